"""MCP latency: ``search_memories`` and ``get_context`` over stdio and streamable HTTP, beside
the same work in process.

One user holds the longest LoCoMo conversation of the data (680 turns as messages, processed
into facts, summaries and topics by the offline pipeline, the bundled embedder by default). The same
LoCoMo questions are then asked four ways, each timed per call on the caller's side:

* ``in process``: ``mem.search(q, user_id=..., limit=10)`` and ``mem.get_memory(session, q)``
  on a ``Memory`` in this process: the engine's own cost;
* ``tools in process``: the MCP tools' own work (``MemoryTools``: the search plus each hit's
  source messages, the context), still without any protocol;
* ``stdio``: the official SDK's client calling a real ``stratamem mcp`` subprocess;
* ``http``: the SDK's client calling ``/mcp/users/{user_id}`` on a real ``stratamem serve``
  (API key, stateless streamable HTTP, JSON responses).

The differences are the protocol's cost: JSON-RPC framing, pydantic models on both sides,
the pipe or the HTTP round trip and the server's per-request setup. Nothing is asserted.

    python bench/mcp.py                      # local embedder, 100 questions
    python bench/mcp.py --embedder hash --questions 30 --json
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from _common import (
    REPO_ROOT,
    Turn,
    emit_json,
    format_summary,
    locomo_questions,
    locomo_turns,
    machine_info,
    other_load,
    summarize,
)

# This script has the SDK's name: with its folder first on sys.path, `import mcp` would find
# the script. The folder leaves sys.path once _common is imported.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(REPO_ROOT / "tests"))  # the suite's real `stratamem serve` process

from server_proc import ServerProcess  # noqa: E402
from stratamem import Memory  # noqa: E402
from stratamem.mcp import MemoryTools  # noqa: E402
from stratamem.mcp._tools import default_session  # noqa: E402

USER = "locomo-user"
_CLI = ("-m", "stratamem")


def _load(db: str, embedder: str) -> int:
    """The longest LoCoMo conversation as the user's messages, processed; returns the count."""
    by_sample: dict[str, list[Turn]] = {}
    for t in locomo_turns():
        by_sample.setdefault(t.sample_id, []).append(t)
    turns = max(by_sample.values(), key=len)
    with Memory(db, embedder=embedder) as mem:
        by_session: dict[int, list[dict[str, Any]]] = {}
        for t in turns:
            by_session.setdefault(t.session, []).append(t.as_message())
        for n, messages in sorted(by_session.items()):
            mem.sessions.create(USER, session_id=f"locomo-{n}")
            mem.add_messages(f"locomo-{n}", messages)
        mem.sessions.create(USER, session_id=default_session(USER))
        mem.wait(timeout=1800)
        return len(turns)


def _time_sync(calls: list[Callable[[], Any]], warmup: int) -> list[float]:
    for call in calls[:warmup]:
        call()
    out = []
    for call in calls:
        start = time.perf_counter()
        call()
        out.append(time.perf_counter() - start)
    return out


async def _time_async(calls: list[Callable[[], Awaitable[Any]]], warmup: int) -> list[float]:
    for call in calls[:warmup]:
        await call()
    out = []
    for call in calls:
        start = time.perf_counter()
        result = await call()
        out.append(time.perf_counter() - start)
        if getattr(result, "is_error", False):
            raise SystemExit(f"tool error: {result.content}")
    return out


async def _over_mcp(client: Any, questions: list[str], warmup: int) -> dict[str, list[float]]:
    async with client as c:
        search = [
            (lambda q=q: c.call_tool("search_memories", {"query": q, "limit": 10}))
            for q in questions
        ]
        context = [(lambda q=q: c.call_tool("get_context", {"query": q})) for q in questions]
        return {
            "search_memories": await _time_async(search, warmup),
            "get_context": await _time_async(context, warmup),
        }


def _env() -> dict[str, str]:
    # The developer's STRATAMEM_* variables must not change what is measured (as server_proc).
    return {k: v for k, v in os.environ.items() if not k.startswith("STRATAMEM_")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--embedder", default="local")
    p.add_argument("--questions", type=int, default=100)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()

    import httpx2
    from mcp import Client, StdioServerParameters
    from mcp.client.streamable_http import streamable_http_client

    questions = locomo_questions(args.questions, seed=1)
    figures: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        db = f"sqlite:///{Path(tmp) / 'memory.db'}"
        started = time.perf_counter()
        count = _load(db, args.embedder)
        print(f"user: {count} LoCoMo messages processed in {time.perf_counter() - started:.1f} s")
        print(f"machine: {machine_info()}")
        timings: dict[str, dict[str, list[float]]] = {}

        with Memory(db, embedder=args.embedder, workers=0) as mem, other_load() as load:
            session = default_session(USER)
            tools = MemoryTools(mem, USER)
            timings["in process"] = {
                "search_memories": _time_sync(
                    [(lambda q=q: mem.search(q, user_id=USER, limit=10)) for q in questions],
                    args.warmup,
                ),
                "get_context": _time_sync(
                    [(lambda q=q: mem.get_memory(session, q)) for q in questions], args.warmup
                ),
            }
            timings["tools in process"] = {
                "search_memories": _time_sync(
                    [(lambda q=q: tools.search_memories(q, limit=10)) for q in questions],
                    args.warmup,
                ),
                "get_context": _time_sync(
                    [(lambda q=q: tools.get_context(q)) for q in questions], args.warmup
                ),
            }
        print(f"(other processes used {load[0]:.0%} of the CPU during the in-process runs)")

        stdio = StdioServerParameters(
            command=sys.executable,
            args=[
                *_CLI,
                "--embedder",
                args.embedder,
                "mcp",
                "--user-id",
                USER,
                "--database-url",
                db,
            ],
            env=_env(),
        )
        with other_load() as load:
            timings["stdio"] = asyncio.run(_over_mcp(Client(stdio), questions, args.warmup))
        print(f"(other processes used {load[0]:.0%} of the CPU during the stdio run)")

        server = ServerProcess(Path(tmp), db_url=db, embedder=args.embedder).start("--no-worker")
        try:

            async def over_http() -> dict[str, list[float]]:
                headers = {"Authorization": f"Api-Key {server.bootstrap_key()}"}
                url = f"{server.url}/mcp/users/{USER}"
                async with httpx2.AsyncClient(headers=headers, timeout=60) as http:
                    transport = streamable_http_client(url, http_client=http)
                    return await _over_mcp(Client(transport), questions, args.warmup)

            with other_load() as load:
                timings["http"] = asyncio.run(over_http())
            print(f"(other processes used {load[0]:.0%} of the CPU during the HTTP run)")
        finally:
            server.stop()

    for tool in ("search_memories", "get_context"):
        print(f"\n{tool} ({len(questions)} LoCoMo questions, after {args.warmup} warm-up calls)")
        base = summarize(timings["in process"][tool])
        for way, by_tool in timings.items():
            s = summarize(by_tool[tool])
            figures.setdefault(way, {})[tool] = s.as_dict()
            extra = "" if way == "in process" else f"   {s.p50 - base.p50:+.2f} ms p50"
            print(format_summary(way, s, width=18) + extra)
    if args.json:
        emit_json("mcp", {"messages": count, "embedder": args.embedder, "figures": figures})


if __name__ == "__main__":
    main()
