"""The job queue on PostgreSQL (jobs/_procrastinate.py, store/postgres/_jobs.py): wake-ups
committed with their messages, one run per user, takeover of dead runs, fencing, backoff,
waiting without workers, self-healing. Real PostgreSQL, real procrastinate."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import psycopg
import pytest

from dbsql import await_lock_wait, execute, rows, sessions, sessions_left
from fakes.openai_server import FakeOpenAIServer
from stratamem import Memory
from stratamem.embed import make_embedder
from stratamem.errors import ProcessingError
from stratamem.jobs._procrastinate import _procrastinate_schema
from stratamem.store import LeaseLostError

WAKE_UPS = "SELECT lock, queueing_lock, args, status FROM procrastinate_jobs ORDER BY id"


def _key(project: str, user: str) -> str:
    return f"stratamem:{len(project)}:{project}:{user}"


def _say(session: Any, *texts: str) -> Any:
    return session.add_messages([{"role": "user", "content": t} for t in texts])


@pytest.fixture
def open_memory(pg_url: str) -> Iterator[Callable[..., Memory]]:
    opened: list[Memory] = []

    def make(**options: Any) -> Memory:
        options.setdefault("embedder", "hash")
        mem = Memory(pg_url, **options)
        opened.append(mem)
        return mem

    yield make
    for mem in reversed(opened):
        mem.close(timeout=10)


def test_a_job_and_its_users_wake_up_commit_together(
    pg_url: str, open_memory: Callable[..., Memory]
) -> None:
    mem = open_memory(workers=0)
    alice = mem.sessions.create(user_id="alice")
    bob = mem.sessions.create(user_id="bob")
    _say(alice, "I ordered parcel a1 for my sister.")
    _say(bob, "I ordered parcel b1 for my sister.")
    _say(alice, "I ordered parcel a2 for my sister.")
    assert rows(pg_url, "SELECT user_id, status FROM jobs ORDER BY id") == [
        ("alice", "queued"),
        ("bob", "queued"),
        ("alice", "queued"),
    ]
    # One waiting wake-up per user: alice's second job merged into her first wake-up.
    key_a, key_b = _key("default", "alice"), _key("default", "bob")
    assert rows(pg_url, WAKE_UPS) == [
        (key_a, key_a, {"project_id": "default", "user_id": "alice"}, "todo"),
        (key_b, key_b, {"project_id": "default", "user_id": "bob"}, "todo"),
    ]
    # When the wake-up cannot be written, neither are the messages nor their job.
    execute(
        pg_url,
        "ALTER TABLE procrastinate_jobs ADD CONSTRAINT refuse CHECK (args->>'user_id' <> 'carol')",
    )
    carol = mem.sessions.create(user_id="carol")
    with pytest.raises(psycopg.errors.CheckViolation):
        _say(carol, "I ordered parcel c1 for my sister.")
    assert rows(pg_url, "SELECT count(*) FROM messages WHERE user_id = 'carol'") == [(0,)]
    assert rows(pg_url, "SELECT count(*) FROM jobs WHERE user_id = 'carol'") == [(0,)]


def test_concurrent_workers_keep_each_users_order_and_process_once(
    pg_url: str, open_memory: Callable[..., Memory]
) -> None:
    writer = open_memory(workers=0)
    sessions = [writer.sessions.create(user_id=f"u{k}") for k in range(6)]
    for i in range(25):
        for k, s in enumerate(sessions):
            _say(s, f"I ordered parcel u{k}n{i:02d} for my sister.")
    worker = open_memory(workers=3)
    worker.wait(timeout=120)
    for k in range(6):
        facts = worker.facts.list(user_id=f"u{k}", limit=100)
        assert [f.text.split()[3] for f in facts] == [f"u{k}n{i:02d}" for i in range(25)]
    assert rows(pg_url, "SELECT status, count(*), max(attempts) FROM jobs GROUP BY 1") == [
        ("done", 150, 1)
    ]
    assert rows(
        pg_url, "SELECT count(*), count(DISTINCT item_pk) FROM vectors WHERE kind = 'message'"
    ) == [(150, 150)]


def test_a_dead_runs_jobs_are_taken_over_and_its_commit_is_refused(
    pg_url: str, open_memory: Callable[..., Memory]
) -> None:
    mem = open_memory(workers=0)
    s = mem.sessions.create(user_id="u1")
    _say(s, "I ordered parcel one for my sister.")
    _say(s, "I ordered parcel two for my sister.")
    store: Any = mem.store
    dead = store.claim_user_batch("default", "u1", "run-a", 256)
    assert dead is not None and dead.job_attempts == dict.fromkeys(dead.job_ids, 1)
    # The user's next run (procrastinate lets one run per user) takes the jobs over.
    live = store.claim_user_batch("default", "u1", "run-b", 256)
    assert live is not None and live.job_attempts == dict.fromkeys(dead.job_ids, 2)
    embedder = make_embedder("hash")
    vectors = np.asarray(embedder.embed([m.content for m in dead.messages]))
    with pytest.raises(LeaseLostError):
        store.complete_batch(dead, embedder=embedder.id, vectors=vectors)
    with pytest.raises(LeaseLostError):
        store.fail_batch(dead, "late failure", retry_at=None)
    store.complete_batch(live, embedder=embedder.id, vectors=vectors)
    assert rows(pg_url, "SELECT status, attempts FROM messages ORDER BY pk") == [
        ("processed", 2),
        ("processed", 2),
    ]
    # A job under a live store lease (claim_batch) is not a dead run's: left alone.
    _say(s, "I ordered parcel three for my sister.")
    leased = store.claim_batch("lease-holder", 30.0, 256)
    assert leased is not None
    assert store.claim_user_batch("default", "u1", "run-c", 256) is None


def _fetch_as_dead_worker(url: str) -> tuple[int, int]:
    """A procrastinate worker that registered, fetched a wake-up and then went silent."""
    with psycopg.connect(url, autocommit=True) as conn:
        registered = conn.execute("SELECT worker_id FROM procrastinate_register_worker_v1()")
        worker_id = registered.fetchone()[0]  # type: ignore[index]
        conn.execute(
            "UPDATE procrastinate_workers SET last_heartbeat = now() - interval '1 hour' "
            "WHERE id = %s",
            (worker_id,),
        )
        job = conn.execute(
            "SELECT id FROM procrastinate_fetch_job_v2(ARRAY['stratamem'], %s)", (worker_id,)
        ).fetchone()
    assert job is not None and job[0] is not None
    return int(worker_id), int(job[0])


def test_a_stalled_workers_run_is_ended_and_another_worker_takes_over(
    pg_url: str, open_memory: Callable[..., Memory]
) -> None:
    writer = open_memory(workers=0)
    s = writer.sessions.create(user_id="u1")
    _say(s, "I ordered parcel one for my sister.", "I ordered parcel two for my sister.")
    _, stalled = _fetch_as_dead_worker(pg_url)
    held = writer.store.claim_user_batch("default", "u1", f"pq{stalled}.0", 256)  # type: ignore[attr-defined]
    assert held is not None
    # A new worker sweeps at start: the silent worker's run is ended, the user woken again.
    worker = open_memory(workers=1, job_lease_seconds=1.0)
    worker.wait(timeout=60)
    assert rows(pg_url, "SELECT status, attempts FROM messages ORDER BY pk") == [
        ("processed", 2),
        ("processed", 2),
    ]
    assert rows(pg_url, "SELECT status FROM procrastinate_jobs WHERE id = ?", stalled) == [
        ("failed",)
    ]


def test_backoff_is_a_scheduled_wake_up_and_failed_for_good_can_be_retried(
    pg_url: str, open_memory: Callable[..., Memory]
) -> None:
    with FakeOpenAIServer(dim=8) as fake:
        mem = open_memory(
            workers=0,
            embedder="openai:fake-embed",
            embedder_base_url=fake.base_url,
            embedder_api_key="k",
            job_backoff_seconds=30.0,
            job_max_attempts=2,
        )
        s = mem.sessions.create(user_id="u1")
        _say(s, "I ordered parcel one for my sister.")
        fake.fail_next(1, status=400)  # not retried by the SDK: the queue retries
        with pytest.raises(ProcessingError):
            mem.wait(timeout=2.0)
        ((run_after, error),) = rows(pg_url, "SELECT run_after, last_error FROM jobs")
        assert run_after > time.time() + 20 and error
        # The user's wake-up is due when the backoff ends, not before.
        ((scheduled,),) = rows(
            pg_url,
            "SELECT extract(epoch FROM scheduled_at) FROM procrastinate_jobs WHERE status = 'todo'",
        )
        assert abs(float(scheduled) - run_after) < 0.01
        # A later message of the user waits behind the failing one (per-user order).
        _say(s, "I ordered parcel two for my sister.")
        assert rows(pg_url, "SELECT count(*) FROM procrastinate_jobs WHERE status = 'todo'") == [
            (1,)
        ]
        # Backoff over: making the job due brings its wake-up forward (the trigger).
        execute(pg_url, "UPDATE jobs SET run_after = 0 WHERE status = 'queued'")
        assert rows(
            pg_url, "SELECT scheduled_at FROM procrastinate_jobs WHERE status = 'todo'"
        ) == [(None,)]
        fake.fail_next(1, status=400)
        # Both jobs are now due, but the one that failed is retried alone: its second
        # attempt fails for good, and the later job, which did not fail, goes through.
        mem.wait(timeout=30)
        assert rows(pg_url, "SELECT status, attempts FROM messages ORDER BY pk") == [
            ("failed", 2),
            ("processed", 1),
        ]
        assert mem.retry_failed() == 1
        mem.wait(timeout=30)
    assert rows(pg_url, "SELECT status FROM messages ORDER BY pk") == [
        ("processed",),
        ("processed",),
    ]


def test_waiting_without_workers_processes_here_unless_a_worker_is_alive(
    pg_url: str, open_memory: Callable[..., Memory]
) -> None:
    mem = open_memory(workers=0)
    s = mem.sessions.create(user_id="u1")
    _say(s, "I ordered parcel one for my sister.")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("SELECT procrastinate_register_worker_v1()")  # alive, heartbeat now
    with pytest.raises(ProcessingError, match="timed out"):
        mem.wait(timeout=1.0)  # left to the live worker
    assert rows(pg_url, "SELECT status FROM messages") == [("pending",)]
    execute(pg_url, "DELETE FROM procrastinate_workers")
    mem.wait(timeout=30)  # no worker anywhere: done by the waiting caller
    assert rows(pg_url, "SELECT status FROM messages") == [("processed",)]
    result = s.add_messages([{"role": "user", "content": "I ordered parcel two."}], sync=True)
    assert result.processed


def test_during_an_outage_wake_ups_wait_for_its_probe_and_its_end_wakes_everyone(
    pg_url: str, open_memory: Callable[..., Memory]
) -> None:
    mem = open_memory(workers=0)
    store: Any = mem.store
    [outage] = store.record_outage("llm m", "HTTP 503", lambda n: 60.0, probe=False)
    _say(mem.sessions.create(user_id="u1"), "I ordered parcel one for my sister.")
    # Nothing is claimed before the probe: the user's wake-up is due then, not now.
    ((scheduled,),) = rows(
        pg_url, "SELECT extract(epoch FROM scheduled_at) FROM procrastinate_jobs"
    )
    assert abs(float(scheduled) - outage.next_probe) < 0.01
    assert store.claim_user_batch("default", "u1", "run-a", 256) is None
    # The outage ended (a probe went through elsewhere): the wake-up is due at once.
    assert [o.service for o in store.end_outage()] == ["llm m"]
    assert store.wake_all() == 1
    assert rows(pg_url, "SELECT scheduled_at FROM procrastinate_jobs") == [(None,)]
    mem.wait(timeout=30)
    assert rows(pg_url, "SELECT status, attempts FROM messages") == [("processed", 1)]


def test_jobs_without_a_wake_up_are_found_and_woken(
    pg_url: str, open_memory: Callable[..., Memory]
) -> None:
    writer = open_memory(workers=0)
    s = writer.sessions.create(user_id="u1")
    _say(s, "I ordered parcel one for my sister.")
    execute(pg_url, "DELETE FROM procrastinate_jobs")  # lost by hand
    worker = open_memory(workers=1)
    worker.wait(timeout=30)
    assert rows(pg_url, "SELECT status FROM messages") == [("processed",)]


def test_procrastinate_schema_is_installed_once_and_upgraded_by_its_migrations(
    pg_url: str, open_memory: Callable[..., Memory]
) -> None:
    mem = open_memory(workers=0)
    schema, migrations = _procrastinate_schema()
    assert rows(pg_url, "SELECT value FROM meta WHERE key = 'procrastinate_schema'") == [
        (migrations[-1][0],)
    ]
    open_memory(workers=0)  # a second process: nothing to do, nothing redone
    store: Any = mem.store
    upgrade = (*migrations, ("99.00.00_01_probe.sql", "CREATE TABLE upgrade_probe (x int)"))
    store.install_dispatch(schema, upgrade)
    store.install_dispatch(schema, upgrade)  # applied once
    assert rows(pg_url, "SELECT value FROM meta WHERE key = 'procrastinate_schema'") == [
        ("99.00.00_01_probe.sql",)
    ]
    assert rows(pg_url, "SELECT count(*) FROM upgrade_probe") == [(0,)]


def test_a_worker_whose_queue_fails_starts_again(
    pg_url: str, open_memory: Callable[..., Memory], caplog: pytest.LogCaptureFixture
) -> None:
    mem = open_memory(workers=1, job_lease_seconds=1.5)  # heartbeats every 0.5 s
    s = mem.sessions.create(user_id="u1")
    # procrastinate stops its worker when a heartbeat fails (the database went away).
    execute(pg_url, "ALTER FUNCTION procrastinate_update_heartbeat_v1(bigint) RENAME TO hb_off")
    deadline = time.monotonic() + 30
    while "restarting" not in caplog.text:
        assert time.monotonic() < deadline, "the worker never noticed"
        time.sleep(0.1)
    execute(pg_url, "ALTER FUNCTION hb_off(bigint) RENAME TO procrastinate_update_heartbeat_v1")
    _say(s, "I ordered parcel one for my sister.")
    deadline = time.monotonic() + 60
    while rows(pg_url, "SELECT status FROM messages") != [("processed",)]:
        assert time.monotonic() < deadline, "nothing processed the message"
        time.sleep(0.1)
    assert mem._engine.queue.running


def test_a_caller_without_workers_does_its_own_work_not_everyones(
    pg_url: str, open_memory: Callable[..., Memory]
) -> None:
    mem = open_memory(workers=0)
    first = mem.sessions.create(user_id="first")
    message = {"id": "m-first", "role": "user", "content": "I ordered parcel one for my sister."}
    first.add_messages([message])
    for k in range(30):
        _say(mem.sessions.create(user_id=f"later{k}"), f"I ordered parcel {k} for my sister.")
    # Sent again with sync: waits for that message's processing, which comes first in line.
    assert first.add_messages([message], sync=True).processed
    assert rows(pg_url, "SELECT status FROM messages WHERE id = 'm-first'") == [("processed",)]
    pending = rows(pg_url, "SELECT count(*) FROM messages WHERE status = 'pending'")[0][0]
    assert pending >= 25  # the other users' messages are left to a worker (or a wait())
    mem.wait(timeout=60)
    assert rows(pg_url, "SELECT count(*) FROM messages WHERE status = 'pending'") == [(0,)]


def test_closing_during_a_sweep_ends_the_sweeps_connection(
    pg_url: str, open_memory: Callable[..., Memory]
) -> None:
    writer = open_memory(workers=0)
    _say(writer.sessions.create(user_id="u1"), "I ordered parcel one for my sister.")
    writer.close()
    # A wake-up running under no worker: the first sweep ends it, and here it waits for the
    # row this test holds (the failure seen: the sweep's connection left idle in a
    # transaction, holding its locks, long after close).
    execute(pg_url, "UPDATE procrastinate_jobs SET status = 'doing'")
    before = sessions(pg_url)
    with psycopg.connect(pg_url) as holder:
        holder.execute("SELECT id FROM procrastinate_jobs FOR UPDATE")
        mem = open_memory(workers=1)
        await_lock_wait(pg_url, "%procrastinate_finish_job%")
        mem.close(timeout=10)
        assert sessions_left(pg_url, before) == {}
        holder.rollback()


def test_closing_during_a_batch_ends_every_connection_and_the_batch_is_redone(
    pg_url: str, open_memory: Callable[..., Memory]
) -> None:
    before = sessions(pg_url)
    mem = open_memory(workers=1)
    s = mem.sessions.create(user_id="u1")
    with psycopg.connect(pg_url) as holder:
        holder.execute("LOCK TABLE facts")
        _say(s, "I ordered parcel one for my sister.")
        await_lock_wait(pg_url, "INSERT INTO facts%")  # the worker commits the batch
        mem.close(timeout=1)  # not enough: the batch is cut short
        assert sessions_left(pg_url, before) == {}
        holder.rollback()
    assert rows(pg_url, "SELECT status, attempts FROM messages") == [("pending", 1)]
    # The batch's run stays with the closed worker, silent from now on: once its lease
    # is over another worker ends it and takes the batch over.
    worker = open_memory(workers=1, job_lease_seconds=1.0)
    worker.wait(timeout=60)
    assert rows(pg_url, "SELECT status, attempts FROM messages") == [("processed", 2)]
