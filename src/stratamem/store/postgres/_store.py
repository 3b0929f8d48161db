"""PostgreSQL adapter of the ``Store`` port: psycopg 3 with a connection pool, pgvector,
tsvector full text. Any number of processes (API replicas, workers) share one database.

Same semantics as the SQLite store, row for row; what differs is how, and each difference
is a part of the store class, over ``PgBase`` (``_connection.py``: the pool) and the
per-user indexes (``_user_indexes.py``) that full text and vectors share:

* **Vectors** (``_vectors.py``): pgvector, exact scans for small scopes, HNSW indexes per
  (kind, dimension) for large ones.
* **Full text** (``_fulltext.py``): a ``tsvector`` column with a GIN index, scored with
  FTS5's BM25 formula so that scores mean the same on both stores.
* **Jobs** (``_jobs.py``) are claimed with ``FOR UPDATE SKIP LOCKED`` and per-user
  advisory locks; workers of a ``Memory`` are dispatched by procrastinate, one run per
  user at a time (see ``jobs/_procrastinate.py``).

Here: construction (the pool, the migrations), closing and the store's facts.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from ..._time import now_iso
from ...errors import ConfigError, StoreError
from .. import AddOutcome, MessageRow, SessionRow, mask_url
from .._core.migrations import latest_version, read_migrations
from ._connection import APPLICATION_NAME
from ._fulltext import PostgresFullText
from ._jobs import PostgresJobs
from ._vectors import PostgresVectors

__all__ = ["PostgresStore", "has_store", "latest_schema_version"]

_MIGRATIONS = "stratamem.store.postgres.migrations"


def latest_schema_version() -> int:
    return latest_version(_MIGRATIONS)


def has_store(url: str, *, connect_timeout: float = 10.0) -> bool:
    """Whether the schema ``url`` creates tables in holds stratamem's (any version)."""
    _check_installed()
    with _connection(url, connect_timeout) as conn:
        return PostgresStore._current_version(conn) > 0


def _check_installed() -> None:
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ConfigError(
            "the PostgreSQL store needs the postgres extra: "
            "pip install 'stratamem[postgres]' (psycopg, psycopg-pool, pgvector)"
        ) from exc


@contextmanager
def _connection(url: str, connect_timeout: float) -> Iterator[Any]:
    """One autocommit connection outside the pool (migrations, checks)."""
    import psycopg

    try:
        with psycopg.connect(
            url,
            autocommit=True,
            # A keyword argument is connection-string text (psycopg writes it with
            # str(), as here); its stubs type this one as int, not float.
            connect_timeout=str(connect_timeout),
            fallback_application_name=APPLICATION_NAME,
        ) as conn:
            yield conn
    except psycopg.OperationalError as exc:
        raise StoreError(f"cannot connect to PostgreSQL at {mask_url(url)}: {exc}") from exc


