"""mem.recall_log: what capture, the memory proxy and the REST context routes recalled and
injected, recorded off the caller's path, bounded, per project, erased with the user; on
SQLite and PostgreSQL (conftest's ``make_memory``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import anthropic
import openai
import pytest

from fakes.anthropic_server import FakeAnthropicServer
from fakes.openai_server import FakeOpenAIServer
from inproc_server import InProcessServer
from stratamem import Memory
from stratamem.errors import ValidationError
from stratamem.proxy import create_proxy_app
from stratamem.server import ServerSettings, create_app, load_server_settings
from stratamem.store import RecallRecordRow
from stratamem.types import RecallRecord

FACT = "I am allergic to peanuts."


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as s:
        s.chat_script = lambda body: "Noted!"
        yield s


def _seeded(make_memory: Any, **settings: Any) -> Memory:
    mem: Memory = make_memory(**settings)
    s = mem.sessions.create(user_id="ana", session_id="facts")
    s.add_messages([{"role": "user", "content": FACT}], sync=True)
    return mem


def _ask(mem: Memory, server: FakeOpenAIServer, question: str, user: str = "ana") -> None:
    client = mem.llm.register(openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0))
    with mem.scope(user_id=user, session_id="chat"):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": question}])


def _record(mem: Memory, user: str = "ana", **kw: Any) -> None:
    values: dict[str, Any] = {
        "user_id": user,
        "session_id": "s",
        "source": "rest",
        "request": "POST /api/sessions/s/context",
        "query": "q",
        "outcome": "none",
        "latency_ms": 1.0,
        **kw,
    }
    mem.recall_log.record(**values)


# -- capture -----------------------------------------------------------------------------------


def test_capture_records_what_it_injected(make_memory: Any, server: FakeOpenAIServer) -> None:
    mem = _seeded(make_memory)
    _ask(mem, server, "Suggest a snack with peanuts?")
    _ask(mem, server, "xyzzy plugh")  # nothing relevant: hash embedder, no shared words
    injected = server.chat_requests()[0]["messages"][-1]["content"]
    records = mem.recall_log.list()
    assert all(isinstance(r, RecallRecord) for r in records)
    first = records[-1]
    assert (first.project_id, first.user_id, first.session_id) == (mem.project_id, "ana", "chat")
    assert (first.source, first.request, first.outcome) == (
        "capture",
        "openai chat.completions",
        "injected",
    )
    assert first.query == "Suggest a snack with peanuts?"
    assert first.formatted_context and first.formatted_context in injected
    assert "peanuts" in first.formatted_context and first.hits >= 1
    assert first.latency_ms > 0 and first.created_at.tzinfo is not None
    second = records[0]  # newest first
    assert second.query == "xyzzy plugh"
    if second.outcome == "none":
        assert second.formatted_context == "" and second.hits == 0
    assert [r.query for r in mem.recall_log.list(limit=1)] == ["xyzzy plugh"]
    assert [r.query for r in mem.recall_log.list(limit=1, offset=1)] == [first.query]


def test_anthropic_capture_names_its_endpoint(make_memory: Any) -> None:
    mem = _seeded(make_memory)
    with FakeAnthropicServer() as ant:
        ant.chat_script = lambda body: "Noted."
        client = mem.llm.register(
            anthropic.Anthropic(base_url=ant.base_url, api_key="k", max_retries=0)
        )
        with mem.scope(user_id="ana", session_id="chat"):
            client.messages.create(
                model="c",
                max_tokens=16,
                messages=[{"role": "user", "content": "peanuts snack?"}],
            )
    [record] = mem.recall_log.list()
    assert (record.source, record.request) == ("capture", "anthropic messages")


def test_a_recall_past_its_bound_is_recorded_as_skipped(
    make_memory: Any, server: FakeOpenAIServer
) -> None:
    with FakeOpenAIServer() as embeddings:
        mem = make_memory(
            embedder="openai:fake-embed",
            embedder_base_url=embeddings.base_url,
            embedder_api_key="k",
            capture_recall_timeout_ms=50,
        )
        embeddings.delay_next(2.0, n=5)  # the memory side's embedding service hangs
        _ask(mem, server, "still there?")
        [record] = mem.recall_log.list()
    assert (record.outcome, record.formatted_context, record.hits) == ("skipped", "", 0)
    assert record.query == "still there?" and record.latency_ms > 0


def test_no_recall_no_record_and_the_off_switch(make_memory: Any, server: FakeOpenAIServer) -> None:
    quiet = _seeded(make_memory, capture_recall=False)
    _ask(quiet, server, "peanuts?")  # captured, but nothing was recalled
    assert quiet.recall_log.list() == []
    off = _seeded(make_memory, recall_log=False)
    assert not off.recall_log.enabled
    _ask(off, server, "peanuts?")
    _record(off)  # a face's record is a no-op too
    off.wait()
    assert off.recall_log.list() == []


# -- the proxy and REST ------------------------------------------------------------------------


def test_the_proxy_records_its_route(make_memory: Any, server: FakeOpenAIServer) -> None:
    mem = _seeded(make_memory)
    settings = load_server_settings(proxy_upstream=server.base_url)
    with ExitStack() as stack:
        proxy = stack.enter_context(InProcessServer(create_proxy_app(mem, settings)))
        client = openai.OpenAI(
            base_url=f"{proxy.url}/v1",
            api_key="sk-x",
            max_retries=0,
            default_headers={"X-Stratamem-User-Id": "ana", "X-Stratamem-Session-Id": "px"},
        )
        client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "snack with peanuts?"}]
        )
    [record] = mem.recall_log.list()
    assert (record.source, record.request) == ("proxy", "POST /v1/chat/completions")
    assert (record.user_id, record.session_id, record.outcome) == ("ana", "px", "injected")
    sent = server.chat_requests()[-1]["messages"][-1]["content"]
    assert record.formatted_context in sent


def test_rest_context_routes_record(make_memory: Any) -> None:
    from fastapi.testclient import TestClient

    mem = _seeded(make_memory)
    project = mem.projects.create("P", project_id="rest-p")
    secret = mem.keys.create(project.id)[1]
    view = mem.for_project(project.id)
    s = view.sessions.create(user_id="bo", session_id="s/1")
    s.add_messages([{"role": "user", "content": FACT}], sync=True)
    with TestClient(create_app(mem, ServerSettings())) as tc:
        auth = {"Authorization": f"Api-Key {secret}"}
        r = tc.post("/api/sessions/s/1/context", json={"query": "peanuts?"}, headers=auth)
        assert r.status_code == 200 and r.json()["data"]["matches"] is None
        r = tc.get("/api/sessions/s/1/context?query=peanuts&details=true", headers=auth)
        assert r.status_code == 200 and r.json()["data"]["matches"]
        assert tc.get("/api/sessions/nope/context?query=x", headers=auth).status_code == 404
    get, post = view.recall_log.list()
    assert (post.source, post.request, post.user_id) == (
        "rest",
        "POST /api/sessions/s/1/context",
        "bo",
    )
    assert post.outcome == "injected" and "peanuts" in post.formatted_context
    assert post.hits >= 1 and get.request == "GET /api/sessions/s/1/context"
    assert mem.recall_log.list() == []  # another project's log


# -- bounds, scope, erasure --------------------------------------------------------------------


def test_bounded_by_entries_and_retention(make_memory: Any) -> None:
    mem: Memory = make_memory(recall_log_max_entries=3, recall_log_retention_hours=1)
    old = time.time() - 2 * 3600
    mem.store.add_recall_records(
        [RecallRecordRow(mem.project_id, "ana", None, "rest", "r", None, "none", "", 0, 1.0, old)]
    )
    for i in range(5):
        _record(mem, query=f"q{i}")
    mem.wait()  # stores the buffer, pruning as it goes
    assert [r.query for r in mem.recall_log.list()] == ["q4", "q3", "q2"]


def test_a_writer_that_falls_behind_drops_the_oldest(make_memory: Any) -> None:
    from stratamem._recall_log import RecallRecorder

    mem: Memory = make_memory()
    recorder = RecallRecorder(mem.store, max_entries=100, retention_hours=1, capacity=2)
    now = time.time()
    rows = [
        RecallRecordRow(mem.project_id, "ana", None, "rest", "r", f"q{i}", "none", "", 0, 1.0, now)
        for i in range(1, 4)
    ]
    # The writer is held (as a slow store would hold it): the buffer overflows.
    with recorder._write_lock:
        for row in rows:
            recorder.record(row)
    recorder.close()
    assert recorder.dropped == 1
    assert [r.query for r in mem.recall_log.list()] == ["q3", "q2"]


def test_project_views_see_only_their_project(make_memory: Any) -> None:
    mem: Memory = make_memory()
    other = mem.for_project("other-p")
    _record(mem, query="mine")
    _record(other, query="theirs")
    assert [r.query for r in mem.recall_log.list()] == ["mine"]
    assert [(r.query, r.project_id) for r in other.recall_log.list()] == [("theirs", "other-p")]
    assert [b.count for b in other.recall_log.latency()] == [1]


def test_erase_user_and_forget_remove_the_users_records(make_memory: Any) -> None:
    mem = _seeded(make_memory)
    mem.sessions.create(user_id="bo", session_id="bo-s").add_messages(
        [{"role": "user", "content": "I like tea."}], sync=True
    )
    _record(mem, "ana")
    _record(mem, "bo")
    mem.forget(user_id="ana", session_id="facts")
    assert [r.user_id for r in mem.recall_log.list()] == ["bo"]
    # A recall that begins after the forget (not within its millisecond: one that may have
    # begun before it is not written, tests/test_erasure_race.py) is logged again.
    time.sleep(0.01)
    _record(mem, "ana")
    mem.erase_user("bo")
    assert [r.user_id for r in mem.recall_log.list()] == ["ana"]
    assert mem.recall_log.list(user_id="bo") == []


def test_latency_buckets_and_arguments(make_memory: Any) -> None:
    mem: Memory = make_memory()
    now = time.time()
    hour = 3600.0
    aligned = (now // hour) * hour
    rows = [
        RecallRecordRow(mem.project_id, "ana", None, "rest", "r", None, o, "", 0, ms, at)
        for o, ms, at in [
            ("none", 10.0, aligned - hour + 1),
            ("none", 30.0, aligned - hour + 2),
            ("skipped", 50.0, aligned + 1),
            ("none", 1.0, aligned - 30 * hour),  # outside a 24 h window
        ]
    ]
    mem.store.add_recall_records(rows)
    previous, current = mem.recall_log.latency(hours=24, bucket_minutes=60)
    assert previous.bucket_start.timestamp() == aligned - hour
    assert (previous.count, previous.skipped, previous.p50_ms, previous.max_ms) == (
        2,
        0,
        10.0,
        30.0,
    )
    assert (current.count, current.skipped, current.p95_ms) == (1, 1, 50.0)
    with pytest.raises(ValidationError):
        mem.recall_log.latency(hours=0)
    with pytest.raises(ValidationError):
        mem.recall_log.latency(hours=24 * 365, bucket_minutes=0.01)
    with pytest.raises(ValidationError):
        mem.recall_log.list(limit=0)
