"""The SQLite store's vectors: rows of the ``vectors`` table, searched in-process.

SQLite has no vector index, so ``SQLiteVectors`` (the store's part) searches through
``VectorCache`` (``store/_vector_cache.py``: a matrix per user and kind, kept current
incrementally, with an HNSW index beside a large one, kept in files beside the database
between processes: ``_index_files.py``). Recall's briefs read their vectors
from the cache too (``_read_briefs``). PostgreSQL searches small scopes through the same
cache and large ones with pgvector (``postgres/_vectors.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from .. import SearchFilters
from .._core.dialect import Tx
from .._core.filters import search_filter_sql
from .._core.layers import LayerSearch, VectorRow
from .._core.recall import BriefRead
from .._vector_cache import VectorCache, VectorScope
from ._connection import SQLiteBase
from ._index_files import SQLiteIndexFiles, vector_generation

__all__ = ["SQLiteVectors"]

_TABLES = {"fact": "facts", "summary": "summaries"}


def _nearest_passing(
    scope: VectorScope,
    query: np.ndarray,
    limit: int,
    passing: Callable[[list[int]], set[int]],
    allowed: Callable[[], np.ndarray],
) -> list[tuple[int, float]]:
    """The ``limit`` items nearest to ``query`` that pass a condition most items usually
    pass: the nearest, over-fetched, are checked first (``passing``: those of the given
    ids that pass), and only when too few of them pass is the search made among every item
    that passes (``allowed``). The passing ones among the nearest are the nearest passing
    ones (exactly so below the HNSW threshold, where the search is exact)."""
    fetched = limit * 2 + 8
    found = scope.search(query, fetched)
    if not found:
        return []
    ok = passing([pk for pk, _ in found])
    kept = [(pk, sim) for pk, sim in found if pk in ok]
    if len(kept) >= limit or len(found) < fetched:
        return kept[:limit]
    return scope.search(query, limit, allowed())


class SQLiteVectors(SQLiteBase):
    """Part of SQLiteStore: the vectors table's upkeep and vector search, through the
    in-process ``VectorCache`` (``vectors``)."""

    def _init_vectors(self, index_threshold: int) -> None:
        self._index_files = SQLiteIndexFiles(self.path)
        self.vectors = VectorCache(index_threshold=index_threshold, files=self._index_files)

    # -- writes and bookkeeping (the core's hooks, see _core/layers.py) ------------------

    def _insert_vector_rows(self, tx: Tx, rows: Sequence[VectorRow]) -> None:
        tx.many(
            # An item embedded again gets a new row (a new pk) rather than an update in
            # place: in-process vector caches read the rows past the last pk they saw.
            "INSERT OR REPLACE INTO vectors "
            "(project_id, user_id, kind, item_pk, embedder, dim, vec) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            ((*row[:6], row[6].tobytes()) for row in rows),
        )

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

    def drop_vectors_except(self, embedder: str) -> int:
        dropped = super().drop_vectors_except(embedder)
        self._index_files.remove_other_embedders(embedder)
        return dropped

    def _vectors_removed(self, tx: Tx, project_id: str, user_id: str) -> None:
        # Loaded vector scopes (in this process and any other) reload from the table.
        tx.execute(
            "INSERT INTO vector_generations (project_id, user_id, kind, generation) "
            "SELECT ?, ?, k.kind, 1 FROM (SELECT 'message' AS kind UNION ALL SELECT 'fact' "
            "UNION ALL SELECT 'summary') k WHERE 1 ON CONFLICT (project_id, user_id, kind) "
            "DO UPDATE SET generation = generation + 1",
            (project_id, user_id),
        )

    # -- search --------------------------------------------------------------------------

    def _vector_messages(
        self, search: LayerSearch, query: np.ndarray, embedder: str, filters: SearchFilters
    ) -> list[tuple[int, float]]:
        project_id, user_id, limit, _ = search
        conn = self._conn()
        scope = self._vector_scope(project_id, user_id, "message", embedder, int(query.shape[0]))
        q = np.asarray(query, dtype=np.float32)
        if filters.empty:
            return scope.search(q, limit)
        where, params = search_filter_sql(self.dialect, filters)
        owned = "m.project_id = ? AND m.user_id = ?"

        def passing(pks: list[int]) -> set[int]:
            # Found by pk (NOT INDEXED): with the user named, the planner walked their index.
            among, args = self.dialect.in_("m.pk", pks)
            sql = f"SELECT m.pk FROM messages m NOT INDEXED WHERE {owned} AND {among}"
            rows = conn.execute(f"{sql}{where}", (project_id, user_id, *args, *params))
            return {r[0] for r in rows}

        def allowed() -> np.ndarray:
            sql = f"SELECT m.pk FROM messages m WHERE {owned}{where}"
            rows = conn.execute(sql, (project_id, user_id, *params))
            return np.fromiter((r[0] for r in rows), dtype=np.int64)

        # Most messages usually pass a filter (a time bound: everything said before the
        # question); reading every passing one of a 10,000-message user and testing
        # membership took 18.7 ms a search with `until`, checking the nearest 1.8 ms.
        return _nearest_passing(scope, q, limit, passing, allowed)

    def _vector_scope(
        self, project_id: str, user_id: str, kind: str, embedder: str, dim: int
    ) -> VectorScope:
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
            generation=vector_generation(conn, project_id, user_id, kind),
            load=load,
        )

    def _vector_layer(
        self, search: LayerSearch, kind: str, query: np.ndarray, embedder: str
    ) -> list[tuple[int, float]]:
        project_id, user_id, limit, statuses = search
        table = _TABLES[kind]
        scope = self._vector_scope(project_id, user_id, kind, embedder, int(query.shape[0]))
        q = np.asarray(query, dtype=np.float32)

        def passing(pks: list[int]) -> set[int]:
            return {pk for pk, st in self._statuses(table, pks).items() if st in statuses}

        def allowed() -> np.ndarray:
            marks = ",".join("?" * len(statuses))
            rows = self._conn().execute(
                f"SELECT pk FROM {table} WHERE project_id = ? AND user_id = ? "
                f"AND status IN ({marks})",
                (project_id, user_id, *statuses),
            )
            return np.fromiter((r[0] for r in rows), dtype=np.int64)

        return _nearest_passing(scope, q, limit, passing, allowed)

    def _statuses(self, table: str, pks: Sequence[int]) -> dict[int, str]:
        if not pks:
            return {}
        among, args = self.dialect.in_("pk", pks)
        return dict(self._conn().execute(f"SELECT pk, status FROM {table} WHERE {among}", args))

    # -- recall --------------------------------------------------------------------------

    def _read_briefs(
        self,
        reads: Sequence[BriefRead],
        project_id: str,
        user_id: str,
        embedder: str | None,
    ) -> Iterator[Iterable[Sequence[Any]]]:
        # Lazily, read by read and row by row: each row with its vector lives only while
        # its brief is built. A search builds a few hundred briefs; holding every layer's
        # rows at once kept enough objects alive to make the garbage collector run (and
        # promote them) about a third more often.
        tx = self._tx()
        for read in reads:
            rows = tx.all(f"SELECT {read.columns} {read.source}", read.params)
            # The vectors come from the in-process cache that vector search keeps anyway:
            # reading ~150 of them from the table cost more than the rest of the briefs.
            vecs: dict[int, bytes] = {}
            if embedder and rows:
                pks = [r[0] for r in rows]
                vecs = self._item_vectors(project_id, user_id, read.kind, embedder, pks)
            vector = vecs.get
            yield ((*r, vector(r[0])) for r in rows)

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
