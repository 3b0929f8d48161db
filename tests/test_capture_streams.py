"""mem.llm over streams and the other generation methods: OpenAI chat streams, parse and the
Responses API; Anthropic messages.create (plain, stream=True) and messages.stream — sync and
async, tool calls, early close, mid-stream failure. Real SDKs, loopback fake servers."""

from __future__ import annotations

import asyncio
import copy
import functools
import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx2
import openai
import pytest
from anthropic.lib.streaming import (
    AsyncMessageStream,
    AsyncMessageStreamManager,
    MessageStream,
    MessageStreamManager,
)
from pydantic import BaseModel

from fakes.anthropic_server import FakeAnthropicServer
from fakes.openai_server import FakeOpenAIServer
from stratamem import Memory
from stratamem.capture import MEMORY_PREAMBLE

ANSWER = "Try roasted chickpeas instead of peanuts."
TOOL = {"tool_calls": [{"id": "call_1", "name": "lookup", "arguments": '{"q": "snacks"}'}]}


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


@pytest.fixture
def oai() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as s:
        s.chat_script = lambda body: ANSWER
        yield s


@pytest.fixture
def ant() -> Iterator[FakeAnthropicServer]:
    with FakeAnthropicServer() as s:
        s.chat_script = lambda body: ANSWER
        yield s


def _last(mem: Memory, session: str = "chat") -> Any:
    assert mem.llm.flush(5)
    return mem.messages.list(session_id=session)[-1]


def _capture(mem: Memory, session: str = "chat") -> dict[str, Any]:
    return _last(mem, session).metadata["capture"]


ASK = [{"role": "user", "content": "Any snack ideas with no peanuts?"}]


# -- OpenAI --------------------------------------------------------------------------------


def test_openai_stream_passes_every_chunk_and_is_captured_at_the_end(
    mem: Memory, oai: FakeOpenAIServer
) -> None:
    client = mem.llm.register(openai.OpenAI(base_url=oai.base_url, api_key="k", max_retries=0))
    with mem.scope(user_id="ana", session_id="chat"):
        stream = client.chat.completions.create(
            model="m", messages=ASK, stream=True, stream_options={"include_usage": True}
        )
        chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ANSWER and len(chunks) > 3
    assert "allergic" in oai.chat_requests()[-1]["messages"][0]["content"]
    last = _last(mem)
    assert (last.role, last.content) == ("assistant", ANSWER)
    assert last.metadata["capture"]["usage"]["completion_tokens"] > 0
    assert "partial" not in last.metadata["capture"]


def test_openai_stream_closed_early_is_captured_as_partial(
    mem: Memory, oai: FakeOpenAIServer
) -> None:
    client = mem.llm.register(openai.OpenAI(base_url=oai.base_url, api_key="k", max_retries=0))
    with (
        mem.scope(user_id="ana", session_id="chat"),
        client.chat.completions.create(model="m", messages=ASK, stream=True) as stream,
    ):
        for i, _ in enumerate(stream):
            if i == 2:
                break
    last = _last(mem)
    assert last.metadata["capture"]["partial"] is True
    assert ANSWER.startswith(last.content) and last.content != ANSWER


def test_a_stream_left_once_its_answer_finished_is_captured_whole(
    mem: Memory, oai: FakeOpenAIServer, ant: FakeAnthropicServer
) -> None:
    """A caller that stops reading once the answer has its finish_reason (before the usage
    chunk and [DONE]), or an Anthropic stream its message_stop (before the body's end),
    left nothing of the answer unread: it is whole, not partial."""
    client = mem.llm.register(openai.OpenAI(base_url=oai.base_url, api_key="k", max_retries=0))
    with (
        mem.scope(user_id="ana", session_id="chat"),
        client.chat.completions.create(
            model="m", messages=ASK, stream=True, stream_options={"include_usage": True}
        ) as stream,
    ):
        for chunk in stream:
            if chunk.choices and chunk.choices[0].finish_reason is not None:
                break
    last = _last(mem)
    assert last.content == ANSWER and "partial" not in last.metadata["capture"]

    claude = mem.llm.register(_anthropic(ant))
    with mem.scope(user_id="ana", session_id="chat"):
        events = claude.messages.create(model="m", max_tokens=50, messages=ASK, stream=True)
        for event in events:
            if event.type == "message_stop":
                break
        events.close()
    last = _last(mem)
    assert last.content == ANSWER and "partial" not in last.metadata["capture"]


