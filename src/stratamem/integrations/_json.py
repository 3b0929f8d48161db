"""What the integrations share about text and JSON: JSON text any store holds exactly, text
a message can hold, and the size limits of the memory they write to."""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["as_json", "clean", "dumps", "limits", "pieces", "text_pieces"]

_UNSAFE = re.compile("[\x00\ud800-\udfff]")
_SURROGATE = re.compile("[\ud800-\udfff]")
# stratamem's defaults (config.Settings), for a memory that does not say its own.
_CONTENT_CHARS = 32_000
_METADATA_BYTES = 16_384


def dumps(value: Any) -> str:
    """Compact JSON text that every store holds as it is and ``json.loads`` reads back
    exactly: non-ASCII text as it is, lone surrogates escaped (NUL always is). A ValueError
    says what is not JSON (NaN, an object of another type)."""
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except TypeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def clean(text: str) -> str:
    """``text`` as a message's content may hold it: NUL and lone surrogates replaced."""
    return _UNSAFE.sub("\ufffd", text)


def limits(memory: object) -> tuple[int, int]:
    """The most characters a message's content, and bytes its metadata, may hold: the
    memory's settings (an embedded memory's own; a remote one's are the client's, which
    are the server's defaults too), else stratamem's defaults."""
    settings = getattr(memory, "settings", None)
    chars = getattr(settings, "max_content_chars", _CONTENT_CHARS)
    size = getattr(settings, "max_metadata_bytes", _METADATA_BYTES)
    return int(chars), int(size)


def as_json(value: object) -> Any:
    """``value`` as the JSON a message's metadata holds (what ``dumps`` writes, read back);
    a ValueError says what is not JSON."""
    return json.loads(dumps(value))


def pieces(text: str, most: int) -> list[str] | None:
    """``text`` as contents of at most ``most`` characters, none blank (each after the first
    starts with a non-space character); None when it cannot be."""
    out = []
    start = 0
    while start < len(text):
        end = min(start + most, len(text))
        while end < len(text) and end > start and text[end].isspace():
            end -= 1
        piece = text[start:end]
        if not piece.strip() or clean(piece) != piece:
            return None
        out.append(piece)
        start = end
    return out or None


def text_pieces(text: str, most: int) -> list[str]:
    """``text`` (cleaned, not blank) as message contents of at most ``most`` characters:
    ``pieces``, or, where a run of white space would leave a blank piece, with every run
    of white space made one space."""
    found = pieces(text, most) or pieces(" ".join(text.split()), most)
    if found is None:
        raise ValueError("no text to store")
    return found
