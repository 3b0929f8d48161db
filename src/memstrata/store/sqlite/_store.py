"""SQLite adapter of the ``Store`` port: one file, WAL, FTS5, vectors searched in-process.

Concurrency model: one connection per thread (sqlite3 connections are not shareable),
writes in ``BEGIN IMMEDIATE`` transactions so writers queue on the database lock (with a
busy timeout) instead of failing halfway, and several processes may open the same file.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import astuple
from decimal import Decimal
from functools import lru_cache
from importlib import resources
from typing import Any

import numpy as np

from ..._time import now_iso, to_iso
from ...errors import ConfigError, ConflictError, StoreError
from .. import (
    CURRENT_SUMMARY,
    AddOutcome,
    CallWrite,
    ClaimedBatch,
    FactRow,
    ItemFilters,
    LayerWrite,
    LeaseLostError,
    MessageRow,
    OutageRow,
    SearchFilters,
    SessionRow,
    SummaryRow,
    TopicRow,
)
from .._batches import (
    JOB_ROW,
    NEXT_JOB_SQL,
    OUTAGE_COLUMNS,
    admit,
    claimable,
    next_job_time,
    outage_after,
    processing_state,
    take_jobs,
)
from .._core.dialect import Tx
from .._core.layers import FulltextColumns, VectorRow
from .._core.store import SQLStore
from .._filters import MetadataCondition
from .._text import fts_document, scope_token
from ._dialect import SQLiteDialect
from ._governance import SQLiteGovernance
from ._vectors import VectorCache
from ._webhooks import SQLiteWebhooks

__all__ = ["SQLiteStore", "latest_schema_version", "sqlite_path"]

_MESSAGE_COLUMNS = (
    "pk, project_id, id, user_id, session_id, process_id, role, content, content_hash, ts, "
    "event_type, page, metadata, status, error, attempts, job_id, created_at, processed_at, name"
)


# A user's full-text scope token, computed once per user rather than once per row.
_scope = lru_cache(maxsize=1024)(scope_token)


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
            "memstrata needs a SQLite file (background workers share it through WAL); "
            "for a throwaway store use a temporary path"
        )
    return os.path.expanduser(path)


def _migrations() -> list[tuple[int, str, str]]:
    folder = resources.files("memstrata.store.sqlite.migrations")
    found = []
    for entry in folder.iterdir():
        name = entry.name
        if name.endswith(".sql") and name[:4].isdigit():
            found.append((int(name[:4]), name, entry.read_text(encoding="utf-8")))
    return sorted(found)


def latest_schema_version() -> int:
    return _migrations()[-1][0]


def _backfill_fts(conn: sqlite3.Connection) -> None:
    rows = conn.execute("SELECT pk, project_id, user_id, content, event_type, page FROM messages")
    conn.executemany(
        "INSERT INTO messages_fts (rowid, body, scope) VALUES (?, ?, ?)",
        (
            (pk, _fts_body(content, event_type, page), scope_token(project, user))
            for pk, project, user, content, event_type, page in rows
        ),
    )


# Python steps that run right after the SQL file of the same version, in its transaction.
_POST_STEPS = {2: _backfill_fts}


def _fts_body(content: str, event_type: str | None, page: str | None) -> str:
    parts = [content]
    if event_type:
        parts.append(event_type.replace("_", " "))
    if page:
        parts.append(page)
    return fts_document("\n".join(parts))


def _any_of(terms: Sequence[str]) -> str:
    """An FTS5 expression matching any of ``terms``, each quoted so it is never syntax."""
    return " OR ".join('"' + t.replace('"', '""') + '"' for t in terms)


def _json_path(path: tuple[str, ...]) -> str:
    return "$" + "".join(f'."{p}"' for p in path)


# SQLite compares JSON numbers as 64-bit integers or doubles: exactly as their decimal
# value (the filter semantics, see _filters.py) only while a filter number stays below 2**53
# in magnitude (a stored integer beyond 2**63 becomes a rounded double, a float filter of
# 2.0**60 equals the integer 2**60 although their JSON differ). Larger filter numbers are
# compared by _number_cmp, in Python, on the stored JSON text itself.
_NATIVE_LIMIT = 2**53
_NUMBER_CMP = "memstrata_number_cmp"


def _number_cmp(document: str | None, dotted: str, number: str) -> int | None:
    """-1, 0 or 1 as the JSON number at ``dotted`` in ``document`` is below, equal to or
    above the JSON number ``number``, compared by exact decimal value (as PostgreSQL's
    numeric does); NULL when the value is missing or not a number."""
    if document is None:
        return None
    value = json.loads(document, parse_int=Decimal, parse_float=Decimal)
    for key in dotted.split("."):
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    if not isinstance(value, Decimal):
        return None
    target = Decimal(number)
    return (value > target) - (value < target)


def _native(value: int | float) -> bool:
    return abs(value) < _NATIVE_LIMIT


def _equals_sql(column: str, path: tuple[str, ...], values: Sequence[Any]) -> tuple[str, list[Any]]:
    """The value at ``path`` equals one of ``values``, compared as JSON: a number matches
    only a number, a string only a string, true only true, null only a present null (as in
    the PostgreSQL store; bare json_extract would make true equal 1 and "5" greater than 3)."""
    where = _json_path(path)
    kind = f"json_type({column}, ?)"
    value = f"json_extract({column}, ?)"
    parts: list[str] = []
    params: list[Any] = []
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    native = [v for v in numbers if _native(v)]
    strings = [v for v in values if isinstance(v, str)]
    for group, types in ((native, "('integer', 'real')"), (strings, "('text')")):
        if group:
            parts.append(f"({kind} IN {types} AND {value} IN ({','.join('?' * len(group))}))")
            params += [where, where, *group]
    for big in (v for v in numbers if not _native(v)):
        parts.append(f"({kind} IN ('integer', 'real') AND {_NUMBER_CMP}({column}, ?, ?) = 0)")
        params += [where, ".".join(path), json.dumps(big)]
    literals = sorted(
        {
            "null" if v is None else str(v).lower()
            for v in values
            if v is None or isinstance(v, bool)
        }
    )
    if literals:
        parts.append(f"{kind} IN ({','.join('?' * len(literals))})")
        params += [where, *literals]
    return "(" + " OR ".join(parts) + ")", params


def _metadata_sql(cond: MetadataCondition, column: str) -> tuple[str, list[Any]]:
    path = _json_path(cond.path)
    op, arg = cond.op, cond.value
    if op == "$exists":
        return f"json_type({column}, ?) IS {'NOT ' if arg else ''}NULL", [path]
    if op in ("$eq", "$ne", "$in", "$nin"):
        sql, params = _equals_sql(column, cond.path, arg if op in ("$in", "$nin") else [arg])
        # Negations match a missing value too.
        return (f"NOT IFNULL({sql}, 0)" if op in ("$ne", "$nin") else sql), params
    sql_op = {"$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}[op]
    if isinstance(arg, str):
        return (
            f"(json_type({column}, ?) = 'text' AND json_extract({column}, ?) {sql_op} ?)",
            [path, path, arg],
        )
    if _native(arg):
        return (
            f"(json_type({column}, ?) IN ('integer', 'real') AND "
            f"json_extract({column}, ?) {sql_op} ?)",
            [path, path, arg],
        )
    return (
        f"(json_type({column}, ?) IN ('integer', 'real') AND "
        f"{_NUMBER_CMP}({column}, ?, ?) {sql_op} 0)",
        [path, ".".join(cond.path), json.dumps(arg)],
    )


def _filter_sql(filters: SearchFilters, alias: str = "m") -> tuple[str, list[Any]]:
    clauses: list[str] = []
    params: list[Any] = []
    if filters.session_id:
        clauses.append(f"{alias}.session_id = ?")
        params.append(filters.session_id)
    if filters.roles:
        clauses.append(f"{alias}.role IN ({','.join('?' * len(filters.roles))})")
        params.extend(filters.roles)
    if filters.event_types:
        clauses.append(f"{alias}.event_type IN ({','.join('?' * len(filters.event_types))})")
        params.extend(filters.event_types)
    if filters.since:
        clauses.append(f"{alias}.ts >= ?")
        params.append(to_iso(filters.since))
    if filters.until:
        clauses.append(f"{alias}.ts < ?")
        params.append(to_iso(filters.until))
    for cond in filters.metadata:
        sql, args = _metadata_sql(cond, f"{alias}.metadata")
        clauses.append(sql)
        params.extend(args)
    return " AND ".join(clauses), params


def _item_filter_sql(filters: ItemFilters, alias: str, when: str) -> tuple[str, list[Any]]:
    """Time window and source-message metadata conditions of a fact or summary listing."""
    sql, params = "", []
    if filters.since:
        sql += f" AND {when} >= ?"
        params.append(filters.since)
    if filters.until:
        sql += f" AND {when} < ?"
        params.append(filters.until)
    if filters.metadata:
        where, args = _filter_sql(SearchFilters(metadata=filters.metadata))
        sql += (
            f" AND EXISTS (SELECT 1 FROM json_each({alias}.message_ids) j JOIN messages m "
            f"ON m.project_id = {alias}.project_id AND m.id = j.value WHERE {where})"
        )
        params += args
    return sql, params


def _row_to_message(row: sqlite3.Row | tuple[Any, ...]) -> MessageRow:
    (
        pk,
        project_id,
        mid,
        user_id,
        session_id,
        process_id,
        role,
        content,
        content_hash,
        ts,
        event_type,
        page,
        metadata,
        status,
        error,
        attempts,
        job_id,
        created_at,
        processed_at,
        name,
    ) = row
    return MessageRow(
        pk=pk,
        project_id=project_id,
        id=mid,
        user_id=user_id,
        session_id=session_id,
        process_id=process_id,
        role=role,
        content=content,
        content_hash=content_hash,
        ts=ts,
        event_type=event_type,
        page=page,
        name=name,
        metadata=json.loads(metadata),
        status=status,
        error=error,
        attempts=attempts,
        job_id=job_id,
        created_at=created_at,
        processed_at=processed_at,
    )


def _row_to_session(row: tuple[Any, ...]) -> SessionRow:
    project_id, sid, user_id, title, metadata, created_at, updated_at = row
    return SessionRow(
        project_id=project_id,
        id=sid,
        user_id=user_id,
        title=title,
        metadata=json.loads(metadata),
        created_at=created_at,
        updated_at=updated_at,
    )


_SESSION_COLUMNS = "project_id, id, user_id, title, metadata, created_at, updated_at"
_SUMMARY_COLUMNS = (
    "pk, project_id, id, user_id, text, status, confidence, version, fact_ids, message_ids, "
    "labels, valid_from, valid_to, superseded_by, model, prompt_version, created_at, updated_at, "
    "observed_at"
)
_FACT_COLUMNS = (
    "pk, project_id, id, user_id, text, kind, confidence, status, message_ids, labels, "
    "occurred_at, valid_from, valid_to, superseded_by, model, prompt_version, created_at, "
    "observed_at"
)


def _row_to_summary(r: tuple[Any, ...]) -> SummaryRow:
    return SummaryRow(
        pk=r[0],
        project_id=r[1],
        id=r[2],
        user_id=r[3],
        text=r[4],
        status=r[5],
        confidence=r[6],
        version=r[7],
        fact_ids=json.loads(r[8]),
        message_ids=json.loads(r[9]),
        labels=json.loads(r[10]),
        valid_from=r[11],
        valid_to=r[12],
        superseded_by=r[13],
        model=r[14],
        prompt_version=r[15],
        created_at=r[16],
        updated_at=r[17],
        observed_at=r[18],
    )


def _row_to_fact(r: tuple[Any, ...]) -> FactRow:
    return FactRow(
        pk=r[0],
        project_id=r[1],
        id=r[2],
        user_id=r[3],
        text=r[4],
        kind=r[5],
        confidence=r[6],
        status=r[7],
        message_ids=json.loads(r[8]),
        labels=json.loads(r[9]),
        occurred_at=r[10],
        valid_from=r[11],
        valid_to=r[12],
        superseded_by=r[13],
        model=r[14],
        prompt_version=r[15],
        created_at=r[16],
        observed_at=r[17],
    )


class SQLiteStore(SQLiteGovernance, SQLiteWebhooks, SQLStore):
    """The embedded store. Thread-safe; several processes may share one file."""

    dialect = SQLiteDialect()

    def __init__(
        self,
        url: str,
        *,
        busy_timeout_ms: int = 30_000,
        synchronous: str = "NORMAL",
        vector_index_threshold: int = 20_000,
        migrate_to: int | None = None,
    ) -> None:
        self.path = sqlite_path(url)
        self.url = f"sqlite:///{self.path}"
        self._busy_timeout_ms = busy_timeout_ms
        if synchronous.upper() not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise ConfigError(f"invalid SQLite synchronous mode {synchronous!r}")
        self._synchronous = synchronous.upper()
        self._local = threading.local()
        self._connections: list[tuple[sqlite3.Connection, threading.Thread]] = []
        self._conn_lock = threading.Lock()
        self._closed = False
        self.vectors = VectorCache(index_threshold=vector_index_threshold)
        self._df_cache: dict[tuple[str, str], tuple[int, int]] = {}
        self._stem_cache: dict[str, str] = {}
        parent = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(parent):
            raise StoreError(f"cannot create {self.path!r}: directory {parent!r} does not exist")
        self._migrate(migrate_to)

    # -- connections -------------------------------------------------------------------

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is not None and not self._closed:
            return conn
        if self._closed:
            if conn is not None:
                # Left open by close() because this thread was using it (see close).
                self._local.conn = None
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
            conn.create_function(_NUMBER_CMP, 3, _number_cmp, deterministic=True)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open SQLite database {self.path!r}: {exc}") from exc
        self._local.conn = conn
        with self._conn_lock:
            self._connections.append((conn, threading.current_thread()))
        return conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        else:
            conn.execute("COMMIT")

    @contextmanager
    def _query(self) -> Iterator[Tx]:
        yield Tx(self._conn(), self.dialect)

    @contextmanager
    def _transaction(self) -> Iterator[Tx]:
        with self._write() as conn:
            yield Tx(conn, self.dialect)

    def close(self) -> None:
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
            self._local.conn = None
        self.vectors.clear()

    # -- schema ----------------------------------------------------------------------

    def _migrate(self, target: int | None) -> None:
        migrations = _migrations()
        latest = migrations[-1][0]
        target = latest if target is None else target
        conn = self._conn()
        current = conn.execute("PRAGMA user_version").fetchone()[0]
        if current > latest:
            raise StoreError(
                f"{self.path!r} has schema version {current}, newer than this memstrata "
                f"understands ({latest}); upgrade memstrata"
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

    # -- messages ----------------------------------------------------------------------

    def add_messages(
        self, project_id: str, session: SessionRow, rows: Sequence[MessageRow]
    ) -> AddOutcome:
        ids = [r.id for r in rows]
        now = time.time()
        scope = scope_token(project_id, session.user_id)
        with self._write() as c:
            existing: dict[str, str] = {}
            for i in range(0, len(ids), 500):
                chunk = ids[i : i + 500]
                marks = ",".join("?" * len(chunk))
                existing.update(
                    c.execute(
                        f"SELECT id, content_hash FROM messages WHERE project_id = ? "
                        f"AND id IN ({marks})",
                        (project_id, *chunk),
                    ).fetchall()
                )
            conflicts = [
                r.id for r in rows if r.id in existing and existing[r.id] != r.content_hash
            ]
            if conflicts:
                raise ConflictError(
                    f"message id(s) already stored with different content: {conflicts[:10]}; "
                    "an id may be resent only with the same session, role and content"
                )
            new = [r for r in rows if r.id not in existing]
            job_id = None
            if new:
                job_id = c.execute(
                    "INSERT INTO jobs (project_id, user_id, kind, status, run_after, created_at, "
                    "size) VALUES (?, ?, 'process_messages', 'queued', ?, ?, ?)",
                    (project_id, session.user_id, now, now, len(new)),
                ).lastrowid
                for r in new:
                    pk = c.execute(
                        "INSERT INTO messages (project_id, id, user_id, session_id, process_id, "
                        "role, content, content_hash, ts, event_type, page, metadata, status, "
                        "job_id, created_at, name) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?, ?, ?)",
                        (
                            project_id,
                            r.id,
                            session.user_id,
                            session.id,
                            r.process_id,
                            r.role,
                            r.content,
                            r.content_hash,
                            r.ts,
                            r.event_type,
                            r.page,
                            json.dumps(r.metadata, ensure_ascii=False),
                            job_id,
                            r.created_at,
                            r.name,
                        ),
                    ).lastrowid
                    r.pk, r.job_id = pk, job_id
                    c.execute(
                        "INSERT INTO messages_fts (rowid, body, scope) VALUES (?, ?, ?)",
                        (pk, _fts_body(r.content, r.event_type, r.page), scope),
                    )
                    if r.name:
                        c.execute(
                            "INSERT OR IGNORE INTO speakers (project_id, user_id, name) "
                            "VALUES (?, ?, ?)",
                            (project_id, session.user_id, r.name),
                        )
                c.execute(
                    "UPDATE sessions SET updated_at = ? WHERE project_id = ? AND id = ?",
                    (now_iso(), project_id, session.id),
                )
        dupes = [r.id for r in rows if r.id in existing]
        return AddOutcome(message_ids=ids, duplicates=dupes, job_id=job_id)

    def get_message(self, project_id: str, message_id: str) -> MessageRow | None:
        row = (
            self._conn()
            .execute(
                f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE project_id = ? AND id = ?",
                (project_id, message_id),
            )
            .fetchone()
        )
        return None if row is None else _row_to_message(row)

    def get_messages(self, project_id: str, message_ids: Sequence[str]) -> dict[str, MessageRow]:
        """The messages of ``message_ids`` that exist, by id (one query)."""
        if not message_ids:
            return {}
        marks = ",".join("?" * len(message_ids))
        rows = self._conn().execute(
            f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE project_id = ? AND id IN ({marks})",
            (project_id, *message_ids),
        )
        return {m.id: m for m in map(_row_to_message, rows)}

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
        sql = f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE project_id = ?"
        params: list[Any] = [project_id]
        for column, value in (("user_id", user_id), ("session_id", session_id), ("status", status)):
            if value is not None:
                sql += f" AND {column} = ?"
                params.append(value)
        sql += f" ORDER BY pk {'DESC' if newest_first else 'ASC'} LIMIT ? OFFSET ?"
        params += [limit, offset]
        return [_row_to_message(r) for r in self._conn().execute(sql, params)]

    def messages_by_pk(self, pks: Sequence[int]) -> dict[int, MessageRow]:
        out: dict[int, MessageRow] = {}
        conn = self._conn()
        pks = list(pks)
        for i in range(0, len(pks), 500):
            chunk = pks[i : i + 500]
            marks = ",".join("?" * len(chunk))
            for row in conn.execute(
                f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE pk IN ({marks})", chunk
            ):
                out[row[0]] = _row_to_message(row)
        return out

    # -- jobs ----------------------------------------------------------------------

    def claim_batch(
        self,
        worker_id: str,
        lease_seconds: float,
        max_messages: int,
        for_jobs: Sequence[int] = (),
    ) -> ClaimedBatch | None:
        now = time.time()
        # for_jobs: a caller waiting for these jobs runs a batch of their users only (one
        # JSON parameter: close() may wait for more jobs than SQLite takes parameters).
        jobs = [json.dumps(list(for_jobs))] if for_jobs else []
        scope = (
            "AND (j.project_id, j.user_id) IN (SELECT project_id, user_id FROM jobs "
            "     WHERE id IN (SELECT value FROM json_each(?))) "
            if jobs
            else ""
        )
        conn = self._conn()
        # Idle workers (and waiting callers) poll: look without taking the write lock first.
        if (
            conn.execute(
                "SELECT 1 FROM jobs j WHERE ((j.status = 'queued' AND j.run_after <= ?) "
                f"OR (j.status = 'running' AND j.lease_until < ?)) {scope}LIMIT 1",
                (now, now, *jobs),
            ).fetchone()
            is None
            or not admit(self._outages(conn), now)[0]
        ):
            return None
        with self._write() as c:
            # Re-read under the write lock: only one claim takes a due probe.
            admitted, hold = admit(self._outages(c), now)
            if not admitted:
                return None
            # The earliest unfinished job of its user, ready to run: per-user order holds
            # because a later job is never claimable while an earlier one is unfinished.
            head = c.execute(
                "SELECT j.id, j.project_id, j.user_id FROM jobs j "
                "WHERE j.status IN ('queued', 'running') "
                "AND ((j.status = 'queued' AND j.run_after <= ?) "
                "     OR (j.status = 'running' AND j.lease_until < ?)) "
                "AND NOT EXISTS (SELECT 1 FROM jobs e WHERE e.project_id = j.project_id "
                "     AND e.user_id = j.user_id AND e.status IN ('queued', 'running') "
                f"     AND e.id < j.id) {scope}"
                "ORDER BY j.id LIMIT 1",
                (now, now, *jobs),
            ).fetchone()
            if head is None:
                return None
            first_id, project_id, user_id = head
            job_ids = take_jobs(
                c.execute(
                    f"SELECT {JOB_ROW} FROM jobs "
                    "WHERE project_id = ? AND user_id = ? AND status IN ('queued', 'running') "
                    "AND id >= ? ORDER BY id LIMIT 256",
                    (project_id, user_id, first_id),
                ).fetchall(),
                max_messages,
                claimable(now),
            )
            if hold is not None:
                c.execute("UPDATE outages SET next_probe = ?", (hold,))
            marks = ",".join("?" * len(job_ids))
            c.execute(
                f"UPDATE jobs SET status = 'running', locked_by = ?, lease_until = ?, "
                f"attempts = attempts + 1 WHERE id IN ({marks})",
                (worker_id, now + lease_seconds, *job_ids),
            )
            c.execute(
                f"UPDATE messages SET attempts = attempts + 1 WHERE job_id IN ({marks})", job_ids
            )
            attempts = c.execute(
                f"SELECT id, attempts FROM jobs WHERE id IN ({marks})", job_ids
            ).fetchall()
            messages = [
                _row_to_message(r)
                for r in c.execute(
                    f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE job_id IN ({marks}) "
                    "ORDER BY pk",
                    job_ids,
                )
            ]
        return ClaimedBatch(
            worker_id=worker_id,
            project_id=project_id,
            user_id=user_id,
            job_ids=job_ids,
            messages=messages,
            job_attempts={int(j): int(a) for j, a in attempts},
            probe=hold is not None,
        )

    def _check_lease(self, c: sqlite3.Connection, batch: ClaimedBatch) -> None:
        marks = ",".join("?" * len(batch.job_ids))
        held = c.execute(
            f"SELECT count(*) FROM jobs WHERE id IN ({marks}) AND status = 'running' "
            "AND locked_by = ?",
            (*batch.job_ids, batch.worker_id),
        ).fetchone()[0]
        if held != len(batch.job_ids):
            raise LeaseLostError(f"worker {batch.worker_id} no longer holds jobs {batch.job_ids}")

    def extend_lease(self, job_ids: Sequence[int], worker_id: str, lease_seconds: float) -> bool:
        if not job_ids:
            return True
        marks = ",".join("?" * len(job_ids))
        with self._write() as c:
            cur = c.execute(
                f"UPDATE jobs SET lease_until = ? WHERE id IN ({marks}) AND status = 'running' "
                "AND locked_by = ?",
                (time.time() + lease_seconds, *job_ids, worker_id),
            )
            return cur.rowcount == len(job_ids)

    def complete_batch(
        self,
        batch: ClaimedBatch,
        *,
        embedder: str,
        vectors: np.ndarray,
        layers: LayerWrite | None = None,
    ) -> None:
        now = time.time()
        marks = ",".join("?" * len(batch.job_ids))
        with self._write() as c:
            self._check_lease(c, batch)
            self._put_vectors(c, embedder, batch.messages, vectors)
            if layers is not None:
                self._write_layers(c, batch, embedder, layers)
                self._record_calls(c, batch, layers.calls)
                self._enqueue_webhooks(c, layers.outbox)
            c.execute(
                f"UPDATE messages SET status = 'processed', error = NULL, processed_at = ? "
                f"WHERE job_id IN ({marks})",
                (now_iso(), *batch.job_ids),
            )
            c.execute(
                f"UPDATE jobs SET status = 'done', finished_at = ?, locked_by = NULL, "
                f"lease_until = NULL, last_error = NULL WHERE id IN ({marks})",
                (now, *batch.job_ids),
            )

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
        marks = ",".join("?" * len(batch.job_ids))
        error = error[:2000]
        back = "" if counted else ", attempts = max(attempts - 1, 0)"
        with self._write() as c:
            self._check_lease(c, batch)
            # Tokens spent on a failed attempt were still spent: account for them.
            self._record_calls(c, batch, calls)
            if retry_at is not None:
                c.execute(
                    f"UPDATE jobs SET status = 'queued', run_after = ?, locked_by = NULL, "
                    f"lease_until = NULL, last_error = ?, batch_cap = coalesce(?, batch_cap)"
                    f"{back} WHERE id IN ({marks})",
                    (retry_at, error, retry_cap, *batch.job_ids),
                )
                c.execute(
                    f"UPDATE messages SET error = ?{back} WHERE job_id IN ({marks})",
                    (error, *batch.job_ids),
                )
            else:
                c.execute(
                    f"UPDATE jobs SET status = 'failed', finished_at = ?, locked_by = NULL, "
                    f"lease_until = NULL, last_error = ?{back} WHERE id IN ({marks})",
                    (time.time(), error, *batch.job_ids),
                )
                c.execute(
                    f"UPDATE messages SET status = 'failed', error = ?{back} "
                    f"WHERE job_id IN ({marks})",
                    (error, *batch.job_ids),
                )

    def outages(self) -> list[OutageRow]:
        return self._outages(self._conn())

    @staticmethod
    def _outages(c: sqlite3.Connection) -> list[OutageRow]:
        return [OutageRow(*r) for r in c.execute(f"SELECT {OUTAGE_COLUMNS} FROM outages")]

    def record_outage(
        self, service: str, error: str, delay: Callable[[int], float], *, probe: bool
    ) -> list[OutageRow]:
        with self._write() as c:
            known = {o.service: o for o in self._outages(c)}
            row = outage_after(known.get(service), service, error, delay, time.time(), probe=probe)
            c.execute(
                f"INSERT OR REPLACE INTO outages ({OUTAGE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                astuple(row),
            )
            known[service] = row
        return list(known.values())

    def end_outage(self) -> list[OutageRow]:
        with self._write() as c:
            ended = self._outages(c)
            c.execute("DELETE FROM outages")
        return ended

    def retry_failed(self, project_id: str, user_id: str | None = None) -> int:
        """Queue terminally failed jobs again (after the cause was fixed)."""
        now = time.time()
        sql_user = " AND user_id = ?" if user_id is not None else ""
        params: list[Any] = [project_id] + ([user_id] if user_id is not None else [])
        with self._write() as c:
            ids = [
                r[0]
                for r in c.execute(
                    f"SELECT id FROM jobs WHERE status = 'failed' AND project_id = ?{sql_user}",
                    params,
                )
            ]
            if not ids:
                return 0
            marks = ",".join("?" * len(ids))
            c.execute(
                f"UPDATE jobs SET status = 'queued', attempts = 0, run_after = ?, "
                f"finished_at = NULL, batch_cap = NULL WHERE id IN ({marks})",
                (now, *ids),
            )
            c.execute(f"UPDATE messages SET status = 'pending' WHERE job_id IN ({marks})", ids)
        return len(ids)

    def job_states(self, job_ids: Sequence[int]) -> dict[int, str]:
        out: dict[int, str] = {}
        ids = list(job_ids)
        for i in range(0, len(ids), 500):  # SQLite caps the number of bound parameters
            chunk = ids[i : i + 500]
            marks = ",".join("?" * len(chunk))
            out.update(
                self._conn()
                .execute(f"SELECT id, status FROM jobs WHERE id IN ({marks})", chunk)
                .fetchall()
            )
        return out

    def unfinished_jobs(self, project_id: str | None = None) -> int:
        sql = "SELECT count(*) FROM jobs WHERE status IN ('queued', 'running')"
        params: tuple[Any, ...] = ()
        if project_id is not None:
            sql += " AND project_id = ?"
            params = (project_id,)
        return int(self._conn().execute(sql, params).fetchone()[0])

    def next_job_time(self) -> float | None:
        return next_job_time(self._conn().execute(NEXT_JOB_SQL).fetchone())

    # -- search ----------------------------------------------------------------------

    # Ranking is the cost of a full-text query: FTS5 scores every row matching any term.
    # Terms are taken rarest first while the rows they match add up to at most this many
    # (the rarest is always kept): common words rank by noise anyway, the rare ones carry
    # the query, and the vector side still sees the whole question.
    MATCH_BUDGET = 4000
    # Ranking reads every row it scores. When the kept terms still match more than this
    # many rows, at most this many of the user's are ranked: term by term, rarest first,
    # each term's in rowid order (PostgresStore.RANK_CAP, the same rule).
    RANK_CAP = 1000

    def _stems(self, words: Sequence[str]) -> list[str]:
        """The index's own tokens for each of ``words`` (Porter stems, CJK grams; several are
        joined by spaces), from a scratch FTS5 table in this connection's temp schema. A
        word's tokens never change, so they are remembered: a recall asks for the same
        words once per layer, and users ask about the same things again."""
        cache = self._stem_cache
        known = {w: cache[w] for w in words if w in cache}
        missing = list(dict.fromkeys(w for w in words if w not in known))
        if missing:
            conn = self._conn()
            if not getattr(self._local, "stemmer", False):
                conn.execute(
                    "CREATE VIRTUAL TABLE IF NOT EXISTS temp.stem USING fts5 "
                    "(x, tokenize = 'porter unicode61 remove_diacritics 2')"
                )
                conn.execute(
                    "CREATE VIRTUAL TABLE IF NOT EXISTS temp.stem_vocab "
                    "USING fts5vocab (temp, stem, 'instance')"
                )
                self._local.stemmer = True
            conn.execute("DELETE FROM temp.stem")
            conn.executemany(
                "INSERT INTO temp.stem (rowid, x) VALUES (?, ?)",
                [(i + 1, w) for i, w in enumerate(missing)],
            )
            out: list[list[str]] = [[] for _ in missing]
            for term, doc in conn.execute("SELECT term, doc FROM temp.stem_vocab"):
                out[int(doc) - 1].append(term)
            found = {w: " ".join(o) for w, o in zip(missing, out, strict=True)}
            known.update(found)
            if len(cache) > 100_000:
                cache.clear()
            cache.update(found)
        return [known[w] for w in words]

    def _doc_frequencies(self, table: str, tokens: Sequence[str], total: int) -> dict[str, int]:
        """Rows containing each token. fts5vocab counts them by walking the token's whole
        posting list, as costly as ranking for a common word, so counts are cached and
        refreshed once the table has grown by a tenth."""
        wanted = {t for token in tokens for t in token.split()}
        out: dict[str, int] = {}
        missing = []
        for term in wanted:
            hit = self._df_cache.get((table, term))
            if hit is not None and total <= hit[1] * 1.1 + 100:
                out[term] = hit[0]
            else:
                missing.append(term)
        if missing:
            marks = ",".join("?" * len(missing))
            found = dict(
                self._conn()
                .execute(
                    f"SELECT term, doc FROM {table}_fts_vocab WHERE term IN ({marks})", missing
                )
                .fetchall()
            )
            if len(self._df_cache) > 100_000:
                self._df_cache.clear()
            for term in missing:
                out[term] = found.get(term, 0)
                self._df_cache[(table, term)] = (out[term], total)
        return out

    def _plan_fulltext(
        self, table: str, project_id: str, user_id: str, terms: Sequence[str]
    ) -> tuple[list[str], str, int]:
        """(terms to search, rarest first; how to keep to the user: "token", "owner" or
        "none"; a bound on the user's rows those terms match)."""
        scope = scope_token(project_id, user_id)
        stems = self._stems([*terms, scope])
        total = self._conn().execute(f"SELECT max(pk) FROM {table}").fetchone()[0] or 0
        df = self._doc_frequencies(table, stems, total)
        scored = sorted(
            (max((df.get(t, 0) for t in stems[i].split()), default=0), i) for i in range(len(terms))
        )
        kept: list[str] = []
        matched = 0
        for d, i in scored:
            if kept and matched + d > self.MATCH_BUDGET:
                break
            kept.append(terms[i])
            matched += d
        # When this user owns most rows, intersecting with the scope token walks nearly every
        # row: check each match's owner instead (or nothing, when every row is theirs).
        owned = df.get(stems[-1], 0)
        bound = min(matched, owned)
        if owned * 2 <= total:
            return kept, "token", bound
        return kept, "none" if owned == total else "owner", bound

    def _rank_fulltext(
        self,
        table: str,
        kept: Sequence[str],
        matched: int,
        token: str | None,
        join: str,
        conds: str,
        args: Sequence[Any],
        limit: int,
    ) -> list[tuple[int, float]]:
        """BM25 ranking of the rows matching any of ``kept`` (rarest first) that pass
        ``join`` and ``conds``; ``matched`` bounds how many that is. Past RANK_CAP rows,
        at most that many are ranked, taken term by term, rarest first, each in rowid
        order."""

        def match(expr: str) -> str:
            return f'scope : "{token}" AND ({expr})' if token else expr

        head = f"FROM {table}_fts f{join} WHERE {table}_fts MATCH ?{conds}"
        only = ""
        extra: list[Any] = []
        conn = self._conn()
        try:
            if matched > self.RANK_CAP:
                # The bound is collection-wide: see first whether this user's matches
                # really pass the cap (one query with no ranking) before taking them term
                # by term.
                probe = conn.execute(
                    f"SELECT f.rowid {head} LIMIT ?",
                    [match(_any_of(kept)), *args, self.RANK_CAP + 1],
                ).fetchall()
                matched = len(probe)
            if matched > self.RANK_CAP:
                taken: list[int] = []
                for i, term in enumerate(kept):
                    expr = _any_of([term])
                    if i:  # rows an earlier term took are not taken twice
                        expr = f"({expr}) NOT ({_any_of(kept[:i])})"
                    found = conn.execute(
                        f"SELECT f.rowid {head} LIMIT ?",
                        [match(expr), *args, self.RANK_CAP - len(taken)],
                    )
                    taken += [int(r[0]) for r in found]
                    if len(taken) >= self.RANK_CAP:
                        break
                # "+": a rowid constraint would open one FTS5 cursor per candidate, and each
                # cursor's bm25 reads its terms' whole doclists again (6 s for 1,000). The
                # candidates' rowid range does bound the one cursor's walk.
                only = (
                    " AND f.rowid BETWEEN ? AND ? AND +f.rowid IN (SELECT value FROM json_each(?))"
                )
                extra = [min(taken, default=0), max(taken, default=0), json.dumps(taken)]
            rows = conn.execute(
                f"SELECT f.rowid, bm25({table}_fts, 1.0, 0.0) AS r {head}{only} ORDER BY r LIMIT ?",
                [match(_any_of(kept)), *args, *extra, limit],
            ).fetchall()
        except sqlite3.OperationalError as exc:  # a malformed MATCH must not break recall
            raise StoreError(f"full-text search failed: {exc}") from exc
        return [(int(pk), -float(r)) for pk, r in rows]

    def fulltext_messages(
        self,
        project_id: str,
        user_id: str,
        terms: Sequence[str],
        limit: int,
        filters: SearchFilters,
    ) -> list[tuple[int, float]]:
        if not terms or limit <= 0:
            return []
        kept, scoping, matched = self._plan_fulltext("messages", project_id, user_id, terms)
        where, params = _filter_sql(filters)
        owner = ""
        if scoping == "owner":
            # Answered from the (project_id, user_id, pk) index alone: reading each matched
            # message row to learn its owner cost more than the ranking.
            owner = (
                " AND EXISTS (SELECT 1 FROM messages o WHERE o.project_id = ? "
                "AND o.user_id = ? AND o.pk = f.rowid)"
            )
        owner_args = [project_id, user_id] if owner else []
        token = scope_token(project_id, user_id) if scoping == "token" else None
        # CROSS JOIN fixes the order: matches first, then each one's row by primary key,
        # rather than walking the user's rows and probing the index per row.
        join = " CROSS JOIN messages m ON m.pk = f.rowid" if where else ""
        return self._rank_fulltext(
            "messages",
            kept,
            matched,
            token,
            join,
            (f" AND {where}" if where else "") + owner,
            [*params, *owner_args],
            limit,
        )

    def _generation(self, project_id: str, user_id: str, kind: str) -> int:
        row = (
            self._conn()
            .execute(
                "SELECT generation FROM vector_generations WHERE project_id = ? AND user_id = ? "
                "AND kind = ?",
                (project_id, user_id, kind),
            )
            .fetchone()
        )
        return 0 if row is None else int(row[0])

    def vector_messages(
        self,
        project_id: str,
        user_id: str,
        query: np.ndarray,
        embedder: str,
        limit: int,
        filters: SearchFilters,
    ) -> list[tuple[int, float]]:
        if limit <= 0:
            return []
        conn = self._conn()
        scope = self._vector_scope(project_id, user_id, "message", embedder, int(query.shape[0]))
        allowed = None
        if not filters.empty:
            where, params = _filter_sql(filters)
            allowed = np.fromiter(
                (
                    r[0]
                    for r in conn.execute(
                        f"SELECT m.pk FROM messages m WHERE m.project_id = ? AND m.user_id = ? "
                        f"AND {where}",
                        (project_id, user_id, *params),
                    )
                ),
                dtype=np.int64,
            )
        return scope.search(np.asarray(query, dtype=np.float32), limit, allowed)

    # -- vectors bookkeeping -----------------------------------------------------------

    def _prepare_vectors(self, dims: dict[str, int]) -> None:
        pass  # searched in-process: nothing to build beforehand

    def _invalidate_vectors(self, tx: Tx) -> None:
        # Every process's cached scopes are reloaded at their next search.
        tx.execute(
            "INSERT INTO vector_generations (project_id, user_id, kind, generation) "
            "SELECT DISTINCT s.project_id, s.user_id, k.kind, 1 FROM messages s, "
            "(SELECT 'message' AS kind UNION ALL SELECT 'fact' UNION ALL SELECT 'summary') k "
            "WHERE 1 ON CONFLICT (project_id, user_id, kind) DO UPDATE "
            "SET generation = generation + 1"
        )

    def _clear_vector_caches(self) -> None:
        self.vectors.clear()

    # -- derived layers: writes (the core's hooks, see _core/layers.py) ------------------

    def _insert_vector_rows(self, tx: Tx, rows: Sequence[VectorRow]) -> None:
        tx.many(
            # An item embedded again gets a new row (a new pk) rather than an update in
            # place: in-process vector caches read the rows past the last pk they saw.
            "INSERT OR REPLACE INTO vectors "
            "(project_id, user_id, kind, item_pk, embedder, dim, vec) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            ((*row[:6], row[6].tobytes()) for row in rows),
        )

    def _fulltext_columns(self, text: str) -> FulltextColumns:
        return ()  # FTS5 tables of their own (_index_fulltext)

    def _index_fulltext(
        self, tx: Tx, table: str, pk: int, text: str, project_id: str, user_id: str, *, new: bool
    ) -> None:
        # facts_fts and summaries_fts: rowid = the row's pk, scoped by a token of the user.
        if new:
            tx.execute(
                f"INSERT INTO {table}_fts (rowid, body, scope) VALUES (?, ?, ?)",
                (pk, fts_document(text), _scope(project_id, user_id)),
            )
        else:
            tx.execute(f"UPDATE {table}_fts SET body = ? WHERE rowid = ?", (fts_document(text), pk))

    # -- derived layers: reads -------------------------------------------------------------

    def context_messages(
        self, project_id: str, user_id: str, before_pk: int, limit: int
    ) -> list[MessageRow]:
        rows = (
            self._conn()
            .execute(
                f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE project_id = ? AND user_id = ? "
                "AND pk < ? ORDER BY pk DESC LIMIT ?",
                (project_id, user_id, before_pk, limit),
            )
            .fetchall()
        )
        return [_row_to_message(r) for r in reversed(rows)]

    def _vector_scope(
        self, project_id: str, user_id: str, kind: str, embedder: str, dim: int
    ) -> Any:
        conn = self._conn()

        def load(after_pk: int) -> Iterator[tuple[int, int, bytes]]:
            return conn.execute(
                "SELECT pk, item_pk, vec FROM vectors WHERE project_id = ? AND user_id = ? "
                "AND kind = ? AND embedder = ? AND pk > ? ORDER BY pk",
                (project_id, user_id, kind, embedder, after_pk),
            )

        return self.vectors.scope(
            (project_id, user_id, kind, embedder),
            dim=dim,
            generation=self._generation(project_id, user_id, kind),
            load=load,
        )

    def similar_summaries(
        self, project_id: str, user_id: str, query: np.ndarray, embedder: str, limit: int
    ) -> list[tuple[SummaryRow, float]]:
        """Current (active or deprioritized) summaries nearest to ``query``."""
        found = self.vector_summaries(project_id, user_id, query, embedder, limit)
        rows = self.summaries_by_pk([pk for pk, _ in found])
        return [(rows[pk], sim) for pk, sim in found if pk in rows]

    def _rows_by_pk(self, table: str, columns: str, pks: Sequence[int]) -> dict[int, Any]:
        if not pks:
            return {}
        marks = ",".join("?" * len(pks))
        return {
            r[0]: r
            for r in self._conn().execute(
                f"SELECT {columns} FROM {table} WHERE pk IN ({marks})", list(pks)
            )
        }

    def get_summaries(self, project_id: str, ids: Sequence[str]) -> list[SummaryRow]:
        if not ids:
            return []
        marks = ",".join("?" * len(ids))
        rows = (
            self._conn()
            .execute(
                f"SELECT {_SUMMARY_COLUMNS} FROM summaries "
                f"WHERE project_id = ? AND id IN ({marks})",
                (project_id, *ids),
            )
            .fetchall()
        )
        by_id = {r[2]: _row_to_summary(r) for r in rows}
        return [by_id[i] for i in ids if i in by_id]

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
        sql = f"SELECT {_SUMMARY_COLUMNS} FROM summaries s WHERE project_id = ?"
        params: list[Any] = [project_id]
        if user_id is not None:
            sql += " AND user_id = ?"
            params.append(user_id)
        if status:
            sql += f" AND status IN ({','.join('?' * len(status))})"
            params.extend(status)
        if filters is not None:
            where, args = _item_filter_sql(filters, "s", "COALESCE(s.valid_from, s.observed_at)")
            sql += where
            params += args
        sql += " ORDER BY pk LIMIT ? OFFSET ?"
        params += [limit, offset]
        return [_row_to_summary(r) for r in self._conn().execute(sql, params)]

    def summary_history(self, project_id: str, summary_id: str) -> list[dict[str, Any]]:
        rows = (
            self._conn()
            .execute(
                "SELECT h.version, h.text, h.status, h.confidence, h.fact_ids, h.reason, h.actor, "
                "h.changed_at FROM summary_history h JOIN summaries s ON s.pk = h.summary_pk "
                "WHERE s.project_id = ? AND s.id = ? ORDER BY h.version, h.pk",
                (project_id, summary_id),
            )
            .fetchall()
        )
        keys = (
            "version",
            "text",
            "status",
            "confidence",
            "fact_ids",
            "reason",
            "actor",
            "changed_at",
        )
        out = []
        for r in rows:
            item = dict(zip(keys, r, strict=True))
            item["fact_ids"] = json.loads(item["fact_ids"])
            out.append(item)
        return out

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
        sql = f"SELECT {_FACT_COLUMNS} FROM facts f WHERE project_id = ?"
        params: list[Any] = [project_id]
        if user_id is not None:
            sql += " AND user_id = ?"
            params.append(user_id)
        if newest_first:
            sql += " AND status = 'active'"
        if filters is not None:
            if filters.status:
                sql += f" AND status IN ({','.join('?' * len(filters.status))})"
                params.extend(filters.status)
            where, args = _item_filter_sql(filters, "f", "COALESCE(f.occurred_at, f.observed_at)")
            sql += where
            params += args
        sql += f" ORDER BY pk {'DESC' if newest_first else ''} LIMIT ? OFFSET ?"
        params += [limit, offset]
        return [_row_to_fact(r) for r in self._conn().execute(sql, params)]

    def get_facts(self, project_id: str, ids: Sequence[str]) -> list[FactRow]:
        if not ids:
            return []
        marks = ",".join("?" * len(ids))
        rows = (
            self._conn()
            .execute(
                f"SELECT {_FACT_COLUMNS} FROM facts WHERE project_id = ? AND id IN ({marks})",
                (project_id, *ids),
            )
            .fetchall()
        )
        by_id = {r[2]: _row_to_fact(r) for r in rows}
        return [by_id[i] for i in ids if i in by_id]

    def list_topics(self, project_id: str, user_id: str) -> list[TopicRow]:
        conn = self._conn()
        rows = conn.execute(
            "SELECT pk, project_id, id, user_id, name, description, status, created_at, "
            "updated_at FROM topics WHERE project_id = ? AND user_id = ? AND status = 'active' "
            "ORDER BY pk",
            (project_id, user_id),
        ).fetchall()
        out = []
        for pk, proj, tid, uid, name, desc, status, created, updated in rows:
            ids = [
                r[0]
                for r in conn.execute(
                    "SELECT s.id FROM topic_summaries ts JOIN summaries s ON s.pk = ts.summary_pk "
                    "WHERE ts.topic_pk = ? ORDER BY s.pk",
                    (pk,),
                )
            ]
            out.append(TopicRow(pk, proj, tid, uid, name, desc, status, ids, created, updated))
        return out

    def _fulltext_layer(
        self,
        table: str,
        project_id: str,
        user_id: str,
        terms: Sequence[str],
        limit: int,
        statuses: Sequence[str],
    ) -> list[tuple[int, float]]:
        if not terms or limit <= 0 or not statuses:
            return []
        kept, scoping, matched = self._plan_fulltext(table, project_id, user_id, terms)
        token = scope_token(project_id, user_id) if scoping == "token" else None
        # Each match's row is read for its status anyway: its owner costs nothing more.
        owner = "" if token else " AND s.project_id = ? AND s.user_id = ?"
        marks = ",".join("?" * len(statuses))
        return self._rank_fulltext(
            table,
            kept,
            matched,
            token,
            f" CROSS JOIN {table} s ON s.pk = f.rowid",
            f" AND s.status IN ({marks}){owner}",
            [*statuses, *([] if token else [project_id, user_id])],
            limit,
        )

    def _vector_layer(
        self,
        table: str,
        kind: str,
        project_id: str,
        user_id: str,
        query: np.ndarray,
        embedder: str,
        limit: int,
        statuses: Sequence[str],
    ) -> list[tuple[int, float]]:
        if limit <= 0 or not statuses:
            return []
        scope = self._vector_scope(project_id, user_id, kind, embedder, int(query.shape[0]))
        q = np.asarray(query, dtype=np.float32)
        # Most items have a wanted status: over-fetch and filter, and only when too many
        # were dropped pay for the exact search among the allowed ones.
        found = scope.search(q, limit * 2 + 8)
        status = self._statuses(table, [pk for pk, _ in found])
        kept = [(pk, sim) for pk, sim in found if status.get(pk) in statuses]
        if len(kept) >= limit or len(found) < limit * 2 + 8:
            return kept[:limit]
        marks = ",".join("?" * len(statuses))
        allowed = np.fromiter(
            (
                r[0]
                for r in self._conn().execute(
                    f"SELECT pk FROM {table} WHERE project_id = ? AND user_id = ? "
                    f"AND status IN ({marks})",
                    (project_id, user_id, *statuses),
                )
            ),
            dtype=np.int64,
        )
        return scope.search(q, limit, allowed)

    def _statuses(self, table: str, pks: Sequence[int]) -> dict[int, str]:
        if not pks:
            return {}
        marks = ",".join("?" * len(pks))
        return dict(
            self._conn().execute(f"SELECT pk, status FROM {table} WHERE pk IN ({marks})", list(pks))
        )

    def fulltext_summaries(
        self,
        project_id: str,
        user_id: str,
        terms: Sequence[str],
        limit: int,
        statuses: Sequence[str] = CURRENT_SUMMARY,
    ) -> list[tuple[int, float]]:
        """Summaries of a user in ``statuses`` matching any of ``terms``, best first (BM25)."""
        return self._fulltext_layer("summaries", project_id, user_id, terms, limit, statuses)

    def vector_summaries(
        self,
        project_id: str,
        user_id: str,
        query: np.ndarray,
        embedder: str,
        limit: int,
        statuses: Sequence[str] = CURRENT_SUMMARY,
    ) -> list[tuple[int, float]]:
        """Summaries of a user in ``statuses`` nearest to ``query``: (pk, cosine similarity)."""
        return self._vector_layer(
            "summaries", "summary", project_id, user_id, query, embedder, limit, statuses
        )

    def fulltext_facts(
        self,
        project_id: str,
        user_id: str,
        terms: Sequence[str],
        limit: int,
        statuses: Sequence[str] = ("active",),
    ) -> list[tuple[int, float]]:
        """Facts of a user in ``statuses`` matching any of ``terms``, best first (BM25)."""
        return self._fulltext_layer("facts", project_id, user_id, terms, limit, statuses)

    def vector_facts(
        self,
        project_id: str,
        user_id: str,
        query: np.ndarray,
        embedder: str,
        limit: int,
        statuses: Sequence[str] = ("active",),
    ) -> list[tuple[int, float]]:
        """Facts of a user in ``statuses`` nearest to ``query``: (pk, cosine similarity)."""
        return self._vector_layer(
            "facts", "fact", project_id, user_id, query, embedder, limit, statuses
        )

    def facts_by_pk(self, pks: Sequence[int]) -> dict[int, FactRow]:
        rows = self._rows_by_pk("facts", _FACT_COLUMNS, list(pks))
        return {pk: _row_to_fact(r) for pk, r in rows.items()}

    def speaker_names(self, project_id: str, user_id: str) -> list[str]:
        """Names of the speakers of a user's messages (messages sent with a ``name``)."""
        return [
            r[0]
            for r in self._conn().execute(
                "SELECT name FROM speakers WHERE project_id = ? AND user_id = ? ORDER BY name",
                (project_id, user_id),
            )
        ]

    def topics_of_summaries(self, pks: Sequence[int]) -> dict[int, list[TopicRow]]:
        """The active topics each summary is filed under (summary pk → topics)."""
        if not pks:
            return {}
        marks = ",".join("?" * len(pks))
        rows = self._conn().execute(
            "SELECT ts.summary_pk, t.pk, t.project_id, t.id, t.user_id, t.name, t.description, "
            "t.status, t.created_at, t.updated_at FROM topic_summaries ts "
            "JOIN topics t ON t.pk = ts.topic_pk "
            f"WHERE ts.summary_pk IN ({marks}) AND t.status = 'active' ORDER BY t.pk",
            list(pks),
        )
        out: dict[int, list[TopicRow]] = {}
        for spk, pk, proj, tid, uid, name, desc, status, created, updated in rows:
            out.setdefault(spk, []).append(
                TopicRow(pk, proj, tid, uid, name, desc, status, [], created, updated)
            )
        return out

    def summaries_by_pk(self, pks: Sequence[int]) -> dict[int, SummaryRow]:
        rows = self._rows_by_pk("summaries", _SUMMARY_COLUMNS, list(pks))
        return {pk: _row_to_summary(r) for pk, r in rows.items()}

    def llm_usage(self, project_id: str | None = None) -> dict[str, Any]:
        where, params = ("WHERE project_id = ?", (project_id,)) if project_id else ("", ())
        rows = (
            self._conn()
            .execute(
                f"SELECT stage, model, count(*), sum(prompt_tokens), sum(completion_tokens), "
                f"sum(1 - ok) FROM llm_calls {where} GROUP BY stage, model ORDER BY stage, model",
                params,
            )
            .fetchall()
        )
        return {
            f"{stage} {model}": {
                "calls": n,
                "prompt_tokens": p or 0,
                "completion_tokens": k or 0,
                "failed": f or 0,
            }
            for stage, model, n, p, k, f in rows
        }

    # -- stats -------------------------------------------------------------------------

    def stats(self, project_id: str | None = None) -> dict[str, Any]:
        conn = self._conn()
        where, params = ("WHERE project_id = ?", (project_id,)) if project_id else ("", ())
        messages = dict(
            conn.execute(
                f"SELECT status, count(*) FROM messages {where} GROUP BY status", params
            ).fetchall()
        )
        jobs = dict(
            conn.execute(
                f"SELECT status, count(*) FROM jobs {where} GROUP BY status", params
            ).fetchall()
        )
        users = conn.execute(
            f"SELECT count(DISTINCT user_id) FROM sessions {where}", params
        ).fetchone()[0]
        sessions = conn.execute(f"SELECT count(*) FROM sessions {where}", params).fetchone()[0]
        vectors = dict(
            conn.execute(
                f"SELECT embedder, count(*) FROM vectors {where} GROUP BY embedder", params
            ).fetchall()
        )
        facts = conn.execute(f"SELECT count(*) FROM facts {where}", params).fetchone()[0]
        summaries = dict(
            conn.execute(
                f"SELECT status, count(*) FROM summaries {where} GROUP BY status", params
            ).fetchall()
        )
        topic_where = f"{where} {'AND' if where else 'WHERE'} status = 'active'"
        topics = conn.execute(f"SELECT count(*) FROM topics {topic_where}", params).fetchone()[0]
        files = (self.path, self.path + "-wal")
        size = sum(os.path.getsize(p) for p in files if os.path.exists(p))
        return {
            "store": "sqlite",
            "path": os.path.abspath(self.path),
            "schema_version": self.schema_version(),
            "size_bytes": size,
            "users": users,
            "sessions": sessions,
            "messages": {k: messages.get(k, 0) for k in ("pending", "processed", "failed")},
            "jobs": {k: jobs.get(k, 0) for k in ("queued", "running", "done", "failed")},
            "facts": facts,
            "summaries": summaries,
            "topics": topics,
            "vectors": vectors,
            "embedder": self.get_meta("embedder"),
            "llm_usage": self.llm_usage(project_id),
            "processing": processing_state(self._outages(conn)),
        }

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
    ) -> tuple[dict[int, tuple[Any, ...]], dict[int, tuple[Any, ...]], dict[int, tuple[Any, ...]]]:
        """What recall ranks items of a user on, without their text (read for the hits only).

        messages: pk -> (id, session_id, name, ts, superseded, prev_pk, next_pk, vec);
        superseded is 1 when every fact of the message was superseded; prev/next (same
        session, time order) only with ``neighbours``, else None. facts: pk -> (id, status,
        occurred_at, observed_at, created_at, valid_to, vec). summaries: pk -> (id, status,
        observed_at, created_at, valid_to, fact_ids JSON, JSON ids of its active topics,
        vec). vec is the item's float32 vector from ``embedder`` as bytes (None without one,
        or when no embedder is given).
        """
        conn = self._conn()
        # A previous turn sharing the timestamp (a batch without timestamps) is the nearest
        # one: seeking on (ts =, pk <) first keeps each lookup one index seek, where a row
        # value (ts, pk) < (?, ?) walks every turn with that timestamp.
        side = (
            "COALESCE((SELECT x.pk FROM messages x INDEXED BY messages_by_session_time "
            "WHERE x.project_id = m.project_id AND x.session_id = m.session_id "
            "AND x.ts = m.ts AND x.pk {op} m.pk ORDER BY x.pk {desc} LIMIT 1), "
            "(SELECT x.pk FROM messages x INDEXED BY messages_by_session_time "
            "WHERE x.project_id = m.project_id AND x.session_id = m.session_id "
            "AND x.ts {op} m.ts ORDER BY x.ts {desc}, x.pk {desc} LIMIT 1))"
        )
        around = (
            f"{side.format(op='<', desc='DESC')}, {side.format(op='>', desc='')}"
            if neighbours
            else "NULL, NULL"
        )
        queries = (
            (
                "message",
                messages,
                "SELECT m.pk, m.id, m.session_id, m.name, m.ts, (SELECT min(f.status = "
                "'superseded') FROM fact_sources fs JOIN facts f ON f.pk = fs.fact_pk "
                f"WHERE fs.message_pk = m.pk), {around} FROM messages m",
            ),
            (
                "fact",
                facts,
                "SELECT m.pk, m.id, m.status, m.occurred_at, m.observed_at, m.created_at, "
                "m.valid_to FROM facts m",
            ),
            (
                "summary",
                summaries,
                "SELECT m.pk, m.id, m.status, m.observed_at, m.created_at, m.valid_to, "
                "m.fact_ids, (SELECT json_group_array(id) FROM (SELECT t.id FROM "
                "topic_summaries ts JOIN topics t ON t.pk = ts.topic_pk WHERE "
                "ts.summary_pk = m.pk AND t.status = 'active' ORDER BY t.pk)) FROM summaries m",
            ),
        )
        out: list[dict[int, tuple[Any, ...]]] = []
        for kind, pks, select in queries:
            rows: list[tuple[Any, ...]] = []
            pks = list(pks)
            for i in range(0, len(pks), 500):
                chunk = pks[i : i + 500]
                marks = ",".join("?" * len(chunk))
                rows += conn.execute(
                    f"{select} WHERE m.pk IN ({marks}) AND m.project_id = ? AND m.user_id = ?",
                    (*chunk, project_id, user_id),
                ).fetchall()
            # The vectors come from the in-process cache that vector search keeps anyway:
            # reading ~150 of them from the table cost more than the rest of the briefs.
            vecs = (
                self._item_vectors(project_id, user_id, kind, embedder, [r[0] for r in rows])
                if embedder and rows
                else {}
            )
            out.append({r[0]: (*r[1:], vecs.get(r[0])) for r in rows})
        return out[0], out[1], out[2]

    def _item_vectors(
        self, project_id: str, user_id: str, kind: str, embedder: str, pks: Sequence[int]
    ) -> dict[int, bytes]:
        cached = self.vectors.peek((project_id, user_id, kind, embedder))
        if cached is not None:
            dim = cached.dim
        else:
            row = (
                self._conn()
                .execute(
                    "SELECT dim FROM vectors WHERE project_id = ? AND user_id = ? AND kind = ? "
                    "AND embedder = ? LIMIT 1",
                    (project_id, user_id, kind, embedder),
                )
                .fetchone()
            )
            if row is None:
                return {}
            dim = int(row[0])
        return self._vector_scope(project_id, user_id, kind, embedder, dim).vectors(pks)


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
