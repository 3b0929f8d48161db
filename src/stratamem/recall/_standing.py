"""Which of the user's standing instructions and preferences apply to a request.

A request in an instruction's scope rarely names it ("How do I manage errors in async
code?" does not say "always give me a code example"), so similarity search misses it. Here
every current standing item of the user (``Store.standing_facts``: active, not retired by
a newer one on its scope nor by an operator) is a candidate, and (docs/recall.md,
"Standing instructions"):

- a **scoped** one applies when it is close to the request (the cosine of the request with
  its scope or with its whole text, whichever is higher, >= ``SCOPE_MIN_SIMILARITY``;
  ``SEARCH_MIN_SIMILARITY`` for search): the closest ``MAX_SCOPED``;
- a **general** one (no scope: "I'm vegetarian", "keep answers short") always applies: the
  ``MAX_GENERAL`` closest to the request, the newest first among equals.

``get_memory`` lists them in their own section of the block, within
``STANDING_TOKEN_SHARE`` of its token budget (``_format.fit_instructions``); ``search``
puts the scoped ones that apply first among its hits (``with_standing``).

The vectors of scopes and of general items' texts are remembered per embedder (a bounded
LRU): a user's items are few and change rarely, so a recall embeds only the request, in
the same call as any item not seen before.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np

from .._time import parse_iso
from ..embed import Embedder
from ..store import FactRow, LayerStore, StandingFact
from ..types import Hit

__all__ = [
    "MAX_GENERAL",
    "MAX_SCOPED",
    "SCOPE_MIN_SIMILARITY",
    "SEARCH_MIN_SIMILARITY",
    "STANDING_TOKEN_SHARE",
    "Applicable",
    "TextVectors",
    "applicable",
    "read_standing",
    "with_standing",
]

# Calibrated on the local MiniLM model: BEAM's instructions ("... when I ask about meeting
# schedules") against its questions: the instruction's own questions score 0.5-0.9, other
# questions' best unrelated scope mostly 0.2-0.45.
SCOPE_MIN_SIMILARITY = 0.45
# Search is stricter: what it puts first reorders the ranking every caller gets.
SEARCH_MIN_SIMILARITY = 0.5
MAX_SCOPED = 3
MAX_GENERAL = 2
# Standing items take at most this share of get_memory's token budget: the rest of memory
# keeps its room however many instructions a user gave.
STANDING_TOKEN_SHARE = 0.25
# A user's standing items read per recall, newest first.
STANDING_READ = 200
_CACHE_SIZE = 8192


@dataclass(frozen=True)
class Applicable:
    """A standing item that applies to the request, and how close it is to it."""

    fact: FactRow
    summary_id: str | None
    similarity: float


class TextVectors:
    """Vectors of short texts (scopes, general items), remembered per embedder: an LRU of
    at most ``size`` texts, safe across threads."""

    def __init__(self, embedder: Embedder, size: int = _CACHE_SIZE) -> None:
        self.embedder = embedder
        self.size = size
        self._known: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def embed(
        self, query: str, texts: Sequence[str], *, embedder: Embedder | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The vector of ``query`` (not remembered) and those of ``texts``, in one call to
        the embedder for the query and every text not remembered. ``embedder``: the
        recall's (``RecallEmbedder``), which has the query's vector already; by default
        this one's own."""
        key = self.embedder.id
        with self._lock:
            known = {}
            for text in dict.fromkeys(texts):
                if (key, text) in self._known:
                    self._known.move_to_end((key, text))
                    known[text] = self._known[(key, text)]
        missing = [t for t in dict.fromkeys(texts) if t not in known]
        vectors = (embedder or self.embedder).embed([query, *missing])
        known.update(zip(missing, vectors[1:], strict=True))
        with self._lock:
            for text in missing:
                self._known[(key, text)] = known[text]
            while len(self._known) > self.size:
                self._known.popitem(last=False)
        rows = np.asarray([known[t] for t in texts], dtype=np.float32)
        return vectors[0], rows.reshape(len(texts), int(vectors.shape[1]))


