"""PostgreSQL adapter of the ``Store`` port: psycopg 3 with a connection pool, pgvector,
tsvector full text. Any number of processes (API replicas, workers) share one database.

Same semantics as the SQLite store, row for row; what differs is how:

* **Vectors** live in one ``vectors`` table with a ``vector`` column of no fixed dimension
  (the embedder decides it, and a reindex may change it). When vectors of a dimension are
  first written, an HNSW index per (kind, dimension) is created on the expression
  ``vec::vector(dim)`` (``halfvec`` above 2,000 dimensions), partial on ``kind`` and
  ``dim``. Similarity is the inner product, which is the cosine for the unit vectors every
  embedder returns, as in SQLite. A user's scope up to ``vector_index_threshold`` vectors
  is searched exactly (a scan of that user's rows); a larger one through the HNSW index
  with ``hnsw.ef_search`` raised to the number of results wanted and, on pgvector 0.8+,
  iterative scans so that status filters cannot starve the result; if the index still
  returns too few rows the search falls back to the exact one.
* **Full text** is a ``tsvector`` column with a GIN index. Documents are the words SQLite's
  tokenizer would see (``_text.fts_words`` over ``fts_document``: CJK runs as grams), so
  PostgreSQL's parser only ever sees plain words; the ``memstrata_fts`` configuration
  stems them like SQLite's porter tokenizer and keeps stop words. Matches are scored with
  FTS5's BM25 formula (k1 = 1.2, b = 0.75, collection-wide IDF and average length), so
  full-text scores mean the same on both stores. Rows are scoped by their
  (project_id, user_id) columns.
* **Jobs** are claimed with ``FOR UPDATE SKIP LOCKED`` and per-user advisory locks;
  workers of a ``Memory`` are dispatched by procrastinate, one run per user at a time
  (see ``_jobs.py`` and ``jobs/_procrastinate.py``).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib import resources
from typing import Any

import numpy as np

from ..._time import now_iso
from ...errors import ConfigError, StoreError
from .. import (
    AddOutcome,
    MessageRow,
    SearchFilters,
    SessionRow,
)
from .._core.dialect import Tx
from .._core.filters import search_filter_sql
from .._core.layers import FulltextColumns, VectorRow
from .._core.recall import BriefRead
from .._core.store import SQLStore
from .._text import fts_words
from ._connection import (
    APPLICATION_NAME,
    checked,
    fts_body,
    mask_url,
)
from ._dialect import PostgresDialect
from ._jobs import PostgresJobs
from ._user_indexes import PostgresUserIndexes, fulltext_target, vector_target

__all__ = ["PostgresStore", "latest_schema_version"]

_KINDS = {"message": "messages", "fact": "facts", "summary": "summaries"}
_TABLES = ("messages", "facts", "summaries")
log = logging.getLogger("memstrata.store")

# pgvector's HNSW indexes `vector` up to 2,000 dimensions and `halfvec` up to 4,000.
_MAX_VECTOR_DIM = 2000
_MAX_HALFVEC_DIM = 4000
# BM25 as SQLite's FTS5 computes it.
_K1, _B = 1.2, 0.75
# Tables up to this many rows (planner's estimate) have their full-text statistics counted
# at every query, exactly like FTS5; larger ones take them from caches (see _fts_stats).
_LIVE_STATS_ROWS = 5000
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
# cap, and the ranking. Lexemes are
# letters and digits only (see _fulltext), so quote_literal makes a tsquery operand of one.
_SMALL_FTS = (
    "WITH terms AS ("
    " SELECT x.i, array_agg(l.lexeme ORDER BY l.positions[1]) AS lexemes"
    " FROM unnest(%(words)s::text[]) WITH ORDINALITY AS x (w, i)"
    " CROSS JOIN LATERAL unnest(to_tsvector('memstrata_fts', x.w)) AS l GROUP BY x.i),"
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
    f" SELECT t.pk, {_BM25_SUM} AS score"
    " FROM {t} t CROSS JOIN LATERAL unnest(t.fts) AS u JOIN q ON q.lexeme = u.lexeme"
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


def _migrations() -> list[tuple[int, str, str]]:
    folder = resources.files("memstrata.store.postgres.migrations")
    found = []
    for entry in folder.iterdir():
        name = entry.name
        if name.endswith(".sql") and name[:4].isdigit():
            found.append((int(name[:4]), name, entry.read_text(encoding="utf-8")))
    return sorted(found)


def latest_schema_version() -> int:
    return _migrations()[-1][0]


def _index_type(dim: int) -> str | None:
    """The pgvector type an HNSW index of ``dim`` dimensions is built on (None: none fits)."""
    if dim <= _MAX_VECTOR_DIM:
        return f"vector({dim})"
    if dim <= _MAX_HALFVEC_DIM:
        return f"halfvec({dim})"
    return None


def _fresh(counted_at_rows: int, rows: int) -> bool:
    """Whether a count made when the table held ``counted_at_rows`` rows still stands."""
    return rows <= counted_at_rows * 1.1 + 100


def _lexeme_query(lexemes: Sequence[Sequence[str]]) -> str:
    """A tsquery (text form) matching any of the terms; a term of several lexemes is a
    phrase. Lexemes are quoted, so nothing in them is tsquery syntax."""
    parts = []
    for group in lexemes:
        quoted = [f"'{lex.translate(_TSQUERY_ESCAPE)}'" for lex in group]
        parts.append(quoted[0] if len(quoted) == 1 else "(" + " <-> ".join(quoted) + ")")
    return " | ".join(parts)


class PostgresStore(
    PostgresJobs,
    PostgresUserIndexes,
    SQLStore,
):
    """The store at scale. Thread-safe; any number of processes may share the database."""

    dialect = PostgresDialect()

    # Like SQLiteStore.MATCH_BUDGET: the terms of every layer's full-text search are taken
    # rarest first while the rows they match (collection-wide) add up to at most this many;
    # the rarest is always kept.
    MATCH_BUDGET = 4000
    # Like SQLiteStore.RANK_CAP: at most this many of a user's matches are ranked, taken
    # term by term, rarest first (tables above _LIVE_STATS_ROWS rows only).
    RANK_CAP = 1000

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
        try:
            import psycopg
            from psycopg_pool import ConnectionPool
        except ImportError as exc:  # pragma: no cover - depends on the installation
            raise ConfigError(
                "the PostgreSQL store needs the postgres extra: "
                "pip install 'memstrata[postgres]' (psycopg, psycopg-pool, pgvector)"
            ) from exc
        if pool_size < 1:
            raise ConfigError("the PostgreSQL pool size must be at least 1")
        self._conninfo = url
        self.url = mask_url(url)
        self._vector_index_threshold = vector_index_threshold
        self._ef_search = max(10, min(1000, ef_search))
        self._lock = threading.Lock()
        self._lent = {}
        self._lending = threading.Condition()
        self._indexed: set[tuple[str, int]] = set()
        self._scope_sizes: dict[tuple[Any, ...], tuple[bool, float]] = {}
        self._lexemes: dict[str, tuple[str, ...]] = {}
        self._df_cache: dict[tuple[str, str], tuple[int, int]] = {}
        self._stats_cache: dict[str, tuple[int, float, float]] = {}
        self._common_lexemes: dict[str, dict[str, float]] = {}
        self._recounting: set[str] = set()
        # table -> (rows holding each lexeme, the table's rows then): see _fts_stats.
        self._vocabulary: dict[str, tuple[dict[str, int], int]] = {}
        self._reading_vocabulary: set[str] = set()
        self._size_estimates: dict[str, tuple[float, float]] = {}
        self._vector_info: Any = None
        self._init_user_indexes(user_index_threshold, user_fulltext_threshold)
        try:
            with psycopg.connect(
                url,
                autocommit=True,
                connect_timeout=connect_timeout,
                fallback_application_name=APPLICATION_NAME,
            ) as conn:
                self._migrate(conn, migrate_to)
                row = conn.execute(
                    "SELECT extversion FROM pg_extension WHERE extname = 'vector'"
                ).fetchone()
        except psycopg.OperationalError as exc:
            raise StoreError(f"cannot connect to PostgreSQL at {self.url}: {exc}") from exc
        version = tuple(int(p) for p in str(row[0] if row else "0").split(".")[:2] if p.isdigit())
        # Iterative index scans (pgvector 0.8) keep filtered HNSW searches from coming back
        # short; older versions fall back to the exact search when they do.
        self._iterative = version >= (0, 8)
        self._pool: ConnectionPool[Any] = ConnectionPool(
            url,
            # A few connections ready from the start: a first recall asks in parallel, and
            # opening one (TCP, auth) costs more than the query.
            min_size=min(4, pool_size),
            max_size=pool_size,
            kwargs={"autocommit": True, "fallback_application_name": APPLICATION_NAME},
            configure=self._configure,
            open=False,
            name="memstrata",
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

    @contextmanager
    def _query(self) -> Iterator[Tx]:
        with self._read() as conn:
            yield Tx(conn, self.dialect)

    @contextmanager
    def _transaction(self) -> Iterator[Tx]:
        with self._write() as conn:
            yield Tx(conn, self.dialect)

    def close(self) -> None:
        self._close_user_indexes()
        self._close_pool()

    # -- schema ----------------------------------------------------------------------

    def _migrate(self, conn: Any, target: int | None) -> None:
        import psycopg

        migrations = _migrations()
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
                f"{self.url} has schema version {current}, newer than this memstrata "
                f"understands ({latest}); upgrade memstrata"
            )
        if current >= target:
            return
        try:
            with conn.transaction():
                # One migrator at a time per database: processes starting together wait
                # here, then find the work done.
                conn.execute("SELECT pg_advisory_xact_lock(hashtext('memstrata.migrate'))")
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
        # "memstrata,public" path must not take public's tables for its own.
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

    # -- full text -----------------------------------------------------------------------
    #
    # BM25 as FTS5 computes it: for each query lexeme, IDF = ln((N - df + 0.5) / (df + 0.5))
    # (1e-6 when not positive) over the whole table, and per row
    # IDF * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len / avglen)), lengths counting SQLite's
    # one-word scope column too. A table of up to _LIVE_STATS_ROWS rows (by the planner's
    # estimate) has N, the lengths and df counted exactly inside the one statement that
    # ranks; a larger one takes them from caches (_large_fulltext), as counting df of a
    # common word means visiting every row that holds it.

    def _is_large(self, c: Any, table: str) -> bool:
        now = time.monotonic()
        hit = self._size_estimates.get(table)
        if hit is None or now - hit[1] > 60:
            # The planner's row estimates of the three full-text tables, in one round trip.
            rows = c.execute(
                "SELECT t, coalesce((SELECT reltuples FROM pg_class WHERE oid = to_regclass(t)), 0)"
                " FROM unnest(%s::text[]) t",
                (list(_TABLES),),
            ).fetchall()
            for name, estimate in rows:
                self._size_estimates[name] = (float(estimate), now)
            hit = self._size_estimates.get(table, (0.0, now))
        return hit[0] > _LIVE_STATS_ROWS

    def _fulltext(
        self,
        table: str,
        project_id: str,
        user_id: str,
        terms: Sequence[str],
        limit: int,
        budget: int | None,
        where: str,
        params: Sequence[Any],
    ) -> list[tuple[int, float]]:
        # Words as the index holds them (fts_words: letters and digits only, which is what
        # lets the statements below quote lexemes by wrapping them in single quotes).
        words = [w for w in (" ".join(fts_words(t)) for t in terms) if w]
        if not words:
            return []
        scope = f" AND t.project_id = %(project)s AND t.user_id = %(user)s{where}"
        args: dict[str, Any] = {
            "project": project_id,
            "user": user_id,
            "limit": limit,
            "budget": budget,
            **{f"p{i}": v for i, v in enumerate(params)},
        }
        with self._read() as c:
            if self._is_large(c, table):
                found = self._large_fulltext(c, table, words, budget, scope, args)
                # Not prepared, so the user's own GIN index, once made, is used as it is.
                self._consider_user_index((project_id, user_id, fulltext_target(table)))
                return found
            args.update(words=words, cap=self.RANK_CAP)
            rows = c.execute(_SMALL_FTS.format(t=checked(table), scope=scope), args).fetchall()
        return [(int(pk), float(score)) for pk, score in rows]

    def _large_fulltext(
        self,
        c: Any,
        table: str,
        words: Sequence[str],
        budget: int | None,
        scope: str,
        args: dict[str, Any],
    ) -> list[tuple[int, float]]:
        groups = [g for g in self._term_lexemes(c, words) if g]
        if not groups:
            return []
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
        # Not prepared: the best plan depends on how common the terms are, which a generic
        # plan does not know.
        found = c.execute(_LARGE_FTS.format(branches=branches), args, prepare=False).fetchall()
        return [(int(pk), float(score)) for pk, score in found]

    def _term_lexemes(self, c: Any, words: Sequence[str]) -> list[tuple[str, ...]]:
        """The index's lexemes of each query word (stemmed), cached."""
        missing = sorted({w for w in words if w not in self._lexemes})
        if missing:
            rows = c.execute(
                "SELECT w, ARRAY(SELECT t.lexeme FROM unnest(to_tsvector('memstrata_fts', w)) t "
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
                target=self._recount, args=(table,), name="memstrata-fts-stats", daemon=True
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
            name="memstrata-fts-vocabulary",
            daemon=True,
        ).start()

    def _vocabulary_reader(self, table: str) -> None:
        try:
            with self._read() as c:
                rows = c.execute(f"SELECT count(*) FROM {checked(table)}").fetchone()[0]
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
        where, params = search_filter_sql(self.dialect, filters, "t")
        # The statements use named placeholders: the filter's become %(p0)s, %(p1)s, ...
        for i in range(len(params)):
            where = where.replace("?", f"%(p{i})s", 1)
        return self._fulltext(
            "messages", project_id, user_id, terms, limit, self.MATCH_BUDGET, where, params
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
        return self._fulltext(
            table,
            project_id,
            user_id,
            terms,
            limit,
            self.MATCH_BUDGET,
            " AND t.status = ANY(%(p0)s::text[])",
            [list(statuses)],
        )

    # -- vectors: search -----------------------------------------------------------------

    def _scope_is_large(
        self, c: Any, project_id: str, user_id: str, kind: str, embedder: str, dim: int
    ) -> bool:
        """Whether a user's vectors of one kind exceed ``vector_index_threshold``.

        Exact searches count the scope as they go (see _vector_search), so an unknown or
        small scope costs no query here; a scope known to be large is recounted, up to the
        threshold only, every five minutes. Either answer gives correct results."""
        threshold = self._vector_index_threshold
        if threshold <= 0:
            return True
        key = (project_id, user_id, kind, embedder, dim)
        hit = self._scope_sizes.get(key)
        if hit is None or not hit[0]:
            return False
        if time.monotonic() - hit[1] < 300:
            return True
        row = c.execute(
            "SELECT count(*) FROM (SELECT 1 FROM vectors WHERE project_id = %s AND user_id = %s "
            "AND kind = %s AND embedder = %s AND dim = %s LIMIT %s) s",
            (project_id, user_id, kind, embedder, dim, threshold + 1),
        ).fetchone()
        self._remember_scope(key, int(row[0]))
        return int(row[0]) > threshold

    def _remember_scope(self, key: tuple[Any, ...], size: int) -> None:
        if len(self._scope_sizes) > 100_000:
            self._scope_sizes.clear()
        self._scope_sizes[key] = (size > self._vector_index_threshold, time.monotonic())

    def _vector_search(
        self,
        kind: str,
        project_id: str,
        user_id: str,
        query: np.ndarray,
        embedder: str,
        limit: int,
        join: str = "",
        params: Sequence[Any] = (),
        narrow: bool = False,
    ) -> list[tuple[int, float]]:
        """Top ``limit`` (item pk, similarity) of a user's vectors of ``kind``; ``join``
        (with ``params``) restricts the items, e.g. to wanted statuses. ``narrow``: the join
        may keep few of the scope's items (message filters), so what an exact search counts
        says nothing about the scope's size."""
        if limit <= 0:
            return []
        q = np.ascontiguousarray(query, dtype=np.float32)
        dim = int(q.shape[0])
        kind_sql = {"message": "'message'", "fact": "'fact'", "summary": "'summary'"}[kind]

        def scope_of(who: str) -> str:
            # kind and dim are literals, not parameters, so that the planner can match the
            # partial HNSW index (WHERE kind = ... AND dim = ...) in a generic plan too.
            return (
                f"FROM vectors v {join} WHERE v.kind = {kind_sql} AND v.dim = {dim} "
                f"AND {who} AND v.embedder = %s"
            )

        scope = scope_of("v.project_id = %s AND v.user_id = %s")
        args = [*params, project_id, user_id, embedder]
        key = (project_id, user_id, kind, embedder, dim)
        with self._read() as c:
            index_type = _index_type(dim)
            if index_type is not None and self._scope_is_large(
                c, project_id, user_id, kind, embedder, dim
            ):
                expr = f"v.vec::{index_type} <#> %b::{index_type}"
                indexed = (project_id, user_id, vector_target(kind, dim))
                hnsw_scope, hnsw_args = scope, args
                if self._has_user_index(indexed):
                    # The user's own index (_pg_user_indexes): the planner matches its
                    # predicate only with the project and user as values it can see, so
                    # they are quoted literals and the statement is not prepared.
                    from psycopg import sql

                    who = sql.SQL("v.project_id = {} AND v.user_id = {}").format(
                        sql.Literal(project_id), sql.Literal(user_id)
                    )
                    hnsw_scope, hnsw_args = scope_of(who.as_string(c)), [*params, embedder]
                # One round trip (pipeline): the settings hold for this transaction only.
                with c.pipeline(), c.transaction():
                    c.execute(
                        "SELECT set_config('hnsw.ef_search', %s, true)",
                        (str(max(self._ef_search, min(1000, limit * 2))),),
                    )
                    if self._iterative:
                        c.execute("SELECT set_config('hnsw.iterative_scan', 'relaxed_order', true)")
                    # Iterative scans may return neighbours slightly out of order: sort the
                    # candidates again, exactly, outside the index scan.
                    cur = c.execute(
                        "WITH c AS MATERIALIZED (SELECT v.item_pk, v.pk, v.vec <#> %b AS d "
                        f"{hnsw_scope} ORDER BY {expr} LIMIT %s) "
                        "SELECT item_pk, d FROM c ORDER BY d, pk",
                        (q, *hnsw_args, q, limit),
                        prepare=False if hnsw_scope is not scope else None,
                    )
                found = cur.fetchall()
                self._consider_user_index(indexed, index_type)
                if len(found) >= limit:
                    return [(int(pk), -float(d)) for pk, d in found]
            # Exact: every vector of the scope (that passes the join), counted on the way so
            # that the next search knows whether the index should answer instead.
            rows = c.execute(
                f"SELECT v.item_pk, v.vec <#> %b AS d, count(*) OVER () {scope} "
                "ORDER BY d, v.pk LIMIT %s",
                (q, *args, limit),
            ).fetchall()
        if rows and not narrow:
            self._remember_scope(key, int(rows[0][2]))
        return [(int(pk), -float(d)) for pk, d, _ in rows]

    def vector_messages(
        self,
        project_id: str,
        user_id: str,
        query: np.ndarray,
        embedder: str,
        limit: int,
        filters: SearchFilters,
    ) -> list[tuple[int, float]]:
        if filters.empty:
            return self._vector_search("message", project_id, user_id, query, embedder, limit)
        where, params = search_filter_sql(self.dialect, filters, "m")
        return self._vector_search(
            "message",
            project_id,
            user_id,
            query,
            embedder,
            limit,
            # The filter's SQL holds no "%" and no "?" but its placeholders.
            f"JOIN messages m ON m.pk = v.item_pk{where.replace('?', '%s')}",
            params,
            narrow=True,
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
        return self._vector_search(
            kind,
            project_id,
            user_id,
            query,
            embedder,
            limit,
            f"JOIN {_KINDS[kind]} s ON s.pk = v.item_pk AND s.status = ANY(%s::text[])",
            [list(statuses)],
        )

    # -- vectors: writes and bookkeeping -------------------------------------------------

    def _prepare_vectors(self, dims: dict[str, int]) -> None:
        """Create the HNSW index of each (kind, dimension) about to be written, if missing.

        In its own short transaction, before the write: CREATE INDEX takes a lock that
        conflicts with concurrent writers, which inside a batch's transaction could
        deadlock with another worker's batch."""
        for kind, dim in dims.items():
            if (kind, dim) in self._indexed:
                continue
            index_type = _index_type(dim)
            name = f"vectors_hnsw_{kind}_{dim}"
            if index_type is not None:
                ops = "halfvec_ip_ops" if index_type.startswith("halfvec") else "vector_ip_ops"
                with self._write() as c:
                    if c.execute("SELECT to_regclass(%s)", (name,)).fetchone()[0] is None:
                        c.execute("SELECT pg_advisory_xact_lock(hashtext('memstrata.index'))")
                        c.execute(
                            f"CREATE INDEX IF NOT EXISTS {name} ON vectors USING hnsw "
                            f"((vec::{index_type}) {ops}) WHERE kind = '{checked(kind)}' "
                            f"AND dim = {int(dim)}"
                        )
            with self._lock:
                self._indexed.add((kind, dim))

    def _invalidate_vectors(self, tx: Tx) -> None:
        pass  # nothing of them is cached outside this process

    def _clear_vector_caches(self) -> None:
        self._scope_sizes.clear()
        # The new embedder's dimension may differ: users' indexes are made again as
        # searches find large scopes.
        self._drop_user_indexes(vectors_only=True)

    # -- derived layers: writes (the core's hooks, see _core/layers.py) ------------------

    def _insert_vector_rows(self, tx: Tx, rows: Sequence[VectorRow]) -> None:
        with tx.raw.cursor() as cur:
            cur.executemany(
                "INSERT INTO vectors (project_id, user_id, kind, item_pk, embedder, dim, vec) "
                "VALUES (%s, %s, %s, %s, %s, %s, %b) ON CONFLICT (kind, item_pk, embedder) "
                "DO UPDATE SET vec = excluded.vec, dim = excluded.dim",
                rows,
            )

    def _fulltext_columns(self, text: str) -> FulltextColumns:
        # The tsvector and its length (for BM25) are columns of the row itself.
        doc, length = fts_body(text)
        return (("fts", "to_tsvector('memstrata_fts', ?)", doc), ("fts_len", "?", length))

    def _index_fulltext(
        self, tx: Tx, table: str, pk: int, text: str, project_id: str, user_id: str, *, new: bool
    ) -> None:
        pass  # indexed in the row (_fulltext_columns)

    # -- derived layers: reads -----------------------------------------------------------

    # -- governance: what removal does here (see _core/removal.py) ------------------------

    def _unindex_gone(self, tx: Tx, table: str, gone: str) -> None:
        pass  # the full-text vector is a column of the row: it goes with it

    def _vectors_removed(self, tx: Tx, project_id: str, user_id: str) -> None:
        pass  # searches read the vectors table itself; nothing caches its rows

    def _user_erased(self, project_id: str, user_id: str) -> None:
        # After the erasure's commit: DROP INDEX CONCURRENTLY cannot run in a transaction.
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

    # -- recall --------------------------------------------------------------------------

    def _read_briefs(
        self,
        reads: Sequence[BriefRead],
        project_id: str,
        user_id: str,
        embedder: str | None,
    ) -> list[list[Sequence[Any]]]:
        out: list[list[Sequence[Any]]] = []
        with self._read() as c:
            # The layers' queries go out together (pipeline mode): one round trip, not
            # three; binary, so that pgvector hands the vectors over as arrays.
            cursors: list[Any] = []
            with c.pipeline():
                for read in reads:
                    vec = (
                        f"(SELECT v.vec FROM vectors v WHERE v.kind = '{read.kind}' "
                        "AND v.item_pk = m.pk AND v.embedder = ?)"
                    )
                    cur = c.cursor(binary=True)
                    sql = f"SELECT {read.columns}, {vec} {read.source}"
                    self.dialect.execute(cur, sql, [embedder, *read.params])
                    cursors.append(cur)
            for cur in cursors:
                out.append(
                    [
                        (*row[:-1], None if row[-1] is None else row[-1].to_numpy().tobytes())
                        for row in cur.fetchall()
                    ]
                )
                cur.close()
        return out
