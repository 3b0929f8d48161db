"""``MemoryClient``: the REST API as typed Python calls, in GUMem's SDK shape.

>>> client = MemoryClient(api_key="...", base_url="http://127.0.0.1:8000")
>>> s = client.sessions.create(user_id="u1", title="trip planning")
>>> s.add_messages([{"role": "user", "content": "I moved to Berlin"}])
>>> s.get_memory("Where does the user live?", details=True).formatted_context

Sessions come back as :class:`memstrata.types.Session` bound to this client, so
``session.add_messages`` / ``session.get_memory`` act through it, exactly as sessions of an
embedded ``Memory`` do. Every answer is one of memstrata's public types.
"""

from __future__ import annotations

import builtins
import os
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, ClassVar, Generic, TypeVar

import httpx

from ..errors import ProcessingError
from ..types import (
    AddResult,
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
from ._http import DEFAULT_SYNC_TIMEOUT, Call, Transport

__all__ = ["MemoryClient"]

T = TypeVar("T")
Item = TypeVar("Item", Fact, Summary)

DEFAULT_BASE_URL = "http://127.0.0.1:8000"


def default_base_url() -> str:
    url = os.environ.get("MEMSTRATA_BASE_URL") or os.environ.get("MEMSTRATA_DATABASE_URL", "")
    return url if url.lower().startswith(("http://", "https://")) else DEFAULT_BASE_URL


def next_poll(delay: float) -> float:
    return min(0.5, delay * 1.5)


class _Sessions:
    """``client.sessions``: create and look up conversation threads."""

    def __init__(self, client: MemoryClient) -> None:
        self._c = client

    def create(
        self,
        user_id: str | Mapping[str, Any] | None = None,
        *,
        title: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        """Create a session of ``user_id`` (or return it, if ``session_id`` names an existing
        session of the same user). GUMem's form ``create({"user_id": ...})`` works too."""
        call = calls.create_session(user_id, title=title, metadata=metadata, session_id=session_id)
        return self._c._bind(self._c._send(call))

    def get(self, session_id: str) -> Session:
        return self._c._bind(self._c._send(calls.get_session(session_id)))

    def list(
        self, *, user_id: str | None = None, limit: int = 100, offset: int = 0
    ) -> list[Session]:
        rows = self._c._send(calls.list_sessions(locals()))
        return [self._c._bind(s) for s in rows]


class _Messages:
    """``client.messages``: stored messages with their processing status."""

    def __init__(self, client: MemoryClient) -> None:
        self._c = client

    def get(self, message_id: str) -> Message:
        return self._c._send(calls.get_message(message_id))

    def list(
        self,
        *,
        user_id: str | None = None,
        session_id: str | None = None,
        status: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[Message]:
        """A session's or a user's messages in acceptance order (against a server one of
        ``session_id`` and ``user_id`` is required)."""
        return self._c._send(calls.list_messages(locals()))


class _Items(Generic[Item]):
    """``client.facts`` and ``client.summaries``: a user's items of one layer."""

    _what: ClassVar[str]

    def __init__(self, client: MemoryClient) -> None:
        self._c = client

    def list(
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
        return self._c._send(calls.list_items(self._what, locals()))


class _Facts(_Items[Fact]):
    """``client.facts``: facts extracted from a user's messages, with provenance."""

    _what = "facts"

    def get(self, fact_id: str) -> Fact:
        return self._c._send(calls.get_item("facts", fact_id, Fact))


class _Summaries(_Items[Summary]):
    """``client.summaries``: long-term memory with status, evidence and history."""

    _what = "summaries"

    def get(self, summary_id: str) -> Summary:
        return self._c._send(calls.get_item("summaries", summary_id, Summary))

    def history(self, summary_id: str) -> list[dict[str, Any]]:
        """Every version of a summary: text, status, evidence, reason, actor, when."""
        return self._c._send(calls.summary_history(summary_id))


class _Topics:
    """``client.topics``: the entry points that group a user's summaries."""

    def __init__(self, client: MemoryClient) -> None:
        self._c = client

    def list(self, *, user_id: str) -> list[Topic]:
        return self._c._send(calls.list_topics(user_id))

    def get(self, topic_id: str) -> Topic:
        return self._c._send(calls.get_item("topics", topic_id, Topic))


class _Webhooks:
    """``client.webhooks``: the project's webhooks (see docs/webhooks.md)."""

    def __init__(self, client: MemoryClient) -> None:
        self._c = client

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
        return self._c._send(calls.create_webhook(fields))

    def list(self, *, limit: int = 100, offset: int = 0) -> list[Webhook]:
        return self._c._send(calls.list_webhooks(limit, offset))

    def get(self, hook_id: str) -> Webhook:
        return self._c._send(calls.get_webhook(hook_id))

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
    ) -> Webhook:
        """Change some fields (``None`` leaves a field as it is)."""
        fields = {
            "name": name,
            "resource": resource,
            "event": event,
            "target_url": target_url,
            "mode": mode,
            "timeout_ms": timeout_ms,
            "enabled": enabled,
        }
        return self._c._send(calls.update_webhook(hook_id, fields))

    def enable(self, hook_id: str) -> Webhook:
        return self.update(hook_id, enabled=True)

    def disable(self, hook_id: str) -> Webhook:
        return self.update(hook_id, enabled=False)

    def delete(self, hook_id: str) -> None:
        self._c._send(calls.delete_webhook(hook_id))

    def rotate_secret(self, hook_id: str, *, grace_seconds: int = 0) -> str:
        return self._c._send(calls.rotate_webhook_secret(hook_id, grace_seconds))

    def deliveries(
        self, hook_id: str, *, limit: int = 100, offset: int = 0
    ) -> builtins.list[WebhookDelivery]:
        return self._c._send(calls.webhook_deliveries(hook_id, limit, offset))


class _UserActions:
    """``client.user_actions``: behaviour events (searches, clicks, views, tool calls)."""

    def __init__(self, client: MemoryClient) -> None:
        self._c = client

    def record(
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
        """Record one event (the keyword fields) or several (``events``) for ``user_id``;
        they go to ``session_id`` or the user's own ``actions-<user_id>`` session.
        GUMem's form ``record({"user_id": ..., "event_type": ...})`` works too."""
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
        return self._c._send(
            calls.record_actions(user_id, fields, sync_timeout=self._c.sync_timeout)
        )


class MemoryClient:
    """A memstrata server, over HTTP.

    ``api_key`` defaults to ``MEMSTRATA_API_KEY``; ``base_url`` to ``MEMSTRATA_BASE_URL`` (or
    an http(s) ``MEMSTRATA_DATABASE_URL``), else ``http://127.0.0.1:8000``. ``timeout`` bounds
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
            api_key if api_key is not None else os.environ.get("MEMSTRATA_API_KEY"),
            timeout=timeout,
            connect_timeout=connect_timeout,
            max_retries=max_retries,
            headers=headers,
            http_client=http_client,
        )
        self.base_url = self._transport.base_url
        self.sync_timeout = sync_timeout
        self._written: set[str] = set()
        self._written_lock = threading.Lock()
        self._project_id: str | None = None
        self.sessions = _Sessions(self)
        self.messages = _Messages(self)
        self.facts = _Facts(self)
        self.summaries = _Summaries(self)
        self.topics = _Topics(self)
        self.user_actions = _UserActions(self)
        self.webhooks = _Webhooks(self)

    # -- plumbing -----------------------------------------------------------------------

    def _send(self, call: Call[T]) -> T:
        return self._transport.send(call)

    def _bind(self, session: Session) -> Session:
        session._memory = self
        self._project_id = session.project_id
        return session

    # -- write --------------------------------------------------------------------------

    def add_messages(
        self,
        session_id: str,
        messages: Sequence[MessageInput | Mapping[str, Any]],
        *,
        sync: bool = False,
    ) -> AddResult:
        """Store messages durably on the server and queue their processing; with
        ``sync=True`` return once they are processed. Messages without an ``id`` get one
        before the first try (your own ids are kept; all are in ``message_ids``), so the
        client's resends after a lost answer store each message once."""
        result = self._send(
            calls.add_messages(session_id, messages, sync=sync, sync_timeout=self.sync_timeout)
        )
        if not result.processed:
            with self._written_lock:
                self._written.add(result.session_id)
        return result

    def wait(self, timeout: float | None = None) -> None:
        """Block until the server has processed every message this client sent (scripts,
        tests). Raises ``ProcessingError`` if ``timeout`` seconds pass first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.02
        while True:
            with self._written_lock:
                pending = sorted(self._written)
            for sid in pending:
                try:
                    done = self.processing_status(sid).done
                except NotFoundError:  # forgotten or erased meanwhile: nothing to wait for
                    done = True
                if done:
                    with self._written_lock:
                        self._written.discard(sid)
            with self._written_lock:
                left = sorted(self._written)
            if not left:
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise ProcessingError(
                    f"messages of {len(left)} session(s) still unprocessed after {timeout} s "
                    f"(e.g. {left[0]!r}); they stay queued on the server"
                )
            pause = delay if deadline is None else min(delay, deadline - time.monotonic())
            time.sleep(max(0.0, pause))
            delay = next_poll(delay)

    # -- read ---------------------------------------------------------------------------

    def get_memory(
        self,
        session_id: str,
        query: str | Mapping[str, Any] | None = None,
        *,
        details: bool = False,
        recall_config: RecallConfig | Mapping[str, Any] | None = None,
        metadata_filters: Mapping[str, Any] | None = None,
    ) -> MemoryContext:
        """What to put before the next model call in this session. GUMem's form
        ``get_memory(session_id, {"query": ..., "details": True})`` works too."""
        return self._send(calls.get_context(locals()))

    def search(
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
        """Ranked memories of ``user_id`` of every layer, each with ``message_ids``."""
        return self._send(calls.search(locals()))

    def processing_status(self, session_id: str) -> ProcessingStatus:
        """How far a session's messages are through the write pipeline."""
        return self._send(calls.processing_status(session_id))

    def health(self) -> dict[str, Any]:
        """``GET /healthz`` (no key needed): ``{"status": "ok", "version": ...}``."""
        return self._send(calls.health())

    # -- governance ---------------------------------------------------------------------

    def set_status(self, summary_id: str, status: str, *, reason: str) -> Summary:
        """Move a summary to active, deprioritized, archived or deleted; the server audits
        the change with ``reason`` and the calling key."""
        return self._send(calls.set_status(summary_id, status, reason))

    def forget(
        self,
        *,
        user_id: str,
        message_ids: Sequence[str] | None = None,
        session_id: str | None = None,
        topic_id: str | None = None,
        reason: str | None = None,
    ) -> dict[str, int]:
        """Delete some of a user's memory (exactly one scope) from provenance upward;
        returns counts by layer."""
        return self._send(calls.forget(locals()))

    def erase_user(self, user_id: str, *, reason: str | None = None) -> dict[str, int]:
        """Remove everything held about ``user_id``; returns counts by layer."""
        return self._send(calls.erase_user(user_id, reason))

    def export_user(self, user_id: str) -> dict[str, Any]:
        """A user's whole memory as JSON-ready data."""
        return self._send(calls.export_user(user_id))

    def audit(
        self, *, user_id: str | None = None, limit: int = 100, offset: int = 0
    ) -> list[AuditRecord]:
        """Status changes, forgets and erasures in the key's project."""
        return self._send(calls.audit(user_id, limit, offset))

    # -- lifetime -----------------------------------------------------------------------

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
