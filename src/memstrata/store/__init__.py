"""The ``Store`` port: everything the engine needs from a database, and nothing more.

Adapters (``sqlite.py`` now, ``postgres.py`` at scale) implement it; the engine never
issues SQL itself. Rows cross the port as the small dataclasses below; the facade turns
them into the public pydantic types.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ._filters import MetadataCondition, SearchFilters, parse_metadata_filters
from ._webhook_rows import OutboxItem, OutboxWrite, WebhookDeliveryRow, WebhookRow

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
    "LayerWrite",
    "LeaseLostError",
    "MessageRow",
    "MetadataCondition",
    "OutageRow",
    "OutboxItem",
    "OutboxWrite",
    "ProjectRow",
    "SearchFilters",
    "SessionRow",
    "Store",
    "SummaryRow",
    "SummaryWrite",
    "TopicRow",
    "TopicWrite",
    "WebhookDeliveryRow",
    "WebhookRow",
    "open_store",
    "parse_metadata_filters",
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
    status: str = "pending"
    error: str | None = None
    attempts: int = 0
    job_id: int | None = None
    processed_at: str | None = None
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
    kind: str
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
    status: str
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


@dataclass
class FactRow:
    pk: int
    project_id: str
    id: str
    user_id: str
    text: str
    kind: str
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
    action: str
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


class LeaseLostError(Exception):
    """The worker's lease expired and another worker reclaimed the job; its work is void."""


