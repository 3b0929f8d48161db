"""mem.llm.register(pydantic_ai=agent|model) with the real pydantic-ai against the loopback fake
OpenAI server: run_sync, run, run_stream, tool loops; memory in the request the server
received; one exchange per run (the model and the SDK client under an agent stand down);
caller objects unchanged; memory failures never reaching the run."""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.messages import ModelRequest, UserPromptPart
from pydantic_ai.models import ModelRequestParameters
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from fakes.openai_server import FakeOpenAIServer
from stratamem import Memory
from stratamem.capture import MEMORY_PREAMBLE

ANSWER = "Try roasted chickpeas instead of peanuts."
ASK = "Any snack ideas? I am allergic to peanuts, remember."
TOOL = {"tool_calls": [{"id": "call_1", "name": "lookup", "arguments": {"q": "snacks"}}]}


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as s:
        s.chat_script = lambda body: ANSWER
        yield s


@pytest.fixture
def make_memory(make_memory: Any) -> Any:
    # These tests check the system slot (injection="system"); the default placement, in the
    # last user turn, is tested with every adapter in test_capture_injection.py.
    return functools.partial(make_memory, capture_injection="system")


@pytest.fixture
def mem(make_memory: Any) -> Memory:
    # Recall's default budget (50 ms) is for production; here a slow recall on a busy
    # machine must not turn into a request without memory.
    mem = make_memory(capture_recall_timeout_ms=10_000)
    s = mem.sessions.create(user_id="ana", session_id="chat")
    s.add_messages([{"role": "user", "content": "I am allergic to peanuts."}], sync=True)
    return mem


def _model(server: FakeOpenAIServer) -> OpenAIChatModel:
    return OpenAIChatModel(
        "gpt-test", provider=OpenAIProvider(base_url=server.base_url, api_key="k")
    )


def _agent(server: FakeOpenAIServer) -> Agent[None, str]:
    agent = Agent(_model(server), instructions="You are a helpful cook.")

    @agent.tool_plain
    def lookup(q: str) -> str:
        """Look up snacks."""
        return "chickpeas"

    return agent


def _systems(server: FakeOpenAIServer) -> list[list[str]]:
    return [
        [m["content"] for m in b["messages"] if m["role"] == "system"]
        for b in server.chat_requests()
    ]


def _injected(systems: list[str]) -> bool:
    memory = [s for s in systems if MEMORY_PREAMBLE in s]
    return len(memory) == 1 and "allergic to peanuts" in memory[0]


def _stored(mem: Memory) -> list[tuple[str, str]]:
    assert mem.llm.flush(5)
    return [(m.role, m.content) for m in mem.messages.list(session_id="chat")]


def _capture(mem: Memory) -> dict[str, Any]:
    assert mem.llm.flush(5)
    return mem.messages.list(session_id="chat")[-1].metadata["capture"]


def test_registration_by_name(mem: Memory, server: FakeOpenAIServer) -> None:
    agent = _agent(server)
    with pytest.raises(TypeError, match=r"register\(pydantic_ai=\.\.\.\)"):
        mem.llm.register(agent)
    with pytest.raises(TypeError, match=r"register\(pydantic_ai=\.\.\.\)"):
        mem.llm.register(agent.model)
    with pytest.raises(TypeError, match="agno= takes"):
        mem.llm.register(agno=agent)
    assert mem.llm.register(pydantic_ai=agent) is agent
    assert "iter" not in vars(agent)  # wrapped on the class, for registered agents only
    mem.llm.unregister(agent)
    assert "iter" not in vars(Agent) or not hasattr(vars(Agent)["iter"], "__stratamem_original__")


def test_agent_run_sync_injects_once_and_captures_the_run(
    mem: Memory, server: FakeOpenAIServer
) -> None:
    agent = mem.llm.register(pydantic_ai=_agent(server))
    history: list[Any] = []
    with mem.scope(user_id="ana", session_id="chat"):
        result = agent.run_sync(ASK, message_history=history)
    assert result.output == ANSWER and history == []
    systems = _systems(server)[-1]
    assert systems[0] == "You are a helpful cook." and _injected(systems)
    # The agent's own instructions are unchanged: a run outside any scope sends only them.
    agent.run_sync("Hello")
    assert _systems(server)[-1] == ["You are a helpful cook."]
    stored = _stored(mem)
    assert stored[-2:] == [("user", ASK), ("assistant", ANSWER)]
    capture = _capture(mem)
    assert capture["provider"] == "pydantic_ai" and capture["model"] == "gpt-test"
    assert capture["usage"]["requests"] == 1


def test_a_tool_loop_is_one_exchange(mem: Memory, server: FakeOpenAIServer) -> None:
    agent = mem.llm.register(pydantic_ai=_agent(server))
    server.chat_replies.extend([TOOL, ANSWER])
    with mem.scope(user_id="ana", session_id="chat"):
        assert agent.run_sync(ASK).output == ANSWER
    assert len(server.chat_requests()) == 2
    assert all(_injected(s) for s in _systems(server))  # every request of the run
    stored = _stored(mem)
    assert stored.count(("user", ASK)) == 1 and stored[-1] == ("assistant", ANSWER)
    assert [s for s in stored if s[0] == "assistant"] == [("assistant", ANSWER)]
    capture = _capture(mem)
    assert [(c["name"], json.loads(c["arguments"])) for c in capture["tool_calls"]] == [
        ("lookup", {"q": "snacks"})
    ]
    assert capture["usage"]["requests"] == 2


