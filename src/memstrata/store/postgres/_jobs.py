"""The durable job queue of the PostgreSQL store: claim, lease, complete, fail, retry.

A mixin of ``PostgresStore``, kept in one module so that a job library (procrastinate)
can later replace or wrap exactly this part. Semantics are SQLite's (store/sqlite.py):

* A job is claimable when it is queued and due, or running with an expired lease, and no
  earlier job of the same (project, user) is unfinished: each user's messages are
  processed in acceptance order, one batch at a time.
* A claim takes that head job and the user's following claimable jobs up to
  ``max_messages`` (and the smallest ``batch_cap`` among them), in one transaction, under
  a lease.
* During an outage (``outages``) nothing is claimed before its next probe; the first
  claim after it is the probe and holds the gate for one more backoff.
* Completing or failing a batch first checks, with the job rows locked, that the worker
  still holds every job; a worker whose lease ran out and was reclaimed gets
  ``LeaseLostError`` and its work is discarded.

How PostgreSQL keeps that with many workers on many machines:

* Claimers lock the head job ``FOR UPDATE SKIP LOCKED``: two workers never take the same
  head, and neither waits for the other. A later job of that user is not claimable while
  the head is unfinished, so the other worker moves on to another user.
* Each claim also takes the user's transaction-scoped advisory lock, without waiting
  (``pg_try_advisory_xact_lock``). ``add_messages``, ``complete_batch``, ``forget`` and
  ``erase_user`` hold the same lock while they write the user's rows, so a claim never
  interleaves with a half-written batch of that user and job ids of one user are
  committed in id order (``add_messages`` allocates them under the lock).
* Claimers lock the outage rows (``FOR UPDATE``) before they look at the gate, so a due
  probe is taken by one of them only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import astuple
from typing import TYPE_CHECKING, Any

from ..._time import now_iso
from .. import CallWrite, ClaimedBatch, LayerWrite, LeaseLostError, OutageRow
from .._batches import (
    JOB_ROW,
    NEXT_JOB_SQL,
    OUTAGE_COLUMNS,
    admit,
    claimable,
    next_job_time,
    outage_after,
    take_jobs,
)
from ._connection import MESSAGE_COLUMNS, PgBase, message_row, user_lock_sql

if TYPE_CHECKING:
    import numpy as np
    import psycopg

__all__ = ["PostgresJobs"]

# Claimable: queued and due, or running under an expired lease.
_READY = (
    "((j.status = 'queued' AND j.run_after <= %(now)s) "
    "OR (j.status = 'running' AND j.lease_until < %(now)s))"
)


class PostgresJobs(PgBase):
    """Mixin: the job half of the ``Store`` port for PostgreSQL."""

    if TYPE_CHECKING:  # provided by PostgresStore and PostgresWebhooks

        def _prepare_vectors(self, dims: dict[str, int]) -> None: ...
        def _put_vectors(
            self, c: Any, embedder: str, rows: Sequence[Any], vectors: np.ndarray
        ) -> None: ...
        def _write_layers(
            self, c: Any, batch: ClaimedBatch, embedder: str, layers: LayerWrite
        ) -> None: ...
        def _record_calls(
            self, c: Any, batch: ClaimedBatch, calls: Sequence[CallWrite]
        ) -> None: ...
        def _enqueue_webhooks(self, c: Any, items: Sequence[Any]) -> None: ...
        @staticmethod
        def _layer_dims(vectors: np.ndarray, layers: LayerWrite | None) -> dict[str, int]: ...

    # -- claiming ------------------------------------------------------------------------

    def claim_batch(
        self,
        worker_id: str,
        lease_seconds: float,
        max_messages: int,
        for_jobs: Sequence[int] = (),
    ) -> ClaimedBatch | None:
        now = time.time()
        skipped: list[str] = []
        # for_jobs: a caller waiting for these jobs runs a batch of their users only.
        scope = (
            "AND (j.project_id, j.user_id) IN (SELECT project_id, user_id FROM jobs "
            "    WHERE id = ANY(%(for_jobs)s::bigint[])) "
            if for_jobs
            else ""
        )
        # A head whose user is being written to right now is left for the next poll; a few
        # tries find another user's head in the meantime.
        for _ in range(4):
            with self._write() as c:
                admitted, hold = admit(self._outages(c, lock=True), now)
                if not admitted:
                    return None
                head = c.execute(
                    "SELECT j.id, j.project_id, j.user_id FROM jobs j "
                    f"WHERE j.status IN ('queued', 'running') AND {_READY} "
                    "AND NOT (j.project_id || chr(31) || j.user_id = ANY(%(skipped)s::text[])) "
                    "AND NOT EXISTS (SELECT 1 FROM jobs e WHERE e.project_id = j.project_id "
                    "    AND e.user_id = j.user_id AND e.status IN ('queued', 'running') "
                    f"    AND e.id < j.id) {scope}"
                    "ORDER BY j.id LIMIT 1 FOR UPDATE OF j SKIP LOCKED",
                    {"now": now, "skipped": skipped, "for_jobs": list(for_jobs)},
                ).fetchone()
                if head is None:
                    return None
                _, project_id, user_id = head
                locked = c.execute(
                    f"SELECT pg_try_advisory_xact_lock({user_lock_sql})", (project_id, user_id)
                ).fetchone()
                if not locked or not locked[0]:
                    skipped.append(f"{project_id}\x1f{user_id}")
                    continue
                job_ids = take_jobs(
                    c.execute(
                        f"SELECT {JOB_ROW} FROM jobs WHERE project_id = %s AND user_id = %s "
                        "AND status IN ('queued', 'running') AND id >= %s "
                        "ORDER BY id LIMIT 256 FOR UPDATE",
                        (project_id, user_id, head[0]),
                    ).fetchall(),
                    max_messages,
                    claimable(now),
                )
                return self._take(
                    c, worker_id, now + lease_seconds, (project_id, user_id), job_ids, hold
                )
        return None

    def _take(
        self,
        c: psycopg.Connection[Any],
        worker_id: str,
        lease_until: float | None,
        user: tuple[str, str],
        job_ids: list[int],
        hold: float | None,
    ) -> ClaimedBatch:
        """Hold ``job_ids`` of ``user`` for ``worker_id`` (this attempt counts), and the
        outages' probe until ``hold`` when this claim is the probe."""
        if hold is not None:
            c.execute("UPDATE outages SET next_probe = %s", (hold,))
        attempts = c.execute(
            "UPDATE jobs SET status = 'running', locked_by = %s, lease_until = %s, "
            "attempts = attempts + 1 WHERE id = ANY(%s::bigint[]) RETURNING id, attempts",
            (worker_id, lease_until, job_ids),
        ).fetchall()
        c.execute(
            "UPDATE messages SET attempts = attempts + 1 WHERE job_id = ANY(%s::bigint[])",
            (job_ids,),
        )
        messages = [
            message_row(r)
            for r in c.execute(
                f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE job_id = ANY(%s::bigint[]) "
                "ORDER BY pk",
                (job_ids,),
            )
        ]
        return ClaimedBatch(
            worker_id=worker_id,
            project_id=user[0],
            user_id=user[1],
            job_ids=job_ids,
            messages=messages,
            job_attempts={int(j): int(a) for j, a in attempts},
            probe=hold is not None,
        )

    def outages(self) -> list[OutageRow]:
        with self._read() as c:
            return self._outages(c)

    @staticmethod
    def _outages(c: psycopg.Connection[Any], *, lock: bool = False) -> list[OutageRow]:
        # Locked by a claim: two claimers never both take a due probe.
        sql = f"SELECT {OUTAGE_COLUMNS} FROM outages" + (" FOR UPDATE" if lock else "")
        return [OutageRow(*r) for r in c.execute(sql)]

    def _check_lease(self, c: psycopg.Connection[Any], batch: ClaimedBatch) -> None:
        # FOR UPDATE: a reclaim racing this commit waits for it, or this check sees it.
        held = c.execute(
            "SELECT id FROM jobs WHERE id = ANY(%s::bigint[]) AND status = 'running' "
            "AND locked_by = %s FOR UPDATE",
            (batch.job_ids, batch.worker_id),
        ).fetchall()
        if len(held) != len(batch.job_ids):
            raise LeaseLostError(f"worker {batch.worker_id} no longer holds jobs {batch.job_ids}")

    def extend_lease(self, job_ids: Sequence[int], worker_id: str, lease_seconds: float) -> bool:
        if not job_ids:
            return True
        with self._write() as c:
            cur = c.execute(
                "UPDATE jobs SET lease_until = %s WHERE id = ANY(%s::bigint[]) "
                "AND status = 'running' AND locked_by = %s",
                (time.time() + lease_seconds, list(job_ids), worker_id),
            )
            return cur.rowcount == len(job_ids)

    # -- finishing -----------------------------------------------------------------------

    def complete_batch(
        self,
        batch: ClaimedBatch,
        *,
        embedder: str,
        vectors: np.ndarray,
        layers: LayerWrite | None = None,
    ) -> None:
        now = time.time()
        self._prepare_vectors(self._layer_dims(vectors, layers))
        with self._write() as c:
            self._lock_user(c, batch.project_id, batch.user_id)
            self._check_lease(c, batch)
            self._put_vectors(c, embedder, batch.messages, vectors)
            if layers is not None:
                self._write_layers(c, batch, embedder, layers)
                self._record_calls(c, batch, layers.calls)
                self._enqueue_webhooks(c, layers.outbox)
            c.execute(
                "UPDATE messages SET status = 'processed', error = NULL, processed_at = %s "
                "WHERE job_id = ANY(%s::bigint[])",
                (now_iso(), batch.job_ids),
            )
            c.execute(
                "UPDATE jobs SET status = 'done', finished_at = %s, locked_by = NULL, "
                "lease_until = NULL, last_error = NULL WHERE id = ANY(%s::bigint[])",
                (now, batch.job_ids),
            )

    def fail_batch(
        self,
        batch: ClaimedBatch,
        error: str,
        retry_at: float | None,
        calls: Sequence[CallWrite] = (),
        *,
        counted: bool = True,
        retry_cap: int | None = None,
    ) -> None:
        error = error[:2000]
        back = "" if counted else ", attempts = greatest(attempts - 1, 0)"
        with self._write() as c:
            self._check_lease(c, batch)
            # Tokens spent on a failed attempt were still spent: account for them.
            self._record_calls(c, batch, calls)
            if retry_at is not None:
                c.execute(
                    "UPDATE jobs SET status = 'queued', run_after = %s, locked_by = NULL, "
                    "lease_until = NULL, last_error = %s, batch_cap = coalesce(%s, batch_cap)"
                    f"{back} WHERE id = ANY(%s::bigint[])",
                    (retry_at, error, retry_cap, batch.job_ids),
                )
                c.execute(
                    f"UPDATE messages SET error = %s{back} WHERE job_id = ANY(%s::bigint[])",
                    (error, batch.job_ids),
                )
            else:
                c.execute(
                    "UPDATE jobs SET status = 'failed', finished_at = %s, locked_by = NULL, "
                    f"lease_until = NULL, last_error = %s{back} WHERE id = ANY(%s::bigint[])",
                    (time.time(), error, batch.job_ids),
                )
                c.execute(
                    f"UPDATE messages SET status = 'failed', error = %s{back} "
                    "WHERE job_id = ANY(%s::bigint[])",
                    (error, batch.job_ids),
                )

    def record_outage(
        self, service: str, error: str, delay: Callable[[int], float], *, probe: bool
    ) -> list[OutageRow]:
        with self._write() as c:
            # Serialises recorders (the rows may not exist yet to be locked).
            c.execute("SELECT pg_advisory_xact_lock(hashtext('memstrata.outages'))")
            known = {o.service: o for o in self._outages(c)}
            row = outage_after(known.get(service), service, error, delay, time.time(), probe=probe)
            c.execute(
                f"INSERT INTO outages ({OUTAGE_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s) "
                "ON CONFLICT (service) DO UPDATE SET since = excluded.since, "
                "failures = excluded.failures, last_error = excluded.last_error, "
                "last_failure = excluded.last_failure, retry_every = excluded.retry_every, "
                "next_probe = excluded.next_probe",
                astuple(row),
            )
            known[service] = row
        return list(known.values())

    def end_outage(self) -> list[OutageRow]:
        with self._write() as c:
            deleted = c.execute(f"DELETE FROM outages RETURNING {OUTAGE_COLUMNS}")
            return [OutageRow(*r) for r in deleted]

    def retry_failed(self, project_id: str, user_id: str | None = None) -> int:
        """Queue terminally failed jobs again (after the cause was fixed)."""
        sql_user = " AND user_id = %s" if user_id is not None else ""
        params: list[Any] = [project_id] + ([user_id] if user_id is not None else [])
        with self._write() as c:
            ids = [
                r[0]
                for r in c.execute(
                    "UPDATE jobs SET status = 'queued', attempts = 0, run_after = %s, "
                    "finished_at = NULL, batch_cap = NULL "
                    f"WHERE status = 'failed' AND project_id = %s{sql_user} "
                    "RETURNING id",
                    [time.time(), *params],
                )
            ]
            if ids:
                c.execute(
                    "UPDATE messages SET status = 'pending' WHERE job_id = ANY(%s::bigint[])",
                    (ids,),
                )
        return len(ids)

    # -- state -------------------------------------------------------------------------

    def job_states(self, job_ids: Sequence[int]) -> dict[int, str]:
        if not job_ids:
            return {}
        with self._read() as c:
            rows = c.execute(
                "SELECT id, status FROM jobs WHERE id = ANY(%s::bigint[])", (list(job_ids),)
            ).fetchall()
        return {int(i): s for i, s in rows}

    def unfinished_jobs(self, project_id: str | None = None) -> int:
        sql = "SELECT count(*) FROM jobs WHERE status IN ('queued', 'running')"
        params: tuple[Any, ...] = ()
        if project_id is not None:
            sql += " AND project_id = %s"
            params = (project_id,)
        with self._read() as c:
            row = c.execute(sql, params).fetchone()
        return int(row[0]) if row else 0

    def next_job_time(self) -> float | None:
        with self._read() as c:
            return next_job_time(c.execute(NEXT_JOB_SQL).fetchone())
