"""``formatted_context``: a compact, dated, deterministic block within a token budget.

Layout (sections appear only when they have lines)::

    Memory about the user (current first, dated):
    ## <topic>
    - [2023-05-08] <summary>
      > "<quoted source message>" (Caroline, 2023-05-07)
    ## Other
    - [2023-05-08] <fact or message>

    Recent conversation in this session:
    - [2023-05-08 14:02] user: ...

Items are admitted by relevance until the budget is spent, then shown grouped by topic
(groups in order of their best item), summaries before facts before messages, superseded
items (only present on request) last and marked, newest first within a kind.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from ..types import Hit, Message
from ._tokens import estimate_tokens, truncate_to_tokens

__all__ = ["format_context"]

MEMORY_HEADER = "Memory about the user (current first, dated):"
HISTORY_HEADER = "Recent conversation in this session:"
OTHER_GROUP = "Other"
_MAX_ITEM_TOKENS = 80
_MAX_QUOTE_TOKENS = 30
_LAYER_ORDER = {"summary": 0, "fact": 1, "message": 2}


def _day(ts: datetime | None) -> str:
    return ts.date().isoformat() if ts else "undated"  # %Y would not pad years before 1000


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _who(role: str | None, name: str | None, event_type: str | None) -> str:
    if event_type:
        return f"event {event_type}"
    return name or role or "user"


def _prefix(hit: Hit) -> str:
    mark = " (superseded)" if _superseded(hit) else ""
    if hit.layer != "message":
        return f"- [{_day(hit.timestamp)}]{mark} "
    return f"- [{_day(hit.timestamp)}]{mark} {_who(hit.role, hit.name, hit.event_type)}: "


def _superseded(hit: Hit) -> bool:
    if hit.layer == "message":
        return bool(hit.signals.get("superseded"))
    return hit.metadata.get("status") == "superseded"


def _quote(msg: Message, room: int) -> str:
    who = _who(msg.role, msg.name, msg.event_type)
    text = truncate_to_tokens(_one_line(msg.content), min(room, _MAX_QUOTE_TOKENS))
    return f'  > "{text}" ({who}, {_day(msg.timestamp)})'


def _history_line(msg: Message) -> str:
    who = _who(msg.role, msg.name, msg.event_type)
    return f"- [{_day(msg.timestamp)} {msg.timestamp:%H:%M}] {who}: "


def format_context(
    matches: Sequence[Hit],
    history: Sequence[Message],
    budget: int,
    *,
    topics: Mapping[str, Sequence[str]] | None = None,
    evidence: Mapping[str, Sequence[Message]] | None = None,
) -> tuple[str, int]:
    """Render memories and the session's recent turns within ``budget`` tokens.

    ``topics`` maps a summary id to the names of the topics shown (the first one groups
    it); ``evidence`` maps a summary or fact id to source messages quoted under it.
    Returns (text, estimated tokens).
    """
    topics = topics or {}
    evidence = evidence or {}
    used = 0
    chosen: list[tuple[Hit, list[str]]] = []
    quoted: set[str] = set()
    headers: set[str] = set()
    if matches:
        used += estimate_tokens(MEMORY_HEADER) + 1
        for hit in matches:
            if hit.layer == "message" and hit.id in quoted:
                continue  # already shown as the evidence of a summary or fact
            group = (topics.get(hit.id) or [OTHER_GROUP])[0]
            header_cost = 0 if group in headers else estimate_tokens(f"## {group}") + 1
            prefix = _prefix(hit)
            room = min(_MAX_ITEM_TOKENS, budget - used - header_cost - estimate_tokens(prefix) - 1)
            if room < 8:
                break
            lines = [prefix + truncate_to_tokens(_one_line(hit.text), room)]
            cost = header_cost + estimate_tokens(lines[0]) + 1
            for msg in evidence.get(hit.id, []):
                if msg.id in quoted or _one_line(msg.content) == _one_line(hit.text):
                    continue
                room = budget - used - cost - 4
                if room < 8:
                    break
                line = _quote(msg, room)
                cost += estimate_tokens(line) + 1
                lines.append(line)
                quoted.add(msg.id)
            used += cost
            headers.add(group)
            chosen.append((hit, lines))
        if not chosen:
            used = 0
    kept: list[tuple[Message, str]] = []
    if history:
        header = estimate_tokens(HISTORY_HEADER) + 1
        if used + header + 8 <= budget:
            used += header
            for msg in reversed(history):
                prefix = _history_line(msg)
                room = min(_MAX_ITEM_TOKENS, budget - used - estimate_tokens(prefix) - 1)
                if room < 8:
                    break
                line = prefix + truncate_to_tokens(_one_line(msg.content), room)
                used += estimate_tokens(line) + 1
                kept.append((msg, line))
            if not kept:
                used -= header
    blocks: list[str] = []
    if chosen:
        groups: dict[str, list[tuple[Hit, list[str]]]] = {}
        for hit, lines in chosen:  # relevance order: a group's position is its best item's
            groups.setdefault((topics.get(hit.id) or [OTHER_GROUP])[0], []).append((hit, lines))
        if OTHER_GROUP in groups:  # untopical items after the topics
            groups[OTHER_GROUP] = groups.pop(OTHER_GROUP)
        out = [MEMORY_HEADER]
        for name, items in groups.items():
            items.sort(
                key=lambda c: (
                    _superseded(c[0]),
                    _LAYER_ORDER.get(c[0].layer, 3),
                    -(c[0].timestamp.timestamp() if c[0].timestamp else 0.0),
                    c[0].id,
                )
            )
            out.append(f"## {name}")
            out.extend(line for _, lines in items for line in lines)
        blocks.append("\n".join(out))
    if kept:
        kept.reverse()
        blocks.append("\n".join([HISTORY_HEADER, *(line for _, line in kept)]))
    text = "\n\n".join(blocks)
    return text, estimate_tokens(text)
