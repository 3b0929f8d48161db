"""mem.llm.register(bedrock=client) with the real boto3 against a loopback fake Bedrock runtime
(endpoint_url, dummy credentials): converse, converse_stream, invoke_model (Anthropic's body)
and invoke_model_with_response_stream — injection in the request the server received, the
exchange captured once, streams and bodies handed to the caller intact, fail-open."""

from __future__ import annotations

import copy
import functools
import json
import logging
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.eventstream import EventStream
from botocore.exceptions import ClientError
from botocore.response import StreamingBody

from fakes.bedrock_server import FakeBedrockServer
from stratamem import Memory
from stratamem.capture import MEMORY_PREAMBLE

ANSWER = "Try roasted chickpeas instead of peanuts."
MODEL = "anthropic.claude-3-haiku-20240307-v1:0"
ASK = "Any snack ideas? I am allergic to peanuts, remember."
TOOL = {"tool_calls": [{"id": "tu_1", "name": "lookup", "arguments": {"q": "snacks"}}]}


@pytest.fixture
def server() -> Iterator[FakeBedrockServer]:
    with FakeBedrockServer() as s:
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


def bedrock_client(server: FakeBedrockServer) -> Any:
    return boto3.client(
        "bedrock-runtime",
        endpoint_url=server.base_url,
        region_name="us-east-1",
        aws_access_key_id="test-key",
        aws_secret_access_key="test-secret",
        config=Config(retries={"max_attempts": 1}),
    )


def _stored(mem: Memory, session: str = "chat") -> list[tuple[str, str]]:
    assert mem.llm.flush(5)
    return [(m.role, m.content) for m in mem.messages.list(session_id=session)]


def _capture(mem: Memory, session: str = "chat") -> dict[str, Any]:
    assert mem.llm.flush(5)
    return mem.messages.list(session_id=session)[-1].metadata["capture"]


def _converse_messages() -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"text": ASK}]}]


def _anthropic_body(**extra: Any) -> dict[str, Any]:
    return {
        "anthropic_version": "bedrock-2023-05-31",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": ASK}],
        **extra,
    }


def test_register_by_name_only(mem: Memory, server: FakeBedrockServer) -> None:
    client = bedrock_client(server)
    with pytest.raises(TypeError, match=r"register\(bedrock=\.\.\.\)"):
        mem.llm.register(client)
    control = boto3.client(
        "bedrock", region_name="us-east-1", aws_access_key_id="k", aws_secret_access_key="s"
    )
    with pytest.raises(TypeError, match="bedrock-runtime"):
        mem.llm.register(bedrock=control)
    with pytest.raises(TypeError, match="unknown name 'boto'"):
        mem.llm.register(boto=client)
    assert mem.llm.register(bedrock=client) is client
    assert mem.llm.register(bedrock=client) is client  # idempotent
    assert "converse" in vars(client)
    mem.llm.unregister(client)
    assert "converse" not in vars(client)
    client.converse(modelId=MODEL, messages=_converse_messages())
    with mem.scope(user_id="ana", session_id="chat"):
        client.converse(modelId=MODEL, messages=_converse_messages())
    assert ("user", ASK) not in _stored(mem)  # unregistered: nothing captured
    assert "system" not in server.model_requests()[-1][2]


def test_converse_injects_into_system_and_captures_once(
    mem: Memory, server: FakeBedrockServer
) -> None:
    client = mem.llm.register(bedrock=bedrock_client(server))
    messages = _converse_messages()
    system = [{"text": "You are a helpful cook."}]
    before = copy.deepcopy((messages, system))
    with mem.scope(user_id="ana", session_id="chat"):
        reply = client.converse(modelId=MODEL, messages=messages, system=system)
    assert reply["output"]["message"]["content"] == [{"text": ANSWER}]
    assert (messages, system) == before  # the caller's lists and dicts are untouched
    op, model, body = server.model_requests()[-1]
    assert (op, model) == ("converse", MODEL)
    assert body["system"][0] == {"text": "You are a helpful cook."}
    assert body["system"][1]["text"].startswith(MEMORY_PREAMBLE)
    assert "allergic to peanuts" in body["system"][1]["text"]
    assert body["messages"] == messages
    stored = _stored(mem)
    assert stored[-2:] == [("user", ASK), ("assistant", ANSWER)]
    assert stored.count(("user", ASK)) == 1
    capture = _capture(mem)
    assert capture["provider"] == "bedrock" and capture["model"] == MODEL
    assert capture["usage"]["totalTokens"] > 0


