"""mem.llm with the real google-genai SDK against a loopback fake Gemini server: recall
injected into ``config.system_instruction`` before, the exchange captured after, sync and
async, plain and streamed, fail-open, attribution by scope."""

from __future__ import annotations

import asyncio
import copy
import functools
import gc
import inspect
import json
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types

from fakes.google_server import FakeGeminiServer
from stratamem import Memory
from stratamem.capture import MEMORY_PREAMBLE

COOK = "You are a helpful cook."
QUESTION = "Suggest a snack with peanuts?"


@pytest.fixture(autouse=True)
def _no_google_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # GOOGLE_API_KEY, GOOGLE_GENAI_USE_VERTEXAI, GOOGLE_GENAI_API_VERSION... would change
    # where the SDK sends the requests.
    for key in list(os.environ):
        if key.startswith(("GOOGLE_", "GEMINI_")):
            monkeypatch.delenv(key)


@pytest.fixture
def server() -> Iterator[FakeGeminiServer]:
    with FakeGeminiServer() as s:
        s.chat_script = lambda body: "Noted!"
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


def _client(server: FakeGeminiServer) -> genai.Client:
    return genai.Client(
        api_key="k",
        vertexai=False,
        http_options=types.HttpOptions(base_url=server.base_url, api_version="v1beta"),
    )


def _stored(mem: Memory, session_id: str) -> list[tuple[str, str]]:
    assert mem.llm.flush(5)
    return [(m.role, m.content) for m in mem.messages.list(session_id=session_id)]


def _capture(mem: Memory, session_id: str) -> dict[str, Any]:
    """The capture metadata of the last stored message of the session."""
    assert mem.llm.flush(5)
    return mem.messages.list(session_id=session_id)[-1].metadata["capture"]


def _system_texts(body: dict[str, Any]) -> list[str]:
    return [p.get("text", "") for p in body["systemInstruction"]["parts"]]


def _user(text: str) -> dict[str, Any]:
    return {"parts": [{"text": text}], "role": "user"}


# -- registration ------------------------------------------------------------------------


def test_register_wraps_both_surfaces_and_is_reversible(
    mem: Memory, server: FakeGeminiServer
) -> None:
    client = _client(server)
    assert mem.llm.register(client) is client
    assert mem.llm.register(client) is client  # twice: a no-op
    for models in (client.models, client.aio.models):
        assert {"generate_content", "generate_content_stream"} <= set(vars(models))
    mem.llm.unregister(client)
    for models in (client.models, client.aio.models):
        assert not {"generate_content", "generate_content_stream"} & set(vars(models))
    reply = client.models.generate_content(model="gemini-test", contents="hi")
    assert reply.text == "Noted!"
    with pytest.raises(TypeError, match=r"google\.genai\.Client"):
        mem.llm.register(object())


# -- sync, plain -------------------------------------------------------------------------


def test_recall_is_injected_and_the_exchange_captured(
    mem: Memory, server: FakeGeminiServer
) -> None:
    server.model_version = "gemini-test-001"
    client = mem.llm.register(_client(server))
    with mem.scope(user_id="ana", session_id="chat"):
        reply = client.models.generate_content(model="gemini-test", contents=QUESTION)
    assert reply.text == "Noted!"
    assert server.generate_paths()[-1] == "/v1beta/models/gemini-test:generateContent"
    body = server.generate_requests()[-1]
    (system,) = _system_texts(body)
    assert system.startswith(MEMORY_PREAMBLE) and "allergic to peanuts" in system
    assert body["contents"] == [_user(QUESTION)]
    stored = _stored(mem, "chat")
    assert stored[-2:] == [("user", QUESTION), ("assistant", "Noted!")]
    capture = _capture(mem, "chat")
    assert capture["provider"] == "google" and capture["model"] == "gemini-test-001"
    assert capture["usage"]["total_token_count"] > 0 and capture["latency_ms"] >= 0
    assert "partial" not in capture and "error" not in capture
    # The injected block is not stored as something the user said.
    assert all(MEMORY_PREAMBLE not in c for _, c in stored)