@runtime_checkable
class Store(Protocol):
    url: str

    def close(self) -> None: ...
    def schema_version(self) -> int: ...
    def get_meta(self, key: str) -> str | None: ...
    def set_meta(self, key: str, value: str) -> None: ...

    # sessions
    def create_session(self, row: SessionRow) -> tuple[SessionRow, bool]: ...
    def get_session(self, project_id: str, session_id: str) -> SessionRow | None: ...
    def list_sessions(
        self, project_id: str, user_id: str | None, limit: int, offset: int
    ) -> list[SessionRow]: ...

    # messages: accepted and queued in one transaction
    def add_messages(
        self, project_id: str, session: SessionRow, rows: Sequence[MessageRow]
    ) -> AddOutcome: ...
    def get_message(self, project_id: str, message_id: str) -> MessageRow | None: ...
    def get_messages(
        self, project_id: str, message_ids: Sequence[str]
    ) -> dict[str, MessageRow]: ...
    def list_messages(
        self,
        project_id: str,
        *,
        user_id: str | None = None,
        session_id: str | None = None,
        status: str | None = None,
        limit: int = 100,
        offset: int = 0,
        newest_first: bool = False,
    ) -> list[MessageRow]: ...
    def messages_by_pk(self, pks: Sequence[int]) -> dict[int, MessageRow]: ...

    # durable jobs
    def claim_batch(
        self,
        worker_id: str,
        lease_seconds: float,
        max_messages: int,
        for_jobs: Sequence[int] = (),
    ) -> ClaimedBatch | None:
        """The oldest ready jobs of one user (of the users of ``for_jobs``, if given), now
        held by ``worker_id``. During an outage none before its next probe; then this
        claim is the probe (``batch.probe``)."""
        ...

    def extend_lease(
        self, job_ids: Sequence[int], worker_id: str, lease_seconds: float
    ) -> bool: ...
    def complete_batch(
        self,
        batch: ClaimedBatch,
        *,
        embedder: str,
        vectors: np.ndarray,
        layers: LayerWrite | None = None,
    ) -> None: ...
    def fail_batch(
        self,
        batch: ClaimedBatch,
        error: str,
        retry_at: float | None,
        calls: Sequence[CallWrite] = (),
        *,
        counted: bool = True,
        retry_cap: int | None = None,
    ) -> None:
        """Record a failed attempt: the jobs fail for good (``retry_at`` None) or are
        queued again for ``retry_at``. ``counted=False``: the attempt does not count (each
        job's attempts go back down by one). ``retry_cap``: a later claim that takes any
        of these jobs takes at most that many jobs in all."""
        ...

    # outages of the services processing needs (see OutageRow)
    def record_outage(
        self, service: str, error: str, delay: Callable[[int], float], *, probe: bool
    ) -> list[OutageRow]:
        """``service`` failed a batch by being unavailable. A new outage, or a failed
        probe, schedules the next probe ``delay(failures)`` seconds from now; another
        batch failing meanwhile only updates the error. Returns every current outage."""
        ...

    def end_outage(self) -> list[OutageRow]:
        """A probe ended otherwise than by an outage: claims go on. Returns what ended."""
        ...

    def outages(self) -> list[OutageRow]:
        """The current outages; none: processing is not paused."""
        ...

    # derived layers
    def context_messages(
        self, project_id: str, user_id: str, before_pk: int, limit: int
    ) -> list[MessageRow]: ...
    def similar_summaries(
        self, project_id: str, user_id: str, query: np.ndarray, embedder: str, limit: int
    ) -> list[tuple[SummaryRow, float]]: ...
    def get_summaries(self, project_id: str, ids: Sequence[str]) -> list[SummaryRow]: ...
    def list_summaries(
        self,
        project_id: str,
        user_id: str | None,
        *,
        status: Sequence[str] = (),
        limit: int = 100,
        offset: int = 0,
        filters: ItemFilters | None = None,
    ) -> list[SummaryRow]: ...
    def summary_history(self, project_id: str, summary_id: str) -> list[dict[str, Any]]: ...
    def list_facts(
        self,
        project_id: str,
        user_id: str | None,
        *,
        limit: int = 100,
        offset: int = 0,
        newest_first: bool = False,
        filters: ItemFilters | None = None,
    ) -> list[FactRow]: ...
    def get_facts(self, project_id: str, ids: Sequence[str]) -> list[FactRow]: ...
    def list_topics(self, project_id: str, user_id: str) -> list[TopicRow]: ...
    def merge_topics(
        self, project_id: str, user_id: str, source_id: str, target_id: str
    ) -> int: ...
    def fulltext_summaries(
        self,
        project_id: str,
        user_id: str,
        terms: Sequence[str],
        limit: int,
        statuses: Sequence[str] = CURRENT_SUMMARY,
    ) -> list[tuple[int, float]]: ...
    def vector_summaries(
        self,
        project_id: str,
        user_id: str,
        query: np.ndarray,
        embedder: str,
        limit: int,
        statuses: Sequence[str] = CURRENT_SUMMARY,
    ) -> list[tuple[int, float]]: ...
    def summaries_by_pk(self, pks: Sequence[int]) -> dict[int, SummaryRow]: ...
    def fulltext_facts(
        self,
        project_id: str,
        user_id: str,
        terms: Sequence[str],
        limit: int,
        statuses: Sequence[str] = ("active",),
    ) -> list[tuple[int, float]]: ...
    def vector_facts(
        self,
        project_id: str,
        user_id: str,
        query: np.ndarray,
        embedder: str,
        limit: int,
        statuses: Sequence[str] = ("active",),
    ) -> list[tuple[int, float]]: ...
    def facts_by_pk(self, pks: Sequence[int]) -> dict[int, FactRow]: ...
    def topics_of_summaries(self, pks: Sequence[int]) -> dict[int, list[TopicRow]]: ...
    def speaker_names(self, project_id: str, user_id: str) -> list[str]: ...
    def retry_failed(self, project_id: str, user_id: str | None = None) -> int: ...
    def job_states(self, job_ids: Sequence[int]) -> dict[int, str]: ...
    def unfinished_jobs(self, project_id: str | None = None) -> int: ...
    def next_job_time(self) -> float | None: ...

    # search
    def fulltext_messages(
        self,
        project_id: str,
        user_id: str,
        terms: Sequence[str],
        limit: int,
        filters: SearchFilters,
    ) -> list[tuple[int, float]]: ...
    def vector_messages(
        self,
        project_id: str,
        user_id: str,
        query: np.ndarray,
        embedder: str,
        limit: int,
        filters: SearchFilters,
    ) -> list[tuple[int, float]]: ...

    # vectors bookkeeping
    def drop_vectors_except(self, embedder: str) -> int: ...
    def messages_missing_vectors(
        self, embedder: str, after_pk: int, limit: int
    ) -> list[MessageRow]: ...
    def layer_items_missing_vectors(
        self, embedder: str, kind: str, after_pk: int, limit: int
    ) -> list[tuple[int, str, str, str]]: ...
    def put_layer_vectors(
        self,
        embedder: str,
        kind: str,
        items: Sequence[tuple[int, str, str, str]],
        vectors: np.ndarray,
    ) -> None: ...
    def put_message_vectors(
        self, embedder: str, rows: Sequence[MessageRow], vectors: np.ndarray
    ) -> None: ...

    def stats(self, project_id: str | None = None) -> dict[str, Any]: ...

    # projects, keys, audit, governance (see store/_core/governance.py, removal.py)
    def create_project(self, project_id: str, name: str) -> tuple[ProjectRow, bool]: ...
    def get_project(self, project_id: str) -> ProjectRow | None: ...
    def list_projects(self) -> list[ProjectRow]: ...
    def create_api_key(self, row: ApiKeyRow, key_hash: str) -> None: ...
    def find_api_key(self, key_hash: str) -> ApiKeyRow | None: ...
    def list_api_keys(self, project_id: str | None) -> list[ApiKeyRow]: ...
    def revoke_api_key(self, key_id: str) -> ApiKeyRow | None: ...
    def touch_api_key(self, key_id: str, when: str) -> None: ...
    def list_audit(
        self, project_id: str, user_id: str | None, limit: int, offset: int
    ) -> list[AuditRow]: ...
    def set_summary_status(
        self, project_id: str, summary_id: str, status: str, reason: str, actor: str
    ) -> bool: ...
    def forget(
        self,
        project_id: str,
        user_id: str,
        *,
        message_ids: Sequence[str] = (),
        session_id: str | None = None,
        topic_id: str | None = None,
        actor: str,
        reason: str | None,
    ) -> dict[str, int] | None: ...
    def erase_user(
        self, project_id: str, user_id: str, *, actor: str, reason: str | None
    ) -> dict[str, int]: ...
    def session_status(
        self, project_id: str, session_id: str
    ) -> list[tuple[str, str, str | None]]: ...
    def get_topic(self, project_id: str, topic_id: str) -> TopicRow | None: ...

    # webhooks: records, delivery log, async outbox (see store/_sqlite_webhooks.py)
    def webhooks_version(self) -> int: ...
    def create_webhook(self, row: WebhookRow) -> WebhookRow: ...
    def get_webhook(self, project_id: str, hook_id: str) -> WebhookRow | None: ...
    def list_webhooks(
        self, project_id: str, *, enabled_only: bool = False, limit: int = -1, offset: int = 0
    ) -> list[WebhookRow]: ...
    def update_webhook(
        self, project_id: str, hook_id: str, changes: dict[str, Any]
    ) -> WebhookRow | None: ...
    def delete_webhook(self, project_id: str, hook_id: str) -> bool: ...
    def add_webhook_delivery(self, delivery: WebhookDeliveryRow, keep: int = 1000) -> None: ...
    def list_webhook_deliveries(
        self, project_id: str, hook_id: str, limit: int, offset: int
    ) -> list[WebhookDeliveryRow]: ...
    def claim_webhook_delivery(
        self, owner: str, lease_seconds: float, skip_projects: Sequence[str] = ()
    ) -> OutboxItem | None: ...
    def finish_webhook_delivery(
        self,
        item: OutboxItem,
        outcome: str,
        *,
        retry_at: float | None = None,
        error: str | None = None,
        log: WebhookDeliveryRow | None = None,
        keep: int = 1000,
    ) -> bool: ...
    def next_webhook_time(self) -> float | None: ...
    def webhook_outbox_counts(self, project_id: str | None = None) -> dict[str, int]: ...

    # recall: what candidates are ranked on, in one query per layer (see SQLiteStore)
    def recall_briefs(
        self,
        project_id: str,
        user_id: str,
        messages: Sequence[int] = (),
        facts: Sequence[int] = (),
        summaries: Sequence[int] = (),
        *,
        neighbours: bool = False,
        embedder: str | None = None,
    ) -> tuple[
        dict[int, tuple[Any, ...]], dict[int, tuple[Any, ...]], dict[int, tuple[Any, ...]]
    ]: ...


