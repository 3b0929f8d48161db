"""Rows of the dashboard's half of the ``Store`` port: users, provenance, activity, and the
dashboard's sign-in sessions.

The SQL that reads and writes them is the core's (``store/_core/dashboard.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .._vocabulary import ItemKind, UiSessionKind
from ._rows import FactRow, MessageRow, SummaryRow, TopicRow

__all__ = ["ActivityCounts", "ProvenanceRows", "UiSessionRow", "UserRow"]


@dataclass(frozen=True)
class UserRow:
    """A user of a project as the dashboard lists them. Times are the stored ISO text: the
    first session's creation and the last session activity (a message added bumps it)."""

    user_id: str
    sessions: int
    messages: int
    first_seen: str
    last_seen: str


@dataclass
class ProvenanceRows:
    """An item (``kind``: message, fact, summary or topic) and what it is linked to, both
    ways; nothing ``deleted``."""

    kind: ItemKind
    item: MessageRow | FactRow | SummaryRow | TopicRow
    messages: list[MessageRow] = field(default_factory=list)
    facts: list[FactRow] = field(default_factory=list)
    summaries: list[SummaryRow] = field(default_factory=list)
    topics: list[TopicRow] = field(default_factory=list)


@dataclass(frozen=True)
class ActivityCounts:
    """Message counts per minute (``"YYYY-MM-DDTHH:MM"``, UTC) of a time window: accepted,
    processed, and failed for good (by when their job failed)."""

    added: dict[str, int]
    processed: dict[str, int]
    failed: dict[str, int]


@dataclass(frozen=True)
class UiSessionRow:
    """A dashboard sign-in. ``id_hash`` is the SHA-256 of the session's token (the token is
    never stored); ``kind`` ``key`` (signed in with a project's API key) or ``admin``
    (``project_id`` None until one is picked). Times are epoch seconds."""

    id_hash: str
    kind: UiSessionKind
    key_id: str | None
    project_id: str | None
    # The form token a signed-in page posts back; kept out of repr like a secret.
    csrf_token: str = field(repr=False)
    created_at: float
    expires_at: float
    last_seen: float
