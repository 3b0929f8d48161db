"""``AsyncMemoryClient``: :class:`MemoryClient` for asyncio, on ``httpx.AsyncClient``.

Every method is the sync client's as a coroutine, made of the same request in ``_calls``
(:func:`~._calls.awaits`), so both send the same requests and return the same types.
Sessions come back as :class:`~stratamem.types.AsyncSession` (``AsyncMemory``'s too),
whose ``add_messages`` / ``get_memory`` are coroutines.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Generic, TypeVar

import httpx

from ..types import AsyncSession, Fact, Session, Summary
from ._calls import (
    ActionCalls,
    FactCalls,
    Item,
    MemoryCalls,
    MessageCalls,
    Poll,
    SessionCalls,
    SummaryCalls,
    TopicCalls,
    WebhookCalls,
    Written,
    awaits,
)
from ._errors import NotFoundError
from ._http import DEFAULT_SYNC_TIMEOUT, AsyncTransport, Call
from ._sync import default_base_url

__all__ = ["AsyncMemoryClient", "AsyncSession"]

T = TypeVar("T")


class _Face:
    def __init__(self, client: AsyncMemoryClient, calls: Any) -> None:
        self._c = client
        self._calls = calls

    async def _send(self, call: Call[T]) -> T:
        return await self._c._send(call)


class _Sessions(_Face):
    __doc__ = SessionCalls.__doc__

    async def create(
        self,
        user_id: str | Mapping[str, Any] | None = None,
        *,
        title: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        session_id: str | None = None,
    ) -> AsyncSession:
        call = self._calls.create(user_id, title=title, metadata=metadata, session_id=session_id)
        return self._c._bind(await self._send(call))

    async def get(self, session_id: str) -> AsyncSession:
        return self._c._bind(await self._send(self._calls.get(session_id)))

    async def list(
        self, *, user_id: str | None = None, limit: int = 100, offset: int = 0
    ) -> list[AsyncSession]:
        rows = await self._send(self._calls.list(user_id=user_id, limit=limit, offset=offset))
        return [self._c._bind(s) for s in rows]


class _Messages(_Face):
    __doc__ = MessageCalls.__doc__
    get = awaits(MessageCalls.get)
    list = awaits(MessageCalls.list)


class _Items(_Face, Generic[Item]):
    pass


class _Facts(_Items[Fact]):
    __doc__ = FactCalls.__doc__
    list = awaits(FactCalls.list)
    get = awaits(FactCalls.get)


class _Summaries(_Items[Summary]):
    __doc__ = SummaryCalls.__doc__
    list = awaits(SummaryCalls.list)
    get = awaits(SummaryCalls.get)
    history = awaits(SummaryCalls.history)


class _Topics(_Face):
    __doc__ = TopicCalls.__doc__
    list = awaits(TopicCalls.list)
    get = awaits(TopicCalls.get)


class _Webhooks(_Face):
    __doc__ = WebhookCalls.__doc__
    create = awaits(WebhookCalls.create)
    list = awaits(WebhookCalls.list)
    get = awaits(WebhookCalls.get)
    update = awaits(WebhookCalls.update)
    enable = awaits(WebhookCalls.enable)
    disable = awaits(WebhookCalls.disable)
    delete = awaits(WebhookCalls.delete)
    rotate_secret = awaits(WebhookCalls.rotate_secret)
    deliveries = awaits(WebhookCalls.deliveries)


class _UserActions(_Face):
    __doc__ = ActionCalls.__doc__
    record = awaits(ActionCalls.record)


class AsyncMemoryClient:
    """A stratamem server, over HTTP, for asyncio code; the arguments are
    :class:`~stratamem.client.MemoryClient`'s (``http_client`` is an
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
            api_key if api_key is not None else os.environ.get("STRATAMEM_API_KEY"),
            timeout=timeout,
            connect_timeout=connect_timeout,
            max_retries=max_retries,
            headers=headers,
            http_client=http_client,
        )
        self.base_url = self._transport.base_url
        self.sync_timeout = sync_timeout
        self._written = Written()
        self._calls = MemoryCalls(sync_timeout, self._written)
        self.sessions = _Sessions(self, SessionCalls())
        self.messages = _Messages(self, MessageCalls())
        self.facts = _Facts(self, FactCalls())
        self.summaries = _Summaries(self, SummaryCalls())
        self.topics = _Topics(self, TopicCalls())
        self.user_actions = _UserActions(self, ActionCalls(sync_timeout))
        self.webhooks = _Webhooks(self, WebhookCalls())

    async def _send(self, call: Call[T]) -> T:
        return await self._transport.send(call)

    def _bind(self, session: Session) -> AsyncSession:
        return AsyncSession(session, self)

    add_messages = awaits(MemoryCalls.add_messages)

    async def wait(self, timeout: float | None = None) -> None:
        """Until the server has processed every message this client sent; raises
        ``ProcessingError`` if ``timeout`` seconds pass first."""
        poll = Poll(timeout)
        while True:
            for sid in self._written.pending():
                try:
                    done = (await self.processing_status(sid)).done
                except NotFoundError:
                    done = True
                if done:
                    self._written.discard(sid)
            left = self._written.pending()
            if not left:
                return
            await asyncio.sleep(poll.pause(left))

    get_memory = awaits(MemoryCalls.get_memory)
    search = awaits(MemoryCalls.search)
    processing_status = awaits(MemoryCalls.processing_status)
    health = awaits(MemoryCalls.health)
    set_status = awaits(MemoryCalls.set_status)
    forget = awaits(MemoryCalls.forget)
    erase_user = awaits(MemoryCalls.erase_user)
    export_user = awaits(MemoryCalls.export_user)
    audit = awaits(MemoryCalls.audit)

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
