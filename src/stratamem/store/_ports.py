"""The ``Store`` port, split by role: what each part of the engine needs from a database.

Each consumer declares the roles it uses (the pipeline: jobs and layers; recall: search,
messages and layers; the queues: jobs; the webhook engine: webhooks; the facade: all of
them, ``Store``). Both adapters implement every role (``tests/test_store_ports.py`` checks
that their methods have the port's signatures). Re-exported from ``stratamem.store``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ._briefs import Briefs
from ._dashboard_rows import ActivityCounts, ProvenanceRows, UiSessionRow, UserRow
from ._filters import SearchFilters
from ._rows import (
    AddOutcome,
    ApiKeyRow,
    AuditRow,
    CallWrite,
    ClaimedBatch,
    FactRow,
    ItemFilters,
    ItemRows,
    LayerWrite,
    MessageRow,
    OutageRow,
    ProjectRow,
    QueueRow,
    RecallLatencyRow,
    RecallRecordRow,
    SessionRow,
    StandingFact,
    SummaryRow,
    TopicRow,
    UsageDayRow,
)
from ._webhook_rows import OutboxItem, WebhookDeliveryRow, WebhookRow

__all__ = [
    "ROLES",
    "DashboardStore",
    "GovernanceStore",
    "JobStore",
    "LayerStore",
    "LeaseLostError",
    "MetaStore",
    "RecallLogStore",
    "SearchStore",
    "SessionStore",
    "Store",
    "WebhookStore",
]


class LeaseLostError(Exception):
    """The worker's lease expired and another worker reclaimed the job; its work is void."""


@runtime_checkable
class MetaStore(Protocol):
    """The database itself: where it is, which backend, its schema, meta keys, counts."""

    url: str

    @property
    def kind(self) -> str:
        """The backend: ``"sqlite"`` or ``"postgresql"`` (what the job queue is chosen by)."""
        ...

    def close(self) -> None: ...
    def schema_version(self) -> int: ...
    def get_meta(self, key: str) -> str | None: ...
    def set_meta(self, key: str, value: str) -> None: ...
    def stats(self, project_id: str | None = None) -> dict[str, Any]: ...
    def usage_by_day(
        self, project_id: str, since: float
    ) -> tuple[list[UsageDayRow], dict[str, int]]:
        """The project's model calls since ``since`` (epoch seconds) per UTC day
        (``YYYY-MM-DD``) and model, and its messages processed per UTC day since then."""
        ...


@runtime_checkable
class SessionStore(Protocol):
    """Sessions, and messages: accepted and queued in one transaction, and read back."""

    def create_session(self, row: SessionRow) -> tuple[SessionRow, bool]: ...
    def get_session(self, project_id: str, session_id: str) -> SessionRow | None: ...
    def list_sessions(
        self, project_id: str, user_id: str | None, limit: int, offset: int
    ) -> list[SessionRow]: ...
    def add_messages(
        self, project_id: str, session: SessionRow, rows: Sequence[MessageRow]
    ) -> AddOutcome: ...
    def add_captured(
        self, session: SessionRow, rows: Sequence[MessageRow], *, began_at: float
    ) -> AddOutcome | None:
        """``add_messages`` of a captured exchange into ``session`` (created if new),
        unless the exchange began (``began_at``, this process's epoch seconds) before the
        session's user was last erased, by any process: then nothing is stored (None).
        ``ConflictError`` if the session is another user's."""
        ...

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


@runtime_checkable
class JobStore(Protocol):
    """Durable jobs: claims under leases, completion and failure, outages, retries, states."""

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

    def retry_failed(self, project_id: str, user_id: str | None = None) -> int: ...
    def job_states(self, job_ids: Sequence[int]) -> dict[int, str]: ...
    def unfinished_jobs(self, project_id: str | None = None) -> int: ...
    def queue_state(self) -> list[QueueRow]:
        """Unfinished jobs of every project, per project and status (what metrics read)."""
        ...

    def next_job_time(self) -> float | None: ...


