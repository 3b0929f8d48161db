"""The ``JobQueue`` port: what the facade needs from whatever runs the write pipeline.

Two adapters: ``WorkerPool`` (the store is the queue: worker threads poll it under leases;
SQLite) and ``ProcrastinateQueue`` (procrastinate dispatches per-user wake-ups through
PostgreSQL to workers on any number of machines). Either way jobs are rows of the store,
committed with their messages, so ``job_states`` / ``unfinished_jobs`` / ``retry_failed``
mean the same on both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol, TypedDict, cast

from ..store import JobStore, MetaStore
from ._worker import BatchHandler, WorkerPool

__all__ = ["JobQueue", "QueueStore", "open_queue"]


class QueueStore(JobStore, MetaStore, Protocol):
    """What ``open_queue`` needs of the store: its jobs, and its ``kind`` to choose by."""


class JobQueue(Protocol):
    """Runs the pipeline over queued jobs, in background workers or in a waiting caller."""

    #: ``store`` (WorkerPool) or ``procrastinate``: named in the startup log.
    name: str
    #: Background workers this process runs (0: none; waiting callers do the work).
    threads: int

    @property
    def running(self) -> bool:
        """Background workers of this process are running."""
        ...

    def start(self) -> None: ...

    def stop(self, timeout: float | None = None) -> None:
        """Stop after the batches in hand are finished (or ``timeout`` passes)."""
        ...

    def notify(self) -> None:
        """Work was queued by this process: a hint to pick it up now."""
        ...

    def wait_until(self, done: Callable[[], bool], timeout: float | None, *, what: str) -> None:
        """Block until ``done()``; raises ``ProcessingError`` after ``timeout`` seconds.
        With no worker to wait for, the waiting caller processes queued work itself."""
        ...

    def wait_jobs(self, job_ids: Iterable[int], timeout: float | None) -> dict[int, str]:
        """Wait until every job is ``done``, ``failed`` or ``deleted`` (its user erased or
        its messages forgotten meanwhile); their states."""
        ...


class _Options(TypedDict):
    """The settings both queues take, by the same names."""

    threads: int
    lease_seconds: float
    max_attempts: int
    backoff_seconds: float
    backoff_max_seconds: float
    outage_backoff_seconds: float
    outage_backoff_max_seconds: float
    batch_max_messages: int
    nice: int


def open_queue(
    store: QueueStore,
    handler: BatchHandler,
    *,
    database_url: str,
    threads: int,
    lease_seconds: float,
    max_attempts: int,
    backoff_seconds: float,
    backoff_max_seconds: float,
    outage_backoff_seconds: float,
    outage_backoff_max_seconds: float,
    batch_max_messages: int,
    nice: int = 0,
) -> JobQueue:
    """The queue that fits ``store``: procrastinate on PostgreSQL, the worker pool otherwise."""
    options: _Options = {
        "threads": threads,
        "lease_seconds": lease_seconds,
        "max_attempts": max_attempts,
        "backoff_seconds": backoff_seconds,
        "backoff_max_seconds": backoff_max_seconds,
        "outage_backoff_seconds": outage_backoff_seconds,
        "outage_backoff_max_seconds": outage_backoff_max_seconds,
        "batch_max_messages": batch_max_messages,
        "nice": nice,
    }
    if store.kind == "postgresql":
        # Imported here: procrastinate is needed only with PostgreSQL (postgres extra).
        from ._procrastinate import DispatchStore, ProcrastinateQueue

        return ProcrastinateQueue(
            cast(DispatchStore, store), handler, database_url=database_url, **options
        )
    return WorkerPool(store, handler, **options)
