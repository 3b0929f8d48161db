"""Scale benchmark: fact search over a large project, and write-pipeline throughput with
1, 2 and 4 worker processes, on PostgreSQL (pgvector HNSW) and on SQLite.

Nothing is asserted; the script prints figures and PASS/MISS against the targets.

Search (``--part search``)
--------------------------
One project holds ``--facts`` facts (default 1,000,000): half belong to one heavy user,
the rest to ten users of 5% each, interleaved in arrival order, so searches run through
the HNSW index both where the user's rows are half of it and where they are a twentieth.

* Real: the vectors' space. Every distinct LoCoMo turn (about 3,400 texts) is embedded by
  the local model (all-MiniLM-L6-v2 int8); each fact's text is a synthetic rewrite of one
  pool text (``_common.synthetic_texts``) and its vector that text's real vector plus
  noise (cosine ~0.9; ``search._corpus``, as bench/search.py builds its messages): ~3,400
  tight clusters of near-duplicates, a hard case for HNSW recall.
* PostgreSQL, bulk-loaded the way an operator would migrate a project: facts with their
  tsvector (the store's own ``fts_body`` words, ``to_tsvector('stratamem_fts', ..)``) and
  vectors by COPY into a fresh database made by the engine's migrations, vacuumed (as
  autovacuum would; a kept database of an earlier build: vacuum it once), then the HNSW
  index is built by the store's own ``_prepare_vectors`` (the index the engine creates and
  uses; ``maintenance_work_mem`` raised for the build only).
* SQLite, through the engine's write path (``complete_batch`` with the facts, 1,000 per
  batch); its vectors are searched in process (usearch HNSW above 20,000 per user).
  SQLite holds a project on one machine: it is run at ``--sqlite-facts`` (default 200,000).
* Measured: ``mem.search(query, user_id=..., limit=10, layers=["fact"])``, the whole read
  path (full text + vectors, fusion, rows), with the query's embedding computed beforehand
  (the embedder answers from a cache): the figure compared with the target, p95 <= 20 ms,
  round trips to PostgreSQL on loopback included. The query embedding (local model) is
  timed on its own. Then the parts: ``store.vector_items("fact", ...)`` (60 candidates,
  what search asks for) and ``store.fulltext_items("fact", ...)``; recall@10 of the vector
  part against exact search (numpy over the same vectors).

One user's history (``--part user``)
------------------------------------
One user with ``--user-messages`` messages (10,000; ``10000,100000`` for both) beside other
users, on SQLite and PostgreSQL (``--backend``), all through the real engine offline:
acceptance and processing rates,
``mem.search`` and ``get_memory`` p50 / p95, a planted real chat's evidence recall beside the
same chat held alone, vector recall@10 against exact, size on disk and memory
(``bench/_user_history.py`` says how the history is made).

Pipeline (``--part pipeline``)
------------------------------
``--messages`` LoCoMo turns (default 2,000; a user per conversation session, sent four at a
time) are stored with no worker running, then 1, 2 and 4 ``stratamem worker`` processes
are started on the backlog (offline mode: heuristic extraction, no LLM; ``--embedder
hash`` by default, ``local`` for the bundled model). Throughput is the messages processed
after every worker was up, divided by the time from then until none was left.

    python bench/scale.py                      # everything, 1,000,000 facts (see docs)
    python bench/scale.py --quick              # 50,000 facts, 1,000 messages (~3 min)
    python bench/scale.py --part search --backend postgres --facts 200000
    python bench/scale.py --part search --reuse postgresql://.../stratamem_bench_scale
    python bench/scale.py --part pipeline --embedder local --json
    python bench/scale.py --part user --backend sqlite --user-messages 10000,100000 --json
    python bench/scale.py --part user --backend postgres --user-messages 10000 --keep
    python bench/scale.py --part user --backend sqlite --user-messages 1000000 --bulk

PostgreSQL: ``--pg`` is a superuser URL of the server (default $STRATAMEM_TEST_POSTGRES_URL,
else postgresql://postgres@127.0.0.1:5432/postgres); the benchmark creates its own
databases and drops them unless ``--keep``. ``--reuse URL`` searches a database kept by
an earlier run (same --facts and --seed) instead of building one; with ``--part user`` it
measures a store kept by ``--keep-dir`` or ``--keep`` again (to time two commits in turn;
``--search-rounds N`` times the searches N times over).
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit, urlunsplit

import numpy as np

from _common import (
    Summary,
    emit_json,
    format_summary,
    loadavg,
    locomo_questions,
    locomo_turns,
    machine_info,
    postgres_admin_url,
    postgres_database,
    stopwatch,
    summarize,
    verdict,
)
from _user_history import run_user
from search import _corpus, _embed_all, _pool_texts
from stratamem import Memory
from stratamem.embed import Embedder, make_embedder
from stratamem.store import ClaimedBatch, FactWrite, LayerWrite
from stratamem.store._text import fts_query_terms

SEARCH_P95_TARGET_MS = 20.0
LIMIT = 10
CANDIDATES = 60  # what Recaller.search asks each retriever for (max(60, 2 * limit))
PROJECT = "default"
LIGHT_USERS = 10
SQLITE_BATCH = 1000
WORKER_COUNTS = (1, 2, 4)


# -- helpers -------------------------------------------------------------------------------


class CachedEmbedder:
    """The local embedder, answering queries embedded beforehand from a cache: search is
    timed without the model (its cost is measured on its own)."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.cache: dict[str, np.ndarray] = {}

    @property
    def id(self) -> str:
        return self.inner.id

    @property
    def name(self) -> str:
        return f"{self.inner.name} (cached queries)"

    @property
    def dim(self) -> int:
        return self.inner.dim

    def prime(self, texts: Sequence[str]) -> list[float]:
        """Embed each text alone, as a query is; the seconds each took."""
        seconds = []
        for text in texts:
            t0 = time.perf_counter()
            self.cache[text] = self.inner.embed([text])[0]
            seconds.append(time.perf_counter() - t0)
        return seconds

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        missing = [t for t in texts if t not in self.cache]
        if missing:
            for t, v in zip(missing, self.inner.embed(missing), strict=True):
                self.cache[t] = v
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.vstack([self.cache[t] for t in texts]).astype(np.float32)


