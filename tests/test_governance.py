"""Projects, keys, status changes, forget, erase and export on a real store of each backend."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

import dbsql
from stratamem import Memory
from stratamem.errors import NotFoundError, ValidationError
from stratamem.store import LeaseLostError
from stratamem.store._text import scope_token

TRIP = [
    {"id": "m1", "role": "user", "content": "I moved to Berlin last May."},
    {"id": "m2", "role": "user", "content": "My favourite food is ramen."},
    {"id": "m3", "role": "user", "content": "I adopted a dog named Rex."},
]


def _fill(mem: Memory, user: str = "u1", prefix: str = "") -> None:
    s = mem.sessions.create(user, session_id=f"{prefix}s1")
    s.add_messages([{**m, "id": prefix + m["id"]} for m in TRIP[:2]], sync=True)
    s2 = mem.sessions.create(user, session_id=f"{prefix}s2")
    s2.add_messages([{**TRIP[2], "id": prefix + "m3"}], sync=True)


def _rows(mem: Memory, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    return dbsql.rows(mem.settings.database_url, sql, *args)


def _indexed(mem: Memory, table: str, word: str) -> int:
    """Rows of a layer whose full-text entry still holds ``word``."""
    if dbsql.is_postgres(mem.settings.database_url):
        sql = f"SELECT count(*) FROM {table} WHERE fts @@ to_tsquery('stratamem_fts', ?)"
    else:
        sql = f"SELECT count(*) FROM {table}_fts WHERE {table}_fts MATCH ?"
    return int(_rows(mem, sql, word)[0][0])


def _texts(mem: Memory, query: str, user: str = "u1") -> list[str]:
    return [h.text for h in mem.search(query, user_id=user, limit=20)]


def _user_counts(mem: Memory, user: str) -> dict[str, int]:
    out = {}
    for table in ("messages", "facts", "summaries", "topics", "sessions", "vectors", "jobs"):
        out[table] = _rows(mem, f"SELECT count(*) FROM {table} WHERE user_id = ?", user)[0][0]
    return out


def test_forget_messages_removes_what_was_built_on_them(mem: Memory) -> None:
    _fill(mem)
    assert any("Berlin" in t for t in _texts(mem, "Berlin"))
    counts = mem.forget(user_id="u1", message_ids=["m1"], reason="user asked")
    assert counts == {"messages": 1, "facts": 1, "summaries": 1, "topics": 1}
    assert not any("Berlin" in t for t in _texts(mem, "Where did the user move? Berlin"))
    assert all("Berlin" not in f.text for f in mem.facts.list(user_id="u1"))
    assert all("Berlin" not in s.text for s in mem.summaries.list(user_id="u1"))
    # Nothing left in the full-text index or among the vectors either.
    assert _indexed(mem, "messages", "berlin") == _indexed(mem, "facts", "berlin") == 0
    assert _rows(mem, "SELECT count(*) FROM summary_history WHERE text LIKE '%Berlin%'") == [(0,)]
    assert _rows(
        mem,
        "SELECT count(*) FROM vectors v LEFT JOIN messages m ON m.pk = v.item_pk "
        "WHERE v.kind = 'message' AND m.pk IS NULL",
    ) == [(0,)]
    # The rest of the user's memory is untouched.
    assert any("ramen" in t for t in _texts(mem, "favourite food ramen"))
    [record] = mem.audit(user_id="u1")
    assert (record.action, record.reason, record.actor) == ("forget", "user asked", "local")
    assert record.details == counts
    assert "Berlin" not in record.model_dump_json()


def test_forget_session_and_topic(mem: Memory) -> None:
    _fill(mem)
    counts = mem.forget(user_id="u1", session_id="s2", actor="ops@example.com")
    assert counts["sessions"] == 1 and counts["messages"] == 1
    with pytest.raises(NotFoundError):
        mem.sessions.get("s2")
    assert not any("Rex" in t for t in _texts(mem, "dog named Rex"))

    food = next(t for t in mem.topics.list(user_id="u1") if "food" in t.name)
    assert mem.topics.get(food.id).summary_ids == food.summary_ids
    counts = mem.forget(user_id="u1", topic_id=food.id)
    assert counts["topics"] == 1 and counts["messages"] == 1
    with pytest.raises(NotFoundError):
        mem.topics.get(food.id)
    assert not any("ramen" in t for t in _texts(mem, "favourite food ramen"))
    assert [m.id for m in mem.messages.list(user_id="u1")] == ["m1"]
    assert [a.actor for a in mem.audit()] == ["ops@example.com", "local"]


def test_forget_refuses_bad_scopes_and_other_users_items(mem: Memory) -> None:
    _fill(mem)
    _fill(mem, "u2", prefix="b")
    with pytest.raises(ValidationError, match="exactly one"):
        mem.forget(user_id="u1")
    with pytest.raises(ValidationError, match="exactly one"):
        mem.forget(user_id="u1", session_id="s1", message_ids=["m1"])
    with pytest.raises(ValidationError):
        mem.forget(user_id="u1", message_ids="m1")  # type: ignore[arg-type]
    # u2's session and messages are not u1's to forget: nothing happens.
    with pytest.raises(NotFoundError):
        mem.forget(user_id="u1", session_id="bs1")
    with pytest.raises(NotFoundError):
        mem.forget(user_id="u1", message_ids=["bm1"])
    with pytest.raises(NotFoundError):
        mem.forget(user_id="u1", topic_id="nope")
    assert _user_counts(mem, "u2")["messages"] == 3
    assert mem.audit() == []


def test_forget_releases_a_batch_in_flight(make_memory: Any) -> None:
    mem = make_memory(workers=0)
    s = mem.sessions.create("u1", session_id="s1")
    s.add_messages(TRIP[:2])
    batch = mem.store.claim_batch("w1", 60, 100)
    assert batch is not None and len(batch.messages) == 2
    mem.forget(user_id="u1", message_ids=["m1"])
    # The worker's result, computed from a message that is gone, can no longer commit.
    vectors = np.zeros((2, mem.embedder.dim), dtype=np.float32)
    with pytest.raises(LeaseLostError):
        mem.store.complete_batch(batch, embedder=mem.embedder.id, vectors=vectors)
    mem.wait(timeout=30)
    assert [m.status for m in mem.messages.list(user_id="u1")] == ["processed"]
    assert all("Berlin" not in f.text for f in mem.facts.list(user_id="u1"))
    assert any("ramen" in f.text for f in mem.facts.list(user_id="u1"))


def test_forgetting_every_queued_message_finishes_the_job(make_memory: Any) -> None:
    mem = make_memory(workers=0)
    mem.sessions.create("u1", session_id="s1").add_messages(TRIP[:1])
    mem.forget(user_id="u1", session_id="s1")
    assert mem.store.unfinished_jobs() == 0


def test_close_does_not_wait_for_the_jobs_of_an_erased_user(make_memory: Any) -> None:
    # close() waits for the jobs this process queued; erasing their user deletes them,
    # which must end the wait, not hold close() for its whole timeout (5.0 s before).
    mem = make_memory()
    mem.sessions.create("u1", session_id="s1").add_messages(TRIP[:2])
    deadline = time.monotonic() + 30
    while mem.store.unfinished_jobs():
        assert time.monotonic() < deadline, "the worker did not process the messages"
        time.sleep(0.02)
    mem.erase_user("u1", reason="GDPR request")
    started = time.monotonic()
    mem.close(timeout=5)
    assert time.monotonic() - started < 2.5


def test_erase_user_leaves_nothing_but_the_audit(mem: Memory) -> None:
    _fill(mem)
    _fill(mem, "u2", prefix="b")
    before = _user_counts(mem, "u2")
    counts = mem.erase_user("u1", reason="GDPR request", actor="dpo")
    assert counts["messages"] == 3 and counts["sessions"] == 2
    assert set(_user_counts(mem, "u1").values()) == {0}
    for table in ("speakers", "llm_calls"):
        assert _rows(mem, f"SELECT count(*) FROM {table} WHERE user_id = 'u1'") == [(0,)]
    if not dbsql.is_postgres(mem.settings.database_url):  # there, rows hold their index
        token = scope_token(mem.project_id, "u1")
        for fts in ("messages_fts", "facts_fts", "summaries_fts"):
            assert _rows(mem, f"SELECT count(*) FROM {fts} WHERE scope = ?", token) == [(0,)]
    assert _texts(mem, "Berlin ramen dog") == []
    assert _user_counts(mem, "u2") == before
    [record] = mem.audit(user_id="u1")
    assert (record.action, record.actor, record.reason) == ("erase_user", "dpo", "GDPR request")
    assert mem.export_user("u1")["messages"] == []
    with pytest.raises(NotFoundError):  # a second erasure finds nothing, records nothing
        mem.erase_user("u1")
    assert len(mem.audit(user_id="u1")) == 1


def test_export_user_has_every_layer_with_provenance(mem: Memory) -> None:
    _fill(mem)
    summary = mem.summaries.list(user_id="u1")[0]
    mem.set_status(summary.id, "deprioritized", reason="stale")
    data = mem.export_user("u1")
    assert data["format"] == "stratamem.export/1"
    assert [m["id"] for m in data["messages"]] == ["m1", "m2", "m3"]
    assert {s["id"] for s in data["sessions"]} == {"s1", "s2"}
    assert all(f["message_ids"] for f in data["facts"])
    exported = next(s for s in data["summaries"] if s["id"] == summary.id)
    assert exported["status"] == "deprioritized"
    assert [h["status"] for h in exported["history"]] == ["active", "deprioritized"]
    assert {t["name"] for t in data["topics"]}
    assert [a["action"] for a in data["audit"]] == ["set_status"]


def test_set_status_is_versioned_and_audited(mem: Memory) -> None:
    _fill(mem)
    summary = next(s for s in mem.summaries.list(user_id="u1") if "Berlin" in s.text)
    changed = mem.set_status(summary.id, "archived", reason="moved again", actor="ops")
    assert (changed.status, changed.version) == ("archived", summary.version + 1)
    history = mem.summaries.history(summary.id)
    assert (history[-1]["status"], history[-1]["reason"], history[-1]["actor"]) == (
        "archived",
        "moved again",
        "ops",
    )
    assert not any(h.id == summary.id for h in mem.search("Berlin", user_id="u1"))
    [record] = mem.audit()
    assert record.details == {"from": "active", "to": "archived", "version": changed.version}
    with pytest.raises(ValidationError, match="status"):
        mem.set_status(summary.id, "superseded", reason="x")
    with pytest.raises(ValidationError, match="reason"):
        mem.set_status(summary.id, "active", reason="")
    with pytest.raises(NotFoundError):
        mem.set_status("nope", "active", reason="x")


def test_listing_filters_by_status_time_and_source_metadata(mem: Memory) -> None:
    s = mem.sessions.create("u1", session_id="s1")
    s.add_messages(
        [
            {
                "role": "user",
                "content": "I moved to Berlin.",
                "timestamp": "2025-03-01T10:00:00Z",
                "metadata": {"channel": "web"},
            },
            {
                "role": "user",
                "content": "I started learning the cello.",
                "timestamp": "2026-03-01T10:00:00Z",
                "metadata": {"channel": "ios"},
            },
        ],
        sync=True,
    )
    web = mem.facts.list(user_id="u1", metadata_filters={"channel": "web"})
    assert [f.text for f in web] and all("Berlin" in f.text for f in web)
    recent = mem.facts.list(user_id="u1", since="2026-01-01T00:00:00Z")
    assert recent and all("cello" in f.text for f in recent)
    old = mem.summaries.list(user_id="u1", until="2026-01-01T00:00:00Z")
    assert old and all("Berlin" in x.text for x in old)
    ios = mem.summaries.list(user_id="u1", metadata_filters={"channel": {"$in": ["ios"]}})
    assert ios and all("cello" in x.text for x in ios)
    assert mem.facts.list(user_id="u1", status="superseded") == []
    with pytest.raises(ValidationError, match="status"):
        mem.facts.list(status="archived")
    with pytest.raises(ValidationError, match="since"):
        mem.summaries.list(since="yesterday-ish")


def test_processing_status_counts_each_state(make_memory: Any) -> None:
    mem = make_memory(workers=0)
    s = mem.sessions.create("u1", session_id="s1")
    s.add_messages(TRIP[:2])
    status = s.processing_status()
    assert (status.pending, status.processed, status.done) == (2, 0, False)
    mem.wait(timeout=30)
    status = mem.processing_status("s1")
    assert (status.pending, status.processed, status.done) == (0, 2, True)
    assert [m.id for m in status.messages] == ["m1", "m2"]
    with pytest.raises(NotFoundError):
        mem.processing_status("nope")


def test_keys_are_hashed_shown_once_and_revocable(mem: Memory) -> None:
    with pytest.raises(NotFoundError):
        mem.keys.create("acme")
    project = mem.projects.create("Acme Inc.", project_id="acme")
    assert mem.projects.create("ignored", project_id="acme") == project
    assert [p.id for p in mem.projects.list()] == ["acme"]
    record, secret = mem.keys.create("acme", name="ci")
    assert secret.startswith("sm_") and secret.startswith(record.prefix)
    stored = _rows(mem, "SELECT * FROM api_keys")
    assert secret not in repr(stored)
    assert mem.keys.verify(secret).id == record.id  # type: ignore[union-attr]
    assert mem.keys.list("acme")[0].last_used_at is not None
    assert mem.keys.verify(secret + "x") is None
    assert mem.keys.verify("Bearer " + secret) is None
    revoked = mem.keys.revoke(record.id)
    assert revoked.revoked_at is not None and not revoked.active
    assert mem.keys.verify(secret) is None
    with pytest.raises(NotFoundError):
        mem.keys.revoke("key_nope")
    with pytest.raises(ValidationError):
        mem.projects.create("")


def test_project_views_share_the_engine_but_not_the_data(mem: Memory) -> None:
    a, b = mem.for_project("a"), mem.for_project("b")
    a.sessions.create("u1", session_id="s1").add_messages(TRIP[:1], sync=True)
    with pytest.raises(NotFoundError):
        b.sessions.get("s1")
    assert b.search("Berlin", user_id="u1") == []
    assert a.search("Berlin", user_id="u1")
    with pytest.raises(NotFoundError):
        b.forget(user_id="u1", session_id="s1")
    b.close()  # a view's close leaves the engine running
    assert a.facts.list(user_id="u1")
    mem.close()
    with pytest.raises(Exception, match="closed"):
        a.search("Berlin", user_id="u1")
