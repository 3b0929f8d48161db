"""Stage 5 of a search: selection, the ranked candidates turned into the hits returned.

Highest score first (ties by layer and key); the head reranked when asked, and spread over
sessions for a question that asks for several things; messages the caller excluded, or
whose text the prompt carries, and facts their single-fact summary restates are passed
over, the next-ranked taking their places. Each hit lists its source
messages best-matching first.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence
from datetime import datetime, timezone

from .._time import parse_iso as parse_ts
from ..llm import ChatModel
from ..store import FactRow, MessageRow, SummaryBrief, SummaryRow
from ..types import Hit
from ._plan import QueryPlan
from ._rerank import rerank
from ._retrieve import RecallStore, StoredRow, fill_rows
from ._scoring import Key, Scored

__all__ = ["SESSION_SPREAD", "THREAD_DEPTH", "THREAD_FLOOR", "carried", "ordered", "select"]

# For a question that asks for several things (``QueryPlan.asks_for_many``), each earlier
# hit from the same session lowers a message's score by this much while the head of the
# ranking is chosen: the things asked for were said in different conversations.
SESSION_SPREAD = 0.15
# A thread question's head is drawn from this many of the best items (or the limit, if
# more), those scoring at least THREAD_FLOOR x the best: an item far below is not about the
# subject, and would take a place in the first round only for being early.
THREAD_DEPTH = 40
THREAD_FLOOR = 0.7


def carried(row: MessageRow, texts: frozenset[str]) -> bool:
    """The prompt holds this message already (its content is one of the texts it carries)."""
    return bool(texts) and row.content.strip() in texts


def _message_hit(row: MessageRow, score: float) -> Hit:
    return Hit(
        layer="message",
        id=row.id,
        text=row.content,
        score=score,
        message_ids=[row.id],
        user_id=row.user_id,
        session_id=row.session_id,
        timestamp=parse_ts(row.ts),
        role=row.role,
        name=row.name,
        event_type=row.event_type,
        metadata=row.metadata,
    )


def _by_relevance(ids: Sequence[str], message_score: dict[str, float]) -> list[str]:
    """Provenance ordered by how well each source message matched this query (stable)."""
    return sorted(ids, key=lambda i: -message_score.get(i, 0.0))


def _fact_hit(row: FactRow, score: float, message_score: dict[str, float]) -> Hit:
    return Hit(
        layer="fact",
        id=row.id,
        text=row.text,
        score=score,
        message_ids=_by_relevance(row.message_ids, message_score),
        user_id=row.user_id,
        timestamp=parse_ts(row.occurred_at or row.observed_at or row.created_at),
        metadata={"status": row.status, "kind": row.kind, "confidence": row.confidence},
    )


def _summary_hit(row: SummaryRow, score: float, message_score: dict[str, float]) -> Hit:
    return Hit(
        layer="summary",
        id=row.id,
        text=row.text,
        score=score,
        message_ids=_by_relevance(row.message_ids, message_score),
        user_id=row.user_id,
        timestamp=parse_ts(row.observed_at or row.updated_at),
        metadata={"status": row.status, "confidence": row.confidence, "version": row.version},
    )


def _hit(row: StoredRow, score: float, message_score: dict[str, float]) -> Hit:
    # The row's type is its layer's.
    if isinstance(row, MessageRow):
        return _message_hit(row, score)
    if isinstance(row, FactRow):
        return _fact_hit(row, score, message_score)
    return _summary_hit(row, score, message_score)


def _spread(ranked: list[tuple[Key, Scored]], depth: int) -> list[tuple[Key, Scored]]:
    """The first ``depth`` items chosen greedily, each message's score lowered by
    ``SESSION_SPREAD`` for every one already chosen from its session.

    A session's items all carry the same penalty, so the best of them is its first in
    ranked order: only each session's first item left competes (a heap), and picking it
    lowers the next one of its session. Items without a session compete alone."""
    head, rest = ranked[:depth], ranked[depth:]
    queues: dict[str | int, deque[int]] = {}
    for i, (_, x) in enumerate(head):
        queues.setdefault(x.cand.session or i, deque()).append(i)
    sizes = {group: len(q) for group, q in queues.items()}
    # (-lowered score, index, group): the index breaks ties by ranked order and is unique.
    heap = [(-head[q[0]][1].score, q[0], group) for group, q in queues.items()]
    heapq.heapify(heap)
    out: list[tuple[Key, Scored]] = []
    while heap:
        _, i, group = heapq.heappop(heap)
        out.append(head[i])
        queue = queues[group]
        queue.popleft()
        if queue:  # only a session holds more than one item
            nxt = queue[0]
            taken = sizes[group] - len(queue)  # chosen from this session so far
            heapq.heappush(heap, (-(head[nxt][1].score - SESSION_SPREAD * taken), nxt, group))
    return out + rest


def _thread(ranked: list[tuple[Key, Scored]], depth: int) -> list[tuple[Key, Scored]]:
    """The head of a thread question's ranking (the first ``depth`` items that score at
    least ``THREAD_FLOOR`` x the best), as the thread went: the sessions they come from in
    the order they took place, and in rounds, each round taking the best remaining item of
    every session. The head so holds each conversation that talks about the subject,
    earliest first, before any holds two. Facts and summaries (no session) each stand
    alone, placed by their own time."""
    floor = THREAD_FLOOR * (ranked[0][1].score if ranked else 0.0)
    depth = min(depth, sum(1 for _, x in ranked[:depth] if x.score >= floor))
    head, rest = ranked[:depth], ranked[depth:]
    queues: dict[str | int, deque[tuple[Key, Scored]]] = {}
    for i, item in enumerate(head):
        queues.setdefault(item[1].cand.session or i, deque()).append(item)
    undated = datetime.max.replace(tzinfo=timezone.utc)
    order = sorted(queues.values(), key=lambda q: min(x.cand.ts or undated for _, x in q))
    out: list[tuple[Key, Scored]] = []
    while order:
        out.extend(q.popleft() for q in order)
        order = [q for q in order if q]
    return out + rest


def _stated_by_summaries(scored: dict[Key, Scored]) -> set[str]:
    """The facts a candidate summary states, to be listed once, as that summary.

    A summary is made of its facts ("User is Alex. User just moved from Lisbon to Berlin"),
    so a fact beside it says again part of what it says. Each such fact is left out, and
    its summary takes the fact's score where that is higher, so it stands where the fact
    would have ("Where does Alex live now?" listed "User is Alex." first, the summary that
    holds the answer after it)."""
    facts = {x.id: x for (layer, _), x in scored.items() if layer == "fact"}
    stated: set[str] = set()
    for x in scored.values():
        if isinstance(x.brief, SummaryBrief):
            own = [facts[f] for f in x.brief.fact_ids if f in facts]
            if own:
                x.score = max(x.score, *(f.score for f in own))
                stated.update(f.id for f in own)
    return stated


def ordered(
    store: RecallStore,
    plan: QueryPlan,
    scored: dict[Key, Scored],
    *,
    limit: int,
    chat: ChatModel | None = None,
) -> list[tuple[Key, Scored]]:
    """The ranking the first ``limit`` hits are taken from: by score, the head reranked
    when asked, then spread over sessions or in the thread's order."""
    ranked = sorted(scored.items(), key=lambda kv: (-kv[1].score, kv[0]))
    if plan.options.rerank:
        depth = max(limit * 2, 20)
        fill_rows(store, ranked[:depth])
        ranked = rerank(ranked, plan.query, chat=chat, depth=depth)
    if plan.thread:
        return _thread(ranked, max(limit, THREAD_DEPTH))
    if plan.asks_for_many:
        return _spread(ranked, max(limit, 20))
    return ranked


