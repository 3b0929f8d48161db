"""stratamem ids from a framework's names: deterministic, one id per name, valid everywhere.

A framework names users, threads and records with any string; stratamem's ids are 1 to 200
of ``types.ID_PATTERN``'s characters. ``as_id`` keeps a name that already is such an id (so
the user "u1" of a LangGraph namespace, of an OpenAI Agents session and of capture is the
same stratamem user) and escapes any other, and ``joined_id`` makes one id of several names.
Both are injective: an escape starts with ``=`` followed by two hex digits, so a name with
``=`` is always escaped, and a name too long for an id is hashed behind a marker no other
form can produce (``h=``, or ``==`` in a joined id).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence

from ..types import ID_PATTERN

__all__ = ["as_id", "joined_id", "part"]

_ID = re.compile(ID_PATTERN)
_MAX_ID = 200
# What an id keeps as it is: every id character but the escape, "=".
_ID_CHARS = re.compile(r"[A-Za-z0-9._:@/+-]")
# What a part of a joined id keeps: also not the separators ":", "/" and ".".
_PART_CHARS = re.compile(r"[A-Za-z0-9_@+-]")


def _escaped(text: str, keep: re.Pattern[str]) -> str:
    return "".join(
        c if keep.fullmatch(c) else "".join(f"={b:02X}" for b in c.encode("utf-8", "surrogatepass"))
        for c in text
    )


def _digest(value: object) -> str:
    data = json.dumps(value, ensure_ascii=True, separators=(",", ":"))
    return hashlib.sha256(data.encode("ascii")).hexdigest()


def as_id(name: str) -> str:
    """``name`` as a stratamem id: itself when it is a valid id without ``=``; else
    ``x=`` and the name with each other character escaped; a name whose escape would be
    too long, ``h=`` and its SHA-256."""
    if _ID.fullmatch(name) and "=" not in name:
        return name
    escaped = "x=" + _escaped(name, _ID_CHARS)
    return escaped if len(escaped) <= _MAX_ID else "h=" + _digest(name)


def part(name: str) -> str:
    """One name as a part of a joined id: every character but ``[A-Za-z0-9_@+-]`` escaped."""
    return _escaped(name, _PART_CHARS)


def joined_id(tag: str, groups: Sequence[Sequence[str]], suffix: str = "") -> str:
    """One id for a tuple of name groups: ``tag:`` then the groups' parts, ``/`` between
    names and ``:`` between groups, then ``suffix``; too long, ``tag:==`` and the SHA-256
    of the groups (then ``suffix``)."""
    body = ":".join("/".join(part(name) for name in group) for group in groups)
    whole = f"{tag}:{body}{suffix}"
    if len(whole) <= _MAX_ID:
        return whole
    return f"{tag}:=={_digest([list(g) for g in groups])}{suffix}"
