"""The Store port's contract: every method's semantics, run unchanged on each backend.

Each test gets a fresh, empty store (a SQLite file, or a schema of its own in PostgreSQL)
through the ``db_url`` fixture, which conftest parametrises by backend. Nothing here
knows which backend it talks to: what passes here on both is what the engine may rely on.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import operator
import re
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest

import dbsql
from stratamem.errors import ConflictError, EmbedderMismatchError
from stratamem.store import (
    ApiKeyRow,
    CallWrite,
    ClaimedBatch,
    FactBrief,
    FactWrite,
    ItemFilters,
    LayerWrite,
    LeaseLostError,
    MessageBrief,
    MessageRow,
    OutboxWrite,
    RecallRecordRow,
    SearchFilters,
    SessionRow,
    Store,
    SummaryBrief,
    SummaryWrite,
    TopicWrite,
    WebhookDeliveryRow,
    WebhookRow,
    open_store,
    parse_metadata_filters,
)

P = "proj"
EMB = "test:v1:8"
DIM = 8
NOW = "2026-03-01T10:00:00.000000Z"


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    s = open_store(db_url)
    yield s
    s.close()


# -- builders ------------------------------------------------------------------------


def unit(*hot: float, seed: int | None = None) -> np.ndarray:
    """A unit vector of DIM dimensions: the given leading components, or random by seed."""
    if seed is not None:
        v = np.random.default_rng(seed).normal(size=DIM)
    else:
        v = np.zeros(DIM)
        v[: len(hot)] = hot
    return (v / np.linalg.norm(v)).astype(np.float32)


def session(store: Store, user: str = "u1", sid: str = "s1", project: str = P) -> SessionRow:
    row, _ = store.create_session(
        SessionRow(project, sid, user, None, {}, NOW, NOW),
    )
    return row


def message(mid: str, content: str, **extra: Any) -> MessageRow:
    fields: dict[str, Any] = {
        "project_id": P,
        "id": mid,
        "user_id": "",
        "session_id": "",
        "role": "user",
        "content": content,
        "content_hash": hashlib.sha256(content.encode()).hexdigest(),
        "ts": NOW,
        "created_at": NOW,
    }
    fields.update(extra)
    return MessageRow(**fields)


def add(
    store: Store,
    texts: Sequence[str],
    *,
    user: str = "u1",
    sid: str = "s1",
    project: str = P,
    prefix: str = "",
    **extra: Any,
) -> list[MessageRow]:
    """Store messages (ids prefix + user + index) and return the rows with their pks."""
    s = session(store, user, sid, project)
    rows = [
        message(f"{prefix}{user}-{sid}-{i}", t, project_id=project, **extra)
        for i, t in enumerate(texts)
    ]
    store.add_messages(project, s, rows)
    return rows


def claim(store: Store, worker: str = "w", lease: float = 30, most: int = 100) -> ClaimedBatch:
    batch = store.claim_batch(worker, lease, most)
    assert batch is not None
    return batch


def vectors_for(batch: ClaimedBatch) -> np.ndarray:
    return np.stack([unit(seed=m.pk) for m in batch.messages]).astype(np.float32)


def complete(store: Store, batch: ClaimedBatch, layers: LayerWrite | None = None) -> None:
    store.complete_batch(batch, embedder=EMB, vectors=vectors_for(batch), layers=layers)


def process(store: Store, layers: LayerWrite | None = None) -> ClaimedBatch:
    """Claim the next batch and complete it with ``layers``."""
    batch = claim(store)
    complete(store, batch, layers)
    return batch


def fact(fid: str, text: str, message_ids: Sequence[str], vec: np.ndarray, **kw: Any) -> FactWrite:
    return FactWrite(
        id=fid,
        text=text,
        kind=kw.pop("kind", "fact"),
        message_ids=list(message_ids),
        confidence=kw.pop("confidence", 0.9),
        model="test",
        prompt_version="t1",
        vector=vec,
        **kw,
    )


def summary(
    sid: str,
    text: str,
    *,
    action: str = "add",
    fact_ids: Sequence[str] = (),
    message_ids: Sequence[str] = (),
    vec: np.ndarray | None = None,
    **kw: Any,
) -> SummaryWrite:
    return SummaryWrite(
        action=action,
        id=sid,
        text=text,
        confidence=kw.pop("confidence", 0.8),
        fact_ids=list(fact_ids),
        message_ids=list(message_ids),
        model="test",
        prompt_version="t1",
        reason=kw.pop("reason", "test"),
        vector=vec,
        **kw,
    )


def layered(store: Store) -> dict[str, Any]:
    """u1 with two messages, two facts, one summary per fact, and a topic holding both."""
    rows = add(store, ["I moved to Berlin last May", "My favourite food is ramen"])
    m0, m1 = (r.id for r in rows)
    process(
        store,
        LayerWrite(
            facts=[
                fact("f-berlin", "User moved to Berlin", [m0], unit(1, 0), occurred_at=NOW),
                fact("f-ramen", "User likes ramen", [m1], unit(0, 1), labels=["food"]),
            ],
            summaries=[
                summary(
                    "s-home",
                    "User lives in Berlin",
                    fact_ids=["f-berlin"],
                    message_ids=[m0],
                    vec=unit(1, 0.1),
                    observed_at=NOW,
                ),
                summary(
                    "s-food",
                    "User likes ramen",
                    fact_ids=["f-ramen"],
                    message_ids=[m1],
                    vec=unit(0.1, 1),
                ),
            ],
            topics=[TopicWrite("t-life", "life", "home and food", ["s-home", "s-food"], True)],
            calls=[CallWrite("extract", "test", "t1", 10, 5, 12.5, True)],
        ),
    )
    return {"messages": rows, "m0": m0, "m1": m1}


# -- meta and schema -------------------------------------------------------------------


def test_meta_round_trips_and_the_schema_is_current(store: Store) -> None:
    assert store.schema_version() >= 1
    assert store.get_meta("nothing") is None
    store.set_meta("k", "v1")
    store.set_meta("k", "v2")
    assert store.get_meta("k") == "v2"


def test_a_store_reopens_with_its_data(db_url: str) -> None:
    first = open_store(db_url)
    add(first, ["kept across opens"])
    version = first.schema_version()
    first.close()
    again = open_store(db_url)
    try:
        assert again.schema_version() == version
        assert [m.content for m in again.list_messages(P)] == ["kept across opens"]
    finally:
        again.close()


# -- sessions --------------------------------------------------------------------------


def test_sessions_are_created_once_and_listed_in_creation_order(store: Store) -> None:
    row, created = store.create_session(
        SessionRow(P, "s1", "u1", "trip", {"a": 1, "城市": "東京"}, NOW, NOW)
    )
    assert created and row.title == "trip" and row.metadata == {"a": 1, "城市": "東京"}
    again, created = store.create_session(SessionRow(P, "s1", "other", "x", {}, NOW, NOW))
    assert not created and again == row  # the stored row, not the new values
    session(store, "u2", "s2")
    session(store, "u1", "s3")
    session(store, "u1", "s4", project="elsewhere")
    assert [s.id for s in store.list_sessions(P, None, 10, 0)] == ["s1", "s2", "s3"]
    assert [s.id for s in store.list_sessions(P, "u1", 10, 0)] == ["s1", "s3"]
    assert [s.id for s in store.list_sessions(P, None, 1, 1)] == ["s2"]
    assert store.get_session(P, "s4") is None
    assert store.get_session("elsewhere", "s4") is not None


# -- messages --------------------------------------------------------------------------


def test_messages_are_stored_with_a_job_in_acceptance_order(store: Store) -> None:
    s = session(store)
    rows = [
        message("a", "first", metadata={"城市": "東京", "nested": {"l": [1, 2.5, None, True]}}),
        message("b", "second", name="Caroline", event_type="search", page="/shop"),
    ]
    out = store.add_messages(P, s, rows)
    assert out.message_ids == ["a", "b"] and out.duplicates == [] and out.job_id is not None
    assert rows[0].pk is not None and rows[1].pk is not None and rows[0].pk < rows[1].pk
    assert rows[0].job_id == rows[1].job_id == out.job_id
    a = store.get_message(P, "a")
    assert a is not None and a.status == "pending" and a.attempts == 0
    assert a.metadata == {"城市": "東京", "nested": {"l": [1, 2.5, None, True]}}
    assert (a.user_id, a.session_id, a.pk) == ("u1", "s1", rows[0].pk)
    b = store.get_message(P, "b")
    assert b is not None and (b.name, b.event_type, b.page) == ("Caroline", "search", "/shop")
    assert store.speaker_names(P, "u1") == ["Caroline"]
    assert store.job_states([out.job_id]) == {out.job_id: "queued"}
    assert store.unfinished_jobs() == 1 and store.unfinished_jobs("other") == 0
    assert store.get_session(P, "s1").updated_at > NOW  # type: ignore[union-attr]


def test_a_resend_is_a_duplicate_and_a_changed_resend_a_conflict(store: Store) -> None:
    s = session(store)
    store.add_messages(P, s, [message("a", "hello")])
    again = store.add_messages(P, s, [message("a", "hello"), message("b", "new")])
    assert again.duplicates == ["a"] and again.job_id is not None
    only = store.add_messages(P, s, [message("a", "hello")])
    assert only.duplicates == ["a"] and only.job_id is None
    with pytest.raises(ConflictError):
        store.add_messages(P, s, [message("c", "fresh"), message("a", "changed")])
    # All or nothing: "c" of the refused call was not stored.
    assert store.get_message(P, "c") is None
    assert [m.id for m in store.list_messages(P)] == ["a", "b"]
    assert store.unfinished_jobs() == 2


def test_message_reads(store: Store) -> None:
    rows = add(store, ["one", "two", "three"])
    add(store, ["other user"], user="u2", sid="s2")
    add(store, ["other project"], project="q")
    ids = [r.id for r in rows]
    assert set(store.get_messages(P, [ids[0], ids[2], "missing"])) == {ids[0], ids[2]}
    assert store.get_messages(P, []) == {}
    assert [m.id for m in store.list_messages(P, user_id="u1")] == ids
    assert [m.id for m in store.list_messages(P, user_id="u1", newest_first=True)] == ids[::-1]
    assert [m.id for m in store.list_messages(P, user_id="u1", limit=1, offset=1)] == ids[1:2]
    assert [m.id for m in store.list_messages(P, session_id="s2")] == ["u2-s2-0"]
    assert store.list_messages(P, status="processed") == []
    assert len(store.list_messages(P)) == 4
    by_pk = store.messages_by_pk([rows[1].pk or 0, 10**9])
    assert list(by_pk) == [rows[1].pk] and by_pk[rows[1].pk or 0].content == "two"
    before = store.context_messages(P, "u1", rows[2].pk or 0, 5)
    assert [m.content for m in before] == ["one", "two"]
    assert [m.content for m in store.context_messages(P, "u1", rows[2].pk or 0, 1)] == ["two"]
    assert store.session_status(P, "s1") == [(i, "pending", None) for i in ids]


def test_many_messages_at_once_are_stored_resent_indexed_and_read(store: Store) -> None:
    # More ids than a statement binds one by one: every read and check takes them all.
    s = session(store)
    rows = [
        message(f"m{i:04}", f"note {i} about kayaks", name=f"Speaker {i % 3}") for i in range(700)
    ]
    out = store.add_messages(P, s, rows)
    assert out.duplicates == [] and store.job_states([out.job_id or 0]) == {out.job_id: "queued"}
    pks = [r.pk or 0 for r in rows]
    assert pks == sorted(pks) and len(set(pks)) == 700
    again = store.add_messages(P, s, [*rows, message("last", "the last one")])
    assert again.duplicates == [r.id for r in rows] and again.job_id != out.job_id
    with pytest.raises(ConflictError, match="m0699"):
        store.add_messages(P, s, [*rows[:-1], message("m0699", "changed")])
    assert set(store.get_messages(P, [r.id for r in rows])) == {r.id for r in rows}
    assert sorted(store.messages_by_pk(pks)) == pks
    everything = list(range(1, 800))  # job ids, most of them no job
    assert store.job_states(everything) == {out.job_id: "queued", again.job_id: "queued"}
    assert store.speaker_names(P, "u1") == ["Speaker 0", "Speaker 1", "Speaker 2"]
    # Full text is indexed as the messages are accepted, before any processing.
    hits = store.fulltext_messages(P, "u1", ["kayaks"], 1000, SearchFilters())
    assert sorted(pk for pk, _ in hits) == pks
    batch = claim(store, most=1000)
    assert [m.id for m in batch.messages] == [r.id for r in rows] + ["last"]
    assert store.extend_lease(batch.job_ids, "w", 30)


# -- jobs ------------------------------------------------------------------------------


def test_nothing_to_claim_is_none(store: Store) -> None:
    assert store.claim_batch("w", 30, 10) is None
    assert store.next_job_time() is None


def test_a_claim_takes_one_users_jobs_in_order_within_the_size_limit(store: Store) -> None:
    for n in range(3):
        add(store, [f"a{n}-x", f"a{n}-y"], prefix=f"{n}")
    add(store, ["b0"], user="u2", sid="s2")
    batch = claim(store, most=4)
    assert batch.user_id == "u1" and batch.project_id == P and not batch.probe
    assert batch.job_attempts == dict.fromkeys(batch.job_ids, 1)
    assert len(batch.job_ids) == 2  # two jobs of two messages fill 4; the third waits
    assert [m.content for m in batch.messages] == ["a0-x", "a0-y", "a1-x", "a1-y"]
    assert all(m.attempts == 1 for m in batch.messages)
    # u1's next job is not claimable while earlier ones run: the next claim is u2's.
    other = claim(store, "w2")
    assert other.user_id == "u2" and [m.content for m in other.messages] == ["b0"]
    assert store.claim_batch("w3", 30, 100) is None
    complete(store, batch)
    rest = claim(store, "w3")
    assert [m.content for m in rest.messages] == ["a2-x", "a2-y"]
    # A first job larger than the limit is still claimed (alone).
    add(store, [f"big {i}" for i in range(5)], user="u3", sid="s3")
    big = claim(store, "w4", most=2)
    assert len(big.messages) == 5


def test_a_claim_for_given_jobs_takes_a_batch_of_their_users_only(store: Store) -> None:
    # A caller waiting for its own jobs runs its users' work, in their order.
    add(store, ["u1 first"], prefix="0")
    add(store, ["u1 second"], prefix="1")
    add(store, ["u2 only"], user="u2", sid="s2")
    (u1_first, u1_second), (u2_job,) = (
        sorted({m.job_id for m in store.list_messages(P, user_id=u)} - {None}) for u in ("u1", "u2")
    )
    mine = store.claim_batch("caller", 30, 1, for_jobs=[u2_job])
    assert mine is not None and mine.user_id == "u2" and mine.job_ids == [u2_job]
    assert store.claim_batch("caller", 30, 1, for_jobs=[u2_job]) is None  # held
    # A later job of u1 is run only after the earlier ones: the claim takes u1's head.
    head = store.claim_batch("caller", 30, 1, for_jobs=[u1_second])
    assert head is not None and head.job_ids == [u1_first]
    assert store.claim_batch("caller", 30, 1, for_jobs=[u1_second]) is None
    assert store.claim_batch("caller", 30, 1, for_jobs=[10**9]) is None  # no such job


def test_completing_a_batch_stores_vectors_and_finishes_jobs(store: Store) -> None:
    rows = add(store, ["hello", "world"])
    batch = claim(store)
    assert store.job_states(batch.job_ids) == {batch.job_ids[0]: "running"}
    assert store.unfinished_jobs() == 1
    complete(store, batch)
    assert store.job_states(batch.job_ids) == {batch.job_ids[0]: "done"}
    assert store.unfinished_jobs() == 0
    done = store.list_messages(P)
    assert {m.status for m in done} == {"processed"} and all(m.processed_at for m in done)
    assert store.get_meta("embedder") == EMB
    q = unit(seed=rows[1].pk)
    found = store.vector_messages(P, "u1", q, EMB, 10, SearchFilters())
    assert found[0][0] == rows[1].pk and found[0][1] == pytest.approx(1.0, abs=1e-5)
    assert store.stats(P)["vectors"] == {EMB: 2}


def test_an_expired_lease_is_reclaimed_and_the_old_holder_cannot_commit(store: Store) -> None:
    add(store, ["slow"])
    slow = claim(store, "slow", lease=0.3)
    assert store.claim_batch("fast", 30, 10) is None  # held
    assert store.extend_lease(slow.job_ids, "slow", 0.3)
    assert store.extend_lease([], "anyone", 1)
    time.sleep(0.4)
    fast = claim(store, "fast")
    assert fast.job_ids == slow.job_ids and fast.job_attempts == {fast.job_ids[0]: 2}
    assert fast.messages[0].attempts == 2
    with pytest.raises(LeaseLostError):
        complete(store, slow)
    with pytest.raises(LeaseLostError):
        store.fail_batch(slow, "late", None)
    assert not store.extend_lease(slow.job_ids, "slow", 30)
    complete(store, fast)
    assert store.stats(P)["vectors"] == {EMB: 1}  # only the holder's write landed


def test_failures_are_retried_later_or_fail_for_good(store: Store) -> None:
    add(store, ["flaky"])
    batch = claim(store)
    later = time.time() + 60
    store.fail_batch(
        batch, "boom " * 1000, later, [CallWrite("extract", "m", "t1", 7, 0, 1.0, False)]
    )
    [m] = store.list_messages(P)
    assert m.status == "pending" and m.error is not None and len(m.error) <= 2000
    assert store.job_states(batch.job_ids) == {batch.job_ids[0]: "queued"}
    assert store.claim_batch("w", 30, 10) is None  # not due yet
    assert store.next_job_time() == pytest.approx(later)
    usage = store.stats(P)["llm_usage"]
    assert usage == {
        "extract m": {"calls": 1, "prompt_tokens": 7, "completion_tokens": 0, "failed": 1}
    }
    add(store, ["doomed"], user="u2", sid="s2")
    doomed = claim(store, "w2")
    store.fail_batch(doomed, "fatal", None)
    assert store.get_message(P, "u2-s2-0").status == "failed"  # type: ignore[union-attr]
    assert store.job_states(doomed.job_ids) == {doomed.job_ids[0]: "failed"}
    assert store.retry_failed(P, "nobody") == 0
    assert store.retry_failed(P, "u2") == 1
    assert store.get_message(P, "u2-s2-0").status == "pending"  # type: ignore[union-attr]
    again = claim(store, "w3")
    assert again.user_id == "u2" and again.job_attempts == {again.job_ids[0]: 1}  # start over


def test_each_job_counts_its_own_attempts_and_a_retry_takes_at_most_its_cap(
    store: Store,
) -> None:
    add(store, ["early"], prefix="a")
    early = claim(store)
    store.fail_batch(early, "bad answer", time.time())  # counted
    add(store, ["late"], prefix="b")
    # Merged into the retry of a job at its second attempt, the late job is at its first.
    both = claim(store)
    first, second = both.job_ids
    assert both.job_attempts == {first: 2, second: 1}
    # Not counted (jobs and messages back down by one), and retried one job at a time.
    store.fail_batch(both, "failed together", time.time(), counted=False, retry_cap=1)
    assert [m.attempts for m in store.list_messages(P)] == [1, 0]
    alone = claim(store)
    assert alone.job_attempts == {first: 2}
    complete(store, alone)
    rest = claim(store)
    assert rest.job_attempts == {second: 1}
    store.fail_batch(rest, "fatal", None)
    assert store.job_states([second]) == {second: "failed"}
    # A job failed for good no longer holds back its user, and a retry of it starts afresh
    # (attempts and cap), merging with what came after it again.
    add(store, ["later"], prefix="c")
    after = claim(store)
    assert [m.content for m in after.messages] == ["later"]
    complete(store, after)
    add(store, ["last"], prefix="d")
    assert store.retry_failed(P) == 1
    again = claim(store)
    assert again.job_attempts == {second: 1, again.job_ids[1]: 1}


def test_an_outage_holds_every_claim_until_one_probe_is_let_through(
    store: Store, db_url: str
) -> None:
    add(store, ["one"], user="u1", sid="s1")
    add(store, ["two"], user="u2", sid="s2")
    before = time.time()
    [outage] = store.record_outage("llm m", "HTTP 503: down", lambda n: 60.0 * n, probe=False)
    assert (outage.service, outage.failures, outage.last_error) == ("llm m", 1, "HTTP 503: down")
    assert outage.next_probe == pytest.approx(before + 60, abs=5)
    assert store.claim_batch("w", 30, 10) is None
    assert store.next_job_time() == pytest.approx(outage.next_probe)
    # A batch that was under way when the outage began updates the error, not the probe.
    [same] = store.record_outage("llm m", "timed out", lambda n: 1.0, probe=False)
    assert (same.failures, same.next_probe, same.last_error) == (1, outage.next_probe, "timed out")
    state = store.stats(P)["processing"]
    assert state["paused"] is True and state["next_probe"] > state["since"]
    assert state["outages"] == [
        {
            "service": "llm m",
            "since": state["since"],
            "failures": 1,
            "last_error": "timed out",
            "last_failure": state["outages"][0]["last_failure"],
        }
    ]
    # The probe is due: the first claim takes it, the next one waits another backoff.
    dbsql.execute(db_url, "UPDATE outages SET next_probe = 0")
    probe = claim(store, "w1")
    assert probe.probe and store.claim_batch("w2", 30, 10) is None
    assert store.next_job_time() == pytest.approx(time.time() + 60, abs=5)
    # The probe failed the same way: not counted, the outage goes on with a longer backoff.
    [longer] = store.record_outage("llm m", "HTTP 503: down", lambda n: 60.0 * n, probe=True)
    assert longer.failures == 2 and longer.next_probe == pytest.approx(time.time() + 120, abs=5)
    store.fail_batch(probe, "HTTP 503: down", time.time(), counted=False)
    assert {m.attempts for m in store.list_messages(P)} == {0}
    dbsql.execute(db_url, "UPDATE outages SET next_probe = 0")
    probe = claim(store, "w1")
    complete(store, probe)
    assert [o.failures for o in store.end_outage()] == [2]
    assert store.stats(P)["processing"] == {"paused": False}
    other = claim(store, "w2")
    assert not other.probe and other.user_id != probe.user_id
    assert store.end_outage() == []


def test_outages_of_several_services_hold_claims_until_the_last_probe(
    store: Store, db_url: str
) -> None:
    add(store, ["one"])
    store.record_outage("llm m", "down", lambda n: 60.0, probe=False)
    both = store.record_outage("embedder e", "down too", lambda n: 600.0, probe=False)
    assert sorted(o.service for o in both) == ["embedder e", "llm m"]
    assert sorted(o.service for o in store.outages()) == ["embedder e", "llm m"]
    assert store.next_job_time() == pytest.approx(max(o.next_probe for o in both))
    dbsql.execute(db_url, "UPDATE outages SET next_probe = 0 WHERE service = 'llm m'")
    assert store.claim_batch("w", 30, 10) is None  # the embedder's probe is not due
    dbsql.execute(db_url, "UPDATE outages SET next_probe = 0")
    probe = claim(store)
    assert probe.probe
    ended = store.end_outage()
    assert sorted((o.service, o.last_error) for o in ended) == [
        ("embedder e", "down too"),
        ("llm m", "down"),
    ]
    assert store.outages() == []


def test_a_lease_is_extended_only_while_every_job_of_it_is_held(store: Store) -> None:
    add(store, ["a"], prefix="0")
    add(store, ["b"], user="u2", sid="s2")
    mine = claim(store, "mine")
    theirs = claim(store, "theirs")
    assert store.extend_lease(mine.job_ids, "mine", 30)
    assert not store.extend_lease(mine.job_ids, "theirs", 30)
    assert not store.extend_lease([*mine.job_ids, *theirs.job_ids], "mine", 30)
    assert not store.extend_lease([*mine.job_ids, 10**9], "mine", 30)
    store.fail_batch(mine, "boom", time.time() + 60)
    assert not store.extend_lease(mine.job_ids, "mine", 30)  # queued again, held by no one
    complete(store, theirs)
    assert not store.extend_lease(theirs.job_ids, "theirs", 30)  # done


def test_retrying_failed_jobs_keeps_to_the_project_and_user(store: Store) -> None:
    for project, user in ((P, "u1"), (P, "u2"), ("q", "u1")):
        add(store, [f"{project} {user}"], user=user, sid=f"s-{user}", project=project)
        store.fail_batch(claim(store), "fatal", None)
    assert store.unfinished_jobs() == 0
    assert store.retry_failed(P, "u1") == 1
    assert store.retry_failed(P) == 1  # u2's: u1's is queued already
    assert store.unfinished_jobs(P) == 2 and store.unfinished_jobs("q") == 0
    assert {m.status for m in store.list_messages(P)} == {"pending"}
    assert [m.status for m in store.list_messages("q")] == ["failed"]


def test_next_job_time_is_the_earliest_due_or_lease_end(store: Store) -> None:
    before = time.time()
    add(store, ["x"])
    assert before <= (store.next_job_time() or 0) <= time.time()
    batch = claim(store, lease=100)
    assert store.next_job_time() == pytest.approx(time.time() + 100, abs=5)
    complete(store, batch)
    assert store.next_job_time() is None


def test_concurrent_claimers_never_share_a_user_and_take_each_job_once(db_url: str) -> None:
    setup = open_store(db_url)
    users = [f"u{i}" for i in range(6)]
    for n in range(5):
        for u in users:
            add(setup, [f"{u} job {n}"], user=u, sid=f"s-{u}", prefix=f"{n}")
    setup.close()
    holding: dict[str, str] = {}
    lock = threading.Lock()
    seen: list[tuple[str, list[str]]] = []
    errors: list[str] = []

    def worker(name: str) -> None:
        st = open_store(db_url)
        try:
            idle = 0
            while idle < 20:
                batch = st.claim_batch(name, 30, 1)
                if batch is None:
                    idle += 1
                    time.sleep(0.01)
                    continue
                idle = 0
                with lock:
                    if batch.user_id in holding:
                        errors.append(f"{name} and {holding[batch.user_id]} hold {batch.user_id}")
                    holding[batch.user_id] = name
                time.sleep(0.002)
                with lock:
                    del holding[batch.user_id]
                    seen.append((batch.user_id, [m.content for m in batch.messages]))
                st.complete_batch(
                    batch,
                    embedder=EMB,
                    vectors=np.stack([unit(seed=1) for _ in batch.messages]),
                )
        finally:
            st.close()

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    assert sorted(c for _, cs in seen for c in cs) == sorted(
        f"{u} job {n}" for u in users for n in range(5)
    )
    for u in users:  # each user's jobs in acceptance order
        assert [cs[0] for user, cs in seen if user == u] == [f"{u} job {n}" for n in range(5)]


# -- derived layers ---------------------------------------------------------------------


def test_layers_are_written_with_the_batch(store: Store) -> None:
    ids = layered(store)
    [berlin, ramen] = store.get_facts(P, ["f-berlin", "f-ramen"])
    assert (berlin.text, berlin.status, berlin.message_ids) == (
        "User moved to Berlin",
        "active",
        [ids["m0"]],
    )
    assert berlin.occurred_at == NOW and ramen.labels == ["food"] and ramen.kind == "fact"
    assert [f.id for f in store.get_facts(P, ["f-ramen", "nope", "f-berlin"])] == [
        "f-ramen",
        "f-berlin",
    ]
    assert [f.id for f in store.list_facts(P, "u1")] == ["f-berlin", "f-ramen"]
    assert [f.id for f in store.list_facts(P, "u1", newest_first=True)] == ["f-ramen", "f-berlin"]
    assert set(store.facts_by_pk([berlin.pk, ramen.pk])) == {berlin.pk, ramen.pk}
    home, food = store.get_summaries(P, ["s-home", "s-food"])
    assert (home.status, home.version, home.fact_ids, home.observed_at) == (
        "active",
        1,
        ["f-berlin"],
        NOW,
    )
    assert [s.id for s in store.list_summaries(P, "u1")] == ["s-home", "s-food"]
    assert store.summaries_by_pk([food.pk])[food.pk].text == "User likes ramen"
    [topic] = store.list_topics(P, "u1")
    assert (topic.id, topic.name, topic.summary_ids) == ("t-life", "life", ["s-home", "s-food"])
    got = store.get_topic(P, "t-life")
    assert got is not None and got.summary_ids == ["s-home", "s-food"]
    assert store.get_topic(P, "nope") is None
    by_summary = store.topics_of_summaries([home.pk, food.pk])
    assert [t.id for t in by_summary[home.pk]] == ["t-life"]
    history = store.summary_history(P, "s-home")
    assert [(h["version"], h["status"], h["fact_ids"]) for h in history] == [
        (1, "active", ["f-berlin"])
    ]
    stats = store.stats(P)
    assert stats["facts"] == 2 and stats["summaries"] == {"active": 2} and stats["topics"] == 1
    assert stats["llm_usage"]["extract test"]["calls"] == 1
    assert stats["messages"] == {"pending": 0, "processed": 2, "failed": 0}


def test_strengthen_and_supersede_version_summaries_and_retire_facts(store: Store) -> None:
    ids = layered(store)
    rows = add(store, ["Correction: I moved to Hamburg", "I still love ramen"], prefix="2")
    process(
        store,
        LayerWrite(
            facts=[
                fact("f-hamburg", "User moved to Hamburg", [rows[0].id], unit(1, 0, 1)),
                fact("f-ramen2", "User loves ramen", [rows[1].id], unit(0, 1, 0.1)),
            ],
            summaries=[
                summary(
                    "s-home2",
                    "User lives in Hamburg",
                    action="supersede",
                    supersedes="s-home",
                    fact_ids=["f-hamburg"],
                    message_ids=[rows[0].id],
                    vec=unit(1, 0, 1),
                    reason="correction",
                ),
                summary(
                    "s-food",
                    "User loves ramen",
                    action="strengthen",
                    fact_ids=["f-ramen2"],
                    message_ids=[rows[1].id],
                    vec=unit(0, 1, 0.2),
                    observed_at="2026-04-01T00:00:00.000000Z",
                ),
            ],
        ),
    )
    old, new, food = store.get_summaries(P, ["s-home", "s-home2", "s-food"])
    assert (old.status, old.superseded_by, old.version) == ("superseded", "s-home2", 2)
    assert new.status == "active" and new.version == 1
    assert (food.text, food.version, food.fact_ids) == (
        "User loves ramen",
        2,
        ["f-ramen", "f-ramen2"],
    )
    assert food.message_ids == [ids["m1"], rows[1].id]
    assert food.observed_at == "2026-04-01T00:00:00.000000Z"
    # The successor is filed where its predecessor was.
    assert store.list_topics(P, "u1")[0].summary_ids == ["s-home", "s-food", "s-home2"]
    # The superseded summary's fact, held by no current summary, is superseded too.
    [berlin] = store.get_facts(P, ["f-berlin"])
    assert (berlin.status, berlin.superseded_by) == ("superseded", "s-home2")
    assert [f.id for f in store.list_facts(P, "u1", newest_first=True)] == [
        "f-ramen2",
        "f-hamburg",
        "f-ramen",
    ]
    m0, m1 = (r.pk or 0 for r in ids["messages"])
    marks, _, _ = store.recall_briefs(P, "u1", [m0, m1, rows[0].pk or 0])
    assert [marks[pk].superseded for pk in (m0, m1, rows[0].pk or 0)] == [True, False, False]
    history = store.summary_history(P, "s-home")
    assert [(h["version"], h["status"], h["reason"]) for h in history] == [
        (1, "active", "test"),
        (2, "superseded", "correction"),
    ]
    assert [h["version"] for h in store.summary_history(P, "s-food")] == [1, 2]
    assert [s.id for s in store.list_summaries(P, "u1", status=["superseded"])] == ["s-home"]
    # The rewording reached the full-text index.
    assert [pk for pk, _ in store.fulltext_items("summary", P, "u1", ["loves"], 10)] == [food.pk]


def test_a_reworded_summary_is_searched_and_ranked_by_its_new_vector(store: Store) -> None:
    """Strengthening a summary with new words re-embeds it: vector search and the briefs
    recall ranks on must both see the new vector, also in a process that had already
    loaded the old one."""
    [first] = add(store, ["I love ramen"])
    process(
        store,
        LayerWrite(
            facts=[fact("f1", "User loves ramen", [first.id], unit(1, 0, 0))],
            summaries=[summary("s1", "User loves ramen", fact_ids=["f1"], vec=unit(1, 0, 0))],
        ),
    )
    [(pk, sim)] = store.vector_items(
        "summary", P, "u1", unit(1, 0, 0), EMB, 5, statuses=("active",)
    )
    assert sim == pytest.approx(1.0)
    [second] = add(store, ["I love ramen with extra egg"], prefix="2")
    process(
        store,
        LayerWrite(
            facts=[fact("f2", "User loves ramen with egg", [second.id], unit(0, 1, 0))],
            summaries=[
                summary(
                    "s1",
                    "User loves ramen with egg",
                    action="strengthen",
                    fact_ids=["f2"],
                    vec=unit(0, 1, 0),
                )
            ],
        ),
    )
    found = store.vector_items("summary", P, "u1", unit(0, 1, 0), EMB, 5, statuses=("active",))
    assert found == [(pk, pytest.approx(1.0))]
    _, _, summaries = store.recall_briefs(P, "u1", summaries=[pk], embedder=EMB)
    vector = summaries[pk].vector
    assert vector is not None
    assert np.frombuffer(vector, dtype=np.float32).tolist() == unit(0, 1, 0).tolist()


def test_a_message_with_active_or_no_facts_is_not_superseded(store: Store) -> None:
    rows = add(store, ["a", "b"])
    process(store, LayerWrite(facts=[fact("f1", "a", [rows[0].id], unit(1))]))
    marks, _, _ = store.recall_briefs(P, "u1", [rows[0].pk or 0, rows[1].pk or 0])
    assert [marks[r.pk or 0].superseded for r in rows] == [False, False]  # no fact, or active


def test_a_bad_layer_write_rolls_the_whole_batch_back(store: Store) -> None:
    add(store, ["x"])
    batch = claim(store)
    bad = LayerWrite(
        facts=[fact("f1", "x", [batch.messages[0].id], unit(1))],
        summaries=[summary("s1", "x", action="strengthen")],  # no such summary
    )
    with pytest.raises(ValueError):
        complete(store, batch, bad)
    assert store.get_facts(P, ["f1"]) == []
    assert store.get_message(P, batch.messages[0].id).status == "pending"  # type: ignore[union-attr]
    assert store.job_states(batch.job_ids) == {batch.job_ids[0]: "running"}
    complete(store, batch)  # still the holder: it can finish the batch another way


def test_merge_topics_moves_summaries_and_retires_the_source(store: Store) -> None:
    layered(store)
    add(store, ["I cook every day"], prefix="2")
    process(
        store,
        LayerWrite(
            summaries=[summary("s-cook", "User cooks daily", vec=unit(0, 1, 1))],
            topics=[
                TopicWrite("t-food", "food", "cooking", ["s-cook", "s-food"], True),
                TopicWrite("t-life", "life", "home, food", [], False),
            ],
        ),
    )
    assert store.get_topic(P, "t-life").description == "home, food"  # type: ignore[union-attr]
    food_pk = store.get_summaries(P, ["s-food"])[0].pk

    def topics_of_food() -> list[str]:
        return store.recall_briefs(P, "u1", summaries=[food_pk])[2][food_pk].topic_ids

    assert topics_of_food() == ["t-life", "t-food"]  # its active topics, in their order
    moved = store.merge_topics(P, "u1", "t-food", "t-life")
    assert moved == 1  # s-food was in both
    assert topics_of_food() == ["t-life"]
    [life] = store.list_topics(P, "u1")
    assert life.id == "t-life" and life.summary_ids == ["s-home", "s-food", "s-cook"]
    merged = store.get_topic(P, "t-food")
    assert merged is not None and merged.status == "merged" and merged.summary_ids == []
    with pytest.raises(KeyError):
        store.merge_topics(P, "u1", "t-food", "t-life")  # no longer active
    with pytest.raises(KeyError):
        store.merge_topics(P, "u1", "t-life", "t-life")


def _strengthen_home(store: Store, prefix: str, **kw: Any) -> None:
    """One more message and a strengthening of s-home (of ``layered``) with ``kw``."""
    [row] = add(store, ["Still in Berlin"], prefix=prefix)
    write = summary(
        "s-home", "User lives in Berlin", action="strengthen", message_ids=[row.id], **kw
    )
    process(store, LayerWrite(summaries=[write]))


def test_strengthening_keeps_the_latest_observation_and_the_first_validity(store: Store) -> None:
    layered(store)  # s-home observed at NOW, no validity; s-food observed never
    later, earlier = "2026-05-01T00:00:00.000000Z", "2026-01-01T00:00:00.000000Z"
    _strengthen_home(store, "2", observed_at=earlier, valid_to=later)
    [home] = store.get_summaries(P, ["s-home"])
    assert (home.observed_at, home.valid_from, home.valid_to) == (NOW, None, later)
    _strengthen_home(store, "3", observed_at=later, valid_from=earlier, valid_to=None)
    [home] = store.get_summaries(P, ["s-home"])
    assert (home.observed_at, home.valid_from, home.valid_to) == (later, earlier, later)
    # A validity once known stays (valid_from) or is replaced only by a newer one (valid_to).
    _strengthen_home(store, "4", valid_from=NOW, valid_to=NOW)
    [home] = store.get_summaries(P, ["s-home"])
    assert (home.observed_at, home.valid_from, home.valid_to, home.version) == (
        later,
        earlier,
        NOW,
        4,
    )
    # Never observed, strengthened without an observation: still none (not an empty time).
    [row] = add(store, ["ramen again"], prefix="5")
    food = summary("s-food", "User likes ramen", action="strengthen", message_ids=[row.id])
    process(store, LayerWrite(summaries=[food]))
    [got] = store.get_summaries(P, ["s-food"])
    assert got.observed_at is None and got.version == 2


def test_strengthening_without_rewording_keeps_the_vector(store: Store) -> None:
    layered(store)
    _strengthen_home(store, "2", vec=unit(0, 0, 1))  # same text: not re-embedded
    [home] = store.get_summaries(P, ["s-home"])
    [(pk, _)] = store.vector_items("summary", P, "u1", unit(1, 0.1), EMB, 1, statuses=("active",))
    assert pk == home.pk and home.version == 2
    assert [pk for pk, _ in store.fulltext_items("summary", P, "u1", ["berlin"], 10)] == [home.pk]


def test_superseding_retires_only_the_facts_no_current_summary_holds(store: Store) -> None:
    ids = layered(store)
    rows = add(store, ["I live in Berlin, by the way"], prefix="2")
    process(
        store,
        LayerWrite(
            summaries=[
                # s-both holds f-berlin too: superseding s-home must leave f-berlin active.
                summary(
                    "s-both",
                    "User lives in Berlin and likes ramen",
                    fact_ids=["f-berlin", "f-ramen"],
                    message_ids=[ids["m0"]],
                ),
                summary(
                    "s-home2",
                    "User lives in Berlin (confirmed)",
                    action="supersede",
                    supersedes="s-home",
                    fact_ids=[],
                    message_ids=[rows[0].id],
                ),
            ]
        ),
    )
    [berlin, ramen] = store.get_facts(P, ["f-berlin", "f-ramen"])
    assert (berlin.status, berlin.superseded_by) == ("active", None)
    assert ramen.status == "active"
    [old] = store.get_summaries(P, ["s-home"])
    assert (old.status, old.superseded_by) == ("superseded", "s-home2")


@pytest.mark.parametrize(
    ("write", "message"),
    [
        (
            LayerWrite(summaries=[summary("s-x", "x", action="supersede", supersedes="s-nope")]),
            "cannot supersede unknown summary 's-nope'",
        ),
        (
            LayerWrite(summaries=[summary("s-other", "x", action="strengthen")]),
            "cannot strengthen unknown summary 's-other'",
        ),
        (
            LayerWrite(summaries=[summary("s-x", "x", action="rewrite")]),
            "unknown summary action 'rewrite'",
        ),
        (
            LayerWrite(topics=[TopicWrite("t-nope", "nope", "", [], False)]),
            "unknown topic 't-nope'",
        ),
        (
            LayerWrite(topics=[TopicWrite("t-new", "new", "", ["s-other"], True)]),
            "topic 'new' names unknown summary 's-other'",
        ),
    ],
)
def test_layer_writes_naming_what_the_user_has_not_are_refused(
    store: Store, write: LayerWrite, message: str
) -> None:
    # s-other exists, but is u2's: u1's writes cannot touch it.
    add(store, ["theirs"], user="u2", sid="s2")
    process(store, LayerWrite(summaries=[summary("s-other", "Theirs", message_ids=[])]))
    [row] = add(store, ["x"])
    batch = claim(store)
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        complete(store, batch, write)
    assert store.get_message(P, row.id).status == "pending"  # type: ignore[union-attr]
    [other] = store.get_summaries(P, ["s-other"])
    assert (other.user_id, other.status, other.version) == ("u2", "active", 1)


def test_a_facts_sources_are_the_batch_messages_it_names(store: Store, db_url: str) -> None:
    rows = add(store, ["I moved to Berlin", "It was in May"])
    m0, m1 = (r.id for r in rows)
    write = fact("f1", "User moved to Berlin in May", [m1, m0, m1, "not-in-batch"], unit(1))
    process(store, LayerWrite(facts=[write]))
    sources = dbsql.rows(
        db_url,
        "SELECT m.id FROM fact_sources fs JOIN facts f ON f.pk = fs.fact_pk "
        "JOIN messages m ON m.pk = fs.message_pk WHERE f.id = ? ORDER BY m.pk",
        "f1",
    )
    assert sources == [(m0,), (m1,)]
    [f1] = store.get_facts(P, ["f1"])
    assert f1.message_ids == [m1, m0, m1, "not-in-batch"]  # as written


def test_listing_filters_by_time_and_source_metadata(store: Store) -> None:
    s = session(store)
    rows = [
        message("m-web", "web order", metadata={"channel": "web"}),
        message("m-ios", "ios order", metadata={"channel": "ios"}),
    ]
    store.add_messages(P, s, rows)
    process(
        store,
        LayerWrite(
            facts=[
                fact("f-web", "web", ["m-web"], unit(1), occurred_at="2026-01-05T00:00:00.000000Z"),
                fact(
                    "f-ios", "ios", ["m-ios"], unit(0, 1), observed_at="2026-02-05T00:00:00.000000Z"
                ),
            ],
            summaries=[
                summary(
                    "s-web", "web", message_ids=["m-web"], valid_from="2026-01-01T00:00:00.000000Z"
                ),
                summary(
                    "s-ios", "ios", message_ids=["m-ios"], observed_at="2026-02-01T00:00:00.000000Z"
                ),
            ],
        ),
    )
    web = ItemFilters(metadata=parse_metadata_filters({"channel": "web"}))
    assert [f.id for f in store.list_facts(P, "u1", filters=web)] == ["f-web"]
    assert [s.id for s in store.list_summaries(P, "u1", filters=web)] == ["s-web"]
    february = ItemFilters(since="2026-02-01T00:00:00.000000Z", until="2026-03-01T00:00:00.000000Z")
    assert [f.id for f in store.list_facts(P, "u1", filters=february)] == ["f-ios"]
    assert [s.id for s in store.list_summaries(P, "u1", filters=february)] == ["s-ios"]
    active = ItemFilters(status=("superseded",))
    assert store.list_facts(P, "u1", filters=active) == []


def test_reads_of_many_items_keep_the_order_asked_and_leave_out_the_unknown(
    store: Store,
) -> None:
    """More ids and pks than a statement binds one by one (SQLite goes through json_each
    past 500) read like a few."""
    [row] = add(store, ["x"])
    n = 600
    process(
        store,
        LayerWrite(
            facts=[fact(f"f{i:04d}", f"fact {i}", [row.id], unit(seed=i)) for i in range(n)],
            summaries=[
                summary(f"s{i:04d}", f"summary {i}", message_ids=[row.id]) for i in range(n)
            ],
            topics=[TopicWrite("t", "all", "", [f"s{i:04d}" for i in range(n)], True)],
        ),
    )
    fact_ids = [f"f{i:04d}" for i in reversed(range(n))]
    facts = store.get_facts(P, ["nope", *fact_ids])
    assert [f.id for f in facts] == fact_ids
    assert store.get_facts("other", fact_ids) == []
    pks = [f.pk for f in facts]
    assert sorted(store.facts_by_pk([*pks, 10**12])) == sorted(pks)
    summary_ids = [f"s{i:04d}" for i in reversed(range(n))]
    summaries = store.get_summaries(P, [*summary_ids, "nope"])
    assert [s.id for s in summaries] == summary_ids
    spks = [s.pk for s in summaries]
    by_pk = store.summaries_by_pk([*spks, 10**12])
    assert sorted(by_pk) == sorted(spks) and by_pk[spks[0]].id == summary_ids[0]
    filed = store.topics_of_summaries([*spks, 10**12])
    assert sorted(filed) == sorted(spks) and {t.id for ts in filed.values() for t in ts} == {"t"}
    [topic] = store.list_topics(P, "u1")
    assert topic.summary_ids == sorted(summary_ids)
    assert store.get_facts(P, []) == [] and store.facts_by_pk([]) == {}
    assert store.summaries_by_pk([]) == {} and store.topics_of_summaries([]) == {}
    # The three layers read together: the same rows as each layer's own read.
    messages, facts_read, summaries_read = store.items_by_pk(
        [row.pk or 0, 10**12], [*pks, 10**12], [*spks, 10**12]
    )
    assert messages == store.messages_by_pk([row.pk or 0])
    assert facts_read == store.facts_by_pk(pks) and summaries_read == by_pk
    assert store.items_by_pk([], pks[:1], []) == ({}, store.facts_by_pk(pks[:1]), {})
    assert store.items_by_pk() == ({}, {}, {})


def test_topics_are_listed_with_their_summaries_or_none(store: Store) -> None:
    """A user's active topics in creation order, each with its summaries in theirs; a
    topic left without summaries is listed too; a summary filed nowhere has no topics."""
    ids = layered(store)
    add(store, ["I paint"], prefix="2")
    process(
        store,
        LayerWrite(
            summaries=[summary("s-art", "User paints", message_ids=[ids["m0"]])],
            topics=[
                TopicWrite("t-empty", "empty", "nothing yet", [], True),
                TopicWrite("t-art", "art", "painting", ["s-art"], True),
            ],
        ),
    )
    topics = store.list_topics(P, "u1")
    assert [(t.id, t.summary_ids) for t in topics] == [
        ("t-life", ["s-home", "s-food"]),
        ("t-empty", []),
        ("t-art", ["s-art"]),
    ]
    assert topics[1].description == "nothing yet" and topics[1].status == "active"
    assert store.list_topics(P, "u2") == [] and store.list_topics("other", "u1") == []
    [home, art] = store.get_summaries(P, ["s-home", "s-art"])
    store.merge_topics(P, "u1", "t-art", "t-life")
    filed = store.topics_of_summaries([home.pk, art.pk])
    assert {pk: [t.id for t in ts] for pk, ts in filed.items()} == {
        home.pk: ["t-life"],
        art.pk: ["t-life"],
    }
    assert filed[home.pk][0].summary_ids == []  # topics_of_summaries leaves them out
    assert store.summary_history(P, "nope") == []


def test_listings_of_a_project_page_in_creation_order(store: Store) -> None:
    """Without a user a listing covers the project's users (not another project's);
    limit and offset page through it; newest_first lists active facts only."""
    layered(store)
    [other] = add(store, ["I am u2"], user="u2", sid="s2")
    process(
        store,
        LayerWrite(
            facts=[fact("f-u2", "u2 exists", [other.id], unit(1, 1))],
            summaries=[summary("s-u2", "u2 exists", message_ids=[other.id])],
        ),
    )
    [elsewhere] = add(store, ["elsewhere"], project="other")
    batch = claim(store)
    complete(
        store,
        batch,
        LayerWrite(
            facts=[fact("f-other", "other", [elsewhere.id], unit(1))],
            summaries=[summary("s-other", "other", message_ids=[elsewhere.id])],
        ),
    )
    assert [f.id for f in store.list_facts(P, None)] == ["f-berlin", "f-ramen", "f-u2"]
    assert [f.id for f in store.list_facts(P, None, limit=1, offset=1)] == ["f-ramen"]
    assert [f.id for f in store.list_facts(P, "u2")] == ["f-u2"]
    assert [s.id for s in store.list_summaries(P, None)] == ["s-home", "s-food", "s-u2"]
    assert [s.id for s in store.list_summaries(P, None, limit=2, offset=1)] == ["s-food", "s-u2"]
    assert [s.id for s in store.list_summaries("other", None)] == ["s-other"]
    store.set_summary_status(P, "s-food", "archived", "old", "tester")
    assert [s.id for s in store.list_summaries(P, None, status=["active"])] == ["s-home", "s-u2"]
    assert [s.id for s in store.list_summaries(P, "u1", status=["active", "archived"])] == [
        "s-home",
        "s-food",
    ]
    newest = store.list_facts(P, None, newest_first=True, filters=ItemFilters(status=("active",)))
    assert [f.id for f in newest] == ["f-u2", "f-ramen", "f-berlin"]
    assert (
        store.list_facts(P, None, newest_first=True, filters=ItemFilters(status=("superseded",)))
        == []
    )


# -- full text -------------------------------------------------------------------------


def _bm25(query_terms: Sequence[str], doc: Sequence[str], corpus: Sequence[Sequence[str]]) -> float:
    """FTS5's bm25 for a corpus of already tokenised rows (each row has one more token:
    the scope column SQLite adds)."""
    n = len(corpus)
    avg = sum(len(d) + 1 for d in corpus) / n
    score = 0.0
    for term in query_terms:
        df = sum(1 for d in corpus if term in d)
        idf = math.log((n - df + 0.5) / (df + 0.5))
        idf = idf if idf > 0 else 1e-6
        tf = doc.count(term)
        score += idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * (len(doc) + 1) / avg))
    return score


def test_fulltext_scores_are_fts5_bm25(store: Store) -> None:
    texts = [
        "alpha beta gamma",
        "alpha alpha delta",
        "epsilon zeta eta theta iota",
        "kappa lambda",
        "mu nu xi omicron pi rho",
    ]
    rows = add(store, texts)
    corpus = [t.split() for t in texts]
    found = dict(store.fulltext_messages(P, "u1", ["alpha", "kappa"], 10, SearchFilters()))
    for row, words in zip(rows, corpus, strict=True):
        expected = _bm25(["alpha", "kappa"], words, corpus)
        if expected:
            assert found[row.pk or 0] == pytest.approx(expected, rel=1e-6)
    assert set(found) == {rows[0].pk, rows[1].pk, rows[3].pk}
    ranked = store.fulltext_messages(P, "u1", ["alpha", "kappa"], 10, SearchFilters())
    assert ranked[0][0] == rows[3].pk  # the rarer term weighs more
    assert ranked == sorted(ranked, key=lambda x: -x[1])


def test_fulltext_is_scoped_to_the_user_and_project(store: Store) -> None:
    add(store, ["secret plan alpha"])
    add(store, ["secret plan beta"], user="u2", sid="s2")
    add(store, ["secret plan gamma"], project="q")
    hits = store.fulltext_messages(P, "u1", ["secret", "plan"], 10, SearchFilters())
    assert [store.messages_by_pk([pk])[pk].content for pk, _ in hits] == ["secret plan alpha"]
    assert store.fulltext_messages(P, "u3", ["secret"], 10, SearchFilters()) == []
    assert store.fulltext_messages(P, "u1", [], 10, SearchFilters()) == []
    assert store.fulltext_messages(P, "u1", ["secret"], 0, SearchFilters()) == []


@pytest.mark.parametrize(
    ("text", "term"),
    [
        ("我上个月搬到了柏林,现在住在克罗伊茨贝格。", "柏林"),
        ("我上个月搬到了柏林,现在住在克罗伊茨贝格。", "住在"),
        ("来月、東京に引っ越します。", "東京"),
        ("ラーメンが大好きです", "ラー"),
        ("저는 서울에 살아요", "서울"),
        ("北京烤鸭 and dumplings", "dumplings"),
        ("猫", "猫"),
        ("We were running along the canal.", "runs"),  # stemmed alike
        ("Un café à São Paulo", "cafe"),  # diacritics folded
        ("Un cafe a Sao Paulo", "são"),
        ("search for /shop/running-shoes?size=42", "shoes"),  # paths split into words
        ("mail me at ana@example.com", "example"),
        ("version 3.14 of the app", "14"),
    ],
)
def test_fulltext_tokenises_alike_on_every_store(store: Store, text: str, term: str) -> None:
    rows = add(store, ["I like hiking in the Alps", text])
    hits = store.fulltext_messages(P, "u1", [term], 10, SearchFilters())
    assert [pk for pk, _ in hits] == [rows[1].pk]


def test_fulltext_query_syntax_is_inert(store: Store) -> None:
    rows = add(store, ['canal" OR "x', "AND NOT (a & b) | c:* <-> 'd'"])
    for term in ['canal" OR "x', "'", '"', "a & b", "c:*", "<->", "NOT", "OR"]:
        store.fulltext_messages(P, "u1", [term], 10, SearchFilters())  # no error
    assert [pk for pk, _ in store.fulltext_messages(P, "u1", ["canal"], 10, SearchFilters())] == [
        rows[0].pk
    ]


def test_event_type_and_page_are_searchable(store: Store) -> None:
    rows = add(store, ["light running shoes"], event_type="product_view", page="/shop/trail")
    for term in ("product", "view", "trail", "shoes"):
        hits = store.fulltext_messages(P, "u1", [term], 10, SearchFilters())
        assert [pk for pk, _ in hits] == [rows[0].pk], term


def test_fulltext_keeps_the_rarest_terms_within_the_match_budget(store: Store) -> None:
    store.MATCH_BUDGET = 3  # type: ignore[attr-defined]  # instead of 4,000
    add(store, [f"pizza night number {i}" for i in range(6)])
    rows = add(store, ["pizza with sushi on the side"], sid="s2")
    hits = store.fulltext_messages(P, "u1", ["pizza", "sushi"], 10, SearchFilters())
    assert [pk for pk, _ in hits] == [rows[0].pk]  # "pizza" (7 rows) was left out
    # Only common terms: the rarest is still searched.
    assert len(store.fulltext_messages(P, "u1", ["pizza", "night"], 10, SearchFilters())) == 6


def test_fulltext_ranks_at_most_the_rank_cap_rarest_term_first(store: Store) -> None:
    texts = ["pizza one", "sushi and pizza", "pizza two", "sushi three", "pizza four", "pizza"]
    rows = add(store, texts)
    m = rows[0].id
    process(
        store, LayerWrite(facts=[fact(f"f{i}", t, [m], unit(seed=i)) for i, t in enumerate(texts)])
    )
    facts = {f.id: f.pk for f in store.get_facts(P, [f"f{i}" for i in range(len(texts))])}
    whole = {
        "message": dict(store.fulltext_messages(P, "u1", ["pizza", "sushi"], 10, SearchFilters())),
        "fact": dict(store.fulltext_items("fact", P, "u1", ["pizza", "sushi"], 10)),
    }
    assert len(whole["message"]) == len(whole["fact"]) == 6
    store.RANK_CAP = 3  # type: ignore[attr-defined]  # instead of the default
    capped = {
        "message": store.fulltext_messages(P, "u1", ["pizza", "sushi"], 10, SearchFilters()),
        "fact": store.fulltext_items("fact", P, "u1", ["pizza", "sushi"], 10),
    }
    # "sushi" (2 rows) first, then "pizza" without them, in the order the rows were stored.
    wanted = {
        "message": {rows[1].pk, rows[3].pk, rows[0].pk},
        "fact": {facts["f1"], facts["f3"], facts["f0"]},
    }
    for layer, found in capped.items():
        assert {pk for pk, _ in found} == wanted[layer]
        assert [s for _, s in found] == pytest.approx([whole[layer][pk] for pk, _ in found])
        assert found == sorted(found, key=lambda x: (-x[1], x[0]))
    # Within the cap nothing changes.
    assert len(store.fulltext_items("fact", P, "u1", ["sushi"], 10)) == 2


def test_fulltext_of_layers_keeps_the_rarest_terms_within_the_match_budget(store: Store) -> None:
    store.MATCH_BUDGET = 3  # type: ignore[attr-defined]  # instead of 4,000
    m = add(store, ["we talked about food"])[0].id
    process(
        store,
        LayerWrite(
            facts=[
                fact(f"f{i}", f"User ate pizza on night {i}", [m], unit(seed=i)) for i in range(6)
            ]
            + [fact("f-sushi", "User likes pizza with sushi", [m], unit(seed=9))],
            summaries=[
                summary(f"s{i}", f"User eats pizza on night {i}", message_ids=[m], vec=unit(seed=i))
                for i in range(6)
            ]
            + [
                summary("s-sushi", "User likes pizza with sushi", message_ids=[m], vec=unit(seed=9))
            ],
        ),
    )
    # u2 has a match too: u1 owns most rows, u2 few, and each sees only its own.
    m2 = add(store, ["sushi again"], user="u2", sid="s2")[0].id
    process(store, LayerWrite(facts=[fact("f-u2", "User likes sushi", [m2], unit(seed=3))]))

    def facts(user: str, terms: list[str]) -> list[str]:
        found = store.fulltext_items("fact", P, user, terms, 10)
        return [store.facts_by_pk([pk])[pk].id for pk, _ in found]

    def summaries(user: str, terms: list[str]) -> list[str]:
        found = store.fulltext_items("summary", P, user, terms, 10)
        return [store.summaries_by_pk([pk])[pk].id for pk, _ in found]

    # "pizza" (7 rows) is left out: the rarer "sushi" alone fills the budget.
    assert facts("u1", ["pizza", "sushi"]) == ["f-sushi"]
    assert summaries("u1", ["pizza", "sushi"]) == ["s-sushi"]
    # Only common terms: the rarest ("night", 6 rows) is still searched, alone.
    assert len(facts("u1", ["pizza", "night"])) == 6
    assert len(summaries("u1", ["pizza", "night"])) == 6
    assert facts("u2", ["pizza", "sushi"]) == ["f-u2"]


def test_fulltext_of_layers_respects_statuses(store: Store) -> None:
    layered(store)
    food = store.get_summaries(P, ["s-food"])[0]
    assert [pk for pk, _ in store.fulltext_items("summary", P, "u1", ["ramen"], 10)] == [food.pk]
    assert store.fulltext_items("summary", P, "u1", ["ramen"], 10, statuses=()) == []
    store.set_summary_status(P, "s-food", "archived", "old", "tester")
    assert store.fulltext_items("summary", P, "u1", ["ramen"], 10) == []
    assert store.fulltext_items("summary", P, "u1", ["ramen"], 10, statuses=("archived",)) != []
    ramen = store.get_facts(P, ["f-ramen"])[0]
    assert [pk for pk, _ in store.fulltext_items("fact", P, "u1", ["ramen"], 10)] == [ramen.pk]
    assert store.fulltext_items("fact", P, "u1", ["ramen"], 10, statuses=("superseded",)) == []
    assert store.fulltext_items("fact", P, "u2", ["ramen"], 10) == []


# -- filters ---------------------------------------------------------------------------


def _filter_corpus(store: Store, layers: LayerWrite | None = None) -> dict[str, int]:
    s1 = session(store, "u1", "s1")
    s2 = session(store, "u1", "s2")
    a = message(
        "a",
        "order pizza margherita",
        ts="2026-01-10T12:00:00.000000Z",
        metadata={"channel": "web", "stars": 5, "vip": True, "addr": {"city": "Berlin"}},
    )
    b = message(
        "b",
        "pizza ordered",
        role="assistant",
        ts="2026-02-10T12:00:00.000000Z",
        metadata={"channel": "ios", "stars": 3},
    )
    c = message(
        "c",
        "pizza again please",
        ts="2026-03-10T12:00:00.000000Z",
        event_type="reorder",
        metadata={"channel": "web", "stars": 1, "coupon": None, "code": "B7"},
    )
    store.add_messages(P, s1, [a, b])
    store.add_messages(P, s2, [c])
    assert len(process(store, layers).job_ids) == 2
    return {"a": a.pk or 0, "b": b.pk or 0, "c": c.pk or 0}


FILTER_CASES = [
    ({"metadata": {"channel": "web"}}, {"a", "c"}),
    ({"metadata": {"channel": {"$in": ["ios"]}}}, {"b"}),
    ({"metadata": {"channel": {"$nin": ["ios"]}}}, {"a", "c"}),
    ({"metadata": {"stars": {"$gte": 3, "$lt": 5}}}, {"b"}),
    ({"metadata": {"stars": {"$gt": 4}}}, {"a"}),
    ({"metadata": {"stars": {"$lte": 1}}}, {"c"}),
    ({"metadata": {"stars": 5.0}}, {"a"}),  # numbers compare as numbers
    ({"metadata": {"vip": True}}, {"a"}),
    ({"metadata": {"channel": {"$ne": "web"}}}, {"b"}),
    ({"metadata": {"coupon": {"$exists": True}}}, {"c"}),
    ({"metadata": {"coupon": {"$exists": False}}}, {"a", "b"}),
    ({"metadata": {"coupon": None}}, {"c"}),
    ({"metadata": {"addr.city": "Berlin"}}, {"a"}),
    ({"metadata": {"code": {"$gte": "B"}}}, {"c"}),  # strings compare as strings
    ({"metadata": {"missing": {"$ne": 1}}}, {"a", "b", "c"}),
    ({"metadata": {"coupon": {"$ne": None}}}, {"a", "b"}),
    ({"metadata": {"coupon": {"$in": [None, "x"]}}}, {"c"}),
    ({"metadata": {"stars": {"$nin": [5, 3]}}}, {"c"}),
    ({"metadata": {"vip": 1}}, set()),  # true is not 1
    ({"metadata": {"stars": {"$gt": "1"}}}, set()),  # nor 5 a string
    ({"metadata": {"stars": "5"}}, set()),
    ({"since": "2026-02-01T00:00:00.000000Z"}, {"b", "c"}),
    ({"since": "2026-02-01T00:00:00.000000Z", "until": "2026-03-01T00:00:00.000000Z"}, {"b"}),
    ({"roles": ("assistant",)}, {"b"}),
    ({"event_types": ("reorder",)}, {"c"}),
    ({"session_id": "s2"}, {"c"}),
    ({"metadata": {"channel": "web", "stars": {"$gt": 1}}}, {"a"}),  # every condition
    ({"metadata": {"addr.city": {"$ne": "Berlin"}}}, {"b", "c"}),  # a missing nested key
    ({"metadata": {"addr.city": {"$exists": True}}}, {"a"}),
    ({"metadata": {"addr": {"$exists": True}}}, {"a"}),
    ({"metadata": {"stars": {"$in": [5, "3"]}}}, {"a"}),  # numbers and strings apart
    ({"metadata": {"vip": {"$in": [True, 1]}}}, {"a"}),
    ({"metadata": {"vip": False}}, set()),
    ({"metadata": {"coupon": {"$nin": [None]}}}, {"a", "b"}),
    ({"metadata": {"code": {"$lt": "b"}}}, {"c"}),  # byte order: "B7" < "b"
    ({"metadata": {"channel": {"$gt": "ios"}}}, {"a", "c"}),
    ({"since": "2026-02-10T12:00:00.000000Z"}, {"b", "c"}),  # since is inclusive
    ({"until": "2026-02-10T12:00:00.000000Z"}, {"a"}),  # until is not
    ({"roles": ("user", "assistant")}, {"a", "b", "c"}),
    ({"event_types": ("reorder", "other")}, {"c"}),
    ({"session_id": "s1", "roles": ("user",), "metadata": {"channel": "web"}}, {"a"}),
]


def _filters(spec: dict[str, Any]) -> SearchFilters:
    from datetime import datetime

    spec = dict(spec)
    if "metadata" in spec:
        spec["metadata"] = parse_metadata_filters(spec["metadata"])
    for key in ("since", "until"):
        if key in spec:
            spec[key] = datetime.fromisoformat(spec[key].replace("Z", "+00:00"))
    return SearchFilters(**spec)


@pytest.mark.parametrize(("spec", "expected"), FILTER_CASES)
def test_filters_narrow_both_full_text_and_vectors(
    store: Store, spec: dict[str, Any], expected: set[str]
) -> None:
    pks = _filter_corpus(store)
    names = {pk: name for name, pk in pks.items()}
    filters = _filters(spec)
    text = store.fulltext_messages(P, "u1", ["pizza"], 10, filters)
    assert {names[pk] for pk, _ in text} == expected
    near = store.vector_messages(P, "u1", unit(seed=1), EMB, 10, filters)
    assert {names[pk] for pk, _ in near} == expected
    [layers] = store.vector_layers(
        P, "u1", [unit(seed=1)], EMB, 10, messages=filters, facts=None, summaries=None
    )
    assert {names[pk] for pk, _ in layers["message"]} == expected


def test_a_filtered_vector_search_finds_the_nearest_passing_messages(store: Store) -> None:
    """Whether most of the user's messages pass a filter or only a few do, a vector search
    finds the nearest passing ones, as an exact search over those alone does."""
    from datetime import datetime

    s = session(store)
    rows = [
        message(f"m{i}", f"note {i}", ts=f"2026-03-01T10:{i:02d}:00.000000Z") for i in range(40)
    ]
    store.add_messages(P, s, rows)
    while (batch := store.claim_batch("w", 30, 100)) is not None:
        complete(store, batch)
    by_pk = {r.pk: r for r in rows}
    q = unit(seed=7)

    def nearest(passing: set[int], k: int) -> list[int]:
        # Each message's vector is unit(seed=pk) (``vectors_for``).
        return sorted(passing, key=lambda pk: -float(unit(seed=pk) @ q))[:k]

    for minute, k in ((38, 3), (38, 12), (3, 3), (5, 10)):
        until = datetime.fromisoformat(f"2026-03-01T10:{minute:02d}:00+00:00")
        passing = {pk for pk, r in by_pk.items() if int(r.ts[14:16]) < minute}
        found = store.vector_messages(P, "u1", q, EMB, k, SearchFilters(until=until))
        assert [pk for pk, _ in found] == nearest(passing, k), (minute, k)


def test_listing_filters_match_source_messages_as_search_filters_do(store: Store) -> None:
    """The metadata conditions of a fact or summary listing keep the items whose source
    message passes them, with the search filters' semantics, on every store."""
    _filter_corpus(
        store,
        LayerWrite(
            facts=[fact(f"f-{m}", m, [m], unit(seed=i)) for i, m in enumerate("abc")],
            summaries=[summary(f"s-{m}", m, message_ids=[m]) for m in "abc"],
        ),
    )
    wrong = []
    for spec, expected in FILTER_CASES:
        if set(spec) != {"metadata"}:
            continue
        filters = ItemFilters(metadata=parse_metadata_filters(spec["metadata"]))
        facts = {f.message_ids[0] for f in store.list_facts(P, "u1", filters=filters)}
        summaries = {s.message_ids[0] for s in store.list_summaries(P, "u1", filters=filters)}
        for how, got in (("list_facts", facts), ("list_summaries", summaries)):
            if got != expected:
                wrong.append((spec["metadata"], how, sorted(got ^ expected)))
    assert not wrong, "\n".join(map(str, wrong))


