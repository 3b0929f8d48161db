"""Webhook overhead: pipeline time a sync webhook adds (loopback) and async webhooks add.

Stores are processed side by side, one batch (one user message) at a time, in the calling
thread (``workers=0``; ``mem.wait()`` runs the batch: claim, offline pipeline with the
hashing embedder, commit), in a shuffled order per round so that drift on the machine hits
all alike:

* baseline: no webhook;
* sync: one sync ``fact.before_add`` webhook on a loopback receiver that answers ``{}``
  (no change), so the batch waits for the round trip;
* sync+edit: the same, the receiver answering with the observations it got (a replacement
  the engine validates and stores);
* async queued: three async webhooks (fact, summary, topic ``before_add``); the pipeline
  only queues them (the sender is started after the timed rounds, to deliver them);
* async sent: the same, with the outbox sender threads delivering while batches run, as
  beside a worker: their CPU competes with the batch on the same cores.

Each round also times one bare round trip of a typical request to the same receiver with
the webhook sender (signed, pinned, size-capped) and with a plain keep-alive httpx client,
under the same conditions. The receiver is tests/fakes/webhook_receiver.py (Python's
ThreadingHTTPServer on 127.0.0.1, in this process). Targets: sync added p50 within 1 ms of
the sender's round trip p50 (the round trip and nothing more); async queued added p50 <=
0.5 ms (about zero). Nothing is asserted.

Then slow receivers: the sender posts to receivers that trickle their body or their status
line and headers a byte every 50 ms, accept and never answer, never complete the TLS
handshake, or never complete the connection, with ``timeout_ms`` 250 and 1000; the figure
is how long each delivery ran past its timeout (target: tens of ms, not seconds).

    python bench/webhooks.py               # 500 rounds (~1 min), 10 slow rounds (~1 min)
    python bench/webhooks.py --batches 2000 --slow-rounds 20 --json
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _common import (
    emit_json,
    engine_version,
    format_summary,
    machine_info,
    other_load,
    summarize,
    verdict,
)
from fakes.webhook_receiver import WebhookReceiver, silent_port
from stratamem import Memory
from stratamem.hooks._http import WebhookHttp
from stratamem.hooks._signing import new_secret, signature_headers
from stratamem.hooks._ssrf import AllowList

SUBJECTS = ["I", "My sister", "My manager", "Our team", "My neighbour"]
VERBS = ["moved to", "started a course in", "is planning a trip to", "loves the food of"]
PLACES = ["Porto", "Kyoto", "Berlin", "Lima", "Oslo", "Nairobi", "Hanoi", "Quebec"]
EXTRA = ["last spring", "next month", "every Sunday", "since 2019", "with two friends"]


def _texts(n: int, seed: int = 3) -> list[str]:
    rng = random.Random(seed)
    return [
        f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(PLACES)} "
        f"{rng.choice(EXTRA)}, and it {rng.choice(['went well', 'was hard', 'is exciting'])}."
        for _ in range(n)
    ]


def _echo(payload: dict[str, Any]) -> tuple[int, Any]:
    return 200, {"data": {"observations": payload["data"]["observations"]}}


BODY = (
    b'{"version":1,"resource":"fact","event":"before_add","data":{"observations":'
    b'[{"text":"User moved to Porto next month, and it went well.","kind":"fact",'
    b'"message_ids":["m_1"],"confidence":0.8}]}}'
)
STORES = ("baseline", "sync", "sync+edit", "async queued", "async sent")


def run(batches: int) -> dict[str, Any]:
    texts = _texts(batches + 20)
    results: dict[str, Any] = {"engine": engine_version(), "batches": batches}
    secret = new_secret()
    with tempfile.TemporaryDirectory() as tmp, WebhookReceiver() as receiver:
        receiver.script("/edit", _echo)
        stores = {
            name: Memory(
                f"sqlite:///{tmp}/{i}.db", embedder="hash", workers=0, webhook_allow="127.0.0.1"
            )
            for i, name in enumerate(STORES)
        }
        stores["sync"].webhooks.create(
            resource="fact", event="before_add", target_url=receiver.url("/noop")
        )
        stores["sync+edit"].webhooks.create(
            resource="fact", event="before_add", target_url=receiver.url("/edit")
        )
        for name in ("async queued", "async sent"):
            for resource in ("fact", "summary", "topic"):
                stores[name].webhooks.create(
                    resource=resource,
                    event="before_add",
                    target_url=receiver.url(f"/async-{resource}"),
                    mode="async",
                )
        # workers=0 keeps batches in this thread; this sender runs as it would beside a
        # worker. The other async store's deliveries wait until the rounds are over.
        stores["async sent"]._engine.webhook_engine.outbox.start()
        sessions = {name: m.sessions.create(user_id="u") for name, m in stores.items()}
        sender = WebhookHttp(AllowList.parse("127.0.0.1"))
        plain = httpx.Client()
        times: dict[str, list[float]] = {name: [] for name in (*STORES, "trip", "plain")}
        order = [*STORES, "trip", "plain"]
        with other_load() as load:
            for i, text in enumerate(texts):
                random.Random(i).shuffle(order)
                for name in order:
                    t0 = time.perf_counter()
                    if name == "trip":
                        headers = signature_headers([secret], "msg_bench", BODY)
                        sender.post(receiver.url("/trip"), BODY, headers, 5000)
                    elif name == "plain":
                        plain.post(receiver.url("/plain"), content=BODY).read()
                    else:
                        sessions[name].add_messages([{"role": "user", "content": text}])
                        t0 = time.perf_counter()
                        stores[name].wait()
                    if i >= 20:  # warm-up: connections, caches
                        times[name].append(time.perf_counter() - t0)
        sender.close()
        plain.close()
        stores["async queued"]._engine.webhook_engine.outbox.start()
        counts = {"delivered": 0, "failed": 0, "retrying": 0}
        for name in ("async queued", "async sent"):
            stores[name].webhooks.wait(timeout=120)
            for h in stores[name].webhooks.list():
                for d in stores[name].webhooks.deliveries(h.id, limit=10_000):
                    counts[d.status] += 1
        facts = stores["sync+edit"].facts.list(user_id="u", limit=10_000)
        for m in stores.values():
            m.close()

    base = np.asarray(times["baseline"])
    print(f"webhook overhead, {batches} rounds (engine {results['engine']})")
    print(f"  other load during the rounds: {load[0]:.1%}")
    for name in STORES:
        s = summarize(times[name])
        results[f"{name}_batch_ms"] = s.as_dict()
        print(format_summary(f"batch time, {name}", s))
    for name in STORES[1:]:
        added = summarize(list(np.asarray(times[name]) - base))
        results[f"{name}_added_ms"] = added.as_dict()
        print(format_summary(f"added per batch, {name}", added))
    for name, label in (("trip", "webhook sender"), ("plain", "plain httpx keep-alive")):
        s = summarize(times[name])
        results[f"round_trip_{name}_ms"] = s.as_dict()
        print(format_summary(f"loopback round trip, {label}", s))
    trip = results["round_trip_trip_ms"]["p50"]
    sync_added = results["sync_added_ms"]["p50"]
    queued_added = results["async queued_added_ms"]["p50"]
    results["verdict_sync"] = verdict(sync_added, trip + 1.0, higher_is_better=False)
    results["verdict_async"] = verdict(queued_added, 0.5, higher_is_better=False)
    results["async_deliveries"] = counts
    results["sync_edit_facts"] = len(facts)
    results["other_load"] = load[0]
    print(
        f"  sync added p50 {sync_added:.3f} ms vs sender round trip p50 {trip:.3f} ms "
        f"(target: within 1 ms): {results['verdict_sync']}"
    )
    print(
        f"  async queued added p50 {queued_added:.3f} ms (target <= 0.5 ms): "
        f"{results['verdict_async']}"
    )
    print(f"  async delivery attempts after the rounds: {counts}")
    return results


SLOW = ("trickled body", "trickled head", "no answer", "no TLS handshake", "no connection")


def run_slow(rounds: int) -> dict[str, Any]:
    """Time past ``timeout_ms`` of deliveries to receivers that drag each step out."""
    results: dict[str, Any] = {"slow_rounds": rounds}
    http = WebhookHttp(AllowList.parse("127.0.0.1"))
    print(f"slow receivers, {rounds} rounds: delivery time past timeout_ms")
    with (
        WebhookReceiver() as receiver,
        silent_port() as silent,
        silent_port(accepting=False) as full,
    ):
        urls = {
            "trickled body": receiver.url("/trickle-body"),
            "trickled head": receiver.url("/trickle-head"),
            "no answer": f"http://127.0.0.1:{silent}/hook",
            "no TLS handshake": f"https://127.0.0.1:{silent}/hook",
            "no connection": f"http://127.0.0.1:{full}/hook",
        }
        for timeout_ms in (250, 1000):
            past: dict[str, list[float]] = {kind: [] for kind in SLOW}
            for _ in range(rounds):
                for kind in SLOW:
                    t0 = time.perf_counter()
                    http.post(urls[kind], BODY, {}, timeout_ms)
                    past[kind].append(time.perf_counter() - t0 - timeout_ms / 1000)
            for kind in SLOW:
                s = summarize(past[kind])
                results[f"past_timeout_{timeout_ms}_{kind.replace(' ', '_')}_ms"] = s.as_dict()
                print(format_summary(f"{kind}, timeout_ms={timeout_ms}", s))
    http.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=500, help="batches per store")
    parser.add_argument("--slow-rounds", type=int, default=10, help="rounds per slow receiver")
    parser.add_argument("--json", action="store_true", help="also print one JSON line")
    args = parser.parse_args()
    info = machine_info()
    print(f"machine: {info.get('cpu')} ({info.get('cores')} cores)")
    results = run(args.batches)
    results.update(run_slow(args.slow_rounds))
    if args.json:
        emit_json("webhooks", {**results, "machine": info})


if __name__ == "__main__":
    main()
