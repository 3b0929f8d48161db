"""``SQLStore``: the ``Store`` port written once over the dialect; backends subclass it.

A backend supplies its connections (``_query`` for reads, ``_transaction`` for one write
transaction, both yielding a ``Tx``), its dialect, and what really differs between
databases: full text, vectors, job claiming, migrations (the abstract methods below and
the role methods it implements itself). The rules of the memory — what a batch writes,
what forgetting removes, how a status change is audited, how a webhook delivery is queued —
are the transactional scripts of this package, called from here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

import numpy as np

from .. import CallWrite, ClaimedBatch, LayerWrite, MessageRow, SessionRow
from . import layers as _layers
from .dialect import Dialect, Tx
from .layers import FulltextColumns, LayerItem, VectorRow
from .rows import SESSION_COLUMNS, session_row

__all__ = ["SQLStore"]


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
        return session_row(stored, self.dialect), created is not None

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
        with self._transaction() as tx:
            for (pk, project_id, user_id, _), v in zip(items, vectors, strict=True):
                _layers.insert_vectors(tx, self, embedder, kind, project_id, user_id, [(pk, v)])

    def put_message_vectors(
        self, embedder: str, rows: Sequence[MessageRow], vectors: np.ndarray
    ) -> None:
        if len(rows):
            self._prepare_vectors({"message": int(np.asarray(vectors).shape[1])})
        with self._transaction() as tx:
            _layers.put_vectors(tx, self, embedder, rows, vectors)

    # The batch's writes under the names the backends' complete_batch and fail_batch call
    # them by, on their raw connection (a Tx is taken as well).

    def _write_layers(self, c: Any, batch: ClaimedBatch, embedder: str, layers: LayerWrite) -> None:
        _layers.write_layers(self._as_tx(c), self, batch, embedder, layers)

    def _record_calls(self, c: Any, batch: ClaimedBatch, calls: Sequence[CallWrite]) -> None:
        _layers.record_calls(self._as_tx(c), batch, calls)

    def _put_vectors(
        self, c: Any, embedder: str, rows: Sequence[MessageRow], vectors: np.ndarray
    ) -> None:
        _layers.put_vectors(self._as_tx(c), self, embedder, rows, vectors)

    @staticmethod
    def _layer_dims(vectors: np.ndarray, layers: LayerWrite | None) -> dict[str, int]:
        return _layers.layer_dims(vectors, layers)

    def _as_tx(self, c: Any) -> Tx:
        return c if isinstance(c, Tx) else Tx(c, self.dialect)

    # What the layer writes ask of the backend.

    @abstractmethod
    def _fulltext_columns(self, text: str) -> FulltextColumns:
        """Columns of a facts or summaries row that index its ``text`` for full-text search,
        set by the same INSERT or UPDATE as the text (every write of it, so no statement
        of their own): (column, SQL value holding one ``?``, that parameter) each. Empty
        for a backend that indexes in a table of its own (``_index_fulltext``)."""

    @abstractmethod
    def _index_fulltext(
        self, tx: Tx, table: str, pk: int, text: str, project_id: str, user_id: str, *, new: bool
    ) -> None:
        """Index ``text``, the text of row ``pk`` of ``table`` (``facts``, ``summaries``) of
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
    # Facts, summaries, topics and their histories, by id, by pk and listed.

    # -- recall (see recall.py) -------------------------------------------------------------
    # What candidates are ranked on, one query per layer, as named briefs.

    # -- governance (see governance.py) -----------------------------------------------------
    # Projects, keys, audit, status changes, and removal from provenance upward.

    # -- webhooks (see webhooks.py) ---------------------------------------------------------
    # Webhook records, the delivery log and the async outbox.
