"""The fault matrix: cases that break one part of a stratamem deployment on purpose and count
what survived. Used by ``bench/faults.py`` (the whole matrix, full size) and by
``tests/test_faults.py`` (a bounded subset); nothing here is a test by itself.

Every part is real: ``stratamem serve`` and ``stratamem worker`` processes, SQLite files,
PostgreSQL databases (a private cluster of our own when a case restarts the server), the
OpenAI SDK against the fake servers of ``tests/fakes``. A case returns a :class:`Row`: the
counts (accepted, stored, processed, failed, duplicated), the time to recover, and the
:class:`Check` list that decides its verdict, each criterion stated with what was measured.

How the counts are made:

* **accepted** — messages the clients were told are stored: a 2xx answer (HTTP) or a
  return without an exception (Python). Clients give every message its own id and a content
  naming that id, and resend a post that failed (transport error, 5xx) with the same ids.
* **stored** — accepted messages found in the store, by id (captured exchanges, whose ids
  the engine makes: by content). ``lost`` = accepted - stored.
* **processed** / **failed** — of the accepted messages, those whose status says so.
* **duplicated** — stored rows beyond one per attempted message (same content twice, or a
  row of content no client attempted under that id), message vectors beyond one per
  message, and facts beyond one per (user, text, source messages): a batch applied twice.
* **time to recover** — from the end of the fault (process restarted, PostgreSQL back, the
  model answering again) until every message accepted before that moment is processed.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, ParamSpec

import httpx

# Run as a script (the child processes below), tests/ must be importable as it is in pytest.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from dbsql import is_postgres, rows
from fakes.memory_model import MemoryModel
from fakes.openai_server import FakeOpenAIServer
from fakes.webhook_receiver import WebhookReceiver
from server_proc import ServerProcess, free_port
from stratamem import Memory
from stratamem.config import load_settings

P = ParamSpec("P")

__all__ = [
    "Check",
    "Ledger",
    "PrivateCluster",
    "Row",
    "capture_close",
    "capture_exit",
    "llm_fault",
    "postgres_restart",
    "serve_sigkill",
    "sqlite_processes",
    "webhook_receiver_fault",
    "worker_sigkill",
]

EMBEDDER = "openai:fake-embed"
# A dead process's batch is taken over this long after its last heartbeat (default 30 s).
LEASE_SECONDS = 3.0
# Short retry and probe settings for the LLM cases that must fit in seconds (the full outage
# case runs with the defaults).
SHORT_BACKOFF: dict[str, Any] = {
    "job_backoff_seconds": 0.2,
    "job_backoff_max_seconds": 1.0,
    "outage_backoff_seconds": 0.2,
    "outage_backoff_max_seconds": 1.0,
    "job_max_attempts": 4,
    "llm_max_retries": 0,
    "llm_timeout_seconds": 1.0,
}


# -- results ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """One pass/fail criterion of a case: what must hold, whether it did, what was seen."""

    criterion: str
    ok: bool
    measured: str = ""


@dataclass
class Row:
    """One case of the matrix on one backend."""

    case: str
    backend: str
    accepted: int = 0
    stored: int = 0
    processed: int = 0
    failed: int = 0
    duplicated: int = 0
    recover_s: float | None = None
    note: str = ""
    checks: list[Check] = field(default_factory=list)
    seconds: float = 0.0  # how long the case ran

    def check(self, criterion: str, ok: bool, measured: str = "") -> bool:
        self.checks.append(Check(criterion, bool(ok), measured))
        return bool(ok)

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    @property
    def verdict(self) -> str:
        return "PASS" if self.ok else "FAIL"

    HEADER = (
        f"{'case':<28} {'backend':<8} {'accepted':>8} {'stored':>7} {'processed':>9} "
        f"{'failed':>6} {'dup':>4} {'recover':>8}  {'verdict':<7} note"
    )

    def line(self) -> str:
        recover = "-" if self.recover_s is None else f"{self.recover_s:.1f}s"
        return (
            f"{self.case:<28} {self.backend:<8} {self.accepted:>8} {self.stored:>7} "
            f"{self.processed:>9} {self.failed:>6} {self.duplicated:>4} {recover:>8}  "
            f"{self.verdict:<7} {self.note}"
        )

    def report(self) -> str:
        """The row, then each criterion with its verdict and what was measured."""
        lines = [self.line()]
        for c in self.checks:
            lines.append(f"    [{'pass' if c.ok else 'FAIL'}] {c.criterion}: {c.measured}")
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "verdict": self.verdict}


class FaultSetupError(RuntimeError):
    """The fault could not be staged (e.g. no worker ever reached a batch): no verdict."""


def failed_setup(case: str, backend: str, exc: BaseException) -> Row:
    """The row of a case that could not run to the end: FAIL, with the reason."""
    row = Row(case, backend, note=f"did not complete: {type(exc).__name__}: {exc}"[:300])
    row.check("the case ran to the end", False, f"{type(exc).__name__}: {exc}"[:500])
    return row


def _timed(case: Callable[P, Row]) -> Callable[P, Row]:
    """Record in the row how long the case ran."""

    @functools.wraps(case)
    def run(*args: P.args, **kwargs: P.kwargs) -> Row:
        started = time.monotonic()
        row = case(*args, **kwargs)
        row.seconds = time.monotonic() - started
        return row

    return run


# -- what the clients were told, and what the store holds -----------------------------------


@dataclass
class Ledger:
    """What clients attempted, keyed by message id (or, for captured exchanges, by content),
    and what they were told. Thread-safe."""

    attempted: dict[str, str] = field(default_factory=dict)  # key -> content
    accepted: set[str] = field(default_factory=set)
    failed_requests: int = 0
    # Ids a resend was told were already stored: the failed request had committed them.
    committed_behind_failure: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)  # answers no client should ever get
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def attempt(self, items: dict[str, str]) -> None:
        with self._lock:
            for key, content in items.items():
                self.attempted.setdefault(key, content)

    def accept(self, keys: Sequence[str]) -> None:
        with self._lock:
            self.accepted.update(keys)

    def fail(self) -> None:
        with self._lock:
            self.failed_requests += 1

    def committed_anyway(self, keys: Sequence[str]) -> None:
        with self._lock:
            self.committed_behind_failure.update(keys)

    def error(self, text: str) -> None:
        with self._lock:
            self.errors.append(text[:300])

    def merge(self, other: dict[str, Any]) -> None:
        """Add a child process's ledger (its JSON form, see :meth:`as_json`)."""
        with self._lock:
            self.attempted.update(other["attempted"])
            self.accepted.update(other["accepted"])
            self.failed_requests += other["failed_requests"]
            self.committed_behind_failure.update(other["committed_behind_failure"])
            self.errors.extend(other["errors"])

    def as_json(self) -> dict[str, Any]:
        with self._lock:
            return {
                "attempted": self.attempted,
                "accepted": sorted(self.accepted),
                "failed_requests": self.failed_requests,
                "committed_behind_failure": sorted(self.committed_behind_failure),
                "errors": self.errors,
            }

    def snapshot(self) -> set[str]:
        with self._lock:
            return set(self.accepted)


