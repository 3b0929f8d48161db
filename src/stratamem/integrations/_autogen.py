"""An AutoGen ``Memory`` backed by stratamem (docs/integrations/autogen.md).

Mapping. ``StratamemMemory`` is the memory of one stratamem user. What ``add`` is given is
a note of that user (``event_type`` ``memory``, as MCP's ``add_memory``) in the memory's own
session, so the pipeline learns facts, summaries and topics from it, and every other face
recalls it; ``query`` is stratamem's hybrid search over the user's whole memory; and
``update_context`` recalls for the context's last user message (``get_memory``, capture's
compact configuration, the context's own turns excluded) and appends the block to the model
context as a system message, as AutoGen's ``ListMemory`` does: what is before it stays the
same, so a provider's prompt cache keeps working. A recall that fails leaves the call
without memory (logged), as capture does; a store that fails raises.

``clear`` forgets what this memory added (its session, and what the pipeline derived from
it), not the user's whole memory; ``close`` leaves the ``MemoryAPI``, which is the caller's,
open.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from autogen_core import CancellationToken
from autogen_core.memory import (
    Memory,
    MemoryContent,
    MemoryMimeType,
    MemoryQueryResult,
    UpdateContextResult,
)
from autogen_core.model_context import ChatCompletionContext
from autogen_core.models import AssistantMessage, SystemMessage, UserMessage

from ..api import MemoryAPI
from ..errors import NotFoundError
from ..types import NOTE_EVENT, Hit
from ._ids import as_id
from ._json import as_json, clean, dumps, limits
from ._recall import RECALL_CONFIG, excluded_texts
from ._session import OwnSession

__all__ = ["RECALL_CONFIG", "StratamemMemory"]

log = logging.getLogger("stratamem.integrations.autogen")

TAG = "autogen"  # the metadata key of the memory's session and notes
_TEXT_TYPES = {MemoryMimeType.TEXT.value, MemoryMimeType.MARKDOWN.value, MemoryMimeType.JSON.value}


def _text_of(content: Any) -> str:
    """A model-context message's text (its string parts; images are not text)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(part for part in content if isinstance(part, str))
    return ""


class StratamemMemory(Memory):
    """An ``autogen_core.memory.Memory`` whose memory is a stratamem user's.

    ``memory`` is any :class:`~stratamem.MemoryAPI` (``Memory(...)`` or ``connect(url)``);
    ``user_id`` the user; ``session_id`` the stratamem session what ``add`` is given goes
    to (default ``autogen-<user_id>``); ``limit`` how many hits ``query`` returns."""

    def __init__(
        self,
        memory: MemoryAPI,
        *,
        user_id: str,
        session_id: str | None = None,
        name: str = "stratamem",
        limit: int = 5,
        recall_config: dict[str, Any] | None = None,
    ) -> None:
        if not isinstance(memory, MemoryAPI):
            raise TypeError("memory must be a stratamem Memory or connect(...) client")
        if not isinstance(user_id, str) or not user_id.strip():
            raise ValueError("user_id must be a non-empty string")
        if not 1 <= limit <= 100:
            raise ValueError("limit must be between 1 and 100")
        self._m = memory
        self.user_id = user_id
        self.name = name
        self.limit = limit
        self.recall_config = dict(RECALL_CONFIG if recall_config is None else recall_config)
        self._sid = as_id(session_id or f"autogen-{user_id}")
        self._session = OwnSession(
            memory,
            user_id,
            self._sid,
            title=f"AutoGen memory {name}",
            metadata={TAG: {"memory": clean(name)}},
        )

    @property
    def session_id(self) -> str:
        """The stratamem session this memory's notes go to."""
        return self._sid

    # -- the seam ---------------------------------------------------------------------------

    async def update_context(self, model_context: ChatCompletionContext) -> UpdateContextResult:
        messages = await model_context.get_messages()
        query = next(
            (
                _text_of(m.content)
                for m in reversed(messages)
                if isinstance(m, UserMessage) and _text_of(m.content).strip()
            ),
            "",
        )
        if not query:
            return UpdateContextResult(memories=MemoryQueryResult(results=[]))
        carried = tuple(
            _text_of(m.content) for m in messages if isinstance(m, UserMessage | AssistantMessage)
        )
        try:
            block, hits = await asyncio.to_thread(self._recall, query, carried)
        except Exception:
            log.warning("autogen: recall failed; the call goes without memory", exc_info=True)
            return UpdateContextResult(memories=MemoryQueryResult(results=[]))
        if not block:
            return UpdateContextResult(memories=MemoryQueryResult(results=[]))
        await model_context.add_message(SystemMessage(content=block))
        return UpdateContextResult(memories=MemoryQueryResult(results=hits))

    async def query(
        self,
        query: str | MemoryContent,
        cancellation_token: CancellationToken | None = None,
        **kwargs: Any,
    ) -> MemoryQueryResult:
        text = query if isinstance(query, str) else _content_text(query)
        if not text.strip():
            return MemoryQueryResult(results=[])
        limit = int(kwargs.get("limit", self.limit))
        hits = await asyncio.to_thread(
            self._m.search, clean(text), user_id=self.user_id, limit=limit
        )
        return MemoryQueryResult(results=[_content(h) for h in hits])

    async def add(
        self, content: MemoryContent, cancellation_token: CancellationToken | None = None
    ) -> None:
        text = _content_text(content)
        if not text.strip():
            raise ValueError("stratamem stores text: this memory content has none")
        chars, _ = limits(self._m)
        if len(text) > chars:
            raise ValueError(f"memory content of {len(text)} characters; the limit is {chars}")
        note: dict[str, Any] = {"role": "user", "content": text, "event_type": NOTE_EVENT}
        if content.metadata:
            note["metadata"] = {TAG: as_json(content.metadata)}
        await asyncio.to_thread(self._session.add, [note])

    async def clear(self) -> None:
        def forget() -> None:
            with contextlib.suppress(NotFoundError):  # nothing added yet
                self._m.forget(user_id=self.user_id, session_id=self._sid)
            self._session.forgotten()

        await asyncio.to_thread(forget)

    async def close(self) -> None:
        """Nothing to release: the ``MemoryAPI`` is the caller's to close."""

    # -- stratamem --------------------------------------------------------------------------

    def _recall(self, query: str, carried: tuple[str, ...]) -> tuple[str, list[MemoryContent]]:
        excluded = excluded_texts(self._m, carried)
        self._session.ensure()
        context = self._m.get_memory(
            self._sid,
            clean(query),
            details=True,
            recall_config=self.recall_config,
            exclude_texts=excluded,
        )
        return context.formatted_context, [_content(h) for h in context.matches or []]


def _content_text(content: MemoryContent) -> str:
    mime = content.mime_type
    kind = mime.value if isinstance(mime, MemoryMimeType) else str(mime)
    if kind not in _TEXT_TYPES:
        raise ValueError(f"stratamem stores text; memory content of type {kind!r} is not")
    value = content.content
    if isinstance(value, str):
        return clean(value)
    if isinstance(value, dict):
        return dumps(value)
    raise ValueError(f"stratamem stores text; memory content of {type(value).__name__} is not")


def _content(hit: Hit) -> MemoryContent:
    return MemoryContent(
        content=hit.text,
        mime_type=MemoryMimeType.TEXT,
        metadata={
            "id": hit.id,
            "layer": hit.layer,
            "score": hit.score,
            "timestamp": hit.timestamp.isoformat() if hit.timestamp else None,
            "message_ids": list(hit.message_ids),
            "current": hit.current,
        },
    )
