"""mem.llm over LiteLLM: ``mem.llm.register(litellm)`` wraps ``litellm.completion`` and
``litellm.acompletion`` — plain and streamed, sync and async, early close, mid-stream
failure, restore. The real litellm (its ``openai/`` provider) against the loopback fake
OpenAI server; nothing may leave the machine."""

from __future__ import annotations

import asyncio
import copy
import functools
import os
import socket
import types
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

# litellm fetches its model cost map from the internet at import unless told to use the
# copy it ships: this must be set before the import below.
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"

import litellm
import openai

from fakes.openai_server import FakeOpenAIServer
from stratamem import Memory
from stratamem.capture import MEMORY_PREAMBLE

# No telemetry, no logging callbacks (they would post to their services), and no
# "Give Feedback / Get Help" banner printed on each expected error.
litellm.telemetry = False
litellm.suppress_debug_info = True
litellm.callbacks = []
litellm.success_callback = []
litellm.failure_callback = []

# litellm's own pydantic models warn as they are built and read; not ours to fix.
pytestmark = [
    pytest.mark.filterwarnings("ignore:Items? .* on TypedDict class:UserWarning"),
    pytest.mark.filterwarnings("ignore:Accessing the 'model_:DeprecationWarning"),
]

ANSWER = "Try roasted chickpeas instead of peanuts."
ASK = [{"role": "user", "content": "Any snack ideas with no peanuts?"}]
TOOL = {"tool_calls": [{"id": "call_1", "name": "lookup", "arguments": '{"q": "snacks"}'}]}


