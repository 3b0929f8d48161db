"""Reading memory: a user's facts, summaries and topics with provenance, items by id, search.

Lists are scoped to the caller's project like everything else: another project's user simply
has no items here, exactly like a user who does not exist.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query

from .._queries import SearchRequest
from .._time import Timestamp
from .._vocabulary import FactStatus, SummaryStatus
from ..types import Fact, Hit, Message, Summary, Topic
from ._auth import CallerDep
from ._common import API_ERRORS, Limit, MessageStatusParam, Offset, json_object_param, listed, page
from ._models import Envelope, Page

router = APIRouter(prefix="/api", tags=["memory"], responses=API_ERRORS)

UID = "{user_id:path}"

Since = Annotated[
    Timestamp | None,
    Query(description="Only items from this time on (ISO-8601 or epoch seconds, inclusive)."),
]
Until = Annotated[
    Timestamp | None,
    Query(description="Only items before this time (ISO-8601 or epoch seconds, exclusive)."),
]
MetadataParam = Annotated[
    str | None,
    Query(
        description='Metadata filters as a URL-encoded JSON object, e.g. `{"channel":"web"}`; '
        "the same vocabulary as search filters ($in, $gte, ...)."
    ),
]


def _window(
    since: Since = None, until: Until = None, metadata: MetadataParam = None
) -> dict[str, Any]:
    # The query parameters of the facts and summaries listings beside status and paging.
    return {
        "since": since,
        "until": until,
        "metadata_filters": json_object_param(metadata, "metadata"),
    }


Window = Annotated[dict[str, Any], Depends(_window)]


@router.get(
    f"/users/{UID}/messages",
    summary="List a user's messages",
    description="The user's messages across sessions in acceptance order, with their "
    "processing status.",
    response_model=Envelope[Page[Message]],
)
def list_user_messages(
    user_id: str,
    caller: CallerDep,
    limit: Limit = 100,
    offset: Offset = 0,
    status: MessageStatusParam = None,
) -> Envelope[Page[Message]]:
    return listed(caller.memory.messages.list, limit, offset, user_id=user_id, status=status)


@router.get(
    f"/users/{UID}/facts",
    summary="List a user's facts",
    description="Facts extracted from the user's messages, each with `message_ids` "
    "(provenance), in extraction order; filter by status, time and metadata.",
    response_model=Envelope[Page[Fact]],
)
def list_facts(
    user_id: str,
    caller: CallerDep,
    window: Window,
    limit: Limit = 100,
    offset: Offset = 0,
    status: Annotated[FactStatus | None, Query()] = None,
) -> Envelope[Page[Fact]]:
    facts = caller.memory.facts.list
    return listed(facts, limit, offset, user_id=user_id, status=status, **window)


@router.get(
    f"/users/{UID}/summaries",
    summary="List a user's summaries",
    description="Long-term memory with status, evidence (`fact_ids`, `message_ids`) and "
    "version; filter by status, time and metadata.",
    response_model=Envelope[Page[Summary]],
)
def list_summaries(
    user_id: str,
    caller: CallerDep,
    window: Window,
    limit: Limit = 100,
    offset: Offset = 0,
    status: Annotated[SummaryStatus | None, Query()] = None,
) -> Envelope[Page[Summary]]:
    summaries = caller.memory.summaries.list
    return listed(summaries, limit, offset, user_id=user_id, status=status, **window)


@router.get(
    f"/users/{UID}/topics",
    summary="List a user's topics",
    description="The entry points of recall, each with the ids of its summaries.",
    response_model=Envelope[Page[Topic]],
)
def list_topics(
    user_id: str, caller: CallerDep, limit: Limit = 100, offset: Offset = 0
) -> Envelope[Page[Topic]]:
    topics = caller.memory.topics.list(user_id=user_id)
    return Envelope(data=page(lambda n, skip: topics[skip : skip + n], limit, offset))


@router.post(
    f"/users/{UID}/search",
    summary="Search a user's memory",
    description="Ranked hits of every layer (summaries, facts, messages) on one scale, each "
    "with `message_ids` (provenance) and the `signals` behind its score.",
    response_model=Envelope[list[Hit]],
)
def search(user_id: str, body: SearchRequest, caller: CallerDep) -> Envelope[list[Hit]]:
    return Envelope(data=caller.memory.search(user_id=user_id, **body.arguments()))


@router.get(
    "/facts/{fact_id:path}",
    summary="Get a fact",
    response_model=Envelope[Fact],
)
def get_fact(fact_id: str, caller: CallerDep) -> Envelope[Fact]:
    return Envelope(data=caller.memory.facts.get(fact_id))


@router.get(
    "/summaries/{summary_id:path}/history",
    summary="A summary's version history",
    description="Every version: text, status, confidence, evidence fact ids, the reason and "
    "actor of the change, and when.",
    response_model=Envelope[list[dict[str, Any]]],
)
def summary_history(summary_id: str, caller: CallerDep) -> Envelope[list[dict[str, Any]]]:
    return Envelope(data=caller.memory.summaries.history(summary_id))


@router.get(
    "/summaries/{summary_id:path}",
    summary="Get a summary",
    response_model=Envelope[Summary],
)
def get_summary(summary_id: str, caller: CallerDep) -> Envelope[Summary]:
    return Envelope(data=caller.memory.summaries.get(summary_id))


@router.get(
    "/topics/{topic_id:path}",
    summary="Get a topic",
    response_model=Envelope[Topic],
)
def get_topic(topic_id: str, caller: CallerDep) -> Envelope[Topic]:
    return Envelope(data=caller.memory.topics.get(topic_id))


@router.get(
    "/messages/{message_id:path}",
    summary="Get a message",
    description="A stored message with its processing status.",
    response_model=Envelope[Message],
)
def get_message(message_id: str, caller: CallerDep) -> Envelope[Message]:
    return Envelope(data=caller.memory.messages.get(message_id))
