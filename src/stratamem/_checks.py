"""The rules of the facade's arguments and the id scheme, shared by every public entry point.

Each rule is written once here: the ``check_*`` functions raise it as a ``ValidationError``
for a single argument, and the query models (``_queries``) raise the same rule, with the
same words, for the fields of a whole request.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from typing import Any, TypeGuard

from pydantic import ValidationError as PydanticValidationError

from ._strings import UNICODE_RULE, shown, text_problem, value_problem
from .errors import ValidationError
from .types import ID_PATTERN, ROLES

_ID_RE = re.compile(ID_PATTERN)
ID_RULE = (
    "expected 1-200 characters of letters, digits and ._:@/+=- starting with a letter or digit"
)
MAX_LIMIT = 10_000  # the largest page a listing returns in one call
MAX_PAGE = 1000  # the largest page of the REST API (and of the MCP tools, which take its bounds)
# The largest offset a listing takes: far past any real listing, and a number every store
# and driver takes (10**20 overflows SQLite's and PostgreSQL's 64-bit integers).
MAX_OFFSET = 1_000_000_000


def new_id(prefix: str) -> str:
    # Time-ordered so ids sort by creation, random so they never collide across processes.
    return f"{prefix}_{int(time.time() * 1000):012x}{secrets.token_hex(6)}"


def is_id(value: Any) -> TypeGuard[str]:
    # fullmatch: the pattern's "$" alone would let a trailing newline through.
    return isinstance(value, str) and _ID_RE.fullmatch(value) is not None


def int_problem(value: Any, low: int, high: int | None) -> str | None:
    """Why ``value`` is not an integer from ``low`` to ``high`` (no bound if None), or None."""
    whole = isinstance(value, int) and not isinstance(value, bool)
    if whole and low <= value and (high is None or value <= high):
        return None
    if high is None:
        return f"expected an integer >= {low}"
    return f"expected an integer from {low} to {high}"


def text_rule_problem(value: Any, max_len: int) -> str | None:
    """Why ``value`` is not a non-blank string of at most ``max_len`` characters, or None.
    (Whether a store can hold it is ``text_problem``'s question.)"""
    if not isinstance(value, str) or not value.strip() or len(value) > max_len:
        return f"expected a non-empty string of at most {max_len}"
    return None


def check_id(value: Any, name: str, *, error: type[ValidationError] = ValidationError) -> str:
    if not is_id(value):
        raise error(f"invalid {name}", [f"{name}: {ID_RULE} (got {shown(value)})"])
    return value


def check_text(value: Any, name: str, *, max_len: int = 200) -> str:
    problem = text_rule_problem(value, max_len)
    if problem is not None or not isinstance(value, str):
        raise ValidationError(f"invalid {name}", [f"{name}: {problem}"])
    check_storable(value, name)
    return value


def optional_text(value: Any, name: str, *, max_len: int, required: bool = False) -> str | None:
    """``check_text`` of ``value``, which may be ``None`` unless ``required``."""
    if value is None and not required:
        return None
    return check_text(value, name, max_len=max_len)


def check_storable(value: str, name: str) -> str:
    """``value``, if every store can hold it (no NUL, no lone surrogate; see _strings)."""
    problem = text_problem(value)
    if problem is not None:
        raise ValidationError(f"invalid {name}", [f"{name}: {problem}"])
    return value


def check_paging(
    limit: Any,
    offset: Any,
    *,
    most: int = MAX_LIMIT,
    error: type[ValidationError] = ValidationError,
) -> tuple[int, int]:
    """``(limit, offset)`` if ``limit`` is 1 to ``most`` and ``offset`` 0 to MAX_OFFSET."""
    problems = [
        f"{name}: {problem} (got {shown(value)})"
        for name, value, problem in (
            ("limit", limit, int_problem(limit, 1, most)),
            ("offset", offset, int_problem(offset, 0, MAX_OFFSET)),
        )
        if problem is not None
    ]
    if problems:
        raise error("invalid paging", problems)
    return limit, offset


def check_metadata(metadata: Any, where: str, *, max_bytes: int) -> dict[str, Any]:
    """``metadata`` (``{}`` for ``None``), if it is a JSON object every store can hold."""
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise ValidationError("invalid metadata", [f"{where}: expected an object"])
    try:
        # allow_nan=False: NaN and Infinity are not JSON (PostgreSQL's JSONB refuses them).
        dumped = json.dumps(metadata, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValidationError("invalid metadata", [f"{where}: not JSON ({exc})"]) from None
    # NUL and lone surrogates (see _strings) in any key or value: refused on every store.
    found = value_problem(metadata, dumped)
    if found is not None:
        raise ValidationError("invalid metadata", [f"{where}{found[0]}: {found[1]}"])
    size = len(dumped.encode())
    if size > max_bytes:
        raise ValidationError(
            "invalid metadata",
            [f"{where}: {size} bytes of JSON; the limit is {max_bytes}"],
        )
    return metadata


def pydantic_problems(exc: PydanticValidationError, prefix: str) -> list[str]:
    """pydantic's errors as the facade's problem lines, each under ``prefix``."""
    problems = []
    for err in exc.errors():
        loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"])
        msg = err["msg"]
        if err["type"] == "literal_error" and err["loc"][-1:] == ("role",):
            msg = f"must be one of {', '.join(repr(r) for r in ROLES)}"
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        if err["type"] == "string_unicode":  # pydantic-core's own refusal of a lone surrogate
            msg = UNICODE_RULE
        given = err.get("input")
        quoted = "" if err["type"] in ("missing", "extra_forbidden") else f" (got {shown(given)})"
        problems.append(f"{prefix}{loc}: {msg}{quoted}")
    return problems
