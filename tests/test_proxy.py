"""The memory proxy (``stratamem proxy``, and ``/v1`` on ``stratamem serve``), driven the way
applications drive it: the official ``openai`` and ``anthropic`` SDKs with their base URL
set to the proxy, ``curl``, and the CLI as a process; the proxy runs under uvicorn on
loopback, over real SQLite and PostgreSQL stores, in front of the loopback fake providers.

What a caller sends and gets is checked on the wire: the SDKs' HTTP transport is a
:class:`Tee` that records the bytes of every request and answer, and the fake upstreams
record what reached them and what they answered, so "unchanged" means byte for byte.
"""

from __future__ import annotations

import gc
import gzip
import json
import logging
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest

from dbsql import is_postgres, rows
from fakes.anthropic_server import FakeAnthropicServer
from fakes.openai_server import FakeOpenAIServer, fake_vector
from inproc_server import InProcessServer
from server_proc import ServerProcess, free_port
from stratamem import Memory
from stratamem.capture import MEMORY_PREAMBLE
from stratamem.proxy import create_proxy_app
from stratamem.server import create_app, load_server_settings

SECRET = "sk-test-SECRET123"
ANTHROPIC_SECRET = "sk-ant-SECRET456"
USER = "X-Stratamem-User-Id"
SESSION = "X-Stratamem-Session-Id"
PROCESS = "X-Stratamem-Process-Id"
KEY = "X-Stratamem-Api-Key"
MEMORY = "x-stratamem-memory"

# What the store plays no part in runs on SQLite only; the rest on both stores.
store_free = pytest.mark.sqlite_only

# -- what the SDKs send and receive, recorded on the wire -----------------------------------


class _Recorded(httpx2.SyncByteStream):
    def __init__(self, inner: httpx2.SyncByteStream, into: list[bytes]) -> None:
        self._inner = inner
        self._into = into
        self._chunks: list[bytes] = []

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._inner:
            self._chunks.append(chunk)
            yield chunk

    def close(self) -> None:
        self._into.append(b"".join(self._chunks))
        self._inner.close()


class Tee(httpx2.BaseTransport):
    """The SDKs' ordinary HTTP transport (both SDKs use ``httpx2``) that also records each
    request's body (``sent``) and headers (``sent_headers``), and each answer's body as
    the SDK read it (``received``, once the answer is closed)."""

    def __init__(self) -> None:
        self._inner = httpx2.HTTPTransport()
        self.sent: list[bytes] = []
        self.sent_headers: list[dict[str, str]] = []
        self.received: list[bytes] = []

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        self.sent.append(request.read())
        self.sent_headers.append({k.lower(): v for k, v in request.headers.items()})
        answer = self._inner.handle_request(request)
        assert isinstance(answer.stream, httpx2.SyncByteStream)
        return httpx2.Response(
            answer.status_code,
            headers=answer.headers,
            stream=_Recorded(answer.stream, self.received),
            extensions=answer.extensions,
        )

    def close(self) -> None:
        self._inner.close()


# -- the proxy under test --------------------------------------------------------------------


