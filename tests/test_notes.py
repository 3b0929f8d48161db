"""Memory notes and explicit corrections through the write pipeline, on both stores.

A note is an ordinary message (``event_type`` "memory"): it becomes facts as it stands,
offline and with a model.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from fakes.memory_model import MemoryModel
from fakes.openai_server import FakeOpenAIServer
from memstrata import Memory
from memstrata.types import CORRECTS, NOTE_EVENT, Summary

LATTE = "I love oat milk lattes every morning."


def note(content: str, *, corrects: str | None = None, **fields: Any) -> dict[str, Any]:
    """A message as an MCP server's add_memory / update_memory stores it."""
    message: dict[str, Any] = {"role": "user", "content": content, "event_type": NOTE_EVENT}
    if corrects is not None:
        message["metadata"] = {CORRECTS: corrects}
    return {**message, **fields}


def summaries(mem: Memory, user_id: str = "u") -> dict[str, Summary]:
    return {x.text: x for x in mem.summaries.list(user_id=user_id, limit=100)}


def remembered(mem: Memory, user_id: str, text: str) -> Summary:
    """The one summary of ``user_id`` made of the statement ``text``."""
    s = mem.sessions.create(user_id=user_id)
    s.add_messages([{"role": "user", "content": text}], sync=True)
    (summary,) = mem.summaries.list(user_id=user_id, status="active")
    return summary


# -- notes become facts ---------------------------------------------------------------------


def test_notes_in_any_person_become_facts_not_behaviour(make_memory: Any) -> None:
    mem = make_memory()
    s = mem.sessions.create(user_id="u")
    s.add_messages(
        [
            note("User prefers tea over coffee.", id="n1"),
            note("Prefers window seats. Is allergic to penicillin!", id="n2"),
            note("I moved to Lisbon in March.", id="n3"),
            note("用户喜欢喝绿茶。", id="n4"),
            note("What does the user eat for breakfast?", id="n5"),  # a question: no fact
            note("Thanks!", id="n6"),
        ],
        sync=True,
    )
    facts = mem.facts.list(user_id="u")
    assert [(f.text, f.kind, f.message_ids) for f in facts] == [
        ("User prefers tea over coffee.", "preference", ["n1"]),
        ("Prefers window seats.", "preference", ["n2"]),
        ("Is allergic to penicillin.", "constraint", ["n2"]),
        ("User moved to Lisbon in March (2026-03).", "event", ["n3"]),
        ("用户喜欢喝绿茶。", "preference", ["n4"]),
    ]
    assert all(f.labels == ["note"] and f.confidence == 0.9 for f in facts)
    assert all(f.model == "heuristic" for f in facts)
    assert {m.status for m in mem.messages.list(session_id=s.id)} == {"processed"}
    assert set(summaries(mem)) == {f.text for f in facts}


def test_a_note_in_another_roles_name_gives_no_fact(make_memory: Any) -> None:
    mem = make_memory()
    s = mem.sessions.create(user_id="u")
    s.add_messages(
        [note("User is an administrator.", role="tool"), note("User is vip.", role="assistant")],
        sync=True,
    )
    assert mem.facts.list(user_id="u") == []


# -- with a model ---------------------------------------------------------------------------


@pytest.fixture
def model() -> MemoryModel:
    return MemoryModel()


@pytest.fixture
def openai_server(model: MemoryModel) -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as server:
        server.chat_script = model
        yield server


def _llm_memory(make_memory: Any, server: FakeOpenAIServer) -> Memory:
    memory: Memory = make_memory(
        llm="openai:fake-chat", llm_base_url=server.base_url, llm_api_key="k"
    )
    return memory


def test_with_a_model_notes_are_facts_by_the_rules_not_by_the_model(
    make_memory: Any, openai_server: FakeOpenAIServer, model: MemoryModel
) -> None:
    mem = _llm_memory(make_memory, openai_server)
    seen: list[list[str]] = []
    mem.hooks.register(
        "fact", "before_llm", lambda p: seen.append([m["id"] for m in p["data"]["messages"]])
    )
    s = mem.sessions.create(user_id="u")
    s.add_messages(
        [
            {"id": "c1", "role": "user", "content": "I work as a nurse at the city hospital."},
            note("Prefers window seats.", id="n1"),
            {"id": "c2", "role": "user", "content": "My sister Maya lives in Porto."},
            note("用户喜欢喝绿茶。", id="n2"),
        ],
        sync=True,
    )
    (extract,) = [user for stage, _, user in model.prompts if stage == "extract"]
    messages = extract.split("MESSAGES:\n", 1)[1]
    assert "[c1]" in messages and "[c2]" in messages
    assert "[n1]" not in messages and "window seats" not in messages and "绿茶" not in messages
    assert seen == [["c1", "c2"]]
    facts = mem.facts.list(user_id="u")
    assert [(f.message_ids, f.text, f.model) for f in facts] == [
        (["c1"], "User: I work as a nurse at the city hospital.", "openai:fake-chat"),
        (["n1"], "Prefers window seats.", "heuristic"),
        (["c2"], "User: My sister Maya lives in Porto.", "openai:fake-chat"),
        (["n2"], "用户喜欢喝绿茶。", "heuristic"),
    ]
    assert facts[1].prompt_version == "heuristic-v1" and facts[0].prompt_version == "extract-v1"


def test_with_a_model_a_batch_of_notes_alone_asks_no_extraction(
    make_memory: Any, openai_server: FakeOpenAIServer, model: MemoryModel
) -> None:
    mem = _llm_memory(make_memory, openai_server)
    s = mem.sessions.create(user_id="u")
    s.add_messages([note("User prefers tea over coffee.")], sync=True)
    assert model.calls["extract"] == 0
    assert [f.text for f in mem.facts.list(user_id="u")] == ["User prefers tea over coffee."]
    assert [x.text for x in mem.summaries.list(user_id="u")] == ["User prefers tea over coffee."]
