"""``MemoryClient``: the REST API as typed Python calls, in GUMem's SDK shape.

>>> client = MemoryClient(api_key="...", base_url="http://127.0.0.1:8000")
>>> s = client.sessions.create(user_id="u1", title="trip planning")
>>> s.add_messages([{"role": "user", "content": "I moved to Berlin"}])
>>> s.get_memory("Where does the user live?", details=True).formatted_context

Sessions come back as :class:`stratamem.types.Session` bound to this client, so
``session.add_messages`` / ``session.get_memory`` act through it, exactly as sessions of an
embedded ``Memory`` do. Every answer is one of stratamem's public types. Each method is
made of its request in ``_calls`` (:func:`~._calls.sends`), as the async client's are.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Generic, TypeVar

import httpx

from ..types import Fact, Session, Summary
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
    sends,
)
from ._errors import NotFoundError
from ._http import DEFAULT_SYNC_TIMEOUT, Call, Transport

__all__ = ["MemoryClient"]

T = TypeVar("T")

DEFAULT_BASE_URL = "http://127.0.0.1:8000"


def default_base_url() -> str:
    url = os.environ.get("STRATAMEM_BASE_URL") or os.environ.get("STRATAMEM_DATABASE_URL", "")
    return url if url.lower().startswith(("http://", "https://")) else DEFAULT_BASE_URL


class _Face:
    def __init__(self, client: MemoryClient, calls: Any) -> None:
        self._c = client
        self._calls = calls

    def _send(self, call: Call[T]) -> T:
        return self._c._send(call)


class _Sessions(_Face):
    __doc__ = SessionCalls.__doc__

    def create(
        self,
        user_id: str | Mapping[str, Any] | None = None,
        *,
        title: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        call = self._calls.create(user_id, title=title, metadata=metadata, session_id=session_id)
        return self._c._bind(self._send(call))

    def get(self, session_id: str) -> Session:
        return self._c._bind(self._send(self._calls.get(session_id)))

    def list(
        self, *, user_id: str | None = None, limit: int = 100, offset: int = 0
    ) -> list[Session]:
        rows = self._send(self._calls.list(user_id=user_id, limit=limit, offset=offset))
        return [self._c._bind(s) for s in rows]


class _Messages(_Face):
    __doc__ = MessageCalls.__doc__
    get = sends(MessageCalls.get)
    list = sends(MessageCalls.list)


class _Items(_Face, Generic[Item]):
    pass


class _Facts(_Items[Fact]):
    __doc__ = FactCalls.__doc__
    list = sends(FactCalls.list)
    get = sends(FactCalls.get)


class _Summaries(_Items[Summary]):
    __doc__ = SummaryCalls.__doc__
    list = sends(SummaryCalls.list)
    get = sends(SummaryCalls.get)
    history = sends(SummaryCalls.history)


class _Topics(_Face):
    __doc__ = TopicCalls.__doc__
    list = sends(TopicCalls.list)
    get = sends(TopicCalls.get)


class _Webhooks(_Face):
    __doc__ = WebhookCalls.__doc__
    create = sends(WebhookCalls.create)
    list = sends(WebhookCalls.list)
    get = sends(WebhookCalls.get)
    update = sends(WebhookCalls.update)
    enable = sends(WebhookCalls.enable)
    disable = sends(WebhookCalls.disable)
    delete = sends(WebhookCalls.delete)
    rotate_secret = sends(WebhookCalls.rotate_secret)
    deliveries = sends(WebhookCalls.deliveries)


class _UserActions(_Face):
    __doc__ = ActionCalls.__doc__
    record = sends(ActionCalls.record)


class MemoryClient:
    """A stratamem server, over HTTP.

    ``api_key`` defaults to ``STRATAMEM_API_KEY``; ``base_url`` to ``STRATAMEM_BASE_URL`` (or
    an http(s) ``STRATAMEM_DATABASE_URL``), else ``http://127.0.0.1:8000``. ``timeout`` bounds
    each request's wait for an answer (seconds, or an ``httpx.Timeout``) and
    ``connect_timeout`` the connection; ``add_messages(sync=True)`` waits up to
    ``sync_timeout`` since the server processes before it answers. Requests that never
    reached the server, and idempotent ones whose connection dropped or that met a 503, are
    retried ``max_retries`` times with jittered backoff; messages, events and new sessions
    get their ids before the first try, so their writes are idempotent (docs/client.md).
    ``http_client`` lets you bring an ``httpx.Client`` (proxies, TLS, transports); it
    stays yours to close.
    """

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
        http_client: httpx.Client | None = None,
    ) -> None:
        self._transport = Transport(
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
        self._project_id: str | None = None
        self.sessions = _Sessions(self, SessionCalls())
        self.messages = _Messages(self, MessageCalls())
        self.facts = _Facts(self, FactCalls())
        self.summaries = _Summaries(self, SummaryCalls())
        self.topics = _Topics(self, TopicCalls())
        self.user_actions = _UserActions(self, ActionCalls(sync_timeout))
        self.webhooks = _Webhooks(self, WebhookCalls())

    def _send(self, call: Call[T]) -> T:
        return self._transport.send(call)

    def _bind(self, session: Session) -> Session:
        session._memory = self
        self._project_id = session.project_id
        return session

    add_messages = sends(MemoryCalls.add_messages)

    def wait(self, timeout: float | None = None) -> None:
        """Block until the server has processed every message this client sent (scripts,
        tests). Raises ``ProcessingError`` if ``timeout`` seconds pass first."""
        poll = Poll(timeout)
        while True:
            for sid in self._written.pending():
                try:
                    done = self.processing_status(sid).done
                except NotFoundError:  # forgotten or erased meanwhile: nothing to wait for
                    done = True
                if done:
                    self._written.discard(sid)
            left = self._written.pending()
            if not left:
                return
            time.sleep(poll.pause(left))

    get_memory = sends(MemoryCalls.get_memory)
    search = sends(MemoryCalls.search)
    processing_status = sends(MemoryCalls.processing_status)
    health = sends(MemoryCalls.health)
    set_status = sends(MemoryCalls.set_status)
    forget = sends(MemoryCalls.forget)
    erase_user = sends(MemoryCalls.erase_user)
    export_user = sends(MemoryCalls.export_user)
    audit = sends(MemoryCalls.audit)

    def close(self) -> None:
        """Close the connection pool (not an ``http_client`` you passed in)."""
        self._transport.close()

    def __enter__(self) -> MemoryClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_url={self.base_url!r})"
