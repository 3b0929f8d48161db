"""The rows that cross the ``Store`` port: small dataclasses, one per thing read or written.

Adapters build them from their own rows (``_core/rows.py``); the facade turns them into the
public pydantic types. Re-exported from ``stratamem.store``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._vocabulary import (
    AuditAction,
    FactKind,
    MessageStatus,
    RecallOutcome,
    RecallSource,
    SummaryStatus,
)
from ._filters import MetadataCondition
from ._webhook_rows import OutboxWrite

__all__ = [
    "CURRENT_SUMMARY",
    "AddOutcome",
    "ApiKeyRow",
    "AuditRow",
    "CallWrite",
    "ClaimedBatch",
    "FactRow",
    "FactWrite",
    "ItemFilters",
    "ItemRows",
    "LayerWrite",
    "MessageRow",
    "OutageRow",
    "ProjectRow",
    "QueueRow",
    "RecallLatencyRow",
    "RecallRecordRow",
    "SessionRow",
    "StandingFact",
    "SummaryRow",
    "SummaryWrite",
    "TopicRow",
    "TopicWrite",
    "UsageDayRow",
]


# Summary statuses recall presents as current memory (deprioritized ones down-weighted).
CURRENT_SUMMARY = ("active", "deprioritized")


@dataclass(frozen=True)
class SessionRow:
    project_id: str
    id: str
    user_id: str
    title: str | None
    metadata: dict[str, Any]
    created_at: str
    updated_at: str


@dataclass
class MessageRow:
    project_id: str
    id: str
    user_id: str
    session_id: str
    role: str
    content: str
    content_hash: str
    ts: str
    created_at: str
    process_id: str | None = None
    event_type: str | None = None
    page: str | None = None
    name: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    status: MessageStatus = "pending"
    error: str | None = None
    attempts: int = 0
    job_id: int | None = None
    processed_at: str | None = None
    # A turn that is small talk as a whole ("Take care!"), judged from its text when it is
    # stored (``pipeline.is_small_talk``); recall counts it less.
    small_talk: bool = False
    # A turn whose text ends with a question mark, judged when it is stored; recall lets a
    # question another speaker answers give way to the answer.
    asks: bool = False
    pk: int | None = None


@dataclass
class AddOutcome:
    message_ids: list[str]
    duplicates: list[str]
    job_id: int | None


@dataclass
class ClaimedBatch:
    """Jobs one worker holds under a lease, and their messages in acceptance order."""

    worker_id: str
    project_id: str
    user_id: str
    job_ids: list[int]
    messages: list[MessageRow]
    #: Each job's attempts, this one included: a job merged into a batch late has fewer.
    job_attempts: dict[int, int]
    #: The claim let through to try the services again during an outage (``record_outage``).
    probe: bool = False


@dataclass(frozen=True)
class OutageRow:
    """A service processing needs that is down: no batch is claimed before ``next_probe``,
    then one (the probe) is let through every ``retry_every`` seconds until one ends
    otherwise than by this outage. Times are epoch seconds."""

    service: str
    since: float
    failures: int
    last_error: str
    last_failure: float
    retry_every: float
    next_probe: float


@dataclass
class FactWrite:
    id: str
    text: str
    kind: FactKind
    message_ids: list[str]
    confidence: float
    model: str
    prompt_version: str
    vector: np.ndarray
    occurred_at: str | None = None
    observed_at: str | None = None
    valid_from: str | None = None
    valid_to: str | None = None
    labels: list[str] = field(default_factory=list)
    # A standing instruction or preference, and what it applies to (None: every request).
    standing: bool = False
    scope: str | None = None


@dataclass
class SummaryWrite:
    """A change to the summary layer: ``add`` a summary, ``strengthen`` one with new
    evidence (optionally rewording it), or ``supersede`` one with a new summary."""

    action: str
    id: str
    text: str
    confidence: float
    fact_ids: list[str]
    message_ids: list[str]
    model: str
    prompt_version: str
    reason: str
    vector: np.ndarray | None = None
    supersedes: str | None = None
    observed_at: str | None = None
    valid_from: str | None = None
    valid_to: str | None = None
    labels: list[str] = field(default_factory=list)
    standing: bool = False  # made of standing facts only (see FactWrite)


@dataclass
class TopicWrite:
    id: str
    name: str
    description: str
    summary_ids: list[str]
    is_new: bool


@dataclass
class CallWrite:
    stage: str
    model: str
    prompt_version: str
    prompt_tokens: int
    completion_tokens: int
    latency_ms: float
    ok: bool


@dataclass
class LayerWrite:
    """Everything one batch derived, committed atomically with the batch's completion."""

    facts: list[FactWrite] = field(default_factory=list)
    summaries: list[SummaryWrite] = field(default_factory=list)
    topics: list[TopicWrite] = field(default_factory=list)
    calls: list[CallWrite] = field(default_factory=list)
    # Async webhook deliveries the batch triggered: queued only if the batch commits.
    outbox: list[OutboxWrite] = field(default_factory=list)


