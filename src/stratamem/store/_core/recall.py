"""Recall's reads: what candidates are ranked on, one query per layer, as named briefs.

The SQL is written here once. A backend runs the reads (``SQLStore._read_briefs``) and
hands each row back with the item's vector appended, from wherever it keeps vectors;
the rows become ``MessageBrief``, ``FactBrief`` and ``SummaryBrief`` here, with the same
Python types on every backend.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any, NamedTuple

from .._briefs import Briefs, FactBrief, MessageBrief, SummaryBrief
from .dialect import Dialect

__all__ = ["BriefRead", "brief_reads", "briefs"]


class BriefRead(NamedTuple):
    """One layer's read: ``SELECT {columns}, <the item's vector> {source}``, ``params``
    binding the ``?`` of ``source``. ``m`` is the layer's table; ``m.pk`` comes first."""

    kind: str  # "message", "fact" or "summary", as the vectors are filed
    columns: str
    source: str
    params: list[Any]


# The nearest turn of the session before (op "<") or after (">") the message m, in
# (ts, pk) order. A turn sharing the timestamp (a batch without timestamps) is nearest:
# seeking on (ts =, pk <) first keeps each lookup one index seek, where a row value
# (ts, pk) < (?, ?) walks every turn with that timestamp.
_SIDE = (
    "COALESCE((SELECT x.pk FROM messages x{hint} WHERE x.project_id = m.project_id "
    "AND x.session_id = m.session_id AND x.ts = m.ts AND x.pk {op} m.pk "
    "ORDER BY x.pk {desc} LIMIT 1), "
    "(SELECT x.pk FROM messages x{hint} WHERE x.project_id = m.project_id "
    "AND x.session_id = m.session_id AND x.ts {op} m.ts "
    "ORDER BY x.ts {desc}, x.pk {desc} LIMIT 1))"
)
# The same where a row value is one index seek: half the lookups.
_ROW_SIDE = (
    "(SELECT x.pk FROM messages x WHERE x.project_id = m.project_id "
    "AND x.session_id = m.session_id AND (x.ts, x.pk) {op} (m.ts, m.pk) "
    "ORDER BY x.ts {desc}, x.pk {desc} LIMIT 1)"
)


# The columns' SQL depends on the dialect only: built once (a search reads briefs 4 times).
@lru_cache(maxsize=8)
def _message_columns(d: Dialect, neighbours: bool) -> str:
    if neighbours and d.row_value_seek:
        around = f"{_ROW_SIDE.format(op='<', desc='DESC')}, {_ROW_SIDE.format(op='>', desc='')}"
    elif neighbours:
        hint = d.indexed_by("messages_by_session_time")
        around = (
            f"{_SIDE.format(hint=hint, op='<', desc='DESC')}, "
            f"{_SIDE.format(hint=hint, op='>', desc='')}"
        )
    else:
        around = "CAST(NULL AS BIGINT), CAST(NULL AS BIGINT)"
    # What became of each fact drawn from the message, in pk order: NULL while it holds,
    # what replaced it ('' when nothing is named) once superseded. The message is superseded
    # when every one of them is (``briefs``). One subquery a row gives both: two read the
    # same facts twice (the costliest part of the read on PostgreSQL).
    fates = d.array_of(
        "SELECT CASE WHEN f.status = 'superseded' THEN COALESCE(f.superseded_by, '') END "
        "AS value FROM fact_sources fs JOIN facts f ON f.pk = fs.fact_pk "
        "WHERE fs.message_pk = m.pk ORDER BY f.pk"
    )
    return (
        f"m.pk, m.id, m.session_id, m.name, m.ts, {fates}, m.small_talk, m.asks, {around}, m.role"
    )


_FACT_COLUMNS = (
    "m.pk, m.id, m.status, m.occurred_at, m.observed_at, m.created_at, m.valid_to, m.message_ids"
)


_SUMMARY_COLUMNS = "m.pk, m.id, m.status, m.observed_at, m.created_at, m.valid_to, m.fact_ids"


