"""Tests of stratamem.llm: the OpenAI and Anthropic adapters driven through the real SDKs
against fake servers on localhost, ``complete_json``'s parse-validate-repair loop, and
``make_chat_model``. Nothing of ours is mocked."""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pydantic
import pytest

from fakes._http import estimate_tokens
from fakes.anthropic_server import FakeAnthropicServer
from fakes.openai_server import FakeOpenAIServer
from stratamem.errors import ConfigError
from stratamem.llm import (
    CallLog,
    LLMError,
    LLMOutputError,
    LLMUnavailableError,
    complete_json,
    make_chat_model,
    parse_json_object,
)
from stratamem.llm.anthropic import AnthropicChatModel
from stratamem.llm.openai import OpenAIChatModel

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"facts": {"type": "array", "items": {"type": "string"}}},
    "required": ["facts"],
}
SCHEMA_HINT = "Answer with a single JSON object that follows this JSON schema:\n" + json.dumps(
    SCHEMA
)
HTML_PAGE = b"<html><body><h1>Sign in to the proxy</h1></body></html>"


@pytest.fixture(autouse=True)
def _no_provider_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # A developer's keys or endpoints must neither leak into requests nor hide errors.
    for key in (
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_AUTH_TOKEN",
        "ANTHROPIC_BASE_URL",
    ):
        monkeypatch.delenv(key, raising=False)


@pytest.fixture
def oai() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as fake:
        yield fake


@pytest.fixture
def ant() -> Iterator[FakeAnthropicServer]:
    with FakeAnthropicServer() as fake:
        yield fake


def openai_model(server: FakeOpenAIServer, **kwargs: Any) -> OpenAIChatModel:
    kwargs.setdefault("api_key", "test-key")
    kwargs.setdefault("timeout", 5.0)
    kwargs.setdefault("max_retries", 2)
    return OpenAIChatModel("gpt-test", base_url=server.base_url, **kwargs)


def anthropic_model(server: FakeAnthropicServer, **kwargs: Any) -> AnthropicChatModel:
    kwargs.setdefault("api_key", "test-key")
    kwargs.setdefault("timeout", 5.0)
    kwargs.setdefault("max_retries", 2)
    return AnthropicChatModel("claude-test", base_url=server.base_url, **kwargs)


def _sent_key(headers: dict[str, str]) -> str:
    """The API key a request carried: ``x-api-key``, or a bearer token (SDK 2.x sends
    ``Authorization: Bearer``)."""
    if "x-api-key" in headers:
        return headers["x-api-key"]
    return headers.get("authorization", "").removeprefix("Bearer ")


class Facts(pydantic.BaseModel):
    facts: list[str] = pydantic.Field(min_length=1)


# -- OpenAI-compatible adapter ----------------------------------------------------------


def test_openai_sends_json_schema_and_returns_text_and_usage(oai: FakeOpenAIServer) -> None:
    reply = '{"facts": ["Ada lives in Lyon"]}'
    oai.chat_replies.append(reply)
    model = openai_model(oai)
    result = model.complete("You extract facts.", "I moved to Lyon.", schema=SCHEMA, max_tokens=321)

    (body,) = oai.chat_requests()
    assert body["model"] == "gpt-test"
    assert body["messages"] == [
        {"role": "system", "content": "You extract facts."},
        {"role": "user", "content": "I moved to Lyon."},
    ]
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "stratamem_output", "schema": SCHEMA, "strict": False},
    }
    assert body["max_tokens"] == 321
    assert body["temperature"] == 0
    assert oai.request_headers[0]["authorization"] == "Bearer test-key"

    assert result.text == reply
    assert result.model == "gpt-test"
    assert result.prompt_tokens == estimate_tokens("You extract facts.") + estimate_tokens(
        "I moved to Lyon."
    )
    assert result.completion_tokens == estimate_tokens(reply)
    assert result.latency_ms > 0
    assert model.id == "openai:gpt-test"
    assert oai.base_url in model.name


def test_openai_without_schema_sends_no_response_format(oai: FakeOpenAIServer) -> None:
    oai.chat_script = lambda body: "plain answer"
    result = openai_model(oai).complete("sys", "user", schema=None, max_tokens=10)
    (body,) = oai.chat_requests()
    assert "response_format" not in body
    assert body["messages"][0] == {"role": "system", "content": "sys"}
    assert result.text == "plain answer"


