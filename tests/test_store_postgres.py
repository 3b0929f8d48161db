"""What only the PostgreSQL store has: migrations under a lock, pgvector HNSW indexes per
dimension, the cached full-text statistics of large tables, and its connection URL.

The behaviour every store shares is tested in test_store_contract.py; these tests need a
server (STRATAMEM_TEST_POSTGRES_URL) and are skipped without one, like the contract's
PostgreSQL half.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

import dbsql
from conftest import REPO
from stratamem.errors import StoreError, ValidationError
from stratamem.store import LayerWrite, SearchFilters, SessionRow, mask_url, open_store
from stratamem.store._core.migrations import read_migrations
from stratamem.store.postgres import _fulltext as pg_fts
from stratamem.store.postgres import _store as pg
from test_store_contract import (
    DIM,
    EMB,
    NOW,
    P,
    add,
    claim,
    fact,
    layered,
    message,
    process,
    summary,
    unit,
)


@pytest.fixture
def store(pg_url: str) -> Iterator[pg.PostgresStore]:
    s = pg.PostgresStore(pg_url)
    yield s
    s.close()


def test_processes_starting_together_migrate_once(pg_url: str) -> None:
    code = (
        "import sys\n"
        "from stratamem.store.postgres import PostgresStore\n"
        "PostgresStore(sys.argv[1]).close()\n"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, pg_url], stderr=subprocess.PIPE)
        for _ in range(4)
    ]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()
    versions = dbsql.rows(pg_url, "SELECT version, name FROM schema_migrations ORDER BY version")
    # Each migration file applied once (the numbers may have a gap while a branch that
    # takes the number before is not merged yet).
    files = [(v, name) for v, name, _ in read_migrations("stratamem.store.postgres.migrations")]
    assert versions == files and versions[-1][0] == pg.latest_schema_version()
    assert versions[0][1] == "0001_schema.sql"


def test_a_database_of_a_newer_stratamem_is_refused(store: pg.PostgresStore, pg_url: str) -> None:
    dbsql.execute(pg_url, "INSERT INTO schema_migrations VALUES (99, 'future.sql', 'x')")
    with pytest.raises(StoreError, match="schema version 99, newer"):
        pg.PostgresStore(pg_url)


def test_a_search_path_without_a_schema_is_a_clear_error(pg_url: str) -> None:
    from conftest import with_search_path

    missing = with_search_path(pg_url, "no_such_schema").replace("%2Cpublic", "")
    with pytest.raises(StoreError, match="no schema to create tables in"):
        pg.PostgresStore(missing)


def test_the_url_never_shows_the_password() -> None:
    assert mask_url("postgresql://ana:s3cret@db:5432/m?sslmode=require") == (
        "postgresql://ana:***@db:5432/m?sslmode=require"
    )
    assert mask_url("postgresql://ana@db/m") == "postgresql://ana@db/m"
    assert mask_url("postgresql://db/m") == "postgresql://db/m"


def _indexes(url: str) -> dict[str, str]:
    return dict(
        dbsql.rows(
            url,
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema() "
            "AND tablename = 'vectors' AND indexname LIKE 'vectors_hnsw_%'",
        )
    )


def _index_scans(url: str, name: str) -> int:
    return int(
        dbsql.rows(
            url,
            "SELECT coalesce(sum(idx_scan), 0) FROM pg_stat_user_indexes "
            "WHERE schemaname = current_schema() AND indexrelname = ?",
            name,
        )[0][0]
    )


def test_an_hnsw_index_per_kind_and_dimension_is_made_on_first_write(
    store: pg.PostgresStore, pg_url: str
) -> None:
    assert _indexes(pg_url) == {}
    rows = add(store, [f"note {i}" for i in range(30)])
    process(store)
    made = _indexes(pg_url)
    assert set(made) == {"vectors_hnsw_message_8"}
    assert "hnsw" in made["vectors_hnsw_message_8"]
    assert "vector_ip_ops" in made["vectors_hnsw_message_8"]
    assert "(vec)::vector(8)" in made["vectors_hnsw_message_8"]
    # Above the threshold, search goes through the index, and on so few rows it is exact.
    # The first search is exact and counts the scope; from then on the index answers.
    indexed = pg.PostgresStore(pg_url, vector_index_threshold=10, pool_size=1)
    try:
        q = unit(seed=rows[3].pk)
        first = indexed.vector_messages(P, "u1", q, EMB, 5, SearchFilters())
        with indexed._read() as c:
            c.execute("SELECT pg_stat_force_next_flush()")
        before = _index_scans(pg_url, "vectors_hnsw_message_8")
        found = indexed.vector_messages(P, "u1", q, EMB, 5, SearchFilters())
        assert found == first
        with indexed._read() as c:  # the pool's one connection: the one that searched
            c.execute("SELECT pg_stat_force_next_flush()")
        assert _index_scans(pg_url, "vectors_hnsw_message_8") > before
        exact = store.vector_messages(P, "u1", q, EMB, 5, SearchFilters())
        assert [pk for pk, _ in found] == [pk for pk, _ in exact]
        assert [x for _, x in found] == pytest.approx([x for _, x in exact])
        assert found[0][0] == rows[3].pk
    finally:
        indexed.close()


def test_layer_searches_move_to_the_index_once_their_scope_is_large(pg_url: str) -> None:
    store = pg.PostgresStore(pg_url, vector_index_threshold=10, pool_size=1)
    try:
        rows = add(store, ["facts"])
        process(
            store,
            LayerWrite(
                facts=[fact(f"f{i}", f"f{i}", [rows[0].id], unit(seed=i)) for i in range(20)]
            ),
        )
        q = unit(seed=4)
        first = store.vector_items("fact", P, "u1", q, EMB, 3)  # exact, and counts 20 active facts
        with store._read() as c:
            c.execute("SELECT pg_stat_force_next_flush()")
        before = _index_scans(pg_url, "vectors_hnsw_fact_8")
        assert store.vector_items("fact", P, "u1", q, EMB, 3) == first
        with store._read() as c:
            c.execute("SELECT pg_stat_force_next_flush()")
        assert _index_scans(pg_url, "vectors_hnsw_fact_8") > before
    finally:
        store.close()


def test_small_scopes_are_searched_in_process_and_see_other_processes_writes(
    pg_url: str,
) -> None:
    """A small scope's vectors are cached in the process that searches; rows another
    process adds, an item it embeds again and what it forgets show at the next search."""
    reader, writer = pg.PostgresStore(pg_url), pg.PostgresStore(pg_url)
    try:
        rows = add(writer, [f"note {i}" for i in range(6)])
        process(writer)
        q = unit(seed=rows[2].pk)
        assert reader.vector_messages(P, "u1", q, EMB, 1, SearchFilters())[0][0] == rows[2].pk
        cached = reader.vectors.peek((P, "u1", "message", EMB))
        assert cached is not None and cached.n == 6
        more = add(writer, ["later"], prefix="x")
        process(writer)
        # Briefs take vectors from the cache, and the ones it does not hold yet from the table.
        briefs = reader.recall_briefs(P, "u1", [rows[3].pk, more[0].pk], embedder=EMB)[0]
        for pk in (rows[3].pk, more[0].pk):
            assert np.frombuffer(briefs[pk].vector or b"", np.float32) == pytest.approx(
                unit(seed=pk)
            )
        found = reader.vector_messages(P, "u1", unit(seed=more[0].pk), EMB, 1, SearchFilters())
        assert found == [(more[0].pk, pytest.approx(1.0, abs=1e-5))]
        again = unit(seed=999)
        [first] = [m for m in writer.list_messages(P) if m.pk == rows[0].pk]
        writer.put_message_vectors(EMB, [first], again[None, :])
        [layers] = reader.vector_layers(
            P, "u1", [again], EMB, 1, messages=SearchFilters(), facts=None, summaries=None
        )
        assert layers["message"] == [(rows[0].pk, pytest.approx(1.0, abs=1e-5))]
        assert reader.vectors.peek((P, "u1", "message", EMB)) is cached  # read on, not reloaded
        writer.forget(P, "u1", message_ids=[rows[2].id], actor="test", reason=None)
        left = reader.vector_messages(P, "u1", q, EMB, 10, SearchFilters())
        assert rows[2].pk not in {pk for pk, _ in left} and len(left) == 6
    finally:
        reader.close()
        writer.close()


def test_cached_layer_searches_see_status_changes_and_new_items(pg_url: str) -> None:
    """Facts and summaries are searched in their cached scopes before those are brought up
    to date, the statuses of what is found asked in that same round trip: a status another
    process changed (no new vector: the guess holds) and an item it added (the guess does
    not) both show at the next search."""
    reader, writer = pg.PostgresStore(pg_url), pg.PostgresStore(pg_url)
    try:
        layered(writer)
        home, food = writer.get_summaries(P, ["s-home", "s-food"])
        q = unit(0.1, 1)

        def summaries() -> list[int]:
            [layers] = reader.vector_layers(
                P, "u1", [q], EMB, 5, messages=None, facts=None, summaries=("active",)
            )
            return [pk for pk, _ in layers["summary"]]

        assert summaries() == [food.pk, home.pk]
        cached = reader.vectors.peek((P, "u1", "summary", EMB))
        assert cached is not None and cached.n == 2
        writer.set_summary_status(P, "s-food", "archived", "old", "tester")
        assert summaries() == [home.pk]
        add(writer, ["I also like udon"], prefix="2")
        process(
            writer, LayerWrite(summaries=[summary("s-udon", "User likes udon", vec=unit(0.2, 1))])
        )
        [udon] = writer.get_summaries(P, ["s-udon"])
        assert summaries() == [udon.pk, home.pk]
        assert reader.vectors.peek((P, "u1", "summary", EMB)) is cached  # read on, not reloaded
    finally:
        reader.close()
        writer.close()


def test_a_users_vectors_commit_in_pk_order_so_a_cache_misses_none(pg_url: str) -> None:
    """Two writers of one user's vectors: the second waits for the first's lock, so a
    search between them cannot see the later pk and then never read the earlier one."""
    reader, first, second = (pg.PostgresStore(pg_url) for _ in range(3))
    try:
        rows = add(first, ["a", "b", "c"])
        process(first)
        assert len(reader.vector_messages(P, "u1", unit(seed=1), EMB, 10, SearchFilters())) == 3
        messages = {m.pk: m for m in first.list_messages(P)}
        va, vb = unit(seed=501), unit(seed=502)
        with first._transaction() as tx:
            first._insert_vector_rows(
                tx, [(P, "u1", "message", rows[0].pk, EMB, DIM, va)]
            )  # a pk drawn, not committed
            later = threading.Thread(
                target=second.put_message_vectors, args=(EMB, [messages[rows[1].pk]], vb[None, :])
            )
            later.start()
            dbsql.await_lock_wait(pg_url, "%pg_advisory_xact_lock%")
            reader.vector_messages(P, "u1", vb, EMB, 1, SearchFilters())
        later.join(30)
        for pk, v in ((rows[0].pk, va), (rows[1].pk, vb)):
            assert reader.vector_messages(P, "u1", v, EMB, 1, SearchFilters()) == [
                (pk, pytest.approx(1.0, abs=1e-5))
            ]
    finally:
        for s in (reader, first, second):
            s.close()


def test_filtered_index_searches_still_return_enough_rows(pg_url: str) -> None:
    # Through the index, with the 35 nearest summaries superseded: the 5 active ones still
    # come back (pgvector's iterative scan, or the exact fallback).
    store = pg.PostgresStore(pg_url, vector_index_threshold=0)
    try:
        q = unit(seed=3)
        rng = np.random.default_rng(3)

        def near(scale: float) -> np.ndarray:
            v = q + scale * rng.normal(size=8).astype(np.float32)
            return (v / np.linalg.norm(v)).astype(np.float32)

        add(store, ["round 0"])
        process(
            store, LayerWrite(summaries=[summary(f"s{i}", "x", vec=near(0.05)) for i in range(40)])
        )
        add(store, ["round 1"], prefix="1")
        process(
            store,
            LayerWrite(
                summaries=[
                    summary(f"n{i}", "y", action="supersede", supersedes=f"s{i}", vec=near(50.0))
                    for i in range(35)
                ]
            ),
        )
        found = store.vector_items("summary", P, "u1", q, EMB, 5)
        ids = {r.id for r in store.summaries_by_pk([pk for pk, _ in found]).values()}
        assert ids == {f"s{i}" for i in range(35, 40)}
    finally:
        store.close()


def test_dimensions_above_2000_are_indexed_as_halfvec(store: pg.PostgresStore, pg_url: str) -> None:
    rows = add(store, ["wide one", "wide two"])
    batch = claim(store)
    wide = np.zeros((2, 3000), np.float32)
    wide[0, 0] = wide[1, 1] = 1.0
    store.complete_batch(batch, embedder="wide:v1:3000", vectors=wide)
    assert "(vec)::halfvec(3000)" in _indexes(pg_url)["vectors_hnsw_message_3000"]
    indexed = pg.PostgresStore(pg_url, vector_index_threshold=0)
    try:
        found = indexed.vector_messages(P, "u1", wide[1], "wide:v1:3000", 1, SearchFilters())
        assert found == [(rows[1].pk, pytest.approx(1.0))]
    finally:
        indexed.close()


def _written_by_version_1(url: str, user: str, sid: str, texts: list[str]) -> list[int]:
    """Messages with their session and job, as version 1 of the schema held them (today's
    store writes columns version 1 did not have); their pks."""
    dbsql.execute(
        url,
        "INSERT INTO sessions (project_id, id, user_id, created_at, updated_at) "
        "VALUES (?, ?, ?, ?, ?)",
        *(P, sid, user, NOW, NOW),
    )
    [(job,)] = dbsql.rows(
        url,
        "INSERT INTO jobs (project_id, user_id, kind, size, run_after, created_at) "
        "VALUES (?, ?, 'process_messages', ?, 0, 0) RETURNING id",
        *(P, user, len(texts)),
    )
    return [
        dbsql.rows(
            url,
            "INSERT INTO messages (project_id, id, user_id, session_id, role, content, "
            "content_hash, ts, created_at, job_id, fts, fts_len) VALUES (?, ?, ?, ?, 'user', "
            "?, 'h', ?, ?, ?, to_tsvector('stratamem_fts', ?), ?) RETURNING pk",
            *(P, f"{user}-{sid}-{i}", user, sid, text, NOW, NOW, job, text, len(text.split())),
        )[0][0]
        for i, text in enumerate(texts)
    ]


def test_an_existing_database_gets_the_per_user_full_text_indexes(pg_url: str) -> None:
    pg.PostgresStore(pg_url, migrate_to=1).close()
    pks = _written_by_version_1(pg_url, "u1", "s1", ["I moved to Berlin", "ramen again"])
    _written_by_version_1(pg_url, "u2", "s2", ["Berlin for me too"])
    store = pg.PostgresStore(pg_url)
    try:
        assert store.schema_version() == pg.latest_schema_version()
        # Claiming needs the current schema (outages, jobs.batch_cap): processed after.
        berlin = fact("f1", "User moved to Berlin", ["u1-s1-0"], unit(1))
        process(store, LayerWrite(facts=[berlin]))
        process(store)
        names = {
            name
            for (name,) in dbsql.rows(
                pg_url,
                "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() "
                "AND indexname LIKE '%fts%'",
            )
        }
        assert names == {"messages_fts_by_user", "facts_fts_by_user", "summaries_fts_by_user"}
        assert [
            pk for pk, _ in store.fulltext_messages(P, "u1", ["berlin"], 10, SearchFilters())
        ] == [pks[0]]
        assert len(store.fulltext_items("fact", P, "u1", ["berlin"], 10)) == 1
        assert store.fulltext_items("fact", P, "u2", ["berlin"], 10) == []
    finally:
        store.close()


def test_large_tables_rank_full_text_from_caches_with_the_same_scores(
    store: pg.PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    texts = [f"pizza night {i} with friends" for i in range(8)] + [
        "sushi and pizza",
        "ramen on a rainy night",
        "我住在上海",
    ]
    add(store, texts)
    process(store)
    queries = [["pizza", "sushi"], ["night", "ramen"], ["上海"], ["friends", "nothing"], ["zzz"]]
    store.MATCH_BUDGET = 5  # type: ignore[misc]
    exact = [store.fulltext_messages(P, "u1", q, 20, SearchFilters()) for q in queries]
    # Every table counts as large (-2: a table never analysed estimates -1 rows).
    monkeypatch.setattr(pg_fts, "_LIVE_STATS_ROWS", -2)
    store._size_estimates.clear()
    cached = [store.fulltext_messages(P, "u1", q, 20, SearchFilters()) for q in queries]
    for a, b in zip(exact, cached, strict=True):
        assert [pk for pk, _ in a] == [pk for pk, _ in b]
        assert [s for _, s in a] == pytest.approx([s for _, s in b], rel=1e-9)
    assert exact[0] and exact[2] and exact[4] == []


def _vocabulary_read(store: pg.PostgresStore, table: str, rows: int) -> dict[str, int]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        known, counted_at = store._vocabulary.get(table, ({}, -1))
        if counted_at == rows and table not in store._reading_vocabulary:
            return known
        time.sleep(0.02)
    raise AssertionError(f"{table}'s vocabulary was not read")


def test_large_tables_take_counts_from_their_vocabulary_read_in_the_background(
    store: pg.PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large table's lexeme counts come from its vocabulary, read once in the background:
    a search then counts nothing it holds, the scores are the exact ones, a lexeme new since
    is counted, and the vocabulary is read again once the table grew by a tenth."""
    texts = [f"pizza night {i} with friends" for i in range(8)] + ["sushi and pizza", "我住在上海"]
    add(store, texts)
    process(store)
    queries = [["pizza", "sushi"], ["night", "friends"], ["上海"]]
    exact = [store.fulltext_messages(P, "u1", q, 20, SearchFilters()) for q in queries]
    # Every table counts as large (-2: a table never analysed estimates -1 rows).
    monkeypatch.setattr(pg_fts, "_LIVE_STATS_ROWS", -2)
    store._size_estimates.clear()
    store.fulltext_messages(P, "u1", ["pizza"], 20, SearchFilters())  # starts the reading
    known = _vocabulary_read(store, "messages", len(texts))
    assert known["pizza"] == 9 and known["night"] == 8 and known["sushi"] == 1
    store._df_cache.clear()
    from_vocabulary = [store.fulltext_messages(P, "u1", q, 20, SearchFilters()) for q in queries]
    assert not store._df_cache  # nothing was counted
    for a, b in zip(exact, from_vocabulary, strict=True):
        assert [pk for pk, _ in a] == [pk for pk, _ in b]
        assert [s for _, s in a] == pytest.approx([s for _, s in b], rel=1e-9)
    add(store, ["ramen tonight"], prefix="b")
    process(store)
    store._stats_cache.clear()  # the row count a minute later
    store.fulltext_messages(P, "u1", ["ramen"], 20, SearchFilters())
    assert ("messages", "ramen") in store._df_cache  # new since the reading: counted
    # Grown by more than a tenth (and 100 rows): read again.
    add(store, [f"udon {i}" for i in range(120)], prefix="c")
    process(store)
    store._stats_cache.clear()
    store.fulltext_messages(P, "u1", ["udon"], 20, SearchFilters())
    assert _vocabulary_read(store, "messages", len(texts) + 121)["udon"] == 120