@runtime_checkable
class LayerStore(Protocol):
    """The derived layers: what the pipeline reads to derive them (a batch's context, the
    summaries it may strengthen or supersede), facts, summaries and topics as listed and
    curated, and the bookkeeping of their vectors (reindexing)."""

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
    def standing_facts(
        self, project_id: str, user_id: str, *, limit: int = 200
    ) -> list[StandingFact]: ...
    def list_topics(self, project_id: str, user_id: str) -> list[TopicRow]: ...
    def get_topic(self, project_id: str, topic_id: str) -> TopicRow | None: ...
    def merge_topics(
        self, project_id: str, user_id: str, source_id: str, target_id: str
    ) -> int: ...

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


@runtime_checkable
class SearchStore(Protocol):
    """What recall ranks on: full-text and vector candidates per layer (pk, score), their
    briefs, their rows by pk, the topics of summaries and the speakers a query may name."""

    def fulltext_items(
        self,
        kind: str,
        project_id: str,
        user_id: str,
        terms: Sequence[str],
        limit: int,
        statuses: Sequence[str] | None = None,
    ) -> list[tuple[int, float]]:
        """A user's facts or summaries (``kind``: ``"fact"``, ``"summary"``) in ``statuses``
        matching any of ``terms``, best first: (pk, BM25 score). ``statuses`` None: the
        layer's current ones (facts ``active``; summaries ``CURRENT_SUMMARY``)."""
        ...

    def vector_items(
        self,
        kind: str,
        project_id: str,
        user_id: str,
        query: np.ndarray,
        embedder: str,
        limit: int,
        statuses: Sequence[str] | None = None,
    ) -> list[tuple[int, float]]:
        """A user's facts or summaries (``kind``) in ``statuses`` (None: as for
        ``fulltext_items``) nearest to ``query``: (pk, cosine similarity)."""
        ...

    def summaries_by_pk(self, pks: Sequence[int]) -> dict[int, SummaryRow]: ...
    def facts_by_pk(self, pks: Sequence[int]) -> dict[int, FactRow]: ...
    def topics_of_summaries(self, pks: Sequence[int]) -> dict[int, list[TopicRow]]: ...
    def speaker_names(self, project_id: str, user_id: str) -> list[str]: ...
    def messages_by_pk(self, pks: Sequence[int]) -> dict[int, MessageRow]: ...
    def items_by_pk(
        self, messages: Sequence[int] = (), facts: Sequence[int] = (), summaries: Sequence[int] = ()
    ) -> ItemRows:
        """The full rows of these messages, facts and summaries (pks), each layer's by pk,
        read in one round trip where the backend can send statements together."""
        ...

    def fulltext_messages(
        self,
        project_id: str,
        user_id: str,
        terms: Sequence[str],
        limit: int,
        filters: SearchFilters,
    ) -> list[tuple[int, float]]: ...
    def fulltext_layers(
        self,
        project_id: str,
        user_id: str,
        variants: Sequence[Sequence[str]],
        limit: int,
        *,
        messages: SearchFilters | None,
        facts: Sequence[str] | None,
        summaries: Sequence[str] | None,
    ) -> list[dict[str, list[tuple[int, float]]]]:
        """For each variant (its terms), the full-text hits of every layer asked (None: not
        searched): messages passing ``messages``, facts and summaries in those statuses."""
        ...

    def vector_messages(
        self,
        project_id: str,
        user_id: str,
        query: np.ndarray,
        embedder: str,
        limit: int,
        filters: SearchFilters,
    ) -> list[tuple[int, float]]: ...
    def vector_layers(
        self,
        project_id: str,
        user_id: str,
        queries: Sequence[np.ndarray],
        embedder: str,
        limit: int,
        *,
        messages: SearchFilters | None,
        facts: Sequence[str] | None,
        summaries: Sequence[str] | None,
    ) -> list[dict[str, list[tuple[int, float]]]]:
        """For each of ``queries``, by layer, what ``vector_messages`` (messages passing
        the filters ``messages``) and ``vector_items`` (facts and summaries in the statuses
        given) find; a layer given None is not searched. Asked together so that a backend
        may answer in fewer round trips."""
        ...

    # recall: what candidates are ranked on, in one query per layer (see _briefs.py)
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
    ) -> Briefs: ...


