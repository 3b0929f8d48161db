"""An OpenAI Agents SDK ``Session`` backed by stratamem, and recall before each model call
(docs/integrations/openai-agents.md).

Mapping. An Agents session is a stratamem session of the given user (its id through
``_ids.as_id``). Each conversation item is stored as messages of that session, in order:
the item's text is the content (a user turn as the user's, an answer as the assistant's, a
tool's output as the tool's, a tool call as ``[tool call] name(arguments)``), so the
pipeline learns from the conversation as from any other; the item itself is JSON text in
the metadata (``openai_agents.doc``), so that ``get_items`` gives back exactly what
``add_items`` got, tool calls, reasoning and every other item type included. A text that is
exactly one field of the item (a message's content, a tool's output) is not repeated in
the JSON: it is the content, split over consecutive messages when it is longer than a
message may hold; JSON longer than a message's metadata may hold is split the same way. The
messages of one item share ``openai_agents.item``; messages of the session not written by
this class are not items and are left out.

Deleting through the seam deletes in stratamem (``pop_item`` forgets the item's messages,
``clear_session`` the session), with everything the pipeline derived from them.

Recall: ``StratamemSession.call_model_input_filter`` is the SDK's hook for editing model
input (``RunConfig(call_model_input_filter=...)``): before each model call it recalls for
the last user message (``get_memory``, with the input's own turns excluded) and appends the
memory block to that message, as capture does, so everything before it stays byte-identical
and the provider's prompt cache keeps working. A recall that fails leaves the call without
memory (logged), as capture does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from agents.items import TResponseInputItem
from agents.memory import SessionSettings
from agents.memory.session_settings import resolve_session_limit
from agents.run_config import CallModelData, ModelInputData

from ..api import MemoryAPI
from ..errors import NotFoundError
from ..types import Message, RecallConfig
from ._ids import as_id
from ._json import clean, dumps, limits, pieces
from ._recall import RECALL_CONFIG, excluded_texts
from ._session import OwnSession

__all__ = ["RECALL_CONFIG", "StratamemSession"]

log = logging.getLogger("stratamem.integrations.openai_agents")

TAG = "openai_agents"  # the metadata key of the session and of its messages
_PAGE = 10_000  # the largest page messages.list returns
# Room kept in a message's metadata for the keys around a JSON piece.
_METADATA_ROOM = 512
_Path = tuple[str | int, ...]


@dataclass(frozen=True)
class _Stored:
    """One item as the session holds it: the item and the ids of its messages."""

    item: dict[str, Any]
    message_ids: tuple[str, ...]


class StratamemSession:
    """The OpenAI Agents SDK's ``Session`` protocol over a stratamem memory (embedded or a
    server's): the conversation ``session_id`` of ``user_id``.

    Pass ``session=`` to ``Runner.run``; for long-term recall before each model call, also
    ``run_config=RunConfig(call_model_input_filter=session.call_model_input_filter)``.
    ``recall_config`` tunes that recall (default ``RECALL_CONFIG``).
    """

    def __init__(
        self,
        session_id: str,
        memory: MemoryAPI,
        *,
        user_id: str,
        session_settings: SessionSettings | None = None,
        recall_config: RecallConfig | dict[str, Any] | None = None,
    ) -> None:
        self.session_id = session_id
        self.session_settings = session_settings
        self.user_id = user_id
        self._m = memory
        self._sid = as_id(session_id)
        self._session = OwnSession(
            memory,
            user_id,
            self._sid,
            title=f"OpenAI Agents session {session_id}",
            metadata={TAG: {"session_id": clean(session_id)}},
        )
        self._recall_config = RecallConfig.model_validate(
            RECALL_CONFIG if recall_config is None else recall_config
        )
        self._lock = threading.Lock()  # one change of the session at a time
        self._recalled: tuple[tuple[str, tuple[str, ...]], str] | None = None

    @property
    def stratamem_session_id(self) -> str:
        """The id of the stratamem session that holds this conversation."""
        return self._sid

    # -- the Session protocol -------------------------------------------------------------

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The conversation's items in order; with a ``limit`` (or the session settings'),
        the latest ``limit`` (none for 0; all for a negative one, as SQLiteSession)."""
        wanted = resolve_session_limit(limit, self.session_settings)
        stored = await asyncio.to_thread(self._stored)
        if wanted is not None and wanted >= 0:
            stored = stored[max(len(stored) - wanted, 0) :] if wanted else []
        return [cast(TResponseInputItem, s.item) for s in stored]

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Store ``items`` after the conversation's, in order."""
        if items:
            await asyncio.to_thread(self._add, [cast(dict[str, Any], i) for i in items])

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove the latest item (forgetting its messages) and return it."""
        popped = await asyncio.to_thread(self._pop)
        return None if popped is None else cast(TResponseInputItem, popped)

    async def clear_session(self) -> None:
        """Forget the whole conversation (the stratamem session and what was derived from
        it)."""
        await asyncio.to_thread(self._clear)

    # -- recall before each model call ----------------------------------------------------

    async def call_model_input_filter(self, data: CallModelData[Any]) -> ModelInputData:
        """``RunConfig.call_model_input_filter``: the model input with the memory block
        recalled for its last user message appended to that message (new objects; the
        run's own items are not changed)."""
        model_data = data.model_data
        items = list(model_data.input)
        last = next((i for i in range(len(items) - 1, -1, -1) if _is_user_message(items[i])), None)
        if last is None:
            return model_data
        query = _message_text(cast(dict[str, Any], items[last]))
        if not query.strip():
            return model_data
        carried = tuple(
            _message_text(cast(dict[str, Any], item))
            for item in items
            if _role_of(cast(dict[str, Any], item)) in ("user", "assistant")
        )
        try:
            block = await asyncio.to_thread(self._recall, query, carried)
        except Exception:
            log.warning("openai agents: recall failed; the call goes without memory", exc_info=True)
            return model_data
        if not block:
            return model_data
        # The message has text (the query), so its content is a string or a list of parts.
        message = cast(dict[str, Any], items[last])
        content = message["content"]
        if isinstance(content, str):
            added: str | list[Any] = f"{content}\n\n{block}"
        else:
            added = [*content, {"type": "input_text", "text": block}]
        items[last] = cast(TResponseInputItem, {**message, "content": added})
        return ModelInputData(input=items, instructions=model_data.instructions)

    def _recall(self, query: str, carried: tuple[str, ...]) -> str:
        excluded = excluded_texts(self._m, carried)
        key = (query, excluded)
        if self._recalled is not None and self._recalled[0] == key:
            return self._recalled[1]  # the same turn again (a tool loop): the same block
        self._session.ensure()
        context = self._m.get_memory(
            self._sid, clean(query), recall_config=self._recall_config, exclude_texts=excluded
        )
        self._recalled = (key, context.formatted_context)
        return context.formatted_context

    # -- storage --------------------------------------------------------------------------

    def _add(self, items: list[dict[str, Any]]) -> None:
        chars, size = limits(self._m)
        messages = [m for item in items for m in _messages_of(item, chars, size)]
        with self._lock:
            self._session.add(messages)

    def _stored(self) -> list[_Stored]:
        messages: list[Message] = []
        offset = 0
        while True:
            try:
                page = self._m.messages.list(session_id=self._sid, limit=_PAGE, offset=offset)
            except NotFoundError:  # a server's answer for a session not made yet
                return []
            messages.extend(page)
            if len(page) < _PAGE:
                break
            offset += _PAGE
        return _items_of(messages)

    def _pop(self) -> dict[str, Any] | None:
        with self._lock:
            stored = self._stored()
            if not stored:
                return None
            last = stored[-1]
            self._m.forget(
                user_id=self.user_id,
                message_ids=list(last.message_ids),
                reason="openai agents: pop_item",
            )
            return last.item

    def _clear(self) -> None:
        with self._lock, contextlib.suppress(NotFoundError):  # nothing stored: nothing to do
            self._m.forget(
                user_id=self.user_id, session_id=self._sid, reason="openai agents: clear_session"
            )
        self._session.forgotten()
        self._recalled = None


# -- items to messages and back ------------------------------------------------------------


def _messages_of(item: dict[str, Any], chars: int, size: int) -> list[dict[str, Any]]:
    """The messages that hold ``item``: its text as their contents, its JSON (less that
    text) in their metadata, each within the memory's limits."""
    text, path = _text_of(item)
    parts = pieces(text, chars) if path is not None else None
    if parts is None:  # the text is only a rendering: the JSON holds everything
        path = None
        shown = clean(text).strip()[:chars]
        parts = [shown if shown.strip() else f"[{item.get('type', 'item')}]"]
    skeleton = _with_text(item, path, "") if path is not None else item
    docs = _json_pieces(dumps(skeleton), size - _METADATA_ROOM)
    token = secrets.token_hex(8)
    role = _role_of(item)
    count = max(len(parts), len(docs))
    out = []
    for i in range(count):
        meta: dict[str, Any] = {"item": token, "part": i, "parts": count}
        if i < len(docs):
            meta["doc"] = docs[i]
        if i == 0:
            meta["text_at"] = None if path is None else list(path)
            meta["pieces"] = len(parts)
            meta["docs"] = len(docs)
        content = parts[i] if i < len(parts) else f"[continued: part {i + 1} of {count}]"
        out.append({"role": role, "content": content, "metadata": {TAG: meta}})
    return out


def _items_of(messages: Sequence[Message]) -> list[_Stored]:
    """The items held by ``messages`` (a session's, in order); others are left out."""
    out: list[_Stored] = []
    group: list[Message] = []
    for message in messages:
        meta = message.metadata.get(TAG)
        if not isinstance(meta, dict) or not isinstance(meta.get("item"), str):
            continue
        if group and group[0].metadata[TAG]["item"] != meta["item"]:
            _close(group, out)
            group = []
        group.append(message)
    _close(group, out)
    return out


def _close(group: list[Message], out: list[_Stored]) -> None:
    if not group:
        return
    ids = tuple(m.id for m in group)
    try:
        head = group[0].metadata[TAG]
        if [m.metadata[TAG]["part"] for m in group] != list(range(head["parts"])):
            raise ValueError(f"parts {[m.metadata[TAG]['part'] for m in group]}")
        item = json.loads("".join(m.metadata[TAG]["doc"] for m in group[: head["docs"]]))
        if head["text_at"] is not None:
            text = "".join(m.content for m in group[: head["pieces"]])
            item = _with_text(item, tuple(head["text_at"]), text)
        out.append(_Stored(item, ids))
    except (KeyError, TypeError, ValueError) as exc:
        log.warning("openai agents: messages %s hold no readable item (%s); skipped", ids, exc)


def _text_of(item: Mapping[str, Any]) -> tuple[str, _Path | None]:
    """An item's text, and where it is in the item when it is exactly one string field."""
    kind = item.get("type")
    if kind == "function_call":
        return f"[tool call] {item.get('name')}({item.get('arguments', '')})", None
    for field in ("content", "output"):
        value = item.get(field)
        if isinstance(value, str):
            return value, (field,)
        if isinstance(value, list):
            texts = [_part_text(p) for p in value]
            only = value[0] if len(value) == 1 else None
            if isinstance(only, dict) and isinstance(only.get("text"), str):
                return only["text"], (field, 0, "text")
            return "\n".join(t for t in texts if t), None
    summary = item.get("summary")
    if isinstance(summary, list):  # reasoning
        return "\n".join(_part_text(p) for p in summary if _part_text(p)), None
    return "", None


def _part_text(part: Any) -> str:
    if not isinstance(part, dict):
        return ""
    for key in ("text", "refusal"):
        if isinstance(part.get(key), str):
            return str(part[key])
    kind = str(part.get("type", "part"))
    name = part.get("filename")
    return f"[{kind.removeprefix('input_')}{f' {name}' if isinstance(name, str) else ''}]"


def _message_text(item: Mapping[str, Any]) -> str:
    """The text of a message item (its text parts); empty for other items."""
    if item.get("type", "message") != "message":
        return ""
    content = item.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(p["text"])
            for p in content
            if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    return ""


def _is_user_message(item: object) -> bool:
    return (
        isinstance(item, dict)
        and item.get("role") == "user"
        and item.get("type", "message") == "message"
    )


def _role_of(item: Mapping[str, Any]) -> str:
    """The stratamem role of an item: a message's own (developer as system), a tool call's
    the assistant's, a tool's output the tool's."""
    role = item.get("role")
    if role in ("user", "assistant", "system"):
        return str(role)
    if role == "developer":
        return "system"
    kind = str(item.get("type", ""))
    return "tool" if kind.endswith("_output") else "assistant"


def _with_text(item: Any, path: _Path | None, text: str) -> Any:
    """A copy of ``item`` with the string at ``path`` replaced by ``text``."""
    if not path:
        return text
    head, rest = path[0], path[1:]
    if isinstance(item, list):
        assert isinstance(head, int)
        return [_with_text(v, rest, text) if i == head else v for i, v in enumerate(item)]
    return {k: _with_text(v, rest, text) if k == head else v for k, v in item.items()}


def _json_pieces(text: str, most: int) -> list[str]:
    """``text`` in pieces of at most ``most`` bytes as JSON strings in metadata."""
    if len(json.dumps(text, ensure_ascii=False).encode()) <= most:
        return [text]
    pieces: list[str] = []
    current: list[str] = []
    used = 0
    for char in text:
        cost = len(json.dumps(char, ensure_ascii=False).encode()) - 2
        if used + cost > most and current:
            pieces.append("".join(current))
            current, used = [], 0
        current.append(char)
        used += cost
    pieces.append("".join(current))
    return pieces
