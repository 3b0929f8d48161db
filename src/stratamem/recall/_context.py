"""Stage 6, for ``get_memory``: assembly of the context a prompt receives.

The session's recent turns, the search's hits (each layer within its cap, none far weaker
than the best), the topics the summaries found belong to, the source messages quoted under
each item, the facts the hits rest on and the user's latest facts, formatted within the
token budget by ``_format``.
An item another one stands for (a fact its summary covers, a message an item quotes) is not
listed twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from .._time import parse_iso
from ..store import FactRow, SessionRow, SummaryRow
from ..types import Hit, MemoryContext, Message, RecallConfig, Topic
from ._format import fit_instructions, format_context
from ._plan import SearchOptions, search_options
from ._retrieve import RecallStore, StoredRow
from ._rows import fact_from_row, message_from_row, topic_from_row
from ._select import carried
from ._standing import STANDING_TOKEN_SHARE, Applicable

__all__ = ["CONTEXT_MIN_SHARE", "Search", "Standing", "assemble", "carried_texts"]

# get_memory leaves out matches scoring below this share of the best one.
CONTEXT_MIN_SHARE = 0.3


class Search(Protocol):
    """The search stages for one user (``Recaller.search`` with the scope bound)."""

    def __call__(
        self,
        query: str,
        *,
        limit: int,
        options: SearchOptions,
        exclude: Sequence[str],
        rows: dict[str, StoredRow],
        carried: frozenset[str],
    ) -> list[Hit]: ...


class Standing(Protocol):
    """The user's standing items that apply to a query (``_standing.applicable`` with the
    user bound)."""

    def __call__(self, query: str) -> list[Applicable]: ...


def carried_texts(texts: Sequence[str]) -> frozenset[str]:
    """``get_memory``'s ``exclude_texts`` as they are compared: stripped, blanks dropped."""
    return frozenset(t for t in (x.strip() for x in texts) if t)


def _matches(
    search: Search,
    query: str,
    config: RecallConfig,
    exclude: Sequence[str],
    found: dict[str, StoredRow],
    texts: frozenset[str],
) -> list[Hit]:
    """The search's hits, each layer within its cap and none far weaker than the best."""
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
    if not layers:
        return []
    hits = search(
        query,
        limit=sum(caps.values()),
        options=search_options(config, layers=layers, min_similarity=floors),
        exclude=exclude,
        rows=found,
        carried=texts,
    )
    taken = dict.fromkeys(caps, 0)
    best = hits[0].score if hits else 0.0
    matches = []
    for hit in hits:
        if hit.signals.get("superseded") and not config.include_superseded:
            continue
        # Far weaker than the best match: noise that would only spend the budget.
        if hit.score < CONTEXT_MIN_SHARE * best or taken[hit.layer] >= caps[hit.layer]:
            continue
        taken[hit.layer] += 1
        matches.append(hit)
    return matches


def _evidence(
    store: RecallStore,
    project_id: str,
    matches: Sequence[Hit],
    per_item: int,
    texts: frozenset[str],
) -> dict[str, list[Message]]:
    """Source messages quoted under each summary and fact (best-matching first), less
    those the prompt carries: as many more are read as could be left out."""
    out: dict[str, list[Message]] = {}
    if per_item <= 0:
        return out
    read = per_item + len(texts)
    quoted = {h.id: h.message_ids[:read] for h in matches if h.layer != "message"}
    rows = store.get_messages(project_id, sorted({m for ids in quoted.values() for m in ids}))
    for item, ids in quoted.items():
        kept = [rows[m] for m in ids if m in rows and not carried(rows[m], texts)]
        out[item] = [message_from_row(r) for r in kept[:per_item]]
    return out


def _answer_facts(
    store: RecallStore,
    project_id: str,
    matches: Sequence[Hit],
    found: dict[str, StoredRow],
    config: RecallConfig,
) -> list[FactRow]:
    """The facts the answer rests on, in the order of its hits, at most
    ``observation_semantic_top_k``: each matched fact, and the facts of each matched summary
    (the search lists a summary in place of the facts it states: it says what they say, so
    without them a summary drawn from statements would leave ``facts`` empty)."""
    wanted: list[str] = []
    for hit in matches:
        row = found[hit.id]
        if isinstance(row, FactRow):
            wanted.append(row.id)
        elif isinstance(row, SummaryRow):
            wanted.extend(row.fact_ids)
    wanted = list(dict.fromkeys(wanted))[: config.observation_semantic_top_k]
    rows = {r.id: r for r in found.values() if isinstance(r, FactRow)}
    restated = [f for f in wanted if f not in rows]
    for r in store.get_facts(project_id, restated) if restated else []:
        if r.status != "superseded" or config.include_superseded:
            rows[r.id] = r
    return [rows[f] for f in wanted if f in rows]


