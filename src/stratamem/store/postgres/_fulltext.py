"""The PostgreSQL store's full text: a ``tsvector`` column with a GIN index, ranked with
FTS5's BM25.

Documents are the words SQLite's tokenizer would see (``_text.fts_words`` over
``fts_document``: CJK runs as grams, ``fts_body``), so PostgreSQL's parser only ever sees
plain words; the ``stratamem_fts`` configuration stems them like SQLite's porter tokenizer
and keeps stop words. Matches are scored with FTS5's BM25 formula (k1 = 1.2, b = 0.75,
collection-wide IDF and average length), so full-text scores mean the same on both
stores. Rows are scoped by their (project_id, user_id) columns. SQLite keeps FTS5 tables
beside the rows instead and lets FTS5 rank (``sqlite/_fulltext.py``).

BM25 as FTS5 computes it: for each query lexeme, IDF = ln((N - df + 0.5) / (df + 0.5))
(1e-6 when not positive) over the whole table, and per row
IDF * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len / avglen)), lengths counting SQLite's
one-word scope column too. A table of up to _LIVE_STATS_ROWS rows (estimated) has N, the
lengths and df counted exactly inside the one statement that ranks; a larger one takes them
from caches (_large_fulltext), as counting df of a common word means visiting every row
that holds it. A user with many rows of a large table gets a GIN index of their own
(``_user_indexes.py``).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Sequence
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from typing import Any, NamedTuple

from ...errors import StoreError
from .._core.dialect import Tx
from .._core.filters import search_filter_sql
from .._core.layers import FulltextAsk, FulltextColumns
from .._text import fts_document, fts_words
from ._connection import checked
from ._user_indexes import PostgresUserIndexes, fulltext_target

__all__ = ["PostgresFullText", "fts_body"]

_TABLES = ("messages", "facts", "summaries")


class _Statement(NamedTuple):
    """A full-text statement of one layer and query variant."""

    sql: str
    args: dict[str, Any]
    prepare: bool  # whether psycopg may prepare it
    # It ranks more of the user's rows than the rank cap lets a statement take at once
    # (its terms match more rows than RANK_CAP): it may run apart (see _fulltext_many).
    ranks_many: bool = False


log = logging.getLogger("stratamem.store")

# PostgreSQL's tsvector holds at most 1 MB; a longer document is indexed by its start.
_MAX_FTS_WORDS = 100_000
# BM25 as SQLite's FTS5 computes it.
_K1, _B = 1.2, 0.75
# Tables up to this many rows (estimated) have their full-text statistics counted at every
# query, exactly like FTS5; larger ones take them from caches (see _fts_stats). Counting
# costs more than the caches from a few hundred rows on (one user's LoCoMo turns, median
# per statement: 2.2 against 1.5 ms at 200 rows, 4.4 against 1.9 at 1,000, 10.5 against
# 3.6 at 3,000), and the caches give the same scores while fresh.
_LIVE_STATS_ROWS = 200
# Lexeme counts kept per large table (the most frequent first); ~100 bytes each.
_VOCABULARY_MAX = 1_000_000
_TSQUERY_ESCAPE = str.maketrans({"'": "''", "\\": "\\\\"})


def _bm25_sum(idf: str, length: str, avgdl: str) -> str:
    """The BM25 sum over a row's matching lexemes ``u`` (tf: the number of positions of the
    lexeme in the row), given SQL for each lexeme's IDF, the row's length (+ 1: SQLite's
    one-word scope column counts in its row lengths) and the average length."""
    return (
        f"sum({idf} * cardinality(u.positions) * {_K1 + 1} / (cardinality(u.positions) + "
        f"{_K1} * ({1 - _B} + {_B} * ({length} + 1) / {avgdl})))"
    )


# `q` holds (lexeme, idf), `st.avgdl` the average row length.
_BM25_SUM = _bm25_sum("q.idf", "t.fts_len", "st.avgdl")

# Full text of a small table in one statement: the query words' lexemes, the table's row
# count and average length, each lexeme's document frequency, the terms kept within the
# budget (rarest first; the rarest always), their tsquery, the candidates within the rank
# cap, and the ranking. Lexemes are letters and digits only (see _fulltext_statement), so
# quote_literal makes a tsquery operand of one.
_SMALL_FTS = (
    "WITH terms AS ("
    " SELECT x.i, array_agg(l.lexeme ORDER BY l.positions[1]) AS lexemes"
    " FROM unnest(%(words)s::text[]) WITH ORDINALITY AS x (w, i)"
    " CROSS JOIN LATERAL unnest(to_tsvector('stratamem_fts', x.w)) AS l GROUP BY x.i),"
    " st AS (SELECT count(*)::float8 AS n,"
    " coalesce(sum(fts_len), 0)::float8 / greatest(count(*), 1) + 1 AS avgdl FROM {t}),"
    " lex AS (SELECT DISTINCT unnest(lexemes) AS lexeme FROM terms),"
    " df AS (SELECT lex.lexeme, (SELECT count(*) FROM {t}"
    " WHERE fts @@ quote_literal(lex.lexeme)::tsquery)::float8 AS df FROM lex),"
    " ranked AS (SELECT terms.i, terms.lexemes, sum(g.d) OVER w AS cum,"
    " row_number() OVER w AS rn FROM terms CROSS JOIN LATERAL"
    " (SELECT max(df.df) AS d FROM df WHERE df.lexeme = ANY(terms.lexemes)) g"
    " WINDOW w AS (ORDER BY g.d, terms.i)),"
    " kept AS (SELECT i, lexemes, rn, cum, array_to_string(ARRAY("
    " SELECT quote_literal(x) FROM unnest(lexemes) AS x), ' <-> ')::tsquery AS tsq FROM ranked"
    " WHERE rn = 1 OR %(budget)s::float8 IS NULL OR cum <= %(budget)s::float8),"
    " q AS (SELECT DISTINCT df.lexeme,"
    " CASE WHEN ln((st.n - df.df + 0.5) / (df.df + 0.5)) > 0"
    " THEN ln((st.n - df.df + 0.5) / (df.df + 0.5)) ELSE 1e-6 END AS idf"
    " FROM kept CROSS JOIN LATERAL unnest(kept.lexemes) AS k (lexeme)"
    " JOIN df ON df.lexeme = k.lexeme CROSS JOIN st),"
    " tsq AS (SELECT string_agg('(' || tsq::text || ')', ' | ')::tsquery AS q FROM kept),"
    # The rank cap, as on a large table: the first %(cap)s matches by (rarest term they
    # match, pk), which is the order SQLite takes them in; which term comes first only
    # needs working out when the kept terms match more rows than the cap.
    " cand AS MATERIALIZED (SELECT t.pk FROM {t} t WHERE t.fts @@ (SELECT q FROM tsq){scope}"
    " ORDER BY CASE WHEN (SELECT max(cum) FROM kept) > %(cap)s"
    " THEN (SELECT min(k.rn) FROM kept k WHERE t.fts @@ k.tsq) END, t.pk LIMIT %(cap)s)"
    # Each candidate's score reads only the query's lexemes out of its tsvector (as on a
    # large table): unnesting every lexeme of long turns took most of the full-text time.
    f" SELECT t.pk, {_BM25_SUM} AS score"
    " FROM {t} t CROSS JOIN LATERAL unnest(ts_filter(setweight(t.fts, 'A',"
    " (SELECT array_agg(lexeme) FROM q)), '{{a}}')) AS u JOIN q ON q.lexeme = u.lexeme"
    " CROSS JOIN st WHERE t.pk IN (SELECT pk FROM cand)"
    " GROUP BY t.pk ORDER BY score DESC, t.pk LIMIT %(limit)s"
)

# Full text of a large table: lexemes, IDF and the average length come from the caches.
# At most %(cap)s candidates are ranked: {branches} are LIMITed scans through the (user_id,
# fts) GIN index, one for all the terms when their rows fit the cap, else one per term,
# rarest first, each leaving out rows an earlier one took. Past the cap, what is left out
# matches only terms at least as common as what was taken. Each candidate's score reads
# just the query's lexemes out of its tsvector (setweight marks them, ts_filter keeps
# them) rather than unnesting every lexeme of the row.
_LARGE_FTS = (
    "WITH c AS MATERIALIZED (SELECT * FROM ({branches}) b LIMIT %(cap)s)"
    f" SELECT c.pk, (SELECT {_bm25_sum('i.idf', 'c.fts_len', '%(avgdl)s::float8')}"
    " FROM unnest(ts_filter(setweight(c.fts, 'A', %(lexemes)s::text[]), '{{a}}')) AS u"
    " CROSS JOIN LATERAL (SELECT (%(idf)s::float8[])[array_position(%(lexemes)s::text[],"
    " u.lexeme)] AS idf) AS i) AS score"
    " FROM c ORDER BY score DESC, c.pk LIMIT %(limit)s"
)
_LARGE_FTS_BRANCH = (
    "(SELECT t.pk, t.fts, t.fts_len FROM {t} t WHERE t.fts @@ %(q{i})s::tsquery{unless}{scope}"
    " LIMIT %(cap)s)"
)


def _fresh(counted_at_rows: int, rows: int) -> bool:
    """Whether a count made when the table held ``counted_at_rows`` rows still stands."""
    return rows <= counted_at_rows * 1.1 + 100


def _execute(c: Any, st: _Statement) -> Any:
    """Send ``st`` on the connection ``c`` (prepared by psycopg once run often, if it may)."""
    return c.execute(st.sql, st.args, prepare=None if st.prepare else False)


def _ranked(rows: Sequence[Sequence[Any]]) -> list[tuple[int, float]]:
    return [(int(pk), float(score)) for pk, score in rows]


def _lexeme_query(lexemes: Sequence[Sequence[str]]) -> str:
    """A tsquery (text form) matching any of the terms; a term of several lexemes is a
    phrase. Lexemes are quoted, so nothing in them is tsquery syntax."""
    parts = []
    for group in lexemes:
        quoted = [f"'{lex.translate(_TSQUERY_ESCAPE)}'" for lex in group]
        parts.append(quoted[0] if len(quoted) == 1 else "(" + " <-> ".join(quoted) + ")")
    return " | ".join(parts)


def fts_body(text: str) -> tuple[str, int]:
    """(document, number of words) to index for ``text``: the words SQLite would index,
    CJK runs expanded to grams, joined by spaces so PostgreSQL's parser sees just words."""
    words = fts_words(fts_document(text))[:_MAX_FTS_WORDS]
    return " ".join(words), len(words)


