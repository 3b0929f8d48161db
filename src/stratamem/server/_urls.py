"""Paths and query strings must spell UTF-8 text.

The ASGI server and Starlette decode percent-escapes with ``errors="replace"``, so
``?query=%ED%A0%80`` (the UTF-8-like encoding of a lone surrogate, invalid UTF-8) would
silently arrive as "\ufffd\ufffd\ufffd", another text than the client sent. Every route
checks the raw bytes first and answers 422 naming the parameter instead.
"""

from __future__ import annotations

from urllib.parse import unquote_to_bytes

from fastapi import Request

from ._errors import ApiError

__all__ = ["check_url_text"]

_RULE = "not valid UTF-8: percent-escapes must spell UTF-8 text"


def _utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _query_problems(query: bytes) -> list[tuple[str, str]]:
    problems = []
    for pair in query.split(b"&"):
        name, _, value = (unquote_to_bytes(p.replace(b"+", b" ")) for p in pair.partition(b"="))
        if not (_utf8(name) and _utf8(value)):
            problems.append((name.decode("utf-8", "backslashreplace"), _RULE))
    return problems


def _path_problems(request: Request, raw_path: bytes) -> list[tuple[str, str]]:
    path = unquote_to_bytes(raw_path)
    if _utf8(path):
        return []
    root = request.scope.get("root_path", "").encode()
    if root and path.startswith(root):
        path = path[len(root) :]
    # Bad bytes decode to U+DC80..U+DCFF here, so the route's own pattern says which
    # path parameter holds them.
    text = path.decode("utf-8", "surrogateescape")
    pattern = getattr(request.scope.get("route"), "path_regex", None)
    found = pattern.match(text) if pattern is not None else None
    names = [
        name
        for name, value in (found.groupdict() if found else {}).items()
        if any("\udc80" <= c <= "\udcff" for c in value)
    ]
    return [(name, _RULE) for name in names or ["path"]]


def check_url_text(request: Request) -> None:
    """A dependency of every route: 422 if the path or query string is not UTF-8."""
    problems = _query_problems(request.scope.get("query_string", b""))
    raw_path = request.scope.get("raw_path")
    if raw_path is not None:
        problems = _path_problems(request, raw_path) + problems
    if problems:
        fields = ", ".join(dict.fromkeys(f for f, _ in problems))
        raise ApiError(422, f"invalid request: {fields}", problems=problems)
