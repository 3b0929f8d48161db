"""mem.llm.register(agno=agent|model) with the real agno against the loopback fake OpenAI
server: run, arun, streamed runs, tool loops; memory in the request the server received;
one exchange per run (the openai client under the model stands down); the agent's messages
unchanged; memory failures never reaching the run."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from agno.agent import Agent
from agno.models.openai import OpenAIChat

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


def lookup(q: str) -> str:
    """Look up snacks."""
    return "chickpeas"


def _agent(server: FakeOpenAIServer) -> Agent:
    model = OpenAIChat(id="gpt-test", base_url=server.base_url, api_key="k", max_retries=0)
    return Agent(model=model, instructions="You are a helpful cook.", tools=[lookup])


def _system(body: dict[str, Any]) -> str:
    first = body["messages"][0]
    return first["content"] if first["role"] in ("system", "developer") else ""


def _injected(system: str) -> bool:
    # Which memories recall picks can depend on whether an earlier captured exchange of the
    # same test (also about peanuts) was already processed; the topic is stable, the line not.
    return system.count(MEMORY_PREAMBLE) == 1 and "peanuts" in system


def _stored(mem: Memory) -> list[tuple[str, str]]:
    assert mem.llm.flush(5)
    return [(m.role, m.content) for m in mem.messages.list(session_id="chat")]


def _capture(mem: Memory) -> dict[str, Any]:
    assert mem.llm.flush(5)
    return mem.messages.list(session_id="chat")[-1].metadata["capture"]


def test_registration_by_name(mem: Memory, server: FakeOpenAIServer) -> None:
    agent = _agent(server)
    with pytest.raises(TypeError, match=r"register\(agno=\.\.\.\)"):
        mem.llm.register(agent)
    with pytest.raises(TypeError, match=r"register\(agno=\.\.\.\)"):
        mem.llm.register(agent.model)
    with pytest.raises(TypeError, match="give the agent a Model object"):
        mem.llm.register(agno=Agent())
    assert mem.llm.register(agno=agent) is agent
    with pytest.raises(ValueError, match="registered already"):
        mem.llm.register(agno=agent.model)
    assert "response" not in vars(agent.model)  # wrapped on the class, for this model only
    mem.llm.unregister(agent)
    assert "response" not in vars(OpenAIChat)
    mem.llm.register(agno=agent.model)  # free again


def test_run_injects_into_the_system_message_and_captures_once(
    mem: Memory, server: FakeOpenAIServer
) -> None:
    agent = mem.llm.register(agno=_agent(server))
    with mem.scope(user_id="ana", session_id="chat"):
        result = agent.run(ASK)
    assert result.content == ANSWER
    system = _system(server.chat_requests()[-1])
    assert system.startswith("You are a helpful cook.") and _injected(system)
    # The run's own record of its messages holds the agent's system message, unchanged.
    assert all(MEMORY_PREAMBLE not in str(m.content) for m in result.messages or [])
    assert _stored(mem)[-2:] == [("user", ASK), ("assistant", ANSWER)]
    capture = _capture(mem)
    assert capture["provider"] == "agno" and capture["model"] == "gpt-test"
    assert capture["usage"]["total_tokens"] > 0


def test_a_tool_loop_is_one_exchange(mem: Memory, server: FakeOpenAIServer) -> None:
    agent = mem.llm.register(agno=_agent(server))
    server.chat_replies.extend([TOOL, ANSWER])
    with mem.scope(user_id="ana", session_id="chat"):
        assert agent.run(ASK).content == ANSWER
    assert len(server.chat_requests()) == 2
    assert all(_injected(_system(b)) for b in server.chat_requests())
    stored = _stored(mem)
    assert stored.count(("user", ASK)) == 1
    assert [s for s in stored if s[0] == "assistant"] == [("assistant", ANSWER)]
    calls = _capture(mem)["tool_calls"]
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("lookup", {"q": "snacks"})]


def test_streamed_and_async_runs(mem: Memory, server: FakeOpenAIServer) -> None:
    agent = mem.llm.register(agno=_agent(server))
    questions = [ASK, "Async, no peanuts?", "Async stream, no peanuts?"]

    def text(events: list[Any]) -> str:
        return "".join(e.content or "" for e in events if getattr(e, "event", "") == "RunContent")

    with mem.scope(user_id="ana", session_id="chat"):
        streamed = list(agent.run(questions[0], stream=True))

        async def go() -> tuple[str, list[Any]]:
            result = await agent.arun(questions[1])
            events = [e async for e in agent.arun(questions[2], stream=True)]
            return result.content, events

        content, events = asyncio.run(go())
    assert text(streamed) == ANSWER and content == ANSWER and text(events) == ANSWER
    assert [b.get("stream", False) for b in server.chat_requests()] == [True, False, True]
    assert all(_injected(_system(b)) for b in server.chat_requests())
    stored = _stored(mem)
    for q in questions:
        assert stored.count(("user", q)) == 1
    assert stored.count(("assistant", ANSWER)) == 3


def test_a_stream_closed_early_is_captured_partial(mem: Memory, server: FakeOpenAIServer) -> None:
    agent = mem.llm.register(agno=_agent(server))
    with mem.scope(user_id="ana", session_id="chat"):
        events = agent.run(ASK, stream=True)
        for event in events:
            if getattr(event, "event", "") == "RunContent" and event.content:
                break
        events.close()
    # Agno appends the assistant's turn when its stream ends; what had arrived is kept.
    assert _stored(mem)[-2:] == [("user", ASK), ("assistant", ANSWER.split()[0])]
    assert _capture(mem)["partial"] is True


def test_the_openai_client_under_the_model_stands_down(
    mem: Memory, server: FakeOpenAIServer
) -> None:
    agent = _agent(server)
    mem.llm.register(agno=agent)
    mem.llm.register(agent.model.get_client())
    with mem.scope(user_id="ana", session_id="chat"):
        agent.run(ASK)
    assert _injected(_system(server.chat_requests()[-1]))
    stored = _stored(mem)
    assert stored.count(("user", ASK)) == 1 and stored.count(("assistant", ANSWER)) == 1
    assert _capture(mem)["provider"] == "agno"


def test_memory_failures_never_reach_the_run(
    mem: Memory, server: FakeOpenAIServer, caplog: pytest.LogCaptureFixture
) -> None:
    agent = mem.llm.register(agno=_agent(server))

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("memory backend down")

    mem.get_memory = broken  # type: ignore[method-assign]
    mem.add_messages = broken  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR, "stratamem.capture"), mem.scope(user_id="ana"):
        assert agent.run(ASK).content == ANSWER
        assert mem.llm.flush(5)
    assert MEMORY_PREAMBLE not in _system(server.chat_requests()[-1])
    assert "memory backend down" in caplog.text
