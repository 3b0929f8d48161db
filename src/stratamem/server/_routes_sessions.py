"""GUMem's core: sessions, adding messages, querying context, processing status."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, Body, Query

from .. import _metrics
from .._queries import ContextRequest
from .._vocabulary import RecallOutcome
from ..types import AddResult, MemoryContext, Message, ProcessingStatus
from ._auth import Caller, CallerDep
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
    def recall(matches: bool) -> MemoryContext:
        return caller.memory.get_memory(session_id, query, details=matches)

    return Envelope(data=_logged(caller, "GET", session_id, details, recall))


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
    given = body or ContextRequest()

    def recall(matches: bool) -> MemoryContext:
        return caller.memory.get_memory(
            session_id,
            given.query if given.query is not None else query,
            details=matches,
            recall_config=given.recall_config,
            metadata_filters=given.metadata_filters,
            exclude_texts=given.exclude_texts,
        )

    asked = bool(given.details if given.details is not None else details)
    return Envelope(data=_logged(caller, "POST", session_id, asked, recall))


def _logged(
    caller: Caller,
    method: str,
    session_id: str,
    details: bool,
    recall: Callable[[bool], MemoryContext],
) -> MemoryContext:
    """The context ``recall(matches)`` returns, with the recall counted (metrics) and in
    the project's recall log (when it keeps one): its matches count the hits, so they are
    then always asked for and left out again unless the caller asked (``details``). A
    recall that fails (an unknown session, bad arguments) is the caller's error, not
    logged."""
    log = caller.memory.recall_log
    start = time.perf_counter()
    ctx = recall(details or log.enabled)
    latency_ms = (time.perf_counter() - start) * 1000
    outcome: RecallOutcome = "injected" if ctx.formatted_context else "none"
    _metrics.recall("rest", outcome, latency_ms / 1000)
    if log.enabled:
        log.record(
            user_id=ctx.user_id,
            session_id=ctx.session_id,
            source="rest",
            # The session's own id: a dashboard shows which conversation asked.
            request=f"{method} /api/sessions/{session_id}/context",
            query=ctx.query,
            outcome=outcome,
            formatted_context=ctx.formatted_context,
            hits=len(ctx.matches or ()),
            latency_ms=latency_ms,
        )
    return ctx if details else ctx.model_copy(update={"matches": None})


@router.get(
    f"/{SID}",
    summary="Get a session",
    response_model=Envelope[SessionData],
)
def get_session(session_id: str, caller: CallerDep) -> Envelope[SessionData]:
    return Envelope(data=SessionData.of(caller.memory.sessions.get(session_id)))