def test_an_item_passes_metadata_conditions_through_one_source_message_of_its_project(
    store: Store,
) -> None:
    """Every condition must hold for the same source message; a message of another
    project with the same id is no source, and an item without sources passes no
    metadata condition at all (not even a negation)."""
    other = session(store, project="other")
    store.add_messages(
        "other", other, [message("z", "z", project_id="other", metadata={"channel": "web"})]
    )
    process(store)
    s = session(store)
    store.add_messages(
        P,
        s,
        [
            message("x", "x", metadata={"channel": "web", "stars": 1}),
            message("y", "y", metadata={"channel": "ios", "stars": 5}),
        ],
    )
    process(
        store,
        LayerWrite(
            facts=[
                fact("f-xy", "xy", ["x", "y"], unit(1)),
                fact("f-z", "z", ["z"], unit(0, 1)),
                fact("f-none", "none", [], unit(0, 0, 1)),
            ],
            summaries=[
                summary("s-xy", "xy", message_ids=["x", "y"]),
                summary("s-z", "z", message_ids=["z"]),
                summary("s-none", "none"),
            ],
        ),
    )
    cases = [
        ({"channel": "web", "stars": 5}, []),
        ({"channel": "ios"}, ["xy"]),
        ({"channel": "web"}, ["xy"]),
        ({"stars": {"$gte": 1}}, ["xy"]),
        ({"channel": {"$ne": "mail"}}, ["xy"]),
        ({"coupon": {"$exists": False}}, ["xy"]),
    ]
    for metadata, expected in cases:
        filters = ItemFilters(metadata=parse_metadata_filters(metadata))
        assert [f.id for f in store.list_facts(P, "u1", filters=filters)] == [
            f"f-{e}" for e in expected
        ], metadata
        assert [s.id for s in store.list_summaries(P, "u1", filters=filters)] == [
            f"s-{e}" for e in expected
        ], metadata
    assert len(store.list_facts(P, "u1", filters=ItemFilters())) == 3


