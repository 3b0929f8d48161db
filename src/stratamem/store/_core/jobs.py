"""The jobs' bookkeeping both backends share: what a claim marks, leases, a batch's
finishing and failure, outages, retries, job states, and what ``stats()`` counts.

Which jobs a claim takes is the backends' own (SQLite: under its one writer; PostgreSQL:
``FOR UPDATE SKIP LOCKED``, advisory locks and procrastinate's dispatch); once taken, the
jobs are held by ``take``. Completing or failing a batch first checks, with the job rows
locked (``for_update``), that the worker still holds every job (``check_lease``): a worker
whose lease ran out and was reclaimed gets ``LeaseLostError`` and its work is discarded.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import astuple
from typing import Any

from ..._time import now_iso
from .. import ClaimedBatch, LeaseLostError, MessageRow, OutageRow, QueueRow, UsageDayRow
from .._batches import NEXT_JOB_SQL, OUTAGE_COLUMNS, outage_after
from .._batches import next_job_time as _next_job_time
from .dialect import Tx
from .rows import MESSAGE_COLUMNS, message_row

__all__ = [
    "check_lease",
    "end_outage",
    "extend_lease",
    "fail_batch",
    "finish_batch",
    "job_states",
    "llm_usage",
    "next_job_time",
    "outages",
    "queue_state",
    "record_outage",
    "retry_failed",
    "store_counts",
    "take",
    "unfinished_jobs",
    "usage_by_day",
]

# -- claiming and leases -------------------------------------------------------------------


def take(
    tx: Tx,
    worker_id: str,
    lease_until: float | None,
    user: tuple[str, str],
    job_ids: list[int],
    hold: float | None,
) -> ClaimedBatch:
    """Hold ``job_ids`` of ``user`` for ``worker_id`` (this attempt counts), and the
    outages' probe until ``hold`` when this claim is the probe."""
    if hold is not None:
        tx.execute("UPDATE outages SET next_probe = ?", (hold,))
    where, params = tx.dialect.in_("id", job_ids)
    attempts = tx.all(
        "UPDATE jobs SET status = 'running', locked_by = ?, lease_until = ?, "
        f"attempts = attempts + 1 WHERE {where} RETURNING id, attempts",
        [worker_id, lease_until, *params],
    )
    where, params = tx.dialect.in_("job_id", job_ids)
    tx.execute(f"UPDATE messages SET attempts = attempts + 1 WHERE {where}", params)
    return ClaimedBatch(
        worker_id=worker_id,
        project_id=user[0],
        user_id=user[1],
        job_ids=job_ids,
        messages=_messages_of_jobs(tx, job_ids),
        job_attempts={int(j): int(a) for j, a in attempts},
        probe=hold is not None,
    )