def _tool_loop(mem: Memory, server: FakeBedrockServer) -> list[dict[str, Any]]:
    """A question, the model's tool call, the tool's result and the model's answer; the
    messages of the second request."""
    client = mem.llm.register(bedrock=bedrock_client(server))
    server.chat_replies.extend([TOOL, "It is safe."])
    messages = _converse_messages()
    with mem.scope(user_id="ana", session_id="chat"):
        first = client.converse(modelId=MODEL, messages=messages)
        use = first["output"]["message"]["content"][0]["toolUse"]
        result = {"toolResult": {"toolUseId": use["toolUseId"], "content": [{"text": "ok"}]}}
        follow = [*messages, first["output"]["message"], {"role": "user", "content": [result]}]
        client.converse(modelId=MODEL, messages=follow)
    return follow


def test_converse_tool_loop_stores_the_question_once(
    mem: Memory, server: FakeBedrockServer
) -> None:
    _tool_loop(mem, server)
    stored = _stored(mem)
    assert stored[-3:] == [
        ("user", ASK),
        ("assistant", '[tool call] lookup({"q": "snacks"})'),
        ("assistant", "It is safe."),
    ]
    # The tool-result request still recalled for the question it continues.
    assert MEMORY_PREAMBLE in server.model_requests()[-1][2]["system"][0]["text"]


def test_by_default_a_tool_loop_carries_the_block_in_the_questions_turn(
    make_memory: Any, server: FakeBedrockServer
) -> None:
    """The request with tool results recalls for the question it continues: the block goes
    where it went in the first request, so that request's prefix is sent again as it was."""
    mem = make_memory(capture_injection="user")
    mem.sessions.create(user_id="ana", session_id="chat").add_messages(
        [{"role": "user", "content": "I am allergic to peanuts."}], sync=True
    )
    follow = _tool_loop(mem, server)
    one, two = (body for _, _, body in server.model_requests()[-2:])
    assert "system" not in one and "system" not in two
    asked, block = two["messages"][0]["content"]
    assert asked == {"text": ASK} and block["text"].startswith(MEMORY_PREAMBLE)
    assert two["messages"][1:] == follow[1:]  # the tool turns as the caller sent them


def test_converse_stream_passes_events_and_captures_at_the_end(
    mem: Memory, server: FakeBedrockServer
) -> None:
    client = mem.llm.register(bedrock=bedrock_client(server))
    server.chat_replies.append({**TOOL, "content": ANSWER})
    with mem.scope(user_id="ana", session_id="chat"):
        response = client.converse_stream(modelId=MODEL, messages=_converse_messages())
        assert mem.llm.flush(5) and ("user", ASK) not in _stored(mem)  # not before the end
        events = list(response["stream"])
    plain = bedrock_client(server)
    server.chat_replies.append({**TOOL, "content": ANSWER})
    expected = list(plain.converse_stream(modelId=MODEL, messages=_converse_messages())["stream"])
    # Every event as botocore parsed it (usage differs: the request had memory in it).
    assert [e for e in events if "metadata" not in e] == [
        e for e in expected if "metadata" not in e
    ]
    assert MEMORY_PREAMBLE in server.model_requests()[-2][2]["system"][0]["text"]
    assert _stored(mem)[-2:] == [("user", ASK), ("assistant", ANSWER)]
    capture = _capture(mem)
    assert capture["tool_calls"] == [
        {"id": "tu_1", "name": "lookup", "arguments": '{"q": "snacks"}'}
    ]
    assert capture["usage"]["outputTokens"] > 0 and "partial" not in capture