# Stored numbers and filter bounds at and beyond the edges of 64-bit integers and doubles.
# Each backend must give the rows that exact decimal comparison of the JSON gives (jsonb's
# numeric; SQLite has only int64 and doubles, PostgreSQL alone compared float bounds as
# doubles and failed on 10**400), hence the same rows on both.
STORED_NUMBERS: dict[str, Any] = {
    "zero": 0,
    "negzero": -0.0,
    "tenth": 0.1,
    "five": 5,
    "p53": 2**53,
    "p53+1": 2**53 + 1,
    "p60": 2**60,
    "p60f": float(2**60),
    "max64": 2**63 - 1,
    "p63": 2**63,
    "p63+1": 2**63 + 1,
    "min64": -(2**63),
    "min64-1": -(2**63) - 1,
    "p64": 2**64,
    "e19f": 1e19,
    "e23f": 1e23,
    "e23": 10**23,
    "e308f": 1e308,
    "-e308f": -1e308,
    "e400": 10**400,
    "-e400": -(10**400),
    "text": "5",
    "true": True,
    "null": None,
}
BOUNDS = [
    0,
    -0.0,
    0.1,
    5,
    2**53,
    2**53 + 1,
    float(2**53),
    2**60,
    float(2**60),
    2**63 - 1,
    2**63,
    2**63 + 1,
    -(2**63),
    -(2**63) - 1,
    2**64,
    1e19,
    1e23,
    10**23,
    1e308,
    -1e308,
    10**400,
    -(10**400),
]
_ORDER = {"$gt": operator.gt, "$gte": operator.ge, "$lt": operator.lt, "$lte": operator.le}


