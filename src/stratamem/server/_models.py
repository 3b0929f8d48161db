"""Wire models of the REST API: the envelope, request bodies and the data they carry.

Every response is an :class:`Envelope` ``{success, data, message, error}`` (docs/server.md), so a
client written for GUMem reads ``data`` the same way on every route. Data models reuse the
engine's public nouns (``Fact``, ``Summary``, ``MemoryContext`` ...) so the wire names are
the Python API's names. The bodies of search, context and forget are the engine's own query
models (``stratamem._queries``), so they are checked by the same rules as a Python call.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from .._strings import CheckedStrings
from .._time import Timestamp
from ..types import ID_PATTERN, AddResult, ApiKey, MessageInput, Session

T = TypeVar("T")

JsonObject = dict[str, Any]


class Problem(BaseModel):
    """One rejected input: which field, and why."""

    field: str = Field(description="Dotted path of the field, e.g. `messages[2].role`.")
    message: str


class ErrorInfo(BaseModel):
    code: str = Field(
        description="Stable machine-readable code: unauthorized, forbidden, not_found, "
        "conflict, payload_too_large, validation_error, bad_request, method_not_allowed, "
        "unavailable, internal_error."
    )
    detail: str = Field(description="What went wrong, readable.")
    problems: list[Problem] = Field(
        default_factory=list, description="For validation errors: every offending field."
    )
    request_id: str | None = Field(
        default=None, description="The request's id, also sent as the X-Request-ID header."
    )


class Envelope(BaseModel, Generic[T]):
    """The shape of every response body."""

    success: bool = True
    data: T | None = None
    message: str | None = None
    error: ErrorInfo | None = None


class ErrorEnvelope(BaseModel):
    """The body of every error response: ``success`` is false and ``error`` says why."""

    success: Literal[False] = False
    data: None = None
    message: str | None = None
    error: ErrorInfo


class Page(BaseModel, Generic[T]):
    """One page of a list. ``next_offset`` is the offset of the next page, null at the end."""

    items: list[T]
    limit: int
    offset: int
    next_offset: int | None = None


class RequestBody(CheckedStrings):
    """A request body. Unknown fields are refused so a misspelt option is an error, not
    silently ignored; every string must be one the stores can hold (see _strings)."""

    model_config = ConfigDict(extra="forbid")


# -- sessions, messages, context ---------------------------------------------------------


class SessionData(BaseModel):
    """A conversation thread of one user. ``session_id`` repeats ``id`` (GUMem's name)."""

    id: str
    session_id: str
    project_id: str
    user_id: str
    title: str | None = None
    metadata: JsonObject = Field(default_factory=dict)
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, s: Session) -> SessionData:
        return cls(**s.model_dump(), session_id=s.id)


class CreateSession(RequestBody):
    user_id: str = Field(pattern=ID_PATTERN, description="The user this session belongs to.")
    title: str | None = Field(default=None, max_length=500)
    metadata: JsonObject | None = None
    session_id: str | None = Field(
        default=None,
        pattern=ID_PATTERN,
        description="Choose the id; an existing session of the same user is returned as is.",
    )


class AddMessages(RequestBody):
    messages: list[MessageInput] = Field(min_length=1)
    sync: bool = Field(
        default=False,
        description="false: return once stored (processing continues in the background); "
        "true: return once processed.",
    )
    user_id: str | None = Field(
        default=None,
        pattern=ID_PATTERN,
        description="The session's user. For an existing session it must match (409 if "
        "not); for a session id that does not exist yet, the session is created for this user "
        "(without it, an unknown session is a 404).",
    )


class UserAction(RequestBody):
    """One behaviour event: a search, click, view, tool call ..."""

    event_type: str = Field(min_length=1, max_length=64, description="e.g. search, click, view")
    content: str | None = Field(
        default=None,
        description="What happened, as text (the search terms, the item viewed); derived "
        "from event_type and page when absent.",
    )
    page: str | None = Field(default=None, max_length=2048)
    timestamp: Timestamp | None = None
    metadata: JsonObject | None = None
    id: str | None = Field(default=None, pattern=ID_PATTERN, description="Makes resends no-ops.")


class UserActions(RequestBody):
    """Behaviour events of one user: either one event inline or a list in ``events``."""

    user_id: str = Field(pattern=ID_PATTERN)
    session_id: str | None = Field(
        default=None,
        pattern=ID_PATTERN,
        description="Session to file the events under (created for the user if missing); "
        "default: the user's own actions session `actions-<user_id>`.",
    )
    events: list[UserAction] | None = Field(default=None, min_length=1)
    event_type: str | None = Field(default=None, min_length=1, max_length=64)
    content: str | None = None
    page: str | None = Field(default=None, max_length=2048)
    timestamp: Timestamp | None = None
    metadata: JsonObject | None = None
    id: str | None = Field(default=None, pattern=ID_PATTERN)
    sync: bool = False


class ActionsData(AddResult):
    user_id: str


# -- governance --------------------------------------------------------------------------


class SummaryStatusChange(RequestBody):
    status: Literal["active", "deprioritized", "archived", "deleted"]
    reason: str = Field(min_length=1, max_length=2000, description="Why (audited).")


# -- admin -------------------------------------------------------------------------------


class NewApiKey(BaseModel):
    key: ApiKey
    secret: str = Field(description="The key itself. Shown only in this response.")


class CreateProject(RequestBody):
    name: str = Field(min_length=1, max_length=200)
    project_id: str | None = Field(default=None, pattern=ID_PATTERN)


class CreateKey(RequestBody):
    name: str | None = Field(default=None, min_length=1, max_length=200)


class Health(BaseModel):
    status: Literal["ok"] = "ok"
    version: str
