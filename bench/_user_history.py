"""``bench/scale.py --part user``: one user's years of history on one store.

One user (``heavy``) holds ``--user-messages`` messages (10,000 by default; a list such as
``10000,100000`` runs each size on a fresh store) beside ``--other-users`` users of 500
messages each. The history is real text first: the last of it is BEAM's first development
chat (796 turns of a long technical user-assistant conversation, its own dates), before it
the other four BEAM chats and every LoCoMo turn, then synthetic rewrites of those texts
(``_common.synthetic_texts``) for the rest, all spread evenly over the years before the
chat, oldest first, 50 messages a session.

Everything goes through the real engine (``max_content_chars`` raised as in
``bench/retrieval.py``: BEAM has turns of 33,000 characters): ``add_messages`` with no worker
running (the acceptance rate), then the workers of a default ``Memory`` process the backlog
offline with the bundled embedder (heuristic facts, summaries, topics, vectors: the
processing rate).
Nothing is bulk-built, so a size costs its processing time (~100 messages/s on 2 cores: 100,000
messages take about 20 minutes).

Then, for the heavy user, after the background HNSW builds are done: ``mem.search`` (limit
10) and ``get_memory`` p50 / p95 over the BEAM chat's questions; the chat's evidence turns in
the first 10 turns of the search (R@10) beside the same chat held alone by a small user in
the same store (the history's cost to recall); the vector search of the message layer
against exact search over the same vectors (recall@10); the store's size on disk and the
process's resident memory.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

from _common import format_summary, loadavg, locomo_turns, summarize, synthetic_texts
from retrieval import (
    MAX_CONTENT_CHARS,
    Dataset,
    Doc,
    Question,
    _turn_ranking,
    beam_dataset,
    score,
)
from stratamem import Memory
from stratamem.store import SearchFilters

HEAVY = "heavy"
ALONE = "chat-alone"
SESSION_SIZE = 50
OTHER_MESSAGES = 500
LIMIT = 10


def _history(beam: Dataset, n: int) -> list[dict[str, Any]]:
    """The heavy user's messages, oldest first, ending with BEAM's first chat as it is."""
    planted = [d for s in beam.users[0].sessions for d in s.docs]
    real = [d.content for u in beam.users[1:] for s in u.sessions for d in s.docs]
    real += [t.text for t in locomo_turns()]
    before = max(0, n - len(planted))
    texts = real[:before]
    if len(texts) < before:
        texts += [s.text for s in synthetic_texts(real, before - len(texts), seed=1)]
    start = planted[0].timestamp
    # The older history over the years before the chat: one message every 30 minutes.
    out = [
        {
            "id": f"h{i}",
            "role": "user" if i % 2 == 0 else "assistant",
            "content": text,
            "timestamp": start - timedelta(minutes=30 * (before - i)),
        }
        for i, text in enumerate(texts)
    ]
    out += [_message(d) for d in planted]
    return out


def _message(d: Doc) -> dict[str, Any]:
    return {"id": d.mid, "role": d.role, "content": d.content, "timestamp": d.timestamp}


def _accept(mem: Memory, user: str, messages: list[dict[str, Any]], prefix: str) -> None:
    for i in range(0, len(messages), SESSION_SIZE):
        session = mem.sessions.create(user_id=user, session_id=f"{prefix}-{i // SESSION_SIZE}")
        session.add_messages(messages[i : i + SESSION_SIZE], sync=False)


def _build(url: str, beam: Dataset, n: int, others: int) -> dict[str, Any]:
    history = _history(beam, n)
    other = [t.text for t in locomo_turns()]
    planted = [_message(d) for s in beam.users[0].sessions for d in s.docs]
    alone = [{**m, "id": f"alone-{m['id']}"} for m in planted]
    total = len(history) + others * OTHER_MESSAGES + len(alone)
    with Memory(url, workers=0, max_content_chars=MAX_CONTENT_CHARS) as mem:
        t0 = time.perf_counter()
        for k in range(others):
            base = history[0]["timestamp"]
            msgs = [
                {
                    "id": f"o{k}-{j}",
                    "role": "user",
                    "content": other[(k * OTHER_MESSAGES + j) % len(other)],
                    "timestamp": base + timedelta(hours=j),
                }
                for j in range(OTHER_MESSAGES)
            ]
            _accept(mem, f"other{k}", msgs, f"o{k}")
        _accept(mem, HEAVY, history, "h")
        _accept(mem, ALONE, alone, "a")
        accept_s = time.perf_counter() - t0
    print(f"  accepted {total:,} messages in {accept_s:.1f} s ({total / accept_s:,.0f}/s)")
    with Memory(url, max_content_chars=MAX_CONTENT_CHARS) as mem:
        t0 = time.perf_counter()
        last = -1
        while True:
            counts = mem.stats()["messages"]
            if counts["pending"] == 0:
                break
            done = counts["processed"] + counts["failed"]
            if done // 5000 != last // 5000:
                print(f"  processed {done:,} / {total:,} ({loadavg()} load)", file=sys.stderr)
            last = done
            time.sleep(1.0)
        mem.wait()
        process_s = time.perf_counter() - t0
        stats = mem.stats()
    print(f"  processed in {process_s:.0f} s ({total / process_s:,.0f}/s)")
    return {
        "messages": total,
        "heavy_messages": len(history),
        "accept_per_s": total / accept_s,
        "process_per_s": total / process_s,
        "failed": stats["messages"]["failed"],
        "facts": stats.get("facts"),
        "summaries": sum(stats.get("summaries", {}).values()),
    }


def _evidence_recall(
    mem: Memory, user: str, questions: list[Question], docs: list[Doc], prefix: str
) -> tuple[float, list[float]]:
    """Mean R@10 of the chat's evidence turns in ``user``'s search (its messages are the
    chat's ``docs``, ids prefixed by ``prefix``), and the search times."""
    by_mid = {f"{prefix}{d.mid}": d for d in docs}
    session_of = {d.turn: d.session for d in docs}
    recalls, times = [], []
    for q in questions:
        t0 = time.perf_counter()
        hits = mem.search(q.text, user_id=user, limit=LIMIT, as_of=q.as_of)
        times.append(time.perf_counter() - t0)
        turns, _ = _turn_ranking(hits, by_mid)
        recalls.append(score(q, turns, session_of)["turn@10"])
    return 100 * float(np.mean(recalls)), times


def _vector_recall(mem: Memory, questions: list[Question]) -> float:
    """The message layer's vector search (HNSW above the index threshold) against exact
    search over the same vectors, top 10."""
    store = mem.store
    emb = mem.embedder
    found = 0
    for q in questions:
        qvec = np.asarray(emb.embed([q.text])[0], dtype=np.float32)
        got = store.vector_messages("default", HEAVY, qvec, emb.id, LIMIT, SearchFilters())
        scope = store.vectors.peek(("default", HEAVY, "message", emb.id))
        if scope is None:
            raise SystemExit("the heavy user's message vectors are not loaded")
        sims = scope.matrix[: scope.n] @ qvec
        exact = scope._top(scope.ids[: scope.n], sims, LIMIT)
        found += len({pk for pk, _ in got} & {pk for pk, _ in exact})
    return found / (LIMIT * len(questions))


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run_user(args: argparse.Namespace, sizes: list[int]) -> dict[str, Any]:
    beam = beam_dataset("all", None)
    questions = beam.users[0].questions
    docs = [d for s in beam.users[0].sessions for d in s.docs]
    results: dict[str, Any] = {}
    for n in sizes:
        print(f"\n== one user's history, sqlite: {n:,} messages (load {loadavg()}) ==")
        with _sqlite(args, n) as (url, path):
            build = _build(url, beam, n, args.other_users)
            with Memory(url, max_content_chars=MAX_CONTENT_CHARS) as mem:
                mem.search("what did we talk about", user_id=HEAVY, limit=LIMIT)
                mem.store.vectors.wait_indexes()
                for q in questions[:3]:  # warm
                    mem.search(q.text, user_id=HEAVY, limit=LIMIT, as_of=q.as_of)
                r10, search_s = _evidence_recall(mem, HEAVY, questions, docs, "")
                mem.search(questions[0].text, user_id=ALONE, limit=LIMIT)
                alone_r10, _ = _evidence_recall(mem, ALONE, questions, docs, "alone-")
                session = mem.sessions.get(f"h-{(build['heavy_messages'] - 1) // SESSION_SIZE}")
                context_s = []
                for q in questions:
                    t0 = time.perf_counter()
                    session.get_memory(q.text)
                    context_s.append(time.perf_counter() - t0)
                vector_recall = _vector_recall(mem, questions)
                search, context = summarize(search_s), summarize(context_s)
                row = {
                    **build,
                    "search": search.as_dict(),
                    "get_memory": context.as_dict(),
                    "evidence_r10": r10,
                    "evidence_r10_alone": alone_r10,
                    "vector_recall_at_10": vector_recall,
                    "db_mib": sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))
                    / 2**20,
                    "rss_mib": _rss_mib(),
                    "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                    "load_after": loadavg(),
                }
            print(format_summary("mem.search, limit 10", search))
            print(format_summary("get_memory", context))
            print(
                f"  BEAM chat 1 evidence R@10 {r10:.1f} (held alone: {alone_r10:.1f}); "
                f"vectors recall@10 vs exact {vector_recall:.3f}; store {row['db_mib']:.0f} MiB, "
                f"RSS {row['rss_mib']:.0f} MiB (peak {row['max_rss_mib']:.0f})"
            )
        results[str(n)] = row
    return results


class _sqlite:
    """A fresh SQLite store for one size, in ``--keep-dir`` (kept) or a temporary folder."""

    def __init__(self, args: argparse.Namespace, n: int) -> None:
        import tempfile

        self._tmp = None if args.keep_dir else tempfile.TemporaryDirectory()
        folder = Path(args.keep_dir or self._tmp.name)  # type: ignore[union-attr]
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"user-{n}.db"
        for old in folder.glob(self.path.name + "*"):
            old.unlink()

    def __enter__(self) -> tuple[str, Path]:
        return f"sqlite:///{self.path}", self.path

    def __exit__(self, *exc: object) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