@runtime_checkable
class GovernanceStore(Protocol):
    """Projects, API keys, the audit log, audited status changes, and removal from
    provenance upward (forget, erase): store/_core/governance.py and removal.py."""

    def create_project(self, project_id: str, name: str) -> tuple[ProjectRow, bool]: ...
    def get_project(self, project_id: str) -> ProjectRow | None: ...
    def list_projects(self) -> list[ProjectRow]: ...
    def create_api_key(self, row: ApiKeyRow, key_hash: str) -> None: ...
    def find_api_key(self, key_hash: str) -> ApiKeyRow | None: ...
    def list_api_keys(self, project_id: str | None) -> list[ApiKeyRow]: ...
    def revoke_api_key(self, key_id: str) -> ApiKeyRow | None: ...
    def touch_api_key(self, key_id: str, when: str) -> None: ...
    def list_audit(
        self,
        project_id: str,
        user_id: str | None,
        limit: int,
        offset: int,
        *,
        newest_first: bool = False,
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


@runtime_checkable
class WebhookStore(Protocol):
    """Webhook records, the delivery log, and the async outbox: store/_core/webhooks.py."""

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


@runtime_checkable
class DashboardStore(Protocol):
    """What the dashboard reads (a project's users, an item's provenance both ways,
    activity per minute) and its sign-in sessions: store/_core/dashboard.py."""

    def list_users(
        self, project_id: str, *, search: str | None = None, limit: int = 50, offset: int = 0
    ) -> list[UserRow]: ...
    def count_users(self, project_id: str, *, search: str | None = None) -> int: ...
    def provenance(self, project_id: str, item_id: str) -> ProvenanceRows | None: ...
    def activity(self, project_id: str, since: float, until: float) -> ActivityCounts: ...

    # sign-ins: rows keyed by the SHA-256 of their token
    def create_ui_session(self, row: UiSessionRow) -> bool:
        """Store a sign-in; False if it names an API key that is unknown or revoked."""
        ...

    def get_ui_session(self, id_hash: str) -> UiSessionRow | None:
        """The sign-in, unless it expired."""
        ...

    def touch_ui_session(self, id_hash: str, when: float) -> None: ...
    def update_ui_session_project(self, id_hash: str, project_id: str | None) -> bool: ...
    def delete_ui_session(self, id_hash: str) -> bool: ...
    def delete_ui_sessions_of_key(self, key_id: str) -> int:
        """End the sign-ins made with an API key (``revoke_api_key`` does it too)."""
        ...

    def prune_ui_sessions(self, now: float) -> int: ...


@runtime_checkable
class RecallLogStore(Protocol):
    """The recall log: what the faces' recalls injected, bounded (store/_core/recall_log.py).
    Times are epoch seconds."""

    def add_recall_records(self, rows: Sequence[RecallRecordRow]) -> int:
        """Insert ``rows`` but those whose recall began before their user's memory was last
        forgotten or erased, by any process (store/_core/erasures.py): how many were left
        out."""
        ...

    def list_recall_records(
        self, project_id: str, user_id: str | None = None, *, limit: int = 50, offset: int = 0
    ) -> list[RecallRecordRow]:
        """Newest first."""
        ...

    def recall_latency_series(
        self, project_id: str, since: float, bucket_seconds: float
    ) -> list[RecallLatencyRow]:
        """Buckets of ``bucket_seconds`` from ``since``, oldest first; empty ones left out."""
        ...

    def prune_recall_log(self, project_id: str | None, keep: int, older_than: float) -> int:
        """Delete records older than ``older_than`` and all but the newest ``keep`` per
        project (of ``project_id`` only, if given); the number deleted."""
        ...


@runtime_checkable
class Store(
    MetaStore,
    SessionStore,
    JobStore,
    LayerStore,
    SearchStore,
    GovernanceStore,
    WebhookStore,
    DashboardStore,
    RecallLogStore,
    Protocol,
):
    """Everything the engine needs from a database, and nothing more: every role."""


#: The role protocols ``Store`` is the union of.
ROLES: tuple[type, ...] = tuple(base for base in Store.__bases__ if base is not Protocol)