def select(
    store: RecallStore,
    plan: QueryPlan,
    scored: dict[Key, Scored],
    *,
    limit: int,
    exclude: Sequence[str] = (),
    texts: frozenset[str] = frozenset(),
    chat: ChatModel | None = None,
    rows: dict[str, StoredRow] | None = None,
) -> list[Hit]:
    """The first ``limit`` hits. ``rows``, when given, receives each hit's stored row."""
    skip = set(exclude)
    restated = _stated_by_summaries(scored)
    ranked = ordered(store, plan, scored, limit=limit, chat=chat)
    message_score = {x.id: x.score for (lay, _), x in scored.items() if lay == "message"}
    hits: list[Hit] = []
    pos = 0
    while len(hits) < limit and pos < len(ranked):
        chosen: list[tuple[Key, Scored]] = []
        while pos < len(ranked) and len(chosen) < limit - len(hits):
            key, x = ranked[pos]
            pos += 1
            if key[0] == "message" and x.id in skip:
                continue
            if key[0] == "fact" and x.id in restated:
                continue
            chosen.append((key, x))
        fill_rows(store, chosen)
        for _, x in chosen:
            if x.row is None:
                continue  # forgotten since it was ranked
            if isinstance(x.row, MessageRow) and carried(x.row, texts):
                continue  # the prompt holds it already (known once its row is read)
            hit = _hit(x.row, round(x.score, 6), message_score)
            hit.signals = x.signals
            hit.superseded = x.cand.superseded or getattr(x.row, "status", None) == "superseded"
            hit.expired = x.cand.expired
            hits.append(hit)
            if rows is not None:
                rows[hit.id] = x.row
    return hits