def parcel(mid: str) -> dict[str, Any]:
    """A message that names its own id, so stored copies can be told apart by content; the
    offline pipeline and the scripted model each make exactly one fact of it."""
    return {"id": mid, "role": "user", "content": f"I packed parcel {mid} for my trip to Lisbon."}


def count_store(
    row: Row, db_url: str, ledger: Ledger, *, projects: Sequence[str] = ("default",), by: str = "id"
) -> dict[str, Any]:
    """Fill ``row``'s counts from the store (the messages of ``projects``) and add the checks
    every case shares: 0 lost, 0 duplicated, contents intact, no unexpected answers.
    Returns the per-message details (status and attempts by key) for the case's own checks."""
    marks = ", ".join("?" * len(projects))
    in_projects = f"project_id IN ({marks})"
    stored_rows = rows(
        db_url, f"SELECT id, content, status, attempts FROM messages WHERE {in_projects}", *projects
    )
    by_content = Counter(content for _, content, _, _ in stored_rows)
    wanted = set(ledger.attempted.values())
    extra_rows = sum(n - 1 for n in by_content.values() if n > 1)
    status: dict[str, str] = {}
    attempts: dict[str, int] = {}
    altered = []
    for mid, content, st, n in stored_rows:
        key = mid if by == "id" else content
        if by == "id" and mid in ledger.attempted:
            if ledger.attempted[mid] != content:
                altered.append(mid)
        elif content not in wanted:
            continue  # nobody attempted this content: not ours to judge
        elif by == "id":
            extra_rows += by_content[content] == 1  # our content, under an id nobody sent
            continue
        status.setdefault(key, st)
        attempts[key] = int(n)
    vectors, distinct = rows(
        db_url,
        f"SELECT count(*), count(DISTINCT item_pk) FROM vectors WHERE {in_projects} "
        "AND kind = 'message'",
        *projects,
    )[0]
    facts = Counter(
        (user, text, str(ids))
        for user, text, ids in rows(
            db_url, f"SELECT user_id, text, message_ids FROM facts WHERE {in_projects}", *projects
        )
    )
    extra_facts = sum(n - 1 for n in facts.values() if n > 1)
    extra_vectors = int(vectors) - int(distinct)

    accepted = ledger.accepted
    lost = sorted(accepted - status.keys())
    row.accepted = len(accepted)
    row.stored = len(accepted) - len(lost)
    row.processed = sum(1 for k in accepted if status.get(k) == "processed")
    row.failed = sum(1 for k in accepted if status.get(k) == "failed")
    row.duplicated = extra_rows + extra_vectors + extra_facts
    row.check("0 accepted messages lost", not lost, f"{len(lost)} lost {lost[:5]}")
    row.check(
        "0 duplicated",
        row.duplicated == 0,
        f"extra rows {extra_rows}, extra message vectors {extra_vectors}, "
        f"facts applied twice {extra_facts}",
    )
    row.check("stored contents intact", not altered, f"{len(altered)} altered {altered[:5]}")
    row.check(
        "no unexpected answer (4xx, malformed)",
        not ledger.errors,
        f"{len(ledger.errors)} {ledger.errors[:3]}",
    )
    return {
        "status": status,
        "attempts": attempts,
        "pending": sum(1 for k in accepted if status.get(k) == "pending"),
    }


def processed_ids(db_url: str, project_id: str = "default") -> set[str]:
    return {
        r[0]
        for r in rows(
            db_url,
            "SELECT id FROM messages WHERE project_id = ? AND status = 'processed'",
            project_id,
        )
    }


def unfinished_jobs(db_url: str) -> int:
    # Anything but the two final states: a user paused by an outage may hold its jobs in
    # another one.
    return int(
        rows(db_url, "SELECT count(*) FROM jobs WHERE status NOT IN ('done', 'failed')")[0][0]
    )


def running_jobs(db_url: str) -> int:
    return int(rows(db_url, "SELECT count(*) FROM jobs WHERE status = 'running'")[0][0])


def wait_processed(
    db_url: str, ids: set[str], *, since: float, timeout: float, project_id: str = "default"
) -> float | None:
    """Seconds from ``since`` (a ``time.monotonic()``) until every message of ``ids`` is
    processed; ``None`` when ``timeout`` passed first, or when the work settled first (no job
    left unfinished while some of them are not processed: they failed for good)."""
    deadline = time.monotonic() + timeout
    settled = 0
    while True:
        if ids <= processed_ids(db_url, project_id):
            return time.monotonic() - since
        settled = settled + 1 if unfinished_jobs(db_url) == 0 else 0
        if settled >= 3 or time.monotonic() > deadline:
            return None
        time.sleep(0.1)


