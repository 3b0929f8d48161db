"""A LlamaIndex memory block backed by stratamem (docs/integrations/llama-index.md).

Mapping. ``llama_index.core.memory.Memory`` keeps a conversation's recent turns itself (its
short-term memory) and hands each memory block what it flushes from them; it asks every
block for its content before each call. ``StratamemMemoryBlock`` stores what it is handed as
messages of a stratamem session of its user (the session LlamaIndex names, through
``_ids.as_id``, else the block's own), so the pipeline learns facts, summaries and topics
from it as from any other conversation, and answers with the memory block stratamem
recalls for the latest user message (``get_memory``, capture's compact configuration, with
the turns LlamaIndex already holds excluded). A user's memory is therefore shared with
every other face: capture, MCP, the proxy and the other integrations.

What is stored: user and assistant turns with text (the text of their text blocks); system
and tool messages, and turns without text, are not conversation (counted in the log).
Recall failing (a server down, a store error) leaves the call without memory, logged, as
capture does; a store that fails raises, so LlamaIndex's caller sees it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from llama_index.core.llms import ChatMessage, TextBlock
from llama_index.core.memory.memory import BaseMemoryBlock
from pydantic import ConfigDict, Field, PrivateAttr, field_validator

from ..api import MemoryAPI
from ._ids import as_id
from ._json import clean, limits, text_pieces
from ._recall import RECALL_CONFIG, excluded_texts
from ._session import OwnSession

__all__ = ["RECALL_CONFIG", "StratamemMemoryBlock"]

log = logging.getLogger("stratamem.integrations.llama_index")

TAG = "llama_index"  # the metadata key of the sessions the block makes


def _text(message: ChatMessage) -> str:
    return "\n".join(b.text for b in message.blocks if isinstance(b, TextBlock) and b.text)


class StratamemMemoryBlock(BaseMemoryBlock[str]):
    """A ``BaseMemoryBlock`` whose memory is a stratamem user's.

    ``memory`` is any :class:`~stratamem.MemoryAPI` (``Memory(...)`` or ``connect(url)``);
    ``user_id`` the user whose memory it is; ``session_id`` the stratamem session flushed
    turns go to when LlamaIndex does not name one (default ``llama-index-<user_id>``)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    name: str = Field(default="stratamem", description="The name of the memory block.")
    description: str | None = Field(
        default="What stratamem remembers about the user, recalled for the latest message."
    )
    memory: Any = Field(exclude=True, description="A stratamem MemoryAPI.")
    user_id: str = Field(description="The stratamem user whose memory this is.")
    session_id: str | None = Field(default=None, description="Where unnamed turns go.")
    recall_config: dict[str, Any] = Field(default_factory=lambda: dict(RECALL_CONFIG))

    _sessions: dict[str, OwnSession] = PrivateAttr(default_factory=dict)

    @field_validator("memory")
    @classmethod
    def _is_memory(cls, value: Any) -> Any:
        if not isinstance(value, MemoryAPI):
            raise ValueError("memory must be a stratamem Memory or connect(...) client")
        return value

    @field_validator("user_id")
    @classmethod
    def _user(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("user_id must not be empty")
        return value

    @property
    def _m(self) -> MemoryAPI:
        return self.memory  # type: ignore[no-any-return]

    # -- the seam ---------------------------------------------------------------------------

    async def _aget(self, messages: list[ChatMessage] | None = None, **block_kwargs: Any) -> str:
        history = messages or []
        query = next((_text(m) for m in reversed(history) if m.role == "user" and _text(m)), "")
        if not query.strip():
            return ""
        carried = tuple(_text(m) for m in history if m.role in ("user", "assistant"))
        try:
            return await asyncio.to_thread(self._recall, query, carried)
        except Exception:
            log.warning("llama index: recall failed; the call goes without memory", exc_info=True)
            return ""

    async def _aput(self, messages: list[ChatMessage]) -> None:
        by_session: dict[str, list[dict[str, Any]]] = {}
        skipped = 0
        chars, _ = limits(self._m)
        for message in messages:
            text = clean(_text(message))
            if message.role not in ("user", "assistant") or not text.strip():
                skipped += 1
                continue
            named = message.additional_kwargs.get("session_id")
            sid = self._sid(str(named) if named else None)
            # A turn longer than a message may hold goes over consecutive messages.
            by_session.setdefault(sid, []).extend(
                {"role": str(message.role.value), "content": piece}
                for piece in text_pieces(text, chars)
            )
        if skipped:
            log.debug("llama index: %d messages without conversation text not stored", skipped)
        for sid, batch in by_session.items():
            await asyncio.to_thread(self._session(sid).add, batch)

    # -- stratamem --------------------------------------------------------------------------

    def _sid(self, named: str | None) -> str:
        return as_id(named or self.session_id or f"llama-index-{self.user_id}")

    def _session(self, sid: str) -> OwnSession:
        session = self._sessions.get(sid)
        if session is None:
            session = self._sessions[sid] = OwnSession(
                self._m,
                self.user_id,
                sid,
                title=f"LlamaIndex conversation {sid}",
                metadata={TAG: {"block": clean(self.name)}},
            )
        return session

    def _recall(self, query: str, carried: tuple[str, ...]) -> str:
        excluded = excluded_texts(self._m, carried)
        session = self._session(self._sid(None))
        context = session.call(
            lambda: self._m.get_memory(
                session.id, clean(query), recall_config=self.recall_config, exclude_texts=excluded
            )
        )
        return context.formatted_context
