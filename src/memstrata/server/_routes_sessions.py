"""GUMem's core: sessions, adding messages, querying context, processing status."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Query

from .._queries import ContextRequest
from ..types import AddResult, MemoryContext, Message, ProcessingStatus
from ._auth import CallerDep
from ._common import API_ERRORS, Limit, MessageStatusParam, Offset, check_sizes, listed, page
from ._models import AddMessages, CreateSession, Envelope, Page, SessionData

router = APIRouter(prefix="/api/sessions", tags=["sessions"], responses=API_ERRORS)

# Ids may contain "/" (the engine allows it), so session ids are matched as paths; routes
# with a suffix are declared before the bare one so the suffix is never read as part of an id.
SID = "{session_id:path}"


@router.post(
    "",
    summary="Create a session",
    description="Create a conversation thread of `user_id` (or return it, if `session_id` "
    "names an existing session of the same user; of another user: 409). "
    "`data.session_id` is the id to use in later calls.",
    response_model=Envelope[SessionData],
)
def create_session(body: CreateSession, caller: CallerDep) -> Envelope[SessionData]:
    session = caller.memory.sessions.create(
        body.user_id, title=body.title, metadata=body.metadata, session_id=body.session_id
    )
    return Envelope(data=SessionData.of(session))


@router.get(
    "",
    summary="List sessions",
    description="Sessions of the project (or of one user), in creation order.",
    response_model=Envelope[Page[SessionData]],
)
def list_sessions(
    caller: CallerDep,
    limit: Limit = 100,
    offset: Offset = 0,
    user_id: Annotated[str | None, Query(description="Only this user's sessions.")] = None,
) -> Envelope[Page[SessionData]]:
    def fetch(n: int, skip: int) -> list[SessionData]:
        rows = caller.memory.sessions.list(user_id=user_id, limit=n, offset=skip)
        return [SessionData.of(s) for s in rows]

    return Envelope(data=page(fetch, limit, offset))


@router.post(
    f"/{SID}/messages",
    summary="Add messages",
    description="Store messages (chat turns or behaviour events) durably and queue their "
    "processing in one transaction. With `user_id`, a session id that does not exist yet is "
    "created for that user. With `sync: false` (default) the call returns once "
    "they are stored; with `sync: true` once they are processed. A message resent with the "
    "same `id` and content is a duplicate (listed in `duplicates`, not stored again); the "
    "same `id` with other content is a 409.",
    response_model=Envelope[AddResult],
)
def add_messages(session_id: str, body: AddMessages, caller: CallerDep) -> Envelope[AddResult]:
    view = caller.memory
    check_sizes([(m.content, m.metadata) for m in body.messages], view.settings, "messages")
    if body.user_id is None:
        session = view.sessions.get(session_id)
    else:
        # create() returns an existing session of the same user and refuses (409) one of
        # another user: adding to a new thread needs no separate call.
        session = view.sessions.create(body.user_id, session_id=session_id)
    result = view.add_messages(session.id, body.messages, sync=body.sync)
    return Envelope(data=result)


@router.get(
    f"/{SID}/messages",
    summary="List a session's messages",
    description="Stored messages in acceptance order, with their processing status.",
    response_model=Envelope[Page[Message]],
)
def list_messages(
    session_id: str,
    caller: CallerDep,
    limit: Limit = 100,
    offset: Offset = 0,
    status: MessageStatusParam = None,
) -> Envelope[Page[Message]]:
    view = caller.memory
    view.sessions.get(session_id)  # 404 for an unknown (or foreign) session, not an empty list
    return listed(view.messages.list, limit, offset, session_id=session_id, status=status)


@router.get(
    f"/{SID}/status",
    summary="Processing status of a session's messages",
    description="Counts of the session's messages by status (pending, processed, failed) "
    "and each message's id, status and error.",
    response_model=Envelope[ProcessingStatus],
)
def processing_status(session_id: str, caller: CallerDep) -> Envelope[ProcessingStatus]:
    return Envelope(data=caller.memory.processing_status(session_id))


_CONTEXT_DOC = (
    "What to put before the next model call: the session's recent `history`, the matched "
    "`facts`, current `summary` lines, `topics`, and `formatted_context` (a dated block "
    "within a token budget). With `details` the matched items of every layer come back in "
    "`matches` with scores."
)


@router.get(
    f"/{SID}/context",
    summary="Query memory",
    description=_CONTEXT_DOC,
    response_model=Envelope[MemoryContext],
)
def get_context(
    session_id: str,
    caller: CallerDep,
    query: Annotated[str | None, Query(description="What the next call is about.")] = None,
    details: Annotated[bool, Query(description="Include matches with scores.")] = False,
) -> Envelope[MemoryContext]:
    return Envelope(data=caller.memory.get_memory(session_id, query, details=details))


@router.post(
    f"/{SID}/context",
    summary="Query memory with a recall config",
    description=_CONTEXT_DOC + " `query` and `details` may be given in the body or, as "
    "GUMem's SDK sends them, in the query string (the body wins).",
    response_model=Envelope[MemoryContext],
)
def post_context(
    session_id: str,
    caller: CallerDep,
    body: Annotated[ContextRequest | None, Body()] = None,
    query: Annotated[str | None, Query(description="What the next call is about.")] = None,
    details: Annotated[bool | None, Query(description="Include matches with scores.")] = None,
) -> Envelope[MemoryContext]:
    # GUMem's MetadataFilters inside recall_config are metadata filters (ContextRequest).
    body = body or ContextRequest()
    ctx = caller.memory.get_memory(
        session_id,
        body.query if body.query is not None else query,
        details=bool(body.details if body.details is not None else details),
        recall_config=body.recall_config,
        metadata_filters=body.metadata_filters,
        exclude_texts=body.exclude_texts,
    )
    return Envelope(data=ctx)


@router.get(
    f"/{SID}",
    summary="Get a session",
    response_model=Envelope[SessionData],
)
def get_session(session_id: str, caller: CallerDep) -> Envelope[SessionData]:
    return Envelope(data=SessionData.of(caller.memory.sessions.get(session_id)))
