"""``AsyncMemoryClient``: :class:`MemoryClient` for asyncio, on ``httpx.AsyncClient``.

Every method is the sync client's as a coroutine, built from the same request
descriptions (``_calls``), so both send the same requests and return the same types.
Sessions come back as :class:`~memstrata.types.AsyncSession` (``AsyncMemory``'s too),
whose ``add_messages`` / ``get_memory`` are coroutines.
"""

from __future__ import annotations

import asyncio
import builtins
import os
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, ClassVar, Generic, TypeVar

import httpx

from ..errors import ProcessingError
from ..types import (
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
from . import _calls as calls
from ._errors import NotFoundError
from ._http import DEFAULT_SYNC_TIMEOUT, AsyncTransport, Call
from ._sync import default_base_url, next_poll

__all__ = ["AsyncMemoryClient", "AsyncSession"]

T = TypeVar("T")
Item = TypeVar("Item", Fact, Summary)


class _Sessions:
    def __init__(self, client: AsyncMemoryClient) -> None:
        self._c = client

    async def create(
        self,
        user_id: str | Mapping[str, Any] | None = None,
        *,
        title: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        session_id: str | None = None,
    ) -> AsyncSession:
        call = calls.create_session(user_id, title=title, metadata=metadata, session_id=session_id)
        return self._c._bind(await self._c._send(call))

    async def get(self, session_id: str) -> AsyncSession:
        return self._c._bind(await self._c._send(calls.get_session(session_id)))

    async def list(
        self, *, user_id: str | None = None, limit: int = 100, offset: int = 0
    ) -> list[AsyncSession]:
        rows = await self._c._send(calls.list_sessions(locals()))
        return [self._c._bind(s) for s in rows]


class _Messages:
    def __init__(self, client: AsyncMemoryClient) -> None:
        self._c = client

    async def get(self, message_id: str) -> Message:
        return await self._c._send(calls.get_message(message_id))

    async def list(
        self,
        *,
        user_id: str | None = None,
        session_id: str | None = None,
        status: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[Message]:
        return await self._c._send(calls.list_messages(locals()))


class _Items(Generic[Item]):
    """``client.facts`` and ``client.summaries``: a user's items of one layer."""

    _what: ClassVar[str]

    def __init__(self, client: AsyncMemoryClient) -> None:
        self._c = client

    async def list(
        self,
        *,
        user_id: str | None = None,
        status: str | Sequence[str] | None = None,
        since: datetime | str | None = None,
        until: datetime | str | None = None,
        metadata_filters: Mapping[str, Any] | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[Item]:
        return await self._c._send(calls.list_items(self._what, locals()))


class _Facts(_Items[Fact]):
    _what = "facts"

    async def get(self, fact_id: str) -> Fact:
        return await self._c._send(calls.get_item("facts", fact_id, Fact))


class _Summaries(_Items[Summary]):
    _what = "summaries"

    async def get(self, summary_id: str) -> Summary:
        return await self._c._send(calls.get_item("summaries", summary_id, Summary))

    async def history(self, summary_id: str) -> list[dict[str, Any]]:
        return await self._c._send(calls.summary_history(summary_id))


class _Topics:
    def __init__(self, client: AsyncMemoryClient) -> None:
        self._c = client

    async def list(self, *, user_id: str) -> list[Topic]:
        return await self._c._send(calls.list_topics(user_id))

    async def get(self, topic_id: str) -> Topic:
        return await self._c._send(calls.get_item("topics", topic_id, Topic))


class _Webhooks:
    """``client.webhooks``: the project's webhooks (see docs/webhooks.md)."""

    def __init__(self, client: AsyncMemoryClient) -> None:
        self._c = client

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
    ) -> tuple[Webhook, str]:
        """The webhook and its signing secret (``whsec_...``), shown only now."""
        fields = {
            "resource": resource,
            "event": event,
            "target_url": target_url,
            "mode": mode,
            "name": name,
            "timeout_ms": timeout_ms,
            "enabled": enabled,
        }
        return await self._c._send(calls.create_webhook(fields))

    async def list(self, *, limit: int = 100, offset: int = 0) -> list[Webhook]:
        return await self._c._send(calls.list_webhooks(limit, offset))

    async def get(self, hook_id: str) -> Webhook:
        return await self._c._send(calls.get_webhook(hook_id))

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
    ) -> Webhook:
        fields = {
            "name": name,
            "resource": resource,
            "event": event,
            "target_url": target_url,
            "mode": mode,
            "timeout_ms": timeout_ms,
            "enabled": enabled,
        }
        return await self._c._send(calls.update_webhook(hook_id, fields))

    async def enable(self, hook_id: str) -> Webhook:
        return await self.update(hook_id, enabled=True)

    async def disable(self, hook_id: str) -> Webhook:
        return await self.update(hook_id, enabled=False)

    async def delete(self, hook_id: str) -> None:
        await self._c._send(calls.delete_webhook(hook_id))

    async def rotate_secret(self, hook_id: str, *, grace_seconds: int = 0) -> str:
        return await self._c._send(calls.rotate_webhook_secret(hook_id, grace_seconds))

    async def deliveries(
        self, hook_id: str, *, limit: int = 100, offset: int = 0
    ) -> builtins.list[WebhookDelivery]:
        return await self._c._send(calls.webhook_deliveries(hook_id, limit, offset))


class _UserActions:
    def __init__(self, client: AsyncMemoryClient) -> None:
        self._c = client

    async def record(
        self,
        user_id: str | Mapping[str, Any],
        *,
        event_type: str | None = None,
        content: str | None = None,
        page: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        timestamp: datetime | str | None = None,
        id: str | None = None,
        events: Sequence[Mapping[str, Any]] | None = None,
        session_id: str | None = None,
        sync: bool = False,
    ) -> AddResult:
        fields = {
            "event_type": event_type,
            "content": content,
            "page": page,
            "metadata": metadata,
            "timestamp": timestamp,
            "id": id,
            "events": events,
            "session_id": session_id,
            "sync": sync or None,
        }
        return await self._c._send(
            calls.record_actions(user_id, fields, sync_timeout=self._c.sync_timeout)
        )


class AsyncMemoryClient:
    """A memstrata server, over HTTP, for asyncio code; the arguments are
    :class:`~memstrata.client.MemoryClient`'s (``http_client`` is an
    ``httpx.AsyncClient``). Use ``async with`` or ``await client.aclose()``."""

    def __init__(
        self,
        api_key: str | None = None,
        base_url: str | None = None,
        *,
        timeout: float | httpx.Timeout | None = None,
        connect_timeout: float | None = None,
        max_retries: int | None = None,
        sync_timeout: float = DEFAULT_SYNC_TIMEOUT,
        headers: Mapping[str, str] | None = None,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        self._transport = AsyncTransport(
            base_url or default_base_url(),
            api_key if api_key is not None else os.environ.get("MEMSTRATA_API_KEY"),
            timeout=timeout,
            connect_timeout=connect_timeout,
            max_retries=max_retries,
            headers=headers,
            http_client=http_client,
        )
        self.base_url = self._transport.base_url
        self.sync_timeout = sync_timeout
        # One event loop drives this client, so plain set operations cannot interleave.
        self._written: set[str] = set()
        self.sessions = _Sessions(self)
        self.messages = _Messages(self)
        self.facts = _Facts(self)
        self.summaries = _Summaries(self)
        self.topics = _Topics(self)
        self.user_actions = _UserActions(self)
        self.webhooks = _Webhooks(self)

    async def _send(self, call: Call[T]) -> T:
        return await self._transport.send(call)

    def _bind(self, session: Session) -> AsyncSession:
        return AsyncSession(session, self)

    async def add_messages(
        self,
        session_id: str,
        messages: Sequence[MessageInput | Mapping[str, Any]],
        *,
        sync: bool = False,
    ) -> AddResult:
        result = await self._send(
            calls.add_messages(session_id, messages, sync=sync, sync_timeout=self.sync_timeout)
        )
        if not result.processed:
            self._written.add(result.session_id)
        return result

    async def wait(self, timeout: float | None = None) -> None:
        """Until the server has processed every message this client sent; raises
        ``ProcessingError`` if ``timeout`` seconds pass first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.02
        while True:
            for sid in sorted(self._written):
                try:
                    done = (await self.processing_status(sid)).done
                except NotFoundError:
                    done = True
                if done:
                    self._written.discard(sid)
            if not self._written:
                return
            if deadline is not None and time.monotonic() >= deadline:
                left = sorted(self._written)
                raise ProcessingError(
                    f"messages of {len(left)} session(s) still unprocessed after {timeout} s "
                    f"(e.g. {left[0]!r}); they stay queued on the server"
                )
            pause = delay if deadline is None else min(delay, deadline - time.monotonic())
            await asyncio.sleep(max(0.0, pause))
            delay = next_poll(delay)

    async def get_memory(
        self,
        session_id: str,
        query: str | Mapping[str, Any] | None = None,
        *,
        details: bool = False,
        recall_config: RecallConfig | Mapping[str, Any] | None = None,
        metadata_filters: Mapping[str, Any] | None = None,
    ) -> MemoryContext:
        return await self._send(calls.get_context(locals()))

    async def search(
        self,
        query: str,
        *,
        user_id: str,
        limit: int = 10,
        filters: Mapping[str, Any] | None = None,
        session_id: str | None = None,
        since: datetime | str | None = None,
        until: datetime | str | None = None,
        roles: Sequence[str] | None = None,
        event_types: Sequence[str] | None = None,
        as_of: datetime | str | None = None,
        layers: Sequence[str] | None = None,
        include_superseded: bool | None = None,
        recall_config: RecallConfig | Mapping[str, Any] | None = None,
    ) -> list[Hit]:
        return await self._send(calls.search(locals()))

    async def processing_status(self, session_id: str) -> ProcessingStatus:
        return await self._send(calls.processing_status(session_id))

    async def health(self) -> dict[str, Any]:
        return await self._send(calls.health())

    async def set_status(self, summary_id: str, status: str, *, reason: str) -> Summary:
        return await self._send(calls.set_status(summary_id, status, reason))

    async def forget(
        self,
        *,
        user_id: str,
        message_ids: Sequence[str] | None = None,
        session_id: str | None = None,
        topic_id: str | None = None,
        reason: str | None = None,
    ) -> dict[str, int]:
        return await self._send(calls.forget(locals()))

    async def erase_user(self, user_id: str, *, reason: str | None = None) -> dict[str, int]:
        return await self._send(calls.erase_user(user_id, reason))

    async def export_user(self, user_id: str) -> dict[str, Any]:
        return await self._send(calls.export_user(user_id))

    async def audit(
        self, *, user_id: str | None = None, limit: int = 100, offset: int = 0
    ) -> list[AuditRecord]:
        return await self._send(calls.audit(user_id, limit, offset))

    async def aclose(self) -> None:
        """Close the connection pool (not an ``http_client`` you passed in)."""
        await self._transport.aclose()

    async def close(self) -> None:
        await self.aclose()

    async def __aenter__(self) -> AsyncMemoryClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_url={self.base_url!r})"