def test_large_tables_keep_to_the_rank_cap_like_small_ones(
    store: pg.PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    texts = ["pizza one", "sushi and pizza", "pizza two", "sushi three", "pizza four", "pizza"]
    texts += ["ramen", "ramen and pizza"]
    add(store, texts)
    process(store)
    add(store, ["sushi and pizza for u2"], user="u2", sid="s2")
    process(store)
    queries = [["pizza", "sushi"], ["pizza"], ["ramen", "sushi", "pizza"], ["sushi"]]
    for cap in (3, 5, 1000):
        store.RANK_CAP = cap  # type: ignore[misc]
        monkeypatch.setattr(pg_fts, "_LIVE_STATS_ROWS", 5000)
        store._size_estimates.clear()
        small = [store.fulltext_messages(P, "u1", q, 20, SearchFilters()) for q in queries]
        # Every table counts as large (-2: a table never analysed estimates -1 rows).
        monkeypatch.setattr(pg_fts, "_LIVE_STATS_ROWS", -2)
        store._size_estimates.clear()
        large = [store.fulltext_messages(P, "u1", q, 20, SearchFilters()) for q in queries]
        for a, b in zip(small, large, strict=True):
            assert [pk for pk, _ in a] == [pk for pk, _ in b]
            assert [s for _, s in a] == pytest.approx([s for _, s in b], rel=1e-9)
            assert len(a) <= cap
        assert len(large[1]) == min(cap, 6)  # "pizza": six of u1's messages


def test_full_text_statements_ranking_many_rows_run_apart_with_the_same_results(
    store: pg.PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A search's full-text statements that rank more rows than the rank cap run on
    connections of their own, in parallel with the rest: the same results as all in one
    pipeline; one that fails fails the search, hands its connection back, and the next
    search works."""
    texts = [f"pizza and sushi night {i}" for i in range(6)] + ["ramen", "ramen and pizza"]
    add(store, texts)
    process(store)
    variants = [["pizza", "sushi"], ["ramen"], ["night", "pizza", "ramen"]]
    # Every table counts as large (-2: a table never analysed estimates -1 rows), and the
    # terms of two variants match more rows than the cap.
    monkeypatch.setattr(pg_fts, "_LIVE_STATS_ROWS", -2)
    store._size_estimates.clear()
    store.RANK_CAP = 3  # type: ignore[misc]
    apart: list[str] = []
    run_apart = store._run_apart

    def counted(st: Any) -> Any:
        apart.append(st.sql)
        return run_apart(st)

    monkeypatch.setattr(store, "_run_apart", counted)

    def search() -> list[dict[str, list[tuple[int, float]]]]:
        return store.fulltext_layers(
            P, "u1", variants, 20, messages=SearchFilters(), facts=None, summaries=None
        )

    store.FULLTEXT_APART = 0  # type: ignore[misc]
    together = search()
    assert apart == []
    store.FULLTEXT_APART = 2  # type: ignore[misc]
    assert search() == together
    assert len(apart) == 2 and together[0]["message"] and together[2]["message"]

    def broken(st: Any) -> Any:
        return run_apart(st._replace(sql="SELECT pk, score FROM no_such_table"))

    monkeypatch.setattr(store, "_run_apart", broken)
    with pytest.raises(Exception, match="no_such_table"):
        search()
    monkeypatch.setattr(store, "_run_apart", run_apart)
    assert search() == together
    assert not store._lent  # every connection back in the pool


def test_one_new_id_sent_for_two_users_at_once_is_stored_once(pg_url: str) -> None:
    stores = [pg.PostgresStore(pg_url) for _ in range(2)]
    sessions = []
    for i, st in enumerate(stores):
        row, _ = st.create_session(SessionRow(P, f"s{i}", f"u{i}", None, {}, NOW, NOW))
        sessions.append(row)
    barrier = threading.Barrier(2)
    outcomes: list[Any] = [None, None]

    def send(i: int) -> None:
        barrier.wait()
        outcomes[i] = stores[i].add_messages(P, sessions[i], [message("same", "same text")])

    threads = [threading.Thread(target=send, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    try:
        assert sorted(o.duplicates for o in outcomes) == [[], ["same"]]
        assert dbsql.rows(pg_url, "SELECT count(*) FROM messages") == [(1,)]
        assert stores[0].unfinished_jobs() == 1
    finally:
        for st in stores:
            st.close()


def test_open_store_passes_each_adapter_its_options(pg_url: str) -> None:
    st = open_store(pg_url, busy_timeout_ms=5, pool_size=2, vector_index_threshold=7)
    try:
        assert isinstance(st, pg.PostgresStore) and st._vector_index_threshold == 7
        assert st._pool.max_size == 2
    finally:
        st.close()


def test_a_claim_skips_a_user_whose_rows_are_being_written(store: pg.PostgresStore) -> None:
    # add_messages, complete_batch, forget and erase_user hold the user's advisory lock
    # while they write; a claim meanwhile moves on to another user instead of waiting.
    add(store, ["u1's"])
    add(store, ["u2's"], user="u2", sid="s2")
    with store._write() as c:
        store.dialect.lock_user(c, P, "u1")
        other = pg.PostgresStore(store._conninfo)
        try:
            assert claim(other, "w1").user_id == "u2"
            assert other.claim_batch("w2", 30, 10) is None
        finally:
            other.close()
    assert claim(store, "w3").user_id == "u1"


def test_closing_ends_the_connections_other_threads_hold(pg_url: str) -> None:
    import psycopg

    store = pg.PostgresStore(pg_url)
    pids: list[int] = []
    failures: list[StoreError] = []
    release = threading.Event()

    def waits_for_a_lock() -> None:
        try:
            with store._read() as c:
                pids.append(c.info.backend_pid)
                c.execute("SELECT count(*) FROM facts")
        except StoreError as exc:
            failures.append(exc)

    def leaves_its_transaction_open() -> None:
        try:
            with store._write() as c:
                c.execute("SELECT count(*) FROM messages")
                pids.append(c.info.backend_pid)
                release.wait(60)
        except StoreError as exc:
            failures.append(exc)

    threads = [threading.Thread(target=f) for f in (waits_for_a_lock, leaves_its_transaction_open)]
    with psycopg.connect(pg_url) as holder:
        holder.execute("LOCK TABLE facts")
        for t in threads:
            t.start()
        dbsql.await_lock_wait(pg_url, "SELECT count(*) FROM facts")
        deadline = time.monotonic() + 60
        while len(pids) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        store.close()
        # The query was cancelled, the open transaction's session ended by the server.
        assert dbsql.sessions_left(pg_url, pids=pids) == {}
        holder.rollback()
    release.set()
    for t in threads:
        t.join(60)
    assert len(failures) == 2


def test_ci_fails_instead_of_skipping_without_a_server(tmp_path: Any) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATAMEM_")}
    env.update(STRATAMEM_REQUIRE_POSTGRES="1")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_docs.py"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "STRATAMEM_TEST_POSTGRES_URL is not set" in proc.stdout + proc.stderr


def test_text_postgresql_cannot_hold_is_the_callers_error(store: pg.PostgresStore) -> None:
    # The engine refuses NUL where it checks input; a path it misses still fails as a
    # ValidationError (a 422), not as a database error (a 500).
    with pytest.raises(ValidationError, match="NUL"):
        store.create_project("p", "a\x00b")
    with pytest.raises(ValidationError, match="NUL"):
        store.create_session(SessionRow(P, "s", "u", None, {"k": "\x00"}, NOW, NOW))
    assert store.list_projects() == [] and store.get_session(P, "s") is None


def _user_facts(store: pg.PostgresStore, user: str, n: int) -> None:
    rows = add(store, [f"facts of {user}"], user=user, sid=f"s-{user}")
    process(
        store,
        LayerWrite(facts=[fact(f"{user}-f{i}", "f", [rows[0].id], unit(seed=i)) for i in range(n)]),
    )


@contextmanager
def _two_users(pg_url: str, **options: Any) -> Iterator[pg.PostgresStore]:
    """A store where u1 holds 30 facts (a small share of the shared index) and u2 200."""
    store = pg.PostgresStore(pg_url, vector_index_threshold=10, **options)
    try:
        _user_facts(store, "u1", 30)
        _user_facts(store, "u2", 200)
        yield store
    finally:
        store.close()


def _settle(store: pg.PostgresStore) -> None:
    deadline = time.monotonic() + 60
    while store._user_index_thread is not None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert store._user_index_thread is None


def _user_index_rows(url: str) -> list[tuple[Any, ...]]:
    return dbsql.rows(url, "SELECT name, user_id, state FROM user_indexes ORDER BY name")


def test_a_large_user_who_is_a_small_share_of_the_index_gets_an_index_of_their_own(
    pg_url: str,
) -> None:
    # u1: 30 of 230 facts, a share small enough; u2: most of the index, no index of its own.
    with _two_users(pg_url, user_index_threshold=20, pool_size=1) as store:
        q = unit(seed=5)
        exact = store.vector_items("fact", P, "u1", q, EMB, 5)  # exact, and counts the scope
        assert store.vector_items("fact", P, "u1", q, EMB, 5) == exact  # through the shared index
        for _ in range(2):
            store.vector_items("fact", P, "u2", q, EMB, 5)
        _settle(store)
        name = store.user_index_name(P, "u1", "vectors:fact:8")
        assert _user_index_rows(pg_url) == [(name, "u1", "ready")]
        made = _indexes(pg_url)
        assert "user_id = 'u1'::text" in made[name] and "hnsw" in made[name]
        # Searches of u1 now go through u1's index (the planner sees the user as a value),
        # with the same results.
        with store._read() as c:
            c.execute("SELECT pg_stat_force_next_flush()")
        before = _index_scans(pg_url, name)
        for _ in range(8):  # more than psycopg's prepare threshold: never a generic plan
            assert store.vector_items("fact", P, "u1", q, EMB, 5) == exact
        with store._read() as c:  # the pool's one connection: the one that searched
            c.execute("SELECT pg_stat_force_next_flush()")
        assert _index_scans(pg_url, name) >= before + 8
        # Another process learns of it and uses it too.
        other = pg.PostgresStore(pg_url, vector_index_threshold=10, user_index_threshold=20)
        try:
            other.vector_items("fact", P, "u1", q, EMB, 5)
            other.vector_items("fact", P, "u1", q, EMB, 5)
            _settle(other)
            assert other._has_user_index((P, "u1", "vectors:fact:8"))
            assert other.vector_items("fact", P, "u1", q, EMB, 5) == exact
        finally:
            other.close()
        # Erasing the user drops it.
        store.erase_user(P, "u1", actor="test", reason=None)
        assert name not in _indexes(pg_url) and _user_index_rows(pg_url) == []
        assert not store._has_user_index((P, "u1", "vectors:fact:8"))


def test_a_build_that_died_is_taken_over_and_a_reindex_drops_user_indexes(pg_url: str) -> None:
    with _two_users(pg_url, user_index_threshold=20) as store:
        name = store.user_index_name(P, "u1", "vectors:fact:8")
        # What a builder killed mid-way leaves: its row, and an invalid index of that name
        # (a concurrent build that failed).
        dbsql.execute(
            pg_url,
            "INSERT INTO user_indexes (name, project_id, user_id, target, state, "
            "rows_at_build) VALUES (?, ?, 'u1', 'vectors:fact:8', 'building', 30)",
            name,
            P,
        )
        with store._read() as c, pytest.raises(Exception, match="could not create unique"):
            c.execute(f"CREATE UNIQUE INDEX CONCURRENTLY {name} ON vectors (kind)")
        assert dbsql.rows(
            pg_url, "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(?)", name
        ) == [(False,)]
        q = unit(seed=7)
        exact = store.vector_items("fact", P, "u1", q, EMB, 5)
        store.vector_items("fact", P, "u1", q, EMB, 5)
        _settle(store)
        assert _user_index_rows(pg_url) == [(name, "u1", "ready")]
        assert "hnsw" in _indexes(pg_url)[name]
        assert store.vector_items("fact", P, "u1", q, EMB, 5) == exact
        # Vectors of another embedder replace these: user indexes go, made again on demand.
        store.drop_vectors_except("test:v2:8")
        assert name not in _indexes(pg_url) and _user_index_rows(pg_url) == []


def test_user_indexes_can_be_turned_off(pg_url: str) -> None:
    with _two_users(pg_url, user_index_threshold=0) as store:
        for _ in range(2):
            store.vector_items("fact", P, "u1", unit(seed=1), EMB, 5)
        _settle(store)
        assert _user_index_rows(pg_url) == []


def test_every_gin_index_keeps_its_pending_list_small(store: pg.PostgresStore) -> None:
    """Every search of a GIN index scans its pending list (up to 4 MB by default, merged
    only by vacuum): the full-text and the array indexes merge theirs past 128 kB (a
    100,000-message user's standing read: 25 ms with the fact_ids index's 66 pages
    pending, 6 once merged)."""
    options = dict(
        dbsql.rows(
            store._conninfo,
            "SELECT c.relname, array_to_string(c.reloptions, ',') FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_am a ON a.oid = c.relam "
            "WHERE n.nspname = current_schema() AND a.amname = 'gin'",
        )
    )
    assert set(options) >= {
        *(f"{t}_fts_by_user" for t in ("messages", "facts", "summaries")),
        "facts_by_message_ids",
        "summaries_by_fact_ids",
        "summaries_by_message_ids",
        "summary_history_by_fact_ids",
    }
    assert set(options.values()) == {"gin_pending_list_limit=128"}


def test_a_user_with_many_rows_gets_a_full_text_index_of_their_own(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = pg.PostgresStore(pg_url, user_fulltext_threshold=5, pool_size=1)
    try:
        add(store, [f"pizza night {i}" for i in range(8)] + ["sushi and pizza"])
        process(store)
        add(store, ["pizza for u2"], user="u2", sid="s2")
        process(store)
        # Every table counts as large (-2: a table never analysed estimates -1 rows).
        monkeypatch.setattr(pg_fts, "_LIVE_STATS_ROWS", -2)
        queries = [["pizza", "sushi"], ["night"], ["sushi"]]
        before = [store.fulltext_messages(P, "u1", q, 20, SearchFilters()) for q in queries]
        store.fulltext_messages(P, "u2", ["pizza"], 20, SearchFilters())  # 1 row: none
        _settle(store)
        name = store.user_index_name(P, "u1", "messages:fts")
        assert _user_index_rows(pg_url) == [(name, "u1", "ready")]
        [(made,)] = dbsql.rows(pg_url, "SELECT indexdef FROM pg_indexes WHERE indexname = ?", name)
        assert "gin (fts)" in made and "user_id = 'u1'::text" in made
        assert "gin_pending_list_limit='128'" in made  # as the shared indexes' (below)
        # The planner takes it by itself where it pays (not on these few rows: the
        # benchmark shows it on a large table); the results do not change.
        after = [store.fulltext_messages(P, "u1", q, 20, SearchFilters()) for q in queries]
        assert after == before
        # A reindex keeps it (full text does not depend on the embedder); erasure drops it.
        store.drop_vectors_except("test:v2:8")
        assert _user_index_rows(pg_url) == [(name, "u1", "ready")]
        store.erase_user(P, "u1", actor="test", reason=None)
        assert _user_index_rows(pg_url) == []
        assert dbsql.rows(pg_url, "SELECT to_regclass(?)::text", name) == [(None,)]
    finally:
        store.close()


def test_the_standing_read_is_planned_once_a_connection(pg_url: str) -> None:
    """The user's standing items are read through partial indexes (``WHERE standing``).
    Bound as a parameter, the flag kept the server from using them in a prepared
    statement's generic plan, so it planned the read again on every search; as a literal
    the generic plan serves it once psycopg has prepared it."""
    s = pg.PostgresStore(pg_url, pool_size=1)  # one connection: its prepared statements
    try:
        [row] = add(s, ["Always give me a code example."])
        # Many other facts and summaries, so that a plan without the indexes costs more.
        others = [fact(f"o{i}", f"note {i}", [row.id], unit(i + 2)) for i in range(3000)]
        process(
            s,
            LayerWrite(
                facts=[
                    fact("f1", "Always give a code example", [row.id], unit(1), standing=True),
                    *others,
                ],
                summaries=[
                    summary("s1", "Give code examples", fact_ids=["f1"], standing=True),
                    *(summary(f"t{i}", f"note {i}", fact_ids=[f"o{i}"]) for i in range(3000)),
                ],
            ),
        )
        with s._read() as c:
            c.execute("ANALYZE facts, summaries")
        for _ in range(15):
            [item] = s.standing_facts(P, "u1", limit=10)
            assert (item.fact.id, item.summary_id) == ("f1", "s1")
        with s._read() as c:
            plans = c.execute(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                "WHERE statement LIKE 'SELECT %standing = %'"
            ).fetchall()
        assert len(plans) == 2
        assert all(generic > 0 and custom <= 5 for generic, custom in plans)
    finally:
        s.close()
