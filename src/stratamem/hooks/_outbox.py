"""Async webhook deliveries: taken from the durable outbox, sent, retried, settled.

A batch's async deliveries are written to the outbox in the transaction that completes the
batch. One poller thread claims a due delivery (under a lease, so several processes can
share a store) whenever one of ``webhook_async_concurrency`` sender threads is free; the
sender POSTs it, signed anew for the attempt under the same delivery id. Senders are
shared between projects: a free one goes to the oldest due delivery of a project with
none in flight in this process, else of one below its share, half the senders rounded up
(:func:`project_share`). So a project whose receivers are slow holds at most that share,
and a delivery of another project waits at most until a sender is free. With a single
sender there is nothing to share: deliveries go oldest first. A 2xx settles it
(the answer is ignored); anything else is retried with exponential backoff and jitter
until ``webhook_max_attempts``, after which the delivery stays in the outbox as ``failed``.
Every attempt is in the hook's delivery log.
"""

from __future__ import annotations

import logging
import os
import queue
import secrets
import socket
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING

from .. import _metrics
from .._time import now_iso
from .._vocabulary import DeliveryStatus
from ..errors import ProcessingError
from ..jobs import backoff_delay
from ..store import OutboxItem, WebhookDeliveryRow, WebhookStore
from ._http import WebhookHttp, excerpt, http_failure, traced_post
from ._signing import signature_headers

if TYPE_CHECKING:
    from ..config import Settings

__all__ = ["OutboxSender"]

log = logging.getLogger("stratamem.hooks")

# A delivery takes at most its timeout (30 s at most); a lease well beyond that is only
# ever outlived by a sender that died.
LEASE_SECONDS = 120.0
POLL_SECONDS = 1.0


def project_share(concurrency: int) -> int:
    """How many of ``concurrency`` sender threads one project's deliveries may hold."""
    return (concurrency + 1) // 2