def _decimal_answer(op: str, bound: Any) -> set[str]:
    """The messages a condition on "n" keeps, by exact decimal comparison of the JSON."""
    from decimal import Decimal

    def number(v: Any) -> Decimal | None:
        numeric = isinstance(v, (int, float)) and not isinstance(v, bool)
        return Decimal(json.dumps(v)) if numeric else None

    bounds = bound if isinstance(bound, list) else [bound]
    keep = set()
    for name, stored in STORED_NUMBERS.items():
        n = number(stored)
        equal = n is not None and any(n == number(b) for b in bounds)
        if op in ("$eq", "$in"):
            hit = equal
        elif op in ("$ne", "$nin"):
            hit = not equal
        else:
            hit = n is not None and _ORDER[op](n, number(bound))
        if hit:
            keep.add(name)
    return keep


def test_huge_and_edge_numbers_compare_alike_on_every_store(store: Store) -> None:
    s = session(store)
    rows = [
        message(name, f"number {name}", metadata={"n": value})
        for name, value in STORED_NUMBERS.items()
    ]
    store.add_messages(P, s, rows)
    batch = claim(store)
    facts = [fact(f"f-{r.id}", r.content, [r.id], unit(seed=i)) for i, r in enumerate(rows)]
    complete(store, batch, LayerWrite(facts=facts))
    names = {r.pk: r.id for r in rows}
    wrong = []
    conditions = [(op, b) for op in ("$eq", "$ne", *_ORDER) for b in BOUNDS]
    conditions += [("$in", [b, 5]) for b in BOUNDS] + [("$nin", [b, 0]) for b in BOUNDS]
    for op, bound in conditions:
        metadata = parse_metadata_filters({"n": {op: bound}})
        expected = _decimal_answer(op, bound)
        filters = SearchFilters(metadata=metadata)
        text = {names[pk] for pk, _ in store.fulltext_messages(P, "u1", ["number"], 100, filters)}
        near = {
            names[pk] for pk, _ in store.vector_messages(P, "u1", unit(seed=1), EMB, 100, filters)
        }
        listed = {
            f.message_ids[0]
            for f in store.list_facts(P, "u1", limit=100, filters=ItemFilters(metadata=metadata))
        }
        for how, got in (("fulltext", text), ("vector", near), ("list_facts", listed)):
            if got != expected:
                wrong.append((op, bound, how, sorted(got ^ expected)))
    assert not wrong, "\n".join(f"{op} {str(b)[:24]} ({how}): {diff}" for op, b, how, diff in wrong)


