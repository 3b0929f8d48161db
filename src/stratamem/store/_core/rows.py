"""The columns the core reads of each table, and their rows as the port's dataclasses.

One list of columns per table, one converter per row type, for both backends: what
differs (JSON text or ``jsonb``, JSON arrays or ``text[]``) is the dialect's
``load_json`` / ``load_array``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import fields
from typing import TYPE_CHECKING, Any, TypeVar

from .. import AuditRow, FactRow, MessageRow, SessionRow, SummaryRow, TopicRow
from .dialect import Dialect

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_Row = TypeVar("_Row", bound="DataclassInstance")

__all__ = [
    "AUDIT_COLUMNS",
    "FACT_COLUMNS",
    "MESSAGE_COLUMNS",
    "SESSION_COLUMNS",
    "SUMMARY_COLUMNS",
    "TOPIC_COLUMNS",
    "audit_row",
    "fact_row",
    "message_row",
    "session_row",
    "summary_row",
    "topic_row",
]

MESSAGE_COLUMNS = (
    "pk, project_id, id, user_id, session_id, process_id, role, content, content_hash, ts, "
    "event_type, page, metadata, status, error, attempts, job_id, created_at, processed_at, name, "
    "small_talk, asks"
)


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
        small_talk=bool(r[20]),
        asks=bool(r[21]),
    )


def _columns(cls: type[DataclassInstance], *, without: tuple[str, ...] = ()) -> str:
    return ", ".join(f.name for f in fields(cls) if f.name not in without)


def _converter(
    cls: type[_Row],
    *,
    arrays: tuple[str, ...] = (),
    documents: tuple[str, ...] = (),
    booleans: tuple[str, ...] = (),
) -> Callable[[Sequence[Any], Dialect], _Row]:
    """A row of ``_columns(cls)`` as a ``cls``: positional, its array and JSON columns
    decoded by the dialect, its flags as bools (SQLite stores them as 0 and 1)."""
    names = [f.name for f in fields(cls)]
    array_at = tuple(names.index(n) for n in arrays)
    document_at = tuple(names.index(n) for n in documents)
    boolean_at = tuple(names.index(n) for n in booleans)

    def convert(r: Sequence[Any], d: Dialect) -> _Row:
        values = list(r)
        for i in array_at:
            values[i] = d.load_array(values[i])
        for i in document_at:
            values[i] = d.load_json(values[i])
        for i in boolean_at:
            values[i] = bool(values[i])
        return cls(*values)

    return convert


# The columns of these tables are their row type's fields, in order.
SESSION_COLUMNS = _columns(SessionRow)
SUMMARY_COLUMNS = _columns(SummaryRow)
FACT_COLUMNS = _columns(FactRow)
AUDIT_COLUMNS = _columns(AuditRow)
# Without summary_ids: a topic's summaries come from topic_summaries (see topic_row).
TOPIC_COLUMNS = _columns(TopicRow, without=("summary_ids",))

session_row = _converter(SessionRow, documents=("metadata",))
summary_row = _converter(
    SummaryRow, arrays=("fact_ids", "message_ids", "labels"), booleans=("standing",)
)
fact_row = _converter(FactRow, arrays=("message_ids", "labels"), booleans=("standing",))
audit_row = _converter(AuditRow, documents=("details",))


def topic_row(r: Sequence[Any], summary_ids: list[str]) -> TopicRow:
    return TopicRow(
        pk=r[0],
        project_id=r[1],
        id=r[2],
        user_id=r[3],
        name=r[4],
        description=r[5],
        status=r[6],
        summary_ids=summary_ids,
        created_at=r[7],
        updated_at=r[8],
    )
