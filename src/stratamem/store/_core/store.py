"""``SQLStore``: the ``Store`` port written once over the dialect; backends subclass it.

A backend supplies its connections (``_query`` for reads, ``_transaction`` for one write
transaction, both yielding a ``Tx``), its dialect, and what really differs between
databases: full text, vectors, job claiming, migrations (the abstract methods below and
the role methods it implements itself). The rules of the memory — what a batch writes,
what forgetting removes, how a status change is audited, how a webhook delivery is queued —
are the transactional scripts of this package, called from here.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import numpy as np

from ...errors import ConflictError
from .. import (
    CURRENT_SUMMARY,
    AddOutcome,
    ApiKeyRow,
    AuditRow,
    Briefs,
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
    SearchFilters,
    SessionRow,
    StandingFact,
    SummaryRow,
    TopicRow,
    UsageDayRow,
)
from .._batches import processing_state
from .._dashboard_rows import ActivityCounts, ProvenanceRows, UiSessionRow, UserRow
from .._webhook_rows import OutboxItem, WebhookDeliveryRow, WebhookRow
from . import (
    dashboard,
    erasures,
    governance,
    ingest,
    jobs,
    reads,
    recall,
    recall_log,
    removal,
    webhooks,
)
from . import layers as _layers
from .dialect import Dialect, Tx
from .layers import FulltextAsk, FulltextColumns, LayerItem, LayerSearch, VectorRow
from .rows import SESSION_COLUMNS, session_row

__all__ = ["SQLStore"]

# A searched layer's table and the statuses it presents as current memory.
_LAYERS = {"fact": ("facts", ("active",)), "summary": ("summaries", CURRENT_SUMMARY)}


class SQLStore(ABC):
    """The memory's rules over one SQL backend (see the module docstring)."""

    url: str
    dialect: Dialect

    @property
    def kind(self) -> str:
        """The backend: ``"sqlite"`` or ``"postgresql"`` (what the job queue is chosen by)."""
        return self.dialect.name

    # -- what a backend supplies -----------------------------------------------------------

    @abstractmethod
    def _query(self) -> AbstractContextManager[Tx]:
        """A connection for reads: each statement commits on its own."""

    @abstractmethod
    def _transaction(self) -> AbstractContextManager[Tx]:
        """One write transaction, committed when the block ends, rolled back on error."""

    # -- meta --------------------------------------------------------------------------------

    def get_meta(self, key: str) -> str | None:
        with self._query() as tx:
            value = tx.scalar("SELECT value FROM meta WHERE key = ?", (key,))
        return None if value is None else str(value)

    def set_meta(self, key: str, value: str) -> None:
        with self._transaction() as tx:
            tx.execute(
                "INSERT INTO meta (key, value) VALUES (?, ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (key, value),
            )

    # -- sessions ----------------------------------------------------------------------------

    def create_session(self, row: SessionRow) -> tuple[SessionRow, bool]:
        with self._transaction() as tx:
            return _create_session(tx, row)

    def get_session(self, project_id: str, session_id: str) -> SessionRow | None:
        with self._query() as tx:
            row = tx.one(
                f"SELECT {SESSION_COLUMNS} FROM sessions WHERE project_id = ? AND id = ?",
                (project_id, session_id),
            )
        return None if row is None else session_row(row, self.dialect)

    def list_sessions(
        self, project_id: str, user_id: str | None, limit: int, offset: int
    ) -> list[SessionRow]:
        sql = f"SELECT {SESSION_COLUMNS} FROM sessions WHERE project_id = ?"
        params: list[Any] = [project_id]
        if user_id is not None:
            sql += " AND user_id = ?"
            params.append(user_id)
        sql += " ORDER BY pk LIMIT ? OFFSET ?"
        params += [limit, offset]
        with self._query() as tx:
            return [session_row(r, self.dialect) for r in tx.all(sql, params)]

    # -- messages and jobs (see ingest.py, jobs.py) -----------------------------------------
    # Accepting messages with their job, reading them, a batch's completion and failure,
    # outages, retries and job states.

    def add_messages(
        self, project_id: str, session: SessionRow, rows: Sequence[MessageRow]
    ) -> AddOutcome:
        with self._transaction() as tx:
            return ingest.add_messages(tx, self, project_id, session, rows)

    def add_captured(
        self, session: SessionRow, rows: Sequence[MessageRow], *, began_at: float
    ) -> AddOutcome | None:
        with self._transaction() as tx:
            key = (session.project_id, session.user_id)
            erased = erasures.tombstones(tx, [key], "erased_at").get(key)
            if erasures.began_before(began_at, erasures.clock_offset(tx), erased):
                return None
            stored, _ = _create_session(tx, session)
            if stored.user_id != session.user_id:
                raise ConflictError(
                    f"session {session.id!r} belongs to another user; the exchange is not stored"
                )
            return ingest.add_messages(tx, self, session.project_id, stored, rows)

    def get_message(self, project_id: str, message_id: str) -> MessageRow | None:
        with self._query() as tx:
            return ingest.get_message(tx, project_id, message_id)

    def get_messages(self, project_id: str, message_ids: Sequence[str]) -> dict[str, MessageRow]:
        """The messages of ``message_ids`` that exist, by id (one query)."""
        if not message_ids:
            return {}
        with self._query() as tx:
            return ingest.get_messages(tx, project_id, message_ids)

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
    ) -> list[MessageRow]:
        with self._query() as tx:
            return ingest.list_messages(
                tx,
                project_id,
                user_id=user_id,
                session_id=session_id,
                status=status,
                limit=limit,
                offset=offset,
                newest_first=newest_first,
            )

    def messages_by_pk(self, pks: Sequence[int]) -> dict[int, MessageRow]:
        if not pks:
            return {}
        with self._query() as tx:
            return ingest.messages_by_pk(tx, pks)

    def context_messages(
        self, project_id: str, user_id: str, before_pk: int, limit: int
    ) -> list[MessageRow]:
        with self._query() as tx:
            return ingest.context_messages(tx, project_id, user_id, before_pk, limit)

    def extend_lease(self, job_ids: Sequence[int], worker_id: str, lease_seconds: float) -> bool:
        if not job_ids:
            return True
        with self._transaction() as tx:
            return jobs.extend_lease(tx, job_ids, worker_id, lease_seconds)

    def complete_batch(
        self,
        batch: ClaimedBatch,
        *,
        embedder: str,
        vectors: np.ndarray,
        layers: LayerWrite | None = None,
    ) -> None:
        """The batch's vectors and layers written, its jobs done: one transaction, under
        the user's lock, if the worker still holds the batch (else ``LeaseLostError``)."""
        now = time.time()
        # Outside the batch's transaction: making an index inside it could deadlock with
        # other writers (PostgreSQL's vector index of a new kind and dimension).
        self._prepare_vectors(_layers.layer_dims(vectors, layers))
        with self._transaction() as tx:
            tx.lock_user(batch.project_id, batch.user_id)
            jobs.check_lease(tx, batch)
            _layers.put_vectors(tx, self, embedder, batch.messages, vectors)
            if layers is not None:
                _layers.write_layers(tx, self, batch, embedder, layers)
                _layers.record_calls(tx, batch, layers.calls)
                webhooks.enqueue_webhooks(tx, layers.outbox)
            jobs.finish_batch(tx, batch, now)

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
        with self._transaction() as tx:
            jobs.check_lease(tx, batch)
            # Tokens spent on a failed attempt were still spent: account for them.
            _layers.record_calls(tx, batch, calls)
            jobs.fail_batch(tx, batch, error, retry_at, counted=counted, retry_cap=retry_cap)

    def outages(self) -> list[OutageRow]:
        with self._query() as tx:
            return jobs.outages(tx)

    def record_outage(
        self, service: str, error: str, delay: Callable[[int], float], *, probe: bool
    ) -> list[OutageRow]:
        with self._transaction() as tx:
            return jobs.record_outage(tx, service, error, delay, probe=probe)

    def end_outage(self) -> list[OutageRow]:
        with self._transaction() as tx:
            return jobs.end_outage(tx)

    def retry_failed(self, project_id: str, user_id: str | None = None) -> int:
        """Queue terminally failed jobs again (after the cause was fixed)."""
        with self._transaction() as tx:
            return jobs.retry_failed(tx, project_id, user_id)

    def job_states(self, job_ids: Sequence[int]) -> dict[int, str]:
        if not job_ids:
            return {}
        with self._query() as tx:
            return jobs.job_states(tx, job_ids)

    def unfinished_jobs(self, project_id: str | None = None) -> int:
        with self._query() as tx:
            return jobs.unfinished_jobs(tx, project_id)

    def next_job_time(self) -> float | None:
        with self._query() as tx:
            return jobs.next_job_time(tx)

    def queue_state(self) -> list[QueueRow]:
        with self._query() as tx:
            return jobs.queue_state(tx)

    def usage_by_day(
        self, project_id: str, since: float
    ) -> tuple[list[UsageDayRow], dict[str, int]]:
        with self._query() as tx:
            return jobs.usage_by_day(tx, project_id, since)

    def llm_usage(self, project_id: str | None = None) -> dict[str, Any]:
        with self._query() as tx:
            return jobs.llm_usage(tx, project_id)

    def stats(self, project_id: str | None = None) -> dict[str, Any]:
        with self._query() as tx:
            counts = jobs.store_counts(tx, project_id)
            outages = jobs.outages(tx)
            embedder = tx.scalar("SELECT value FROM meta WHERE key = 'embedder'")
            usage = jobs.llm_usage(tx, project_id)
        return {
            **self._store_facts(),
            **counts,
            "embedder": embedder,
            "llm_usage": usage,
            "processing": processing_state(outages),
        }

    @abstractmethod
    def _store_facts(self) -> dict[str, Any]:
        """The first entries of ``stats()``, the backend's own: ``store`` (its name), where
        the data is (``path`` or ``url``), ``schema_version`` and ``size_bytes``."""

    # -- the derived layers: writes (see layers.py) -----------------------------------------
    # What a completed batch adds, strengthens, supersedes and files under topics.

    def merge_topics(self, project_id: str, user_id: str, source_id: str, target_id: str) -> int:
        """File every summary of ``source_id`` under ``target_id`` and retire the source.

        Returns how many summaries moved. The source keeps a ``merged_into`` link."""
        with self._transaction() as tx:
            return _layers.merge_topics(tx, project_id, user_id, source_id, target_id)

    def drop_vectors_except(self, embedder: str) -> int:
        with self._transaction() as tx:
            dropped = _layers.drop_vectors(tx, embedder)
            self._invalidate_vectors(tx)
        self._clear_vector_caches()
        return dropped

    def messages_missing_vectors(
        self, embedder: str, after_pk: int, limit: int
    ) -> list[MessageRow]:
        with self._query() as tx:
            return _layers.messages_missing_vectors(tx, embedder, after_pk, limit)

    def layer_items_missing_vectors(
        self, embedder: str, kind: str, after_pk: int, limit: int
    ) -> list[LayerItem]:
        """(pk, project_id, user_id, text) of facts or summaries without a vector of
        ``embedder``, in pk order, for re-embedding."""
        with self._query() as tx:
            return _layers.layer_items_missing_vectors(tx, embedder, kind, after_pk, limit)

    def put_layer_vectors(
        self, embedder: str, kind: str, items: Sequence[LayerItem], vectors: np.ndarray
    ) -> None:
        if len(items):
            self._prepare_vectors({kind: int(np.asarray(vectors).shape[1])})
        by_user: dict[tuple[str, str], list[tuple[int, np.ndarray]]] = {}
        for (pk, project_id, user_id, _), v in zip(items, vectors, strict=True):
            by_user.setdefault((project_id, user_id), []).append((pk, v))
        with self._transaction() as tx:
            # In user order, as put_vectors writes (a backend may lock each user).
            for (project_id, user_id), mine in sorted(by_user.items(), key=lambda kv: kv[0]):
                _layers.insert_vectors(tx, self, embedder, kind, project_id, user_id, mine)

    def put_message_vectors(
        self, embedder: str, rows: Sequence[MessageRow], vectors: np.ndarray
    ) -> None:
        if len(rows):
            self._prepare_vectors({"message": int(np.asarray(vectors).shape[1])})
        with self._transaction() as tx:
            _layers.put_vectors(tx, self, embedder, rows, vectors)

    # What the layer writes ask of the backend.

    @abstractmethod
    def _fulltext_columns(self, text: str) -> FulltextColumns:
        """Columns of a messages, facts or summaries row that index its ``text`` for full-text
        search,
        set by the same INSERT or UPDATE as the text (every write of it, so no statement
        of their own): (column, SQL value holding one ``?``, that parameter) each. Empty
        for a backend that indexes in a table of its own (``_index_fulltext``)."""

    @abstractmethod
    def _index_fulltext(
        self, tx: Tx, table: str, pk: int, text: str, project_id: str, user_id: str, *, new: bool
    ) -> None:
        """Index ``text``, the text of row ``pk`` of ``table`` (``messages``, ``facts``,
        ``summaries``) of
        that user, in the transaction that wrote it: just inserted (``new``) or changed. A
        no-op for a backend whose index is in the row (``_fulltext_columns``)."""

    @abstractmethod
    def _insert_vector_rows(self, tx: Tx, rows: Sequence[VectorRow]) -> None:
        """Store ``rows`` of ``vectors`` (their embedder already claimed), each replacing
        the vector of that item and embedder the table may hold."""

    @abstractmethod
    def _prepare_vectors(self, dims: dict[str, int]) -> None:
        """Before a write of vectors (kind -> dimension), outside its transaction: make
        what searching them needs (an index per kind and dimension), if missing."""

    @abstractmethod
    def _invalidate_vectors(self, tx: Tx) -> None:
        """In the transaction that dropped other embedders' vectors: tell readers of this
        database (other processes included) that what they hold of them is void."""

    @abstractmethod
    def _clear_vector_caches(self) -> None:
        """After other embedders' vectors were dropped (committed): forget what this
        process knows of them (caches, per-user indexes of their dimension)."""

    # -- the derived layers: reads (see reads.py) -------------------------------------------
    # Facts, summaries, topics and their histories, by id, by pk and listed. A read of no
    # ids returns at once, without a connection: recall often asks with none.

    def get_summaries(self, project_id: str, ids: Sequence[str]) -> list[SummaryRow]:
        if not ids:
            return []
        with self._query() as tx:
            return reads.get_summaries(tx, project_id, ids)

    def list_summaries(
        self,
        project_id: str,
        user_id: str | None,
        *,
        status: Sequence[str] = (),
        limit: int = 100,
        offset: int = 0,
        filters: ItemFilters | None = None,
    ) -> list[SummaryRow]:
        with self._query() as tx:
            return reads.list_summaries(tx, project_id, user_id, status, limit, offset, filters)

    def summary_history(self, project_id: str, summary_id: str) -> list[dict[str, Any]]:
        with self._query() as tx:
            return reads.summary_history(tx, project_id, summary_id)

    def summaries_by_pk(self, pks: Sequence[int]) -> dict[int, SummaryRow]:
        if not pks:
            return {}
        with self._query() as tx:
            return reads.summaries_by_pk(tx, pks)

    def list_facts(
        self,
        project_id: str,
        user_id: str | None,
        *,
        limit: int = 100,
        offset: int = 0,
        newest_first: bool = False,
        filters: ItemFilters | None = None,
    ) -> list[FactRow]:
        with self._query() as tx:
            return reads.list_facts(tx, project_id, user_id, limit, offset, newest_first, filters)

    def standing_facts(
        self, project_id: str, user_id: str, *, limit: int = 200
    ) -> list[StandingFact]:
        with self._query() as tx:
            return reads.standing_facts(tx, project_id, user_id, limit)

    def get_facts(self, project_id: str, ids: Sequence[str]) -> list[FactRow]:
        if not ids:
            return []
        with self._query() as tx:
            return reads.get_facts(tx, project_id, ids)

    def items_by_pk(
        self, messages: Sequence[int] = (), facts: Sequence[int] = (), summaries: Sequence[int] = ()
    ) -> ItemRows:
        if not (messages or facts or summaries):
            return {}, {}, {}
        with self._query() as tx:
            return reads.items_by_pk(tx, messages, facts, summaries)

    def facts_by_pk(self, pks: Sequence[int]) -> dict[int, FactRow]:
        if not pks:
            return {}
        with self._query() as tx:
            return reads.facts_by_pk(tx, pks)

    def list_topics(self, project_id: str, user_id: str) -> list[TopicRow]:
        with self._query() as tx:
            return reads.list_topics(tx, project_id, user_id)

    def topics_of_summaries(self, pks: Sequence[int]) -> dict[int, list[TopicRow]]:
        """The active topics each summary is filed under (summary pk → topics)."""
        if not pks:
            return {}
        with self._query() as tx:
            return reads.topics_of_summaries(tx, pks)

    def speaker_names(self, project_id: str, user_id: str) -> list[str]:
        """Names of the speakers of a user's messages (messages sent with a ``name``)."""
        with self._query() as tx:
            return reads.speaker_names(tx, project_id, user_id)

    # -- search: the layers' candidates ------------------------------------------------------
    # The rules are here (what an empty query or status list returns, which statuses are
    # current); the ranking is the backend's (FTS5 or tsvector BM25, in-process or pgvector).

    def fulltext_messages(
        self,
        project_id: str,
        user_id: str,
        terms: Sequence[str],
        limit: int,
        filters: SearchFilters,
    ) -> list[tuple[int, float]]:
        """A user's messages passing ``filters`` that match any of ``terms``, best first
        (BM25)."""
        if not terms or limit <= 0:
            return []
        search = LayerSearch(project_id, user_id, limit, ())
        return self._fulltext_many([FulltextAsk("messages", search, terms, filters)])[0]

    def vector_messages(
        self,
        project_id: str,
        user_id: str,
        query: np.ndarray,
        embedder: str,
        limit: int,
        filters: SearchFilters,
    ) -> list[tuple[int, float]]:
        """A user's messages passing ``filters`` nearest to ``query``: (pk, cosine
        similarity)."""
        if limit <= 0:
            return []
        search = LayerSearch(project_id, user_id, limit, ())
        return self._vector_messages(search, query, embedder, filters)

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
        (None: the layer's current ones) matching any of ``terms``, best first (BM25)."""
        table, current = _LAYERS[kind]
        statuses = current if statuses is None else statuses
        if not terms or limit <= 0 or not statuses:
            return []
        search = LayerSearch(project_id, user_id, limit, statuses)
        return self._fulltext_many([FulltextAsk(table, search, terms, None)])[0]

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
        """For each variant (its terms), what ``fulltext_messages`` finds with the filters
        ``messages`` and ``fulltext_items`` in the statuses ``facts`` and ``summaries``, by
        layer; a layer given None is not searched. In one round trip where the backend
        sends statements together."""
        layers = [
            (kind, table, filters, statuses)
            for kind, table, filters, statuses in (
                ("message", "messages", messages, ()),
                ("fact", "facts", None, facts),
                ("summary", "summaries", None, summaries),
            )
            if (filters if kind == "message" else statuses) is not None
        ]
        out: list[dict[str, list[tuple[int, float]]]] = [
            {kind: [] for kind, *_ in layers} for _ in variants
        ]
        asks: list[FulltextAsk] = []
        into: list[tuple[int, str]] = []
        for v, terms in enumerate(variants):
            for kind, table, filters, statuses in layers:
                if not terms or limit <= 0 or (kind != "message" and not statuses):
                    continue
                search = LayerSearch(project_id, user_id, limit, statuses or ())
                asks.append(FulltextAsk(table, search, terms, filters))
                into.append((v, kind))
        if asks:
            for (v, kind), found in zip(into, self._fulltext_many(asks), strict=True):
                out[v][kind] = found
        return out

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
        """A user's facts or summaries (``kind``) in ``statuses`` (None: the layer's current
        ones) nearest to ``query``: (pk, cosine similarity)."""
        current = _LAYERS[kind][1]
        statuses = current if statuses is None else statuses
        if limit <= 0 or not statuses:
            return []
        search = LayerSearch(project_id, user_id, limit, statuses)
        return self._vector_layer(search, kind, query, embedder)

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
        """For each of ``queries``, by layer, what ``vector_messages`` and ``vector_items``
        find; a layer given None is not searched (one search per query and layer here; a
        backend may override this with fewer round trips)."""
        out: list[dict[str, list[tuple[int, float]]]] = []
        for q in queries:
            found: dict[str, list[tuple[int, float]]] = {}
            if messages is not None:
                found["message"] = self.vector_messages(
                    project_id, user_id, q, embedder, limit, messages
                )
            for kind, statuses in (("fact", facts), ("summary", summaries)):
                if statuses is not None:
                    found[kind] = self.vector_items(
                        kind, project_id, user_id, q, embedder, limit, statuses
                    )
            out.append(found)
        return out

    def similar_summaries(
        self, project_id: str, user_id: str, query: np.ndarray, embedder: str, limit: int
    ) -> list[tuple[SummaryRow, float]]:
        """Current (active or deprioritized) summaries nearest to ``query``."""
        found = self.vector_items("summary", project_id, user_id, query, embedder, limit)
        rows = self.summaries_by_pk([pk for pk, _ in found])
        return [(rows[pk], sim) for pk, sim in found if pk in rows]

    @abstractmethod
    def _fulltext_many(self, asks: Sequence[FulltextAsk]) -> list[list[tuple[int, float]]]:
        """Each ask's rows, best first: (pk, BM25 score as FTS5 computes it)."""

    @abstractmethod
    def _vector_messages(
        self, search: LayerSearch, query: np.ndarray, embedder: str, filters: SearchFilters
    ) -> list[tuple[int, float]]:
        """The ``search``'s messages passing ``filters`` nearest to ``query`` among
        ``embedder``'s vectors: (pk, cosine similarity)."""

    @abstractmethod
    def _vector_layer(
        self, search: LayerSearch, kind: str, query: np.ndarray, embedder: str
    ) -> list[tuple[int, float]]:
        """The ``search``'s items of ``kind`` (``fact``, ``summary``) nearest to ``query``
        among ``embedder``'s vectors: (pk, cosine similarity)."""

    # -- recall (see recall.py) -------------------------------------------------------------
    # What candidates are ranked on, one query per layer, as named briefs.

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
    ) -> Briefs:
        """What recall ranks items of a user on, without their text (read for the hits
        only): ``MessageBrief``, ``FactBrief`` and ``SummaryBrief`` by pk. A message's
        neighbouring turns only with ``neighbours``; vectors only from ``embedder``."""
        pks = (messages, facts, summaries)
        reads = recall.brief_reads(self.dialect, project_id, user_id, pks, neighbours)
        if not reads:
            return {}, {}, {}
        rows = self._read_briefs(reads, project_id, user_id, embedder)
        return recall.briefs(reads, rows, self.dialect)

    @abstractmethod
    def _read_briefs(
        self,
        reads: Sequence[recall.BriefRead],
        project_id: str,
        user_id: str,
        embedder: str | None,
    ) -> Iterable[Iterable[Sequence[Any]]]:
        """Run each read, ``SELECT {read.columns} {read.source}`` (the core's SQL, ``?``
        placeholders), and return its rows, in order, each with the vector of its item
        ``m`` (a ``read.kind``) from ``embedder`` appended as float32 bytes: None without
        one, or without an embedder. The vector may be selected with the row or looked up
        after it, wherever the backend keeps vectors. Both levels may be lazy (each is
        iterated once, in order, right away)."""

    # -- governance (see governance.py) -----------------------------------------------------
    # Projects, keys, audit, status changes, and removal from provenance upward.

    def create_project(self, project_id: str, name: str) -> tuple[ProjectRow, bool]:
        with self._transaction() as tx:
            return governance.create_project(tx, project_id, name)

    def get_project(self, project_id: str) -> ProjectRow | None:
        with self._query() as tx:
            return governance.get_project(tx, project_id)

    def list_projects(self) -> list[ProjectRow]:
        with self._query() as tx:
            return governance.list_projects(tx)

    def create_api_key(self, row: ApiKeyRow, key_hash: str) -> None:
        with self._transaction() as tx:
            governance.create_api_key(tx, row, key_hash)

    def find_api_key(self, key_hash: str) -> ApiKeyRow | None:
        with self._query() as tx:
            return governance.find_api_key(tx, key_hash)

    def list_api_keys(self, project_id: str | None) -> list[ApiKeyRow]:
        with self._query() as tx:
            return governance.list_api_keys(tx, project_id)

    def revoke_api_key(self, key_id: str) -> ApiKeyRow | None:
        """Revoke a key; the dashboard sessions signed in with it end in the same
        transaction (a revoked key must not keep a browser signed in)."""
        with self._transaction() as tx:
            row = governance.revoke_api_key(tx, key_id)
            dashboard.delete_ui_sessions_of_key(tx, key_id)
            return row

    def touch_api_key(self, key_id: str, when: str) -> None:
        with self._transaction() as tx:
            governance.touch_api_key(tx, key_id, when)

    def list_audit(
        self,
        project_id: str,
        user_id: str | None,
        limit: int,
        offset: int,
        *,
        newest_first: bool = False,
    ) -> list[AuditRow]:
        with self._query() as tx:
            return governance.list_audit(
                tx, project_id, user_id, limit, offset, newest_first=newest_first
            )

    def set_summary_status(
        self, project_id: str, summary_id: str, status: str, reason: str, actor: str
    ) -> bool:
        with self._transaction() as tx:
            return governance.set_summary_status(tx, project_id, summary_id, status, reason, actor)

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
    ) -> dict[str, int] | None:
        with self._transaction() as tx:
            scope = (message_ids, session_id, topic_id)
            counts = removal.forget(self, tx, project_id, user_id, scope, actor, reason)
        if counts is not None:
            self._seal(project_id, user_id, erased=False)
            self._memory_removed(project_id, user_id, erased=False)
        return counts

    def erase_user(
        self, project_id: str, user_id: str, *, actor: str, reason: str | None
    ) -> dict[str, int]:
        with self._transaction() as tx:
            counts = removal.erase_user(self, tx, project_id, user_id, actor=actor, reason=reason)
        self._seal(project_id, user_id, erased=True)
        self._memory_removed(project_id, user_id, erased=True)
        return counts

    def _seal(self, project_id: str, user_id: str, *, erased: bool) -> None:
        """After a forget or an erasure committed: its tombstone (see ``erasures.py``), and
        the recall log records written in between deleted."""
        with self._transaction() as tx:
            erasures.seal(tx, project_id, user_id, erased=erased)
            recall_log.forget_recall_log(tx, project_id, user_id)

    def session_status(self, project_id: str, session_id: str) -> list[tuple[str, str, str | None]]:
        with self._query() as tx:
            return governance.session_status(tx, project_id, session_id)

    def get_topic(self, project_id: str, topic_id: str) -> TopicRow | None:
        with self._query() as tx:
            return governance.get_topic(tx, project_id, topic_id)

    @abstractmethod
    def _unindex_gone(self, tx: Tx, table: str, gone: str) -> None:
        """In a removal, before the rows of ``table`` (messages, facts or summaries) whose
        pk is in the temporary table ``gone`` are deleted: remove their full-text index
        entries where those are not part of the row."""

    @abstractmethod
    def _vectors_removed(self, tx: Tx, project_id: str, user_id: str) -> None:
        """In a removal, once vectors of the user's messages, facts or summaries are
        deleted: make whatever holds them outside the table (in this process or another)
        read them again."""

    @abstractmethod
    def _memory_removed(self, project_id: str, user_id: str, *, erased: bool) -> None:
        """After ``forget`` or ``erase_user`` (``erased``; even of an unknown user)
        committed: drop what the backend keeps for the user outside the tables."""

    # -- webhooks (see webhooks.py) ---------------------------------------------------------
    # Webhook records, the delivery log and the async outbox.

    def webhooks_version(self) -> int:
        with self._query() as tx:
            return webhooks.version(tx)

    def create_webhook(self, row: WebhookRow) -> WebhookRow:
        with self._transaction() as tx:
            return webhooks.create_hook(tx, row)

    def get_webhook(self, project_id: str, hook_id: str) -> WebhookRow | None:
        with self._query() as tx:
            return webhooks.get_hook(tx, project_id, hook_id)

    def list_webhooks(
        self, project_id: str, *, enabled_only: bool = False, limit: int = -1, offset: int = 0
    ) -> list[WebhookRow]:
        """A project's hooks in creation order (the order hooks on one point run in)."""
        with self._query() as tx:
            return webhooks.list_hooks(tx, project_id, enabled_only, limit, offset)

    def update_webhook(
        self, project_id: str, hook_id: str, changes: dict[str, Any]
    ) -> WebhookRow | None:
        webhooks.check_changes(changes)
        with self._transaction() as tx:
            return webhooks.update_hook(tx, project_id, hook_id, changes)

    def delete_webhook(self, project_id: str, hook_id: str) -> bool:
        """Delete a hook with its delivery log and queued deliveries."""
        with self._transaction() as tx:
            return webhooks.delete_hook(tx, project_id, hook_id)

    def add_webhook_delivery(self, delivery: WebhookDeliveryRow, keep: int = 1000) -> None:
        """Log one delivery attempt; the log keeps about the last ``keep`` per hook."""
        with self._transaction() as tx:
            webhooks.add_delivery(tx, delivery, keep)

    def list_webhook_deliveries(
        self, project_id: str, hook_id: str, limit: int, offset: int
    ) -> list[WebhookDeliveryRow]:
        """A hook's delivery attempts, newest first."""
        with self._query() as tx:
            return webhooks.list_deliveries(tx, project_id, hook_id, limit, offset)

    def claim_webhook_delivery(
        self, owner: str, lease_seconds: float, skip_projects: Sequence[str] = ()
    ) -> OutboxItem | None:
        """Take the next due async delivery under a lease (``None`` when nothing is due),
        oldest due first, of any project but ``skip_projects``."""
        now = time.time()
        # Idle senders poll: look before opening a write transaction (SQLite's takes the
        # database's write lock).
        with self._query() as tx:
            if not webhooks.any_due(tx, now, skip_projects):
                return None
        with self._transaction() as tx:
            return webhooks.claim_delivery(tx, owner, lease_seconds, skip_projects, now)

    def finish_webhook_delivery(
        self,
        item: OutboxItem,
        outcome: str,
        *,
        retry_at: float | None = None,
        error: str | None = None,
        log: WebhookDeliveryRow | None = None,
        keep: int = 1000,
    ) -> bool:
        """Settle a claimed delivery: ``done`` (removed), ``retry`` at ``retry_at``, or
        ``failed`` for good; logs the attempt. False if the lease was lost meanwhile."""
        with self._transaction() as tx:
            return webhooks.finish_delivery(tx, item, outcome, retry_at, error, log, keep)

    def next_webhook_time(self) -> float | None:
        with self._query() as tx:
            return webhooks.next_time(tx)

    def webhook_outbox_counts(self, project_id: str | None = None) -> dict[str, int]:
        """Async deliveries by state: ``queued``, ``running``, ``failed`` (for good)."""
        with self._query() as tx:
            return webhooks.outbox_counts(tx, project_id)

    # -- the dashboard (see dashboard.py) ----------------------------------------------------
    # Users, provenance both ways and activity, read for the dashboard; its sign-ins.

    def list_users(
        self, project_id: str, *, search: str | None = None, limit: int = 50, offset: int = 0
    ) -> list[UserRow]:
        """A page of the project's users (``search``: a case-insensitive part of the
        id), most recently active first, then by id."""
        with self._query() as tx:
            return dashboard.list_users(tx, project_id, search, limit, offset)

    def count_users(self, project_id: str, *, search: str | None = None) -> int:
        with self._query() as tx:
            return dashboard.count_users(tx, project_id, search)

    def provenance(self, project_id: str, item_id: str) -> ProvenanceRows | None:
        """The message, fact, summary or topic ``item_id`` of the project with what it is
        linked to both ways (nothing deleted); None if there is none."""
        with self._query() as tx:
            return dashboard.provenance(tx, project_id, item_id)

    def activity(self, project_id: str, since: float, until: float) -> ActivityCounts:
        """The project's messages accepted, processed and failed for good per minute of
        [since, until) (epoch seconds)."""
        with self._query() as tx:
            return dashboard.activity(tx, project_id, since, until)

    def create_ui_session(self, row: UiSessionRow) -> bool:
        """Store a sign-in; False if it names an API key that is unknown or revoked."""
        with self._transaction() as tx:
            return dashboard.create_ui_session(tx, row)

    def get_ui_session(self, id_hash: str) -> UiSessionRow | None:
        """The sign-in, unless it expired."""
        with self._query() as tx:
            return dashboard.get_ui_session(tx, id_hash, time.time())

    def touch_ui_session(self, id_hash: str, when: float) -> None:
        with self._transaction() as tx:
            dashboard.touch_ui_session(tx, id_hash, when)

    def update_ui_session_project(self, id_hash: str, project_id: str | None) -> bool:
        """Set the project an unexpired sign-in acts in; False if there is none."""
        with self._transaction() as tx:
            return dashboard.update_ui_session_project(tx, id_hash, project_id, time.time())

    def delete_ui_session(self, id_hash: str) -> bool:
        with self._transaction() as tx:
            return dashboard.delete_ui_session(tx, id_hash)

    def delete_ui_sessions_of_key(self, key_id: str) -> int:
        with self._transaction() as tx:
            return dashboard.delete_ui_sessions_of_key(tx, key_id)

    def prune_ui_sessions(self, now: float) -> int:
        """Delete the sign-ins expired at ``now``: how many."""
        with self._transaction() as tx:
            return dashboard.prune_ui_sessions(tx, now)

    # -- the recall log (see recall_log.py) --------------------------------------------------

    def add_recall_records(self, rows: Sequence[RecallRecordRow]) -> int:
        if not rows:
            return 0
        with self._transaction() as tx:
            return recall_log.add_records(tx, rows)

    def list_recall_records(
        self, project_id: str, user_id: str | None = None, *, limit: int = 50, offset: int = 0
    ) -> list[RecallRecordRow]:
        with self._query() as tx:
            return recall_log.list_records(tx, project_id, user_id, limit, offset)

    def recall_latency_series(
        self, project_id: str, since: float, bucket_seconds: float
    ) -> list[RecallLatencyRow]:
        with self._query() as tx:
            return recall_log.latency_series(tx, project_id, since, bucket_seconds)

    def prune_recall_log(self, project_id: str | None, keep: int, older_than: float) -> int:
        with self._transaction() as tx:
            return recall_log.prune(tx, project_id, keep, older_than)


def _create_session(tx: Tx, row: SessionRow) -> tuple[SessionRow, bool]:
    """The session ``row`` names, inserted unless it exists: (the stored row, whether it
    was inserted)."""
    created = tx.one(
        "INSERT INTO sessions (project_id, id, user_id, title, metadata, created_at, "
        "updated_at) VALUES (?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (project_id, id) DO NOTHING RETURNING pk",
        (
            row.project_id,
            row.id,
            row.user_id,
            row.title,
            tx.dialect.json(row.metadata),
            row.created_at,
            row.updated_at,
        ),
    )
    stored = tx.one(
        f"SELECT {SESSION_COLUMNS} FROM sessions WHERE project_id = ? AND id = ?",
        (row.project_id, row.id),
    )
    return session_row(stored, tx.dialect), created is not None
