"""The SQLite store: migrations, WAL, full text (CJK included), vectors, filters, scoping."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stratamem import ConfigError, EmbedderMismatchError, Memory, StoreError
from stratamem._products import similarities
from stratamem.store import SearchFilters, parse_metadata_filters
from stratamem.store._text import fts_document, fts_query_terms
from stratamem.store._vector_cache import VectorScope
from stratamem.store.sqlite import SQLiteStore, latest_schema_version, sqlite_path
from stratamem.store.sqlite._dialect import SQLiteDialect
from test_store_contract import (
    DIM,
    EMB,
    LayerWrite,
    P,
    add,
    fact,
    open_store,
    process,
    summary,
    unit,
)

# About the SQLite store itself (files, FTS5 plans, the in-process vector index);
# what every store must do is in test_store_contract.py.
pytestmark = pytest.mark.sqlite_only


def _conn(url: str) -> sqlite3.Connection:
    return sqlite3.connect(sqlite_path(url))


def test_wal_mode_and_schema_version(mem: Memory, db_url: str) -> None:
    with _conn(db_url) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA user_version").fetchone()[0] == latest_schema_version()
    assert latest_schema_version() >= 2


def test_migrations_upgrade_a_file_from_an_older_schema_in_place(db_url: str) -> None:
    # Build a version-1 file the way version 1 of stratamem wrote it: no search tables.
    SQLiteStore(db_url, migrate_to=1).close()
    with _conn(db_url) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        assert "messages" in tables and "messages_fts" not in tables
        conn.execute(
            "INSERT INTO sessions (project_id, id, user_id, metadata, created_at, updated_at) "
            "VALUES ('default', 'old-s', 'old-u', '{}', '2025-01-01T00:00:00.000000Z', "
            "'2025-01-01T00:00:00.000000Z')"
        )
        conn.execute(
            "INSERT INTO jobs (project_id, user_id, kind, size, status, run_after, created_at) "
            "VALUES ('default', 'old-u', 'process_messages', 2, 'queued', 0, 0)"
        )
        for i, text in enumerate(["I adopted a greyhound named Pixel", "我住在上海"]):
            conn.execute(
                "INSERT INTO messages (project_id, id, user_id, session_id, role, content, "
                "content_hash, ts, metadata, job_id, created_at) VALUES ('default', ?, 'old-u', "
                "'old-s', 'user', ?, 'h', '2025-01-01T00:00:00.000000Z', '{}', 1, "
                "'2025-01-01T00:00:00.000000Z')",
                (f"old-{i}", text),
            )
    with Memory(db_url, embedder="hash") as mem:
        assert mem.store.schema_version() == latest_schema_version()
        # Old rows were back-filled into the new full-text index and the queued job ran. The
        # messages' layer only: the worker may already have made a summary of the same words.
        found = {
            q: mem.search(q, user_id="old-u", layers=["message"]) for q in ("greyhound", "上海")
        }
        assert found["greyhound"][0].id == "old-0" and found["上海"][0].id == "old-1"
        mem.wait(timeout=30)
        assert {m.status for m in mem.messages.list(user_id="old-u")} == {"processed"}
        s = mem.sessions.get("old-s")
        s.add_messages([{"role": "user", "content": "Pixel loves the beach"}], sync=True)
        hits = mem.search("Pixel", user_id="old-u", limit=10)
        assert [h.id for h in hits if h.layer == "message"][1] == "old-0"
    with _conn(db_url) as conn:
        names = {r[0] for r in conn.execute("SELECT key FROM meta")}
        assert {"schema_migrated_0001_core.sql", "schema_migrated_0002_search.sql"} <= names


def test_a_file_from_a_newer_stratamem_is_refused(db_url: str) -> None:
    SQLiteStore(db_url).close()
    with _conn(db_url) as conn:
        conn.execute("PRAGMA user_version = 99")
    with pytest.raises(StoreError, match="schema version 99, newer"):
        SQLiteStore(db_url)


def test_missing_directory_is_a_clear_error(tmp_path: Any) -> None:
    with pytest.raises(StoreError, match="does not exist"):
        SQLiteStore(f"sqlite:///{tmp_path}/no/such/dir/x.db")


def test_connections_read_through_the_configured_memory_map(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every connection (one a thread) maps the file up to ``sqlite_mmap_bytes`` (0, no
    map, by default), set from the setting or its variable; a size that is not bytes is
    refused before the file is opened."""

    def mapped(store: SQLiteStore) -> list[int]:
        sizes = [store._conn().execute("PRAGMA mmap_size").fetchone()[0]]
        other = threading.Thread(
            target=lambda: sizes.append(store._conn().execute("PRAGMA mmap_size").fetchone()[0])
        )
        other.start()
        other.join()
        return sizes

    url = f"sqlite:///{tmp_path}/m.db"
    with Memory(url, embedder="hash", workers=0) as mem:
        mem.sessions.create(user_id="u").add_messages([{"role": "user", "content": "kiwi"}])
        assert mapped(mem.store) == [0, 0]
    with Memory(url, embedder="hash", workers=0, sqlite_mmap_bytes=1 << 30) as mem:
        assert mapped(mem.store) == [1 << 30, 1 << 30]
        assert [h.text for h in mem.search("kiwi", user_id="u")] == ["kiwi"]
    monkeypatch.setenv("STRATAMEM_SQLITE_MMAP_BYTES", "65536")
    with Memory(url, embedder="hash", workers=0) as mem:
        assert mapped(mem.store) == [65536, 65536]
        assert [h.text for h in mem.search("kiwi", user_id="u")] == ["kiwi"]
    for bad in (-1, 1.5, True):
        with pytest.raises(ConfigError, match="mmap size"):
            SQLiteStore(f"sqlite:///{tmp_path}/bad.db", mmap_bytes=bad)
    with pytest.raises(ConfigError, match="sqlite_mmap_bytes"):
        Memory(url, embedder="hash", workers=0, sqlite_mmap_bytes=-1)
    assert not (tmp_path / "bad.db").exists()


@pytest.mark.parametrize(
    ("text", "query"),
    [
        ("我上个月搬到了柏林,现在住在克罗伊茨贝格。", "柏林"),
        ("我上个月搬到了柏林,现在住在克罗伊茨贝格。", "住在哪里"),  # shares the bigram 住在
        ("来月、東京に引っ越します。", "東京"),
        ("ラーメンが大好きです", "ラーメン"),
        ("저는 서울에 살아요", "서울"),
        ("北京烤鸭 and dumplings", "dumplings"),
        ("猫", "猫"),  # a one-character text and query
    ],
)
def test_cjk_full_text_search(make_memory: Any, text: str, query: str) -> None:
    mem = make_memory(workers=0)  # no processing: only full text can find it
    s = mem.sessions.create(user_id="u1")
    s.add_messages(
        [
            {"role": "user", "content": "I like hiking in the Alps"},
            {"role": "user", "content": text},
        ]
    )
    hits = mem.search(query, user_id="u1")
    assert hits and hits[0].text == text
    assert "fulltext" in hits[0].signals and "vector" not in hits[0].signals


