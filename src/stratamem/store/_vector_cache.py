"""Vectors kept in process memory, per (project, user, kind, embedder) scope.

Each scope is loaded once into a contiguous float32 matrix and then kept current
incrementally: new rows are read by primary key > last seen (an item embedded again gets
a new row, which overwrites the item's vector here), and a generation counter, bumped in
the store on deletion, forces a reload. Small scopes are searched exactly (one
matrix-vector product); once a scope holds more than ``index_threshold`` vectors an HNSW
index (usearch, keyed by item id) is built beside the matrix and answers unfiltered and
loosely filtered searches, with the exact matrix as fallback for selective filters. Where
the store can keep files (SQLite: ``sqlite/_index_files.py``), a built index is saved and
the next process restores it instead of building it again, after checking every vector
it holds against the ones it loaded (a file is a cache: stale or foreign ones are repaired
or rebuilt, never trusted).

SQLite searches every scope here (``sqlite/_vectors.py``); PostgreSQL the scopes small
enough to be searched exactly, where one scan of the user's rows in the server cost more
than the rest of a search's statements together (``postgres/_vectors.py``). Reading "rows
past the last pk" is only sound if a scope's rows commit in pk order: SQLite has one
writer; PostgreSQL writes a user's vectors under that user's lock.
"""

from __future__ import annotations

import importlib.util
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from .._products import similarities

__all__ = ["IndexFiles", "ScopeKey", "VectorCache", "VectorScope"]

ScopeKey = tuple[str, str, str, str]  # project_id, user_id, kind, embedder

# usearch's search-time parameters are not saved with an index: set on every one.
_EXPANSION_ADD = 64
_EXPANSION_SEARCH = 200

# A restored index is repaired in place when little of it differs from the loaded vectors;
# past this share removed or rewritten (usearch leaves removed nodes in the graph as
# tombstones that searches still walk) it is built again instead.
_MAX_REPAIRED_SHARE = 0.25


class IndexFiles(Protocol):
    """Where a scope's HNSW index is kept between processes (a store's port for it)."""

    def restore(self, key: ScopeKey) -> Any:
        """The index last saved for ``key`` (a usearch ``Index``), or None."""

    def save(self, key: ScopeKey, index: Any, generation: int) -> bool:
        """Keep ``index`` for ``key``, built from the vectors of ``generation``; whether
        it was kept."""


def _usearch_index() -> Any:
    # usearch loaded before onnxruntime makes onnxruntime's module init crash the process
    # (SIGSEGV in its C++ runtime; reproduced with usearch 2.26 / onnxruntime 1.32), so the
    # model runtime, when installed, is always loaded first.
    if importlib.util.find_spec("onnxruntime") is not None:
        import onnxruntime  # noqa: F401

    from usearch.index import Index

    return Index


