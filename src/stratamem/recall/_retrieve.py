"""Stage 2 of a recall: retrieval, the candidates of every layer with their evidence.

For each variant of the plan and each layer it searches, full text (run in a background
thread, with the briefs of what it found and of their neighbouring turns) beside the query
embedding, then the vector search. Every candidate then gets its cosine with every variant
(also those only full text found), its neighbouring turns, its time, and its status weight:
a ``Candidate`` for the scorer. Nothing here weighs one candidate against another.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from .. import _abandon, _tracing
from .._products import similarities
from .._time import parse_iso as parse_ts
from ..embed import Embedder
from ..store import (
    FactBrief,
    FactRow,
    LayerStore,
    MessageBrief,
    MessageRow,
    SearchStore,
    SessionStore,
    SummaryBrief,
    SummaryRow,
)
from ._plan import QueryPlan
from ._scoring import Candidate, Key

if TYPE_CHECKING:
    from ._scoring import Scored

__all__ = ["Brief", "RecallStore", "Retrieved", "StoredRow", "fill_rows", "retrieve"]

Brief = MessageBrief | FactBrief | SummaryBrief
#: A candidate's full row, read for the hits only (``fill_rows``).
StoredRow = MessageRow | FactRow | SummaryRow

# Facts and summaries whose validity ended before the question count this much.
EXPIRED_WEIGHT = 0.5

# A turn that is small talk as a whole ("Take care!", "Cool! What did it look like?")
# counts this much: short, content-free turns sit close to any short question in vector
# space (docs/benchmarks.md, retrieval).
SMALL_TALK_WEIGHT = 0.8

_STATUS_WEIGHT = {"deprioritized": 0.5, "superseded": 0.5}

# In a chat with an assistant (its turns unnamed), the assistant's turns count this much
# unless the question asks what the assistant said: memory is about the user, whose facts,
# plans and choices are in their own turns, while a long answer matches many questions by
# its breadth alone. A named speaker with the assistant role (one side of a two-person
# chat, as LoCoMo is stored) counts in full. BEAM turn R@5 / R@10 47.5 / 62.9 -> 52.7 /
# 64.0; LoCoMo and LongMemEval-S unchanged (docs/benchmarks.md).
ASSISTANT_WEIGHT = 0.8


class RecallStore(SearchStore, SessionStore, LayerStore, Protocol):
    """What recall reads: its candidates (search), a session's history and the messages
    items quote (sessions), and a user's latest facts (layers)."""


@dataclass
class Retrieved:
    """The candidates of one retrieval, each with the brief it was found as."""

    cands: dict[Key, Candidate]
    briefs: dict[Key, Brief]


@dataclass
class _Rows:
    """Briefs of the candidates loaded so far (``Store.recall_briefs``), by layer and pk:
    what ranking needs, without text or metadata."""

    messages: dict[int, MessageBrief] = field(default_factory=dict)
    facts: dict[int, FactBrief] = field(default_factory=dict)
    summaries: dict[int, SummaryBrief] = field(default_factory=dict)
    neighbours: dict[int, tuple[int | None, int | None]] = field(default_factory=dict)
    # Briefs of turns read only as neighbours of the above (no links of their own yet): a
    # turn that turns out to be a candidate too is read again, with its neighbours.
    context: dict[int, MessageBrief] = field(default_factory=dict)

    def __contains__(self, key: Key) -> bool:
        layer, pk = key
        if layer == "message":
            return pk in self.messages
        if layer == "fact":
            return pk in self.facts
        return pk in self.summaries

    def update(self, other: _Rows) -> None:
        self.messages.update(other.messages)
        self.facts.update(other.facts)
        self.summaries.update(other.summaries)
        self.neighbours.update(other.neighbours)
        self.context.update(other.context)


def _similarities(
    tables: Mapping[str, Mapping[int, Brief]],
    keys: Sequence[Key],
    qvecs: Sequence[np.ndarray],
) -> dict[Key, list[float]]:
    """Cosine of each query variant with every key whose brief has a vector: one matrix
    product for all of them."""
    have: list[Key] = []
    blobs: list[bytes] = []
    for key in keys:
        brief = tables[key[0]].get(key[1])
        if brief is not None and brief.vector is not None:
            have.append(key)
            blobs.append(brief.vector)
    if not have or not len(qvecs):
        return {}
    matrix = np.frombuffer(b"".join(blobs), dtype=np.float32).reshape(len(have), -1)
    queries = np.asarray(qvecs, dtype=np.float32)
    sims = similarities(matrix, queries.T).tolist()
    return dict(zip(have, sims, strict=True))


def _fulltext(store: RecallStore, plan: QueryPlan) -> dict[Key, list[float]]:
    """BM25 of every candidate full text finds, per variant."""
    out: dict[Key, list[float]] = {}
    found = store.fulltext_layers(
        plan.project_id,
        plan.user_id,
        [list(terms) for terms in plan.terms],
        plan.per_layer,
        messages=plan.filters if "message" in plan.layers else None,
        facts=plan.fact_statuses if "fact" in plan.layers else None,
        summaries=plan.summary_statuses if "summary" in plan.layers else None,
    )
    for v, by_layer in enumerate(found):
        for layer in ("message", "fact", "summary"):
            for pk, s in by_layer.get(layer, ()):
                out.setdefault((layer, pk), [0.0] * len(plan.terms))[v] = s
    return out