# -- vectors ---------------------------------------------------------------------------


def test_vector_search_ranks_by_cosine_within_the_user(store: Store) -> None:
    rows = add(store, [f"note {i}" for i in range(12)])
    add(store, ["someone else"], user="u2", sid="s2")
    process(store)
    process(store)
    q = unit(seed=rows[4].pk)
    found = store.vector_messages(P, "u1", q, EMB, 5, SearchFilters())
    assert len(found) == 5 and found[0][0] == rows[4].pk
    exact = sorted(((float(unit(seed=r.pk) @ q), r.pk) for r in rows), reverse=True)[:5]
    assert [pk for pk, _ in found] == [pk for _, pk in exact]
    assert [s for _, s in found] == pytest.approx([s for s, _ in exact], abs=1e-5)
    assert store.vector_messages(P, "u1", q, EMB, 0, SearchFilters()) == []
    assert store.vector_messages(P, "u1", q, "other:v1:8", 5, SearchFilters()) == []
    assert store.vector_messages(P, "u9", q, EMB, 5, SearchFilters()) == []


def _crowding_supersessions(
    store: Store, q: np.ndarray, facts_of: Sequence[MessageRow] = ()
) -> None:
    """40 summaries near ``q``, 35 of them then superseded by far ones (the current five
    are s35-s39); a fact near ``q`` for each of ``facts_of``."""
    rng = np.random.default_rng(3)

    def near(scale: float) -> np.ndarray:
        v = q + scale * rng.normal(size=DIM).astype(np.float32)
        return (v / np.linalg.norm(v)).astype(np.float32)

    add(store, ["round 0"], prefix="0")
    process(
        store,
        LayerWrite(
            facts=[fact(f"f{i}", f"fact {i}", [m.id], near(0.3)) for i, m in enumerate(facts_of)],
            summaries=[summary(f"s{i}", f"s{i}", vec=near(0.05)) for i in range(40)],
        ),
    )
    add(store, ["round 1"], prefix="1")
    process(
        store,
        LayerWrite(
            summaries=[
                summary(f"n{i}", f"n{i}", action="supersede", supersedes=f"s{i}", vec=near(50.0))
                for i in range(35)
            ]
        ),
    )


def test_vector_search_of_layers_skips_unwanted_statuses_even_when_they_crowd_the_top(
    store: Store,
) -> None:
    q = unit(seed=3)
    _crowding_supersessions(store, q)
    found = store.similar_summaries(P, "u1", q, EMB, 3)
    assert len(found) == 3
    assert all(
        row.status == "active" and row.id in {f"s{i}" for i in range(35, 40)} for row, _ in found
    )
    supers = store.vector_items("summary", P, "u1", q, EMB, 3, statuses=("superseded",))
    assert len(supers) == 3
    assert store.vector_items("summary", P, "u1", q, EMB, 3, statuses=()) == []


def test_vector_search_of_facts(store: Store) -> None:
    layered(store)
    [berlin, ramen] = store.get_facts(P, ["f-berlin", "f-ramen"])
    found = store.vector_items("fact", P, "u1", unit(1, 0), EMB, 5)
    assert [pk for pk, _ in found] == [berlin.pk, ramen.pk]
    assert found[0][1] == pytest.approx(1.0, abs=1e-5) and found[1][1] == pytest.approx(
        0.0, abs=1e-5
    )
    assert store.vector_items("fact", P, "u1", unit(1, 0), EMB, 5, statuses=("superseded",)) == []


def test_vector_layers_find_what_each_layer_search_finds_for_every_query(store: Store) -> None:
    """All layers and query variants asked at once: the same as one search per layer and
    query, superseded items crowding the top included, only the layers asked."""
    q = unit(seed=3)
    rows = add(store, [f"note {i}" for i in range(12)])
    add(store, ["someone else"], user="u2", sid="s2")
    process(store)
    process(store)
    _crowding_supersessions(store, q, facts_of=rows)
    queries = [q, unit(seed=rows[4].pk), unit(seed=11)]
    found = store.vector_layers(
        P,
        "u1",
        queries,
        EMB,
        4,
        messages=SearchFilters(),
        facts=("active",),
        summaries=("active",),
    )
    assert len(found) == 3
    for query, by_layer in zip(queries, found, strict=True):
        assert by_layer == {
            "message": store.vector_messages(P, "u1", query, EMB, 4, SearchFilters()),
            "fact": store.vector_items("fact", P, "u1", query, EMB, 4, ("active",)),
            "summary": store.vector_items("summary", P, "u1", query, EMB, 4, ("active",)),
        }
        assert all(len(hits) == 4 for hits in by_layer.values())
    ids = {s.pk: s.id for s in store.list_summaries(P, "u1", limit=100)}
    # Current summaries only, though 35 superseded ones are nearer.
    assert {ids[pk] for pk, _ in found[0]["summary"]} <= {f"s{i}" for i in range(35, 40)}
    only = store.vector_layers(
        P, "u1", [q], EMB, 3, messages=None, facts=("superseded",), summaries=()
    )
    assert only == [{"fact": [], "summary": []}]
    assert store.vector_layers(
        P, "u1", [q], EMB, 0, messages=SearchFilters(), facts=None, summaries=None
    ) == [{"message": []}]
    assert store.vector_layers(
        P, "u9", [q], EMB, 3, messages=SearchFilters(), facts=("active",), summaries=None
    ) == [{"message": [], "fact": []}]


def test_fulltext_layers_find_what_each_layer_search_finds_for_every_variant(
    store: Store,
) -> None:
    """All layers and variants asked at once (one round trip on PostgreSQL): the same as
    one search per layer and variant, message filters and statuses applied, only the
    layers asked."""
    layered(store)
    add(store, ["Berlin again, and ramen in Berlin"], prefix="2", sid="s2")
    store.set_summary_status(P, "s-food", "deprioritized", "stale", "ops")
    variants = [["berlin"], ["ramen", "food"], []]
    in_s2 = SearchFilters(session_id="s2")
    current = ("active", "deprioritized")
    found = store.fulltext_layers(
        P, "u1", variants, 5, messages=in_s2, facts=("active",), summaries=current
    )
    assert len(found) == 3
    for terms, by_layer in zip(variants, found, strict=True):
        assert by_layer == {
            "message": store.fulltext_messages(P, "u1", terms, 5, in_s2),
            "fact": store.fulltext_items("fact", P, "u1", terms, 5, ("active",)),
            "summary": store.fulltext_items("summary", P, "u1", terms, 5, current),
        }
    assert len(found[0]["message"]) == 1 and len(found[1]["message"]) == 1  # s2's turn only
    assert found[1]["fact"] and found[1]["summary"]  # the deprioritized s-food too
    assert found[2] == {"message": [], "fact": [], "summary": []}
    assert store.fulltext_layers(
        P, "u1", [["ramen"]], 5, messages=None, facts=(), summaries=None
    ) == [{"fact": []}]
    assert store.fulltext_layers(
        P, "u1", [["ramen"]], 0, messages=SearchFilters(), facts=None, summaries=None
    ) == [{"message": []}]
    assert store.fulltext_layers(
        P, "u9", [["ramen"]], 5, messages=SearchFilters(), facts=("active",), summaries=None
    ) == [{"message": [], "fact": []}]


def test_vectors_of_another_embedder_are_refused_then_reindexed(store: Store) -> None:
    rows = add(store, ["one", "two"])
    process(store)
    messages = store.list_messages(P)
    with pytest.raises(EmbedderMismatchError):
        store.put_message_vectors("other:v1:4", messages, np.zeros((2, 4), np.float32))
    assert store.stats(P)["vectors"] == {EMB: 2}
    assert store.drop_vectors_except("other:v1:4") == 2
    assert store.get_meta("embedder") == "other:v1:4"
    missing = store.messages_missing_vectors("other:v1:4", 0, 10)
    assert [m.id for m in missing] == [r.id for r in rows]
    assert [m.id for m in store.messages_missing_vectors("other:v1:4", rows[0].pk or 0, 10)] == [
        rows[1].id
    ]
    four = np.eye(4, dtype=np.float32)[:2]
    store.put_message_vectors("other:v1:4", missing, four)
    assert store.messages_missing_vectors("other:v1:4", 0, 10) == []
    found = store.vector_messages(P, "u1", four[1], "other:v1:4", 5, SearchFilters())
    assert found[0] == (rows[1].pk, pytest.approx(1.0))


