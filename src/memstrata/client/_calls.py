"""The REST API as :class:`Call` values: which route each operation uses and how its
answer becomes memstrata's public types. The sync and async clients both build their
requests here, so they send the same bytes and return the same objects."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, TypeVar

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
from ..types import (
    AddResult,
    AuditRecord,
    Fact,
    Hit,
    MemoryContext,
    Message,
    MessageInput,
    ProcessingStatus,
    Session,
    Summary,
    Topic,
    Webhook,
    WebhookDelivery,
)
from ._errors import ValidationError
from ._http import MAX_PAGE, Call, path_segment

Q = TypeVar("Q", bound=Query)
M = TypeVar("M", bound=BaseModel)


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


def _time_param(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _status_param(status: tuple[str, ...]) -> str | None:
    if len(status) > 1:
        raise ValidationError(
            "invalid status",
            [f"status: the server filters by one status at a time (got {list(status)!r})"],
        )
    return status[0] if status else None


def _parse_list(model: type[BaseModel]) -> Any:
    adapter = TypeAdapter(list[model])  # type: ignore[valid-type]
    return adapter.validate_python


def session_from(data: Any) -> Session:
    return Session.model_validate(data)


def _sessions(items: Any) -> list[Session]:
    return [Session.model_validate(i) for i in items]


# -- sessions and messages ----------------------------------------------------------------


def create_session(
    user_id: str | Mapping[str, Any] | None,
    *,
    title: str | None,
    metadata: Mapping[str, Any] | None,
    session_id: str | None,
) -> Call[Session]:
    body: dict[str, Any] = {}
    if isinstance(user_id, Mapping):
        # GUMem's SDK form: sessions.create({"user_id": ..., "title": ...}). Keys are sent
        # as given; the server refuses unknown ones by name.
        body.update(user_id)
    elif user_id is not None:
        body["user_id"] = user_id
    for key, value in (("title", title), ("metadata", metadata), ("session_id", session_id)):
        if value is not None:
            body[key] = value
    if "user_id" not in body:
        raise ValidationError("invalid session", ["user_id: required"])
    # The id is chosen here, before the first try, in the server's own form: a resend after
    # a lost answer then returns the session the first try made instead of a second one.
    if body.get("session_id") is None:
        body["session_id"] = new_id("s")
    return Call("POST", "/api/sessions", session_from, body=body, idempotent=True)


def get_session(session_id: str) -> Call[Session]:
    sid = path_segment(check_id(session_id, "session_id"))
    return Call("GET", f"/api/sessions/{sid}", session_from)


def list_sessions(args: Mapping[str, Any]) -> Call[list[Session]]:
    q = _query(ListQuery, args, "sessions.list")
    return Call(
        "GET", "/api/sessions", _sessions, params={"user_id": q.user_id}, paged=(q.limit, q.offset)
    )


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


def add_messages(
    session_id: str, messages: Any, *, sync: bool, sync_timeout: float
) -> Call[AddResult]:
    sid = path_segment(check_id(session_id, "session_id"))
    messages, with_ids = _with_ids(messages)
    return Call(
        "POST",
        f"/api/sessions/{sid}/messages",
        AddResult.model_validate,
        body={"messages": messages, "sync": sync},
        idempotent=with_ids,
        read_timeout=sync_timeout if sync else None,
        resend_unavailable=not sync,
    )


def get_context(args: Mapping[str, Any]) -> Call[MemoryContext]:
    fields = arguments(args)
    query = fields.pop("query")
    if isinstance(query, Mapping):
        # GUMem's SDK form: session.get_memory({"query": ..., "details": True, ...}); the
        # keyword arguments given beside it win.
        given = {k: v for k, v in fields.items() if v is not None and v is not False}
        fields = {**fields, **query, **given}
    else:
        fields["query"] = query
    q = _query(ContextQuery, fields, "get_memory")
    # Always POST: a long query does not fit in a URL, and GET takes no recall_config.
    return Call(
        "POST",
        f"/api/sessions/{path_segment(q.session_id)}/context",
        MemoryContext.model_validate,
        body=_body(q, path="session_id"),
        idempotent=True,
    )


def list_messages(args: Mapping[str, Any]) -> Call[list[Message]]:
    q = _query(MessageQuery, args, "messages.list")
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
            # Memory.messages.list(user_id=, session_id=) returns nothing for a session of
            # another user; the filter keeps that meaning.
            inner, wanted = parse, q.user_id

            def parse(items: Any) -> list[Message]:
                return [m for m in inner(items) if m.user_id == wanted]

    return Call("GET", path, parse, params={"status": q.status}, paged=(q.limit, q.offset))


def get_message(message_id: str) -> Call[Message]:
    mid = path_segment(check_id(message_id, "message_id"))
    return Call("GET", f"/api/messages/{mid}", Message.model_validate)


def processing_status(session_id: str) -> Call[ProcessingStatus]:
    sid = path_segment(check_id(session_id, "session_id"))
    return Call("GET", f"/api/sessions/{sid}/status", ProcessingStatus.model_validate)


# -- reading memory ----------------------------------------------------------------------


def search(args: Mapping[str, Any]) -> Call[list[Hit]]:
    q = _query(SearchQuery, args, "search")
    return Call(
        "POST",
        f"/api/users/{path_segment(q.user_id)}/search",
        _parse_list(Hit),
        body=_body(q, path="user_id"),
        idempotent=True,
    )


def _user_path(user_id: str | None, what: str) -> str:
    if user_id is None:
        raise ValidationError(
            f"invalid {what}.list",
            [f"user_id: required against a server, which lists {what} per user"],
        )
    return f"/api/users/{path_segment(check_id(user_id, 'user_id'))}/{what}"


_ITEMS: dict[str, tuple[type[BaseModel], type[ItemQuery]]] = {
    "facts": (Fact, FactQuery),
    "summaries": (Summary, SummaryQuery),
}


def list_items(what: str, args: Mapping[str, Any]) -> Call[Any]:
    model, query = _ITEMS[what]
    q = _query(query, args, f"{what}.list")
    params = {
        "status": _status_param(q.status),
        "since": _time_param(q.since),
        "until": _time_param(q.until),
        "metadata": None if q.metadata_filters is None else json.dumps(q.metadata_filters),
    }
    return Call(
        "GET",
        _user_path(q.user_id, what),
        _parse_list(model),
        params=params,
        paged=(q.limit, q.offset),
    )


def list_topics(user_id: str | None) -> Call[list[Topic]]:
    return Call("GET", _user_path(user_id, "topics"), _parse_list(Topic), paged=(MAX_LIMIT, 0))


def get_item(what: str, item_id: str, model: type[M]) -> Call[M]:
    name = {"facts": "fact_id", "summaries": "summary_id", "topics": "topic_id"}[what]
    iid = path_segment(check_id(item_id, name))
    return Call("GET", f"/api/{what}/{iid}", model.model_validate)


def summary_history(summary_id: str) -> Call[list[dict[str, Any]]]:
    sid = path_segment(check_id(summary_id, "summary_id"))
    return Call("GET", f"/api/summaries/{sid}/history", list)


# -- governance --------------------------------------------------------------------------


def set_status(summary_id: str, status: str, reason: str | None) -> Call[Summary]:
    sid = path_segment(check_id(summary_id, "summary_id"))
    return Call(
        "PATCH",
        f"/api/summaries/{sid}",
        Summary.model_validate,
        body={"status": status, "reason": reason},
    )


def forget(args: Mapping[str, Any]) -> Call[dict[str, int]]:
    return Call("POST", "/api/forget", dict, body=_body(_query(ForgetScope, args, "forget")))


def erase_user(user_id: str, reason: str | None) -> Call[dict[str, int]]:
    uid = path_segment(check_id(user_id, "user_id"))
    # Not resent after a dropped connection: a second erase would add a second audit record.
    return Call("DELETE", f"/api/users/{uid}", dict, params={"reason": reason}, idempotent=False)


def export_user(user_id: str) -> Call[dict[str, Any]]:
    uid = path_segment(check_id(user_id, "user_id"))
    return Call("GET", f"/api/users/{uid}/export", dict)


def audit(user_id: str | None, limit: int, offset: int) -> Call[list[AuditRecord]]:
    if user_id is not None:
        check_id(user_id, "user_id")
    return Call(
        "GET",
        "/api/audit",
        _parse_list(AuditRecord),
        params={"user_id": user_id},
        paged=check_paging(limit, offset),
    )


# -- behaviour events and health ---------------------------------------------------------


def record_actions(
    user_id: str | Mapping[str, Any], fields: Mapping[str, Any], *, sync_timeout: float
) -> Call[AddResult]:
    body: dict[str, Any] = dict(user_id) if isinstance(user_id, Mapping) else {"user_id": user_id}
    for key, value in fields.items():
        if value is not None:
            body[key] = value
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
        read_timeout=sync_timeout if body.get("sync") else None,
        resend_unavailable=not body.get("sync"),
    )


def health() -> Call[dict[str, Any]]:
    return Call("GET", "/healthz", dict)


__all__ = [
    "MAX_PAGE",
    "add_messages",
    "audit",
    "check_id",
    "check_paging",
    "create_session",
    "erase_user",
    "export_user",
    "forget",
    "get_context",
    "get_item",
    "get_message",
    "get_session",
    "health",
    "list_items",
    "list_messages",
    "list_sessions",
    "list_topics",
    "processing_status",
    "record_actions",
    "search",
    "session_from",
    "set_status",
    "summary_history",
]


# -- webhooks ----------------------------------------------------------------------------


def _with_secret(data: Any) -> tuple[Webhook, str]:
    return Webhook.model_validate(data["webhook"]), str(data["secret"])


def _hook_path(hook_id: str, suffix: str = "") -> str:
    return f"/api/webhooks/{path_segment(check_id(hook_id, 'hook_id'))}{suffix}"


def create_webhook(fields: Mapping[str, Any]) -> Call[tuple[Webhook, str]]:
    body = {k: v for k, v in fields.items() if v is not None}
    return Call("POST", "/api/webhooks", _with_secret, body=body)


def list_webhooks(limit: int, offset: int) -> Call[list[Webhook]]:
    return Call("GET", "/api/webhooks", _parse_list(Webhook), paged=check_paging(limit, offset))


def get_webhook(hook_id: str) -> Call[Webhook]:
    return Call("GET", _hook_path(hook_id), Webhook.model_validate)


def update_webhook(hook_id: str, fields: Mapping[str, Any]) -> Call[Webhook]:
    body = {k: v for k, v in fields.items() if v is not None}
    return Call("PATCH", _hook_path(hook_id), Webhook.model_validate, body=body)


def delete_webhook(hook_id: str) -> Call[None]:
    return Call("DELETE", _hook_path(hook_id), lambda _: None)


def rotate_webhook_secret(hook_id: str, grace_seconds: int) -> Call[str]:
    return Call(
        "POST",
        _hook_path(hook_id, "/rotate-secret"),
        lambda data: str(data["secret"]),
        body={"grace_seconds": grace_seconds},
    )


def webhook_deliveries(hook_id: str, limit: int, offset: int) -> Call[list[WebhookDelivery]]:
    return Call(
        "GET",
        _hook_path(hook_id, "/deliveries"),
        _parse_list(WebhookDelivery),
        paged=check_paging(limit, offset),
    )
