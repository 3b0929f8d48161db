"""The columns the core reads of each table, and their rows as the port's dataclasses.

One list of columns per table, one converter per row type, for both backends: what
differs (JSON text or ``jsonb``, JSON arrays or ``text[]``) is the dialect's
``load_json`` / ``load_array``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import FactRow, MessageRow, SessionRow, SummaryRow, TopicRow
from .dialect import Dialect

__all__ = [
    "FACT_COLUMNS",
    "MESSAGE_COLUMNS",
    "SESSION_COLUMNS",
    "SUMMARY_COLUMNS",
    "TOPIC_COLUMNS",
    "fact_row",
    "message_row",
    "session_row",
    "summary_row",
    "topic_row",
]

MESSAGE_COLUMNS = (
    "pk, project_id, id, user_id, session_id, process_id, role, content, content_hash, ts, "
    "event_type, page, metadata, status, error, attempts, job_id, created_at, processed_at, name"
)
SESSION_COLUMNS = "project_id, id, user_id, title, metadata, created_at, updated_at"
SUMMARY_COLUMNS = (
    "pk, project_id, id, user_id, text, status, confidence, version, fact_ids, message_ids, "
    "labels, valid_from, valid_to, superseded_by, model, prompt_version, created_at, updated_at, "
    "observed_at"
)
FACT_COLUMNS = (
    "pk, project_id, id, user_id, text, kind, confidence, status, message_ids, labels, "
    "occurred_at, valid_from, valid_to, superseded_by, model, prompt_version, created_at, "
    "observed_at"
)
# Without summary_ids: a topic's summaries come from topic_summaries (see topic_row).
TOPIC_COLUMNS = "pk, project_id, id, user_id, name, description, status, created_at, updated_at"


def message_row(r: Sequence[Any], d: Dialect) -> MessageRow:
    return MessageRow(
        pk=r[0],
        project_id=r[1],
        id=r[2],
        user_id=r[3],
        session_id=r[4],
        process_id=r[5],
        role=r[6],
        content=r[7],
        content_hash=r[8],
        ts=r[9],
        event_type=r[10],
        page=r[11],
        metadata=d.load_json(r[12]),
        status=r[13],
        error=r[14],
        attempts=r[15],
        job_id=r[16],
        created_at=r[17],
        processed_at=r[18],
        name=r[19],
    )


def session_row(r: Sequence[Any], d: Dialect) -> SessionRow:
    return SessionRow(
        project_id=r[0],
        id=r[1],
        user_id=r[2],
        title=r[3],
        metadata=d.load_json(r[4]),
        created_at=r[5],
        updated_at=r[6],
    )


def summary_row(r: Sequence[Any], d: Dialect) -> SummaryRow:
    return SummaryRow(
        pk=r[0],
        project_id=r[1],
        id=r[2],
        user_id=r[3],
        text=r[4],
        status=r[5],
        confidence=r[6],
        version=r[7],
        fact_ids=d.load_array(r[8]),
        message_ids=d.load_array(r[9]),
        labels=d.load_array(r[10]),
        valid_from=r[11],
        valid_to=r[12],
        superseded_by=r[13],
        model=r[14],
        prompt_version=r[15],
        created_at=r[16],
        updated_at=r[17],
        observed_at=r[18],
    )


def fact_row(r: Sequence[Any], d: Dialect) -> FactRow:
    return FactRow(
        pk=r[0],
        project_id=r[1],
        id=r[2],
        user_id=r[3],
        text=r[4],
        kind=r[5],
        confidence=r[6],
        status=r[7],
        message_ids=d.load_array(r[8]),
        labels=d.load_array(r[9]),
        occurred_at=r[10],
        valid_from=r[11],
        valid_to=r[12],
        superseded_by=r[13],
        model=r[14],
        prompt_version=r[15],
        created_at=r[16],
        observed_at=r[17],
    )


def topic_row(r: Sequence[Any], summary_ids: list[str]) -> TopicRow:
    return TopicRow(
        pk=r[0],
        project_id=r[1],
        id=r[2],
        user_id=r[3],
        name=r[4],
        description=r[5],
        status=r[6],
        created_at=r[7],
        updated_at=r[8],
        summary_ids=summary_ids,
    )