def _with_options(url: str, **settings: str) -> str:
    parts = urlsplit(url)
    options = " ".join(f"-c {k}={v}" for k, v in settings.items())
    query = urlencode({"options": options}, quote_via=quote)
    return urlunsplit(parts._replace(query=query))


def _owners(n: int) -> list[str]:
    """Which user holds each fact, in arrival order: every other fact is the heavy user's,
    the rest go round the ten others, so each user's rows are spread over the table as
    they would be after months of interleaved traffic."""
    return ["heavy" if i % 2 == 0 else f"u{(i // 2) % LIGHT_USERS:02d}" for i in range(n)]


def _observed(i: int) -> str:
    # The engine's own timestamp form (microseconds, Z): ranking parses it.
    return (datetime(2023, 1, 1, tzinfo=timezone.utc) + timedelta(seconds=30 * i)).strftime(
        "%Y-%m-%dT%H:%M:%S.%fZ"
    )


def _time_each(fn: Callable[[Any], Any], items: Sequence[Any]) -> tuple[Summary, list[Any]]:
    samples, out = [], []
    for item in items:
        t0 = time.perf_counter()
        out.append(fn(item))
        samples.append(time.perf_counter() - t0)
    return summarize(samples), out


def _similarity_kept(
    approx: list[list[int]], exact: list[list[int]], sim: dict[int, np.ndarray], qvecs: np.ndarray
) -> float:
    """Mean cosine of the approximate top 10 over that of the exact top 10: how much worse
    the neighbours a miss returns are (1.0: as good). ``sim[pk]`` is a fact's vector."""
    ratios = []
    for a, e, q in zip(approx, exact, qvecs, strict=False):
        if a and e:
            got = float(np.mean([sim[pk] @ q for pk in a[:LIMIT]]))
            best = float(np.mean([sim[pk] @ q for pk in e[:LIMIT]]))
            ratios.append(got / best if best > 0 else 1.0)
    return float(np.mean(ratios)) if ratios else float("nan")


