"""Scale-out on loopback, every part a real process: two API replicas (``stratamem serve
--no-worker``) and three workers (``stratamem worker``) on one fresh PostgreSQL database.
Twelve users write through both APIs at once; one worker is SIGKILLed while it holds a
batch. Afterwards:

* every accepted message is stored, once, and processed: one vector and exactly one fact
  per message (a batch applied twice would leave two);
* each user's facts follow the order the user's messages were accepted in;
* no user's jobs were ever held by two runs at once, and every job was completed once: a
  trigger installed by the test records each change of a job's state and holder, in commit
  order for the user (claims and completions of one user are serialised by its locks).

The workers' embedder is a fake OpenAI server in this process, so the test can hold every
embedding call at a gate: the victim is killed while it provably holds claimed jobs.
"""

from __future__ import annotations

import os
import random
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
import pytest

from conftest import POSTGRES_URL
from dbsql import execute, rows
from fakes.openai_server import FakeOpenAIServer
from server_proc import KEY_RE, free_port
from stratamem.store import open_store

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

USERS = 12
MESSAGES_PER_USER = 40
WRITERS = 6
LEASE_SECONDS = "4"  # a dead worker's run is taken over this long after its last heartbeat

AUDIT_SQL = """
CREATE TABLE job_audit (
    seq        bigserial PRIMARY KEY,
    job_id     bigint NOT NULL,
    user_id    text NOT NULL,
    old_status text NOT NULL,
    new_status text NOT NULL,
    old_holder text,
    new_holder text,
    -- One UPDATE changes several jobs in no set order: the checker reads a transaction's
    -- rows together (takeovers and releases before claims).
    txid       bigint NOT NULL DEFAULT txid_current()
);
CREATE FUNCTION job_audit_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status IS DISTINCT FROM NEW.status OR OLD.locked_by IS DISTINCT FROM NEW.locked_by
    THEN
        INSERT INTO job_audit (job_id, user_id, old_status, new_status, old_holder, new_holder)
        VALUES (NEW.id, NEW.user_id, OLD.status, NEW.status, OLD.locked_by, NEW.locked_by);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER job_audit AFTER UPDATE ON jobs
    FOR EACH ROW EXECUTE FUNCTION job_audit_row();
"""