def test_converse_stream_closed_early_is_captured_partial(
    mem: Memory, server: FakeBedrockServer
) -> None:
    client = mem.llm.register(bedrock=bedrock_client(server))
    with mem.scope(user_id="ana", session_id="chat"):
        stream = client.converse_stream(modelId=MODEL, messages=_converse_messages())["stream"]
        it = iter(stream)
        next(it), next(it)  # messageStart, the first word
        stream.close()
    assert _stored(mem)[-1] == ("assistant", ANSWER.split()[0])
    assert _capture(mem)["partial"] is True


def test_streams_left_at_their_stop_event_are_captured_whole(
    mem: Memory, server: FakeBedrockServer
) -> None:
    """messageStop (message_stop in an Anthropic body stream) ends the answer; only the
    usage may follow it."""
    client = mem.llm.register(bedrock=bedrock_client(server))
    with mem.scope(user_id="ana", session_id="chat"):
        stream = client.converse_stream(modelId=MODEL, messages=_converse_messages())["stream"]
        for event in stream:
            if "messageStop" in event:
                break
        stream.close()
    assert _stored(mem)[-1] == ("assistant", ANSWER)
    assert "partial" not in _capture(mem)
    with mem.scope(user_id="ana", session_id="chat"):
        body = client.invoke_model_with_response_stream(
            modelId=MODEL, body=json.dumps(_anthropic_body())
        )["body"]
        for event in body:
            if json.loads(event["chunk"]["bytes"])["type"] == "message_stop":
                break
        body.close()
    assert _stored(mem)[-1] == ("assistant", ANSWER)
    assert "partial" not in _capture(mem)


def test_converse_stream_broken_midway_is_captured_with_the_error(
    mem: Memory, server: FakeBedrockServer
) -> None:
    client = mem.llm.register(bedrock=bedrock_client(server))
    server.fail_stream_after(3)
    with mem.scope(user_id="ana", session_id="chat"):
        stream = client.converse_stream(modelId=MODEL, messages=_converse_messages())["stream"]
        with pytest.raises(Exception):  # noqa: B017 - botocore's own error, as without stratamem
            list(stream)
    capture = _capture(mem)
    assert capture["error"]


def test_invoke_model_body_is_still_readable(mem: Memory, server: FakeBedrockServer) -> None:
    client = mem.llm.register(bedrock=bedrock_client(server))
    body = _anthropic_body(system="Be brief.")
    raw = json.dumps(body)
    with mem.scope(user_id="ana", session_id="chat"):
        response = client.invoke_model(modelId=MODEL, body=raw, contentType="application/json")
    answer = json.loads(response["body"].read())  # the caller reads the body as always
    assert answer["content"] == [{"type": "text", "text": ANSWER}]
    assert response["body"].read() == b""  # and it is a stream, read once
    assert response["contentType"] == "application/json"
    sent = server.model_requests()[-1][2]
    assert sent["system"].startswith("Be brief.\n\n" + MEMORY_PREAMBLE)
    assert "allergic to peanuts" in sent["system"]
    assert sent["messages"] == body["messages"] and json.loads(raw) == body
    assert _stored(mem)[-2:] == [("user", ASK), ("assistant", ANSWER)]
    capture = _capture(mem)
    assert capture["model"] == MODEL and capture["usage"]["output_tokens"] > 0


