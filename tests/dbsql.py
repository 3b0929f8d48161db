"""Raw SQL against a test store of either backend, for assertions on stored rows.

Queries are written once with ``?`` placeholders (SQLite's); for PostgreSQL they become
``%s``. Rows come back as tuples of plain Python values on both.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from stratamem.store.sqlite import sqlite_path


def _pg(sql: str, args: tuple[Any, ...]) -> str:
    # Without arguments psycopg leaves the text alone ("LIKE '%x%'"); with them, a literal
    # % must be doubled.
    return sql.replace("%", "%%").replace("?", "%s") if args else sql


def rows(url: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    if url.startswith(("postgresql:", "postgres:")):
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            return [tuple(r) for r in conn.execute(_pg(sql, args), args or None).fetchall()]
    with sqlite3.connect(sqlite_path(url)) as conn:
        return conn.execute(sql, args).fetchall()


def execute(url: str, sql: str, *args: Any) -> None:
    """Run one write statement (committed at once)."""
    if url.startswith(("postgresql:", "postgres:")):
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(_pg(sql, args), args or None)
        return
    with sqlite3.connect(sqlite_path(url)) as conn:
        conn.execute(sql, args)


def is_postgres(url: str) -> bool:
    return url.startswith(("postgresql:", "postgres:"))


# The names stratamem gives its PostgreSQL sessions: the store's and the job queue's.
SESSION_NAMES = ("stratamem", "stratamem-jobs")


def sessions(url: str, pids: Iterable[int] | None = None) -> dict[int, tuple[str, str, str]]:
    """stratamem's sessions on the URL's database, or those of ``pids`` whatever their
    name: pid -> (name, state, query)."""
    where, arg = ("application_name", list(SESSION_NAMES)) if pids is None else ("pid", list(pids))
    found = rows(
        url,
        "SELECT pid, application_name, state, query FROM pg_stat_activity "
        f"WHERE datname = current_database() AND {where} = ANY(?)",
        arg,
    )
    return {pid: (name, state, query) for pid, name, state, query in found}


def sessions_left(
    url: str, before: Iterable[int] = (), pids: Iterable[int] | None = None
) -> dict[int, tuple[str, str, str]]:
    """``sessions(url, pids)`` other than ``before`` still there after a few seconds (the
    server process of a closed connection takes a moment to go)."""
    old, pids = set(before), None if pids is None else list(pids)
    deadline = time.monotonic() + 5.0
    while True:
        left = {pid: s for pid, s in sessions(url, pids).items() if pid not in old}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def await_lock_wait(url: str, like: str, timeout: float = 60.0) -> None:
    """Wait until a session of the URL's database waits for a lock in a query ``LIKE like``."""
    deadline = time.monotonic() + timeout
    while not rows(
        url,
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock' AND query LIKE ?",
        like,
    ):
        assert time.monotonic() < deadline, f"no query like {like!r} came to wait for a lock"
        time.sleep(0.05)


@contextmanager
def writes_held(url: str) -> Iterator[None]:
    """Another connection holds the store's write lock for the block, as another process
    would: writers of sessions and messages wait (SQLite: up to its busy timeout)."""
    if is_postgres(url):
        import psycopg

        with psycopg.connect(url) as conn:  # one transaction, rolled back at the end
            conn.execute("LOCK TABLE sessions, messages IN EXCLUSIVE MODE")
            yield
            conn.rollback()
        return
    conn = sqlite3.connect(sqlite_path(url), isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        yield
        conn.execute("ROLLBACK")
    finally:
        conn.close()
