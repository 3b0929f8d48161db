"""The embedded job queue: worker threads that claim batches from the store (leases,
heartbeats), run them, and commit or retry. Used with SQLite; see ``_procrastinate.py``
for PostgreSQL."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from .. import _metrics, _tracing
from .._priority import lower_this_thread
from ..errors import ProcessingError, UnavailableError
from ..store import ClaimedBatch, JobStore, LeaseLostError

__all__ = [
    "FINISHED",
    "BatchHandler",
    "WorkerPool",
    "backoff_delay",
    "job_states",
    "paused_because",
    "run_batch",
    "wait_for_jobs",
    "wait_timed_out",
]

log = logging.getLogger("stratamem.jobs")

#: Job states that end a wait for the job.
FINISHED = frozenset({"done", "failed", "deleted"})


class BatchHandler(Protocol):
    """Processes one claimed batch and commits its results through the store."""

    def __call__(self, batch: ClaimedBatch) -> None: ...


class _Waiting(Protocol):
    def wait_until(
        self,
        done: Callable[[], bool],
        timeout: float | None,
        *,
        what: str,
        own: Sequence[int] = (),
    ) -> None: ...


def backoff_delay(attempt: int, base: float, cap: float) -> float:
    """Exponential backoff with +-20% jitter so retries of many jobs do not align."""
    delay = min(cap, base * 2.0 ** max(0, attempt - 1))
    return delay * random.uniform(0.8, 1.2)


def job_states(store: JobStore, job_ids: Sequence[int]) -> dict[int, str]:
    """The jobs' states; a job that no longer exists is ``deleted`` (its user was erased or
    its messages forgotten meanwhile), which is as finished as ``done``."""
    states = store.job_states(job_ids)
    return {i: states.get(i, "deleted") for i in job_ids}


def wait_for_jobs(
    queue: _Waiting, store: JobStore, job_ids: Iterable[int], timeout: float | None
) -> dict[int, str]:
    """``queue.wait_jobs``: wait until every job is finished; their states."""
    ids = list(job_ids)
    states: dict[int, str] = {}

    def finished() -> bool:
        states.update(job_states(store, ids))
        return all(state in FINISHED for state in states.values())

    queue.wait_until(finished, timeout, what=f"jobs {ids}", own=ids)
    return states


def paused_because(store: JobStore) -> str | None:
    """Why processing is paused (a service's outage), or None when it is not."""
    try:
        outages = store.outages()
    except Exception:  # a store that cannot say is not reported as paused
        return None
    if not outages:
        return None
    first = min(outages, key=lambda o: o.since)
    return (
        f"processing is paused: {first.service} has been unavailable for "
        f"{time.time() - first.since:.0f} s ({first.last_error[:200]}); it resumes by itself "
        "once a probe gets an answer"
    )


def wait_timed_out(store: JobStore, timeout: float | None, what: str) -> ProcessingError:
    """The error of a wait for ``what`` that ran out of ``timeout`` seconds."""
    why = paused_because(store)
    return ProcessingError(
        f"timed out after {timeout or 0.0:.1f}s waiting for {what}; "
        + (f"{why}. " if why else "")
        + "The messages are stored and will be processed by a worker"
    )


def run_batch(
    store: JobStore,
    handler: BatchHandler,
    batch: ClaimedBatch,
    *,
    max_attempts: int,
    backoff_seconds: float,
    backoff_max_seconds: float,
    outage_backoff_seconds: float,
    outage_backoff_max_seconds: float,
    on_resume: Callable[[], object] | None = None,
) -> None:
    """Run ``handler`` over a claimed batch; a failure is recorded, never raised.

    * A service it needs is unavailable (``UnavailableError``: the LLM or the embedder is
      down, overloaded, or refuses the configuration): an outage. Processing pauses (the
      store claims nothing until the outage's next probe, with its own backoff) and the
      jobs wait for it; the attempt does not count.
    * Any other failure of a batch of several jobs: which job caused it is not known, so
      the attempt counts for none of them, and their retry takes half as many jobs (down
      to one), which narrows the failure down to the job that causes it while the others
      go through.
    * A job failing alone: its own attempt counts; it is retried alone with backoff, and
      fails for good after ``max_attempts`` (a job failed for good no longer holds back
      its user's later jobs).

    A probe (``batch.probe``) that ends otherwise than by an outage ends the outage, then
    ``on_resume()`` lets the waiting work go on. A batch whose claim was lost meanwhile
    is discarded: its holder's successor redoes it."""
    started = time.perf_counter()
    jobs = len(batch.job_ids)
    with _tracing.span(
        "stratamem.process_batch",
        {
            _tracing.STORE_ID: batch.project_id,
            _tracing.USER_ID: batch.user_id,
            "stratamem.batch.jobs": jobs,
            "stratamem.batch.messages": len(batch.messages),
            "stratamem.batch.probe": batch.probe,
        },
    ) as span:
        try:
            handler(batch)
        except LeaseLostError as exc:
            _tracing.failed(span, exc)
            log.warning("jobs %s were reclaimed by another worker; result discarded", batch.job_ids)
            return
        except UnavailableError as exc:
            _tracing.failed(span, exc)
            _pause(store, batch, exc, outage_backoff_seconds, outage_backoff_max_seconds)
            _metrics.job_outcome(batch.project_id, "paused", jobs)
            return
        except Exception as exc:  # every failure is recorded and retried, never raised here
            _tracing.failed(span, exc)
            if batch.probe:  # the services answered: whatever went wrong, the outage is over
                _resume(store, on_resume)
            _fail(store, batch, exc, max_attempts, backoff_seconds, backoff_max_seconds)
            return
        if batch.probe:
            _resume(store, on_resume)
    _metrics.job_outcome(batch.project_id, "processed", jobs)
    log.debug(
        "processed %d messages of %s/%s in %.1f ms",
        len(batch.messages),
        batch.project_id,
        batch.user_id,
        (time.perf_counter() - started) * 1000,
    )


def _fail(
    store: JobStore,
    batch: ClaimedBatch,
    exc: Exception,
    max_attempts: int,
    backoff_seconds: float,
    backoff_max_seconds: float,
) -> None:
    error = f"{type(exc).__name__}: {exc}"
    calls = getattr(exc, "stratamem_calls", ())
    if len(batch.job_ids) > 1:
        cap = (len(batch.job_ids) + 1) // 2
        split_at = time.time() + backoff_delay(1, backoff_seconds, backoff_max_seconds)
        with contextlib.suppress(LeaseLostError):
            store.fail_batch(batch, error, split_at, calls, counted=False, retry_cap=cap)
            _metrics.job_outcome(batch.project_id, "retried", len(batch.job_ids))
            log.warning(
                "jobs %s failed together (an attempt of none of them); retrying them in "
                "batches of at most %d jobs in %.1fs: %s",
                batch.job_ids,
                cap,
                split_at - time.time(),
                error,
            )
        return
    attempts = batch.job_attempts[batch.job_ids[0]]
    retry_at: float | None = None
    if attempts < max_attempts:
        retry_at = time.time() + backoff_delay(attempts, backoff_seconds, backoff_max_seconds)
    try:
        store.fail_batch(batch, error, retry_at, calls, retry_cap=1)
    except LeaseLostError:
        return
    _metrics.job_outcome(batch.project_id, "failed" if retry_at is None else "retried", 1)
    if retry_at is None:
        log.error("job %s failed for good after %d attempts: %s", batch.job_ids, attempts, error)
    else:
        log.warning(
            "job %s failed (attempt %d/%d), retrying in %.1fs: %s",
            batch.job_ids,
            attempts,
            max_attempts,
            retry_at - time.time(),
            error,
        )


def _pause(
    store: JobStore, batch: ClaimedBatch, exc: UnavailableError, base: float, cap: float
) -> None:
    error = f"{type(exc).__name__}: {exc}"
    outages = store.record_outage(
        exc.service, error, lambda n: backoff_delay(n, base, cap), probe=batch.probe
    )
    try:
        # Due at once: the outage holds every claim until its probe, and once the probe
        # went through, these jobs need not wait for anything.
        calls = getattr(exc, "stratamem_calls", ())
        store.fail_batch(batch, error, time.time(), calls, counted=False)
    except LeaseLostError:
        return
    outage = next(o for o in outages if o.service == exc.service)
    wait = max(o.next_probe for o in outages) - time.time()
    if outage.failures == 1 and not batch.probe:
        log.warning(
            "processing paused: %s is unavailable (%s); attempts are not counted, next "
            "probe in %.1fs",
            exc.service,
            error,
            wait,
        )
    elif batch.probe:
        log.warning(
            "processing still paused: %s unavailable for %.0fs (failed %d times): %s; next "
            "probe in %.1fs",
            exc.service,
            time.time() - outage.since,
            outage.failures,
            error,
            wait,
        )
    else:
        log.info("jobs %s wait for the outage of %s to end", batch.job_ids, exc.service)


def _resume(store: JobStore, on_resume: Callable[[], object] | None) -> None:
    try:
        ended = store.end_outage()
    except Exception:  # the next probe ends it
        log.exception("could not record the end of an outage")
        return
    for outage in ended:
        log.warning(
            "processing resumed: %s answers again after %.0fs unavailable (failed %d times)",
            outage.service,
            time.time() - outage.since,
            outage.failures,
        )
    if ended and on_resume is not None:
        on_resume()


class WorkerPool:
    """``threads`` workers in this process; any number of processes may share a store.

    The store is the queue: workers poll it for claimable batches (``claim_batch``) and
    hold them under leases that a heartbeat thread extends. A ``JobQueue``.
    """

    name = "store"

    def __init__(
        self,
        store: JobStore,
        handler: BatchHandler,
        *,
        threads: int = 1,
        lease_seconds: float = 60.0,
        max_attempts: int = 8,
        backoff_seconds: float = 2.0,
        backoff_max_seconds: float = 600.0,
        outage_backoff_seconds: float = 2.0,
        outage_backoff_max_seconds: float = 60.0,
        batch_max_messages: int = 256,
        poll_seconds: float = 0.5,
        nice: int = 0,
        on_resume: Callable[[], object] | None = None,
    ) -> None:
        self.store = store
        self.handler = handler
        self.threads = threads
        self.lease_seconds = lease_seconds
        self.max_attempts = max_attempts
        self.backoff_seconds = backoff_seconds
        self.backoff_max_seconds = backoff_max_seconds
        self.outage_backoff_seconds = outage_backoff_seconds
        self.outage_backoff_max_seconds = outage_backoff_max_seconds
        self.batch_max_messages = batch_max_messages
        self.poll_seconds = poll_seconds
        self.nice = nice  # the worker threads' lower priority (_priority.py)
        # What lets waiting work go on once a probe ended an outage (default: idle workers
        # wait for the probe; with the outage over, work is due now).
        self._on_resume = on_resume
        self._prefix = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._progress = threading.Condition()
        self._held: dict[str, list[int]] = {}
        self._held_lock = threading.Lock()
        self._workers: list[threading.Thread] = []
        self._heartbeat: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return any(t.is_alive() for t in self._workers)

    def start(self) -> None:
        if self._workers or self.threads <= 0:
            return
        self._stop.clear()
        for i in range(self.threads):
            t = threading.Thread(
                target=self._loop,
                args=(f"{self._prefix}:{i}",),
                name=f"stratamem-worker-{i}",
                daemon=True,
            )
            t.start()
            self._workers.append(t)
        self._ensure_heartbeat()

    def stop(self, timeout: float | None = None) -> None:
        """Stop after the batches in hand are finished (or ``timeout`` passes)."""
        self._stop.set()
        self._wake.set()
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in self._workers:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        beat = self._heartbeat
        if beat is not None:
            beat.join(1.0)
        self._workers = [t for t in self._workers if t.is_alive()]

    def notify(self) -> None:
        """New work was queued in this process: wake an idle worker now, not at next poll."""
        self._wake.set()

    # -- the work ----------------------------------------------------------------------

    def run_once(
        self, worker_id: str | None = None, *, for_jobs: Sequence[int] = ()
    ) -> ClaimedBatch | None:
        """Claim and run one batch (of the users of ``for_jobs``, if given) in the calling
        thread; the batch it ran, or None if nothing was ready."""
        worker_id = worker_id or f"{self._prefix}:caller-{threading.get_ident()}"
        batch = self.store.claim_batch(
            worker_id, self.lease_seconds, self.batch_max_messages, for_jobs
        )
        if batch is None:
            return None
        with self._held_lock:
            self._held[worker_id] = batch.job_ids
        self._ensure_heartbeat()
        try:
            self._run(batch)
        finally:
            with self._held_lock:
                self._held.pop(worker_id, None)
            with self._progress:
                self._progress.notify_all()
        return batch

    def _run(self, batch: ClaimedBatch) -> None:
        run_batch(
            self.store,
            self.handler,
            batch,
            max_attempts=self.max_attempts,
            backoff_seconds=self.backoff_seconds,
            backoff_max_seconds=self.backoff_max_seconds,
            outage_backoff_seconds=self.outage_backoff_seconds,
            outage_backoff_max_seconds=self.outage_backoff_max_seconds,
            on_resume=self._on_resume or self._wake.set,
        )

    def _loop(self, worker_id: str) -> None:
        lower_this_thread(self.nice)
        while not self._stop.is_set():
            try:
                worked = self.run_once(worker_id) is not None
            except Exception:  # a store hiccup (e.g. disk full) must not kill the worker
                log.exception("worker %s could not claim work", worker_id)
                worked = False
                self._stop.wait(self.poll_seconds)
            if not worked and not self._stop.is_set():
                self._wake.wait(self._idle_wait())
                self._wake.clear()

    def _idle_wait(self) -> float:
        try:
            due = self.store.next_job_time()
        except Exception:
            return self.poll_seconds
        if due is None:
            return self.poll_seconds
        return max(0.01, min(self.poll_seconds, due - time.time()))

    def _ensure_heartbeat(self) -> None:
        with self._held_lock:
            if self._heartbeat is None:
                self._heartbeat = threading.Thread(
                    target=self._beat, name="stratamem-heartbeat", daemon=True
                )
                self._heartbeat.start()

    def _beat(self) -> None:
        # Leases are extended while a batch is in hand, so only a dead holder's jobs expire.
        interval = max(0.05, self.lease_seconds / 3)
        while True:
            stopping = self._stop.wait(interval)
            with self._held_lock:
                held = list(self._held.items())
            for worker_id, job_ids in held:
                try:
                    self.store.extend_lease(job_ids, worker_id, self.lease_seconds)
                except Exception:
                    log.exception("could not extend the lease of jobs %s", job_ids)
            with self._held_lock:
                if not self._held and (stopping or not self.running):
                    self._heartbeat = None
                    return

    # -- waiting -----------------------------------------------------------------------

    def wait_until(
        self,
        done: Callable[[], bool],
        timeout: float | None,
        *,
        what: str,
        own: Sequence[int] = (),
    ) -> None:
        """Block until ``done()``; without worker threads, do the work in this thread.

        A caller waiting for its ``own`` jobs while every worker is busy (with other users'
        batches: slow hooks, a slow model) runs its users' ready batches itself, as it
        does without workers, rather than queue behind other projects' work.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while not done():
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise wait_timed_out(self.store, timeout, what)
            if self.running:
                if own and self._workers_busy() and self.run_once(for_jobs=own):
                    continue
                with self._progress:
                    self._progress.wait(min(0.05, remaining) if remaining else 0.05)
            elif not self.run_once():
                time.sleep(min(0.02, remaining) if remaining else 0.02)

    def wait_jobs(self, job_ids: Iterable[int], timeout: float | None) -> dict[int, str]:
        return wait_for_jobs(self, self.store, job_ids, timeout)

    def _workers_busy(self) -> bool:
        """Every worker thread of this pool holds a batch."""
        with self._held_lock:
            held = sum(f"{self._prefix}:{i}" in self._held for i in range(self.threads))
        return held >= self.threads