def _recall(approx: list[list[int]], exact: list[list[int]]) -> float:
    scores = [
        len(set(a[:LIMIT]) & set(e[:LIMIT])) / min(LIMIT, len(e))
        for a, e in zip(approx, exact, strict=True)
        if e
    ]
    return float(np.mean(scores)) if scores else float("nan")


# -- search: building the project ---------------------------------------------------------


def _load_postgres(
    url: str, embedder: CachedEmbedder, texts: list[str], vecs: np.ndarray
) -> dict[str, Any]:
    """COPY the facts and their vectors into a database made by the engine, then build the
    engine's HNSW index over them."""
    import psycopg
    from pgvector.psycopg import register_vector

    from stratamem.store.postgres import PostgresStore
    from stratamem.store.postgres._fulltext import fts_body

    Memory(url, embedder=embedder, workers=0).close()  # migrations, as an app would
    owners = _owners(len(texts))
    out: dict[str, Any] = {}
    with psycopg.connect(url, autocommit=True) as c:
        register_vector(c)
        c.execute(
            "INSERT INTO meta (key, value) VALUES ('embedder', %s) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (embedder.id,),
        )
        c.execute(
            "CREATE UNLOGGED TABLE fact_load (pk bigint, user_id text, text text, doc text, "
            "len integer, observed text)"
        )
        with stopwatch() as t_facts:
            with c.cursor().copy("COPY fact_load FROM STDIN") as copy:
                for i, text in enumerate(texts):
                    doc, length = fts_body(text)
                    copy.write_row((i + 1, owners[i], text, doc, length, _observed(i)))
            c.execute(
                "INSERT INTO facts (pk, project_id, id, user_id, text, kind, observed_at, "
                "confidence, message_ids, model, prompt_version, created_at, fts, fts_len) "
                "SELECT pk, %s, 'f' || pk, user_id, text, 'fact', observed, 0.9, "
                "ARRAY['m' || pk], 'bench', 'bench', observed, "
                "to_tsvector('stratamem_fts', doc), len FROM fact_load ORDER BY pk",
                (PROJECT,),
            )
            c.execute("DROP TABLE fact_load")
            c.execute(
                "SELECT setval(pg_get_serial_sequence('facts', 'pk'), (SELECT max(pk) FROM facts))"
            )
        out["facts_s"] = t_facts[0]
        with (
            stopwatch() as t_vectors,
            c.cursor().copy(
                "COPY vectors (project_id, user_id, kind, item_pk, embedder, dim, vec) "
                "FROM STDIN WITH (FORMAT BINARY)"
            ) as copy,
        ):
            copy.set_types(["text", "text", "text", "int8", "text", "int4", "vector"])
            dim = int(vecs.shape[1])
            for i in range(len(texts)):
                copy.write_row((PROJECT, owners[i], "fact", i + 1, embedder.id, dim, vecs[i]))
        out["vectors_s"] = t_vectors[0]
        # VACUUM, not only ANALYZE: rows fresh from COPY carry no hint bits and are not in
        # the visibility map, so every search would first dirty the pages it reads (and
        # counts could not skip the heap). Autovacuum does this on a live server (and a
        # server with it off, like the CI image's, never would): measured both ways on the
        # same database, heavy user's mem.search p50 21.6 -> 12.6 ms.
        c.execute("VACUUM (ANALYZE) facts")
        c.execute("VACUUM (ANALYZE) vectors")
    # The store's own index, built over the loaded rows with memory enough for the graph.
    builder = PostgresStore(
        _with_options(url, maintenance_work_mem="6GB", max_parallel_maintenance_workers="2"),
        pool_size=1,
    )
    try:
        with stopwatch() as t_index:
            builder._prepare_vectors({"fact": int(vecs.shape[1])})
    finally:
        builder.close()
    out["hnsw_s"] = t_index[0]
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("ANALYZE vectors")
        out["db_mib"] = (
            c.execute("SELECT pg_database_size(currentpostgres_database())").fetchone()[0] / 2**20
        )
        out["hnsw_mib"] = (
            c.execute(
                "SELECT pg_relation_size(%s::regclass)", (f"vectors_hnsw_fact_{vecs.shape[1]}",)
            ).fetchone()[0]
            / 2**20
        )
    return out


