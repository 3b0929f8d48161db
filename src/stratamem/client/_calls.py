"""The REST API as :class:`Call` values, one class per face of the client: which route each
operation uses and how its answer becomes stratamem's public types.

Each method here has the public signature and docstring of the client method it becomes:
:func:`sends` makes the sync client's method of it (build the call, send it) and
:func:`awaits` the async client's, so both clients take the same arguments, send the same
bytes and return the same objects, and neither spells a signature out again."""

from __future__ import annotations

import functools
import inspect
import json
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar

from pydantic import BaseModel, TypeAdapter

from .. import _checks
from .._checks import MAX_LIMIT, new_id
from .._queries import (
    ContextQuery,
    FactQuery,
    ForgetScope,
    ItemQuery,
    ListQuery,
    MessageQuery,
    Query,
    SearchQuery,
    SummaryQuery,
    arguments,
)
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
from ._errors import ValidationError
from ._http import Call, path_segment

__all__ = [
    "ActionCalls",
    "FactCalls",
    "Item",
    "MemoryCalls",
    "MessageCalls",
    "Poll",
    "SessionCalls",
    "SummaryCalls",
    "TopicCalls",
    "WebhookCalls",
    "Written",
    "awaits",
    "sends",
]

P = ParamSpec("P")
T = TypeVar("T")
Q = TypeVar("Q", bound=Query)
M = TypeVar("M", bound=BaseModel)
Item = TypeVar("Item", Fact, Summary)


# -- methods made of calls -----------------------------------------------------------------


class _Sender(Protocol):
    _calls: Any

    def _send(self, call: Call[Any]) -> Any: ...


def _made_of(method: Callable[..., Any], build: Callable[..., Any]) -> None:
    # The method's signature is its call's, returning what the call's answer parses to;
    # kept as the annotation's text, as the call's own is (postponed annotations).
    returns = build.__annotations__["return"]
    if returns.startswith("Call[") and returns.endswith("]"):
        returns = returns[len("Call[") : -1]
    method.__annotations__ = {**build.__annotations__, "return": returns}
    method.__signature__ = inspect.signature(build).replace(  # type: ignore[attr-defined]
        return_annotation=returns
    )


def sends(build: Callable[Concatenate[Any, P], Call[T]]) -> Callable[Concatenate[Any, P], T]:
    """The sync client's method of a call builder: the face (or client) builds the call
    with its ``_calls`` and sends it; the same signature and docstring."""
    name = build.__name__

    @functools.wraps(build)
    def method(self: _Sender, /, *args: P.args, **kwargs: P.kwargs) -> T:
        result: T = self._send(getattr(self._calls, name)(*args, **kwargs))
        return result

    _made_of(method, build)
    return method


def awaits(
    build: Callable[Concatenate[Any, P], Call[T]],
) -> Callable[Concatenate[Any, P], Coroutine[Any, Any, T]]:
    """``sends`` for the async client: the same method as a coroutine."""
    name = build.__name__

    @functools.wraps(build)
    async def method(self: _Sender, /, *args: P.args, **kwargs: P.kwargs) -> T:
        sent: Awaitable[T] = self._send(getattr(self._calls, name)(*args, **kwargs))
        return await sent

    _made_of(method, build)
    return method


class Written:
    """The sessions a client sent messages to that the server may not have processed yet
    (what ``wait()`` waits for); thread-safe, as a sync client may be shared."""

    def __init__(self) -> None:
        self._ids: set[str] = set()
        self._lock = threading.Lock()

    def add(self, session_id: str) -> None:
        with self._lock:
            self._ids.add(session_id)

    def discard(self, session_id: str) -> None:
        with self._lock:
            self._ids.discard(session_id)

    def pending(self) -> list[str]:
        with self._lock:
            return sorted(self._ids)


class Poll:
    """The pauses of ``wait()``'s polling, growing to half a second, within ``timeout``."""

    def __init__(self, timeout: float | None) -> None:
        self.timeout = timeout
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._delay = 0.02

    def pause(self, left: Sequence[str]) -> float:
        """How long to sleep before the next round; ``ProcessingError`` once past the
        deadline with sessions ``left``."""
        if self._deadline is not None and time.monotonic() >= self._deadline:
            raise ProcessingError(
                f"messages of {len(left)} session(s) still unprocessed after {self.timeout} s "
                f"(e.g. {left[0]!r}); they stay queued on the server"
            )
        delay, self._delay = self._delay, min(0.5, self._delay * 1.5)
        if self._deadline is None:
            return delay
        return max(0.0, min(delay, self._deadline - time.monotonic()))


