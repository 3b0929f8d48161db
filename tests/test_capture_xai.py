"""mem.llm with the real xai_sdk (gRPC) against a loopback fake Chat service: recall injected
into the request that is sent, the exchange captured after, streams, errors, fail-open."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
import xai_sdk
from xai_sdk.chat import system, user

from fakes.xai_server import FakeXAIServer
from stratamem import Memory
from stratamem.capture import MEMORY_PREAMBLE


@pytest.fixture
def server() -> Iterator[FakeXAIServer]:
    with FakeXAIServer() as s:
        s.script = lambda request: "Noted, no peanuts."
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


def _client(server: FakeXAIServer) -> Any:
    return xai_sdk.Client(**server.client_kwargs())


def _stored(mem: Memory, session_id: str) -> list[tuple[str, str]]:
    assert mem.llm.flush(5)
    return [(m.role, m.content) for m in mem.messages.list(session_id=session_id)]


def _capture_of(mem: Memory, session_id: str, content: str) -> dict[str, Any]:
    assert mem.llm.flush(5)
    found = [m for m in mem.messages.list(session_id=session_id) if m.content == content]
    assert found, f"{content!r} was not stored"
    return found[-1].metadata["capture"]


def _wire(messages: Any) -> list[bytes]:
    return [m.SerializeToString() for m in messages]


def _assert_memory_merged(server: FakeXAIServer, question: str, index: int = -1) -> None:
    sent = server.messages(index)
    assert sent[0][0] == "system"
    assert sent[0][1].startswith("You are a helpful cook.\n\n" + MEMORY_PREAMBLE)
    assert "allergic to peanuts" in sent[0][1]
    assert sent[1:] == [("user", question)]


def test_register_is_idempotent_and_reversible(mem: Memory, server: FakeXAIServer) -> None:
    client = _client(server)
    assert mem.llm.register(client) is client
    assert mem.llm.register(client) is client  # twice: a no-op
    assert "create" in vars(client.chat)
    chat = client.chat.create(model="grok-test", messages=[user("Any snack ideas?")])
    sdk_stub = client.chat._stub
    assert chat._stub is not sdk_stub  # this chat's requests pass through stratamem
    mem.llm.unregister(client)
    assert "create" not in vars(client.chat)  # the SDK's own method again
    assert chat._stub is sdk_stub  # and the chat made meanwhile has the SDK's stub back
    with mem.scope(user_id="ana", session_id="chat"):
        chat.sample()
    assert server.messages() == [("user", "Any snack ideas?")]
    with pytest.raises(TypeError, match=r"xai_sdk\.Client"):
        mem.llm.register(object())


def test_sample_injects_memory_into_the_sent_request_and_captures(
    mem: Memory, server: FakeXAIServer
) -> None:
    client = mem.llm.register(_client(server))
    messages = [system("You are a helpful cook."), user("Suggest a snack with peanuts?")]
    before = _wire(messages)
    with mem.scope(user_id="ana", session_id="chat"):
        chat = client.chat.create(model="grok-test", messages=messages)
        history = _wire(chat.messages)
        response = chat.sample()
    assert response.content == "Noted, no peanuts."
    assert _wire(messages) == before  # the caller's message protos are untouched
    assert _wire(chat.messages) == history  # so is the chat's own history
    _assert_memory_merged(server, "Suggest a snack with peanuts?")
    stored = _stored(mem, "chat")
    assert stored[-2:] == [
        ("user", "Suggest a snack with peanuts?"),
        ("assistant", "Noted, no peanuts."),
    ]
    assert all(MEMORY_PREAMBLE not in c for _, c in stored)  # the block is not a user turn
    capture = _capture_of(mem, "chat", "Noted, no peanuts.")
    assert capture["provider"] == "xai" and capture["model"] == "grok-test"
    assert capture["usage"]["total_tokens"] > 0 and capture["latency_ms"] >= 0


def test_memory_is_sent_per_call_not_added_to_the_conversation(
    mem: Memory, server: FakeXAIServer
) -> None:
    client = mem.llm.register(_client(server))
    with mem.scope(user_id="ana", session_id="chat"):
        chat = client.chat.create(
            model="grok-test", messages=[user("Which snacks are safe with peanuts around?")]
        )
        chat.append(chat.sample())
        chat.append(user("And a dessert without peanuts?"))
        chat.sample()
    first, second = server.requests[-2:]
    # One system message in front of the conversation; nothing kept from the first call.
    conversation = [m.SerializeToString() for m in chat.messages]
    assert [m.SerializeToString() for m in second.messages[1:]] == conversation
    for sent in (server.messages(-2), server.messages(-1)):
        assert sent[0][0] == "system" and sent[0][1].startswith(MEMORY_PREAMBLE)
        assert sum(MEMORY_PREAMBLE in text for _, text in sent) == 1
    assert server.messages(-1)[1:] == [
        ("user", "Which snacks are safe with peanuts around?"),
        ("assistant", "Noted, no peanuts."),
        ("user", "And a dessert without peanuts?"),
    ]
    assert len(first.messages) == 2


def test_stream_is_injected_and_captured_when_finished(mem: Memory, server: FakeXAIServer) -> None:
    server.replies.append("Try roasted chickpeas instead.")
    client = mem.llm.register(_client(server))
    with mem.scope(user_id="ana", session_id="chat"):
        chat = client.chat.create(
            model="grok-test",
            messages=[system("You are a helpful cook."), user("Crunchy snack without peanuts?")],
        )
        pieces = [chunk.content for _, chunk in chat.stream()]
    assert "".join(pieces) == "Try roasted chickpeas instead." and len(pieces) > 2
    _assert_memory_merged(server, "Crunchy snack without peanuts?")
    assert _stored(mem, "chat")[-2:] == [
        ("user", "Crunchy snack without peanuts?"),
        ("assistant", "Try roasted chickpeas instead."),
    ]
    capture = _capture_of(mem, "chat", "Try roasted chickpeas instead.")
    assert capture["model"] == "grok-test" and capture["usage"]["total_tokens"] > 0
    assert "partial" not in capture and "error" not in capture


def test_tool_calls_are_captured(mem: Memory, server: FakeXAIServer) -> None:
    call = {"name": "find_recipe", "arguments": {"avoid": "peanuts"}, "id": "call_1"}
    server.replies.extend([{"tool_calls": [call]}, {"tool_calls": [call]}])
    client = mem.llm.register(_client(server))
    with mem.scope(user_id="ana", session_id="tools"):
        chat = client.chat.create(model="grok-test", messages=[user("Find me a recipe")])
        assert chat.sample().tool_calls[0].function.name == "find_recipe"
        assert list(chat.stream())[-1][0].tool_calls[0].id == "call_1"
    assert mem.llm.flush(5)
    answers = [m for m in mem.messages.list(session_id="tools") if m.role == "assistant"]
    assert len(answers) == 2
    for answer in answers:
        assert answer.content == '[tool call] find_recipe({"avoid": "peanuts"})'
        assert answer.metadata["capture"]["tool_calls"] == [
            {"id": "call_1", "name": "find_recipe", "arguments": '{"avoid": "peanuts"}'}
        ]


def test_the_sdk_gets_its_own_stub_and_grpc_stream_types(
    mem: Memory, server: FakeXAIServer
) -> None:
    """The chat's stub is a ``ChatStub`` to ``isinstance`` and its stream RPC hands the SDK a
    ``grpc.Call`` (and ``grpc.Future``), as without stratamem; what the caller reads is the
    SDK's own ``chat.stream()``."""
    client = mem.llm.register(_client(server))
    sdk_stub = client.chat._stub
    with mem.scope(user_id="ana", session_id="chat"):
        chat = client.chat.create(model="grok-test", messages=[user("Any snack ideas?")])
        assert isinstance(chat._stub, type(sdk_stub)) and chat._stub is not sdk_stub
        call = chat._stub.GetCompletionChunk(chat._make_request(1))
        assert isinstance(call, grpc.Call) and isinstance(call, grpc.Future)
        assert type(call) is not call.__class__  # a capturing proxy of the SDK's call
        text = "".join(c.outputs[0].delta.content for c in call if c.outputs)
        assert text == "Noted, no peanuts." and call.code() == grpc.StatusCode.OK
    assert _stored(mem, "chat")[-2:] == [
        ("user", "Any snack ideas?"),
        ("assistant", "Noted, no peanuts."),
    ]

    async def scenario() -> None:
        aclient = mem.llm.register(xai_sdk.AsyncClient(**server.client_kwargs()))
        chat = aclient.chat.create(model="grok-test", messages=[user("Async ideas?")])
        assert isinstance(chat._stub, type(aclient.chat._stub))
        assert chat._stub is not aclient.chat._stub
        await aclient.close()

    asyncio.run(scenario())


