"""An LLM outage, then the model back: what was accepted, processed and failed, how many calls
the dead model got, and how long processing took to catch up once it answered again.

What is real: the engine (store, queue, pipeline, the `openai` SDK over HTTP) with its
default settings (`llm_max_retries`, `outage_backoff_*`, `job_*`), one worker. What is
simulated: the model, a scripted one behind the loopback fake OpenAI server
(tests/fakes), which fails every call (`--fault`: an HTTP status, `refuse` or `hang`) for
`--outage` seconds while `--users` users keep adding a message every 10 s each.

    python bench/llm_outage.py                     # 10 minutes of 503 on a SQLite file
    python bench/llm_outage.py --outage 60 --db postgresql://...
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import REPO_ROOT, emit_json, machine_info

sys.path.insert(0, str(REPO_ROOT / "tests"))

from fakes.memory_model import MemoryModel
from fakes.openai_server import FakeOpenAIServer
from memstrata import Memory

ARRIVAL_SECONDS = 10.0


def run(db: str, outage: float, fault: str | int, users: int) -> dict[str, Any]:
    with FakeOpenAIServer() as server:
        server.chat_script = MemoryModel()
        llm = {"llm": "openai:fake-chat", "llm_base_url": server.base_url, "llm_api_key": "k"}
        mem = Memory(db, embedder="hash", **llm)
        try:
            sessions = [mem.sessions.create(user_id=f"u{i}") for i in range(users)]
            server.fault(fault)
            began, accepted = time.monotonic(), 0
            while time.monotonic() - began < outage:
                for s in sessions:
                    s.add_messages([{"role": "user", "content": f"I ordered parcel {accepted}."}])
                    accepted += 1
                time.sleep(ARRIVAL_SECONDS)
            during = mem.stats()
            calls = len(server.chat_requests())
            server.heal()
            healed = time.monotonic()
            while mem.stats()["messages"]["pending"]:
                time.sleep(0.2)
            caught_up = time.monotonic() - healed
            after = mem.stats()
        finally:
            mem.close()
    outages = during["processing"].get("outages", [])
    return {
        "store": during["store"],
        "fault": fault,
        "outage_seconds": outage,
        "accepted": accepted,
        "failed_during": during["messages"]["failed"],
        "paused_during": during["processing"]["paused"],
        "probes": sum(o["failures"] for o in outages),
        "calls_to_dead_model": calls,
        "processed": after["messages"]["processed"],
        "failed": after["messages"]["failed"],
        "caught_up_seconds": round(caught_up, 1),
        "paused_after": after["processing"]["paused"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", help="database URL (default: a temporary SQLite file)")
    parser.add_argument("--outage", type=float, default=600.0, help="seconds of outage")
    parser.add_argument("--fault", default="503", help="an HTTP status, refuse or hang")
    parser.add_argument("--users", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="also print one JSON line")
    args = parser.parse_args()
    fault: str | int = int(args.fault) if args.fault.isdigit() else args.fault
    with tempfile.TemporaryDirectory() as tmp:
        db = args.db or f"sqlite:///{Path(tmp) / 'outage.db'}"
        results = run(db, args.outage, fault, args.users)
    for key, value in results.items():
        print(f"{key:>20}: {value}")
    if args.json:
        emit_json("llm_outage", {**results, "machine": machine_info()})


if __name__ == "__main__":
    main()
