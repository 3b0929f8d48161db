"""One timestamp format for everything stored: UTC, microseconds, fixed width; and one
reading of the times callers send (``Timestamp``).

Fixed width makes the stored text sort in time order, so range filters are plain string
comparisons in SQL.
"""

from __future__ import annotations

import math
import re
from datetime import datetime, timedelta, timezone
from decimal import ROUND_HALF_EVEN, Decimal
from functools import lru_cache
from typing import Annotated, Any, overload

from pydantic import AfterValidator, BeforeValidator

__all__ = ["Timestamp", "as_utc", "now_iso", "parse_iso", "parse_stored", "to_iso", "utcnow"]

_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
# The instants a datetime can hold, 0001-01-01T00:00:00Z to 9999-12-31T23:59:59.999999Z.
_FIRST, _LAST = Decimal(-62_135_596_800), Decimal("253402300799.999999")
_MICRO = Decimal("0.000001")
_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)", re.ASCII)


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def as_utc(value: datetime) -> datetime:
    # Naive datetimes are taken as UTC (documented): guessing the server's local zone would
    # make the same input mean different instants on different machines.
    if value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    try:
        return value.astimezone(timezone.utc)
    except OverflowError:
        # 0001-01-01T00:00+05:00 is a valid ISO time whose UTC instant is in year 0.
        raise ValueError("out of range: the UTC time must be within the years 1 to 9999") from None


def _from_epoch_seconds(value: int | float | str) -> datetime:
    """The UTC instant ``value`` seconds after 1970-01-01T00:00:00Z, to the microsecond.

    Every number is seconds, however large: pydantic would read numbers above 2e10 as
    milliseconds, so ``253402300800`` (year 10000) would silently become 1978-01-11.
    A number outside years 1 to 9999 is a ``ValueError`` that says the range.
    """
    if isinstance(value, bool):  # bool is an int in Python; True is no time
        raise ValueError("expected an ISO-8601 datetime or epoch seconds, not a boolean")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"epoch seconds must be a finite number (got {value})")
    # Decimal is exact for ints, floats and numeric strings: sub-second digits survive.
    seconds = Decimal(value.strip() if isinstance(value, str) else value)
    if _FIRST - 1 <= seconds <= _LAST + 1:  # only then can it be rounded to microseconds
        rounded = seconds.quantize(_MICRO, rounding=ROUND_HALF_EVEN)
        if _FIRST <= rounded <= _LAST:
            return _EPOCH + timedelta(microseconds=int(rounded.scaleb(6)))
    shown = f"{seconds:.3e}" if abs(seconds) >= 10**30 else repr(value).strip("'")
    raise ValueError(
        f"epoch seconds out of range: {shown} is not within the years 1 to 9999 "
        f"(from {_FIRST} to {_LAST})"
    )


def _read_number(value: Any) -> Any:
    # Numbers and numeric strings ("1700000000.5", as query strings carry them) are epoch
    # seconds; everything else is left to pydantic's ISO-8601 parsing.
    if isinstance(value, (int, float)) or (
        isinstance(value, str) and _NUMBER.fullmatch(value.strip())
    ):
        return _from_epoch_seconds(value)
    return value


# A time as callers send it: an ISO-8601 string (naive = UTC) or epoch seconds (a number or
# a numeric string), always as an aware UTC datetime.
Timestamp = Annotated[datetime, BeforeValidator(_read_number), AfterValidator(as_utc)]


def _format(value: datetime) -> str:
    # glibc's %Y does not zero-pad years before 1000 ("159-08-17T..."): such a time would
    # neither sort with the others nor parse back, so the year is written here.
    return f"{value.year:04d}{value.strftime(_FORMAT[2:])}"


@overload
def to_iso(value: datetime) -> str: ...
@overload
def to_iso(value: None) -> None: ...
@overload
def to_iso(value: datetime | None) -> str | None: ...
def to_iso(value: datetime | None) -> str | None:
    return None if value is None else _format(as_utc(value))


def now_iso() -> str:
    return _format(utcnow())


# Recall parses the same stored times again and again (a candidate's time, its validity,
# its neighbours', on every query): datetimes are immutable, so a parsed one can be shared.
@lru_cache(maxsize=8192)
def parse_iso(value: str | None) -> datetime | None:
    if not value:
        return None
    # Stored times are always in _FORMAT; fromisoformat reads it ~20x faster than strptime
    # (recall parses hundreds per query).
    if value.endswith("Z") and len(value) == 27:
        return datetime.fromisoformat(value[:-1]).replace(tzinfo=timezone.utc)
    year, dash, rest = value.partition("-")
    if dash and year.isdigit() and len(year) < 4:
        # Written before years were padded (see _format): read it as what it meant.
        return parse_iso(f"{int(year):04d}-{rest}")
    return datetime.strptime(value, _FORMAT).replace(tzinfo=timezone.utc)


def parse_stored(value: str) -> datetime:
    """``parse_iso`` of a time every stored row has (a message's ``ts``, ``created_at``)."""
    parsed = parse_iso(value)
    if parsed is None:  # a ValueError, as the public model's validation of None would be
        raise ValueError(f"a stored time is missing: {value!r}")
    return parsed
