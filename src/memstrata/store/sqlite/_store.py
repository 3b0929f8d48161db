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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from functools import lru_cache
from importlib import resources
from typing import Any

import numpy as np

from ..._time import now_iso
from ...errors import ConfigError, StoreError
from .. import (
    ClaimedBatch,
    SearchFilters,
)
from .._batches import (
    JOB_ROW,
    admit,
    claimable,
    take_jobs,
)
from .._core import jobs as core_jobs
from .._core.dialect import Tx
from .._core.filters import search_filter_sql
from .._core.layers import FulltextColumns, VectorRow
from .._core.recall import BriefRead
from .._core.store import SQLStore
from .._text import fts_document, message_text, scope_token
from ._dialect import NUMBER_CMP, SQLiteDialect, number_cmp
from ._vectors import VectorCache

__all__ = ["SQLiteStore", "latest_schema_version", "sqlite_path"]

_TABLES = {"fact": "facts", "summary": "summaries"}


# Claimable: queued and due, or running under an expired lease (parameters: now, now).
_READY = (
    "((j.status = 'queued' AND j.run_after <= ?) OR (j.status = 'running' AND j.lease_until < ?))"
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
            (pk, fts_document(message_text(content, event_type, page)), scope_token(project, user))
            for pk, project, user, content, event_type, page in rows
        ),
    )


# Python steps that run right after the SQL file of the same version, in its transaction.
_POST_STEPS = {2: _backfill_fts}


def _any_of(terms: Sequence[str]) -> str:
    """An FTS5 expression matching any of ``terms``, each quoted so it is never syntax."""
    return " OR ".join('"' + t.replace('"', '""') + '"' for t in terms)


class SQLiteStore(SQLStore):
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
            conn.create_function(NUMBER_CMP, 3, number_cmp, deterministic=True)
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

    # -- messages and jobs (the rest is the core's: _core/ingest.py, _core/jobs.py) ------

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
        with self._query() as tx:
            # Idle workers (and waiting callers) poll: look without taking the write lock.
            if (
                tx.one(f"SELECT 1 FROM jobs j WHERE {_READY} {scope}LIMIT 1", (now, now, *jobs))
                is None
                or not admit(core_jobs.outages(tx), now)[0]
            ):
                return None
        with self._transaction() as tx:
            # Re-read under the write lock: only one claim takes a due probe.
            admitted, hold = admit(core_jobs.outages(tx), now)
            if not admitted:
                return None
            # The earliest unfinished job of its user, ready to run: per-user order holds
            # because a later job is never claimable while an earlier one is unfinished.
            head = tx.one(
                "SELECT j.id, j.project_id, j.user_id FROM jobs j "
                f"WHERE j.status IN ('queued', 'running') AND {_READY} "
                "AND NOT EXISTS (SELECT 1 FROM jobs e WHERE e.project_id = j.project_id "
                "     AND e.user_id = j.user_id AND e.status IN ('queued', 'running') "
                f"     AND e.id < j.id) {scope}"
                "ORDER BY j.id LIMIT 1",
                (now, now, *jobs),
            )
            if head is None:
                return None
            first_id, project_id, user_id = head
            job_ids = take_jobs(
                tx.all(
                    f"SELECT {JOB_ROW} FROM jobs "
                    "WHERE project_id = ? AND user_id = ? AND status IN ('queued', 'running') "
                    "AND id >= ? ORDER BY id LIMIT 256",
                    (project_id, user_id, first_id),
                ),
                max_messages,
                claimable(now),
            )
            user = (project_id, user_id)
            return core_jobs.take(tx, worker_id, now + lease_seconds, user, job_ids, hold)

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
        where, params = search_filter_sql(self.dialect, filters)
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
            where + owner,
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
            where, params = search_filter_sql(self.dialect, filters)
            allowed = np.fromiter(
                (
                    r[0]
                    for r in conn.execute(
                        f"SELECT m.pk FROM messages m WHERE m.project_id = ? AND m.user_id = ?"
                        f"{where}",
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
        # messages_fts, facts_fts, summaries_fts: rowid = the row's pk, scoped by a token of
        # the user.
        if new:
            tx.execute(
                f"INSERT INTO {table}_fts (rowid, body, scope) VALUES (?, ?, ?)",
                (pk, fts_document(text), _scope(project_id, user_id)),
            )
        else:
            tx.execute(f"UPDATE {table}_fts SET body = ? WHERE rowid = ?", (fts_document(text), pk))

    # -- derived layers: reads -------------------------------------------------------------

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

    def _fulltext_layer(
        self,
        table: str,
        project_id: str,
        user_id: str,
        terms: Sequence[str],
        limit: int,
        statuses: Sequence[str],
    ) -> list[tuple[int, float]]:
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
        kind: str,
        project_id: str,
        user_id: str,
        query: np.ndarray,
        embedder: str,
        limit: int,
        statuses: Sequence[str],
    ) -> list[tuple[int, float]]:
        table = _TABLES[kind]
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

    # -- governance: what removal does here (see _core/removal.py) ------------------------

    def _unindex_gone(self, tx: Tx, table: str, gone: str) -> None:
        # The FTS5 tables hold one row per item, under the item's pk.
        tx.execute(f"DELETE FROM {table}_fts WHERE rowid IN (SELECT pk FROM {gone})")

    def _vectors_removed(self, tx: Tx, project_id: str, user_id: str) -> None:
        # Loaded vector scopes (in this process and any other) reload from the table.
        tx.execute(
            "INSERT INTO vector_generations (project_id, user_id, kind, generation) "
            "SELECT ?, ?, k.kind, 1 FROM (SELECT 'message' AS kind UNION ALL SELECT 'fact' "
            "UNION ALL SELECT 'summary') k WHERE 1 ON CONFLICT (project_id, user_id, kind) "
            "DO UPDATE SET generation = generation + 1",
            (project_id, user_id),
        )

    def _user_erased(self, project_id: str, user_id: str) -> None:
        pass  # nothing kept per user outside the tables (the vector cache: by generation)

    # -- stats -------------------------------------------------------------------------

    def _store_facts(self) -> dict[str, Any]:
        files = (self.path, self.path + "-wal")
        return {
            "store": "sqlite",
            "path": os.path.abspath(self.path),
            "schema_version": self.schema_version(),
            "size_bytes": sum(os.path.getsize(p) for p in files if os.path.exists(p)),
        }

    # -- recall --------------------------------------------------------------------------

    def _read_briefs(
        self,
        reads: Sequence[BriefRead],
        project_id: str,
        user_id: str,
        embedder: str | None,
    ) -> list[list[Sequence[Any]]]:
        out: list[list[Sequence[Any]]] = []
        with self._query() as tx:
            for read in reads:
                rows = tx.all(f"SELECT {read.columns} {read.source}", read.params)
                # The vectors come from the in-process cache that vector search keeps
                # anyway: reading ~150 of them from the table cost more than the rest of
                # the briefs.
                vecs: dict[int, bytes] = {}
                if embedder and rows:
                    pks = [r[0] for r in rows]
                    vecs = self._item_vectors(project_id, user_id, read.kind, embedder, pks)
                out.append([(*r, vecs.get(r[0])) for r in rows])
        return out

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