def test_cjk_text_is_indexed_as_grams() -> None:
    assert fts_document("我住在上海").split() == [
        "我",
        "住",
        "在",
        "上",
        "海",
        "我住",
        "住在",
        "在上",
        "上海",
    ]
    assert fts_query_terms("Where does the user live?") == ["live"]
    assert fts_query_terms("上海在哪") == ["上海", "海在", "在哪"]
    assert fts_query_terms("Who am I?") == ["who", "am", "i"]  # all stopwords: keep them
    assert fts_query_terms('"; DROP TABLE messages; --') == ["drop", "table", "messages"]


def test_english_stemming_and_punctuation(make_memory: Any) -> None:
    mem = make_memory(workers=0)
    s = mem.sessions.create(user_id="u1")
    s.add_messages([{"role": "user", "content": "We were running along the canal."}])
    assert mem.search("runs", user_id="u1")  # porter: running ~ runs
    assert mem.search('canal" OR "x', user_id="u1")  # FTS syntax in a query is inert


def test_users_and_projects_are_isolated(db_url: str) -> None:
    with (
        Memory(db_url, embedder="hash", project_id="p1") as p1,
        Memory(db_url, embedder="hash", project_id="p2") as p2,
    ):
        p1.sessions.create(user_id="u1", session_id="s").add_messages(
            [{"role": "user", "content": "secret plan alpha"}], sync=True
        )
        p1.sessions.create(user_id="u2", session_id="t").add_messages(
            [{"role": "user", "content": "secret plan beta"}], sync=True
        )
        p2.sessions.create(user_id="u1", session_id="s").add_messages(
            [{"role": "user", "content": "secret plan gamma"}], sync=True
        )
        assert [h.text for h in p1.search("secret plan", user_id="u1")] == ["secret plan alpha"]
        assert [h.text for h in p2.search("secret plan", user_id="u1")] == ["secret plan gamma"]
        assert p2.search("alpha", user_id="u2") == []


def test_metadata_time_role_and_session_filters(mem: Memory) -> None:
    s1 = mem.sessions.create(user_id="u1", session_id="s1")
    s2 = mem.sessions.create(user_id="u1", session_id="s2")
    s1.add_messages(
        [
            {
                "role": "user",
                "content": "order pizza margherita",
                "timestamp": "2026-01-10T12:00:00Z",
                "metadata": {"channel": "web", "stars": 5, "vip": True, "addr": {"city": "Berlin"}},
            },
            {
                "role": "assistant",
                "content": "pizza ordered",
                "timestamp": "2026-02-10T12:00:00Z",
                "metadata": {"channel": "ios", "stars": 3},
            },
        ]
    )
    s2.add_messages(
        [
            {
                "role": "user",
                "content": "pizza again please",
                "timestamp": "2026-03-10T12:00:00Z",
                "metadata": {"channel": "web", "stars": 1, "coupon": None},
            },
        ],
        sync=True,
    )
    mem.wait()

    def texts(**kw: Any) -> set[str]:
        return {h.text for h in mem.search("pizza", user_id="u1", **kw)}

    assert texts(filters={"channel": "web"}) == {"order pizza margherita", "pizza again please"}
    assert texts(filters={"channel": {"$in": ["ios"]}}) == {"pizza ordered"}
    assert texts(filters={"channel": {"$nin": ["ios"]}}) == {
        "order pizza margherita",
        "pizza again please",
    }
    assert texts(filters={"stars": {"$gte": 3, "$lt": 5}}) == {"pizza ordered"}
    assert texts(filters={"stars": {"$gt": 4}}) == {"order pizza margherita"}
    assert texts(filters={"stars": {"$lte": 1}}) == {"pizza again please"}
    assert texts(filters={"vip": True}) == {"order pizza margherita"}
    assert texts(filters={"channel": {"$ne": "web"}}) == {"pizza ordered"}
    assert texts(filters={"coupon": {"$exists": True}}) == {"pizza again please"}
    assert texts(filters={"coupon": None}) == {"pizza again please"}
    assert texts(filters={"addr.city": "Berlin"}) == {"order pizza margherita"}
    assert texts(since="2026-02-01T00:00:00Z") == {"pizza ordered", "pizza again please"}
    assert texts(since="2026-02-01", until="2026-03-01") == {"pizza ordered"}
    assert texts(roles=["assistant"]) == {"pizza ordered"}
    assert texts(session_id="s2") == {"pizza again please"}


def test_filters_apply_to_the_vector_side_too(mem: Memory) -> None:
    s = mem.sessions.create(user_id="u1")
    s.add_messages(
        [{"role": "user", "content": f"note {i}", "metadata": {"i": i}} for i in range(30)],
        sync=True,
    )
    store = mem.store
    q = mem.embedder.embed(["note 7"])[0]
    filters = SearchFilters(metadata=parse_metadata_filters({"i": {"$lt": 5}}))
    found = store.vector_messages("default", "u1", q, mem.embedder.id, 10, filters)
    assert len(found) == 5
    rows = store.messages_by_pk([pk for pk, _ in found])
    assert all(r.metadata["i"] < 5 for r in rows.values())


def test_hnsw_index_agrees_with_exact_search() -> None:
    rng = np.random.default_rng(7)
    vecs = rng.normal(size=(3000, 64)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    ids = np.arange(1, 3001, dtype=np.int64)
    exact = VectorScope(dim=64, index_threshold=10**9)
    indexed = VectorScope(dim=64, index_threshold=1000)
    for scope in (exact, indexed):
        scope.add(ids[:2000], ids[:2000], vecs[:2000])
        scope.add(ids[2000:], ids[2000:], vecs[2000:])  # incremental growth
    # The index is built in the background; searches are exact (and correct) meanwhile.
    assert indexed.wait_index(60) and exact.hnsw is None and indexed.hnsw_n == 3000
    overlap = []
    for q in vecs[rng.choice(3000, 50, replace=False)] + 0.1:
        q = q / np.linalg.norm(q)
        a = {i for i, _ in exact.search(q, 10)}
        b = {i for i, _ in indexed.search(q, 10)}
        overlap.append(len(a & b) / 10)
    assert np.mean(overlap) >= 0.95
    allowed = ids[::50]  # a selective filter falls back to exact search
    got = indexed.search(vecs[0], 5, allowed)
    assert {i for i, _ in got} <= set(allowed.tolist()) and len(got) == 5
    assert got == exact.search(vecs[0], 5, allowed)


def _unit_rows(n: int, dim: int, seed: int) -> np.ndarray:
    vecs = np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32)
    return vecs / np.linalg.norm(vecs, axis=1, keepdims=True)


