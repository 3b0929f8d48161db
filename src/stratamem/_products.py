"""Matrix products that stay on the calling thread.

numpy's OpenBLAS runs a product past a size threshold on every core (a matrix-vector
product of more than ~400,000 elements: a vector scope of ~1,100 MiniLM vectors; a
matrix-matrix one of ~900,000 multiply-adds: 600 recall candidates against 4 query
variants), and its worker threads then spin, waiting for more work. With products 5 ms
apart they used 0.99 of a core (tests/test_store_sqlite.py measures it): on 2 cores a
capture recall took ~20% longer beside it, and the pipeline and the application lost that
core (docs/benchmarks.md). Products of at most ``_PRODUCT_ELEMENTS`` multiply-adds per block
run on the calling thread alone (measured with numpy's OpenBLAS).
"""

from __future__ import annotations

import numpy as np

__all__ = ["similarities"]

_PRODUCT_ELEMENTS = 1 << 18


def similarities(matrix: np.ndarray, query: np.ndarray) -> np.ndarray:
    """``matrix @ query`` (``query``: one vector, or one column per query), in row blocks
    small enough to stay single-threaded; equal within float32 rounding (BLAS orders its
    sums by the operands' sizes anyway)."""
    per_row = matrix.shape[1] * (query.shape[1] if query.ndim == 2 else 1)
    rows = max(1, _PRODUCT_ELEMENTS // max(1, per_row))
    if len(matrix) <= rows:
        product: np.ndarray = matrix @ query  # numpy types @ of arrays of any dtype as Any
        return product
    out = np.empty((len(matrix), *query.shape[1:]), dtype=np.result_type(matrix, query))
    for start in range(0, len(matrix), rows):
        np.matmul(matrix[start : start + rows], query, out=out[start : start + rows])
    return out