def _summary_read(d: Dialect, pks: list[int]) -> tuple[str, str, list[Any]]:
    """(columns, ``FROM`` and ``WHERE`` up to the owner, parameters) of the summaries
    ``pks``, each with the ids of its active topics. Where the backend orders an aggregate,
    the topics of all of them are one grouped join: a subquery per row made PostgreSQL hash
    a small topics table once per summary (2.3 against 1.0 ms for 50 LoCoMo summaries)."""
    where, params = d.in_("m.pk", pks)
    by_pk = d.indexed_by(None)  # see brief_reads
    agg = d.ordered_array_agg("t.id", "t.pk")
    if agg is None:
        topics = d.array_of(
            "SELECT t.id AS value FROM topic_summaries ts JOIN topics t ON t.pk = ts.topic_pk "
            "WHERE ts.summary_pk = m.pk AND t.status = 'active' ORDER BY t.pk"
        )
        return f"{_SUMMARY_COLUMNS}, {topics}", f"FROM summaries m{by_pk} WHERE {where}", params
    grouped, grouped_params = d.in_("ts.summary_pk", pks)
    source = (
        f"FROM summaries m{by_pk} LEFT JOIN (SELECT ts.summary_pk, {agg} AS topics "
        "FROM topic_summaries ts JOIN topics t ON t.pk = ts.topic_pk "
        f"WHERE {grouped} AND t.status = 'active' GROUP BY ts.summary_pk) x "
        f"ON x.summary_pk = m.pk WHERE {where}"
    )
    return f"{_SUMMARY_COLUMNS}, x.topics", source, [*grouped_params, *params]


def brief_reads(
    d: Dialect,
    project_id: str,
    user_id: str,
    pks: tuple[Sequence[int], Sequence[int], Sequence[int]],
    neighbours: bool,
) -> list[BriefRead]:
    """The reads of the (messages, facts, summaries) ``pks`` of one user: one per layer
    asked about; another user's items are not read. Each row is found by its pk: with
    the user named beside the pks, SQLite's planner walked the user's index instead (for
    a user of 100,000 messages, 109 summaries took 1.8 ms against 0.05, 351 messages 1.9
    against 0.2)."""
    layers = (
        ("message", "messages", _message_columns(d, neighbours)),
        ("fact", "facts", _FACT_COLUMNS),
        ("summary", "summaries", ""),
    )
    reads = []
    for (kind, table, columns), wanted in zip(layers, pks, strict=True):
        if not wanted:
            continue
        if kind == "summary":
            columns, source, params = _summary_read(d, list(wanted))
        else:
            where, params = d.in_("m.pk", list(wanted))
            source = f"FROM {table} m{d.indexed_by(None)} WHERE {where}"
        owner = f"{source} AND m.project_id = ? AND m.user_id = ?"
        reads.append(BriefRead(kind, columns, owner, [*params, project_id, user_id]))
    return reads


def briefs(
    reads: Sequence[BriefRead], rows: Iterable[Iterable[Sequence[Any]]], d: Dialect
) -> Briefs:
    """The briefs of what ``reads`` found: ``rows`` holds each read's rows, the item's
    vector (float32 bytes or None) appended to each."""
    messages: dict[int, MessageBrief] = {}
    facts: dict[int, FactBrief] = {}
    summaries: dict[int, SummaryBrief] = {}
    for read, found in zip(reads, rows, strict=True):
        if read.kind == "message":
            for row in found:
                (pk, id_, session, name, ts, fates, small_talk, asks, prev, next_) = row[:10]
                role, vector = row[10], row[11]
                fate = d.load_array(fates)
                messages[pk] = MessageBrief(
                    id_,
                    session,
                    name,
                    ts,
                    bool(fate) and None not in fate,
                    bool(small_talk),
                    bool(asks),
                    prev,
                    next_,
                    vector,
                    tuple(dict.fromkeys(str(s) for s in fate if s)),
                    role,
                )
        elif read.kind == "fact":
            for pk, id_, status, occurred, observed, created, valid_to, mids, vector in found:
                facts[pk] = FactBrief(
                    id_,
                    status,
                    occurred,
                    observed,
                    created,
                    valid_to,
                    vector,
                    tuple(str(m) for m in d.load_array(mids)),
                )
        else:
            load = d.load_array
            for pk, id_, status, observed, created, valid_to, fact_ids, topics, vector in found:
                summaries[pk] = SummaryBrief(
                    id_, status, observed, created, valid_to, load(fact_ids), load(topics), vector
                )
    return messages, facts, summaries
