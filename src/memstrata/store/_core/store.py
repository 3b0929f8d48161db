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
from contextlib import AbstractContextManager
from typing import Any

from .. import SessionRow
from .dialect import Dialect, Tx
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

    # -- the derived layers: reads (see reads.py) -------------------------------------------
    # Facts, summaries, topics and their histories, by id, by pk and listed.

    # -- recall (see recall.py) -------------------------------------------------------------
    # What candidates are ranked on, one query per layer, as named briefs.

    # -- governance (see governance.py) -----------------------------------------------------
    # Projects, keys, audit, status changes, and removal from provenance upward.

    # -- webhooks (see webhooks.py) ---------------------------------------------------------
    # Webhook records, the delivery log and the async outbox.