def test_the_same_vectors_build_the_same_index() -> None:
    """Scopes of the same vectors (two processes, or two starts of one) answer every query
    alike: a graph built by several threads at once depended on how they interleaved."""
    vecs = _unit_rows(10_000, 32, seed=5)
    ids = np.arange(1, 10_001, dtype=np.int64)
    queries = _unit_rows(300, 32, seed=6)
    answers = []
    for _ in range(3):
        scope = VectorScope(dim=32, index_threshold=1000)
        scope.add(ids, ids, vecs)
        assert scope.wait_index(60) and scope.hnsw_n == 10_000
        answers.append([scope.search(q, 10) for q in queries])
    assert answers[0] == answers[1] == answers[2]


def test_an_item_embedded_again_is_rewritten_in_place_with_or_without_an_index() -> None:
    """A new row for an item the scope holds (a reworded summary) replaces its vector:
    exact search, the HNSW index and the vectors handed to recall all see the new one."""
    vecs = _unit_rows(1200, 32, seed=3)
    ids = np.arange(10, 1210, dtype=np.int64)
    exact = VectorScope(dim=32, index_threshold=10**9)
    indexed = VectorScope(dim=32, index_threshold=1000)
    for scope in (exact, indexed):
        scope.add(ids, ids, vecs)
    assert indexed.wait_index(60)
    new = -vecs[7]  # item 17 now points the other way
    for scope in (exact, indexed):
        scope.add(np.array([5000]), np.array([17]), new[None, :])
        assert scope.n == 1200 and scope.last_pk == 5000
        assert scope.search(new, 1) == [(17, pytest.approx(1.0))]
        assert scope.search(vecs[7], 3)[0][0] != 17
        assert scope.vectors([17, 18, 99999]) == {17: new.tobytes(), 18: vecs[8].tobytes()}


def test_a_rewrite_during_the_index_build_reaches_the_index() -> None:
    vecs = _unit_rows(30_000, 32, seed=4)
    ids = np.arange(1, 30_001, dtype=np.int64)
    scope = VectorScope(dim=32, index_threshold=1000)
    scope.add(ids, ids, vecs)  # starts the background build
    new = -vecs[0]
    with scope.lock:  # as VectorCache.scope adds rows; the build takes this lock to finish
        assert scope.hnsw is None  # still building (30,000 vectors took 0.9 s here)
        scope.add(np.array([40_000]), np.array([1]), new[None, :])
        assert scope._dirty == {0}  # to be redone once the build is done
    assert scope.wait_index(60) and scope.hnsw is not None and not scope._dirty
    matches = scope.hnsw.search(new, 1)
    assert int(matches.keys[0]) == 1 and float(matches.distances[0]) == pytest.approx(0, abs=1e-5)


# -- HNSW index files kept beside the database -------------------------------------------


def _indexed_store(url: str, users: Sequence[str] = ("u1",), n: int = 1500) -> SQLiteStore:
    """A store whose users hold ``n`` message vectors each, over its HNSW threshold."""
    store = SQLiteStore(url, vector_index_threshold=1000)
    for user in users:
        add(store, [f"note {i}" for i in range(n)], user=user, sid=f"s-{user}")
        store.put_message_vectors(EMB, _rows(store, user), _user_rows(user, n))
    return store


def _rows(store: SQLiteStore, user: str = "u1") -> list[Any]:
    return sorted(store.list_messages(P, user_id=user, limit=100_000), key=lambda m: m.pk)


def _user_rows(user: str, n: int = 1500) -> np.ndarray:
    return _unit_rows(n, DIM, seed=int(user[1:]))


def _search(store: SQLiteStore, q: np.ndarray, user: str = "u1") -> list[tuple[int, float]]:
    return store.vector_messages(P, user, q, EMB, 10, SearchFilters())


def _built(store: SQLiteStore, user: str = "u1") -> Any:
    """The user's message scope once its index is ready (searched first to load it)."""
    _search(store, unit(seed=0), user)
    scope = store.vectors.peek((P, user, "message", EMB))
    assert scope is not None and scope.wait_index(60) and scope.hnsw is not None
    return scope


def _index_file(store: SQLiteStore, user: str = "u1") -> Path:
    return Path(store._index_files.path((P, user, "message", EMB)))


def test_a_built_index_is_kept_and_the_next_process_restores_it(db_url: str) -> None:
    first = _indexed_store(db_url)
    queries = _unit_rows(40, DIM, seed=9)
    try:
        _built(first)
        path = _index_file(first)
        assert path.exists() and path.parent.name.endswith(".db-hnsw")
        assert "u1" not in path.name  # names are hashes (a user id may be an address)
        answers = [_search(first, q) for q in queries]
        database = Path(sqlite_path(db_url)).stat().st_size
        assert first.stats()["size_bytes"] >= database + path.stat().st_size  # counted in
    finally:
        first.close()
    kept = path.stat()
    second = SQLiteStore(db_url, vector_index_threshold=1000)
    try:
        scope = _built(second)
        # Restored as it was (every vector checked against the table's), not written again.
        assert (path.stat().st_ino, path.stat().st_mtime_ns) == (kept.st_ino, kept.st_mtime_ns)
        assert scope.saved and scope.hnsw_n == 1500
        assert [_search(second, q) for q in queries] == answers  # the same graph
    finally:
        second.close()


def test_a_restored_index_takes_in_what_changed_since_it_was_kept(db_url: str) -> None:
    store = _indexed_store(db_url)
    store.close()
    store = SQLiteStore(db_url, vector_index_threshold=1000)
    try:
        # Written while no process held the index: an item embedded again, new items.
        rows = _rows(store)
        moved = -_user_rows("u1")[7]
        store.put_message_vectors(EMB, [rows[7]], moved[None, :])
        add(store, [f"later {i}" for i in range(50)], sid="s-later")
        more = _rows(store)[1500:]
        fresh = _unit_rows(50, DIM, seed=77)
        store.put_message_vectors(EMB, more, fresh)
        scope = _built(store)
        assert scope.hnsw_n == 1550 and len(scope.hnsw) == 1550
        assert scope.hnsw.search(moved, 1).keys[0] == rows[7].pk
        assert int(scope.hnsw.search(fresh[3], 1).keys[0]) == more[3].pk
        assert np.array_equal(scope.hnsw.get(rows[7].pk), moved)
        assert _search(store, moved)[0] == (rows[7].pk, pytest.approx(1.0, abs=1e-5))
    finally:
        store.close()
    # The repaired index was kept: a third process finds nothing to repair.
    third = SQLiteStore(db_url, vector_index_threshold=1000)
    try:
        assert _built(third).saved
    finally:
        third.close()


