"""The REST API as :class:`Call` values: which route each operation uses and how its
answer becomes memstrata's public types. The sync and async clients both build their
requests here, so they send the same bytes and return the same objects."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from pydantic import BaseModel, TypeAdapter

from .._checks import new_id
from ..types import (
    ID_PATTERN,
    AddResult,
    AuditRecord,
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
from ._http import MAX_PAGE, Call, path_segment

_ID = re.compile(ID_PATTERN)
_MAX_LIMIT = 10_000


def check_id(value: Any, name: str) -> str:
    # Checked here because an id goes into the URL: an empty or odd one would reach another
    # route (or none) instead of being refused for what it is.
    if not isinstance(value, str) or not _ID.match(value):
        raise ValidationError(
            f"invalid {name}",
            [
                f"{name}: expected 1-200 characters of letters, digits and ._:@/+=- "
                f"starting with a letter or digit (got {value!r})"
            ],
        )
    return value


def check_paging(limit: Any, offset: Any) -> tuple[int, int]:
    problems = []
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= _MAX_LIMIT:
        problems.append(f"limit: expected an integer from 1 to {_MAX_LIMIT} (got {limit!r})")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        problems.append(f"offset: expected an integer >= 0 (got {offset!r})")
    if problems:
        raise ValidationError("invalid paging", problems)
    return limit, offset


def _time_param(value: datetime | str | None) -> str | None:
    return value.isoformat() if isinstance(value, datetime) else value


def _status_param(status: str | Sequence[str] | None) -> str | None:
    if status is None or isinstance(status, str):
        return status
    wanted = list(status)
    if len(wanted) > 1:
        raise ValidationError(
            "invalid status",
            [f"status: the server filters by one status at a time (got {wanted!r})"],
        )
    return wanted[0] if wanted else None


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


def list_sessions(user_id: str | None, limit: int, offset: int) -> Call[list[Session]]:
    if user_id is not None:
        check_id(user_id, "user_id")
    return Call(
        "GET",
        "/api/sessions",
        _sessions,
        params={"user_id": user_id},
        paged=check_paging(limit, offset),
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


def get_context(
    session_id: str,
    query: str | Mapping[str, Any] | None,
    *,
    details: bool,
    recall_config: RecallConfig | Mapping[str, Any] | None,
    metadata_filters: Mapping[str, Any] | None,
) -> Call[MemoryContext]:
    sid = path_segment(check_id(session_id, "session_id"))
    body: dict[str, Any] = {}
    if isinstance(query, Mapping):
        # GUMem's SDK form: session.get_memory({"query": ..., "details": True, ...}).
        body.update(query)
    elif query is not None:
        body["query"] = query
    if details:
        body["details"] = True
    if isinstance(recall_config, RecallConfig):
        # Only the keys the caller set: the server fills the rest from its own defaults
        # (its token budget among them), as the embedded engine does.
        recall_config = recall_config.model_dump(exclude_unset=True)
    if recall_config is not None:
        body["recall_config"] = recall_config
    if metadata_filters is not None:
        body["metadata_filters"] = metadata_filters
    # Always POST: a long query does not fit in a URL, and GET takes no recall_config.
    return Call(
        "POST",
        f"/api/sessions/{sid}/context",
        MemoryContext.model_validate,
        body=body,
        idempotent=True,
    )


def list_messages(
    session_id: str | None,
    user_id: str | None,
    status: str | None,
    limit: int,
    offset: int,
) -> Call[list[Message]]:
    if session_id is None:
        if user_id is None:
            raise ValidationError(
                "invalid messages.list",
                ["session_id or user_id: required against a server (it lists per user)"],
            )
        uid = path_segment(check_id(user_id, "user_id"))
        return Call(
            "GET",
            f"/api/users/{uid}/messages",
            _parse_list(Message),
            params={"status": status},
            paged=check_paging(limit, offset),
        )
    sid = path_segment(check_id(session_id, "session_id"))
    parse = _parse_list(Message)
    if user_id is not None:
        wanted = check_id(user_id, "user_id")
        # Memory.messages.list(user_id=, session_id=) returns nothing for a session of
        # another user; the filter keeps that meaning.
        inner = parse

        def parse(items: Any) -> list[Message]:
            return [m for m in inner(items) if m.user_id == wanted]

    return Call(
        "GET",
        f"/api/sessions/{sid}/messages",
        parse,
        params={"status": status},
        paged=check_paging(limit, offset),
    )


def get_message(message_id: str) -> Call[Message]:
    mid = path_segment(check_id(message_id, "message_id"))
    return Call("GET", f"/api/messages/{mid}", Message.model_validate)


def processing_status(session_id: str) -> Call[ProcessingStatus]:
    sid = path_segment(check_id(session_id, "session_id"))
    return Call("GET", f"/api/sessions/{sid}/status", ProcessingStatus.model_validate)


# -- reading memory ----------------------------------------------------------------------


def search(query: Any, *, user_id: str, **options: Any) -> Call[list[Hit]]:
    uid = path_segment(check_id(user_id, "user_id"))
    body: dict[str, Any] = {"query": query}
    for key, value in options.items():
        if value is None:
            continue
        if isinstance(value, RecallConfig):
            value = value.model_dump(exclude_unset=True)
        elif isinstance(value, (tuple, set, frozenset)):
            value = list(value)
        body[key] = value
    return Call("POST", f"/api/users/{uid}/search", _parse_list(Hit), body=body, idempotent=True)


def _user_path(user_id: str | None, what: str) -> str:
    if user_id is None:
        raise ValidationError(
            f"invalid {what}.list",
            [f"user_id: required against a server, which lists {what} per user"],
        )
    return f"/api/users/{path_segment(check_id(user_id, 'user_id'))}/{what}"


def list_items(
    what: str,
    model: type[BaseModel],
    *,
    user_id: str | None,
    status: str | Sequence[str] | None,
    since: datetime | str | None,
    until: datetime | str | None,
    metadata_filters: Mapping[str, Any] | None,
    limit: int,
    offset: int,
) -> Call[Any]:
    params = {
        "status": _status_param(status),
        "since": _time_param(since),
        "until": _time_param(until),
        "metadata": None if metadata_filters is None else json.dumps(metadata_filters),
    }
    return Call(
        "GET",
        _user_path(user_id, what),
        _parse_list(model),
        params=params,
        paged=check_paging(limit, offset),
    )


def list_topics(user_id: str | None) -> Call[list[Topic]]:
    return Call("GET", _user_path(user_id, "topics"), _parse_list(Topic), paged=(_MAX_LIMIT, 0))


def get_item(what: str, item_id: str, model: type[BaseModel]) -> Call[Any]:
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


def forget(
    *,
    user_id: str,
    message_ids: Sequence[str] | None,
    session_id: str | None,
    topic_id: str | None,
    reason: str | None,
) -> Call[dict[str, int]]:
    body: dict[str, Any] = {"user_id": user_id}
    if message_ids is not None:
        body["message_ids"] = message_ids if isinstance(message_ids, str) else list(message_ids)
    for key, value in (("session_id", session_id), ("topic_id", topic_id), ("reason", reason)):
        if value is not None:
            body[key] = value
    return Call("POST", "/api/forget", dict, body=body)


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