def test_openai_stream_failing_midway_raises_to_the_caller_and_is_captured(
    mem: Memory, oai: FakeOpenAIServer
) -> None:
    client = mem.llm.register(openai.OpenAI(base_url=oai.base_url, api_key="k", max_retries=0))
    oai.fail_stream_after(2)
    with (
        mem.scope(user_id="ana", session_id="chat"),
        pytest.raises(openai.APIConnectionError),
    ):
        for _ in client.chat.completions.create(model="m", messages=ASK, stream=True):
            pass
    assert "error" in _capture(mem)


def test_openai_tool_calls_plain_and_streamed(mem: Memory, oai: FakeOpenAIServer) -> None:
    oai.chat_script = lambda body: copy.deepcopy(TOOL)
    client = mem.llm.register(openai.OpenAI(base_url=oai.base_url, api_key="k", max_retries=0))
    with mem.scope(user_id="ana", session_id="chat"):
        reply = client.chat.completions.create(model="m", messages=ASK)
        assert reply.choices[0].message.tool_calls[0].function.name == "lookup"
        calls = _capture(mem)["tool_calls"]
        assert calls == [{"id": "call_1", "name": "lookup", "arguments": '{"q": "snacks"}'}]
        list(client.chat.completions.create(model="m", messages=ASK, stream=True))
    last = _last(mem)
    assert last.metadata["capture"]["tool_calls"][0]["name"] == "lookup"
    assert last.content.startswith("[tool call] lookup(")


def test_openai_async_stream(mem: Memory, oai: FakeOpenAIServer) -> None:
    client = mem.llm.register(openai.AsyncOpenAI(base_url=oai.base_url, api_key="k", max_retries=0))

    async def scenario() -> str:
        with mem.scope(user_id="ana", session_id="chat"):
            stream = await client.chat.completions.create(model="m", messages=ASK, stream=True)
            parts = [c.choices[0].delta.content or "" async for c in stream if c.choices]
        await client.close()
        return "".join(parts)

    assert asyncio.run(scenario()) == ANSWER
    assert _last(mem).content == ANSWER


def test_openai_parse_is_captured(mem: Memory, oai: FakeOpenAIServer) -> None:
    class Snack(BaseModel):
        name: str

    oai.chat_script = lambda body: json.dumps({"name": "chickpeas"})
    client = mem.llm.register(openai.OpenAI(base_url=oai.base_url, api_key="k", max_retries=0))
    with mem.scope(user_id="ana", session_id="chat"):
        parsed = client.chat.completions.parse(model="m", messages=ASK, response_format=Snack)
    assert parsed.choices[0].message.parsed == Snack(name="chickpeas")
    assert "allergic" in oai.chat_requests()[-1]["messages"][0]["content"]
    assert _last(mem).content == '{"name": "chickpeas"}'


def test_openai_responses_plain_and_streamed(mem: Memory, oai: FakeOpenAIServer) -> None:
    client = mem.llm.register(openai.OpenAI(base_url=oai.base_url, api_key="k", max_retries=0))
    with mem.scope(user_id="ana", session_id="chat"):
        r = client.responses.create(
            model="m", input="Any snack ideas with no peanuts?", instructions="Be brief."
        )
        assert r.output_text == ANSWER
        sent = oai.responses_requests()[-1]
        assert sent["instructions"].startswith("Be brief.\n\n" + MEMORY_PREAMBLE)
        assert sent["input"] == "Any snack ideas with no peanuts?"
        assert _last(mem).content == ANSWER
        events = list(client.responses.create(model="m", input=ASK, stream=True))
    assert events[-1].type == "response.completed"
    assert oai.responses_requests()[-1]["instructions"].startswith(MEMORY_PREAMBLE)
    last = _last(mem)
    assert last.content == ANSWER and last.metadata["capture"]["usage"]["output_tokens"] > 0