_CONFIGS: dict[str, Callable[[], Any]] = {
    "pydantic-str": lambda: types.GenerateContentConfig(system_instruction=COOK, temperature=0.25),
    "dict-str": lambda: {"system_instruction": COOK, "temperature": 0.25},
    "content": lambda: types.GenerateContentConfig(
        system_instruction=types.Content(parts=[types.Part(text=COOK)]), temperature=0.25
    ),
    "part": lambda: types.GenerateContentConfig(system_instruction=types.Part(text=COOK)),
    "list": lambda: {"system_instruction": [COOK, types.Part(text="Be brief.")]},
    "content-dict": lambda: {"system_instruction": {"parts": [{"text": COOK}]}},
}


_EARLIER = [_user("Hi there"), {"parts": [{"text": "Hello! What shall we cook?"}], "role": "model"}]
_CONTENTS: dict[str, tuple[Callable[[], Any], list[dict[str, Any]]]] = {
    # contents as the caller writes them -> the turns before the last one, as sent
    "string": (lambda: QUESTION, []),
    "strings": (lambda: ["Hi there", QUESTION], []),  # bare parts: one user turn
    "content": (lambda: types.Content(role="user", parts=[types.Part(text=QUESTION)]), []),
    "dicts": (
        lambda: [
            {"role": "user", "parts": [{"text": "Hi there"}]},
            {"role": "model", "parts": [{"text": "Hello! What shall we cook?"}]},
            {"role": "user", "parts": [{"text": QUESTION}]},
        ],
        _EARLIER,
    ),
    "contents-then-parts": (
        lambda: [
            types.Content(role="user", parts=[types.Part(text="Hi there")]),
            types.Content(role="model", parts=[types.Part(text="Hello! What shall we cook?")]),
            types.Part(text=QUESTION),
        ],
        _EARLIER,
    ),
    "list-in-list": (lambda: [[QUESTION]], []),
}


@pytest.mark.parametrize("form", list(_CONTENTS))
def test_by_default_memory_is_the_last_user_turns_last_part(
    make_memory: Any, server: FakeGeminiServer, form: str
) -> None:
    mem = make_memory(capture_injection="user")
    mem.sessions.create(user_id="ana", session_id="chat").add_messages(
        [{"role": "user", "content": "I am allergic to peanuts."}], sync=True
    )
    client = mem.llm.register(_client(server))
    make, earlier = _CONTENTS[form]
    contents = make()
    before = copy.deepcopy(contents)
    with mem.scope(user_id="ana", session_id="chat"):
        client.models.generate_content(
            model="gemini-test", contents=contents, config={"system_instruction": COOK}
        )
    assert contents == before  # the caller's objects are untouched
    body = server.generate_requests()[-1]
    assert _system_texts(body) == [COOK]
    *sent_earlier, last = body["contents"]
    assert sent_earlier == earlier and last["role"] == "user"
    *asked, block = [p["text"] for p in last["parts"]]
    assert asked[-1] == QUESTION
    assert block.startswith(MEMORY_PREAMBLE) and "allergic to peanuts" in block


@pytest.mark.parametrize("form", list(_CONFIGS))
def test_the_callers_system_instruction_is_kept_and_nothing_of_theirs_changes(
    mem: Memory, server: FakeGeminiServer, form: str
) -> None:
    client = mem.llm.register(_client(server))
    config = _CONFIGS[form]()
    contents = [
        types.Content(role="user", parts=[types.Part(text="Hi there")]),
        types.Content(role="model", parts=[types.Part(text="Hello! What shall we cook?")]),
        types.Content(role="user", parts=[types.Part(text=QUESTION)]),
    ]
    config_before, contents_before = copy.deepcopy(config), copy.deepcopy(contents)
    instruction = (
        config["system_instruction"] if isinstance(config, dict) else config.system_instruction
    )
    with mem.scope(user_id="ana", session_id="chat"):
        client.models.generate_content(model="gemini-test", contents=contents, config=config)
    # The caller's objects are untouched, down to the instruction object itself.
    assert config == config_before and contents == contents_before
    now = config["system_instruction"] if isinstance(config, dict) else config.system_instruction
    assert now is instruction
    body = server.generate_requests()[-1]
    texts = _system_texts(body)
    assert texts[0].startswith(COOK)
    merged = "\n".join(texts)
    assert merged.index(COOK) < merged.index(MEMORY_PREAMBLE)
    assert "allergic to peanuts" in merged
    if form == "list":
        assert texts[1] == "Be brief."
    if form in ("pydantic-str", "dict-str", "content"):  # the rest of the config is kept
        assert body["generationConfig"]["temperature"] == 0.25
    assert [c["parts"][0]["text"] for c in body["contents"]] == [
        "Hi there",
        "Hello! What shall we cook?",
        QUESTION,
    ]
    assert _stored(mem, "chat")[-2:] == [("user", QUESTION), ("assistant", "Noted!")]