class OutboxSender:
    """Sends this store's async webhook deliveries from background threads."""

    def __init__(self, store: WebhookStore, http: WebhookHttp, settings: Settings) -> None:
        self.store = store
        self.http = http
        self.settings = settings
        self._owner = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._slots = threading.Semaphore(settings.webhook_async_concurrency)
        self._share = project_share(settings.webhook_async_concurrency)
        self._sending: Counter[str] = Counter()  # deliveries in flight, by project
        self._sending_lock = threading.Lock()
        self._queue: queue.SimpleQueue[OutboxItem | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []

    @property
    def running(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    def start(self) -> None:
        if self._threads:
            return
        self._stop.clear()
        poller = threading.Thread(target=self._poll, name="stratamem-webhooks", daemon=True)
        self._threads.append(poller)
        for i in range(self.settings.webhook_async_concurrency):
            self._threads.append(
                threading.Thread(
                    target=self._work, name=f"stratamem-webhook-sender-{i}", daemon=True
                )
            )
        for t in self._threads:
            t.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop claiming; deliveries in flight finish (or are reclaimed after their lease)."""
        self._stop.set()
        self._wake.set()
        for _ in range(self.settings.webhook_async_concurrency):
            self._queue.put(None)
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self._threads = [t for t in self._threads if t.is_alive()]

    def notify(self) -> None:
        self._wake.set()

    # -- the work ----------------------------------------------------------------------

    def run_once(self) -> bool:
        """Claim and send one due delivery in the calling thread; False if none was due."""
        item = self.store.claim_webhook_delivery(f"{self._owner}:caller", LEASE_SECONDS)
        if item is None:
            return False
        self.send(item)
        return True

    def send(self, item: OutboxItem) -> None:
        hook = item.hook
        attempt = item.attempts
        body = item.body.encode()
        limit = self.settings.webhook_max_attempts
        status: DeliveryStatus
        if not hook.enabled:
            status, reason, result = "failed", "webhook disabled before delivery", None
        else:
            headers = signature_headers(hook.signing_secrets(now_iso()), item.delivery_id, body)
            result = traced_post(self.http, hook, "async", body, headers)
            failure = http_failure(result)
            if failure is None:
                status, reason = "delivered", f"HTTP {result.status} (answers are ignored)"
            elif attempt < limit:
                status, reason = "retrying", failure
            else:
                status, reason = "failed", failure
        latency = 0.0 if result is None else result.latency_ms / 1000
        _metrics.webhook_delivery(item.project_id, "async", status, latency)
        retry_at = None
        if status == "retrying":
            delay = backoff_delay(
                attempt,
                self.settings.webhook_backoff_seconds,
                self.settings.webhook_backoff_max_seconds,
            )
            retry_at = time.time() + delay
            reason = f"{reason} (attempt {attempt}/{limit}, next in {delay:.1f} s)"
        elif status == "failed" and result is not None:
            reason = f"{reason} (attempt {attempt}/{limit}, final)"
        row = WebhookDeliveryRow(
            id=item.delivery_id,
            hook_pk=hook.pk,
            project_id=item.project_id,
            user_id=item.user_id,
            message_ids=item.message_ids,
            resource=hook.resource,
            event=hook.event,
            mode="async",
            attempt=attempt,
            status=status,
            http_status=None if result is None else result.status,
            latency_ms=0.0 if result is None else result.latency_ms,
            reason=reason,
            request=excerpt(item.body),
            response="" if result is None else excerpt(result.body),
            at=now_iso(),
        )
        if status != "delivered":
            log.warning(
                "async webhook %s (%s, %s.%s) delivery %s: %s",
                hook.name,
                hook.id,
                hook.resource,
                hook.event,
                status,
                reason,
            )
        outcome = {"delivered": "done", "retrying": "retry", "failed": "failed"}[status]
        kept = self.store.finish_webhook_delivery(
            item,
            outcome,
            retry_at=retry_at,
            error=reason,
            log=row,
            keep=self.settings.webhook_log_keep,
        )
        if not kept:
            log.warning("webhook delivery %s was reclaimed meanwhile; result dropped", row.id)

    # -- threads -----------------------------------------------------------------------

    def _poll(self) -> None:
        while not self._stop.is_set():
            if not self._slots.acquire(timeout=POLL_SECONDS):
                continue
            with self._sending_lock:
                busy = list(self._sending)
                full = [p for p in busy if self._sending[p] >= self._share]
            try:
                # Projects with nothing in flight first, then any below its share: a
                # project whose receivers are slow never holds a sender another one needs.
                item = self.store.claim_webhook_delivery(self._owner, LEASE_SECONDS, busy)
                if item is None and busy:
                    item = self.store.claim_webhook_delivery(self._owner, LEASE_SECONDS, full)
            except Exception:  # a store hiccup must not end async delivery for good
                log.exception("could not claim a webhook delivery")
                item = None
                self._stop.wait(POLL_SECONDS)
            if item is None:
                self._slots.release()
                if not self._stop.is_set():
                    # Deliveries of the projects skipped may be due already: the next chance
                    # is a sender finishing (it wakes this thread), or new work.
                    self._wake.wait(POLL_SECONDS if full else self._idle_wait())
                    self._wake.clear()
                continue
            with self._sending_lock:
                self._sending[item.project_id] += 1
            self._queue.put(item)

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            try:
                self.send(item)
            except Exception:
                if self._stop.is_set():
                    # Closing under it (the store went away): the row stays leased and the
                    # next process with a sender retries it once the lease runs out.
                    log.debug("webhook delivery %s left to a later sender", item.delivery_id)
                else:
                    log.exception("webhook delivery %s could not be settled", item.delivery_id)
            finally:
                with self._sending_lock:
                    self._sending[item.project_id] -= 1
                    if not self._sending[item.project_id]:
                        del self._sending[item.project_id]
                self._slots.release()
                # A retry may now be due sooner than the poller planned to look again.
                self._wake.set()

    def _idle_wait(self) -> float:
        try:
            due = self.store.next_webhook_time()
        except Exception:
            return POLL_SECONDS
        if due is None:
            return POLL_SECONDS
        return max(0.01, min(POLL_SECONDS, due - time.time()))

    # -- waiting -----------------------------------------------------------------------

    def wait(self, project_id: str | None, timeout: float | None) -> None:
        """Block until no async delivery (of ``project_id``) is queued or in flight;
        without sender threads, send them in the calling thread."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            counts = self.store.webhook_outbox_counts(project_id)
            if counts["queued"] + counts["running"] == 0:
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise ProcessingError(
                    f"timed out after {timeout:.1f}s waiting for async webhook deliveries "
                    f"({counts['queued']} queued, {counts['running']} in flight)"
                )
            if self.running or not self.run_once():
                time.sleep(0.02)