class PostgresFullText(PostgresUserIndexes):
    """Part of PostgresStore: the rows' full-text columns and full-text search."""

    # the rarest is always kept.
    MATCH_BUDGET = 4000
    # Like SQLiteStore.RANK_CAP: at most this many of a user's matches are ranked, taken
    # term by term, rarest first (tables above _LIVE_STATS_ROWS rows only).
    RANK_CAP = 1000
    # Statements of a search that rank many rows run apart, each on a connection of its
    # own, at most this many at once (see _fulltext_many).
    FULLTEXT_APART = 2

    def _init_fulltext(self) -> None:
        self._lexemes: dict[str, tuple[str, ...]] = {}
        self._df_cache: dict[tuple[str, str], tuple[int, int]] = {}
        self._stats_cache: dict[str, tuple[int, float, float]] = {}
        self._common_lexemes: dict[str, dict[str, float]] = {}
        self._recounting: set[str] = set()
        # table -> (rows holding each lexeme, the table's rows then): see _fts_stats.
        self._vocabulary: dict[str, tuple[dict[str, int], int]] = {}
        self._reading_vocabulary: set[str] = set()
        self._size_estimates: dict[str, tuple[float, float]] = {}
        self._apart: ThreadPoolExecutor | None = None
        self._apart_closed = False

    def _close_fulltext(self) -> None:
        with self._lock:
            apart, self._apart, self._apart_closed = self._apart, None, True
        if apart is not None:
            apart.shutdown(wait=False, cancel_futures=True)

    # -- writes (the core's hooks, see _core/layers.py and _core/removal.py) -------------

    def _fulltext_columns(self, text: str) -> FulltextColumns:
        # The tsvector and its length (for BM25) are columns of the row itself.
        doc, length = fts_body(text)
        return (("fts", "to_tsvector('stratamem_fts', ?)", doc), ("fts_len", "?", length))

    def _index_fulltext(
        self, tx: Tx, table: str, pk: int, text: str, project_id: str, user_id: str, *, new: bool
    ) -> None:
        pass  # indexed in the row (_fulltext_columns)

    def _unindex_gone(self, tx: Tx, table: str, gone: str) -> None:
        pass  # the full-text vector is a column of the row: it goes with it

    # -- search --------------------------------------------------------------------------

    def _is_large(self, c: Any, table: str) -> bool:
        now = time.monotonic()
        hit = self._size_estimates.get(table)
        if hit is None or now - hit[1] > 60:
            # The row estimates of the three full-text tables, in one round trip: the
            # planner's, or the live count of the statistics system for a table never
            # analysed (-1: a new table, or autovacuum off).
            rows = c.execute(
                "SELECT t, greatest("
                "(SELECT reltuples FROM pg_class WHERE oid = to_regclass(t)),"
                " (SELECT n_live_tup FROM pg_stat_user_tables WHERE relid = to_regclass(t)), 0)"
                " FROM unnest(%s::text[]) t",
                (list(_TABLES),),
            ).fetchall()
            for name, estimate in rows:
                self._size_estimates[name] = (float(estimate), now)
            hit = self._size_estimates.get(table, (0.0, now))
        return hit[0] > _LIVE_STATS_ROWS

    def _fulltext_many(self, asks: Sequence[FulltextAsk]) -> list[list[tuple[int, float]]]:
        # Every statement in one round trip (a pipeline): a search asks three layers for
        # each variant of its query. What a statement needs first (lexemes, counts) is
        # read before, when not cached. The server runs a pipeline's statements one after
        # the other, so those that rank many rows (a user with a long history: ~1,000
        # rows each, tens of milliseconds) are sent on connections of their own, to run
        # in parallel with the rest, which keep the one round trip.
        apart: list[tuple[int, Future[list[tuple[int, float]]]]] = []
        with self._read() as c:
            statements = [self._fulltext_statement(c, ask) for ask in asks]
            live = [(i, st) for i, st in enumerate(statements) if st is not None]
            many = [(i, st) for i, st in live if st.ranks_many][: self.FULLTEXT_APART]
            if len(many) == len(live):
                many = many[1:]  # this connection runs one of them
            for i, st in many:
                apart.append((i, self._run_apart(st)))
                statements[i] = None
            cursors: list[Any] = []
            with c.pipeline():
                for here in statements:
                    if here is None:
                        cursors.append(None)
                        continue
                    cursors.append(_execute(c, here))
            found = [[] if cur is None else _ranked(cur.fetchall()) for cur in cursors]
        # Waited for with this connection back in the pool: a thread running a statement
        # apart may need it.
        for i, future in apart:
            try:
                found[i] = future.result()
            except CancelledError:  # the store closed before it ran
                raise StoreError("the store is closed") from None
        return found

    def _run_apart(self, st: _Statement) -> Future[list[tuple[int, float]]]:
        with self._lock:
            if self._apart_closed:
                raise StoreError("the store is closed")
            if self._apart is None:
                self._apart = ThreadPoolExecutor(
                    max_workers=self.FULLTEXT_APART, thread_name_prefix="stratamem-fulltext"
                )
            apart = self._apart

        def run() -> list[tuple[int, float]]:
            with self._read() as c:
                return _ranked(_execute(c, st).fetchall())

        return apart.submit(run)

    def _fulltext_statement(self, c: Any, ask: FulltextAsk) -> _Statement | None:
        """The statement that ranks ``ask``'s rows (None: no word to look for)."""
        table, (project_id, user_id, limit, statuses), terms, filters = ask
        # Words as the index holds them (fts_words: letters and digits only, which is what
        # lets the statements below quote lexemes by wrapping them in single quotes).
        words = [w for w in (" ".join(fts_words(t)) for t in terms) if w]
        if not words:
            return None
        if filters is not None:
            where, params = search_filter_sql(self.dialect, filters, "t")
            # The statements use named placeholders: the filter's become %(p0)s, %(p1)s, ...
            for i in range(len(params)):
                where = where.replace("?", f"%(p{i})s", 1)
        else:
            where, params = " AND t.status = ANY(%(p0)s::text[])", [list(statuses)]
        scope = f" AND t.project_id = %(project)s AND t.user_id = %(user)s{where}"
        budget = self.MATCH_BUDGET
        args: dict[str, Any] = {
            "project": project_id,
            "user": user_id,
            "limit": limit,
            "budget": budget,
            **{f"p{i}": v for i, v in enumerate(params)},
        }
        if self._is_large(c, table):
            own = (project_id, user_id, fulltext_target(table))
            found = self._large_fulltext(
                c, table, words, budget, scope, args, prepare=not self._has_user_index(own)
            )
            self._consider_user_index(own)
            return found
        args.update(words=words, cap=self.RANK_CAP)
        return _Statement(_SMALL_FTS.format(t=checked(table), scope=scope), args, True)

    def _large_fulltext(
        self,
        c: Any,
        table: str,
        words: Sequence[str],
        budget: int | None,
        scope: str,
        args: dict[str, Any],
        *,
        prepare: bool,
    ) -> _Statement | None:
        """The statement of a large table's full text (None: no term to look for).
        ``prepare``: whether the statement may be prepared (psycopg prepares a statement
        run often): not for a user with a GIN index of their own, which the planner matches
        only with the user as a value it sees, in a plan made for this execution."""
        groups = [g for g in self._term_lexemes(c, words) if g]
        if not groups:
            return None
        rows, avg, df = self._fts_stats(c, table, [lex for g in groups for lex in g])
        # Rarest first: the order the budget keeps terms in and candidates are taken in.
        rarity = sorted((max(df[lex] for lex in g), i) for i, g in enumerate(groups))
        kept: list[tuple[str, ...]] = []
        matched = 0
        for d, i in rarity:
            # While the rows they match add up to at most the budget (the rarest is always
            # kept), as SQLiteStore._plan_fulltext does.
            if budget is not None and kept and matched + d > budget:
                break
            kept.append(groups[i])
            matched += d
        idf = {}
        for g in kept:
            for lex in g:
                value = math.log((rows - df[lex] + 0.5) / (df[lex] + 0.5))
                idf[lex] = value if value > 0 else 1e-6
        lexemes = list(idf)
        # One index scan when the terms' rows (collection-wide, so the user's too) fit the
        # cap; each scan decodes the user's whole posting list.
        parts = [kept] if matched <= self.RANK_CAP else [[g] for g in kept]
        args.update(
            avgdl=avg,
            lexemes=lexemes,
            idf=[idf[x] for x in lexemes],
            cap=self.RANK_CAP,
            **{f"q{i}": _lexeme_query(part) for i, part in enumerate(parts)},
            **{f"x{i}": _lexeme_query(kept[:i]) for i in range(1, len(parts))},
        )
        t = checked(table)
        branches = " UNION ALL ".join(
            _LARGE_FTS_BRANCH.format(
                t=t, i=i, scope=scope, unless=f" AND NOT t.fts @@ %(x{i})s::tsquery" if i else ""
            )
            for i in range(len(parts))
        )
        # Prepared, planning took as long as running the statement (LoCoMo users: ~0.7 of
        # ~1.6 ms). The server still plans the first five runs with the values, and keeps
        # a generic plan only if it does not look costlier than those; the plan is the same
        # index scan whatever the terms, as the (user_id, fts) GIN index serves any of them.
        return _Statement(
            _LARGE_FTS.format(branches=branches), args, prepare, ranks_many=len(parts) > 1
        )

    def _term_lexemes(self, c: Any, words: Sequence[str]) -> list[tuple[str, ...]]:
        """The index's lexemes of each query word (stemmed), cached."""
        missing = sorted({w for w in words if w not in self._lexemes})
        if missing:
            rows = c.execute(
                "SELECT w, ARRAY(SELECT t.lexeme FROM unnest(to_tsvector('stratamem_fts', w)) t "
                "ORDER BY t.positions[1]) FROM unnest(%s::text[]) w",
                (missing,),
            ).fetchall()
            if len(self._lexemes) > 100_000:
                self._lexemes.clear()
            for w, lexemes in rows:
                self._lexemes[w] = tuple(lexemes)
        return [self._lexemes.get(w, ()) for w in words]

    def _fts_stats(
        self, c: Any, table: str, lexemes: Sequence[str]
    ) -> tuple[int, float, dict[str, int]]:
        """(rows, average length, rows holding each lexeme) of a large table.

        Counting costs a visit to every row counted, so nothing common is counted on a
        search's path. The table's rows and average length are counted on the first search
        and then recounted once a minute in the background (a large collection's average
        barely moves, and IDF follows the logarithm of the counts). A lexeme ANALYZE found
        common takes its count from its frequency in pg_stats; any other from the table's
        vocabulary (every lexeme's count, read by ts_stat in the background after the first
        search, and again once the table grew by a tenth); one the vocabulary does not hold
        yet is counted (a few thousand rows at most, or it would be common) and cached until
        the table grew by a tenth, as SQLiteStore caches counts."""
        hit = self._stats_cache.get(table)
        if hit is None:
            hit = self._count_table(c, table)
        elif time.monotonic() - hit[2] > 60 and table not in self._recounting:
            self._recounting.add(table)
            threading.Thread(
                target=self._recount, args=(table,), name="stratamem-fts-stats", daemon=True
            ).start()
        rows, avg = hit[0], hit[1]
        common = self._common_lexemes.get(table, {})
        known, counted_at = self._vocabulary.get(table, ({}, -1))
        if counted_at < 0 or not _fresh(counted_at, rows):
            known = {}
            self._read_vocabulary(table)
        df: dict[str, int] = {}
        missing = []
        for lex in dict.fromkeys(lexemes):
            cached = self._df_cache.get((table, lex))
            if lex in common:
                df[lex] = round(common[lex] * rows)
            elif lex in known:
                df[lex] = known[lex]
            elif cached is not None and _fresh(cached[1], rows):
                df[lex] = cached[0]
            else:
                missing.append(lex)
        if missing:
            found = c.execute(
                f"SELECT l, (SELECT count(*) FROM {checked(table)} WHERE fts @@ q::tsquery) "
                "FROM unnest(%s::text[], %s::text[]) x (l, q)",
                (missing, [_lexeme_query([(lex,)]) for lex in missing]),
            ).fetchall()
            if len(self._df_cache) > 100_000:
                self._df_cache.clear()
            for lex, k in found:
                df[lex] = int(k)
                self._df_cache[(table, lex)] = (int(k), rows)
        return rows, avg, df

    def _count_table(self, c: Any, table: str) -> tuple[int, float, float]:
        n, total = c.execute(
            f"SELECT count(*), coalesce(sum(fts_len), 0) FROM {checked(table)}"
        ).fetchone()
        # + 1: SQLite's one-word scope column counts in its row lengths.
        hit = (int(n), (float(total) / n if n else 0.0) + 1.0, time.monotonic())
        row = c.execute(
            "SELECT most_common_elems::text::text[], most_common_elem_freqs FROM pg_stats "
            "WHERE schemaname = current_schema() AND tablename = %s AND attname = 'fts'",
            (table,),
        ).fetchone()
        common: dict[str, float] = {}
        if row is not None and row[0]:
            # The frequencies list ends with three summary figures, past the elements.
            common = dict(zip(row[0], row[1], strict=False))
        self._stats_cache[table] = hit
        self._common_lexemes[table] = common
        return hit

    def _read_vocabulary(self, table: str) -> None:
        """Read ``table``'s vocabulary in the background, unless a reading runs already."""
        with self._lock:
            if table in self._reading_vocabulary:
                return
            self._reading_vocabulary.add(table)
        threading.Thread(
            target=self._vocabulary_reader,
            args=(table,),
            name="stratamem-fts-vocabulary",
            daemon=True,
        ).start()

    def _vocabulary_reader(self, table: str) -> None:
        try:
            with self._read() as c:
                counted = c.execute(f"SELECT count(*) FROM {checked(table)}").fetchone()
                assert counted is not None  # an aggregate without GROUP BY has its one row
                rows = counted[0]
                # One pass over the table (about 2 s per million rows here), off the search
                # path. The rarest lexemes past the cap are counted when asked for, cheaply.
                found = c.execute(
                    "SELECT word, ndoc FROM ts_stat(%s) ORDER BY ndoc DESC LIMIT %s",
                    (f"SELECT fts FROM {checked(table)}", _VOCABULARY_MAX),
                ).fetchall()
            self._vocabulary[table] = ({w: int(n) for w, n in found}, int(rows))
        except Exception:  # searches go on counting what they need
            log.warning("reading %s's full-text vocabulary failed", table, exc_info=True)
        finally:
            with self._lock:
                self._reading_vocabulary.discard(table)

    def _recount(self, table: str) -> None:
        try:
            with self._read() as c:
                self._count_table(c, table)
        except Exception:  # a failed recount keeps the previous figures
            log.warning("recounting %s's full-text statistics failed", table, exc_info=True)
        finally:
            self._recounting.discard(table)
