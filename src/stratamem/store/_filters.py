"""Search filters: validated once here, translated to SQL by each store adapter.

Metadata filters use a small MongoDB-like vocabulary, documented in docs/api.md::

    {"channel": "web"}                      equality
    {"channel": {"$in": ["web", "ios"]}}    membership ($nin: not in)
    {"stars": {"$gte": 3, "$lt": 5}}        ranges ($gt, $gte, $lt, $lte)
    {"plan": {"$ne": "free"}}               inequality
    {"coupon": {"$exists": true}}           presence
    {"address.city": "Berlin"}              dotted paths reach nested objects

Numbers compare by their exact decimal value as JSON writes them, on every store (SQLite
and PostgreSQL give the same rows): 5 equals 5.0, 2**63 + 1 is above 2**63, 10**400 is a
number like any other. A float is written as the shortest decimal that reads back as the
same double (0.1 as 0.1, 2.0**60 as 1.152921504606847e+18, which is not 2**60).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .._strings import printable, text_problem
from ..errors import ValidationError

__all__ = ["MetadataCondition", "SearchFilters", "parse_metadata_filters"]

_KEY = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_\-]{0,63}(\.[A-Za-z0-9_][A-Za-z0-9_\-]{0,63}){0,7}$")
_OPS = {"$eq", "$ne", "$in", "$nin", "$gt", "$gte", "$lt", "$lte", "$exists"}
Scalar = str | int | float | bool | None


@dataclass(frozen=True)
class MetadataCondition:
    path: tuple[str, ...]
    op: str
    value: Any


@dataclass(frozen=True)
class SearchFilters:
    session_id: str | None = None
    roles: tuple[str, ...] = ()
    event_types: tuple[str, ...] = ()
    since: datetime | None = None
    until: datetime | None = None
    metadata: tuple[MetadataCondition, ...] = field(default_factory=tuple)

    @property
    def empty(self) -> bool:
        return not (
            self.session_id
            or self.roles
            or self.event_types
            or self.since
            or self.until
            or self.metadata
        )


def _scalar(value: Any, where: str) -> Scalar:
    # What a stored value cannot hold (NUL, lone surrogates, non-finite numbers) is no filter
    # value either: refused on every store alike.
    if isinstance(value, str) and (problem := text_problem(value)) is not None:
        raise ValidationError("invalid metadata filter", [f"{where}: {problem}"])
    if isinstance(value, float) and not math.isfinite(value):
        raise ValidationError(
            "invalid metadata filter",
            [f"{where}: expected a finite number (JSON has no NaN or Infinity; got {value})"],
        )
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            json.dumps(value)
        except ValueError:  # more digits than Python writes (sys.get_int_max_str_digits)
            raise ValidationError(
                "invalid metadata filter", [f"{where}: the number has too many digits"]
            ) from None
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    raise ValidationError(
        "invalid metadata filter", [f"{where}: expected a string, number, boolean or null"]
    )


def parse_metadata_filters(
    filters: dict[str, Any] | None, name: str = "metadata_filters"
) -> tuple[MetadataCondition, ...]:
    """``filters`` validated; problems name the argument ``name`` (search calls it filters)."""
    if not filters:
        return ()
    if not isinstance(filters, dict):
        raise ValidationError("invalid metadata filter", [f"{name}: expected an object"])
    out: list[MetadataCondition] = []
    problems: list[str] = []
    for key, spec in filters.items():
        if not isinstance(key, str) or not _KEY.match(key):
            shown = printable(key) if isinstance(key, str) else repr(key)
            problems.append(f"{name}.{shown}: keys are letters, digits, _ and - (dotted)")
            continue
        path = tuple(key.split("."))
        if not isinstance(spec, dict):
            out.append(MetadataCondition(path, "$eq", _scalar(spec, f"{name}.{key}")))
            continue
        if not spec:
            problems.append(f"{name}.{key}: empty operator object")
        for op, value in spec.items():
            where = f"{name}.{key}.{printable(str(op))}"
            if op not in _OPS:
                problems.append(f"{where}: unknown operator; use one of {sorted(_OPS)}")
            elif op in ("$in", "$nin"):
                if not isinstance(value, list) or not value or len(value) > 500:
                    problems.append(f"{where}: expected a non-empty list (at most 500 values)")
                else:
                    vals = tuple(_scalar(v, where) for v in value)
                    out.append(MetadataCondition(path, op, vals))
            elif op == "$exists":
                if not isinstance(value, bool):
                    problems.append(f"{where}: expected true or false")
                else:
                    out.append(MetadataCondition(path, op, value))
            else:
                scalar = _scalar(value, where)
                if op in ("$gt", "$gte", "$lt", "$lte") and (
                    scalar is None or isinstance(scalar, bool)
                ):
                    problems.append(f"{where}: expected a number or string")
                else:
                    out.append(MetadataCondition(path, op, scalar))
    if problems:
        raise ValidationError("invalid metadata filter", problems)
    return tuple(out)
