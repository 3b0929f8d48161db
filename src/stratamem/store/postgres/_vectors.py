"""The PostgreSQL store's vectors: pgvector, searched exactly or through HNSW indexes.

Vectors live in one ``vectors`` table with a ``vector`` column of no fixed dimension (the
embedder decides it, and a reindex may change it). When vectors of a dimension are first
written, an HNSW index per (kind, dimension) is created on the expression
``vec::vector(dim)`` (``halfvec`` above 2,000 dimensions), partial on ``kind`` and
``dim``. Similarity is the inner product, which is the cosine for the unit vectors every
embedder returns, as in SQLite. A user's scope up to ``vector_index_threshold`` vectors is
searched exactly, in this process, through the vector cache SQLite uses
(``store/_vector_cache.py``): scanning a LoCoMo-sized user's rows in the server cost 2-4 ms a
layer (distances and a status join over a few hundred rows), more than the rest of a search's
statements; the cache reads only the rows past the last one it saw, and everything again once
the user's generation moved (``vector_generations``, bumped on deletion). That is sound
because a user's vectors are written under the user's lock (``_insert_vector_rows``), so they
commit in pk order, and an item embedded again takes a new pk. A larger scope is searched
through the HNSW index with
``hnsw.ef_search`` raised to the number of results wanted and, on pgvector 0.8+,
iterative scans so that status filters cannot starve the result; if the index still
returns too few rows the search falls back to the exact one. A user lost in a large shared
index gets one of their own (``_user_indexes.py``). SQLite has no vector index and
searches in-process instead (``sqlite/_vectors.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from .. import SearchFilters
from .._core.dialect import Tx
from .._core.filters import search_filter_sql
from .._core.layers import LayerSearch, VectorRow
from .._core.recall import BriefRead
from .._vector_cache import VectorCache, VectorScope
from ._connection import checked
from ._dialect import int_array
from ._user_indexes import PostgresUserIndexes, vector_target

__all__ = ["PostgresVectors"]

_KINDS = {"message": "messages", "fact": "facts", "summary": "summaries"}

# pgvector's HNSW indexes `vector` up to 2,000 dimensions and `halfvec` up to 4,000.
_MAX_VECTOR_DIM = 2000
_MAX_HALFVEC_DIM = 4000
# Vectors the cache of small scopes holds, across users (~1.5 KB each at 384 dimensions);
# the least recently searched users are dropped past it.
_CACHE_MAX_VECTORS = 1_000_000
# The scopes cached are searched exactly: the cache never builds an index of its own.
_NO_CACHE_INDEX = 1 << 62
# A scope's vector rows past a pk: (project, user, kind, embedder, dim, after pk).
_ROWS_AFTER = (
    "pk, item_pk, vec FROM vectors WHERE project_id = %s AND user_id = %s AND kind = %s "
    "AND embedder = %s AND dim = %s AND pk > %s"
)
_GENERATION_KINDS = "(VALUES ('message'), ('fact'), ('summary')) k (kind)"


def _index_type(dim: int) -> str | None:
    """The pgvector type an HNSW index of ``dim`` dimensions is built on (None: none fits)."""
    if dim <= _MAX_VECTOR_DIM:
        return f"vector({dim})"
    if dim <= _MAX_HALFVEC_DIM:
        return f"halfvec({dim})"
    return None


@dataclass(frozen=True)
class _ReadAhead:
    """A scope's rows past ``after`` as read ahead (``rows``); asked from another pk,
    ``read`` reads them."""

    after: int
    rows: list[tuple[int, int, bytes]]
    read: Callable[[int], list[tuple[int, int, bytes]]]

    def __call__(self, after_pk: int) -> list[tuple[int, int, bytes]]:
        return self.rows if after_pk == self.after else self.read(after_pk)


class PostgresVectors(PostgresUserIndexes):
    """Part of PostgresStore: the vectors table's upkeep and vector search."""

    def _init_vectors(self, conn: Any, index_threshold: int, ef_search: int) -> None:
        """Settings and caches of vector search; ``conn``: a connection to learn pgvector's
        version on."""
        self._vector_index_threshold = index_threshold
        self._ef_search = max(10, min(1000, ef_search))
        self._indexed: set[tuple[str, int]] = set()
        self._scope_sizes: dict[tuple[Any, ...], tuple[bool, float]] = {}
        self.vectors = VectorCache(index_threshold=_NO_CACHE_INDEX, max_vectors=_CACHE_MAX_VECTORS)
        row = conn.execute(
            "SELECT extversion FROM pg_extension WHERE extname = 'vector'"
        ).fetchone()
        version = tuple(int(p) for p in str(row[0] if row else "0").split(".")[:2] if p.isdigit())
        # Iterative index scans (pgvector 0.8) keep filtered HNSW searches from coming back
        # short; older versions fall back to the exact search when they do.
        self._iterative = version >= (0, 8)

    # -- writes and bookkeeping (the core's hooks, see _core/layers.py) ------------------

    def _insert_vector_rows(self, tx: Tx, rows: Sequence[VectorRow]) -> None:
        # Under each user's lock, taken before the rows draw their pks: the writes of one
        # user then commit in pk order, which is what lets a cache read "the rows past the
        # last pk it saw" (a batch's transaction holds its user's lock already; taking it
        # again is free). Sorted, so that two writers of several users cannot deadlock.
        for project_id, user_id in sorted({(r[0], r[1]) for r in rows}):
            tx.lock_user(project_id, user_id)
        with tx.raw.cursor() as cur:
            cur.executemany(
                # An item embedded again takes a new pk, as on SQLite: caches see it as new.
                "INSERT INTO vectors (project_id, user_id, kind, item_pk, embedder, dim, vec) "
                "VALUES (%s, %s, %s, %s, %s, %s, %b) ON CONFLICT (kind, item_pk, embedder) "
                "DO UPDATE SET vec = excluded.vec, dim = excluded.dim, pk = excluded.pk",
                rows,
            )

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
                    found = c.execute("SELECT to_regclass(%s)", (name,)).fetchone()
                    assert found is not None  # a SELECT without FROM has its one row
                    if found[0] is None:
                        c.execute("SELECT pg_advisory_xact_lock(hashtext('stratamem.index'))")
                        c.execute(
                            f"CREATE INDEX IF NOT EXISTS {name} ON vectors USING hnsw "
                            f"((vec::{index_type}) {ops}) WHERE kind = '{checked(kind)}' "
                            f"AND dim = {int(dim)}"
                        )
            with self._lock:
                self._indexed.add((kind, dim))

    def _invalidate_vectors(self, tx: Tx) -> None:
        # Every process's cached scopes are loaded again at their next search.
        tx.raw.execute(
            "INSERT INTO vector_generations (project_id, user_id, kind, generation) "
            f"SELECT s.project_id, s.user_id, k.kind, 1 FROM (SELECT DISTINCT project_id, "
            f"user_id FROM messages) s, {_GENERATION_KINDS} ON CONFLICT "
            "(project_id, user_id, kind) DO UPDATE SET generation = "
            "vector_generations.generation + 1"
        )

    def _clear_vector_caches(self) -> None:
        self.vectors.clear()
        self._scope_sizes.clear()
        # The new embedder's dimension may differ: users' indexes are made again as
        # searches find large scopes.
        self._drop_user_indexes(vectors_only=True)

    def _vectors_removed(self, tx: Tx, project_id: str, user_id: str) -> None:
        # Cached scopes of the user (in this process and any other) load again.
        tx.raw.execute(
            "INSERT INTO vector_generations (project_id, user_id, kind, generation) "
            f"SELECT %s, %s, k.kind, 1 FROM {_GENERATION_KINDS} ON CONFLICT "
            "(project_id, user_id, kind) DO UPDATE SET generation = "
            "vector_generations.generation + 1",
            (project_id, user_id),
        )

    # -- search --------------------------------------------------------------------------

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

    def _small_scopes(
        self,
        c: Any,
        project_id: str,
        user_id: str,
        kinds: Sequence[str],
        embedder: str,
        dim: int,
        also: Callable[[], Any] | None = None,
    ) -> tuple[dict[str, VectorScope | None], Any]:
        """A user's vectors of each of ``kinds`` from the cache, brought up to date in one
        round trip (the generations, and the rows past the last pk each scope saw: usually
        none); None for a scope of more than ``vector_index_threshold`` vectors, which the
        server searches. A scope this process has not loaded yet is counted first, up to
        the threshold. ``also`` sends more statements in that round trip: what it returns
        comes back beside the scopes (None when no scope was to be brought up to date)."""
        threshold = self._vector_index_threshold
        out: dict[str, VectorScope | None] = {}
        after: dict[str, int] = {}
        for kind in kinds:
            key = (project_id, user_id, kind, embedder, dim)
            known = self._scope_sizes.get(key)
            loaded = self.vectors.peek((project_id, user_id, kind, embedder))
            if known is None and loaded is None:
                row = c.execute(
                    "SELECT count(*) FROM (SELECT 1 FROM vectors WHERE project_id = %s AND "
                    "user_id = %s AND kind = %s AND embedder = %s AND dim = %s LIMIT %s) s",
                    (project_id, user_id, kind, embedder, dim, max(threshold, 0) + 1),
                ).fetchone()
                self._remember_scope(key, int(row[0]))
                known = self._scope_sizes[key]
            if known is not None and known[0]:
                out[kind] = None
            else:
                after[kind] = loaded.last_pk if loaded is not None and loaded.dim == dim else 0
        if not after:
            return out, None
        wanted = list(after)
        rows_sql = " UNION ALL ".join(f"(SELECT kind, {_ROWS_AFTER})" for _ in wanted)
        extra = None
        with c.pipeline():
            if also is not None:
                extra = also()
            generations = c.execute(
                "SELECT kind, generation FROM vector_generations WHERE project_id = %s "
                "AND user_id = %s AND kind = ANY(%s)",
                (project_id, user_id, wanted),
            )
            # Binary: pgvector hands each vector over as an array, not text to parse.
            new_rows = c.cursor(binary=True)
            new_rows.execute(
                f"{rows_sql} ORDER BY 1, 2",
                [a for k in wanted for a in (project_id, user_id, k, embedder, dim, after[k])],
            )
        generation = dict(generations.fetchall())
        found: dict[str, list[tuple[int, int, bytes]]] = {k: [] for k in wanted}
        for kind, pk, item, vec in new_rows:
            found[kind].append((pk, item, vec.to_numpy().tobytes()))
        new_rows.close()
        for kind in wanted:
            # What was read above, unless the scope moved since (another thread added rows,
            # or the generation changed and the scope loads from the start).
            read = _ReadAhead(
                after[kind],
                found[kind],
                partial(self._rows_after, c, (project_id, user_id, kind, embedder, dim)),
            )
            scope = self.vectors.scope(
                (project_id, user_id, kind, embedder),
                dim=dim,
                generation=int(generation.get(kind, 0)),
                load=read,
            )
            if scope.n > threshold:
                # Grown large: the index answers next time, and nothing reads this copy
                # again (briefs would take stale vectors from it).
                self._remember_scope((project_id, user_id, kind, embedder, dim), scope.n)
                self.vectors.drop((project_id, user_id, kind, embedder))
            out[kind] = scope
        return out, extra

    @staticmethod
    def _rows_after(
        c: Any, scope: tuple[str, str, str, str, int], after_pk: int
    ) -> list[tuple[int, int, bytes]]:
        """(pk, item pk, vector bytes) of a (project, user, kind, embedder, dim) scope's rows
        past ``after_pk``, in pk order."""
        with c.cursor(binary=True) as cur:
            cur.execute(f"SELECT {_ROWS_AFTER} ORDER BY pk", (*scope, after_pk))
            return [(pk, item, vec.to_numpy().tobytes()) for pk, item, vec in cur]

    def vector_layers(
        self,
        project_id: str,
        user_id: str,
        queries: Sequence[np.ndarray],
        embedder: str,
        limit: int,
        *,
        messages: SearchFilters | None,
        facts: Sequence[str] | None,
        summaries: Sequence[str] | None,
    ) -> list[dict[str, list[tuple[int, float]]]]:
        """Every layer and query in two round trips when the user's scopes are small: their
        freshness, then the statuses of the facts and summaries found (over-fetched) with
        the messages a filter keeps. One statement per layer and query searched them in the
        server before, each a scan of the user's rows. A large scope is searched in the
        server (``_vector_search``)."""
        statuses = {k: tuple(v) for k, v in (("fact", facts), ("summary", summaries)) if v}
        kinds = ["message"] * (messages is not None) + list(statuses)
        out: list[dict[str, list[tuple[int, float]]]] = [
            {k: [] for k, v in (("fact", facts), ("summary", summaries)) if v is not None}
            for _ in queries
        ]
        if not queries or not kinds or limit <= 0:
            for found in out:
                found.update((k, []) for k in kinds)
            return out
        qs = [np.ascontiguousarray(q, dtype=np.float32) for q in queries]
        dim = int(qs[0].shape[0])
        near: dict[str, list[list[tuple[int, float]]]] = {}
        over = limit * 2 + 8  # most items have a wanted status: over-fetch, then filter
        # Facts and summaries are searched in their cached scopes as they are, and the
        # statuses of what that finds are asked in the round trip that brings the scopes up
        # to date: when that finds nothing new (the usual case), no second round trip.
        guesses: dict[str, tuple[VectorScope, int, list[list[tuple[int, float]]]]] = {}
        for kind in statuses:
            held = self.vectors.peek((project_id, user_id, kind, embedder))
            if held is not None and held.dim == dim:
                guesses[kind] = (held, *held.searched(qs, over))
        with self._read() as c:
            scopes, read_guessed = self._small_scopes(
                c,
                project_id,
                user_id,
                kinds,
                embedder,
                dim,
                also=partial(self._ask_statuses, c, {k: g[2] for k, g in guesses.items()}),
            )
            guessed = read_guessed() if read_guessed is not None else {}
            cached = {k: scope for k, scope in scopes.items() if scope is not None}
            checked = [k for k in statuses if k in cached]
            status_of: dict[str, dict[int, str]] = {k: {} for k in checked}
            stale = []
            for kind in checked:
                held, last_pk, hits = guesses.get(kind, (None, -1, []))
                # A guess holds when its scope is the one brought up to date and took no rows.
                if held is cached[kind] and last_pk == held.last_pk:
                    near[kind], status_of[kind] = hits, guessed[kind]
                else:
                    near[kind] = [cached[kind].search(q, over) for q in qs]
                    stale.append(kind)
            where, params = (
                ("", [])
                if messages is None or messages.empty
                else search_filter_sql(self.dialect, messages, "m")
            )
            # The filter's SQL holds no "%" and no "?" but its placeholders.
            where = where.replace("?", "%s")
            filtered = "message" in cached and bool(where)
            if "message" in cached and not filtered:
                near["message"] = [cached["message"].search(q, limit) for q in qs]
            if stale or filtered:
                with c.pipeline():
                    late = self._ask_statuses(c, {k: near[k] for k in stale})
                    allowed_rows = None
                    if filtered:
                        allowed_rows = c.execute(
                            "SELECT m.pk FROM messages m WHERE m.project_id = %s AND "
                            f"m.user_id = %s{where}",
                            (project_id, user_id, *params),
                        )
                status_of.update(late())
                if allowed_rows is not None:
                    allowed = np.fromiter((r[0] for r in allowed_rows), dtype=np.int64)
                    near["message"] = [cached["message"].search(q, limit, allowed) for q in qs]
            for kind in checked:
                near[kind] = [
                    self._kept(
                        c,
                        (project_id, user_id, kind),
                        cached[kind],
                        q,
                        hits,
                        status_of[kind],
                        statuses[kind],
                        limit,
                    )
                    for q, hits in zip(qs, near[kind], strict=True)
                ]
        # What the cache does not hold, the server searches, restricted as the layer asks.
        restrict = {
            "message": (f"JOIN messages m ON m.pk = v.item_pk{where}" if where else "", params),
            **{
                k: (
                    f"JOIN {_KINDS[k]} s ON s.pk = v.item_pk AND s.status = ANY(%s::text[])",
                    [list(v)],
                )
                for k, v in statuses.items()
            },
        }
        for i, q in enumerate(qs):
            for kind in kinds:
                if kind in near:
                    out[i][kind] = near[kind][i]
                else:
                    join, args = restrict[kind]
                    out[i][kind] = self._vector_search(
                        kind,
                        project_id,
                        user_id,
                        q,
                        embedder,
                        limit,
                        join,
                        args,
                        narrow=kind == "message" and bool(where),
                    )
        return out

    @staticmethod
    def _ask_statuses(
        c: Any, found: dict[str, list[list[tuple[int, float]]]]
    ) -> Callable[[], dict[str, dict[int, str]]]:
        """Send the statement that reads the status of each item ``found`` (by kind, per
        query), in one statement for all kinds (in a pipeline it waits for the rest):
        returns what reads the answer, {kind: {pk: status}}."""
        kinds = list(found)
        if not kinds:
            return dict
        cur = c.execute(
            " UNION ALL ".join(
                f"SELECT {i}, pk, status FROM {_KINDS[k]} WHERE pk = ANY(%s::bigint[])"
                for i, k in enumerate(kinds)
            ),
            [int_array(sorted({pk for hits in found[k] for pk, _ in hits})) for k in kinds],
        )

        def read() -> dict[str, dict[int, str]]:
            out: dict[str, dict[int, str]] = {k: {} for k in kinds}
            for i, pk, status in cur.fetchall():
                out[kinds[i]][pk] = status
            return out

        return read

    def _kept(
        self,
        c: Any,
        scope_of: tuple[str, str, str],
        scope: VectorScope,
        q: np.ndarray,
        found: list[tuple[int, float]],
        status: dict[int, str],
        statuses: Sequence[str],
        limit: int,
    ) -> list[tuple[int, float]]:
        """Of ``found`` (``limit * 2 + 8`` over-fetched from the cached ``scope`` of
        (project, user, kind) ``scope_of``), the items in ``statuses`` by ``status``; when
        the filter dropped too many, a search among the allowed items only."""
        kept = [(pk, sim) for pk, sim in found if status.get(pk) in statuses]
        if len(kept) >= limit or len(found) < limit * 2 + 8:
            return kept[:limit]
        project_id, user_id, kind = scope_of
        allowed = c.execute(
            f"SELECT pk FROM {_KINDS[kind]} WHERE project_id = %s AND user_id = %s "
            "AND status = ANY(%s::text[])",
            (project_id, user_id, list(statuses)),
        ).fetchall()
        return scope.search(q, limit, np.fromiter((r[0] for r in allowed), dtype=np.int64))

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
        """Top ``limit`` (item pk, similarity) of a user's vectors of ``kind`` that the
        cache does not hold, searched in the server: through the HNSW index once the scope
        is known to be large, else exactly; ``join`` (with ``params``) restricts the items,
        e.g. to wanted statuses. ``narrow``: the join may keep few of the scope's items
        (message filters), so what an exact search counts says nothing about the scope's
        size."""
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
                    # The user's own index (_user_indexes.py): the planner matches its
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
            # Exact, in the server: every vector of the scope (that passes the join), counted
            # on the way so that the next search knows whether the index should answer.
            rows = c.execute(
                f"SELECT v.item_pk, v.vec <#> %b AS d, count(*) OVER () {scope} "
                "ORDER BY d, v.pk LIMIT %s",
                (q, *args, limit),
            ).fetchall()
        if rows and not narrow:
            self._remember_scope(key, int(rows[0][2]))
        return [(int(pk), -float(d)) for pk, d, _ in rows]

    def _vector_messages(
        self, search: LayerSearch, query: np.ndarray, embedder: str, filters: SearchFilters
    ) -> list[tuple[int, float]]:
        project_id, user_id, limit, _ = search
        found = self.vector_layers(
            project_id,
            user_id,
            [query],
            embedder,
            limit,
            messages=filters,
            facts=None,
            summaries=None,
        )
        return found[0]["message"]

    def _vector_layer(
        self, search: LayerSearch, kind: str, query: np.ndarray, embedder: str
    ) -> list[tuple[int, float]]:
        project_id, user_id, limit, statuses = search
        found = self.vector_layers(
            project_id,
            user_id,
            [query],
            embedder,
            limit,
            messages=None,
            facts=statuses if kind == "fact" else None,
            summaries=statuses if kind == "summary" else None,
        )
        return found[0][kind]

    # -- recall --------------------------------------------------------------------------

    def _read_briefs(
        self,
        reads: Sequence[BriefRead],
        project_id: str,
        user_id: str,
        embedder: str | None,
    ) -> Iterable[Iterable[Sequence[Any]]]:
        out: list[list[Sequence[Any]]] = []
        with self._read() as c:
            # The layers' queries go out together (pipeline mode): one round trip, not
            # three; binary, so that pgvector hands the vectors over as arrays. A layer whose
            # scope this process caches takes its vectors from there, as SQLite does (the
            # search that reads briefs has just brought it up to date, or is doing so beside
            # it): reading ~150 vectors a search from the table cost more than the rest of
            # the briefs. Items the cache does not hold yet are read from the table.
            cursors: list[tuple[Any, VectorScope | None]] = []
            with c.pipeline():
                for read in reads:
                    scope = (
                        None
                        if embedder is None
                        else self.vectors.peek((project_id, user_id, read.kind, embedder))
                    )
                    vec = (
                        "NULL::vector"
                        if scope is not None
                        else f"(SELECT v.vec FROM vectors v WHERE v.kind = '{read.kind}' "
                        "AND v.item_pk = m.pk AND v.embedder = ?)"
                    )
                    cur = c.cursor(binary=True)
                    sql = f"SELECT {read.columns}, {vec} {read.source}"
                    args = read.params if scope is not None else [embedder, *read.params]
                    self.dialect.execute(cur, sql, args)
                    cursors.append((cur, scope))
            for read, (cur, scope) in zip(reads, cursors, strict=True):
                rows = cur.fetchall()
                cur.close()
                if scope is None:
                    out.append(
                        [
                            (*row[:-1], None if row[-1] is None else row[-1].to_numpy().tobytes())
                            for row in rows
                        ]
                    )
                    continue
                assert embedder is not None
                vectors = scope.vectors([row[0] for row in rows])
                missing = [row[0] for row in rows if row[0] not in vectors]
                if missing:
                    with c.cursor(binary=True) as more:
                        more.execute(
                            "SELECT item_pk, vec FROM vectors WHERE kind = %s AND embedder = %s "
                            "AND item_pk = ANY(%s::bigint[])",
                            (read.kind, embedder, int_array(missing)),
                        )
                        vectors.update((pk, vec.to_numpy().tobytes()) for pk, vec in more)
                out.append([(*row[:-1], vectors.get(row[0])) for row in rows])
        return out