def test_an_index_file_of_other_vectors_or_none_at_all_is_built_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A file is only a cache: one of another database (the file replaced, a copied
    directory) or an unreadable one is rebuilt from the table, never answers."""
    ours = _indexed_store(f"sqlite:///{tmp_path / 'ours.db'}")
    other = _indexed_store(f"sqlite:///{tmp_path / 'other.db'}", users=("u9",))
    try:
        _built(other, "u9")
        ours_path, theirs = _index_file(ours), _index_file(other, "u9")
        ours_path.parent.mkdir()
        ours_path.write_bytes(theirs.read_bytes())  # u9's vectors, under u1's name
        scope = _built(ours)
        assert scope.hnsw_n == 1500 and not scope._dirty
        found = [int(scope.hnsw.search(v, 1).keys[0]) for v in _user_rows("u1")[:50]]
        assert found == [r.pk for r in _rows(ours)[:50]]
        assert ours_path.read_bytes() != theirs.read_bytes()  # kept again, rebuilt
    finally:
        ours.close()
    ours_path.write_bytes(b"not an index")
    ours = SQLiteStore(f"sqlite:///{tmp_path / 'ours.db'}", vector_index_threshold=1000)
    try:
        with caplog.at_level("WARNING", logger="stratamem.store"):
            scope = _built(ours)
        assert "unreadable, building again" in caplog.text and scope.hnsw_n == 1500
        assert len(ours._index_files.restore(scope.key)) == 1500  # kept again, whole
    finally:
        ours.close()
        other.close()


def test_removing_memory_deletes_the_users_index_files(db_url: str) -> None:
    store = _indexed_store(db_url, users=("u1", "u2"))
    try:
        for user in ("u1", "u2"):
            _built(store, user)
        u1, u2 = _index_file(store, "u1"), _index_file(store, "u2")
        assert u1.exists() and u2.exists()
        assert store.forget(P, "u1", message_ids=["u1-s-u1-3"], actor="t", reason=None)
        assert not u1.exists() and u2.exists()  # the forgotten message's vector was in it
        _built(store, "u1")
        assert u1.exists()
        store.erase_user(P, "u1", actor="t", reason=None)
        assert not u1.exists() and u2.exists()
    finally:
        store.close()
    assert not u1.exists()  # closing kept no index of the erased user


def test_a_save_clears_what_a_save_killed_long_ago_left(db_url: str) -> None:
    store = _indexed_store(db_url)
    try:
        scope = _built(store)
        path = _index_file(store)
        old, recent = Path(f"{path}.1.2.tmp"), Path(f"{path}.3.4.tmp")
        for leftover in (old, recent):
            leftover.write_bytes(b"half an index")
        os.utime(old, (time.time() - 7200, time.time() - 7200))
        assert store._index_files.save(scope.key, scope.hnsw, scope.generation)
        assert not old.exists() and recent.exists()  # another process may be saving that one
    finally:
        store.close()


def test_a_save_that_raced_a_removal_deletes_its_own_file(db_url: str) -> None:
    store = _indexed_store(db_url)
    try:
        scope = _built(store)
        path = _index_file(store)
        store.erase_user(P, "u1", actor="t", reason=None)
        # A build from before the erasure finishing after it (here: this process's index,
        # of the generation it was loaded at).
        assert not store._index_files.save(scope.key, scope.hnsw, scope.generation)
        assert not path.exists() and not list(path.parent.iterdir())
    finally:
        store.close()


def test_switching_the_embedder_deletes_the_other_embedders_files(db_url: str) -> None:
    store = _indexed_store(db_url)
    try:
        _built(store)
        path = _index_file(store)
        keep = Path(store._index_files.path((P, "u1", "message", "next:v1:8")))
        keep.write_bytes(b"x")
        store.drop_vectors_except("next:v1:8")
        assert not path.exists() and keep.exists()
    finally:
        store.close()


def test_index_files_that_cannot_be_written_cost_nothing_but_the_warning(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    Path(sqlite_path(db_url) + "-hnsw").write_text("a file where the directory goes")
    store = _indexed_store(db_url, users=("u1", "u2"))
    try:
        with caplog.at_level("WARNING", logger="stratamem.store"):
            scopes = [_built(store, user) for user in ("u1", "u2")]
        assert all(not s.saved and s.hnsw_n == 1500 for s in scopes)
        assert caplog.text.count("cannot keep HNSW index files") == 1
        v = _user_rows("u2")[5]
        assert _search(store, v, "u2")[0][1] == pytest.approx(1.0, abs=1e-5)
    finally:
        store.close()


def test_item_lookup_works_for_ids_in_any_order() -> None:
    scope = VectorScope(dim=4, index_threshold=10**9)
    vecs = _unit_rows(6, 4, seed=5)
    scope.add(np.arange(1, 4), np.array([5, 9, 12]), vecs[:3])  # ascending
    scope.add(np.arange(4, 7), np.array([2, 30, 7]), vecs[3:])  # an older item, embedded late
    got = scope.vectors([2, 5, 7, 9, 12, 30, 8])
    assert got == {i: vecs[k].tobytes() for k, i in enumerate([5, 9, 12, 2, 30, 7])}
    scope.add(np.array([7]), np.array([9]), vecs[:1])  # rewrite in the unordered scope
    assert scope.vectors([9]) == {9: vecs[0].tobytes()} and scope.n == 6


def test_vector_index_follows_new_rows_and_other_processes(db_url: str) -> None:
    reader = Memory(db_url, embedder="hash", workers=0)
    writer = Memory(db_url, embedder="hash")
    s = writer.sessions.create(user_id="u1")
    s.add_messages([{"role": "user", "content": "first fact about tea"}], sync=True)
    assert [h.text for h in reader.search("tea", user_id="u1")] == ["first fact about tea"]
    s.add_messages([{"role": "user", "content": "second fact about tea"}], sync=True)
    assert len(reader.search("tea", user_id="u1")) == 2  # cache picked up the new vector
    writer.close()
    reader.close()


def test_embedder_mismatch_is_detected_not_mixed(db_url: str) -> None:
    with Memory(db_url, embedder="hash:384") as mem:
        mem.sessions.create(user_id="u1", session_id="s").add_messages(
            [{"role": "user", "content": "I keep bees"}], sync=True
        )
    with pytest.raises(EmbedderMismatchError, match=r"'hash:v2:384' .* 'hash:v2:128'.*reindex"):
        Memory(db_url, embedder="hash:128")
    with Memory(db_url, embedder="hash:128", embedder_mismatch="reindex", workers=0) as mem:
        # The message and what was derived from it (its fact and summary) are re-embedded.
        layers = mem.stats()
        assert mem.stats()["vectors"] == {
            "hash:v2:128": 1 + layers["facts"] + sum(layers["summaries"].values())
        }
        hits = mem.search("bees", user_id="u1")
        # (the fact is restated by its one-fact summary, so it is listed once, as that)
        assert {h.layer for h in hits if h.signals.get("vector", 0) > 0} == {"message", "summary"}
    with Memory(db_url, embedder="hash:128") as mem:  # now the stored embedder
        assert mem.store.get_meta("embedder") == "hash:v2:128"


def test_a_store_of_the_earlier_bundled_model_is_told_to_reindex(db_url: str) -> None:
    from stratamem.embed.local import LocalEmbedder

    with Memory(db_url, embedder="hash:384") as mem:
        mem.store.set_meta("embedder", LocalEmbedder.replaces[0])
    # The earlier model no longer ships: "open it with the original embedder" cannot help.
    with pytest.raises(EmbedderMismatchError, match="earlier version of the bundled") as err:
        Memory(db_url, embedder="local")
    assert "stratamem reindex" in str(err.value) and "STRATAMEM_EMBEDDER" not in str(err.value)


def test_store_refuses_to_write_vectors_of_another_embedder(db_url: str) -> None:
    with Memory(db_url, embedder="hash:384", workers=0) as mem:
        mem.sessions.create(user_id="u1", session_id="s").add_messages(
            [{"role": "user", "content": "one"}], sync=True
        )
        rows = mem.store.list_messages("default")
        with pytest.raises(EmbedderMismatchError):
            mem.store.put_message_vectors("other:7", rows, np.zeros((1, 7), np.float32))
        assert mem.stats()["vectors"] == {"hash:v2:384": 1}


def test_message_metadata_round_trips_unicode(mem: Memory) -> None:
    s = mem.sessions.create(user_id="u1")
    meta = {"城市": "東京", "nested": {"list": [1, 2.5, None, True]}}
    s.add_messages([{"role": "user", "content": "x", "metadata": meta}])
    assert mem.messages.list()[0].metadata == meta
    with _conn(mem.store.url) as conn:
        assert json.loads(conn.execute("SELECT metadata FROM messages").fetchone()[0]) == meta


def test_similar_summaries_skip_retired_ones_even_when_they_crowd_the_top(db_url: str) -> None:
    from stratamem.store import LayerWrite, SummaryWrite

    rng = np.random.default_rng(3)
    q = rng.normal(size=16).astype(np.float32)
    q /= np.linalg.norm(q)

    def near(scale: float) -> np.ndarray:
        v = q + scale * rng.normal(size=16).astype(np.float32)
        return v / np.linalg.norm(v)

    def summary(sid: str, vec: np.ndarray, supersedes: str | None = None) -> SummaryWrite:
        return SummaryWrite(
            action="supersede" if supersedes else "add",
            id=sid,
            text=sid,
            confidence=0.9,
            fact_ids=[],
            message_ids=[],
            model="test",
            prompt_version="t",
            reason="test",
            vector=vec,
            supersedes=supersedes,
        )

    with Memory(db_url, embedder="hash:16", workers=0) as mem:
        s = mem.sessions.create(user_id="u1", session_id="s")
        store = mem.store
        for round_ in range(2):
            s.add_messages([{"role": "user", "content": f"round {round_}"}])
            batch = store.claim_batch("w", 30, 100)
            assert batch is not None
            if round_ == 0:  # 40 summaries close to q
                writes = [summary(f"s{i}", near(0.05)) for i in range(40)]
            else:  # the 35 closest are superseded by summaries far from q
                writes = [summary(f"n{i}", near(50.0), supersedes=f"s{i}") for i in range(35)]
            store.complete_batch(
                batch,
                embedder="hash:v2:16",
                vectors=np.zeros((1, 16), np.float32),
                layers=LayerWrite(summaries=writes),
            )
        found = store.similar_summaries("default", "u1", q, "hash:v2:16", 3)
    assert len(found) == 3
    assert all(
        row.status == "active" and row.id in {f"s{i}" for i in range(35, 40)} for row, _ in found
    )


def test_fulltext_keeps_the_rarest_terms_within_a_match_budget(make_memory: Any) -> None:
    mem = make_memory(workers=0)
    store = mem.store
    store.MATCH_BUDGET = 3  # instead of 4,000, to keep the test small
    s = mem.sessions.create(user_id="u1")
    s.add_messages([{"role": "user", "content": f"pizza night number {i}"} for i in range(6)])
    s.add_messages([{"role": "user", "content": "pizza with sushi on the side"}])
    kept, _, _ = store._plan_fulltext("messages", "default", "u1", ["pizza", "sushi"])
    assert kept == ["sushi"]  # "pizza" is in 7 rows: ranking by it is noise
    hits = store.fulltext_messages("default", "u1", ["pizza", "sushi"], 10, SearchFilters())
    assert len(hits) == 1
    # Only common terms: the rarest is kept, so the query still finds something.
    kept, _, _ = store._plan_fulltext("messages", "default", "u1", ["pizza", "night"])
    assert kept == ["night"]
    # Stems are what counts: "nights" is the index's "night".
    assert store._stems(["nights", "上海"]) == ["night", "上海"]


def test_every_match_within_the_budget_is_ranked(make_memory: Any) -> None:
    """With the default settings, terms that match at most MATCH_BUDGET rows have all their
    rows ranked: the best match stored last is found among 1,200 (a cap of 1,000 ranked the
    first 1,000 in rowid order and missed it, and cost more than ranking them all)."""
    mem = make_memory(workers=0)
    store = mem.store
    assert store.RANK_CAP >= store.MATCH_BUDGET >= 1200
    s = mem.sessions.create(user_id="u1")
    for start in range(0, 1199, 100):  # add_messages takes at most 100 at a time
        batch = range(start, min(start + 100, 1199))
        s.add_messages([{"role": "user", "content": f"saffron note {i}"} for i in batch])
    s.add_messages([{"role": "user", "content": "saffron saffron saffron"}])
    (last,) = store._conn().execute("SELECT max(pk) FROM messages").fetchone()
    hits = store.fulltext_messages("default", "u1", ["saffron"], 5, SearchFilters())
    assert hits[0][0] == last


def test_fulltext_scoping_is_exact_on_both_plans(make_memory: Any) -> None:
    mem = make_memory(workers=0)
    big = mem.sessions.create(user_id="big")
    small = mem.sessions.create(user_id="small")
    big.add_messages([{"role": "user", "content": f"garden note {i}"} for i in range(12)])
    small.add_messages([{"role": "user", "content": "my garden secret"}])
    store = mem.store
    # "big" owns most rows: each match's owner is checked; "small" is scoped by its token.
    assert store._plan_fulltext("messages", "default", "big", ["garden"])[1] == "owner"
    assert store._plan_fulltext("messages", "default", "small", ["garden"])[1] == "token"
    assert {h.text for h in mem.search("garden", user_id="small")} == {"my garden secret"}
    big_hits = mem.search("garden", user_id="big", limit=50)
    assert len(big_hits) == 12 and all(h.user_id == "big" for h in big_hits)


def test_a_large_users_matches_are_found_under_other_users_better_ones(make_memory: Any) -> None:
    """A user who owns most rows has their best matches taken from the head of the whole
    table's ranking; when other users' rows fill that head, each match's owner is checked
    instead, and either way the user gets their own rows, best first."""
    mem = make_memory(workers=0)
    store = mem.store
    big = mem.sessions.create(user_id="big")
    big.add_messages([{"role": "user", "content": f"garden note {i}"} for i in range(20)])
    big.add_messages([{"role": "user", "content": "a rose in the garden note"}])
    big.add_messages([{"role": "user", "content": "rose"}])
    other = mem.sessions.create(user_id="other")
    other.add_messages([{"role": "user", "content": "rose rose rose"} for _ in range(9)])
    assert store._plan_fulltext("messages", "default", "big", ["rose"])[1] == "owner"
    store.OWNED_HEAD = 2  # the table's 4 best for a limit of 2: all "other"'s
    crowded = store.fulltext_messages("default", "big", ["rose"], 2, SearchFilters())
    store.OWNED_HEAD = 100  # the head reaches "big"'s rows
    head = store.fulltext_messages("default", "big", ["rose"], 2, SearchFilters())
    by_pk = dict(store._conn().execute("SELECT pk, content FROM messages"))
    assert [by_pk[pk] for pk, _ in crowded] == ["rose", "a rose in the garden note"]
    assert head == crowded


def test_a_large_users_layer_matches_are_found_under_rows_that_rank_higher(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user who owns most of a layer's rows has their best matches in the statuses asked
    taken from the head of the whole table's ranking, no row read per match; when other
    users' rows or rows in another status fill that head, each match is checked instead.
    Either way the user gets their own rows in those statuses, best first."""
    store = open_store(db_url)
    try:
        m = add(store, ["notes"], user="big")[0].id
        mine = [(f"garden-{i}", f"garden note {i}") for i in range(20)]
        mine += [("rose", "rose"), ("rose-garden", "a rose in the garden note")]
        mine += [(f"old-{i}", "rose rose rose") for i in range(4)]  # archived below
        process(
            store,
            LayerWrite(
                summaries=[
                    summary(sid, text, message_ids=[m], vec=unit(seed=i))
                    for i, (sid, text) in enumerate(mine)
                ]
            ),
        )
        for i in range(4):
            store.set_summary_status(P, f"old-{i}", "archived", "old", "tester")
        o = add(store, ["notes"], user="other", sid="s2")[0].id
        process(
            store,
            LayerWrite(
                summaries=[
                    summary(f"o{i}", "rose rose rose", message_ids=[o], vec=unit(seed=50 + i))
                    for i in range(3)
                ]
            ),
        )
        assert store._plan_fulltext("summaries", P, "big", ["rose"])[1] == "owner"  # type: ignore[attr-defined]
        joined: list[bool] = []
        rank = store._rank_fulltext  # type: ignore[attr-defined]

        def spied(table: str, kept: Any, matched: int, token: Any, join: str, *rest: Any) -> Any:
            joined.append(bool(join))
            return rank(table, kept, matched, token, join, *rest)

        monkeypatch.setattr(store, "_rank_fulltext", spied)

        def found() -> list[str]:
            hits = store.fulltext_items("summary", P, "big", ["rose"], 2)
            return [store.summaries_by_pk([pk])[pk].id for pk, _ in hits]

        store.OWNED_HEAD = 2  # type: ignore[attr-defined]  # the table's 4 best: none "big"'s active
        crowded = found()
        assert joined == [False, True]  # the head, then every match checked
        joined.clear()
        store.OWNED_HEAD = 100  # type: ignore[attr-defined]  # the head reaches them
        head = found()
        assert joined == [False]
        assert crowded == head == ["rose", "rose-garden"]
        # The archived ones when they are asked for, from the head as well.
        joined.clear()
        archived = store.fulltext_items("summary", P, "big", ["rose"], 2, statuses=("archived",))
        assert joined == [False] and len(archived) == 2
        assert all(store.summaries_by_pk([pk])[pk].status == "archived" for pk, _ in archived)
    finally:
        store.close()


