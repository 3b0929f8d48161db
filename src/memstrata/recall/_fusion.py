"""Fusing ranked lists from several retrievers (vector, full text) into one ranking."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["rrf", "score_fusion"]

Ranked = Sequence[tuple[int, float]]


def rrf(lists: Mapping[str, Ranked], k: int = 60) -> list[tuple[int, float]]:
    """Reciprocal rank fusion: sum of 1/(k + rank) over the lists an item appears in.

    Rank-based, so it needs no calibration between cosine similarities and BM25 scores.
    """
    scores: dict[int, float] = {}
    for ranked in lists.values():
        for rank, (item, _) in enumerate(ranked, start=1):
            scores[item] = scores.get(item, 0.0) + 1.0 / (k + rank)
    return sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))


def score_fusion(
    lists: Mapping[str, Ranked], weights: Mapping[str, float] | None = None
) -> list[tuple[int, float]]:
    """Weighted sum of min-max normalised scores (an item missing from a list scores 0)."""
    scores: dict[int, float] = {}
    for name, ranked in lists.items():
        if not ranked:
            continue
        weight = 1.0 if weights is None else weights.get(name, 1.0)
        values = [s for _, s in ranked]
        lo, hi = min(values), max(values)
        span = hi - lo
        for item, s in ranked:
            norm = 1.0 if span <= 1e-12 else (s - lo) / span
            scores[item] = scores.get(item, 0.0) + weight * norm
    return sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))
