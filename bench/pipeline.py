"""Write-pipeline cost and throughput: LLM calls and tokens per message, messages per second.

What is real: the whole engine (store, local embedder, pipeline, worker, the `openai` SDK
talking HTTP). What is simulated: the model. A scripted model (tests/fakes/memory_model.py)
behind the loopback fake OpenAI server answers the real prompts with deterministic JSON,
after a fixed `--latency` per call to stand in for a hosted model. Prompt tokens are the
fake server's estimate (characters / 4) of the prompts stratamem really sent; completion
tokens the same estimate of the scripted answers (shorter than a real model's).

Two ingestion patterns, both on one LoCoMo conversation per user:
- import: every session added with ``sync=False``, then ``wait()`` (batches merge);
- live:   each session added with ``sync=True`` before the next (a chat app, one session at
          a time).
The same runs in offline mode (``llm=none``) measure the heuristic pipeline.

    python bench/pipeline.py            # one conversation, latency 0.5 s per call
    python bench/pipeline.py --quick    # first 120 turns
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from _common import REPO_ROOT, emit_json, locomo_turns, machine_info

sys.path.insert(0, str(REPO_ROOT / "tests"))

from fakes.memory_model import MemoryModel
from fakes.openai_server import FakeOpenAIServer
from stratamem import Memory
from stratamem.embed import make_embedder

TARGET_CALLS_PER_MESSAGE = 0.2


def _sessions(turns: list[Any]) -> list[list[dict[str, Any]]]:
    grouped: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for t in turns:
        grouped[t.session].append(t.as_message())
    return [grouped[k] for k in sorted(grouped)]


def run(mode: str, pattern: str, turns: list[Any], embedder: Any, latency: float) -> dict[str, Any]:
    model = MemoryModel()

    def slow_model(body: dict[str, Any]) -> str:
        time.sleep(latency)
        return model(body)

    with tempfile.TemporaryDirectory() as tmp, FakeOpenAIServer() as server:
        server.chat_script = slow_model
        llm = (
            {}
            if mode == "offline"
            else {
                "llm": "openai:simulated",
                "llm_base_url": server.base_url,
                "llm_api_key": "k",
            }
        )
        mem = Memory(f"sqlite:///{Path(tmp) / 'bench.db'}", embedder=embedder, **llm)
        session = mem.sessions.create(user_id="bench-user", session_id="bench")
        started = time.perf_counter()
        for chunk in _sessions(turns):
            session.add_messages(chunk, sync=(pattern == "live"))
        mem.wait()
        elapsed = time.perf_counter() - started
        stats = mem.stats()
        mem.close()
    n = len(turns)
    usage = stats["llm_usage"].values()
    calls = sum(u["calls"] for u in usage)
    prompt = sum(u["prompt_tokens"] for u in usage)
    completion = sum(u["completion_tokens"] for u in usage)
    return {
        "mode": mode,
        "pattern": pattern,
        "messages": n,
        "seconds": round(elapsed, 2),
        "messages_per_second": round(n / elapsed, 1),
        "llm_calls": calls,
        "calls_per_message": round(calls / n, 3),
        "prompt_tokens_per_message": round(prompt / n, 1),
        "completion_tokens_per_message": round(completion / n, 1),
        "facts": stats["facts"],
        "summaries": sum(stats["summaries"].values()),
        "topics": stats["topics"],
        "failed": stats["messages"]["failed"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversation", default="conv-26", help="LoCoMo sample id")
    parser.add_argument("--latency", type=float, default=0.5, help="simulated s per LLM call")
    parser.add_argument("--embedder", default="local")
    parser.add_argument("--quick", action="store_true", help="first 120 turns only")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    turns = [t for t in locomo_turns() if t.sample_id == args.conversation]
    if not turns:
        raise SystemExit(f"no LoCoMo conversation {args.conversation!r}")
    if args.quick:
        turns = turns[:120]
    embedder = make_embedder(args.embedder)
    print(
        f"conversation {args.conversation}: {len(turns)} turns; embedder {embedder.name}; "
        f"simulated model latency {args.latency:.2f} s per call"
    )
    print(f"machine: {machine_info()}")
    results = []
    for mode in ("llm", "offline"):
        for pattern in ("import", "live"):
            r = run(mode, pattern, turns, embedder, args.latency)
            results.append(r)
            verdict = ""
            if mode == "llm":
                ok = r["calls_per_message"] <= TARGET_CALLS_PER_MESSAGE
                verdict = f"  [{'PASS' if ok else 'MISS'} <= {TARGET_CALLS_PER_MESSAGE}]"
            print(
                f"{mode:>7} {pattern:>6}: {r['messages_per_second']:7.1f} msg/s  "
                f"{r['calls_per_message']:.3f} calls/msg{verdict}  "
                f"{r['prompt_tokens_per_message']:7.1f} prompt + "
                f"{r['completion_tokens_per_message']:6.1f} completion tokens/msg  "
                f"-> {r['facts']} facts, {r['summaries']} summaries, {r['topics']} topics"
            )
    if args.json:
        emit_json("pipeline", {"conversation": args.conversation, "results": results})


if __name__ == "__main__":
    main()