def _load_sqlite(mem: Memory, texts: list[str], vecs: np.ndarray) -> dict[str, Any]:
    """Facts through the engine's write path: one job per 1,000 facts of a user, claimed
    and completed with the facts as its derived layer."""
    store = mem.store
    owners = _owners(len(texts))
    by_user: dict[str, list[int]] = defaultdict(list)
    for i, user in enumerate(owners):
        by_user[user].append(i)
    embedder_id = mem.embedder.id
    with stopwatch() as t_load:
        for user, rows in by_user.items():
            session = mem.sessions.create(user_id=user, session_id=f"s-{user}")
            for start in range(0, len(rows), SQLITE_BATCH):
                part = rows[start : start + SQLITE_BATCH]
                session.add_messages([{"role": "user", "content": f"batch {start} of {user}"}])
                batch: ClaimedBatch | None = store.claim_batch("bench-loader", 600.0, 10)
                assert batch is not None and batch.user_id == user
                facts = [
                    FactWrite(
                        id=f"f{i + 1}",
                        text=texts[i],
                        kind="fact",
                        message_ids=[batch.messages[0].id],
                        confidence=0.9,
                        model="bench",
                        prompt_version="bench",
                        vector=vecs[i],
                        observed_at=_observed(i),
                    )
                    for i in part
                ]
                store.complete_batch(
                    batch,
                    embedder=embedder_id,
                    vectors=vecs[part[:1]],
                    layers=LayerWrite(facts=facts),
                )
    stats = mem.stats()
    return {"facts_s": t_load[0], "db_mib": stats["size_bytes"] / 2**20}


# -- search: measuring -----------------------------------------------------------------------


def _measure_user(
    mem: Memory,
    user: str,
    queries: list[str],
    qvecs: np.ndarray,
    exact_pks: list[list[int]],
    vector_of: dict[int, np.ndarray],
) -> dict[str, Any]:
    store = mem.store
    emb_id = mem.embedder.id
    first = time.perf_counter()
    mem.search(queries[0], user_id=user, limit=LIMIT, layers=["fact"])
    cold_ms = (time.perf_counter() - first) * 1000
    # After a first search PostgreSQL's store reads a large table's vocabulary (~2 s per
    # million rows) and makes a large user's own indexes (seconds) in the background; a
    # server that has been up a while has them, so the warm searches are timed after. (The
    # first search of a user's vectors counts them exactly; the second goes through the
    # shared index, which is what asks for the user's own.)
    mem.search(queries[1], user_id=user, limit=LIMIT, layers=["fact"])
    vocabulary = getattr(store, "_vocabulary", None)
    # SQLite builds a large user's HNSW index in the background (tens of seconds at 100,000
    # vectors); until then its searches scan exactly. A server up a while has it.
    wait_indexes = getattr(getattr(store, "vectors", None), "wait_indexes", None)
    if callable(wait_indexes):
        wait_indexes()
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and (
        (vocabulary is not None and "facts" not in vocabulary)
        or getattr(store, "_user_index_thread", None) is not None
    ):
        time.sleep(0.05)
    settle_s = time.perf_counter() - first - cold_ms / 1000
    search, hits = _time_each(
        lambda q: mem.search(q, user_id=user, limit=LIMIT, layers=["fact"]), queries
    )
    vector, found = _time_each(
        lambda v: store.vector_items("fact", PROJECT, user, v, emb_id, CANDIDATES), list(qvecs)
    )
    terms = [fts_query_terms(q) for q in queries]
    fulltext, _ = _time_each(
        lambda t: store.fulltext_items("fact", PROJECT, user, t, CANDIDATES) if t else [], terms
    )
    approx = [[pk for pk, _ in r] for r in found[: len(exact_pks)]]
    out: dict[str, Any] = {
        "cold_first_search_ms": cold_ms,
        "background_settle_s": settle_s,
        "search": search,
        "vector": vector,
        "fulltext": fulltext,
        "recall_at_10": _recall(approx, exact_pks),
        "similarity_kept": _similarity_kept(approx, exact_pks, vector_of, qvecs),
        "hits_per_search": float(np.mean([len(h) for h in hits])),
    }
    if hasattr(store, "RANK_CAP"):
        # Diagnostic: the same full text with every match of the kept terms ranked (no
        # rank cap), to show what the cap saves. Not what search does.
        cap = store.RANK_CAP
        store.RANK_CAP = 10**9
        try:
            uncapped, _ = _time_each(
                lambda t: store.fulltext_items("fact", PROJECT, user, t, CANDIDATES) if t else [],
                terms,
            )
        finally:
            store.RANK_CAP = cap
        out["fulltext_uncapped"] = uncapped
    return out