def test_structured_output_is_stored_as_json(mem: Memory, server: FakeOpenAIServer) -> None:
    class Snack(BaseModel):
        name: str

    agent = mem.llm.register(pydantic_ai=Agent(_model(server), output_type=Snack))
    server.chat_replies.append(
        {"tool_calls": [{"name": "final_result", "arguments": {"name": "chickpeas"}}]}
    )
    with mem.scope(user_id="ana", session_id="chat"):
        assert agent.run_sync(ASK).output == Snack(name="chickpeas")
    assert _stored(mem)[-1] == ("assistant", '{"name":"chickpeas"}')
    assert "tool_calls" not in _capture(mem)  # the output tool is the answer, not a tool call


def test_async_run_and_run_stream(mem: Memory, server: FakeOpenAIServer) -> None:
    agent = mem.llm.register(pydantic_ai=_agent(server))

    async def go() -> tuple[str, list[str]]:
        with mem.scope(user_id="ana", session_id="chat"):
            result = await agent.run(ASK)
            async with agent.run_stream("Dessert without peanuts?") as stream:
                pieces = [t async for t in stream.stream_text(delta=True)]
        return result.output, pieces

    output, pieces = asyncio.run(go())
    assert output == ANSWER and "".join(pieces) == ANSWER
    assert server.chat_requests()[-1]["stream"] is True
    assert all(_injected(s) for s in _systems(server))
    stored = _stored(mem)
    assert stored[-4:] == [
        ("user", ASK),
        ("assistant", ANSWER),
        ("user", "Dessert without peanuts?"),
        ("assistant", ANSWER),
    ]
    assert "partial" not in _capture(mem)


def test_model_and_sdk_under_a_registered_agent_stand_down(
    mem: Memory, server: FakeOpenAIServer
) -> None:
    agent = _agent(server)
    mem.llm.register(pydantic_ai=agent)
    mem.llm.register(pydantic_ai=agent.model)
    mem.llm.register(agent.model.client)  # the openai.AsyncOpenAI under the model
    server.chat_replies.extend([TOOL, ANSWER])
    with mem.scope(user_id="ana", session_id="chat"):
        agent.run_sync(ASK)
    assert all(_injected(s) for s in _systems(server))
    stored = _stored(mem)
    assert stored.count(("user", ASK)) == 1
    assert [s for s in stored if s[0] == "assistant"] == [("assistant", ANSWER)]
    assert _capture(mem)["provider"] == "pydantic_ai"


def test_a_registered_model_captures_each_request(mem: Memory, server: FakeOpenAIServer) -> None:
    model = _model(server)
    mem.llm.register(pydantic_ai=model)
    agent = Agent(model, instructions="You are a helpful cook.")

    @agent.tool_plain
    def lookup(q: str) -> str:
        """Look up snacks."""
        return "chickpeas"

    server.chat_replies.extend([TOOL, ANSWER])
    with mem.scope(user_id="ana", session_id="chat"):
        agent.run_sync(ASK)

        # A model of its own: run_sync's event loop is gone, and its connections with it.
        direct_model = mem.llm.register(pydantic_ai=_model(server))

        async def direct() -> Any:
            request = ModelRequest(parts=[UserPromptPart("Lunch without peanuts?")])
            kept = copy.deepcopy(request)
            params = ModelRequestParameters()
            response = await direct_model.request([request], None, params)
            assert request == kept and params == ModelRequestParameters()
            return response

        response = asyncio.run(direct())
    assert response.parts[0].content == ANSWER
    assert all(_injected(s) for s in _systems(server))
    stored = _stored(mem)
    # The tool-result request stores its answer, not the question again.
    assert stored[-5:] == [
        ("user", ASK),
        ("assistant", '[tool call] lookup({"q":"snacks"})'),
        ("assistant", ANSWER),
        ("user", "Lunch without peanuts?"),
        ("assistant", ANSWER),
    ]


def test_memory_failures_never_reach_the_run(
    mem: Memory, server: FakeOpenAIServer, caplog: pytest.LogCaptureFixture
) -> None:
    agent = mem.llm.register(pydantic_ai=_agent(server))

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("memory backend down")

    mem.get_memory = broken  # type: ignore[method-assign]
    mem.add_messages = broken  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR, "stratamem.capture"), mem.scope(user_id="ana"):
        assert agent.run_sync(ASK).output == ANSWER
        assert mem.llm.flush(5)
    assert _systems(server)[-1] == ["You are a helpful cook."]
    assert "memory backend down" in caplog.text


def test_a_failed_run_is_recorded_and_raised(mem: Memory, server: FakeOpenAIServer) -> None:
    agent = mem.llm.register(pydantic_ai=_agent(server))
    server.fail_next(5, status=400)
    with mem.scope(user_id="ana", session_id="chat"), pytest.raises(Exception, match="400"):
        agent.run_sync(ASK)
    assert _stored(mem)[-1] == ("user", ASK)
    assert _capture(mem)["error"]
