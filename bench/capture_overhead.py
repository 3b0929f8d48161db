"""Capture overhead: what ``mem.llm.register(client)`` adds to each LLM call.

The same loopback fake OpenAI server (``tests/fakes/openai_server.py``, on 127.0.0.1)
answers a plain ``openai.OpenAI`` client and a registered one; calls alternate between the
two so that drift on the machine hits both alike. Reported per call: wall time of each
client, and the *added* time (registered minus plain, per pair, then p50/p95) and the ratio
of medians. Nothing is asserted; targets are printed with PASS/MISS.

* recall off (``capture_recall=False``): attribution, the request copy and the background
  hand-off only. Target: added p50 <= 1 ms.
* recall on, for a user holding ``--memories`` messages processed by the offline pipeline
  (facts, summaries, topics) with the local embedder: recall runs before every call
  (query embedding, hybrid search, formatted_context). Target: added p50 <= 10 ms.
* streams (recall off): time to the first chunk with ``stream=True``. Target: added
  p50 <= 1 ms.
* recall alone, for reference (no target): the capture recall (``get_memory`` with the
  capture config) and the query embedding by themselves, once the pipeline is idle. During
  the pairs every captured exchange also goes through the write pipeline in this process,
  on the same cores, beside the next calls' recall.
* recall on again, from the same 1,000 memories, with the captured exchanges processed by
  a ``stratamem worker`` process on the same file (the application's ``Memory`` has
  ``workers=0``), as docs/capture.md describes (no target of its own).
* with ``--model-ms MS``: recall on again, from the same 1,000 memories, with the fake
  model answering each call after MS milliseconds, as a real one does (``--model-calls``
  pairs): the background work of one exchange then runs while the next call waits for
  its model, not beside its recall (no target of its own: the target is judged on the
  instant fake above).

Each figure also counts the registered calls whose recall passed its bound (they went out
without memory) and the garbage collections over 10 ms during its pairs (a full pass stops
every thread; see docs/capture.md, "Garbage collection pauses").

Questions are LoCoMo questions (shuffled, fixed seed), the same one for both calls of a
pair; the recall user's messages are the first ``--memories`` LoCoMo turns, and the fake
model's answers the LoCoMo turns after them. The fake
answers at once, so the figures are the client-side cost alone; a real model's
latency (hundreds of ms) only dilutes the ratio.

If the ``memori`` package is installed (``pip install memori``; not a dependency), Memori's
capture runs against the same server and is printed beside ours: BYODB mode on a SQLite
file, no attribution, so capture without recall or augmentation (those need Memori's cloud
or a model download); its cloud and telemetry addresses point at a closed port on
127.0.0.1. See ``_memori_pairs``.

    python bench/capture_overhead.py              # 300 pairs each, 1,000 memories (~1 min)
    python bench/capture_overhead.py --calls 1000 --memories 1000 --json
    python bench/capture_overhead.py --model-ms 200    # plus 100 pairs at 200 ms (~1 min more)
    python bench/capture_overhead.py --tracing ab      # plus tracing absent/off/on, alternated

``--tracing on`` runs everything with OpenTelemetry tracing on (the SDK with an in-memory
exporter); ``--tracing ab`` adds a figure: registered calls with recall on, in rounds
(``--rounds``) that alternate tracing absent (as without opentelemetry-api), off (the API,
no provider) and on, and the median of each mode's p50s.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import io
import itertools
import logging
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import openai

from _common import (
    emit_json,
    engine_version,
    format_ab,
    format_summary,
    locomo_questions,
    locomo_turns,
    machine_info,
    other_load,
    summarize,
    tracing,
    tracing_ab,
    verdict,
)
from fakes.openai_server import FakeOpenAIServer
from stratamem import Memory
from stratamem.embed import make_embedder

# Varied questions, as real traffic has: one question asked N times would make every
# captured exchange an exact full-text match for the next recall.
QUESTIONS = locomo_questions(2000, seed=7)


def _client(server: FakeOpenAIServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)


def _call(client: Any, stream: bool, i: int = 0) -> float:
    """Seconds to the complete answer, or to the first chunk of a stream."""
    question = QUESTIONS[i % len(QUESTIONS)]
    t0 = time.perf_counter()
    if stream:
        it = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": question}], stream=True
        )
        next(iter(it))
        elapsed = time.perf_counter() - t0
        for _ in it:
            pass
        return elapsed
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": question}])
    return time.perf_counter() - t0


def _pairs(
    plain: Any,
    captured: Any,
    mem: Memory | None,
    n: int,
    stream: bool,
    scope: Callable[[], AbstractContextManager[Any]] | None = None,
) -> dict[str, Any]:
    """``n`` pairs of calls; each registered call runs in ``scope()`` (default: stratamem's
    scope of the bench user)."""
    if scope is None:
        assert mem is not None
        scope = partial(mem.scope, user_id="bench", session_id="bench")
    for i in range(20):  # warm both paths (connections, recall caches, model)
        _call(plain, stream, i)
        with scope():
            _call(captured, stream, i)
    base: list[float] = []
    wrapped: list[float] = []
    with other_load() as load, _recall_timeouts() as timeouts, _gc_pauses() as pauses:
        for i in range(n):
            order = (0, 1) if i % 2 == 0 else (1, 0)
            q = 20 + i  # both clients ask the same question of the pair
            for which in order:
                if which == 0:
                    base.append(_call(plain, stream, q))
                else:
                    with scope():
                        wrapped.append(_call(captured, stream, q))
    if mem is not None:
        assert mem.llm.flush(60)
    added = np.asarray(wrapped) - np.asarray(base)
    return {
        "plain": summarize(base),
        "registered": summarize(wrapped),
        "added_p50_ms": float(np.percentile(added, 50) * 1000),
        "added_p95_ms": float(np.percentile(added, 95) * 1000),
        "ratio": float(np.median(wrapped) / np.median(base)),
        "other_load": load[0],
        "recall_timeouts": len(timeouts),
        "gc_pauses_ms": [round(p * 1000, 1) for p in pauses],
    }


class _Counter(logging.Handler):
    def __init__(self, needle: str) -> None:
        super().__init__(logging.WARNING)
        self.needle = needle
        self.hits: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if self.needle in record.getMessage():
            self.hits.append(record.getMessage())


@contextlib.contextmanager
def _recall_timeouts() -> Iterator[list[str]]:
    """Registered calls whose recall passed its bound (they went out without memory)."""
    counter = _Counter("recall took longer")
    logger = logging.getLogger("stratamem.capture")
    logger.addHandler(counter)
    try:
        yield counter.hits
    finally:
        logger.removeHandler(counter)


@contextlib.contextmanager
def _gc_pauses(longer_than: float = 0.01) -> Iterator[list[float]]:
    """Seconds of each garbage collection longer than ``longer_than``: a full pass stops
    every thread, a recall included, for as long as it takes."""
    pauses: list[float] = []
    started: list[float] = [0.0]

    def watch(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        elif time.perf_counter() - started[0] > longer_than:
            pauses.append(time.perf_counter() - started[0])

    gc.callbacks.append(watch)
    try:
        yield pauses
    finally:
        gc.callbacks.remove(watch)


def _report(label: str, r: dict[str, Any], target: float | None) -> None:
    print(f"\n{label}")
    print(format_summary("plain client", r["plain"]))
    print(format_summary("registered client", r["registered"]))
    judged = (
        f"   target p50 <= {target:g} ms: "
        f"{verdict(r['added_p50_ms'], target, higher_is_better=False)}"
        if target is not None
        else ""
    )
    print(
        f"  added per call: p50 {r['added_p50_ms']:.3f} ms, p95 {r['added_p95_ms']:.3f} ms; "
        f"ratio of medians {r['ratio']:.2f}; other load {r['other_load']:.0%}{judged}"
    )
    print(
        f"  recall timeouts: {r['recall_timeouts']}; garbage collections over 10 ms "
        f"(they stop every thread): {r['gc_pauses_ms'] or 'none'}"
    )


def _recall_parts(mem: Memory, embedder: str, n: int) -> dict[str, Any]:
    """The capture recall alone (get_memory with the capture config, no HTTP, no capture
    writes) and the query embedding alone, once the pipeline is idle: what recall-on costs
    without the background work that the pairs above run beside."""
    mem.wait()
    config = {**mem.llm.recall_config, "message_recent_limit": 0}
    model = make_embedder(embedder)
    for q in QUESTIONS[:20]:
        mem.get_memory("bench", q, recall_config=config)
        model.embed([q])
    questions = QUESTIONS[20 : 20 + n]
    with other_load() as load:
        recall = [
            _seconds(lambda q=q: mem.get_memory("bench", q, recall_config=config))
            for q in questions
        ]
        embed = [_seconds(lambda q=q: model.embed([q])) for q in questions]
    out = {"get_memory": summarize(recall), "query_embedding": summarize(embed)}
    print(f"\nrecall alone (pipeline idle; other load {load[0]:.0%})")
    print(format_summary("get_memory, capture config", out["get_memory"]))
    print(format_summary("query embedding alone", out["query_embedding"]))
    return out


def _worker_process_pairs(
    plain: Any, server: FakeOpenAIServer, url: str, args: argparse.Namespace
) -> dict[str, Any]:
    """Recall on, with the captured exchanges processed by a `stratamem worker` process on
    the same file (docs/capture.md): the application's process only stores them."""
    worker = subprocess.Popen(
        [sys.executable, "-m", "stratamem", "--db", url, "--embedder", args.embedder, "worker"],
        stdout=subprocess.DEVNULL,
    )
    mem = Memory(url, embedder=args.embedder, workers=0)
    try:
        out = _pairs(plain, mem.llm.register(_client(server)), mem, args.calls, False)
        # How far the worker was behind when the calls ended (it batches what is queued).
        out["pending_at_end"] = mem.stats()["messages"]["pending"]
        t0 = time.perf_counter()
        deadline = time.monotonic() + 120
        while mem.stats()["messages"]["pending"] and time.monotonic() < deadline:
            time.sleep(0.05)
        out["drained_s"] = time.perf_counter() - t0
        print(
            f"  messages pending when the calls ended: {out['pending_at_end']}, processed "
            f"{out['drained_s']:.1f} s later"
        )
        return out
    finally:
        mem.close()
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)