def _ef_sweep(
    url: str, user: str, qvecs: np.ndarray, exact_pks: list[list[int]], emb_id: str
) -> list[dict[str, Any]]:
    """Recall@10 and latency of the vector part at other ``postgres_ef_search`` values."""
    from stratamem.store.postgres import PostgresStore

    rows = []
    for ef in (100, 400, 1000):
        store = PostgresStore(url, ef_search=ef, pool_size=2)
        try:
            summary, found = _time_each(
                lambda v, st=store: st.vector_items("fact", PROJECT, user, v, emb_id, CANDIDATES),
                list(qvecs[: len(exact_pks)]),
            )
        finally:
            store.close()
        approx = [[pk for pk, _ in r] for r in found]
        rows.append(
            {"ef_search": ef, "recall_at_10": _recall(approx, exact_pks), "vector": summary}
        )
    return rows


def _exact(
    vecs: np.ndarray, owners: list[str], user: str, qvecs: np.ndarray, pks: np.ndarray
) -> list[list[int]]:
    """Exact top-10 fact pks of ``user`` for each query vector (inner product = cosine);
    ``pks[i]`` is the stored pk of fact ``i``."""
    rows = np.fromiter((i for i, o in enumerate(owners) if o == user), dtype=np.int64)
    sims = vecs[rows] @ qvecs.T  # (user's facts, queries)
    out = []
    for j in range(sims.shape[1]):
        col = sims[:, j]
        top = np.argpartition(-col, LIMIT)[:LIMIT]
        top = top[np.argsort(-col[top])]
        out.append([int(pks[rows[t]]) for t in top])
    return out


def _fact_pks(url: str, n: int) -> np.ndarray:
    """The stored pk of each fact ``i`` (its id is ``f{i + 1}``)."""
    pks = np.zeros(n, dtype=np.int64)
    conn = _Progress(url)._conn
    try:
        for fid, pk in conn.execute("SELECT id, pk FROM facts"):
            pks[int(fid[1:]) - 1] = pk
    finally:
        conn.close()
    return pks


def _print_user(label: str, r: dict[str, Any]) -> None:
    s = r["search"]
    print(
        f"  {label}: search p50 {s.p50:.2f} ms, p95 {s.p95:.2f} ms "
        f"[{verdict(s.p95, SEARCH_P95_TARGET_MS, higher_is_better=False)} against "
        f"<= {SEARCH_P95_TARGET_MS:.0f} ms]; first search {r['cold_first_search_ms']:.0f} ms, "
        f"then {r['background_settle_s']:.1f} s of the store's background work; "
        f"recall@10 {r['recall_at_10']:.3f} (similarity kept {r['similarity_kept']:.3f})"
    )
    print(format_summary("mem.search, layers=[fact], limit 10", s))
    print(format_summary(f"store.vector_items('fact'), {CANDIDATES} candidates", r["vector"]))
    print(format_summary(f"store.fulltext_items('fact'), {CANDIDATES} candidates", r["fulltext"]))
    if "fulltext_uncapped" in r:
        print(format_summary("  diagnostic: full text, no rank cap", r["fulltext_uncapped"]))
    for row in r.get("ef_sweep", ()):
        print(
            f"    ef_search {row['ef_search']:4d}: recall@10 {row['recall_at_10']:.3f}, vector "
            f"part p50 {row['vector'].p50:.2f} ms, p95 {row['vector'].p95:.2f} ms"
        )


