"""The PostgreSQL store's connections (a pool, transactions, closing), and the base its
parts (full text, vectors, jobs, per-user indexes) are written over, without importing
the store class.

PostgreSQL pools connections (any thread takes one for a statement or a transaction and
hands it back), where SQLite keeps one per thread (``sqlite/_connection.py``).
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ...errors import StoreError, ValidationError
from .. import mask_url
from .._core.dialect import Tx
from .._core.store import SQLStore
from ._dialect import PostgresDialect

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import ConnectionPool

__all__ = [
    "APPLICATION_NAME",
    "PgBase",
]

log = logging.getLogger("stratamem.store")

# The store's sessions in pg_stat_activity, unless the URL (or PGAPPNAME) names them.
APPLICATION_NAME = "stratamem"
# At close, how long a thread still holding a connection has to hand it back once its
# query is cancelled, before the server is asked to end the session.
CLOSE_GRACE_SECONDS = 2.0


_IDENT = re.compile(r"^[a-z_]+$")


def checked(name: str) -> str:
    """A table or column name from our own code, asserted to be one before it enters SQL."""
    if not _IDENT.match(name):
        raise ValueError(f"not an identifier: {name!r}")
    return name


class PgBase(SQLStore):
    """Connections for the PostgreSQL store and its parts."""

    dialect = PostgresDialect()
    _pool: ConnectionPool[Any]  # opened by the store (it configures its connections)

    def _init_connections(self, url: str) -> None:
        self._conninfo = url
        self.url = mask_url(url)
        # Guards the parts' shared state (caches, the per-user indexes' queue).
        self._lock = threading.Lock()
        # The pool's connections out of it (with their server process): the pool closes
        # them only when they come back, so closing the store ends them (_close_pool).
        self._lent: dict[psycopg.Connection[Any], int] = {}
        self._lending = threading.Condition()

    @contextmanager
    def _query(self) -> Iterator[Tx]:
        with self._read() as conn:
            yield Tx(conn, self.dialect)

    @contextmanager
    def _transaction(self) -> Iterator[Tx]:
        with self._write() as conn:
            yield Tx(conn, self.dialect)

    @contextmanager
    def _read(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection in autocommit mode: each statement is its own transaction."""
        import psycopg
        from psycopg_pool import PoolClosed, PoolTimeout

        lent = None
        try:
            with self._pool.connection() as lent:
                with self._lending:
                    self._lent[lent] = lent.info.backend_pid
                yield lent
        except PoolClosed:
            raise StoreError("the store is closed") from None
        except PoolTimeout as exc:
            raise StoreError(f"no PostgreSQL connection available ({self.url}): {exc}") from exc
        except psycopg.OperationalError as exc:
            raise StoreError(f"PostgreSQL error ({self.url}): {exc}") from exc
        except psycopg.DataError as exc:
            # The engine refuses NUL where it checks input; any path it misses must still
            # be the caller's error (422), not the server's.
            if "NUL (0x00)" in str(exc) or "\\u0000" in str(exc):
                raise ValidationError(
                    "invalid input", ["text must not contain NUL characters"]
                ) from exc
            raise
        finally:
            if lent is not None:
                with self._lending:
                    self._lent.pop(lent, None)
                    self._lending.notify_all()

    def _close_pool(self) -> None:
        """Close the pool and every connection of it, also those other threads hold (a
        worker's batch that close left behind, say): a query of theirs is cancelled in the
        server, which hands the connection back to the closed pool, which closes it; a
        session still open after ``CLOSE_GRACE_SECONDS`` is ended by the server."""
        import psycopg

        self._pool.close()
        with self._lending:
            lent = list(self._lent)
        for conn in lent:
            with contextlib.suppress(Exception):  # it may be closing on its own
                conn.cancel()  # meant for use from another thread
        deadline = time.monotonic() + CLOSE_GRACE_SECONDS
        with self._lending:
            while self._lent and (left := deadline - time.monotonic()) > 0:
                self._lending.wait(left)
            pids = list(self._lent.values())
        if not pids:
            return
        log.warning("ending %d PostgreSQL sessions still in use at close", len(pids))
        try:
            with psycopg.connect(
                self._conninfo,
                autocommit=True,
                connect_timeout=10,
                fallback_application_name=APPLICATION_NAME,
            ) as conn:
                conn.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) pid", (pids,))
        except psycopg.Error as exc:
            log.warning("could not end the sessions %s at close: %s", pids, exc)

    @contextmanager
    def _write(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection inside one transaction, committed when the block ends."""
        with self._read() as conn, conn.transaction():
            yield conn