@pytest.mark.parametrize(
    ("contents", "asked"),
    [
        (["Two parts", "of one turn"], "Two parts\nof one turn"),
        (types.Part(text="A bare part"), "A bare part"),
        (
            [
                {"role": "user", "parts": [{"text": "first"}]},
                {"role": "model", "parts": [{"text": "answer"}]},
                {"role": "user", "parts": [{"text": "second"}]},
            ],
            "second",
        ),
        (
            [
                types.Content(role="user", parts=[types.Part(text="Weather in Paris?")]),
                types.Content(
                    role="model",
                    parts=[types.Part.from_function_call(name="weather", args={"c": "Paris"})],
                ),
                types.Content(
                    role="user",
                    parts=[types.Part.from_function_response(name="weather", response={"t": 20})],
                ),
            ],
            "Weather in Paris?",  # a turn of function responses is not the user asking
        ),
    ],
    ids=["list-of-str", "part", "dicts", "function-response-last"],
)
def test_the_query_is_the_last_user_turn(
    mem: Memory, server: FakeGeminiServer, contents: Any, asked: str
) -> None:
    client = mem.llm.register(_client(server))
    with mem.scope(user_id="ana", session_id="forms"):
        client.models.generate_content(model="gemini-test", contents=contents)
    assert ("user", asked) in _stored(mem, "forms")


def test_no_user_in_scope_means_the_call_is_untouched(
    make_memory: Any, server: FakeGeminiServer
) -> None:
    mem = make_memory()
    client = mem.llm.register(_client(server))
    config = types.GenerateContentConfig(system_instruction=COOK)
    client.models.generate_content(model="gemini-test", contents="hi", config=config)
    body = server.generate_requests()[-1]
    assert _system_texts(body) == [COOK]
    assert body["contents"] == [_user("hi")]
    stream = client.models.generate_content_stream(model="gemini-test", contents="hi")
    assert inspect.isgenerator(stream)  # the SDK's own generator, not wrapped
    assert "".join(c.text or "" for c in stream) == "Noted!"
    assert mem.llm.flush(5) and mem.llm.written == 0


def test_history_is_injected_as_earlier_turns_not_already_sent(
    make_memory: Any, server: FakeGeminiServer
) -> None:
    mem = make_memory(capture_inject_history=True)
    s = mem.sessions.create(user_id="ana", session_id="chat")
    s.add_messages(
        [
            {"role": "user", "content": "I am allergic to peanuts."},
            {"role": "assistant", "content": "Noted, no peanuts."},
        ],
        sync=True,
    )
    client = mem.llm.register(_client(server))
    with mem.scope(user_id="ana", session_id="chat"):
        client.models.generate_content(model="gemini-test", contents="What can I snack on?")
        sent = server.generate_requests()[-1]["contents"]
        assert sent == [
            {"parts": [{"text": "I am allergic to peanuts."}], "role": "user"},
            {"parts": [{"text": "Noted, no peanuts."}], "role": "model"},
            _user("What can I snack on?"),
        ]
        # Turns the caller sends already are not sent twice.
        mine = [
            {"role": "user", "parts": [{"text": "I am allergic to peanuts."}]},
            {"role": "user", "parts": [{"text": "And for dinner?"}]},
        ]
        client.models.generate_content(model="gemini-test", contents=mine)
        sent = [c["parts"][0]["text"] for c in server.generate_requests()[-1]["contents"]]
        assert sent.count("I am allergic to peanuts.") == 1
        assert sent[-1] == "And for dinner?"