def test_openai_falls_back_to_json_object_and_remembers(oai: FakeOpenAIServer) -> None:
    oai.reject_response_format({"json_schema"})
    oai.chat_replies.extend(['{"facts": ["a"]}', '{"facts": ["b"]}'])
    model = openai_model(oai)

    first = model.complete("sys", "one", schema=SCHEMA, max_tokens=50)
    assert first.text == '{"facts": ["a"]}'
    rejected, accepted = oai.chat_requests()
    assert rejected["response_format"]["type"] == "json_schema"
    assert accepted["response_format"] == {"type": "json_object"}
    # json_object needs the schema (and the word JSON) in the prompt.
    assert accepted["messages"][0]["content"] == "sys\n\n" + SCHEMA_HINT

    second = model.complete("sys", "two", schema=SCHEMA, max_tokens=50)
    assert second.text == '{"facts": ["b"]}'
    assert len(oai.chat_requests()) == 3  # the working mode is sent directly
    assert oai.chat_requests()[2]["response_format"] == {"type": "json_object"}


def test_openai_falls_back_to_plain_text_and_remembers(
    oai: FakeOpenAIServer, caplog: pytest.LogCaptureFixture
) -> None:
    oai.reject_response_format({"json_schema", "json_object"})
    oai.chat_script = lambda body: '{"facts": []}'
    model = openai_model(oai)

    with caplog.at_level(logging.WARNING, logger="stratamem.llm"):
        assert model.complete("sys", "one", schema=SCHEMA, max_tokens=50).text == '{"facts": []}'
    kinds = [body.get("response_format", {}).get("type") for body in oai.chat_requests()]
    assert kinds == ["json_schema", "json_object", None]
    assert sum("falling back" in r.getMessage() for r in caplog.records) == 2

    model.complete("sys", "two", schema=SCHEMA, max_tokens=50)
    requests = oai.chat_requests()
    assert len(requests) == 4
    assert "response_format" not in requests[3]
    assert requests[3]["messages"][0]["content"] == "sys\n\n" + SCHEMA_HINT
    assert requests[3]["messages"][1] == {"role": "user", "content": "two"}


def test_openai_other_bad_request_is_not_a_fallback(oai: FakeOpenAIServer) -> None:
    model = openai_model(oai)
    oai.fail_next(1, status=400)
    with pytest.raises(LLMError, match="refused the request: HTTP 400") as info:
        model.complete("sys", "user", schema=SCHEMA, max_tokens=50)
    assert isinstance(info.value.__cause__, openai.BadRequestError)
    assert len(oai.chat_requests()) == 1  # a 400 is not retried
    model.complete("sys", "user", schema=SCHEMA, max_tokens=50)
    assert oai.chat_requests()[1]["response_format"]["type"] == "json_schema"


@pytest.mark.parametrize(
    "body",
    [
        {"error": "Input validation error: response_format is not supported", "error_type": "x"},
        {"detail": "response_format json_schema is not supported"},
        "response_format json_schema is not supported",
    ],
    ids=["tgi-style", "fastapi-style", "plain-text"],
)
def test_openai_fallback_recognises_other_error_shapes(oai: FakeOpenAIServer, body: Any) -> None:
    oai.chat_replies.extend([(400, body), '{"facts": []}'])
    result = openai_model(oai).complete("sys", "user", schema=SCHEMA, max_tokens=50)
    assert result.text == '{"facts": []}'
    kinds = [request["response_format"]["type"] for request in oai.chat_requests()]
    assert kinds == ["json_schema", "json_object"]


def test_openai_concurrent_rejections_step_down_once(oai: FakeOpenAIServer) -> None:
    model = openai_model(oai)
    oai.reject_response_format({"json_schema"})
    model.complete("sys", "warm-up", schema=SCHEMA, max_tokens=5)  # now in json_object mode
    oai.reject_response_format({"json_schema", "json_object"})
    oai.hold.clear()
    outcomes: list[object] = []

    def call() -> None:
        try:
            outcomes.append(model.complete("sys", "u", schema=SCHEMA, max_tokens=5).text)
        except Exception as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=call) for _ in range(2)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 5
    while len(oai.chat_requests()) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)  # both json_object requests are waiting at the gate
    oai.hold.set()
    for thread in threads:
        thread.join(5)
    assert outcomes == ["{}", "{}"]
    assert model.complete("sys", "after", schema=SCHEMA, max_tokens=5).text == "{}"
    assert "response_format" not in oai.chat_requests()[-1]


