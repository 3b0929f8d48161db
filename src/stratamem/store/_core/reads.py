"""Reads of the derived layers: facts, summaries, topics and their histories."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from .. import (
    CURRENT_SUMMARY,
    FactRow,
    ItemFilters,
    ItemRows,
    StandingFact,
    SummaryRow,
    TopicRow,
)
from .dialect import Tx
from .filters import item_filter_sql
from .rows import (
    FACT_COLUMNS,
    MESSAGE_COLUMNS,
    SUMMARY_COLUMNS,
    TOPIC_COLUMNS,
    fact_row,
    message_row,
    summary_row,
    topic_row,
)

__all__ = [
    "get_facts",
    "get_summaries",
    "items_by_pk",
    "list_facts",
    "list_summaries",
    "list_topics",
    "rows_by_pk",
    "speaker_names",
    "standing_facts",
    "summary_by_id",
    "summary_history",
    "topics_of_summaries",
]

T = TypeVar("T")

# What a summary's history entry holds, in the order of the columns read.
_HISTORY_KEYS = (
    "version",
    "text",
    "status",
    "confidence",
    "fact_ids",
    "reason",
    "actor",
    "changed_at",
)
# A topic's columns when the statement joins other tables.
_TOPIC_T = ", ".join(f"t.{c.strip()}" for c in TOPIC_COLUMNS.split(","))
# When a listed item happened, for its time window.
_SUMMARY_WHEN = "COALESCE(s.valid_from, s.observed_at)"
_FACT_WHEN = "COALESCE(f.occurred_at, f.observed_at)"


def summary_by_id(tx: Tx, project_id: str, summary_id: str) -> SummaryRow | None:
    row = tx.one(
        f"SELECT {SUMMARY_COLUMNS} FROM summaries WHERE project_id = ? AND id = ?",
        (project_id, summary_id),
    )
    return None if row is None else summary_row(row, tx.dialect)


def rows_by_pk(tx: Tx, table: str, columns: str, pks: Sequence[int]) -> dict[int, Any]:
    """The rows of ``table`` (``columns``, the pk first) with these pks, by pk."""
    if not pks:
        return {}
    where, params = tx.dialect.in_("pk", list(pks))
    return {r[0]: r for r in tx.all(f"SELECT {columns} FROM {table} WHERE {where}", params)}


def items_by_pk(
    tx: Tx, messages: Sequence[int], facts: Sequence[int], summaries: Sequence[int]
) -> ItemRows:
    """The rows of these pks of each layer, by pk: the layers' statements sent together."""
    d = tx.dialect
    layers = (
        ("messages", MESSAGE_COLUMNS, messages),
        ("facts", FACT_COLUMNS, facts),
        ("summaries", SUMMARY_COLUMNS, summaries),
    )
    cursors: dict[str, Any] = {}
    with tx.together():
        for table, columns, pks in layers:
            if pks:
                where, params = d.in_("pk", list(pks))
                cursors[table] = tx.execute(f"SELECT {columns} FROM {table} WHERE {where}", params)

    def rows(table: str) -> list[Any]:
        return cursors[table].fetchall() if table in cursors else []

    return (
        {r[0]: message_row(r, d) for r in rows("messages")},
        {r[0]: fact_row(r, d) for r in rows("facts")},
        {r[0]: summary_row(r, d) for r in rows("summaries")},
    )


def _by_ids(
    tx: Tx,
    table: str,
    columns: str,
    convert: Callable[[Any, Any], T],
    project_id: str,
    ids: Sequence[str],
) -> list[T]:
    """The rows of a project with these ids (column 2), in the order asked, unknown ids
    left out."""
    if not ids:
        return []
    where, params = tx.dialect.in_("id", list(ids))
    rows = tx.all(
        f"SELECT {columns} FROM {table} WHERE project_id = ? AND {where}", [project_id, *params]
    )
    by_id = {r[2]: convert(r, tx.dialect) for r in rows}
    return [by_id[i] for i in ids if i in by_id]