def _messages_of_jobs(tx: Tx, job_ids: Sequence[int]) -> list[MessageRow]:
    """The messages of ``job_ids``, in acceptance order (what a claimed batch processes)."""
    where, params = tx.dialect.in_("job_id", job_ids)
    rows = tx.all(f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE {where} ORDER BY pk", params)
    return [message_row(r, tx.dialect) for r in rows]


def check_lease(tx: Tx, batch: ClaimedBatch) -> None:
    """``LeaseLostError`` unless the batch's worker still holds every job of it. The rows
    stay locked (``for_update``): a reclaim racing this commit waits for it, or this check
    sees it."""
    where, params = tx.dialect.in_("id", batch.job_ids)
    held = tx.all(
        f"SELECT id FROM jobs WHERE {where} AND status = 'running' AND locked_by = ?"
        f"{tx.dialect.for_update}",
        [*params, batch.worker_id],
    )
    if len(held) != len(batch.job_ids):
        raise LeaseLostError(f"worker {batch.worker_id} no longer holds jobs {batch.job_ids}")


def extend_lease(tx: Tx, job_ids: Sequence[int], worker_id: str, lease_seconds: float) -> bool:
    """Whether ``worker_id`` still held every one of ``job_ids``, now for longer."""
    where, params = tx.dialect.in_("id", list(job_ids))
    cur = tx.execute(
        f"UPDATE jobs SET lease_until = ? WHERE {where} AND status = 'running' AND locked_by = ?",
        [time.time() + lease_seconds, *params, worker_id],
    )
    return bool(cur.rowcount == len(job_ids))


# -- finishing -----------------------------------------------------------------------------


def finish_batch(tx: Tx, batch: ClaimedBatch, now: float) -> None:
    """The batch's messages processed and its jobs done (at ``now``), released."""
    where, params = tx.dialect.in_("job_id", batch.job_ids)
    tx.execute(
        f"UPDATE messages SET status = 'processed', error = NULL, processed_at = ? WHERE {where}",
        [now_iso(), *params],
    )
    where, params = tx.dialect.in_("id", batch.job_ids)
    tx.execute(
        "UPDATE jobs SET status = 'done', finished_at = ?, locked_by = NULL, "
        f"lease_until = NULL, last_error = NULL WHERE {where}",
        [now, *params],
    )


def fail_batch(
    tx: Tx,
    batch: ClaimedBatch,
    error: str,
    retry_at: float | None,
    *,
    counted: bool,
    retry_cap: int | None,
) -> None:
    """The batch's jobs queued again at ``retry_at`` (under ``retry_cap`` jobs a batch when
    given), or failed for good without it; ``error`` kept on jobs and messages. An attempt
    not ``counted`` is taken back from jobs and messages."""
    error = error[:2000]
    back = "" if counted else f", attempts = {tx.dialect.greatest('attempts - 1', '0')}"
    jobs, job_params = tx.dialect.in_("id", batch.job_ids)
    messages, message_params = tx.dialect.in_("job_id", batch.job_ids)
    if retry_at is not None:
        tx.execute(
            "UPDATE jobs SET status = 'queued', run_after = ?, locked_by = NULL, "
            "lease_until = NULL, last_error = ?, batch_cap = coalesce(?, batch_cap)"
            f"{back} WHERE {jobs}",
            [retry_at, error, retry_cap, *job_params],
        )
        tx.execute(
            f"UPDATE messages SET error = ?{back} WHERE {messages}", [error, *message_params]
        )
    else:
        tx.execute(
            "UPDATE jobs SET status = 'failed', finished_at = ?, locked_by = NULL, "
            f"lease_until = NULL, last_error = ?{back} WHERE {jobs}",
            [time.time(), error, *job_params],
        )
        tx.execute(
            f"UPDATE messages SET status = 'failed', error = ?{back} WHERE {messages}",
            [error, *message_params],
        )


def retry_failed(tx: Tx, project_id: str, user_id: str | None) -> int:
    """Queue the terminally failed jobs of the project (or of one user) again, from their
    first attempt and without a batch cap: how many."""
    sql_user = " AND user_id = ?" if user_id is not None else ""
    params: list[Any] = [time.time(), project_id] + ([user_id] if user_id is not None else [])
    ids = [
        r[0]
        for r in tx.all(
            "UPDATE jobs SET status = 'queued', attempts = 0, run_after = ?, "
            "finished_at = NULL, batch_cap = NULL "
            f"WHERE status = 'failed' AND project_id = ?{sql_user} RETURNING id",
            params,
        )
    ]
    if ids:
        where, args = tx.dialect.in_("job_id", ids)
        tx.execute(f"UPDATE messages SET status = 'pending' WHERE {where}", args)
    return len(ids)


# -- outages -------------------------------------------------------------------------------


def outages(tx: Tx, *, lock: bool = False) -> list[OutageRow]:
    """The outages going on; ``lock``: their rows locked (a claim: two claimers never
    both take a due probe)."""
    sql = f"SELECT {OUTAGE_COLUMNS} FROM outages" + (tx.dialect.for_update if lock else "")
    return [OutageRow(*r) for r in tx.all(sql)]


def record_outage(
    tx: Tx, service: str, error: str, delay: Callable[[int], float], *, probe: bool
) -> list[OutageRow]:
    """The outage of ``service`` after a batch failed because of it (``outage_after``),
    stored; every outage going on."""
    tx.lock("stratamem.outages")  # serialises recorders: the row may not exist to be locked
    known = {o.service: o for o in outages(tx)}
    row = outage_after(known.get(service), service, error, delay, time.time(), probe=probe)
    tx.execute(
        f"INSERT INTO outages ({OUTAGE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (service) DO UPDATE SET since = excluded.since, "
        "failures = excluded.failures, last_error = excluded.last_error, "
        "last_failure = excluded.last_failure, retry_every = excluded.retry_every, "
        "next_probe = excluded.next_probe",
        astuple(row),
    )
    known[service] = row
    return list(known.values())


def end_outage(tx: Tx) -> list[OutageRow]:
    """Every outage ended (removed): the ones there were."""
    return [OutageRow(*r) for r in tx.all(f"DELETE FROM outages RETURNING {OUTAGE_COLUMNS}")]


# -- state ---------------------------------------------------------------------------------


def job_states(tx: Tx, job_ids: Sequence[int]) -> dict[int, str]:
    """The status of each of ``job_ids`` that exists."""
    if not job_ids:
        return {}
    where, params = tx.dialect.in_("id", list(job_ids))
    return {int(i): s for i, s in tx.all(f"SELECT id, status FROM jobs WHERE {where}", params)}


def unfinished_jobs(tx: Tx, project_id: str | None) -> int:
    """How many jobs (of the project, or of every one) are queued or running."""
    sql = "SELECT count(*) FROM jobs WHERE status IN ('queued', 'running')"
    params: tuple[Any, ...] = ()
    if project_id is not None:
        sql += " AND project_id = ?"
        params = (project_id,)
    return int(tx.scalar(sql, params) or 0)


def queue_state(tx: Tx) -> list[QueueRow]:
    """Unfinished jobs per project and status, with the oldest one's queueing time."""
    rows = tx.all(
        "SELECT project_id, status, count(*), min(created_at) FROM jobs "
        "WHERE status IN ('queued', 'running') GROUP BY project_id, status "
        "ORDER BY project_id, status"
    )
    return [QueueRow(str(p), str(s), int(n), float(t)) for p, s, n, t in rows]


def next_job_time(tx: Tx) -> float | None:
    return _next_job_time(tx.one(NEXT_JOB_SQL))


def llm_usage(tx: Tx, project_id: str | None) -> dict[str, Any]:
    """Calls, tokens and failures per ``"stage model"`` (of the project, or of all)."""
    where, params = ("WHERE project_id = ?", (project_id,)) if project_id else ("", ())
    rows = tx.all(
        "SELECT stage, model, count(*), sum(prompt_tokens), sum(completion_tokens), "
        f"count(*) FILTER (WHERE NOT ok) FROM llm_calls {where} "
        "GROUP BY stage, model ORDER BY stage, model",
        params,
    )
    return {
        f"{stage} {model}": {
            "calls": int(n),
            "prompt_tokens": int(p or 0),
            "completion_tokens": int(k or 0),
            "failed": int(f or 0),
        }
        for stage, model, n, p, k, f in rows
    }


def usage_by_day(tx: Tx, project_id: str, since: float) -> tuple[list[UsageDayRow], dict[str, int]]:
    """The project's model calls since ``since`` (epoch) per UTC day and model, and its
    messages processed per UTC day since then."""
    # Days counted from the epoch in SQL both databases accept (an integer division; the
    # cast rounds on PostgreSQL and truncates on SQLite, which only matters within half a
    # second of midnight), named as dates here.
    rows = tx.all(
        "SELECT CAST(created_at AS BIGINT) / 86400 AS day, model, count(*), "
        "count(*) FILTER (WHERE NOT ok), sum(prompt_tokens), sum(completion_tokens) "
        "FROM llm_calls WHERE project_id = ? AND created_at >= ? "
        "GROUP BY day, model ORDER BY day, model",
        (project_id, since),
    )
    usage = [
        UsageDayRow(_day(int(d) * 86400), str(m), int(n), int(f), int(p or 0), int(c or 0))
        for d, m, n, f, p, c in rows
    ]
    processed = tx.all(
        "SELECT substr(processed_at, 1, 10) AS day, count(*) FROM messages "
        "WHERE project_id = ? AND status = 'processed' AND processed_at >= ? "
        "GROUP BY day ORDER BY day",
        (project_id, _day(since)),
    )
    return usage, {str(d): int(n) for d, n in processed}


def _day(epoch: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(epoch))


def store_counts(tx: Tx, project_id: str | None) -> dict[str, Any]:
    """What ``stats()`` counts of the project (or of all): users, sessions, messages and
    jobs by status, facts, summaries by status, active topics, vectors by embedder."""
    where, params = ("WHERE project_id = ?", (project_id,)) if project_id else ("", ())

    def grouped(sql: str) -> dict[str, int]:
        return {str(k): int(v) for k, v in tx.all(sql, params)}

    def one(sql: str) -> int:
        return int(tx.scalar(sql, params) or 0)

    messages = grouped(f"SELECT status, count(*) FROM messages {where} GROUP BY status")
    jobs = grouped(f"SELECT status, count(*) FROM jobs {where} GROUP BY status")
    topic_where = f"{where} {'AND' if where else 'WHERE'} status = 'active'"
    return {
        "users": one(f"SELECT count(DISTINCT user_id) FROM sessions {where}"),
        "sessions": one(f"SELECT count(*) FROM sessions {where}"),
        "messages": {k: messages.get(k, 0) for k in ("pending", "processed", "failed")},
        "jobs": {k: jobs.get(k, 0) for k in ("queued", "running", "done", "failed")},
        "facts": one(f"SELECT count(*) FROM facts {where}"),
        "summaries": grouped(f"SELECT status, count(*) FROM summaries {where} GROUP BY status"),
        "topics": one(f"SELECT count(*) FROM topics {topic_where}"),
        "vectors": grouped(f"SELECT embedder, count(*) FROM vectors {where} GROUP BY embedder"),
    }
