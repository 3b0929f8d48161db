"""When processing fails, end to end: an outage of the model pauses processing, which
resumes by itself once the model answers again, without counting attempts; a model that
answers unusably counts attempts, each job its own; a job that fails is isolated from the
jobs around it. Real SDKs against fake servers on 127.0.0.1, both stores, the real queue."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import dbsql
from fakes.anthropic_server import FakeAnthropicServer
from fakes.memory_model import MemoryModel
from fakes.openai_server import FakeOpenAIServer
from stratamem import Memory
from stratamem.cli import main
from stratamem.errors import ProcessingError

SPECS = {"openai": "openai:fake-chat", "anthropic": "anthropic:fake-claude"}
# What the error of each fault says (the SDK's exception, or the status).
CAUSES = {"hang": "APITimeoutError", "refuse": "APIConnectionError"}


def _server(provider: str) -> Any:
    server = FakeOpenAIServer() if provider == "openai" else FakeAnthropicServer()
    server.chat_script = MemoryModel()
    return server.start()


def _memory(make_memory: Callable[..., Memory], server: Any, provider: str, **kw: Any) -> Memory:
    options: dict[str, Any] = {
        "llm": SPECS[provider],
        "llm_base_url": server.base_url,
        "llm_api_key": "k",
        "llm_max_retries": 0,
        "llm_timeout_seconds": 10.0,
        "job_max_attempts": 3,
        "job_backoff_seconds": 0.01,
        "outage_backoff_seconds": 0.05,
        "outage_backoff_max_seconds": 0.2,
    }
    return make_memory(**{**options, **kw})


def _say(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def _until(check: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
    return value


def _failures(mem: Memory) -> int:
    outages = mem.stats()["processing"].get("outages", [])
    return sum(o["failures"] for o in outages)


def _messages(mem: Memory) -> list[tuple[Any, ...]]:
    return dbsql.rows(
        mem.settings.database_url, "SELECT status, attempts FROM messages ORDER BY pk"
    )


@pytest.mark.parametrize(
    ("provider", "fault"),
    [("openai", f) for f in ("hang", 500, 429, "refuse", 401)]
    + [("anthropic", f) for f in ("hang", 529, 429, "refuse")],
)
def test_an_outage_pauses_processing_until_the_model_answers_again(
    make_memory: Callable[..., Memory], provider: str, fault: str | int
) -> None:
    server = _server(provider)
    try:
        mem = _memory(
            make_memory, server, provider, llm_timeout_seconds=0.5 if fault == "hang" else 10.0
        )
        server.fault(fault)
        sessions = [mem.sessions.create(user_id=f"u{i}") for i in range(2)]
        for n in range(3):
            for s in sessions:
                s.add_messages(_say(f"I ordered parcel {n} for my sister {s.user_id}."))
        # However many probes fail, no message fails, and the stats say why nothing moves.
        _until(lambda: _failures(mem) >= 3, "three failures")
        stats = mem.stats()
        assert stats["messages"] == {"pending": 6, "processed": 0, "failed": 0}
        assert stats["jobs"]["failed"] == 0
        state = stats["processing"]
        assert state["paused"] and state["since"] <= state["next_probe"]
        [outage] = state["outages"]
        assert outage["service"] == f"llm {SPECS[provider]}"
        assert CAUSES.get(str(fault), f"HTTP {fault}") in outage["last_error"]
        # The model is back: everything is processed, with no operator action, and the
        # outage cost no message an attempt.
        server.heal()
        mem.wait(timeout=60)
        assert _messages(mem) == [("processed", 1)] * 6
        assert mem.stats()["processing"] == {"paused": False}
    finally:
        server.close()


def test_another_process_sees_the_pause_in_stratamem_stats(
    make_memory: Callable[..., Memory], db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    server = _server("openai")
    try:
        mem = _memory(make_memory, server, "openai")
        server.fault(503)
        mem.sessions.create(user_id="u").add_messages(_say("I ordered a parcel for my sister."))
        _until(lambda: _failures(mem) >= 2, "two failures")

        def stats(*extra: str) -> str:
            cli = [sys.executable, "-m", "stratamem.cli", "--db", db_url, "--embedder", "hash"]
            return subprocess.run(
                [*cli, "stats", *extra],
                capture_output=True,
                text=True,
                timeout=120,
                check=True,
            ).stdout

        state = json.loads(stats("--json"))["processing"]
        assert state["paused"] and state["outages"][0]["service"] == "llm openai:fake-chat"
        assert "HTTP 503" in state["outages"][0]["last_error"]
        assert main(["--db", db_url, "--embedder", "hash", "stats"]) == 0
        line = next(x for x in capsys.readouterr().out.splitlines() if "processing:" in x)
        assert "paused since" in line and "llm openai:fake-chat unavailable" in line
        assert "HTTP 503" in line and "next probe at" in line
        server.heal()
        mem.wait(timeout=60)
        assert json.loads(stats("--json"))["processing"] == {"paused": False}
    finally:
        server.close()


def test_waits_during_an_outage_say_so_and_close_does_not_wait(
    make_memory: Callable[..., Memory],
) -> None:
    server = _server("openai")
    try:
        mem = _memory(make_memory, server, "openai", sync_timeout_seconds=1.0)
        server.fault(503)
        session = mem.sessions.create(user_id="u")
        # A sync write that times out during an outage says why nothing moved.
        with pytest.raises(ProcessingError, match="processing is paused: llm openai:fake-chat"):
            session.add_messages(_say("I ordered a parcel for my sister."), sync=True)
        session.add_messages(_say("I ordered a parcel for my brother."))
        _until(lambda: mem.stats()["processing"]["paused"], "the pause")
        # Nothing is processed before the model answers: close() does not run its clock out
        # (it waited all of close_timeout_seconds), the jobs stay queued in the store.
        started = time.monotonic()
        mem.close(timeout=10)
        assert time.monotonic() - started < 5
        assert [s for s, _ in _messages(mem)] == ["pending", "pending"]
    finally:
        server.close()


def test_one_probe_at_a_time_reaches_a_dead_model(make_memory: Callable[..., Memory]) -> None:
    server = _server("openai")
    try:
        # Two processes' worth of workers on one store: four batches can run at once.
        mems = [_memory(make_memory, server, "openai", workers=2) for _ in range(2)]
        server.fault(500)
        for i in range(8):
            mems[i % 2].sessions.create(user_id=f"u{i}").add_messages(
                _say(f"I ordered parcel {i} for my sister.")
            )
        _until(lambda: _failures(mems[0]) >= 6, "six failures")
        calls = len(server.chat_requests())
        failures = _failures(mems[0])
        # Each call fails a batch (no SDK retries). Counted: the one that began the outage
        # and every probe; not: batches already under way when it began (at most one per
        # other worker), and a probe whose failure was not recorded yet when counted.
        assert calls <= failures + 3 + 1
        server.heal()
        for mem in mems:
            mem.wait(timeout=60)
        assert _messages(mems[0]) == [("processed", 1)] * 8
    finally:
        server.close()


@pytest.mark.parametrize("fault", ["invalid_json", "wrong_schema", 400])
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_an_unusable_model_fails_each_job_after_its_own_attempts(
    make_memory: Callable[..., Memory], provider: str, fault: str | int
) -> None:
    server = _server(provider)
    try:
        mem = _memory(make_memory, server, provider)
        server.fault(fault)
        s = mem.sessions.create(user_id="u")
        server.hold.clear()
        s.add_messages(_say("I ordered a parcel for my sister."))
        assert server.held.wait(30)  # the first job's first attempt is under way ...
        s.add_messages(_say("I ordered another parcel for my brother."))  # ... and this waits
        server.hold.set()
        mem.wait(timeout=60)
        # The model answered, unusably: attempts count, but each job's own, so the later
        # job is not failed by the attempts of the one before it.
        assert _messages(mem) == [("failed", 3), ("failed", 3)]
        assert mem.stats()["processing"] == {"paused": False}
    finally:
        server.close()


def _poisoned(model: MemoryModel) -> Callable[[dict[str, Any]], str]:
    """The model's answers, except unusable ones for a batch with a POISON message."""

    def answer(body: dict[str, Any]) -> str:
        _, user = MemoryModel._texts(body)
        if "POISON" in user.split("MESSAGES:", 1)[-1]:  # not in the context of later ones
            return "I cannot answer that."
        return model(body)

    return answer


