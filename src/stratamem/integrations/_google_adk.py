"""A Google ADK memory service backed by stratamem (docs/integrations/google-adk.md).

Mapping. A ``StratamemMemoryService`` serves one ADK application (``app_name``; a call for
another is refused) over one stratamem memory (a project). An ADK user is the stratamem user
of the same name (through ``_ids.as_id``), so capture, MCP, the proxy and the other
integrations share the memory; an ADK session is a stratamem session of that user.

- ``add_session_to_memory`` and ``add_events_to_memory`` store every event with text as a
  message (the user's turns as the user's, every agent's as the assistant's, with the
  event's time), its id derived from the event's id: adding a session again, as ADK does
  after each turn, stores only its new events.
- ``add_memory`` stores each entry's text as a note of the user (``event_type`` ``memory``,
  as MCP's ``add_memory``) in the session ``adk-memories-<user>``.
- ``search_memory`` is stratamem's hybrid search over the user's memory: each hit is a
  ``MemoryEntry`` (its text, the author, the time, and in ``custom_metadata`` the layer,
  score, the messages it came from and whether it is current).
- ``delete_memory`` takes the ids ``search_memory`` returns: a message is forgotten (with
  what was derived from it), a summary's status becomes ``deleted`` (audited), a fact's
  messages are forgotten. An event deleted this way is not stored again when its session
  is added again through the same service.

A store that fails raises to ADK's caller; nothing is dropped silently.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from google.adk.events.event import Event
from google.adk.memory.base_memory_service import BaseMemoryService, SearchMemoryResponse
from google.adk.memory.memory_entry import MemoryEntry
from google.adk.sessions.session import Session
from google.genai import types

from ..api import MemoryAPI
from ..errors import NotFoundError
from ..types import NOTE_EVENT, Hit
from ._ids import as_id
from ._json import as_json, clean, limits, text_pieces
from ._session import OwnSession

__all__ = ["StratamemMemoryService"]


TAG = "google_adk"  # the metadata key of the service's sessions and messages


def _text(content: types.Content | None) -> str:
    if content is None or not content.parts:
        return ""
    return "\n".join(p.text for p in content.parts if p.text and not p.thought)


def _event_id(event_id: str) -> str:
    return as_id(f"adk:{event_id}")


class StratamemMemoryService(BaseMemoryService):
    """An ADK ``BaseMemoryService`` whose memory is stratamem's.

    ``memory`` is any :class:`~stratamem.MemoryAPI` (``Memory(...)`` or ``connect(url)``);
    ``app_name`` the ADK application it serves (``None``: any, all sharing the memory);
    ``limit`` how many memories ``search_memory`` returns."""

    def __init__(self, memory: MemoryAPI, *, app_name: str | None = None, limit: int = 10):
        if not isinstance(memory, MemoryAPI):
            raise TypeError("memory must be a stratamem Memory or connect(...) client")
        if not 1 <= limit <= 100:
            raise ValueError("limit must be between 1 and 100")
        self._m = memory
        self.app_name = app_name
        self.limit = limit
        self._sessions: dict[str, OwnSession] = {}
        self._deleted: set[str] = set()

    # -- the seam ---------------------------------------------------------------------------

    async def add_session_to_memory(self, session: Session) -> None:
        self._check(session.app_name, session.user_id)
        await asyncio.to_thread(self._add_events, session.user_id, session.id, session.events)

    async def add_events_to_memory(
        self,
        *,
        app_name: str,
        user_id: str,
        events: Sequence[Event],
        session_id: str | None = None,
        custom_metadata: Mapping[str, object] | None = None,
    ) -> None:
        self._check(app_name, user_id)
        sid = session_id or f"adk-{user_id}"
        await asyncio.to_thread(self._add_events, user_id, sid, events)

    async def add_memory(
        self,
        *,
        app_name: str,
        user_id: str,
        memories: Sequence[MemoryEntry],
        custom_metadata: Mapping[str, object] | None = None,
    ) -> None:
        self._check(app_name, user_id)
        chars, _ = limits(self._m)
        notes: list[dict[str, Any]] = []
        for entry in memories:
            text = clean(_text(entry.content))
            if not text.strip():
                raise ValueError("a memory entry without text: stratamem stores text")
            if len(text) > chars:
                raise ValueError(f"a memory entry of {len(text)} characters; the limit is {chars}")
            note: dict[str, Any] = {"role": "user", "content": text, "event_type": NOTE_EVENT}
            if entry.id:
                note["id"] = _event_id(entry.id)
            extra = {**(custom_metadata or {}), **entry.custom_metadata}
            if extra:
                note["metadata"] = {TAG: as_json(extra)}
            notes.append(note)
        if notes:
            await asyncio.to_thread(self._add, user_id, f"adk-memories-{user_id}", notes)

    async def search_memory(
        self, *, app_name: str, user_id: str, query: str
    ) -> SearchMemoryResponse:
        self._check(app_name, user_id)
        if not query.strip():
            return SearchMemoryResponse()
        hits = await asyncio.to_thread(
            self._m.search, clean(query), user_id=as_id(user_id), limit=self.limit
        )
        return SearchMemoryResponse(memories=[_entry(h) for h in hits])

    async def delete_memory(
        self, *, app_name: str, user_id: str, memory_id: str | None = None
    ) -> None:
        self._check(app_name, user_id)
        if memory_id:
            await asyncio.to_thread(self._delete, as_id(user_id), memory_id)

    # -- stratamem --------------------------------------------------------------------------

    def _check(self, app_name: str, user_id: str) -> None:
        if self.app_name is not None and app_name != self.app_name:
            raise ValueError(
                f"this memory service serves the ADK app {self.app_name!r}, not {app_name!r}"
            )
        if not isinstance(user_id, str) or not user_id.strip():
            raise ValueError("user_id must be a non-empty string")

    def _add_events(self, user_id: str, session_id: str, events: Sequence[Event]) -> None:
        chars, _ = limits(self._m)
        messages: list[dict[str, Any]] = []
        for event in events:
            text = clean(_text(event.content))
            mid = _event_id(event.id) if event.id else None
            if not text.strip() or (mid is not None and mid in self._deleted):
                continue
            role = "user" if event.author == "user" else "assistant"
            when = datetime.fromtimestamp(event.timestamp, tz=timezone.utc)
            # A turn longer than a message may hold goes over consecutive messages.
            for part, piece in enumerate(text_pieces(text, chars)):
                message: dict[str, Any] = {
                    "role": role,
                    "content": piece,
                    "timestamp": when,
                    "metadata": {TAG: {"author": clean(event.author)[:200]}},
                }
                if mid is not None:
                    message["id"] = mid if part == 0 else as_id(f"adk:{event.id}:{part}")
                messages.append(message)
        if messages:
            self._add(user_id, session_id, messages)

    def _add(self, user_id: str, session_id: str, messages: list[dict[str, Any]]) -> None:
        sid = as_id(session_id)
        session = self._sessions.get(sid)
        if session is None:
            session = self._sessions[sid] = OwnSession(
                self._m,
                as_id(user_id),
                sid,
                title=f"Google ADK session {session_id}",
                metadata={TAG: {"session_id": clean(session_id)[:200]}},
            )
        session.add(messages)

    def _delete(self, user_id: str, memory_id: str) -> None:
        reason = "deleted through Google ADK's delete_memory"
        try:
            if memory_id.startswith("s_"):
                _own(self._m.summaries.get(memory_id).user_id, user_id, memory_id)
                self._m.set_status(memory_id, "deleted", reason=reason)
            elif memory_id.startswith("f_"):
                fact = self._m.facts.get(memory_id)
                _own(fact.user_id, user_id, memory_id)
                self._m.forget(user_id=user_id, message_ids=list(fact.message_ids), reason=reason)
            else:
                _own(self._m.messages.get(memory_id).user_id, user_id, memory_id)
                self._m.forget(user_id=user_id, message_ids=[memory_id], reason=reason)
                self._deleted.add(memory_id)
        except NotFoundError:
            return  # gone already (or with what it was drawn from): deleting is idempotent


def _own(owner: str, user_id: str, memory_id: str) -> None:
    if owner != user_id:
        raise ValueError(f"memory {memory_id!r} is not user {user_id!r}'s")


def _entry(hit: Hit) -> MemoryEntry:
    role = "user" if hit.role in (None, "user") else "model"
    return MemoryEntry(
        id=hit.id,
        content=types.Content(role=role, parts=[types.Part(text=hit.text)]),
        author=hit.role or "user",
        timestamp=hit.timestamp.isoformat() if hit.timestamp else None,
        custom_metadata={
            "layer": hit.layer,
            "score": hit.score,
            "message_ids": list(hit.message_ids),
            "current": hit.current,
        },
    )
