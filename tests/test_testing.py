"""stratamem.testing: a scripted chat model and the hashing embedder drive a real Memory."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

import stratamem.embed.hashing
from stratamem import Memory
from stratamem.errors import ConfigError, ProcessingError
from stratamem.llm import LLMError
from stratamem.pipeline.prompts import CONSOLIDATE, EXTRACT, TOPICS
from stratamem.testing import Answer, ChatCall, HashingEmbedder, ScriptedChatModel

SAILING = [{"role": "user", "content": "I love sailing on the lake"}]


def _ids(prompt: str, section: str, prefix: str) -> list[str]:
    body = prompt.split(section, 1)[1].split("\n\n", 1)[0]
    return re.findall(rf"^\[({prefix}_[^\]]+)\]", body, re.M)


def _pipeline(call: ChatCall) -> Answer:
    """What a model that learns "User loves sailing" from every batch would answer."""
    if call.system == EXTRACT.system:
        sources = _ids(call.user, "MESSAGES:", "m")
        fact = {"text": "User loves sailing", "kind": "preference", "confidence": 0.9}
        return {"facts": [{**fact, "source_ids": sources}]}
    if call.system == CONSOLIDATE.system:
        facts = _ids(call.user, "NEW FACTS:", "f")
        return {"decisions": [{"fact_ids": facts, "action": "add", "text": "Loves sailing"}]}
    assert call.system == TOPICS.system
    filed = _ids(call.user, "SUMMARIES TO FILE:", "s")
    return {"assignments": [{"summary_id": s, "topic": "hobbies"} for s in filed]}


def test_a_scripted_model_writes_what_it_answers(make_memory: Callable[..., Memory]) -> None:
    model = ScriptedChatModel(respond=_pipeline)
    mem = make_memory(llm=model)
    assert mem.mode == model.name
    mem.sessions.create("u1", session_id="s1").add_messages(SAILING, sync=True)
    facts = mem.facts.list(user_id="u1")
    assert [(f.text, f.model) for f in facts] == [("User loves sailing", model.id)]
    assert [s.text for s in mem.summaries.list(user_id="u1")] == ["Loves sailing"]
    assert [t.name for t in mem.topics.list(user_id="u1")] == ["hobbies"]
    assert [c.system for c in model.calls] == [EXTRACT.system, CONSOLIDATE.system, TOPICS.system]
    assert [c.schema for c in model.calls] == [EXTRACT.schema, CONSOLIDATE.schema, TOPICS.schema]
    assert "I love sailing on the lake" in model.prompts[0]
    assert facts[0].id in model.prompts[1]


def test_answers_given_in_advance_come_first_then_the_emptiest_answer(
    make_memory: Callable[..., Memory],
) -> None:
    model = ScriptedChatModel([{"facts": [{"text": "x", "kind": "nonsense"}]}])
    mem = make_memory(llm=model, job_max_attempts=1)
    session = mem.sessions.create("u1", session_id="s1")
    # The scripted answer has no source_ids and a kind that is none: the repair call
    # gets the emptiest answer of the schema, {"facts": []}, and nothing is learned.
    assert session.add_messages(SAILING, sync=True).processed
    assert len(model.calls) == 2
    assert "could not be used" in model.prompts[1]
    assert mem.facts.list(user_id="u1") == []


def test_unusable_json_twice_fails_the_batch_until_it_is_retried(
    make_memory: Callable[..., Memory],
) -> None:
    model = ScriptedChatModel(respond=_pipeline)
    model.bad_json()
    mem = make_memory(llm=model, job_max_attempts=1)
    session = mem.sessions.create("u1", session_id="s1")
    with pytest.raises(ProcessingError):
        session.add_messages(SAILING, sync=True)
    (message,) = mem.messages.list(session_id="s1")
    assert message.status == "failed"
    assert message.error is not None and "unusable JSON twice" in message.error
    assert mem.retry_failed() == 1
    mem.wait(timeout=30)
    assert [f.text for f in mem.facts.list(user_id="u1")] == ["User loves sailing"]


def test_a_refusal_counts_an_attempt_and_is_recorded(make_memory: Callable[..., Memory]) -> None:
    model = ScriptedChatModel(respond=_pipeline)
    model.fail(LLMError("scripted refusal: HTTP 400"))
    mem = make_memory(llm=model, job_max_attempts=1)
    with pytest.raises(ProcessingError, match="scripted refusal"):
        mem.sessions.create("u1", session_id="s1").add_messages(SAILING, sync=True)
    assert mem.messages.list(session_id="s1")[0].attempts == 1


def test_a_scripted_outage_pauses_processing_without_costing_an_attempt(
    make_memory: Callable[..., Memory],
) -> None:
    model = ScriptedChatModel(respond=_pipeline)
    model.fail()  # an outage: LLMUnavailableError
    mem = make_memory(llm=model, workers=0, job_max_attempts=1, outage_backoff_seconds=0.1)
    mem.sessions.create("u1", session_id="s1").add_messages(SAILING)
    mem.wait(timeout=30)  # the waiting caller probes again after the backoff
    (message,) = mem.messages.list(session_id="s1")
    assert (message.status, message.attempts) == ("processed", 1)
    assert len(model.calls) == 4  # the failed call, then extraction, consolidation, topics
    assert mem.stats()["processing"] == {"paused": False}


def test_llm_takes_a_spec_or_a_chat_model(db_url: str) -> None:
    with pytest.raises(ConfigError, match="llm must be"):
        Memory(db_url, embedder="hash", llm=42)  # type: ignore[arg-type]


def test_the_hashing_embedder_is_the_one_behind_hash(make_memory: Callable[..., Memory]) -> None:
    assert HashingEmbedder is stratamem.embed.hashing.HashingEmbedder
    mem = make_memory(embedder=HashingEmbedder())
    session = mem.sessions.create("u1", session_id="s1")
    session.add_messages(SAILING, sync=True)
    assert mem.embedder.id == make_memory(embedder="hash").embedder.id
    assert mem.search("sailing", user_id="u1")[0].text == SAILING[0]["content"]


def test_scripted_answers_are_sent_as_json_text() -> None:
    model = ScriptedChatModel([{"order": [2, 1]}, "not JSON", LLMError("no")])
    model.script({"late": True})
    result = model.complete("sys", "first", schema=None, max_tokens=10)
    assert (result.text, result.model) == ('{"order": [2, 1]}', "scripted:scripted")
    assert result.prompt_tokens > 0 and result.completion_tokens > 0
    assert model.complete("sys", "second", schema=None, max_tokens=10).text == "not JSON"
    with pytest.raises(LLMError, match="no"):
        model.complete("sys", "third", schema=None, max_tokens=10)
    assert model.complete("sys", "fourth", schema=None, max_tokens=10).text == '{"late": true}'
    schema: dict[str, Any] = {"type": "object", "required": ["n"], "properties": {"n": {}}}
    assert model.complete("s", "fifth", schema=schema, max_tokens=1).text == '{"n": {}}'
    assert model.prompts == ["first", "second", "third", "fourth", "fifth"]
