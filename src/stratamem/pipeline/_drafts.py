"""What the write path's steps hand each other before anything is stored.

A draft is validated (``FactDraft.check``) the same way whether it came from the LLM,
from the offline heuristics or from a ``before_add`` hook: the source ids must be messages
of the batch being processed, so no step can attach a fact to another user's or another
batch's messages.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeGuard, get_args

from .._vocabulary import FactKind

__all__ = ["FACT_KINDS", "FactDraft"]

FACT_KINDS: tuple[FactKind, ...] = get_args(FactKind)
MAX_FACT_CHARS = 1000
MAX_SCOPE_CHARS = 200


@dataclass
class FactDraft:
    """A fact about the user, grounded in ``message_ids`` (ids of messages in the batch)."""

    text: str
    kind: str
    message_ids: list[str]
    confidence: float = 0.8
    occurred_at: datetime | None = None  # when the event happened / was stated to happen
    valid_from: datetime | None = None  # when the fact started to hold
    valid_to: datetime | None = None  # when it stopped (or will stop) holding
    labels: list[str] = field(default_factory=list)
    # A standing instruction or preference: it holds for later requests in its ``scope``
    # (what it applies to, e.g. "async error handling"; None: to every request).
    standing: bool = False
    scope: str | None = None

    def problems(self, allowed_ids: Collection[str]) -> list[str]:
        """Why this draft must be rejected (empty when it is fine)."""
        out = []
        if not isinstance(self.text, str) or not self.text.strip():
            out.append("text is empty")
        elif len(self.text) > MAX_FACT_CHARS:
            out.append(f"text longer than {MAX_FACT_CHARS} characters")
        if not _is_fact_kind(self.kind):
            out.append(_kind_problem(self.kind))
        if not self.message_ids:
            out.append("no source message ids")
        foreign = [m for m in self.message_ids if m not in allowed_ids]
        if foreign:
            out.append(f"source ids {foreign[:5]} are not messages of this batch")
        if not 0.0 <= float(self.confidence) <= 1.0:
            out.append("confidence outside 0..1")
        if self.valid_from and self.valid_to and self.valid_to < self.valid_from:
            out.append("valid_to is before valid_from")
        if self.scope is not None and not self.standing:
            out.append("a scope is given but the fact is not standing")
        elif self.scope is not None and len(self.scope) > MAX_SCOPE_CHARS:
            out.append(f"scope longer than {MAX_SCOPE_CHARS} characters")
        return out

    @property
    def checked_kind(self) -> FactKind:
        """``kind`` of a draft that ``problems`` passed (it checks the kind)."""
        if not _is_fact_kind(self.kind):
            raise ValueError(_kind_problem(self.kind))
        return self.kind


def _is_fact_kind(kind: str) -> TypeGuard[FactKind]:
    return kind in FACT_KINDS


def _kind_problem(kind: str) -> str:
    return f"kind {kind!r} is not one of {', '.join(FACT_KINDS)}"