def get_summaries(tx: Tx, project_id: str, ids: Sequence[str]) -> list[SummaryRow]:
    return _by_ids(tx, "summaries", SUMMARY_COLUMNS, summary_row, project_id, ids)


def get_facts(tx: Tx, project_id: str, ids: Sequence[str]) -> list[FactRow]:
    return _by_ids(tx, "facts", FACT_COLUMNS, fact_row, project_id, ids)


def summaries_by_pk(tx: Tx, pks: Sequence[int]) -> dict[int, SummaryRow]:
    rows = rows_by_pk(tx, "summaries", SUMMARY_COLUMNS, pks)
    return {pk: summary_row(r, tx.dialect) for pk, r in rows.items()}


def facts_by_pk(tx: Tx, pks: Sequence[int]) -> dict[int, FactRow]:
    rows = rows_by_pk(tx, "facts", FACT_COLUMNS, pks)
    return {pk: fact_row(r, tx.dialect) for pk, r in rows.items()}


def _owned(project_id: str, user_id: str | None) -> tuple[str, list[Any]]:
    """`` WHERE`` of a project's rows, or of one user's."""
    if user_id is None:
        return " WHERE project_id = ?", [project_id]
    return " WHERE project_id = ? AND user_id = ?", [project_id, user_id]


def list_summaries(
    tx: Tx,
    project_id: str,
    user_id: str | None,
    status: Sequence[str],
    limit: int,
    offset: int,
    filters: ItemFilters | None,
) -> list[SummaryRow]:
    """Summaries in creation order; ``status`` narrows them (``filters.status`` does not:
    the caller passes it as ``status``)."""
    where, params = _owned(project_id, user_id)
    sql = f"SELECT {SUMMARY_COLUMNS} FROM summaries s{where}"
    if status:
        clause, args = tx.dialect.in_("status", list(status))
        sql += f" AND {clause}"
        params += args
    if filters is not None:
        clause, args = item_filter_sql(tx.dialect, filters, "s", _SUMMARY_WHEN)
        sql += clause
        params += args
    rows = tx.all(sql + " ORDER BY pk LIMIT ? OFFSET ?", [*params, limit, offset])
    return [summary_row(r, tx.dialect) for r in rows]


def list_facts(
    tx: Tx,
    project_id: str,
    user_id: str | None,
    limit: int,
    offset: int,
    newest_first: bool,
    filters: ItemFilters | None,
) -> list[FactRow]:
    """Facts in creation order, or only the active ones newest first."""
    where, params = _owned(project_id, user_id)
    sql = f"SELECT {FACT_COLUMNS} FROM facts f{where}"
    if newest_first:
        sql += " AND status = 'active'"
    if filters is not None:
        if filters.status:
            clause, args = tx.dialect.in_("status", list(filters.status))
            sql += f" AND {clause}"
            params += args
        clause, args = item_filter_sql(tx.dialect, filters, "f", _FACT_WHEN)
        sql += clause
        params += args
    sql += f" ORDER BY pk {'DESC' if newest_first else ''} LIMIT ? OFFSET ?"
    return [fact_row(r, tx.dialect) for r in tx.all(sql, [*params, limit, offset])]


def summary_history(tx: Tx, project_id: str, summary_id: str) -> list[dict[str, Any]]:
    """Every version of a summary, oldest first."""
    rows = tx.all(
        "SELECT h.version, h.text, h.status, h.confidence, h.fact_ids, h.reason, h.actor, "
        "h.changed_at FROM summary_history h JOIN summaries s ON s.pk = h.summary_pk "
        "WHERE s.project_id = ? AND s.id = ? ORDER BY h.version, h.pk",
        (project_id, summary_id),
    )
    out = []
    for r in rows:
        item = dict(zip(_HISTORY_KEYS, r, strict=True))
        item["fact_ids"] = tx.dialect.load_array(item["fact_ids"])
        out.append(item)
    return out


