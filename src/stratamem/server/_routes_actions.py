"""Behaviour events (``POST /api/user/actions``): what users do is memory too.

Each event becomes a message of the user with ``event_type`` (and ``page``, ``metadata``), so
it goes through the same write path and recall as chat turns. GUMem's SDK posts one event
per request as a flat object (``{"user_id": ..., "event_type": "view", ...}``); a list goes in
``events``.
"""

from __future__ import annotations

import hashlib
from typing import Any

from fastapi import APIRouter

from ._auth import CallerDep
from ._common import API_ERRORS, check_sizes
from ._errors import ApiError
from ._models import ActionsData, Envelope, UserAction, UserActions

router = APIRouter(prefix="/api/user", tags=["behaviour events"], responses=API_ERRORS)

_INLINE = ("event_type", "content", "page", "timestamp", "metadata", "id")
_MAX_DERIVED = 500


def actions_session_id(user_id: str) -> str:
    """The session a user's events go to when the request names none."""
    sid = f"actions-{user_id}"
    # Session ids are at most 200 characters; a long user id is hashed instead.
    return sid if len(sid) <= 200 else "actions-" + hashlib.sha256(user_id.encode()).hexdigest()


def _content(event: UserAction) -> str:
    """The event as text, so the write path and full-text search have something to read:
    ``view on /products/42 (item=Nike Pegasus, price=120)``."""
    if event.content and event.content.strip():
        return event.content
    text = event.event_type
    if event.page:
        text += f" on {event.page}"
    scalars = [
        f"{k}={v}"
        for k, v in (event.metadata or {}).items()
        if isinstance(v, (str, int, float, bool)) and str(v).strip()
    ]
    if scalars:
        text += f" ({', '.join(scalars)})"
    return text if len(text) <= _MAX_DERIVED else text[: _MAX_DERIVED - 1] + "…"


def _events(body: UserActions) -> list[UserAction]:
    inline = {k: getattr(body, k) for k in _INLINE if getattr(body, k) is not None}
    if body.events is not None:
        if inline:
            raise ApiError(
                422,
                "invalid request: events",
                problems=[
                    (k, "give the event inline or in `events`, not both") for k in sorted(inline)
                ],
            )
        return body.events
    if "event_type" not in inline:
        raise ApiError(
            422,
            "invalid request: event_type",
            problems=[("event_type", "required (or send a list in `events`)")],
        )
    return [UserAction(**inline)]


@router.post(
    "/actions",
    summary="Record behaviour events",
    description="Record what a user did (searched, clicked, viewed, called a tool). Each "
    "event is stored as a message with `role: user` and its `event_type`, `page`, "
    "`metadata`; `content` defaults to a text made of the event type, page and scalar "
    "metadata. Events go to `session_id`, created for the user if missing (default: the "
    "user's own session `actions-<user_id>`); a session of another user is a 409.",
    response_model=Envelope[ActionsData],
)
def record_actions(body: UserActions, caller: CallerDep) -> Envelope[ActionsData]:
    view = caller.memory
    events = _events(body)
    contents = [_content(e) for e in events]
    field = "events" if body.events is not None else ""
    sized = [(c, e.metadata or {}) for c, e in zip(contents, events, strict=True)]
    check_sizes(sized, view.settings, field)
    sid = body.session_id or actions_session_id(body.user_id)
    session = view.sessions.create(body.user_id, session_id=sid, title="behaviour events")
    messages: list[dict[str, Any]] = []
    for e, content in zip(events, contents, strict=True):
        m: dict[str, Any] = {
            "role": "user",
            "content": content,
            "event_type": e.event_type,
            "metadata": e.metadata or {},
        }
        for key in ("page", "timestamp", "id"):
            if getattr(e, key) is not None:
                m[key] = getattr(e, key)
        messages.append(m)
    result = view.add_messages(session.id, messages, sync=body.sync)
    return Envelope(data=ActionsData(user_id=body.user_id, **result.model_dump()))