def test_a_stream_closed_early_is_captured_as_partial(mem: Memory, server: FakeXAIServer) -> None:
    server.replies.append("First a long preamble and then the actual answer.")
    client = mem.llm.register(_client(server))
    with mem.scope(user_id="ana", session_id="chat"):
        chat = client.chat.create(model="grok-test", messages=[user("Tell me slowly")])
        stream = chat.stream()
        _, chunk = next(stream)
        stream.close()
    assert chunk.content == "First"
    capture = _capture_of(mem, "chat", "First")
    assert capture["partial"] is True and "error" not in capture


def test_a_failing_stream_raises_and_is_captured_with_the_error(
    mem: Memory, server: FakeXAIServer
) -> None:
    server.replies.append("one two three four five")
    server.fail_stream_after(2)
    client = mem.llm.register(_client(server))
    seen: list[str] = []
    with mem.scope(user_id="ana", session_id="chat"), pytest.raises(grpc.RpcError) as caught:
        chat = client.chat.create(model="grok-test", messages=[user("Count for me")])
        for _, chunk in chat.stream():
            seen.append(chunk.content)
    assert caught.value.code() == grpc.StatusCode.INTERNAL  # the SDK's error, unchanged
    assert "".join(seen) == "one two"
    capture = _capture_of(mem, "chat", "one two")
    assert "INTERNAL" in capture["error"] and "stream broke" in capture["error"]
    assert "partial" not in capture
    assert ("user", "Count for me") in _stored(mem, "chat")


