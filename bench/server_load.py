"""Server under load: N concurrent clients on loopback adding messages and querying context.

Starts a real ``stratamem serve`` (embedded SQLite, background worker, the local embedder
unless ``--embedder``) on 127.0.0.1 and runs ``--clients`` asyncio clients against it for
``--seconds``. Each client is one user with one session: it adds a few LoCoMo turns
(``POST /api/sessions/{id}/messages``, asynchronous by default), then asks a LoCoMo
question (``POST /api/sessions/{id}/context``) every ``--query-every`` writes. Printed:
requests per second and p50/p95/p99 latency per route, then the check that counts: after
the load, once the worker has caught up, every message the server accepted (a 200 answer)
is stored and processed, and nothing else is.

    python bench/server_load.py                       # 8 clients, 30 s, local embedder
    python bench/server_load.py --clients 16 --seconds 60 --embedder hash --json
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
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
from typing import Any

import httpx

from _common import (
    emit_json,
    engine_version,
    format_summary,
    locomo_questions,
    locomo_turns,
    machine_info,
    summarize,
)

KEY_RE = re.compile(r"\bsm_[A-Za-z0-9_-]{20,}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, workdir: Path, embedder: str, workers: int) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.out = workdir / "serve.out"
        env = {k: v for k, v in os.environ.items() if not k.startswith("STRATAMEM_")}
        env["STRATAMEM_WORKERS"] = str(workers)
        cmd = [
            sys.executable,
            "-m",
            "stratamem",
            "--embedder",
            embedder,
            "serve",
            "--port",
            str(self.port),
            "--database-url",
            f"sqlite:///{workdir / 'load.db'}",
        ]
        with open(self.out, "wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.DEVNULL, env=env)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"stratamem serve exited: {self.out.read_text()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        else:
            self.stop()
            raise SystemExit("stratamem serve did not come up in 120 s")
        keys = KEY_RE.findall(self.out.read_text())
        if not keys:
            self.stop()
            raise SystemExit("no bootstrap key printed")
        self.key = keys[0]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


class Load:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        turns = locomo_turns()
        self.texts = [t.text for t in turns]
        self.questions = locomo_questions(2000, seed=3)
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.errors: dict[str, int] = defaultdict(int)
        self.accepted: dict[str, set[str]] = defaultdict(set)  # user -> message ids

    async def client(self, c: httpx.AsyncClient, n: int, stop_at: float) -> None:
        user = f"load-user-{n}"
        r = await c.post("/api/sessions", json={"user_id": user, "session_id": f"load-{n}"})
        r.raise_for_status()
        sid = r.json()["data"]["session_id"]
        writes = 0
        cursor = (n * 997) % len(self.texts)
        while time.monotonic() < stop_at:
            batch = []
            for _ in range(self.args.batch):
                batch.append(
                    {
                        "id": f"{user}-{writes}-{len(batch)}",
                        "role": "user",
                        "content": self.texts[cursor % len(self.texts)],
                    }
                )
                cursor += 1
            await self.request(
                c,
                "POST /api/sessions/{id}/messages",
                "POST",
                f"/api/sessions/{sid}/messages",
                {"messages": batch, "sync": False},
                on_ok=lambda ids=[m["id"] for m in batch]: self.accepted[user].update(ids),
            )
            writes += 1
            if writes % self.args.query_every == 0:
                question = self.questions[(n * 31 + writes) % len(self.questions)]
                await self.request(
                    c,
                    "POST /api/sessions/{id}/context",
                    "POST",
                    f"/api/sessions/{sid}/context",
                    {"query": question},
                )

    async def request(
        self,
        c: httpx.AsyncClient,
        route: str,
        method: str,
        path: str,
        body: dict[str, Any],
        on_ok: Any = None,
    ) -> None:
        started = time.perf_counter()
        try:
            r = await c.request(method, path, json=body)
        except httpx.HTTPError as exc:
            self.errors[f"{route}: {type(exc).__name__}"] += 1
            return
        self.latency[route].append(time.perf_counter() - started)
        if r.status_code == 200:
            if on_ok is not None:
                on_ok()
        else:
            self.errors[f"{route}: HTTP {r.status_code}"] += 1

    async def run(self, url: str, key: str) -> float:
        limits = httpx.Limits(max_connections=self.args.clients)
        headers = {"Authorization": f"Api-Key {key}"}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60, limits=limits) as c:
            started = time.monotonic()
            stop_at = started + self.args.seconds
            await asyncio.gather(*(self.client(c, n, stop_at) for n in range(self.args.clients)))
            return time.monotonic() - started


def _check(url: str, key: str, accepted: dict[str, set[str]], timeout: float) -> dict[str, Any]:
    """Wait for the worker to catch up, then compare what is stored with what was accepted."""
    headers = {"Authorization": f"Api-Key {key}"}
    started = time.monotonic()
    with httpx.Client(base_url=url, headers=headers, timeout=60) as c:

        def pending(user: str) -> bool:
            params = {"status": "pending", "limit": 1}
            return bool(c.get(f"/api/users/{user}/messages", params=params).json()["data"]["items"])

        while any(pending(u) for u in accepted) and time.monotonic() - started < timeout:
            time.sleep(0.5)
        drained = time.monotonic() - started
        stored: dict[str, dict[str, str]] = {}
        for user in accepted:
            states: dict[str, str] = {}
            offset: int | None = 0
            while offset is not None:
                page = c.get(
                    f"/api/users/{user}/messages", params={"limit": 1000, "offset": offset}
                ).json()["data"]
                states.update({m["id"]: m["status"] for m in page["items"]})
                offset = page["next_offset"]
            stored[user] = states
    missing = sum(len(ids - set(stored[u])) for u, ids in accepted.items())
    unexpected = sum(len(set(stored[u]) - ids) for u, ids in accepted.items())
    statuses: dict[str, int] = defaultdict(int)
    for states in stored.values():
        for status in states.values():
            statuses[status] += 1
    return {
        "accepted": sum(len(ids) for ids in accepted.values()),
        "stored": sum(len(s) for s in stored.values()),
        "missing": missing,
        "unexpected": unexpected,
        "by_status": dict(statuses),
        "drain_seconds": round(drained, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--batch", type=int, default=4, help="messages per add request")
    p.add_argument("--query-every", type=int, default=2, help="a context query per N adds")
    p.add_argument("--embedder", default="local")
    p.add_argument("--workers", type=int, default=1, help="worker threads of the server")
    p.add_argument("--drain-timeout", type=float, default=600.0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if not 1 <= args.clients <= 256 or not 1 <= args.seconds <= 600:
        raise SystemExit("--clients 1..256 and --seconds 1..600 (load tests are bounded)")

    with tempfile.TemporaryDirectory(prefix="stratamem-load-") as tmp:
        server = Server(Path(tmp), args.embedder, args.workers)
        try:
            load = Load(args)
            elapsed = asyncio.run(load.run(server.url, server.key))
            check = _check(server.url, server.key, load.accepted, args.drain_timeout)
        finally:
            server.stop()

    routes = {route: summarize(values) for route, values in sorted(load.latency.items())}
    total = sum(s.n for s in routes.values())
    print(
        f"stratamem {engine_version()}: {args.clients} clients for {elapsed:.1f} s on loopback, "
        f"embedder {args.embedder}, {args.workers} worker thread(s), "
        f"{args.batch} messages per add, a context query every {args.query_every} adds"
    )
    print(
        f"  throughput: {total / elapsed:.1f} requests/s, "
        f"{check['accepted'] / elapsed:.1f} messages accepted/s"
    )
    for route, s in routes.items():
        print(format_summary(f"{route} ({s.n / elapsed:.1f}/s)", s, width=48))
    if load.errors:
        print("  errors: " + ", ".join(f"{k} x{v}" for k, v in sorted(load.errors.items())))
    ok = check["missing"] == 0 and check["unexpected"] == 0
    done = check["by_status"].get("processed", 0) == check["accepted"]
    print(
        f"  after the load: {check['accepted']} accepted, {check['stored']} stored "
        f"({check['missing']} missing, {check['unexpected']} unexpected), by status "
        f"{check['by_status']}; the worker caught up {check['drain_seconds']} s after the "
        f"load ended -> {'PASS' if ok and done else 'FAIL'}"
    )
    if args.json:
        emit_json(
            "server_load",
            {
                "machine": machine_info(),
                "args": vars(args),
                "elapsed_seconds": elapsed,
                "routes": {r: dataclasses.asdict(s) for r, s in routes.items()},
                "errors": dict(load.errors),
                "check": check,
            },
        )
    if not (ok and done):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
