"""``bench/scale.py --part user``: one user's years of history on one store (``--backend``:
SQLite, PostgreSQL or both, each size on a fresh store of each).

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
Nothing is bulk-built by default, so a size costs its processing time (~100 messages/s on 2
cores: 100,000 messages take about 20 minutes; 1,000,000 would take hours). ``--bulk`` takes
one shortcut, for sizes the model cannot embed in a session: the older history's messages
are not embedded by the workers. The real texts are embedded beforehand, once, in batches; a
synthetic message's vector is derived from its source text's (plus noise, and half of a
blended text's vector: ``search._corpus``, as ``--part search`` builds its facts). Messages
are ~85% of the model's work on this history (they are long, facts short). Everything else
still goes through the workers and the model: every fact, summary and topic, full text, the
planted chat. The processing rate of a ``--bulk`` build is not the pipeline's.

Then, for the heavy user, after the background HNSW builds are done: ``mem.search`` (limit
10) and ``get_memory`` p50 / p95 over the BEAM chat's questions; the chat's evidence turns in
the first 10 turns of the search (R@10) beside the same chat held alone by a small user in
the same store (the history's cost to recall); the vector search of the message layer
against exact search over the same vectors (recall@10); the store's size on disk (the
SQLite file, its HNSW files apart, or the PostgreSQL database) and the process's resident
memory (PostgreSQL's own processes not counted); how long the measuring process waited
after opening the store before its searches were the ones timed (the model, the first search,
the HNSW graphs built or restored); and, searched once more with tracing on, where a search's
time goes: the median of each stage's span (the query's embedding, vectors, full text beside
them, the whole retrieval, scoring). A PostgreSQL store is analysed after the load, as
autovacuum would.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import resource
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

from _common import (
    analyze_postgres,
    format_stages,
    format_summary,
    loadavg,
    locomo_turns,
    postgres_admin_url,
    postgres_database,
    stage_medians,
    summarize,
    synthetic_texts,
)
from retrieval import (
    MAX_CONTENT_CHARS,
    Dataset,
    Doc,
    Question,
    _turn_ranking,
    beam_dataset,
    score,
)
from search import _corpus, _embed_all
from stratamem import Memory
from stratamem.embed import Embedder, make_embedder
from stratamem.errors import ProcessingError
from stratamem.store import SearchFilters

HEAVY = "heavy"
ALONE = "chat-alone"
SESSION_SIZE = 50
OTHER_MESSAGES = 500
LIMIT = 10


def _real_texts(beam: Dataset) -> list[str]:
    """The real texts the older history is made of (and rewritten from, past their number)."""
    real = [d.content for u in beam.users[1:] for s in u.sessions for d in s.docs]
    return real + [t.text for t in locomo_turns()]


def _history(beam: Dataset, n: int) -> list[dict[str, Any]]:
    """The heavy user's messages, oldest first, ending with BEAM's first chat as it is."""
    planted = [d for s in beam.users[0].sessions for d in s.docs]
    real = _real_texts(beam)
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


class _DerivedVectors:
    """The bundled model, except for the texts whose vectors were made beforehand
    (``--bulk``): those are answered from the table. Same ``id``: the store cannot tell."""

    def __init__(self, inner: Embedder, texts: list[str], matrix: np.ndarray) -> None:
        self.inner = inner
        self.rows = {t: i for i, t in enumerate(texts)}
        self.matrix = matrix
        self.answered = 0

    @property
    def id(self) -> str:
        return self.inner.id

    @property
    def name(self) -> str:
        return f"{self.inner.name} (synthetic messages derived)"

    @property
    def dim(self) -> int:
        return self.inner.dim

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        rows = [self.rows.get(t) for t in texts]
        missing = [t for t, r in zip(texts, rows, strict=True) if r is None]
        computed = iter(self.inner.embed(missing)) if missing else iter(())
        self.answered += len(texts) - len(missing)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, r in enumerate(rows):
            out[i] = self.matrix[r] if r is not None else next(computed)
        return out


def _derived_vectors(beam: Dataset, n: int, noise: float) -> _DerivedVectors:
    """The model, answering the older history's messages from a table (``--bulk``): the
    real texts embedded beforehand in batches, the synthetic ones derived from them
    (``search._corpus``)."""
    planted = sum(len(s.docs) for s in beam.users[0].sessions)
    real = _real_texts(beam)
    model = make_embedder("local")
    t0 = time.perf_counter()
    texts, matrix = _corpus(real, _embed_all(model, real), max(0, n - planted), seed=1, noise=noise)
    print(
        f"  --bulk: {len(real):,} real texts embedded in {time.perf_counter() - t0:.0f} s, "
        f"{max(0, len(texts) - len(real)):,} synthetic messages' vectors derived from them"
    )
    return _DerivedVectors(model, texts, matrix)


def _build(
    url: str, beam: Dataset, n: int, others: int, embedder: _DerivedVectors | None = None
) -> dict[str, Any]:
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
    with Memory(url, embedder=embedder, max_content_chars=MAX_CONTENT_CHARS) as mem:
        t0 = time.perf_counter()
        while True:
            # Progress from stats() now and then only: it counts every row (a third of a
            # core when asked every second at 1,000,000 messages).
            try:
                mem.wait(timeout=60)
                break
            except ProcessingError:
                counts = mem.stats()["messages"]
                done = counts["processed"] + counts["failed"]
                print(f"  processed {done:,} / {total:,} ({loadavg()} load)", file=sys.stderr)
        process_s = time.perf_counter() - t0
        stats = mem.stats()
    bulk = f" (--bulk: {embedder.answered:,} vectors from the table)" if embedder else ""
    print(f"  processed in {process_s:.0f} s ({total / process_s:,.0f}/s){bulk}")
    return {
        "bulk": embedder is not None,
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


def _vector_recall(mem: Memory, questions: list[Question]) -> tuple[float, float]:
    """The message layer's vector search (HNSW above the index threshold) against exact
    search over the same vectors, top 10: recall@10 of the ids, and the found items' mean
    similarity over the exact ones' (1.0: as close; the figure that means something where
    many vectors are near-duplicates of one another, as ``--bulk``'s derived ones are)."""
    store = mem.store
    emb = mem.embedder
    ids, matrix = _message_vectors(mem)
    found, kept = 0, []
    for q in questions:
        qvec = np.asarray(emb.embed([q.text])[0], dtype=np.float32)
        got = store.vector_messages("default", HEAVY, qvec, emb.id, LIMIT, SearchFilters())
        sims = matrix @ qvec
        best = np.argsort(-sims, kind="stable")[:LIMIT]
        found += len({pk for pk, _ in got} & {int(pk) for pk in ids[best]})
        kept.append(float(np.mean([s for _, s in got])) / float(np.mean(sims[best])))
    return found / (LIMIT * len(questions)), float(np.mean(kept))


