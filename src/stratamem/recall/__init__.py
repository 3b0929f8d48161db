"""The read path: layered hybrid search, the local scorer, rerank, and context assembly.

A recall is a straight line of stages, each a function of the plan and of the previous
stage's output (docs/recall.md, "The stages"):

1. plan (``_plan``): the query read once — its period, variants, terms, the names it
   mentions, whether it asks for several things, the layers and candidate counts;
2. retrieve (``_retrieve``): full-text and vector candidates of every layer, with their
   evidence (cosines, neighbouring turns, time, status);
3. score (``_scoring``): one ranking on one scale over every layer;
4. chain (``_chain``, ``multi_hop_chain`` only): a second retrieval seeded by the best hits;
5. select (``_select``): rerank of the head when asked, the head spread over sessions for
   a question asking for several things, exclusions, the hits returned;
6. assemble (``_context``, ``get_memory`` only): history, topics, quotes, the token budget.

Beside them, ``_standing`` finds the user's standing instructions and preferences that apply
to the request: ``get_memory`` lists them in their own section, ``search`` puts them first.

``Recaller`` runs them. Full text sees a message the moment it is accepted; the vector side
once a worker has embedded it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from datetime import datetime
from functools import partial

from .. import _abandon, _tracing
from .._foreground import Foreground
from .._queries import SEARCH_LAYERS
from .._time import parse_iso as parse_ts
from ..embed import Embedder
from ..llm import ChatModel
from ..store import SearchFilters, SessionRow, StandingFact
from ..types import Hit, MemoryContext, RecallConfig
from ._chain import chain
from ._context import assemble, carried_texts
from ._plan import QueryPlan, SearchOptions, asks_for_record, plan_query, search_options
from ._recall_embedder import RecallEmbedder
from ._retrieve import RecallStore, StoredRow, retrieve
from ._rows import message_from_row
from ._scoring import DEFAULT_WEIGHTS, Key, Scored, ScorerWeights, rank
from ._select import ordered, select
from ._standing import (
    SEARCH_MIN_SIMILARITY,
    TextVectors,
    applicable,
    read_standing,
    with_standing,
)
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


class Recaller:
    """Runs the recall stages over a store, an embedder and (for rerank) a chat model."""

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
        self.vectors = TextVectors(embedder)
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    def _executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(4, thread_name_prefix="stratamem-retrieve")
            return self._pool

    def close(self) -> None:
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

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
        standing: bool = False,
        embedder: RecallEmbedder | None = None,
    ) -> list[Hit]:
        """Ranked hits of every layer asked for, each with its provenance message ids.
        ``rows``, when given, receives the stored row of each hit by id. Messages whose id
        is in ``exclude``, or whose stripped content is in ``carried``, are passed over:
        the next-ranked items take their places. With ``standing``, the user's standing
        instructions and preferences whose scope the query is in come first (facts; not
        under metadata filters, which they are not checked against). ``embedder``: the
        recall's when this search is part of one (``context``), so that a text is embedded
        once in it."""
        if limit <= 0 or not query.strip():
            return []
        options = options or SearchOptions()
        wants_standing = (
            standing
            and "fact" in options.layers
            and not filters.metadata
            and not asks_for_record(query)  # the record asked for, not work to shape
        )
        once = embedder or RecallEmbedder(self.embedder)
        with self._foreground():
            _abandon.check()  # the foreground gate may have been waited for
            # Read beside the search (it needs nothing the search finds): off its path.
            read = self._standing_read(project_id, user_id) if wants_standing else None
            speakers = self.store.speaker_names(project_id, user_id)
            plan = plan_query(
                query,
                project_id=project_id,
                user_id=user_id,
                filters=filters,
                options=options,
                limit=limit,
                speakers=speakers,
                excluded=len(exclude),
                carried=len(carried),
                locate=lambda event, opts: self._locate(
                    project_id, user_id, event, opts, speakers, once, beside=query
                ),
            )
            scored = self._rank(plan, once)
            _abandon.check()
            if plan.options.router == "multi_hop_chain":
                with _tracing.span("stratamem.recall.chain", child=True):
                    scored = chain(self.store, plan, scored, partial(self._rank, embedder=once))
                _abandon.check()
            hits = select(
                self.store,
                plan,
                scored,
                limit=limit,
                exclude=exclude,
                texts=carried,
                chat=self.chat,
                rows=rows,
            )
            if read is None:
                return hits
            items = applicable(
                read,
                self.vectors,
                query,
                as_of=plan.options.as_of,
                general=False,
                minimum=SEARCH_MIN_SIMILARITY,
                embedder=once,
            )
            return with_standing(hits, items, limit)

    def _standing_read(self, project_id: str, user_id: str) -> Callable[[], list[StandingFact]]:
        """The user's standing items, read in the background from now: the returned
        callable waits for them."""
        pending = self._executor().submit(
            _tracing.carry(partial(read_standing, self.store, project_id, user_id))
        )
        return pending.result

    def _rank(self, plan: QueryPlan, embedder: Embedder) -> dict[Key, Scored]:
        """Retrieve and score: what one plan finds, ranked."""
        with _tracing.span("stratamem.recall.retrieve", child=True) as span:
            found = retrieve(self.store, embedder, self._executor(), plan)
            span.set_attribute("stratamem.recall.candidates", len(found.cands))
        with _tracing.span("stratamem.recall.score", child=True):
            return rank(found, plan, self.weights)

    def _locate(
        self,
        project_id: str,
        user_id: str,
        event: str,
        options: SearchOptions,
        speakers: Sequence[str],
        embedder: RecallEmbedder,
        *,
        beside: str | None = None,
    ) -> datetime | None:
        """When ``event`` was talked about ("before the move": the move): the time of the
        best message for it, as a search for it with limit 1 would return it. It takes no
        more candidates than the recall it serves (a capture recall's are few), and the
        recall's speakers; the time is the candidate's own, so no row is read for a hit
        (on PostgreSQL two round trips fewer: most of the slowest LoCoMo recalls are the
        few that locate an event). ``beside``: the question, which the recall embeds next;
        a remote embedder (one without ``foreground``: it does not compute on this
        machine's cores) is sent both in one request, a round trip fewer. The bundled
        model embeds them one after the other: side by side they were slower."""
        if beside is not None and getattr(self.embedder, "foreground", None) is None:
            embedder.embed([event, beside])
        plan = plan_query(
            event,
            project_id=project_id,
            user_id=user_id,
            filters=SearchFilters(),
            options=SearchOptions(
                layers=("message",), as_of=options.as_of, per_layer=options.per_layer
            ),
            limit=1,
            speakers=speakers,
            locate=lambda e, opts: self._locate(project_id, user_id, e, opts, speakers, embedder),
        )
        ranked = ordered(self.store, plan, self._rank(plan, embedder), limit=1, chat=self.chat)
        for _, best in ranked:
            return best.cand.ts
        return None

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
        once = RecallEmbedder(self.embedder)  # the search's and the standing items'
        standing = (
            None
            if filters.metadata
            or not (query and query.strip())
            or not config.enable_long_term_recall
            else partial(
                applicable,
                self._standing_read(project_id, session.user_id),
                self.vectors,
                embedder=once,
            )
        )
        with self._foreground(), _tracing.span("stratamem.recall.assemble", child=True):
            return assemble(
                self.store,
                partial(self.search, project_id, session.user_id, filters=filters, embedder=once),
                project_id=project_id,
                session=session,
                query=query,
                config=config,
                details=details,
                texts=carried_texts(exclude_texts),
                standing=standing,
            )
