"""What both stores' job claims share: which jobs one batch takes, the outage gate in
front of every claim, and how an outage reads in ``stats()``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any

from .._time import to_iso
from . import OutageRow

__all__ = [
    "JOB_ROW",
    "NEXT_JOB_SQL",
    "OUTAGE_COLUMNS",
    "admit",
    "claimable",
    "next_job_time",
    "outage_after",
    "processing_state",
    "take_jobs",
]

#: The columns ``take_jobs`` reads, in its order.
JOB_ROW = "id, status, run_after, lease_until, size, batch_cap"
OUTAGE_COLUMNS = "service, since, failures, last_error, last_failure, retry_every, next_probe"
#: What ``next_job_time`` reads: when the earliest unfinished job is due, and the next probe.
NEXT_JOB_SQL = (
    "SELECT min(CASE status WHEN 'queued' THEN run_after ELSE lease_until END), "
    "(SELECT max(next_probe) FROM outages) "
    "FROM jobs WHERE status IN ('queued', 'running')"
)


def take_jobs(
    rows: Sequence[Sequence[Any]], max_messages: int, ready: Callable[[Sequence[Any]], bool]
) -> list[int]:
    """The ids a batch takes from a user's unfinished jobs (``JOB_ROW`` rows, id order):
    the leading ``ready`` ones, up to ``max_messages`` messages (the first one whatever its
    size) and no more jobs than the smallest ``batch_cap`` among those taken, so retries of
    a failed batch narrow down to the job that fails (jobs/_worker.py)."""
    taken: list[int] = []
    total = 0
    caps: list[int] = []
    for row in rows:
        job_id, size, cap = row[0], row[4], row[5]
        if not ready(row) or (taken and total + size > max_messages):
            break
        if cap is not None:
            caps.append(cap)
        if taken and caps and len(taken) >= min(caps):
            break
        taken.append(job_id)
        total += size
    return taken


def claimable(now: float) -> Callable[[Sequence[Any]], bool]:
    """``take_jobs``' test for a claim under a lease: a job queued and due, or running
    under a lease that ran out (its holder died)."""
    return lambda r: (r[1] == "queued" and r[2] <= now) or (r[1] == "running" and (r[3] or 0) < now)


def next_job_time(row: Sequence[Any] | None) -> float | None:
    """When a claim may next succeed (``NEXT_JOB_SQL``'s row): during an outage, not before
    its next probe."""
    if row is None or row[0] is None:
        return None
    return max(float(row[0]), float(row[1] or 0))


def admit(outages: Sequence[OutageRow], now: float) -> tuple[bool, float | None]:
    """Whether a claim may go on during these outages, and if so until when it holds the
    probe (None: no outage, nothing to hold). A probe holds the gate one ``retry_every``
    (the current backoff): a probe that hangs longer lets the next one through then."""
    if not outages:
        return True, None
    if max(o.next_probe for o in outages) > now:
        return False, None
    return True, now + max(o.retry_every for o in outages)


def outage_after(
    row: OutageRow | None,
    service: str,
    error: str,
    delay: Callable[[int], float],
    now: float,
    *,
    probe: bool,
) -> OutageRow:
    """The outage of ``service`` once a batch failed because of it (``record_outage``)."""
    error = error[:2000]
    if row is None:
        wait = delay(1)
        return OutageRow(service, now, 1, error, now, wait, now + wait)
    if not probe:  # a batch that was under way when the outage began
        return OutageRow(
            service, row.since, row.failures, error, now, row.retry_every, row.next_probe
        )
    wait = delay(row.failures + 1)
    return OutageRow(service, row.since, row.failures + 1, error, now, wait, now + wait)


def processing_state(outages: Sequence[OutageRow]) -> dict[str, Any]:
    """``stats()["processing"]``: paused or not, since when, until which probe, and why."""
    if not outages:
        return {"paused": False}
    return {
        "paused": True,
        "since": _iso(min(o.since for o in outages)),
        "next_probe": _iso(max(o.next_probe for o in outages)),
        "outages": [
            {
                "service": o.service,
                "since": _iso(o.since),
                "failures": o.failures,
                "last_error": o.last_error,
                "last_failure": _iso(o.last_failure),
            }
            for o in sorted(outages, key=lambda o: o.since)
        ],
    }


def _iso(seconds: float) -> str:
    return str(to_iso(datetime.fromtimestamp(seconds, timezone.utc)))
