"""PostgreSQL round trips of one recall: how many times ``mem.search`` waits for the server.

A search on PostgreSQL sends its statements from two threads (full text beside the query's
embedding and the vector search), some of them together in pipelines. Each time a
connection sends after the server has answered is one round trip: on one machine it costs
the client and server's work per statement; across a network, one network round trip on
top. This script counts them: it puts a loopback TCP relay in front of the server (the
store connects through it, nothing else changes), asks the LoCoMo questions of a store
``bench/retrieval.py --dataset locomo --db URL`` built, and prints round trips per search
with the search latency. ``--delay-ms`` holds each round trip that long in the relay, as a
network would (the relay itself adds a little even at 0, so compare runs of one setting).

    python bench/retrieval.py --dataset locomo --db postgresql://.../locomo   # once
    python bench/roundtrips.py --db postgresql://.../locomo --questions 200
    python bench/roundtrips.py --db postgresql://.../locomo --delay-ms 0.5 --json
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from _common import emit_json, machine_info
from retrieval import locomo_dataset
from stratamem import Memory

WARMUP_QUESTIONS = 20


class Relay:
    """A TCP relay on 127.0.0.1 to ``host:port`` that counts round trips (a client burst
    after the server spoke, on any connection) and delays each by ``delay`` seconds."""

    def __init__(self, host: str, port: int, delay: float) -> None:
        self.target = (host, port)
        self.delay = delay
        self.round_trips = 0
        self.port = 0
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event
        self._thread = threading.Thread(target=self._run, name="relay", daemon=True)

    def __enter__(self) -> Relay:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _run(self) -> None:
        self._loop.run_until_complete(self._serve())
        self._loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        await self._stop.wait()
        server.close()
        pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def _connection(self, client_r: Any, client_w: Any) -> None:
        server_r, server_w = await asyncio.open_connection(*self.target)
        for writer in (client_w, server_w):
            writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        last = ["server"]
        try:
            await asyncio.gather(
                self._pump(client_r, server_w, "client", last),
                self._pump(server_r, client_w, "server", last),
            )
        except asyncio.CancelledError:  # the relay closing under an open connection
            client_w.close()
            server_w.close()

    async def _pump(self, reader: Any, writer: Any, side: str, last: list[str]) -> None:
        try:
            while data := await reader.read(65536):
                if side == "client" and last[0] == "server":
                    self.round_trips += 1
                    if self.delay:
                        await asyncio.sleep(self.delay)
                last[0] = side
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()


def _through(url: str, port: int) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    host = f"127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2 else host))


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--db", required=True, help="a PostgreSQL URL holding the LoCoMo store")
    p.add_argument("--questions", type=int, default=200)
    p.add_argument("--delay-ms", type=float, default=0.0, help="added to each round trip")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if not args.db.startswith("postgres"):
        sys.exit("--db must be a PostgreSQL URL (SQLite has no round trips)")
    target = urlsplit(args.db)
    ds = locomo_dataset("all", None)
    questions = [(u.user_id, q) for u in ds.users for q in u.questions][: args.questions]
    with Relay(target.hostname or "127.0.0.1", target.port or 5432, args.delay_ms / 1000) as relay:
        mem = Memory(_through(args.db, relay.port), embedder="local")
        try:
            for user_id, q in questions[:WARMUP_QUESTIONS]:
                mem.search(q.text, user_id=user_id, limit=10, as_of=q.as_of)
            time.sleep(0.2)  # background reads of the first searches
            before = relay.round_trips
            seconds = []
            for user_id, q in questions:
                t0 = time.perf_counter()
                mem.search(q.text, user_id=user_id, limit=10, as_of=q.as_of)
                seconds.append(time.perf_counter() - t0)
            per_search = (relay.round_trips - before) / len(questions)
        finally:
            mem.close()
    seconds.sort()
    result = {
        "round_trips_per_search": round(per_search, 2),
        "delay_ms": args.delay_ms,
        "questions": len(questions),
        "p50_ms": round(seconds[len(seconds) // 2] * 1000, 1),
        "p95_ms": round(seconds[int(0.95 * (len(seconds) - 1))] * 1000, 1),
        "mean_ms": round(statistics.mean(seconds) * 1000, 1),
        "machine": machine_info(),
    }
    print(
        f"PostgreSQL round trips per mem.search (limit 10, LoCoMo, {len(questions)} questions, "
        f"{args.delay_ms} ms added to each): {per_search:.2f}; search p50 / p95 / mean "
        f"{result['p50_ms']} / {result['p95_ms']} / {result['mean_ms']} ms"
    )
    if args.json:
        emit_json("roundtrips", result)


if __name__ == "__main__":
    main()