def wait_settled(db_url: str, timeout: float) -> float | None:
    """Seconds until no job is left unfinished (done or failed for good), or ``None``."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if unfinished_jobs(db_url) == 0:
            return time.monotonic() - start
        time.sleep(0.1)
    return None


# -- processes -------------------------------------------------------------------------------


def process_env(embed: FakeOpenAIServer) -> dict[str, str]:
    """Environment of the stratamem processes of a case: the fake embedding service, short
    leases; the developer's own STRATAMEM_* variables left out."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATAMEM_")}
    env.update(
        {
            "STRATAMEM_EMBEDDER_BASE_URL": embed.base_url,
            "STRATAMEM_EMBEDDER_API_KEY": "k",
            "STRATAMEM_JOB_LEASE_SECONDS": str(LEASE_SECONDS),
        }
    )
    return env


class WorkerProcess:
    """``stratamem worker`` in a subprocess, its output appended to a file in ``workdir``."""

    def __init__(self, workdir: Path, db_url: str, env: dict[str, str]) -> None:
        self.db_url = db_url
        self.env = env
        self.out_path = workdir / f"worker-{free_port()}.out"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *extra: str) -> WorkerProcess:
        cmd = [sys.executable, "-m", "stratamem", "--db", self.db_url, "--embedder", EMBEDDER]
        with open(self.out_path, "ab") as out:
            self.proc = subprocess.Popen(
                [*cmd, "worker", *extra], stdout=out, stderr=subprocess.STDOUT, env=self.env
            )
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def stop(self) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(10)


@contextlib.contextmanager
def mid_batch(embed: FakeOpenAIServer, db_url: str, timeout: float = 60.0) -> Iterator[int]:
    """Hold embedding calls at the fake's gate until a worker is inside one: a batch is then
    claimed and mid-flight. The body (the fault) runs with the number of running jobs; the
    gate opens after it."""
    embed.hold.clear()
    try:
        if not embed.held.wait(timeout):
            raise FaultSetupError(f"no worker reached an embedding call in {timeout:.0f} s")
        yield running_jobs(db_url)
    finally:
        embed.hold.set()


def _pg_bin() -> Path | None:
    env = os.environ.get("STRATAMEM_PG_BIN")
    if env:
        return Path(env)
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    return found[-1].parent if found else None


