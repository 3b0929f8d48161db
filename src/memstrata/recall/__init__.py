"""The read path: layered hybrid search, the local scorer, rerank, and context assembly.

Every search runs a vector retriever and a full-text retriever over each layer asked for
(summaries, facts, messages) and ranks all candidates on one scale (``_scoring``). Full text
sees a message the moment it is accepted; the vector side once a worker has embedded it.
See docs/recall.md.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Protocol

import numpy as np

from .._foreground import Foreground
from .._products import similarities
from .._queries import SEARCH_LAYERS
from .._time import parse_iso as parse_ts
from .._time import utcnow
from ..embed import Embedder
from ..llm import ChatModel
from ..store import (
    CURRENT_SUMMARY,
    FactBrief,
    FactRow,
    LayerStore,
    MessageBrief,
    MessageRow,
    SearchFilters,
    SearchStore,
    SessionRow,
    SessionStore,
    SummaryBrief,
    SummaryRow,
)
from ..store._text import fts_query_terms
from ..types import Hit, MemoryContext, Message, RecallConfig, Topic
from ._format import format_context
from ._rerank import rerank
from ._rewrite import rewrite_query
from ._rows import fact_from_row, message_from_row, topic_from_row
from ._scoring import DEFAULT_WEIGHTS, Candidate, Key, ScorerWeights, score
from ._temporal import TimeIntent, parse_time_intent, window_boost
from ._tokens import estimate_tokens

__all__ = [
    "SEARCH_LAYERS",
    "RecallStore",
    "Recaller",
    "SearchOptions",
    "estimate_tokens",
    "message_from_row",
    "parse_ts",
    "search_options",
]

_WORD = re.compile(r"\w+")

# Facts and summaries whose validity ended before the question count this much.
EXPIRED_WEIGHT = 0.5

# get_memory leaves out matches scoring below this share of the best one.
CONTEXT_MIN_SHARE = 0.3

# A second (multi-hop) retrieval's scores count at this share of the first's.
CHAIN_WEIGHT = 0.7


def _hit(row: MessageRow, score: float) -> Hit:
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


def _signals(cand: Candidate, window: dict[Key, float] | None) -> dict[str, float]:
    """Per-retriever evidence of one hit: only the retrievers that found it."""
    out = {}
    if cand.weight < 1.0:
        out["status_weight"] = cand.weight
    if cand.superseded:  # a message every fact of which was corrected since
        out["superseded"] = 1.0
    if cand.expired:
        out["expired"] = 1.0
    if max(cand.fulltext, default=0.0) > 0:
        out["fulltext"] = round(max(cand.fulltext), 6)
    if max(cand.vector, default=0.0) > 0:
        out["vector"] = round(max(cand.vector), 6)
    if window is not None:
        out["time_window"] = round(window.get(cand.key, 0.0), 6)
    return out


def _carried_texts(texts: Sequence[str]) -> frozenset[str]:
    """``get_memory``'s ``exclude_texts`` as they are compared: stripped, blanks dropped."""
    return frozenset(t for t in (x.strip() for x in texts) if t)


def _carried(row: MessageRow, carried: frozenset[str]) -> bool:
    """The prompt holds this message already (its content is one of the texts it carries)."""
    return bool(carried) and row.content.strip() in carried


def _words(text: str) -> list[str]:
    return [w.casefold() for w in _WORD.findall(text)]


def _row_text(row: StoredRow) -> str:
    return str(getattr(row, "content", None) or getattr(row, "text", ""))


Brief = MessageBrief | FactBrief | SummaryBrief
#: A hit's full row, read for the hits only (``Recaller._load``).
StoredRow = MessageRow | FactRow | SummaryRow


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


@dataclass(frozen=True)
class SearchOptions:
    """How one search runs; built from ``Memory.search`` arguments or a RecallConfig."""

    layers: tuple[str, ...] = ("summary", "fact", "message")
    include_superseded: bool = False
    router: str = "single_hop_direct"
    rerank: bool = False
    fusion: str = "score"
    rrf_k: int = 60
    # Per layer: a cosine below this is no vector match (full-text matches still count).
    min_similarity: Mapping[str, float] = field(default_factory=dict)
    as_of: datetime | None = None
    per_layer: int | None = None  # candidates per retriever and layer (default from limit)


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