def test_layer_items_missing_vectors_are_found_and_filled(store: Store) -> None:
    layered(store)
    store.drop_vectors_except("new:v1:3")
    facts = store.layer_items_missing_vectors("new:v1:3", "fact", 0, 10)
    assert [(t[1], t[2], t[3]) for t in facts] == [
        (P, "u1", "User moved to Berlin"),
        (P, "u1", "User likes ramen"),
    ]
    assert len(store.layer_items_missing_vectors("new:v1:3", "fact", facts[0][0], 10)) == 1
    store.put_layer_vectors("new:v1:3", "fact", facts, np.eye(3, dtype=np.float32)[:2])
    assert store.layer_items_missing_vectors("new:v1:3", "fact", 0, 10) == []
    summaries = store.layer_items_missing_vectors("new:v1:3", "summary", 0, 10)
    assert len(summaries) == 2
    found = store.vector_items("fact", P, "u1", np.eye(3, dtype=np.float32)[1], "new:v1:3", 5)
    assert found[0][0] == facts[1][0]


# -- recall briefs and neighbours -------------------------------------------------------


def test_message_neighbours_follow_time_then_acceptance_order(store: Store) -> None:
    s = session(store)
    rows = [
        message("late", "late", ts="2026-03-03T00:00:00.000000Z"),
        message("early", "early", ts="2026-03-01T00:00:00.000000Z"),
        message("mid1", "mid one", ts="2026-03-02T00:00:00.000000Z"),
        message("mid2", "mid two", ts="2026-03-02T00:00:00.000000Z"),
    ]
    store.add_messages(P, s, rows)
    add(store, ["elsewhere"], sid="s2")
    late, early, mid1, mid2 = (r.pk for r in rows)
    pks = [late, early, mid1, mid2]
    briefs, _, _ = store.recall_briefs(P, "u1", pks, neighbours=True)  # type: ignore[arg-type]
    got = {pk: (briefs[pk].prev_pk, briefs[pk].next_pk) for pk in pks}  # type: ignore[index]
    assert got == {early: (None, mid1), mid1: (early, mid2), mid2: (mid1, late), late: (mid2, None)}
    assert store.recall_briefs(P, "u2", [late], neighbours=True)[0] == {}  # type: ignore[list-item]
    plain, _, _ = store.recall_briefs(P, "u1", [mid1])  # type: ignore[list-item]
    assert (plain[mid1].prev_pk, plain[mid1].next_pk) == (None, None)  # type: ignore[index]


def test_recall_briefs_describe_each_layer(store: Store) -> None:
    ids = layered(store)
    rows = ids["messages"]
    [berlin, ramen] = store.get_facts(P, ["f-berlin", "f-ramen"])
    [home, food] = store.get_summaries(P, ["s-home", "s-food"])
    msgs, facts, sums = store.recall_briefs(
        P,
        "u1",
        [r.pk for r in rows],
        [berlin.pk, ramen.pk],
        [home.pk, food.pk],
        embedder=EMB,
    )
    m0 = msgs[rows[0].pk]
    assert (m0.id, m0.session_id, m0.name, m0.ts, m0.superseded) == (
        rows[0].id,
        "s1",
        None,
        NOW,
        False,
    )
    assert np.frombuffer(m0.vector, dtype=np.float32) == pytest.approx(unit(seed=rows[0].pk))
    f = facts[berlin.pk]
    assert (f.id, f.status, f.occurred_at, f.observed_at, f.created_at, f.valid_to) == (
        "f-berlin",
        "active",
        NOW,
        None,
        berlin.created_at,
        None,
    )
    assert np.frombuffer(f.vector, dtype=np.float32) == pytest.approx(unit(1, 0))
    sm = sums[home.pk]
    assert (sm.id, sm.status, sm.observed_at, sm.created_at, sm.valid_to) == (
        "s-home",
        "active",
        NOW,
        home.created_at,
        None,
    )
    assert sm.fact_ids == ["f-berlin"] and sm.topic_ids == ["t-life"]
    assert np.frombuffer(sm.vector, dtype=np.float32) == pytest.approx(unit(1, 0.1))
    # Without an embedder, no vectors; another user's items are not described.
    no_vec, _, _ = store.recall_briefs(P, "u1", [rows[0].pk])
    assert no_vec[rows[0].pk].vector is None
    assert store.recall_briefs(P, "u2", [rows[0].pk], [berlin.pk], [home.pk]) == ({}, {}, {})
    assert store.recall_briefs(P, "u1") == ({}, {}, {})


def _field_types(brief: Any) -> dict[str, type]:
    return {f.name: type(getattr(brief, f.name)) for f in dataclasses.fields(brief)}


def test_recall_briefs_have_the_same_fields_and_types_on_every_backend(store: Store) -> None:
    """Recall reads briefs by field name, and each field holds one plain Python type
    whatever the backend: id lists as lists of str (not JSON text, not arrays), the
    superseded mark a bool (also for a message without facts), pks as int, vectors as
    float32 bytes."""
    names = {
        cls: " ".join(f.name for f in dataclasses.fields(cls))
        for cls in (MessageBrief, FactBrief, SummaryBrief)
    }
    assert names == {
        MessageBrief: (
            "id session_id name ts superseded small_talk asks prev_pk next_pk vector replaced_by "
            "role"
        ),
        FactBrief: "id status occurred_at observed_at created_at valid_to vector message_ids",
        SummaryBrief: "id status observed_at created_at valid_to fact_ids topic_ids vector",
    }
    rows = add(store, ["Ann moved to Berlin", "Ann likes ramen", "Ann is home"], name="Ann")
    dated = {"observed_at": NOW, "valid_to": "2027-01-01T00:00:00.000000Z"}
    process(
        store,
        LayerWrite(
            facts=[fact("f1", "Ann moved", [rows[0].id], unit(1), occurred_at=NOW, **dated)],
            summaries=[summary("s1", "Ann moved", fact_ids=["f1"], vec=unit(1), **dated)],
            topics=[TopicWrite("t1", "life", "home", ["s1"], True)],
        ),
    )
    [later] = add(store, ["not processed yet"], prefix="2")
    [f1] = store.get_facts(P, ["f1"])
    [s1] = store.get_summaries(P, ["s1"])
    pks = [r.pk or 0 for r in [*rows, later]]
    msgs, facts, sums = store.recall_briefs(
        P, "u1", pks, [f1.pk], [s1.pk], neighbours=True, embedder=EMB
    )
    assert all(type(pk) is int for layer in (msgs, facts, sums) for pk in layer)
    none = type(None)
    turn = {
        "id": str,
        "session_id": str,
        "name": str,
        "ts": str,
        "superseded": bool,
        "small_talk": bool,
        "asks": bool,
    }
    assert isinstance(msgs[pks[1]], MessageBrief)
    turn["replaced_by"] = tuple
    turn["role"] = str
    assert msgs[pks[1]].role == "user"
    assert _field_types(msgs[pks[1]]) == {**turn, "prev_pk": int, "next_pk": int, "vector": bytes}
    # No name, no facts, no vector yet, the last turn.
    assert _field_types(msgs[pks[3]]) == {
        **turn,
        "name": none,
        "prev_pk": int,
        "next_pk": none,
        "vector": none,
    }
    assert msgs[pks[3]].superseded is False
    # The small-talk mark is stored as the row says and read back as a bool, in the row
    # and in the brief.
    [said] = add(store, ["Ann lives in Berlin"], prefix="3")
    [chat] = add(store, ["See ya!"], prefix="4", small_talk=True)
    briefs = store.recall_briefs(P, "u1", [chat.pk or 0, said.pk or 0], embedder=EMB)[0]
    assert briefs[chat.pk or 0].small_talk is True
    assert briefs[said.pk or 0].small_talk is False
    back = store.get_messages(P, [chat.id, said.id])
    assert (back[chat.id].small_talk, back[said.id].small_talk) == (True, False)
    # So is the mark of a turn that asks something (ends with a question mark).
    [question] = add(store, ["Where did you go?"], prefix="5", asks=True)
    marks = store.recall_briefs(P, "u1", [question.pk or 0, said.pk or 0], embedder=EMB)[0]
    assert (marks[question.pk or 0].asks, marks[said.pk or 0].asks) == (True, False)
    back = store.get_messages(P, [question.id, said.id])
    assert (back[question.id].asks, back[said.id].asks) == (True, False)
    dates = {"observed_at": str, "created_at": str, "valid_to": str}
    assert isinstance(facts[f1.pk], FactBrief)
    assert _field_types(facts[f1.pk]) == {
        **{"id": str, "status": str, "occurred_at": str},
        **dates,
        "vector": bytes,
        "message_ids": tuple,
    }
    assert facts[f1.pk].message_ids == (rows[0].id,)
    summary_brief = sums[s1.pk]
    assert isinstance(summary_brief, SummaryBrief)
    assert _field_types(summary_brief) == {
        **{"id": str, "status": str},
        **dates,
        **{"fact_ids": list, "topic_ids": list, "vector": bytes},
    }
    assert summary_brief.fact_ids == ["f1"] and summary_brief.topic_ids == ["t1"]
    assert all(type(i) is str for i in [*summary_brief.fact_ids, *summary_brief.topic_ids])
    # Without topics or facts, the lists are empty lists; without an embedder, no vectors.
    process(store, LayerWrite(summaries=[summary("s2", "alone", vec=unit(0, 1))]))
    [s2] = store.get_summaries(P, ["s2"])
    _, _, bare = store.recall_briefs(P, "u1", summaries=[s2.pk])
    assert (bare[s2.pk].fact_ids, bare[s2.pk].topic_ids, bare[s2.pk].vector) == ([], [], None)
    plain, _, _ = store.recall_briefs(P, "u1", pks[:1])
    assert (plain[pks[0]].prev_pk, plain[pks[0]].next_pk, plain[pks[0]].vector) == (
        None,
        None,
        None,
    )


def test_recall_briefs_of_many_items_at_once(store: Store) -> None:
    """More pks than SQLite binds one by one (they go as one JSON list there): every one
    described, with its neighbours, another user's left out."""
    rows = add(store, [f"turn {i}" for i in range(700)])
    [other] = add(store, ["not u1's"], user="u2", sid="s2")
    pks = [r.pk or 0 for r in rows]
    msgs, _, _ = store.recall_briefs(P, "u1", [*pks, other.pk or 0], neighbours=True)
    assert sorted(msgs) == pks
    assert [msgs[pk].prev_pk for pk in pks] == [None, *pks[:-1]]
    assert [msgs[pk].next_pk for pk in pks] == [*pks[1:], None]


def test_a_message_whose_facts_were_all_superseded_is_marked(store: Store) -> None:
    ids = layered(store)
    rows = add(store, ["Correction: Hamburg"], prefix="2")
    process(
        store,
        LayerWrite(
            facts=[fact("f-hh", "Hamburg", [rows[0].id], unit(1, 1))],
            summaries=[
                summary(
                    "s-hh", "Hamburg", action="supersede", supersedes="s-home", fact_ids=["f-hh"]
                )
            ],
        ),
    )
    m0, m1 = (r.pk for r in ids["messages"])
    msgs, _, _ = store.recall_briefs(P, "u1", [m0, m1, rows[0].pk])  # type: ignore[list-item]
    assert msgs[m0].superseded is True and msgs[m1].superseded is False  # type: ignore[index]
    assert msgs[rows[0].pk].superseded is False  # type: ignore[index]
    # What holds instead: the summary that superseded its facts, so recall can rank it first.
    assert msgs[m0].replaced_by == ("s-hh",)  # type: ignore[index]
    assert msgs[m1].replaced_by == msgs[rows[0].pk].replaced_by == ()  # type: ignore[index]


# -- projects, keys, audit, governance ------------------------------------------------------


def test_projects_and_api_keys(store: Store) -> None:
    project, created = store.create_project("acme", "Acme Inc.")
    assert created and project.name == "Acme Inc."
    same, created = store.create_project("acme", "ignored")
    assert not created and same == project
    store.create_project("beta", "Beta")
    assert store.get_project("nope") is None
    assert [p.id for p in store.list_projects()] == ["acme", "beta"]
    key = ApiKeyRow("k1", "acme", "ci", "sm_abc", "2026-01-01T00:00:00.000000Z")
    store.create_api_key(key, "hash-1")
    store.create_api_key(
        ApiKeyRow("k2", "beta", None, "sm_def", "2026-01-02T00:00:00.000000Z"), "hash-2"
    )
    assert store.find_api_key("hash-1") == key
    assert store.find_api_key("hash-x") is None
    assert [k.id for k in store.list_api_keys(None)] == ["k1", "k2"]
    assert [k.id for k in store.list_api_keys("beta")] == ["k2"]
    store.touch_api_key("k1", "2026-02-02T00:00:00.000000Z")
    assert store.find_api_key("hash-1").last_used_at == "2026-02-02T00:00:00.000000Z"  # type: ignore[union-attr]
    revoked = store.revoke_api_key("k1")
    assert revoked is not None and revoked.revoked_at is not None
    again = store.revoke_api_key("k1")
    assert again is not None and again.revoked_at == revoked.revoked_at  # first revocation kept
    assert store.revoke_api_key("nope") is None


def test_status_changes_are_versioned_and_audited(store: Store) -> None:
    layered(store)
    assert store.set_summary_status(P, "s-food", "deprioritized", "stale", "ops")
    assert store.set_summary_status(P, "s-food", "deprioritized", "again", "ops")  # no change
    assert not store.set_summary_status(P, "nope", "archived", "x", "ops")
    [food] = store.get_summaries(P, ["s-food"])
    assert (food.status, food.version) == ("deprioritized", 2)
    history = store.summary_history(P, "s-food")
    assert [(h["version"], h["status"], h["actor"], h["reason"]) for h in history][-1] == (
        2,
        "deprioritized",
        "ops",
        "stale",
    )
    [record] = store.list_audit(P, "u1", 10, 0)
    assert (record.action, record.target, record.actor, record.reason) == (
        "set_status",
        "s-food",
        "ops",
        "stale",
    )
    assert record.details == {"from": "active", "to": "deprioritized", "version": 2}
    assert store.list_audit(P, "u2", 10, 0) == [] and store.list_audit("q", None, 10, 0) == []


def test_forget_messages_removes_everything_built_on_them(store: Store) -> None:
    ids = layered(store)
    add(store, ["unrelated"], user="u2", sid="s2")
    process(store)
    counts = store.forget(P, "u1", message_ids=[ids["m0"]], actor="dpo", reason="asked")
    assert counts == {"messages": 1, "facts": 1, "summaries": 1, "topics": 0}
    assert store.get_message(P, ids["m0"]) is None
    assert store.get_facts(P, ["f-berlin"]) == [] and store.get_summaries(P, ["s-home"]) == []
    assert store.summary_history(P, "s-home") == []
    assert store.list_topics(P, "u1")[0].summary_ids == ["s-food"]
    assert store.fulltext_messages(P, "u1", ["berlin"], 10, SearchFilters()) == []
    assert store.fulltext_items("fact", P, "u1", ["berlin"], 10) == []
    assert store.fulltext_items("summary", P, "u1", ["berlin"], 10) == []
    assert [pk for pk, _ in store.vector_items("fact", P, "u1", unit(1, 0), EMB, 10)] == [
        store.get_facts(P, ["f-ramen"])[0].pk
    ]
    assert len(store.vector_messages(P, "u1", unit(seed=1), EMB, 10, SearchFilters())) == 1
    assert store.stats(P)["vectors"] == {EMB: 4}  # m1, f-ramen, s-food and u2's message
    [record] = store.list_audit(P, "u1", 10, 0)
    assert (record.action, record.target, record.details) == ("forget", "messages:1", counts)
    # Forgetting the rest removes the topic left empty.
    assert store.forget(P, "u1", message_ids=[ids["m1"]], actor="dpo", reason=None) == {
        "messages": 1,
        "facts": 1,
        "summaries": 1,
        "topics": 1,
    }
    assert store.list_topics(P, "u1") == []


def test_forget_by_session_and_by_topic(store: Store) -> None:
    ids = layered(store)
    add(store, ["other session"], sid="s9")
    process(store)
    counts = store.forget(P, "u1", session_id="s9", actor="a", reason=None)
    assert counts == {"messages": 1, "facts": 0, "summaries": 0, "topics": 0, "sessions": 1}
    assert store.get_session(P, "s9") is None
    counts = store.forget(P, "u1", topic_id="t-life", actor="a", reason=None)
    assert counts == {"messages": 2, "facts": 2, "summaries": 2, "topics": 1}
    assert store.get_message(P, ids["m0"]) is None and store.list_topics(P, "u1") == []
    assert store.get_session(P, "s1") is not None  # forgetting a topic keeps the session