@dataclass
class SummaryRow:
    pk: int
    project_id: str
    id: str
    user_id: str
    text: str
    status: SummaryStatus
    confidence: float
    version: int
    fact_ids: list[str]
    message_ids: list[str]
    labels: list[str]
    valid_from: str | None
    valid_to: str | None
    superseded_by: str | None
    model: str
    prompt_version: str
    created_at: str
    updated_at: str
    observed_at: str | None = None
    standing: bool = False


@dataclass
class FactRow:
    pk: int
    project_id: str
    id: str
    user_id: str
    text: str
    kind: FactKind
    confidence: float
    status: str
    message_ids: list[str]
    labels: list[str]
    occurred_at: str | None
    valid_from: str | None
    valid_to: str | None
    superseded_by: str | None
    model: str
    prompt_version: str
    created_at: str
    observed_at: str | None = None
    standing: bool = False
    scope: str | None = None


@dataclass(frozen=True)
class StandingFact:
    """A user's standing instruction or preference as recall reads it: the fact, and the
    current summary that holds it (None when no summary holds it)."""

    fact: FactRow
    summary_id: str | None


@dataclass
class TopicRow:
    pk: int
    project_id: str
    id: str
    user_id: str
    name: str
    description: str
    status: str
    summary_ids: list[str]
    created_at: str
    updated_at: str


@dataclass(frozen=True)
class ProjectRow:
    id: str
    name: str
    created_at: str


@dataclass(frozen=True)
class ApiKeyRow:
    id: str
    project_id: str
    name: str | None
    prefix: str
    created_at: str
    revoked_at: str | None = None
    last_used_at: str | None = None


@dataclass(frozen=True)
class AuditRow:
    pk: int
    project_id: str
    user_id: str | None
    action: AuditAction
    target: str | None
    actor: str
    reason: str | None
    details: dict[str, Any]
    at: str


@dataclass(frozen=True)
class ItemFilters:
    """Filters for listing facts and summaries. The time window applies to when an item
    happened or was observed; metadata conditions apply to the messages it came from."""

    status: tuple[str, ...] = ()
    since: str | None = None
    until: str | None = None
    metadata: tuple[MetadataCondition, ...] = ()


@dataclass(frozen=True)
class RecallRecordRow:
    """One recall a face made (the recall log): who asked, what was injected, how long it
    took. ``query`` and ``formatted_context`` are memory text, so erasing or forgetting the
    user removes the row. ``created_at`` is epoch seconds (bucketed and pruned by time)."""

    project_id: str
    user_id: str
    session_id: str | None
    source: RecallSource
    request: str
    query: str | None
    outcome: RecallOutcome
    formatted_context: str
    hits: int
    latency_ms: float
    created_at: float
    pk: int = 0


@dataclass(frozen=True)
class RecallLatencyRow:
    """One bucket of a project's recall latency: recalls that began in
    ``[bucket_start, bucket_start + bucket_seconds)`` (epoch seconds), skipped ones
    included, with their latency percentiles (nearest rank) and maximum."""

    bucket_start: float
    count: int
    skipped: int
    p50_ms: float
    p95_ms: float
    max_ms: float


@dataclass(frozen=True)
class QueueRow:
    """Unfinished jobs of one project in one status (``queued``, ``running``), and when the
    oldest of them was queued (epoch seconds)."""

    project_id: str
    status: str
    jobs: int
    oldest_created_at: float


@dataclass(frozen=True)
class UsageDayRow:
    """The model calls of one UTC day (``YYYY-MM-DD``) of a project with one model."""

    day: str
    model: str
    calls: int
    failed: int
    prompt_tokens: int
    completion_tokens: int


#: The full rows of some messages, facts and summaries, each layer's by pk.
ItemRows = tuple[dict[int, MessageRow], dict[int, FactRow], dict[int, SummaryRow]]
