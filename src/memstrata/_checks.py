"""Checks of the facade's arguments and the id scheme, shared by every public entry point."""

from __future__ import annotations

import json
import re
import secrets
import time
from datetime import datetime
from typing import Any

from pydantic import TypeAdapter
from pydantic import ValidationError as PydanticValidationError

from ._strings import UNICODE_RULE, text_problem, value_problem
from ._time import Timestamp
from .errors import ValidationError
from .types import ID_PATTERN, ROLES, RecallConfig

_ID_RE = re.compile(ID_PATTERN)
_TIMESTAMP: TypeAdapter[datetime] = TypeAdapter(Timestamp)


def new_id(prefix: str) -> str:
    # Time-ordered so ids sort by creation, random so they never collide across processes.
    return f"{prefix}_{int(time.time() * 1000):012x}{secrets.token_hex(6)}"


def check_id(value: Any, name: str) -> str:
    if not isinstance(value, str) or not _ID_RE.match(value):
        raise ValidationError(
            f"invalid {name}",
            [
                f"{name}: expected 1-200 characters of letters, digits and ._:@/+=- "
                f"starting with a letter or digit (got {value!r})"
            ],
        )
    return value


def check_text(value: Any, name: str, *, max_len: int = 200) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > max_len:
        raise ValidationError(
            f"invalid {name}", [f"{name}: expected a non-empty string of at most {max_len}"]
        )
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


def check_paging(limit: Any, offset: Any) -> None:
    problems = []
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
        problems.append(f"limit: expected an integer from 1 to 10000 (got {limit!r})")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        problems.append(f"offset: expected an integer >= 0 (got {offset!r})")
    if problems:
        raise ValidationError("invalid paging", problems)


def read_time(
    value: datetime | str | float | None, name: str
) -> tuple[datetime | None, str | None]:
    """``(value as a UTC datetime, None)``, or ``(None, the problem with it)``."""
    if value is None:
        return None, None
    try:
        return _TIMESTAMP.validate_python(value), None
    except PydanticValidationError as exc:
        error = exc.errors()[0]
        if error["type"] == "value_error":  # out of range, a boolean: the reason says which
            return None, f"{name}: {error['ctx']['error']} (got {value!r:.60})"
        return None, f"{name}: expected an ISO-8601 datetime or epoch seconds (got {value!r:.60})"


def parse_time(value: datetime | str | float | None, name: str) -> datetime | None:
    when, problem = read_time(value, name)
    if problem is not None:
        raise ValidationError(f"invalid {name}", [problem])
    return when


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
        shown = "" if err["type"] in ("missing", "extra_forbidden") else f" (got {given!r:.60})"
        problems.append(f"{prefix}{loc}: {msg}{shown}")
    return problems


def check_recall_config(value: RecallConfig | dict[str, Any] | None) -> RecallConfig:
    """A ``recall_config`` argument as a ``RecallConfig`` (the defaults for ``None``)."""
    if value is None:
        return RecallConfig()
    if isinstance(value, RecallConfig):
        return value
    if not isinstance(value, dict):
        raise ValidationError("invalid recall_config", ["recall_config: expected an object"])
    try:
        return RecallConfig.model_validate(value)
    except PydanticValidationError as exc:
        raise ValidationError(
            "invalid recall_config", pydantic_problems(exc, "recall_config")
        ) from None
