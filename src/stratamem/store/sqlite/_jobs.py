"""The SQLite store's job claims: a poll without the write lock, then one ``BEGIN
IMMEDIATE`` transaction that takes a user's head job and its followers.

What both stores share (leases, finishing and failing a batch, outages, retries, job
states) is the core's (``_core/jobs.py``). PostgreSQL claims with ``FOR UPDATE SKIP
LOCKED`` and advisory locks instead, as many workers on many machines claim there
(``postgres/_jobs.py``); here the database lock serialises claims.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

from .. import ClaimedBatch
from .._batches import JOB_ROW, admit, claimable, take_jobs
from .._core import jobs as core_jobs
from ._connection import SQLiteBase

__all__ = ["SQLiteJobs"]

# Claimable: queued and due, or running under an expired lease (parameters: now, now).
_READY = (
    "((j.status = 'queued' AND j.run_after <= ?) OR (j.status = 'running' AND j.lease_until < ?))"
)


class SQLiteJobs(SQLiteBase):
    """Part of SQLiteStore: claiming batches (the rest is the core's: _core/jobs.py)."""

    def claim_batch(
        self,
        worker_id: str,
        lease_seconds: float,
        max_messages: int,
        for_jobs: Sequence[int] = (),
    ) -> ClaimedBatch | None:
        now = time.time()
        # for_jobs: a caller waiting for these jobs runs a batch of their users only (one
        # JSON parameter: close() may wait for more jobs than SQLite takes parameters).
        jobs = [json.dumps(list(for_jobs))] if for_jobs else []
        scope = (
            "AND (j.project_id, j.user_id) IN (SELECT project_id, user_id FROM jobs "
            "     WHERE id IN (SELECT value FROM json_each(?))) "
            if jobs
            else ""
        )
        with self._query() as tx:
            # Idle workers (and waiting callers) poll: look without taking the write lock.
            if (
                tx.one(f"SELECT 1 FROM jobs j WHERE {_READY} {scope}LIMIT 1", (now, now, *jobs))
                is None
                or not admit(core_jobs.outages(tx), now)[0]
            ):
                return None
        with self._transaction() as tx:
            # Re-read under the write lock: only one claim takes a due probe.
            admitted, hold = admit(core_jobs.outages(tx), now)
            if not admitted:
                return None
            # The earliest unfinished job of its user, ready to run: per-user order holds
            # because a later job is never claimable while an earlier one is unfinished.
            head = tx.one(
                "SELECT j.id, j.project_id, j.user_id FROM jobs j "
                f"WHERE j.status IN ('queued', 'running') AND {_READY} "
                "AND NOT EXISTS (SELECT 1 FROM jobs e WHERE e.project_id = j.project_id "
                "     AND e.user_id = j.user_id AND e.status IN ('queued', 'running') "
                f"     AND e.id < j.id) {scope}"
                "ORDER BY j.id LIMIT 1",
                (now, now, *jobs),
            )
            if head is None:
                return None
            first_id, project_id, user_id = head
            job_ids = take_jobs(
                tx.all(
                    f"SELECT {JOB_ROW} FROM jobs "
                    "WHERE project_id = ? AND user_id = ? AND status IN ('queued', 'running') "
                    "AND id >= ? ORDER BY id LIMIT 256",
                    (project_id, user_id, first_id),
                ),
                max_messages,
                claimable(now),
            )
            user = (project_id, user_id)
            return core_jobs.take(tx, worker_id, now + lease_seconds, user, job_ids, hold)
