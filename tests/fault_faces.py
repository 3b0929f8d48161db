"""The fault matrix's cases for the faces and for erasure (issue 39), beside the engine's in
``fault_matrix.py`` (whose rows, ledger and counting they share). Used by
``bench/faults.py`` (full size) and ``tests/test_faults.py`` (cheap variants).

* ``mcp-sigkill``, ``mcp-sigterm`` — MCP clients add memories over ``/mcp`` while
  ``stratamem serve`` is SIGKILLed (or stopped with SIGTERM) and started again. Every
  acknowledged write stored once and processed; a write that failed is not resent (MCP
  gives a write no id of the caller's), so it may or may not be stored, once at most.
* ``proxy-sigterm``, ``proxy-sigkill`` — chat calls through the memory proxy on ``serve``'s
  ``/v1`` while it is stopped or killed. After a clean stop every answered exchange is
  stored; a kill loses at most the exchanges the capture writer still held
  (``MAX_QUEUED_EXCHANGES``), and only ones answered before the kill.
* ``proxy-slow-key-check`` — the project key check cannot answer (the store's ``api_keys``
  table locked): each call is relayed without memory at once and its exchange stored once
  the check is done.
* ``proxy-postgres-outage`` — PostgreSQL stopped for a while under proxied traffic: the
  calls answered meanwhile are stored after it.
* ``erasure-race`` — ``erase_user`` or ``forget`` while another process holds a recall log
  record of the user, or a captured exchange in flight (tests/erasure_race.py): none of it
  is written afterwards; what the user says after coming back is.

Counting is by content (``count_store(..., by="content")``): the engine gives these
messages their ids.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

import fault_matrix as fm
from dbsql import rows
from erasure_race import BACK_TELLS, capture_race, recall_race
from fakes.openai_server import FakeOpenAIServer
from server_proc import ServerProcess
from stratamem.capture._capture import MAX_QUEUED_EXCHANGES

__all__ = [
    "erasure_race",
    "mcp_serve_fault",
    "proxy_postgres_outage",
    "proxy_serve_fault",
    "proxy_slow_key_check",
]


# The default load of the faces' process cases: exchanges (or writes) before and after.
FACES_STREAM = fm.Stream(writers=3, before=40, after=40, timeout=90)


@contextlib.contextmanager
def _serving(db_url: str, workdir: Path, **env: str) -> Iterator[tuple[ServerProcess, Any]]:
    """``stratamem serve`` on the store (embeddings from a fake service), with the proxy in
    front of a fake OpenAI upstream that answers "Noted: <the question's first line>"."""
    with FakeOpenAIServer(dim=16) as embed, FakeOpenAIServer() as upstream:
        # The question's first line: the memory block, injected after it, is not echoed.
        upstream.chat_script = lambda body: (
            "Noted: " + str(body["messages"][-1]["content"]).split("\n", 1)[0]
        )
        env = {**fm.process_env(embed), "STRATAMEM_PROXY_UPSTREAM": upstream.base_url, **env}
        srv = ServerProcess(workdir, db_url=db_url, embedder=fm.EMBEDDER, env=env).start()
        try:
            yield srv, upstream
        finally:
            srv.stop()


class _Clients:
    """``clients`` threads calling ``call(client, worker, seq)`` until stopped; each call
    returns the keys it may add to the ledger (accepted) or None (failed, not resent)."""

    def __init__(
        self,
        url: str,
        ledger: fm.Ledger,
        call: Callable[[httpx.Client, int, int], list[str] | None],
        *,
        clients: int,
        interval: float = 0.05,
    ) -> None:
        self.ledger = ledger
        self._call = call
        self._stop = threading.Event()
        self._url = url
        self._interval = interval
        self.answered: list[tuple[float, list[str]]] = []  # (when, keys)
        self.threads = [
            threading.Thread(target=self._run, args=(w,), daemon=True) for w in range(clients)
        ]
        for t in self.threads:
            t.start()

    def _run(self, worker: int) -> None:
        with httpx.Client(base_url=self._url, timeout=30) as client:
            seq = 0
            while not self._stop.is_set():
                seq += 1
                try:
                    keys = self._call(client, worker, seq)
                except httpx.TransportError:
                    keys = None
                if keys is None:
                    self.ledger.fail()
                else:
                    self.ledger.accept(keys)
                    self.answered.append((time.monotonic(), keys))
                time.sleep(self._interval)

    def wait_accepted(self, n: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.ledger.accepted) < n:
            if time.monotonic() > deadline:
                raise fm.FaultSetupError(f"clients stalled at {len(self.ledger.accepted)} of {n}")
            time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        for t in self.threads:
            t.join(60)


def _parcel(prefix: str, worker: int, seq: int) -> str:
    return f"Please remember parcel {prefix}-w{worker}-{seq:05d} goes to Lisbon."


def _restart(srv: ServerProcess, how: str) -> float:
    """Kill (SIGKILL) or stop (SIGTERM) ``serve`` and start it again; seconds it was down."""
    began = time.monotonic()
    if how == "kill":
        srv.kill()
    else:
        srv.stop()
    srv.start()
    return time.monotonic() - began


# -- MCP -----------------------------------------------------------------------------------------


def _mcp_call(key: str, ledger: fm.Ledger, prefix: str, acked: list[str]) -> Any:
    def call(client: httpx.Client, worker: int, seq: int) -> list[str] | None:
        text = _parcel(prefix, worker, seq)
        ledger.attempt({text: text})
        body = {
            "jsonrpc": "2.0",
            "id": seq,
            "method": "tools/call",
            "params": {"name": "add_memory", "arguments": {"text": text}},
        }
        r = client.post(
            f"/mcp/users/{prefix}-u{worker}",
            json=body,
            headers={
                "Authorization": f"Api-Key {key}",
                "Accept": "application/json, text/event-stream",
            },
        )
        if r.status_code >= 500:
            return None
        result = r.json().get("result") if r.status_code == 200 else None
        if result is None or result.get("isError"):
            ledger.error(f"HTTP {r.status_code}: {r.text[:200]}")
            return None
        acked.extend(result["structuredContent"]["message_ids"])
        return [text]

    return call


@fm._timed
def mcp_serve_fault(
    db_url: str, workdir: Path, how: str, stream: fm.Stream = FACES_STREAM
) -> fm.Row:
    """MCP ``add_memory`` calls through a SIGKILL (``how="kill"``) or a SIGTERM ("term") of
    ``serve``, which is started again."""
    row = fm.Row(f"mcp-sig{how}", fm._backend(db_url))
    ledger, acked = fm.Ledger(), list[str]()
    with _serving(db_url, workdir) as (srv, _):
        key = srv.bootstrap_key()
        clients = _Clients(
            srv.url, ledger, _mcp_call(key, ledger, f"mcp{how}", acked), clients=stream.writers
        )
        try:
            clients.wait_accepted(stream.before)
            before, failed_before = len(ledger.accepted), ledger.failed_requests
            down = _restart(srv, how)
            back = time.monotonic()
            clients.wait_accepted(before + stream.after)
        finally:
            clients.stop()
        row.recover_s = fm.wait_processed(db_url, set(acked), since=back, timeout=stream.timeout)
    fm.count_store(row, db_url, ledger, by="content")
    failed = ledger.failed_requests - failed_before
    row.check(
        "every acknowledged write processed",
        row.processed == row.accepted,
        f"{row.processed}/{row.accepted}",
    )
    if how == "kill":
        row.check("the kill hit clients mid-request", failed > 0, f"{failed} calls failed")
    row.note = f"down {down:.1f}s; {failed} calls failed (not resent)"
    return row


# -- the memory proxy ------------------------------------------------------------------------------


def _proxy_call(key: str, ledger: fm.Ledger, prefix: str, states: list[str]) -> Any:
    def call(client: httpx.Client, worker: int, seq: int) -> list[str] | None:
        text = _parcel(prefix, worker, seq)
        answer = f"Noted: {text}"
        ledger.attempt({text: text, answer: answer})
        r = client.post(
            "/v1/chat/completions",
            json={"model": "gpt-fake", "messages": [{"role": "user", "content": text}]},
            headers={
                "Authorization": "Bearer sk-caller",
                "X-Stratamem-Api-Key": key,
                "X-Stratamem-User-Id": f"{prefix}-u{worker}",
            },
        )
        if r.status_code >= 500:
            return None
        if r.status_code != 200 or r.json()["choices"][0]["message"]["content"] != answer:
            ledger.error(f"HTTP {r.status_code}: {r.text[:200]}")
            return None
        states.append(r.headers.get("x-stratamem-memory", ""))
        return [text, answer]

    return call


def _stored_contents(db_url: str, prefix: str) -> set[str]:
    return {
        c
        for (c,) in rows(
            db_url, "SELECT content FROM messages WHERE content LIKE ?", f"%{prefix}-w%"
        )
    }


def _wait_stored(db_url: str, prefix: str, wanted: set[str], timeout: float) -> float | None:
    """Seconds until every one of ``wanted`` is stored, or None after ``timeout``."""
    began = time.monotonic()
    while not wanted <= _stored_contents(db_url, prefix):
        if time.monotonic() - began > timeout:
            return None
        time.sleep(0.1)
    return time.monotonic() - began


@fm._timed
def proxy_serve_fault(
    db_url: str, workdir: Path, how: str, stream: fm.Stream = FACES_STREAM
) -> fm.Row:
    """Calls through the proxy on ``serve`` across its SIGTERM (``how="term"``: every
    answered exchange stored) or SIGKILL ("kill": at most the writer's queue lost, only of
    what was answered before the kill); ``serve`` is started again and the calls go on."""
    row = fm.Row(f"proxy-sig{how}", fm._backend(db_url))
    ledger, states = fm.Ledger(), list[str]()
    prefix = f"px{how}"
    with _serving(db_url, workdir) as (srv, _):
        key = srv.bootstrap_key()
        clients = _Clients(
            srv.url, ledger, _proxy_call(key, ledger, prefix, states), clients=stream.writers
        )
        try:
            clients.wait_accepted(2 * stream.before)
            struck = time.monotonic()
            down = _restart(srv, how)
            clients.wait_accepted(len(ledger.accepted) + 2 * stream.after)
        finally:
            clients.stop()
        after = {k for at, keys in clients.answered if at > struck + down for k in keys}
        row.recover_s = _wait_stored(db_url, prefix, after, stream.timeout)
    fm.count_store(row, db_url, ledger, by="content")
    lost = ledger.accepted - _stored_contents(db_url, prefix)
    if how == "kill":
        # Not "0 lost": a kill may take what the writer still held. Said how many instead.
        row.checks = [c for c in row.checks if c.criterion != "0 accepted messages lost"]
        row.check(
            f"lost at most the writer's queue ({MAX_QUEUED_EXCHANGES} exchanges), "
            "all answered before the kill",
            len(lost) <= 2 * MAX_QUEUED_EXCHANGES and not (lost & after),
            f"{len(lost)} messages lost, {len(lost & after)} of them answered after the restart",
        )
    row.check(
        "every exchange answered after the restart stored",
        row.recover_s is not None,
        f"{len(after)} messages",
    )
    row.note = (
        f"down {down:.1f}s; {ledger.failed_requests} calls failed; "
        f"{len(lost) // 2} answered exchanges lost"
    )
    return row


@fm._timed
def proxy_slow_key_check(
    db_url: str, workdir: Path, *, hold_s: float = 3.0, clients: int = 3
) -> fm.Row:
    """PostgreSQL: the ``api_keys`` table is locked for ``hold_s``, so the proxy cannot
    check project keys: each call is relayed at once without memory ("skipped") and its
    exchange stored once the check is done."""
    import psycopg

    row = fm.Row("proxy-slow-key-check", fm._backend(db_url))
    ledger, states = fm.Ledger(), list[str]()
    prefix = "pxslow"
    with _serving(db_url, workdir) as (srv, _):
        key = srv.bootstrap_key()
        with psycopg.connect(db_url) as locker:
            locker.execute("LOCK TABLE api_keys IN ACCESS EXCLUSIVE MODE")
            locked = time.monotonic()
            load = _Clients(
                srv.url, ledger, _proxy_call(key, ledger, prefix, states), clients=clients
            )
            time.sleep(hold_s)
            load.stop()
            during = {k for at, keys in load.answered if at < locked + hold_s for k in keys}
            skipped = states.count("skipped")
            locker.rollback()  # the lock goes: the checks waiting on it finish
        row.recover_s = _wait_stored(db_url, prefix, ledger.accepted, 60)
    fm.count_store(row, db_url, ledger, by="content")
    row.check(
        "calls were answered while the key check could not be made",
        len(during) > 0,
        f"{len(during) // 2} answered in the {hold_s:g} s the keys were locked",
    )
    row.check(
        "each went without memory (x-stratamem-memory: skipped)",
        skipped == len(states) > 0,
        f"{skipped} of {len(states)} skipped",
    )
    row.note = f"api_keys locked {hold_s:g}s; {len(states)} calls, all answered at once"
    return row


@fm._timed
def proxy_postgres_outage(
    cluster: fm.PrivateCluster,
    db_url: str,
    workdir: Path,
    *,
    down_s: float = 10.0,
    clients: int = 3,
) -> fm.Row:
    """PostgreSQL (a private cluster) stopped for ``down_s`` under calls through the proxy:
    the upstream still answers them; their exchanges are stored once it is back."""
    row = fm.Row("proxy-postgres-outage", "postgres")
    ledger, states = fm.Ledger(), list[str]()
    prefix = "pxpg"
    with _serving(db_url, workdir) as (srv, _):
        key = srv.bootstrap_key()
        load = _Clients(srv.url, ledger, _proxy_call(key, ledger, prefix, states), clients=clients)
        try:
            load.wait_accepted(20)
            cluster.down()
            stopped = time.monotonic()
            time.sleep(down_s)
            answered_down = {
                k for at, keys in load.answered if stopped < at < time.monotonic() for k in keys
            }
            cluster.up()
            load.wait_accepted(len(ledger.accepted) + 20)
        finally:
            load.stop()
        row.recover_s = _wait_stored(db_url, prefix, ledger.accepted, 120)
        alive = srv.proc is not None and srv.proc.poll() is None
    fm.count_store(row, db_url, ledger, by="content")
    row.check(
        "calls were answered during the outage",
        len(answered_down) > 0,
        f"{len(answered_down) // 2} exchanges",
    )
    row.check(
        "every one stored after it", row.recover_s is not None, "see '0 accepted messages lost'"
    )
    row.check("stratamem serve survived", alive, "running" if alive else "exited")
    row.note = (
        f"PostgreSQL down {down_s:g}s; {len(answered_down) // 2} exchanges answered meanwhile"
    )
    return row


# -- erasure ---------------------------------------------------------------------------------------


@fm._timed
def erasure_race(db_url: str, workdir: Path, *, rounds: int = 1) -> fm.Row:
    """``rounds`` of each race of tests/erasure_race.py: an erasure and a forget against
    another process's buffered recall log record, an erasure against its captured call in
    flight (recall on and off). Accepted: what the user said or was recalled after coming
    back (must be stored); nothing quoting the erased PIN may be."""
    row = fm.Row("erasure-race", fm._backend(db_url))
    leaked: list[str] = []
    missing: list[str] = []
    dropped = 0
    races = [
        *(("recall", removal) for removal in ("erase_user", "forget")),
        *(("capture", on) for on in (True, False)),
    ]
    for n in range(rounds):
        for i, (kind, how) in enumerate(races):
            place = workdir / f"race-{n}-{i}"
            place.mkdir()
            user = f"u-{kind}-{n}-{i}"
            if kind == "recall":
                race = recall_race(db_url, place, str(how), user=user)
                expected = ["I'm back"]
            else:
                race = capture_race(db_url, place, bool(how), user=user)
                expected = [BACK_TELLS, "Noted."]
            leaked += race.leaked
            missing += [e for e in expected if e not in race.written]
            dropped += race.counts.get("erased", 0)
            row.accepted += len(expected)
            row.stored += sum(e in race.written for e in expected)
    row.check("nothing of the erased user written back", not leaked, f"{len(leaked)} {leaked[:2]}")
    row.check("what the user said after coming back stored", not missing, f"{len(missing)} missing")
    row.check(
        "each held record or exchange dropped, counted",
        dropped == rounds * len(races),
        f"{dropped} of {rounds * len(races)}",
    )
    row.note = f"{rounds * len(races)} races; {dropped} held writes dropped; {len(leaked)} leaked"
    return row