def test_function_calls_are_captured(mem: Memory, server: FakeGeminiServer) -> None:
    client = mem.llm.register(_client(server))
    call = {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}
    server.chat_replies.extend([call, call])
    with mem.scope(user_id="ana", session_id="tools"):
        reply = client.models.generate_content(model="gemini-test", contents="Weather?")
        assert reply.function_calls[0].name == "get_weather"
        chunks = list(
            client.models.generate_content_stream(model="gemini-test", contents="And now?")
        )
        assert chunks[-1].function_calls[0].args == {"city": "Paris"}
    assert mem.llm.flush(5)
    answers = [m for m in mem.messages.list(session_id="tools") if m.role == "assistant"]
    assert len(answers) == 2
    for answer in answers:
        (captured,) = answer.metadata["capture"]["tool_calls"]
        assert captured["name"] == "get_weather"
        assert json.loads(captured["arguments"]) == {"city": "Paris"}
        assert answer.content.startswith("[tool call] get_weather(")


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_provider_errors_reach_the_caller_and_are_captured(
    mem: Memory, server: FakeGeminiServer, stream: bool
) -> None:
    client = mem.llm.register(_client(server))
    server.fail_next(1, status=400)
    with mem.scope(user_id="ana", session_id="chat"), pytest.raises(genai_errors.ClientError):
        if stream:  # nothing is sent before the first chunk is asked for
            list(client.models.generate_content_stream(model="gemini-test", contents="fails"))
        else:
            client.models.generate_content(model="gemini-test", contents="fails")
    assert mem.llm.flush(5)
    failed = [m for m in mem.messages.list(session_id="chat") if m.content == "fails"]
    assert failed and "ClientError" in failed[0].metadata["capture"]["error"]


# -- sync, streamed ----------------------------------------------------------------------


def test_stream_is_injected_passed_through_and_captured(
    mem: Memory, server: FakeGeminiServer
) -> None:
    server.chat_script = lambda body: "Try roasted chickpeas instead."
    client = mem.llm.register(_client(server))
    with mem.scope(user_id="ana", session_id="chat"):
        stream = client.models.generate_content_stream(model="gemini-test", contents=QUESTION)
        texts = [chunk.text for chunk in stream]
    assert len(texts) > 1 and "".join(texts) == "Try roasted chickpeas instead."
    assert server.generate_paths()[-1].endswith(":streamGenerateContent?alt=sse")
    (system,) = _system_texts(server.generate_requests()[-1])
    assert system.startswith(MEMORY_PREAMBLE) and "allergic to peanuts" in system
    assert _stored(mem, "chat")[-2:] == [
        ("user", QUESTION),
        ("assistant", "Try roasted chickpeas instead."),
    ]
    capture = _capture(mem, "chat")
    assert capture["model"] == "gemini-test" and capture["usage"]["total_token_count"] > 0
    assert "partial" not in capture and "error" not in capture


@pytest.mark.parametrize("how", ["close", "drop"])
def test_a_stream_left_early_is_captured_as_partial(
    mem: Memory, server: FakeGeminiServer, how: str
) -> None:
    server.chat_script = lambda body: "one two three four five six"
    client = mem.llm.register(_client(server))
    with mem.scope(user_id="ana", session_id="early"):
        stream = client.models.generate_content_stream(model="gemini-test", contents="Count")
        for _chunk in stream:
            break
        if how == "close":
            stream.close()
        else:
            del stream, _chunk
            gc.collect()
    assert _stored(mem, "early") == [("user", "Count"), ("assistant", "one")]
    capture = _capture(mem, "early")
    assert capture["partial"] is True and "error" not in capture


def test_a_stream_left_at_its_finish_reason_is_captured_whole(
    mem: Memory, server: FakeGeminiServer
) -> None:
    server.chat_script = lambda body: "one two three"
    client = mem.llm.register(_client(server))
    with mem.scope(user_id="ana", session_id="whole"):
        stream = client.models.generate_content_stream(model="gemini-test", contents="Count")
        for chunk in stream:
            if chunk.candidates and chunk.candidates[0].finish_reason is not None:
                break
        stream.close()
    assert _stored(mem, "whole") == [("user", "Count"), ("assistant", "one two three")]
    assert "partial" not in _capture(mem, "whole")


def test_a_stream_broken_mid_way_raises_to_the_caller_and_is_captured(
    mem: Memory, server: FakeGeminiServer
) -> None:
    server.chat_script = lambda body: "one two three four"
    server.fail_stream_after(2)
    client = mem.llm.register(_client(server))
    seen: list[str] = []
    with mem.scope(user_id="ana", session_id="broken"), pytest.raises(Exception) as caught:
        for chunk in client.models.generate_content_stream(model="gemini-test", contents="Go"):
            seen.append(chunk.text)
    assert not type(caught.value).__module__.startswith("stratamem")  # the SDK's own error
    assert seen == ["one", " two"]
    assert _stored(mem, "broken") == [("user", "Go"), ("assistant", "one two")]
    capture = _capture(mem, "broken")
    assert type(caught.value).__name__ in capture["error"] and "partial" not in capture