def test_openai_text_mode_rejection_raises(oai: FakeOpenAIServer) -> None:
    # Even the last step of the chain can be refused; that is an error, not a loop.
    oai.reject_response_format({"json_schema", "json_object"})
    model = openai_model(oai)
    model.complete("sys", "user", schema=SCHEMA, max_tokens=50)
    oai.chat_replies.append((400, {"error": {"message": "response_format is bad", "type": "x"}}))
    with pytest.raises(LLMError, match="refused"):
        model.complete("sys", "user", schema=SCHEMA, max_tokens=50)
    assert len(oai.chat_requests()) == 4


def test_openai_retries_rate_limit_then_succeeds(oai: FakeOpenAIServer) -> None:
    oai.fail_next(1, status=429)
    oai.chat_replies.append('{"facts": []}')
    started = time.perf_counter()
    result = openai_model(oai, max_retries=2).complete("s", "u", schema=SCHEMA, max_tokens=5)
    assert time.perf_counter() - started < 2  # retry-after-ms honoured, no backoff
    assert result.text == '{"facts": []}'
    assert len(oai.chat_requests()) == 2
    assert [h["x-stainless-retry-count"] for h in oai.request_headers] == ["0", "1"]


def test_openai_persistent_server_error_raises(oai: FakeOpenAIServer) -> None:
    oai.fail_next(3, status=500)
    with pytest.raises(LLMError, match="openai:gpt-test failed: HTTP 500") as info:
        openai_model(oai, max_retries=2).complete("s", "u", schema=SCHEMA, max_tokens=5)
    assert isinstance(info.value.__cause__, openai.InternalServerError)
    assert len(oai.chat_requests()) == 3


def test_openai_timeout_raises(oai: FakeOpenAIServer) -> None:
    oai.delay_next(3.0)
    model = openai_model(oai, timeout=0.2, max_retries=0)
    started = time.perf_counter()
    with pytest.raises(LLMError, match="failed") as info:
        model.complete("s", "u", schema=SCHEMA, max_tokens=5)
    assert time.perf_counter() - started < 2
    assert isinstance(info.value.__cause__, openai.APITimeoutError)
    assert len(oai.chat_requests()) == 1


def test_openai_unreachable_endpoint_raises() -> None:
    with FakeOpenAIServer() as fake:
        base_url = fake.base_url  # a port that is closed once the server is gone
    model = OpenAIChatModel("m", base_url=base_url, api_key="k", max_retries=0, timeout=5)
    with pytest.raises(LLMError) as info:
        model.complete("s", "u", schema=None, max_tokens=5)
    assert isinstance(info.value.__cause__, openai.APIConnectionError)


def test_openai_no_choices_raises(oai: FakeOpenAIServer) -> None:
    oai.chat_replies.append({"id": "x", "object": "chat.completion", "model": "m", "choices": []})
    with pytest.raises(LLMUnavailableError, match="no choices"):
        openai_model(oai).complete("s", "u", schema=None, max_tokens=5)


def test_openai_warns_when_cut_at_max_tokens(
    oai: FakeOpenAIServer, caplog: pytest.LogCaptureFixture
) -> None:
    oai.chat_replies.append(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": "gpt-test-2024",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": '{"facts": ["'},
                    "finish_reason": "length",
                }
            ],
        }
    )
    with caplog.at_level(logging.WARNING, logger="stratamem.llm"):
        result = openai_model(oai).complete("s", "u", schema=SCHEMA, max_tokens=3)
    assert result.text == '{"facts": ["'
    assert result.model == "gpt-test-2024"  # what the server says it ran
    assert (result.prompt_tokens, result.completion_tokens) == (0, 0)  # no usage sent
    assert any("max_tokens=3" in r.getMessage() for r in caplog.records)


def test_openai_needs_a_key_without_base_url() -> None:
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        OpenAIChatModel("gpt-4o-mini")


@pytest.mark.parametrize("via", ["argument", "environment"])
def test_openai_key_is_optional_with_a_base_url(
    oai: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch, via: str
) -> None:
    if via == "argument":
        model = OpenAIChatModel("local", base_url=oai.base_url, max_retries=0)
    else:
        monkeypatch.setenv("OPENAI_BASE_URL", oai.base_url)
        model = OpenAIChatModel("local", max_retries=0)
    assert model.complete("s", "u", schema=None, max_tokens=5).text == "{}"
    assert oai.request_headers[0]["authorization"].startswith("Bearer ")


