"""Which strings stratamem accepts: text every store can hold, checked at every entry point.

A Python ``str`` can carry what no store can: NUL (PostgreSQL's text and JSONB refuse it)
and lone UTF-16 surrogates such as ``"\\ud800"`` (a JSON ``"\\ud800"`` escape decodes to
one; no UTF-8 encoder accepts it, so SQLite's driver and PostgreSQL's both fail on it).
Both are refused before anything is written, on every backend alike, with the field named.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel, field_validator

__all__ = [
    "UNICODE_RULE",
    "CheckedStrings",
    "printable",
    "shown",
    "text_problem",
    "value_problem",
]

_BAD = re.compile("[\x00\ud800-\udfff]")
_SURROGATE = re.compile("[\ud800-\udfff]")
UNICODE_RULE = "must be valid Unicode text (a lone UTF-16 surrogate such as \\ud800 is not)"


def text_problem(value: str) -> str | None:
    """Why ``value`` cannot be stored, or None."""
    found = _BAD.search(value)
    if found is None:
        return None
    if found.group() == "\x00":
        return "must not contain NUL characters"
    return (
        f"must be valid Unicode text: U+{ord(found.group()):04X} at position {found.start()} "
        "is a lone UTF-16 surrogate"
    )


def value_problem(value: Any, dumped: str | None = None) -> tuple[str, str] | None:
    """The first string or key of a JSON-like value that cannot be stored: ``(its path
    inside value, e.g. ".address.city" or "[2]", "" for value itself; why)``, or None.
    ``dumped`` is ``json.dumps(value, ensure_ascii=False)`` if the caller has it."""
    if isinstance(value, (dict, list, tuple)) and _clean_json(value, dumped):
        return None
    return _walk(value)


def _clean_json(value: Any, dumped: str | None) -> bool:
    # The fast answer for what is almost always true: the JSON text (written in C) holds no
    # NUL (it would read \u0000) and no surrogate, so no string inside does either.
    if dumped is None:
        try:
            dumped = json.dumps(value, ensure_ascii=False)
        except (TypeError, ValueError):  # not JSON (models, a set ...): each part is looked at
            return False
    return "\\u0000" not in dumped and _SURROGATE.search(dumped) is None


def _walk(value: Any) -> tuple[str, str] | None:
    if isinstance(value, str):
        problem = text_problem(value)
        return None if problem is None else ("", problem)
    if isinstance(value, dict):
        for key, item in value.items():
            where = f".{printable(key)}" if isinstance(key, str) else f".{key!r}"
            if isinstance(key, str) and (problem := text_problem(key)) is not None:
                return where, f"(a key) {problem}"
            if (found := _walk(item)) is not None:
                return where + found[0], found[1]
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            if (found := _walk(item)) is not None:
                return f"[{i}]" + found[0], found[1]
    return None


def printable(value: str) -> str:
    """``value`` with what UTF-8 cannot encode written as ``\\udXXX`` escapes: safe to echo
    in an error, a log line or a JSON response whatever the caller sent."""
    return value.encode("utf-8", "backslashreplace").decode("utf-8")


# An error quotes at most this many characters of what it refuses: enough to recognise it,
# never a 100 KB id echoed back whole (or into a log line).
SHOWN_CHARS = 60


def shown(value: Any) -> str:
    """``repr(value)`` cut to ``SHOWN_CHARS`` characters (marked with "..."), for an error
    that quotes its input: the input may be huge or an integer too long to print."""
    if isinstance(value, str):
        value = value[: SHOWN_CHARS + 1]  # what is cut below is never written out
    try:
        text = repr(value)
    except ValueError:  # an int past sys.get_int_max_str_digits()
        return f"<an integer of {value.bit_length()} bits>"
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


class CheckedStrings(BaseModel):
    """Base of models validating outside input: every string in every field (keys and
    values of nested JSON too) must be one the stores can hold. Nested models check their
    own fields (value_problem does not enter them)."""

    @field_validator("*")
    @classmethod
    def _storable_strings(cls, value: Any) -> Any:
        found = value_problem(value)
        if found is not None:
            path, problem = found
            raise ValueError(f"at {path.lstrip('.')}: {problem}" if path else problem)
        return value