# -- async -------------------------------------------------------------------------------


def test_async_plain_and_stream(mem: Memory, server: FakeGeminiServer) -> None:
    client = mem.llm.register(_client(server))

    async def scenario() -> None:
        async def ask(user: str) -> str | None:
            with mem.scope(user_id=user, session_id=f"{user}-async"):
                r = await client.aio.models.generate_content(
                    model="gemini-test", contents=f"hello from {user}: peanuts?"
                )
            return r.text

        async def ask_stream(user: str) -> str:
            with mem.scope(user_id=user, session_id=f"{user}-stream"):
                stream = await client.aio.models.generate_content_stream(
                    model="gemini-test", contents=f"stream for {user}: peanuts?"
                )
                return "".join([c.text or "" async for c in stream])

        assert await asyncio.gather(ask("ana"), ask("cy")) == ["Noted!", "Noted!"]
        assert await asyncio.gather(ask_stream("ana"), ask_stream("cy")) == ["Noted!"] * 2
        await client.aio.aclose()

    asyncio.run(scenario())
    systems = {
        body["contents"][-1]["parts"][0]["text"]: "\n".join(_system_texts(body))
        if "systemInstruction" in body
        else ""
        for body in server.generate_requests()
    }
    assert "allergic to peanuts" in systems["hello from ana: peanuts?"]
    assert systems["stream for ana: peanuts?"].startswith(MEMORY_PREAMBLE)
    # ana's memory never goes into cy's calls, however the two interleave.
    cy = systems["hello from cy: peanuts?"] + systems["stream for cy: peanuts?"]
    assert "allergic" not in cy and "ana" not in cy
    assert _stored(mem, "ana-async") == [
        ("user", "hello from ana: peanuts?"),
        ("assistant", "Noted!"),
    ]
    assert ("user", "hello from cy: peanuts?") in _stored(mem, "cy-async")
    assert _stored(mem, "ana-stream") == [
        ("user", "stream for ana: peanuts?"),
        ("assistant", "Noted!"),
    ]
    assert "partial" not in _capture(mem, "ana-stream")


def test_streams_are_the_sdks_generators(mem: Memory, server: FakeGeminiServer) -> None:
    """``generate_content_stream`` gives a generator (an async generator on ``client.aio``);
    a registered client's is one too, to ``isinstance`` and ``inspect``."""
    client = mem.llm.register(_client(server))
    with mem.scope(user_id="ana", session_id="types"):
        stream = client.models.generate_content_stream(model="gemini-test", contents=QUESTION)
        assert inspect.isgenerator(stream) and not inspect.isgeneratorfunction(stream)
        assert type(stream).__name__ != "generator"  # the capturing proxy
        assert "".join(c.text or "" for c in stream) == "Noted!"

    async def scenario() -> str:
        with mem.scope(user_id="ana", session_id="types"):
            stream = await client.aio.models.generate_content_stream(
                model="gemini-test", contents=QUESTION
            )
            assert inspect.isasyncgen(stream)
            assert type(stream).__name__ != "async_generator"
            text = "".join([c.text or "" async for c in stream])
        await client.aio.aclose()
        return text

    assert asyncio.run(scenario()) == "Noted!"
    assert _stored(mem, "types") == [("user", QUESTION), ("assistant", "Noted!")] * 2


@pytest.mark.parametrize("how", ["aclose", "drop"])
def test_an_async_stream_left_early_is_captured_as_partial(
    mem: Memory, server: FakeGeminiServer, how: str
) -> None:
    server.chat_script = lambda body: "one two three four five six"
    client = mem.llm.register(_client(server))

    async def scenario() -> None:
        with mem.scope(user_id="ana", session_id="early"):
            stream = await client.aio.models.generate_content_stream(
                model="gemini-test", contents="Count"
            )
            async for _chunk in stream:
                break
            if how == "aclose":
                await stream.aclose()
            else:
                del stream, _chunk
                gc.collect()
        await client.aio.aclose()

    asyncio.run(scenario())
    assert _stored(mem, "early") == [("user", "Count"), ("assistant", "one")]
    capture = _capture(mem, "early")
    assert capture["partial"] is True and "error" not in capture