def test_openai_key_from_environment(
    oai: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "env-key")
    OpenAIChatModel("m", base_url=oai.base_url).complete("s", "u", schema=None, max_tokens=5)
    assert oai.request_headers[0]["authorization"] == "Bearer env-key"


@pytest.mark.parametrize(
    ("body", "content_type"),
    [(b"{oops", "application/json"), (HTML_PAGE, "text/html"), (b"[]", "application/json")],
    ids=["broken-json", "html-page", "json-list"],
)
def test_openai_malformed_response_is_an_outage(
    oai: FakeOpenAIServer, body: bytes, content_type: str
) -> None:
    # Not the model answering badly (that is LLMOutputError): the endpoint misbehaves.
    oai.respond_raw_next(body, content_type=content_type)
    with pytest.raises(LLMUnavailableError, match="malformed response"):
        openai_model(oai, max_retries=0).complete("s", "u", schema=None, max_tokens=5)


# -- Anthropic adapter ------------------------------------------------------------------


def test_anthropic_sends_output_config_and_returns_text_and_usage(
    ant: FakeAnthropicServer,
) -> None:
    reply = '{"facts": ["Ada lives in Lyon"]}'
    ant.chat_replies.append(reply)
    model = anthropic_model(ant)
    result = model.complete("You extract facts.", "I moved to Lyon.", schema=SCHEMA, max_tokens=321)

    (body,) = ant.message_requests()
    assert body["model"] == "claude-test"
    assert body["system"] == "You extract facts."
    assert body["messages"] == [{"role": "user", "content": "I moved to Lyon."}]
    assert body["max_tokens"] == 321
    assert body["output_config"] == {"format": {"type": "json_schema", "schema": SCHEMA}}
    assert _sent_key(ant.request_headers[0]) == "test-key"

    assert result.text == reply
    assert result.model == "claude-test"
    assert result.prompt_tokens == estimate_tokens("You extract facts.") + estimate_tokens(
        "I moved to Lyon."
    )
    assert result.completion_tokens == estimate_tokens(reply)
    assert result.latency_ms > 0
    assert model.id == "anthropic:claude-test"
    assert ant.base_url in model.name


def test_anthropic_without_schema_sends_no_output_config(ant: FakeAnthropicServer) -> None:
    ant.chat_script = lambda body: "plain answer"
    result = anthropic_model(ant).complete("sys", "user", schema=None, max_tokens=10)
    (body,) = ant.message_requests()
    assert "output_config" not in body
    assert body["system"] == "sys"
    assert result.text == "plain answer"


def test_anthropic_falls_back_to_schema_in_prompt_and_remembers(
    ant: FakeAnthropicServer, caplog: pytest.LogCaptureFixture
) -> None:
    ant.reject_output_config()
    ant.chat_replies.extend(['{"facts": ["a"]}', '{"facts": ["b"]}'])
    model = anthropic_model(ant)

    with caplog.at_level(logging.WARNING, logger="stratamem.llm"):
        assert model.complete("sys", "one", schema=SCHEMA, max_tokens=50).text == (
            '{"facts": ["a"]}'
        )
    rejected, accepted = ant.message_requests()
    assert "output_config" in rejected
    assert "output_config" not in accepted
    assert accepted["system"] == "sys\n\n" + SCHEMA_HINT
    assert any("output_config" in r.getMessage() for r in caplog.records)

    assert model.complete("sys", "two", schema=SCHEMA, max_tokens=50).text == '{"facts": ["b"]}'
    requests = ant.message_requests()
    assert len(requests) == 3
    assert "output_config" not in requests[2]
    assert requests[2]["system"] == "sys\n\n" + SCHEMA_HINT


def test_anthropic_other_bad_request_is_not_a_fallback(ant: FakeAnthropicServer) -> None:
    model = anthropic_model(ant)
    ant.fail_next(1, status=400)
    with pytest.raises(LLMError, match="refused the request: HTTP 400") as info:
        model.complete("sys", "user", schema=SCHEMA, max_tokens=50)
    assert isinstance(info.value.__cause__, anthropic.BadRequestError)
    model.complete("sys", "user", schema=SCHEMA, max_tokens=50)
    requests = ant.message_requests()
    assert len(requests) == 2
    assert "output_config" in requests[1]


def test_anthropic_rejection_without_schema_raises(ant: FakeAnthropicServer) -> None:
    ant.chat_replies.append((400, ant.error_body(400, "output_config: unexpected")))
    with pytest.raises(LLMError, match="refused"):
        anthropic_model(ant).complete("sys", "user", schema=None, max_tokens=50)
    assert len(ant.message_requests()) == 1


