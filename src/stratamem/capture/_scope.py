"""Who a captured LLM call belongs to: a context variable, so that concurrent requests in
threads or asyncio tasks never mix users."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace

from .._strings import shown
from ..errors import ValidationError
from ..types import ID_PATTERN

__all__ = ["Attribution", "current", "scope"]

_ID = re.compile(ID_PATTERN)


@dataclass(frozen=True)
class Attribution:
    user_id: str | None = None
    session_id: str | None = None
    process_id: str | None = None

    def merged(self, inner: Attribution) -> Attribution:
        """``inner``'s fields where set, this one's elsewhere."""
        return replace(
            self,
            **{k: v for k, v in vars(inner).items() if v is not None},
        )


_EMPTY = Attribution()
_current: ContextVar[Attribution | None] = ContextVar("stratamem_attribution", default=None)


def check(**fields: str | None) -> Attribution:
    problems = [
        f"{name}: expected an id of letters, digits and ._:@/+=- (got {shown(value)})"
        for name, value in fields.items()
        if value is not None and (not isinstance(value, str) or not _ID.fullmatch(value))
    ]
    if problems:
        raise ValidationError("invalid attribution", problems)
    return Attribution(**fields)


def current() -> Attribution:
    return _current.get() or _EMPTY


@contextmanager
def scope(
    user_id: str | None = None, session_id: str | None = None, process_id: str | None = None
) -> Iterator[Attribution]:
    """Attribute the LLM calls made inside the block; nested scopes refine outer ones."""
    inner = check(user_id=user_id, session_id=session_id, process_id=process_id)
    merged = current().merged(inner)
    token = _current.set(merged)
    try:
        yield merged
    finally:
        _current.reset(token)