class PostgresStore(PostgresFullText, PostgresVectors, PostgresJobs):
    """The store at scale. Thread-safe; any number of processes may share the database."""

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 10,
        vector_index_threshold: int = 20_000,
        ef_search: int = 100,
        user_index_threshold: int = 20_000,
        user_fulltext_threshold: int = 100_000,
        connect_timeout: float = 10.0,
        migrate_to: int | None = None,
    ) -> None:
        _check_installed()
        from psycopg_pool import ConnectionPool

        if pool_size < 1:
            raise ConfigError("the PostgreSQL pool size must be at least 1")
        self._init_connections(url)
        self._init_fulltext()
        self._vector_info: Any = None
        self._init_user_indexes(user_index_threshold, user_fulltext_threshold)
        with _connection(url, connect_timeout) as conn:
            self._migrate(conn, migrate_to)
            self._init_vectors(conn, vector_index_threshold, ef_search)
        self._pool: ConnectionPool[Any] = ConnectionPool(
            url,
            # A few connections ready from the start: a first recall asks in parallel, and
            # opening one (TCP, auth) costs more than the query.
            min_size=min(4, pool_size),
            max_size=pool_size,
            kwargs={"autocommit": True, "fallback_application_name": APPLICATION_NAME},
            configure=self._configure,
            open=False,
            name="stratamem",
        )
        try:
            self._pool.open(wait=True, timeout=connect_timeout)
        except Exception as exc:
            self._pool.close()
            raise StoreError(f"cannot open a connection pool to {self.url}: {exc}") from exc

    def _configure(self, conn: Any) -> None:
        # pgvector's register_vector looks up four types per connection; the vector type's
        # oid does not change, so it is looked up once.
        from pgvector.psycopg.vector import register_vector_info
        from psycopg.types import TypeInfo

        if self._vector_info is None:
            self._vector_info = TypeInfo.fetch(conn, "vector")
        register_vector_info(conn, self._vector_info)

    def close(self) -> None:
        """Stop the per-user indexes' thread and the full-text statements run apart, then
        close the pool (see ``_close_pool``)."""
        self._close_user_indexes()
        self._close_fulltext()
        self._close_pool()

    # -- schema ----------------------------------------------------------------------

    def _migrate(self, conn: Any, target: int | None) -> None:
        import psycopg

        migrations = read_migrations(_MIGRATIONS)
        latest = migrations[-1][0]
        target = latest if target is None else target
        if conn.execute("SELECT current_schema()").fetchone()[0] is None:
            raise StoreError(
                f"{self.url}: no schema to create tables in (the search_path names none that "
                "exists)"
            )
        current = self._current_version(conn)
        if current > latest:
            raise StoreError(
                f"{self.url} has schema version {current}, newer than this stratamem "
                f"understands ({latest}); upgrade stratamem"
            )
        if current >= target:
            return
        try:
            with conn.transaction():
                # One migrator at a time per database: processes starting together wait
                # here, then find the work done.
                conn.execute("SELECT pg_advisory_xact_lock(hashtext('stratamem.migrate'))")
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS schema_migrations (version integer PRIMARY KEY, "
                    "name text NOT NULL, applied_at text NOT NULL)"
                )
                current = self._current_version(conn)
                for version, name, sql in migrations:
                    if current < version <= target:
                        conn.execute(sql)
                        conn.execute(
                            "INSERT INTO schema_migrations (version, name, applied_at) "
                            "VALUES (%s, %s, %s)",
                            (version, name, now_iso()),
                        )
        except psycopg.errors.FeatureNotSupported as exc:
            raise StoreError(f"{self.url}: migration failed: {exc}") from exc
        except (psycopg.errors.UndefinedFile, psycopg.errors.InsufficientPrivilege) as exc:
            raise StoreError(
                f"{self.url}: an extension the schema needs is missing or may not be created "
                f"by this role ({exc}). Install pgvector (vector) and PostgreSQL's contrib "
                "(btree_gin) on the server and run CREATE EXTENSION vector and CREATE "
                "EXTENSION btree_gin as a superuser once, or connect as a role allowed to."
            ) from exc

    @staticmethod
    def _current_version(conn: Any) -> int:
        # In the schema tables are created in, not anywhere on the search path: a
        # "stratamem,public" path must not take public's tables for its own.
        exists = conn.execute(
            "SELECT 1 FROM pg_tables WHERE schemaname = current_schema() "
            "AND tablename = 'schema_migrations'"
        ).fetchone()
        if exists is None:
            return 0
        row = conn.execute("SELECT max(version) FROM schema_migrations").fetchone()
        return int(row[0] or 0)

    def schema_version(self) -> int:
        with self._read() as c:
            return self._current_version(c)

    # -- messages (the rest is the core's: _core/ingest.py) ------------------------------

    def add_messages(
        self, project_id: str, session: SessionRow, rows: Sequence[MessageRow]
    ) -> AddOutcome:
        import psycopg

        # Two callers adding the same new id for different users do not wait for each
        # other (the lock is per user); the loser hits the unique key and tries again,
        # now seeing the winner's row as it would have in SQLite.
        for attempt in range(3):
            try:
                return super().add_messages(project_id, session, rows)
            except psycopg.errors.UniqueViolation:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    # -- governance: what erasure does here (see _core/removal.py) ------------------------

    def _memory_removed(self, project_id: str, user_id: str, *, erased: bool) -> None:
        # After the erasure's commit: DROP INDEX CONCURRENTLY cannot run in a transaction.
        # (A forget leaves the user's indexes: the rows they held are gone with the rows.)
        if erased:
            self._drop_user_indexes(project_id, user_id, vectors_only=False)

    # -- stats -------------------------------------------------------------------------

    def _store_facts(self) -> dict[str, Any]:
        with self._read() as c:
            size = c.execute(
                "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                "WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'r'"
            ).fetchone()
            version = self._current_version(c)
        return {
            "store": "postgres",
            "url": self.url,
            "schema_version": version,
            "size_bytes": int(size[0]) if size else 0,
        }