def _model_latency_pairs(
    plain: Any, server: FakeOpenAIServer, tmp: str, args: argparse.Namespace
) -> dict[str, Any]:
    """Recall on, with the fake model answering after ``--model-ms`` (both clients)."""
    script = server.chat_script
    wait = args.model_ms / 1000

    def slow(body: Any) -> Any:
        time.sleep(wait)
        return script(body)

    server.chat_script = slow
    mem = Memory(f"sqlite:///{tmp}/model.db", embedder=args.embedder)
    try:
        return _pairs(plain, mem.llm.register(_client(server)), mem, args.model_calls, False)
    finally:
        mem.close()
        server.chat_script = script


def _memori_pairs(plain: Any, server: FakeOpenAIServer, tmp: str, n: int) -> dict[str, Any]:
    """Memori's capture on the same server, when the ``memori`` package is installed.

    Memori runs in its BYODB mode on a SQLite file beside stratamem's, with no attribution:
    so it captures each exchange (stored before the call returns) without recall or
    augmentation, which need Memori's cloud (its extraction runs there) or a model download.
    Its telemetry and cloud calls go to a closed port on 127.0.0.1 (refused at once) and its
    native core, which would download onnxruntime, stays off. Two runs: one Memori session
    (as an application uses it: Memori then replays the session's earlier turns into each
    request, its default) and a new session before every call (the capture alone).
    """
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    os.environ.update(
        MEMORI_API_URL_BASE=closed,
        MEMORI_COLLECTOR_URL_BASE=closed,
        MEMORI_DISABLE_RUST_CORE="1",
        MEMORI_ORT_AUTO_DOWNLOAD="0",
    )
    from memori import Memori

    out: dict[str, Any] = {}
    for label, fresh in (("one session", False), ("new session per call", True)):
        path = f"{tmp}/memori-{int(fresh)}.db"
        with contextlib.redirect_stdout(io.StringIO()):  # its schema build prints a banner
            memori = Memori(conn=lambda path=path: sqlite3.connect(path, check_same_thread=False))
            memori.config.storage.build()  # its schema
            client = _client(server)
            memori.llm.register(client)

        @contextlib.contextmanager
        def scope(memori: Any = memori, fresh: bool = fresh) -> Iterator[None]:
            if fresh:
                memori.new_session()
            yield

        out[label] = _pairs(plain, client, None, n, False, scope)
        with sqlite3.connect(path) as db:
            stored = db.execute("SELECT count(*) FROM memori_conversation_message").fetchone()[0]
        _report(f"memori {memori.config.version}, capture only, {label}", out[label], None)
        print(f"  messages stored by Memori: {stored} ({2 * (n + 20)} sent and answered)")
    return out