def test_reading_a_few_items_of_a_long_history_does_not_walk_it(db_url: str) -> None:
    """Recall's brief reads find each item by its pk, however long the user's history: with
    the user named beside the pks, SQLite's planner walked the user's index instead (the
    summaries of a 100,000-message user: 1.8 ms against 0.05 for a search's hundred)."""
    store = open_store(db_url)
    try:
        m = add(store, ["notes"], user="long")[0].id
        process(
            store,
            LayerWrite(
                summaries=[
                    summary(f"s{i}", f"note {i}", message_ids=[m], vec=unit(seed=i))
                    for i in range(1500)
                ]
            ),
        )
        m2 = add(store, ["notes"], user="short", sid="s2")[0].id
        process(
            store,
            LayerWrite(summaries=[summary(f"t{i}", "a note", message_ids=[m2]) for i in range(20)]),
        )
        conn = store._conn()  # type: ignore[attr-defined]

        def steps(user: str) -> int:
            sql = "SELECT pk FROM summaries WHERE user_id = ? ORDER BY pk LIMIT 20"
            pks = [pk for (pk,) in conn.execute(sql, (user,))]
            count = [0]

            def step() -> int:
                count[0] += 1
                return 0

            conn.set_progress_handler(step, 1)
            try:
                briefs = store.recall_briefs(P, user, summaries=pks)[2]
            finally:
                conn.set_progress_handler(None, 1)
            assert sorted(briefs) == sorted(pks)
            return count[0]

        assert steps("long") < 2 * steps("short")
    finally:
        store.close()