@pytest.mark.parametrize("status", [529, 500, 429])
def test_anthropic_retries_transient_errors(ant: FakeAnthropicServer, status: int) -> None:
    ant.fail_next(2, status=status)
    ant.chat_replies.append('{"facts": []}')
    started = time.perf_counter()
    result = anthropic_model(ant, max_retries=2).complete("s", "u", schema=SCHEMA, max_tokens=5)
    assert time.perf_counter() - started < 2  # retry-after-ms honoured, no backoff
    assert result.text == '{"facts": []}'
    assert len(ant.message_requests()) == 3


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (529, anthropic.OverloadedError),
        (500, anthropic.InternalServerError),
        (429, anthropic.RateLimitError),
    ],
)
def test_anthropic_persistent_errors_raise(
    ant: FakeAnthropicServer, status: int, error: type[Exception]
) -> None:
    ant.fail_next(2, status=status)
    with pytest.raises(LLMError, match=f"anthropic:claude-test failed: HTTP {status}") as info:
        anthropic_model(ant, max_retries=1).complete("s", "u", schema=SCHEMA, max_tokens=5)
    assert isinstance(info.value.__cause__, error)
    assert len(ant.message_requests()) == 2


def test_anthropic_authentication_error_is_not_retried(ant: FakeAnthropicServer) -> None:
    ant.fail_next(1, status=401)
    with pytest.raises(LLMError, match="HTTP 401") as info:
        anthropic_model(ant).complete("s", "u", schema=SCHEMA, max_tokens=5)
    assert isinstance(info.value.__cause__, anthropic.AuthenticationError)
    assert len(ant.message_requests()) == 1


def test_anthropic_timeout_raises(ant: FakeAnthropicServer) -> None:
    ant.delay_next(3.0)
    model = anthropic_model(ant, timeout=0.2, max_retries=0)
    started = time.perf_counter()
    with pytest.raises(LLMError, match="failed") as info:
        model.complete("s", "u", schema=SCHEMA, max_tokens=5)
    assert time.perf_counter() - started < 2
    assert isinstance(info.value.__cause__, anthropic.APITimeoutError)


def test_anthropic_joins_text_blocks_and_skips_others(ant: FakeAnthropicServer) -> None:
    ant.chat_replies.append(
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-test-20250101",
            "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                {"type": "text", "text": '{"facts": '},
                {"type": "text", "text": '["x"]}'},
            ],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 11, "output_tokens": 7},
        }
    )
    result = anthropic_model(ant).complete("s", "u", schema=SCHEMA, max_tokens=50)
    assert result.text == '{"facts": ["x"]}'
    assert result.model == "claude-test-20250101"
    assert (result.prompt_tokens, result.completion_tokens) == (11, 7)


def test_anthropic_needs_a_key(ant: FakeAnthropicServer) -> None:
    with pytest.raises(ConfigError, match="ANTHROPIC_API_KEY"):
        AnthropicChatModel("claude-test", base_url=ant.base_url)


def test_anthropic_key_from_environment(
    ant: FakeAnthropicServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "env-key")
    AnthropicChatModel("c", base_url=ant.base_url).complete("s", "u", schema=None, max_tokens=5)
    assert _sent_key(ant.request_headers[0]) == "env-key"


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b"{oops", "application/json"),
        (HTML_PAGE, "text/html"),
        (b'{"id": "msg_1", "type": "message"}', "application/json"),
    ],
    ids=["broken-json", "html-page", "no-content"],
)
def test_anthropic_malformed_response_is_an_outage(
    ant: FakeAnthropicServer, body: bytes, content_type: str
) -> None:
    # Not the model answering badly (that is LLMOutputError): the endpoint misbehaves.
    ant.respond_raw_next(body, content_type=content_type)
    with pytest.raises(LLMUnavailableError, match="malformed response"):
        anthropic_model(ant, max_retries=0).complete("s", "u", schema=None, max_tokens=5)


# -- what an error means: an outage (processing pauses) or a refused request ------------


@contextlib.contextmanager
def _serving(provider: str) -> Iterator[tuple[Any, Any]]:
    """A fake server of ``provider``, and the function making our model against it."""
    if provider == "openai":
        with FakeOpenAIServer() as oai:
            yield oai, openai_model
    else:
        with FakeAnthropicServer() as ant:
            yield ant, anthropic_model


