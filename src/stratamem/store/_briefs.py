"""What recall ranks a candidate on, as the store hands it over: ``Store.recall_briefs``.

A brief is the ranking half of an item, without its text or metadata (those are read for
the hits only). Both backends return the same Python types: timestamps as the stored ISO
text, id lists as lists, the vector as float32 bytes (``None`` without one, or when no
embedder was asked for).

Slotted dataclasses, not frozen and not NamedTuples: a search builds a few hundred of them
and reads each several times; measured on CPython 3.11, building one and reading it seven
times costs ~300 ns, against ~470 ns for a NamedTuple (its ``__new__`` is a Python
function) and ~1 us for a frozen dataclass (one ``object.__setattr__`` per field).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Briefs", "FactBrief", "MessageBrief", "SummaryBrief"]


@dataclass(slots=True)
class MessageBrief:
    id: str
    session_id: str
    name: str | None
    ts: str
    # Every fact drawn from the message has been superseded since (False without facts).
    superseded: bool
    # Small talk as a whole ("Take care!"), judged from its text when it was stored.
    small_talk: bool
    # Its text ends with a question mark (judged when it was stored): a question, which
    # the next turn may answer.
    asks: bool
    # The turns before and after it in its session, in (ts, pk) order: read only when
    # asked for (``neighbours=True``), else None.
    prev_pk: int | None
    next_pk: int | None
    vector: bytes | None
    # The summaries that superseded the message's facts (what holds instead), oldest
    # first; empty when none was superseded.
    replaced_by: tuple[str, ...] = ()
    role: str = "user"


@dataclass(slots=True)
class FactBrief:
    id: str
    status: str
    occurred_at: str | None
    observed_at: str | None
    created_at: str
    valid_to: str | None
    vector: bytes | None
    # The messages it was drawn from (ids).
    message_ids: tuple[str, ...] = ()


@dataclass(slots=True)
class SummaryBrief:
    id: str
    status: str
    observed_at: str | None
    created_at: str
    valid_to: str | None
    fact_ids: list[str]
    # Ids of the active topics it is filed under, in topic order.
    topic_ids: list[str]
    vector: bytes | None


#: ``recall_briefs``' answer: messages, facts and summaries, each by pk.
Briefs = tuple[dict[int, MessageBrief], dict[int, FactBrief], dict[int, SummaryBrief]]