def _said_by(item: StandingFact, as_of: datetime | None) -> bool:
    """Whether the item was said at or before ``as_of`` (a question asked back then does
    not know what the user said later)."""
    if as_of is None:
        return True
    said = parse_iso(item.fact.observed_at or item.fact.created_at)
    return said is None or said <= as_of


def read_standing(store: LayerStore, project_id: str, user_id: str) -> list[StandingFact]:
    """The user's standing items that ``applicable`` chooses from."""
    return store.standing_facts(project_id, user_id, limit=STANDING_READ)


def applicable(
    read: Callable[[], Sequence[StandingFact]],
    vectors: TextVectors,
    query: str,
    *,
    as_of: datetime | None = None,
    general: bool = True,
    minimum: float = SCOPE_MIN_SIMILARITY,
    embedder: Embedder | None = None,
) -> list[Applicable]:
    """The user's standing items (``read()``, see ``read_standing``) that apply to
    ``query``: the scoped ones at least ``minimum`` close first (closest first), then, if
    ``general``, the general ones (see the module docstring). ``embedder``: the recall's,
    which has embedded ``query`` already (``TextVectors.embed``)."""
    items = [s for s in read() if _said_by(s, as_of) and (general or s.fact.scope)]
    if not items or not query.strip():
        return []
    texts = [s.fact.text for s in items]
    scopes = [s.fact.scope for s in items if s.fact.scope]
    q, rows = vectors.embed(query, [*texts, *scopes], embedder=embedder)
    similarity = rows[: len(texts)] @ q
    # A scoped item is as close as its scope or its text, whichever is closer: the scope
    # alone ("performance metrics") misses requests its whole text is near, and the other
    # way round (on BEAM the maximum told an item's own requests from others best).
    by_scope = iter(rows[len(texts) :] @ q)
    similarity = np.array(
        [
            max(float(t), float(next(by_scope))) if s.fact.scope else float(t)
            for s, t in zip(items, similarity, strict=True)
        ]
    )
    ranked = sorted(range(len(items)), key=lambda i: (-similarity[i], -items[i].fact.pk))
    scoped: list[Applicable] = []
    unscoped: list[Applicable] = []
    # One item said twice ("I'm allergic to peanuts" in two conversations) is two facts of
    # one summary: it applies once, as its closest fact.
    seen: set[str] = set()
    for i in ranked:
        item, sim = items[i], float(similarity[i])
        said = item.summary_id or " ".join(item.fact.text.casefold().split())
        if said in seen:
            continue
        seen.add(said)
        if item.fact.scope:
            if sim >= minimum and len(scoped) < MAX_SCOPED:
                scoped.append(Applicable(item.fact, item.summary_id, sim))
        elif len(unscoped) < MAX_GENERAL:
            unscoped.append(Applicable(item.fact, item.summary_id, sim))
    return scoped + unscoped


def _standing_hit(item: Applicable, score: float) -> Hit:
    """A standing item as a search hit (its fact), marked as such."""
    f = item.fact
    return Hit(
        layer="fact",
        id=f.id,
        text=f.text,
        score=score,
        message_ids=list(f.message_ids),
        user_id=f.user_id,
        timestamp=parse_iso(f.occurred_at or f.observed_at or f.created_at),
        metadata={
            "status": f.status,
            "kind": f.kind,
            "confidence": f.confidence,
            "standing": True,
            "scope": f.scope,
        },
        signals={"standing": round(item.similarity, 6)},
    )


def with_standing(hits: list[Hit], items: Sequence[Applicable], limit: int) -> list[Hit]:
    """``hits`` with the standing ``items`` that apply first (at the best hit's score),
    each listed once: the hit of its fact or of the summary holding it gives way."""
    if not items:
        return hits
    covered = {i.fact.id for i in items} | {i.summary_id for i in items if i.summary_id}
    best = hits[0].score if hits else 1.0
    rest = [h for h in hits if not (h.layer in ("fact", "summary") and h.id in covered)]
    return [_standing_hit(i, best) for i in items][:limit] + rest[: max(0, limit - len(items))]