@dataclass
class Proxy:
    url: str
    memory: Any
    oai: FakeOpenAIServer
    ant: FakeAnthropicServer
    tee: Tee = field(default_factory=Tee)

    def headers(
        self, user: str | None = "ana", session: str | None = None, **more: str
    ) -> dict[str, str]:
        headers = dict(more)
        if user is not None:
            headers[USER] = user
        if session is not None:
            headers[SESSION] = session
        return headers

    def openai(
        self,
        user: str | None = "ana",
        session: str | None = None,
        *,
        key: str = SECRET,
        headers: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.url}/v1",
            api_key=key,
            max_retries=0,
            timeout=30,
            default_headers={**self.headers(user, session), **(headers or {})},
            http_client=httpx2.Client(transport=self.tee),
            **kwargs,
        )

    def anthropic(
        self,
        user: str | None = "ana",
        session: str | None = None,
        *,
        key: str | None = ANTHROPIC_SECRET,
        headers: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> anthropic.Anthropic:
        return anthropic.Anthropic(
            base_url=self.url,
            api_key=key,
            max_retries=0,
            timeout=30,
            default_headers={**self.headers(user, session), **(headers or {})},
            http_client=httpx2.Client(transport=self.tee),
            **kwargs,
        )


@pytest.fixture
def oai() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as server:
        server.chat_script = lambda body: "Noted."
        yield server


@pytest.fixture
def ant() -> Iterator[FakeAnthropicServer]:
    with FakeAnthropicServer() as server:
        server.chat_script = lambda body: "Noted."
        yield server


StartProxy = Callable[..., Proxy]


@pytest.fixture
def start_proxy(oai: FakeOpenAIServer, ant: FakeAnthropicServer) -> Iterator[StartProxy]:
    """``start_proxy(memory, **proxy_settings)``: ``stratamem proxy``'s app over ``memory``
    in front of the fakes (``proxy_upstream=None``: no upstream)."""
    with ExitStack() as stack:

        def start(memory: Any, **settings: Any) -> Proxy:
            settings.setdefault("proxy_upstream", oai.base_url)  # ".../v1": the proxy drops it
            settings.setdefault("proxy_anthropic_upstream", ant.base_url)
            app = create_proxy_app(memory, load_server_settings(**settings))
            server = stack.enter_context(InProcessServer(app))
            return Proxy(server.url, memory, oai, ant)

        yield start


@pytest.fixture
def proxy(mem: Memory, start_proxy: StartProxy) -> Proxy:
    """The proxy over ``mem`` (conftest: a fresh store of each backend)."""
    return start_proxy(mem)


def seed(mem: Memory, user: str, *texts: str) -> None:
    """What ``user`` said earlier, stored (and processed) outside the proxy."""
    session = mem.sessions.create(user_id=user, session_id=f"facts-{user}")
    session.add_messages([{"role": "user", "content": t} for t in texts], sync=True)


def stored(mem: Memory, session: str, at_least: int = 1, timeout: float = 10.0) -> list[Any]:
    """The session's messages once at least ``at_least`` are stored (a relayed stream is
    captured just after its last byte went out, so the caller may be first)."""
    deadline = time.monotonic() + timeout
    while True:
        assert mem.llm.flush(timeout)
        found = mem.messages.list(session_id=session)
        if len(found) >= at_least or time.monotonic() > deadline:
            return found
        time.sleep(0.02)


KEY_HEADERS = ("authorization", "x-api-key", "api-key")


def sent_key(headers: dict[str, str]) -> str:
    """The provider key a request carried: ``x-api-key``, or a bearer token (the
    ``anthropic`` SDK 2.x sends ``Authorization: Bearer``)."""
    if "x-api-key" in headers:
        return headers["x-api-key"]
    return headers.get("authorization", "").removeprefix("Bearer ")


def assert_same_key_headers(caller: dict[str, str], upstream: dict[str, str]) -> None:
    """The upstream got the caller's key headers, exactly as sent."""
    assert {h: caller[h] for h in KEY_HEADERS if h in caller} == {
        h: upstream[h] for h in KEY_HEADERS if h in upstream
    }


def block_of(content: str, question: str) -> str:
    """The memory block the proxy put after ``question`` in a user turn."""
    asked, sep, block = content.partition("\n\n")
    assert asked == question and sep, content
    assert block.startswith(MEMORY_PREAMBLE), block
    return block


# -- the seven ways of asking -----------------------------------------------------------------

WAYS = (
    "chat",
    "chat-stream",
    "responses",
    "responses-stream",
    "messages",
    "messages-stream",
    "messages-helper",
)
# The request field holding the turns, per API.
TURNS = {"chat": "messages", "responses": "input", "messages": "messages"}
# Other request fields, each API's own and one it does not know: all must cross unchanged.
CUSTOM = {"extra_body": {"x_custom": {"nested": [1, 2.5, None, "ü"]}}}
FIELDS: dict[str, dict[str, Any]] = {
    "chat": {"temperature": 0.2, "max_tokens": 50, "seed": 7, "user": "end-user-1", **CUSTOM},
    "responses": {"temperature": 0.3, "max_output_tokens": 40, "metadata": {"t": "1"}, **CUSTOM},
    "messages": {"metadata": {"user_id": "end-user-1"}, "stop_sequences": ["END"], **CUSTOM},
}
SYSTEM = "You are a careful travel assistant. Answer briefly."
EARLIER = [
    {"role": "user", "content": "Hi, I am planning a trip."},
    {"role": "assistant", "content": "Great, where would you like to go?"},
]


def api_of(way: str) -> str:
    return way.split("-")[0]


def upstream_of(proxy: Proxy, way: str) -> FakeOpenAIServer | FakeAnthropicServer:
    return proxy.ant if api_of(way) == "messages" else proxy.oai


@dataclass
class Asked:
    answer: str
    memory: str | None
    headers: httpx2.Headers


def ask(
    proxy: Proxy,
    way: str,
    question: str,
    *,
    user_id: str | None = "ana",
    session_id: str | None = None,
    client: Any = None,
    **extra: Any,
) -> Asked:
    """Ask ``question`` (after SYSTEM and EARLIER) through the proxy ``way``'s way, as
    ``user_id`` (in ``session_id``), with ``extra`` request fields."""
    turn = {"role": "user", "content": question}
    if api_of(way) == "chat":
        c = client or proxy.openai(user_id, session_id)
        raw = c.chat.completions.with_raw_response.create(
            model="gpt-fake",
            messages=[{"role": "system", "content": SYSTEM}, *EARLIER, turn],
            stream=way == "chat-stream",
            **extra,
        )
        if way == "chat":
            text = raw.parse().choices[0].message.content or ""
        else:
            text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
        return Asked(text, raw.headers.get(MEMORY), raw.headers)
    if api_of(way) == "responses":
        c = client or proxy.openai(user_id, session_id)
        raw = c.responses.with_raw_response.create(
            model="gpt-fake",
            instructions=SYSTEM,
            input=[*EARLIER, turn],  # type: ignore[list-item]
            stream=way == "responses-stream",
            **extra,
        )
        if way == "responses":
            text = raw.parse().output_text
        else:
            text = "".join(e.delta for e in raw.parse() if e.type == "response.output_text.delta")
        return Asked(text, raw.headers.get(MEMORY), raw.headers)
    c = client or proxy.anthropic(user_id, session_id)
    request: dict[str, Any] = {
        "model": "claude-fake",
        "max_tokens": 64,
        "system": SYSTEM,
        "messages": [*EARLIER, turn],
        **extra,
    }
    if way == "messages-helper":
        with c.messages.stream(**request) as stream:
            text = stream.get_final_text()
            headers = stream.response.headers
        return Asked(text, headers.get(MEMORY), headers)
    raw = c.messages.with_raw_response.create(**request, stream=way == "messages-stream")
    if way == "messages":
        text = "".join(b.text for b in raw.parse().content if b.type == "text")
    else:
        text = "".join(
            e.delta.text
            for e in raw.parse()
            if e.type == "content_block_delta" and e.delta.type == "text_delta"
        )
    return Asked(text, raw.headers.get(MEMORY), raw.headers)


def sent_upstream(proxy: Proxy, way: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(what the caller's SDK sent the proxy, what the upstream got), parsed."""
    caller = json.loads(proxy.tee.sent[-1])
    got = upstream_of(proxy, way).requests[-1][1]
    return caller, got


def assert_relayed_with_block(proxy: Proxy, way: str, question: str) -> str:
    """The upstream got the caller's request with the memory block after the last user
    turn's text and nothing else changed; the caller got the upstream's answer byte for
    byte. Returns the block."""
    caller, got = sent_upstream(proxy, way)
    turns = TURNS[api_of(way)]
    # Every other field (model, system/instructions, stream, temperature ...) as sent.
    assert {k: v for k, v in got.items() if k != turns} == {
        k: v for k, v in caller.items() if k != turns
    }
    # Earlier turns (and the chat's system message) identical: the prompt cache holds.
    assert got[turns][:-1] == caller[turns][:-1]
    last = got[turns][-1]
    assert {k: v for k, v in last.items() if k != "content"} == {
        k: v for k, v in caller[turns][-1].items() if k != "content"
    }
    assert proxy.tee.received[-1] == upstream_of(proxy, way).answers[-1]
    return block_of(last["content"], question)


@pytest.mark.parametrize("way", WAYS)
def test_recall_inject_capture_and_recall_again(mem: Memory, proxy: Proxy, way: str) -> None:
    seed(mem, "ana", "I am allergic to peanuts.")
    # Half the ways name a session; the others use capture's default, llm-<user>.
    session = "trip-42" if WAYS.index(way) % 2 else None
    where = session or "llm-ana"
    upstream = upstream_of(proxy, way)

    fields = FIELDS[api_of(way)]
    if way == "chat-stream":
        fields = {**fields, "stream_options": {"include_usage": True}}

    first = "Can you suggest a snack with peanuts for the flight?"
    upstream.chat_replies.append("Try the almond cookies from the Lisbon bakery instead.")
    asked = ask(proxy, way, first, session_id=session, **fields)
    assert asked.answer == "Try the almond cookies from the Lisbon bakery instead."
    assert asked.memory == "injected"
    block = assert_relayed_with_block(proxy, way, first)
    assert "allergic to peanuts" in block
    assert sent_upstream(proxy, way)[1]["x_custom"] == {"nested": [1, 2.5, None, "ü"]}

    messages = stored(mem, where, 2)
    assert [(m.role, m.content) for m in messages] == [
        ("user", first),
        ("assistant", "Try the almond cookies from the Lisbon bakery instead."),
    ]
    capture = messages[1].metadata["capture"]
    assert capture["provider"] == ("anthropic" if api_of(way) == "messages" else "openai")
    assert capture["model"] in ("gpt-fake", "claude-fake")
    assert "partial" not in capture and "error" not in capture
    assert capture["usage"]  # a chat stream's too: include_usage is asked for above
    assert messages[0].user_id == "ana"

    # The exchange is memory now: a later call about it gets it injected.
    second = "Which bakery were those almond cookies from?"
    upstream.chat_replies.append("The Lisbon bakery.")
    again = ask(proxy, way, second, session_id=session)
    assert again.answer == "The Lisbon bakery." and again.memory == "injected"
    block = assert_relayed_with_block(proxy, way, second)
    assert "almond cookies from the Lisbon bakery" in block
    assert len(stored(mem, where, 4)) == 4


@store_free
@pytest.mark.parametrize("way", WAYS)
def test_nothing_recalled_sends_the_request_as_it_came(mem: Memory, proxy: Proxy, way: str) -> None:
    seed(mem, "bob", "I am allergic to peanuts.")  # another user's memory
    asked = ask(proxy, way, "Any snack with peanuts?")
    assert asked.memory == "none" and asked.answer == "Noted."
    assert upstream_of(proxy, way).raw_requests[-1] == proxy.tee.sent[-1]  # byte for byte
    assert proxy.tee.received[-1] == upstream_of(proxy, way).answers[-1]
    assert [m.content for m in stored(mem, "llm-ana", 2)] == ["Any snack with peanuts?", "Noted."]


PIXEL = (  # a 1x1 PNG
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


@store_free
def test_content_shapes_keep_theirs_and_get_the_block_their_way(mem: Memory, proxy: Proxy) -> None:
    seed(mem, "ana", "I am allergic to peanuts.")
    question = "Are there peanuts in the snack on this picture?"
    # Chat: a list of parts gets one more text part; the image part is sent as it came.
    parts = [
        {"type": "text", "text": question},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PIXEL}"}},
    ]
    reply = proxy.openai().chat.completions.with_raw_response.create(
        model="gpt-fake", messages=[{"role": "user", "content": parts}]
    )
    assert reply.headers[MEMORY] == "injected"
    sent = proxy.oai.chat_requests()[-1]["messages"][-1]["content"]
    assert sent[:2] == parts and len(sent) == 3 and sent[2]["type"] == "text"
    assert sent[2]["text"].startswith(MEMORY_PREAMBLE) and "peanuts" in sent[2]["text"]
    # Anthropic: a list of blocks gets one more text block.
    blocks = [
        {"type": "text", "text": question},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PIXEL}},
    ]
    proxy.anthropic().messages.create(
        model="claude-fake", max_tokens=16, messages=[{"role": "user", "content": blocks}]
    )
    sent = proxy.ant.message_requests()[-1]["messages"][-1]["content"]
    assert sent[:2] == blocks and len(sent) == 3 and sent[2]["type"] == "text"
    assert sent[2]["text"].startswith(MEMORY_PREAMBLE)
    # Responses: a string input stays one string.
    proxy.openai().responses.create(model="gpt-fake", input=question, instructions=SYSTEM)
    got = proxy.oai.responses_requests()[-1]
    assert got["instructions"] == SYSTEM
    block_of(got["input"], question)
    # Text beyond ASCII, streamed in pieces, arrives and is stored whole.
    proxy.oai.chat_replies.append("Café ☕ sans cacahuètes — 日本語のお菓子 🎉 ok.")
    streamed = ask(proxy, "chat-stream", "Any snack without peanuts?")
    assert streamed.answer == "Café ☕ sans cacahuètes — 日本語のお菓子 🎉 ok."
    assert proxy.tee.received[-1] == proxy.oai.answers[-1]
    assert stored(mem, "llm-ana", 8)[-1].content == streamed.answer


# -- tools -------------------------------------------------------------------------------------

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {"name": "get_weather", "description": "The weather in a city."}
TOOLS = {
    "chat": {"type": "function", "function": {**WEATHER, "parameters": CITY}},
    "responses": {"type": "function", **WEATHER, "parameters": CITY, "strict": False},
    "messages": {**WEATHER, "input_schema": CITY},
}


@pytest.mark.parametrize(
    "way", ["chat", "chat-stream", "responses", "responses-stream", "messages", "messages-stream"]
)
def test_tool_calls_pass_through_and_are_captured(mem: Memory, proxy: Proxy, way: str) -> None:
    seed(mem, "ana", "I live in Porto.")
    api = api_of(way)
    tool = TOOLS[api]
    call_id = "toolu_w1" if api == "messages" else "call_w1"
    upstream = upstream_of(proxy, way)
    upstream.chat_replies.append(
        {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Porto"}, "id": call_id}]}
    )
    question = "What is the weather like where I live?"
    asked = ask(proxy, way, question, tools=[tool])
    assert asked.memory == "injected" and asked.answer == ""
    block = assert_relayed_with_block(proxy, way, question)  # tools included, as sent
    assert "Porto" in block
    assert sent_upstream(proxy, way)[1]["tools"] == [tool]

    messages = stored(mem, "llm-ana", 2)
    assert [m.role for m in messages] == ["user", "assistant"]
    calls = messages[1].metadata["capture"]["tool_calls"]
    assert [(c["id"], c["name"], json.loads(c["arguments"])) for c in calls] == [
        (call_id, "get_weather", {"city": "Porto"})
    ]
    assert "get_weather" in messages[1].content


# -- everything else passes through ---------------------------------------------------------


@store_free
def test_headers_cross_as_the_upstream_and_the_caller_need(proxy: Proxy) -> None:
    proxy.oai.answer_headers = {
        "x-request-id": "req_abc123",
        "x-ratelimit-remaining-requests": "99",
        "x-ratelimit-reset-tokens": "6ms",
        "openai-processing-ms": "12",
    }
    proxy.ant.answer_headers = {
        "request-id": "req_ant456",
        "anthropic-ratelimit-requests-remaining": "49",
    }
    stratamem_headers = {PROCESS: "agent-7", SESSION: "s-1"}
    client = proxy.openai(
        organization="org-test",
        project="proj-test",
        headers={"X-Trace-Id": "trace-1", **stratamem_headers},
        default_query={"api-version": "2024-10-21"},  # Azure-style: the query crosses too
    )
    for way in ("chat", "chat-stream", "responses", "responses-stream"):
        asked = ask(proxy, way, "Hello?", client=client)
        assert proxy.oai.requests[-1][0].endswith("?api-version=2024-10-21")
        assert asked.headers["x-request-id"] == "req_abc123"
        assert asked.headers["x-ratelimit-remaining-requests"] == "99"
        assert asked.headers["x-ratelimit-reset-tokens"] == "6ms"
        assert asked.headers["openai-processing-ms"] == "12"
        got = proxy.oai.request_headers[-1]
        assert got["authorization"] == f"Bearer {SECRET}"
        assert_same_key_headers(proxy.tee.sent_headers[-1], got)
        assert got["openai-organization"] == "org-test"
        assert got["openai-project"] == "proj-test"
        assert got["x-trace-id"] == "trace-1"
        assert got["x-stainless-lang"] == "python"
        assert not [h for h in got if h.startswith("x-stratamem")]
        assert got["host"] == f"127.0.0.1:{proxy.oai.port}"  # the upstream's, not the proxy's

    beta = {"anthropic-beta": "prompt-caching-2024-07-31", **stratamem_headers}
    client = proxy.anthropic(headers=beta)
    for way in ("messages", "messages-stream", "messages-helper"):
        asked = ask(proxy, way, "Hello?", client=client)
        assert asked.headers["request-id"] == "req_ant456"
        assert asked.headers["anthropic-ratelimit-requests-remaining"] == "49"
        got = proxy.ant.request_headers[-1]
        assert sent_key(got) == ANTHROPIC_SECRET
        assert_same_key_headers(proxy.tee.sent_headers[-1], got)
        assert got["anthropic-version"] == proxy.tee.sent_headers[-1]["anthropic-version"]
        assert got["anthropic-beta"] == "prompt-caching-2024-07-31"
        assert not [h for h in got if h.startswith("x-stratamem")]


@store_free
def test_the_sdks_read_the_relayed_request_ids(proxy: Proxy) -> None:
    proxy.oai.answer_headers = {"x-request-id": "req_abc123"}
    proxy.ant.answer_headers = {"request-id": "req_ant456"}
    reply = proxy.openai().chat.completions.create(
        model="gpt-fake", messages=[{"role": "user", "content": "Hi"}]
    )
    assert reply._request_id == "req_abc123"
    message = proxy.anthropic().messages.create(
        model="claude-fake", max_tokens=16, messages=[{"role": "user", "content": "Hi"}]
    )
    assert message._request_id == "req_ant456"


@store_free
def test_an_upstream_that_compresses_anyway_reaches_the_caller_readable(
    mem: Memory, start_proxy: StartProxy
) -> None:
    """The proxy asks for an uncompressed answer; an upstream that gzips it all the same
    still reaches the caller readable, captured or merely relayed."""
    proxy = start_proxy(mem, proxy_require_user=False)
    proxy.oai.answer_headers = {"Content-Encoding": "gzip"}
    completion = {
        "id": "chatcmpl-gz",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-fake",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Zipped hello."},
                "finish_reason": "stop",
            }
        ],
    }
    for user in ("ana", None):
        proxy.oai.respond_raw_next(gzip.compress(json.dumps(completion).encode()))
        asked = ask(proxy, "chat", "Hello?", user_id=user)
        assert asked.answer == "Zipped hello."
        assert asked.memory == ("none" if user else "off")
        assert proxy.oai.request_headers[-1]["accept-encoding"] == "identity"
    assert [m.content for m in stored(mem, "llm-ana", 2)] == ["Hello?", "Zipped hello."]


