"""Background threads at a lower CPU priority than the application's own (Linux).

On Linux niceness belongs to each thread, and a new thread (onnxruntime's pool threads
included) inherits its creator's. A dedicated background thread lowers itself once, when
it starts: when the cores are busy, the application's threads (a recall that an LLM call
waits for, the call itself) then run first and the background work takes what they leave
idle. On a 2-core machine a busy pipeline otherwise added ~2 ms to every captured call
(docs/benchmarks.md). Elsewhere this is a no-op: macOS and Windows have no per-thread
niceness that a process can set this way. Never applied to a caller's thread: a thread
cannot take its priority back without privileges.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import TypeVar

__all__ = ["in_lowered_thread", "lower_this_thread"]

log = logging.getLogger("stratamem")

_T = TypeVar("_T")

_LOWEST = 19  # the weakest niceness Linux has


def lower_this_thread(steps: int) -> bool:
    """Make the calling thread ``steps`` nicer than the process's main thread (at most 19),
    unless it already is: a lowered thread starting another does not lower it twice. True
    when the thread runs at that priority (or lower)."""
    if steps <= 0 or not sys.platform.startswith("linux"):
        return False
    tid = threading.get_native_id()
    try:
        # PRIO_PROCESS with the pid reads the main thread's niceness on Linux.
        target = min(_LOWEST, os.getpriority(os.PRIO_PROCESS, os.getpid()) + steps)
        if os.getpriority(os.PRIO_PROCESS, tid) < target:
            os.setpriority(os.PRIO_PROCESS, tid, target)
    except OSError as exc:  # a sandbox may forbid it: the work still runs, at full priority
        log.debug("stratamem: could not lower a background thread's priority: %s", exc)
        return False
    return True


def in_lowered_thread(fn: Callable[[], _T], steps: int, name: str) -> _T:
    """``fn()`` run in a new thread lowered by ``steps`` and waited for: the threads it
    creates (onnxruntime's pools) inherit that priority, and the caller keeps its own."""
    if steps <= 0 or not sys.platform.startswith("linux"):
        return fn()
    values: list[_T] = []
    errors: list[BaseException] = []

    def run() -> None:
        lower_this_thread(steps)
        try:
            values.append(fn())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return values[0]