class PrivateCluster:
    """A PostgreSQL cluster of our own: ``initdb`` in a temporary directory, its own port and
    socket directory, started, restarted and stopped with ``pg_ctl`` on that directory only.
    The machine's shared server is never touched. As root, the server runs as ``postgres``
    (initdb refuses root). pgvector must be installed for the server's version."""

    def __init__(self) -> None:
        bin_dir = _pg_bin()
        if bin_dir is None or not (bin_dir / "pg_ctl").exists():
            raise FaultSetupError("no PostgreSQL server binaries (set STRATAMEM_PG_BIN)")
        self.bin = bin_dir
        self.dir = Path(tempfile.mkdtemp(prefix="stratamem-pg-"))
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        self.port = free_port()
        self._user = "postgres" if os.geteuid() == 0 else None

    @staticmethod
    def available() -> bool:
        bin_dir = _pg_bin()
        return bin_dir is not None and (bin_dir / "pg_ctl").exists()

    def _run(self, tool: str, *args: str, timeout: float = 120) -> None:
        done = subprocess.run(
            [str(self.bin / tool), *args],
            user=self._user,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise FaultSetupError(f"{tool} {' '.join(args[:2])} failed: {done.stderr[-800:]}")

    def _pg_ctl(self, action: str, mode: str | None = None) -> None:
        args = [action, "-D", str(self.data), "-l", str(self.log), "-w", "-t", "120"]
        if mode is not None:
            args += ["-m", mode]
        if action in ("start", "restart"):
            args += [
                "-o",
                f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 "
                "-c shared_buffers=32MB -c max_connections=200",
            ]
        self._run("pg_ctl", *args)

    def start(self) -> PrivateCluster:
        try:
            if self._user is not None:
                shutil.chown(self.dir, user=self._user)
            self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "-E", "UTF8")
            self._pg_ctl("start")
        except BaseException:
            self.close()
            raise
        return self

    def restart(self, mode: str) -> float:
        """``pg_ctl restart -m <mode>`` (fast: sessions are ended; immediate: the server
        stops without a checkpoint and recovers from WAL on start). Returns its seconds."""
        started = time.monotonic()
        self._pg_ctl("restart", mode)
        return time.monotonic() - started

    def down(self) -> None:
        """``pg_ctl stop -m fast``: sessions are ended and the server stays down."""
        self._pg_ctl("stop", "fast")

    def up(self) -> None:
        self._pg_ctl("start")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def new_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        with psycopg.connect(self.url(name), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            conn.execute("CREATE EXTENSION IF NOT EXISTS btree_gin")
        return self.url(name)

    def close(self) -> None:
        try:
            if (self.data / "postmaster.pid").exists():  # also after a start that timed out
                self._pg_ctl("stop", "immediate")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PrivateCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- clients ---------------------------------------------------------------------------------


class HttpWriters:
    """Clients writing continuously over HTTP until stopped, each its own users and message
    ids, posts of 1-3 messages. A post that fails (transport error, 5xx) is resent with the
    same ids, as a careful client does, until it is answered or ``give_up_s`` pass; any
    other non-2xx answer is an error."""

    def __init__(
        self,
        base_url: str,
        key: str,
        ledger: Ledger,
        *,
        prefix: str,
        writers: int = 3,
        interval: float = 0.2,
        give_up_s: float = 90.0,
    ) -> None:
        self.base_url = base_url
        self.key = key
        self.ledger = ledger
        self.prefix = prefix
        self.interval = interval
        self.give_up_s = give_up_s
        self._stop = threading.Event()
        self.threads = [
            threading.Thread(target=self._write, args=(w,), name=f"writer-{w}", daemon=True)
            for w in range(writers)
        ]

    def start(self) -> HttpWriters:
        for t in self.threads:
            t.start()
        return self

    def wait_accepted(self, n: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.ledger.accepted) < n:
            if time.monotonic() > deadline:
                raise FaultSetupError(f"writers stalled at {len(self.ledger.accepted)} of {n}")
            time.sleep(0.05)

    def stop(self) -> None:
        """Let each writer finish its current post (resends included), then end."""
        self._stop.set()
        for t in self.threads:
            t.join(self.give_up_s + 30)

    def _write(self, w: int) -> None:
        rng = random.Random(w)
        users = [f"{self.prefix}-u{w}a", f"{self.prefix}-u{w}b"]
        headers = {"Authorization": f"Api-Key {self.key}"}
        with httpx.Client(base_url=self.base_url, headers=headers, timeout=20.0) as client:
            seq = post = 0
            while not self._stop.is_set():
                n = rng.choice((1, 1, 2, 3))
                messages = [parcel(f"{self.prefix}-w{w}-{i:05d}") for i in range(seq, seq + n)]
                seq += n
                post += 1
                self._post(client, users[post % 2], messages)
                time.sleep(self.interval)

    def _post(self, client: httpx.Client, user: str, messages: list[dict[str, Any]]) -> None:
        ids = [m["id"] for m in messages]
        self.ledger.attempt({m["id"]: m["content"] for m in messages})
        body = {"user_id": user, "messages": messages}
        give_up = time.monotonic() + self.give_up_s
        failed = False
        while time.monotonic() < give_up:
            try:
                r: httpx.Response | None = client.post(
                    f"/api/sessions/s-{user}/messages", json=body
                )
            except httpx.TransportError:
                r = None
            if r is None or r.status_code >= 500:
                self.ledger.fail()
                failed = True
                time.sleep(0.1)
                continue
            if r.status_code >= 300:
                self.ledger.error(f"HTTP {r.status_code} for {ids}: {r.text[:200]}")
                return
            data = r.json()["data"]
            duplicates = set(data.get("duplicates") or [])
            if not set(ids) <= set(data["message_ids"]) | duplicates:
                self.ledger.error(f"answer for {ids} names {data['message_ids']}")
            if failed and duplicates:
                self.ledger.committed_anyway(sorted(duplicates & set(ids)))
            self.ledger.accept(ids)
            return


def _admin(url: str, token: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def _api(url: str, key: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Api-Key {key}"}, timeout=120)


# -- cases: processes killed, PostgreSQL restarted ----------------------------------------------


@dataclass(frozen=True)
class Stream:
    """The write load of a process fault: ``writers`` clients; the fault strikes once
    ``before`` messages are accepted, and they go on until ``after`` more are accepted
    after its end; every accepted message must be processed ``timeout`` s after that."""

    writers: int = 3
    before: int = 40
    after: int = 40
    timeout: float = 90.0


def _backend(db_url: str) -> str:
    return "postgres" if is_postgres(db_url) else "sqlite"


def _warm_up(url: str, key: str, db_url: str, ledger: Ledger) -> None:
    """One message written and processed before the clients start: the worker is up, so the
    fault lands mid-stream rather than while processes are still starting."""
    with _api(url, key) as api:
        _http_add(api, ledger, "warm", "warm-0", sync=False)
    if wait_processed(db_url, {"warm-0"}, since=time.monotonic(), timeout=120) is None:
        raise FaultSetupError("the warm-up message was not processed within 120 s")


@dataclass
class _Struck:
    """What the fault hit: jobs running at that moment, requests failed since; how long
    from its beginning to its end (the process back, the server accepting again)."""

    running: int = 0
    failed_requests: int = 0
    down_s: float = 0.0


@contextlib.contextmanager
def _serving(
    db_url: str, workdir: Path, *extra: str
) -> Iterator[tuple[ServerProcess, FakeOpenAIServer]]:
    """``stratamem serve`` on the store, embedding through a fake service whose gate
    :func:`mid_batch` holds; yields the server and that fake."""
    with FakeOpenAIServer(dim=16) as embed:
        srv = ServerProcess(workdir, db_url=db_url, embedder=EMBEDDER, env=process_env(embed))
        srv.start(*extra)
        try:
            yield srv, embed
        finally:
            embed.hold.set()
            srv.stop()


def _write_through(
    row: Row,
    srv: ServerProcess,
    embed: FakeOpenAIServer,
    stream: Stream,
    *,
    prefix: str,
    begin: Callable[[], object],
    end: Callable[[], object],
) -> _Struck:
    """Clients write; once ``stream.before`` are accepted and a worker is inside a batch,
    ``begin()`` the fault, ``end()`` it (restart what was killed) and time the recovery of
    what was accepted until then; then count and check the store."""
    db_url, ledger, struck = srv.db_url, Ledger(), _Struck()
    key = srv.bootstrap_key()
    _warm_up(srv.url, key, db_url, ledger)
    load = HttpWriters(srv.url, key, ledger, prefix=prefix, writers=stream.writers).start()
    try:
        load.wait_accepted(len(ledger.accepted) + stream.before)
        with mid_batch(embed, db_url) as struck.running:
            before = ledger.snapshot()
            failed_before = ledger.failed_requests
            began = time.monotonic()
            begin()
        end()
        back = time.monotonic()
        struck.down_s = back - began
        row.recover_s = wait_processed(
            db_url, ledger.snapshot(), since=back, timeout=stream.timeout
        )
        load.wait_accepted(len(before) + stream.after)
    finally:
        load.stop()
    wait_processed(db_url, ledger.snapshot(), since=time.monotonic(), timeout=stream.timeout)
    struck.failed_requests = ledger.failed_requests - failed_before
    details = count_store(row, db_url, ledger)
    row.check(
        "every accepted message processed",
        row.processed == row.accepted,
        f"{row.processed}/{row.accepted} (failed {row.failed}, pending {details['pending']}) "
        f"waiting up to {stream.timeout:.0f} s after the last write",
    )
    row.check(
        "the fault hit a batch mid-flight", struck.running > 0, f"{struck.running} job(s) running"
    )
    row.note = (
        f"{struck.failed_requests} failed attempts resent; "
        f"{len(ledger.committed_behind_failure)} messages committed behind a failed answer"
    )
    return struck


@_timed
def serve_sigkill(db_url: str, workdir: Path, stream: Stream = Stream()) -> Row:
    """SIGKILL of ``stratamem serve`` (API and its worker) while clients write and a batch
    is mid-flight; started again on the same port and store."""
    row = Row("serve-sigkill", _backend(db_url))
    with _serving(db_url, workdir) as (srv, embed):
        struck = _write_through(row, srv, embed, stream, prefix="sk", begin=srv.kill, end=srv.start)
    row.check(
        "the kill hit clients mid-request",
        struck.failed_requests > 0,
        f"{struck.failed_requests} attempts failed",
    )
    row.note = f"down {struck.down_s:.1f}s; " + row.note
    return row


@_timed
def worker_sigkill(db_url: str, workdir: Path, stream: Stream = Stream()) -> Row:
    """SIGKILL of a ``stratamem worker`` process mid-batch while ``serve --no-worker``
    accepts writes; the worker is started again."""
    row = Row("worker-sigkill", _backend(db_url))
    with _serving(db_url, workdir, "--no-worker") as (srv, embed):
        worker = WorkerProcess(workdir, db_url, srv.env).start()
        try:
            _write_through(
                row, srv, embed, stream, prefix="wk", begin=worker.kill, end=worker.start
            )
            exit_code = worker.stop()
        finally:
            worker.kill()
    row.check("the restarted worker stopped cleanly", exit_code == 0, f"exit code {exit_code}")
    row.note = f"lease {LEASE_SECONDS:g}s; " + row.note
    return row


@_timed
def postgres_restart(
    cluster: PrivateCluster, db_url: str, workdir: Path, mode: str, stream: Stream = Stream()
) -> Row:
    """``pg_ctl restart -m fast|immediate`` of a private cluster under ``stratamem serve``
    (API and worker on it) while clients write and a batch is mid-flight."""
    row = Row(f"postgres-restart-{mode}", "postgres")
    with _serving(db_url, workdir) as (srv, embed):
        struck = _write_through(
            row,
            srv,
            embed,
            stream,
            prefix="pg",
            begin=lambda: cluster.restart(mode),
            end=lambda: None,
        )
        alive = srv.proc is not None and srv.proc.poll() is None
    row.check("stratamem serve survived the restart", alive, "running" if alive else "exited")
    row.note = f"pg_ctl restart {struck.down_s:.1f}s; " + row.note
    return row


# -- cases: the LLM misbehaving --------------------------------------------------------------

#: Faults that end (the model is back afterwards) and faults that last.
OUTAGES = ("hang", "500", "429", "unreachable")
BAD_OUTPUT = ("invalid-json", "wrong-schema")


class _Model:
    """The fake OpenAI-compatible model and the fault it is made to show (the fake server's
    own fault modes), counting the chat calls that reached it while faulty."""

    _MODES: ClassVar[dict[str, str | int]] = {
        "hang": "hang",
        "500": 500,
        "429": 429,
        "unreachable": "refuse",
        "invalid-json": "invalid_json",
        "wrong-schema": "wrong_schema",
    }

    def __init__(self) -> None:
        self.server = FakeOpenAIServer().start()
        self.server.chat_script = MemoryModel()
        self._calls_before = 0
        self.faulty_calls = 0

    def begin(self, fault: str) -> None:
        self._calls_before = len(self.server.chat_requests())
        self.server.fault(self._MODES[fault])

    def end(self, fault: str) -> None:
        self.faulty_calls = len(self.server.chat_requests()) - self._calls_before
        self.server.heal()

    def count(self) -> int:
        """Chat calls since :meth:`begin` (a fault that lasts to the end of the case)."""
        return len(self.server.chat_requests()) - self._calls_before

    def close(self) -> None:
        self.server.close()


def retry_budget(settings: dict[str, Any], fault: str) -> float:
    """The longest a message is retried before it fails for good under ``settings`` (the
    backoffs at their +20% jitter, plus the LLM timeouts a hanging model costs): an outage
    shorter than this cannot show whether an outage fails messages."""
    s = load_settings(**settings)
    backoffs = sum(
        min(s.job_backoff_max_seconds, s.job_backoff_seconds * 2 ** (k - 1))
        for k in range(1, s.job_max_attempts)
    )
    hanging = s.job_max_attempts * s.llm_timeout_seconds * (s.llm_max_retries + 1)
    return 1.2 * backoffs + (hanging if fault == "hang" else 0.0)


@_timed
def llm_fault(
    fault: str,
    db_url: str,
    *,
    fault_seconds: float = 4.0,
    users: int = 3,
    posts: int = 4,
    settings: dict[str, Any] | None = None,
    timeout: float = 90.0,
) -> Row:
    """The LLM of the write pipeline misbehaves: for ``fault_seconds`` it hangs, answers
    500 or 429, or refuses connections, then answers well again (expected: processing
    paused and resumed by itself, 0 failed, no operator action); or it answers invalid JSON
    or JSON of the wrong shape for good (expected: the messages fail after
    ``job_max_attempts`` attempts each, also those that joined a batch already failing).
    Messages are written before and during the fault by an embedded ``Memory`` with one
    worker thread and the OpenAI SDK; ``settings`` are its retry settings (default
    :data:`SHORT_BACKOFF`)."""
    if fault not in OUTAGES + BAD_OUTPUT:
        raise ValueError(f"unknown LLM fault {fault!r}")
    settings = dict(SHORT_BACKOFF if settings is None else settings)
    row = Row(f"llm-{fault}", _backend(db_url))
    ledger = Ledger()
    model = _Model()
    mem = Memory(
        db_url,
        embedder="hash",
        llm="openai:fake-chat",
        llm_base_url=model.server.base_url,
        llm_api_key="k",
        workers=1,
        **settings,
    )
    sessions = [
        mem.sessions.create(user_id=f"llm-u{u}", session_id=f"llm-s{u}") for u in range(users)
    ]

    def add(session: Any, mids: list[str], *, sync: bool = False) -> None:
        messages = [parcel(m) for m in mids]
        ledger.attempt({m["id"]: m["content"] for m in messages})
        try:
            session.add_messages(messages, sync=sync)
        except Exception as exc:
            ledger.error(f"add_messages raised {type(exc).__name__}: {exc}")
            return
        ledger.accept(mids)

    processed_in_fault, settled, left = 0, None, 0
    try:
        add(sessions[0], ["llm-warm-0"], sync=True)  # the model works before the fault
        model.begin(fault)
        fault_began = time.monotonic()
        during: list[str] = []
        # An outage is written through for its first half; bad output within the retry
        # budget, so that later messages join batches that are already failing.
        spread = fault_seconds if fault in OUTAGES else retry_budget(settings, fault)
        for p in range(posts):
            for u, session in enumerate(sessions):
                mids = [f"llm-u{u}-p{p}-{k}" for k in range(2)]
                add(session, mids)
                during.extend(mids)
            time.sleep(spread / 2 / posts)
        if fault in OUTAGES:
            time.sleep(max(0.0, fault_began + fault_seconds - time.monotonic()))
            processed_in_fault = len(set(during) & processed_ids(db_url))
            paused = mem.stats()["processing"]
            model.end(fault)
            back = time.monotonic()
            row.recover_s = wait_processed(db_url, ledger.snapshot(), since=back, timeout=timeout)
            left = unfinished_jobs(db_url)
        else:
            settled = wait_settled(db_url, timeout)
    finally:
        mem.close(timeout=10)
        model.close()
    details = count_store(row, db_url, ledger)
    if fault in OUTAGES:
        budget = retry_budget(settings, fault)
        row.check(
            "the fault outlasted the retry budget (or the case proves nothing)",
            fault_seconds > budget,
            f"{fault_seconds:g}s of {fault}, budget {budget:.1f}s",
        )
        row.check(
            "the fault stopped processing",
            processed_in_fault == 0,
            f"{processed_in_fault} of the {len(during)} messages written during it processed",
        )
        row.check(
            "stats said processing was paused, and why",
            bool(paused.get("paused")) and bool(paused.get("outages")),
            "; ".join(o["last_error"][:80] for o in paused.get("outages", [])) or str(paused),
        )
        row.check("0 failed after the model is back", row.failed == 0, f"{row.failed} failed")
        row.check(
            "all processed, no operator action",
            row.processed == row.accepted,
            f"{row.processed}/{row.accepted} processed after the model's return, "
            + (
                f"{left} jobs still queued after {timeout:.0f} s" if left else "nothing left to run"
            ),
        )
        row.note = (
            f"{fault_seconds:g}s of {fault}, then the model back; "
            f"{model.faulty_calls} calls reached the faulty model"
        )
    else:
        max_attempts = load_settings(**settings).job_max_attempts
        failed = [m for m in during if details["status"].get(m) == "failed"]
        short = {m: details["attempts"].get(m) for m in failed}
        short = {m: n for m, n in short.items() if n != max_attempts}
        row.check(
            "every message written during the fault failed for good (none left pending)",
            settled is not None and len(failed) == len(during),
            f"{len(failed)}/{len(during)} failed, "
            + (f"settled in {settled:.1f}s" if settled is not None else "still unfinished"),
        )
        row.check(
            f"each failed after its own job_max_attempts={max_attempts} attempts",
            not short and bool(failed),
            f"{len(short)} with other counts {dict(list(short.items())[:4])}",
        )
        row.note = f"{model.count()} {fault} answers, for good"
    return row


# -- cases: webhook receivers that misbehave ------------------------------------------------

#: Receiver path and the log reason a truthful delivery log gives, per misbehaviour.
RECEIVERS: dict[str, tuple[str, str]] = {
    "hang": ("/hang", r"timed out"),
    "trickle-body": ("/trickle-body", r"timed out"),
    "trickle-head": ("/trickle-head", r"timed out"),
    "huge": ("/huge", r"over \d+ bytes"),
    "redirect": ("/redirect", r"redirect .*not followed"),
}
ADMIN_TOKEN = "fault-admin-token"


@_timed
def webhook_receiver_fault(
    kind: str,
    db_url: str,
    workdir: Path,
    *,
    timeout_ms: int = 1000,
    trickle_seconds: float = 30.0,
    margin_s: float = 1.0,
    async_slots: int = 4,
) -> Row:
    """A project's webhook receiver misbehaves (``RECEIVERS``): one sync ``fact.before_add``
    hook and ``async_slots`` async ones (as many as the server's async delivery slots), all
    with ``timeout_ms``, on ``stratamem serve`` with its single worker thread. Meanwhile
    another project writes with ``sync=True`` and has an async hook to a healthy receiver.

    Criteria: each delivery to the bad receiver ends within ``timeout_ms`` + ``margin_s``
    as the receiver saw it; its log reason names what happened and its logged latency
    agrees with the receiver's clock; the other project's ``sync=True`` write waits at most
    for the one sync hook ahead of it (``timeout_ms`` + 3 s of its own processing) and its
    delivery goes out within 3 s of its batch. A receiver gives up trickling after
    ``trickle_seconds``, which bounds the case's time when deliveries are not bounded.
    """
    path, reason_re = RECEIVERS[kind]
    row = Row(f"webhook-{kind}", _backend(db_url))
    ledger = Ledger()
    limit = timeout_ms / 1000 + margin_s
    sync_bound = timeout_ms / 1000 + 3.0
    async_bound = 3.0
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATAMEM_")}
    env.update(
        {
            "STRATAMEM_ADMIN_TOKEN": ADMIN_TOKEN,
            "STRATAMEM_WEBHOOK_ALLOW": "127.0.0.1",
            "STRATAMEM_WEBHOOK_MAX_ATTEMPTS": "1",
            "STRATAMEM_WEBHOOK_ASYNC_CONCURRENCY": str(async_slots),
        }
    )
    with WebhookReceiver(trickle_interval=0.2, trickle_seconds=trickle_seconds) as receiver:
        srv = ServerProcess(workdir, db_url=db_url, env=env).start()
        try:
            noisy_key = srv.bootstrap_key()
            with _admin(srv.url, ADMIN_TOKEN) as admin:
                admin.post("/admin/projects", json={"name": "calm", "project_id": "calm"})
                calm_key = admin.post("/admin/projects/calm/keys", json={"name": "faults"}).json()
            with (
                _api(srv.url, noisy_key) as noisy,
                _api(srv.url, calm_key["data"]["secret"]) as calm,
            ):
                bad_hooks = [
                    _hook(noisy, receiver.url(path), mode, timeout_ms)
                    for mode in ["sync"] + ["async"] * async_slots
                ]
                _hook(calm, receiver.url("/ok"), "async", timeout_ms)
                _http_add(noisy, ledger, "noisy", "wh-noisy-0", sync=False)
                _wait(lambda: receiver.at(path), 60, "the noisy project's sync hook never fired")
                calm_began = time.monotonic()
                _http_add(calm, ledger, "calm", "wh-calm-0", sync=True)
                calm_done = time.monotonic()
                calm_sync_s = calm_done - calm_began
                ok = _wait(lambda: receiver.at("/ok"), trickle_seconds + 60, None)
                # It may even arrive before the write's answer does.
                calm_async_s = max(0.0, ok[0].arrived - calm_done) if ok else None

                def all_ended() -> bool:
                    got = receiver.at(path)
                    return len(got) >= len(bad_hooks) and all(r.ended for r in got)

                def all_logged() -> dict[str, Any] | None:
                    logs = {h: _last_delivery(noisy, h) for h in bad_hooks}
                    return logs if all(logs.values()) else None

                _wait(all_ended, trickle_seconds + 60, None)
                logs = _wait(all_logged, 30, None) or {
                    h: _last_delivery(noisy, h) for h in bad_hooks
                }
                wait_processed(db_url, {"wh-noisy-0"}, since=time.monotonic(), timeout=30)
        finally:
            srv.stop()
    bad = receiver.at(path)
    count_store(row, db_url, ledger, projects=("default", "calm"))
    row.check(
        "both projects' messages processed",
        row.processed == row.accepted,
        f"{row.processed}/{row.accepted}",
    )
    row.check(
        f"the bad receiver got 1 sync + {async_slots} async deliveries",
        len(bad) == len(bad_hooks),
        f"{len(bad)} requests",
    )
    spans = [r.seconds for r in bad]
    worst = max((s for s in spans if s is not None), default=None)
    unfinished = sum(s is None for s in spans)
    row.check(
        f"each delivery ended within timeout_ms + {margin_s:g} s = {limit:g} s (receiver's clock)",
        bool(spans) and unfinished == 0 and worst is not None and worst <= limit,
        f"longest {_secs(worst)}, {unfinished} still open after {trickle_seconds:g} s",
    )
    seen = {r.json.get("hook_id"): r.seconds for r in bad}
    untrue = []
    for hook_id, log in logs.items():
        took = seen.get(hook_id)
        if log is None or took is None:
            untrue.append(f"{hook_id}: no log entry or no request")
            continue
        logged = float(log["latency_ms"]) / 1000
        if not re.search(reason_re, log["reason"]) or abs(logged - took) > margin_s:
            untrue.append(f"'{log['reason'][:60]}' logged {logged:.1f}s, took {took:.1f}s")
    row.check(
        "each log reason names what happened and its latency is the real one",
        not untrue,
        "; ".join(untrue[:2]) or f"all {len(logs)} match /{reason_re}/ within {margin_s:g} s",
    )
    row.check(
        f"another project's sync=True write waited <= {sync_bound:g} s",
        calm_sync_s <= sync_bound,
        f"{calm_sync_s:.1f}s",
    )
    row.check(
        f"another project's delivery went out <= {async_bound:g} s after its batch",
        calm_async_s is not None and calm_async_s <= async_bound,
        _secs(calm_async_s) if calm_async_s is not None else "never arrived",
    )
    row.note = (
        f"delivery max {_secs(worst)} (bound {limit:g}s); other project: sync write "
        f"{calm_sync_s:.1f}s, delivery {_secs(calm_async_s)}"
    )
    return row


def _hook(api: httpx.Client, url: str, mode: str, timeout_ms: int) -> str:
    r = api.post(
        "/api/webhooks",
        json={
            "resource": "fact",
            "event": "before_add",
            "mode": mode,
            "target_url": url,
            "timeout_ms": timeout_ms,
        },
    )
    if r.status_code != 201:
        raise FaultSetupError(f"webhook not created: {r.status_code} {r.text[:200]}")
    return str(r.json()["data"]["webhook"]["id"])


def _last_delivery(api: httpx.Client, hook_id: str) -> dict[str, Any] | None:
    items = api.get(f"/api/webhooks/{hook_id}/deliveries").json()["data"]["items"]
    return items[0] if items else None


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def _wait(probe: Callable[[], Any], timeout: float, error: str | None) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.05)
    if error is not None:
        raise FaultSetupError(error)
    return None


def _http_add(api: httpx.Client, ledger: Ledger, user: str, mid: str, *, sync: bool) -> None:
    message = parcel(mid)
    ledger.attempt({mid: message["content"]})
    r = api.post(
        f"/api/sessions/s-{user}/messages",
        json={"user_id": user, "messages": [message], "sync": sync},
    )
    if r.status_code == 200:
        ledger.accept([mid])
    else:
        ledger.error(f"HTTP {r.status_code} for {mid}: {r.text[:200]}")


# -- cases: several processes on one SQLite file; capture at close and exit -----------------


@_timed
def sqlite_processes(workdir: Path, *, processes: int = 4, messages: int = 40) -> Row:
    """``processes`` processes, each an embedded ``Memory`` with a worker thread, write to
    one SQLite file at once (their own user and one shared by all) and search it."""
    row = Row(f"sqlite-{processes}-processes", "sqlite")
    db_url = f"sqlite:///{workdir / 'shared.db'}"
    go = workdir / "go"
    children = []
    for i in range(processes):
        out = workdir / f"writer-{i}.json"
        err = open(workdir / f"writer-{i}.err", "wb")  # noqa: SIM115 - closed below
        cmd = [sys.executable, __file__, "sqlite-writer", db_url, str(i), str(messages), str(out)]
        children.append((subprocess.Popen(cmd, stderr=err, env=_child_env()), out, err))
    ledger = Ledger()
    try:
        _wait(
            lambda: all((workdir / f"writer-{i}.json.ready").exists() for i in range(processes)),
            120,
            "the writer processes did not start",
        )
        go.touch()
        codes = [proc.wait(300) for proc, _, _ in children]
    finally:
        for proc, _, err in children:
            if proc.poll() is None:
                proc.kill()
            err.close()
    locked = []
    for i, (_, out, _) in enumerate(children):
        if out.exists():
            ledger.merge(json.loads(out.read_text()))
        text = (workdir / f"writer-{i}.err").read_text(errors="replace")
        locked += [line for line in text.splitlines() if "database is locked" in line]
    locked += [e for e in ledger.errors if "locked" in e]
    count_store(row, db_url, ledger)
    row.check("every process exited 0", all(c == 0 for c in codes), f"exit codes {codes}")
    row.check("no 'database is locked'", not locked, f"{len(locked)} {locked[:2]}")
    row.check(
        "every accepted message processed when the last process exited",
        row.processed == row.accepted,
        f"{row.processed}/{row.accepted}",
    )
    row.note = f"{processes} processes x {messages} messages, one user shared by all"
    return row


def _child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATAMEM_")}
    src = str(Path(__file__).resolve().parent.parent / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    return env


def _sqlite_writer(db_url: str, index: int, messages: int, out: Path) -> None:
    ledger = Ledger()
    rng = random.Random(index)
    mem = Memory(db_url, embedder="hash", workers=1)
    try:
        own = mem.sessions.create(user_id=f"proc-{index}", session_id=f"s-proc-{index}")
        shared = mem.sessions.create(user_id="shared", session_id=f"s-shared-{index}")
        Path(f"{out}.ready").touch()
        _wait(lambda: (out.parent / "go").exists(), 120, "the go signal never came")
        seq = post = 0
        while seq < messages:
            n = min(rng.choice((1, 2, 3)), messages - seq)
            batch = [parcel(f"p{index}-{i:04d}") for i in range(seq, seq + n)]
            seq += n
            post += 1
            session = shared if post % 2 else own
            ledger.attempt({m["id"]: m["content"] for m in batch})
            try:
                session.add_messages(batch)
                ledger.accept([m["id"] for m in batch])
            except Exception as exc:
                ledger.error(f"add_messages: {type(exc).__name__}: {exc}")
            if post % 4 == 0:
                try:
                    mem.search("parcel for my trip", user_id=session.user_id, limit=5)
                except Exception as exc:
                    ledger.error(f"search: {type(exc).__name__}: {exc}")
    finally:
        mem.close()
    out.write_text(json.dumps(ledger.as_json()))


def _capture_calls(db_url: str, base_url: str, calls: int) -> tuple[Memory, Ledger]:
    """``calls`` captured chat calls through the real OpenAI SDK; the ``Memory`` is returned
    open. Keys are contents: captured messages get engine ids."""
    import openai

    ledger = Ledger()
    mem = Memory(db_url, embedder="hash", workers=1)
    client = mem.llm.register(openai.OpenAI(base_url=base_url, api_key="k", max_retries=0))
    with mem.scope(user_id="cap-user", session_id="cap-session"):
        for i in range(calls):
            question = f"Please remember parcel cap-{i:03d} is for my sister."
            reply = client.chat.completions.create(
                model="fake-chat", messages=[{"role": "user", "content": question}]
            )
            answer = reply.choices[0].message.content or ""
            ledger.attempt({question: question, answer: answer})
            ledger.accept([question, answer])
    return mem, ledger


def _echo(body: dict[str, Any]) -> str:
    return "Noted: " + str(body["messages"][-1]["content"])


def _exchanges_stored(row: Row, calls: int) -> None:
    row.check(
        "every exchange stored (2 messages a call)",
        row.accepted == row.stored == 2 * calls,
        f"{row.stored} of {2 * calls} stored",
    )


@_timed
def capture_close(db_url: str, *, calls: int = 5) -> Row:
    """``mem.llm.register`` on the OpenAI SDK against the fake server, ``calls`` captured
    calls, then ``Memory.close()`` at once: every exchange (2 messages a call) stored."""
    row = Row(f"capture-close-{calls}", _backend(db_url))
    with FakeOpenAIServer() as fake:
        fake.chat_script = _echo
        mem, ledger = _capture_calls(db_url, fake.base_url, calls)
        mem.close()
    count_store(row, db_url, ledger, by="content")
    _exchanges_stored(row, calls)
    row.note = f"{calls} calls, close() right after the last"
    return row


@_timed
def capture_exit(db_url: str, workdir: Path, *, calls: int = 5) -> Row:
    """The same calls in a child process that then exits without ``close()``."""
    row = Row(f"capture-exit-{calls}", _backend(db_url))
    out = workdir / f"capture-exit-{calls}.json"
    with FakeOpenAIServer() as fake:
        fake.chat_script = _echo
        cmd = [
            sys.executable,
            __file__,
            "capture-exit",
            db_url,
            fake.base_url,
            str(calls),
            str(out),
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=_child_env())
    ledger = Ledger()
    if out.exists():
        ledger.merge(json.loads(out.read_text()))
    count_store(row, db_url, ledger, by="content")
    exited = done.returncode == 0 and out.exists()
    row.check(
        "the process exited 0 without close()",
        exited,
        f"exit code {done.returncode}" + ("" if exited else f": {done.stderr[-300:]}"),
    )
    _exchanges_stored(row, calls)
    row.note = f"{calls} calls, exit right after the last, no close()"
    return row


def _main(argv: list[str]) -> Memory | None:
    command, *args = argv
    if command == "sqlite-writer":
        db_url, index, messages, out = args
        _sqlite_writer(db_url, int(index), int(messages), Path(out))
        return None
    if command == "capture-exit":
        db_url, base_url, calls, out = args
        mem, ledger = _capture_calls(db_url, base_url, int(calls))
        Path(out).write_text(json.dumps(ledger.as_json()))
        return mem  # kept open, as a script's global would be, until the interpreter exits
    raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    _open = _main(sys.argv[1:])
