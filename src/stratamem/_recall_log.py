"""The recall log: a bounded record of what each face's recalls injected, and how fast.

Capture (``mem.llm``), the memory proxy and the REST context routes call
``mem.recall_log.record(...)`` after each recall. That only appends to this process's
buffer: a :class:`RecallRecorder` thread writes the buffer to the store in batches (about
once a second, or sooner when it fills) and prunes the log to its bounds, so recording costs
a caller no store round trip. A writer that cannot keep up loses the oldest records, never
the caller's time. ``mem.recall_log.list`` and ``latency`` read the store (this process's
buffer written first, so a reader sees its own records). The log holds memory text: the
store's forget and erase delete a user's records (store/_core/recall_log.py), and a record
whose recall began before its user's memory was forgotten or erased is not written, in
whichever process it waited (store/_core/erasures.py).
"""

from __future__ import annotations

import builtins
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from datetime import datetime, timezone

from . import _metrics
from ._queries import ListQuery, arguments
from ._vocabulary import RecallOutcome, RecallSource
from .errors import ValidationError
from .store import RecallLatencyRow, RecallLogStore, RecallRecordRow
from .types import RecallLatency, RecallRecord

__all__ = ["RecallLog", "RecallRecorder"]

log = logging.getLogger("stratamem")

# Records held in memory at most while the writer catches up (the oldest are dropped past
# it): a few MB of blocks, never a growing heap when the store is slow or down.
BUFFER_RECORDS = 4096
# The writer wakes this often, or as soon as this many records wait.
FLUSH_SECONDS = 1.0
FLUSH_RECORDS = 256
# latency(): at most this many buckets (a chart, not a table of every minute of a week).
MAX_BUCKETS = 10_000


class RecallRecorder:
    """The engine's buffer of recall records and the daemon thread that stores them.

    One per engine (every project's records; each carries its project). ``record`` never
    blocks on the store; ``flush`` writes what is pending now, in the caller's thread."""

    def __init__(
        self,
        store: RecallLogStore,
        *,
        max_entries: int,
        retention_hours: float,
        capacity: int = BUFFER_RECORDS,
    ) -> None:
        self._store = store
        self._keep = max_entries
        self._retention = retention_hours * 3600
        self._pending: deque[RecallRecordRow] = deque(maxlen=capacity)
        self._cond = threading.Condition()
        # One write at a time: the thread's and a reader's flush must not both take the
        # same batch, nor interleave their prunes.
        self._write_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopped = False
        self.dropped = 0  # records lost to a full buffer (a writer that fell behind)
        # Records not written because their user's memory was forgotten or erased (by any
        # process) after their recall began: they may quote what was deleted.
        self.erased = 0

    def record(self, row: RecallRecordRow) -> None:
        with self._cond:
            if self._stopped:
                return
            if len(self._pending) == self._pending.maxlen:
                self.dropped += 1  # the deque drops the oldest on append
                _metrics.recall_log_dropped(1)
            self._pending.append(row)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="stratamem-recall-log", daemon=True
                )
                self._thread.start()
            if len(self._pending) >= FLUSH_RECORDS:
                self._cond.notify()

    def flush(self) -> None:
        """Store every pending record and prune the projects they belong to."""
        with self._write_lock:
            with self._cond:
                batch = list(self._pending)
                self._pending.clear()
            if not batch:
                return
            try:
                erased = self._store.add_recall_records(batch)
            except Exception:
                _metrics.recall_log_dropped(len(batch))
                raise
            _metrics.recall_log_written(min(r.created_at for r in batch))
            if erased:
                self.erased += erased
                log.warning(
                    "stratamem: %d recall log record(s) not written: their user's memory was "
                    "forgotten or erased after the recall",
                    erased,
                )
            older_than = time.time() - self._retention
            for project in dict.fromkeys(r.project_id for r in batch):
                self._store.prune_recall_log(project, self._keep, older_than)

    def close(self) -> None:
        """Store what is pending and stop the thread (the store is about to close)."""
        with self._cond:
            self._stopped = True
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join(timeout=5.0)
        self._flush_logged()

    def _flush_logged(self) -> None:
        try:
            self.flush()
        except Exception:
            log.exception("stratamem: could not store recall log records; they are dropped")

    def _loop(self) -> None:
        while True:
            with self._cond:
                if not self._stopped and len(self._pending) < FLUSH_RECORDS:
                    self._cond.wait(FLUSH_SECONDS)
                stopped = self._stopped
            if stopped:
                return  # close() flushes in its own thread, after this one is gone
            self._flush_logged()