def list_topics(tx: Tx, project_id: str, user_id: str) -> list[TopicRow]:
    """A user's active topics in creation order, each with its summaries' ids in theirs
    (one statement: a topic and its summaries as one moment saw them)."""
    rows = tx.all(
        f"SELECT {_TOPIC_T}, s.id FROM topics t "
        "LEFT JOIN topic_summaries ts ON ts.topic_pk = t.pk "
        "LEFT JOIN summaries s ON s.pk = ts.summary_pk "
        "WHERE t.project_id = ? AND t.user_id = ? AND t.status = 'active' ORDER BY t.pk, s.pk",
        (project_id, user_id),
    )
    topics: dict[int, tuple[Sequence[Any], list[str]]] = {}
    for r in rows:
        _, ids = topics.setdefault(r[0], (r, []))
        if r[-1] is not None:
            ids.append(r[-1])
    return [topic_row(r, ids) for r, ids in topics.values()]


def topics_of_summaries(tx: Tx, pks: Sequence[int]) -> dict[int, list[TopicRow]]:
    """The active topics each summary is filed under (summary pk → topics, in creation
    order; their ``summary_ids`` left empty)."""
    if not pks:
        return {}
    where, params = tx.dialect.in_("ts.summary_pk", list(pks))
    rows = tx.all(
        f"SELECT ts.summary_pk, {_TOPIC_T} FROM topic_summaries ts "
        f"JOIN topics t ON t.pk = ts.topic_pk WHERE {where} AND t.status = 'active' "
        "ORDER BY t.pk",
        params,
    )
    out: dict[int, list[TopicRow]] = {}
    for r in rows:
        out.setdefault(r[0], []).append(topic_row(r[1:], []))
    return out


def speaker_names(tx: Tx, project_id: str, user_id: str) -> list[str]:
    """Names of the speakers of a user's messages (messages sent with a ``name``)."""
    rows = tx.all(
        "SELECT name FROM speakers WHERE project_id = ? AND user_id = ? ORDER BY name",
        (project_id, user_id),
    )
    return [r[0] for r in rows]


def standing_facts(tx: Tx, project_id: str, user_id: str, limit: int) -> list[StandingFact]:
    """The user's active standing facts, newest first, at most ``limit``, each with the
    newest current summary holding it. A fact whose every holding summary was retired (an
    operator archived or deleted it) is left out: it is no longer the user's memory. The
    two reads are sent together: the facts through their partial index (``facts_standing``),
    then only the summaries holding one of them (``Dialect.summaries_holding``), not every
    standing summary of a long history."""
    d = tx.dialect
    read = (
        "SELECT {} FROM facts WHERE project_id = ? AND user_id = ? "
        f"AND standing = {d.true} AND status = 'active' ORDER BY pk DESC LIMIT ?"
    )
    args = (project_id, user_id, limit)
    with tx.together():
        facts_read = tx.execute(read.format(FACT_COLUMNS), args)
        holders_read = tx.execute(
            "SELECT id, status, fact_ids FROM summaries WHERE pk IN "
            f"({d.summaries_holding('?', read.format('id'))}) AND standing = {d.true} "
            "ORDER BY pk DESC",
            (project_id, *args),
        )
    facts = [fact_row(r, d) for r in facts_read.fetchall()]
    held_by = holders_read.fetchall()
    if not facts:
        return []
    holders: dict[str, list[tuple[str, bool]]] = {}  # fact id -> (summary id, current?)
    for sid, status, fact_ids in held_by:
        for fid in d.load_array(fact_ids):
            holders.setdefault(fid, []).append((sid, status in CURRENT_SUMMARY))
    out = []
    for f in facts:
        held = holders.get(f.id, [])
        current = [sid for sid, ok in held if ok]
        if held and not current:
            continue
        out.append(StandingFact(f, current[0] if current else None))
    return out
