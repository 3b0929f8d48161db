"""The SQLite store's connections, and the base its parts (full text, vectors, jobs)
are written over.

Concurrency model: one connection per thread (sqlite3 connections are not shareable),
writes in ``BEGIN IMMEDIATE`` transactions so writers queue on the database lock (with a
busy timeout) instead of failing halfway, and several processes may open the same file.
PostgreSQL pools connections instead (``postgres/_connection.py``).
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, suppress

from ...errors import ConfigError, StoreError
from .._core.dialect import Tx
from .._core.store import SQLStore
from ._dialect import NUMBER_CMP, SQLiteDialect, number_cmp

__all__ = ["SQLiteBase", "sqlite_path"]


def sqlite_path(url: str) -> str:
    """File path of a ``sqlite:///relative`` / ``sqlite:////absolute`` URL or a bare path."""
    path = url
    if url.lower().startswith("sqlite:"):
        rest = url[len("sqlite:") :]
        if not rest.startswith("///"):
            raise ConfigError(
                f"invalid SQLite URL {url!r}: use sqlite:///relative.db or sqlite:////abs/path.db"
            )
        path = rest[3:]
    if not path or path == ":memory:" or path.startswith("file:"):
        raise ConfigError(
            "stratamem needs a SQLite file (background workers share it through WAL); "
            "for a throwaway store use a temporary path"
        )
    return os.path.expanduser(path)


class SQLiteBase(SQLStore):
    """The SQLite store's file and its per-thread connections: what every part uses."""

    dialect = SQLiteDialect()

    def _open(self, url: str, busy_timeout_ms: int, synchronous: str, mmap_bytes: int) -> None:
        """Name the file and set up its connections (each thread opens its own)."""
        self.path = sqlite_path(url)
        self.url = f"sqlite:///{self.path}"
        self._busy_timeout_ms = busy_timeout_ms
        if synchronous.upper() not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise ConfigError(f"invalid SQLite synchronous mode {synchronous!r}")
        if isinstance(mmap_bytes, bool) or not isinstance(mmap_bytes, int) or mmap_bytes < 0:
            raise ConfigError(f"invalid SQLite mmap size {mmap_bytes!r}: bytes, 0 or more")
        # With a size, reads go through a memory map of the file up to it: every connection
        # (one a thread) reads the OS's cached pages in place instead of copying them into
        # a page cache of its own (2 MB each), which a large file outgrows (a
        # 100,000-message user's search: mean 41 -> 37 ms). Off by default: each
        # connection maps the file anew, and the process's RSS counts a page once per
        # connection that read it (the bench's peak 1.1 -> 2.4 GiB for an 851 MiB file).
        self._mmap_bytes = mmap_bytes
        self._synchronous = synchronous.upper()
        self._local = threading.local()
        self._connections: list[tuple[sqlite3.Connection, threading.Thread]] = []
        self._conn_lock = threading.Lock()
        self._closed = False
        parent = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(parent):
            raise StoreError(f"cannot create {self.path!r}: directory {parent!r} does not exist")

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection = self._tx().raw  # Tx.raw: the backend's connection, untyped
        return conn

    def _tx(self) -> Tx:
        """This thread's connection as the core uses it (one ``Tx`` per connection: it
        holds nothing but the connection, so every statement of the thread shares it)."""
        tx: Tx | None = getattr(self._local, "tx", None)
        if tx is not None and not self._closed:
            return tx
        conn = getattr(self._local, "conn", None)
        if self._closed:
            if conn is not None:
                # Left open by close() because this thread was using it (see close).
                self._local.conn = self._local.tx = None
                with suppress(sqlite3.Error):
                    conn.close()
            raise StoreError("the store is closed")
        try:
            conn = sqlite3.connect(
                self.path,
                isolation_level=None,
                check_same_thread=False,
                timeout=self._busy_timeout_ms / 1000,
            )
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_ms)}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute(f"PRAGMA synchronous = {self._synchronous}")
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute("PRAGMA temp_store = MEMORY")
            conn.execute(f"PRAGMA mmap_size = {self._mmap_bytes}")
            conn.create_function(NUMBER_CMP, 3, number_cmp, deterministic=True)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open SQLite database {self.path!r}: {exc}") from exc
        self._local.conn = conn
        self._local.tx = tx = Tx(conn, self.dialect)
        with self._conn_lock:
            self._connections.append((conn, threading.current_thread()))
        return tx

    @contextmanager
    def _transaction(self) -> Iterator[Tx]:
        tx = self._tx()
        tx.execute("BEGIN IMMEDIATE")
        try:
            yield tx
        except BaseException:
            tx.execute("ROLLBACK")
            raise
        else:
            tx.execute("COMMIT")

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """``_transaction`` on the connection itself, for backend code."""
        with self._transaction() as tx:
            yield tx.raw

    def _query(self) -> AbstractContextManager[Tx]:
        # The thread's Tx itself, not a generator: reads are many and small (a search makes
        # several), and an autocommit connection needs nothing around a read.
        return self._tx()

    def _close_connections(self) -> None:
        """Close the connections of this thread and of threads that have ended. Another
        live thread's connection may be mid-statement (a worker past close's timeout, a
        heartbeat waiting for the write lock): closing it under the statement crashes the
        interpreter (CPython's sqlite3 does not guard against it), so that thread closes it
        itself at its next use, which then raises ``StoreError``."""
        self._closed = True
        me = threading.current_thread()
        with self._conn_lock:
            conns, self._connections = self._connections, []
        for conn, owner in conns:
            if owner is me or not owner.is_alive():
                with suppress(sqlite3.Error):
                    conn.close()
        if getattr(self._local, "conn", None) is not None:
            self._local.conn = self._local.tx = None
