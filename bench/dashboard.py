"""Dashboard page loads for a user of LoCoMo size, through a real `stratamem serve`.

One LoCoMo conversation (the largest of the development set: about 700 turns) is stored as
one user's sessions, with ``name`` the speaker, and processed by the offline pipeline with
the bundled embedder (facts, summaries, topics). A `stratamem serve` process is started on
that store; this process signs in to /ui with an API key, as a browser does (login form,
CSRF token, session cookie), and fetches each page of that user in turn, round after round,
so that drift on the machine hits every page alike. A load is the whole HTML answer read over
HTTP on 127.0.0.1 (the stylesheet is cached by a browser and is not counted).

Printed per page: p50 / p95 / max and the size of the page; then the p95 over every load,
with the target: p95 <= 200 ms.

    python bench/dashboard.py                    # 40 rounds (~1 min after ingest)
    python bench/dashboard.py --rounds 100 --json
    python bench/dashboard.py --database-url postgresql://postgres@127.0.0.1:5432/postgres
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import httpx

from _common import (
    REPO_ROOT,
    emit_json,
    engine_version,
    format_summary,
    locomo_turns,
    machine_info,
    other_load,
    summarize,
    verdict,
)

TARGET_P95_MS = 200.0
USER = "locomo-user"
CSRF_RE = re.compile(r'name="csrf" value="([^"]+)"')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ingest(url: str) -> tuple[str, dict[str, str], int]:
    """The conversation stored and processed; returns an API key, ids of one item per
    layer, and how many messages were stored."""
    from stratamem import Memory

    turns = locomo_turns()
    by_sample: dict[str, list] = defaultdict(list)
    for t in turns:
        by_sample[t.sample_id].append(t)
    sample = max(by_sample.values(), key=len)
    mem = Memory(url)
    try:
        # The embedded Memory's project has no record until one is made (keys need one).
        mem.projects.create("bench", project_id=mem.project_id)
        _, key = mem.keys.create(mem.project_id, name="bench")
        sessions: dict[int, list] = defaultdict(list)
        for t in sample:
            sessions[t.session].append(t)
        started = time.perf_counter()
        for n, session_turns in sorted(sessions.items()):
            s = mem.sessions.create(USER, session_id=f"session-{n}", title=f"Session {n}")
            s.add_messages([{**t.as_message(), "name": t.speaker or None} for t in session_turns])
        mem.wait()
        print(
            f"  ingested {len(sample)} messages in {len(sessions)} sessions "
            f"in {time.perf_counter() - started:.1f} s"
        )
        summary = next(s for s in mem.summaries.list(user_id=USER, limit=1000) if s.fact_ids)
        ids = {
            "summary": summary.id,
            "fact": summary.fact_ids[0],
            "message": summary.message_ids[0],
            "topic": mem.topics.list(user_id=USER)[0].id,
        }
        stats = mem.stats()
        print(
            f"  memory: {stats['facts']} facts, {sum(stats['summaries'].values())} summaries, "
            f"{stats['topics']} topics"
        )
        return key, ids, len(sample)
    finally:
        mem.close()


def _serve(url: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATAMEM_")}
    cmd = [sys.executable, "-m", "stratamem", "serve", "--port", str(port), "--database-url", url]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"stratamem serve did not start:\n{log.read_text()}")


def _sign_in(client: httpx.Client, key: str) -> None:
    page = client.get("/ui/login")
    csrf = CSRF_RE.search(page.text)
    assert csrf, page.text
    r = client.post("/ui/login", data={"key": key, "csrf": csrf.group(1)})
    assert r.status_code == 303, r.text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--database-url", help="a store URL (default: a new SQLite file)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    print("dashboard page loads, LoCoMo-sized user", machine_info(), engine_version())
    with tempfile.TemporaryDirectory() as tmp:
        url = args.database_url or f"sqlite:///{Path(tmp) / 'dashboard.db'}"
        key, ids, messages = _ingest(url)
        pages = {
            "overview": "/ui/",
            "users": "/ui/users",
            "user memory": f"/ui/users/{USER}",
            "user facts": f"/ui/users/{USER}?tab=facts",
            "user messages": f"/ui/users/{USER}?tab=messages",
            "user messages p10": f"/ui/users/{USER}?tab=messages&page=10",
            "summary + history": f"/ui/items/{ids['summary']}",
            "fact": f"/ui/items/{ids['fact']}",
            "message": f"/ui/items/{ids['message']}",
            "topic": f"/ui/items/{ids['topic']}",
            "recall (query)": f"/ui/recall?user_id={USER}&query=What+did+she+paint+last+year%3F",
            "recall log": "/ui/recall/log",
            "audit": "/ui/audit",
        }
        port = _free_port()
        proc = _serve(url, port, Path(tmp) / "serve.log")
        times: dict[str, list[float]] = defaultdict(list)
        sizes: dict[str, int] = {}
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
                _sign_in(client, key)
                for path in pages.values():  # warm-up: imports, caches, first queries
                    assert client.get(path).status_code == 200, path
                with other_load([proc.pid]) as load:
                    for _ in range(args.rounds):
                        for name, path in pages.items():
                            t0 = time.perf_counter()
                            r = client.get(path)
                            times[name].append(time.perf_counter() - t0)
                            assert r.status_code == 200, (path, r.status_code)
                            sizes[name] = len(r.content)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    print(f"  {messages} messages; {args.rounds} rounds; other load {load[0]:.0%}")
    results: dict[str, object] = {"messages": messages, "rounds": args.rounds}
    for name, ts in times.items():
        s = summarize(ts)
        print(format_summary(f"{name} ({sizes[name] // 1024} KiB)", s, width=36))
        results[name] = s.as_dict()
    overall = summarize([t for ts in times.values() for t in ts])
    print(format_summary("every page", overall, width=36))
    print(
        f"  page load p95 {overall.p95:.1f} ms (target <= {TARGET_P95_MS:.0f} ms: "
        f"{verdict(overall.p95, TARGET_P95_MS, higher_is_better=False)})"
    )
    results["overall"] = overall.as_dict()
    if args.json:
        emit_json("dashboard", results)


if __name__ == "__main__":
    main()
