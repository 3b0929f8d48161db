"""Reading what the chat-style SDKs send and return: dicts from the caller, SDK objects from
the provider, read the same way."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ._capture import Recalled

__all__ = [
    "earlier_turns",
    "field",
    "into_user_message",
    "into_user_turn",
    "last_user_text",
    "said",
    "text_of",
    "turn_texts",
    "usage_dict",
    "with_block",
]

# The turns whose text capture stores (the user's and the model's), in stratamem's roles.
_SPOKEN = ("user", "assistant")


def field(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


def text_of(content: Any, kinds: Sequence[str] = ("text",)) -> str:
    """A message's text: the content string, or its text parts (``type`` in ``kinds``)."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "\n".join(str(field(p, "text") or "") for p in content if field(p, "type") in kinds)
    return ""


def last_user_text(items: Any, kinds: Sequence[str] = ("text",)) -> str | None:
    """The text of the last user turn (a bare string is one user turn): the recall query."""
    if isinstance(items, str):
        return items
    if not isinstance(items, Sequence):
        return None
    for m in reversed(items):
        if field(m, "role") == "user":
            return text_of(field(m, "content"), kinds) or None
    return None


def said(turns: Iterable[tuple[Any, str | None]]) -> tuple[str, ...]:
    """The non-blank texts of the user's and the assistant's turns among ``(role, text)``
    pairs (roles in stratamem's words): what a request carries already, which recall leaves
    out of the block (``Capture.before``'s second argument)."""
    return tuple(text for role, text in turns if role in _SPOKEN and text and text.strip())


def turn_texts(items: Any, text: Callable[[Any], str] = text_of) -> tuple[str, ...]:
    """``said`` of a chat-shaped request: turns (dicts or objects) with a ``role`` and a
    ``content`` that ``text`` reads (a bare string is one user turn), in the caller's list
    as it was sent, before any memory is put into it."""
    if isinstance(items, str):
        return said([("user", items)])
    if not isinstance(items, Sequence):
        return ()
    return said((field(m, "role"), text(field(m, "content"))) for m in items)


def with_block(content: Any, block: str, part: dict[str, Any]) -> Any:
    """A user turn's content with the memory block after the user's own words: a string
    gets it after a blank line, a list of parts one more part (``part``, the API's text
    part holding the block); None for a shape stratamem does not know."""
    if isinstance(content, str):
        return f"{content}\n\n{block}"
    if isinstance(content, Sequence):
        return [*content, part]
    return None


def into_user_turn(
    items: list[Any],
    block: str,
    part: dict[str, Any],
    text: Callable[[Any], str] | None = None,
) -> bool:
    """Put ``block`` into the last user turn of ``items``, the turn whose text recall
    searched with (``last_user_text``; with ``text``, the last one whose content has text):
    that dict is replaced by a new one, the caller's stays as it is. False when there is no
    such turn in a known shape."""
    for i in range(len(items) - 1, -1, -1):
        turn = items[i]
        if field(turn, "role") != "user":
            continue
        if text is not None and not text(field(turn, "content")).strip():
            continue
        content = with_block(turn.get("content"), block, part) if isinstance(turn, dict) else None
        if content is None:
            return False
        items[i] = {**turn, "content": content}
        return True
    return False


def into_user_message(messages: list[Any], block: str, is_user: Callable[[Any], bool]) -> bool:
    """``into_user_turn`` for message objects with a ``content`` (LangChain's and Agno's
    pydantic messages): the last one ``is_user`` picks is replaced by a ``model_copy``."""
    for i in range(len(messages) - 1, -1, -1):
        if is_user(messages[i]):
            content = with_block(messages[i].content, block, {"type": "text", "text": block})
            if content is None:
                return False
            messages[i] = messages[i].model_copy(update={"content": content})
            return True
    return False


def earlier_turns(
    recalled: Recalled, sent: Sequence[Any], kinds: Sequence[str] = ("text",)
) -> list[dict[str, Any]]:
    """The session's earlier turns that the caller did not send already."""
    already = {(field(m, "role"), text_of(field(m, "content"), kinds)) for m in sent}
    return [
        {"role": h.role, "content": h.content}
        for h in recalled.history
        if h.role in ("user", "assistant") and (h.role, h.content) not in already
    ]


def usage_dict(usage: Any) -> dict[str, Any] | None:
    """Token counts as plain JSON (``mode="json"``: enum values must be storable)."""
    if usage is None:
        return None
    dump = getattr(usage, "model_dump", None)
    return dump(mode="json", exclude_none=True) if dump else dict(usage)