def _vector_keys(
    store: RecallStore, embedder: Embedder, plan: QueryPlan, qvecs: Sequence[np.ndarray]
) -> set[Key]:
    """What the vector search finds, for every variant and layer."""
    found = store.vector_layers(
        plan.project_id,
        plan.user_id,
        qvecs,
        embedder.id,
        plan.per_layer,
        messages=plan.filters if "message" in plan.layers else None,
        facts=plan.fact_statuses if "fact" in plan.layers else None,
        summaries=plan.summary_statuses if "summary" in plan.layers else None,
    )
    return {(layer, pk) for by_layer in found for layer, hits in by_layer.items() for pk, _ in hits}


def _briefs(store: RecallStore, embedder: Embedder, plan: QueryPlan, keys: Sequence[Key]) -> _Rows:
    """Briefs of ``keys`` and, for an unfiltered search, the neighbouring turns of its
    messages (a filter describes which messages count)."""
    unfiltered = plan.filters.empty
    messages, facts, summaries = store.recall_briefs(
        plan.project_id,
        plan.user_id,
        [pk for lay, pk in keys if lay == "message"],
        [pk for lay, pk in keys if lay == "fact"],
        [pk for lay, pk in keys if lay == "summary"],
        neighbours=unfiltered,
        embedder=embedder.id,
    )
    out = _Rows(messages, facts, summaries)
    if unfiltered:
        out.neighbours = {pk: (b.prev_pk, b.next_pk) for pk, b in messages.items()}
    return out


def _turn_briefs(
    store: RecallStore, embedder: Embedder, plan: QueryPlan, pks: Sequence[int]
) -> dict[int, MessageBrief]:
    return store.recall_briefs(plan.project_id, plan.user_id, pks, embedder=embedder.id)[0]


def _with_neighbours(
    store: RecallStore, embedder: Embedder, plan: QueryPlan, rows: _Rows, keys: list[Key]
) -> list[Key]:
    """The candidates' neighbouring turns join them (evidence clusters); returns the keys
    with them."""
    neighbours, messages = rows.neighbours, rows.messages
    more = {p for pair in neighbours.values() for p in pair if p is not None}
    more -= set(messages)
    if not more:
        return keys
    missing = sorted(more - set(rows.context))
    if missing:
        rows.context.update(_turn_briefs(store, embedder, plan, missing))
    messages.update((pk, rows.context[pk]) for pk in more if pk in rows.context)
    # An added turn's link back to the candidate it neighbours is known; its other side is
    # not needed for a turn that only came in as context.
    for pk, (prev, nxt) in list(neighbours.items()):
        if prev in more:
            neighbours[prev] = (neighbours.get(prev, (None, None))[0], pk)
        if nxt in more:
            neighbours[nxt] = (pk, neighbours.get(nxt, (None, None))[1])
    return sorted(set(keys) | {("message", pk) for pk in more})


def _asks_the_next_speaker(brief: MessageBrief, after: MessageBrief | None) -> bool:
    """The turn asks something that another named speaker answers in the next turn. Named
    speakers only: a user's unnamed turns in a chat with an assistant are the user's own
    words, their questions included (LongMemEval's evidence)."""
    return (
        brief.asks
        and after is not None
        and brief.name is not None
        and after.name is not None
        and after.name != brief.name
    )


def _candidate(
    key: Key,
    brief: Brief,
    vector: tuple[float, ...],
    text: Sequence[float],
    rows: _Rows,
    plan: QueryPlan,
) -> Candidate:
    cand = Candidate(key=key, fulltext=text, vector=vector)
    if isinstance(brief, MessageBrief):
        cand.session, cand.name = brief.session_id, brief.name
        cand.ts = parse_ts(brief.ts)
        prev, nxt = rows.neighbours.get(key[1], (None, None))
        cand.prev = ("message", prev) if prev is not None else None
        cand.next = ("message", nxt) if nxt is not None else None
        cand.asked = _asks_the_next_speaker(brief, None if nxt is None else rows.messages.get(nxt))
        # Raw history stays full evidence ("how many times did I move?" needs the old value
        # too): it is marked, ranked below what replaced it when that is found too
        # (``_scoring.current_first``), and get_memory leaves it out unless asked.
        cand.superseded = brief.superseded
        cand.replaced_by = brief.replaced_by
        if brief.small_talk:
            cand.small_talk, cand.weight = True, SMALL_TALK_WEIGHT
        if brief.role == "assistant" and brief.name is None and not plan.about_assistant:
            cand.assistant = True
            cand.weight *= ASSISTANT_WEIGHT
        return cand
    # A fact is placed in time by when it happened ("went hiking last spring"), a summary
    # by when it was observed.
    if isinstance(brief, FactBrief):
        when = brief.occurred_at or brief.observed_at or brief.created_at
    else:
        when = brief.observed_at or brief.created_at
        cand.topics = tuple(brief.topic_ids)
    cand.ts = parse_ts(when)
    cand.superseded = brief.status == "superseded"
    cand.weight = 1.0 if cand.superseded and plan.history else _STATUS_WEIGHT.get(brief.status, 1.0)
    until = parse_ts(brief.valid_to)
    if until is not None and until < plan.as_of:
        cand.expired = True
        if not plan.history:
            cand.weight *= EXPIRED_WEIGHT  # no longer holds: history, not current
    return cand


