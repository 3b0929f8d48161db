"""The memory API as protocols: what every stratamem memory offers, embedded or remote.

``MemoryAPI`` is satisfied by :class:`~stratamem.Memory`, by the remote memory
(:func:`stratamem.connect`, ``Memory("http://...")``: a
:class:`~stratamem.client.RemoteMemory`) and by :class:`~stratamem.client.MemoryClient`;
``AsyncMemoryAPI`` by :class:`~stratamem.AsyncMemory` and
:class:`~stratamem.client.AsyncMemoryClient`. Code written against them runs on any of
these::

    def remember(mem: MemoryAPI, user_id: str, text: str) -> None:
        mem.sessions.create(user_id, session_id=f"notes-{user_id}").add_messages(
            [{"role": "user", "content": text}]
        )

Both are ``runtime_checkable`` (``isinstance(mem, MemoryAPI)``). What only one side has is
left out: the embedded engine's ``reindex``, ``retry_failed``, ``stats``, ``for_project``,
``topics.merge``, ``webhooks.wait``, ``recall_log`` (the log of recent recalls), projects,
keys and in-process hooks, what the dashboard reads and keeps (``users``, ``provenance``,
``activity``, ``dashboard_sessions``), and the governance calls' ``actor`` (a server
records the calling key); the client's ``health`` and ``user_actions``. Capture (``llm``,
``scope``) is on ``Memory``, ``AsyncMemory`` and the remote memory. Parameters are typed as
the embedded memory takes them; the remote one takes more (any ``Mapping`` for a ``dict``,
and GUMem's dict forms).
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Protocol, TypeVar, runtime_checkable

from .types import (
    AddResult,
    AsyncSession,
    AuditRecord,
    Fact,
    Hit,
    MemoryContext,
    Message,
    MessageInput,
    ProcessingStatus,
    RecallConfig,
    Session,
    Summary,
    Topic,
    Webhook,
    WebhookDelivery,
)

__all__ = [
    "AsyncFactsAPI",
    "AsyncItemsAPI",
    "AsyncMemoryAPI",
    "AsyncMessagesAPI",
    "AsyncSessionsAPI",
    "AsyncSummariesAPI",
    "AsyncTopicsAPI",
    "AsyncWebhooksAPI",
    "FactsAPI",
    "ItemsAPI",
    "MemoryAPI",
    "MessagesAPI",
    "SessionsAPI",
    "SummariesAPI",
    "TopicsAPI",
    "WebhooksAPI",
]

_M = TypeVar("_M")
_Item = TypeVar("_Item")

# In each protocol ``list`` comes after every method annotated with ``list[...]``: type
# checkers resolve that name in the class body, where the method would shadow the builtin.


class SessionsAPI(Protocol):
    """``mem.sessions``: conversation threads; sessions come back bound to the memory."""

    def create(
        self,
        user_id: str,
        *,
        title: str | None = None,
        metadata: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session: ...

    def get(self, session_id: str) -> Session: ...

    def list(
        self, *, user_id: str | None = None, limit: int = 100, offset: int = 0
    ) -> list[Session]: ...


class MessagesAPI(Protocol):
    """``mem.messages``: stored messages with their processing status."""

    def get(self, message_id: str) -> Message: ...

    def list(
        self,
        *,
        user_id: str | None = None,
        session_id: str | None = None,
        status: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[Message]: ...


class ItemsAPI(Protocol[_Item]):
    """What ``mem.facts`` and ``mem.summaries`` share: a user's items of one layer."""

    def list(
        self,
        *,
        user_id: str | None = None,
        status: str | Sequence[str] | None = None,
        since: datetime | str | None = None,
        until: datetime | str | None = None,
        metadata_filters: dict[str, Any] | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[_Item]: ...


class FactsAPI(ItemsAPI[Fact], Protocol):
    """``mem.facts``: facts extracted from messages, with provenance."""

    def get(self, fact_id: str) -> Fact: ...


class SummariesAPI(ItemsAPI[Summary], Protocol):
    """``mem.summaries``: long-term memory with status, evidence and history."""

    def get(self, summary_id: str) -> Summary: ...

    def history(self, summary_id: str) -> builtins.list[dict[str, Any]]: ...


class TopicsAPI(Protocol):
    """``mem.topics``: the entry points that group a user's summaries."""

    def list(self, *, user_id: str) -> list[Topic]: ...

    def get(self, topic_id: str) -> Topic: ...


class WebhooksAPI(Protocol):
    """``mem.webhooks``: the project's webhooks and their delivery log."""

    def create(
        self,
        *,
        resource: str,
        event: str,
        target_url: str,
        mode: str = "sync",
        name: str | None = None,
        timeout_ms: int | None = None,
        enabled: bool = True,
    ) -> tuple[Webhook, str]: ...

    def get(self, hook_id: str) -> Webhook: ...

    def update(
        self,
        hook_id: str,
        *,
        name: str | None = None,
        resource: str | None = None,
        event: str | None = None,
        target_url: str | None = None,
        mode: str | None = None,
        timeout_ms: int | None = None,
        enabled: bool | None = None,
    ) -> Webhook: ...

    def enable(self, hook_id: str) -> Webhook: ...

    def disable(self, hook_id: str) -> Webhook: ...

    def delete(self, hook_id: str) -> None: ...

    def rotate_secret(self, hook_id: str, *, grace_seconds: int = 0) -> str: ...

    def deliveries(
        self, hook_id: str, *, limit: int = 100, offset: int = 0
    ) -> list[WebhookDelivery]: ...

    def list(self, *, limit: int = 100, offset: int = 0) -> list[Webhook]: ...


@runtime_checkable
class MemoryAPI(Protocol):
    """A memory: sessions, messages and their recall, the derived layers, webhooks and
    governance (see the module docstring for who satisfies it)."""

    @property
    def sessions(self) -> SessionsAPI: ...

    @property
    def messages(self) -> MessagesAPI: ...

    @property
    def facts(self) -> FactsAPI: ...

    @property
    def summaries(self) -> SummariesAPI: ...

    @property
    def topics(self) -> TopicsAPI: ...

    @property
    def webhooks(self) -> WebhooksAPI: ...

    def add_messages(
        self,
        session_id: str,
        messages: Sequence[MessageInput | dict[str, Any]],
        *,
        sync: bool = False,
    ) -> AddResult: ...

    def get_memory(
        self,
        session_id: str,
        query: str | None = None,
        *,
        details: bool = False,
        recall_config: RecallConfig | dict[str, Any] | None = None,
        metadata_filters: dict[str, Any] | None = None,
        exclude_texts: Sequence[str] = (),
    ) -> MemoryContext: ...

    def search(
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
    ) -> list[Hit]: ...

    def wait(self, timeout: float | None = None) -> None: ...

    def processing_status(self, session_id: str) -> ProcessingStatus: ...

    def set_status(self, summary_id: str, status: str, *, reason: str) -> Summary: ...

    def forget(
        self,
        *,
        user_id: str,
        message_ids: Sequence[str] | None = None,
        session_id: str | None = None,
        topic_id: str | None = None,
        reason: str | None = None,
    ) -> dict[str, int]: ...

    def erase_user(self, user_id: str, *, reason: str | None = None) -> dict[str, int]: ...

    def export_user(self, user_id: str) -> dict[str, Any]: ...

    def audit(
        self, *, user_id: str | None = None, limit: int = 100, offset: int = 0
    ) -> list[AuditRecord]: ...

    def close(self) -> None: ...

    def __enter__(self: _M) -> _M: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


class AsyncSessionsAPI(Protocol):
    """``SessionsAPI`` as coroutines; sessions come back as ``AsyncSession``."""

    async def create(
        self,
        user_id: str,
        *,
        title: str | None = None,
        metadata: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> AsyncSession: ...

    async def get(self, session_id: str) -> AsyncSession: ...

    async def list(
        self, *, user_id: str | None = None, limit: int = 100, offset: int = 0
    ) -> list[AsyncSession]: ...


class AsyncMessagesAPI(Protocol):
    """``MessagesAPI`` as coroutines."""

    async def get(self, message_id: str) -> Message: ...

    async def list(
        self,
        *,
        user_id: str | None = None,
        session_id: str | None = None,
        status: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[Message]: ...


class AsyncItemsAPI(Protocol[_Item]):
    """``ItemsAPI`` as coroutines."""

    async def list(
        self,
        *,
        user_id: str | None = None,
        status: str | Sequence[str] | None = None,
        since: datetime | str | None = None,
        until: datetime | str | None = None,
        metadata_filters: dict[str, Any] | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[_Item]: ...


class AsyncFactsAPI(AsyncItemsAPI[Fact], Protocol):
    """``FactsAPI`` as coroutines."""

    async def get(self, fact_id: str) -> Fact: ...


class AsyncSummariesAPI(AsyncItemsAPI[Summary], Protocol):
    """``SummariesAPI`` as coroutines."""

    async def get(self, summary_id: str) -> Summary: ...

    async def history(self, summary_id: str) -> builtins.list[dict[str, Any]]: ...


class AsyncTopicsAPI(Protocol):
    """``TopicsAPI`` as coroutines."""

    async def list(self, *, user_id: str) -> list[Topic]: ...

    async def get(self, topic_id: str) -> Topic: ...


class AsyncWebhooksAPI(Protocol):
    """``WebhooksAPI`` as coroutines."""

    async def create(
        self,
        *,
        resource: str,
        event: str,
        target_url: str,
        mode: str = "sync",
        name: str | None = None,
        timeout_ms: int | None = None,
        enabled: bool = True,
    ) -> tuple[Webhook, str]: ...

    async def get(self, hook_id: str) -> Webhook: ...

    async def update(
        self,
        hook_id: str,
        *,
        name: str | None = None,
        resource: str | None = None,
        event: str | None = None,
        target_url: str | None = None,
        mode: str | None = None,
        timeout_ms: int | None = None,
        enabled: bool | None = None,
    ) -> Webhook: ...

    async def enable(self, hook_id: str) -> Webhook: ...

    async def disable(self, hook_id: str) -> Webhook: ...

    async def delete(self, hook_id: str) -> None: ...

    async def rotate_secret(self, hook_id: str, *, grace_seconds: int = 0) -> str: ...

    async def deliveries(
        self, hook_id: str, *, limit: int = 100, offset: int = 0
    ) -> list[WebhookDelivery]: ...

    async def list(self, *, limit: int = 100, offset: int = 0) -> list[Webhook]: ...


@runtime_checkable
class AsyncMemoryAPI(Protocol):
    """``MemoryAPI`` for asyncio code: the same members, the methods as coroutines."""

    @property
    def sessions(self) -> AsyncSessionsAPI: ...

    @property
    def messages(self) -> AsyncMessagesAPI: ...

    @property
    def facts(self) -> AsyncFactsAPI: ...

    @property
    def summaries(self) -> AsyncSummariesAPI: ...

    @property
    def topics(self) -> AsyncTopicsAPI: ...

    @property
    def webhooks(self) -> AsyncWebhooksAPI: ...

    async def add_messages(
        self,
        session_id: str,
        messages: Sequence[MessageInput | dict[str, Any]],
        *,
        sync: bool = False,
    ) -> AddResult: ...

    async def get_memory(
        self,
        session_id: str,
        query: str | None = None,
        *,
        details: bool = False,
        recall_config: RecallConfig | dict[str, Any] | None = None,
        metadata_filters: dict[str, Any] | None = None,
        exclude_texts: Sequence[str] = (),
    ) -> MemoryContext: ...

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
    ) -> list[Hit]: ...

    async def wait(self, timeout: float | None = None) -> None: ...

    async def processing_status(self, session_id: str) -> ProcessingStatus: ...

    async def set_status(self, summary_id: str, status: str, *, reason: str) -> Summary: ...

    async def forget(
        self,
        *,
        user_id: str,
        message_ids: Sequence[str] | None = None,
        session_id: str | None = None,
        topic_id: str | None = None,
        reason: str | None = None,
    ) -> dict[str, int]: ...

    async def erase_user(self, user_id: str, *, reason: str | None = None) -> dict[str, int]: ...

    async def export_user(self, user_id: str) -> dict[str, Any]: ...

    async def audit(
        self, *, user_id: str | None = None, limit: int = 100, offset: int = 0
    ) -> list[AuditRecord]: ...

    async def close(self) -> None: ...

    async def __aenter__(self: _M) -> _M: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...
