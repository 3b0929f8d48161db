"""``AsyncMemory``: every face and method of ``Memory``, with its signature, as coroutines.

SQLite and the local model block, so each call runs the sync ``Memory``'s in a worker
thread (``asyncio.to_thread``) and the event loop stays free. ``tests/test_api.py`` checks
that every public method here has the signature of its sync counterpart.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from ._facts import AsyncFacts
from ._messages import AsyncMessages
from ._projects import AsyncApiKeys, AsyncProjects
from ._sessions import AsyncSessions
from ._summaries import AsyncSummaries
from ._topics import AsyncTopics
from ._webhooks import AsyncWebhooks
from .types import (
    AddResult,
    AuditRecord,
    Hit,
    MemoryContext,
    MessageInput,
    ProcessingStatus,
    RecallConfig,
    Summary,
)

if TYPE_CHECKING:
    from .capture import Attribution, Capture
    from .config import Settings
    from .embed import Embedder
    from .hooks import Hooks
    from .llm import ChatModel
    from .memory import Memory
    from .store import Store

__all__ = ["AsyncMemory"]


class AsyncMemory:
    """``Memory`` for asyncio code: the same faces and methods, as coroutines.

    It takes ``Memory``'s arguments and opens one (``sync``); with an ``http(s)://`` URL
    that is a :class:`~memstrata.client.RemoteMemory`, whose methods it runs the same way.
    ``llm``, ``scope``, ``hooks`` and ``for_project`` are not I/O and stay plain calls.
    """

    def __init__(
        self,
        database_url: str | None = None,
        *,
        api_key: str | None = None,
        project_id: str | None = None,
        embedder: str | Embedder | None = None,
        llm: str | ChatModel | None = None,
        workers: int | None = None,
        settings: Settings | None = None,
        embedder_mismatch: Literal["error", "reindex"] = "error",
        **options: Any,
    ) -> None:
        from .memory import Memory

        # Only what was given: with an http(s) URL, Memory(...) is a RemoteMemory, which
        # takes settings or options, not both.
        given = {
            k: v
            for k, v in (
                ("api_key", api_key),
                ("project_id", project_id),
                ("embedder", embedder),
                ("llm", llm),
                ("workers", workers),
                ("settings", settings),
            )
            if v is not None
        }
        if embedder_mismatch != "error":
            given["embedder_mismatch"] = embedder_mismatch
        self._attach(Memory(database_url, **given, **options))

    def _attach(self, sync: Memory) -> None:
        self.sync = sync
        self.sessions = AsyncSessions(sync.sessions, self)
        self.messages = AsyncMessages(sync.messages)
        self.facts = AsyncFacts(sync.facts)
        self.summaries = AsyncSummaries(sync.summaries)
        self.topics = AsyncTopics(sync.topics)
        self.webhooks = AsyncWebhooks(sync.webhooks)
        # A RemoteMemory has no projects or keys: the server's operator manages those.
        if hasattr(sync, "projects"):
            self.projects = AsyncProjects(sync.projects)
            self.keys = AsyncApiKeys(sync.keys)

    # -- what is no I/O ----------------------------------------------------------------

    @property
    def project_id(self) -> str:
        return self.sync.project_id

    @property
    def settings(self) -> Settings:
        return self.sync.settings

    @property
    def llm(self) -> Capture:
        """``mem.llm``: register sync or async LLM clients (see docs/capture.md)."""
        return self.sync.llm

    @property
    def hooks(self) -> Hooks:
        """In-process pipeline hooks; they run in the worker threads, so they stay sync."""
        return self.sync.hooks

    @property
    def mode(self) -> str:
        return self.sync.mode

    @property
    def store(self) -> Store:
        return self.sync.store

    @property
    def embedder(self) -> Embedder:
        return self.sync.embedder

    def scope(
        self,
        user_id: str | None = None,
        session_id: str | None = None,
        process_id: str | None = None,
    ) -> AbstractContextManager[Attribution]:
        """The same context-variable scope as ``Memory.scope``; safe across asyncio tasks."""
        return self.sync.scope(user_id=user_id, session_id=session_id, process_id=process_id)

    def for_project(self, project_id: str) -> AsyncMemory:
        """``Memory.for_project`` as an AsyncMemory: the same engine, another project."""
        return _AsyncProjectView(self.sync.for_project(project_id))

    # -- write -------------------------------------------------------------------------

    async def add_messages(
        self,
        session_id: str,
        messages: Sequence[MessageInput | dict[str, Any]],
        *,
        sync: bool = False,
    ) -> AddResult:
        return await asyncio.to_thread(self.sync.add_messages, session_id, messages, sync=sync)

    async def wait(self, timeout: float | None = None) -> None:
        await asyncio.to_thread(self.sync.wait, timeout)

    async def retry_failed(self, user_id: str | None = None) -> int:
        return await asyncio.to_thread(self.sync.retry_failed, user_id)

    async def reindex(self, *, batch_size: int = 256, progress: Any = None) -> int:
        return await asyncio.to_thread(self.sync.reindex, batch_size=batch_size, progress=progress)

    # -- read --------------------------------------------------------------------------

    async def get_memory(
        self,
        session_id: str,
        query: str | None = None,
        *,
        details: bool = False,
        recall_config: RecallConfig | dict[str, Any] | None = None,
        metadata_filters: dict[str, Any] | None = None,
    ) -> MemoryContext:
        return await asyncio.to_thread(
            self.sync.get_memory,
            session_id,
            query,
            details=details,
            recall_config=recall_config,
            metadata_filters=metadata_filters,
        )

    async def search(
        self,
        query: str,
        *,
        user_id: str,
        limit: int = 10,
        filters: dict[str, Any] | None = None,
        session_id: str | None = None,
        since: datetime | str | None = None,
        until: datetime | str | None = None,
        roles: Sequence[str] | None = None,
        event_types: Sequence[str] | None = None,
        as_of: datetime | str | None = None,
        layers: Sequence[str] | None = None,
        include_superseded: bool | None = None,
        recall_config: RecallConfig | dict[str, Any] | None = None,
    ) -> list[Hit]:
        return await asyncio.to_thread(
            self.sync.search,
            query,
            user_id=user_id,
            limit=limit,
            filters=filters,
            session_id=session_id,
            since=since,
            until=until,
            roles=roles,
            event_types=event_types,
            as_of=as_of,
            layers=layers,
            include_superseded=include_superseded,
            recall_config=recall_config,
        )

    async def stats(self) -> dict[str, Any]:
        return await asyncio.to_thread(self.sync.stats)

    # -- governance --------------------------------------------------------------------

    async def set_status(
        self, summary_id: str, status: str, *, reason: str, actor: str | None = None
    ) -> Summary:
        return await asyncio.to_thread(
            self.sync.set_status, summary_id, status, reason=reason, actor=actor
        )

    async def forget(
        self,
        *,
        user_id: str,
        message_ids: Sequence[str] | None = None,
        session_id: str | None = None,
        topic_id: str | None = None,
        reason: str | None = None,
        actor: str | None = None,
    ) -> dict[str, int]:
        return await asyncio.to_thread(
            self.sync.forget,
            user_id=user_id,
            message_ids=message_ids,
            session_id=session_id,
            topic_id=topic_id,
            reason=reason,
            actor=actor,
        )

    async def erase_user(
        self, user_id: str, *, reason: str | None = None, actor: str | None = None
    ) -> dict[str, int]:
        return await asyncio.to_thread(self.sync.erase_user, user_id, reason=reason, actor=actor)

    async def export_user(self, user_id: str) -> dict[str, Any]:
        return await asyncio.to_thread(self.sync.export_user, user_id)

    async def audit(
        self, *, user_id: str | None = None, limit: int = 100, offset: int = 0
    ) -> list[AuditRecord]:
        return await asyncio.to_thread(self.sync.audit, user_id=user_id, limit=limit, offset=offset)

    async def processing_status(self, session_id: str) -> ProcessingStatus:
        return await asyncio.to_thread(self.sync.processing_status, session_id)

    # -- lifetime ----------------------------------------------------------------------

    async def close(self, timeout: float | None = None) -> None:
        await asyncio.to_thread(self.sync.close, timeout)

    async def __aenter__(self) -> AsyncMemory:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class _AsyncProjectView(AsyncMemory):
    """``AsyncMemory.for_project``: over a sync view, whose ``close()`` does nothing."""

    def __init__(self, sync: Memory) -> None:
        self._attach(sync)