@pytest.fixture(autouse=True)
def _loopback_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # Recorded rather than raised: litellm swallows errors in its background work.
    outside: list[Any] = []
    real = socket.socket.connect

    def connect(sock: socket.socket, address: Any) -> None:
        if sock.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in (
            "127.0.0.1",
            "::1",
            "localhost",
        ):
            outside.append(address)
            raise OSError(f"test: network access to {address} refused")
        return real(sock, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    yield
    assert outside == []


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
    mem = make_memory()
    s = mem.sessions.create(user_id="ana", session_id="chat")
    s.add_messages([{"role": "user", "content": "I am allergic to peanuts."}], sync=True)
    return mem


def _kw(server: FakeOpenAIServer, **more: Any) -> dict[str, Any]:
    return {
        "model": "openai/gpt-test",
        "api_base": server.base_url,
        "api_key": "k",
        "messages": ASK,
        **more,
    }


def _stored(mem: Memory, session: str = "chat") -> list[Any]:
    assert mem.llm.flush(5)
    return mem.messages.list(session_id=session)


def _capture(mem: Memory, session: str = "chat") -> dict[str, Any]:
    return _stored(mem, session)[-1].metadata["capture"]


def _injected(server: FakeOpenAIServer) -> bool:
    first = server.chat_requests()[-1]["messages"][0]
    return first["role"] == "system" and first["content"].startswith(MEMORY_PREAMBLE)


async def _enumerate(stream: Any) -> AsyncIterator[tuple[int, Any]]:
    i = 0
    async for item in stream:
        yield i, item
        i += 1


def _text(chunks: list[Any]) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_register_wraps_the_module_and_unregister_restores_it(mem: Memory) -> None:
    completion, acompletion = litellm.completion, litellm.acompletion
    assert mem.llm.register(litellm) is litellm
    assert mem.llm.register(litellm) is litellm  # twice: a no-op
    assert litellm.completion is not completion and litellm.acompletion is not acompletion
    assert litellm.completion.__wrapped__ is completion  # functools.wraps: same name, docs
    mem.llm.unregister(litellm)
    assert litellm.completion is completion and litellm.acompletion is acompletion
    assert not hasattr(litellm, "_stratamem_capture")
    # Identity, not a name: a look-alike module is not litellm.
    with pytest.raises(TypeError, match="litellm module"):
        mem.llm.register(types.ModuleType("litellm"))


def test_completion_injects_memory_and_captures(mem: Memory, server: FakeOpenAIServer) -> None:
    mem.llm.register(litellm)
    messages = [{"role": "system", "content": "Be brief."}, *ASK]
    before = copy.deepcopy(messages)
    with mem.scope(user_id="ana", session_id="chat"):
        reply = litellm.completion(**_kw(server, messages=messages))
    assert reply.choices[0].message.content == ANSWER
    assert messages == before  # the caller's list and dicts are untouched
    sent = server.chat_requests()[-1]["messages"]
    assert sent[0]["content"].startswith("Be brief.\n\n" + MEMORY_PREAMBLE)
    assert "allergic to peanuts" in sent[0]["content"] and sent[1:] == ASK
    user, answer = _stored(mem)[-2:]
    assert (user.role, user.content) == ("user", ASK[0]["content"])
    assert (answer.role, answer.content) == ("assistant", ANSWER)
    capture = answer.metadata["capture"]
    assert capture["provider"] == "litellm" and capture["model"] == "gpt-test"
    assert capture["usage"]["completion_tokens"] > 0


def test_positional_model_and_messages_are_injected_too(
    mem: Memory, server: FakeOpenAIServer
) -> None:
    mem.llm.register(litellm)
    with mem.scope(user_id="ana", session_id="chat"):
        litellm.completion("openai/gpt-test", ASK, api_base=server.base_url, api_key="k")
    assert _injected(server)
    assert _stored(mem)[-1].content == ANSWER


def test_completion_stream_passes_every_chunk_and_is_captured_at_the_end(
    mem: Memory, server: FakeOpenAIServer
) -> None:
    mem.llm.register(litellm)
    with mem.scope(user_id="ana", session_id="chat"):
        stream = litellm.completion(
            **_kw(server, stream=True, stream_options={"include_usage": True})
        )
        chunks = list(stream)
    assert _text(chunks) == ANSWER and len(chunks) > 3
    assert _injected(server)
    last = _stored(mem)[-1]
    assert (last.role, last.content) == ("assistant", ANSWER)
    capture = last.metadata["capture"]
    assert capture["provider"] == "litellm" and capture["usage"]["completion_tokens"] > 0
    assert "partial" not in capture


def test_completion_stream_closed_early_is_partial(mem: Memory, server: FakeOpenAIServer) -> None:
    mem.llm.register(litellm)
    with (
        mem.scope(user_id="ana", session_id="chat"),
        litellm.completion(**_kw(server, stream=True)) as stream,
    ):
        for i, _ in enumerate(stream):
            if i == 2:
                break
    last = _stored(mem)[-1]
    assert last.metadata["capture"]["partial"] is True
    assert ANSWER.startswith(last.content) and last.content != ANSWER


def test_completion_stream_failing_midway_raises_and_is_captured(
    mem: Memory, server: FakeOpenAIServer
) -> None:
    mem.llm.register(litellm)
    server.fail_stream_after(3)
    # litellm's exceptions subclass openai's (this version: MidStreamFallbackError).
    with mem.scope(user_id="ana", session_id="chat"), pytest.raises(openai.APIError):
        for _ in litellm.completion(**_kw(server, stream=True)):
            pass
    capture = _capture(mem)
    assert capture["provider"] == "litellm" and "error" in capture
    assert "partial" not in capture  # an error, not an early close


def test_tool_calls_plain_and_streamed(mem: Memory, server: FakeOpenAIServer) -> None:
    server.chat_script = lambda body: copy.deepcopy(TOOL)
    mem.llm.register(litellm)
    call = {"id": "call_1", "name": "lookup", "arguments": '{"q": "snacks"}'}
    with mem.scope(user_id="ana", session_id="chat"):
        litellm.completion(**_kw(server))
        assert _capture(mem)["tool_calls"] == [call]
        list(litellm.completion(**_kw(server, stream=True)))
    last = _stored(mem)[-1]
    assert last.metadata["capture"]["tool_calls"] == [call]
    assert last.content.startswith("[tool call] lookup(")


def test_acompletion_plain_and_streamed(mem: Memory, server: FakeOpenAIServer) -> None:
    mem.llm.register(litellm)

    async def scenario() -> list[str]:
        answers = []
        with mem.scope(user_id="ana", session_id="async"):
            reply = await litellm.acompletion(**_kw(server))
            answers.append(reply.choices[0].message.content)
            assert _injected(server)
            stream = await litellm.acompletion(**_kw(server, stream=True))
            async with stream:  # litellm's aclose() behind the proxy: no TypeError
                answers.append(_text([c async for c in stream]))
            assert _injected(server)
            # litellm's own spelling of an async call, captured as one.
            reply = await litellm.completion(**_kw(server), acompletion=True)
            answers.append(reply.choices[0].message.content)
        return answers

    assert asyncio.run(scenario()) == [ANSWER] * 3
    stored = _stored(mem, "async")
    assert [m.content for m in stored if m.role == "assistant"] == [ANSWER] * 3
    assert {m.metadata["capture"]["provider"] for m in stored if m.role == "assistant"} == {
        "litellm"
    }
    assert not any("partial" in m.metadata.get("capture", {}) for m in stored)


def test_acompletion_stream_closed_early_and_failing_midway(
    mem: Memory, server: FakeOpenAIServer
) -> None:
    mem.llm.register(litellm)

    async def scenario() -> None:
        with mem.scope(user_id="ana", session_id="chat"):
            stream = await litellm.acompletion(**_kw(server, stream=True))
            async with stream:
                async for i, _ in _enumerate(stream):
                    if i == 2:
                        break
            assert _capture(mem)["partial"] is True
            stream = await litellm.acompletion(**_kw(server, stream=True))
            for _ in range(3):
                await stream.__anext__()
            await stream.aclose()  # litellm's own close, not only the proxy's
            assert _capture(mem)["partial"] is True
            server.fail_stream_after(3)
            with pytest.raises(openai.APIError):
                async for _ in await litellm.acompletion(**_kw(server, stream=True)):
                    pass
            assert "error" in _capture(mem)

    asyncio.run(scenario())
    assert len([m for m in _stored(mem) if m.role == "assistant"]) == 3


def test_a_call_without_a_user_is_left_alone(mem: Memory, server: FakeOpenAIServer) -> None:
    mem.llm.register(litellm)
    reply = litellm.completion(**_kw(server))
    assert reply.choices[0].message.content == ANSWER
    assert server.chat_requests()[-1]["messages"] == ASK  # nothing injected
    stream = litellm.completion(**_kw(server, stream=True))
    assert type(stream).__name__ == "CustomStreamWrapper"  # litellm's own object, unwrapped
    assert _text(list(stream)) == ANSWER
    assert mem.llm.flush(5) and mem.llm.written == 0


def test_streams_are_litellms_own_type(mem: Memory, server: FakeOpenAIServer) -> None:
    mem.llm.register(litellm)
    with mem.scope(user_id="ana", session_id="types"):
        stream = litellm.completion(**_kw(server, stream=True))
        assert isinstance(stream, litellm.CustomStreamWrapper)
        assert type(stream).__name__ != "CustomStreamWrapper"  # the capturing proxy
        assert stream.model == "gpt-test"  # litellm's own attributes
        assert _text(list(stream)) == ANSWER

    async def scenario() -> str:
        with mem.scope(user_id="ana", session_id="types"):
            stream = await litellm.acompletion(**_kw(server, stream=True))
            assert isinstance(stream, litellm.CustomStreamWrapper)
            async with stream:
                return _text([c async for c in stream])

    assert asyncio.run(scenario()) == ANSWER
    assert [m.content for m in _stored(mem, "types") if m.role == "assistant"] == [ANSWER] * 2