def test_openai_streams_are_the_sdks_types(mem: Memory, oai: FakeOpenAIServer) -> None:
    """What a registered client hands back is an ``openai.Stream`` (``AsyncStream``) to
    ``isinstance``, with the SDK's attributes, context manager and close()."""
    client = mem.llm.register(openai.OpenAI(base_url=oai.base_url, api_key="k", max_retries=0))
    with mem.scope(user_id="ana", session_id="types"):
        stream = client.chat.completions.create(model="m", messages=ASK, stream=True)
        assert isinstance(stream, openai.Stream) and type(stream) is not openai.Stream
        assert stream.response.status_code == 200
        with stream as entered:
            assert entered is stream
            assert next(stream).choices[0].delta is not None
        assert stream.response.is_closed  # the SDK's own close() ran
        assert _capture(mem, "types")["partial"] is True
        events = client.responses.create(model="m", input=ASK, stream=True)
        assert isinstance(events, openai.Stream)
        assert [e.type for e in events][-1] == "response.completed"
    assert _last(mem, "types").content == ANSWER

    aclient = mem.llm.register(
        openai.AsyncOpenAI(base_url=oai.base_url, api_key="k", max_retries=0)
    )

    async def scenario() -> str:
        with mem.scope(user_id="ana", session_id="async"):
            stream = await aclient.chat.completions.create(model="m", messages=ASK, stream=True)
            assert isinstance(stream, openai.AsyncStream) and type(stream) is not openai.AsyncStream
            async with stream as entered:
                assert entered is stream
                parts = [c.choices[0].delta.content or "" async for c in stream if c.choices]
            assert stream.response.is_closed
            events = await aclient.responses.create(model="m", input=ASK, stream=True)
            assert isinstance(events, openai.AsyncStream)
            await events.close()
        await aclient.close()
        return "".join(parts)

    assert asyncio.run(scenario()) == ANSWER
    assert mem.llm.flush(5)
    stored = mem.messages.list(session_id="async")
    assert [m.content for m in stored if m.role == "assistant"] == [ANSWER]
    assert _capture(mem, "async")["partial"] is True  # the Responses stream closed unread


def test_openai_stream_helpers_read_through_the_proxy(mem: Memory, oai: FakeOpenAIServer) -> None:
    """``chat.completions.stream()`` and ``responses.stream()`` build on ``create(stream=True)``:
    the SDK's helpers read the captured stream as their own, and each call is stored once."""
    client = mem.llm.register(openai.OpenAI(base_url=oai.base_url, api_key="k", max_retries=0))
    with mem.scope(user_id="ana", session_id="helpers"):
        with client.chat.completions.stream(model="m", messages=ASK) as stream:
            assert [e.type for e in stream][-1] == "content.done"
            assert stream.get_final_completion().choices[0].message.content == ANSWER
        with client.responses.stream(model="m", input=ASK) as events:
            assert events.get_final_response().output_text == ANSWER
    assert mem.llm.flush(5)
    stored = mem.messages.list(session_id="helpers")
    assert [m.content for m in stored if m.role == "assistant"] == [ANSWER] * 2
    assert not any("partial" in m.metadata.get("capture", {}) for m in stored)


# -- Anthropic -----------------------------------------------------------------------------


def _anthropic(server: FakeAnthropicServer, cls: Any = None) -> Any:
    return (cls or anthropic.Anthropic)(base_url=server.base_url, api_key="k", max_retries=0)


def test_anthropic_create_injects_into_system_and_captures(
    mem: Memory, ant: FakeAnthropicServer
) -> None:
    client = mem.llm.register(_anthropic(ant))
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Any snack ideas with no peanuts?"}]}
    ]
    before = copy.deepcopy(messages)
    with mem.scope(user_id="ana", session_id="chat"):
        reply = client.messages.create(
            model="claude-test", max_tokens=100, system="Be brief.", messages=messages
        )
    assert reply.content[0].text == ANSWER and messages == before
    sent = ant.message_requests()[-1]
    assert sent["system"].startswith("Be brief.\n\n" + MEMORY_PREAMBLE)
    assert "allergic" in sent["system"] and sent["messages"] == messages
    last = _last(mem)
    assert last.content == ANSWER and last.metadata["capture"]["provider"] == "anthropic"
    assert mem.messages.list(session_id="chat")[-2].content == "Any snack ideas with no peanuts?"