class Pool:
    """The real texts and their local-model vectors, and the embedded questions: made once
    per run, shared by both backends."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.embedder = CachedEmbedder(make_embedder("local"))
        self.texts = _pool_texts(args.pool)
        with stopwatch() as t_pool:
            self.vecs = _embed_all(self.embedder.inner, self.texts)
        self.queries = locomo_questions(args.queries, seed=args.seed)
        self.query_embedding = summarize(self.embedder.prime(self.queries))
        self.qvecs = self.embedder.embed(self.queries)
        print(
            f"\npool of {len(self.texts):,} real texts embedded in {t_pool[0]:.1f} s; "
            f"{len(self.queries)} LoCoMo questions"
        )
        print(format_summary("query embedding (local model), alone", self.query_embedding))


def run_search(args: argparse.Namespace, pool: Pool, backend: str, n: int) -> dict[str, Any]:
    print(f"\n== search, {backend}: {n:,} facts in one project (load {loadavg()}) ==")
    embedder, queries, qvecs = pool.embedder, pool.queries, pool.qvecs
    embed_summary = pool.query_embedding
    with stopwatch() as t_corpus:
        texts, vecs = _corpus(pool.texts, pool.vecs, n, seed=args.seed, noise=args.noise)
    owners = _owners(n)
    print(f"  corpus of {n:,} made in {t_corpus[0]:.1f} s")
    result: dict[str, Any] = {"facts": n, "query_embedding": embed_summary.as_dict()}
    n_exact = min(len(queries), args.recall_queries)
    targets = {"heavy": "heavy", "light": "u00"}

    def measure(mem: Memory) -> None:
        pks = _fact_pks(mem.settings.database_url, n)
        for label, user in targets.items():
            share = owners.count(user)
            path = "HNSW" if share > mem.settings.vector_index_threshold else "exact scan"
            exact = _exact(vecs, owners, user, qvecs[:n_exact], pks)
            vector_of = {int(pks[i]): vecs[i] for i, o in enumerate(owners) if o == user}
            r = _measure_user(mem, user, queries, qvecs, exact, vector_of)
            if mem.store.url.startswith("postgres") and path == "HNSW":
                r["ef_sweep"] = _ef_sweep(
                    mem.settings.database_url, user, qvecs, exact, mem.embedder.id
                )
            _print_user(f"{label} user ({share:,} facts, vectors by {path})", r)
            r["load_after"] = loadavg()
            for row in r.get("ef_sweep", ()):
                row["vector"] = row["vector"].as_dict()
            result[label] = {
                "user_facts": share,
                "vector_path": path,
                **{k: v.as_dict() if isinstance(v, Summary) else v for k, v in r.items()},
            }

    if backend == "postgres":
        admin = postgres_admin_url(args.pg)
        if args.reuse:
            url = args.reuse
            print(f"  reusing {urlsplit(url).path[1:]} (no build)")
            with Memory(url, embedder=embedder, workers=0) as mem:
                measure(mem)
            return result
        name = f"stratamem_bench_scale_{n}"
        with postgres_database(admin, name, keep=args.keep) as url:
            build = _load_postgres(url, embedder, texts, vecs)
            result["build"] = build
            print(
                f"  build: facts (COPY + tsvector + indexes) {build['facts_s']:.0f} s, vectors "
                f"(COPY) {build['vectors_s']:.0f} s, HNSW index {build['hnsw_s']:.0f} s "
                f"({build['hnsw_mib']:.0f} MiB); database {build['db_mib']:.0f} MiB"
            )
            if args.keep:
                print(f"  kept: --reuse {url}")
            with Memory(url, embedder=embedder, workers=0) as mem:
                measure(mem)
        return result
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'scale.db'}"
        with Memory(url, embedder=embedder, workers=0) as mem:
            build = _load_sqlite(mem, texts, vecs)
        result["build"] = build
        print(
            f"  build: facts through complete_batch {build['facts_s']:.0f} s; file "
            f"{build['db_mib']:.0f} MiB"
        )
        with Memory(url, embedder=embedder, workers=0) as mem:
            measure(mem)
    return result


# -- pipeline --------------------------------------------------------------------------------


def _pipeline_messages(n: int) -> dict[str, list[dict[str, Any]]]:
    """The first ``n`` LoCoMo turns, a user per conversation session, in order."""
    by_user: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for t in locomo_turns()[:n]:
        by_user[f"{t.sample_id}-s{t.session}"].append(t.as_message())
    return by_user


class _Progress:
    """Processed-message count of a store, over one connection kept open."""

    def __init__(self, url: str) -> None:
        if url.startswith("postgresql"):
            import psycopg

            self._conn: Any = psycopg.connect(url, autocommit=True)
        else:
            import sqlite3

            from stratamem.store.sqlite import sqlite_path

            self._conn = sqlite3.connect(sqlite_path(url))

    def processed(self) -> int:
        sql = "SELECT count(*) FROM messages WHERE status = 'processed'"
        return int(self._conn.execute(sql).fetchone()[0])

    def close(self) -> None:
        self._conn.close()


def _drain(url: str, workers: int, embedder: str, total: int, workdir: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATAMEM_")}
    env.update(
        {"STRATAMEM_DATABASE_URL": url, "STRATAMEM_EMBEDDER": embedder, "STRATAMEM_LLM": "none"}
    )
    logs = [workdir / f"worker-{workers}-{k}.log" for k in range(workers)]
    procs = []
    progress = _Progress(url)
    started = time.perf_counter()
    for log in logs:
        with open(log, "wb") as out:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "stratamem", "-v", "worker", "--threads", "1"],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                )
            )
    try:
        # Up: each worker has logged that it runs (its model loaded, its queue started).
        while not all("worker running" in log.read_text(errors="replace") for log in logs):
            if any(p.poll() is not None for p in procs):
                raise SystemExit("a worker exited:\n" + "\n".join(x.read_text() for x in logs))
            time.sleep(0.05)
        t0 = time.perf_counter()
        done0 = progress.processed()
        while (done := progress.processed()) < total:
            if time.perf_counter() - t0 > 900:
                raise SystemExit(f"workers stalled at {done}/{total}")
            time.sleep(0.1)
        t1 = time.perf_counter()
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(60)
        progress.close()
    return {
        "workers": workers,
        "startup_s": t0 - started,
        "before_all_up": done0,
        "messages": total - done0,
        "seconds": t1 - t0,
        "msgs_per_s": (total - done0) / (t1 - t0) if t1 > t0 else float("nan"),
    }


def run_pipeline(args: argparse.Namespace, backend: str, n: int) -> dict[str, Any]:
    print(
        f"\n== pipeline, {backend}: {n:,} messages, offline, {args.embedder} embedder "
        f"(load {loadavg()}) =="
    )
    users = _pipeline_messages(n)
    total = sum(map(len, users.values()))
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for workers in WORKER_COUNTS:
            if backend == "postgres":
                ctx: Any = postgres_database(
                    postgres_admin_url(args.pg),
                    f"stratamem_bench_pipeline_{secrets.token_hex(3)}",
                    keep=False,
                )
            else:
                ctx = _sqlite_url(Path(tmp) / f"pipeline-{workers}.db")
            with ctx as url:
                with Memory(url, embedder=args.embedder, workers=0) as mem:
                    for user, messages in users.items():
                        s = mem.sessions.create(user_id=user, session_id=user)
                        for k in range(0, len(messages), 4):
                            s.add_messages(messages[k : k + 4])
                run = _drain(url, workers, args.embedder, total, Path(tmp))
            runs.append(run)
            print(
                f"  {workers} worker process{'es' if workers > 1 else ''}: "
                f"{run['msgs_per_s']:7.1f} messages/s ({run['messages']:,} in "
                f"{run['seconds']:.1f} s after all were up; {run['before_all_up']} done "
                f"during the {run['startup_s']:.1f} s start)"
            )
    return {"messages": total, "users": len(users), "embedder": args.embedder, "runs": runs}


@contextmanager
def _sqlite_url(path: Path) -> Iterator[str]:
    yield f"sqlite:///{path}"


# -- main -------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", choices=("search", "pipeline", "user", "all"), default="all")
    p.add_argument("--backend", choices=("postgres", "sqlite", "both"), default="both")
    p.add_argument("--facts", type=int, default=1_000_000, help="facts in the project (PostgreSQL)")
    p.add_argument("--sqlite-facts", type=int, default=200_000, help="facts in the SQLite project")
    p.add_argument("--messages", type=int, default=2000, help="pipeline: LoCoMo turns to process")
    p.add_argument(
        "--embedder", choices=("hash", "local"), default="hash", help="pipeline embedder"
    )
    p.add_argument("--queries", type=int, default=100, help="LoCoMo questions to search")
    p.add_argument("--recall-queries", type=int, default=100, help="of which checked for recall")
    p.add_argument("--pool", type=int, default=None, help="cap on real (embedded) pool texts")
    p.add_argument("--noise", type=float, default=0.025, help="per-dim noise of synthetic vectors")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="50,000 facts, 1,000 messages")
    p.add_argument("--pg", help="PostgreSQL superuser URL the benchmark makes databases with")
    p.add_argument("--keep", action="store_true", help="keep the PostgreSQL databases built")
    p.add_argument(
        "--reuse",
        help="--part search: search this kept PostgreSQL database; --part user: measure this "
        "kept store (sqlite:///.../user-N.db or a PostgreSQL URL) again",
    )
    p.add_argument(
        "--user-messages", default="10000", help="--part user: the user's sizes, comma-separated"
    )
    p.add_argument("--other-users", type=int, default=4, help="--part user: users beside it")
    p.add_argument("--keep-dir", help="--part user: keep the SQLite files in this folder")
    p.add_argument(
        "--bulk",
        action="store_true",
        help="--part user: derive the synthetic messages' vectors from their source texts' "
        "(--noise) instead of the model computing them; the rest through the workers",
    )
    p.add_argument(
        "--search-rounds",
        type=int,
        default=1,
        help="--part user: time the user's searches this many times over (more samples, "
        "to time two commits in turn)",
    )
    p.add_argument("--json", action="store_true", help="also print a JSON line of results")
    args = p.parse_args(argv)
    if args.search_rounds < 1:
        p.error("--search-rounds must be at least 1")
    if args.quick:
        args.facts = args.sqlite_facts = 50_000
        args.messages = 1000
    backends = ("postgres", "sqlite") if args.backend == "both" else (args.backend,)

    info = machine_info()
    print(
        f"stratamem scale benchmark: {info['cpu']}, {info['cores']} cores, {info['ram_gib']} GiB "
        f"RAM, engine {info['engine']}, load {info.get('loadavg_1m_at_start')}"
    )
    results: dict[str, Any] = {"machine": info, "quick": args.quick}
    with stopwatch() as t_all:
        if args.part == "user":
            sizes = [int(x) for x in args.user_messages.split(",")]
            results["user"] = run_user(args, sizes)
        pool = Pool(args) if args.part in ("search", "all") else None
        for backend in backends:
            if pool is not None:
                n = args.facts if backend == "postgres" else args.sqlite_facts
                results[f"search_{backend}"] = run_search(args, pool, backend, n)
            if args.part in ("pipeline", "all"):
                results[f"pipeline_{backend}"] = run_pipeline(args, backend, args.messages)
    print(f"\ntotal {t_all[0] / 60:.1f} min")
    if args.json:
        emit_json("scale", results)


if __name__ == "__main__":
    main()