@dataclass
class VectorScope:
    dim: int
    index_threshold: int
    ids: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    matrix: np.ndarray = field(init=False)  # (capacity, dim); rows [:n] are live
    n: int = 0
    last_pk: int = 0
    max_id: int = -1
    generation: int = 0
    hnsw: Any = None  # usearch.index.Index, keyed by item id
    hnsw_n: int = 0  # positions [0, hnsw_n) are in it
    key: ScopeKey | None = None
    files: IndexFiles | None = None
    saved: bool = False  # the index is as last saved (or restored)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _builder: threading.Thread | None = None
    _cancel: threading.Event = field(default_factory=threading.Event)
    # Item id -> position, for the first `_sorted_n` positions: ids in ascending order and
    # where each one is (None while the ids themselves are ascending, the usual case).
    _sorted_ids: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    _order: np.ndarray | None = None
    _sorted_n: int = 0
    _dirty: set[int] = field(default_factory=set)  # rewritten while an index was built

    def __post_init__(self) -> None:
        self.matrix = np.empty((0, self.dim), dtype=np.float32)

    def add(self, pks: np.ndarray, item_ids: np.ndarray, vecs: np.ndarray) -> None:
        if len(item_ids) == 0:
            return
        self.last_pk = max(self.last_pk, int(pks.max()))
        if self.n and int(item_ids.min()) <= self.max_id:
            # Items embedded again (a reworded summary): their rows are rewritten in place.
            positions = self._positions(item_ids)
            again = positions >= 0
            if again.any():
                self._rewrite(positions[again], vecs[again])
                item_ids, vecs = item_ids[~again], vecs[~again]
                if len(item_ids) == 0:
                    return
        need = self.n + len(item_ids)
        if need > self.matrix.shape[0]:
            capacity = max(1024, 1 << (need - 1).bit_length())
            grown = np.empty((capacity, self.dim), dtype=np.float32)
            grown[: self.n] = self.matrix[: self.n]
            self.matrix = grown
            ids = np.empty(capacity, dtype=np.int64)
            ids[: self.n] = self.ids[: self.n]
            self.ids = ids
        self.matrix[self.n : need] = vecs
        self.ids[self.n : need] = item_ids
        self.n = need
        self.max_id = max(self.max_id, int(item_ids.max()))
        if self.hnsw is not None:
            self._catch_up()
        elif self.n > self.index_threshold and self._builder is None:
            self._start_build()

    def _positions(self, item_ids: np.ndarray) -> np.ndarray:
        """Where each of ``item_ids`` is in the scope; -1 for the ones it does not hold."""
        n = self.n
        if self._sorted_n != n:
            tail = self.ids[self._sorted_n : n]
            ascending = bool(np.all(tail[1:] > tail[:-1])) and (
                self._sorted_n == 0 or int(tail[0]) > int(self._sorted_ids[-1])
            )
            if ascending and self._order is None:
                self._sorted_ids = self.ids[:n]
            else:
                self._order = np.argsort(self.ids[:n], kind="stable")
                self._sorted_ids = self.ids[:n][self._order]
            self._sorted_n = n
        wanted = np.asarray(item_ids, dtype=np.int64)
        if n == 0:
            return np.full(len(wanted), -1, dtype=np.int64)
        at = np.minimum(np.searchsorted(self._sorted_ids, wanted), n - 1)
        found = self._sorted_ids[at] == wanted
        positions = at if self._order is None else self._order[at]
        return np.where(found, positions, -1)

    def _rewrite(self, positions: np.ndarray, vecs: np.ndarray) -> None:
        self.matrix[positions] = vecs
        if self.hnsw is not None:
            for pos in positions.tolist():
                if pos < self.hnsw_n:
                    key = int(self.ids[pos])
                    self.hnsw.remove(key)
                    self.hnsw.add(key, self.matrix[pos])
                    self.saved = False
        elif self._builder is not None:  # a build is copying the old rows: redo these after
            self._dirty.update(positions.tolist())

    def vectors(self, item_ids: Iterable[int]) -> dict[int, bytes]:
        """The float32 vector (as bytes) of each of ``item_ids`` that the scope holds."""
        with self.lock:
            wanted = np.fromiter(item_ids, dtype=np.int64)
            if self.n == 0 or len(wanted) == 0:
                return {}
            positions = self._positions(wanted)
            matrix = self.matrix
            return {
                i: matrix[p].tobytes()
                for i, p in zip(wanted.tolist(), positions.tolist(), strict=True)
                if p >= 0
            }

    def _start_build(self) -> None:
        # Building HNSW over 100k vectors takes tens of seconds on 2 cores: do it off the
        # query path. Searches stay exact (correct, a little slower) until it is ready.
        # Growth copies into new arrays: these stay valid for the build.
        args = (self.matrix, self.ids, self.n)
        self._builder = threading.Thread(
            target=self._build, args=args, name="stratamem-hnsw-build", daemon=True
        )
        self._builder.start()

    def _build(self, matrix: np.ndarray, ids: np.ndarray, n: int) -> None:
        restored = self._restore(matrix, ids, n)
        if restored is not None:
            index, changed = restored
        else:
            index, changed = self._new_index(), True
            if not self._add(index, ids, matrix, np.arange(n)):
                return
        if self._cancel.is_set():
            return
        # Saved before it is published: from then on searches (and their catch-up) use it.
        saved = not changed
        if changed and self.files is not None and self.key is not None:
            saved = self.files.save(self.key, index, self.generation)
        with self.lock:
            dirty = sorted(p for p in self._dirty if p < n)
            for pos in dirty:
                index.remove(int(self.ids[pos]))
                index.add(int(self.ids[pos]), self.matrix[pos])
            self._dirty.clear()
            self.hnsw, self.hnsw_n, self.saved = index, n, saved and not dirty
            self._catch_up()

    def _new_index(self) -> Any:
        # From the sweep in docs/benchmarks.md (100k MiniLM vectors): expansion_add=64 builds
        # twice as fast as 128, and expansion_search=200 lifts recall@10 from 0.93 to ~0.95
        # for +0.2 ms per query.
        return _usearch_index()(
            ndim=self.dim,
            metric="ip",
            dtype="f32",
            connectivity=16,
            expansion_add=_EXPANSION_ADD,
            expansion_search=_EXPANSION_SEARCH,
        )

    def _add(self, index: Any, ids: np.ndarray, matrix: np.ndarray, positions: np.ndarray) -> bool:
        """Add the rows at ``positions`` (ascending) to ``index``, keyed by item id; False
        if the scope was cancelled meanwhile."""
        # In slices, so that closing the store does not wait for a whole build. One thread:
        # a graph built by several depends on how they interleave, so two processes (or two
        # starts of one) answered the same question differently (29 of 34 searches alike
        # for a 100,000-message user); one thread builds the same graph from the same
        # vectors, in twice the time (100,000 vectors: 8 -> 16 s), leaving the other core to
        # the searches meanwhile (exact until the graph is ready).
        for start in range(0, len(positions), 4096):
            if self._cancel.is_set():
                return False
            part = positions[start : start + 4096]
            index.add(ids[part].astype(np.uint64), matrix[part], threads=1)
        return True

    def _restore(self, matrix: np.ndarray, ids: np.ndarray, n: int) -> tuple[Any, bool] | None:
        """The saved index, checked against the ``n`` rows loaded and repaired where they
        differ (with whether it was), or None: no file, or one too far from the rows."""
        if self.files is None or self.key is None:
            return None
        index = self.files.restore(self.key)
        if index is None:
            return None
        made = self._new_index()  # a file of other parameters (an older release) is rebuilt
        if (index.ndim, index.metric, index.dtype, index.connectivity) != (
            made.ndim,
            made.metric,
            made.dtype,
            made.connectivity,
        ):
            return None
        index.expansion_add, index.expansion_search = _EXPANSION_ADD, _EXPANSION_SEARCH
        held = np.asarray(index.keys, dtype=np.uint64).astype(np.int64)
        # Where each held item is among the loaded rows (-1: no longer there).
        order = np.argsort(ids[:n], kind="stable")
        at = np.minimum(np.searchsorted(ids[:n][order], held), n - 1)
        positions = np.where(ids[:n][order[at]] == held, order[at], -1)
        kept = positions >= 0
        # Every vector the file holds is compared with the loaded one: only a file whose
        # vectors are the loaded ones may answer for them (exactly: both are the same f32).
        differs = np.zeros(len(held), dtype=bool)
        for start in range(0, len(held), 65_536):
            if self._cancel.is_set():
                return None
            part = slice(start, start + 65_536)
            mine = kept[part]
            if mine.any():
                got = np.vstack(index.get(held[part][mine].astype(np.uint64)))
                differs[np.flatnonzero(mine) + start] = np.any(
                    got != matrix[positions[part][mine]], axis=1
                )
        stale = ~kept | differs
        covered = np.zeros(n, dtype=bool)
        covered[positions[kept & ~differs]] = True
        missing = np.flatnonzero(~covered)
        if stale.sum() > _MAX_REPAIRED_SHARE * max(len(held), 1) or len(missing) > n // 2:
            return None
        if stale.any():
            index.remove(held[stale].astype(np.uint64))
        if not self._add(index, ids, matrix, missing):
            return None
        return index, bool(stale.any() or len(missing))

    def _catch_up(self) -> None:
        if self.hnsw is not None and self.hnsw_n < self.n:
            keys = self.ids[self.hnsw_n : self.n].astype(np.uint64)
            self.hnsw.add(keys, self.matrix[self.hnsw_n : self.n], threads=1)  # see _add
            self.hnsw_n = self.n
            self.saved = False

    def save(self) -> None:
        """Keep the index (if any, and changed since it was last kept) for the next process."""
        with self.lock:
            if self.hnsw is not None and not self.saved and self.files and self.key:
                self.saved = self.files.save(self.key, self.hnsw, self.generation)

    def wait_index(self, timeout: float | None = None) -> bool:
        """Block until a background HNSW build (if any) is done; True if an index exists."""
        builder = self._builder
        if builder is not None:
            builder.join(timeout)
        return self.hnsw is not None

    def cancel(self) -> None:
        self._cancel.set()
        builder = self._builder
        if builder is not None:
            builder.join()

    def search(
        self, query: np.ndarray, k: int, allowed: np.ndarray | None = None
    ) -> list[tuple[int, float]]:
        """Top ``k`` (item id, cosine similarity), optionally only among ``allowed`` ids."""
        with self.lock:
            return self._search(query, k, allowed)

    def searched(
        self, queries: Sequence[np.ndarray], k: int
    ) -> tuple[int, list[list[tuple[int, float]]]]:
        """Each query's ``search`` for ``k``, with the last pk the scope held then: while
        it holds no later one, the same searches find the same."""
        with self.lock:
            return self.last_pk, [self._search(q, k, None) for q in queries]

    def _search(
        self, query: np.ndarray, k: int, allowed: np.ndarray | None
    ) -> list[tuple[int, float]]:
        if self.n == 0 or k <= 0:
            return []
        ids = self.ids[: self.n]
        matrix = self.matrix[: self.n]
        if allowed is not None:
            mask = np.isin(ids, allowed, assume_unique=False)
            selected = int(mask.sum())
            if selected == 0:
                return []
            # An HNSW walk visits ~k*ef nodes; if the filter keeps only a small share of the
            # scope, post-filtering it would find too few, and exact search is cheap anyway.
            if self.hnsw is not None and selected > 0.2 * self.n:
                found = self._hnsw_search(query, min(self.n, k * 8), allowed)
                if len(found) >= min(k, selected):
                    return found[:k]
            positions = np.flatnonzero(mask)
            sims = similarities(matrix[positions], query)
            return self._top(ids[positions], sims, k)
        if self.hnsw is not None:
            return self._hnsw_search(query, k, None)
        return self._top(ids, similarities(matrix, query), k)

    def _hnsw_search(
        self, query: np.ndarray, k: int, allowed: np.ndarray | None
    ) -> list[tuple[int, float]]:
        matches = self.hnsw.search(query, min(k, self.hnsw_n))
        keys = np.asarray(matches.keys, dtype=np.uint64).astype(np.int64)
        sims = 1.0 - np.asarray(matches.distances)
        if allowed is not None:
            passing = np.isin(keys, allowed)
            keys, sims = keys[passing], sims[passing]
        return list(zip(keys.tolist(), sims.tolist(), strict=True))

    @staticmethod
    def _top(ids: np.ndarray, sims: np.ndarray, k: int) -> list[tuple[int, float]]:
        if len(sims) > k:
            part = np.argpartition(-sims, k - 1)[:k]
            order = part[np.argsort(-sims[part], kind="stable")]
        else:
            order = np.argsort(-sims, kind="stable")
        return [(int(ids[i]), float(sims[i])) for i in order]


