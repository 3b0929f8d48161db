"""Stage 4 of a recall (``multi_hop_chain`` only): chaining.

A question whose answer the question does not name ("What did Caroline's friend give her for
her birthday?") is searched twice: the second retrieval searches the query with the best
first hits' text, so what those hits mention (the friend's name) finds its own evidence.
The second ranking counts at ``CHAIN_WEIGHT`` of the first's.
"""

from __future__ import annotations

from collections.abc import Callable

from ._plan import QueryPlan
from ._retrieve import RecallStore, fill_rows
from ._scoring import Key, Scored

__all__ = ["CHAIN_WEIGHT", "chain"]

# A second (multi-hop) retrieval's scores count at this share of the first's.
CHAIN_WEIGHT = 0.7

# How many of the first hits seed the second retrieval.
SEEDS = 3


def _text(x: Scored) -> str:
    return str(getattr(x.row, "content", None) or getattr(x.row, "text", ""))


def chain(
    store: RecallStore,
    plan: QueryPlan,
    first: dict[Key, Scored],
    rank: Callable[[QueryPlan], dict[Key, Scored]],
) -> dict[Key, Scored]:
    """``first`` merged with a second retrieval (``rank`` of the chained plan) seeded by
    its best hits."""
    if not first:
        return first
    top = sorted(first.items(), key=lambda kv: -kv[1].score)[:SEEDS]
    fill_rows(store, top)
    seed = " ".join(_text(x) for _, x in top if x.row is not None)
    second = rank(plan.chained(f"{plan.query} {seed}"))
    merged = dict(first)
    for key, found in second.items():
        s2 = CHAIN_WEIGHT * found.score
        if key not in merged or merged[key].score < s2:
            merged[key] = Scored(s2, found.brief, found.cand, found.window, row=found.row)
            merged[key].signals["chain"] = 1.0
    return merged