def test_a_failed_call_reaches_the_caller_and_is_captured(
    mem: Memory, server: FakeXAIServer
) -> None:
    client = mem.llm.register(_client(server))
    server.fail_next(1)
    with mem.scope(user_id="ana", session_id="chat"), pytest.raises(grpc.RpcError) as caught:
        client.chat.create(model="grok-test", messages=[user("this fails")]).sample()
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    capture = _capture_of(mem, "chat", "this fails")
    assert "INVALID_ARGUMENT" in capture["error"] and capture["model"] == "grok-test"


def test_without_a_user_in_scope_the_call_is_untouched(
    make_memory: Any, server: FakeXAIServer
) -> None:
    mem = make_memory()
    client = mem.llm.register(_client(server))
    chat = client.chat.create(
        model="grok-test", messages=[system("Be brief."), user("hi")], temperature=0.5
    )
    chat.sample()
    list(chat.stream())
    expected = chat._make_request(1)  # exactly what the SDK itself would send
    assert [r.SerializeToString() for r in server.requests] == [expected.SerializeToString()] * 2
    assert mem.llm.flush(5) and mem.messages.list(user_id="anonymous") == []
    assert mem.llm.written == 0


def test_async_client_sample_and_stream(mem: Memory, server: FakeXAIServer) -> None:
    server.script = lambda request: f"ok: {request.messages[-1].content[0].text}"

    async def scenario() -> None:
        client = mem.llm.register(xai_sdk.AsyncClient(**server.client_kwargs()))
        with mem.scope(user_id="ana", session_id="chat"):
            chat = client.chat.create(
                model="grok-test",
                messages=[system("You are a helpful cook."), user("Async snack with peanuts?")],
            )
            assert (await chat.sample()).content == "ok: Async snack with peanuts?"
            _assert_memory_merged(server, "Async snack with peanuts?")
            chat = client.chat.create(
                model="grok-test", messages=[user("Streamed snack, peanuts-free?")]
            )
            text = "".join([chunk.content async for _, chunk in chat.stream()])
            assert text == "ok: Streamed snack, peanuts-free?"
            assert server.messages()[0][1].startswith(MEMORY_PREAMBLE)

        async def other_user() -> str:
            with mem.scope(user_id="cy", session_id="cy-async"):
                chat = client.chat.create(model="grok-test", messages=[user("hello from cy")])
                return (await chat.sample()).content

        assert await asyncio.gather(other_user(), other_user()) == ["ok: hello from cy"] * 2
        await client.close()

    asyncio.run(scenario())
    stored = _stored(mem, "chat")
    assert ("assistant", "ok: Async snack with peanuts?") in stored
    assert ("assistant", "ok: Streamed snack, peanuts-free?") in stored
    assert _stored(mem, "cy-async").count(("user", "hello from cy")) == 2