def test_an_async_stream_broken_mid_way_raises_and_is_captured(
    mem: Memory, server: FakeGeminiServer
) -> None:
    server.chat_script = lambda body: "one two three four"
    server.fail_stream_after(2)
    client = mem.llm.register(_client(server))
    seen: list[str | None] = []

    async def scenario() -> None:
        try:
            with mem.scope(user_id="ana", session_id="broken"):
                stream = await client.aio.models.generate_content_stream(
                    model="gemini-test", contents="Go"
                )
                async for chunk in stream:
                    seen.append(chunk.text)
        finally:
            await client.aio.aclose()

    with pytest.raises(Exception) as caught:
        asyncio.run(scenario())
    assert not type(caught.value).__module__.startswith("stratamem")
    assert seen == ["one", " two"]
    assert _stored(mem, "broken") == [("user", "Go"), ("assistant", "one two")]
    assert type(caught.value).__name__ in _capture(mem, "broken")["error"]


def test_async_provider_errors_reach_the_caller(mem: Memory, server: FakeGeminiServer) -> None:
    client = mem.llm.register(_client(server))
    server.fail_next(1, status=400)

    async def scenario() -> None:
        try:
            with mem.scope(user_id="ana", session_id="chat"):
                await client.aio.models.generate_content(model="gemini-test", contents="fails")
        finally:
            await client.aio.aclose()

    with pytest.raises(genai_errors.ClientError):
        asyncio.run(scenario())
    assert mem.llm.flush(5)
    failed = [m for m in mem.messages.list(session_id="chat") if m.content == "fails"]
    assert failed and "ClientError" in failed[0].metadata["capture"]["error"]


# -- beyond the models surface; fail-open ------------------------------------------------


def test_chat_sessions_go_through_the_wrapped_models(mem: Memory, server: FakeGeminiServer) -> None:
    server.chat_replies.extend(["Hello Ana!", "Chickpeas."])
    client = mem.llm.register(_client(server))
    with mem.scope(user_id="ana", session_id="chat"):
        chat = client.chats.create(model="gemini-test")
        chat.send_message("Hi, I am Ana.")
        assert chat.send_message(QUESTION).text == "Chickpeas."
    body = server.generate_requests()[-1]
    assert "allergic to peanuts" in "\n".join(_system_texts(body))
    assert [c["parts"][0]["text"] for c in body["contents"]] == [
        "Hi, I am Ana.",
        "Hello Ana!",
        QUESTION,
    ]
    assert _stored(mem, "chat")[-4:] == [
        ("user", "Hi, I am Ana."),
        ("assistant", "Hello Ana!"),
        ("user", QUESTION),
        ("assistant", "Chickpeas."),
    ]


def test_a_hanging_memory_backend_costs_at_most_the_recall_timeout(
    make_memory: Any, server: FakeGeminiServer
) -> None:
    from fakes.openai_server import FakeOpenAIServer

    with FakeOpenAIServer() as embeddings:
        mem = make_memory(
            embedder="openai:fake-embed",
            embedder_base_url=embeddings.base_url,
            embedder_api_key="k",
            capture_recall_timeout_ms=50,
        )
        client = mem.llm.register(_client(server))
        embeddings.delay_next(2.0, n=5)  # the memory side's embedding service hangs
        import time

        start = time.perf_counter()
        with mem.scope(user_id="ana", session_id="slow"):
            reply = client.models.generate_content(model="gemini-test", contents="still there?")
        assert reply.text == "Noted!"
        assert time.perf_counter() - start < 1.0
        body = server.generate_requests()[-1]
        assert "systemInstruction" not in body and body["contents"] == [_user("still there?")]


def test_a_closed_memory_never_breaks_the_call(make_memory: Any, server: FakeGeminiServer) -> None:
    mem = make_memory()
    client = _client(server)
    mem.llm.register(client)
    mem.close()  # unregisters: the client is the SDK's again
    with mem.scope(user_id="ana"):
        reply = client.models.generate_content(model="gemini-test", contents="hi")
    assert reply.text == "Noted!"
