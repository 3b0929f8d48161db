"""StratamemSession: the OpenAI Agents SDK's ``Session`` protocol (held against the SDK's
own ``SQLiteSession``), its items as stratamem memory, and recall before each model call
through ``RunConfig.call_model_input_filter``; real ``Runner.run`` calls whose model is the
fake OpenAI server's Responses API, embedded on both stores and against a real
``stratamem serve``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from agents import Agent, OpenAIResponsesModel, RunConfig, Runner, SQLiteSession, function_tool
from agents.run_config import CallModelData, ModelInputData

from conftest import assert_names_the_extra, run_docs_example
from fakes.openai_server import FakeOpenAIServer
from server_proc import free_port
from stratamem import Memory, connect
from stratamem.api import MemoryAPI
from stratamem.integrations.openai_agents import StratamemSession


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as s:
        yield s


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"Sunny in {city}, 21 degrees."


def _agent(server: FakeOpenAIServer) -> Agent[Any]:
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    model = OpenAIResponsesModel(model="gpt-4o-mini", openai_client=client)
    return Agent(name="assistant", instructions="Be brief.", tools=[get_weather], model=model)


def _run(server: FakeOpenAIServer, session: StratamemSession, text: str, *replies: Any) -> str:
    server.chat_replies.extend(replies)
    config = RunConfig(
        call_model_input_filter=session.call_model_input_filter, tracing_disabled=True
    )
    result = asyncio.run(Runner.run(_agent(server), text, session=session, run_config=config))
    return str(result.final_output)


def _last_user_text(request: dict[str, Any]) -> str:
    user = [i for i in request["input"] if i.get("role") == "user"][-1]
    content = user["content"]
    return content if isinstance(content, str) else "\n".join(p["text"] for p in content)


# -- the Session protocol, against the SDK's own SQLiteSession -------------------------------

BIG = "A tool's long output. " * 300 + "   " * 400 + "end"
ITEMS: list[dict[str, Any]] = [
    {"role": "user", "content": "Hello 😀 naïve café \u0000 with a NUL"},
    {"role": "developer", "content": "Answer in French."},
    {
        "role": "user",
        "content": [
            {"type": "input_text", "text": "What is on this picture?"},
            {
                "type": "input_image",
                "image_url": "data:image/png;base64," + "iVBO" * 3000,
                "detail": "auto",
            },
        ],
    },
    {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Look."}]},
    {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "call_1",
        "name": "get_weather",
        "arguments": '{"city": "Paris"}',
        "status": "completed",
    },
    {"type": "function_call_output", "call_id": "call_1", "output": BIG},
    {"type": "function_call_output", "call_id": "call_2", "output": "   "},
    {"type": "function_call_output", "call_id": "call_3", "output": " " * 2500 + "x"},
    {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "Il fait beau.", "annotations": []}],
    },
    {"role": "assistant", "content": ""},
]


@pytest.fixture
def small(make_memory: Callable[..., Memory]) -> Memory:
    """A memory whose messages hold little, so that items span several messages."""
    return make_memory(max_content_chars=1000, max_metadata_bytes=4096)


def test_items_round_trip_as_the_sdks_sqlite_session_keeps_them(small: Memory) -> None:
    ours = StratamemSession("conv 1/é", small, user_id="ana")
    reference = SQLiteSession("conv 1/é")

    async def both(method: str, *args: Any) -> Any:
        a = await getattr(ours, method)(*args)
        b = await getattr(reference, method)(*args)
        assert a == b, method
        return a

    async def run() -> None:
        assert await both("get_items") == []
        assert await both("pop_item") is None
        await both("add_items", ITEMS[:6])
        await both("add_items", ITEMS[6:])
        assert await both("get_items") == ITEMS
        for limit in (0, 1, 3, len(ITEMS) + 5, -1):
            await both("get_items", limit)
        assert await both("pop_item") == ITEMS[-1]
        assert await both("pop_item") == ITEMS[-2]
        await both("add_items", [ITEMS[0]])
        assert await both("get_items", 2) == [ITEMS[-3], ITEMS[0]]
        await both("clear_session")
        assert await both("get_items") == []
        await both("add_items", ITEMS[:1])
        assert await both("get_items") == ITEMS[:1]

    asyncio.run(run())
    # One item spans several messages: its text split where a message ends, its JSON too.
    messages = small.messages.list(session_id=ours.stratamem_session_id)
    assert all(len(m.content) <= 1000 and m.content.strip() for m in messages)
    assert ours.stratamem_session_id == "x=conv=201/=C3=A9"
    reference.close()


def test_a_lone_surrogate_and_the_session_settings_limit(mem: Memory) -> None:
    from agents import SessionSettings

    session = StratamemSession("s", mem, user_id="ana", session_settings=SessionSettings(limit=1))
    odd = {"role": "user", "content": "lone \ud800 surrogate"}

    async def run() -> list[Any]:
        await session.add_items([{"role": "user", "content": "first"}, odd])  # type: ignore[list-item]
        return await session.get_items()

    assert asyncio.run(run()) == [odd]


def test_pop_and_clear_delete_in_stratamem(mem: Memory) -> None:
    session = StratamemSession("s1", mem, user_id="ana")
    asyncio.run(
        session.add_items(
            [
                {"role": "user", "content": "I am allergic to peanuts."},
                {"role": "user", "content": "I play the cello."},
            ]
        )
    )
    mem.wait()
    assert any("cello" in f.text for f in mem.facts.list(user_id="ana"))
    popped = asyncio.run(session.pop_item())
    assert popped == {"role": "user", "content": "I play the cello."}
    assert not any("cello" in f.text for f in mem.facts.list(user_id="ana"))
    assert [m.content for m in mem.messages.list(user_id="ana")] == ["I am allergic to peanuts."]
    asyncio.run(session.clear_session())
    assert mem.messages.list(user_id="ana") == [] and mem.facts.list(user_id="ana") == []
    asyncio.run(session.clear_session())  # clearing an empty session is no error
    # The reverse: what stratamem forgets, the session no longer returns.
    asyncio.run(session.add_items([{"role": "user", "content": "again"}]))
    mem.forget(user_id="ana", session_id=session.stratamem_session_id)
    assert asyncio.run(session.get_items()) == []
    asyncio.run(session.add_items([{"role": "user", "content": "and again"}]))
    assert asyncio.run(session.get_items()) == [{"role": "user", "content": "and again"}]


def test_messages_not_written_by_the_session_are_not_items(mem: Memory) -> None:
    session = StratamemSession("s1", mem, user_id="ana")
    asyncio.run(session.add_items([{"role": "user", "content": "mine"}]))
    mem.add_messages(session.stratamem_session_id, [{"role": "user", "content": "not an item"}])
    assert asyncio.run(session.get_items()) == [{"role": "user", "content": "mine"}]


# -- runs: the conversation, and recall before each model call -------------------------------


@pytest.fixture
def semantic(make_memory: Callable[..., Memory], local_embedder: Any) -> Memory:
    return make_memory(embedder=local_embedder)


def _conversation(memory: MemoryAPI, server: FakeOpenAIServer) -> None:
    """ana says what she is allergic to in one conversation and asks about it in another;
    ben asks the same."""
    first = StratamemSession("ana-monday", memory, user_id="ana")
    call = {"name": "get_weather", "arguments": {"city": "Paris"}}
    answer = _run(
        server,
        first,
        "I'm allergic to peanuts. What's the weather in Paris?",
        {"tool_calls": [call]},
        "Noted. Sunny in Paris.",
    )
    assert answer == "Noted. Sunny in Paris."
    items = asyncio.run(first.get_items())
    assert [i.get("type", "message") for i in items] == [
        "message",
        "function_call",
        "function_call_output",
        "message",
    ]
    # What the session stored is what was said, without any memory block.
    assert items[0] == {
        "role": "user",
        "content": "I'm allergic to peanuts. What's the weather in Paris?",
    }
    assert items[2]["output"] == "Sunny in Paris, 21 degrees."
    memory.wait()

    later = StratamemSession("ana-friday", memory, user_id="ana")
    _run(server, later, "Can you suggest a snack for me?", "Try an apple.")
    request = server.responses_requests()[-1]
    asked = _last_user_text(request)
    assert asked.startswith("Can you suggest a snack for me?\n\n<memory>")
    assert "allergic to peanuts" in asked
    other = StratamemSession("ben-friday", memory, user_id="ben")
    _run(server, other, "Can you suggest a snack for me?", "Try an apple.")
    assert "<memory>" not in _last_user_text(server.responses_requests()[-1])


def test_memory_of_one_conversation_is_recalled_in_another(
    semantic: Memory, server: FakeOpenAIServer
) -> None:
    _conversation(semantic, server)


def test_another_project_recalls_nothing(semantic: Memory, server: FakeOpenAIServer) -> None:
    _run(server, StratamemSession("p1", semantic, user_id="ana"), "I'm allergic to peanuts.", "Ok.")
    semantic.wait()
    semantic.projects.create("other", project_id="other")
    elsewhere = StratamemSession("p1", semantic.for_project("other"), user_id="ana")
    assert asyncio.run(elsewhere.get_items()) == []
    _run(server, elsewhere, "Can you suggest a snack for me?", "Try an apple.")
    assert "<memory>" not in _last_user_text(server.responses_requests()[-1])


def test_the_block_goes_into_the_last_user_turn_and_the_prefix_stays_the_same(
    semantic: Memory, server: FakeOpenAIServer
) -> None:
    setup = StratamemSession("notes", semantic, user_id="ana")
    asyncio.run(setup.add_items([{"role": "user", "content": "I live in Lisbon."}]))
    semantic.wait()
    session = StratamemSession("trip", semantic, user_id="ana")
    call = {"name": "get_weather", "arguments": {"city": "Lisbon"}}
    _run(server, session, "What's the weather where I live?", {"tool_calls": [call]}, "Sunny.")
    first, second = server.responses_requests()[-2:]
    # Both calls of the run (before and after the tool) carry the same block in the same
    # place, after the user's own words; the instructions are untouched.
    assert first["instructions"] == second["instructions"] == "Be brief."
    assert first["input"][0] == second["input"][0]
    assert "Lisbon" in _last_user_text(first)
    # The next turn sends the stored history as it was, the block only in its last turn.
    _run(server, session, "And tomorrow?", "Also sunny.")
    third = server.responses_requests()[-1]
    history = asyncio.run(session.get_items())[:-2]
    assert third["input"][: len(history)] == history
    assert "<memory>" not in str(third["input"][: len(history)])
    assert _last_user_text(third).startswith("And tomorrow?\n\n<memory>")


def test_the_filter_changes_no_object_of_the_run(mem: Memory) -> None:
    setup = StratamemSession("notes", mem, user_id="ana")
    asyncio.run(setup.add_items([{"role": "user", "content": "I live in Lisbon."}]))
    mem.wait()
    session = StratamemSession("now", mem, user_id="ana")
    agent = Agent(name="a")

    def filtered(message: dict[str, Any]) -> tuple[ModelInputData, dict[str, Any]]:
        before = {**message}
        data = ModelInputData(input=[message], instructions="Be brief.")  # type: ignore[list-item]
        out = asyncio.run(session.call_model_input_filter(CallModelData(data, agent, None)))
        assert message == before and data.input == [message]  # nothing of the run changed
        return out, message

    out, _ = filtered({"role": "user", "content": "Where do I live, Lisbon?"})
    text = out.input[0]["content"]  # type: ignore[index]
    assert (
        text.startswith("Where do I live, Lisbon?\n\n<memory>") and out.instructions == "Be brief."
    )
    parts = [{"type": "input_text", "text": "Where do I live?"}]
    out, _ = filtered({"role": "user", "content": parts})
    added = out.input[0]["content"]  # type: ignore[index]
    assert added[0] == parts[0] and added[1]["type"] == "input_text"
    assert added[1]["text"].startswith("<memory>") and "Lisbon" in added[1]["text"]
    # A user turn without text asks nothing: no recall, the input as it was.
    odd = {"role": "user", "type": "message", "content": None, "text": "Where do I live?"}
    out, _ = filtered(odd)
    assert out.input == [odd] and out.instructions == "Be brief."  # no text: no recall


def test_a_correction_replaces_the_old_value(semantic: Memory, server: FakeOpenAIServer) -> None:
    _run(server, StratamemSession("c1", semantic, user_id="ana"), "I drive a Honda Civic.", "Ok.")
    semantic.wait()
    correction = "Correction: I drive a Tesla Model 3 now."
    _run(server, StratamemSession("c2", semantic, user_id="ana"), correction, "Ok.")
    semantic.wait()
    _run(
        server, StratamemSession("c3", semantic, user_id="ana"), "What car do I drive?", "A Tesla."
    )
    block = _last_user_text(server.responses_requests()[-1])
    assert "Tesla" in block
    if "Honda" in block:  # history may be quoted, marked, after the current value
        assert block.index("Tesla") < block.index("Honda") and "(superseded)" in block


def test_clearing_a_conversation_removes_its_memory(
    semantic: Memory, server: FakeOpenAIServer
) -> None:
    first = StratamemSession("monday", semantic, user_id="ana")
    _run(server, first, "I'm allergic to peanuts.", "Noted.")
    semantic.wait()
    asyncio.run(first.clear_session())
    _run(server, StratamemSession("friday", semantic, user_id="ana"), "Suggest a snack.", "Ok.")
    assert "peanuts" not in _last_user_text(server.responses_requests()[-1])


def test_a_failed_recall_leaves_the_call_without_memory(
    caplog: pytest.LogCaptureFixture,
) -> None:
    dead = connect(f"http://127.0.0.1:{free_port()}", api_key="sm_x", max_retries=0)
    session = StratamemSession("s", dead, user_id="ana")
    data = ModelInputData(input=[{"role": "user", "content": "Hi"}], instructions="Be brief.")
    agent = Agent(name="a")
    with caplog.at_level(logging.WARNING, logger="stratamem.integrations.openai_agents"):
        out = asyncio.run(session.call_model_input_filter(CallModelData(data, agent, None)))
    assert out.input == [{"role": "user", "content": "Hi"}] and out.instructions == "Be brief."
    assert "recall failed" in caplog.text
    dead.close()


# -- against a server ----------------------------------------------------------------------


@pytest.mark.slow
def test_against_a_server(served: str, server: FakeOpenAIServer) -> None:
    url, key = served.split()
    with connect(url, api_key=key) as remote:
        _conversation(remote, server)
        session = StratamemSession("round-trip", remote, user_id="cy")
        asyncio.run(session.add_items(ITEMS))  # type: ignore[arg-type]
        assert asyncio.run(session.get_items()) == ITEMS
        assert asyncio.run(session.pop_item()) == ITEMS[-1]
        asyncio.run(session.clear_session())
        assert asyncio.run(session.get_items()) == []
        remote.erase_user("ana")
        remote.erase_user("ben")


# -- packaging -----------------------------------------------------------------------------


def test_without_the_sdk_the_module_names_the_extra() -> None:
    assert_names_the_extra("agents", "stratamem.integrations.openai_agents", "openai-agents")


def test_the_docs_example_runs(tmp_path: Path, server: FakeOpenAIServer) -> None:
    server.chat_replies.extend(["Noted.", "Try an apple."])
    out = run_docs_example(
        "openai-agents.md",
        tmp_path,
        OPENAI_API_KEY="k",
        OPENAI_BASE_URL=server.base_url,
        OPENAI_AGENTS_DISABLE_TRACING="1",  # traces would go to OpenAI
    )
    assert out.split() == ["Noted.", "Try", "an", "apple."]
    first, second = server.responses_requests()
    assert _last_user_text(first) == "I'm allergic to peanuts."
    question, _, block = _last_user_text(second).partition("\n\n")
    assert question == "Can you suggest a snack?"
    assert block.startswith("<memory>") and "User is allergic to peanuts." in block
