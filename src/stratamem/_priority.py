"""Background threads at a lower CPU priority than the application's own (Linux).

On Linux niceness belongs to each thread, and a new thread inherits its creator's. A
dedicated background thread lowers itself once, when it starts: when the cores are busy, the
application's threads (a recall that an LLM call waits for, the call itself) then run first
and the background work takes what they leave idle. On a 2-core machine a busy pipeline
otherwise added ~2 ms to every captured call (docs/benchmarks.md). Elsewhere this is a no-op:
macOS and Windows have no per-thread niceness that a process can set this way. Never applied
to a caller's thread: a thread cannot take its priority back without privileges.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

__all__ = ["lower_this_thread"]

log = logging.getLogger("stratamem")

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