@store_free
def test_bodies_the_proxy_cannot_read_or_will_not_take(
    mem: Memory, start_proxy: StartProxy
) -> None:
    proxy = start_proxy(mem, proxy_max_body_bytes=4096)
    # Not JSON: sent as it came; the upstream says what is wrong.
    r = httpx.post(
        f"{proxy.url}/v1/chat/completions",
        content=b"{not json",
        headers={USER: "ana", "Content-Type": "application/json"},
    )
    assert r.status_code == 400 and r.headers[MEMORY] == "off"
    assert r.json()["error"]["message"] == "body must be a JSON object"
    assert proxy.oai.raw_requests == [b"{not json"]
    # Over proxy_max_body_bytes: refused before anything is read or sent, in the
    # provider's error shape (the SDK's message says why).
    with pytest.raises(openai.APIStatusError) as raised:
        ask(proxy, "chat", "x" * 5000)
    assert raised.value.status_code == 413
    assert "request body larger than 4096 bytes" in raised.value.message
    with pytest.raises(anthropic.APIStatusError) as refused:
        ask(proxy, "messages", "x" * 5000)
    assert refused.value.status_code == 413
    assert refused.value.body["error"]["message"] == "request body larger than 4096 bytes"  # type: ignore[index]
    # A body sent without a Content-Length grows past the limit while it streams in.
    chunks = iter([b'{"model": "m", "messages": [{"role": "user", "content": "', b"x" * 5000])
    r = httpx.post(
        f"{proxy.url}/v1/chat/completions",
        content=chunks,
        headers={"X-Stratamem-User-Id": "ana", "Content-Type": "application/json"},
    )
    assert r.status_code == 413
    assert r.json()["error"]["message"] == "request body larger than 4096 bytes"
    assert len(proxy.oai.requests) == 1 and not proxy.ant.requests


