"""The current truth first (issue 40, part 2): after a correction or a change, no face ranks
what was replaced above what replaced it for a question about the current value, while a
question about the past still finds the old evidence; every hit says whether it holds.

The memory: four subjects stated, then changed three ways (a note naming the summary it
corrects, as MCP's ``update_memory`` and the REST API's corrections send; a correction
marker; a new value with a cue word), on both stores, with the bundled embedder."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx2
import openai
import pytest
from mcp import Client

from fakes.openai_server import FakeOpenAIServer
from stratamem import Memory
from stratamem.capture import MEMORY_PREAMBLE
from stratamem.mcp import MemoryTools
from stratamem.mcp._server import build_server
from stratamem.types import CORRECTS, NOTE_EVENT

USER = "ana"
# subject: (what was said, how it changed, the old value, the new value, a question about the
# current value, a question about the past)
SUBJECTS = {
    "home": (
        "I live in Berlin.",
        None,  # corrected by a note naming the summary (update_memory's way)
        "Berlin",
        "Lisbon",
        "Where does the user live now?",
        "Where did I live before?",
    ),
    "car": (
        "I drive a Honda Civic.",
        "Correction: I drive a Tesla Model 3 now.",
        "Honda",
        "Tesla",
        "What car do I drive?",
        "What car did I use to drive?",
    ),
    "coffee": (
        "My favourite coffee shop is Blue Bottle.",
        "My favourite coffee shop is now Sightglass.",
        "Blue Bottle",
        "Sightglass",
        "What is my favourite coffee shop?",
        "Which coffee shop was my favourite before?",
    ),
    "gym": (
        "I go to the gym 3 times a week.",
        "I now go to the gym 5 times a week.",
        "3 times",
        "5 times",
        "How often do I go to the gym these days?",
        "How often did I go to the gym at first?",
    ),
}


@pytest.fixture
def corrected(make_memory: Callable[..., Memory], local_embedder: Any) -> Memory:
    """Each subject stated in January, then changed in March."""
    mem = make_memory(embedder=local_embedder)
    first = mem.sessions.create(user_id=USER, session_id="january")
    first.add_messages(
        [
            {"role": "user", "content": said, "timestamp": f"2026-01-0{i + 1}T10:00:00Z"}
            for i, (said, *_) in enumerate(SUBJECTS.values())
        ],
        sync=True,
    )
    berlin = next(s for s in mem.summaries.list(user_id=USER) if "Berlin" in s.text)
    later = mem.sessions.create(user_id=USER, session_id="march")
    changes: list[dict[str, Any]] = [
        {
            "role": "user",
            "content": "I moved to Lisbon.",
            "event_type": NOTE_EVENT,
            "metadata": {CORRECTS: berlin.id},
            "timestamp": "2026-03-01T10:00:00Z",
        }
    ]
    changes += [
        {"role": "user", "content": change, "timestamp": f"2026-03-0{i + 2}T10:00:00Z"}
        for i, (_, change, *_) in enumerate(v for v in SUBJECTS.values() if v[1])
    ]
    later.add_messages(changes, sync=True)
    return mem


def test_every_old_value_is_superseded_and_the_new_one_current(corrected: Memory) -> None:
    summaries = corrected.summaries.list(user_id=USER, status="superseded")
    for subject, (_, _, old, new, *_) in SUBJECTS.items():
        assert any(old in s.text for s in summaries), subject
        current = [s for s in corrected.summaries.list(user_id=USER) if new in s.text]
        assert current and all(s.status == "active" for s in current), subject


@pytest.mark.parametrize("subject", list(SUBJECTS))
def test_a_question_about_the_current_value_finds_it_first(corrected: Memory, subject: str) -> None:
    _, _, old, new, now, _ = SUBJECTS[subject]
    hits = corrected.search(now, user_id=USER, limit=10)
    first = hits[0]
    assert first.current and not first.superseded and not first.expired, first
    assert new in first.text, [h.text for h in hits]
    # What it replaced may still come, marked, but never before it.
    for h in hits:
        if old in h.text and new not in h.text:
            assert h.superseded, h
            assert hits.index(h) > 0


@pytest.mark.parametrize("subject", list(SUBJECTS))
def test_a_question_about_the_past_still_finds_the_old_value(
    corrected: Memory, subject: str
) -> None:
    _, _, old, _, _, before = SUBJECTS[subject]
    hits = corrected.search(before, user_id=USER, limit=5)
    old_hits = [h for h in hits if old in h.text]
    assert old_hits, [h.text for h in hits]
    assert all(h.superseded for h in old_hits if h.layer != "summary" or h.superseded)


def test_get_memory_states_the_new_values_not_the_old(corrected: Memory) -> None:
    session = corrected.sessions.get("march")
    for subject, (_, _, old, new, now, _) in SUBJECTS.items():
        block = session.get_memory(now).formatted_context
        assert new in block, (subject, block)
        # An old value is quoted only as history, marked, after the new one.
        if old in block:
            assert block.index(new) < block.index(old), (subject, block)
            assert "(superseded)" in block, (subject, block)


def test_mcp_search_says_which_results_still_hold(corrected: Memory) -> None:
    tools = MemoryTools(corrected, USER)

    async def scenario() -> list[dict[str, Any]]:
        async with Client(build_server(lambda _request: tools), read_timeout_seconds=60) as c:
            result = await c.call_tool(
                "search_memories", {"query": "Where did I live before?", "limit": 10}
            )
            assert not result.is_error, result.content
            assert result.structured_content is not None
            return list(result.structured_content["results"])

    results = asyncio.run(scenario())
    statuses = {r["status"] for r in results}
    assert statuses <= {"current", "superseded", "expired"} and "current" in statuses
    berlin = [r for r in results if "Berlin" in r["text"]]
    assert berlin and all(r["status"] == "superseded" for r in berlin)
    lisbon = [r for r in results if "Lisbon" in r["text"]]
    assert lisbon and all(r["status"] == "current" for r in lisbon)


@pytest.fixture
def fake_openai() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as server:
        server.chat_script = lambda body: "Noted."
        yield server


def test_a_captured_call_is_given_the_new_values(
    corrected: Memory, fake_openai: FakeOpenAIServer
) -> None:
    """What capture injects (and the proxy, which runs the same recall and injection)."""
    client = corrected.llm.register(
        openai.OpenAI(
            base_url=fake_openai.base_url,
            api_key="test",
            max_retries=0,
            http_client=httpx2.Client(),
        )
    )
    with corrected.scope(user_id=USER, session_id="today"):
        for _, _, old, new, now, _ in SUBJECTS.values():
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": now}])
            content = fake_openai.chat_requests()[-1]["messages"][-1]["content"]
            block = content.split("\n\n", 1)[1]
            assert block.startswith(MEMORY_PREAMBLE) and new in block, block
            if old in block:
                assert block.index(new) < block.index(old), block


def test_rest_hits_carry_the_flags(corrected: Memory) -> None:
    """The REST API returns hits as the model dumps them: both flags are on the wire."""
    hits = corrected.search("Where did I live before?", user_id=USER, limit=10)
    wire = json.loads(json.dumps([h.model_dump(mode="json") for h in hits]))
    assert all({"superseded", "expired"} <= set(h) for h in wire)
    assert any(h["superseded"] for h in wire) and any(not h["superseded"] for h in wire)