@pytest.fixture
def fresh_database() -> Iterator[str]:
    if not POSTGRES_URL:
        pytest.skip("needs STRATAMEM_TEST_POSTGRES_URL (see README: Tests)")
    name = f"stratamem_scale_{secrets.token_hex(4)}"
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = urlunsplit(urlsplit(POSTGRES_URL)._replace(path=f"/{name}"))
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        yield url
    finally:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class Fleet:
    """The processes of the test, their output in files under ``workdir``."""

    def __init__(self, workdir: Path, db_url: str, embed_url: str) -> None:
        self.workdir = workdir
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("STRATAMEM_")}
        self.env.update(
            {
                "STRATAMEM_DATABASE_URL": db_url,
                "STRATAMEM_EMBEDDER": "openai:fake-embed",
                "STRATAMEM_EMBEDDER_BASE_URL": embed_url,
                "STRATAMEM_EMBEDDER_API_KEY": "k",
                "STRATAMEM_JOB_LEASE_SECONDS": LEASE_SECONDS,
            }
        )
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        with open(self.workdir / f"{name}.out", "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "stratamem", *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
            )
        self.procs[name] = proc
        return proc

    def output(self, name: str) -> str:
        return (self.workdir / f"{name}.out").read_text(encoding="utf-8", errors="replace")

    def api(self, name: str) -> str:
        port = free_port()
        self.spawn(name, "serve", "--no-worker", "--port", str(port))
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.procs[name].poll() is not None:
                raise AssertionError(f"{name} exited:\n{self.output(name)}")
            try:
                if httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200:
                    return url
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"{name} did not come up:\n{self.output(name)}")

    def stop(self, name: str) -> int:
        proc = self.procs[name]
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        return int(proc.returncode)

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def _write(
    apis: list[str], key: str, users: list[str], accepted: dict[str, list[str]], seed: int
) -> None:
    """One writer: its users' messages in order, in posts of 1-3, the users interleaved and
    the replicas alternating; each user's last post with ``sync: true`` (the replica has no
    worker: it waits for the fleet)."""
    rng = random.Random(seed)
    posts: dict[str, list[list[int]]] = {}
    for user in users:
        posts[user], i = [], 0
        while i < MESSAGES_PER_USER:
            n = rng.choice((1, 1, 2, 3))
            posts[user].append(list(range(i, min(i + n, MESSAGES_PER_USER))))
            i += n
    clients = [httpx.Client(base_url=u, timeout=60.0) for u in apis]
    headers = {"Authorization": f"Api-Key {key}"}
    try:
        while any(posts.values()):
            for user in users:
                if not posts[user]:
                    continue
                numbers = posts[user].pop(0)
                last = not posts[user]
                body = {
                    "user_id": user,
                    "sync": last,
                    "messages": [
                        {
                            "id": f"{user}-{i:03d}",
                            "role": "user",
                            "content": f"I ordered parcel {user}x{i:03d} for my sister.",
                        }
                        for i in numbers
                    ],
                }
                client = clients[(numbers[0] + int(user[1:])) % len(clients)]
                for attempt in range(5):  # the same ids again: a resend is a no-op
                    try:
                        r = client.post(
                            f"/api/sessions/s-{user}/messages", json=body, headers=headers
                        )
                    except httpx.TransportError:
                        time.sleep(0.2 * (attempt + 1))
                        continue
                    if r.status_code < 500:
                        break
                    time.sleep(0.2 * (attempt + 1))
                assert r.status_code == 200, r.text
                data = r.json()["data"]
                accepted[user].extend(data["message_ids"])
                if last:
                    assert data["processed"] is True, data
                time.sleep(0.02)
    finally:
        for c in clients:
            c.close()


def _victim_holds(db_url: str, pid: int) -> list[int]:
    return [
        jid
        for jid, holder in rows(db_url, "SELECT id, locked_by FROM jobs WHERE status = 'running'")
        if holder and f":{pid}:" in holder
    ]


def test_two_apis_three_workers_one_killed(fresh_database: str, tmp_path: Path) -> None:
    db_url = fresh_database
    open_store(db_url).close()  # stratamem's tables, so that the audit can be attached
    execute(db_url, AUDIT_SQL)
    users = [f"u{k:02d}" for k in range(USERS)]
    accepted: dict[str, list[str]] = defaultdict(list)
    with FakeOpenAIServer(dim=16) as embed:
        fleet = Fleet(tmp_path, db_url, embed.base_url)
        try:
            api_a = fleet.api("api-a")
            key = KEY_RE.findall(fleet.output("api-a"))[0]  # bootstrap key of project default
            api_b = fleet.api("api-b")
            workers = [fleet.spawn(f"worker-{k}", "worker", "--threads", "2") for k in range(3)]
            victim = workers[0]
            writers = [
                threading.Thread(
                    target=_write,
                    args=([api_a, api_b], key, users[w::WRITERS], accepted, w),
                    name=f"writer-{w}",
                )
                for w in range(WRITERS)
            ]
            for t in writers:
                t.start()

            # Mid-run: hold every embedding call, wait until the victim holds claimed jobs
            # (it is then inside a batch), kill it, let the others go on.
            deadline = time.monotonic() + 60
            while sum(map(len, accepted.values())) < USERS * MESSAGES_PER_USER // 3:
                assert time.monotonic() < deadline, "writers made no progress"
                time.sleep(0.05)
            embed.hold.clear()
            deadline = time.monotonic() + 60
            while not (held := _victim_holds(db_url, victim.pid)):
                assert time.monotonic() < deadline, fleet.output("worker-0")
                time.sleep(0.02)
            victim.send_signal(signal.SIGKILL)
            victim.wait(10)
            embed.hold.set()

            for t in writers:
                t.join(150)
                assert not t.is_alive(), f"{t.name} did not finish"
            deadline = time.monotonic() + 90
            while rows(db_url, "SELECT count(*) FROM jobs WHERE status <> 'done'") != [(0,)]:
                assert time.monotonic() < deadline, rows(
                    db_url,
                    "SELECT id, status, locked_by, last_error FROM jobs WHERE status <> 'done'",
                )
                time.sleep(0.2)
            for name in ("worker-1", "worker-2"):
                assert fleet.stop(name) == 0, fleet.output(name)
            for name in ("api-a", "api-b"):
                fleet.stop(name)
        finally:
            embed.hold.set()
            fleet.close()

    _check_messages(db_url, users, accepted)
    _check_facts(db_url, users)
    _check_audit(db_url, victim.pid, held)