@store_free
def test_serve_spends_its_own_upstream_key_only_for_a_stratamem_key(
    mem: Memory, oai: FakeOpenAIServer, ant: FakeAnthropicServer
) -> None:
    mem.projects.create("default", project_id="default")
    _, key = mem.keys.create("default")
    settings = load_server_settings(
        proxy_upstream=oai.base_url,
        proxy_anthropic_upstream=ant.base_url,
        proxy_upstream_api_key="sk-proxy-OWN",
        proxy_require_user=False,
    )
    with InProcessServer(create_app(mem, settings)) as server:
        proxy = Proxy(server.url, mem, oai, ant)
        # Without the stratamem key: refused, on the memory routes and every other path,
        # with a user or without one.
        for user in ("ana", None):
            with pytest.raises(openai.AuthenticationError):
                ask(proxy, "chat", "Hello?", user_id=user)
            with pytest.raises(anthropic.AuthenticationError):
                ask(proxy, "messages", "Hello?", user_id=user)
        with pytest.raises(openai.AuthenticationError, match="x-stratamem-api-key"):
            proxy.openai().models.list()
        wrong = proxy.openai(headers={KEY: "sm_wrong_key_0123456789abcdef"})
        with pytest.raises(openai.AuthenticationError, match="invalid"):
            wrong.embeddings.create(model="text-embedding-fake", input="hello")
        assert not oai.requests and not oai.get_requests and not ant.requests

        mine = proxy.openai(headers={KEY: key})
        assert ask(proxy, "chat", "Hello?", client=mine).memory == "none"
        anonymous = proxy.openai(user=None, headers={KEY: key})
        assert ask(proxy, "chat", "Hello?", client=anonymous).memory == "off"
        mine.models.list()
        ask(proxy, "messages-stream", "Hello?", client=proxy.anthropic(headers={KEY: key}))
    assert [h["authorization"] for h in oai.request_headers] == ["Bearer sk-proxy-OWN"] * 2
    assert oai.get_requests[-1][1]["authorization"] == "Bearer sk-proxy-OWN"
    assert ant.request_headers[-1]["x-api-key"] == "sk-proxy-OWN"
    assert "authorization" not in ant.request_headers[-1]


# -- upstream errors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("way", "status"),
    [
        ("chat", 429),
        ("chat-stream", 500),
        ("responses", 500),
        ("responses-stream", 429),
        ("messages", 429),
        ("messages-stream", 500),
    ],
)
def test_upstream_errors_reach_the_caller_as_sent_and_only_the_answered_retry_is_stored(
    mem: Memory, proxy: Proxy, way: str, status: int
) -> None:
    seed(mem, "ana", "I prefer window seats.")
    upstream = upstream_of(proxy, way)
    upstream.fail_next(1, status=status)
    upstream.answer_headers = {"x-request-id": "req_failed"}
    errors: dict[int, type[Exception]] = (
        {429: anthropic.RateLimitError, 500: anthropic.InternalServerError}
        if api_of(way) == "messages"
        else {429: openai.RateLimitError, 500: openai.InternalServerError}
    )
    question = "Which seat should I book on the window side?"
    with pytest.raises(errors[status]) as raised:
        ask(proxy, way, question)
    error: Any = raised.value
    assert error.status_code == status
    assert error.response.content == upstream.answers[-1]  # the upstream's exact body
    assert f"injected failure (HTTP {status})".encode() in error.response.content
    assert error.response.headers["x-request-id"] == "req_failed"
    assert error.response.headers["retry-after-ms"] == "1"
    assert error.response.headers[MEMORY] == "injected"
    assert len(upstream.requests) == 1  # max_retries=0: one try, and the proxy adds none

    # A failed attempt is not stored: the SDK's retry is a request of its own, and the
    # attempt that succeeds is stored, once.
    assert mem.llm.flush(10) and mem.messages.list(session_id="llm-ana") == []
    upstream.chat_replies.append("Seat 12A, by the window.")
    assert ask(proxy, way, question).answer == "Seat 12A, by the window."
    turns = stored(mem, "llm-ana", 2)
    assert [(t.role, t.content) for t in turns] == [
        ("user", question),
        ("assistant", "Seat 12A, by the window."),
    ]


@store_free
def test_an_unreachable_upstream_is_a_502_in_the_providers_shape(
    mem: Memory, start_proxy: StartProxy
) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    proxy = start_proxy(mem, proxy_upstream=closed, proxy_anthropic_upstream=closed)
    with pytest.raises(openai.InternalServerError) as raised:
        proxy.openai().chat.completions.create(
            model="gpt-fake", messages=[{"role": "user", "content": "Hi"}]
        )
    assert raised.value.status_code == 502
    assert closed in raised.value.message and "failed (" in raised.value.message
    with pytest.raises(anthropic.InternalServerError) as failed:
        proxy.anthropic().messages.create(
            model="claude-fake", max_tokens=16, messages=[{"role": "user", "content": "Hi"}]
        )
    assert failed.value.status_code == 502
    assert failed.value.body["error"]["type"] == "api_error"  # type: ignore[index]
    assert mem.llm.flush(10) and mem.messages.list(session_id="llm-ana") == []


# -- the caller goes away mid-stream --------------------------------------------------------

LONG_ANSWER = " ".join(f"word{i}" for i in range(400))


@pytest.mark.parametrize("way", ["chat-stream", "responses-stream", "messages-stream"])
def test_a_caller_that_leaves_mid_stream_stops_the_upstream_and_is_captured_partial(
    mem: Memory, proxy: Proxy, way: str
) -> None:
    upstream = upstream_of(proxy, way)
    upstream.chunk_delay = 0.02  # 400 words: the whole answer would take 8 s
    upstream.chat_replies.append(LONG_ANSWER)
    question = "Tell me a very long story."
    api = api_of(way)
    read: list[str] = []
    if api == "chat":
        stream: Any = proxy.openai().chat.completions.create(
            model="gpt-fake", messages=[{"role": "user", "content": question}], stream=True
        )
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                read.append(chunk.choices[0].delta.content)
            if len(read) == 3:
                break
    elif api == "responses":
        stream = proxy.openai().responses.create(model="gpt-fake", input=question, stream=True)
        for event in stream:
            if event.type == "response.output_text.delta":
                read.append(event.delta)
            if len(read) == 3:
                break
    else:
        stream = proxy.anthropic().messages.create(
            model="claude-fake",
            max_tokens=1024,
            messages=[{"role": "user", "content": question}],
            stream=True,
        )
        for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "text_delta":
                read.append(event.delta.text)
            if len(read) == 3:
                break
    left = time.monotonic()
    stream.close()
    # The proxy closed its upstream connection: the upstream's next write failed.
    assert upstream.wait_idle(5)
    assert time.monotonic() - left < 3
    assert upstream.streams_abandoned == 1

    (asked, partial) = stored(mem, "llm-ana", 2)
    assert asked.content == question
    assert partial.role == "assistant" and partial.metadata["capture"]["partial"] is True
    assert partial.content.startswith("".join(read))
    assert LONG_ANSWER.startswith(partial.content) and len(partial.content) < len(LONG_ANSWER)


@pytest.mark.parametrize("way", ["chat-stream", "responses-stream", "messages-stream"])
def test_a_caller_that_leaves_after_the_last_event_is_captured_whole(
    mem: Memory, proxy: Proxy, way: str
) -> None:
    """OpenAI's SDK closes a chat stream once it reads ``[DONE]``, before the body's end:
    the proxy sees a disconnect, yet the answer was whole (this once stored it as partial
    whenever the upstream's end came after the caller had left)."""
    upstream = upstream_of(proxy, way)
    upstream.end_delay = 5.0  # the body ends long after the last event
    upstream.chat_replies.append("The whole answer.")
    stream: Any
    if api_of(way) == "chat":
        stream = proxy.openai().chat.completions.create(
            model="gpt-fake", messages=[{"role": "user", "content": "Hi?"}], stream=True
        )
    elif api_of(way) == "responses":
        stream = proxy.openai().responses.create(model="gpt-fake", input="Hi?", stream=True)
    else:
        stream = proxy.anthropic().messages.create(
            model="claude-fake",
            max_tokens=64,
            messages=[{"role": "user", "content": "Hi?"}],
            stream=True,
        )
    for event in stream:  # the chat SDK stops at [DONE]; the others would read on
        if getattr(event, "type", None) in ("message_stop", "response.completed"):
            break
    stream.close()

    (asked, answer) = stored(mem, "llm-ana", 2)
    assert not upstream.wait_idle(0)  # stored while the upstream's body has not ended
    assert asked.content == "Hi?" and answer.content == "The whole answer."
    assert "partial" not in answer.metadata["capture"]


