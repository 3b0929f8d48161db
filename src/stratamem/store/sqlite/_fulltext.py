"""The SQLite store's full text: FTS5 tables beside the rows, searched with FTS5's BM25.

``messages_fts``, ``facts_fts`` and ``summaries_fts`` hold one row per item (rowid = the
item's pk), its text and a scope token of its user; a search matches the query's terms
(planned rarest first within ``MATCH_BUDGET``, at most ``RANK_CAP`` rows ranked) and the
token. PostgreSQL keeps a ``tsvector`` column in the row instead and computes the same
BM25 itself (``postgres/_fulltext.py``).
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Sequence
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from functools import lru_cache
from typing import Any, NamedTuple

from ...errors import StoreError
from .. import SearchFilters
from .._core.dialect import Tx
from .._core.filters import search_filter_sql
from .._core.layers import FulltextAsk, FulltextColumns, LayerSearch
from .._text import fts_document, scope_token
from ._connection import SQLiteBase

__all__ = ["SQLiteFullText"]

# A user's full-text scope token, computed once per user rather than once per row.
_scope = lru_cache(maxsize=1024)(scope_token)


class _Plan(NamedTuple):
    """How one full-text search runs (``_plan_fulltext``)."""

    kept: list[str]  # the terms searched, rarest first
    scoping: str  # how to keep to the user: "token", "owner" or "none"
    matched: int  # a bound on the user's rows those terms match


def _any_of(terms: Sequence[str]) -> str:
    """An FTS5 expression matching any of ``terms``, each quoted so it is never syntax."""
    return " OR ".join('"' + t.replace('"', '""') + '"' for t in terms)


class SQLiteFullText(SQLiteBase):
    """Part of SQLiteStore: the FTS5 tables' upkeep and full-text search."""

    # Ranking is the cost of a full-text query: FTS5 scores every row matching any term.
    # Terms are taken rarest first while the rows they match add up to at most this many
    # (the rarest is always kept): common words rank by noise anyway, the rare ones carry
    # the query, and the vector side still sees the whole question.
    MATCH_BUDGET = 4000
    # Ranking reads every row it scores. When the kept terms still match more than this
    # many rows (only when the rarest alone does: MATCH_BUDGET keeps the rest within it),
    # at most this many of the user's are ranked: term by term, rarest first, each term's
    # in rowid order (PostgresStore.RANK_CAP, the same rule). Choosing a subset costs a walk
    # of each term and a ranking walk of their rowid range, more than ranking every match
    # within the budget: at 1,000, a 10,000-message user's full text took 27 ms a search
    # against 16-21 ms ranking all (bench/scale.py --part user).
    RANK_CAP = MATCH_BUDGET
    # A user who owns most rows: their best messages are looked for among this many times
    # as many of the table's best (``_owned_of_head``).
    OWNED_HEAD = 4
    # A search's statements run one after the other on the caller's connection; those that
    # rank more than APART_ROWS rows (a user with a long history: ~5 us a row, so a few to
    # tens of milliseconds each) run beside the first of them, at most FULLTEXT_APART at
    # once, each on a connection of its own: FTS5 ranks with the GIL released, and while
    # one statement ranks, the other core is often idle (the vector side is done first).
    # A 10,000-message user's search (bench/scale.py --part user's store, 8 processes a
    # side in turn): mean 54.7 -> 51.8 ms, p95 99 -> 90 ms. A user with fewer rows in a
    # table than APART_ROWS never hands over: there it would cost about what it saves.
    APART_ROWS = 1000
    FULLTEXT_APART = 2

    def _init_fulltext(self) -> None:
        self._df_cache: dict[tuple[str, str], tuple[int, int]] = {}
        self._stem_cache: dict[str, str] = {}
        self._apart: ThreadPoolExecutor | None = None
        self._apart_closed = False
        self._apart_lock = threading.Lock()

    def _close_fulltext(self) -> None:
        """Stop the threads that run statements apart. Waited for: a live thread keeps its
        connection open (``_close_connections``), and a statement takes milliseconds."""
        with self._apart_lock:
            apart, self._apart, self._apart_closed = self._apart, None, True
        if apart is not None:
            apart.shutdown(wait=True, cancel_futures=True)

    # -- writes (the core's hooks, see _core/layers.py and _core/removal.py) -------------

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

    def _unindex_gone(self, tx: Tx, table: str, gone: str) -> None:
        # The FTS5 tables hold one row per item, under the item's pk.
        tx.execute(f"DELETE FROM {table}_fts WHERE rowid IN (SELECT pk FROM {gone})")

    # -- search --------------------------------------------------------------------------

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
    ) -> _Plan:
        """The terms to search, how to keep to the user, and how many rows that ranks."""
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
            return _Plan(kept, "token", bound)
        return _Plan(kept, "none" if owned == total else "owner", bound)

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
                # The bound is collection-wide: this user's matches are taken term by term,
                # rarest first, until the cap; when they all fit, all are ranked.
                taken = self._take_rarest(conn, head, [match(_any_of([t])) for t in kept], args)
                if taken is not None:
                    # "+": a rowid constraint would open one FTS5 cursor per candidate, and
                    # each cursor's bm25 reads its terms' whole doclists again (6 s for
                    # 1,000). The candidates' rowid range does bound the one cursor's walk.
                    only = (
                        " AND f.rowid BETWEEN ? AND ?"
                        " AND +f.rowid IN (SELECT value FROM json_each(?))"
                    )
                    extra = [min(taken), max(taken), json.dumps(sorted(taken))]
            rows = conn.execute(
                f"SELECT f.rowid, bm25({table}_fts, 1.0, 0.0) AS r {head}{only} ORDER BY r LIMIT ?",
                [match(_any_of(kept)), *args, *extra, limit],
            ).fetchall()
        except sqlite3.OperationalError as exc:  # a malformed MATCH must not break recall
            raise StoreError(f"full-text search failed: {exc}") from exc
        return [(int(pk), -float(r)) for pk, r in rows]

    def _take_rarest(
        self, conn: sqlite3.Connection, head: str, matches: Sequence[str], args: Sequence[Any]
    ) -> set[int] | None:
        """At most RANK_CAP of the rows each of ``matches`` finds (one per term, rarest
        first), each term's in rowid order, rows an earlier term found passed over; None
        when there are fewer in all (rank them all). Each term's doclist is walked once:
        excluding the earlier terms in the expression walked all of theirs again."""
        taken: set[int] = set()
        cap = self.RANK_CAP
        for expr in matches:
            # One row back, a JSON array: stepping through the rows from Python gave the
            # GIL away and back for every one.
            (found,) = conn.execute(
                f"SELECT json_group_array(rowid) FROM (SELECT f.rowid {head} LIMIT ?)",
                [expr, *args, cap],
            ).fetchone()
            for rowid in json.loads(found):
                taken.add(rowid)
                if len(taken) >= cap:
                    return taken
        return None

    def _fulltext_many(self, asks: Sequence[FulltextAsk]) -> list[list[tuple[int, float]]]:
        plans = [self._plan_fulltext(a.table, *a.search[:2], a.terms) for a in asks]
        many = [i for i, plan in enumerate(plans) if plan.matched > self.APART_ROWS]
        apart = {i: self._run_apart(asks[i], plans[i]) for i in many[1 : 1 + self.FULLTEXT_APART]}
        found = [
            [] if i in apart else self._fulltext_ask(ask, plan)
            for i, (ask, plan) in enumerate(zip(asks, plans, strict=True))
        ]
        for i, future in apart.items():
            try:
                found[i] = future.result()
            except CancelledError:  # the store closed before it ran
                raise StoreError("the store is closed") from None
        return found

    def _fulltext_ask(self, ask: FulltextAsk, plan: _Plan) -> list[tuple[int, float]]:
        if ask.filters is None:
            return self._fulltext_layer(ask.search, ask.table, plan)
        return self._fulltext_messages(ask.search, plan, ask.filters)

    def _run_apart(self, ask: FulltextAsk, plan: _Plan) -> Future[list[tuple[int, float]]]:
        with self._apart_lock:
            if self._apart_closed:
                raise StoreError("the store is closed")
            if self._apart is None:
                self._apart = ThreadPoolExecutor(
                    max_workers=self.FULLTEXT_APART, thread_name_prefix="stratamem-fulltext"
                )
            return self._apart.submit(self._fulltext_ask, ask, plan)

    def _fulltext_messages(
        self, search: LayerSearch, plan: _Plan, filters: SearchFilters
    ) -> list[tuple[int, float]]:
        project_id, user_id, limit, _ = search
        kept, scoping, matched = plan
        where, params = search_filter_sql(self.dialect, filters)
        if scoping == "owner" and not where and matched <= self.RANK_CAP:
            found = self._owned_of_head("messages", search, kept)
            if found is not None:
                return found
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

    def _owned_of_head(
        self, table: str, search: LayerSearch, kept: Sequence[str]
    ) -> list[tuple[int, float]] | None:
        """The user's ``limit`` best rows of ``table`` (in ``search``'s statuses, if it
        names any: messages have none), taken from the head of the whole table's ranking,
        for a user who owns most rows; None when other users' rows (or rows in another
        status) crowd the head: then the ranking checks each match. BM25 reads the table's
        statistics whoever owns a row, so the user's rows keep their scores and order.
        Checking the owner of every match cost 40% of the statement for a 10,000-message
        user, reading each fact's row for its status half of the facts' statement at
        100,000; checking ``OWNED_HEAD`` x ``limit`` rows by their pks costs a tenth of a
        millisecond (``NOT INDEXED``: the planner walked the user's index instead)."""
        project_id, user_id, limit, statuses = search
        status = f" AND status IN ({','.join('?' * len(statuses))})" if statuses else ""
        depth = limit * self.OWNED_HEAD
        ranked = self._rank_fulltext(table, kept, 0, None, "", "", [], depth)
        if not ranked:
            return []
        pks, args = self.dialect.in_("pk", [pk for pk, _ in ranked])
        mine = {
            pk
            for (pk,) in self._conn().execute(
                f"SELECT pk FROM {table} NOT INDEXED WHERE project_id = ? AND user_id = ?"
                f"{status} AND {pks}",
                [project_id, user_id, *statuses, *args],
            )
        }
        owned = [hit for hit in ranked if hit[0] in mine]
        if len(owned) >= limit or len(ranked) < depth:
            return owned[:limit]
        return None

    def _fulltext_layer(
        self, search: LayerSearch, table: str, plan: _Plan
    ) -> list[tuple[int, float]]:
        project_id, user_id, limit, statuses = search
        kept, scoping, matched = plan
        if scoping != "token" and matched <= self.RANK_CAP:
            found = self._owned_of_head(table, search, kept)
            if found is not None:
                return found
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