def test_a_job_accepted_before_a_failing_batchs_last_attempt_keeps_its_own_attempts(
    make_memory: Callable[..., Memory],
) -> None:
    server = _server("openai")
    try:
        calls = itertools.count(1)
        second_attempt, accepted = threading.Event(), threading.Event()
        poisoned = _poisoned(MemoryModel())

        def script(body: dict[str, Any]) -> str:
            if next(calls) == 3:  # the first call of the poison's second attempt (of 3)
                second_attempt.set()
                accepted.wait(30)
            return poisoned(body)

        server.chat_script = script
        mem = _memory(make_memory, server, "openai")
        s = mem.sessions.create(user_id="u")
        s.add_messages(_say("POISON that no model can read."))
        assert second_attempt.wait(30)
        s.add_messages(_say("I ordered a parcel for my sister."))  # before the last attempt
        accepted.set()
        mem.wait(timeout=60)
        # The poison failed for good after its own three attempts; the job accepted meanwhile
        # did not share them (and was not failed after one attempt of its own).
        assert _messages(mem) == [("failed", 3), ("processed", 1)]
    finally:
        server.close()


def test_a_poison_job_is_isolated_and_the_jobs_around_it_go_through(
    make_memory: Callable[..., Memory],
) -> None:
    server = _server("openai")
    try:
        server.chat_script = _poisoned(MemoryModel())
        mem = _memory(make_memory, server, "openai", workers=0)
        s = mem.sessions.create(user_id="u")
        for n in range(6):
            text = "POISON that no model can read." if n == 2 else f"I ordered parcel {n}."
            s.add_messages(_say(text))
        mem.wait(timeout=60)
        # Claimed as one batch, which failed; its retries took halves until the poison was
        # alone. Only its own attempts counted; the others went through at their first.
        assert _messages(mem) == [("processed", 1)] * 2 + [("failed", 3)] + [("processed", 1)] * 3
        facts = mem.facts.list(user_id="u", limit=100)
        assert len(facts) == 5 and not any("POISON" in f.text for f in facts)
    finally:
        server.close()
