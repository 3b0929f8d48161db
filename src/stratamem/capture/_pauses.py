"""How long the garbage collector has stopped this process, in total.

A full collection holds the GIL for as long as it takes, and every Python thread waits: in a
process that imports a provider SDK (``openai`` with ``pydantic`` leaves ~93,000 tracked
objects) one pass took 45-60 ms on a 2-core machine. A recall bounded by wall time alone
would lose such a pass to its bound and the call would go out without memory, though the
call was held up by the pass all the same. :class:`Capture` waits for the recall's own
time instead: wall time minus the collector's pauses (see ``Capture._result``).
"""

from __future__ import annotations

import gc
import threading
import time
from typing import Any

__all__ = ["CollectorPauses", "collector_pauses"]


class CollectorPauses:
    """A ``gc.callbacks`` entry adding up the seconds of every collection."""

    def __init__(self) -> None:
        # (seconds of the collections that ended, start of the one running or None), one
        # tuple so that a reader always sees both halves of one moment.
        self._state: tuple[float, float | None] = (0.0, None)

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        ended, running = self._state
        if phase == "start":
            self._state = (ended, time.perf_counter())
        elif running is not None:
            self._state = (ended + time.perf_counter() - running, None)

    def seconds(self) -> float:
        """Seconds collected so far, a collection still running included: a callback is
        Python code, so a waiting thread can run between a collection's end and the
        callback that records it."""
        ended, running = self._state
        return ended if running is None else ended + time.perf_counter() - running


_installed: CollectorPauses | None = None
_lock = threading.Lock()


def collector_pauses() -> CollectorPauses:
    """The process's one tracker, installed in ``gc.callbacks`` on first use."""
    global _installed
    with _lock:
        if _installed is None or _installed not in gc.callbacks:
            _installed = CollectorPauses()
            gc.callbacks.append(_installed)
        return _installed