def test_invoke_model_with_response_stream(mem: Memory, server: FakeBedrockServer) -> None:
    client = mem.llm.register(bedrock=bedrock_client(server))
    server.chat_replies.append({**TOOL, "content": ANSWER})
    with mem.scope(user_id="ana", session_id="chat"):
        response = client.invoke_model_with_response_stream(
            modelId=MODEL, body=json.dumps(_anthropic_body())
        )
        events = [json.loads(e["chunk"]["bytes"]) for e in response["body"]]
    text = "".join(
        e["delta"]["text"]
        for e in events
        if e["type"] == "content_block_delta" and "text" in e["delta"]
    )
    assert text == ANSWER
    assert server.model_requests()[-1][2]["system"].startswith(MEMORY_PREAMBLE)
    assert _stored(mem)[-2:] == [("user", ASK), ("assistant", ANSWER)]
    capture = _capture(mem)
    assert capture["tool_calls"] == [
        {"id": "tu_1", "name": "lookup", "arguments": '{"q": "snacks"}'}
    ]
    assert capture["usage"]["input_tokens"] > 0 and capture["usage"]["output_tokens"] > 0


def test_streams_and_bodies_are_botocores_types(mem: Memory, server: FakeBedrockServer) -> None:
    client = mem.llm.register(bedrock=bedrock_client(server))
    with mem.scope(user_id="ana", session_id="chat"):
        stream = client.converse_stream(modelId=MODEL, messages=_converse_messages())["stream"]
        assert isinstance(stream, EventStream) and type(stream) is not EventStream
        assert "metadata" in list(stream)[-1]
        body = client.invoke_model(modelId=MODEL, body=json.dumps(_anthropic_body()))["body"]
        assert isinstance(body, StreamingBody)
        assert json.loads(body.read())["content"][0]["text"] == ANSWER
        response = client.invoke_model_with_response_stream(
            modelId=MODEL, body=json.dumps(_anthropic_body())
        )
        assert isinstance(response["body"], EventStream)
        assert [e for e in response["body"] if "chunk" in e]
    assert [c for role, c in _stored(mem) if role == "assistant"][-3:] == [ANSWER] * 3


def test_other_model_bodies_go_out_untouched(mem: Memory, server: FakeBedrockServer) -> None:
    client = mem.llm.register(bedrock=bedrock_client(server))
    llama = json.dumps({"prompt": ASK, "max_gen_len": 50})
    with (
        mem.scope(user_id="ana", session_id="chat"),
        pytest.raises(ClientError, match="Anthropic message bodies only"),
    ):
        client.invoke_model(modelId="meta.llama3-8b-instruct-v1:0", body=llama)
    assert server.model_requests()[-1][2] == json.loads(llama)
    assert ("user", ASK) not in _stored(mem)


def test_provider_errors_reach_the_caller_and_are_recorded(
    mem: Memory, server: FakeBedrockServer
) -> None:
    client = mem.llm.register(bedrock=bedrock_client(server))
    server.fail_next(1, status=400)
    with (
        mem.scope(user_id="ana", session_id="chat"),
        pytest.raises(ClientError, match="ValidationException"),
    ):
        client.converse(modelId=MODEL, messages=_converse_messages())
    assert _stored(mem)[-1] == ("user", ASK)
    assert "ValidationException" in _capture(mem)["error"]


def test_memory_failures_never_reach_the_call(
    mem: Memory, server: FakeBedrockServer, caplog: pytest.LogCaptureFixture
) -> None:
    client = mem.llm.register(bedrock=bedrock_client(server))

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("memory backend down")

    mem.get_memory = broken  # type: ignore[method-assign]
    mem.add_messages = broken  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR, "stratamem.capture"), mem.scope(user_id="ana"):
        reply = client.converse(modelId=MODEL, messages=_converse_messages())
        streamed = list(
            client.converse_stream(modelId=MODEL, messages=_converse_messages())["stream"]
        )
        body = client.invoke_model(modelId=MODEL, body=json.dumps(_anthropic_body()))["body"]
        assert json.loads(body.read())["content"][0]["text"] == ANSWER
        assert mem.llm.flush(5)
    assert reply["output"]["message"]["content"] == [{"text": ANSWER}]
    assert any("contentBlockDelta" in e for e in streamed)
    assert "system" not in server.model_requests()[-1][2]  # sent as the caller made it
    assert "memory backend down" in caplog.text