def _message_vectors(mem: Memory) -> tuple[np.ndarray, np.ndarray]:
    """Every message vector of the heavy user, as stored: (message pks, matrix)."""
    if mem.store.url.startswith("postgresql"):
        import psycopg
        from pgvector.psycopg import register_vector

        with psycopg.connect(mem.settings.database_url) as c:
            register_vector(c)
            rows = c.execute(
                "SELECT item_pk, vec FROM vectors WHERE project_id = 'default' AND "
                "user_id = %s AND kind = 'message' AND embedder = %s",
                (HEAVY, mem.embedder.id),
            ).fetchall()
        pks = np.array([r[0] for r in rows], dtype=np.int64)
        return pks, np.array([r[1].to_numpy() for r in rows], dtype=np.float32)
    scope = mem.store.vectors.peek(("default", HEAVY, "message", mem.embedder.id))
    if scope is None:
        raise SystemExit("the heavy user's message vectors are not loaded")
    return np.asarray(scope.ids[: scope.n], dtype=np.int64), scope.matrix[: scope.n]


def _forget_queries(mem: Memory) -> None:
    """Forget the vectors of the texts embedded so far: the local model keeps recent texts'
    (a prompt sent again costs nothing), and every timed pass embeds its questions as new
    ones, as a user's next question is (before, a second round of the same searches reused
    them: ~11 ms a search less on a CPU without VNNI)."""
    recent = getattr(mem.embedder, "_recent", None)
    if recent is not None:
        recent.clear()


