"""Write-path benchmark: ``add_messages`` accept latency and end-to-end import throughput.

What is measured (all on fresh SQLite files in a temporary directory):

1. Accept latency: ``--n`` calls of ``add_messages(session_id, [one message], sync=False)``
   (LoCoMo turn texts, cycled), each timed on its own, after 20 untimed warm-up calls.
   Run twice: with the default settings (one background worker thread embedding with the
   configured embedder while the calls arrive, as in production) and with ``workers=0``
   (nothing runs in the background: the pure write path, validation + one SQLite
   transaction). The first run then drains its backlog (``mem.wait()``), also timed.
2. Import throughput: every LoCoMo turn (about 3,400 messages, 6 users) written to a
   temporary JSONL file and imported with ``stratamem.cli.import_jsonl`` exactly as
   ``stratamem import FILE`` does (batches of 256, then wait until every message is
   processed: embedded, and run through the write pipeline, whose facts and summaries are
   embedded too). The wall time runs from opening ``Memory`` to ``close()`` (model load
   included, as a user of the CLI sees it). Reported beside it: the embedder alone on the
   same message texts in batches of 256, measured right before and right after the import
   (the ceiling for embedding the messages alone; two figures, because on a shared machine
   they differ), and the same import with the ``hash`` embedder (the cost of everything
   but the model). Each figure carries the share of CPU other processes used meanwhile.

Targets: accept p50 <= 2 ms; import >= 200 messages/s on 2 cores. Nothing here is
asserted; the script prints figures and PASS/MISS against the targets.

    python bench/ingest.py              # full run (~3 minutes on 2 cores)
    python bench/ingest.py --quick      # smoke run (seconds)
    python bench/ingest.py --json       # also print one JSON line of results
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from _common import (
    Turn,
    emit_json,
    format_summary,
    locomo_turns,
    machine_info,
    other_load,
    stopwatch,
    summarize,
    verdict,
)
from stratamem import Memory
from stratamem.cli import import_jsonl
from stratamem.embed import make_embedder

ACCEPT_P50_TARGET_MS = 2.0
IMPORT_TARGET_MSGS_PER_S = 200.0
WARMUP_CALLS = 20
IMPORT_BATCH = 256  # `stratamem import` default --batch-size, and the worker's batch size


def _accept_latency(
    texts: Sequence[str],
    n: int,
    *,
    embedder: str,
    workers: int | None,
    drain: bool,
    profile: bool = False,
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="stratamem-bench-") as tmp:
        mem = Memory(
            f"sqlite:///{os.path.join(tmp, 'accept.db')}", embedder=embedder, workers=workers
        )
        try:
            session = mem.sessions.create(user_id="bench-user", session_id="bench-session")
            for i in range(WARMUP_CALLS):
                mem.add_messages(session.id, [{"role": "user", "content": f"warm-up {i}"}])
            profiler = cProfile.Profile() if profile else None
            samples: list[float] = []
            started = time.perf_counter()
            if profiler is not None:
                profiler.enable()
            for i in range(n):
                message = {
                    "role": "user" if i % 2 == 0 else "assistant",
                    "content": texts[i % len(texts)],
                }
                t0 = time.perf_counter()
                mem.add_messages(session.id, [message], sync=False)
                samples.append(time.perf_counter() - t0)
            if profiler is not None:
                profiler.disable()
            accept_wall = time.perf_counter() - started
            drained = None
            if drain:
                with stopwatch() as t:
                    mem.wait()
                drained = t[0]
        finally:
            mem.close()
    quarter = max(1, n // 4)
    return {
        "profile": profiler,
        "quarters_p50": [summarize(samples[i : i + quarter]).p50 for i in range(0, n, quarter)],
        "summary": summarize(samples),
        "calls_per_s": n / accept_wall,
        "drain_s": drained,
    }


class _Recorder:
    """Wraps a Memory for import_jsonl to note when the last batch was accepted."""

    def __init__(self, mem: Memory) -> None:
        self._mem = mem
        self.last_accept = 0.0

    def add_messages(self, session_id: str, messages: Any, **kwargs: Any) -> Any:
        result = self._mem.add_messages(session_id, messages, **kwargs)
        self.last_accept = time.perf_counter()
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._mem, name)


def _write_jsonl(turns: Sequence[Turn], path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for t in turns:
            line = {
                "user_id": t.sample_id,
                "session_id": f"{t.sample_id}-s{t.session}",
                **t.as_message(),
            }
            f.write(json.dumps(line, ensure_ascii=False) + "\n")


def _import(turns: Sequence[Turn], *, embedder: str, workers: int | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="stratamem-bench-") as tmp:
        path = os.path.join(tmp, "locomo.jsonl")
        _write_jsonl(turns, path)
        started = time.perf_counter()
        mem = Memory(
            f"sqlite:///{os.path.join(tmp, 'import.db')}", embedder=embedder, workers=workers
        )
        try:
            opened = time.perf_counter()
            recorder = _Recorder(mem)
            counts = import_jsonl(
                recorder,
                path,
                user_id=None,
                session_id=None,
                batch_size=IMPORT_BATCH,
                wait=True,
                progress=False,
            )
            processed = time.perf_counter()
            stats = mem.stats()
        finally:
            mem.close()
        total = time.perf_counter() - started
    new = counts["messages"] - counts["duplicates"]
    if stats["messages"]["processed"] != new:
        raise SystemExit(f"import did not process everything: {stats}")
    summaries = stats.get("summaries") or {}
    return {
        "messages": new,
        "wall_s": total,
        "msgs_per_s": new / total,
        "open_s": opened - started,
        "accepted_s": recorder.last_accept - opened,
        "processed_s": processed - opened,
        "embedder": stats["embedder"],
        # What the pipeline derived: each fact and summary is embedded too.
        "vectors": sum(stats["vectors"].values()),
        "facts": stats.get("facts"),
        "summaries": sum(summaries.values()) if isinstance(summaries, dict) else summaries,
        "topics": stats.get("topics"),
    }


def _embedder_only(texts: Sequence[str], spec: str) -> dict[str, Any]:
    embedder = make_embedder(spec)
    with stopwatch() as t_load:
        embedder.embed(["warm up the model"])
    with stopwatch() as t:
        for i in range(0, len(texts), IMPORT_BATCH):
            embedder.embed(texts[i : i + IMPORT_BATCH])
    return {
        "messages": len(texts),
        "seconds": t[0],
        "msgs_per_s": len(texts) / t[0],
        "load_s": t_load[0],
    }


def _pct(share: float) -> str:
    return "n/a" if share != share else f"{100 * share:.0f}%"


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=2000, help="accept-latency calls (default 2000)")
    p.add_argument("--embedder", default="local", help="embedder of the main runs (default local)")
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="worker threads for the import (default: settings)",
    )
    p.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    p.add_argument("--profile", action="store_true", help="cProfile the accept loop (workers=0)")
    p.add_argument("--json", action="store_true", help="also print a JSON line of results")
    args = p.parse_args(argv)

    n = 200 if args.quick else args.n
    turns = locomo_turns()
    if args.quick:
        turns = turns[:400]
    texts = [t.text for t in turns]
    info = machine_info()
    print(
        f"stratamem ingest benchmark: {info['cpu']}, {info['cores']} cores, "
        f"{info['ram_gib']} GiB RAM, SIMD {info['simd']}, engine {info['engine']}, "
        f"load {info.get('loadavg_1m_at_start')}"
    )
    results: dict[str, Any] = {"machine": info, "quick": args.quick}

    print(f"\n[1] add_messages accept latency: {n} calls, one message each, sync=False")
    with other_load() as noise_bg:
        bg = _accept_latency(texts, n, embedder=args.embedder, workers=None, drain=True)
    with other_load() as noise_fg:
        fg = _accept_latency(
            texts, n, embedder=args.embedder, workers=0, drain=False, profile=args.profile
        )
    print(format_summary(f"default settings (1 worker, {args.embedder})", bg["summary"]))
    print(format_summary("workers=0 (pure write path)", fg["summary"]))
    for label, r in (("default settings", bg), ("workers=0", fg)):
        parts = ", ".join(f"{v:.2f}" for v in r["quarters_p50"])
        print(f"    p50 of each quarter of the calls, {label}: {parts} ms")
    p50 = bg["summary"].p50
    print(
        f"  -> accept p50 {p50:.3f} ms vs target <= {ACCEPT_P50_TARGET_MS} ms: "
        f"{verdict(p50, ACCEPT_P50_TARGET_MS, higher_is_better=False)}"
        f"  ({bg['calls_per_s']:.0f} calls/s; backlog drained in {bg['drain_s']:.1f} s)"
    )
    print(
        f"  other processes used {_pct(noise_bg[0])} / {_pct(noise_fg[0])} of the CPU "
        "during these two runs"
    )
    if fg["profile"] is not None:
        print("\n  cProfile of the workers=0 accept loop, top 15 by cumulative time:")
        pstats.Stats(fg["profile"]).sort_stats("cumulative").print_stats(15)
    results["accept"] = {
        "n": n,
        "background": bg["summary"].as_dict(),
        "background_calls_per_s": round(bg["calls_per_s"], 1),
        "background_drain_s": round(bg["drain_s"], 2),
        "background_quarters_p50": [round(v, 3) for v in bg["quarters_p50"]],
        "workers0": fg["summary"].as_dict(),
        "workers0_quarters_p50": [round(v, 3) for v in fg["quarters_p50"]],
        "other_load": [round(noise_bg[0], 3), round(noise_fg[0], 3)],
        "target_p50_ms": ACCEPT_P50_TARGET_MS,
        "verdict": verdict(p50, ACCEPT_P50_TARGET_MS, higher_is_better=False),
    }

    print(f"\n[2] import throughput: {len(turns)} LoCoMo turns via import_jsonl (CLI path)")
    # The ceiling is measured right before and right after the import, so that a machine
    # shared with other work shows up as two different ceilings rather than a wrong ratio.
    with other_load() as noise_c1:
        before = _embedder_only(texts, args.embedder)
    with other_load() as noise_imp:
        main_run = _import(turns, embedder=args.embedder, workers=args.workers)
    with other_load() as noise_c2:
        after = _embedder_only(texts, args.embedder)
    hashed = (
        _import(turns, embedder="hash", workers=args.workers) if args.embedder != "hash" else None
    )

    def line(label: str, r: dict[str, Any], noise: float) -> None:
        print(
            f"  {label:<34} {r['msgs_per_s']:7.1f} msg/s  ({r['messages']} in {r['wall_s']:.1f} s;"
            f" open {r['open_s']:.2f} s, all accepted at {r['accepted_s']:.1f} s,"
            f" all processed at {r['processed_s']:.1f} s; other load {_pct(noise)})"
        )
        print(
            f"  {'':<34} derived: {r['facts']} facts, {r['summaries']} summaries, "
            f"{r['topics']} topics; {r['vectors']} vectors "
            f"({r['vectors'] / max(1, r['messages']):.2f} per message)"
        )

    def ceiling_line(label: str, c: dict[str, Any], noise: float) -> None:
        print(
            f"  {label:<34} {c['msgs_per_s']:7.1f} msg/s  ({c['messages']} in {c['seconds']:.1f}"
            f" s, batches of {IMPORT_BATCH}; first call incl. model load {c['load_s']:.2f} s;"
            f" other load {_pct(noise)})"
        )

    ceiling_line("embedder alone, before import", before, noise_c1[0])
    line(f"import, {args.embedder} embedder", main_run, noise_imp[0])
    ceiling_line("embedder alone, after import", after, noise_c2[0])
    if hashed is not None:
        line("import, hash embedder", hashed, float("nan"))
    rate = main_run["msgs_per_s"]
    ceiling = max(before["msgs_per_s"], after["msgs_per_s"])
    print(
        f"  -> import {rate:.1f} msg/s vs target >= {IMPORT_TARGET_MSGS_PER_S:.0f}: "
        f"{verdict(rate, IMPORT_TARGET_MSGS_PER_S, higher_is_better=True)}"
        f"  (the embedder alone reaches {ceiling:.1f} msg/s on message texts; the pipeline "
        f"also embeds facts and summaries)"
    )
    results["import"] = {
        "messages": main_run["messages"],
        "embedder": args.embedder,
        "msgs_per_s": round(rate, 1),
        "wall_s": round(main_run["wall_s"], 2),
        "accepted_s": round(main_run["accepted_s"], 2),
        "vectors": main_run["vectors"],
        "facts": main_run["facts"],
        "summaries": main_run["summaries"],
        "embedder_only_msgs_per_s": [
            round(before["msgs_per_s"], 1),
            round(after["msgs_per_s"], 1),
        ],
        "hash_msgs_per_s": None if hashed is None else round(hashed["msgs_per_s"], 1),
        "other_load": [round(noise_c1[0], 3), round(noise_imp[0], 3), round(noise_c2[0], 3)],
        "target_msgs_per_s": IMPORT_TARGET_MSGS_PER_S,
        "verdict": verdict(rate, IMPORT_TARGET_MSGS_PER_S, higher_is_better=True),
    }
    if args.json:
        emit_json("ingest", results)


if __name__ == "__main__":
    main()
