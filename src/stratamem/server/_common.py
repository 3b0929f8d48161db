"""Small pieces every route module shares: paging, JSON query parameters, error docs."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Annotated, Any, TypeVar

from fastapi import Query

from .._checks import MAX_OFFSET, MAX_PAGE
from .._vocabulary import MessageStatus
from ._errors import ApiError
from ._models import Envelope, ErrorEnvelope, Page

T = TypeVar("T")

Limit = Annotated[int, Query(ge=1, le=MAX_PAGE, description="Items per page.")]
Offset = Annotated[int, Query(ge=0, le=MAX_OFFSET, description="Items to skip (paging).")]
MessageStatusParam = Annotated[
    MessageStatus | None, Query(description="Only messages in this processing state.")
]


def _err(description: str) -> dict[str, Any]:
    return {"model": ErrorEnvelope, "description": description}


# Documented on every authenticated route, so clients see the error shape in OpenAPI.
API_ERRORS: dict[int | str, dict[str, Any]] = {
    400: _err("Malformed request (e.g. a body that is not JSON)."),
    401: _err("Missing, invalid or revoked API key."),
    404: _err("No such item in the caller's project (another project's ids look the same)."),
    409: _err("The request contradicts stored state."),
    413: _err("Request body or message over the configured limit."),
    422: _err("Validation failed; `error.problems` names each field."),
    500: _err("Unexpected error; `error.request_id` identifies it in the server log."),
    503: _err("Storage, embedder or processing unavailable; retry later."),
}


def page(fetch: Callable[[int, int], Sequence[T]], limit: int, offset: int) -> Page[T]:
    """One page from ``fetch(limit, offset)``, asking for one extra item to know if more
    follow without counting the whole list."""
    rows = list(fetch(limit + 1, offset))
    more = len(rows) > limit
    return Page(
        items=rows[:limit],
        limit=limit,
        offset=offset,
        next_offset=offset + limit if more else None,
    )


def listed(
    listing: Callable[..., Sequence[T]], limit: int, offset: int, **filters: Any
) -> Envelope[Page[T]]:
    """The answer of a list route: one page of ``listing(**filters, limit=, offset=)``, one of
    the engine's list methods, which checks the filters (by its query model)."""

    def fetch(n: int, skip: int) -> Sequence[T]:
        return listing(limit=n, offset=skip, **filters)

    return Envelope(data=page(fetch, limit, offset))


def json_object_param(value: str | None, name: str) -> dict[str, Any] | None:
    """A query parameter that carries a JSON object (e.g. ``metadata={"channel":"web"}``)."""
    if value is None:
        return None
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict):
        raise ApiError(
            422,
            f"invalid request: {name}",
            problems=[(name, "expected a JSON object, URL-encoded")],
        )
    return parsed


def check_sizes(items: Sequence[tuple[str, dict[str, Any]]], settings: Any, field: str) -> None:
    """Refuse with 413 a request whose messages are over the engine's size limits.

    Size limits answer 413, not 422: the request is well-formed, only too big to accept.
    ``items`` are each message's (content, metadata); ``field`` names the list in the body
    ("" for a single item given inline).
    """
    problems = []
    if len(items) > settings.max_messages_per_call:
        problems.append(
            (
                field or "messages",
                f"{len(items)} in one request; the limit is "
                f"{settings.max_messages_per_call} (send batches)",
            )
        )
    for i, (content, metadata) in enumerate(items):
        at = f"{field}[{i}]." if field else ""
        if len(content) > settings.max_content_chars:
            problems.append(
                (
                    f"{at}content",
                    f"{len(content)} characters; the limit is {settings.max_content_chars}",
                )
            )
        size = len(json.dumps(metadata, ensure_ascii=False).encode())
        if size > settings.max_metadata_bytes:
            problems.append(
                (
                    f"{at}metadata",
                    f"{size} bytes of JSON; the limit is {settings.max_metadata_bytes}",
                )
            )
    if problems:
        fields = ", ".join(f for f, _ in problems)
        raise ApiError(413, f"too large: {fields}", problems=problems)