# Down, overloaded, unreachable, hanging, or refusing the key / permissions / model.
OUTAGES: list[str | int] = ["hang", "refuse", 500, 502, 503, 429, 408, 401, 403, 404]


@pytest.mark.parametrize(
    ("provider", "fault"),
    [("openai", f) for f in OUTAGES] + [("anthropic", f) for f in [*OUTAGES, 529]],
)
def test_outages_are_unavailable_errors_and_the_model_answers_once_healed(
    provider: str, fault: str | int
) -> None:
    with _serving(provider) as (server, make):
        model = make(server, timeout=0.3, max_retries=0)
        server.fault(fault)
        with pytest.raises(LLMUnavailableError) as info:
            model.complete("s", "u", schema=SCHEMA, max_tokens=5)
        assert info.value.service == f"llm {model.id}"
        assert not isinstance(info.value, LLMOutputError)
        server.heal()
        server.chat_script = lambda body: '{"facts": []}'
        assert model.complete("s", "u", schema=SCHEMA, max_tokens=5).text == '{"facts": []}'


@pytest.mark.parametrize("status", [400, 413, 422])
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_refused_request_is_not_an_outage(provider: str, status: int) -> None:
    with _serving(provider) as (server, make):
        server.fault(status)
        with pytest.raises(LLMError, match=f"HTTP {status}") as info:
            make(server, max_retries=0).complete("s", "u", schema=SCHEMA, max_tokens=5)
        assert not isinstance(info.value, LLMUnavailableError | LLMOutputError)


@pytest.mark.parametrize("fault", ["invalid_json", "wrong_schema"])
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_model_answering_unusably_is_an_output_error(provider: str, fault: str) -> None:
    with _serving(provider) as (server, make):
        server.fault(fault)
        with pytest.raises(LLMOutputError) as info:
            complete_json(make(server), "s", "u", schema=SCHEMA, validate=Facts.model_validate)
        assert not isinstance(info.value, LLMUnavailableError)
        assert len(server.requests) == 2  # asked, then asked to repair