def test_counting_messages_by_status_reads_an_index_not_the_rows(db_url: str) -> None:
    """``stats()`` (the dashboard's overview, ``stratamem stats``) counts messages by status:
    reading the rows read every long message's overflow pages too (the status comes after
    the content), 1.6 s of a 2.1 s ``stats()`` at a million messages."""
    store = open_store(db_url)
    try:
        add(store, [f"{i} " + "long content " * 2000 for i in range(30)])
        process(store)
        add(store, ["one more"], sid="s2")
        conn = store._conn()  # type: ignore[attr-defined]
        statements: list[str] = []
        conn.set_trace_callback(statements.append)
        try:
            counts = [store.stats(P), store.stats()]
        finally:
            conn.set_trace_callback(None)
        assert all(c["messages"] == {"pending": 1, "processed": 30, "failed": 0} for c in counts)
        reads = [sql for sql in statements if " FROM messages " in f"{sql} "]
        assert len(reads) == 2
        for sql in reads:
            plan = [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}")]
            table = [step for step in plan if " messages " in f"{step} "]
            assert len(table) == 1 and "COVERING INDEX messages_by_status" in table[0], plan
    finally:
        store.close()


def _summary_facts(store: Any) -> set[tuple[str, int]]:
    """(fact id, summary pk) pairs: as the triggers keep them, and as fact_ids say."""
    conn = store._conn()
    kept = set(conn.execute("SELECT fact_id, summary_pk FROM summary_facts"))
    listed = set(conn.execute("SELECT j.value, s.pk FROM summaries s, json_each(s.fact_ids) j"))
    assert kept == listed
    return kept


