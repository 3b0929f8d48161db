"""Durable ingestion: idempotency, status, retries with backoff, and nothing lost on exit."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import dbsql
from fakes.openai_server import FakeOpenAIServer
from stratamem import Memory, ProcessingError
from stratamem.embed.openai import OpenAIEmbedder
from stratamem.store.sqlite import sqlite_path


def _msg(i: int, **extra: Any) -> dict[str, Any]:
    return {"role": "user", "content": f"message number {i} about Berlin", **extra}


def _rows(url: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    return dbsql.rows(url, sql, *args)


def test_accepted_messages_are_durable_and_pending_before_processing(
    make_memory: Any, db_url: str
) -> None:
    mem = make_memory(workers=0)
    s = mem.sessions.create(user_id="u1")
    result = s.add_messages([_msg(1), _msg(2)])
    assert result.job_id is not None and not result.processed
    # Committed at return: another connection sees both messages and their job.
    assert _rows(db_url, "SELECT status FROM messages") == [("pending",), ("pending",)]
    assert _rows(db_url, "SELECT status, size FROM jobs") == [("queued", 2)]
    # Full text sees them at once; vectors come with processing.
    assert mem.search("number 2", user_id="u1")[0].id == result.message_ids[1]
    mem.wait()
    assert {m.status for m in s.messages()} == {"processed"}
    assert _rows(db_url, "SELECT count(*) FROM vectors") == [(2,)]


def test_sync_returns_after_processing(mem: Memory) -> None:
    s = mem.sessions.create(user_id="u1")
    result = s.add_messages([_msg(1)], sync=True)
    assert result.processed
    m = mem.messages.get(result.message_ids[0])
    assert m.status == "processed" and m.processed_at is not None and m.attempts == 1


def test_resend_with_same_ids_is_not_a_duplicate(mem: Memory, db_url: str) -> None:
    s = mem.sessions.create(user_id="u1")
    batch = [_msg(i, id=f"client-{i}") for i in range(5)]
    first = s.add_messages(batch, sync=True)
    again = s.add_messages(batch, sync=True)
    assert again.duplicates == first.message_ids and again.job_id is None
    mixed = s.add_messages([*batch[:2], _msg(9, id="client-9")], sync=True)
    assert mixed.duplicates == ["client-0", "client-1"]
    assert _rows(db_url, "SELECT count(*) FROM messages") == [(6,)]
    assert _rows(db_url, "SELECT count(*) FROM jobs") == [(2,)]
    assert _rows(db_url, "SELECT max(attempts) FROM messages") == [(1,)]


def test_behaviour_events_are_stored_and_searchable(mem: Memory) -> None:
    s = mem.sessions.create(user_id="u1")
    s.add_messages(
        [
            {
                "role": "user",
                "content": "light running shoes",
                "event_type": "search",
                "page": "/shop/search",
                "metadata": {"results": 12},
            },
            {
                "role": "user",
                "content": "Asics Gel-Kayano",
                "event_type": "click",
                "page": "/shop/product/asics",
            },
        ],
        sync=True,
    )
    hits = mem.search("running shoes", user_id="u1", layers=["message"])
    assert hits[0].text == "light running shoes" and hits[0].event_type == "search"
    assert hits[0].metadata == {"results": 12}
    clicks = mem.search("Asics", user_id="u1", event_types=["click"])
    assert [h.event_type for h in clicks] == ["click"]
    stored = mem.messages.list(user_id="u1")
    assert stored[1].page == "/shop/product/asics"


@pytest.fixture
def fake() -> Any:
    with FakeOpenAIServer(dim=16) as server:
        yield server


def _openai(fake: FakeOpenAIServer) -> OpenAIEmbedder:
    # No SDK retries: the job queue's own retry is what is under test.
    return OpenAIEmbedder(
        "fake-embed", base_url=fake.base_url, api_key="k", max_retries=0, timeout=5
    )


def test_a_refused_embedding_request_is_retried_with_backoff(make_memory: Any, fake: Any) -> None:
    mem = make_memory(embedder=_openai(fake), job_backoff_seconds=0.2, job_max_attempts=5)
    s = mem.sessions.create(user_id="u1")
    fake.fail_next(2, status=400)  # about the request: each failure is an attempt
    started = time.monotonic()
    result = s.add_messages([_msg(1), _msg(2)], sync=True)
    elapsed = time.monotonic() - started
    assert result.processed
    m = mem.messages.get(result.message_ids[0])
    assert m.status == "processed" and m.error is None and m.attempts == 3
    # two backoffs: ~0.2 s then ~0.4 s (+-20% jitter)
    assert elapsed >= 0.45


@pytest.mark.parametrize("fault", ["down", "malformed"])
def test_an_embedding_outage_pauses_processing_and_costs_no_attempt(
    make_memory: Any, fake: Any, fault: str
) -> None:
    mem = make_memory(embedder=_openai(fake), outage_backoff_seconds=0.05, job_max_attempts=1)
    s = mem.sessions.create(user_id="u1")
    if fault == "down":
        fake.fail_next(3, status=503)
    else:
        fake.respond_raw_next(b"{not json")  # not an embeddings response at all
    result = s.add_messages([_msg(1)], sync=True)
    m = mem.messages.get(result.message_ids[0])
    assert m.status == "processed" and m.error is None and m.attempts == 1


def test_permanent_failure_marks_messages_failed_and_can_be_retried(
    make_memory: Any, fake: Any
) -> None:
    mem = make_memory(embedder=_openai(fake), job_backoff_seconds=0.05, job_max_attempts=3)
    s = mem.sessions.create(user_id="u1")
    fake.fail_next(3, status=422)
    with pytest.raises(ProcessingError, match="failed for good after 3 attempts"):
        s.add_messages([_msg(1), _msg(2)], sync=True)
    failed = s.messages(status="failed")
    assert len(failed) == 2 and "422" in (failed[0].error or "")
    # The content is intact and still searchable by full text.
    assert mem.search("number 2", user_id="u1")[0].text == _msg(2)["content"]
    assert mem.retry_failed() == 1
    mem.wait(timeout=30)
    assert {m.status for m in s.messages()} == {"processed"}


def test_a_failed_user_does_not_block_others(make_memory: Any, fake: Any) -> None:
    mem = make_memory(embedder=_openai(fake), job_backoff_seconds=5.0, job_max_attempts=3)
    a = mem.sessions.create(user_id="a")
    b = mem.sessions.create(user_id="b")
    fake.fail_next(1, status=400)
    a.add_messages([_msg(1)])  # fails once, then waits ~5 s for its retry
    time.sleep(0.3)
    b.add_messages([_msg(2)], sync=True)  # processed meanwhile
    assert a.messages()[0].status == "pending" and "400" in (a.messages()[0].error or "")


def test_per_user_order_with_concurrent_workers(make_memory: Any, db_url: str) -> None:
    mem = make_memory(workers=3, batch_max_messages=1)
    sessions = [mem.sessions.create(user_id=f"u{i}") for i in range(3)]
    for n in range(15):
        for s in sessions:
            s.add_messages([_msg(n)])
    mem.wait(timeout=60)
    for s in sessions:
        done = _rows(
            db_url,
            "SELECT id, finished_at FROM jobs WHERE user_id = ? ORDER BY id",
            s.user_id,
        )
        finished = [f for _, f in done]
        assert len(finished) == 15 and finished == sorted(finished)


def test_wait_without_worker_threads_processes_in_caller(make_memory: Any) -> None:
    mem = make_memory(workers=0)
    s = mem.sessions.create(user_id="u1")
    s.add_messages([_msg(i) for i in range(10)])
    s.add_messages([_msg(i) for i in range(10, 20)], sync=True)
    mem.wait()
    assert len(s.messages(status="processed")) == 20


def test_wait_times_out_with_a_clear_error(make_memory: Any, fake: Any) -> None:
    mem = make_memory(embedder=_openai(fake), job_backoff_seconds=30)
    s = mem.sessions.create(user_id="u1")
    fake.fail_next(1)
    s.add_messages([_msg(1)])
    with pytest.raises(ProcessingError, match=r"timed out after 0.5s .* stored"):
        mem.wait(timeout=0.5)


def test_concurrent_writer_threads(make_memory: Any, db_url: str) -> None:
    shared = make_memory()
    errors: list[BaseException] = []

    def writer(k: int) -> None:
        try:
            own = Memory(db_url, embedder="hash", workers=0) if k % 2 else shared
            s = own.sessions.create(user_id=f"t{k}")
            for n in range(20):
                s.add_messages([_msg(n, id=f"t{k}-{n}"), _msg(n + 100, id=f"t{k}-{n + 100}")])
            if own is not shared:
                own.close()
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    shared.wait(timeout=60)
    assert _rows(db_url, "SELECT count(*), count(DISTINCT id) FROM messages") == [(240, 240)]
    assert _rows(db_url, "SELECT status, count(*) FROM messages GROUP BY status") == [
        ("processed", 240)
    ]


_WRITER = textwrap.dedent(
    """
    import sys
    from stratamem import Memory
    url, k = sys.argv[1], int(sys.argv[2])
    with Memory(url, embedder="hash") as mem:
        s = mem.sessions.create(user_id=f"p{k}", session_id=f"p{k}")
        for n in range(40):
            msg = {"role": "user", "content": f"process {k} says {n}", "id": f"p{k}-{n}"}
            s.add_messages([msg])
            if n % 10 == 0:   # some to a user every process shares
                shared = mem.sessions.create(user_id="shared", session_id=f"shared-{k}")
                shared.add_messages([{"role": "user", "content": f"shared {k} {n}"}])
    """
)


@pytest.mark.slow
def test_concurrent_writer_processes(db_url: str, make_memory: Any) -> None:
    make_memory(workers=0).close()  # create the schema once, as an app would
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, db_url, str(k)]) for k in range(3)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    assert _rows(db_url, "SELECT count(*), count(DISTINCT id) FROM messages") == [(132, 132)]
    mem = make_memory()
    mem.wait(timeout=60)
    assert _rows(db_url, "SELECT status, count(*) FROM messages GROUP BY status") == [
        ("processed", 132)
    ]
    # Each process's messages kept their order.
    for k in range(3):
        ids = [
            r[0]
            for r in _rows(db_url, "SELECT id FROM messages WHERE user_id = ? ORDER BY pk", f"p{k}")
        ]
        assert ids == [f"p{k}-{n}" for n in range(40)]


_EXITER = textwrap.dedent(
    """
    import os, sys
    from stratamem import Memory
    url, how = sys.argv[1], sys.argv[2]
    mem = Memory(url, embedder="hash")
    s = mem.sessions.create(user_id="u1", session_id="s1")
    for n in range(20):
        s.add_messages([{"role": "user", "content": f"note {n}"}])
    if how == "hard":
        os._exit(0)   # no atexit, no close: as if the process were killed
    # "soft": fall off the end without close(); atexit finishes the queued work
    """
)


@pytest.mark.parametrize("how", ["soft", "hard"])
def test_short_script_loses_nothing_on_exit(db_url: str, make_memory: Any, how: str) -> None:
    # A short lease so that the dead process's in-flight job is reclaimed quickly.
    env = {**os.environ, "STRATAMEM_JOB_LEASE_SECONDS": "1"}
    subprocess.run([sys.executable, "-c", _EXITER, db_url, how], check=True, timeout=120, env=env)
    statuses = dict(_rows(db_url, "SELECT status, count(*) FROM messages GROUP BY status"))
    assert sum(statuses.values()) == 20
    if how == "soft":
        assert statuses == {"processed": 20}
    mem = make_memory()
    mem.wait(timeout=60)
    assert _rows(db_url, "SELECT status, count(*) FROM messages GROUP BY status") == [
        ("processed", 20)
    ]
    if not dbsql.is_postgres(db_url):
        assert Path(sqlite_path(db_url)).exists()