# Options each adapter understands; the facade passes all of them, whatever the URL.
_SQLITE_OPTIONS = frozenset({"busy_timeout_ms", "synchronous", "vector_index_threshold"})
_POSTGRES_OPTIONS = frozenset({"pool_size", "vector_index_threshold", "ef_search"})


def open_store(url: str, **options: Any) -> Store:
    """Open the store a database URL names: ``sqlite:///path`` (bare paths are SQLite) or
    ``postgresql://...``. Options an adapter does not use are ignored."""
    from ..errors import ConfigError

    lowered = url.lower()
    if lowered.startswith("sqlite:") or "://" not in url:
        from .sqlite import SQLiteStore

        return SQLiteStore(url, **{k: v for k, v in options.items() if k in _SQLITE_OPTIONS})
    if lowered.startswith(("postgresql:", "postgres:")):
        # Imported here: `import memstrata` must not need psycopg.
        from .postgres import PostgresStore

        return PostgresStore(url, **{k: v for k, v in options.items() if k in _POSTGRES_OPTIONS})
    if lowered.startswith(("http:", "https:")):
        raise ConfigError(
            "a remote memstrata server is not a database; use Memory(url) "
            "(memstrata.Memory opens a remote server itself) or sqlite:///path.db"
        )
    raise ConfigError(
        f"unsupported database URL {url!r}: expected sqlite:///path.db or postgresql://..."
    )