def test_which_summaries_hold_a_fact_is_kept_beside_them(db_url: str) -> None:
    """summary_facts, the reverse of summaries.fact_ids, follows every write: filled for a
    file migrated from before it, and kept by adding, strengthening, superseding and erasing."""
    old = SQLiteStore(db_url, migrate_to=17)  # a file from before it, with a summary
    try:
        m = add(old, ["I live in Berlin and like ramen"])[0].id
        vec = unit(seed=1)
        process(
            old,
            LayerWrite(
                facts=[fact("f1", "User lives in Berlin", [m], vec), fact("f2", "ramen", [m], vec)],
                summaries=[summary("s1", "User lives in Berlin", fact_ids=["f1"], message_ids=[m])],
            ),
        )
    finally:
        old.close()
    store = open_store(db_url)  # migrated in place: the existing summary is indexed
    try:
        assert _summary_facts(store) == {("f1", store.get_summaries(P, ["s1"])[0].pk)}
        add(store, ["and ramen"], prefix="2")
        process(
            store,
            LayerWrite(
                summaries=[summary("s1", "Berlin, ramen", action="strengthen", fact_ids=["f2"])]
            ),
        )
        pk1 = store.get_summaries(P, ["s1"])[0].pk
        assert _summary_facts(store) == {("f1", pk1), ("f2", pk1)}
        add(store, ["I moved to Lisbon"], prefix="3")
        process(
            store,
            LayerWrite(
                summaries=[
                    summary(
                        "s2",
                        "User lives in Lisbon",
                        action="supersede",
                        supersedes="s1",
                        fact_ids=["f2"],
                    )
                ]
            ),
        )
        pk2 = store.get_summaries(P, ["s2"])[0].pk
        assert _summary_facts(store) == {("f1", pk1), ("f2", pk1), ("f2", pk2)}
        # f1 is held by no current summary any more; f2 is, by s2.
        assert [f.status for f in store.get_facts(P, ["f1", "f2"])] == ["superseded", "active"]
        store.erase_user(P, "u1", actor="test", reason=None)
        assert _summary_facts(store) == set()
    finally:
        store.close()


def test_retiring_a_summarys_facts_does_not_read_every_summary_of_the_user(db_url: str) -> None:
    """Superseding a summary asks which current summaries still hold its facts: it asked
    every summary of the user (parsing its fact_ids) inside the write transaction, 1.96 s
    for five facts of a million-message user."""
    store = open_store(db_url)
    try:
        conn = store._conn()  # type: ignore[attr-defined]

        def steps(user: str, others: int) -> int:
            m = add(store, ["notes"], user=user, sid=f"{user}-s")[0].id
            process(
                store,
                LayerWrite(
                    facts=[
                        fact(f"{user}-f{i}", f"note {i}", [m], unit(seed=i)) for i in range(others)
                    ],
                    summaries=[
                        summary(
                            f"{user}-s{i}", f"note {i}", fact_ids=[f"{user}-f{i}"], message_ids=[m]
                        )
                        for i in range(others)
                    ],
                ),
            )
            count = [0]

            def step() -> int:
                count[0] += 1
                return 0

            write = summary(f"{user}-new", "changed", action="supersede", supersedes=f"{user}-s0")
            add(store, ["a change"], user=user, sid=f"{user}-s", prefix="2")
            conn.set_progress_handler(step, 1)
            try:
                process(store, LayerWrite(summaries=[write]))
            finally:
                conn.set_progress_handler(None, 1)
            assert store.get_facts(P, [f"{user}-f0"])[0].status == "superseded"
            return count[0]

        assert steps("long", 1500) < 2 * steps("short", 20)
    finally:
        store.close()