def _tracing_ab(mem: Memory, captured: Any, args: argparse.Namespace) -> dict[str, list[float]]:
    """Registered calls with recall on, tracing absent, off and on alternated per round."""
    n = max(args.calls // 3, 30)
    asked = itertools.count(20)

    def calls() -> list[float]:
        with mem.scope(user_id="bench", session_id="bench"):
            seconds = [_call(captured, False, next(asked)) for _ in range(n)]
        assert mem.llm.flush(60)
        return seconds

    p50s = tracing_ab(calls, args.rounds)
    print(format_ab(f"[tracing] registered call, recall on ({n} calls a round)", p50s))
    return p50s


def _seconds(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--calls", type=int, default=300, help="pairs of calls per figure")
    p.add_argument("--memories", type=int, default=1000, help="messages of the recall user")
    p.add_argument("--embedder", default="local")
    p.add_argument("--model-ms", type=float, default=0, help="also run with a model latency")
    p.add_argument("--model-calls", type=int, default=100, help="pairs of the --model-ms run")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--tracing",
        choices=("off", "on", "ab"),
        default="off",
        help="OpenTelemetry tracing: off, on (in-memory exporter), or ab (alternate them)",
    )
    p.add_argument("--rounds", type=int, default=7, help="rounds of the --tracing ab figure")
    args = p.parse_args(argv)
    traced = contextlib.ExitStack()
    traced.enter_context(tracing("on" if args.tracing == "on" else "off"))
    info = machine_info()
    print(
        f"stratamem capture overhead: {info['cpu']}, {info['cores']} cores, "
        f"engine {engine_version()}, {args.calls} pairs per figure"
    )
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp, FakeOpenAIServer() as server:
        # Varied answers, as a model gives (LoCoMo turns the recall user does not hold): one
        # answer repeated would make every captured exchange half a duplicate, and its
        # vector would be reused rather than computed.
        answers = itertools.cycle([t.text for t in locomo_turns()][args.memories :])
        server.chat_script = lambda body: next(answers)
        plain = _client(server)

        off = Memory(f"sqlite:///{tmp}/off.db", embedder="hash", capture_recall=False)
        captured = off.llm.register(_client(server))
        results["recall_off"] = _pairs(plain, captured, off, args.calls, False)
        _report(
            "recall off (attribution, request copy, background hand-off)",
            results["recall_off"],
            1.0,
        )
        results["stream_first_chunk"] = _pairs(plain, captured, off, args.calls, True)
        _report("stream, time to first chunk (recall off)", results["stream_first_chunk"], 1.0)
        off.close()

        on = Memory(f"sqlite:///{tmp}/on.db", embedder=args.embedder)
        texts = [t.text for t in locomo_turns()][: args.memories]
        s = on.sessions.create(user_id="bench", session_id="bench")
        t0 = time.perf_counter()
        for i in range(0, len(texts), 200):
            s.add_messages([{"role": "user", "content": x} for x in texts[i : i + 200]])
        on.wait()
        stats = on.stats()
        print(
            f"\nrecall user: {len(texts)} messages processed in {time.perf_counter() - t0:.1f} s "
            f"-> {stats.get('facts')} facts, {stats.get('summaries')} summaries"
        )
        on.close()
        # The same user for the runs below, before this run adds to it.
        for copy in ("apart", "model") if args.model_ms > 0 else ("apart",):
            with sqlite3.connect(f"{tmp}/on.db") as src, sqlite3.connect(f"{tmp}/{copy}.db") as dst:
                src.backup(dst)
        on = Memory(f"sqlite:///{tmp}/on.db", embedder=args.embedder)
        captured = on.llm.register(_client(server))
        results["recall_on"] = _pairs(plain, captured, on, args.calls, False)
        _report(f"recall on, user with {len(texts)} memories", results["recall_on"], 10.0)
        if args.tracing == "ab":
            results["tracing_ab_p50_ms"] = _tracing_ab(on, captured, args)
        on.close()
        # Reopened, so that the embedder has not kept the vectors of the pairs' questions
        # (the recall alone asks them again).
        on = Memory(f"sqlite:///{tmp}/on.db", embedder=args.embedder)
        results["recall_parts"] = _recall_parts(on, args.embedder, args.calls)
        on.close()

        results["recall_on_worker_process"] = _worker_process_pairs(
            plain, server, f"sqlite:///{tmp}/apart.db", args
        )
        _report(
            f"recall on, user with {len(texts)} memories, pipeline in a `stratamem worker` "
            "process (the application's Memory has workers=0)",
            results["recall_on_worker_process"],
            10.0,
        )
        if args.model_ms > 0:
            results["recall_on_model_latency"] = _model_latency_pairs(plain, server, tmp, args)
            _report(
                f"recall on, user with {len(texts)} memories, the model answering after "
                f"{args.model_ms:g} ms",
                results["recall_on_model_latency"],
                None,
            )
        if importlib.util.find_spec("memori") is not None:
            for label, r in _memori_pairs(plain, server, tmp, args.calls).items():
                results[f"memori, {label}"] = r
        else:
            print("\nmemori: not installed, so not measured here (pip install memori)")
    if args.json:
        flat = {
            k: {kk: (vv.as_dict() if hasattr(vv, "as_dict") else vv) for kk, vv in v.items()}
            for k, v in results.items()
        }
        emit_json("capture_overhead", flat)
    traced.close()


if __name__ == "__main__":
    main()