def _check_messages(db_url: str, users: list[str], accepted: dict[str, list[str]]) -> None:
    expected = {f"{u}-{i:03d}" for u in users for i in range(MESSAGES_PER_USER)}
    assert {m for ids in accepted.values() for m in ids} == expected
    stored = rows(db_url, "SELECT id, status FROM messages")
    assert len(stored) == len(expected)
    assert {m for m, _ in stored} == expected
    assert {s for _, s in stored} == {"processed"}
    assert rows(
        db_url, "SELECT count(*), count(DISTINCT item_pk) FROM vectors WHERE kind = 'message'"
    ) == [(len(expected), len(expected))]


def _check_facts(db_url: str, users: list[str]) -> None:
    marker = re.compile(r"\b(u\d\dx\d{3})\b")
    for user in users:
        facts = rows(
            db_url, "SELECT text, message_ids FROM facts WHERE user_id = ? ORDER BY pk", user
        )
        found = [(marker.findall(text), list(ids)) for text, ids in facts]
        # One fact per message, from that message alone, in the user's message order.
        assert found == [
            ([f"{user}x{i:03d}"], [f"{user}-{i:03d}"]) for i in range(MESSAGES_PER_USER)
        ], user


def _check_audit(db_url: str, victim_pid: int, held: list[int]) -> None:
    by_transaction: dict[int, list[tuple[Any, ...]]] = {}
    for txid, *change in rows(
        db_url,
        "SELECT txid, job_id, user_id, old_status, new_status, old_holder, new_holder "
        "FROM job_audit ORDER BY seq",
    ):
        by_transaction.setdefault(txid, []).append(tuple(change))
    # A user's transactions are serialised by its lock, so their order is the rows' order;
    # within one, what a job let go of comes before what another job took.
    audit = [
        change
        for changes in by_transaction.values()
        for change in sorted(changes, key=lambda c: c[2] != "running")
    ]
    holding: dict[str, dict[str, set[int]]] = defaultdict(lambda: defaultdict(set))
    completed: dict[int, int] = defaultdict(int)
    fenced: set[str] = set()
    taken_over: set[int] = set()
    for job, user, old, new, old_holder, new_holder in audit:
        if old == "running" and new == "running" and old_holder != new_holder:
            # A takeover: the user's next run found the job held by a dead run, which is
            # fenced off from then on (its commit would fail the holder check).
            assert f":{victim_pid}:" in old_holder, f"a live run was taken over: {old_holder}"
            fenced.add(old_holder)
            holding[user].pop(old_holder, None)
            taken_over.add(job)
        elif old == "running" and old_holder:
            assert old_holder not in fenced, f"fenced run {old_holder} finished job {job}"
            holding[user][old_holder].discard(job)
        if new == "running":
            others = {h for h, jobs in holding[user].items() if jobs and h != new_holder}
            assert not others, f"{user}: {new_holder} claimed job {job} while {others} held jobs"
            holding[user][new_holder].add(job)
        if new == "done":
            completed[job] += 1
    assert set(completed.values()) == {1}
    assert len(completed) == rows(db_url, "SELECT count(*) FROM jobs")[0][0]
    # The victim's jobs were taken over by another run, which completed them.
    assert set(held) <= taken_over
    for jid, attempts in rows(db_url, "SELECT id, attempts FROM jobs"):
        if jid in held:
            assert attempts >= 2