@store_free
def test_a_caller_that_gives_up_on_a_plain_call_stops_it_and_nothing_is_stored(
    mem: Memory, proxy: Proxy
) -> None:
    """Only answers the caller got are stored: a timed-out attempt and each of the SDK's
    retries are requests of their own, and storing them would repeat the user's turn."""
    proxy.oai.delay_next(5.0, n=3)
    # Each try has time to pass the proxy's own work and reach the upstream, which holds it.
    client = proxy.openai().with_options(timeout=1.0, max_retries=2)
    started = time.monotonic()
    with pytest.raises(openai.APITimeoutError):
        client.chat.completions.create(
            model="gpt-fake", messages=[{"role": "user", "content": "Slow one?"}]
        )
    assert time.monotonic() - started < 4.9  # three tries of 1 s (and backoff)
    assert len(proxy.oai.requests) == 3
    assert proxy.oai.wait_idle(15)  # the upstream is done with the three (its answers go nowhere)
    time.sleep(0.2)  # what a proxy still holding an answer would store, it has stored now
    assert mem.llm.flush(10) and mem.messages.list(session_id="llm-ana") == []
    proxy.oai.chat_replies.append("Fast now.")
    assert ask(proxy, "chat", "Slow one?").answer == "Fast now."
    assert [t.content for t in stored(mem, "llm-ana", 2)] == ["Slow one?", "Fast now."]


@store_free
def test_an_upstream_stream_that_breaks_aborts_the_callers_and_is_captured(
    mem: Memory, proxy: Proxy
) -> None:
    proxy.oai.chat_replies.append("one two three four five six seven eight")
    proxy.oai.fail_stream_after(4)
    with pytest.raises(openai.APIError):
        stream = proxy.openai().chat.completions.create(
            model="gpt-fake", messages=[{"role": "user", "content": "Count"}], stream=True
        )
        for _ in stream:
            pass
    (_, answer) = stored(mem, "llm-ana", 2)
    assert answer.content == "one two three"  # the role chunk, three words, the break
    capture = answer.metadata["capture"]
    assert "error" in capture and "partial" not in capture


@store_free
def test_an_upstream_anthropic_stream_that_breaks_reaches_the_sdk_and_is_captured(
    mem: Memory, proxy: Proxy
) -> None:
    proxy.ant.chat_replies.append("one two three four five")
    proxy.ant.fail_stream_after(5)  # message_start, block start, ping, two deltas
    received: list[str] = []
    with (
        pytest.raises((anthropic.APIConnectionError, httpx2.RemoteProtocolError)) as broken,
        proxy.anthropic().messages.stream(
            model="claude-fake", max_tokens=50, messages=[{"role": "user", "content": "Count"}]
        ) as stream,
    ):
        received.extend(stream.text_stream)
    # The SDK reports the aborted relay as it reports a broken connection: APIConnectionError
    # from the transport's error (anthropic >= 2.17), or that error itself (earlier).
    transport = broken.value
    if isinstance(transport, anthropic.APIConnectionError):
        transport = transport.__cause__
    assert isinstance(transport, httpx2.RemoteProtocolError)
    (_, answer) = stored(mem, "llm-ana", 2)
    assert answer.content == "".join(received) == "one two"
    capture = answer.metadata["capture"]
    assert "error" in capture and "partial" not in capture


# -- users never mix ---------------------------------------------------------------------------

COLOURS = [
    *("teal", "crimson", "amber", "violet", "olive", "coral", "indigo", "saffron"),
    *("magenta", "ochre", "turquoise", "maroon", "lavender", "cobalt", "scarlet", "jade"),
]


def test_concurrent_users_never_mix(mem: Memory, proxy: Proxy) -> None:
    users = [f"u{i:02d}" for i in range(len(COLOURS))]
    for user, colour in zip(users, COLOURS, strict=True):
        seed(mem, user, f"My favourite colour is {colour}.")

    def script(body: dict[str, Any]) -> str:
        user = re.search(r"I am (u\d\d)\.", json.dumps(body))
        return f"Reply for {user.group(1) if user else '?'}: noted."

    proxy.oai.chat_script = proxy.ant.chat_script = script
    ways = ["chat", "chat-stream", "responses", "responses-stream", "messages", "messages-stream"]
    start = threading.Barrier(len(users))
    results: dict[str, Asked] = {}
    failures: list[BaseException] = []

    def run(index: int, user: str) -> None:
        try:
            start.wait(10)
            question = f"I am {user}. Which favourite colour should I paint my room?"
            results[user] = ask(proxy, ways[index % len(ways)], question, user_id=user)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(i, u)) for i, u in enumerate(users)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not failures, failures
    for user in users:
        assert results[user].answer == f"Reply for {user}: noted."
        assert results[user].memory == "injected"

    # Each upstream request's block holds its own user's colour and no other.
    requests = [b for _, b in proxy.oai.requests] + [b for _, b in proxy.ant.requests]
    assert len(requests) == len(users)
    for body in requests:
        text = json.dumps(body)
        user = re.search(r"I am (u\d\d)\.", text)
        assert user is not None
        colours = {c for c in COLOURS if c in text}
        assert colours == {COLOURS[users.index(user.group(1))]}, (user.group(1), colours)

    for user in users:
        messages = stored(mem, f"llm-{user}", 2)
        assert [(m.user_id, m.role, m.content) for m in messages] == [
            (user, "user", f"I am {user}. Which favourite colour should I paint my room?"),
            (user, "assistant", f"Reply for {user}: noted."),
        ]


# -- who is asking -------------------------------------------------------------------------------


@store_free
def test_no_user_is_refused_in_the_providers_shape(mem: Memory, proxy: Proxy) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        ask(proxy, "chat", "Hello?", user_id=None)
    assert raised.value.status_code == 400
    assert "x-stratamem-user-id" in raised.value.message
    assert raised.value.body["type"] == "invalid_request_error"  # type: ignore[index]
    assert raised.value.response.headers[MEMORY] == "off"
    with pytest.raises(openai.BadRequestError, match="no user"):
        ask(proxy, "responses-stream", "Hello?", user_id=None)
    with pytest.raises(anthropic.BadRequestError) as refused:
        ask(proxy, "messages", "Hello?", user_id=None)
    body: Any = refused.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "x-stratamem-user-id" in body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError, match="no user"):
        ask(proxy, "messages-helper", "Hello?", user_id=None)
    assert not proxy.oai.requests and not proxy.ant.requests
    assert mem.llm.flush(5) and mem.sessions.list() == []


@store_free
def test_without_require_user_no_user_is_relayed_without_memory(
    mem: Memory, start_proxy: StartProxy
) -> None:
    seed(mem, "ana", "I am allergic to peanuts.")
    proxy = start_proxy(mem, proxy_require_user=False)
    for way in WAYS:
        asked = ask(proxy, way, "Any snack with peanuts?", user_id=None)
        assert asked.answer == "Noted." and asked.memory == "off"
        assert upstream_of(proxy, way).raw_requests[-1] == proxy.tee.sent[-1]
    # With a user, memory as usual.
    assert ask(proxy, "chat", "Any snack with peanuts?").memory == "injected"
    mem.llm.flush(5)
    assert [s.id for s in mem.sessions.list()] == ["facts-ana", "llm-ana"]
    assert len(mem.messages.list(session_id="llm-ana")) == 2


@store_free
@pytest.mark.parametrize(
    ("headers", "says"),
    [
        ({USER: "two words"}, "user_id"),
        ({USER: "-leading-dash"}, "user_id"),
        ({USER: "u" * 201}, "user_id"),
        ({USER: "ana", SESSION: "a/b c"}, "session_id"),
        ({USER: "ana", PROCESS: "p;q"}, "process_id"),
        ({SESSION: "s-1"}, "need x-stratamem-user-id"),
        ({PROCESS: "p-1"}, "need x-stratamem-user-id"),
    ],
)
def test_invalid_ids_are_refused(
    mem: Memory, proxy: Proxy, headers: dict[str, str], says: str
) -> None:
    client = proxy.openai(user=None, headers=headers)
    with pytest.raises(openai.BadRequestError) as raised:
        ask(proxy, "chat", "Hello?", client=client)
    assert says in raised.value.message
    with pytest.raises(anthropic.BadRequestError) as refused:
        ask(proxy, "messages", "Hello?", client=proxy.anthropic(user=None, headers=headers))
    assert says in refused.value.body["error"]["message"]  # type: ignore[index]
    assert not proxy.oai.requests and not proxy.ant.requests