class VectorCache:
    """LRU of loaded scopes, bounded by the number of vectors held in memory."""

    def __init__(
        self,
        *,
        index_threshold: int,
        max_vectors: int = 5_000_000,
        files: IndexFiles | None = None,
    ) -> None:
        self.index_threshold = index_threshold
        self.max_vectors = max_vectors
        self.files = files
        self._scopes: OrderedDict[ScopeKey, VectorScope] = OrderedDict()
        self._lock = threading.Lock()

    def scope(
        self,
        key: ScopeKey,
        *,
        dim: int,
        generation: int,
        load: Callable[[int], Iterable[tuple[int, int, bytes]]],
    ) -> VectorScope:
        """The current scope for ``key``; ``load(after_pk)`` yields (pk, item_id, blob) rows."""
        with self._lock:
            scope = self._scopes.get(key)
            if scope is None or scope.generation != generation or scope.dim != dim:
                if scope is not None:
                    scope._cancel.set()  # its vectors are stale: stop building their index
                scope = VectorScope(
                    dim=dim, index_threshold=self.index_threshold, key=key, files=self.files
                )
                scope.generation = generation
                self._scopes[key] = scope
            self._scopes.move_to_end(key)
        with scope.lock:
            rows = list(load(scope.last_pk))
            if rows:
                pks = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
                item_ids = np.fromiter((r[1] for r in rows), dtype=np.int64, count=len(rows))
                vecs = np.frombuffer(b"".join(r[2] for r in rows), dtype=np.float32)
                scope.add(pks, item_ids, vecs.reshape(len(rows), dim))
        self._evict()
        return scope

    def peek(self, key: ScopeKey) -> VectorScope | None:
        """The scope loaded for ``key``, if any, as it is (not refreshed)."""
        with self._lock:
            return self._scopes.get(key)

    def drop(self, key: ScopeKey) -> None:
        """Forget the scope loaded for ``key``, if any."""
        with self._lock:
            scope = self._scopes.pop(key, None)
        if scope is not None:
            scope._cancel.set()

    def _evict(self) -> None:
        with self._lock:
            total = sum(s.n for s in self._scopes.values())
            while total > self.max_vectors and len(self._scopes) > 1:
                _, old = self._scopes.popitem(last=False)
                old._cancel.set()
                total -= old.n

    def wait_indexes(self, timeout: float | None = None) -> None:
        """Block until every background HNSW build of the loaded scopes has finished."""
        with self._lock:
            scopes = list(self._scopes.values())
        for scope in scopes:
            scope.wait_index(timeout)

    def save(self) -> None:
        """Keep every loaded index that changed since it was last kept (see ``IndexFiles``)."""
        with self._lock:
            scopes = list(self._scopes.values())
        for scope in scopes:
            scope.save()

    def clear(self) -> None:
        with self._lock:
            scopes = list(self._scopes.values())
            self._scopes.clear()
        for scope in scopes:  # no native build may outlive the store (or the interpreter)
            scope.cancel()