def test_forget_refuses_scopes_that_are_not_the_users(store: Store) -> None:
    layered(store)
    add(store, ["theirs"], user="u2", sid="s2")
    assert store.forget(P, "u1", session_id="s2", actor="a", reason=None) is None
    assert store.forget(P, "u1", session_id="nope", actor="a", reason=None) is None
    assert store.forget(P, "u1", topic_id="nope", actor="a", reason=None) is None
    assert store.forget(P, "u1", message_ids=["u2-s2-0"], actor="a", reason=None) is None
    assert store.forget(P, "u1", message_ids=[], actor="a", reason=None) is None
    assert store.get_message(P, "u2-s2-0") is not None
    assert store.list_audit(P, None, 10, 0) == []


def test_forgetting_a_message_in_flight_voids_its_workers_lease(store: Store) -> None:
    rows = add(store, ["keep me", "forget me"])
    batch = claim(store)
    store.forget(P, "u1", message_ids=[rows[1].id], actor="a", reason=None)
    with pytest.raises(LeaseLostError):
        complete(store, batch)
    again = claim(store, "w2")
    assert [m.content for m in again.messages] == ["keep me"]
    assert again.job_attempts == {again.job_ids[0]: 1}


def test_forgetting_every_message_of_a_queued_job_finishes_it(store: Store) -> None:
    rows = add(store, ["only"])
    store.forget(P, "u1", message_ids=[rows[0].id], actor="a", reason=None)
    assert store.unfinished_jobs() == 0 and store.claim_batch("w", 30, 10) is None


def test_erase_user_leaves_only_the_audit(store: Store) -> None:
    layered(store)
    add(store, ["named"], name="Bob", prefix="n")
    add(store, ["other user"], user="u2", sid="s2")
    counts = store.erase_user(P, "u1", actor="dpo", reason="GDPR")
    assert counts["messages"] == 3 and counts["facts"] == 2 and counts["summaries"] == 2
    assert counts["topics"] == 1 and counts["sessions"] == 1 and counts["jobs"] == 2
    assert store.list_messages(P, user_id="u1") == [] and store.list_topics(P, "u1") == []
    assert store.list_sessions(P, "u1", 10, 0) == [] and store.speaker_names(P, "u1") == []
    assert store.stats(P)["llm_usage"] == {}
    assert store.vector_messages(P, "u1", unit(seed=1), EMB, 10, SearchFilters()) == []
    assert [m.content for m in store.list_messages(P, user_id="u2")] == ["other user"]
    [record] = store.list_audit(P, "u1", 10, 0)
    assert (record.action, record.actor, record.reason) == ("erase_user", "dpo", "GDPR")
    assert store.erase_user(P, "nobody", actor="dpo", reason=None) == {
        "messages": 0,
        "facts": 0,
        "summaries": 0,
        "topics": 0,
        "sessions": 0,
        "jobs": 0,
    }
    assert len(store.list_audit(P, None, 10, 0)) == 1


def test_projects_and_keys_of_the_same_time_are_listed_by_id(store: Store, db_url: str) -> None:
    store.create_project("zeta", "Z")
    store.create_project("alpha", "A")
    dbsql.execute(db_url, "UPDATE projects SET created_at = ?", NOW)
    assert [p.id for p in store.list_projects()] == ["alpha", "zeta"]
    for key_id in ("k2", "k1"):
        store.create_api_key(ApiKeyRow(key_id, "alpha", None, "sm_x", NOW), f"hash-{key_id}")
    store.create_api_key(ApiKeyRow("k0", "zeta", None, "sm_x", "2026-03-02T00:00:00.000000Z"), "h")
    assert [k.id for k in store.list_api_keys(None)] == ["k1", "k2", "k0"]
    assert [k.id for k in store.list_api_keys("alpha")] == ["k1", "k2"]


def test_every_status_change_is_a_version_and_an_audit_record(store: Store) -> None:
    layered(store)
    for status, reason in (("deprioritized", "stale"), ("archived", "old"), ("active", "back")):
        assert store.set_summary_status(P, "s-food", status, reason, "ops")
    [food] = store.get_summaries(P, ["s-food"])
    assert (food.status, food.version, food.fact_ids) == ("active", 4, ["f-ramen"])
    history = store.summary_history(P, "s-food")
    assert [
        (h["version"], h["status"], h["reason"], h["actor"], h["fact_ids"]) for h in history
    ] == [
        (1, "active", "test", "test", ["f-ramen"]),
        (2, "deprioritized", "stale", "ops", ["f-ramen"]),
        (3, "archived", "old", "ops", ["f-ramen"]),
        (4, "active", "back", "ops", ["f-ramen"]),
    ]
    records = store.list_audit(P, None, 10, 0)
    assert [(r.user_id, r.target, r.reason, r.details) for r in records] == [
        ("u1", "s-food", "stale", {"from": "active", "to": "deprioritized", "version": 2}),
        ("u1", "s-food", "old", {"from": "deprioritized", "to": "archived", "version": 3}),
        ("u1", "s-food", "back", {"from": "archived", "to": "active", "version": 4}),
    ]
    assert records[0].pk < records[1].pk < records[2].pk and records[0].at <= records[2].at
    assert store.list_audit(P, "u1", 1, 1) == [records[1]]


def test_forget_by_topic_takes_the_messages_its_facts_cite(store: Store) -> None:
    rows = add(store, ["I moved to Berlin", "I like ramen"])
    m0, m1 = (r.id for r in rows)
    process(
        store,
        LayerWrite(
            facts=[
                fact("f-berlin", "User moved to Berlin", [m0], unit(1, 0)),
                fact("f-ramen", "User likes ramen", [m1], unit(0, 1)),
            ],
            summaries=[
                summary("s-home", "User lives in Berlin", fact_ids=["f-berlin"], vec=unit(1, 0)),
                summary("s-food", "User likes ramen", message_ids=[m1], vec=unit(0, 1)),
            ],
            topics=[
                TopicWrite("t-home", "home", "where", ["s-home"], True),
                TopicWrite("t-food", "food", "what", ["s-food"], True),
            ],
        ),
    )
    counts = store.forget(P, "u1", topic_id="t-home", actor="dpo", reason="asked")
    assert counts == {"messages": 1, "facts": 1, "summaries": 1, "topics": 1}
    assert store.get_message(P, m0) is None and store.get_message(P, m1) is not None
    assert store.get_topic(P, "t-home") is None and store.get_topic(P, "t-food") is not None
    [record] = store.list_audit(P, "u1", 10, 0)
    assert (record.action, record.target, record.actor, record.reason, record.details) == (
        "forget",
        "topic:t-home",
        "dpo",
        "asked",
        counts,
    )
    # A topic forgotten is no longer the user's to forget.
    assert store.forget(P, "u1", topic_id="t-home", actor="dpo", reason=None) is None
    assert store.forget(P, "u2", topic_id="t-food", actor="dpo", reason=None) is None


def test_forget_reaches_context_citations_and_older_versions(store: Store, db_url: str) -> None:
    ids = layered(store)
    later = add(store, ["Yes, that one"], prefix="2")
    process(
        store,
        LayerWrite(
            # Cited as context: m0 is not of this batch, so only the id list names it.
            facts=[fact("f-ctx", "User confirmed Berlin", [ids["m0"]], unit(1, 1))],
            summaries=[summary("s-ctx", "Berlin, confirmed", message_ids=[later[0].id])],
        ),
    )
    # s-food's current version cites nothing; its first version, kept in the history,
    # cites f-ramen.
    empty = "'{}'" if dbsql.is_postgres(db_url) else "'[]'"
    dbsql.execute(
        db_url,
        f"UPDATE summaries SET fact_ids = {empty}, message_ids = {empty} WHERE id = ?",
        "s-food",
    )
    counts = store.forget(P, "u1", message_ids=[ids["m0"], ids["m1"]], actor="a", reason=None)
    assert counts == {"messages": 2, "facts": 3, "summaries": 2, "topics": 1}
    assert store.get_facts(P, ["f-berlin", "f-ramen", "f-ctx"]) == []
    assert [s.id for s in store.list_summaries(P, "u1")] == ["s-ctx"]


def test_forget_takes_any_number_of_message_ids_counted_once(store: Store) -> None:
    ids = layered(store)
    many = [ids["m0"], ids["m0"], *(f"unknown-{i}" for i in range(600)), ids["m1"]]
    counts = store.forget(P, "u1", message_ids=many, actor="a", reason=None)
    assert counts == {"messages": 2, "facts": 2, "summaries": 2, "topics": 1}
    [record] = store.list_audit(P, "u1", 10, 0)
    assert record.target == "messages:602"


def test_forgotten_items_leave_searches_already_loaded(store: Store) -> None:
    ids = layered(store)
    [food] = store.get_summaries(P, ["s-food"])
    assert len(store.vector_items("fact", P, "u1", unit(1, 0), EMB, 10)) == 2
    assert len(store.vector_items("summary", P, "u1", unit(1, 0), EMB, 10)) == 2
    assert len(store.vector_messages(P, "u1", unit(seed=1), EMB, 10, SearchFilters())) == 2
    store.forget(P, "u1", message_ids=[ids["m0"]], actor="a", reason=None)
    [(fact_pk, _)] = store.vector_items("fact", P, "u1", unit(1, 0), EMB, 10)
    assert fact_pk == store.get_facts(P, ["f-ramen"])[0].pk
    assert [pk for pk, _ in store.vector_items("summary", P, "u1", unit(1, 0), EMB, 10)] == [
        food.pk
    ]
    [(message_pk, _)] = store.vector_messages(P, "u1", unit(seed=1), EMB, 10, SearchFilters())
    assert message_pk == ids["messages"][1].pk


def test_forget_by_session_and_erasure_are_audited_with_their_counts(store: Store) -> None:
    layered(store)
    add(store, ["other session"], sid="s9")
    process(store)
    by_session = store.forget(P, "u1", session_id="s9", actor="a", reason="r")
    erased = store.erase_user(P, "u1", actor="dpo", reason="GDPR")
    assert erased == {
        "messages": 2,
        "facts": 2,
        "summaries": 2,
        "topics": 1,
        "sessions": 1,
        "jobs": 2,  # the forgotten session's, finished, goes too
    }
    records = store.list_audit(P, "u1", 10, 0)
    assert [(r.action, r.target, r.user_id, r.details) for r in records] == [
        ("forget", "session:s9", "u1", by_session),
        ("erase_user", "u1", "u1", erased),
    ]


def test_stats_count_what_is_stored(store: Store) -> None:
    layered(store)
    add(store, ["pending one"], user="u2", sid="s2")
    stats = store.stats(P)
    assert stats["users"] == 2 and stats["sessions"] == 2
    assert stats["messages"] == {"pending": 1, "processed": 2, "failed": 0}
    assert stats["jobs"] == {"queued": 1, "running": 0, "done": 1, "failed": 0}
    assert stats["embedder"] == EMB and stats["schema_version"] == store.schema_version()
    assert store.stats("q")["messages"] == {"pending": 0, "processed": 0, "failed": 0}
    assert store.stats()["users"] == 2


def test_stats_have_one_shape_on_every_store(store: Store) -> None:
    layered(store)  # two facts, two summaries, one topic, one extract call of u1
    add(store, ["elsewhere"], project="q")
    doomed = claim(store)
    store.fail_batch(doomed, "fatal", None, [CallWrite("extract", "m2", "t1", 3, 0, 1.0, False)])
    stats = store.stats(P)
    keys = list(stats)
    assert keys[0] == "store" and keys[1] in ("path", "url")
    assert stats["store"] == {"sqlite": "sqlite", "postgresql": "postgres"}[store.kind]
    assert keys[2:] == [
        "schema_version",
        "size_bytes",
        "users",
        "sessions",
        "messages",
        "jobs",
        "facts",
        "summaries",
        "topics",
        "vectors",
        "embedder",
        "llm_usage",
        "processing",
    ]
    assert stats["size_bytes"] > 0 and stats["facts"] == 2 and stats["topics"] == 1
    assert stats["summaries"] == {"active": 2} and stats["vectors"] == {EMB: 6}
    assert stats["processing"] == {"paused": False}
    assert stats["llm_usage"] == {
        "extract test": {"calls": 1, "prompt_tokens": 10, "completion_tokens": 5, "failed": 0}
    }
    assert store.llm_usage("q") == {
        "extract m2": {"calls": 1, "prompt_tokens": 3, "completion_tokens": 0, "failed": 1}
    }
    assert list(store.llm_usage()) == ["extract m2", "extract test"]
    whole = store.stats()
    assert whole["messages"] == {"pending": 0, "processed": 2, "failed": 1}
    assert whole["jobs"] == {"queued": 0, "running": 0, "done": 1, "failed": 1}
    assert store.stats("nobody")["vectors"] == {} and store.stats("nobody")["users"] == 0


# -- webhooks ----------------------------------------------------------------------------


def hook(hid: str, project: str = P, **kw: Any) -> WebhookRow:
    fields: dict[str, Any] = {
        "pk": 0,
        "id": hid,
        "project_id": project,
        "name": hid,
        "resource": "fact",
        "event": "before_add",
        "mode": "async",
        "target_url": "https://example.com/hook",
        "secret": "whsec_x",
        "enabled": True,
        "timeout_ms": 1000,
        "created_at": NOW,
        "updated_at": NOW,
    }
    fields.update(kw)
    return WebhookRow(**fields)


def delivery(
    h: WebhookRow, n: int, message_ids: Sequence[str] = (), user: str = "u1"
) -> WebhookDeliveryRow:
    return WebhookDeliveryRow(
        id=f"d{n}",
        hook_pk=h.pk,
        project_id=h.project_id,
        user_id=user,
        message_ids=list(message_ids),
        resource=h.resource,
        event=h.event,
        mode=h.mode,
        attempt=1,
        status="delivered",
        http_status=200,
        latency_ms=1.23456,
        reason="",
        request="{}",
        response="{}",
        at=NOW,
    )


def test_webhook_records_and_their_version(store: Store) -> None:
    v0 = store.webhooks_version()
    a = store.create_webhook(hook("wh_a"))
    b = store.create_webhook(hook("wh_b", enabled=False))
    store.create_webhook(hook("wh_c", project="q"))
    assert a.pk > 0 and a.pk < b.pk and a.enabled and not b.enabled
    assert store.webhooks_version() == v0 + 3
    assert store.get_webhook(P, "wh_a") == a and store.get_webhook("q", "wh_a") is None
    assert [h.id for h in store.list_webhooks(P)] == ["wh_a", "wh_b"]
    assert [h.id for h in store.list_webhooks(P, enabled_only=True)] == ["wh_a"]
    assert [h.id for h in store.list_webhooks(P, limit=1, offset=1)] == ["wh_b"]
    changed = store.update_webhook(P, "wh_b", {"enabled": True, "timeout_ms": 2000})
    assert changed is not None and changed.enabled and changed.timeout_ms == 2000
    assert store.webhooks_version() == v0 + 4
    assert store.update_webhook(P, "nope", {"name": "x"}) is None
    with pytest.raises(ValueError):
        store.update_webhook(P, "wh_a", {"project_id": "q"})
    assert store.delete_webhook(P, "wh_a") and not store.delete_webhook(P, "wh_a")
    assert store.webhooks_version() == v0 + 5
    assert "whsec" not in repr(a)


def test_the_delivery_log_is_newest_first_and_pruned(store: Store) -> None:
    h = store.create_webhook(hook("wh_a"))
    for n in range(140):
        store.add_webhook_delivery(delivery(h, n), keep=10)
    log = store.list_webhook_deliveries(P, "wh_a", 5, 0)
    assert [d.id for d in log] == ["d139", "d138", "d137", "d136", "d135"]
    assert log[0].hook_id == "wh_a" and log[0].latency_ms == pytest.approx(1.235)
    assert len(store.list_webhook_deliveries(P, "wh_a", 1000, 0)) < 140  # pruned as it grew
    store.delete_webhook(P, "wh_a")
    store.add_webhook_delivery(delivery(h, 999))  # the hook is gone: nothing to log under
    assert store.list_webhook_deliveries(P, "wh_a", 10, 0) == []


def _outbox_batch(store: Store, h: WebhookRow, n: int = 2) -> ClaimedBatch:
    rows = add(store, ["something happened"], prefix=f"o{n}")
    batch = claim(store)
    complete(
        store,
        batch,
        LayerWrite(
            outbox=[
                OutboxWrite(f"dl{n}-{i}", h.pk, P, "u1", [rows[0].id], f'{{"n": {i}}}')
                for i in range(n)
            ]
        ),
    )
    return batch