def test_anthropic_system_blocks_and_no_system(mem: Memory, ant: FakeAnthropicServer) -> None:
    client = mem.llm.register(_anthropic(ant))
    with mem.scope(user_id="ana", session_id="chat"):
        client.messages.create(
            model="m",
            max_tokens=10,
            system=[{"type": "text", "text": "Be brief."}],
            messages=ASK,
        )
        blocks = ant.message_requests()[-1]["system"]
        assert blocks[0] == {"type": "text", "text": "Be brief."}
        assert blocks[1]["text"].startswith(MEMORY_PREAMBLE)
        client.messages.create(model="m", max_tokens=10, messages=ASK)
        assert ant.message_requests()[-1]["system"].startswith(MEMORY_PREAMBLE)


def test_anthropic_raw_stream_tool_use_and_early_close(
    mem: Memory, ant: FakeAnthropicServer
) -> None:
    client = mem.llm.register(_anthropic(ant))
    with mem.scope(user_id="ana", session_id="chat"):
        events = list(client.messages.create(model="m", max_tokens=50, messages=ASK, stream=True))
        assert events[-1].type == "message_stop"
        assert _last(mem).content == ANSWER
        ant.chat_script = lambda body: copy.deepcopy(TOOL)
        list(client.messages.create(model="m", max_tokens=50, messages=ASK, stream=True))
        call = _capture(mem)["tool_calls"][0]
        assert call["name"] == "lookup" and json.loads(call["arguments"]) == {"q": "snacks"}
        ant.chat_script = lambda body: ANSWER
        stream = client.messages.create(model="m", max_tokens=50, messages=ASK, stream=True)
        for i, _ in enumerate(stream):
            if i == 3:
                break
        stream.close()
    assert _capture(mem)["partial"] is True


def test_anthropic_stream_helper_sync_and_async(mem: Memory, ant: FakeAnthropicServer) -> None:
    client = mem.llm.register(_anthropic(ant))
    with (
        mem.scope(user_id="ana", session_id="chat"),
        client.messages.stream(model="m", max_tokens=50, messages=ASK) as stream,
    ):
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == ANSWER and final.content[0].text == ANSWER
    assert ant.message_requests()[-1]["system"].startswith(MEMORY_PREAMBLE)
    assert _last(mem).content == ANSWER and "partial" not in _capture(mem)
    with (
        mem.scope(user_id="ana", session_id="chat"),
        client.messages.stream(model="m", max_tokens=50, messages=ASK) as stream,
    ):
        next(iter(stream.text_stream))
    assert _capture(mem)["partial"] is True

    aclient = mem.llm.register(_anthropic(ant, anthropic.AsyncAnthropic))

    async def scenario() -> str:
        with mem.scope(user_id="ana", session_id="async"):
            async with aclient.messages.stream(model="m", max_tokens=50, messages=ASK) as s:
                parts = [t async for t in s.text_stream]
            r = await aclient.messages.create(model="m", max_tokens=50, messages=ASK)
            assert r.content[0].text == ANSWER
            raw = await aclient.messages.create(model="m", max_tokens=50, messages=ASK, stream=True)
            async for _ in raw:
                pass
        await aclient.close()
        return "".join(parts)

    assert asyncio.run(scenario()) == ANSWER
    assert mem.llm.flush(5)
    answers = [m.content for m in mem.messages.list(session_id="async") if m.role == "assistant"]
    assert answers == [ANSWER] * 3


