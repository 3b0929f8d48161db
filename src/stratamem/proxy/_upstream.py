"""Where the proxy forwards to, and which headers cross it.

The caller's provider key (``Authorization``, ``x-api-key``, ...) travels to the upstream
untouched unless the proxy has a key of its own for that upstream; stratamem's headers
(``X-Stratamem-*``: the project key, the user) never leave the proxy. Nothing here logs a
header.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

import httpx

from ..errors import ConfigError

__all__ = [
    "UnsafePath",
    "Upstream",
    "base_url",
    "body_decoder",
    "redacted",
    "request_headers",
    "response_headers",
]

# Hop-by-hop headers (RFC 9110 §7.6.1) and those the proxy sets itself: the body's length
# changes when memory is injected, and the upstream is asked for an uncompressed answer
# (the proxy reads it to capture it).
_NOT_FORWARDED = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "accept-encoding",
    }
)
# The places providers read a key from: replaced when the proxy has a key of its own.
_KEY_HEADERS = frozenset({"authorization", "x-api-key", "api-key", "x-goog-api-key"})
_OWN_PREFIX = "x-stratamem-"
# The server computes these for the body it sends; and it dates its answer itself (uvicorn
# adds a Date header: the upstream's would make it two).
_NOT_RETURNED = frozenset(
    {
        "date",
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "content-length",
    }
)


# Query parameters whose value is a credential, in any case ("key", "api_key", "token",
# "access_token", "sig", "X-Amz-Signature", ...): their values are never shown.
_SECRET_PARAM = re.compile(r"(^|[-_.])(key|token|sig|signature|secret|password|auth)$", re.I)
# How many rounds of percent-decoding a path is checked through: an upstream (or a server
# behind it) may decode once more than the proxy did ("%252e" -> "%2e" -> ".").
_DECODE_ROUNDS = 4


def redacted(url: str) -> str:
    """``url`` fit to show (logs, error bodies, the start banner): its userinfo (a user name
    can be a token too) and the values of query parameters that carry credentials are
    replaced by ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<an unreadable URL>"
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"***@{netloc.rpartition('@')[2]}"
    query = parts.query
    pairs = parse_qsl(query, keep_blank_values=True)
    if any(_SECRET_PARAM.search(k) for k, _ in pairs):
        shown = [(k, "***" if _SECRET_PARAM.search(k) else v) for k, v in pairs]
        query = urlencode(shown, safe="*")
    return urlunsplit(parts._replace(netloc=netloc, query=query))


class UnsafePath(ValueError):
    """A request path that would leave ``/v1`` or the upstream's base path (dot segments,
    raw or percent-encoded): refused before anything is sent."""


def _dot_segments(path: str) -> bool:
    segments = path.replace("\\", "/").split("/")
    return any(segment in (".", "..") for segment in segments)


def check_path(raw_path: str) -> None:
    """Raise :class:`UnsafePath` when ``raw_path`` (as the caller sent it, percent-encoded)
    holds a ``.`` or ``..`` segment in it or in any of its decodings, ``/`` and ``\\``
    both separating segments (``%2e%2e``, ``..%2F``, ``%2e.``, ``%252e%252e``, ...)."""
    path = raw_path
    for _ in range(_DECODE_ROUNDS):
        if _dot_segments(path):
            raise UnsafePath(raw_path)
        decoded = unquote(path, errors="replace")  # other bytes make no dot
        if decoded == path:
            return
        path = decoded
    # Still decoding after that many rounds: nobody sends that in good faith.
    raise UnsafePath(raw_path)


def base_url(url: str, what: str) -> str:
    """``url`` as the base the request's ``/v1/...`` path is appended to: a trailing ``/``
    or ``/v1`` (how SDK base URLs are usually written) is dropped."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"{what}: expected an http:// or https:// URL, got {url!r}")
    if parts.query or parts.fragment:
        raise ConfigError(f"{what}: a base URL has no query or fragment, got {url!r}")
    path = parts.path.rstrip("/").removesuffix("/v1")
    return f"{parts.scheme}://{parts.netloc}{path}"


@dataclass(frozen=True)
class Upstream:
    """One upstream: its base URL and, optionally, the key the proxy sends it instead of
    the caller's (``key_header``: ``authorization`` for OpenAI-style APIs, ``x-api-key``
    for Anthropic's)."""

    url: str
    key: str | None = None
    key_header: str = "authorization"

    @property
    def shown(self) -> str:
        """The base URL as logs and error bodies show it (:func:`redacted`)."""
        return redacted(self.url)

    def target(self, raw_path: str, query: str) -> httpx.URL:
        """The upstream URL of a ``/v1/...`` request path (percent-encoded, as received).
        Raises :class:`UnsafePath` for a path with dot segments, and, checked again on the
        URL itself, for one that would not land under the base URL's ``/v1/``."""
        check_path(raw_path)
        url = httpx.URL(f"{self.url}{raw_path}?{query}" if query else f"{self.url}{raw_path}")
        base = httpx.URL(self.url)
        inside = base.raw_path.rstrip(b"/") + b"/v1/"
        if (
            (url.scheme, url.host, url.port) != (base.scheme, base.host, base.port)
            or not url.raw_path.startswith(inside)
            or _dot_segments(url.path)
        ):
            raise UnsafePath(raw_path)
        return url

    def headers(self, incoming: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
        out = request_headers(incoming, drop_keys=self.key is not None)
        if self.key is not None:
            value = f"Bearer {self.key}" if self.key_header == "authorization" else self.key
            out.append((self.key_header, value))
        return out


def request_headers(
    incoming: Iterable[tuple[str, str]], *, drop_keys: bool = False
) -> list[tuple[str, str]]:
    out = [
        (name, value)
        for name, value in incoming
        if name not in _NOT_FORWARDED
        and not name.startswith(_OWN_PREFIX)
        and not (drop_keys and name in _KEY_HEADERS)
    ]
    out.append(("accept-encoding", "identity"))
    return out


def response_headers(incoming: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The upstream's response headers the caller gets, raw (names and duplicates kept)."""
    return [(k, v) for k, v in incoming if k.decode("latin-1").lower() not in _NOT_RETURNED]


def body_decoder(encoding: str | None) -> Callable[[bytes], bytes] | None:
    """What undoes the upstream's ``Content-Encoding`` for capture's copy of the answer,
    chunk by chunk: the proxy asks for none, but an upstream may compress anyway. None
    for an encoding stratamem cannot read (the answer is then relayed, not captured)."""
    encoding = (encoding or "identity").strip().lower()
    if encoding == "identity":
        return _same
    if encoding in ("gzip", "x-gzip", "deflate"):
        # wbits 47: a gzip or zlib header, whichever comes.
        return zlib.decompressobj(wbits=47).decompress
    return None


def _same(data: bytes) -> bytes:
    return data