def test_full_text_statements_ranking_many_rows_run_apart_with_the_same_results(
    make_memory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A search's full-text statements that rank more than APART_ROWS rows run beside the
    first of them, each on a connection of its own: the same results as one after the
    other; one that fails fails the search, and the next search works; once the store is
    closed their threads are gone and a search says the store is closed."""
    mem = make_memory(workers=0)
    s = mem.sessions.create(user_id="u1")
    s.add_messages([{"role": "user", "content": f"pizza and sushi night {i}"} for i in range(6)])
    s.add_messages([{"role": "user", "content": t} for t in ("ramen", "ramen and pizza")])
    store = mem.store
    variants = [["pizza", "sushi"], ["ramen"], ["night", "pizza", "ramen"]]
    apart: list[str] = []
    run_apart = store._run_apart

    def counted(ask: Any, plan: Any) -> Any:
        apart.append(threading.current_thread().name)
        return run_apart(ask, plan)

    monkeypatch.setattr(store, "_run_apart", counted)

    def search() -> list[dict[str, list[tuple[int, float]]]]:
        return store.fulltext_layers(
            "default", "u1", variants, 20, messages=SearchFilters(), facts=None, summaries=None
        )

    together = search()  # no statement ranks more than APART_ROWS
    assert apart == [] and together[0]["message"] and together[1]["message"]
    before = set(threading.enumerate())  # other tests' stores may have threads of their own
    store.APART_ROWS = 2  # the first and third variants' statements rank more
    assert search() == together
    assert len(apart) == 1  # the first of them runs on the caller's connection
    threads = [
        t for t in set(threading.enumerate()) - before if t.name.startswith("stratamem-fulltext")
    ]
    assert threads

    def broken(ask: Any, plan: Any) -> Any:
        return run_apart(ask._replace(table="no_such_table", filters=None), plan)

    monkeypatch.setattr(store, "_run_apart", broken)
    with pytest.raises(StoreError, match="no_such_table"):
        search()
    monkeypatch.setattr(store, "_run_apart", run_apart)
    assert search() == together
    mem.close()
    assert not any(t.is_alive() for t in threads)
    with pytest.raises(StoreError, match="closed"):
        search()


def test_fulltext_of_the_only_user_needs_no_scoping(make_memory: Any) -> None:
    mem = make_memory(workers=0)
    s = mem.sessions.create(user_id="solo")
    s.add_messages([{"role": "user", "content": f"tulip bulb {i}"} for i in range(5)])
    assert mem.store._plan_fulltext("messages", "default", "solo", ["tulip"])[1] == "none"
    assert len(mem.search("tulip", user_id="solo", limit=10)) == 5
    assert mem.search("tulip", user_id="nobody") == []  # another user: scoped by token


def test_similarities_in_blocks_equal_the_plain_product_within_rounding() -> None:
    rng = np.random.default_rng(3)
    for rows in (1, 682, 683, 5000):
        matrix = rng.standard_normal((rows, 384)).astype(np.float32)
        for query in (
            rng.standard_normal(384).astype(np.float32),  # one vector
            rng.standard_normal((4, 384)).astype(np.float32).T,  # a column per query
        ):
            got = similarities(matrix, query)
            assert got.dtype == np.float32 and got.shape == (rows, *query.shape[1:])
            np.testing.assert_allclose(got, matrix @ query, rtol=0, atol=1e-4)


_SPIN_PROBE = """
import sys, threading, time
from pathlib import Path
import numpy as np
from stratamem._products import similarities
from stratamem.store._vector_cache import VectorScope

def other_threads_cpu():
    main = str(threading.get_native_id())
    total = 0
    for task in Path("/proc/self/task").iterdir():
        if task.name != main:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime + stime, in ticks
    return total / 100

rng = np.random.default_rng(0)
matrix = rng.standard_normal((4000, 384)).astype(np.float32)
query = rng.standard_normal(384).astype(np.float32)
scope = VectorScope(dim=384, index_threshold=10**9)
scope.add(np.arange(1, 4001), np.arange(1, 4001), matrix)
queries = rng.standard_normal((4, 384)).astype(np.float32).T  # 4 variants, as recall has
search = {
    "plain": lambda: matrix @ query,
    "scope": lambda: scope.search(query, 10),
    "plain, 4 queries": lambda: matrix[:600] @ queries,  # recall's candidates x variants
    "blocks, 4 queries": lambda: similarities(matrix[:600], queries),
}[sys.argv[1]]
before, start = other_threads_cpu(), time.perf_counter()
while time.perf_counter() - start < 0.6:  # searches a few milliseconds apart
    search()
    time.sleep(0.005)
print((other_threads_cpu() - before) / (time.perf_counter() - start))
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc (Linux)")
@pytest.mark.parametrize(
    ("plain", "ours"), [("plain", "scope"), ("plain, 4 queries", "blocks, 4 queries")]
)
def test_large_products_leave_no_blas_thread_spinning(plain: str, ours: str) -> None:
    """numpy's OpenBLAS runs a product this large on every core and its threads then spin
    between calls; a scope search and recall's candidate similarities keep it on the calling
    thread. Measured in a fresh process (only numpy's own threads beside the main one);
    skipped where the plain product does not spin (another BLAS, one core)."""

    def busy(mode: str) -> float:
        run = subprocess.run(
            [sys.executable, "-c", _SPIN_PROBE, mode],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return float(run.stdout)

    if busy(plain) < 0.5:
        pytest.skip("this numpy's BLAS does not spin threads after a large product here")
    assert busy(ours) < 0.2  # share of a core the other threads used


_CLOSE_UNDER_A_STATEMENT = """
import sys, threading
from stratamem.store.sqlite import SQLiteStore
store = SQLiteStore(sys.argv[1])
inside, closed = threading.Event(), threading.Event()


def hold() -> int:
    inside.set()
    closed.wait(10)
    return 1


outcome = []


def reader() -> None:
    conn = store._conn()
    conn.create_function("hold", 0, hold)
    try:
        outcome.append(conn.execute("SELECT hold()").fetchall())
        store.job_states([1])
    except Exception as exc:
        outcome.append(type(exc).__name__)


thread = threading.Thread(target=reader)
thread.start()
inside.wait(10)
store.close()
closed.set()
thread.join(10)
print(outcome)
"""


def test_close_leaves_a_statement_running_in_another_thread_to_finish(tmp_path: Path) -> None:
    """A worker past close()'s timeout may be mid-statement when the store closes: closing
    its connection under the statement crashed the interpreter (SIGSEGV). The statement
    finishes, and the thread's next use of the store raises StoreError."""
    run = subprocess.run(
        [sys.executable, "-c", _CLOSE_UNDER_A_STATEMENT, f"sqlite:///{tmp_path / 'm.db'}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, (run.returncode, run.stderr[-2000:])
    assert run.stdout.strip() == "[[(1,)], 'StoreError']"


@pytest.mark.parametrize(
    "text",
    [
        "[]",
        '["m-1","m-2"]',
        '[1, 2.5, null, true, "x"]',
        ' ["spaced"] ',
        '["\\u00e9t\\u00e9", "été", "日本"]',
        '[{"nested": [1]}]',
        "[NaN]",
    ],
)
def test_arrays_read_back_as_json_loads_reads_them(text: str) -> None:
    """The dialect's fast path for compact JSON arrays gives what json.loads gives."""
    assert SQLiteDialect().load_array(text) == json.loads(text)
    assert SQLiteDialect().load_array(text.encode()) == json.loads(text)


@pytest.mark.parametrize("text", ['["a"] x', '["a"', "x", '["a"],["b"]'])
def test_an_array_that_is_not_json_fails_as_json_loads_fails(text: str) -> None:
    with pytest.raises(json.JSONDecodeError):
        SQLiteDialect().load_array(text)


def test_bound_lists_take_a_few_widths_and_select_what_they_list(
    request: pytest.FixtureRequest,
) -> None:
    """Each length of a bound IN list used to be an SQL text of its own, so a search's brief
    reads (a different number of candidates each time) missed the connection's statement
    cache and were parsed again; a few widths, the last value repeated, select the same rows
    with IN and with NOT IN."""
    d = SQLiteDialect()
    texts = {d.in_("x", list(range(1, n + 1)))[0] for n in range(1, 501)}
    assert len(texts) <= 10
    conn = sqlite3.connect(":memory:")
    request.addfinalizer(conn.close)
    conn.execute("CREATE TABLE t (x INTEGER)")
    conn.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(1, 700)])
    for n in (1, 7, 8, 9, 44, 129, 257, 500, 501):
        wanted = list(range(3, 3 + 2 * n, 2))
        sql, args = d.in_("x", wanted)
        assert sql.count("?") == len(args) and (len(args) >= n or n > 500)  # then JSON
        found = [r[0] for r in conn.execute(f"SELECT x FROM t WHERE {sql} ORDER BY x", args)]
        assert found == [w for w in wanted if w < 700]
        (left,) = conn.execute(f"SELECT count(*) FROM t WHERE NOT {sql}", args).fetchone()
        assert left == 699 - len(found)
    assert d.in_("x", []) == ("x IN ()", [])
