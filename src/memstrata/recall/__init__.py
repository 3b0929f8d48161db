"""The read path: hybrid candidate search, fusion, and context assembly.

Every search runs a vector retriever and a full-text retriever over the same scope and
fuses them (reciprocal rank fusion by default). Full text sees a message the moment it is
accepted; the vector side sees it once a worker has embedded it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

from .._time import parse_iso as parse_ts
from ..embed import Embedder
from ..store import MessageRow, SearchFilters, SessionRow, Store, SummaryRow
from ..store._text import fts_query_terms
from ..types import Hit, MemoryContext, Message, RecallConfig
from ._format import format_context
from ._fusion import rrf, score_fusion
from ._tokens import estimate_tokens

__all__ = ["Recaller", "estimate_tokens", "message_from_row", "parse_ts"]

Fusion = Literal["rrf", "score"]


def message_from_row(row: MessageRow) -> Message:
    return Message(
        id=row.id,
        project_id=row.project_id,
        user_id=row.user_id,
        session_id=row.session_id,
        role=row.role,
        content=row.content,
        timestamp=parse_ts(row.ts),  # type: ignore[arg-type]
        event_type=row.event_type,
        page=row.page,
        process_id=row.process_id,
        metadata=row.metadata,
        status=row.status,
        error=row.error,  # type: ignore[arg-type]
        attempts=row.attempts,
        created_at=parse_ts(row.created_at),  # type: ignore[arg-type]
        processed_at=parse_ts(row.processed_at),
    )


def _hit(row: MessageRow, score: float, signals: dict[str, float]) -> Hit:
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
        event_type=row.event_type,
        metadata=row.metadata,
        signals=signals,
    )


def _summary_hit(row: SummaryRow, score: float, signals: dict[str, float]) -> Hit:
    return Hit(
        layer="summary",
        id=row.id,
        text=row.text,
        score=score,
        message_ids=row.message_ids,
        user_id=row.user_id,
        timestamp=parse_ts(row.observed_at or row.updated_at),
        metadata={"status": row.status, "confidence": row.confidence, "version": row.version},
        signals=signals,
    )


class Recaller:
    def __init__(self, store: Store, embedder: Embedder, *, fusion: Fusion = "rrf") -> None:
        self.store = store
        self.embedder = embedder
        self.fusion = fusion
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

    def search(
        self,
        project_id: str,
        user_id: str,
        query: str,
        *,
        limit: int,
        filters: SearchFilters,
        rrf_k: int = 60,
        min_similarity: float = 0.0,
        exclude: Sequence[str] = (),
        layers: Sequence[str] = ("summary", "message"),
    ) -> list[Hit]:
        """Hybrid search over the layers named, fused into one ranking.

        Summaries take part only when no message-level filter (session, role, event type,
        time, metadata) is given, since those filters describe messages.
        """
        if limit <= 0 or not query.strip():
            return []
        # Fetch more candidates than asked so fusion has overlap to work with.
        candidates = max(20, limit * 3) + len(exclude)
        terms = fts_query_terms(query)
        summaries_too = "summary" in layers and filters.empty

        def fulltext() -> dict[str, list[tuple[tuple[str, int], float]]]:
            out = {}
            if "message" in layers:
                out["message.fulltext"] = [
                    (("message", pk), s)
                    for pk, s in self.store.fulltext_messages(
                        project_id, user_id, terms, candidates, filters
                    )
                ]
            if summaries_too:
                out["summary.fulltext"] = [
                    (("summary", pk), s)
                    for pk, s in self.store.fulltext_summaries(
                        project_id, user_id, terms, candidates
                    )
                ]
            return out

        # Full text (SQLite) and the query embedding (onnxruntime) both release the GIL and
        # use different resources: run them side by side.
        pending = self._executor().submit(fulltext)
        qvec = self.embedder.embed([query])[0]
        # A non-positive cosine means "unrelated" for every embedder we ship: never a match.
        floor = max(min_similarity, 1e-6)
        lists: dict[str, list[tuple[tuple[str, int], float]]] = {}
        if "message" in layers:
            vector = self.store.vector_messages(
                project_id, user_id, qvec, self.embedder.id, candidates, filters
            )
            lists["message.vector"] = [(("message", pk), s) for pk, s in vector if s >= floor]
        if summaries_too:
            vector = self.store.vector_summaries(
                project_id, user_id, qvec, self.embedder.id, candidates
            )
            lists["summary.vector"] = [(("summary", pk), s) for pk, s in vector if s >= floor]
        lists.update(pending.result())
        fused = rrf(lists, k=rrf_k) if self.fusion == "rrf" else score_fusion(lists)
        signals: dict[tuple[str, int], dict[str, float]] = {}
        for name, ranked in lists.items():
            retriever = name.split(".", 1)[1]
            for rank, (key, s) in enumerate(ranked, start=1):
                signals.setdefault(key, {})[retriever] = round(float(s), 6)
                signals[key][f"{retriever}_rank"] = float(rank)
        head = fused[: limit + len(exclude)]
        messages = self.store.messages_by_pk([pk for (layer, pk), _ in head if layer == "message"])
        summaries = self.store.summaries_by_pk(
            [pk for (layer, pk), _ in head if layer == "summary"]
        )
        skip = set(exclude)
        hits = []
        for key, score in head:
            layer, pk = key
            if layer == "message":
                row = messages.get(pk)
                if row is None or row.id in skip:
                    continue
                hits.append(_hit(row, round(score, 6), signals.get(key, {})))
            else:
                summary = summaries.get(pk)
                if summary is None:
                    continue
                if summary.status == "deprioritized":
                    score *= 0.5
                hits.append(_summary_hit(summary, round(score, 6), signals.get(key, {})))
        hits.sort(key=lambda h: -h.score)
        return hits[:limit]

    def context(
        self,
        *,
        project_id: str,
        session: SessionRow,
        query: str | None,
        config: RecallConfig,
        filters: SearchFilters,
        details: bool,
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
        history = [message_from_row(r) for r in reversed(history_rows)]
        matches: list[Hit] = []
        if query and query.strip() and config.enable_long_term_recall:
            matches = self.search(
                project_id,
                session.user_id,
                query,
                limit=config.message_semantic_top_k,
                filters=filters,
                rrf_k=config.long_term_rrf_k,
                min_similarity=config.message_semantic_min_score,
                exclude=[m.id for m in history],
            )
        text, tokens = format_context(matches, history, config.token_budget)
        return MemoryContext(
            project_id=project_id,
            user_id=session.user_id,
            session_id=session.id,
            query=query,
            history=history,
            formatted_context=text,
            token_estimate=tokens,
            matches=matches if details else None,
        )
