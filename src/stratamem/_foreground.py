"""Recall first: background work of this process steps aside while a recall runs.

A recall is what a caller (a user, an LLM call) is waiting for; the write pipeline and the
capture writer are not. In one process they share the GIL, so a pipeline thread running
Python while a recall runs makes every GIL hand-off of the recall wait (up to the switch
interval). Background threads call :meth:`Foreground.pause` at safe points between their
steps, holding no lock or transaction, and wait there for the recalls already running.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["PAUSE_SECONDS", "Foreground"]

# One pause waits at most this long: a capture recall takes 10-40 ms; a slower recall (or
# a stuck one) must not hold the pipeline up for longer than this at each safe point.
PAUSE_SECONDS = 0.05


class Foreground:
    """Counts the recalls running now; lets background work wait for them, boundedly."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._next = 0  # ticket of the next recall to start
        self._running: set[int] = set()
        # Pauses that waited, and their seconds in total (for tests and diagnostics).
        self.paused = 0
        self.waited = 0.0

    @contextmanager
    def hold(self) -> Iterator[None]:
        """The calling thread runs a recall for the length of the block."""
        with self._cond:
            ticket = self._next
            self._next += 1
            self._running.add(ticket)
        try:
            yield
        finally:
            with self._cond:
                self._running.discard(ticket)
                self._cond.notify_all()

    @property
    def busy(self) -> bool:
        return bool(self._running)

    def pause(self, timeout: float = PAUSE_SECONDS) -> float:
        """Wait until the recalls running now have ended, at most ``timeout`` seconds;
        returns the seconds waited. Recalls that start meanwhile do not extend the wait, so
        a steady stream of them cannot starve the caller."""
        if not self._running:  # the common case, without taking the lock
            return 0.0
        start = time.perf_counter()
        with self._cond:
            horizon = self._next
            if not any(t < horizon for t in self._running):
                return 0.0
            self.paused += 1
            self._cond.wait_for(
                lambda: not any(t < horizon for t in self._running), timeout=timeout
            )
            waited = time.perf_counter() - start
            self.waited += waited
        return waited