def _turns_as_their_facts(rows: _Rows, keys: Sequence[Key], sims: dict[Key, list[float]]) -> None:
    """A turn is as similar to the query as the closest fact drawn from it, when that is
    closer than the turn's own vector. The embedder reads the first few hundred words of a
    text only, and one vector averages everything a long turn says; its facts are
    sentence-sized. Only turns and facts that are both candidates take part. BEAM (turns of
    ~2,300 characters) turn R@5/R@10 +0.5/+1.1, LoCoMo +0.1, LongMemEval-S +-0."""
    turn_of = {b.id: ("message", pk) for pk, b in rows.messages.items()}
    for key in keys:
        fact = rows.facts.get(key[1]) if key[0] == "fact" else None
        if fact is None or key not in sims:
            continue
        for mid in fact.message_ids:
            turn = turn_of.get(mid)
            if turn is not None and turn in sims:
                sims[turn] = [max(a, b) for a, b in zip(sims[turn], sims[key], strict=True)]


def retrieve(store: RecallStore, embedder: Embedder, pool: Executor, plan: QueryPlan) -> Retrieved:
    """Every candidate of the plan's layers, with its evidence."""

    def fulltext_and_briefs() -> tuple[dict[Key, list[float]], _Rows]:
        _abandon.check()  # the thread may have been waited for
        with _tracing.span("stratamem.recall.fulltext", child=True) as span:
            found = _fulltext(store, plan)
            span.set_attribute("stratamem.recall.candidates", len(found))
        _abandon.check()
        rows = _briefs(store, embedder, plan, list(found))
        around = {p for pair in rows.neighbours.values() for p in pair if p is not None}
        around -= set(rows.messages)
        if around:
            rows.context = _turn_briefs(store, embedder, plan, sorted(around))
        return found, rows

    pending = pool.submit(_tracing.carry(fulltext_and_briefs))
    qvecs = list(embedder.embed(list(plan.embedded)))
    _abandon.check()
    with _tracing.span("stratamem.recall.vectors", child=True) as span:
        keys = _vector_keys(store, embedder, plan, qvecs)
        span.set_attribute("stratamem.recall.candidates", len(keys))
    fulltext, rows = pending.result()
    _abandon.check()
    keys.update(fulltext)
    ordered = sorted(keys)
    rows.update(_briefs(store, embedder, plan, [k for k in ordered if k not in rows]))
    if rows.neighbours:
        ordered = _with_neighbours(store, embedder, plan, rows, ordered)
    tables: dict[str, Mapping[int, Brief]] = {
        "message": rows.messages,
        "fact": rows.facts,
        "summary": rows.summaries,
    }
    sims = _similarities(tables, ordered, qvecs)
    _turns_as_their_facts(rows, ordered, sims)
    out = Retrieved({}, {})
    no_match = (0.0,) * len(plan.variants)
    for key in ordered:
        brief = tables[key[0]].get(key[1])
        if brief is None:
            continue
        # A non-positive cosine means "unrelated" for every embedder we ship.
        floor = max(plan.options.min_similarity.get(key[0], 0.0), 1e-6)
        # A tuple, not a list: short tuples come from CPython's free list, which the garbage
        # collector does not count, and a search keeps a few hundred of these alive (a list
        # each made the collector run a third more often).
        vector = tuple([v if v >= floor else 0.0 for v in sims.get(key, ())])
        text = fulltext.get(key, no_match)
        if max(vector, default=0.0) <= 0 and max(text) <= 0:
            continue
        out.cands[key] = _candidate(key, brief, vector, text, rows, plan)
        out.briefs[key] = brief
    return out


def fill_rows(store: RecallStore, items: Sequence[tuple[Key, Scored]]) -> None:
    """Read the full rows of ``items`` that have none yet (hits, rerank, chain seeds); an
    item forgotten since it was ranked keeps none."""
    wanted: dict[str, list[int]] = {}
    for (layer, pk), x in items:
        if x.row is None:
            wanted.setdefault(layer, []).append(pk)
    if not wanted:
        return
    layers = ("message", "fact", "summary")
    rows = store.items_by_pk(*(wanted.get(layer, []) for layer in layers))
    found: dict[str, Mapping[int, StoredRow]] = dict(zip(layers, rows, strict=True))
    for (layer, pk), x in items:
        if x.row is None:
            x.row = found[layer].get(pk)
