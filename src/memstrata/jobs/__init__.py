"""Durable background work: the ``JobQueue`` port and the embedded worker pool.

Jobs live in the store (written in the same transaction as the messages they process),
so a crash loses nothing: a job is ``queued`` until a worker claims it under a lease,
``done`` once its results are committed, retried with backoff when processing fails, and
reclaimed by another worker when its lease runs out (the holder died).
"""

from __future__ import annotations

from ._worker import BatchHandler, WorkerPool, backoff_delay

__all__ = ["BatchHandler", "WorkerPool", "backoff_delay"]
