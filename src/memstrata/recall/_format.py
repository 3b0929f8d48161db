"""``formatted_context``: a compact, dated, deterministic block within a token budget."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from ..types import Hit, Message
from ._tokens import estimate_tokens, truncate_to_tokens

__all__ = ["format_context"]

MEMORY_HEADER = "Relevant memories (newest first):"
HISTORY_HEADER = "Recent conversation in this session:"
_MAX_ITEM_TOKENS = 80


def _day(ts: datetime | None) -> str:
    return ts.strftime("%Y-%m-%d") if ts else "undated"


def _memory_line(hit: Hit) -> str:
    if hit.layer != "message":
        return f"- [{_day(hit.timestamp)}] "
    who = f"event {hit.event_type}" if hit.event_type else (hit.role or "user")
    return f"- [{_day(hit.timestamp)}] {who}: "


def _history_line(msg: Message) -> str:
    who = f"event {msg.event_type}" if msg.event_type else msg.role
    return f"- [{msg.timestamp.strftime('%Y-%m-%d %H:%M')}] {who}: "


def _one_line(text: str) -> str:
    return " ".join(text.split())


def format_context(
    matches: Sequence[Hit], history: Sequence[Message], budget: int
) -> tuple[str, int]:
    """Render memories (by relevance until the budget is spent, shown newest first) and the
    session's recent turns (most recent kept first, shown in order). Returns (text, tokens)."""
    used = 0
    chosen: list[tuple[Hit, str]] = []
    if matches:
        used += estimate_tokens(MEMORY_HEADER) + 1
        for hit in matches:
            prefix = _memory_line(hit)
            room = min(_MAX_ITEM_TOKENS, budget - used - estimate_tokens(prefix) - 1)
            if room < 8:
                break
            line = prefix + truncate_to_tokens(_one_line(hit.text), room)
            used += estimate_tokens(line) + 1
            chosen.append((hit, line))
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
        chosen.sort(
            key=lambda c: (c[0].timestamp.timestamp() if c[0].timestamp else 0.0, c[0].id),
            reverse=True,
        )
        blocks.append("\n".join([MEMORY_HEADER, *(line for _, line in chosen)]))
    if kept:
        kept.reverse()
        blocks.append("\n".join([HISTORY_HEADER, *(line for _, line in kept)]))
    text = "\n\n".join(blocks)
    return text, estimate_tokens(text)
