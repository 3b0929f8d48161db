"""Second-stage reranking of the fused candidates (``enable_long_term_rerank``).

With a chat model configured, the model orders the head of the ranking by how directly
each item answers the query. Offline, or when the model fails, a local scorer re-scores the
head by query-term coverage: the share of the query's content terms (Porter-like stems)
that the item's text contains, so an item that mentions every part of the question rises
above one that matches a single rare word. Either way only the first ``depth`` items move;
the rest keep their fused order behind them.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .._speakers import without_speaker
from ..llm import ChatModel, complete_json
from ..store._text import fts_query_terms

if TYPE_CHECKING:
    from ._scoring import Key, Scored

__all__ = ["COVERAGE_WEIGHT", "coverage", "rerank"]

log = logging.getLogger("stratamem.recall")

COVERAGE_WEIGHT = 0.3
_WORD = re.compile(r"\w+", re.UNICODE)
_SUFFIXES = ("ing", "ed", "es", "s", "ly")

RERANK_PROMPT = (
    "You rank memories by how directly they help answer a question about a user. "
    'Answer with JSON {"order": [numbers]}: the numbers of the useful memories, most useful '
    "first. Leave out memories that do not help."
)
_SCHEMA = {
    "type": "object",
    "properties": {"order": {"type": "array", "items": {"type": "integer"}}},
    "required": ["order"],
    "additionalProperties": False,
}


def _stem(word: str) -> str:
    w = word.casefold()
    for suffix in _SUFFIXES:
        if len(w) > len(suffix) + 2 and w.endswith(suffix):
            return w[: -len(suffix)]
    return w


def coverage(query_terms: Sequence[str], text: str) -> float:
    """Share of ``query_terms`` whose stem occurs in ``text`` (0 when there are none)."""
    if not query_terms:
        return 0.0
    words = {_stem(w) for w in _WORD.findall(text)}
    wanted = {_stem(t) for t in query_terms}
    return sum(1 for t in wanted if t in words) / len(wanted)


def _text(item: Scored) -> str:
    row = item.row
    name = getattr(row, "name", None)
    body = str(getattr(row, "content", None) or getattr(row, "text", ""))
    return f"{name}: {without_speaker(body, name)}" if name else body


def _local(ranked: list[tuple[Key, Scored]], query: str, depth: int) -> list[tuple[Key, Scored]]:
    terms = [t for t in fts_query_terms(query) if _WORD.fullmatch(t)]
    head, tail = ranked[:depth], ranked[depth:]
    rescored = []
    for key, item in head:
        c = coverage(terms, _text(item))
        item.signals["coverage"] = round(c, 6)
        rescored.append((item.score + COVERAGE_WEIGHT * c, key, item))
    rescored.sort(key=lambda r: (-r[0], r[1]))
    for s, _, item in rescored:
        item.score = s
    return [(key, item) for _, key, item in rescored] + tail


def _llm(
    ranked: list[tuple[Key, Scored]], query: str, chat: ChatModel, depth: int
) -> list[tuple[Key, Scored]]:
    head, tail = ranked[:depth], ranked[depth:]
    lines = [f"{i}. {' '.join(_text(item).split())[:300]}" for i, (_, item) in enumerate(head, 1)]
    user = f"Question: {query}\n\nMemories:\n" + "\n".join(lines)

    def validate(obj: dict[str, Any]) -> list[int]:
        order = obj.get("order")
        if not isinstance(order, list) or not all(
            isinstance(i, int) and 1 <= i <= len(head) for i in order
        ):
            raise ValueError(f'"order" must list numbers from 1 to {len(head)}')
        return list(dict.fromkeys(order))

    order, _ = complete_json(
        chat, RERANK_PROMPT, user, schema=_SCHEMA, validate=validate, max_tokens=400
    )
    chosen = [head[i - 1] for i in order]
    rest = [pair for i, pair in enumerate(head, 1) if i not in set(order)]
    top = max((item.score for _, item in head), default=0.0)
    # Scores follow the model's order (above every item it left out), so callers that sort
    # by score agree with it.
    for rank, (_, item) in enumerate(chosen):
        item.signals["llm_rank"] = float(rank + 1)
        item.score = top + (len(chosen) - rank) * 1e-3
    return chosen + rest + tail


def rerank(
    ranked: list[tuple[Key, Scored]], query: str, *, chat: ChatModel | None, depth: int
) -> list[tuple[Key, Scored]]:
    """Rerank the head of ``ranked`` ((key, scored item) pairs, best first)."""
    if chat is not None:
        try:
            return _llm(ranked, query, chat, depth)
        except Exception as exc:  # a failing model must never fail recall
            log.warning("LLM rerank failed, using the local scorer: %s", exc)
    return _local(ranked, query, depth)
