"""A worker process killed with SIGKILL mid-job: its job is reclaimed, nothing is lost or
processed twice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from dbsql import rows as _rows
from fakes.openai_server import FakeOpenAIServer
from stratamem import Memory
from stratamem.embed import make_embedder
from stratamem.store import LeaseLostError, open_store


def _worker(db_url: str, base_url: str, *extra: str) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "STRATAMEM_DATABASE_URL": db_url,
        "STRATAMEM_EMBEDDER": "openai:fake-embed",
        "STRATAMEM_EMBEDDER_BASE_URL": base_url,
        "STRATAMEM_EMBEDDER_API_KEY": "k",
        "STRATAMEM_JOB_LEASE_SECONDS": "2",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "stratamem.cli", "worker", *extra],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


@pytest.mark.slow
def test_sigkilled_worker_job_is_reclaimed_and_processed_exactly_once(db_url: str) -> None:
    with FakeOpenAIServer(dim=8) as fake:
        mem = Memory(
            db_url,
            embedder="openai:fake-embed",
            embedder_base_url=fake.base_url,
            embedder_api_key="k",
            workers=0,
        )
        users = {u: mem.sessions.create(user_id=u) for u in ("alice", "bob")}
        for n in range(3):  # three jobs per user, accepted in this order
            for u, s in users.items():
                s.add_messages([{"role": "user", "content": f"{u} note {n}.{k}"} for k in range(4)])
        mem.close()

        fake.hold.clear()  # embedding requests now block at the gate: the job is mid-flight
        victim = _worker(db_url, fake.base_url)
        assert fake.held.wait(30), "the worker never reached the embedding call"
        running = _rows(db_url, "SELECT id, user_id FROM jobs WHERE status = 'running'")
        assert len(running) >= 1
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        assert victim.returncode == -signal.SIGKILL
        assert _rows(db_url, "SELECT count(*) FROM messages WHERE status = 'processed'") == [(0,)]
        fake.hold.set()

        # A new worker waits out the dead one's lease (2 s), then takes over.
        rescuer = _worker(db_url, fake.base_url, "--exit-when-idle")
        out, _ = rescuer.communicate(timeout=120)
        assert rescuer.returncode == 0, out.decode()

    assert _rows(db_url, "SELECT status, count(*) FROM messages GROUP BY status") == [
        ("processed", 24)
    ]
    assert _rows(db_url, "SELECT status, count(*) FROM jobs GROUP BY status") == [("done", 6)]
    # Exactly one vector per message, and the killed batch was claimed twice, no more.
    assert _rows(db_url, "SELECT count(*), count(DISTINCT item_pk) FROM vectors") == [(24, 24)]
    killed = {jid for jid, _ in running}
    for jid, attempts in _rows(db_url, "SELECT id, attempts FROM jobs"):
        assert attempts == (2 if jid in killed else 1)
    # Each user's jobs still finished in acceptance order.
    for user in ("alice", "bob"):
        finished = [
            r[0]
            for r in _rows(
                db_url, "SELECT finished_at FROM jobs WHERE user_id = ? ORDER BY id", user
            )
        ]
        assert finished == sorted(finished)


def test_a_worker_that_lost_its_lease_cannot_commit(db_url: str) -> None:
    with Memory(db_url, embedder="hash", workers=0) as mem:
        mem.sessions.create(user_id="u1", session_id="s1").add_messages(
            [{"role": "user", "content": "hello"}]
        )
    store = open_store(db_url)
    embedder = make_embedder("hash")
    try:
        slow = store.claim_batch("slow-worker", lease_seconds=0.6, max_messages=10)
        assert slow is not None
        assert store.claim_batch("other", lease_seconds=30, max_messages=10) is None  # held
        time.sleep(0.7)
        fast = store.claim_batch("fast-worker", lease_seconds=30, max_messages=10)
        assert fast is not None and fast.job_ids == slow.job_ids
        assert fast.job_attempts == {fast.job_ids[0]: 2}
        vectors = embedder.embed([m.content for m in slow.messages])
        with pytest.raises(LeaseLostError):
            store.complete_batch(slow, embedder=embedder.id, vectors=vectors)
        with pytest.raises(LeaseLostError):
            store.fail_batch(slow, "late failure", retry_at=None)
        assert not store.extend_lease(slow.job_ids, "slow-worker", 30)
        store.complete_batch(fast, embedder=embedder.id, vectors=np.asarray(vectors))
    finally:
        store.close()
    assert _rows(db_url, "SELECT status, attempts FROM messages") == [("processed", 2)]
    assert _rows(db_url, "SELECT count(*) FROM vectors") == [(1,)]