# -- parse_json_object ------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        '{"facts": ["a"]}',
        '  \n{"facts": ["a"]}\n ',
        '```json\n{"facts": ["a"]}\n```',
        '```\n{"facts": ["a"]}\n```',
        '\n```json {"facts": ["a"]} ```\n',
    ],
    ids=["bare", "whitespace", "json-fence", "plain-fence", "one-line-fence"],
)
def test_parse_json_object_accepts(text: str) -> None:
    assert parse_json_object(text) == {"facts": ["a"]}


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('[{"facts": ["a"]}]', "expected a JSON object, got list"),
        ('"facts"', "expected a JSON object, got str"),
        ('Here you go: {"facts": ["a"]}', "not valid JSON"),
        ('{"facts": ["a"]}\nHope this helps!', "not valid JSON"),
        ('Sure!\n```json\n{"facts": ["a"]}\n```', "not valid JSON"),
        ('{"a": 1}\n{"b": 2}', "not valid JSON"),
        ('{"facts": ["a"', "not valid JSON"),
        ("", "empty"),
        ("   \n", "empty"),
        ("```json\n```", "empty"),
    ],
    ids=[
        "list",
        "string",
        "prose-before",
        "prose-after",
        "prose-and-fence",
        "two-objects",
        "truncated",
        "empty",
        "blank",
        "empty-fence",
    ],
)
def test_parse_json_object_rejects(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_json_object(text)


# -- complete_json ----------------------------------------------------------------------


def test_complete_json_returns_validated_value_and_raw_text(oai: FakeOpenAIServer) -> None:
    oai.chat_replies.append('{"facts": ["a", "b"]}')
    calls = CallLog()
    value, raw = complete_json(
        openai_model(oai),
        "sys",
        "user",
        schema=SCHEMA,
        validate=Facts.model_validate,
        calls=calls,
    )
    assert value == Facts(facts=["a", "b"])
    assert raw == '{"facts": ["a", "b"]}'
    assert len(oai.chat_requests()) == 1
    assert oai.chat_requests()[0]["max_tokens"] == 4096
    assert len(calls.calls) == 1
    assert calls.prompt_tokens == estimate_tokens("sys") + estimate_tokens("user")
    assert calls.completion_tokens == estimate_tokens(raw)


def test_complete_json_accepts_a_fenced_answer(ant: FakeAnthropicServer) -> None:
    fenced = '```json\n{"facts": ["a"]}\n```'
    ant.chat_replies.append(fenced)
    value, raw = complete_json(
        anthropic_model(ant), "sys", "user", schema=SCHEMA, validate=Facts.model_validate
    )
    assert value.facts == ["a"]
    assert raw == fenced
    assert len(ant.message_requests()) == 1


def test_complete_json_repairs_malformed_json_once(
    oai: FakeOpenAIServer, caplog: pytest.LogCaptureFixture
) -> None:
    oai.chat_replies.extend(['{"facts": ["a",', '{"facts": ["a"]}'])
    calls = CallLog()
    with caplog.at_level(logging.WARNING, logger="stratamem.llm"):
        value, raw = complete_json(
            openai_model(oai),
            "sys",
            "Extract.",
            schema=SCHEMA,
            validate=Facts.model_validate,
            max_tokens=77,
            calls=calls,
        )
    assert value.facts == ["a"]
    assert raw == '{"facts": ["a"]}'
    first, repair = oai.chat_requests()
    assert repair["messages"][0] == first["messages"][0]  # same system prompt
    assert repair["response_format"] == first["response_format"]  # same schema
    assert repair["max_tokens"] == 77
    prompt = repair["messages"][1]["content"]
    assert prompt.startswith("Extract.\n\n")
    assert "not valid JSON" in prompt  # the parse error ...
    assert prompt.endswith('{"facts": ["a",')  # ... and the previous answer
    assert len(calls.calls) == 2
    assert any("repair" in r.getMessage() for r in caplog.records)


def test_complete_json_gives_up_after_one_repair(ant: FakeAnthropicServer) -> None:
    ant.chat_replies.extend(["I cannot answer that.", 'Here: {"facts": ["a"]}'])
    calls = CallLog()
    with pytest.raises(LLMOutputError, match="unusable JSON twice") as info:
        complete_json(
            anthropic_model(ant),
            "sys",
            "user",
            schema=SCHEMA,
            validate=Facts.model_validate,
            calls=calls,
        )
    assert info.value.raw == 'Here: {"facts": ["a"]}'
    assert isinstance(info.value, LLMError)
    assert len(ant.message_requests()) == 2
    assert "I cannot answer that." in ant.message_requests()[1]["messages"][0]["content"]
    assert len(calls.calls) == 2  # both calls are accounted for even on failure


def test_complete_json_validator_error_counts_as_malformed(oai: FakeOpenAIServer) -> None:
    def validate(obj: dict[str, Any]) -> list[str]:
        if not obj.get("facts"):
            raise ValueError("facts must not be empty")
        return list(obj["facts"])

    oai.chat_replies.extend(['{"facts": []}', '{"facts": ["x"]}'])
    value, _ = complete_json(openai_model(oai), "s", "u", schema=SCHEMA, validate=validate)
    assert value == ["x"]
    repair = oai.chat_requests()[1]["messages"][1]["content"]
    assert "facts must not be empty" in repair
    assert repair.endswith('{"facts": []}')


def test_complete_json_pydantic_errors_count_as_malformed(oai: FakeOpenAIServer) -> None:
    oai.chat_replies.extend(['{"facts": "not a list"}', '{"facts": 3}'])
    with pytest.raises(LLMOutputError) as info:
        complete_json(openai_model(oai), "s", "u", schema=SCHEMA, validate=Facts.model_validate)
    assert info.value.raw == '{"facts": 3}'
    assert "validation error" in oai.chat_requests()[1]["messages"][1]["content"]


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        ('[{"facts": ["a"]}]', "expected a JSON object, got list"),
        ('The facts are {"facts": ["a"]}', "not valid JSON"),
    ],
    ids=["json-list", "prose-with-json"],
)
def test_complete_json_rejects_non_objects(
    oai: FakeOpenAIServer, answer: str, problem: str
) -> None:
    oai.chat_replies.extend([answer, answer])
    with pytest.raises(LLMOutputError, match=problem) as info:
        complete_json(openai_model(oai), "s", "u", schema=SCHEMA, validate=Facts.model_validate)
    assert info.value.raw == answer
    assert problem in oai.chat_requests()[1]["messages"][1]["content"]


def test_complete_json_passes_transport_errors_through(oai: FakeOpenAIServer) -> None:
    oai.fail_next(1, status=500)
    with pytest.raises(LLMError) as info:
        complete_json(
            openai_model(oai, max_retries=0),
            "s",
            "u",
            schema=SCHEMA,
            validate=Facts.model_validate,
        )
    assert not isinstance(info.value, LLMOutputError)
    assert len(oai.chat_requests()) == 1  # no repair call for an unreachable model


