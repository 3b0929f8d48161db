"""The PostgreSQL store's vectors: pgvector, searched exactly or through HNSW indexes.

Vectors live in one ``vectors`` table with a ``vector`` column of no fixed dimension (the
embedder decides it, and a reindex may change it). When vectors of a dimension are first
written, an HNSW index per (kind, dimension) is created on the expression
``vec::vector(dim)`` (``halfvec`` above 2,000 dimensions), partial on ``kind`` and
``dim``. Similarity is the inner product, which is the cosine for the unit vectors every
embedder returns, as in SQLite. A user's scope up to ``vector_index_threshold`` vectors is
searched exactly (a scan of that user's rows); a larger one through the HNSW index with
``hnsw.ef_search`` raised to the number of results wanted and, on pgvector 0.8+,
iterative scans so that status filters cannot starve the result; if the index still
returns too few rows the search falls back to the exact one. A user lost in a large shared
index gets one of their own (``_user_indexes.py``). SQLite has no vector index and
searches in-process instead (``sqlite/_vectors.py``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from .. import SearchFilters
from .._core.dialect import Tx
from .._core.filters import search_filter_sql
from .._core.layers import LayerSearch, VectorRow
from .._core.recall import BriefRead
from ._connection import checked
from ._user_indexes import PostgresUserIndexes, vector_target

__all__ = ["PostgresVectors"]

_KINDS = {"message": "messages", "fact": "facts", "summary": "summaries"}

# pgvector's HNSW indexes `vector` up to 2,000 dimensions and `halfvec` up to 4,000.
_MAX_VECTOR_DIM = 2000
_MAX_HALFVEC_DIM = 4000


def _index_type(dim: int) -> str | None:
    """The pgvector type an HNSW index of ``dim`` dimensions is built on (None: none fits)."""
    if dim <= _MAX_VECTOR_DIM:
        return f"vector({dim})"
    if dim <= _MAX_HALFVEC_DIM:
        return f"halfvec({dim})"
    return None


class PostgresVectors(PostgresUserIndexes):
    """Part of PostgresStore: the vectors table's upkeep and vector search."""

    def _init_vectors(self, conn: Any, index_threshold: int, ef_search: int) -> None:
        """Settings and caches of vector search; ``conn``: a connection to learn pgvector's
        version on."""
        self._vector_index_threshold = index_threshold
        self._ef_search = max(10, min(1000, ef_search))
        self._indexed: set[tuple[str, int]] = set()
        self._scope_sizes: dict[tuple[Any, ...], tuple[bool, float]] = {}
        row = conn.execute(
            "SELECT extversion FROM pg_extension WHERE extname = 'vector'"
        ).fetchone()
        version = tuple(int(p) for p in str(row[0] if row else "0").split(".")[:2] if p.isdigit())
        # Iterative index scans (pgvector 0.8) keep filtered HNSW searches from coming back
        # short; older versions fall back to the exact search when they do.
        self._iterative = version >= (0, 8)

    # -- writes and bookkeeping (the core's hooks, see _core/layers.py) ------------------

    def _insert_vector_rows(self, tx: Tx, rows: Sequence[VectorRow]) -> None:
        with tx.raw.cursor() as cur:
            cur.executemany(
                "INSERT INTO vectors (project_id, user_id, kind, item_pk, embedder, dim, vec) "
                "VALUES (%s, %s, %s, %s, %s, %s, %b) ON CONFLICT (kind, item_pk, embedder) "
                "DO UPDATE SET vec = excluded.vec, dim = excluded.dim",
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
        pass  # nothing of them is cached outside this process

    def _clear_vector_caches(self) -> None:
        self._scope_sizes.clear()
        # The new embedder's dimension may differ: users' indexes are made again as
        # searches find large scopes.
        self._drop_user_indexes(vectors_only=True)

    def _vectors_removed(self, tx: Tx, project_id: str, user_id: str) -> None:
        pass  # searches read the vectors table itself; nothing caches its rows

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

    def _vector_messages(
        self, search: LayerSearch, query: np.ndarray, embedder: str, filters: SearchFilters
    ) -> list[tuple[int, float]]:
        project_id, user_id, limit, _ = search
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
        self, search: LayerSearch, kind: str, query: np.ndarray, embedder: str
    ) -> list[tuple[int, float]]:
        project_id, user_id, limit, statuses = search
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