def test_async_deliveries_are_claimed_under_a_lease_and_settled(store: Store) -> None:
    h = store.create_webhook(hook("wh_a"))
    assert store.claim_webhook_delivery("s", 30) is None and store.next_webhook_time() is None
    _outbox_batch(store, h)
    assert store.webhook_outbox_counts() == {"queued": 2, "running": 0, "failed": 0}
    first = store.claim_webhook_delivery("s1", 0.3)
    assert first is not None and first.body == '{"n": 0}' and first.attempts == 1
    assert first.hook.id == "wh_a" and first.message_ids == ["o2u1-s1-0"]
    second = store.claim_webhook_delivery("s2", 30)
    assert second is not None and second.delivery_id == "dl2-1"
    assert store.claim_webhook_delivery("s3", 30) is None
    assert store.webhook_outbox_counts(P) == {"queued": 0, "running": 2, "failed": 0}
    time.sleep(0.4)
    again = store.claim_webhook_delivery("s3", 30)  # s1's lease ran out
    assert again is not None and again.pk == first.pk and again.attempts == 2
    assert not store.finish_webhook_delivery(first, "done")  # s1 lost it
    retry_at = time.time() + 60
    assert store.finish_webhook_delivery(again, "retry", retry_at=retry_at, error="503")
    assert store.next_webhook_time() == pytest.approx(time.time() + 30, abs=5)  # s2's lease
    assert store.finish_webhook_delivery(
        second, "failed", error="gone", log=delivery(h, 1, ["x"]), keep=10
    )
    assert store.webhook_outbox_counts() == {"queued": 1, "running": 0, "failed": 1}
    assert [d.id for d in store.list_webhook_deliveries(P, "wh_a", 10, 0)] == ["d1"]
    assert store.next_webhook_time() == pytest.approx(retry_at)


def test_a_delivery_claim_skips_the_projects_it_is_told_to(store: Store) -> None:
    # A sender skips projects holding their share of its slots; the rest go oldest first.
    h = store.create_webhook(hook("wh_a"))
    _outbox_batch(store, h, 3)
    other = store.create_webhook(hook("wh_q", project="q"))
    add(store, ["elsewhere"], project="q", user="uq", sid="sq")
    batch = claim(store)
    complete(store, batch, LayerWrite(outbox=[OutboxWrite("dq", other.pk, "q", "uq", [], "{}")]))
    taken = store.claim_webhook_delivery("s", 30, skip_projects=[P])
    assert taken is not None and (taken.project_id, taken.delivery_id) == ("q", "dq")
    assert store.claim_webhook_delivery("s", 30, skip_projects=[P, "q"]) is None
    assert store.claim_webhook_delivery("s", 30, skip_projects=["q"]).delivery_id == "dl3-0"  # type: ignore[union-attr]
    assert store.claim_webhook_delivery("s", 30).delivery_id == "dl3-1"  # type: ignore[union-attr]


def test_deliveries_are_queued_only_if_their_batch_commits(store: Store) -> None:
    h = store.create_webhook(hook("wh_a"))
    add(store, ["x"])
    batch = claim(store)
    bad = LayerWrite(
        summaries=[summary("nope", "x", action="strengthen")],
        outbox=[OutboxWrite("dl", h.pk, P, "u1", [], "{}")],
    )
    with pytest.raises(ValueError):
        complete(store, batch, bad)
    assert store.webhook_outbox_counts() == {"queued": 0, "running": 0, "failed": 0}
    # A delivery for a hook deleted meanwhile is dropped, the batch still commits.
    store.delete_webhook(P, "wh_a")
    complete(store, batch, LayerWrite(outbox=[OutboxWrite("dl", h.pk, P, "u1", [], "{}")]))
    assert store.webhook_outbox_counts()["queued"] == 0
    assert store.unfinished_jobs() == 0


def test_deleting_a_hook_drops_its_queue_and_forgetting_drops_traces(store: Store) -> None:
    h = store.create_webhook(hook("wh_a"))
    keep = store.create_webhook(hook("wh_b"))
    _outbox_batch(store, h, 1)
    _outbox_batch(store, keep, 3)
    store.add_webhook_delivery(delivery(keep, 1, ["o3u1-s1-0"]))
    store.add_webhook_delivery(delivery(keep, 2, ["unrelated"]))
    store.delete_webhook(P, "wh_a")
    assert store.webhook_outbox_counts()["queued"] == 3
    store.forget(P, "u1", message_ids=["o3u1-s1-0"], actor="a", reason=None)
    assert store.webhook_outbox_counts()["queued"] == 0
    assert [d.id for d in store.list_webhook_deliveries(P, "wh_b", 10, 0)] == ["d2"]


def test_a_hook_change_is_seen_by_another_store_and_only_changes_bump_the_version(
    store: Store, db_url: str
) -> None:
    other = open_store(db_url)  # another process on the same database
    try:
        v0 = other.webhooks_version()
        store.create_webhook(hook("wh_a"))
        store.create_webhook(hook("wh_b"))
        assert other.webhooks_version() == v0 + 2
        assert [h.id for h in other.list_webhooks(P, offset=1)] == ["wh_b"]  # no limit
        assert store.update_webhook(P, "nope", {"name": "x"}) is None
        with pytest.raises(ValueError, match="not updatable"):
            store.update_webhook(P, "wh_a", {"name": "x", "secret_hash": "y"})
        assert not store.delete_webhook(P, "nope")
        assert other.webhooks_version() == v0 + 2 and store.get_webhook(P, "wh_a").name == "wh_a"  # type: ignore[union-attr]
        store.update_webhook(P, "wh_a", {"enabled": False})
        assert other.webhooks_version() == v0 + 3
        assert [h.id for h in other.list_webhooks(P, enabled_only=True)] == ["wh_b"]
    finally:
        other.close()


def test_the_delivery_log_keeps_the_newest_of_each_hook(store: Store) -> None:
    busy = store.create_webhook(hook("wh_a"))
    quiet = store.create_webhook(hook("wh_b"))
    for n in range(5):
        store.add_webhook_delivery(delivery(quiet, 1000 + n), keep=3)
    for n in range(200):
        store.add_webhook_delivery(delivery(busy, n), keep=10)
    kept = [d.id for d in store.list_webhook_deliveries(P, "wh_a", 1000, 0)]
    # Pruned now and then (every 64th row logged), to the newest `keep`; never below that.
    assert 10 <= len(kept) < 10 + 64
    assert kept == [f"d{n}" for n in range(199, 199 - len(kept), -1)]
    # One hook's pruning leaves the others' logs alone.
    assert len(store.list_webhook_deliveries(P, "wh_b", 1000, 0)) == 5


def test_a_delivery_claim_takes_the_earliest_due_and_never_a_settled_one(store: Store) -> None:
    h = store.create_webhook(hook("wh_a"))
    _outbox_batch(store, h, 3)
    first = store.claim_webhook_delivery("s", 30)
    assert first is not None and first.delivery_id == "dl3-0"
    # Due again before the others were: it comes first.
    assert store.finish_webhook_delivery(first, "retry", retry_at=time.time() - 60, error="503")
    again = store.claim_webhook_delivery("s", 30)
    assert again is not None and (again.delivery_id, again.attempts) == ("dl3-0", 2)
    assert store.finish_webhook_delivery(again, "failed", error="gone")  # never again
    later = store.claim_webhook_delivery("s", 30)
    assert later is not None and later.delivery_id == "dl3-1"
    retry_at = time.time() + 60
    assert store.finish_webhook_delivery(later, "retry", retry_at=retry_at, error="503")
    last = store.claim_webhook_delivery("s", 30)
    assert last is not None and last.delivery_id == "dl3-2"
    assert store.finish_webhook_delivery(last, "done")
    assert store.claim_webhook_delivery("s", 30) is None  # dl3-1 is not due yet
    assert store.webhook_outbox_counts() == {"queued": 1, "running": 0, "failed": 1}
    assert store.next_webhook_time() == pytest.approx(retry_at)
    # However many projects a sender skips.
    many = [f"p{i}" for i in range(600)]
    assert store.claim_webhook_delivery("s", 30, skip_projects=[*many, P]) is None
    assert store.next_webhook_time() == pytest.approx(retry_at)


def test_settling_a_delivery_refuses_an_unknown_outcome_even_after_its_lease_is_lost(
    store: Store,
) -> None:
    h = store.create_webhook(hook("wh_a"))
    _outbox_batch(store, h, 1)
    item = store.claim_webhook_delivery("s", 30)
    assert item is not None
    for held_by in (item, dataclasses.replace(item, lease_owner="someone else")):
        with pytest.raises(ValueError, match="unknown outcome"):
            store.finish_webhook_delivery(held_by, "delivered", log=delivery(h, 1))
    assert store.webhook_outbox_counts() == {"queued": 0, "running": 1, "failed": 0}
    assert store.list_webhook_deliveries(P, "wh_a", 10, 0) == []
    assert store.finish_webhook_delivery(item, "done")


def test_concurrent_senders_never_take_the_same_delivery(store: Store) -> None:
    h = store.create_webhook(hook("wh_a"))
    _outbox_batch(store, h, 12)
    taken: list[str] = []
    lock = threading.Lock()

    def sender(name: str) -> None:
        while (item := store.claim_webhook_delivery(name, 30)) is not None:
            with lock:
                taken.append(item.delivery_id)

    threads = [threading.Thread(target=sender, args=(f"s{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(taken) == sorted(f"dl12-{i}" for i in range(12))
    assert store.webhook_outbox_counts() == {"queued": 0, "running": 12, "failed": 0}


# -- the recall log --------------------------------------------------------------------------


def recall_row(
    user: str = "u1", at: float = 1_000_000.0, latency: float = 10.0, **kw: Any
) -> RecallRecordRow:
    values: dict[str, Any] = {
        "project_id": P,
        "user_id": user,
        "session_id": "s1",
        "source": "capture",
        "request": "openai chat.completions",
        "query": "where do I live?",
        "outcome": "injected",
        "formatted_context": "<memory>Berlin</memory>",
        "hits": 2,
        "latency_ms": latency,
        "created_at": at,
        **kw,
    }
    return RecallRecordRow(**values)


def test_recall_records_are_listed_newest_first_per_project_and_user(store: Store) -> None:
    store.add_recall_records(
        [
            recall_row(at=1.0, latency=1.5),
            recall_row(at=3.0, user="u2", outcome="none", formatted_context="", hits=0),
            recall_row(at=2.0, session_id=None, query=None, source="rest", request="POST /x"),
            recall_row(at=4.0, project_id="other"),
        ]
    )
    listed = store.list_recall_records(P)
    assert [r.created_at for r in listed] == [3.0, 2.0, 1.0]
    assert listed[2] == dataclasses.replace(recall_row(at=1.0, latency=1.5), pk=listed[2].pk)
    assert (listed[1].session_id, listed[1].query, listed[1].source) == (None, None, "rest")
    assert [r.created_at for r in store.list_recall_records(P, "u1")] == [2.0, 1.0]
    assert [r.created_at for r in store.list_recall_records(P, limit=1, offset=1)] == [2.0]
    assert [r.project_id for r in store.list_recall_records("other")] == ["other"]
    store.add_recall_records([])  # nothing to write: no transaction


def test_recall_latency_series_buckets_with_nearest_rank_percentiles(store: Store) -> None:
    since = 1_000_000.0
    rows = [recall_row(at=since + i, latency=float(i + 1)) for i in range(20)]  # 1..20 ms
    rows.append(recall_row(at=since + 3600 + 5, latency=7.0, outcome="skipped"))
    rows.append(recall_row(at=since - 1, latency=999.0))  # before the window
    rows.append(recall_row(at=since + 2, latency=999.0, project_id="other"))
    store.add_recall_records(rows)
    first, second = store.recall_latency_series(P, since, 3600)
    assert (first.bucket_start, first.count, first.skipped) == (since, 20, 0)
    assert (first.p50_ms, first.p95_ms, first.max_ms) == (10.0, 19.0, 20.0)
    assert (second.bucket_start, second.count, second.skipped) == (since + 3600, 1, 1)
    assert second.p50_ms == second.p95_ms == second.max_ms == 7.0
    assert store.recall_latency_series(P, since + 7200, 3600) == []


def test_recall_log_is_pruned_by_count_per_project_and_by_age(store: Store) -> None:
    store.add_recall_records([recall_row(at=float(t)) for t in range(1, 11)])
    store.add_recall_records([recall_row(at=float(t), project_id="other") for t in range(1, 4)])
    assert store.prune_recall_log(P, 4, older_than=0.0) == 6
    assert [r.created_at for r in store.list_recall_records(P)] == [10.0, 9.0, 8.0, 7.0]
    assert len(store.list_recall_records("other")) == 3  # another project's untouched
    assert store.prune_recall_log(None, 100, older_than=8.5) == 5  # 7, 8 and other's 1-3
    assert [r.created_at for r in store.list_recall_records(P)] == [10.0, 9.0]
    assert store.list_recall_records("other") == []


def test_a_record_or_an_exchange_that_began_before_a_removal_is_left_out(store: Store) -> None:
    """The tombstone of erasures.py: a recall record (or a captured exchange) that began
    before its user's memory was last forgotten (erased), wherever it waited, is not
    written, and counted; one that began after it is; other users and projects are not
    concerned."""
    add(store, ["I live in Berlin"])
    before = time.time()
    time.sleep(0.01)
    assert store.forget(P, "u1", session_id="s1", actor="a", reason=None) is not None
    time.sleep(0.01)
    after = time.time()
    rows = [
        recall_row(at=before + 0.005, latency=1.0),  # finished after, began before: out
        recall_row(at=after, latency=0.0),
        recall_row(user="u2", at=before),
        recall_row(project_id="other", at=before),
    ]
    assert store.add_recall_records(rows) == 1
    assert [r.created_at for r in store.list_recall_records(P, "u1")] == [after]
    assert len(store.list_recall_records(P, "u2")) == len(store.list_recall_records("other")) == 1
    # A forget is no erasure: an exchange that began before it is stored.
    exchange = [message("x-1", "Hello again")]
    assert store.add_captured(session(store, sid="s-x"), exchange, began_at=before) is not None
    store.erase_user(P, "u1", actor="dpo", reason=None)
    assert store.list_recall_records(P, "u1") == []
    late = [message("x-2", "My PIN is 4321")]
    new_session = SessionRow(P, "s-late", "u1", None, {}, NOW, NOW)
    assert store.add_captured(new_session, late, began_at=after) is None
    assert store.get_session(P, "s-late") is None  # not made again either
    assert store.get_message(P, "x-2") is None
    assert store.add_recall_records([recall_row(at=after)]) == 1
    # The user comes back: what begins after the erasure is stored.
    time.sleep(0.01)
    back = [message("x-3", "I'm back")]
    outcome = store.add_captured(new_session, back, began_at=time.time())
    assert outcome is not None and outcome.message_ids == ["x-3"]
    assert store.get_session(P, "s-late") is not None
    # The session of another user is refused, not written into.
    other = SessionRow(P, "s-late", "u2", None, {}, NOW, NOW)
    with pytest.raises(ConflictError):
        store.add_captured(other, [message("x-4", "hi")], began_at=time.time())


def test_erase_and_forget_delete_the_users_recall_records(store: Store) -> None:
    ids = layered(store)
    add(store, ["other user"], user="u2", sid="s2")
    store.add_recall_records(
        [recall_row(at=1.0), recall_row(at=2.0, session_id="s9"), recall_row(user="u2")]
    )
    store.add_recall_records([recall_row(project_id="other")])  # same user, another project
    # Forgetting any part of the user's memory deletes all of the user's records.
    assert store.forget(P, "u1", message_ids=[ids["m0"]], actor="a", reason=None) is not None
    assert [r.user_id for r in store.list_recall_records(P)] == ["u2"]
    # A recall made after the forget is logged again (one from before it would not be:
    # test_a_record_or_an_exchange_that_began_before_a_removal_is_left_out).
    assert store.add_recall_records([recall_row(at=time.time() + 1)]) == 0
    # A scope that is not the user's forgets nothing, the log included.
    assert store.forget(P, "u1", session_id="nope", actor="a", reason=None) is None
    assert len(store.list_recall_records(P, "u1")) == 1
    store.erase_user(P, "u1", actor="dpo", reason=None)
    assert store.list_recall_records(P, "u1") == []
    assert len(store.list_recall_records(P, "u2")) == 1
    assert len(store.list_recall_records("other", "u1")) == 1
    # A user known only to the log is erased from it too.
    store.add_recall_records([recall_row(user="ghost")])
    store.erase_user(P, "ghost", actor="dpo", reason=None)
    assert store.list_recall_records(P, "ghost") == []
