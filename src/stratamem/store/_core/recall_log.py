"""The recall log: what each face's recalls injected, kept bounded, over the core's dialect.

Rows are appended in batches by the engine's recorder (never on a caller's path), listed
newest first, summarised into latency buckets for a chart, pruned per project by count and
age, and deleted with a user's memory (``forget_recall_log``, from ``removal.py``): they
hold the user's query and the memory text that was injected. A record whose recall began
before its user's memory was last forgotten is not inserted, whichever process buffered it
(``erasures.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from .._rows import RecallLatencyRow, RecallRecordRow
from .dialect import Tx
from .erasures import began_before, clock_offset, tombstones

__all__ = [
    "RECALL_COLUMNS",
    "add_records",
    "forget_recall_log",
    "latency_series",
    "list_records",
    "prune",
]

_FIELDS = tuple(f.name for f in fields(RecallRecordRow))
RECALL_COLUMNS = ", ".join(_FIELDS)
_WRITTEN = tuple(f for f in _FIELDS if f != "pk")


def _row(r: Sequence[Any]) -> RecallRecordRow:
    values = dict(zip(_FIELDS, r, strict=True))
    # PostgreSQL returns double precision and integer as Python numbers already; SQLite
    # may hand back an int for a REAL that has no fraction.
    values["latency_ms"] = float(values["latency_ms"])
    values["created_at"] = float(values["created_at"])
    return RecallRecordRow(**values)


def add_records(tx: Tx, rows: Sequence[RecallRecordRow]) -> int:
    """Insert ``rows``, except those whose recall began before their user's memory was
    last forgotten (``erasures.py``): the number left out."""
    if not rows:
        return 0
    forgotten = tombstones(tx, ((r.project_id, r.user_id) for r in rows), "forgotten_at")
    offset = clock_offset(tx) if forgotten else 0.0
    kept = [
        r
        for r in rows
        if not began_before(
            # The recall began latency_ms before it was recorded.
            r.created_at - r.latency_ms / 1000,
            offset,
            forgotten.get((r.project_id, r.user_id)),
        )
    ]
    if kept:
        marks = ", ".join("?" for _ in _WRITTEN)
        tx.many(
            f"INSERT INTO recall_log ({', '.join(_WRITTEN)}) VALUES ({marks})",
            [tuple(getattr(r, f) for f in _WRITTEN) for r in kept],
        )
    return len(rows) - len(kept)


def list_records(
    tx: Tx, project_id: str, user_id: str | None, limit: int, offset: int
) -> list[RecallRecordRow]:
    """A project's (or one user's) recall records, newest first."""
    sql = f"SELECT {RECALL_COLUMNS} FROM recall_log WHERE project_id = ?"
    params: list[Any] = [project_id]
    if user_id is not None:
        sql += " AND user_id = ?"
        params.append(user_id)
    rows = tx.all(
        sql + " ORDER BY created_at DESC, pk DESC LIMIT ? OFFSET ?", (*params, limit, offset)
    )
    return [_row(r) for r in rows]


def _rank(ordered: Sequence[float], share: float) -> float:
    """The nearest-rank percentile of sorted values: the same number on every backend
    (SQL's percentile functions differ between SQLite and PostgreSQL)."""
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


def latency_series(
    tx: Tx, project_id: str, since: float, bucket_seconds: float
) -> list[RecallLatencyRow]:
    """Recall latency of a project since ``since`` (epoch seconds), in buckets of
    ``bucket_seconds`` aligned to ``since``, oldest first; buckets without recalls are
    left out. The log is bounded per project, so the window's rows are few."""
    if bucket_seconds <= 0:
        raise ValueError("bucket_seconds must be positive")
    buckets: dict[int, list[tuple[float, bool]]] = {}
    for created, latency, outcome in tx.all(
        "SELECT created_at, latency_ms, outcome FROM recall_log "
        "WHERE project_id = ? AND created_at >= ?",
        (project_id, since),
    ):
        index = int((float(created) - since) // bucket_seconds)
        buckets.setdefault(index, []).append((float(latency), outcome == "skipped"))
    series = []
    for index in sorted(buckets):
        entries = buckets[index]
        ordered = sorted(latency for latency, _ in entries)
        series.append(
            RecallLatencyRow(
                bucket_start=since + index * bucket_seconds,
                count=len(entries),
                skipped=sum(skipped for _, skipped in entries),
                p50_ms=_rank(ordered, 0.5),
                p95_ms=_rank(ordered, 0.95),
                max_ms=ordered[-1],
            )
        )
    return series


def prune(tx: Tx, project_id: str | None, keep: int, older_than: float) -> int:
    """Delete records older than ``older_than`` (epoch seconds) and, per project (only
    ``project_id``'s if given), all but the newest ``keep``; the number deleted."""
    where, scope = ("WHERE project_id = ?", (project_id,)) if project_id is not None else ("", ())
    deleted: int = tx.execute(
        f"DELETE FROM recall_log {where}{' AND' if where else 'WHERE'} created_at < ?",
        (*scope, older_than),
    ).rowcount
    projects = (
        [project_id]
        if project_id is not None
        else [p for (p,) in tx.all("SELECT DISTINCT project_id FROM recall_log")]
    )
    for project in projects:
        # The newest `keep` stay; NOT IN over at most `keep` keys (the log is small).
        deleted += tx.execute(
            "DELETE FROM recall_log WHERE project_id = ? AND pk NOT IN (SELECT pk FROM "
            "recall_log WHERE project_id = ? ORDER BY created_at DESC, pk DESC LIMIT ?)",
            (project, project, keep),
        ).rowcount
    return deleted


def forget_recall_log(tx: Tx, project_id: str, user_id: str) -> int:
    """Delete every recall record of a user: its query and injected block are the user's
    memory text. Forgetting part of a memory deletes them all too: which records quoted
    the forgotten part cannot be told reliably from the text, and the log only serves a
    dashboard, so losing a forgotten user's recent log costs little."""
    deleted: int = tx.execute(
        "DELETE FROM recall_log WHERE project_id = ? AND user_id = ?", (project_id, user_id)
    ).rowcount
    return deleted