@pytest.fixture(params=["installed", "transport-error-through"])
def sdk_breaks(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """How the SDK reports a stream broken mid-way. anthropic 2.17 raises
    ``APIConnectionError`` from the transport's error (``installed``, what the lock pins);
    earlier releases let the transport's own error (``httpx2.RemoteProtocolError``)
    through, which the second case brings back by reading the body as they did."""
    if request.param == "transport-error-through":
        streaming = anthropic._streaming
        if hasattr(streaming, "iter_response_bytes"):
            monkeypatch.setattr(streaming, "iter_response_bytes", lambda r, c: r.iter_bytes())
            monkeypatch.setattr(
                streaming, "async_iter_response_bytes", lambda r, c: r.aiter_bytes()
            )
    return str(request.param)


async def _read_async(client: Any, way: str) -> None:
    if way == "stream helper":
        async with client.messages.stream(model="m", max_tokens=50, messages=ASK) as s:
            async for _ in s.text_stream:
                pass
    else:
        raw = await client.messages.create(model="m", max_tokens=50, messages=ASK, stream=True)
        async for _ in raw:
            pass


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("way", ["stream helper", "create(stream=True)"])
def test_anthropic_stream_broken_mid_way_keeps_the_partial_answer_and_the_error(
    mem: Memory, ant: FakeAnthropicServer, sdk_breaks: str, way: str, is_async: bool
) -> None:
    # message_start, content_block_start, ping and two text deltas, then the connection drops.
    ant.fail_stream_after(5)
    client = mem.llm.register(_anthropic(ant, anthropic.AsyncAnthropic if is_async else None))
    with (
        mem.scope(user_id="ana", session_id="chat"),
        pytest.raises((anthropic.APIConnectionError, httpx2.RemoteProtocolError)) as caught,
    ):
        if is_async:
            asyncio.run(_read_async(client, way))
        elif way == "stream helper":
            with client.messages.stream(model="m", max_tokens=50, messages=ASK) as stream:
                for _ in stream.text_stream:
                    pass
        else:
            for _ in client.messages.create(model="m", max_tokens=50, messages=ASK, stream=True):
                pass
    wrapped = isinstance(caught.value, anthropic.APIConnectionError)
    assert wrapped == (sdk_breaks == "installed")
    answer = _last(mem)
    assert answer.role == "assistant" and answer.content == "Try roasted"  # what arrived
    capture = answer.metadata["capture"]
    # The error is recorded naming the transport's error, whichever exception the SDK raised;
    # "partial" is for a stream the caller closed early.
    assert type(caught.value).__name__ in capture["error"]
    assert "RemoteProtocolError" in capture["error"] and "partial" not in capture


def test_anthropic_streams_and_stream_helpers_are_the_sdks_types(
    mem: Memory, ant: FakeAnthropicServer
) -> None:
    client = mem.llm.register(_anthropic(ant))
    with mem.scope(user_id="ana", session_id="types"):
        raw = client.messages.create(model="m", max_tokens=50, messages=ASK, stream=True)
        assert isinstance(raw, anthropic.Stream) and type(raw) is not anthropic.Stream
        assert raw.response.status_code == 200
        assert [e.type for e in raw][-1] == "message_stop"
        manager = client.messages.stream(model="m", max_tokens=50, messages=ASK)
        assert isinstance(manager, MessageStreamManager)
        assert type(manager) is not MessageStreamManager
        with manager as stream:
            assert isinstance(stream, MessageStream)
            assert "".join(stream.text_stream) == ANSWER

    aclient = mem.llm.register(_anthropic(ant, anthropic.AsyncAnthropic))

    async def scenario() -> None:
        with mem.scope(user_id="ana", session_id="types"):
            raw = await aclient.messages.create(model="m", max_tokens=50, messages=ASK, stream=True)
            assert isinstance(raw, anthropic.AsyncStream)
            async with raw:
                async for _ in raw:
                    pass
            manager = aclient.messages.stream(model="m", max_tokens=50, messages=ASK)
            assert isinstance(manager, AsyncMessageStreamManager)
            async with manager as stream:
                assert isinstance(stream, AsyncMessageStream)
                assert (await stream.get_final_text()) == ANSWER
        await aclient.close()

    asyncio.run(scenario())
    assert mem.llm.flush(5)
    stored = mem.messages.list(session_id="types")
    assert [m.content for m in stored if m.role == "assistant"] == [ANSWER] * 4
    assert not any("partial" in m.metadata.get("capture", {}) for m in stored)
