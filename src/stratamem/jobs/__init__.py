"""Durable background work: the ``JobQueue`` port and its two adapters.

Jobs live in the store (written in the same transaction as the messages they process),
so a crash loses nothing: a job is ``queued`` until a worker claims it, ``done`` once its
results are committed, retried with backoff when processing fails (``failed`` after
``max_attempts`` attempts of its own), and taken over by another worker when its holder
died. An outage of a service the pipeline needs fails nothing: the store claims no batch
until the outage's next probe (``run_batch``).

* ``WorkerPool`` (SQLite, embedded): worker threads poll the store and hold jobs under
  leases that a heartbeat extends; a lease that runs out marks a dead holder.
* ``ProcrastinateQueue`` (PostgreSQL): procrastinate dispatches one wake-up per user to
  workers on any number of machines; its locks keep one worker per user and its worker
  heartbeats mark dead ones (see ``_procrastinate.py``).
"""

from __future__ import annotations

from ._queue import JobQueue, open_queue
from ._worker import (
    FINISHED,
    BatchHandler,
    WorkerPool,
    backoff_delay,
    job_states,
    paused_because,
    run_batch,
)

__all__ = [
    "FINISHED",
    "BatchHandler",
    "JobQueue",
    "WorkerPool",
    "backoff_delay",
    "job_states",
    "open_queue",
    "paused_because",
    "run_batch",
]
