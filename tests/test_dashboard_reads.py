"""What the dashboard reads and keeps, through the embedded facade, on both stores: users
(search, paging, counts), provenance both ways, activity buckets, failed messages with
their errors, and the dashboard's sign-in sessions (expiry, sign-out, a revoked key).

Layers are written through the store's own batch completion (the contract tests'
builders), so each test knows exactly which facts, summaries and topics exist; the
Memory then reads them back with an embedder of the same id.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from itertools import pairwise
from typing import Any

import numpy as np
import pytest

import dbsql
from stratamem import Memory
from stratamem.errors import NotFoundError, ValidationError
from stratamem.store import LayerWrite, Store, TopicWrite, UiSessionRow, open_store
from stratamem.testing import HashingEmbedder
from stratamem.types import Fact, Message, Summary, Topic
from test_store_contract import add, claim, fact, summary

P = "proj"
DIM = 8
EMB = f"hash:v2:{DIM}"


def vec(*hot: float) -> np.ndarray:
    v = np.zeros(DIM, dtype=np.float32)
    v[: len(hot)] = hot
    return v / np.linalg.norm(v)


def complete(store: Store, layers: LayerWrite | None = None) -> None:
    batch = claim(store)
    vectors = np.stack([vec(1, m.pk or 1) for m in batch.messages])
    store.complete_batch(batch, embedder=EMB, vectors=vectors, layers=layers)


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    s = open_store(db_url)
    yield s
    s.close()


@pytest.fixture
def memory(db_url: str) -> Iterator[Callable[..., Memory]]:
    """Memories over the test's database, in project ``proj``: no worker threads (what a
    test leaves pending stays pending), the embedder the layers were written with."""
    opened: list[Memory] = []

    def make(**kwargs: Any) -> Memory:
        kwargs.setdefault("project_id", P)
        mem = Memory(db_url, embedder=HashingEmbedder(DIM), workers=0, **kwargs)
        opened.append(mem)
        return mem

    yield make
    for mem in opened:
        mem.close(timeout=1)


# -- users ---------------------------------------------------------------------------------


def _activity(mem: Memory, user: str, messages: int = 1, sessions: int = 1) -> None:
    for i in range(sessions):
        s = mem.sessions.create(user_id=user, session_id=f"{user}-s{i}")
        if messages:
            s.add_messages([{"role": "user", "content": f"note {j}"} for j in range(messages)])


def test_users_are_listed_most_recently_active_first_with_counts(
    memory: Callable[..., Memory],
) -> None:
    mem = memory()
    _activity(mem, "carol", messages=1)
    _activity(mem, "alice", messages=2, sessions=2)
    _activity(mem, "bob", messages=0)
    # Carol comes back last: a message added makes her the most recent.
    mem.sessions.get("carol-s0").add_messages([{"role": "user", "content": "back again"}])
    users = mem.users.list()
    assert [u.user_id for u in users] == ["carol", "bob", "alice"]
    by_id = {u.user_id: u for u in users}
    assert (by_id["alice"].sessions, by_id["alice"].messages) == (2, 4)
    assert (by_id["bob"].sessions, by_id["bob"].messages) == (1, 0)
    assert (by_id["carol"].sessions, by_id["carol"].messages) == (1, 2)
    alice = mem.sessions.get("alice-s0")
    assert by_id["alice"].first_seen == alice.created_at
    assert by_id["carol"].last_seen > by_id["carol"].first_seen
    assert by_id["carol"].last_seen.tzinfo is not None
    assert mem.users.count() == 3


def test_users_search_is_a_case_insensitive_part_of_the_id_with_literal_wildcards(
    memory: Callable[..., Memory],
) -> None:
    mem = memory()
    for user in ("Alice.Smith", "malice", "bob", "a-b", "axb", "ALI"):
        _activity(mem, user, messages=0)

    def found(search: str) -> list[str]:
        return sorted(u.user_id for u in mem.users.list(search=search))

    assert found("ali") == ["ALI", "Alice.Smith", "malice"]
    assert found("SMITH") == ["Alice.Smith"]
    assert mem.users.count(search="ali") == 3
    # % and _ are characters to find, not wildcards (no id holds them).
    assert found("%") == [] and found("a_b") == [] and found("_") == []
    assert mem.users.count(search="%") == 0
    assert found("a-b") == ["a-b"]
    assert found("!") == [] and found("a!") == []  # the escape character itself
    assert found("") == sorted(u.user_id for u in mem.users.list())
    with pytest.raises(ValidationError):
        mem.users.list(search="x" * 201)


def test_users_page_in_a_stable_order(memory: Callable[..., Memory]) -> None:
    mem = memory()
    for i in range(7):
        _activity(mem, f"user-{i}", messages=0)
    every = [u.user_id for u in mem.users.list(limit=100)]
    assert every == [f"user-{i}" for i in reversed(range(7))]
    pages = [mem.users.list(limit=3, offset=o) for o in (0, 3, 6, 9)]
    assert [[u.user_id for u in p] for p in pages] == [every[:3], every[3:6], every[6:], []]
    with pytest.raises(ValidationError):
        mem.users.list(limit=0)
    with pytest.raises(ValidationError):
        mem.users.list(offset=-1)


def test_users_are_the_projects_own(memory: Callable[..., Memory]) -> None:
    mem = memory()
    mem.projects.create("other", project_id="other")
    other = mem.for_project("other")
    _activity(mem, "mine", messages=1)
    _activity(other, "theirs", messages=3)
    _activity(other, "mine", messages=1)  # the same user id in another project
    assert [(u.user_id, u.messages) for u in mem.users.list()] == [("mine", 1)]
    assert sorted((u.user_id, u.messages) for u in other.users.list()) == [
        ("mine", 1),
        ("theirs", 3),
    ]
    assert (mem.users.count(), other.users.count(), other.users.count(search="the")) == (1, 2, 1)


# -- provenance ----------------------------------------------------------------------------


def _layers(store: Store) -> dict[str, str]:
    """u1: three messages; facts f_berlin (m0), f_ramen (m1), f_old (m2, superseded by a
    later summary); summaries s_home (f_berlin, m0), s_food (f_ramen, by its fact only),
    s_gone (deleted later); topics t_life (s_home, s_food) and t_gone (deleted)."""
    rows = add(store, ["I moved to Berlin", "I like ramen", "I lived in Paris"])
    m0, m1, m2 = (r.id for r in rows)
    complete(
        store,
        LayerWrite(
            facts=[
                fact("f_berlin", "User moved to Berlin", [m0], vec(1, 0)),
                fact("f_ramen", "User likes ramen", [m1], vec(0, 1)),
                fact("f_paris", "User lived in Paris", [m2], vec(1, 1)),
            ],
            summaries=[
                summary("s_home", "User lives in Berlin", fact_ids=["f_berlin"], message_ids=[m0]),
                summary("s_food", "User likes ramen", fact_ids=["f_ramen"], vec=vec(0, 1)),
                summary("s_paris", "User lives in Paris", fact_ids=["f_paris"], message_ids=[m2]),
                summary("s_gone", "User said Berlin", fact_ids=["f_berlin"], message_ids=[m0]),
            ],
            topics=[
                TopicWrite("t_life", "Life", "Home and food", ["s_home", "s_food"], True),
                TopicWrite("t_paris", "Paris", "Before", ["s_paris", "s_gone"], True),
            ],
        ),
    )
    assert store.set_summary_status(P, "s_gone", "deleted", "test", "tester")
    assert store.set_summary_status(P, "s_paris", "archived", "test", "tester")
    return {"m0": m0, "m1": m1, "m2": m2}


def _ids(items: list[Any]) -> list[str]:
    return [i.id for i in items]


def test_provenance_of_each_kind_both_ways(store: Store, memory: Callable[..., Memory]) -> None:
    ids = _layers(store)
    m0, m2 = ids["m0"], ids["m2"]
    mem = memory()

    p = mem.provenance(m0)
    assert p.kind == "message" and isinstance(p.item, Message) and p.item.id == m0
    assert (_ids(p.facts), _ids(p.summaries), _ids(p.topics), p.messages) == (
        ["f_berlin"],
        ["s_home"],  # s_gone cites it too, but is deleted
        ["t_life"],
        [],
    )

    p = mem.provenance("f_ramen")
    assert p.kind == "fact" and isinstance(p.item, Fact)
    assert (_ids(p.messages), _ids(p.summaries), _ids(p.topics)) == (
        [ids["m1"]],
        ["s_food"],
        ["t_life"],
    )

    p = mem.provenance("s_home")
    assert p.kind == "summary" and isinstance(p.item, Summary)
    assert (_ids(p.facts), _ids(p.messages), _ids(p.topics), p.summaries) == (
        ["f_berlin"],
        [m0],
        ["t_life"],
        [],
    )
    # A summary citing only a fact reaches the fact's messages.
    assert _ids(mem.provenance("s_food").messages) == [ids["m1"]]

    p = mem.provenance("t_life")
    assert p.kind == "topic" and isinstance(p.item, Topic)
    assert _ids(p.summaries) == ["s_home", "s_food"]
    assert p.item.summary_ids == ["s_home", "s_food"]

    # Archived items are shown (the dashboard marks them); deleted ones never.
    p = mem.provenance("t_paris")
    assert [(s.id, s.status) for s in p.summaries] == [("s_paris", "archived")]
    assert p.item.summary_ids == ["s_paris"]  # type: ignore[union-attr]
    assert [(s.id, s.status) for s in mem.provenance(m2).summaries] == [("s_paris", "archived")]
    with pytest.raises(NotFoundError):
        mem.provenance("s_gone")
    with pytest.raises(NotFoundError):
        mem.provenance("no-such-item")
    with pytest.raises(ValidationError):
        mem.provenance("not an id")


def test_provenance_keeps_superseded_items(store: Store, memory: Callable[..., Memory]) -> None:
    rows = add(store, ["I moved to Berlin"])
    complete(
        store,
        LayerWrite(
            facts=[fact("f_1", "User moved to Berlin", [rows[0].id], vec(1))],
            summaries=[summary("s_1", "User lives in Berlin", fact_ids=["f_1"], vec=vec(1))],
        ),
    )
    later = add(store, ["Correction: I moved to Munich"], prefix="b-")
    complete(
        store,
        LayerWrite(
            facts=[fact("f_2", "User moved to Munich", [later[0].id], vec(1, 1))],
            summaries=[
                summary(
                    "s_2",
                    "User lives in Munich",
                    action="supersede",
                    supersedes="s_1",
                    fact_ids=["f_2"],
                    vec=vec(1, 1),
                )
            ],
        ),
    )
    mem = memory()
    p = mem.provenance(rows[0].id)
    assert [(f.id, f.status) for f in p.facts] == [("f_1", "superseded")]
    assert [(s.id, s.status, s.superseded_by) for s in p.summaries] == [
        ("s_1", "superseded", "s_2")
    ]
    assert mem.provenance("s_1").item.status == "superseded"  # type: ignore[union-attr]


def test_provenance_of_another_projects_item_is_not_found(
    store: Store, memory: Callable[..., Memory]
) -> None:
    ids = _layers(store)
    mem = memory()
    mem.projects.create("other", project_id="other")
    other = mem.for_project("other")
    for item in (ids["m0"], "f_berlin", "s_home", "t_life"):
        assert mem.provenance(item).item.id == item
        with pytest.raises(NotFoundError):
            other.provenance(item)


def test_a_message_id_that_looks_like_a_fact_id_is_still_found(
    store: Store, memory: Callable[..., Memory]
) -> None:
    # Message ids are the sender's: one may look like the pipeline's fact ids.
    rows = add(store, ["hello"], prefix="f_")
    complete(store)
    p = memory().provenance(rows[0].id)
    assert p.kind == "message" and p.item.id == rows[0].id


def test_provenance_of_a_busy_message(store: Store, memory: Callable[..., Memory]) -> None:
    # Many facts, summaries and topics around one message, all found (in a fixed number
    # of statements: see store/_core/dashboard.py).
    rows = add(store, ["a long story"])
    facts = [fact(f"f_{i}", f"fact {i}", [rows[0].id], vec(1, i)) for i in range(30)]
    sums = [summary(f"s_{i}", f"summary {i}", fact_ids=[f"f_{i}"]) for i in range(30)]
    topics = [TopicWrite(f"t_{i}", f"topic {i}", "", [f"s_{i}"], True) for i in range(30)]
    complete(store, LayerWrite(facts=facts, summaries=sums, topics=topics))
    mem = memory()
    p = mem.provenance(rows[0].id)
    assert (len(p.facts), len(p.summaries), len(p.topics)) == (30, 30, 30)
    assert len(mem.provenance("t_3").summaries) == 1


# -- activity ------------------------------------------------------------------------------


def test_activity_has_every_bucket_oldest_first(memory: Callable[..., Memory]) -> None:
    mem = memory()
    s = mem.sessions.create(user_id="u1", session_id="s1")
    s.add_messages([{"role": "user", "content": f"m{i}"} for i in range(3)])
    mem.wait(timeout=60)  # workers=0: processed here
    failing = mem.sessions.create(user_id="u2", session_id="s2")
    failing.add_messages([{"role": "user", "content": "x"}, {"role": "user", "content": "y"}])
    batch = mem.store.claim_batch("test", 30, 10)
    assert batch is not None and batch.user_id == "u2"
    mem.store.fail_batch(batch, "model said no", None)
    s.add_messages([{"role": "user", "content": "still pending"}])

    buckets = mem.activity(hours=3, bucket_minutes=30)
    assert len(buckets) == 6
    starts = [b.start for b in buckets]
    assert starts == sorted(starts)
    assert all(b - a == timedelta(minutes=30) for a, b in pairwise(starts))
    now = datetime.now(timezone.utc)
    assert starts[-1] <= now < starts[-1] + timedelta(minutes=30)
    assert all(b.start.minute % 30 == 0 and b.start.second == 0 for b in buckets)
    assert sum(b.messages_added for b in buckets) == 6
    assert sum(b.messages_processed for b in buckets) == 3
    assert sum(b.messages_failed for b in buckets) == 2
    # Only the last bucket or the one before it (a boundary crossed meanwhile) has any.
    assert all(b.messages_added == 0 for b in buckets[:-2])

    hourly = mem.activity()
    assert len(hourly) == 48 and sum(b.messages_added for b in hourly) == 6
    assert len(mem.activity(hours=1, bucket_minutes=7)) == 9  # a partial bucket is whole
    mem.projects.create("other", project_id="other")
    assert sum(b.messages_added for b in mem.for_project("other").activity()) == 0
    for bad in ({"hours": 0}, {"bucket_minutes": 0}, {"hours": 24 * 400}, {"hours": True}):
        with pytest.raises(ValidationError):
            mem.activity(**bad)
    with pytest.raises(ValidationError):
        mem.activity(hours=24 * 30, bucket_minutes=1)  # too many buckets for a chart


def test_activity_counts_outside_the_window_are_left_out(
    store: Store, memory: Callable[..., Memory]
) -> None:
    add(store, ["long ago"])  # created_at: the contract builders' fixed past time
    complete(store)  # processed_at: now
    buckets = memory().activity()
    assert sum(b.messages_added for b in buckets) == 0
    assert sum(b.messages_processed for b in buckets) == 1


# -- failed messages -----------------------------------------------------------------------


def test_failed_messages_show_their_error(memory: Callable[..., Memory]) -> None:
    mem = memory()
    s = mem.sessions.create(user_id="u1", session_id="s1")
    s.add_messages([{"role": "user", "content": "this one fails"}])
    batch = mem.store.claim_batch("test", 30, 10)
    assert batch is not None
    mem.store.fail_batch(batch, "LLM refused: content policy", None)
    s.add_messages([{"role": "user", "content": "this one works"}])
    mem.wait(timeout=60)
    failed = mem.messages.list(status="failed")
    assert [(m.content, m.error) for m in failed] == [
        ("this one fails", "LLM refused: content policy")
    ]
    assert [m.error for m in mem.messages.list(status="processed")] == [None]
    assert mem.messages.get(failed[0].id).error == "LLM refused: content policy"
    assert mem.provenance(failed[0].id).item.error == "LLM refused: content policy"  # type: ignore[union-attr]


# -- dashboard sign-in sessions ------------------------------------------------------------


def test_a_sign_in_is_found_by_its_token_and_stores_only_its_hash(
    memory: Callable[..., Memory], db_url: str
) -> None:
    mem = memory()
    token, record = mem.dashboard_sessions.create("admin", None, None, 3600)
    assert len(token) >= 43 and record.kind == "admin" and record.project_id is None
    assert len(record.csrf_token) >= 43 and record.csrf_token != token
    lifetime = record.expires_at - record.created_at
    assert abs(lifetime - timedelta(seconds=3600)) < timedelta(milliseconds=1)
    assert "csrf_token" not in repr(record)
    stored = dbsql.rows(db_url, "SELECT id_hash, csrf_token FROM ui_sessions")
    assert stored == [(hashlib.sha256(token.encode()).hexdigest(), record.csrf_token)]
    assert token not in str(dbsql.rows(db_url, "SELECT * FROM ui_sessions"))
    again = mem.dashboard_sessions.get(token)
    assert again is not None and again.csrf_token == record.csrf_token
    # An admin picks a project later; any process sees the same sign-in.
    assert mem.dashboard_sessions.set_project(token, P)
    found = memory().dashboard_sessions.get(token)
    assert found is not None and found.project_id == P
    for wrong in ("", "x" * 43, token + "x", "é" * 43, "x" * 500):
        assert mem.dashboard_sessions.get(wrong) is None
        assert not mem.dashboard_sessions.set_project(wrong, P)
    assert mem.dashboard_sessions.delete(token)
    assert mem.dashboard_sessions.get(token) is None
    assert not mem.dashboard_sessions.delete(token)
    assert not mem.dashboard_sessions.set_project(token, P)


def test_a_sign_in_expires_and_is_pruned(
    store: Store, memory: Callable[..., Memory], db_url: str
) -> None:
    mem = memory()
    token, _ = mem.dashboard_sessions.create("admin", None, None, 1)
    now = time.time()
    old = UiSessionRow("h-old", "admin", None, None, "c", now - 100, now - 1, now - 100)
    assert store.create_ui_session(old)
    assert store.get_ui_session("h-old") is None  # expired: never returned
    assert not store.update_ui_session_project("h-old", P)
    time.sleep(1.05)
    assert mem.dashboard_sessions.get(token) is None
    assert mem.dashboard_sessions.prune() == 2
    assert dbsql.rows(db_url, "SELECT count(*) FROM ui_sessions") == [(0,)]
    with pytest.raises(ValidationError):
        mem.dashboard_sessions.create("admin", None, None, 0)
    with pytest.raises(ValidationError):
        mem.dashboard_sessions.create("root", None, None, 60)  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        mem.dashboard_sessions.create("key", None, P, 60)


def test_revoking_a_key_ends_its_sign_ins(memory: Callable[..., Memory]) -> None:
    mem = memory()
    mem.projects.create("Project", project_id=P)
    key, _ = mem.keys.create(P)
    other_key, _ = mem.keys.create(P)
    token, record = mem.dashboard_sessions.create("key", key.id, P, 3600)
    assert (record.kind, record.key_id, record.project_id) == ("key", key.id, P)
    second, _ = mem.dashboard_sessions.create("key", key.id, P, 3600)
    kept, _ = mem.dashboard_sessions.create("key", other_key.id, P, 3600)
    admin, _ = mem.dashboard_sessions.create("admin", None, None, 3600)
    mem.keys.revoke(key.id)
    assert mem.dashboard_sessions.get(token) is None
    assert mem.dashboard_sessions.get(second) is None
    assert mem.dashboard_sessions.get(kept) is not None
    assert mem.dashboard_sessions.get(admin) is not None
    # A revoked or unknown key signs no one in.
    with pytest.raises(NotFoundError):
        mem.dashboard_sessions.create("key", key.id, P, 3600)
    with pytest.raises(NotFoundError):
        mem.dashboard_sessions.create("key", "key_unknown", P, 3600)
    assert mem.store.delete_ui_sessions_of_key(other_key.id) == 1
    assert mem.dashboard_sessions.get(kept) is None


# -- the schema ------------------------------------------------------------------------------


def test_an_older_database_is_upgraded_with_the_dashboards_table(
    backend: str, db_url: str, memory: Callable[..., Memory]
) -> None:
    if backend == "postgres":
        from stratamem.store.postgres import PostgresStore, latest_schema_version

        old: Store = PostgresStore(db_url, migrate_to=5)
    else:
        from stratamem.store.sqlite import SQLiteStore, latest_schema_version

        old = SQLiteStore(db_url, migrate_to=11)
    try:
        with pytest.raises(Exception):  # noqa: B017  (either database's own error)
            dbsql.rows(db_url, "SELECT count(*) FROM ui_sessions")
    finally:
        old.close()
    # Written as that version wrote them: today's code writes columns it did not have.
    long_ago = "2025-01-01T00:00:00.000000Z"
    dbsql.execute(
        db_url,
        "INSERT INTO sessions (project_id, id, user_id, metadata, created_at, updated_at) "
        "VALUES (?, 's1', 'u1', '{}', ?, ?)",
        P,
        long_ago,
        long_ago,
    )
    # PostgreSQL keeps the full-text document in the row (SQLite in its own table).
    fts = (
        (", fts, fts_len", ", to_tsvector('stratamem_fts', 'from before the upgrade'), 4")
        if backend == "postgres"
        else ("", "")
    )
    dbsql.execute(
        db_url,
        "INSERT INTO messages (project_id, id, user_id, session_id, role, content, "
        f"content_hash, ts, metadata, created_at{fts[0]}) VALUES (?, 'm-old', 'u1', 's1', "
        f"'user', 'from before the upgrade', 'h', ?, '{{}}', ?{fts[1]})",
        P,
        long_ago,
        long_ago,
    )
    mem = memory()
    assert mem.store.schema_version() == latest_schema_version()
    assert [(u.user_id, u.messages) for u in mem.users.list()] == [("u1", 1)]
    token, _ = mem.dashboard_sessions.create("admin", None, None, 60)
    assert mem.dashboard_sessions.get(token) is not None
    assert sum(b.messages_added for b in mem.activity()) == 0  # made long ago (see add)