def test_async_streams_closed_early_or_failing_are_captured(
    mem: Memory, server: FakeXAIServer
) -> None:
    server.replies.extend(["alpha beta gamma delta", "red green blue"])

    async def scenario() -> None:
        client = mem.llm.register(xai_sdk.AsyncClient(**server.client_kwargs()))
        with mem.scope(user_id="ana", session_id="chat"):
            chat = client.chat.create(model="grok-test", messages=[user("Greek letters?")])
            stream = chat.stream()
            _, chunk = await stream.__anext__()
            assert chunk.content == "alpha"
            await stream.aclose()
            server.fail_stream_after(1)
            chat = client.chat.create(model="grok-test", messages=[user("Colours?")])
            with pytest.raises(grpc.RpcError):
                async for _ in chat.stream():
                    pass
        await client.close()

    asyncio.run(scenario())
    closed = _capture_of(mem, "chat", "alpha")
    assert closed["partial"] is True and "error" not in closed
    failed = _capture_of(mem, "chat", "red")
    assert "INTERNAL" in failed["error"]


def test_a_closed_memory_never_breaks_the_call(make_memory: Any, server: FakeXAIServer) -> None:
    mem = make_memory()
    client = _client(server)
    mem.llm.register(client)
    chat = client.chat.create(model="grok-test", messages=[user("hi")])
    mem.close()  # unregisters: the client and its chats are the SDK's again
    with mem.scope(user_id="ana"):
        assert chat.sample().content == "Noted, no peanuts."
        assert client.chat.create(model="m", messages=[user("hi")]).sample().content
    assert [len(r.messages) for r in server.requests] == [1, 1]


def test_history_injection_never_duplicates_turns(make_memory: Any, server: FakeXAIServer) -> None:
    mem = make_memory(capture_inject_history=True)
    s = mem.sessions.create(user_id="ana", session_id="chat")
    s.add_messages(
        [
            {"role": "user", "content": "My cat is called Miso."},
            {"role": "assistant", "content": "What a lovely name!"},
            {"role": "user", "content": "She likes tuna."},
        ],
        sync=True,
    )
    client = mem.llm.register(_client(server))
    messages = [
        system("Be kind."),
        user("She likes tuna."),  # the caller resends one turn
        user("What should I feed my cat?"),
    ]
    with mem.scope(user_id="ana", session_id="chat"):
        client.chat.create(model="grok-test", messages=messages).sample()
    sent = server.messages()
    assert sent[0][0] == "system" and sent[0][1].startswith("Be kind.")
    assert sent[1:] == [
        ("user", "My cat is called Miso."),
        ("assistant", "What a lovely name!"),
        ("user", "She likes tuna."),
        ("user", "What should I feed my cat?"),
    ]
