"""The local scorer: how candidates of one layer are ranked, without a model call.

Every candidate has, per query variant, a full-text score (BM25 from the store) and a
cosine similarity with the query embedding. They are fused either by normalised scores
(default) or by reciprocal rank, then messages get conversational evidence that single
turns lack:

* context: a turn is also scored together with the turn before it (an answer is often only
  meaningful after its question) — the mean of the two similarities, the earlier one at
  half weight;
* neighbours: a share of the best neighbouring turn's score, since evidence clusters;
* speaker: a bonus when the query names exactly one of the speakers among the candidates;
* answered questions: a turn asking what another speaker answers in the next turn gives up
  a share of its score, and its answer gains a share of the question's relevance (a
  question reads like the query, the answer holds the evidence);
* session: a share of the best score in the same session, so the session that talks about
  the subject lifts its other turns;
* time: a bonus inside the period the query names, and a small recency bonus.

Weights were chosen on the first three LoCoMo conversations and checked on the other three
and on LongMemEval-S (docs/benchmarks.md); they are not tuned per question.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from ._temporal import window_boost

if TYPE_CHECKING:
    from ._plan import QueryPlan
    from ._retrieve import Brief, Retrieved, StoredRow

__all__ = ["DEFAULT_WEIGHTS", "Candidate", "Key", "Scored", "ScorerWeights", "rank", "score"]


@dataclass(frozen=True)
class ScorerWeights:
    fulltext: float = 0.5  # share of BM25 in the fused base score; the rest is the vector side
    context: float = 0.5  # share of the vector side given to the turn-with-previous-turn score
    previous_turn: float = 0.5  # weight of the previous turn inside that context score
    neighbour: float = 0.4
    # A question another speaker answers in the next turn keeps this share of its score,
    # and the answer gains ``answer`` x the question's base relevance.
    asked: float = 0.8
    answer: float = 0.1
    speaker: float = 0.2
    session: float = 0.25
    topic: float = 0.25  # the same for summaries: the topic the query is about lifts its others
    time_window: float = 0.5
    recency: float = 0.03
    recency_half_life_days: float = 180.0
    rewrite: float = 0.5  # weight of each offline rewrite's score next to the query's
    # Facts and summaries have no neighbours or session: their relevance is scaled up by
    # this much to stand on the scale of messages, whose bonuses add up to about as much.
    derived: float = 0.5


DEFAULT_WEIGHTS = ScorerWeights()


Key = tuple[str, int]  # (layer, pk)


@dataclass
class Candidate:
    """One item under consideration, with its per-variant raw scores.

    Messages carry their session, speaker and neighbouring turns; facts and summaries do not,
    so they are ranked on relevance and time alone, on the same normalised scale.
    """

    key: Key
    fulltext: Sequence[float] = ()  # BM25 per query variant (0 = no match)
    vector: Sequence[float] = ()  # cosine per query variant
    session: str | None = None
    topics: tuple[str, ...] = ()  # a summary's topics
    superseded: bool = False  # a message whose every fact was corrected since
    replaced_by: tuple[str, ...] = ()  # a superseded message's successors (summary ids)
    small_talk: bool = False  # a message that is small talk as a whole
    assistant: bool = False  # an assistant's turn, counted less (``_retrieve``)
    asked: bool = False  # a question another named speaker answers in the next turn
    expired: bool = False  # a fact or summary whose validity ended before the question
    name: str | None = None
    ts: datetime | None = None
    prev: Key | None = None
    next: Key | None = None
    # Status weight: deprioritized and superseded items count half, small talk 0.8.
    weight: float = 1.0


def _normalise(values: Mapping[Key, float]) -> dict[Key, float]:
    if not values:
        return {}
    lo, hi = min(values.values()), max(values.values())
    span = hi - lo
    if span <= 1e-12:
        return {k: (1.0 if hi > 0 else 0.0) for k in values}
    return {k: (v - lo) / span for k, v in values.items()}


def _ranks(values: Mapping[Key, float]) -> dict[Key, int]:
    order = sorted(values, key=lambda k: (-values[k], k))
    return {k: i for i, k in enumerate(order, start=1)}


def _fuse(
    fulltext: Mapping[Key, float],
    vectors: Sequence[Mapping[Key, float]],
    weights: ScorerWeights,
    fusion: str,
    rrf_k: int,
) -> dict[Key, float]:
    """Base relevance of each item for one query variant.

    ``vectors`` holds one or two similarity maps (the item alone, then in context); they
    share the vector side, ``weights.context`` going to the second.
    """
    keys = set(fulltext) | {k for v in vectors for k in v}
    shares = [1.0] if len(vectors) == 1 else [1.0 - weights.context, weights.context]
    out = dict.fromkeys(keys, 0.0)
    if fusion == "rrf":
        matched = {k: s for k, s in fulltext.items() if s > 0}
        parts: list[tuple[float, Mapping[Key, float]]] = [(weights.fulltext, matched)]
        parts += [((1 - weights.fulltext) * sh, v) for sh, v in zip(shares, vectors, strict=False)]
        for weight, scores in parts:
            for k, r in _ranks(scores).items():
                out[k] += weight * (rrf_k + 1) / (rrf_k + r)
        return out
    best = max(fulltext.values(), default=0.0)
    if best > 0:
        for k, s in fulltext.items():
            out[k] += weights.fulltext * max(s, 0.0) / best
    for share, scores in zip(shares, vectors, strict=False):
        for k, s in _normalise(scores).items():
            out[k] += (1 - weights.fulltext) * share * s
    return out


def _variants(cands: Mapping[Key, Candidate]) -> int:
    return max((len(c.vector) for c in cands.values()), default=0) or max(
        (len(c.fulltext) for c in cands.values()), default=0
    )


def _combine_variants(
    per_variant: list[dict[Key, float]], weights: ScorerWeights
) -> dict[Key, float]:
    """The query's own score plus the rewrites' at ``weights.rewrite`` each, on one scale."""
    if not per_variant:
        return {}
    total = 1.0 + weights.rewrite * (len(per_variant) - 1)
    out = dict.fromkeys(per_variant[0], 0.0)
    for i, scores in enumerate(per_variant):
        w = 1.0 if i == 0 else weights.rewrite
        for k, s in scores.items():
            out[k] = out.get(k, 0.0) + w * s
    return {k: v / total for k, v in out.items()}


def _time_bonus(
    cand: Candidate,
    weights: ScorerWeights,
    window_score: float | None,
    as_of: datetime | None,
) -> float:
    bonus = 0.0
    if window_score is not None:
        bonus += weights.time_window * window_score
    if as_of is not None and cand.ts is not None and weights.recency:
        age_days = max((as_of - cand.ts).total_seconds(), 0.0) / 86400
        bonus += weights.recency * math.exp(
            -age_days * math.log(2) / weights.recency_half_life_days
        )
    return bonus


def _group_prior(
    groups: Mapping[Key, tuple[str, ...]], scores: Mapping[Key, float]
) -> dict[Key, float]:
    """For each member, the best score in any of its groups, normalised over the members."""
    best: dict[str, float] = {}
    for pk, names in groups.items():
        for g in names:
            best[g] = max(best.get(g, 0.0), scores[pk])
    return _normalise({pk: max(best[g] for g in names) for pk, names in groups.items()})


def _answered(
    cands: Mapping[Key, Candidate],
    base: Mapping[Key, float],
    scores: dict[Key, float],
    weights: ScorerWeights,
) -> None:
    """A question answered in the next turn by another speaker ("Where did you go on that
    road trip?") resembles the query more than its answer does ("We explored the coast up
    in the Pacific Northwest"), yet the answer holds the evidence: the question keeps
    ``weights.asked`` of its score and its answer gains ``weights.answer`` x the question's
    base relevance. Before the session prior, so a session is not lifted by its questions
    alone. LoCoMo turn R@5 69.1 -> 70.4 (both halves gain); LongMemEval-S, whose turns are
    one unnamed user's, unchanged."""
    gains: dict[Key, float] = {}
    for pk, c in cands.items():
        if not c.asked or c.next is None or c.next not in scores:
            continue
        scores[pk] *= weights.asked
        gain = weights.answer * base.get(pk, 0.0)
        gains[c.next] = max(gains.get(c.next, 0.0), gain)
    for pk, gain in gains.items():
        scores[pk] += gain


def score(
    cands: Mapping[Key, Candidate],
    *,
    weights: ScorerWeights = DEFAULT_WEIGHTS,
    named: frozenset[str] = frozenset(),
    fusion: str = "score",
    rrf_k: int = 60,
    window: Mapping[Key, float] | None = None,
    as_of: datetime | None = None,
) -> dict[Key, float]:
    """Final scores of candidates of every layer (higher is better), fused jointly so that
    a fact, a summary and a message are compared on one scale."""
    if not cands:
        return {}
    per_variant = []
    for v in range(_variants(cands)):
        fulltext = {pk: (c.fulltext[v] if v < len(c.fulltext) else 0.0) for pk, c in cands.items()}
        alone = {pk: c.vector[v] for pk, c in cands.items() if v < len(c.vector)}
        context: dict[Key, float] = {}
        for pk, s in alone.items():
            prev = cands[pk].prev
            if prev is not None and prev in alone:
                context[pk] = (s + weights.previous_turn * alone[prev]) / (
                    1 + weights.previous_turn
                )
            else:
                context[pk] = s
        vectors = [alone, context] if alone else []
        per_variant.append(_fuse(fulltext, vectors, weights, fusion, rrf_k))
    base = _combine_variants(per_variant, weights)
    scores = {}
    for pk, c in cands.items():
        if c.session is None:
            scores[pk] = base.get(pk, 0.0) * (1 + weights.derived)
            continue
        around = [base.get(n, 0.0) for n in (c.prev, c.next) if n is not None]
        scores[pk] = base.get(pk, 0.0) + weights.neighbour * max(around, default=0.0)
    _answered(cands, base, scores, weights)
    if len(named) == 1:
        (who,) = named
        for pk, c in cands.items():
            if c.name == who:
                scores[pk] += weights.speaker
    sessions = {pk: (c.session,) for pk, c in cands.items() if c.session is not None}
    topics = {pk: c.topics for pk, c in cands.items() if c.topics}
    for groups, weight in ((sessions, weights.session), (topics, weights.topic)):
        for pk, p in _group_prior(groups, scores).items():
            scores[pk] += weight * p
    for pk, c in cands.items():
        w = None if window is None else window.get(pk, 0.0)
        scores[pk] = scores[pk] * c.weight + _time_bonus(c, weights, w, as_of)
    return scores


def _signals(cand: Candidate, window: Mapping[Key, float] | None) -> dict[str, float]:
    """Per-retriever evidence of one hit: only the retrievers that found it."""
    out = {}
    if cand.weight < 1.0:
        out["status_weight"] = cand.weight
    if cand.superseded:  # a message every fact of which was corrected since
        out["superseded"] = 1.0
    if cand.expired:
        out["expired"] = 1.0
    if cand.small_talk:
        out["small_talk"] = 1.0
    if cand.assistant:
        out["assistant"] = 1.0
    if cand.asked:  # a question another speaker answers in the next turn
        out["asked"] = 1.0
    if max(cand.fulltext, default=0.0) > 0:
        out["fulltext"] = round(max(cand.fulltext), 6)
    if max(cand.vector, default=0.0) > 0:
        out["vector"] = round(max(cand.vector), 6)
    if window is not None:
        out["time_window"] = round(window.get(cand.key, 0.0), 6)
    return out


@dataclass
class Scored:
    """A candidate with its final score (and, once read, its full row)."""

    score: float
    brief: Brief  # what the item was ranked on (Store.recall_briefs)
    cand: Candidate
    window: Mapping[Key, float] | None = None
    _signals: dict[str, float] | None = None
    row: StoredRow | None = None

    @property
    def id(self) -> str:
        return self.brief.id

    @property
    def signals(self) -> dict[str, float]:
        """Computed for the hits returned only: a search scores hundreds of candidates."""
        if self._signals is None:
            self._signals = _signals(self.cand, self.window)
        return self._signals


# How far above a superseded message what replaced it is placed (``current_first``).
CURRENT_MARGIN = 1e-3


def current_first(
    cands: Mapping[Key, Candidate], ids: Mapping[Key, str], scores: dict[Key, float]
) -> None:
    """What holds now before what it replaced: a summary that superseded a message's facts
    (the user moved, a value changed, a correction was made) and that is itself a candidate
    is raised just above that message, if it ranked below it. The old message keeps its
    score, so it stays evidence for the question where it was; only the order of the two
    changes. A replacement that is not a candidate (not about the question) changes
    nothing."""
    summaries = {ids[k]: k for k in cands if k[0] == "summary" and k in scores}
    if not summaries:
        return
    raised: dict[Key, float] = {}
    for key, c in cands.items():
        if not c.replaced_by or key not in scores:
            continue
        successors = [summaries[s] for s in c.replaced_by if s in summaries]
        if successors:
            best = max(successors, key=lambda k: scores[k])
            floor = scores[key] + CURRENT_MARGIN
            if scores[best] < floor:
                raised[best] = max(raised.get(best, 0.0), floor)
    scores.update(raised)


# A question about the beginning ("the versions I used to start my project", "when I first
# described my setup") looks in the first this much of the history its candidates span.
BEGINNING_SHARE = 0.1


def _beginning(cands: Mapping[Key, Candidate], plan: QueryPlan) -> tuple[datetime, datetime] | None:
    """The start of the history the candidates span, for a question about the beginning."""
    if not plan.beginning:
        return None
    times = [c.ts for c in cands.values() if c.ts is not None and c.ts <= plan.as_of]
    if not times:
        return None
    start = min(times)
    return start, start + (plan.as_of - start) * BEGINNING_SHARE


def rank(
    retrieved: Retrieved, plan: QueryPlan, weights: ScorerWeights = DEFAULT_WEIGHTS
) -> dict[Key, Scored]:
    """Stage 3 of a recall: every candidate of a retrieval scored by the plan."""
    cands = retrieved.cands
    window = None
    span = plan.window if plan.window is not None else _beginning(cands, plan)
    if span is not None:
        window = {k: window_boost(c.ts, span) for k, c in cands.items()}
    scores = score(
        cands,
        named=plan.named,
        weights=weights,
        fusion=plan.options.fusion,
        rrf_k=plan.options.rrf_k,
        window=window,
        as_of=plan.as_of,
    )
    if not plan.history:
        current_first(cands, {k: b.id for k, b in retrieved.briefs.items()}, scores)
    return {k: Scored(s, retrieved.briefs[k], cands[k], window) for k, s in scores.items()}
