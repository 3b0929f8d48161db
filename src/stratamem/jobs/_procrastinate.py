"""The job queue on PostgreSQL: procrastinate dispatches, the store keeps the jobs.

Division of labour
------------------
stratamem's ``jobs`` table stays the record of work: ``add_messages`` commits the messages
and one job row in one transaction; attempts, errors, backoff and the final ``failed``
state live there, and ``job_states`` / ``unfinished_jobs`` / ``retry_failed`` read and
write it exactly as on SQLite. procrastinate (Postgres-only, LISTEN/NOTIFY, locks) adds
what lets workers on many machines share it:

* a *wake-up* per user with work: a procrastinate job of task ``stratamem.process_user``
  whose ``lock`` and ``queueing_lock`` are both the user's key. A trigger on ``jobs``
  creates it in the very transaction that queues a job (store/postgres/_jobs.py), so a job
  never lacks one; while one waits, later jobs of the user merge into it; at most one runs
  per user (one user's memory is consolidated by one worker at a time, in order);
* workers that LISTEN for wake-ups, fetch them with ``SKIP LOCKED``, run ``threads`` at a
  time and heartbeat; a wake-up scheduled for when a failed batch's backoff ends.

A wake-up's run claims the user's ready jobs in id order, in batches of at most
``batch_max_messages``, under a token unique to the run (``claim_user_batch``), runs the
pipeline over each (``run_batch``: commit, or record the failure and back off), and before
it ends makes sure a wake-up exists for whatever the user has left (a batch in backoff, new
messages, the rest of a backlog: a run takes a few batches, then yields to other users).

Dead workers: procrastinate declares a worker stalled once its heartbeat is
``lease_seconds`` old. Every worker sweeps: the runs of stalled workers are ended as failed
and their users woken again; the next run takes over the jobs the dead one held (their
attempts count it), and should the "dead" run come back, its commit fails the token check
(``LeaseLostError``) and is discarded. procrastinate's own ``retry_job`` would put the run
back to ``todo``, which collides with the queueing lock when another wake-up of the user is
already waiting (procrastinate-org/procrastinate#1446); a fresh wake-up merges instead.
Users that have unfinished jobs but no wake-up at all (queued before the trigger existed,
or a wake-up deleted by hand) are woken when a worker starts and by a periodic task.

With no background worker (``workers=0``, ``stratamem serve --no-worker``), waiting
(``wait()``, ``sync=True``) leaves the work to the workers when any is alive anywhere, and
otherwise runs procrastinate's worker for the waiting caller until nothing is due.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import os
import secrets
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

from .._priority import lower_this_thread
from ..errors import ConfigError
from ..store import ClaimedBatch, JobStore
from ..store.postgres._jobs import DISPATCH_QUEUE, DISPATCH_TASK
from ._worker import BatchHandler, WorkerPool, run_batch, wait_for_jobs, wait_timed_out

__all__ = ["DispatchStore", "ProcrastinateQueue"]

_T = TypeVar("_T")

log = logging.getLogger("stratamem.jobs")

# Batches one run takes before it hands the user back to the queue, so that one user's
# backlog does not hold a worker while other users wait.
BATCHES_PER_RUN = 4
# Users with jobs but no wake-up are looked for (a scan of the unfinished jobs; the trigger
# makes finding any rare) when a worker starts, by a waiting caller at most once a minute,
# and fleet-wide by a periodic task every five minutes.
ORPHAN_SWEEP_SECONDS = 60.0
ORPHAN_CRON = "*/5 * * * *"
# At stop, how long each step of ending what still runs on the queue's loop may take (a
# query psycopg cancels in the server takes a round trip or two).
CLOSE_STEP_SECONDS = 5.0


class DispatchStore(JobStore, Protocol):
    """The store operations this queue needs beyond the jobs role (PostgreSQL)."""

    def install_dispatch(self, schema: str, migrations: Sequence[tuple[str, str]]) -> None: ...
    def claim_user_batch(
        self, project_id: str, user_id: str, worker_id: str, max_messages: int
    ) -> ClaimedBatch | None: ...
    def wake_users(self, users: Sequence[tuple[str, str]], delay: float = 0.0) -> int: ...
    def wake_orphans(self) -> int: ...
    def wake_all(self) -> int: ...
    def queue_workers_alive(self, within_seconds: float) -> int: ...


@functools.cache
def _procrastinate_schema() -> tuple[str, tuple[tuple[str, str], ...]]:
    """procrastinate's schema and its migrations (file name, SQL), oldest first."""
    from procrastinate.schema import SchemaManager

    folder = Path(SchemaManager.get_migrations_path())
    migrations = tuple(
        sorted((p.name, p.read_text(encoding="utf-8")) for p in folder.glob("*.sql"))
    )
    return SchemaManager.get_schema(), migrations