def _settle(mem: Memory) -> None:
    """Wait for the store's background index builds that the first searches started (SQLite:
    the user's HNSW graphs; PostgreSQL: a per-user index, if the user qualifies)."""
    mem.search("what did we talk about", user_id=HEAVY, limit=LIMIT)
    if mem.store.url.startswith("postgresql"):
        deadline = time.monotonic() + 1800
        while mem.store._user_index_thread is not None and time.monotonic() < deadline:
            time.sleep(0.2)
    else:
        mem.store.vectors.wait_indexes()


def _rss_mib(field: str = "VmRSS") -> float:
    """A memory figure of this process from /proc/self/status: ``VmRSS``, its resident set,
    or ``RssAnon``, its own memory without the pages of the files it maps (RSS counts
    those once per mapping: the model, and the database with ``sqlite_mmap_bytes``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _memory_line(row: dict[str, Any]) -> str:
    return (
        f"RSS {row['rss_mib']:.0f} MiB (anonymous {row['anon_mib']:.0f}, "
        f"peak {row['max_rss_mib']:.0f})"
    )


def run_user(args: argparse.Namespace, sizes: list[int]) -> dict[str, Any]:
    beam = beam_dataset("all", None)
    questions = beam.users[0].questions
    docs = [d for s in beam.users[0].sessions for d in s.docs]
    if args.reuse:
        # A store kept by an earlier run (--keep-dir, --keep): measured again, not built, so
        # that two commits can be timed in turn on the same data.
        print(f"\n== one user's history: {args.reuse} (kept; load {loadavg()}) ==")
        heavy = _heavy_messages(args.reuse)
        row = _measure(args.reuse, questions, docs, heavy, args.search_rounds)
        print(f"  {_memory_line(row)}")
        return {"reused": row}
    backends = ("sqlite", "postgres") if args.backend == "both" else (args.backend,)
    results: dict[str, Any] = {}
    for backend in backends:
        for n in sizes:
            print(f"\n== one user's history, {backend}: {n:,} messages (load {loadavg()}) ==")
            with _store(args, backend, n) as (url, size_mib):
                derived = _derived_vectors(beam, n, args.noise) if args.bulk else None
                build = _build(url, beam, n, args.other_users, derived)
                del derived  # its table is not the measured process's memory
                gc.collect()
                if backend == "postgres":
                    print(f"  {analyze_postgres(url)}")
                measured = _measure(
                    url, questions, docs, build["heavy_messages"], args.search_rounds
                )
                row = {**build, **measured, "db_mib": size_mib()}
            print(f"  store {row['db_mib']:.0f} MiB, {_memory_line(row)}")
            results[f"{backend}:{n}"] = row
    return results


def _heavy_messages(url: str) -> int:
    sql = f"SELECT count(*) FROM messages WHERE user_id = '{HEAVY}'"
    if url.startswith("postgresql"):
        import psycopg

        with psycopg.connect(url) as c:
            row = c.execute(sql).fetchone()
    else:
        import sqlite3

        from stratamem.store.sqlite import sqlite_path

        with contextlib.closing(sqlite3.connect(sqlite_path(url))) as c:
            row = c.execute(sql).fetchone()
    if not row or not row[0]:
        raise SystemExit(f"no messages of the user {HEAVY!r} in {url}")
    return int(row[0])


def _measure(
    url: str, questions: list[Question], docs: list[Doc], heavy_messages: int, rounds: int = 1
) -> dict[str, Any]:
    opened = time.perf_counter()
    with Memory(url, max_content_chars=MAX_CONTENT_CHARS) as mem:
        _settle(mem)
        # What a new process waits before its searches are the ones timed below: opening,
        # the model, the first search and the HNSW graphs (built, or restored from the
        # files a SQLite store keeps beside it).
        ready_s = time.perf_counter() - opened
        for q in questions[:3]:  # warm
            mem.search(q.text, user_id=HEAVY, limit=LIMIT, as_of=q.as_of)
        _forget_queries(mem)
        r10, search_s = _evidence_recall(mem, HEAVY, questions, docs, "")
        for _ in range(rounds - 1):  # the same searches again: only their times are new
            _forget_queries(mem)
            search_s += _evidence_recall(mem, HEAVY, questions, docs, "")[1]
        mem.search(questions[0].text, user_id=ALONE, limit=LIMIT)
        alone_r10, _ = _evidence_recall(mem, ALONE, questions, docs, "alone-")
        session = mem.sessions.get(f"h-{(heavy_messages - 1) // SESSION_SIZE}")
        context_s = []
        for q in questions:
            t0 = time.perf_counter()
            session.get_memory(q.text)
            context_s.append(time.perf_counter() - t0)
        vector_recall, similarity_kept = _vector_recall(mem, questions)
        _forget_queries(mem)
        stages = stage_medians(lambda: _evidence_recall(mem, HEAVY, questions, docs, ""))
    search, context = summarize(search_s), summarize(context_s)
    index_mib = _index_files_mib(url)
    print(f"  ready to search in {ready_s:.1f} s after opening; HNSW files {index_mib:.0f} MiB")
    print(format_summary("mem.search, limit 10", search))
    print(format_stages(stages))
    print(format_summary("get_memory", context))
    print(
        f"  BEAM chat 1 evidence R@10 {r10:.1f} (held alone: {alone_r10:.1f}); "
        f"vectors recall@10 vs exact {vector_recall:.3f} (similarity {similarity_kept:.4f} of "
        "exact)"
    )
    return {
        "search": search.as_dict(),
        "get_memory": context.as_dict(),
        "evidence_r10": r10,
        "evidence_r10_alone": alone_r10,
        "vector_recall_at_10": vector_recall,
        "vector_similarity_kept": similarity_kept,
        "stages_ms": stages,
        "ready_s": ready_s,
        "index_files_mib": index_mib,
        "rss_mib": _rss_mib(),
        "anon_mib": _rss_mib("RssAnon"),
        "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "load_after": loadavg(),
    }


def _index_files_mib(url: str) -> float:
    """The HNSW index files a SQLite store keeps beside its file (none on PostgreSQL)."""
    if url.startswith("postgresql"):
        return 0.0
    from stratamem.store.sqlite import sqlite_path
    from stratamem.store.sqlite._index_files import SQLiteIndexFiles

    return sum(Path(f).stat().st_size for f in SQLiteIndexFiles(sqlite_path(url)).files()) / 2**20


@contextlib.contextmanager
def _store(
    args: argparse.Namespace, backend: str, n: int
) -> Iterator[tuple[str, Callable[[], float]]]:
    """A fresh store for one size: its URL and a function giving its size on disk in MiB.
    SQLite: ``user-<n>.db`` in ``--keep-dir`` (kept) or a temporary folder; PostgreSQL: the
    database ``stratamem_bench_user_<n>`` on ``--pg``'s server, kept with ``--keep``."""
    if backend == "postgres":
        name = f"stratamem_bench_user_{n}"
        with postgres_database(postgres_admin_url(args.pg), name, keep=args.keep) as url:

            def database_mib() -> float:
                import psycopg

                with psycopg.connect(url) as c:
                    row = c.execute("SELECT pg_database_size(current_database())").fetchone()
                return float(row[0]) / 2**20 if row else float("nan")

            yield url, database_mib
            if args.keep:
                print(f"  kept: {url}")
        return
    with contextlib.ExitStack() as stack:
        if args.keep_dir:
            folder = Path(args.keep_dir)
            folder.mkdir(parents=True, exist_ok=True)
        else:
            import tempfile

            folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        path = folder / f"user-{n}.db"
        for old in folder.glob(path.name + "*"):
            shutil.rmtree(old) if old.is_dir() else old.unlink()
        yield (  # the database's files (the HNSW folder's: _index_files_mib)
            f"sqlite:///{path}",
            lambda: (
                sum(f.stat().st_size for f in folder.glob(path.name + "*") if f.is_file()) / 2**20
            ),
        )
