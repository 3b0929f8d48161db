"""SQLite adapter of the ``Store`` port: one file, WAL, FTS5, vectors searched in-process.

The store class combines its parts, each over ``SQLiteBase`` (``_connection.py``: the
file's per-thread connections): full text (``_fulltext.py``), vectors (``_vectors.py``)
and job claims (``_jobs.py``); the memory's rules are the core's (``_core/``). Here:
construction, closing, the schema's migrations and the store's facts.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from typing import Any

from ..._time import now_iso
from ...errors import StoreError
from .._core.migrations import latest_version, read_migrations
from .._text import fts_document, message_text, scope_token
from ._connection import sqlite_path
from ._fulltext import SQLiteFullText
from ._jobs import SQLiteJobs
from ._vectors import SQLiteVectors

__all__ = ["SQLiteStore", "latest_schema_version", "sqlite_path"]

_MIGRATIONS = "stratamem.store.sqlite.migrations"


def latest_schema_version() -> int:
    return latest_version(_MIGRATIONS)


def _backfill_fts(conn: sqlite3.Connection) -> None:
    rows = conn.execute("SELECT pk, project_id, user_id, content, event_type, page FROM messages")
    conn.executemany(
        "INSERT INTO messages_fts (rowid, body, scope) VALUES (?, ?, ?)",
        (
            (pk, fts_document(message_text(content, event_type, page)), scope_token(project, user))
            for pk, project, user, content, event_type, page in rows
        ),
    )


# Python steps that run right after the SQL file of the same version, in its transaction.
_POST_STEPS = {2: _backfill_fts}


class SQLiteStore(SQLiteFullText, SQLiteVectors, SQLiteJobs):
    """The embedded store. Thread-safe; several processes may share one file."""

    def __init__(
        self,
        url: str,
        *,
        busy_timeout_ms: int = 30_000,
        synchronous: str = "NORMAL",
        vector_index_threshold: int = 20_000,
        mmap_bytes: int = 0,
        migrate_to: int | None = None,
    ) -> None:
        self._open(url, busy_timeout_ms, synchronous, mmap_bytes)
        self._init_vectors(vector_index_threshold)
        self._init_fulltext()
        self._migrate(migrate_to)

    def close(self) -> None:
        """Stop the full-text statements run apart, close the connections (see
        ``_close_connections``), keep the HNSW indexes that changed since they were last
        kept (``_index_files.py``) and drop the vector cache."""
        self._close_fulltext()
        self._close_connections()
        self.vectors.save()
        self._clear_vector_caches()

    # -- schema ----------------------------------------------------------------------

    def _migrate(self, target: int | None) -> None:
        migrations = read_migrations(_MIGRATIONS)
        latest = migrations[-1][0]
        target = latest if target is None else target
        conn = self._conn()
        current = conn.execute("PRAGMA user_version").fetchone()[0]
        if current > latest:
            raise StoreError(
                f"{self.path!r} has schema version {current}, newer than this stratamem "
                f"understands ({latest}); upgrade stratamem"
            )
        if current >= target:
            return
        with self._write() as c:
            # Re-read under the write lock: another process may have migrated meanwhile.
            current = c.execute("PRAGMA user_version").fetchone()[0]
            for version, name, sql in migrations:
                if current < version <= target:
                    for statement in _split_sql(sql):
                        c.execute(statement)
                    step = _POST_STEPS.get(version)
                    if step is not None:
                        step(c)
                    c.execute(f"PRAGMA user_version = {version}")
                    c.execute(
                        "INSERT INTO meta (key, value) VALUES ('schema_migrated_' || ?, ?) "
                        "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                        (name, now_iso()),
                    )

    def schema_version(self) -> int:
        return int(self._conn().execute("PRAGMA user_version").fetchone()[0])

    # -- governance: what erasure does here (see _core/removal.py) ------------------------

    def _memory_removed(self, project_id: str, user_id: str, *, erased: bool) -> None:
        # The user's HNSW index files hold vectors of what was removed (loaded vector
        # scopes are reloaded by generation).
        self._index_files.remove_user(project_id, user_id)

    # -- stats -------------------------------------------------------------------------

    def _store_facts(self) -> dict[str, Any]:
        # The HNSW files count as PostgreSQL's indexes do in its size.
        files = (self.path, self.path + "-wal", *self._index_files.files())
        sizes = []
        for path in files:
            with contextlib.suppress(OSError):  # a file removed meanwhile
                sizes.append(os.path.getsize(path))
        return {
            "store": "sqlite",
            "path": os.path.abspath(self.path),
            "schema_version": self.schema_version(),
            "size_bytes": sum(sizes),
        }


def _split_sql(script: str) -> list[str]:
    """Statements of a migration file (no semicolons inside our string literals)."""
    statements, buf = [], []
    for line in script.splitlines():
        stripped = line.strip()
        if stripped.startswith("--") or not stripped:
            continue
        buf.append(line)
        if stripped.endswith(";"):
            statement = "\n".join(buf).strip()
            if not sqlite3.complete_statement(statement):
                continue
            statements.append(statement)
            buf = []
    if buf:
        statements.append("\n".join(buf))
    return statements
