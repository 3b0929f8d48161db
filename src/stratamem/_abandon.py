"""Work its caller may stop waiting for: the recall of a captured call that went on without
its memory.

The caller runs the work under a flag (``abandonable``) and sets the flag when it gives up;
the work calls ``check()`` between its steps and stops with ``Abandoned`` once the flag is
set, rather than running to the end for nobody. Under load a late recall ran on for
hundreds of milliseconds holding one of the few recall threads and the pipeline's
foreground gate while the recalls of later calls waited behind it. Outside ``abandonable``
``check()`` does nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = ["Abandoned", "abandonable", "check"]

_flag: ContextVar[threading.Event | None] = ContextVar("stratamem_abandoned", default=None)


class Abandoned(Exception):
    """The caller stopped waiting for this work."""


@contextmanager
def abandonable(flag: threading.Event) -> Iterator[None]:
    """Run the block as work that stops at its next ``check()`` once ``flag`` is set."""
    token = _flag.set(flag)
    try:
        yield
    finally:
        _flag.reset(token)


def check() -> None:
    """Raise ``Abandoned`` if the caller of the work running now has given up on it."""
    flag = _flag.get()
    if flag is not None and flag.is_set():
        raise Abandoned