class RecallLog:
    """``mem.recall_log``: recent recalls of this project and their latency.

    Embedded only (like ``stats()``). With ``recall_log`` off nothing is recorded; what
    the store already holds is still listed until it ages out or is erased."""

    def __init__(
        self,
        store: RecallLogStore,
        project_id: str,
        *,
        recorder: RecallRecorder | None,
        check_open: Callable[[], None],
    ) -> None:
        self._store = store
        self._project_id = project_id
        self._recorder = recorder
        self._check_open = check_open

    @property
    def enabled(self) -> bool:
        """Whether recalls are recorded (the ``recall_log`` setting)."""
        return self._recorder is not None

    def record(
        self,
        *,
        user_id: str,
        session_id: str | None,
        source: RecallSource,
        request: str,
        query: str | None,
        outcome: RecallOutcome,
        latency_ms: float,
        formatted_context: str = "",
        hits: int = 0,
    ) -> None:
        """Log one recall a face made (for faces: capture, the proxy, the REST routes).
        Returns at once; a no-op when the log is off."""
        if self._recorder is None:
            return
        self._recorder.record(
            RecallRecordRow(
                project_id=self._project_id,
                user_id=user_id,
                session_id=session_id,
                source=source,
                request=request,
                query=query,
                outcome=outcome,
                formatted_context=formatted_context if outcome == "injected" else "",
                hits=hits,
                latency_ms=round(latency_ms, 3),
                created_at=time.time(),
            )
        )

    def list(
        self, *, user_id: str | None = None, limit: int = 50, offset: int = 0
    ) -> builtins.list[RecallRecord]:
        """Recent recalls of this project (or of one user), newest first."""
        q = ListQuery.build(arguments(locals()), what="recall_log.list")
        self._check_open()
        self._flush()
        rows = self._store.list_recall_records(
            self._project_id, q.user_id, limit=q.limit, offset=q.offset
        )
        return [_record(r) for r in rows]

    def latency(
        self, *, hours: float = 24.0, bucket_minutes: float = 60.0
    ) -> builtins.list[RecallLatency]:
        """Recall latency over the last ``hours``, in buckets of ``bucket_minutes`` aligned
        to the clock (UTC), oldest first; buckets without recalls are left out."""
        problems = []
        if not (isinstance(hours, int | float) and math.isfinite(hours) and hours > 0):
            problems.append(f"hours: expected a positive number, got {hours!r}")
        if not (
            isinstance(bucket_minutes, int | float)
            and math.isfinite(bucket_minutes)
            and bucket_minutes > 0
        ):
            problems.append(f"bucket_minutes: expected a positive number, got {bucket_minutes!r}")
        elif not problems and hours * 60 / bucket_minutes > MAX_BUCKETS:
            problems.append(f"hours / bucket_minutes: at most {MAX_BUCKETS} buckets")
        if problems:
            raise ValidationError("invalid recall_log.latency arguments", problems)
        self._check_open()
        self._flush()
        bucket = bucket_minutes * 60
        # Aligned to multiples of the bucket since the epoch, so a chart's buckets stay put
        # from one reading to the next.
        since = math.floor((time.time() - hours * 3600) / bucket) * bucket
        rows = self._store.recall_latency_series(self._project_id, since, bucket)
        return [_latency(r) for r in rows]

    def _flush(self) -> None:
        if self._recorder is not None:
            self._recorder.flush()


def _when(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, tz=timezone.utc)


def _record(r: RecallRecordRow) -> RecallRecord:
    return RecallRecord(
        project_id=r.project_id,
        user_id=r.user_id,
        session_id=r.session_id,
        source=r.source,
        request=r.request,
        query=r.query,
        outcome=r.outcome,
        formatted_context=r.formatted_context,
        hits=r.hits,
        latency_ms=r.latency_ms,
        created_at=_when(r.created_at),
    )


def _latency(r: RecallLatencyRow) -> RecallLatency:
    return RecallLatency(
        bucket_start=_when(r.bucket_start),
        count=r.count,
        skipped=r.skipped,
        p50_ms=r.p50_ms,
        p95_ms=r.p95_ms,
        max_ms=r.max_ms,
    )