# -- the provider key ---------------------------------------------------------------------------


def _everything_stored(mem: Memory, db_url: str) -> bytes:
    """Every byte of the store: the SQLite files, or every row of every table."""
    assert mem.llm.flush(10)
    mem.wait(30)
    if not is_postgres(db_url):
        path = Path(db_url.removeprefix("sqlite:///"))
        return b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*"))
    tables = rows(
        db_url,
        "SELECT table_name FROM information_schema.tables "
        "WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'",
    )
    assert len(tables) > 5
    dump = [str(r) for (t,) in tables for r in rows(db_url, f'SELECT t::text FROM "{t}" t')]
    return "\n".join(dump).encode()


def test_the_provider_key_reaches_the_upstream_and_nothing_else(
    mem: Memory, proxy: Proxy, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    for name in list(logging.root.manager.loggerDict):
        caplog.set_level(logging.DEBUG, logger=name)
    seed(mem, "ana", "I am allergic to peanuts.")
    for way in WAYS:
        ask(proxy, way, "Any snack with peanuts?")
    proxy.oai.fail_next(1, 429)
    with pytest.raises(openai.RateLimitError):
        ask(proxy, "chat", "Any snack with peanuts?")
    proxy.ant.fail_next(1, 500)
    with pytest.raises(anthropic.InternalServerError):
        ask(proxy, "messages-stream", "Any snack with peanuts?")
    with pytest.raises(openai.BadRequestError):
        ask(proxy, "chat", "Hello?", user_id="not valid")
    client = proxy.openai()
    assert "gpt-fake" in [m.id for m in client.models.list()]
    client.embeddings.create(model="text-embedding-fake", input="peanuts")

    for headers in proxy.oai.request_headers:
        assert headers["authorization"] == f"Bearer {SECRET}"
    for _, headers in proxy.oai.get_requests:
        assert headers["authorization"] == f"Bearer {SECRET}"
    for headers in proxy.ant.request_headers:
        assert sent_key(headers) == ANTHROPIC_SECRET

    logged = caplog.text + "".join(f"{r.getMessage()}{r.args!r}" for r in caplog.records)
    assert "/v1/chat/completions" in logged  # DEBUG records of the requests were captured
    stored_bytes = _everything_stored(mem, db_url)
    assert b"Any snack with peanuts?" in stored_bytes  # the dump holds the exchanges
    for secret in (SECRET, ANTHROPIC_SECRET, "SECRET123", "SECRET456"):
        assert secret not in logged
        assert secret.encode() not in stored_bytes


@store_free
def test_the_proxys_own_key_replaces_the_callers(mem: Memory, start_proxy: StartProxy) -> None:
    proxy = start_proxy(mem, proxy_upstream_api_key="sk-proxy-OWN")
    ask(proxy, "chat", "Hello?")
    ask(proxy, "responses-stream", "Hello?")
    client = proxy.openai()
    client.models.list()
    client.embeddings.create(model="text-embedding-fake", input="hello")
    for headers in proxy.oai.request_headers:
        assert headers["authorization"] == "Bearer sk-proxy-OWN"
    (_, get_headers) = proxy.oai.get_requests[-1]
    assert get_headers["authorization"] == "Bearer sk-proxy-OWN"

    ask(proxy, "messages", "Hello?")
    ask(proxy, "messages-helper", "Hello?")
    # A caller that sends a bearer token to /v1/messages: dropped, the proxy's key goes.
    bearer = proxy.anthropic(key=None, auth_token="sk-caller-BEARER")
    ask(proxy, "messages", "Hello?", client=bearer)
    for headers in proxy.ant.request_headers:
        assert headers["x-api-key"] == "sk-proxy-OWN"
        assert "authorization" not in headers


# -- memory down: the request is served ---------------------------------------------------------


def _unanswering_socket() -> socket.socket:
    """A port whose connections are accepted (by the kernel) and never answered."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    return sock


@pytest.mark.parametrize("memory_is", ["closed", "hanging"])
def test_memory_down_the_request_goes_upstream_unchanged(
    start_proxy: StartProxy, memory_is: str
) -> None:
    with ExitStack() as stack:
        if memory_is == "closed":
            url = f"http://127.0.0.1:{free_port()}"
        else:
            sock = stack.enter_context(_unanswering_socket())
            url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        remote = Memory(
            url,
            api_key="sm_unreachable_key_0123456789",
            timeout=1.0,
            max_retries=0,
            capture_recall_timeout_ms=300,
        )
        stack.callback(remote.close)
        proxy = start_proxy(remote)
        # Hanging, each captured exchange waits out the memory's timeout when it is stored.
        ways = WAYS if memory_is == "closed" else ("chat-stream", "responses", "messages-helper")
        for way in ways:
            began = time.monotonic()
            asked = ask(proxy, way, "Any snack with peanuts?")
            took = time.monotonic() - began
            assert asked.answer == "Noted." and asked.memory == "skipped"
            assert upstream_of(proxy, way).raw_requests[-1] == proxy.tee.sent[-1]
            assert took < 2.0, f"{way}: {took:.2f} s"


# -- other /v1 paths ----------------------------------------------------------------------------


@store_free
def test_other_v1_paths_are_relayed_unchanged(proxy: Proxy) -> None:
    client = proxy.openai()
    models = client.models.with_raw_response.list()
    assert models.headers[MEMORY] == "off"
    assert [m.id for m in models.parse()] == ["gpt-fake", "gpt-fake-mini", "text-embedding-fake"]
    assert proxy.tee.received[-1] == proxy.oai.answers[-1]

    embedded = client.embeddings.create(
        model="text-embedding-fake", input=["peanuts", "almonds"], dimensions=4
    )
    assert [e.embedding for e in embedded.data] == [
        pytest.approx(fake_vector(t, 4, "text-embedding-fake")) for t in ("peanuts", "almonds")
    ]
    assert proxy.oai.raw_requests[-1] == proxy.tee.sent[-1]
    # No user needed off the memory routes; the query string crosses too.
    r = httpx.get(f"{proxy.url}/v1/models?limit=2&after=x", headers={"Authorization": "Bearer k"})
    assert r.status_code == 200 and r.headers[MEMORY] == "off"
    assert proxy.oai.get_requests[-1][0] == "/v1/models?limit=2&after=x"
    missing = httpx.get(f"{proxy.url}/v1/nothing/here")
    assert missing.status_code == 404 and missing.json()["error"]["message"].startswith(
        "no route GET"
    )  # the upstream's 404, relayed


@store_free
def test_no_upstream_is_a_501_naming_the_setting(mem: Memory, start_proxy: StartProxy) -> None:
    proxy = start_proxy(mem, proxy_upstream=None, proxy_anthropic_upstream=None)
    with pytest.raises(openai.APIStatusError) as raised:
        ask(proxy, "chat", "Hello?")
    assert raised.value.status_code == 501
    assert "STRATAMEM_PROXY_UPSTREAM" in raised.value.message
    with pytest.raises(anthropic.APIStatusError) as refused:
        ask(proxy, "messages", "Hello?")
    assert refused.value.status_code == 501
    message = refused.value.body["error"]["message"]  # type: ignore[index]
    assert "STRATAMEM_PROXY_ANTHROPIC_UPSTREAM" in message
    r = httpx.get(f"{proxy.url}/v1/models")
    assert r.status_code == 501 and "STRATAMEM_PROXY_UPSTREAM" in r.json()["error"]["message"]


@store_free
def test_serve_without_a_proxy_upstream_says_which_setting(mem: Memory) -> None:
    """``stratamem serve`` mounts /v1 always; unconfigured, it says how to configure it."""
    settings = load_server_settings()
    with InProcessServer(create_app(mem, settings)) as server:
        r = httpx.post(
            f"{server.url}/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            headers={USER: "ana", KEY: "whatever"},
        )
    assert r.status_code == 501
    assert "STRATAMEM_PROXY_UPSTREAM" in r.json()["error"]["message"]


# -- plain curl ---------------------------------------------------------------------------------


def _curl(*args: str) -> bytes:
    curl = shutil.which("curl")
    if curl is None:
        pytest.fail("curl is not installed (Debian: apt-get install curl; .ci/tools.sh does)")
    done = subprocess.run(
        [curl, "-sS", "--max-time", "30", *args], capture_output=True, timeout=60, check=True
    )
    return done.stdout


@store_free
def test_curl(mem: Memory, proxy: Proxy) -> None:
    seed(mem, "ana", "I am allergic to peanuts.")
    body = {"model": "gpt-fake", "messages": [{"role": "user", "content": "Snack with peanuts?"}]}
    common = [
        "-H",
        "Content-Type: application/json",
        "-H",
        f"Authorization: Bearer {SECRET}",
        "-H",
        f"{USER}: ana",
    ]
    plain = _curl("-i", f"{proxy.url}/v1/chat/completions", *common, "-d", json.dumps(body))
    head, _, payload = plain.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert b"x-stratamem-memory: injected" in head.lower()
    assert json.loads(payload)["choices"][0]["message"]["content"] == "Noted."
    assert payload == proxy.oai.answers[-1]

    proxy.oai.chat_replies.append("Try almond cookies.")
    streamed = _curl(
        "-N",
        f"{proxy.url}/v1/chat/completions",
        *common,
        "-d",
        json.dumps({**body, "stream": True}),
    )
    assert streamed == proxy.oai.answers[-1]
    events = [line[6:] for line in streamed.decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    pieces = [json.loads(e)["choices"][0]["delta"].get("content") for e in events[:-1]]
    assert "".join(p or "" for p in pieces) == "Try almond cookies."
    assert [m.content for m in stored(mem, "llm-ana", 4)][-1] == "Try almond cookies."


# -- stratamem proxy, the command ---------------------------------------------------------------


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("STRATAMEM_")}


def test_the_proxy_command(tmp_path: Path, oai: FakeOpenAIServer, ant: FakeAnthropicServer) -> None:
    port = free_port()
    db = tmp_path / "proxy.db"
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    cmd = [
        sys.executable,
        "-m",
        "stratamem",
        "-v",
        "--embedder",
        "hash",
        "proxy",
        "--upstream",
        oai.base_url,
        "--anthropic-upstream",
        ant.base_url,
        "--port",
        str(port),
        "--database-url",
        f"sqlite:///{db}",
    ]
    env = {**_env(), "STRATAMEM_CAPTURE_RECALL_TIMEOUT_MS": "10000"}
    with open(out, "wb") as o, open(err, "wb") as e:
        proc = subprocess.Popen(cmd, stdout=o, stderr=e, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, err.read_text()
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, err.read_text()
            time.sleep(0.1)
        proxy = Proxy(url, None, oai, ant)
        oai.chat_replies.append("Your cat is called Miso.")
        first = ask(proxy, "chat", "My cat is called Miso. What is my cat called?")
        assert first.answer == "Your cat is called Miso." and first.memory == "none"
        # Stored at once by the proxy's capture; the next call recalls it.
        deadline = time.monotonic() + 10
        while True:
            second = ask(proxy, "chat-stream", "Remind me: what is my cat called?")
            if second.memory == "injected" or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert second.memory == "injected"
        assert "Miso" in block_of(
            oai.chat_requests()[-1]["messages"][-1]["content"], "Remind me: what is my cat called?"
        )
        assert ask(proxy, "messages-helper", "Hello Claude?").answer == "Noted."
        refused = httpx.post(f"{url}/v1/chat/completions", json={"model": "m", "messages": []})
        assert refused.status_code == 400
    finally:
        proc.terminate()
        # SIGTERM: uvicorn stops, the proxy stores what it captured, the Memory closes.
        assert proc.wait(30) == 0
    logs = out.read_text() + err.read_text()
    assert f"stratamem proxy on http://127.0.0.1:{port}" in logs
    # The access log: one JSON line a request, the route's template, never a header.
    assert '"method": "POST", "path": "/v1/chat/completions", "status": 200' in logs
    with Memory(f"sqlite:///{db}", embedder="hash", workers=0) as mem:
        messages = mem.messages.list(user_id="ana", limit=100)
        assert {m.content for m in messages} >= {
            "My cat is called Miso. What is my cat called?",
            "Your cat is called Miso.",
            "Hello Claude?",
        }
    data = b"".join(p.read_bytes() for p in tmp_path.glob("proxy.db*"))
    for secret in (SECRET, ANTHROPIC_SECRET):
        assert secret not in logs
        assert secret.encode() not in data


def test_the_proxy_command_needs_an_upstream(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "stratamem", "proxy", "--database-url", str(tmp_path / "m.db")],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=60,
    )
    assert done.returncode == 2
    assert "--upstream URL (or STRATAMEM_PROXY_UPSTREAM)" in done.stderr


# -- stratamem serve --proxy-upstream: a project per stratamem key ------------------------------

ADMIN = "admin-proxy-tests-0123456789"


@dataclass
class Served:
    proc: ServerProcess
    oai: FakeOpenAIServer
    ant: FakeAnthropicServer
    key: str
    other_key: str

    def proxy(self) -> Proxy:
        return Proxy(self.proc.url, None, self.oai, self.ant)

    def api(self, key: str) -> httpx.Client:
        return httpx.Client(
            base_url=self.proc.url, headers={"Authorization": f"Api-Key {key}"}, timeout=30
        )


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, module_db_url: str) -> Iterator[Served]:
    with FakeOpenAIServer() as oai, FakeAnthropicServer() as ant:
        proc = ServerProcess(
            tmp_path_factory.mktemp("proxy-serve"),
            db_url=module_db_url,
            env={"STRATAMEM_ADMIN_TOKEN": ADMIN, "STRATAMEM_CAPTURE_RECALL_TIMEOUT_MS": "10000"},
        ).start("--proxy-upstream", oai.base_url, "--proxy-anthropic-upstream", ant.base_url)
        try:
            admin = {"Authorization": f"Bearer {ADMIN}"}
            with httpx.Client(base_url=proc.url, headers=admin, timeout=30) as a:
                created = a.post("/admin/projects", json={"name": "other", "project_id": "other"})
                assert created.status_code == 201, created.text
                r = a.post("/admin/projects/other/keys", json={"name": "proxy tests"})
                assert r.status_code == 201, r.text
                other = str(r.json()["data"]["secret"])
            yield Served(proc, oai, ant, proc.bootstrap_key(), other)
        finally:
            assert proc.stop() == 0


@pytest.fixture
def fresh(served: Served) -> Served:
    for fake in (served.oai, served.ant):
        fake.requests.clear()
        fake.raw_requests.clear()
        fake.request_headers.clear()
        fake.answers.clear()
        fake.chat_replies.clear()
        fake.chat_script = lambda body: "Noted."
    return served


@pytest.mark.parametrize(
    ("key", "says"),
    [(None, "send the stratamem project key"), ("sm_wrong_key_0123456789abcdef", "invalid")],
)
def test_serve_refuses_a_missing_or_wrong_stratamem_key(
    fresh: Served, key: str | None, says: str
) -> None:
    proxy = fresh.proxy()
    headers = {} if key is None else {KEY: key}
    with pytest.raises(openai.AuthenticationError) as raised:
        ask(proxy, "chat", "Hello?", client=proxy.openai(headers=headers))
    assert raised.value.status_code == 401 and says in raised.value.message
    assert raised.value.body["type"] == "authentication_error"  # type: ignore[index]
    with pytest.raises(anthropic.AuthenticationError) as refused:
        ask(proxy, "messages-stream", "Hello?", client=proxy.anthropic(headers=headers))
    body: Any = refused.value.body
    assert body["type"] == "error" and body["error"]["type"] == "authentication_error"
    assert says in body["error"]["message"]
    assert not fresh.oai.requests and not fresh.ant.requests


def test_serve_keeps_each_projects_memory(fresh: Served) -> None:
    proxy = fresh.proxy()
    with fresh.api(fresh.key) as api:
        r = api.post(
            "/api/sessions/facts-ana/messages",
            json={
                "user_id": "ana",
                "messages": [{"role": "user", "content": "I am allergic to peanuts."}],
                "sync": True,
            },
        )
        assert r.status_code in (200, 201), r.text

    mine = proxy.openai(headers={KEY: fresh.key})
    fresh.oai.chat_replies.append("Try almond cookies.")
    asked = ask(proxy, "chat-stream", "Any snack with peanuts?", client=mine)
    assert asked.memory == "injected" and asked.answer == "Try almond cookies."
    assert "allergic to peanuts" in block_of(
        fresh.oai.chat_requests()[-1]["messages"][-1]["content"], "Any snack with peanuts?"
    )
    assert not [h for h in fresh.oai.request_headers[-1] if h.startswith("x-stratamem")]
    assert fresh.oai.request_headers[-1]["authorization"] == f"Bearer {SECRET}"

    # Another project's key, the same user id: that project's memory, which is empty.
    theirs = proxy.anthropic(headers={KEY: fresh.other_key})
    asked = ask(proxy, "messages", "Any snack with peanuts?", client=theirs)
    assert asked.memory == "none"
    assert fresh.ant.message_requests()[-1]["messages"][-1]["content"] == "Any snack with peanuts?"

    def session(key: str) -> list[tuple[str, str]]:
        deadline = time.monotonic() + 10
        with fresh.api(key) as api:
            while True:
                r = api.get("/api/sessions/llm-ana/messages")
                found = r.json()["data"]["items"] if r.status_code == 200 else []
                if len(found) >= 2 or time.monotonic() > deadline:
                    return [(m["role"], m["content"]) for m in found]
                time.sleep(0.05)

    assert session(fresh.key) == [
        ("user", "Any snack with peanuts?"),
        ("assistant", "Try almond cookies."),
    ]
    assert session(fresh.other_key) == [
        ("user", "Any snack with peanuts?"),
        ("assistant", "Noted."),
    ]
    logs = fresh.proc.stdout() + fresh.proc.stderr()
    assert SECRET not in logs and ANTHROPIC_SECRET not in logs


@store_free
def test_serve_and_proxy_hand_the_gil_over_quickly_and_freeze_start_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The commands' runner prepares the process before the server starts. It sets the
    switch interval: a recall's thread hands the GIL back at every SQLite step and model
    run, and behind a busy event loop Python's default 5 ms per handback made a 5 ms recall
    take half a second. And it freezes what start-up left alive (gc.freeze): a full
    collection no longer walks it, which stopped every thread, recalls included, for ~70 ms
    at each pass (docs/server.md#garbage-collection)."""
    import os
    import signal

    import uvicorn

    from stratamem import cli

    seen: list[tuple[float, int]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "lifespan"
        await receive()
        seen.append((sys.getswitchinterval(), gc.get_freeze_count()))
        await send({"type": "lifespan.startup.complete"})
        os.kill(os.getpid(), signal.SIGTERM)  # stop as a supervisor does
        await receive()
        await send({"type": "lifespan.shutdown.complete"})

    monkeypatch.setenv("STRATAMEM_SWITCH_INTERVAL_MS", "0.3")
    held = [{"n": i} for i in range(20_000)]  # start-up's objects, alive for the process
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    before = sys.getswitchinterval()
    try:
        settings = load_server_settings(port=free_port())
        with pytest.raises(SystemExit) as stopped:
            cli._run(uvicorn, app, settings)
        assert stopped.value.code == 0
    finally:
        sys.setswitchinterval(before)
        gc.unfreeze()  # this test process goes on collecting as before
    assert len(seen) == 1
    assert seen[0][0] == pytest.approx(0.0003)
    assert seen[0][1] >= len(held)
    assert load_server_settings().switch_interval_ms == 0.3
    monkeypatch.delenv("STRATAMEM_SWITCH_INTERVAL_MS")
    assert load_server_settings().switch_interval_ms == 0.2


def _answers_closed(app: Any, timeout: float = 5.0) -> None:
    """Wait until the proxy has closed every upstream answer (and so handed its connection
    back): that comes a moment after its client has read the last chunk."""
    deadline = time.monotonic() + timeout
    while any(p.in_flight for p in app.state.proxy._transports) and time.monotonic() < deadline:
        time.sleep(0.005)


@store_free
def test_upstream_connections_stay_warm_when_calm_and_spread_under_load(
    mem: Memory, oai: FakeOpenAIServer, ant: FakeAnthropicServer
) -> None:
    """One upstream pool's bookkeeping grows with its connections (httpcore walks them all
    on every request), so concurrent answers are spread over several pools; calls one at a
    time keep reusing one warm connection (a provider's TLS handshake is not free)."""
    settings = load_server_settings(
        proxy_upstream=oai.base_url, proxy_anthropic_upstream=ant.base_url
    )
    app = create_proxy_app(mem, settings)
    with InProcessServer(app) as server:
        proxy = Proxy(server.url, mem, oai, ant)
        for i in range(4):
            assert ask(proxy, "chat", f"Calm question {i}?", session_id="calm").answer
            _answers_closed(app)  # one at a time
        assert oai.open_connections == 1

        pools = app.state.proxy._transports
        at_once = 12  # more than one pool takes before the next is used
        seen: list[list[int]] = []
        # Every answer is in flight in the proxy when the last request arrives.
        together = threading.Barrier(
            at_once, action=lambda: seen.append([p.in_flight for p in pools])
        )

        def script(body: dict[str, Any]) -> str:
            together.wait(30)
            return "one two three"

        oai.chat_script = script
        answers: list[str] = []
        failures: list[BaseException] = []

        def run(i: int) -> None:
            try:
                answers.append(ask(proxy, "chat-stream", f"Busy {i}?", session_id=f"b{i}").answer)
            except BaseException as exc:
                failures.append(exc)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(at_once)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not failures, failures
        assert answers == ["one two three"] * at_once
        [counts] = seen
        # About 8 in the first pool, the rest in the next: a pool is chosen by its count
        # before the request is counted in it, so two chosen together may make it 9.
        assert sum(counts) == at_once and 8 <= counts[0] < at_once and counts[1] > 0, counts
        _answers_closed(app)
        assert [p.in_flight for p in pools] == [0] * len(pools)  # every answer closed


@store_free
def test_serve_and_proxy_keep_idle_connections_longer_than_clients_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The commands' runner keeps an idle connection ``keep_alive_s`` (75 s by default),
    longer than httpx's 5 s, so the client closes first: at uvicorn's 5 s both ends timed
    out together and a call sent on a connection the server was closing failed. Checked
    with the setting at 1 s: the connection is still open after a request and closed by
    the server past its bound."""
    import os
    import signal

    import uvicorn

    from stratamem import cli

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await receive()
            await send({"type": "lifespan.startup.complete"})
            await receive()
            await send({"type": "lifespan.shutdown.complete"})
            return
        headers = [(b"content-length", b"2")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"ok"})

    port = free_port()
    seen: dict[str, Any] = {}

    def client() -> None:
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    conn = socket.create_connection(("127.0.0.1", port), timeout=5)
                    break
                except OSError:
                    assert time.monotonic() < deadline
                    time.sleep(0.05)
            with conn:
                request = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"

                def answer() -> bytes:
                    conn.sendall(request)
                    got = b""
                    while not got.endswith(b"\r\n\r\nok"):
                        piece = conn.recv(4096)
                        assert piece, got
                        got += piece
                    return got

                seen["answer"] = answer()
                time.sleep(0.3)  # idle, within the bound: still open
                seen["again"] = answer()
                start = time.monotonic()
                seen["closed"] = conn.recv(4096)  # b"" once the server closes it
                seen["idle_s"] = time.monotonic() - start
        except BaseException as exc:
            seen["error"] = exc
        finally:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setenv("STRATAMEM_KEEP_ALIVE_S", "1")
    settings = load_server_settings(port=port)
    thread = threading.Thread(target=client)
    before = sys.getswitchinterval()
    thread.start()
    try:
        with pytest.raises(SystemExit):
            cli._run(uvicorn, app, settings)
    finally:
        sys.setswitchinterval(before)
        gc.unfreeze()  # the runner froze this test process's heap
        thread.join(30)
    assert "error" not in seen, seen
    assert seen["answer"].startswith(b"HTTP/1.1 200") and seen["again"].startswith(b"HTTP/1.1 200")
    assert seen["closed"] == b"" and 0.5 < seen["idle_s"] < 5, seen
    monkeypatch.delenv("STRATAMEM_KEEP_ALIVE_S")
    assert load_server_settings().keep_alive_s == 75
