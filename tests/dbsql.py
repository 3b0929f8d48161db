"""Raw SQL against a test store of either backend, for assertions on stored rows.

Queries are written once with ``?`` placeholders (SQLite's); for PostgreSQL they become
``%s``. Rows come back as tuples of plain Python values on both.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from memstrata.store.sqlite import sqlite_path


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