# -- make_chat_model --------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["none", " NONE ", "None"])
def test_make_chat_model_none(spec: str) -> None:
    assert make_chat_model(spec) is None


def test_make_chat_model_openai(oai: FakeOpenAIServer) -> None:
    model = make_chat_model(" openai:llama3.1:8b ", base_url=oai.base_url, max_retries=0)
    assert isinstance(model, OpenAIChatModel)
    assert model.model == "llama3.1:8b"  # a model name may itself contain ':'
    assert model.id == "openai:llama3.1:8b"
    oai.fail_next(1, status=500)  # max_retries reaches the SDK: one attempt only
    with pytest.raises(LLMError):
        model.complete("s", "u", schema=None, max_tokens=5)
    assert oai.chat_requests()[0]["model"] == "llama3.1:8b"
    assert len(oai.chat_requests()) == 1


def test_make_chat_model_anthropic(ant: FakeAnthropicServer) -> None:
    model = make_chat_model(
        "Anthropic:claude-test", base_url=ant.base_url, api_key="k", timeout=0.2, max_retries=0
    )
    assert isinstance(model, AnthropicChatModel)
    assert model.id == "anthropic:claude-test"
    ant.delay_next(3.0)  # the timeout reaches the SDK
    with pytest.raises(LLMError) as info:
        model.complete("s", "u", schema=None, max_tokens=5)
    assert isinstance(info.value.__cause__, anthropic.APITimeoutError)


@pytest.mark.parametrize(
    "spec",
    ["", "   ", "openai", "openai:", "openai:  ", "gemini:pro", "none:x", ":gpt-4o", None, 3],
)
def test_make_chat_model_rejects_bad_specs(spec: Any) -> None:
    with pytest.raises(ConfigError):
        make_chat_model(spec, base_url="http://127.0.0.1:1/v1", api_key="k")


@pytest.mark.parametrize(
    ("spec", "module", "extra"),
    [("openai:m", "openai", "openai"), ("anthropic:m", "anthropic", "anthropic")],
)
def test_make_chat_model_without_the_sdk_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch, spec: str, module: str, extra: str
) -> None:
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(ConfigError, match=rf"stratamem\[{extra}\]"):
        make_chat_model(spec, base_url="http://127.0.0.1:1", api_key="k")


def test_fake_servers_release_delayed_requests_and_leave_no_threads() -> None:
    before = set(threading.enumerate())
    for fake in (FakeOpenAIServer(), FakeAnthropicServer()):
        with fake:
            fake.delay_next(30.0)
            fake.hold.clear()
            worker = threading.Thread(
                target=lambda f=fake: _post_ignoring_errors(f), name="fake-client"
            )
            worker.start()
            assert fake.held.wait(5)
        worker.join(5)
        assert not worker.is_alive()
    assert set(threading.enumerate()) <= before


def _post_ignoring_errors(fake: FakeOpenAIServer | FakeAnthropicServer) -> None:
    request = urllib.request.Request(
        fake.origin + "/v1/messages", data=b"{}", headers={"Content-Type": "application/json"}
    )
    with contextlib.suppress(OSError), urllib.request.urlopen(request, timeout=10) as answer:
        answer.read()


def test_openai_reasoning_model_parameters_fallback() -> None:
    from stratamem.llm.openai import OpenAIChatModel

    def script(body: dict[str, Any]) -> Any:
        if "max_tokens" in body or "temperature" in body:
            return (
                400,
                {
                    "error": {
                        "message": "Unsupported parameter: 'max_tokens' is not "
                        "supported with this model. Use 'max_completion_tokens'",
                        "type": "invalid_request_error",
                        "param": "max_tokens",
                        "code": "unsupported_parameter",
                    }
                },
            )
        return '{"ok": true}'

    with FakeOpenAIServer() as server:
        server.chat_script = script
        model = OpenAIChatModel("o-reasoner", base_url=server.base_url, api_key="k", max_retries=0)
        result = model.complete("s", "u", schema={"type": "object"}, max_tokens=64)
        assert result.text == '{"ok": true}'
        sent = server.chat_requests()
        assert "max_tokens" in sent[0] and sent[-1]["max_completion_tokens"] == 64
        assert "temperature" not in sent[-1]
        model.complete("s", "u", schema={"type": "object"}, max_tokens=64)
        assert len(server.chat_requests()) == len(sent) + 1  # remembered
