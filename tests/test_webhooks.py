"""Webhooks end to end: stored hooks, real HTTP receivers on 127.0.0.1, the real pipeline.

The receivers are real HTTP servers (tests/fakes/webhook_receiver.py); signatures are
checked with the ``standardwebhooks`` package, as a receiver would; the LLM is the scripted
model behind a loopback OpenAI-compatible server. 127.0.0.1 is reachable only because each
Memory here allows it (``webhook_allow``); the SSRF tests run without that.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pytest
import standardwebhooks

import dbsql
from fakes.memory_model import MemoryModel
from fakes.openai_server import FakeOpenAIServer
from fakes.webhook_receiver import WebhookReceiver
from stratamem import Memory, NotFoundError, ValidationError

POINTS = [
    ("fact", "before_llm"),
    ("fact", "after_llm"),
    ("fact", "before_add"),
    ("summary", "before_llm"),
    ("summary", "after_llm"),
    ("summary", "before_add"),
    ("topic", "before_add"),
]

TURNS = [
    ("w1", "user", "I love oat milk lattes every morning."),
    ("w2", "assistant", "Noted."),
    ("w3", "user", "My sister Mia lives in Porto."),
    ("w4", "user", "I work as a nurse at the city hospital."),
]


def _messages(rows: list[tuple[str, str, str]] = TURNS) -> list[dict[str, Any]]:
    return [
        {"id": mid, "role": role, "content": text, "timestamp": f"2026-03-0{i + 1}T10:00:00Z"}
        for i, (mid, role, text) in enumerate(rows)
    ]


def _verify(secret: str, request: Any) -> dict[str, Any]:
    """What a receiver does first: check the signature (raises if it does not match)."""
    return standardwebhooks.Webhook(secret).verify(request.body, request.headers)


def _sql(mem: Memory, query: str, *args: Any) -> list[tuple[Any, ...]]:
    return dbsql.rows(mem.settings.database_url, query, *args)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as r:
        yield r


@pytest.fixture
def llm(model: MemoryModel) -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as server:
        server.chat_script = model
        yield server


def _llm_memory(make_memory: Any, server: FakeOpenAIServer, **kw: Any) -> Memory:
    kw.setdefault("webhook_allow", "127.0.0.1")
    return make_memory(
        llm="openai:fake-chat",
        llm_base_url=server.base_url,
        llm_api_key="k",
        llm_max_retries=0,
        job_backoff_seconds=0.01,
        **kw,
    )


# -- every point, sync --------------------------------------------------------------------


def test_every_point_is_delivered_signed_and_its_answer_applied(
    make_memory: Any, llm: FakeOpenAIServer, model: MemoryModel, receiver: WebhookReceiver
) -> None:
    mem = _llm_memory(make_memory, llm)

    def shout(payload: dict[str, Any]) -> tuple[int, Any]:
        items = payload["data"]["observations"]
        for item in items:
            item["text"] = item["text"].replace("User:", "USER:")
        return 200, {"data": {"observations": items}}

    def label(payload: dict[str, Any]) -> tuple[int, Any]:
        props = payload["data"]["propositions"]
        for p in props:
            p["labels"] = ["synced"]
        return 200, {"data": {"propositions": props}}

    def rename(payload: dict[str, Any]) -> tuple[int, Any]:
        topics = payload["data"]["topics"]
        for t in topics:
            t["name"] = "crm: " + t["name"]
        return 200, {"data": {"topics": topics}}

    answers: dict[str, Any] = {
        "fact.before_llm": (200, {"data": {"instruction": "Mind allergies."}}),
        # after_llm answers are ignored, even when they try to change something.
        "fact.after_llm": (200, {"data": {"observations": []}}),
        "fact.before_add": shout,
        "summary.before_llm": (200, {"data": {"instruction": "Keep dates."}}),
        "summary.after_llm": (200, "ok, not JSON, ignored"),
        "summary.before_add": label,
        "topic.before_add": rename,
    }
    secrets = {}
    for resource, event in POINTS:
        point = f"{resource}.{event}"
        receiver.script(f"/{point}", answers[point])
        hook, secrets[point] = mem.webhooks.create(
            resource=resource, event=event, target_url=receiver.url(f"/{point}")
        )
        assert hook.mode == "sync" and hook.enabled and hook.name == point

    s = mem.sessions.create(user_id="ana", session_id="chat-1")
    s.add_messages(_messages(), sync=True)

    payloads = {}
    for resource, event in POINTS:
        point = f"{resource}.{event}"
        got = receiver.at(f"/{point}")
        assert len(got) == 1, point
        payload = _verify(secrets[point], got[0])  # signed with that hook's own secret
        with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):
            other = secrets["topic.before_add" if point != "topic.before_add" else "fact.after_llm"]
            _verify(other, got[0])
        assert got[0].headers["webhook-id"] == payload["delivery_id"]
        assert payload["version"] == 1 and payload["mode"] == "sync"
        assert (payload["resource"], payload["event"]) == (resource, event)
        assert payload["project_id"] == mem.project_id and payload["hook_name"] == point
        ctx = payload["context"]
        assert ctx["user_id"] == "ana" and ctx["session_id"] == ctx["thread_id"] == "chat-1"
        assert ctx["message_ids"] == ["w1", "w2", "w3", "w4"]
        payloads[point] = payload["data"]
    ids = [r.headers["webhook-id"] for r in receiver.requests]
    assert len(set(ids)) == len(ids)  # a unique delivery id per delivery

    # data of each point, as docs/webhooks.md specifies it
    assert [m["id"] for m in payloads["fact.before_llm"]["messages"]] == ["w1", "w2", "w3", "w4"]
    assert payloads["fact.before_llm"]["messages"][0]["content"] == TURNS[0][2]
    assert set(payloads["fact.after_llm"]) == {"raw_output", "observations"}
    assert json.loads(payloads["fact.after_llm"]["raw_output"])["facts"]
    assert {o["message_ids"][0] for o in payloads["fact.before_add"]["observations"]} == {
        "w1",
        "w3",
        "w4",
    }
    assert set(payloads["summary.before_llm"]) == {"observations", "propositions"}
    assert all(o["id"].startswith("f_") for o in payloads["summary.before_llm"]["observations"])
    assert set(payloads["summary.after_llm"]) == {"raw_output", "observations", "propositions"}
    assert set(payloads["summary.before_add"]) == {"propositions", "observations"}
    assert all(
        o["text"].startswith("USER:") for o in payloads["summary.before_add"]["observations"]
    )
    assert set(payloads["topic.before_add"]) == {"topics", "propositions"}
    filed = {p["id"] for p in payloads["topic.before_add"]["propositions"]}
    assert filed == {
        sid for t in payloads["topic.before_add"]["topics"] for sid in t["summary_ids"]
    }

    # answers applied: instructions appended to the user prompt only, edits stored
    extract_user = next(u for stage, _, u in model.prompts if stage == "extract")
    extract_system = next(sy for stage, sy, _ in model.prompts if stage == "extract")
    assert extract_user.endswith("Additional instructions:\nMind allergies.")
    assert "Mind allergies" not in extract_system
    assert next(u for st, _, u in model.prompts if st == "consolidate").endswith("Keep dates.")
    facts = mem.facts.list(user_id="ana")
    assert len(facts) == 3 and all(f.text.startswith("USER:") for f in facts)
    assert all(x.labels == ["synced"] for x in mem.summaries.list(user_id="ana"))
    assert all(t.name.startswith("crm: ") for t in mem.topics.list(user_id="ana"))

    for hook in mem.webhooks.list():
        (delivery,) = mem.webhooks.deliveries(hook.id)
        assert delivery.status == "delivered", (hook.name, delivery.reason)
        assert delivery.http_status == 200 and delivery.latency_ms > 0
        assert delivery.mode == "sync" and delivery.attempt == 1
        assert delivery.request.startswith('{"version":1,') and delivery.user_id == "ana"
    by_name = {h.name: h for h in mem.webhooks.list()}
    fact_add = mem.webhooks.deliveries(by_name["fact.before_add"].id)[0]
    assert fact_add.reason == "3 observations" and "USER:" in fact_add.response
    after = mem.webhooks.deliveries(by_name["summary.after_llm"].id)[0]
    assert after.reason == "HTTP 200 (answers are ignored)"


def test_offline_pipeline_calls_before_add_webhooks(
    make_memory: Any, receiver: WebhookReceiver
) -> None:
    # Without an LLM there is no LLM call, so only the before_add points fire.
    mem = make_memory(webhook_allow="127.0.0.1", workers=0)
    for resource, event in POINTS:
        mem.webhooks.create(
            resource=resource, event=event, target_url=receiver.url(f"/{resource}.{event}")
        )
    s = mem.sessions.create(user_id="u")
    s.add_messages(_messages(TURNS[:1]), sync=True)
    assert [r.path for r in receiver.requests] == [
        "/fact.before_add",
        "/summary.before_add",
        "/topic.before_add",
    ]


def test_before_add_answers_with_text_no_store_can_hold_are_skipped(
    make_memory: Any, receiver: WebhookReceiver
) -> None:
    # A lone surrogate where the answer's schema has a free string fails validation like any
    # other bad answer (before, SQLite stored it escaped and PostgreSQL failed the batch).
    def spoil(key: str, field: str, value: Any) -> Any:
        def edit(payload: dict[str, Any]) -> tuple[int, Any]:
            items = payload["data"][key]
            for item in items:
                item[field] = value
            return 200, {"data": {key: items}}

        return edit

    receiver.script("/summary", spoil("propositions", "labels", ["\udfff"]))
    receiver.script("/topic", spoil("topics", "description", "about \ud800"))
    mem = make_memory(webhook_allow="127.0.0.1", workers=0)
    mem.webhooks.create(resource="summary", event="before_add", target_url=receiver.url("/summary"))
    mem.webhooks.create(resource="topic", event="before_add", target_url=receiver.url("/topic"))
    s = mem.sessions.create(user_id="u")
    s.add_messages(_messages(TURNS[:1]), sync=True)
    assert {m.status for m in s.messages()} == {"processed"}
    for hook in mem.webhooks.list():
        (delivery,) = mem.webhooks.deliveries(hook.id)
        assert delivery.status == "failed" and "failed validation" in delivery.reason
    assert mem.summaries.list(user_id="u") and mem.topics.list(user_id="u")


# -- order and chaining ---------------------------------------------------------------------


def test_hooks_chain_in_creation_order_after_in_process_hooks(
    make_memory: Any, llm: FakeOpenAIServer, model: MemoryModel, receiver: WebhookReceiver
) -> None:
    mem = _llm_memory(make_memory, llm)
    mem.hooks.register(
        "fact", "before_llm", lambda p: {"data": {"instruction": "first (in process)"}}
    )
    receiver.script("/i2", (200, {"data": {"instruction": "second"}}))
    receiver.script("/i3", (200, {"data": {"instruction": "third"}}))
    mem.webhooks.create(resource="fact", event="before_llm", target_url=receiver.url("/i2"))
    mem.webhooks.create(resource="fact", event="before_llm", target_url=receiver.url("/i3"))

    def in_process(payload: dict[str, Any]) -> Any:
        kept = [o for o in payload["data"]["observations"] if "nurse" not in o["text"]]
        return {"data": {"observations": kept}}

    def tag(marker: str) -> Any:
        def edit(payload: dict[str, Any]) -> tuple[int, Any]:
            items = payload["data"]["observations"]
            for o in items:
                o["text"] += marker
            return 200, {"data": {"observations": items}}

        return edit

    mem.hooks.register("fact", "before_add", in_process)
    receiver.script("/a", tag(" [a]"))
    receiver.script("/b", tag(" [b]"))
    mem.webhooks.create(resource="fact", event="before_add", target_url=receiver.url("/a"))
    mem.webhooks.create(resource="fact", event="before_add", target_url=receiver.url("/b"))

    s = mem.sessions.create(user_id="u")
    s.add_messages(_messages(), sync=True)

    user = next(u for stage, _, u in model.prompts if stage == "extract")
    assert user.endswith("Additional instructions:\nfirst (in process)\nsecond\nthird")
    # /a saw the in-process edit (no nurse); /b saw /a's edit; the store has both markers.
    seen_a = receiver.at("/a")[0].json["data"]["observations"]
    seen_b = receiver.at("/b")[0].json["data"]["observations"]
    assert seen_a and not any("nurse" in o["text"] for o in seen_a)
    assert all(o["text"].endswith(" [a]") for o in seen_b)
    assert sorted(f.text for f in mem.facts.list(user_id="u")) == sorted(
        o["text"] + " [b]" for o in seen_b
    )


# -- failures -------------------------------------------------------------------------------

FAILURES = {
    "hang": ("/hang", "waiting for the status line and headers (timeout 300 ms)"),
    "huge": ("/huge", "answer over 1048576 bytes (cut)"),
    "redirect": ("/redirect", "HTTP 302: redirect to http://169.254.169.254/"),
    "non-2xx": ("/status/500", "HTTP 500"),
    "invalid JSON": ("/not-json", "answer is not valid JSON"),
    "not an object": ("/list", "answer is list, not an object"),
    "data not an object": ("/data-string", "answer.data is not an object"),
    "failed validation": ("/foreign", "failed validation"),
    # A label with a lone surrogate (the JSON escape "\ud800"), which no store can hold.
    "unstorable text": ("/surrogate", "failed validation"),
    "unreachable": (None, "unreachable: ConnectError"),
}


@pytest.mark.parametrize("case", list(FAILURES))
def test_a_failing_webhook_is_logged_and_skipped(
    make_memory: Any, receiver: WebhookReceiver, case: str
) -> None:
    path, reason = FAILURES[case]
    url = receiver.url(path) if path else f"http://127.0.0.1:{_closed_port()}/hook"
    # A before_add hook that tries to inject another user's message: validation refuses it.
    receiver.script(
        "/foreign",
        (
            200,
            {
                "data": {
                    "observations": [
                        {
                            "text": "User is a billionaire.",
                            "kind": "fact",
                            "message_ids": ["someone-elses-message"],
                            "confidence": 1.0,
                        }
                    ]
                }
            },
        ),
    )
    receiver.script(
        "/surrogate",
        (
            200,
            {
                "data": {
                    "observations": [
                        {
                            "text": "User is a billionaire.",
                            "kind": "fact",
                            "message_ids": ["w1"],
                            "confidence": 1.0,
                            "labels": ["rich", "\ud800"],
                        }
                    ]
                }
            },
        ),
    )
    mem = make_memory(webhook_allow="127.0.0.1", workers=0)
    # Only the hanging receiver needs a short timeout; the others answer at once, and on a
    # loaded machine 300 ms would turn their failure into a timeout.
    timeout_ms = 300 if case == "hang" else 5000
    bad, _ = mem.webhooks.create(
        resource="fact", event="before_add", target_url=url, timeout_ms=timeout_ms, name=case
    )
    # A later hook still runs, and receives the data the failing one could not change.
    after, _ = mem.webhooks.create(
        resource="fact", event="before_add", target_url=receiver.url("/after")
    )
    s = mem.sessions.create(user_id="u")
    started = time.monotonic()
    s.add_messages(_messages(TURNS[:1]), sync=True)
    assert time.monotonic() - started < 15  # bounded by the hook's timeout, not the receiver

    facts = mem.facts.list(user_id="u")
    assert [f.message_ids for f in facts] == [["w1"]]  # the engine's own output was kept
    assert "billionaire" not in facts[0].text
    (seen,) = receiver.at("/after")
    assert seen.json["data"]["observations"][0]["message_ids"] == ["w1"]
    (delivery,) = mem.webhooks.deliveries(bad.id)
    assert delivery.status == "failed"
    assert reason in delivery.reason, delivery.reason
    assert delivery.request.startswith('{"version":1,')
    if case == "huge":
        assert len(delivery.response) < 5000  # the log keeps an excerpt, not 10 MB
    if case == "redirect":
        assert delivery.http_status == 302
    if case == "hang":
        assert delivery.http_status is None and delivery.latency_ms < 5000
    assert mem.webhooks.deliveries(after.id)[0].status == "delivered"


def test_bad_before_llm_answers_are_skipped(
    make_memory: Any, llm: FakeOpenAIServer, model: MemoryModel, receiver: WebhookReceiver
) -> None:
    mem = _llm_memory(make_memory, llm)
    receiver.script("/number", (200, {"data": {"instruction": 42}}))
    receiver.script("/good", (200, {"data": {"instruction": "Be brief."}}))
    bad, _ = mem.webhooks.create(
        resource="fact", event="before_llm", target_url=receiver.url("/number")
    )
    mem.webhooks.create(resource="fact", event="before_llm", target_url=receiver.url("/good"))
    mem.sessions.create(user_id="u", session_id="s").add_messages(_messages(), sync=True)
    user = next(u for stage, _, u in model.prompts if stage == "extract")
    assert user.endswith("Additional instructions:\nBe brief.")
    assert "not a string" in mem.webhooks.deliveries(bad.id)[0].reason


# -- async ----------------------------------------------------------------------------------


def test_async_deliveries_retry_with_backoff_until_delivered(
    make_memory: Any, receiver: WebhookReceiver
) -> None:
    calls = {"n": 0}

    def flaky(payload: dict[str, Any]) -> tuple[int, Any]:
        calls["n"] += 1
        return (503, {"error": "busy"}) if calls["n"] < 3 else (200, {"data": {"topics": []}})

    receiver.script("/flaky", flaky)
    mem = make_memory(
        webhook_allow="127.0.0.1", webhook_backoff_seconds=0.01, webhook_max_attempts=5
    )
    hook, secret = mem.webhooks.create(
        resource="topic", event="before_add", target_url=receiver.url("/flaky"), mode="async"
    )
    s = mem.sessions.create(user_id="u")
    s.add_messages(_messages(TURNS[:1]), sync=True)
    mem.webhooks.wait(timeout=30)

    # The async answer (an empty topic list) changed nothing.
    assert mem.topics.list(user_id="u")
    got = receiver.at("/flaky")
    assert len(got) == 3
    assert len({r.headers["webhook-id"] for r in got}) == 1  # one delivery, three attempts
    for request in got:
        payload = _verify(secret, request)  # each attempt is signed
        assert payload["mode"] == "async" and payload["event"] == "before_add"
    log = mem.webhooks.deliveries(hook.id)
    assert [(d.attempt, d.status) for d in log] == [
        (3, "delivered"),
        (2, "retrying"),
        (1, "retrying"),
    ]
    assert "HTTP 503" in log[2].reason and "attempt 1/5, next in" in log[2].reason
    assert mem.store.webhook_outbox_counts() == {"queued": 0, "running": 0, "failed": 0}


def test_async_deliveries_end_failed_after_max_attempts(
    make_memory: Any, receiver: WebhookReceiver
) -> None:
    mem = make_memory(
        webhook_allow="127.0.0.1",
        webhook_backoff_seconds=0.01,
        webhook_max_attempts=3,
        workers=0,
    )
    hook, _ = mem.webhooks.create(
        resource="fact", event="before_add", target_url=receiver.url("/status/500"), mode="async"
    )
    mem.sessions.create(user_id="u").add_messages(_messages(TURNS[:1]), sync=True)
    assert receiver.at("/status/500") == []  # queued, not sent by the pipeline itself
    mem.webhooks.wait(timeout=30)  # workers=0: sent in this thread
    assert len(receiver.at("/status/500")) == 3
    log = mem.webhooks.deliveries(hook.id)
    assert [d.status for d in log] == ["failed", "retrying", "retrying"]
    assert log[0].reason.endswith("(attempt 3/3, final)")
    assert mem.store.webhook_outbox_counts(mem.project_id)["failed"] == 1
    assert mem.facts.list(user_id="u")  # the batch itself went through


def test_async_deliveries_are_sent_after_the_batch_commits(
    make_memory: Any, receiver: WebhookReceiver
) -> None:
    mem = make_memory(webhook_allow="127.0.0.1")
    stored_when_received: list[int] = []

    def check(payload: dict[str, Any]) -> tuple[int, Any]:
        stored_when_received.append(len(mem.facts.list(user_id="u")))
        return 200, {"data": {"observations": []}}  # ignored: async

    receiver.script("/audit", check)
    mem.webhooks.create(
        resource="fact", event="before_add", target_url=receiver.url("/audit"), mode="async"
    )
    mem.sessions.create(user_id="u").add_messages(_messages(), sync=True)
    mem.webhooks.wait(timeout=30)
    assert stored_when_received == [3]
    assert len(mem.facts.list(user_id="u")) == 3


def test_queued_deliveries_of_a_disabled_webhook_fail(
    make_memory: Any, receiver: WebhookReceiver
) -> None:
    mem = make_memory(webhook_allow="127.0.0.1", workers=0)
    hook, _ = mem.webhooks.create(
        resource="fact", event="before_add", target_url=receiver.url("/later"), mode="async"
    )
    mem.sessions.create(user_id="u").add_messages(_messages(TURNS[:1]), sync=True)
    mem.webhooks.disable(hook.id)
    mem.webhooks.wait(timeout=10)
    assert receiver.at("/later") == []
    (attempt,) = mem.webhooks.deliveries(hook.id)
    assert (attempt.status, attempt.reason) == ("failed", "webhook disabled before delivery")


def test_a_failed_batch_sends_no_async_delivery(
    make_memory: Any, llm: FakeOpenAIServer, receiver: WebhookReceiver
) -> None:
    mem = _llm_memory(make_memory, llm, job_max_attempts=2, workers=0)
    llm.fault("invalid_json")
    mem.webhooks.create(
        resource="fact", event="before_llm", target_url=receiver.url("/n"), mode="async"
    )
    sync_hook, _ = mem.webhooks.create(
        resource="fact", event="before_llm", target_url=receiver.url("/s")
    )
    s = mem.sessions.create(user_id="u")
    with pytest.raises(Exception, match="failed for good"):
        s.add_messages(_messages(), sync=True)
    mem.webhooks.wait(timeout=10)
    # The sync hook was called by each attempt; the async one waits for a commit that
    # never came, so the receiver never hears of a batch that was not stored.
    assert len(receiver.at("/s")) == 2 and receiver.at("/n") == []
    assert len(mem.webhooks.deliveries(sync_hook.id)) == 2
    assert _sql(mem, "SELECT count(*) FROM webhook_outbox") == [(0,)]


# -- slow receivers -----------------------------------------------------------------------------
# The receiver's trickles take 10 s; a per-read timeout (what httpx offers) never fires on
# them. The margins are for a loaded machine, far below what the trickles would take.


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize(
    ("path", "step"),
    [
        ("/trickle-body", "reading the answer body"),
        ("/trickle-head", "waiting for the status line and headers"),
    ],
)
def test_a_trickling_receiver_is_cut_off_at_the_hooks_timeout(
    make_memory: Any, receiver: WebhookReceiver, mode: str, path: str, step: str
) -> None:
    mem = make_memory(webhook_allow="127.0.0.1", webhook_max_attempts=1, workers=0)
    hook, _ = mem.webhooks.create(
        resource="fact",
        event="before_add",
        target_url=receiver.url(path),
        mode=mode,
        timeout_ms=300,
    )
    started = time.monotonic()
    mem.sessions.create(user_id="u").add_messages(_messages(TURNS[:1]), sync=True)
    mem.webhooks.wait(timeout=30)
    assert time.monotonic() - started < 5
    (delivery,) = mem.webhooks.deliveries(hook.id)
    assert delivery.status == "failed" and 300 <= delivery.latency_ms < 1500
    # The reason says which step was cut short and after how long (async: and the attempt).
    said = re.match(rf"timed out after (\d+) ms {step}.* \(timeout 300 ms\)", delivery.reason)
    assert said is not None and abs(int(said[1]) - delivery.latency_ms) < 50, delivery.reason
    assert mem.facts.list(user_id="u")  # the batch went through without the hook


def test_a_sync_hook_that_gave_no_answer_is_not_called_again_in_the_batch(
    make_memory: Any, llm: FakeOpenAIServer, receiver: WebhookReceiver
) -> None:
    # One extraction per message: fact.before_llm is a point four times in this batch.
    mem = _llm_memory(make_memory, llm, extract_chunk_messages=1, workers=0)
    hook, _ = mem.webhooks.create(
        resource="fact", event="before_llm", target_url=receiver.url("/hang"), timeout_ms=300
    )
    mem.sessions.create(user_id="u").add_messages(_messages(), sync=True)
    assert len(receiver.at("/hang")) == 1  # one timeout for the batch, not one per chunk
    first, *rest = reversed(mem.webhooks.deliveries(hook.id))
    assert first.reason.startswith("timed out after") and len(rest) == 3
    for skipped in rest:
        assert skipped.status == "failed" and skipped.latency_ms == 0
        assert skipped.reason == f"not sent: earlier in this batch, {first.reason}"
    # The next batch tries the receiver again.
    later = _messages([("x1", "user", "I drink green tea.")])
    mem.sessions.create(user_id="u").add_messages(later, sync=True)
    assert len(receiver.at("/hang")) == 2


def test_one_projects_slow_receivers_leave_senders_to_the_others(
    make_memory: Any, receiver: WebhookReceiver
) -> None:
    # Two senders; project a's three deliveries would hold both for 5 s each.
    mem = make_memory(
        webhook_allow="127.0.0.1", webhook_async_concurrency=2, webhook_max_attempts=1
    )
    slow = mem.for_project("a")
    hooks = [
        slow.webhooks.create(
            resource="fact",
            event="before_add",
            target_url=receiver.url("/trickle-body"),
            mode="async",
            timeout_ms=5000,
        )[0]
        for _ in range(3)
    ]
    finished_when_b_arrived: list[int] = []

    def b(payload: dict[str, Any]) -> tuple[int, Any]:
        finished_when_b_arrived.append(sum(len(slow.webhooks.deliveries(h.id)) for h in hooks))
        return 200, {}

    receiver.script("/b", b)
    other = mem.for_project("b")
    other.webhooks.create(
        resource="fact", event="before_add", target_url=receiver.url("/b"), mode="async"
    )
    slow.sessions.create(user_id="u").add_messages(_messages(TURNS[:1]), sync=True)
    _until(lambda: receiver.at("/trickle-body"))  # a sender is busy with project a
    other.sessions.create(user_id="u").add_messages(_messages(TURNS[:1]), sync=True)
    _until(lambda: finished_when_b_arrived, timeout=30)
    # b's delivery went out while every delivery of a was still being trickled.
    assert finished_when_b_arrived == [0]
    assert len(receiver.at("/trickle-body")) == 1  # a holds its share: one of two senders
    receiver.release()
    slow.webhooks.wait(timeout=30)


def test_a_sync_write_does_not_wait_behind_another_projects_slow_hook(
    make_memory: Any, receiver: WebhookReceiver
) -> None:
    mem = make_memory(webhook_allow="127.0.0.1", workers=1)
    slow = mem.for_project("a")
    slow.webhooks.create(
        resource="fact",
        event="before_add",
        target_url=receiver.url("/trickle-body"),
        timeout_ms=5000,
    )
    stuck = slow.sessions.create(user_id="u").add_messages(_messages(TURNS[:1]))
    _until(lambda: receiver.at("/trickle-body"))  # the only worker is in a's hook
    other = mem.for_project("b")
    result = other.sessions.create(user_id="u").add_messages(_messages(TURNS[:1]), sync=True)
    assert result.processed and other.facts.list(user_id="u")
    # b's batch was processed while a's was still held by its receiver.
    assert mem.store.job_states([stuck.job_id]) == {stuck.job_id: "running"}
    receiver.release()
    mem.wait(timeout=30)


def _until(check: Any, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


# -- safety -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/hook",
        "http://10.0.0.1/hook",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]:8080/hook",
        "http://[::ffff:127.0.0.1]/hook",
        "http://0.0.0.0/hook",
        "http://192.168.1.10/hook",
    ],
)
def test_private_literal_targets_are_refused_at_creation(mem: Memory, url: str) -> None:
    with pytest.raises(ValidationError, match="STRATAMEM_WEBHOOK_ALLOW") as info:
        mem.webhooks.create(resource="fact", event="before_add", target_url=url)
    assert any("target_url" in p for p in info.value.problems)
    assert mem.webhooks.list() == []


def test_a_host_resolving_to_loopback_is_refused_at_delivery(
    make_memory: Any, receiver: WebhookReceiver
) -> None:
    mem = make_memory(workers=0)  # nothing allowed
    hook, _ = mem.webhooks.create(
        resource="fact",
        event="before_add",
        target_url=f"http://localhost:{receiver.port}/hook",
    )
    mem.sessions.create(user_id="u").add_messages(_messages(TURNS[:1]), sync=True)
    assert receiver.requests == []  # never connected
    (delivery,) = mem.webhooks.deliveries(hook.id)
    assert delivery.status == "failed"
    assert delivery.reason.startswith("refused: localhost resolves to ")
    assert "loopback" in delivery.reason
    assert mem.facts.list(user_id="u")  # the pipeline went on


def test_allow_list_by_host_name_permits_a_private_target(
    make_memory: Any, receiver: WebhookReceiver
) -> None:
    mem = make_memory(webhook_allow=["localhost"], workers=0)
    hook, _ = mem.webhooks.create(
        resource="fact", event="before_add", target_url=f"http://localhost:{receiver.port}/x"
    )
    mem.sessions.create(user_id="u").add_messages(_messages(TURNS[:1]), sync=True)
    (request,) = receiver.at("/x")
    assert request.headers["host"] == f"localhost:{receiver.port}"
    assert mem.webhooks.deliveries(hook.id)[0].status == "delivered"


def test_invalid_allow_list_is_a_config_error(tmp_path: Any) -> None:
    from stratamem import ConfigError

    with pytest.raises(ConfigError, match="webhook_allow"):
        Memory(f"sqlite:///{tmp_path}/x.db", embedder="hash", webhook_allow="10.0.0.0/33")


# -- management -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"resource": "topic", "event": "before_llm"}, "topic.before_llm is not a hook point"),
        ({"resource": "message", "event": "before_add"}, "supported are fact.after_llm"),
        ({"mode": "later"}, "mode: expected 'sync' or 'async'"),
        ({"target_url": "ftp://example.com/x"}, "scheme must be http or https"),
        ({"target_url": "https://user:pw@example.com/x"}, "must not carry credentials"),
        ({"target_url": "not a url"}, "target_url"),
        ({"target_url": ""}, "target_url"),
        ({"timeout_ms": 99}, "timeout_ms: expected an integer from 100 to 30000"),
        ({"timeout_ms": 30_001}, "timeout_ms"),
        ({"timeout_ms": True}, "timeout_ms"),
        ({"name": ""}, "name"),
        ({"enabled": "yes"}, "enabled"),
    ],
)
def test_create_validates(mem: Memory, fields: dict[str, Any], problem: str) -> None:
    args: dict[str, Any] = {
        "resource": "fact",
        "event": "before_add",
        "target_url": "https://hooks.example.com/stratamem",
    }
    args.update(fields)
    with pytest.raises(ValidationError) as info:
        mem.webhooks.create(**args)
    assert any(problem in p for p in info.value.problems), info.value.problems


def test_manage_webhooks(make_memory: Any, receiver: WebhookReceiver) -> None:
    mem = make_memory(webhook_allow="127.0.0.1", workers=0)
    a, secret_a = mem.webhooks.create(
        resource="fact", event="before_add", target_url=receiver.url("/a"), name="pii"
    )
    b, _ = mem.webhooks.create(
        resource="summary", event="after_llm", target_url=receiver.url("/b"), mode="async"
    )
    assert secret_a.startswith("whsec_") and a.timeout_ms == 5000
    assert [h.id for h in mem.webhooks.list()] == [a.id, b.id]
    assert [h.id for h in mem.webhooks.list(limit=1, offset=1)] == [b.id]
    assert mem.webhooks.get(a.id) == a

    changed = mem.webhooks.update(a.id, name="redact", timeout_ms=1500)
    assert (changed.name, changed.timeout_ms, changed.resource) == ("redact", 1500, "fact")
    assert changed.updated_at >= a.updated_at
    with pytest.raises(ValidationError, match="invalid webhook"):
        mem.webhooks.update(a.id, event="after_add")
    with pytest.raises(ValidationError):
        mem.webhooks.update(b.id, resource="topic")  # topic.after_llm does not exist
    assert mem.webhooks.update(b.id, resource="topic", event="before_add").resource == "topic"

    assert mem.webhooks.disable(a.id).enabled is False
    s = mem.sessions.create(user_id="u")
    s.add_messages(_messages(TURNS[:1]), sync=True)
    assert receiver.at("/a") == []  # disabled: not called
    assert mem.webhooks.enable(a.id).enabled is True
    s.add_messages(_messages(TURNS[2:3]), sync=True)
    (first,) = receiver.at("/a")
    _verify(secret_a, first)

    new_secret = mem.webhooks.rotate_secret(a.id)
    assert new_secret != secret_a and new_secret.startswith("whsec_")
    s.add_messages(_messages(TURNS[3:4]), sync=True)
    second = receiver.at("/a")[1]
    _verify(new_secret, second)
    with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):
        _verify(secret_a, second)

    assert len(mem.webhooks.deliveries(a.id)) == 2
    assert [d.attempt for d in mem.webhooks.deliveries(a.id, limit=1, offset=1)] == [1]
    mem.webhooks.delete(a.id)
    with pytest.raises(NotFoundError):
        mem.webhooks.get(a.id)
    with pytest.raises(NotFoundError):
        mem.webhooks.deliveries(a.id)
    with pytest.raises(NotFoundError):
        mem.webhooks.delete(a.id)
    with pytest.raises(NotFoundError):
        mem.webhooks.rotate_secret(a.id)
    assert _sql(
        mem,
        "SELECT count(*) FROM webhook_deliveries d JOIN webhooks w "
        "ON w.pk = d.hook_pk WHERE w.id = ?",
        a.id,
    ) == [(0,)]
    assert [h.id for h in mem.webhooks.list()] == [b.id]


def test_rotation_with_a_grace_period_signs_with_both_secrets_until_it_ends(
    make_memory: Any, receiver: WebhookReceiver
) -> None:
    mem = make_memory(webhook_allow="127.0.0.1", workers=0)
    hook, first = mem.webhooks.create(
        resource="fact", event="before_add", target_url=receiver.url("/a")
    )
    s = mem.sessions.create(user_id="u")
    second = mem.webhooks.rotate_secret(hook.id, grace_seconds=3600)
    until = mem.webhooks.get(hook.id).rotation_grace_until
    assert until is not None and 3500 < (until - datetime.now(timezone.utc)).total_seconds() <= 3600
    s.add_messages(_messages(TURNS[:1]), sync=True)
    (during,) = receiver.at("/a")
    for secret in (first, second):  # a receiver on either secret accepts it
        _verify(secret, during)

    # The grace period ends: only the new secret signs.
    row = mem.store.get_webhook(mem.project_id, hook.id)
    past = "2000-01-01T00:00:00.000000Z"
    mem.store.update_webhook(mem.project_id, hook.id, {"previous_secret_until": past})
    assert row.signing_secrets(past) == [second, first]
    assert mem.webhooks.get(hook.id).rotation_grace_until is None
    s.add_messages(_messages(TURNS[2:3]), sync=True)
    after = receiver.at("/a")[1]
    _verify(second, after)
    with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):
        _verify(first, after)

    # Rotating again without a grace period (a leaked secret) stops the old one at once.
    mem.webhooks.rotate_secret(hook.id, grace_seconds=600)
    third = mem.webhooks.rotate_secret(hook.id)
    assert mem.webhooks.get(hook.id).rotation_grace_until is None
    s.add_messages(_messages(TURNS[3:4]), sync=True)
    last = receiver.at("/a")[2]
    assert len(last.headers["webhook-signature"].split(" ")) == 1
    _verify(third, last)

    for bad in (-1, 7 * 86_400 + 1, 1.5, "60", True):
        with pytest.raises(ValidationError, match="grace_seconds"):
            mem.webhooks.rotate_secret(hook.id, grace_seconds=bad)


def test_webhooks_belong_to_their_project(make_memory: Any, receiver: WebhookReceiver) -> None:
    mem = make_memory(webhook_allow="127.0.0.1", workers=0)
    other = mem.for_project("other")
    hook, _ = other.webhooks.create(
        resource="fact", event="before_add", target_url=receiver.url("/other")
    )
    assert mem.webhooks.list() == []
    with pytest.raises(NotFoundError):
        mem.webhooks.get(hook.id)
    with pytest.raises(NotFoundError):
        mem.webhooks.delete(hook.id)
    assert hook.project_id == "other" and other.webhooks.get(hook.id) == hook
    # A batch of the default project does not call the other project's hook ...
    mem.sessions.create(user_id="u").add_messages(_messages(TURNS[:1]), sync=True)
    assert receiver.at("/other") == []
    # ... and one of the other project does.
    other.sessions.create(user_id="u").add_messages(_messages(TURNS[:1]), sync=True)
    assert receiver.at("/other")[0].json["project_id"] == "other"


def test_changes_reach_the_pipeline_of_another_memory_on_the_same_store(
    make_memory: Any, db_url: str, receiver: WebhookReceiver
) -> None:
    worker = make_memory(webhook_allow="127.0.0.1", workers=0)
    s = worker.sessions.create(user_id="u")
    s.add_messages(_messages(TURNS[:1]), sync=True)  # caches "no webhooks"
    admin = make_memory(db_url, webhook_allow="127.0.0.1", workers=0)  # e.g. the server
    hook, _ = admin.webhooks.create(
        resource="fact", event="before_add", target_url=receiver.url("/new")
    )
    s.add_messages(_messages(TURNS[2:3]), sync=True)
    assert len(receiver.at("/new")) == 1
    admin.webhooks.disable(hook.id)
    s.add_messages(_messages(TURNS[3:4]), sync=True)
    assert len(receiver.at("/new")) == 1


def test_secrets_are_never_returned_again_nor_logged(
    make_memory: Any, receiver: WebhookReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    mem = make_memory(
        webhook_allow="127.0.0.1", webhook_backoff_seconds=0.01, webhook_max_attempts=2, workers=0
    )
    hook, secret = mem.webhooks.create(
        resource="fact", event="before_add", target_url=receiver.url("/status/500")
    )
    async_hook, async_secret = mem.webhooks.create(
        resource="fact",
        event="before_add",
        target_url=receiver.url("/hang"),
        mode="async",
        timeout_ms=200,
    )
    rotated = mem.webhooks.rotate_secret(hook.id)
    mem.sessions.create(user_id="u").add_messages(_messages(TURNS[:1]), sync=True)
    mem.webhooks.wait(timeout=30)
    shown = [
        repr(hook),
        hook.model_dump_json(),
        *(h.model_dump_json() for h in mem.webhooks.list()),
        mem.webhooks.get(hook.id).model_dump_json(),
        mem.webhooks.update(hook.id, name="renamed").model_dump_json(),
        *(d.model_dump_json() for d in mem.webhooks.deliveries(hook.id)),
        *(d.model_dump_json() for d in mem.webhooks.deliveries(async_hook.id)),
        repr(mem.store.get_webhook(mem.project_id, hook.id)),
        caplog.text,
        *(r.getMessage() for r in caplog.records),
    ]
    assert "failed" in caplog.text  # the failures were logged, without the secrets
    for secret_value in (secret, rotated, async_secret):
        key = secret_value.removeprefix("whsec_")
        assert not any(key in text for text in shown)
        # Not on the wire either: receivers see an HMAC, never the secret.
        assert not any(key.encode() in r.body or key in str(r.headers) for r in receiver.requests)


def test_forget_and_erase_remove_logged_content(
    make_memory: Any, receiver: WebhookReceiver
) -> None:
    mem = make_memory(webhook_allow="127.0.0.1", webhook_backoff_seconds=60, workers=0)
    sync_hook, _ = mem.webhooks.create(
        resource="fact", event="before_add", target_url=receiver.url("/log")
    )
    mem.webhooks.create(
        resource="fact", event="before_add", target_url=receiver.url("/status/500"), mode="async"
    )
    s = mem.sessions.create(user_id="u")
    s.add_messages(_messages(TURNS[:1]), sync=True)
    s.add_messages(_messages(TURNS[2:3]), sync=True)
    mem._engine.webhook_engine.outbox.run_once()  # one failed attempt, retry in 60 s
    assert len(mem.webhooks.deliveries(sync_hook.id)) == 2
    assert mem.store.webhook_outbox_counts()["queued"] == 2

    mem.forget(user_id="u", message_ids=["w1"])
    remaining = mem.webhooks.deliveries(sync_hook.id)
    assert [d.message_ids for d in remaining] == [["w3"]]
    assert not any("oat milk" in d.request for d in remaining)
    assert mem.store.webhook_outbox_counts()["queued"] == 1

    mem.erase_user("u")
    assert mem.webhooks.deliveries(sync_hook.id) == []
    assert mem.store.webhook_outbox_counts()["queued"] == 0
    assert mem.webhooks.get(sync_hook.id)  # the hooks themselves stay


def test_forget_removes_deliveries_that_quote_a_summary_built_from_the_message(
    make_memory: Any, receiver: WebhookReceiver
) -> None:
    # The second batch repeats the first's fact: it strengthens the stored summary, whose
    # words (built from w1) travel in that batch's summary.before_add payload.
    mem = make_memory(webhook_allow="127.0.0.1", workers=0)
    hook, _ = mem.webhooks.create(
        resource="summary", event="before_add", target_url=receiver.url("/log")
    )
    s = mem.sessions.create(user_id="u")
    s.add_messages(_messages(TURNS[:1]), sync=True)
    s.add_messages([{"id": "w5", "role": "user", "content": TURNS[0][2]}], sync=True)
    s.add_messages(_messages(TURNS[2:3]), sync=True)
    (summary,) = [x for x in mem.summaries.list(user_id="u") if "oat milk" in x.text]
    assert summary.message_ids == ["w1", "w5"]  # strengthened, not duplicated
    logged = {tuple(d.message_ids) for d in mem.webhooks.deliveries(hook.id)}
    assert ("w5", "w1") in logged and ("w1",) in logged

    mem.forget(user_id="u", message_ids=["w1"])
    remaining = mem.webhooks.deliveries(hook.id)
    assert [d.message_ids[0] for d in remaining] == ["w3"]
    assert not any("oat milk" in d.request for d in remaining)


def test_forget_removes_deliveries_that_showed_a_summary_to_the_model(
    make_memory: Any, llm: FakeOpenAIServer, receiver: WebhookReceiver
) -> None:
    # With a model, stored summaries near a batch's facts are quoted in summary.before_llm.
    mem = _llm_memory(make_memory, llm, workers=0)
    hook, _ = mem.webhooks.create(
        resource="summary", event="before_llm", target_url=receiver.url("/log")
    )
    s = mem.sessions.create(user_id="u")
    s.add_messages(_messages(TURNS[:1]), sync=True)
    s.add_messages(_messages(TURNS[2:3]), sync=True)
    bodies = [json.loads(r.body) for r in receiver.requests]
    (second,) = [b for b in bodies if b["context"]["message_ids"] == ["w3"]]
    assert "oat milk" in json.dumps(second["data"])  # the w1 summary went to the model
    logged = [d.message_ids for d in mem.webhooks.deliveries(hook.id)]
    assert sorted(logged) == [["w1"], ["w3", "w1"]]

    mem.forget(user_id="u", message_ids=["w1"])
    assert mem.webhooks.deliveries(hook.id) == []


def test_async_memory_mirrors_webhooks(make_memory: Any, db_url: str) -> None:
    import asyncio

    from stratamem import AsyncMemory

    async def run() -> None:
        amem = AsyncMemory(db_url, embedder="hash", workers=0)
        try:
            hook, secret = await amem.webhooks.create(
                resource="topic", event="before_add", target_url="https://hooks.example.com/t"
            )
            assert secret.startswith("whsec_")
            assert [h.id for h in await amem.webhooks.list()] == [hook.id]
            assert (await amem.webhooks.disable(hook.id)).enabled is False
            assert await amem.webhooks.deliveries(hook.id) == []
            await amem.webhooks.delete(hook.id)
            assert await amem.webhooks.list() == []
        finally:
            await amem.close()

    asyncio.run(run())
