"""An erasure (or a forget) racing another process that holds something of the user in
memory, as a proxy, a ``serve`` replica or an app using ``mem.llm`` would: the races that
tests/test_erasure_race.py asserts on and the fault matrix's ``erasure-race`` case counts.

``recall_race``: the other process logs a recall that injected the user's PIN (buffered, as
every face's are) and stops itself (SIGSTOP) before its writer's first flush; this process
erases (or forgets) the user, writes WORKDIR/removed and continues it (SIGCONT); it then
logs a recall of the user coming back and closes, which writes what is buffered.
``capture_race``: the other process makes a captured OpenAI SDK call that tells the PIN,
whose answer this process's fake server holds until the user is erased; then a call of the
user coming back. Either returns what the store holds of the user afterwards and what the
other process counted (``WORKDIR/child.json``) and logged.

    python tests/erasure_race.py recall  DB_URL WORKDIR USER        (the other process)
    python tests/erasure_race.py capture DB_URL WORKDIR USER BASE_URL RECALL(0|1)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PIN_BLOCK = "<memory>\n- [2026-12-01] User's bank PIN is 4321.\n</memory>"
PIN_TELLS = "My bank PIN is 4321, remember it."
BACK_TELLS = "I'm back: my new bank PIN is 9876."


def _child_recall(db_url: str, workdir: Path, user: str) -> None:
    from stratamem import Memory

    mem = Memory(db_url, embedder="hash", workers=0)

    def recall(query: str, **outcome: Any) -> None:
        mem.recall_log.record(
            user_id=user,
            session_id=None,
            source="capture",
            request="openai chat.completions",
            query=query,
            **outcome,
        )

    try:
        recall(
            "what is my PIN?",
            outcome="injected",
            latency_ms=3.0,
            formatted_context=PIN_BLOCK,
            hits=1,
        )
        (workdir / "recorded").touch()
        # Held in the buffer: its writer waits up to a second before it writes.
        os.kill(os.getpid(), signal.SIGSTOP)
        while not (workdir / "removed").exists():  # the stop may take effect a moment late
            time.sleep(0.01)
        # The user comes back: a recall that begins (its latency before it is logged) after
        # the removal, not within the same millisecond.
        time.sleep(0.05)
        recall("I'm back", outcome="none", latency_ms=2.0)
    finally:
        mem.close()
    recorder = mem._engine.recall_log
    assert recorder is not None
    (workdir / "child.json").write_text(json.dumps({"erased": recorder.erased}))


def _child_capture(db_url: str, workdir: Path, user: str, base_url: str, recall_on: bool) -> None:
    import openai

    from stratamem import Memory

    mem = Memory(db_url, embedder="hash", workers=0, capture_recall=recall_on)
    try:
        client = mem.llm.register(openai.OpenAI(base_url=base_url, api_key="k", max_retries=0))
        with mem.scope(user_id=user, session_id=f"chat-{user}"):
            for text in (PIN_TELLS, BACK_TELLS):
                client.chat.completions.create(
                    model="fake-chat", messages=[{"role": "user", "content": text}]
                )
                mem.llm.flush(30)
                # The user comes back a moment later: an exchange is dropped if the recall
                # that could have fed it (up to the recall bound and a second of collection
                # pauses before the call) may have begun before the erasure.
                time.sleep(1.2)
    finally:
        mem.close()
    counts = {"written": mem.llm.written, "erased": mem.llm.erased}
    (workdir / "child.json").write_text(json.dumps(counts))


# -- this process's side ----------------------------------------------------------------------


@dataclass
class RaceOutcome:
    """What the store holds of the user after a race, and what the other process said."""

    written: list[str]  # the user's recall log queries, or message contents, in order
    sessions: list[str]  # the user's sessions (capture)
    leaked: list[str]  # of what the store holds, what quotes the erased PIN
    counts: dict[str, int]  # what the other process counted
    log: str  # the other process's stderr


def _spawn(workdir: Path, *args: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATAMEM_")}
    src = str(Path(__file__).resolve().parent.parent / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    err = open(workdir / "child.err", "wb")  # noqa: SIM115 - the child holds it
    return subprocess.Popen([sys.executable, __file__, *args], stderr=err, env=env)


def _wait(probe: Callable[[], Any], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.01)


def _stopped(proc: subprocess.Popen[bytes]) -> bool:
    state = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state == "T"


def _user_with_memory(mem: Any, user: str) -> str:
    session = mem.sessions.create(user, session_id=f"s-{user}")
    mem.add_messages(session.id, [{"role": "user", "content": "My bank PIN is 4321."}])
    return str(session.id)


def _finished(proc: subprocess.Popen[bytes], workdir: Path) -> tuple[dict[str, int], str]:
    code = proc.wait(60)
    log = (workdir / "child.err").read_text()
    if code != 0:
        raise RuntimeError(f"the other process exited {code}:\n{log[-2000:]}")
    counts: dict[str, int] = json.loads((workdir / "child.json").read_text())
    return counts, log


def recall_race(db_url: str, workdir: Path, removal: str, user: str = "u-pin") -> RaceOutcome:
    """``removal`` ("erase_user" or "forget") of ``user`` while another process holds a
    recall log record quoting their PIN."""
    from stratamem import Memory

    with Memory(db_url, embedder="hash", workers=0) as mem:
        session = _user_with_memory(mem, user)
        child = _spawn(workdir, "recall", db_url, str(workdir), user)
        try:
            _wait(lambda: (workdir / "recorded").exists() and _stopped(child), 60, "the child")
            if removal == "erase_user":
                mem.erase_user(user, reason="asked")
            else:
                mem.forget(user_id=user, session_id=session, reason="asked")
        finally:
            (workdir / "removed").touch()
            child.send_signal(signal.SIGCONT)
        counts, log = _finished(child, workdir)
        records = mem.recall_log.list(user_id=user)
    texts = [r.formatted_context + (r.query or "") for r in records]
    return RaceOutcome(
        written=[r.query or "" for r in records],
        sessions=[],
        leaked=[t for t in texts if "4321" in t],
        counts=counts,
        log=log,
    )


def capture_race(db_url: str, workdir: Path, recall_on: bool, user: str = "u-cap") -> RaceOutcome:
    """``erase_user`` while another process's captured call that tells the PIN is in
    flight (recall before calls on or off)."""
    from fakes.openai_server import FakeOpenAIServer
    from stratamem import Memory

    in_call, erased = threading.Event(), threading.Event()

    def answer(body: dict[str, Any]) -> str:
        if PIN_TELLS in json.dumps(body):
            in_call.set()
            erased.wait(60)
        return "Noted."

    with FakeOpenAIServer() as llm, Memory(db_url, embedder="hash", workers=0) as mem:
        llm.chat_script = answer
        _user_with_memory(mem, user)
        args = ("capture", db_url, str(workdir), user, llm.base_url, str(int(recall_on)))
        child = _spawn(workdir, *args)
        try:
            if not in_call.wait(60):
                raise TimeoutError((workdir / "child.err").read_text()[-2000:])
            mem.erase_user(user, reason="asked")
        finally:
            erased.set()
        counts, log = _finished(child, workdir)
        written = [m.content for m in mem.messages.list(user_id=user)]
        sessions = [s.id for s in mem.sessions.list(user_id=user)]
    return RaceOutcome(
        written=written,
        sessions=sessions,
        leaked=[t for t in written if "4321" in t],
        counts=counts,
        log=log,
    )


if __name__ == "__main__":
    command, db_url, workdir, user, *rest = sys.argv[1:]
    if command == "recall":
        _child_recall(db_url, Path(workdir), user)
    elif command == "capture":
        _child_capture(db_url, Path(workdir), user, rest[0], rest[1] == "1")
    else:
        raise SystemExit(f"unknown command {command!r}")
