"""Per-user indexes for the PostgreSQL store: HNSW for a user lost in a large shared
vector index, GIN for a user whose rows are a large part of a full-text index.

The shared indexes serve every user, and each has a case where one user pays for the
others (measured on the scale benchmark, docs/benchmarks.md):

* **Vectors.** A kind's HNSW index (``vectors_hnsw_<kind>_<dim>``) holds everyone's
  vectors, so a search for one user walks the graph through all of them and checks each
  one's owner on its row: for a user who holds a twentieth of the index, about twenty rows
  are visited for each one of theirs (pgvector's iterative scan). A user whose vectors of a
  kind pass ``user_index_threshold`` while being at most ``USER_INDEX_SHARE`` of that kind's
  gets a partial HNSW index (``WHERE kind = .. AND dim = .. AND project_id = .. AND
  user_id = ..``): 6-8x faster there, and closer to exact. A user who is most of the shared
  index gains little from one and would double its memory, so none is made.
* **Full text.** The ``(user_id, fts)`` GIN index finds a term's rows of one user by
  intersecting the term's posting list with the user's, and the user's is decoded whole on
  every term scanned: ~2 ms a term for a user of 500,000 rows. A user with more rows in a
  table than ``user_fulltext_threshold`` gets a partial GIN index of ``fts`` alone (``WHERE
  project_id = .. AND user_id = ..``), where a term's rows of that user are its posting
  list. The full-text statements of a user known to have one are not prepared, so the
  planner sees the user and picks the partial index by itself; anyone else's may be.

* **When**: a search through a shared index (a vector scope past
  ``vector_index_threshold``, a large table's full text) hands the scope to a background
  thread of the process, at most once per ``USER_INDEX_RECHECK`` seconds per scope. The
  thread counts the user's rows and, if they qualify, builds the index with ``CREATE INDEX
  CONCURRENTLY`` on a connection of its own: reads and writes go on meanwhile.
* **Who**: one process per index, under a session advisory lock on its name; a process
  that dies mid-build releases the lock with its connection, and the next one to try drops
  the invalid index it left and builds again. ``user_indexes`` records them ('building' /
  'ready'); at most ``MAX_USER_INDEXES`` per target, as every insert into a table checks
  each of its partial indexes' predicates.
* **Use**: the planner matches a partial index only with the user as a value it can see.
  Vector searches of a user known to have one (this process found it ready) send project
  and user as quoted literals, unprepared, and their full-text statements are not
  prepared; anyone else's stay prepared. Either statement
  returns the same rows: a stale belief costs speed, never results.
* **Upkeep**: PostgreSQL keeps the indexes current with every write. ``erase_user`` drops a
  user's indexes; dropping another embedder's vectors (reindex) drops every user's vector
  indexes, to be made again as searches find large scopes.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import threading
import time
from typing import Any

from ._connection import APPLICATION_NAME, PgBase, checked

__all__ = ["PostgresUserIndexes"]

log = logging.getLogger("stratamem.store")

# (project_id, user_id, target): target 'vectors:<kind>:<dim>' or '<table>:fts'
Scope = tuple[str, str, str]
_INDEX_TYPE = re.compile(r"(vector|halfvec)\(\d+\)")
_FTS_TABLES = ("messages", "facts", "summaries")


def vector_target(kind: str, dim: int) -> str:
    return f"vectors:{checked(kind)}:{int(dim)}"


def fulltext_target(table: str) -> str:
    return f"{checked(table)}:fts"


class PostgresUserIndexes(PgBase):
    """Part of PostgresStore under its full text and vectors (both use it): builds and
    tracks per-user indexes."""

    # A user at most this share of a kind's vectors gets an HNSW index of their own.
    USER_INDEX_SHARE = 0.25
    # Per target: each partial index costs every insert into its table a predicate check.
    MAX_USER_INDEXES = 100
    # Seconds before a scope is looked at again (its index may have been made elsewhere).
    USER_INDEX_RECHECK = 600.0
    # maintenance_work_mem of a build: room for the HNSW graph of a few hundred thousand
    # 384-dimension vectors (pgvector builds far slower once it no longer fits).
    USER_INDEX_BUILD_MEMORY = "512MB"

    def _init_user_indexes(self, vectors: int, fulltext: int) -> None:
        self._user_index_threshold = vectors
        self._user_fulltext_threshold = fulltext
        self._user_indexed: set[Scope] = set()
        self._user_index_seen: dict[Scope, float] = {}
        self._user_index_queue: list[tuple[Scope, str | None]] = []
        self._user_index_thread: threading.Thread | None = None
        self._user_index_conn: Any = None
        self._user_index_closed = False

    @staticmethod
    def user_index_name(project_id: str, user_id: str, target: str) -> str:
        """The name of a user's index: 63 bytes at most, whatever the ids."""
        digest = hashlib.sha256(f"{project_id}\x00{user_id}".encode()).hexdigest()[:20]
        table, _, rest = target.partition(":")
        if table == "vectors":
            kind, _, dim = rest.partition(":")
            return f"vectors_hnsw_{checked(kind)}_{int(dim)}_u{digest}"
        return f"{checked(table)}_fts_u{digest}"

    def _has_user_index(self, scope: Scope) -> bool:
        return scope in self._user_indexed

    def _consider_user_index(self, scope: Scope, index_type: str | None = None) -> None:
        """A search went through a shared index for ``scope``: have the background thread
        check (at most once per USER_INDEX_RECHECK) whether it deserves one of its own.
        ``index_type``: the vector type of an HNSW target (``vector(384)``)."""
        vectors = scope[2].startswith("vectors:")
        if (self._user_index_threshold if vectors else self._user_fulltext_threshold) <= 0:
            return
        now = time.monotonic()
        with self._lock:
            if self._user_index_closed:
                return
            seen = self._user_index_seen.get(scope)
            if seen is not None and now - seen < self.USER_INDEX_RECHECK:
                return
            if len(self._user_index_seen) > 100_000:
                self._user_index_seen.clear()
            self._user_index_seen[scope] = now
            self._user_index_queue.append((scope, index_type))
            if self._user_index_thread is None:
                self._user_index_thread = threading.Thread(
                    target=self._user_index_worker, name="stratamem-user-index", daemon=True
                )
                self._user_index_thread.start()

    def _user_index_worker(self) -> None:
        import psycopg

        while True:
            with self._lock:
                if not self._user_index_queue or self._user_index_closed:
                    self._user_index_thread = None
                    return
                scope, index_type = self._user_index_queue.pop(0)
            try:
                # A connection of its own: a build holds it for seconds to minutes, with
                # session settings and an advisory lock the pool must not inherit.
                with psycopg.connect(
                    self._conninfo, autocommit=True, fallback_application_name=APPLICATION_NAME
                ) as conn:
                    with self._lock:
                        if self._user_index_closed:
                            return
                        self._user_index_conn = conn
                    try:
                        self._check_user_index(conn, scope, index_type)
                    finally:
                        with self._lock:
                            self._user_index_conn = None
            except Exception:
                if not self._user_index_closed:
                    log.warning("per-user index of %s failed", scope, exc_info=True)

    def _qualifies(self, c: Any, scope: Scope) -> int | None:
        """The user's rows in the target if they deserve an index of their own, else None."""
        project_id, user_id, target = scope
        table, _, rest = target.partition(":")
        if table == "vectors":
            kind, _, dim = rest.partition(":")
            rows = int(
                c.execute(
                    "SELECT count(*) FROM vectors WHERE project_id = %s AND user_id = %s "
                    "AND kind = %s AND dim = %s",
                    (project_id, user_id, kind, int(dim)),
                ).fetchone()[0]
            )
            if rows <= self._user_index_threshold:
                return None
            # The shared index's entries (as of its last VACUUM or ANALYZE), else a count.
            found = c.execute(
                "SELECT reltuples FROM pg_class WHERE oid = to_regclass(%s)",
                (f"vectors_hnsw_{checked(kind)}_{int(dim)}",),
            ).fetchone()
            size = float(found[0]) if found is not None and found[0] > 0 else 0.0
            if size < rows:
                size = float(
                    c.execute(
                        "SELECT count(*) FROM vectors WHERE kind = %s AND dim = %s",
                        (kind, int(dim)),
                    ).fetchone()[0]
                )
            return rows if rows <= self.USER_INDEX_SHARE * size else None
        if table not in _FTS_TABLES:
            return None
        # Counted only up to the threshold: a large user's count is not needed.
        limit = self._user_fulltext_threshold + 1
        rows = int(
            c.execute(
                f"SELECT count(*) FROM (SELECT 1 FROM {checked(table)} "
                "WHERE project_id = %s AND user_id = %s LIMIT %s) s",
                (project_id, user_id, limit),
            ).fetchone()[0]
        )
        return rows if rows >= limit else None

    def _check_user_index(self, c: Any, scope: Scope, index_type: str | None) -> None:
        name = self.user_index_name(*scope)
        state = c.execute(
            "SELECT u.state, i.indisvalid FROM user_indexes u "
            "LEFT JOIN pg_index i ON i.indexrelid = to_regclass(u.name) WHERE u.name = %s",
            (name,),
        ).fetchone()
        if state is not None and state[0] == "ready" and state[1]:
            with self._lock:
                self._user_indexed.add(scope)
            return
        rows = self._qualifies(c, scope)
        if rows is None:
            return
        lock_key = "stratamem.user_index." + name
        if not c.execute(
            "SELECT pg_try_advisory_lock(hashtext(current_schema() || %s))", (lock_key,)
        ).fetchone()[0]:
            return  # another process is building it
        try:
            self._build_user_index(c, scope, name, index_type, rows)
        finally:
            c.execute("SELECT pg_advisory_unlock(hashtext(current_schema() || %s))", (lock_key,))

    def _build_user_index(
        self, c: Any, scope: Scope, name: str, index_type: str | None, rows: int
    ) -> None:
        from psycopg import sql

        project_id, user_id, target = scope
        table, _, rest = target.partition(":")
        if table == "vectors":
            if index_type is None or not _INDEX_TYPE.fullmatch(index_type):
                raise ValueError(f"not an index type: {index_type!r}")
            kind, _, dim = rest.partition(":")
            ops = "halfvec_ip_ops" if index_type.startswith("halfvec") else "vector_ip_ops"
            create = sql.SQL(
                "CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON vectors USING hnsw "
                "((vec::{type}) {ops}) WHERE kind = {kind} AND dim = {dim} "
                "AND project_id = {project} AND user_id = {user}"
            ).format(
                name=sql.Identifier(name),
                type=sql.SQL(index_type),
                ops=sql.SQL(ops),
                kind=sql.Literal(kind),
                dim=sql.Literal(int(dim)),
                project=sql.Literal(project_id),
                user=sql.Literal(user_id),
            )
        else:
            create = sql.SQL(
                # A small pending list, as the shared full-text indexes have (migration 13).
                "CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {table} USING gin (fts) "
                "WITH (gin_pending_list_limit = 128) "
                "WHERE project_id = {project} AND user_id = {user}"
            ).format(
                name=sql.Identifier(name),
                table=sql.Identifier(checked(table)),
                project=sql.Literal(project_id),
                user=sql.Literal(user_id),
            )
        claimed = c.execute(
            "INSERT INTO user_indexes (name, project_id, user_id, target, state, rows_at_build) "
            "SELECT %s, %s, %s, %s, 'building', %s "
            "WHERE (SELECT count(*) FROM user_indexes WHERE target = %s) < %s "
            "ON CONFLICT (name) DO UPDATE SET state = 'building', "
            "rows_at_build = excluded.rows_at_build, updated_at = now() RETURNING 1",
            (name, project_id, user_id, target, rows, target, self.MAX_USER_INDEXES),
        ).fetchone()
        if claimed is None:
            return  # as many user indexes of the target as allowed already
        # Under the lock no one else builds it: an index of that name that is not valid is
        # what a builder that died left behind.
        left = c.execute(
            "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", (name,)
        ).fetchone()
        if left is not None and not left[0]:
            c.execute(sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(sql.Identifier(name)))
        c.execute(
            "SELECT set_config('maintenance_work_mem', %s, false)",
            (self.USER_INDEX_BUILD_MEMORY,),
        )
        c.execute(create)
        c.execute(
            "UPDATE user_indexes SET state = 'ready', updated_at = now() WHERE name = %s", (name,)
        )
        with self._lock:
            self._user_indexed.add(scope)
        log.info("built %s: %d rows of %s for user %s", name, rows, target, user_id)

    def _drop_user_indexes(
        self, project_id: str | None = None, user_id: str | None = None, *, vectors_only: bool
    ) -> int:
        """Drop the per-user indexes of one user (or of everyone); returns how many."""
        from psycopg import sql

        conditions, args = [], []
        if project_id is not None and user_id is not None:
            conditions.append("project_id = %s AND user_id = %s")
            args += [project_id, user_id]
        if vectors_only:
            conditions.append("target LIKE 'vectors:%%'")
        where = f" WHERE {' AND '.join(conditions)}" if conditions else ""

        def dropped(s: Scope) -> bool:
            return (project_id is None or s[:2] == (project_id, user_id)) and (
                not vectors_only or s[2].startswith("vectors:")
            )

        with self._lock:
            self._user_indexed = {s for s in self._user_indexed if not dropped(s)}
            self._user_index_seen.clear()
        with self._read() as c:
            names = [r[0] for r in c.execute(f"SELECT name FROM user_indexes{where}", args)]
            for name in names:
                # Outside a transaction, like the build: readers and writers go on.
                c.execute(
                    sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(sql.Identifier(name))
                )
                c.execute("DELETE FROM user_indexes WHERE name = %s", (name,))
        return len(names)

    def _close_user_indexes(self) -> None:
        """Stop the background thread: a build in progress is cancelled (it leaves an
        invalid index, which the next build drops)."""
        with self._lock:
            self._user_index_closed = True
            self._user_index_queue.clear()
            thread, conn = self._user_index_thread, self._user_index_conn
        if conn is not None:
            with contextlib.suppress(Exception):  # it may be closing on its own
                conn.cancel()
        if thread is not None:
            thread.join(timeout=30)
