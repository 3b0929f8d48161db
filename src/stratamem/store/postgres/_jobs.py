"""The PostgreSQL store's job claims and its side of the procrastinate job queue.

What both stores share (leases, finishing and failing a batch, outages, retries, job
states) is the core's (``_core/jobs.py``); the claims are PostgreSQL's own. Semantics are
SQLite's (``store/sqlite/_jobs.py``):

* A job is claimable when it is queued and due, or running with an expired lease, and no
  earlier job of the same (project, user) is unfinished: each user's messages are
  processed in acceptance order, one batch at a time.
* A claim takes that head job and the user's following claimable jobs up to
  ``max_messages`` (and the smallest ``batch_cap`` among them), in one transaction, under
  a lease.
* During an outage (``outages``) nothing is claimed before its next probe; the first
  claim after it is the probe and holds the gate for one more backoff.

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

Dispatch (``jobs/_procrastinate.py``): stratamem's ``jobs`` table stays the record of
work, as on SQLite; procrastinate's tables hold *wake-ups*: one procrastinate job per user
with work to do (task ``stratamem.process_user``), whose ``lock`` and ``queueing_lock`` are
both the user's key, so at most one runs per user at a time and at most one waits per user
(later work merges into the waiting one). This class installs procrastinate's schema next
to stratamem's, the SQL that keeps the two in step, and the claim a wake-up's run makes.

* ``stratamem_wake(projects, users, delay)`` makes sure each user with unfinished jobs has
  a waiting wake-up, due when the user's oldest unfinished job may run (a job in backoff
  holds back every later one: per-user order), and not before the next probe of an outage
  (``outages``: claims wait for it). One ``INSERT .. ON CONFLICT`` on
  procrastinate's partial unique index of waiting jobs: a user who already has one keeps
  it, brought forward if this one is due earlier. (procrastinate's
  ``procrastinate_defer_jobs_v1`` is that same INSERT without the merge; calling it would
  need a subtransaction per user to survive the unique violation.)
* Statement triggers on ``jobs`` call it for every statement that queues jobs
  (``add_messages``, a retry after backoff, ``retry_failed``), in that statement's
  transaction: a queued job without a wake-up can never be committed.
* ``claim_user_batch`` is ``claim_batch`` for one user, made by the user's running
  wake-up. Because procrastinate lets one wake-up per user be ``doing``, a job still
  ``running`` under another token belongs to a run that died (or was declared dead): it is
  taken over, and the old run's commit then fails the token check of ``complete_batch`` /
  ``fail_batch`` (``LeaseLostError``), so every batch is applied once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from .. import ClaimedBatch
from .._batches import JOB_ROW, admit, claimable, take_jobs
from .._core import jobs as core_jobs
from .._core.dialect import Tx
from ._connection import PgBase
from ._dialect import user_lock_sql

__all__ = ["DISPATCH_QUEUE", "DISPATCH_TASK", "PostgresJobs"]

log = logging.getLogger("stratamem.store")

# Claimable: queued and due, or running under an expired lease.
_READY = (
    "((j.status = 'queued' AND j.run_after <= %(now)s) "
    "OR (j.status = 'running' AND j.lease_until < %(now)s))"
)

DISPATCH_TASK = "stratamem.process_user"
DISPATCH_QUEUE = "stratamem"
# Version of the SQL below; stored in ``meta`` so that it is replaced when it changes.
_GLUE_VERSION = "2"

_GLUE = f"""
CREATE OR REPLACE FUNCTION stratamem_user_key(p_project text, p_user text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT 'stratamem:' || length(p_project) || ':' || p_project || ':' || p_user $$;

CREATE OR REPLACE FUNCTION stratamem_wake(
    p_projects text[], p_users text[], p_delay double precision DEFAULT 0
) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    now_epoch double precision := extract(epoch FROM clock_timestamp());
    woken integer;
BEGIN
    WITH scope AS (
        SELECT DISTINCT s.project_id, s.user_id
          FROM unnest(p_projects, p_users) AS s(project_id, user_id)
    ), due AS (
        -- The oldest unfinished job decides: queued -> when it may run; running -> now
        -- (its run is waited for by the lock, or taken over if dead), or when a store
        -- lease on it ends.
        SELECT scope.project_id, scope.user_id,
               greatest(CASE WHEN head.status = 'queued' THEN head.run_after
                             ELSE coalesce(head.lease_until, 0) END,
                        now_epoch + p_delay,
                        -- During an outage nothing is claimed before its next probe.
                        (SELECT max(o.next_probe) FROM outages o)) AS at
          FROM scope
          CROSS JOIN LATERAL (
              SELECT j.status, j.run_after, j.lease_until FROM jobs j
               WHERE j.project_id = scope.project_id AND j.user_id = scope.user_id
                 AND j.status IN ('queued', 'running')
               ORDER BY j.id LIMIT 1
          ) AS head
    )
    INSERT INTO procrastinate_jobs AS p
           (queue_name, task_name, priority, lock, queueing_lock, args, scheduled_at)
    SELECT '{DISPATCH_QUEUE}', '{DISPATCH_TASK}', 0, k.key, k.key,
           jsonb_build_object('project_id', due.project_id, 'user_id', due.user_id),
           CASE WHEN due.at > now_epoch THEN to_timestamp(due.at) END
      FROM due CROSS JOIN LATERAL stratamem_user_key(due.project_id, due.user_id) AS k(key)
     ORDER BY k.key
        ON CONFLICT (queueing_lock) WHERE status = 'todo'
        DO UPDATE SET scheduled_at = excluded.scheduled_at
        WHERE p.scheduled_at IS NOT NULL
          AND (excluded.scheduled_at IS NULL OR excluded.scheduled_at < p.scheduled_at);
    GET DIAGNOSTICS woken = ROW_COUNT;
    RETURN woken;
END $$;

CREATE OR REPLACE FUNCTION stratamem_jobs_queued() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM stratamem_wake(array_agg(project_id), array_agg(user_id))
       FROM queued_jobs WHERE status = 'queued' HAVING count(*) > 0;
    RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS stratamem_jobs_inserted ON jobs;
CREATE TRIGGER stratamem_jobs_inserted AFTER INSERT ON jobs
    REFERENCING NEW TABLE AS queued_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION stratamem_jobs_queued();
DROP TRIGGER IF EXISTS stratamem_jobs_updated ON jobs;
CREATE TRIGGER stratamem_jobs_updated AFTER UPDATE ON jobs
    REFERENCING NEW TABLE AS queued_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION stratamem_jobs_queued();
"""


class PostgresJobs(PgBase):
    """Part of ``PostgresStore``: job claims, and what ``ProcrastinateQueue`` needs."""

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
                tx = Tx(c, self.dialect)
                admitted, hold = admit(core_jobs.outages(tx, lock=True), now)
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
                user = (project_id, user_id)
                return core_jobs.take(tx, worker_id, now + lease_seconds, user, job_ids, hold)
        return None

    def claim_user_batch(
        self, project_id: str, user_id: str, worker_id: str, max_messages: int
    ) -> ClaimedBatch | None:
        """The user's ready jobs from the oldest unfinished one on (queued and due, or
        running under a dead run), up to ``max_messages``, now held by ``worker_id``.

        Only the user's running wake-up may call this: it holds procrastinate's lock of
        the user, which is what makes a ``running`` job of another token a dead run's.
        """
        now = time.time()
        with self._write() as c:
            tx = Tx(c, self.dialect)
            # Waits for a write of this user in flight (add_messages holds the lock until it
            # commits), so a job committed while this wake-up was being fetched is seen.
            tx.lock_user(project_id, user_id)
            admitted, hold = admit(core_jobs.outages(tx, lock=True), now)
            if not admitted:
                return None

            def ready(row: Sequence[Any]) -> bool:
                if row[1] == "queued":
                    return bool(row[2] <= now)
                # Held without a lease: by a wake-up's run, dead since this one holds the
                # user's lock. Under a live store lease (claim_batch): not ours.
                return row[3] is None or row[3] < now

            job_ids = take_jobs(
                c.execute(
                    f"SELECT {JOB_ROW} FROM jobs WHERE project_id = %s AND user_id = %s "
                    "AND status IN ('queued', 'running') ORDER BY id LIMIT 256 FOR UPDATE",
                    (project_id, user_id),
                ).fetchall(),
                max_messages,
                ready,
            )
            if not job_ids:
                return None
            return core_jobs.take(tx, worker_id, None, (project_id, user_id), job_ids, hold)

    # -- dispatch ------------------------------------------------------------------------

    def install_dispatch(self, schema: str, migrations: Sequence[tuple[str, str]]) -> None:
        """Install procrastinate's ``schema`` (or the ``migrations`` newer than the one
        recorded) in this store's schema, then the glue above; a no-op when current.

        ``migrations`` are procrastinate's (file name, SQL) pairs in name order, the last
        one being what ``schema`` amounts to. Runs under the store's migration lock, so
        processes starting together install it once.
        """
        latest = migrations[-1][0] if migrations else ""
        with self._read() as c:
            if self._dispatch_meta(c) == (latest, _GLUE_VERSION):
                return
        with self._write() as c:
            c.execute("SELECT pg_advisory_xact_lock(hashtext('stratamem.migrate'))")
            recorded, glue = self._dispatch_meta(c)
            present = c.execute(
                "SELECT to_regclass(format('%I.procrastinate_jobs', current_schema())) IS NOT NULL"
            ).fetchone()
            if not (present and present[0]):
                c.execute(schema)
                recorded = latest
            elif recorded is None:
                # Installed by hand (`procrastinate schema --apply`): taken to be current.
                log.warning("procrastinate's tables were already there; assuming %s", latest)
                recorded = latest
            elif recorded > latest:
                log.warning(
                    "the database has procrastinate schema %s, newer than the installed "
                    "procrastinate's %s: upgrade procrastinate on this machine",
                    recorded,
                    latest,
                )
            else:
                for name, sql in migrations:
                    if name > recorded:
                        log.info("applying procrastinate migration %s", name)
                        c.execute(sql)
                recorded = latest
            if glue != _GLUE_VERSION:
                c.execute(_GLUE)
            c.execute(
                "INSERT INTO meta (key, value) VALUES ('procrastinate_schema', %s), "
                "('dispatch_version', %s) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (recorded, _GLUE_VERSION),
            )

    @staticmethod
    def _dispatch_meta(c: Any) -> tuple[str | None, str | None]:
        values = dict(
            c.execute(
                "SELECT key, value FROM meta "
                "WHERE key IN ('procrastinate_schema', 'dispatch_version')"
            ).fetchall()
        )
        return values.get("procrastinate_schema"), values.get("dispatch_version")

    def wake_users(self, users: Sequence[tuple[str, str]], delay: float = 0.0) -> int:
        """Make sure each of ``users`` with unfinished jobs has a waiting wake-up, due no
        sooner than ``delay`` seconds from now; how many were queued or brought forward."""
        if not users:
            return 0
        with self._write() as c:
            row = c.execute(
                "SELECT stratamem_wake(%s::text[], %s::text[], %s)",
                ([p for p, _ in users], [u for _, u in users], delay),
            ).fetchone()
        return int(row[0] or 0) if row else 0

    def wake_orphans(self) -> int:
        """Wake every user with unfinished jobs and neither a waiting nor a running wake-up
        (jobs queued before the queue was installed, a wake-up deleted by hand)."""
        with self._write() as c:
            row = c.execute(
                "SELECT stratamem_wake(array_agg(o.project_id), array_agg(o.user_id)) FROM ("
                "  SELECT DISTINCT j.project_id, j.user_id FROM jobs j "
                "   WHERE j.status IN ('queued', 'running') AND NOT EXISTS ("
                "     SELECT 1 FROM procrastinate_jobs p "
                "      WHERE p.lock = stratamem_user_key(j.project_id, j.user_id) "
                "        AND p.status IN ('todo', 'doing'))) o "
                "HAVING count(*) > 0"
            ).fetchone()
        return int(row[0] or 0) if row else 0

    def wake_all(self) -> int:
        """Bring every user's wake-up forward to when its work may run: an outage ended,
        and wake-ups scheduled for its next probe need not wait for it."""
        with self._write() as c:
            row = c.execute(
                "SELECT stratamem_wake(array_agg(u.project_id), array_agg(u.user_id)) FROM ("
                "  SELECT DISTINCT project_id, user_id FROM jobs "
                "   WHERE status IN ('queued', 'running')) u "
                "HAVING count(*) > 0"
            ).fetchone()
        return int(row[0] or 0) if row else 0

    def queue_workers_alive(self, within_seconds: float) -> int:
        """procrastinate workers (any machine) whose heartbeat is at most this old."""
        with self._read() as c:
            row = c.execute(
                "SELECT count(*) FROM procrastinate_workers "
                "WHERE last_heartbeat > now() - make_interval(secs => %s)",
                (within_seconds,),
            ).fetchone()
        return int(row[0]) if row else 0
