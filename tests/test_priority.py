"""Background work runs at a lower CPU priority than the application's threads (Linux):
the worker threads (procrastinate's job threads on PostgreSQL) and the local model's batch
threads; never a caller's own thread."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest

from stratamem import ConfigError, Memory
from stratamem._priority import lower_this_thread
from stratamem.embed import make_embedder

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="per-thread niceness is Linux's"
)


def _nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def _threads_nice() -> dict[int, int]:
    """Niceness of each thread of this process, by native id."""
    out = {}
    for task in Path("/proc/self/task").iterdir():
        stat = (task / "stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()
        out[int(task.name)] = int(fields[16])  # field 19 of stat(5), counted from 1
    return out


def _in_new_thread(fn: Callable[[], object]) -> object:
    out: list[object] = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join()
    return out[0]


class _NotingEmbedder:
    """The hashing embedder, noting the niceness of every thread that calls it."""

    def __init__(self) -> None:
        self._inner = make_embedder("hash")
        self.id = self._inner.id
        self.name = self._inner.name
        self.dim = self._inner.dim
        self.seen: list[int] = []

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.seen.append(_nice())
        return self._inner.embed(texts)


def test_a_thread_lowers_itself_by_the_steps_asked_and_no_further_than_19() -> None:
    base = _nice()
    assert _in_new_thread(lambda: (lower_this_thread(3), _nice())) == (True, min(19, base + 3))
    assert _in_new_thread(lambda: (lower_this_thread(40), _nice()))[1] == 19  # type: ignore[index]
    assert _in_new_thread(lambda: (lower_this_thread(0), _nice())) == (False, base)
    assert _nice() == base


def test_a_new_thread_inherits_its_creators_priority_and_is_not_lowered_twice() -> None:
    """A worker thread (lowered once) that starts the model's runner threads: they lower
    themselves by the same steps from the main thread's priority, so not twice."""
    base = _nice()

    def worker() -> tuple[int, object]:
        lower_this_thread(3)
        return _nice(), _in_new_thread(lambda: (_nice(), lower_this_thread(3), _nice()))

    assert _in_new_thread(worker) == (
        min(19, base + 3),
        (min(19, base + 3), True, min(19, base + 3)),
    )
    assert _nice() == base


def _pipeline_niceness(
    make_memory: Callable[..., Memory], *, sync: bool = False, **settings: object
) -> tuple[set[int], _NotingEmbedder, Memory]:
    """The niceness of the threads that embedded one processed message."""
    noting = _NotingEmbedder()
    mem = make_memory(embedder=noting, **settings)
    s = mem.sessions.create(user_id="u")
    s.add_messages([{"role": "user", "content": "I moved to Lisbon in May."}], sync=sync)
    if not sync:
        mem.wait(60)
    assert noting.seen, "the pipeline embedded nothing"
    return set(noting.seen), noting, mem


def test_background_batches_run_lowered_and_the_caller_keeps_its_priority(
    make_memory: Callable[..., Memory],
) -> None:
    base = _nice()
    seen, noting, mem = _pipeline_niceness(make_memory, worker_nice=7)
    assert seen == {min(19, base + 7)}
    noting.seen.clear()
    mem.search("Lisbon", user_id="u")  # a query: the caller's thread
    assert noting.seen == [base]
    assert _nice() == base


def test_work_done_in_the_callers_thread_is_not_lowered(
    make_memory: Callable[..., Memory],
) -> None:
    base = _nice()
    seen, _, _ = _pipeline_niceness(make_memory, sync=True, workers=0, worker_nice=7)
    assert seen == {base}
    assert _nice() == base


def test_worker_nice_0_leaves_the_workers_at_the_callers_priority(
    make_memory: Callable[..., Memory],
) -> None:
    assert _pipeline_niceness(make_memory, worker_nice=0)[0] == {_nice()}


@pytest.mark.parametrize("value", [-1, 20, "low"])
def test_worker_nice_out_of_range_is_refused(tmp_path: Path, value: object) -> None:
    with pytest.raises(ConfigError, match="worker_nice"):
        Memory(f"sqlite:///{tmp_path / 'm.db'}", embedder="hash", worker_nice=value)


def test_the_local_models_batch_threads_are_lowered() -> None:
    pytest.importorskip("onnxruntime")
    from stratamem.embed.local import LocalEmbedder

    base = _nice()
    embedder = LocalEmbedder(batch_nice=6, threads=2)
    embedder.load()
    before = set(_threads_nice())
    texts = [f"batch text number {i} about gardens" for i in range(8)]
    batch = embedder.embed(texts)  # on the runner threads, started now
    new = {tid: n for tid, n in _threads_nice().items() if tid not in before}
    assert new and set(new.values()) == {min(19, base + 6)}
    assert _nice() == base
    assert np.array_equal(batch[3], embedder.embed([texts[3]])[0])  # a query: same vector


def test_batch_nice_out_of_range_is_refused() -> None:
    pytest.importorskip("onnxruntime")
    from stratamem.embed.local import LocalEmbedder

    with pytest.raises(ConfigError, match="batch_nice"):
        LocalEmbedder(batch_nice=20)