def assemble(
    store: RecallStore,
    search: Search,
    *,
    project_id: str,
    session: SessionRow,
    query: str | None,
    config: RecallConfig,
    details: bool,
    texts: frozenset[str],
    standing: Standing | None = None,
) -> MemoryContext:
    """``get_memory``'s context; ``search`` runs the search stages for the session's user,
    ``standing`` (None: none apply, as without a query or with long-term recall off) finds
    their standing items that apply, ``texts`` are those the prompt carries already."""
    history_rows = (
        store.list_messages(
            project_id,
            session_id=session.id,
            limit=config.message_recent_limit,
            newest_first=True,
        )
        if config.message_recent_limit
        else []
    )
    # The last message_recent_limit turns, less those the prompt carries (no older turns come
    # in instead: the history is the session's latest turns).
    history = [message_from_row(r) for r in reversed(history_rows) if not carried(r, texts)]
    user_id = session.user_id
    found: dict[str, StoredRow] = {}  # stored rows of the hits, not read twice
    matches: list[Hit] = []
    if query and query.strip() and config.enable_long_term_recall:
        matches = _matches(search, query, config, [r.id for r in history_rows], found, texts)
    # (A hit's row is of its layer's type.)
    summary_rows = [
        r for h in matches if h.layer == "summary" and isinstance(r := found[h.id], SummaryRow)
    ]
    topics_of = store.topics_of_summaries([r.pk for r in summary_rows])
    by_summary = {r.id: [topic_from_row(t) for t in topics_of.get(r.pk, [])] for r in summary_rows}
    topic_rank: dict[str, tuple[float, Topic]] = {}
    for hit in matches:
        for topic in by_summary.get(hit.id, []):
            best = topic_rank.get(topic.id, (0.0, topic))[0]
            topic_rank[topic.id] = (best + hit.score, topic)
    topics = [t for _, t in sorted(topic_rank.values(), key=lambda x: (-x[0], x[1].name))][
        : config.topic_top_k
    ]
    # Each topic lists the summaries of this answer filed under it, best first (the store
    # reads a summary's topics without their members; a topic's own page lists them all).
    for topic in topics:
        topic.summary_ids = [s for s, ts in by_summary.items() if any(t.id == topic.id for t in ts)]
    evidence = _evidence(store, project_id, matches, config.observation_context_top_k, texts)
    fact_rows = _answer_facts(store, project_id, matches, found, config)
    if config.observation_recent_limit:
        known = {r.id for r in fact_rows}
        fact_rows += [
            r
            for r in store.list_facts(
                project_id, user_id, limit=config.observation_recent_limit, newest_first=True
            )
            if r.id not in known
        ]
    # The caller passes ``standing`` only where it applies (a query, long-term recall on): it
    # has started reading the items by then.
    applicable = standing(query) if standing is not None and query is not None else []
    lines = fit_instructions(
        [(a.fact.text, parse_iso(a.fact.observed_at or a.fact.created_at)) for a in applicable],
        int(config.token_budget * STANDING_TOKEN_SHARE),
    )
    instructions = [a for a, _ in zip(applicable, lines, strict=False)]
    # A standing item listed in its own section is not listed again as a match.
    listed = {a.fact.id for a in instructions} | {a.summary_id for a in instructions}
    shown_topics = {t.id for t in topics}
    groups = {sid: [t.name for t in ts if t.id in shown_topics] for sid, ts in by_summary.items()}
    # A summary stands for its facts and quotes its messages; a fact quotes its messages: the
    # covered items are not listed again.
    covered_facts = {f for r in summary_rows for f in r.fact_ids}
    covered_messages = {m for h in matches if h.layer != "message" for m in h.message_ids}
    shown = [
        h
        for h in matches
        if not (h.layer == "fact" and h.id in covered_facts)
        and not (h.layer == "message" and h.id in covered_messages)
        and not (h.layer != "message" and h.id in listed)
    ]
    text, tokens = format_context(
        shown, history, config.token_budget, topics=groups, evidence=evidence, instructions=lines
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
        instructions=[fact_from_row(a.fact) for a in instructions],
    )
