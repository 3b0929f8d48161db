"""Stored rows to public types (shared by the facade and the read path)."""

from __future__ import annotations

from .._time import parse_iso as parse_ts
from .._time import parse_stored
from ..store import FactRow, MessageRow, SummaryRow, TopicRow
from ..types import Fact, Message, Summary, Topic

__all__ = ["fact_from_row", "message_from_row", "summary_from_row", "topic_from_row"]


def message_from_row(row: MessageRow) -> Message:
    return Message(
        id=row.id,
        project_id=row.project_id,
        user_id=row.user_id,
        session_id=row.session_id,
        role=row.role,
        content=row.content,
        timestamp=parse_stored(row.ts),
        event_type=row.event_type,
        page=row.page,
        process_id=row.process_id,
        name=row.name,
        metadata=row.metadata,
        status=row.status,
        error=row.error,
        attempts=row.attempts,
        created_at=parse_stored(row.created_at),
        processed_at=parse_ts(row.processed_at),
    )


def fact_from_row(r: FactRow) -> Fact:
    return Fact(
        id=r.id,
        user_id=r.user_id,
        text=r.text,
        kind=r.kind,
        message_ids=r.message_ids,
        occurred_at=parse_ts(r.occurred_at),
        observed_at=parse_ts(r.observed_at),
        valid_from=parse_ts(r.valid_from),
        valid_to=parse_ts(r.valid_to),
        confidence=r.confidence,
        status=r.status,
        superseded_by=r.superseded_by,
        labels=r.labels,
        model=r.model,
        prompt_version=r.prompt_version,
        created_at=parse_ts(r.created_at),
    )


def summary_from_row(r: SummaryRow) -> Summary:
    return Summary(
        id=r.id,
        user_id=r.user_id,
        text=r.text,
        fact_ids=r.fact_ids,
        message_ids=r.message_ids,
        status=r.status,
        valid_from=parse_ts(r.valid_from),
        valid_to=parse_ts(r.valid_to),
        confidence=r.confidence,
        labels=r.labels,
        version=r.version,
        superseded_by=r.superseded_by,
        observed_at=parse_ts(r.observed_at),
        model=r.model,
        prompt_version=r.prompt_version,
        created_at=parse_ts(r.created_at),
        updated_at=parse_ts(r.updated_at),
    )


def topic_from_row(r: TopicRow) -> Topic:
    return Topic(
        id=r.id,
        user_id=r.user_id,
        name=r.name,
        description=r.description,
        summary_ids=r.summary_ids,
        created_at=parse_ts(r.created_at),
        updated_at=parse_ts(r.updated_at),
    )