async def _in_thread(fn: Callable[..., _T], *args: Any, nice: int = 0) -> _T:
    """``fn(*args)`` in a new thread (not an executor: see _run_process_user), awaited;
    the thread runs ``nice`` steps below normal priority (_priority.py)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[_T] = loop.create_future()

    def succeed(result: _T) -> None:
        if not done.cancelled():
            done.set_result(result)

    def fail(error: BaseException) -> None:
        if not done.cancelled():
            done.set_exception(error)

    def run() -> None:
        lower_this_thread(nice)
        settle: Callable[[], None]
        try:
            settle = functools.partial(succeed, fn(*args))
        except BaseException as exc:
            settle = functools.partial(fail, exc)
        # RuntimeError: the loop was closed meanwhile (stop), nobody waits any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle)

    threading.Thread(target=run, name="stratamem-job", daemon=True).start()
    return await done


class ProcrastinateQueue:
    """A ``JobQueue`` whose workers are procrastinate workers on the store's database."""

    name = "procrastinate"

    def __init__(
        self,
        store: DispatchStore,
        handler: BatchHandler,
        *,
        database_url: str,
        threads: int = 1,
        lease_seconds: float = 30.0,
        max_attempts: int = 8,
        backoff_seconds: float = 2.0,
        backoff_max_seconds: float = 600.0,
        outage_backoff_seconds: float = 2.0,
        outage_backoff_max_seconds: float = 60.0,
        batch_max_messages: int = 256,
        poll_seconds: float = 0.5,
        nice: int = 0,
    ) -> None:
        try:
            import procrastinate
        except ImportError as exc:  # pragma: no cover - depends on the installation
            raise ConfigError(
                "workers on PostgreSQL need procrastinate: pip install 'stratamem[postgres]'"
            ) from exc
        schema, migrations = _procrastinate_schema()
        store.install_dispatch(schema, migrations)
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
        self.nice = nice  # the job threads' lower priority (_priority.py)
        self._prefix = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self._background_name = f"stratamem@{self._prefix}"
        self._app = procrastinate.App(
            connector=procrastinate.PsycopgConnector(
                conninfo=database_url,
                # Fetching, finishing, heartbeats and sweeps share these (LISTEN has one of
                # its own). All are opened at start: a script's queued work is finished at
                # interpreter exit, when a new connection may need a resolver thread that
                # is no longer allowed.
                min_size=max(2, threads + 2),
                max_size=max(2, threads + 2),
                name="stratamem-jobs",
                # Named in pg_stat_activity, apart from the store's connections.
                kwargs={"application_name": "stratamem-jobs"},
                # Every connection (the LISTEN one too) is known, for stop to close those
                # the pool would close only once they are handed back.
                configure=self._opened,
            )
        )
        self._app.task(name=DISPATCH_TASK, queue=DISPATCH_QUEUE, pass_context=True)(
            self._run_process_user
        )
        # A periodic task also keeps procrastinate's side-task monitor alive: without one,
        # the monitor ends with the (idle) periodic deferrer and a worker whose heartbeat
        # failed would go on without heartbeats instead of stopping (and being restarted).
        self._app.periodic(cron=ORPHAN_CRON, periodic_id="orphans")(
            self._app.task(
                name="stratamem.wake_orphans",
                queue=DISPATCH_QUEUE,
                lock="stratamem:orphans",
                queueing_lock="stratamem:orphans",
            )(self._run_wake_orphans)
        )
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._serving: asyncio.Task[None] | None = None
        self._served = threading.Event()
        self._stopping = threading.Event()
        self._progress = threading.Condition()
        self._runs = 0
        self._busy = 0  # runs of this process's background worker in hand
        # A caller waiting for its own jobs while every background thread is busy claims
        # and runs its users' batches itself, under a store lease (see wait_until).
        self._here = WorkerPool(
            store,
            handler,
            threads=0,
            lease_seconds=lease_seconds,
            max_attempts=max_attempts,
            backoff_seconds=backoff_seconds,
            backoff_max_seconds=backoff_max_seconds,
            outage_backoff_seconds=outage_backoff_seconds,
            outage_backoff_max_seconds=outage_backoff_max_seconds,
            batch_max_messages=batch_max_messages,
            on_resume=store.wake_all,
        )
        self._next_orphan_sweep = 0.0
        self._alive_checked = (0.0, False)
        self._connections: weakref.WeakSet[Any] = weakref.WeakSet()

    # -- the event loop procrastinate runs in ------------------------------------------------

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is not None:
                return self._loop
            loop = asyncio.new_event_loop()
            thread = threading.Thread(
                target=loop.run_forever, name="stratamem-procrastinate", daemon=True
            )
            thread.start()
            try:
                asyncio.run_coroutine_threadsafe(self._open(), loop).result(30)
            except BaseException:
                loop.call_soon_threadsafe(loop.stop)
                thread.join(5)
                raise
            self._loop, self._loop_thread = loop, thread
            return loop

    async def _open(self) -> None:
        await self._app.open_async()

    async def _opened(self, conn: Any) -> None:
        self._connections.add(conn)

    def _call(self, coro: Any, timeout: float | None = None) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._ensure_loop()).result(timeout)

    def _worker_options(self) -> dict[str, Any]:
        return {
            "queues": [DISPATCH_QUEUE],
            "install_signal_handlers": False,
            "fetch_job_polling_interval": self.poll_seconds,
            # One knob for "dead": a worker silent for lease_seconds is stalled.
            "update_heartbeat_interval": max(0.2, self.lease_seconds / 3),
            "stalled_worker_timeout": self.lease_seconds,
            # A finished wake-up has nothing to keep (the jobs table records the work);
            # failed ones (stalled runs) stay for the operator to see.
            "delete_jobs": "successful",
        }

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        task = self._serving
        return task is not None and not task.done()

    def start(self) -> None:
        if self.threads <= 0 or self.running:
            return
        self._stopping.clear()
        self._served.clear()
        loop = self._ensure_loop()
        started = concurrent.futures.Future[None]()

        def begin() -> None:
            self._serving = loop.create_task(self._serve())
            started.set_result(None)

        loop.call_soon_threadsafe(begin)
        started.result(10)

    async def _serve(self) -> None:
        sweeper = asyncio.create_task(self._sweep_forever())
        try:
            pause = 1.0
            while not self._stopping.is_set():
                began = time.monotonic()
                failure: BaseException | None = None
                try:
                    await self._app.run_worker_async(
                        name=self._background_name,
                        concurrency=self.threads,
                        wait=True,
                        **self._worker_options(),
                    )
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    failure = exc
                if self._stopping.is_set():
                    break
                # procrastinate stops its worker when the database goes away (a failed
                # heartbeat, say); a long-running worker process starts it again.
                pause = 1.0 if time.monotonic() - began > 60 else min(30.0, pause * 2)
                log.warning(
                    "the job queue's worker stopped (%s); restarting in %.0fs",
                    failure or "see procrastinate's log",
                    pause,
                    exc_info=failure,
                )
                await asyncio.sleep(pause)
        finally:
            sweeper.cancel()
            try:
                # Awaited: a sweep cancelled mid-query has psycopg cancel the query in the
                # server and roll back, which takes turns of this loop; a loop stopped before
                # left the connection idle in its transaction, holding its locks.
                await asyncio.wait({sweeper})
            finally:
                self._served.set()

    def stop(self, timeout: float | None = None) -> None:
        """Stop after the batches in hand are finished (or ``timeout`` passes), then
        close every connection; ``start()`` or a wait opens them again.

        A batch still in hand after ``timeout`` is left to its thread, which cannot write
        once the store is closed. Its wake-up stays running under this worker, whose
        heartbeat ends here: once ``lease_seconds`` pass, any worker's sweep ends it and
        wakes the user, whose next run takes the jobs over (and fences this one off).
        """
        self._stopping.set()
        loop, serving = self._loop, self._serving
        if loop is None:
            return
        if serving is not None:
            # Cancelling run_worker_async is procrastinate's graceful stop: no new fetch,
            # the running jobs finish (ours stop claiming, having _stopping set).
            loop.call_soon_threadsafe(serving.cancel)
            if not self._served.wait(timeout):
                log.warning(
                    "workers still busy after %.1fs; their batches are left to the next "
                    "worker, once this one's lease is over",
                    timeout or 0.0,
                )
        self._serving = None
        try:
            asyncio.run_coroutine_threadsafe(self._close(serving), loop).result(
                4 * CLOSE_STEP_SECONDS
            )
        except Exception:
            log.exception("could not close the job queue's connections")
        with self._lock:
            loop.call_soon_threadsafe(loop.stop)
            if self._loop_thread is not None:
                self._loop_thread.join(5)
            self._loop = self._loop_thread = None
        if not loop.is_running():
            loop.close()

    async def _close(self, serving: asyncio.Task[None] | None) -> None:
        """End what still runs on this loop, then close every connection of the queue."""
        from psycopg.pq import TransactionStatus

        if serving is not None and not serving.done():
            # Cancelled again, procrastinate's worker stops waiting for its runs (and
            # leaves them running in the database, as a dead worker would).
            serving.cancel()
            await asyncio.wait({serving}, timeout=CLOSE_STEP_SECONDS)
        try:
            # Closed before the runs are cancelled: they can then not record themselves
            # as aborted, which would keep the stalled-worker sweep from taking them over.
            await self._app.close_async()
        finally:
            current = asyncio.current_task()
            rest = [task for task in asyncio.all_tasks() if task is not current]
            for task in rest:
                task.cancel()
            if rest:
                done, _ = await asyncio.wait(rest, timeout=CLOSE_STEP_SECONDS)
                for task in done:
                    if not task.cancelled():
                        task.exception()  # a run failing to record itself, as meant
            for conn in [c for c in self._connections if not c.closed]:
                # Held by a task that did not end in time. A query running is cancelled
                # in the server first: a closed socket alone does not stop it.
                with contextlib.suppress(Exception):
                    if conn.info.transaction_status == TransactionStatus.ACTIVE:
                        await conn.cancel_safe(timeout=CLOSE_STEP_SECONDS)
                    await conn.close()

    def notify(self) -> None:
        """Nothing to do: the wake-up's INSERT notifies every listening worker."""

    # -- the task ------------------------------------------------------------------------

    async def _run_process_user(self, context: Any, project_id: str, user_id: str) -> None:
        # procrastinate would run a sync task in an executor, and executors refuse work
        # once the interpreter is exiting, which is when a script's Memory finishes what it
        # queued (atexit): the run gets a thread of its own instead. Only the background
        # worker's runs are lowered: a caller waiting (sync=True, wait()) waits for this one.
        background = context.worker_name == self._background_name
        with self._progress:
            self._busy += background
        try:
            await _in_thread(
                self._process_user,
                context,
                project_id,
                user_id,
                nice=self.nice if background else 0,
            )
        finally:
            with self._progress:
                self._busy -= background

    def _process_user(self, context: Any, project_id: str, user_id: str) -> None:
        job = context.job
        # Unique per run: a later run of the same user has another token, so this run's
        # claims are fenced off from it and from any run after it.
        worker_id = f"{self._prefix}:pq{job.id}.{job.attempts}"
        delay = 0.0
        try:
            for _ in range(BATCHES_PER_RUN):
                if self._stopping.is_set():
                    break
                batch = self.store.claim_user_batch(
                    project_id, user_id, worker_id, self.batch_max_messages
                )
                if batch is None:
                    break
                run_batch(
                    self.store,
                    self.handler,
                    batch,
                    max_attempts=self.max_attempts,
                    backoff_seconds=self.backoff_seconds,
                    backoff_max_seconds=self.backoff_max_seconds,
                    outage_backoff_seconds=self.outage_backoff_seconds,
                    outage_backoff_max_seconds=self.outage_backoff_max_seconds,
                    # Every user's wake-up waited for the probe: due now instead.
                    on_resume=self.store.wake_all,
                )
                with self._progress:
                    self._runs += 1
                    self._progress.notify_all()
        except Exception:
            # A store error outside run_batch's care: the next run retries, not at once.
            log.exception("processing %s/%s failed; retrying later", project_id, user_id)
            delay = max(self.poll_seconds, self.backoff_seconds)
        finally:
            # Whatever the user has left (new messages, a batch in backoff, the rest of a
            # backlog) gets its wake-up before this run lets go of the user's lock.
            self.store.wake_users([(project_id, user_id)], delay=delay)

    # -- the sweep -----------------------------------------------------------------------

    async def _run_wake_orphans(self, timestamp: int) -> None:
        await self._wake_orphans()

    async def _wake_orphans(self) -> None:
        woken = await _in_thread(self.store.wake_orphans)
        if woken:
            log.info("woke %d users whose queued jobs had no wake-up", woken)

    async def _sweep_forever(self) -> None:
        orphans = True
        while True:
            try:
                await self._sweep(orphans=orphans)
                orphans = False
            except Exception:
                log.exception("sweeping the job queue failed")
            await asyncio.sleep(max(0.2, self.lease_seconds / 2))

    async def _sweep(self, *, orphans: bool) -> None:
        from procrastinate.jobs import Status

        manager = self._app.job_manager
        stalled = await manager.get_stalled_jobs(
            queue=DISPATCH_QUEUE,
            task_name=DISPATCH_TASK,
            seconds_since_heartbeat=self.lease_seconds,
        )
        users: list[tuple[str, str]] = []
        for job in stalled:
            assert job.id is not None
            try:
                await manager.finish_job_by_id_async(job.id, Status.FAILED, delete_job=False)
            except Exception:  # another worker's sweep ended it first
                continue
            kwargs = job.task_kwargs
            log.warning(
                "worker of %s/%s stopped heartbeating; its work is taken over",
                kwargs.get("project_id"),
                kwargs.get("user_id"),
            )
            users.append((str(kwargs["project_id"]), str(kwargs["user_id"])))
        if users:
            await _in_thread(self.store.wake_users, users)
        if orphans:
            await self._wake_orphans()

    # -- waiting -------------------------------------------------------------------------

    def _workers_elsewhere(self) -> bool:
        # Asked every few tens of milliseconds while waiting: answered from a 1 s cache.
        at, alive = self._alive_checked
        if time.monotonic() - at > 1.0:
            alive = self.store.queue_workers_alive(self.lease_seconds) > 0
            self._alive_checked = (time.monotonic(), alive)
        return alive

    async def _pass(self, done: Callable[[], bool] | None, deadline: float | None) -> None:
        orphans = time.monotonic() >= self._next_orphan_sweep
        if orphans:
            self._next_orphan_sweep = time.monotonic() + ORPHAN_SWEEP_SECONDS
        await self._sweep(orphans=orphans)
        worker = asyncio.ensure_future(
            self._app.run_worker_async(
                name=f"stratamem-wait@{self._prefix}",
                concurrency=1,
                wait=False,
                listen_notify=False,
                **self._worker_options(),
            )
        )
        # The caller waits for something (its job, say), not for every user's backlog: once
        # that is done, or its time is up, no further run is fetched (the one in hand ends).
        seen, stopping = self._runs, False
        while not worker.done() and not stopping:
            await asyncio.wait({worker}, timeout=0.02)
            if deadline is not None and time.monotonic() >= deadline:
                stopping = True
            elif done is not None and self._runs != seen:
                seen = self._runs
                stopping = await _in_thread(done)
            if stopping:
                worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker

    def run_once(
        self, done: Callable[[], bool] | None = None, deadline: float | None = None
    ) -> bool:
        """Run procrastinate's worker for this caller until no wake-up is due, ``done()``
        or the ``deadline`` (``time.monotonic()``). False if it found nothing to do."""
        before = self._runs
        self._call(self._pass(done, deadline))
        return self._runs > before

    def wait_until(
        self,
        done: Callable[[], bool],
        timeout: float | None,
        *,
        what: str,
        own: Sequence[int] = (),
    ) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not done():
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise wait_timed_out(self.store, timeout, what)
            step = 0.05 if remaining is None else min(0.05, remaining)
            if own and self.running and self._busy >= self.threads and self._run_own(own):
                continue
            if self.running or self._workers_elsewhere():
                with self._progress:
                    self._progress.wait(step)
            elif not self.run_once(done, deadline):
                # Nothing due yet (a batch in backoff, a dead worker not yet declared so).
                time.sleep(step)

    def wait_jobs(self, job_ids: Iterable[int], timeout: float | None) -> dict[int, str]:
        return wait_for_jobs(self, self.store, job_ids, timeout)

    def _run_own(self, own: Sequence[int]) -> bool:
        """Run a ready batch of the users of ``own`` jobs in this thread (False: none).

        Its store lease keeps the user's wake-up off these jobs meanwhile (a run that finds
        them leased reschedules itself for the lease's end, stratamem_wake), and the
        claim's rule that no earlier job of the user is unfinished keeps the user's order
        and a single batch of the user in hand; afterwards the user's wake-up is brought
        forward for whatever is left.
        """
        batch = self._here.run_once(for_jobs=own)
        if batch is None:
            return False
        self.store.wake_users([(batch.project_id, batch.user_id)])
        return True
