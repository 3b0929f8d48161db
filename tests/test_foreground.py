"""Recalls go first: the pipeline and the capture writer wait for running recalls at their
safe points, boundedly, so read traffic can slow background work but never stop it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from stratamem import Memory
from stratamem._foreground import Foreground
from stratamem.embed import make_embedder
from stratamem.pipeline._pipeline import BATCH_PAUSE_SECONDS


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    return t, out


def test_pause_is_free_when_no_recall_runs() -> None:
    gate = Foreground()
    assert gate.pause(1.0) == 0.0
    assert gate.paused == 0


def test_pause_waits_for_the_running_recall_and_no_longer() -> None:
    gate = Foreground()
    release = threading.Event()

    def recall() -> None:
        with gate.hold():
            release.wait(5)

    r = threading.Thread(target=recall, daemon=True)
    r.start()
    while not gate.busy:
        time.sleep(0.001)
    waiter, waited = _in_thread(lambda: gate.pause(5.0))
    time.sleep(0.05)
    assert waiter.is_alive()  # held back by the recall
    release.set()
    waiter.join(2)
    assert not waiter.is_alive() and 0.04 <= waited[0] < 2
    assert gate.paused == 1 and not gate.busy


def test_pause_is_bounded_by_its_timeout() -> None:
    gate = Foreground()
    with gate.hold():  # a recall that never ends (stuck backend)
        t0 = time.perf_counter()
        waited = gate.pause(0.05)
        assert waited >= 0.04 and time.perf_counter() - t0 < 1.0


def test_recalls_that_start_during_a_pause_do_not_extend_it() -> None:
    """A steady stream of overlapping recalls cannot starve the background: a pause waits
    for the recalls it found running, not for their successors."""
    gate = Foreground()
    first_done = threading.Event()
    second_go = threading.Event()
    stop = threading.Event()

    def first() -> None:
        with gate.hold():
            second_go.wait(5)
            time.sleep(0.03)
        first_done.set()

    def second() -> None:
        second_go.wait(5)
        with gate.hold():  # starts after the pause began, outlives the first recall
            stop.wait(5)

    threads = [threading.Thread(target=f, daemon=True) for f in (first, second)]
    threads[0].start()
    while not gate.busy:
        time.sleep(0.001)
    waiter, waited = _in_thread(lambda: gate.pause(5.0))
    time.sleep(0.01)
    threads[1].start()
    second_go.set()
    waiter.join(2)
    try:
        assert not waiter.is_alive() and first_done.is_set()
        assert waited[0] < 1.0 and gate.busy  # the second recall still runs
    finally:
        stop.set()


class _WatchingEmbedder:
    """The hashing embedder, noting whether a recall was marked running while it embedded
    a query (one text) and whether a background batch ran while one was."""

    def __init__(self) -> None:
        self._inner = make_embedder("hash")
        self.id = self._inner.id
        self.name = "watching hash"
        self.dim = self._inner.dim
        self.gate: Foreground | None = None
        self.query_busy: list[bool] = []

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if len(texts) == 1 and self.gate is not None:
            self.query_busy.append(self.gate.busy)
        return self._inner.embed(texts)


def test_recalls_mark_themselves_running(make_memory: Callable[..., Memory]) -> None:
    emb = _WatchingEmbedder()
    mem = make_memory(embedder=emb)
    emb.gate = mem._engine.foreground
    s = mem.sessions.create(user_id="u1", session_id="s1")
    s.add_messages([{"role": "user", "content": "I moved to Berlin last May"}], sync=True)
    emb.query_busy.clear()
    mem.search("where does the user live", user_id="u1")
    s.get_memory("where does the user live")
    assert emb.query_busy == [True, True]
    assert not mem._engine.foreground.busy


def test_a_recall_that_never_ends_delays_a_batch_boundedly(
    make_memory: Callable[..., Memory],
) -> None:
    mem = make_memory()
    s = mem.sessions.create(user_id="u1", session_id="s1")
    with mem._engine.foreground.hold():  # e.g. a recall stuck on a slow backend
        t0 = time.perf_counter()
        s.add_messages([{"role": "user", "content": "I moved to Berlin last May"}])
        mem.wait(timeout=10)
        elapsed = time.perf_counter() - t0
    assert mem.facts.list(user_id="u1")
    gate = mem._engine.foreground
    assert gate.paused >= 2  # the batch waited at more than one safe point ...
    assert BATCH_PAUSE_SECONDS * 0.9 <= gate.waited <= BATCH_PAUSE_SECONDS + 0.05  # ... its budget
    assert elapsed < 5
