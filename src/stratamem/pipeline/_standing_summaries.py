"""How a batch's standing facts become summaries, by rule, with or without an LLM.

A standing instruction or preference (docs/recall.md#standing-instructions) is one memory:
its own summary, never merged with other facts (so retiring it retires nothing else), and
compared only with the user's current standing items of the same kind:

- it **restates** one (the same scope, or both for every request, and nearly the same
  words: cosine >= ``RESTATED_SIMILARITY`` of what is asked): that summary is
  strengthened;
- it **changes** one on the same scope (scopes' cosine >= ``SAME_SCOPE_SIMILARITY``; two
  items for every request count as one scope): it says the same thing differently
  (cosine >= ``CHANGED_SIMILARITY`` of what is asked: the text without the scope and
  without "User asks to always ... when User asks about"), turns it around
  (always / never, do / don't), or says it changes it ("instead", "no longer", "now",
  ``heuristics.is_correction``) about the same thing (cosine >= ``RELATED_SIMILARITY``):
  it supersedes that summary, whose facts are retired,
  so the older instruction never comes back;
- otherwise it is added: two instructions on one scope that add to each other ("include a
  deployment checklist", "confirm the deployment with a status message") both stand.

The thresholds are cosines of the local MiniLM model, like the pipeline's own.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .._checks import new_id
from ..embed import Embedder
from ..store import ClaimedBatch, FactWrite, LayerStore, SummaryRow, SummaryWrite
from . import _heuristics as heuristics
from .prompts import HEURISTIC_VERSION

__all__ = [
    "CHANGED_SIMILARITY",
    "RESTATED_SIMILARITY",
    "SAME_SCOPE_SIMILARITY",
    "standing_summaries",
]

SAME_SCOPE_SIMILARITY = 0.8
CHANGED_SIMILARITY = 0.7
# Nearly the same words: "I'm vegan" (0.88 to "I'm vegetarian") changes the item.
RESTATED_SIMILARITY = 0.92
# Turned around or said to change, it still has to be about the same thing.
RELATED_SIMILARITY = 0.45
# A user's standing items a batch compares its own with, newest first.
COMPARED = 500
RULES = "heuristic"

_NEGATION = re.compile(
    r"\b(?:never|not|no|don['’]t|doesn['’]t|avoid|stop|without|nor)\b|不要|别|不用|不再|没有", re.I
)


@dataclass
class _Item:
    """A current standing item: stored (its summary) or written by this batch."""

    kind: str
    scoped: bool
    text: str
    scope_vector: np.ndarray | None
    asked: np.ndarray  # what is asked, the scope left out
    summary_id: str
    write: SummaryWrite | None  # set when this batch writes the summary
    row: SummaryRow | None  # set when the summary is stored


# The words every instruction shares ("User asks to always ... when User asks about"):
# left in, they make any two instructions look alike.
_ASKS = re.compile(r"^\S+\s+asks\s+(?:not\s+|never\s+)?to\s+(?:always\s+|never\s+)?", re.I)
_WHEN_ASKED = re.compile(
    r"\b(?:when|whenever|if|before|after)\s+\S+\s+(?:asks?|asking|talks?)\s+"
    r"(?:about|for|regarding|on)\b",
    re.I,
)


def _asked(text: str, scope: str | None) -> str:
    """What an item asks, compared apart from where: its text without its scope and
    without the words every instruction shares."""
    if scope:
        text = re.sub(re.escape(scope), " ", text, flags=re.I)
    text = _ASKS.sub("", _WHEN_ASKED.sub(" ", text))
    return " ".join(text.split()).strip(" .") or text


def _flipped(a: str, b: str) -> bool:
    return bool(_NEGATION.search(a)) != bool(_NEGATION.search(b))


def standing_summaries(
    store: LayerStore,
    embedder: Embedder,
    batch: ClaimedBatch,
    facts: Sequence[FactWrite],
) -> list[SummaryWrite]:
    """The summary changes of the batch's standing ``facts`` (see the module docstring), in
    order: a later fact of the batch builds on what an earlier one wrote."""
    if not facts:
        return []
    held = [
        s
        for s in store.standing_facts(batch.project_id, batch.user_id, limit=COMPARED)
        if s.summary_id is not None
    ]
    rows = {
        r.id: r
        for r in store.get_summaries(
            batch.project_id, sorted({s.summary_id for s in held if s.summary_id})
        )
    }
    held = [s for s in held if s.summary_id in rows]
    # One embedder call for every scope and every "what is asked" compared.
    texts: list[str] = []
    said: list[tuple[str, str | None]] = [(s.fact.text, s.fact.scope) for s in held]
    for text, scope in [*said, *((f.text, f.scope) for f in facts)]:
        texts.append(_asked(text, scope))
        if scope:
            texts.append(scope)
    vectors = iter(embedder.embed(texts)) if texts else iter(())
    items: list[_Item] = []
    seen: set[str] = set()
    for s in held:
        asked = next(vectors)
        scope_vector = next(vectors) if s.fact.scope else None
        assert s.summary_id is not None
        if s.summary_id in seen:
            continue  # one item per summary: its newest fact speaks for it
        seen.add(s.summary_id)
        items.append(
            _Item(
                s.fact.kind,
                bool(s.fact.scope),
                s.fact.text,
                scope_vector,
                asked,
                s.summary_id,
                None,
                rows[s.summary_id],
            )
        )
    writes: list[SummaryWrite] = []
    strengthened: dict[str, SummaryWrite] = {}
    for f in facts:
        asked = next(vectors)
        scope_vector = next(vectors) if f.scope else None
        target, restated = _match(f, asked, scope_vector, items)
        if target is not None and restated:
            _strengthen(f, target, writes, strengthened)
            continue
        supersedes = target.summary_id if target is not None else None
        write = SummaryWrite(
            action="supersede" if supersedes else "add",
            id=new_id("s"),
            text=f.text,
            confidence=f.confidence,
            fact_ids=[f.id],
            message_ids=list(f.message_ids),
            model=RULES,
            prompt_version=HEURISTIC_VERSION,
            reason=(
                f"standing instruction {f.id} changes it"
                if supersedes
                else f"standing instruction {f.id}"
            ),
            vector=f.vector,
            supersedes=supersedes,
            valid_from=f.valid_from or f.occurred_at,
            valid_to=f.valid_to,
            labels=[f.kind],
            standing=True,
        )
        writes.append(write)
        if target is not None:
            items.remove(target)
        items.append(
            _Item(f.kind, bool(f.scope), f.text, scope_vector, asked, write.id, write, None)
        )
    return writes


def _match(
    f: FactWrite, asked: np.ndarray, scope_vector: np.ndarray | None, items: Sequence[_Item]
) -> tuple[_Item | None, bool]:
    """The current item ``f`` restates (True) or changes (False), if any; the closest one
    in what it asks wins."""
    best: tuple[float, _Item] | None = None
    for item in items:
        if item.kind != f.kind or item.scoped != bool(f.scope):
            continue
        if (
            scope_vector is not None
            and item.scope_vector is not None
            and float(scope_vector @ item.scope_vector) < SAME_SCOPE_SIMILARITY
        ):
            continue  # another scope
        similarity = float(asked @ item.asked)
        if best is None or similarity > best[0]:
            best = (similarity, item)
    if best is None:
        return None, False
    similarity, item = best
    if similarity >= RESTATED_SIMILARITY and not _flipped(f.text, item.text):
        return item, True
    turned = _flipped(f.text, item.text) or heuristics.is_correction(f.text)
    changed = similarity >= CHANGED_SIMILARITY or (turned and similarity >= RELATED_SIMILARITY)
    return (item, False) if changed else (None, False)


def _strengthen(
    f: FactWrite, target: _Item, writes: list[SummaryWrite], done: dict[str, SummaryWrite]
) -> None:
    """``f`` says again what ``target`` says: its summary gains ``f`` as evidence."""
    write = target.write or done.get(target.summary_id)
    if write is None:
        row = target.row
        assert row is not None  # an item is either written here or stored
        write = SummaryWrite(
            action="strengthen",
            id=row.id,
            text=row.text,
            confidence=row.confidence,
            fact_ids=[],
            message_ids=[],
            model=RULES,
            prompt_version=HEURISTIC_VERSION,
            reason=f"restated by standing instruction {f.id}",
        )
        writes.append(write)
        done[row.id] = write
    write.fact_ids.append(f.id)
    write.message_ids.extend(m for m in f.message_ids if m not in write.message_ids)
    write.confidence = round(1.0 - (1.0 - write.confidence) * (1.0 - f.confidence), 4)
