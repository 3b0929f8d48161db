"""The other process of tests/test_erasure_race.py (and the fault matrix's erasure case): it
holds something of a user in memory while the test's process erases that user, then writes
it, as a proxy, a ``serve`` replica or an app using ``mem.llm`` would.

    python tests/erasure_child.py recall  DB_URL WORKDIR USER
    python tests/erasure_child.py capture DB_URL WORKDIR USER BASE_URL RECALL(0|1)

``recall``: logs a recall that injected the user's PIN (buffered, as every face's are), then
stops itself (SIGSTOP) before its writer's first flush; the test erases the user, writes
WORKDIR/removed and continues it (SIGCONT); it then logs a recall of the user coming back
and closes, which writes what is buffered. ``capture``: a captured OpenAI SDK call that
tells the PIN, whose answer the test's fake server holds until the user is erased; then a
call of the user coming back. Both write what they counted to WORKDIR/child.json.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

PIN_BLOCK = "<memory>\n- [2026-12-01] User's bank PIN is 4321.\n</memory>"
PIN_TELLS = "My bank PIN is 4321, remember it."
BACK_TELLS = "I'm back: my new bank PIN is 9876."


def recall(db_url: str, workdir: Path, user: str) -> None:
    from stratamem import Memory

    mem = Memory(db_url, embedder="hash", workers=0)
    try:
        mem.recall_log.record(
            user_id=user,
            session_id=None,
            source="capture",
            request="openai chat.completions",
            query="what is my PIN?",
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
        mem.recall_log.record(
            user_id=user,
            session_id=None,
            source="capture",
            request="openai chat.completions",
            query="I'm back",
            outcome="none",
            latency_ms=2.0,
        )
    finally:
        mem.close()
    recorder = mem._engine.recall_log
    assert recorder is not None
    (workdir / "child.json").write_text(json.dumps({"erased": recorder.erased}))


def capture(db_url: str, workdir: Path, user: str, base_url: str, recall_on: bool) -> None:
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


if __name__ == "__main__":
    command, db_url, workdir, user, *rest = sys.argv[1:]
    if command == "recall":
        recall(db_url, Path(workdir), user)
    elif command == "capture":
        capture(db_url, Path(workdir), user, rest[0], rest[1] == "1")
    else:
        raise SystemExit(f"unknown command {command!r}")