@dataclass
class Scored:
    score: float
    brief: Brief  # what the item was ranked on (Store.recall_briefs)
    cand: Candidate
    window: dict[Key, float] | None = None
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


def _statuses(opts: SearchOptions) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(summary statuses, fact statuses) a search may return."""
    if opts.include_superseded:
        return (*CURRENT_SUMMARY, "superseded"), ("active", "superseded")
    return CURRENT_SUMMARY, ("active",)


_STATUS_WEIGHT = {"deprioritized": 0.5, "superseded": 0.5}


class RecallStore(SearchStore, SessionStore, LayerStore, Protocol):
    """What recall reads: its candidates (search), a session's history and the messages
    items quote (sessions), and a user's latest facts (layers)."""


class Recaller:
    def __init__(
        self,
        store: RecallStore,
        embedder: Embedder,
        *,
        chat: ChatModel | None = None,
        weights: ScorerWeights = DEFAULT_WEIGHTS,
        foreground: Foreground | None = None,
    ) -> None:
        self.store = store
        self.embedder = embedder
        self.chat = chat
        self.weights = weights
        self.foreground = foreground
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    def _executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(4, thread_name_prefix="memstrata-recall")
            return self._pool

    def close(self) -> None:
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    # -- retrieval -------------------------------------------------------------------

    def _fulltext(
        self,
        project_id: str,
        user_id: str,
        variants: Sequence[str],
        n: int,
        filters: SearchFilters,
        opts: SearchOptions,
        speakers: Sequence[str],
    ) -> dict[Key, list[float]]:
        out: dict[Key, list[float]] = {}
        layers = self._layers(opts, filters)
        summary_statuses, fact_statuses = _statuses(opts)
        # Speaker names are matched by the speaker signal, not as words: within one user's
        # memory a name is in half the turns, yet the index's collection-wide statistics
        # would weigh it as a rare, decisive word.
        names = {w for n in speakers for w in _words(n)}
        for v, text in enumerate(variants):
            terms = [t for t in fts_query_terms(text) if t.casefold() not in names]
            found: list[tuple[Key, float]] = []
            if "message" in layers:
                found += [
                    (("message", pk), s)
                    for pk, s in self.store.fulltext_messages(
                        project_id, user_id, terms, n, filters
                    )
                ]
            if "fact" in layers:
                found += [
                    (("fact", pk), s)
                    for pk, s in self.store.fulltext_items(
                        "fact", project_id, user_id, terms, n, fact_statuses
                    )
                ]
            if "summary" in layers:
                found += [
                    (("summary", pk), s)
                    for pk, s in self.store.fulltext_items(
                        "summary", project_id, user_id, terms, n, summary_statuses
                    )
                ]
            for key, s in found:
                out.setdefault(key, [0.0] * len(variants))[v] = s
        return out

    @staticmethod
    def _layers(opts: SearchOptions, filters: SearchFilters) -> tuple[str, ...]:
        # Message-level filters (session, role, event type, time, metadata) describe
        # messages: derived layers take part only without them.
        if filters.empty:
            return opts.layers
        return tuple(layer for layer in opts.layers if layer == "message")

    def _retrieve(
        self,
        project_id: str,
        user_id: str,
        variants: Sequence[str],
        n: int,
        filters: SearchFilters,
        opts: SearchOptions,
        speakers: Sequence[str],
    ) -> tuple[dict[Key, list[float]], list[Key], list[np.ndarray], _Rows]:
        """Candidates of every layer: full text (run beside the query embedding, with the
        briefs of what it found and of their neighbouring turns), then vectors. Returns
        (full-text scores per variant, every candidate, query vectors, briefs so far)."""

        def fulltext_and_rows() -> tuple[dict[Key, list[float]], _Rows]:
            found = self._fulltext(project_id, user_id, variants, n, filters, opts, speakers)
            rows = self._rows(project_id, user_id, list(found), filters)
            around = {p for pair in rows.neighbours.values() for p in pair if p is not None}
            around -= set(rows.messages)
            if around:
                rows.context = self.store.recall_briefs(
                    project_id, user_id, sorted(around), embedder=self.embedder.id
                )[0]
            return found, rows

        pending = self._executor().submit(fulltext_and_rows)
        qvecs = self.embedder.embed(list(variants))
        layers = self._layers(opts, filters)
        summary_statuses, fact_statuses = _statuses(opts)
        keys: set[Key] = set()
        for q in qvecs:
            if "message" in layers:
                keys.update(
                    ("message", pk)
                    for pk, _ in self.store.vector_messages(
                        project_id, user_id, q, self.embedder.id, n, filters
                    )
                )
            if "fact" in layers:
                keys.update(
                    ("fact", pk)
                    for pk, _ in self.store.vector_items(
                        "fact", project_id, user_id, q, self.embedder.id, n, fact_statuses
                    )
                )
            if "summary" in layers:
                keys.update(
                    ("summary", pk)
                    for pk, _ in self.store.vector_items(
                        "summary", project_id, user_id, q, self.embedder.id, n, summary_statuses
                    )
                )
        fulltext, rows = pending.result()
        keys.update(fulltext)
        return fulltext, sorted(keys), list(qvecs), rows

    def _rows(
        self, project_id: str, user_id: str, keys: Sequence[Key], filters: SearchFilters
    ) -> _Rows:
        """Briefs of ``keys`` and, for an unfiltered search, the neighbouring turns of its
        messages (a filter describes which messages count)."""
        messages, facts, summaries = self.store.recall_briefs(
            project_id,
            user_id,
            [pk for lay, pk in keys if lay == "message"],
            [pk for lay, pk in keys if lay == "fact"],
            [pk for lay, pk in keys if lay == "summary"],
            neighbours=filters.empty,
            embedder=self.embedder.id,
        )
        out = _Rows(messages, facts, summaries)
        if filters.empty:
            out.neighbours = {pk: (b.prev_pk, b.next_pk) for pk, b in messages.items()}
        return out

    def _load(self, items: Sequence[tuple[Key, Scored]]) -> None:
        """Read the full rows of ``items`` that have none yet (hits, rerank, chain seeds)."""
        wanted: dict[str, list[int]] = {}
        for (layer, pk), x in items:
            if x.row is None:
                wanted.setdefault(layer, []).append(pk)
        if not wanted:
            return
        found: dict[str, Mapping[int, StoredRow]] = {
            "message": self.store.messages_by_pk(wanted.get("message", [])),
            "fact": self.store.facts_by_pk(wanted.get("fact", [])),
            "summary": self.store.summaries_by_pk(wanted.get("summary", [])),
        }
        for (layer, pk), x in items:
            if x.row is None:
                x.row = found[layer].get(pk)

    def search(
        self,
        project_id: str,
        user_id: str,
        query: str,
        *,
        limit: int,
        filters: SearchFilters,
        options: SearchOptions | None = None,
        exclude: Sequence[str] = (),
        rows: dict[str, StoredRow] | None = None,
        carried: frozenset[str] = frozenset(),
    ) -> list[Hit]:
        """Ranked hits of every layer asked for, each with its provenance message ids.
        ``rows``, when given, receives the stored row of each hit by id. Messages whose id
        is in ``exclude``, or whose stripped content is in ``carried``, are passed over:
        the next-ranked items take their places."""
        opts = options or SearchOptions()
        if limit <= 0 or not query.strip():
            return []
        with self._foreground():
            return self._search(
                project_id, user_id, query, limit, filters, opts, exclude, rows, carried
            )

    @contextmanager
    def _foreground(self) -> Iterator[None]:
        # A recall is waited for: this process's background threads (the pipeline, the
        # capture writer) and an embedder that runs background batches on the same cores
        # (the local model) let it go first for its whole length, not only while the
        # query itself is embedded.
        foreground = getattr(self.embedder, "foreground", None)
        with (
            self.foreground.hold() if self.foreground is not None else nullcontext(),
            foreground() if foreground is not None else nullcontext(),
        ):
            yield

    def _search(
        self,
        project_id: str,
        user_id: str,
        query: str,
        limit: int,
        filters: SearchFilters,
        opts: SearchOptions,
        exclude: Sequence[str],
        rows: dict[str, StoredRow] | None,
        carried: frozenset[str],
    ) -> list[Hit]:
        as_of = opts.as_of or utcnow()
        intent = parse_time_intent(query, as_of)
        variants = [query]
        if opts.router == "single_hop_parallel":
            variants += [r.text for r in rewrite_query(query)]
        n = opts.per_layer or max(60, limit * 2) + len(exclude)
        # The prompt's own turns are likely among the best candidates (the same conversation):
        # as many more candidates as they could take, at most twice as many in all.
        n += min(len(carried), n)
        opts = replace(opts, as_of=as_of)
        scored = self._score(project_id, user_id, query, variants, n, filters, opts, intent)
        if opts.router == "multi_hop_chain" and scored:
            scored = self._chain(project_id, user_id, query, scored, n, filters, opts, intent)
        return self._hits(scored, limit, exclude, opts, query, rows, carried)

    def _score(
        self,
        project_id: str,
        user_id: str,
        query: str,
        variants: Sequence[str],
        n: int,
        filters: SearchFilters,
        opts: SearchOptions,
        intent: TimeIntent,
    ) -> dict[Key, Scored]:
        speakers = self.store.speaker_names(project_id, user_id)
        fulltext, keys, qvecs, rows = self._retrieve(
            project_id, user_id, variants, n, filters, opts, speakers
        )
        rows.update(self._rows(project_id, user_id, [k for k in keys if k not in rows], filters))
        messages, facts, summaries = rows.messages, rows.facts, rows.summaries
        neighbours = rows.neighbours
        if neighbours:
            more = {p for pair in neighbours.values() for p in pair if p is not None}
            more -= set(messages)
            if more:
                missing = sorted(more - set(rows.context))
                if missing:
                    rows.context.update(
                        self.store.recall_briefs(
                            project_id, user_id, missing, embedder=self.embedder.id
                        )[0]
                    )
                messages.update((pk, rows.context[pk]) for pk in more if pk in rows.context)
                keys = sorted(set(keys) | {("message", pk) for pk in more})
                # An added turn's link back to the candidate it neighbours is known; its
                # other side is not needed for a turn that only came in as context.
                for pk, (prev, nxt) in list(neighbours.items()):
                    if prev in more:
                        neighbours[prev] = (neighbours.get(prev, (None, None))[0], pk)
                    if nxt in more:
                        neighbours[nxt] = (pk, neighbours.get(nxt, (None, None))[1])
        tables: dict[str, Mapping[int, Brief]] = {
            "message": messages,
            "fact": facts,
            "summary": summaries,
        }
        sims = _similarities(tables, keys, qvecs)
        cands: dict[Key, Candidate] = {}
        briefs: dict[Key, Brief] = {}
        no_match = (0.0,) * len(variants)
        for key in keys:
            layer, pk = key
            brief = tables[layer].get(pk)
            if brief is None:
                continue
            # A non-positive cosine means "unrelated" for every embedder we ship.
            floor = max(opts.min_similarity.get(layer, 0.0), 1e-6)
            # A tuple, not a list: short tuples come from CPython's free list, which the
            # garbage collector does not count, and a search keeps a few hundred of these
            # alive (a list each made the collector run a third more often).
            vec = tuple([v if v >= floor else 0.0 for v in sims.get(key, ())])
            text = fulltext.get(key, no_match)
            if max(vec, default=0.0) <= 0 and max(text) <= 0:
                continue
            cand = Candidate(key=key, fulltext=text, vector=vec)
            if isinstance(brief, MessageBrief):
                cand.session, cand.name = brief.session_id, brief.name
                cand.ts = parse_ts(brief.ts)
                prev, nxt = neighbours.get(pk, (None, None))
                cand.prev = ("message", prev) if prev is not None else None
                cand.next = ("message", nxt) if nxt is not None else None
                # Raw history stays full evidence ("how many since..." needs the old value
                # too); it is only marked, and get_memory leaves it out unless asked.
                cand.superseded = brief.superseded
            else:
                # A fact is placed in time by when it happened ("went hiking last spring"),
                # a summary by when it was observed.
                if isinstance(brief, FactBrief):
                    when = brief.occurred_at or brief.observed_at or brief.created_at
                else:
                    when = brief.observed_at or brief.created_at
                    cand.topics = tuple(brief.topic_ids)
                cand.ts = parse_ts(when)
                cand.weight = _STATUS_WEIGHT.get(brief.status, 1.0)
                until = parse_ts(brief.valid_to)
                if until is not None and opts.as_of is not None and until < opts.as_of:
                    cand.weight *= EXPIRED_WEIGHT  # no longer holds: history, not current
                    cand.expired = True
            cands[key] = cand
            briefs[key] = brief
        window = None
        span = intent.window
        if span is None and intent.relation and intent.anchor:
            span = self._anchor_window(project_id, user_id, intent, opts)
        if span is not None:
            window = {k: window_boost(c.ts, span) for k, c in cands.items()}
        scores = score(
            cands,
            query,
            speakers=speakers,
            weights=self.weights,
            fusion=opts.fusion,
            rrf_k=opts.rrf_k,
            window=window,
            as_of=opts.as_of,
        )
        return {k: Scored(s, briefs[k], cands[k], window) for k, s in scores.items()}

    def _anchor_window(
        self, project_id: str, user_id: str, intent: TimeIntent, opts: SearchOptions
    ) -> tuple[datetime, datetime] | None:
        """ "before the move": find when the anchor event was talked about, and turn the
        relation into a period ending (before) or starting (after) there. The search for it
        takes no more candidates than the recall it serves (a capture recall's are few)."""
        assert intent.anchor is not None
        as_of = opts.as_of
        hits = self.search(
            project_id,
            user_id,
            intent.anchor,
            limit=1,
            filters=SearchFilters(),
            options=SearchOptions(layers=("message",), as_of=as_of, per_layer=opts.per_layer),
        )
        if not hits or hits[0].timestamp is None:
            return None
        at = hits[0].timestamp
        if intent.relation == "before":
            return (datetime(1970, 1, 1, tzinfo=timezone.utc), at)
        return (at, as_of or utcnow())

    def _chain(
        self,
        project_id: str,
        user_id: str,
        query: str,
        first: dict[Key, Scored],
        n: int,
        filters: SearchFilters,
        opts: SearchOptions,
        intent: TimeIntent,
    ) -> dict[Key, Scored]:
        """Multi-hop: a second retrieval seeded by what the first found (the query plus the
        best hits' text), merged with the first at a lower weight."""
        top = sorted(first.items(), key=lambda kv: -kv[1].score)[:3]
        self._load(top)
        seed = " ".join(_row_text(x.row) for _, x in top if x.row is not None)
        second = self._score(
            project_id, user_id, query, [f"{query} {seed}"], n, filters, opts, intent
        )
        merged = dict(first)
        for key, found in second.items():
            s2 = CHAIN_WEIGHT * found.score
            if key not in merged or merged[key].score < s2:
                merged[key] = Scored(s2, found.brief, found.cand, found.window, row=found.row)
                merged[key].signals["chain"] = 1.0
        return merged

    def _hits(
        self,
        scored: dict[Key, Scored],
        limit: int,
        exclude: Sequence[str],
        opts: SearchOptions,
        query: str,
        rows: dict[str, StoredRow] | None = None,
        carried: frozenset[str] = frozenset(),
    ) -> list[Hit]:
        skip = set(exclude)
        ranked = sorted(scored.items(), key=lambda kv: (-kv[1].score, kv[0]))
        if opts.rerank:
            depth = max(limit * 2, 20)
            self._load(ranked[:depth])
            ranked = rerank(ranked, query, chat=self.chat, depth=depth)
        message_score = {x.id: x.score for (lay, _), x in scored.items() if lay == "message"}
        # A summary made of one fact says what the fact says: list the summary only.
        restated: set[str] = set()
        for x in scored.values():
            if isinstance(x.brief, SummaryBrief) and len(x.brief.fact_ids) == 1:
                restated.add(x.brief.fact_ids[0])
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
            self._load(chosen)
            for _, x in chosen:
                if x.row is None:
                    continue  # forgotten since it was ranked
                if isinstance(x.row, MessageRow) and _carried(x.row, carried):
                    continue  # the prompt holds it already (known once its row is read)
                s = round(x.score, 6)
                # The row's type is its layer's.
                if isinstance(x.row, MessageRow):
                    hit = _hit(x.row, s)
                elif isinstance(x.row, FactRow):
                    hit = _fact_hit(x.row, s, message_score)
                else:
                    hit = _summary_hit(x.row, s, message_score)
                hit.signals = x.signals
                hits.append(hit)
                if rows is not None:
                    rows[hit.id] = x.row
        return hits

    def context(
        self,
        *,
        project_id: str,
        session: SessionRow,
        query: str | None,
        config: RecallConfig,
        filters: SearchFilters,
        details: bool,
        exclude_texts: Sequence[str] = (),
    ) -> MemoryContext:
        """``get_memory``: the session's recent turns and what recall finds for ``query``,
        formatted within the token budget. A message whose content is one of
        ``exclude_texts`` (stripped) is in the prompt already: it is left out of the history,
        the matches (the next-ranked take its slot) and the quotes (the next source message
        takes its place), before anything is formatted."""
        carried = _carried_texts(exclude_texts)
        with self._foreground():
            return self._context(project_id, session, query, config, filters, details, carried)

    def _context(
        self,
        project_id: str,
        session: SessionRow,
        query: str | None,
        config: RecallConfig,
        filters: SearchFilters,
        details: bool,
        carried: frozenset[str],
    ) -> MemoryContext:
        history_rows = (
            self.store.list_messages(
                project_id,
                session_id=session.id,
                limit=config.message_recent_limit,
                newest_first=True,
            )
            if config.message_recent_limit
            else []
        )
        # The last message_recent_limit turns, less those the prompt carries (no older turns
        # come in instead: the history is the session's latest turns).
        history = [message_from_row(r) for r in reversed(history_rows) if not _carried(r, carried)]
        user_id = session.user_id
        matches: list[Hit] = []
        found: dict[str, StoredRow] = {}  # stored rows of the hits, not read twice
        if query and query.strip() and config.enable_long_term_recall:
            caps = {
                "summary": config.proposition_top_k,
                "fact": config.observation_semantic_top_k,
                "message": config.message_semantic_top_k,
            }
            floors = {
                "summary": config.observation_semantic_min_score,
                "fact": config.observation_semantic_min_score,
                "message": config.message_semantic_min_score,
            }
            layers = tuple(layer for layer, k in caps.items() if k > 0)
            if layers:
                hits = self.search(
                    project_id,
                    user_id,
                    query,
                    limit=sum(caps.values()),
                    filters=filters,
                    options=search_options(config, layers=layers, min_similarity=floors),
                    exclude=[r.id for r in history_rows],
                    rows=found,
                    carried=carried,
                )
                taken = dict.fromkeys(caps, 0)
                best = hits[0].score if hits else 0.0
                for hit in hits:
                    if hit.signals.get("superseded") and not config.include_superseded:
                        continue
                    # Far weaker than the best match: noise that would only spend the budget.
                    if hit.score < CONTEXT_MIN_SHARE * best or taken[hit.layer] >= caps[hit.layer]:
                        continue
                    taken[hit.layer] += 1
                    matches.append(hit)
        # (A hit's row is of its layer's type.)
        summary_rows = [
            r for h in matches if h.layer == "summary" and isinstance(r := found[h.id], SummaryRow)
        ]
        topics_of = self.store.topics_of_summaries([r.pk for r in summary_rows])
        by_summary = {
            r.id: [topic_from_row(t) for t in topics_of.get(r.pk, [])] for r in summary_rows
        }
        topic_rank: dict[str, tuple[float, Topic]] = {}
        for hit in matches:
            for topic in by_summary.get(hit.id, []):
                best = topic_rank.get(topic.id, (0.0, topic))[0]
                topic_rank[topic.id] = (best + hit.score, topic)
        topics = [t for _, t in sorted(topic_rank.values(), key=lambda x: (-x[0], x[1].name))][
            : config.topic_top_k
        ]
        evidence = self._evidence(project_id, matches, config.observation_context_top_k, carried)
        fact_rows = [
            r for h in matches if h.layer == "fact" and isinstance(r := found[h.id], FactRow)
        ]
        if config.observation_recent_limit:
            known = {r.id for r in fact_rows}
            fact_rows += [
                r
                for r in self.store.list_facts(
                    project_id, user_id, limit=config.observation_recent_limit, newest_first=True
                )
                if r.id not in known
            ]
        shown_topics = {t.id for t in topics}
        groups = {
            sid: [t.name for t in ts if t.id in shown_topics] for sid, ts in by_summary.items()
        }
        # A summary stands for its facts and quotes its messages; a fact quotes its
        # messages: the covered items are not listed again.
        covered_facts = {f for r in summary_rows for f in r.fact_ids}
        covered_messages = {m for h in matches if h.layer != "message" for m in h.message_ids}
        shown = [
            h
            for h in matches
            if not (h.layer == "fact" and h.id in covered_facts)
            and not (h.layer == "message" and h.id in covered_messages)
        ]
        text, tokens = format_context(
            shown, history, config.token_budget, topics=groups, evidence=evidence
        )
        summaries = [h.text for h in matches if h.layer == "summary"]
        return MemoryContext(
            project_id=project_id,
            user_id=user_id,
            session_id=session.id,
            query=query,
            history=history,
            facts=[fact_from_row(r) for r in fact_rows],
            summary="\n".join(summaries) if summaries else None,
            topics=topics,
            formatted_context=text,
            token_estimate=tokens,
            matches=matches if details else None,
        )

    def _evidence(
        self, project_id: str, matches: Sequence[Hit], per_item: int, carried: frozenset[str]
    ) -> dict[str, list[Message]]:
        """Source messages quoted under each summary and fact (best-matching first), less
        those the prompt carries: as many more are read as could be left out."""
        out: dict[str, list[Message]] = {}
        if per_item <= 0:
            return out
        read = per_item + len(carried)
        quoted = {h.id: h.message_ids[:read] for h in matches if h.layer != "message"}
        rows = self.store.get_messages(
            project_id, sorted({m for ids in quoted.values() for m in ids})
        )
        for item, ids in quoted.items():
            kept = [rows[m] for m in ids if m in rows and not _carried(rows[m], carried)]
            out[item] = [message_from_row(r) for r in kept[:per_item]]
        return out


def search_options(
    config: RecallConfig,
    *,
    as_of: datetime | None = None,
    layers: tuple[str, ...] | None = None,
    include_superseded: bool | None = None,
    min_similarity: Mapping[str, float] | None = None,
) -> SearchOptions:
    """The search a RecallConfig asks for."""
    return SearchOptions(
        layers=layers or SEARCH_LAYERS,
        include_superseded=(
            config.include_superseded if include_superseded is None else include_superseded
        ),
        router=config.query_router,
        rerank=config.enable_long_term_rerank,
        fusion=config.fusion,
        rrf_k=config.long_term_rrf_k,
        as_of=as_of,
        min_similarity=dict(min_similarity or {}),
        per_layer=config.candidate_pool,
    )
