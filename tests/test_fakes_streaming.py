"""The fake provider servers' streamed answers, tool calls and Responses API, driven through
the real ``openai`` and ``anthropic`` SDKs (sync and async) over loopback HTTP: whatever a
capture layer's tests will rely on must parse in the SDKs exactly as real answers do."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx2
import openai
import pytest

from fakes._http import estimate_tokens
from fakes.anthropic_server import FakeAnthropicServer
from fakes.openai_server import FakeOpenAIServer

REPLY = "The quick brown fox jumps."
# Any: the SDKs' parameters are TypedDicts, which a module-level literal does not infer as.
USER: Any = [{"role": "user", "content": "Tell me something."}]
WEATHER_CALL = {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}
WEATHER_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@pytest.fixture(autouse=True)
def _no_provider_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # A developer's endpoints must not redirect the SDKs away from the fakes.
    for key in ("OPENAI_BASE_URL", "ANTHROPIC_BASE_URL", "ANTHROPIC_AUTH_TOKEN"):
        monkeypatch.delenv(key, raising=False)


@pytest.fixture
def oai() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as fake:
        yield fake


@pytest.fixture
def ant() -> Iterator[FakeAnthropicServer]:
    with FakeAnthropicServer() as fake:
        yield fake


def _openai(server: FakeOpenAIServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="test-key", max_retries=0, timeout=5)


def _async_openai(server: FakeOpenAIServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=server.base_url, api_key="test-key", max_retries=0, timeout=5
    )


def _anthropic(server: FakeAnthropicServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=server.base_url, api_key="test-key", max_retries=0, timeout=5
    )


def _async_anthropic(server: FakeAnthropicServer) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(
        base_url=server.base_url, api_key="test-key", max_retries=0, timeout=5
    )


def _text(message: anthropic.types.Message) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


# -- OpenAI chat completions -------------------------------------------------------------


def test_chat_stream_sends_role_words_finish_usage_and_done(oai: FakeOpenAIServer) -> None:
    oai.chat_replies.append(REPLY)
    with _openai(oai) as client:
        chunks = list(
            client.chat.completions.create(
                model="gpt-test",
                messages=USER,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    contents = [c.choices[0].delta.content or "" for c in chunks[1:-2]]
    assert len(contents) == len(REPLY.split()) and "".join(contents) == REPLY
    finishes = [c.choices[0].finish_reason for c in chunks[:-1]]
    assert finishes[-1] == "stop" and set(finishes[:-1]) == {None}
    # include_usage: a last chunk without choices carries the usage, the others null.
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == estimate_tokens(REPLY)
    assert all(c.usage is None for c in chunks[:-1])
    (sent,) = oai.chat_requests()
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}


def test_chat_stream_without_include_usage_has_no_usage_chunk(oai: FakeOpenAIServer) -> None:
    oai.chat_script = lambda body: REPLY
    with _openai(oai) as client:
        chunks = list(client.chat.completions.create(model="gpt-test", messages=USER, stream=True))
    assert all(c.choices and c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_chat_plain_tool_call(oai: FakeOpenAIServer) -> None:
    oai.chat_replies.append(
        {
            "content": "Checking.",
            "tool_calls": [
                {"name": "get_weather", "arguments": {"city": "Paris"}},
                {"name": "get_time", "arguments": '{"tz": "CET"}', "id": "call_mine"},
            ],
        }
    )
    with _openai(oai) as client:
        completion = client.chat.completions.create(
            model="gpt-test",
            messages=USER,
            tools=[WEATHER_TOOL],
        )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Checking."
    calls = choice.message.tool_calls or []
    assert [(c.type, c.function.name, c.function.arguments) for c in calls] == [
        ("function", "get_weather", '{"city": "Paris"}'),
        ("function", "get_time", '{"tz": "CET"}'),
    ]
    assert calls[0].id.startswith("call_") and calls[1].id == "call_mine"
    assert oai.chat_requests()[0]["tools"] == [WEATHER_TOOL]


def test_chat_plain_text_reply_is_unchanged(oai: FakeOpenAIServer) -> None:
    oai.chat_replies.append(REPLY)
    with _openai(oai) as client:
        completion = client.chat.completions.create(model="gpt-test", messages=USER)
    message = completion.choices[0].message
    assert message.content == REPLY and message.tool_calls is None
    assert completion.choices[0].finish_reason == "stop"


def test_chat_stream_tool_call_arrives_in_pieces(oai: FakeOpenAIServer) -> None:
    arguments = json.dumps({"city": "Paris", "unit": "celsius", "days": 3})
    oai.chat_replies.append({"tool_calls": [{"name": "get_weather", "arguments": arguments}]})
    with _openai(oai) as client:
        chunks = list(client.chat.completions.create(model="gpt-test", messages=USER, stream=True))
    first = chunks[0].choices[0].delta
    # Without text the role rides on the tool call's head, which names the function.
    assert first.role == "assistant" and first.content is None
    (head,) = first.tool_calls or []
    assert head.index == 0 and head.id and head.type == "function"
    assert head.function is not None and head.function.name == "get_weather"
    pieces = [
        call.function.arguments or ""
        for chunk in chunks[1:]
        for call in chunk.choices[0].delta.tool_calls or []
        if call.function is not None
    ]
    assert len(pieces) > 2 and "".join(pieces) == arguments
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_chat_stream_helper_accumulates_text_and_tool_calls(oai: FakeOpenAIServer) -> None:
    oai.chat_replies.append({"content": "Let me check.", **WEATHER_CALL})
    with (
        _openai(oai) as client,
        client.chat.completions.stream(model="gpt-test", messages=USER) as stream,
    ):
        completion = stream.get_final_completion()
    message = completion.choices[0].message
    assert message.content == "Let me check."
    (call,) = message.tool_calls or []
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert completion.choices[0].finish_reason == "tool_calls"


def test_async_chat_stream(oai: FakeOpenAIServer) -> None:
    oai.chat_replies.extend([REPLY, WEATHER_CALL])

    async def scenario() -> tuple[str, str]:
        async with _async_openai(oai) as client:
            stream = await client.chat.completions.create(
                model="gpt-test",
                messages=USER,
                stream=True,
            )
            text = "".join([c.choices[0].delta.content or "" async for c in stream])
            stream = await client.chat.completions.create(
                model="gpt-test",
                messages=USER,
                stream=True,
            )
            arguments = ""
            async for chunk in stream:
                for call in chunk.choices[0].delta.tool_calls or []:
                    if call.function is not None:
                        arguments += call.function.arguments or ""
            return text, arguments

    assert asyncio.run(scenario()) == (REPLY, '{"city": "Paris"}')


def test_chat_stream_broken_mid_way_raises_connection_error(oai: FakeOpenAIServer) -> None:
    oai.chat_script = lambda body: REPLY
    oai.fail_stream_after(3)
    received: list[str] = []
    with _openai(oai) as client:
        # A plain answer does not consume the injected stream failure.
        client.chat.completions.create(model="gpt-test", messages=USER)
        stream = client.chat.completions.create(model="gpt-test", messages=USER, stream=True)
        with pytest.raises(openai.APIConnectionError) as caught:
            for chunk in stream:
                received.append(chunk.choices[0].delta.content or "")
        assert isinstance(caught.value.__cause__, httpx2.RemoteProtocolError)
        assert len(received) == 3 and "".join(received) == "The quick"
        # One-shot: the next stream is whole again.
        again = client.chat.completions.create(model="gpt-test", messages=USER, stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in again) == REPLY


def test_async_chat_stream_broken_mid_way(oai: FakeOpenAIServer) -> None:
    oai.fail_stream_after(1)

    async def scenario() -> None:
        async with _async_openai(oai) as client:
            stream = await client.chat.completions.create(
                model="gpt-test",
                messages=USER,
                stream=True,
            )
            with pytest.raises(openai.APIConnectionError):
                async for _ in stream:
                    pass

    asyncio.run(scenario())


def test_chunk_delay_spaces_chunks_out(oai: FakeOpenAIServer) -> None:
    oai.chat_replies.append("a b c")
    oai.chunk_delay = 0.04
    arrivals: list[float] = []
    with _openai(oai) as client:
        started = time.monotonic()
        for _ in client.chat.completions.create(model="gpt-test", messages=USER, stream=True):
            arrivals.append(time.monotonic())
    # role, three words, finish: five chunks (then [DONE]), each 40 ms after the last. The
    # gaps a client sees shrink when a loaded machine delivers two chunks together; the
    # last chunk still cannot arrive before the four delays have passed.
    assert len(arrivals) == 5
    assert arrivals[-1] - started >= 4 * 0.04


def test_close_does_not_wait_for_a_slow_stream() -> None:
    server = FakeOpenAIServer().start()
    server.chunk_delay = 10.0
    server.chat_replies.append(REPLY)
    client = _openai(server)
    stream = client.chat.completions.create(model="gpt-test", messages=USER, stream=True)
    next(iter(stream))
    started = time.monotonic()
    server.close()
    assert time.monotonic() - started < 2
    stream.close()
    client.close()


def test_bad_scripted_tool_call_answers_an_error_naming_it(
    oai: FakeOpenAIServer, ant: FakeAnthropicServer
) -> None:
    oai.chat_replies.append({"tool_calls": [{"name": "x"}]})
    with _openai(oai) as client, pytest.raises(openai.InternalServerError, match="arguments"):
        client.chat.completions.create(model="gpt-test", messages=USER)
    ant.chat_replies.append({"tool_calls": [{"name": "x", "arguments": "[1]"}]})
    with _anthropic(ant) as client, pytest.raises(anthropic.InternalServerError, match="object"):
        client.messages.create(model="claude-test", max_tokens=50, messages=USER)


# -- OpenAI Responses API ----------------------------------------------------------------


def test_responses_plain(oai: FakeOpenAIServer) -> None:
    oai.chat_replies.append(REPLY)
    with _openai(oai) as client:
        response = client.responses.create(
            model="gpt-test", input="Tell me something.", instructions="Be brief."
        )
    assert response.object == "response" and response.status == "completed"
    assert response.id.startswith("resp_") and response.model == "gpt-test"
    assert response.output_text == REPLY
    (message,) = response.output
    assert message.type == "message" and message.role == "assistant"
    assert response.usage is not None
    assert response.usage.input_tokens == estimate_tokens("Be brief.") + estimate_tokens(
        "Tell me something."
    )
    assert response.usage.output_tokens == estimate_tokens(REPLY)
    assert response.usage.total_tokens == response.usage.input_tokens + estimate_tokens(REPLY)
    assert oai.responses_requests() == [
        {"model": "gpt-test", "input": "Tell me something.", "instructions": "Be brief."}
    ]
    assert oai.chat_requests() == []


def test_responses_script_sees_input_items(oai: FakeOpenAIServer) -> None:
    oai.chat_script = lambda body: f"{len(body['input'])} items"
    with _openai(oai) as client:
        response = client.responses.create(
            model="gpt-test",
            input=[
                {"role": "user", "content": "one"},
                {"role": "user", "content": [{"type": "input_text", "text": "two"}]},
            ],
        )
    assert response.output_text == "2 items"


def test_responses_create_stream_sends_typed_events(oai: FakeOpenAIServer) -> None:
    oai.chat_replies.append(REPLY)
    with _openai(oai) as client:
        events = list(client.responses.create(model="gpt-test", input="hi", stream=True))
    words = len(REPLY.split())
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * words,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == REPLY
    created, completed = events[0], events[-1]
    assert created.type == "response.created" and created.response.status == "in_progress"
    assert completed.type == "response.completed"
    assert completed.response.output_text == REPLY
    assert completed.response.id == created.response.id
    assert oai.responses_requests()[0]["stream"] is True


def test_responses_stream_helper_sync_and_async(oai: FakeOpenAIServer) -> None:
    oai.chat_script = lambda body: REPLY
    with _openai(oai) as client, client.responses.stream(model="gpt-test", input="hi") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == REPLY and final.output_text == REPLY

    async def scenario() -> str:
        async with (
            _async_openai(oai) as client,
            client.responses.stream(model="gpt-test", input="hi") as stream,
        ):
            return (await stream.get_final_response()).output_text

    assert asyncio.run(scenario()) == REPLY
    assert len(oai.responses_requests()) == 2


def test_responses_tool_call_plain_and_streamed(oai: FakeOpenAIServer) -> None:
    arguments = json.dumps({"city": "Paris", "unit": "celsius"})
    call = {"tool_calls": [{"name": "get_weather", "arguments": arguments, "id": "call_1"}]}
    oai.chat_replies.extend([call, call])
    with _openai(oai) as client:
        plain = client.responses.create(model="gpt-test", input="hi")
        with client.responses.stream(model="gpt-test", input="hi") as stream:
            pieces = [e.delta for e in stream if e.type == "response.function_call_arguments.delta"]
            streamed = stream.get_final_response()
    for response in (plain, streamed):
        (item,) = response.output
        assert item.type == "function_call"
        assert (item.name, item.arguments, item.call_id) == ("get_weather", arguments, "call_1")
        assert response.output_text == ""
    assert len(pieces) > 1 and "".join(pieces) == arguments


def test_responses_stream_broken_mid_way(oai: FakeOpenAIServer) -> None:
    oai.fail_stream_after(5)
    with _openai(oai) as client:
        events = client.responses.create(model="gpt-test", input="hi", stream=True)
        types: list[str] = []
        with pytest.raises(openai.APIConnectionError):
            for event in events:
                types.append(event.type)
    assert len(types) == 5 and "response.completed" not in types


# -- Anthropic Messages ------------------------------------------------------------------


def test_anthropic_create_stream_sends_typed_events(ant: FakeAnthropicServer) -> None:
    ant.chat_replies.append(REPLY)
    with _anthropic(ant) as client:
        events = list(
            client.messages.create(
                model="claude-test",
                max_tokens=50,
                messages=USER,
                stream=True,
            )
        )
    words = len(REPLY.split())
    assert [e.type for e in events] == [  # the SDK drops the ping
        "message_start",
        "content_block_start",
        *["content_block_delta"] * words,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start, delta = events[0], events[-2]
    assert start.type == "message_start" and start.message.content == []
    assert start.message.usage.input_tokens == estimate_tokens(USER[0]["content"])
    text = "".join(
        e.delta.text
        for e in events
        if e.type == "content_block_delta" and e.delta.type == "text_delta"
    )
    assert text == REPLY
    assert delta.type == "message_delta" and delta.delta.stop_reason == "end_turn"
    assert delta.usage.output_tokens == estimate_tokens(REPLY)
    (sent,) = ant.message_requests()
    assert sent["stream"] is True and sent["max_tokens"] == 50


def test_anthropic_stream_helper_text_stream_and_final_message(ant: FakeAnthropicServer) -> None:
    ant.chat_replies.append(REPLY)
    with (
        _anthropic(ant) as client,
        client.messages.stream(
            model="claude-test",
            max_tokens=50,
            system="Be brief.",
            messages=USER,
        ) as stream,
    ):
        pieces = list(stream.text_stream)
        message = stream.get_final_message()
    assert len(pieces) == len(REPLY.split()) and "".join(pieces) == REPLY
    assert message.content[0].type == "text" and message.content[0].text == REPLY
    assert message.stop_reason == "end_turn"
    assert message.usage.output_tokens == estimate_tokens(REPLY)
    assert ant.message_requests()[0]["system"] == "Be brief."


def test_anthropic_async_stream_helper_and_create_stream(ant: FakeAnthropicServer) -> None:
    ant.chat_script = lambda body: REPLY

    async def scenario() -> tuple[str, str, str]:
        async with (
            _async_anthropic(ant) as client,
            client.messages.stream(
                model="claude-test",
                max_tokens=50,
                messages=USER,
            ) as stream,
        ):
            pieces = [piece async for piece in stream.text_stream]
            message = await stream.get_final_message()
            raw = await client.messages.create(
                model="claude-test",
                max_tokens=50,
                messages=USER,
                stream=True,
            )
            created = "".join(
                [
                    e.delta.text
                    async for e in raw
                    if e.type == "content_block_delta" and e.delta.type == "text_delta"
                ]
            )
            return "".join(pieces), _text(message), created

    assert asyncio.run(scenario()) == (REPLY, REPLY, REPLY)


def test_anthropic_tool_use_plain_and_streamed(ant: FakeAnthropicServer) -> None:
    arguments = json.dumps({"city": "Paris", "days": [1, 2]})
    call = {"content": "Checking.", "tool_calls": [{"name": "get_weather", "arguments": arguments}]}
    ant.chat_replies.extend([call, call, call])
    with _anthropic(ant) as client:
        kwargs: dict[str, Any] = {"model": "claude-test", "max_tokens": 50, "messages": USER}
        plain = client.messages.create(**kwargs)
        with client.messages.stream(**kwargs) as stream:
            streamed = stream.get_final_message()
        raw = list(client.messages.create(**kwargs, stream=True))
    for message in (plain, streamed):
        assert message.stop_reason == "tool_use"
        text, tool = message.content
        assert text.type == "text" and text.text == "Checking."
        assert tool.type == "tool_use" and tool.name == "get_weather"
        assert tool.input == {"city": "Paris", "days": [1, 2]} and tool.id.startswith("toolu_")
    starts = [e for e in raw if e.type == "content_block_start"]
    assert [e.content_block.type for e in starts] == ["text", "tool_use"]
    partial = [
        e.delta.partial_json
        for e in raw
        if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    ]
    assert len(partial) > 2 and "".join(partial) == arguments


def test_anthropic_stream_broken_mid_way(ant: FakeAnthropicServer) -> None:
    ant.chat_script = lambda body: REPLY
    ant.fail_stream_after(4)  # message_start, content_block_start, ping, one delta
    with _anthropic(ant) as client:
        # The SDK raises APIConnectionError from the transport's error (since anthropic 2.17;
        # earlier releases let the transport's error itself through).
        with (
            pytest.raises((anthropic.APIConnectionError, httpx2.RemoteProtocolError)) as caught,
            client.messages.stream(
                model="claude-test",
                max_tokens=50,
                messages=USER,
            ) as stream,
        ):
            pieces: list[str] = []
            for piece in stream.text_stream:
                pieces.append(piece)
        assert pieces == ["The"]
        transport = caught.value
        if isinstance(transport, anthropic.APIConnectionError):
            transport = transport.__cause__
        assert isinstance(transport, httpx2.RemoteProtocolError)
        again = client.messages.create(model="claude-test", max_tokens=50, messages=USER)
        assert _text(again) == REPLY


def test_anthropic_chunk_delay(ant: FakeAnthropicServer) -> None:
    ant.chat_replies.append("a b")
    ant.chunk_delay = 0.03
    started = time.monotonic()
    with (
        _anthropic(ant) as client,
        client.messages.stream(
            model="claude-test",
            max_tokens=50,
            messages=USER,
        ) as stream,
    ):
        assert stream.get_final_text() == "a b"
    # Eight events (start, block start, ping, two deltas, block stop, delta, stop): 7 gaps.
    assert time.monotonic() - started >= 7 * 0.03
