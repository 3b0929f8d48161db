"""Several server processes on one port (``--processes``, docs/server.md#processes): real
``stratamem serve`` and ``stratamem proxy`` processes on 127.0.0.1, their children found in
/proc. What must hold: both processes answer, each with its own Memory on the one store;
``/metrics`` counts every process's requests whichever process a scrape reaches; a process
that dies is replaced and the port keeps answering; SIGTERM stops them all, the work
accepted kept."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fakes.openai_server import FakeOpenAIServer
from server_proc import ServerProcess, client, free_port
from stratamem import Memory
from stratamem.errors import StratamemError
from stratamem.server._processes import STARTUP_FAILURE, serve_processes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

ROUTE = "/api/sessions/{session_id}/messages"
CHAT = "/v1/chat/completions"


def _children(pid: int) -> list[int]:
    """The server processes the supervisor ``pid`` spawned (``multiprocessing.spawn``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        parent = int(stat.rpartition(")")[2].split()[1])
        if parent == pid and b"spawn_main" in cmdline:
            found.append(int(entry.name))
    return sorted(found)


def _wait_for(what: str, check: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _access_pids(stderr: str, path: str) -> Counter[int]:
    """Requests to ``path`` per answering process, from the access log's JSON lines."""
    pids: Counter[int] = Counter()
    for line in stderr.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if record.get("path") == path:
                pids[record["pid"]] += 1
    return pids


def _requests_counted(url: str) -> float:
    """``/metrics``' count of POSTs to ``ROUTE``, from a new connection each time (so any
    process may answer), as Prometheus' parser reads it."""
    with httpx.Client(timeout=30) as c:
        text = c.get(f"{url}/metrics").text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "stratamem_http_request_duration_seconds_count"
        and sample.labels.get("route") == ROUTE
    )


def test_serve_processes_share_the_port_the_store_and_the_metrics(
    tmp_path: Path, db_url: str
) -> None:
    srv = ServerProcess(tmp_path, env={"STRATAMEM_METRICS": "true"}, db_url=db_url)
    srv.start("--processes", "2")
    try:
        assert srv.proc is not None
        assert "2 processes, each with 1 worker(s)" in srv.stdout()
        key = srv.bootstrap_key()
        _wait_for("two server processes", lambda: len(_children(srv.proc.pid)) == 2)
        first = _children(srv.proc.pid)
        with client(srv.url, key) as c:
            created = c.post("/api/sessions", json={"user_id": "ana", "session_id": "s1"})
            assert created.status_code < 300, created.text
        # A new connection per request: the kernel hands each to whichever process accepts
        # first. Until both have answered (bounded), each request stores one message.
        sent = 0
        while len(_access_pids(srv.stderr(), ROUTE)) < 2:
            assert sent < 300, _access_pids(srv.stderr(), ROUTE)
            with client(srv.url, key) as c:
                r = c.post(
                    "/api/sessions/s1/messages",
                    json={"messages": [{"role": "user", "content": f"I own {sent} books."}]},
                )
            assert r.status_code < 300, r.text
            sent += 1
            if sent % 10 == 0:
                time.sleep(0.2)  # the access log is written after the answer
        assert set(_access_pids(srv.stderr(), ROUTE)) == set(first)
        # Every scrape counts every process's requests, whichever process answers it.
        for _ in range(6):
            assert _requests_counted(srv.url) == sent

        # A process that dies is replaced; the port answers throughout.
        os.kill(first[0], signal.SIGKILL)
        _wait_for(
            "a replacement process",
            lambda: len(_children(srv.proc.pid)) == 2 and first[0] not in _children(srv.proc.pid),
        )
        with client(srv.url, key) as c:
            r = c.post(
                "/api/sessions/s1/messages",
                json={"messages": [{"role": "user", "content": "I moved to Lisbon."}]},
            )
            assert r.status_code < 300, r.text
            sent += 1
        children = _children(srv.proc.pid)
    finally:
        code = srv.stop()
    assert code == 0, srv.stderr()
    # SIGTERM stopped every process, and nothing accepted was lost.
    assert not [pid for pid in children if Path(f"/proc/{pid}").exists()]
    assert "Traceback" not in srv.stderr(), srv.stderr()
    with Memory(srv.db_url, embedder="hash", workers=1) as mem:
        session = mem.sessions.get("s1")
        assert len(session.messages(limit=1000)) == sent
        mem.wait(60)  # and what the stopped processes left queued is processed (raises if not)


def test_proxy_processes_give_memory_and_store_each_exchange(tmp_path: Path) -> None:
    with FakeOpenAIServer() as oai:
        port = free_port()
        db = f"sqlite:///{tmp_path / 'proxy.db'}"
        cmd = [sys.executable, "-m", "stratamem", "--embedder", "hash", "proxy"]
        cmd += ["--upstream", oai.base_url, "--port", str(port), "--db", db, "--processes", "2"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("STRATAMEM_")}
        env["STRATAMEM_CAPTURE_RECALL_TIMEOUT_MS"] = "10000"
        err = tmp_path / "proxy.err"
        with open(err, "wb") as e:
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=e, env=env)
        url = f"http://127.0.0.1:{port}"
        try:

            def up() -> bool:
                assert proc.poll() is None, err.read_text()
                try:
                    return httpx.get(f"{url}/health", timeout=1).status_code == 200
                except httpx.TransportError:
                    return False

            _wait_for("the proxy", up)
            _wait_for("two proxy processes", lambda: len(_children(proc.pid)) == 2)
            headers = {
                "Authorization": "Bearer k",
                "X-Stratamem-User-Id": "ana",
                "X-Stratamem-Session-Id": "chat",
            }
            states: list[str] = []
            # A new connection per request, until both processes have relayed (bounded).
            while len(states) < 20 or len(_access_pids(err.read_text(), CHAT)) < 2:
                assert len(states) < 300, _access_pids(err.read_text(), CHAT)
                n = len(states)
                oai.chat_replies.append(f"Noted {n}.")
                question = {"role": "user", "content": f"My cat is {n} years old."}
                with httpx.Client(timeout=30) as c:
                    r = c.post(
                        f"{url}{CHAT}", json={"model": "m", "messages": [question]}, headers=headers
                    )
                assert r.status_code == 200, r.text
                states.append(r.headers["x-stratamem-memory"])
                if n % 10 == 9:
                    time.sleep(0.2)  # the access log is written after the answer
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(60)
    assert code == 0, err.read_text()
    assert "skipped" not in states and "injected" in states
    with Memory(db, embedder="hash", workers=0) as mem:
        messages = mem.sessions.get("chat").messages(limit=1000)
    assert sorted(m.content for m in messages if m.role == "assistant") == sorted(
        f"Noted {n}." for n in range(len(states))
    )


def _cannot_start(sock: socket.socket) -> None:
    """A server process whose start fails, as one whose store cannot be opened does."""
    sys.exit(STARTUP_FAILURE)


def test_a_process_that_cannot_start_stops_them_all() -> None:
    """Not a loop of restarts: the next process would fail the same way."""
    started = time.monotonic()
    with pytest.raises(StratamemError, match="could not start"):
        serve_processes(_cannot_start, count=2, host="127.0.0.1", port=0, stop_timeout=5)
    assert time.monotonic() - started < 30


def test_a_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cmd = [sys.executable, "-m", "stratamem", "--embedder", "hash", "serve"]
        cmd += ["--port", str(port), "--db", f"sqlite:///{tmp_path / 'm.db'}", "--processes", "2"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("STRATAMEM_")}
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2, done.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "Traceback" not in done.stderr