# -- shared rules --------------------------------------------------------------------------


def check_id(value: Any, name: str) -> str:
    # Checked here because an id goes into the URL: an empty or odd one would reach another
    # route (or none) instead of being refused for what it is.
    return _checks.check_id(value, name, error=ValidationError)


def check_paging(limit: Any, offset: Any) -> tuple[int, int]:
    return _checks.check_paging(limit, offset, error=ValidationError)


def _query(model: type[Q], args: Mapping[str, Any], what: str) -> Q:
    """The query model of a client method's ``locals()``: refused here, before any request,
    by the rules (and in the words) of the embedded engine."""
    return model.build(arguments(args), what=what, error=ValidationError)


def _body(query: Query, *, path: str | None = None) -> dict[str, Any]:
    # Only what the caller gave (of a RecallConfig, only the keys they set): the server fills
    # in the rest from its own defaults, its token budget among them, as the engine does.
    leave_out = set() if path is None else {path}
    return query.model_dump(mode="json", exclude_none=True, exclude_unset=True, exclude=leave_out)


def _given(fields: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


def _time_param(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _status_param(status: tuple[str, ...]) -> str | None:
    if len(status) > 1:
        raise ValidationError(
            "invalid status",
            [f"status: the server filters by one status at a time (got {list(status)!r})"],
        )
    return status[0] if status else None


def _parse_list(model: type[M]) -> Callable[[Any], list[M]]:
    adapter = TypeAdapter(list[model])  # type: ignore[valid-type]
    parse: Callable[[Any], list[M]] = adapter.validate_python
    return parse


def _user_path(user_id: str | None, what: str) -> str:
    if user_id is None:
        raise ValidationError(
            f"invalid {what}.list",
            [f"user_id: required against a server, which lists {what} per user"],
        )
    return f"/api/users/{path_segment(check_id(user_id, 'user_id'))}/{what}"


def _with_ids(items: Any) -> tuple[Any, bool]:
    """``items`` (messages or behaviour events) each with an id, and whether all have one.

    The server stores a resent id with the same content once, so ids given before the
    first try make every resend of the request a no-op: a write whose answer was lost
    (dropped connection, a 503 after the commit) is resent without storing it twice. The
    caller's own ids are kept; the others get one in the server's own form. Anything that
    is not a list of objects goes as it is, for the server to refuse by name.
    """
    if isinstance(items, Iterable) and not isinstance(items, (str, bytes, Mapping)):
        items = [
            m.model_dump(mode="json", exclude_none=True) if isinstance(m, MessageInput) else m
            for m in items
        ]
    if not isinstance(items, list) or not items or not all(isinstance(m, Mapping) for m in items):
        return items, False
    return [m if m.get("id") is not None else {**m, "id": new_id("m")} for m in items], True


# -- the client's own methods: write, read, governance -------------------------------------


class MemoryCalls:
    """The client's methods. ``sync_timeout`` bounds ``add_messages(sync=True)``;
    ``written`` collects the sessions whose messages are not processed yet."""

    def __init__(self, sync_timeout: float, written: Written) -> None:
        self.sync_timeout = sync_timeout
        self.written = written

    def add_messages(
        self,
        session_id: str,
        messages: Sequence[MessageInput | Mapping[str, Any]],
        *,
        sync: bool = False,
    ) -> Call[AddResult]:
        """Store messages durably on the server and queue their processing; with
        ``sync=True`` return once they are processed. Messages without an ``id`` get one
        before the first try (your own ids are kept; all are in ``message_ids``), so the
        client's resends after a lost answer store each message once."""
        sid = path_segment(check_id(session_id, "session_id"))
        sent, with_ids = _with_ids(messages)

        def parse(data: Any) -> AddResult:
            result = AddResult.model_validate(data)
            if not result.processed:
                self.written.add(result.session_id)
            return result

        return Call(
            "POST",
            f"/api/sessions/{sid}/messages",
            parse,
            body={"messages": sent, "sync": sync},
            idempotent=with_ids,
            read_timeout=self.sync_timeout if sync else None,
            resend_unavailable=not sync,
        )

    def get_memory(
        self,
        session_id: str,
        query: str | Mapping[str, Any] | None = None,
        *,
        details: bool = False,
        recall_config: RecallConfig | Mapping[str, Any] | None = None,
        metadata_filters: Mapping[str, Any] | None = None,
        exclude_texts: Sequence[str] = (),
    ) -> Call[MemoryContext]:
        """What to put before the next model call in this session; ``exclude_texts``: texts
        the prompt carries already, whose messages are left out (see ``Memory.get_memory``).
        GUMem's form ``get_memory(session_id, {"query": ..., "details": True})`` works too."""
        fields = arguments(locals())
        asked = fields.pop("query")
        if isinstance(asked, Mapping):
            # GUMem's SDK form: session.get_memory({"query": ..., "details": True, ...}); the
            # keyword arguments given beside it (not left at their defaults) win.
            given = {k: v for k, v in fields.items() if v not in (None, False, ())}
            fields = {**fields, **asked, **given}
        else:
            fields["query"] = asked
        q = _query(ContextQuery, fields, "get_memory")
        # Always POST: a long query does not fit in a URL, and GET takes no recall_config.
        return Call(
            "POST",
            f"/api/sessions/{path_segment(q.session_id)}/context",
            MemoryContext.model_validate,
            body=_body(q, path="session_id"),
            idempotent=True,
        )

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
    ) -> Call[list[Hit]]:
        """Ranked memories of ``user_id`` of every layer, each with ``message_ids``."""
        q = _query(SearchQuery, locals(), "search")
        return Call(
            "POST",
            f"/api/users/{path_segment(q.user_id)}/search",
            _parse_list(Hit),
            body=_body(q, path="user_id"),
            idempotent=True,
        )

    def processing_status(self, session_id: str) -> Call[ProcessingStatus]:
        """How far a session's messages are through the write pipeline."""
        sid = path_segment(check_id(session_id, "session_id"))
        return Call("GET", f"/api/sessions/{sid}/status", ProcessingStatus.model_validate)

    def health(self) -> Call[dict[str, Any]]:
        """``GET /healthz`` (no key needed): ``{"status": "ok", "version": ...}``."""
        return Call("GET", "/healthz", dict)

    def set_status(self, summary_id: str, status: str, *, reason: str) -> Call[Summary]:
        """Move a summary to active, deprioritized, archived or deleted; the server audits
        the change with ``reason`` and the calling key."""
        sid = path_segment(check_id(summary_id, "summary_id"))
        return Call(
            "PATCH",
            f"/api/summaries/{sid}",
            Summary.model_validate,
            body={"status": status, "reason": reason},
        )

    def forget(
        self,
        *,
        user_id: str,
        message_ids: Sequence[str] | None = None,
        session_id: str | None = None,
        topic_id: str | None = None,
        reason: str | None = None,
    ) -> Call[dict[str, int]]:
        """Delete some of a user's memory (exactly one scope) from provenance upward;
        returns counts by layer."""
        scope = _query(ForgetScope, locals(), "forget")
        return Call("POST", "/api/forget", dict, body=_body(scope))

    def erase_user(self, user_id: str, *, reason: str | None = None) -> Call[dict[str, int]]:
        """Remove everything held about ``user_id``; returns counts by layer."""
        uid = path_segment(check_id(user_id, "user_id"))
        # Not resent after a dropped connection: a second erase would add a second audit
        # record.
        return Call(
            "DELETE", f"/api/users/{uid}", dict, params={"reason": reason}, idempotent=False
        )

    def export_user(self, user_id: str) -> Call[dict[str, Any]]:
        """A user's whole memory as JSON-ready data."""
        uid = path_segment(check_id(user_id, "user_id"))
        return Call("GET", f"/api/users/{uid}/export", dict)

    def audit(
        self,
        *,
        user_id: str | None = None,
        limit: int = 100,
        offset: int = 0,
        newest_first: bool = False,
    ) -> Call[list[AuditRecord]]:
        """Status changes, forgets and erasures in the key's project, oldest first (or
        newest first)."""
        if user_id is not None:
            check_id(user_id, "user_id")
        return Call(
            "GET",
            "/api/audit",
            _parse_list(AuditRecord),
            params={"user_id": user_id, "newest_first": "true" if newest_first else None},
            paged=check_paging(limit, offset),
        )


# -- the faces -----------------------------------------------------------------------------


class SessionCalls:
    """``client.sessions``: create and look up conversation threads (each client binds the
    sessions that come back to itself)."""

    def create(
        self,
        user_id: str | Mapping[str, Any] | None = None,
        *,
        title: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Call[Session]:
        """Create a session of ``user_id`` (or return it, if ``session_id`` names an existing
        session of the same user). GUMem's form ``create({"user_id": ...})`` works too."""
        body: dict[str, Any] = {}
        if isinstance(user_id, Mapping):
            # GUMem's SDK form: sessions.create({"user_id": ..., "title": ...}). Keys are
            # sent as given; the server refuses unknown ones by name.
            body.update(user_id)
        elif user_id is not None:
            body["user_id"] = user_id
        body.update(_given({"title": title, "metadata": metadata, "session_id": session_id}))
        if "user_id" not in body:
            raise ValidationError("invalid session", ["user_id: required"])
        # The id is chosen here, before the first try, in the server's own form: a resend
        # after a lost answer then returns the session the first try made, not a second one.
        if body.get("session_id") is None:
            body["session_id"] = new_id("s")
        return Call("POST", "/api/sessions", Session.model_validate, body=body, idempotent=True)

    def get(self, session_id: str) -> Call[Session]:
        sid = path_segment(check_id(session_id, "session_id"))
        return Call("GET", f"/api/sessions/{sid}", Session.model_validate)

    def list(
        self, *, user_id: str | None = None, limit: int = 100, offset: int = 0
    ) -> Call[list[Session]]:
        q = _query(ListQuery, locals(), "sessions.list")
        return Call(
            "GET",
            "/api/sessions",
            _parse_list(Session),
            params={"user_id": q.user_id},
            paged=(q.limit, q.offset),
        )


class MessageCalls:
    """``client.messages``: stored messages with their processing status."""

    def get(self, message_id: str) -> Call[Message]:
        mid = path_segment(check_id(message_id, "message_id"))
        return Call("GET", f"/api/messages/{mid}", Message.model_validate)

    def list(
        self,
        *,
        user_id: str | None = None,
        session_id: str | None = None,
        status: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> Call[list[Message]]:
        """A session's or a user's messages in acceptance order (against a server one of
        ``session_id`` and ``user_id`` is required)."""
        q = _query(MessageQuery, locals(), "messages.list")
        parse = _parse_list(Message)
        if q.session_id is None:
            if q.user_id is None:
                raise ValidationError(
                    "invalid messages.list",
                    ["session_id or user_id: required against a server (it lists per user)"],
                )
            path = f"/api/users/{path_segment(q.user_id)}/messages"
        else:
            path = f"/api/sessions/{path_segment(q.session_id)}/messages"
            if q.user_id is not None:
                # Memory.messages.list(user_id=, session_id=) returns nothing for a session
                # of another user; the filter keeps that meaning.
                inner, wanted = parse, q.user_id

                def parse(items: Any) -> list[Message]:
                    return [m for m in inner(items) if m.user_id == wanted]

        return Call("GET", path, parse, params={"status": q.status}, paged=(q.limit, q.offset))


def _get(what: str, name: str, item_id: str, model: type[M]) -> Call[M]:
    iid = path_segment(check_id(item_id, name))
    return Call("GET", f"/api/{what}/{iid}", model.model_validate)


class _ItemCalls(Generic[Item]):
    """``client.facts`` and ``client.summaries``: a user's items of one layer."""

    def __init__(self, what: str, model: type[Item], query: type[ItemQuery]) -> None:
        self._what = what
        self._model: type[Item] = model
        self._query = query

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
    ) -> Call[list[Item]]:
        q = _query(self._query, locals(), f"{self._what}.list")
        params = {
            "status": _status_param(q.status),
            "since": _time_param(q.since),
            "until": _time_param(q.until),
            "metadata": None if q.metadata_filters is None else json.dumps(q.metadata_filters),
        }
        return Call(
            "GET",
            _user_path(q.user_id, self._what),
            _parse_list(self._model),
            params=params,
            paged=(q.limit, q.offset),
        )


class FactCalls(_ItemCalls[Fact]):
    """``client.facts``: facts extracted from a user's messages, with provenance."""

    def __init__(self) -> None:
        super().__init__("facts", Fact, FactQuery)

    def get(self, fact_id: str) -> Call[Fact]:
        return _get("facts", "fact_id", fact_id, Fact)


class SummaryCalls(_ItemCalls[Summary]):
    """``client.summaries``: long-term memory with status, evidence and history."""

    def __init__(self) -> None:
        super().__init__("summaries", Summary, SummaryQuery)

    def get(self, summary_id: str) -> Call[Summary]:
        return _get("summaries", "summary_id", summary_id, Summary)

    def history(self, summary_id: str) -> Call[list[dict[str, Any]]]:
        """Every version of a summary: text, status, evidence, reason, actor, when."""
        sid = path_segment(check_id(summary_id, "summary_id"))
        return Call("GET", f"/api/summaries/{sid}/history", list)


class TopicCalls:
    """``client.topics``: the entry points that group a user's summaries."""

    def get(self, topic_id: str) -> Call[Topic]:
        return _get("topics", "topic_id", topic_id, Topic)

    def list(self, *, user_id: str) -> Call[list[Topic]]:
        path = _user_path(user_id, "topics")
        return Call("GET", path, _parse_list(Topic), paged=(MAX_LIMIT, 0))


def _hook_path(hook_id: str, suffix: str = "") -> str:
    return f"/api/webhooks/{path_segment(check_id(hook_id, 'hook_id'))}{suffix}"


def _with_secret(data: Any) -> tuple[Webhook, str]:
    return Webhook.model_validate(data["webhook"]), str(data["secret"])


class WebhookCalls:
    """``client.webhooks``: the project's webhooks (see docs/webhooks.md)."""

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
    ) -> Call[tuple[Webhook, str]]:
        """The webhook and its signing secret (``whsec_...``), shown only now."""
        body = _given(arguments(locals()))
        return Call("POST", "/api/webhooks", _with_secret, body=body)

    def get(self, hook_id: str) -> Call[Webhook]:
        return Call("GET", _hook_path(hook_id), Webhook.model_validate)

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
    ) -> Call[Webhook]:
        """Change some fields (``None`` leaves a field as it is)."""
        body = _given(arguments(locals()))
        del body["hook_id"]
        return Call("PATCH", _hook_path(hook_id), Webhook.model_validate, body=body)

    def enable(self, hook_id: str) -> Call[Webhook]:
        return self.update(hook_id, enabled=True)

    def disable(self, hook_id: str) -> Call[Webhook]:
        return self.update(hook_id, enabled=False)

    def delete(self, hook_id: str) -> Call[None]:
        return Call("DELETE", _hook_path(hook_id), lambda _: None)

    def rotate_secret(self, hook_id: str, *, grace_seconds: int = 0) -> Call[str]:
        return Call(
            "POST",
            _hook_path(hook_id, "/rotate-secret"),
            lambda data: str(data["secret"]),
            body={"grace_seconds": grace_seconds},
        )

    def deliveries(
        self, hook_id: str, *, limit: int = 100, offset: int = 0
    ) -> Call[list[WebhookDelivery]]:
        return Call(
            "GET",
            _hook_path(hook_id, "/deliveries"),
            _parse_list(WebhookDelivery),
            paged=check_paging(limit, offset),
        )

    def list(self, *, limit: int = 100, offset: int = 0) -> Call[list[Webhook]]:
        return Call("GET", "/api/webhooks", _parse_list(Webhook), paged=check_paging(limit, offset))


class ActionCalls:
    """``client.user_actions``: behaviour events (searches, clicks, views, tool calls)."""

    def __init__(self, sync_timeout: float) -> None:
        self.sync_timeout = sync_timeout

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
    ) -> Call[AddResult]:
        """Record one event (the keyword fields) or several (``events``) for ``user_id``;
        they go to ``session_id`` or the user's own ``actions-<user_id>`` session.
        GUMem's form ``record({"user_id": ..., "event_type": ...})`` works too."""
        fields = arguments(locals())
        del fields["user_id"]
        fields["sync"] = sync or None
        body: dict[str, Any] = (
            dict(user_id) if isinstance(user_id, Mapping) else {"user_id": user_id}
        )
        body.update(_given(fields))
        if body.get("events") is not None:
            body["events"], with_ids = _with_ids(body["events"])
        else:  # one event inline (GUMem's form)
            if body.get("id") is None:
                body["id"] = new_id("m")
            with_ids = True
        return Call(
            "POST",
            "/api/user/actions",
            AddResult.model_validate,
            body=body,
            idempotent=with_ids,
            # Like add_messages(sync=True): the server answers once the events are processed.
            read_timeout=self.sync_timeout if body.get("sync") else None,
            resend_unavailable=not body.get("sync"),
        )
