"""mem.llm.register(chatopenai=...|chatanthropic=...|chatgoogle=...|chatbedrockconverse=...|
chatbedrock=...) with the real LangChain integrations talking to loopback fake provider
servers: invoke, ainvoke, stream, astream, batch; memory in the system slot of the request
the server received; each exchange captured once (also when the model's SDK client is
registered too); caller objects unchanged; memory failures never reaching the call."""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from botocore.config import Config
from langchain_anthropic import ChatAnthropic
from langchain_aws import ChatBedrock, ChatBedrockConverse
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage
from langchain_google_genai import ChatGoogleGenerativeAI
from langchain_openai import ChatOpenAI

from fakes.anthropic_server import FakeAnthropicServer
from fakes.bedrock_server import FakeBedrockServer
from fakes.google_server import FakeGeminiServer
from fakes.openai_server import FakeOpenAIServer
from stratamem import Memory
from stratamem.capture import MEMORY_PREAMBLE

ANSWER = "Try roasted chickpeas instead of peanuts."
ASK = "Any snack ideas? I am allergic to peanuts, remember."
BEDROCK_MODEL = "anthropic.claude-3-haiku-20240307-v1:0"
TOOL = {"tool_calls": [{"id": "call_1", "name": "lookup", "arguments": {"q": "snacks"}}]}


def _parts_text(parts: Any) -> str:
    if isinstance(parts, str):
        return parts
    return "\n".join(str(p.get("text", "")) for p in parts or [] if isinstance(p, dict))


@dataclass
class Case:
    name: str  # the register() keyword
    server: Any
    make: Callable[[], BaseChatModel]
    system: Callable[[], list[str]]  # the system texts of every model request received
    bedrock: Any = None  # the boto3 client under a Bedrock model


def _bedrock_client(server: FakeBedrockServer) -> Any:
    return boto3.client(
        "bedrock-runtime",
        endpoint_url=server.base_url,
        region_name="us-east-1",
        aws_access_key_id="test-key",
        aws_secret_access_key="test-secret",
        config=Config(retries={"max_attempts": 1}),
    )


def _case(kind: str, stack: list[Any]) -> Case:
    if kind == "chatopenai":
        oai = FakeOpenAIServer().start()
        stack.append(oai)

        def openai_system() -> list[str]:
            return [
                "\n".join(m["content"] for m in b["messages"] if m["role"] == "system")
                for b in oai.chat_requests()
            ]

        return Case(
            kind,
            oai,
            lambda: ChatOpenAI(model="gpt-test", base_url=oai.base_url, api_key="k", max_retries=0),
            openai_system,
        )
    if kind == "chatanthropic":
        ant = FakeAnthropicServer().start()
        stack.append(ant)
        return Case(
            kind,
            ant,
            lambda: ChatAnthropic(
                model="claude-test", base_url=ant.base_url, api_key="k", max_retries=0
            ),
            lambda: [_parts_text(b.get("system", "")) for b in ant.message_requests()],
        )
    if kind == "chatgoogle":
        gem = FakeGeminiServer().start()
        stack.append(gem)
        return Case(
            kind,
            gem,
            lambda: ChatGoogleGenerativeAI(
                model="gemini-test", google_api_key="k", base_url=gem.base_url
            ),
            lambda: [
                _parts_text((b.get("systemInstruction") or {}).get("parts"))
                for b in gem.generate_requests()
            ],
        )
    brk = FakeBedrockServer().start()
    stack.append(brk)
    client = _bedrock_client(brk)

    def bedrock_system() -> list[str]:
        return [_parts_text(body.get("system", "")) for _, _, body in brk.model_requests()]

    if kind == "chatbedrockconverse":
        return Case(
            kind,
            brk,
            lambda: ChatBedrockConverse(
                model=BEDROCK_MODEL, client=client, region_name="us-east-1"
            ),
            bedrock_system,
            client,
        )
    return Case(
        kind,
        brk,
        lambda: ChatBedrock(model_id=BEDROCK_MODEL, client=client, region_name="us-east-1"),
        bedrock_system,
        client,
    )


KINDS = ["chatopenai", "chatanthropic", "chatgoogle", "chatbedrockconverse", "chatbedrock"]


@pytest.fixture(params=KINDS)
def case(request: pytest.FixtureRequest) -> Iterator[Case]:
    stack: list[Any] = []
    try:
        c = _case(request.param, stack)
        c.server.chat_script = lambda body: ANSWER
        yield c
    finally:
        for server in stack:
            server.close()


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


def _stored(mem: Memory, session: str = "chat") -> list[tuple[str, str]]:
    assert mem.llm.flush(5)
    return [(m.role, m.content) for m in mem.messages.list(session_id=session)]


def _capture(mem: Memory) -> dict[str, Any]:
    assert mem.llm.flush(5)
    return mem.messages.list(session_id="chat")[-1].metadata["capture"]


def _injected(system: str) -> bool:
    return system.count(MEMORY_PREAMBLE) == 1 and "allergic to peanuts" in system


# -- registration ------------------------------------------------------------------------


def test_positional_framework_objects_are_refused_with_the_name_to_use(
    mem: Memory, case: Case
) -> None:
    model = case.make()
    with pytest.raises(TypeError, match=rf"register\({case.name}=\.\.\.\)"):
        mem.llm.register(model)
    wrong = "chatanthropic" if case.name != "chatanthropic" else "chatopenai"
    with pytest.raises(TypeError, match=rf"{wrong}= takes .*registers as {case.name}="):
        mem.llm.register(**{wrong: model})
    with pytest.raises(TypeError, match="one framework object per call"):
        mem.llm.register(**{case.name: model, "bedrock": case.bedrock})
    assert mem.llm.register(**{case.name: model}) is model
    assert mem.llm.register(**{case.name: model}) is model  # twice: a no-op


def test_langchain_name_takes_any_chat_model(mem: Memory) -> None:
    with FakeOpenAIServer() as oai:
        oai.chat_script = lambda body: ANSWER
        model = ChatOpenAI(model="gpt-test", base_url=oai.base_url, api_key="k", max_retries=0)
        mem.llm.register(langchain=model)
        with mem.scope(user_id="ana", session_id="chat"):
            model.invoke(ASK)
        assert _injected(oai.chat_requests()[-1]["messages"][0]["content"])
    assert _capture(mem)["provider"] == "langchain:ChatOpenAI"
    with pytest.raises(TypeError, match="langchain= takes"):
        mem.llm.register(langchain=object())


# -- the paths -----------------------------------------------------------------------------


def test_invoke_injects_into_the_system_slot_and_captures_once(mem: Memory, case: Case) -> None:
    model = case.make()
    before = model.model_dump()
    mem.llm.register(**{case.name: model})
    messages = [SystemMessage("You are a helpful cook."), HumanMessage(ASK)]
    kept = copy.deepcopy(messages)
    with mem.scope(user_id="ana", session_id="chat"):
        reply = model.invoke(messages)
    assert reply.content == ANSWER or reply.text == ANSWER
    assert messages == kept  # the caller's messages are untouched
    assert model.model_dump() == before and type(model).__name__ == case.make().__class__.__name__
    system = case.system()[-1]
    assert system.startswith("You are a helpful cook.") and _injected(system)
    stored = _stored(mem)
    assert stored[-2:] == [("user", ASK), ("assistant", ANSWER)]
    assert stored.count(("user", ASK)) == 1
    capture = _capture(mem)
    assert capture["provider"] == f"langchain:{type(model).__name__}"
    assert capture["model"] and capture["latency_ms"] >= 0


def test_stream_passes_chunks_and_captures_at_the_end(mem: Memory, case: Case) -> None:
    model = mem.llm.register(**{case.name: case.make()})
    with mem.scope(user_id="ana", session_id="chat"):
        stream = model.stream(ASK)
        first = next(stream)
        assert mem.llm.flush(5) and ("user", ASK) not in _stored(mem)  # not before the end
        chunks = [first, *stream]
    plain = case.make()  # an unregistered model streams the same chunks
    expected = list(plain.stream(ASK))
    assert [c.text for c in chunks] == [c.text for c in expected]
    assert "".join(c.text for c in chunks) == ANSWER
    assert _injected(case.system()[-2]) and MEMORY_PREAMBLE not in case.system()[-1]
    stored = _stored(mem)
    assert stored[-2:] == [("user", ASK), ("assistant", ANSWER)]
    assert stored.count(("user", ASK)) == 1 and "partial" not in _capture(mem)


def test_async_paths_and_batch(mem: Memory, case: Case) -> None:
    model = mem.llm.register(**{case.name: case.make()})

    async def run() -> tuple[Any, list[Any]]:
        with mem.scope(user_id="ana", session_id="chat"):
            reply = await model.ainvoke(ASK)
            chunks = [c async for c in model.astream("And for dessert? No peanuts.")]
        return reply, chunks

    reply, chunks = asyncio.run(run())
    assert reply.text == ANSWER and "".join(c.text for c in chunks) == ANSWER
    with mem.scope(user_id="ana", session_id="chat"):
        replies = model.batch(["Lunch ideas without peanuts?", "Dinner ideas without peanuts?"])
    assert [r.text for r in replies] == [ANSWER, ANSWER]
    assert all(_injected(s) for s in case.system())
    stored = _stored(mem)
    for question in (
        ASK,
        "And for dessert? No peanuts.",
        "Lunch ideas without peanuts?",
        "Dinner ideas without peanuts?",
    ):
        assert stored.count(("user", question)) == 1
    assert stored.count(("assistant", ANSWER)) == 4


def test_tool_calls_are_captured_and_the_question_stored_once(mem: Memory, case: Case) -> None:
    model = mem.llm.register(**{case.name: case.make()})
    case.server.chat_replies.extend([TOOL, "Chickpeas are safe."])

    def lookup(q: str) -> str:
        """Look up snacks."""
        return "chickpeas"

    bound = model.bind_tools([lookup])
    messages: list[Any] = [HumanMessage(ASK)]
    with mem.scope(user_id="ana", session_id="chat"):
        first = bound.invoke(messages)
        call = first.tool_calls[0]
        assert call["name"] == "lookup" and call["args"] == {"q": "snacks"}
        messages += [first, ToolMessage("chickpeas", tool_call_id=call["id"])]
        bound.invoke(messages)
    stored = _stored(mem)
    assert stored.count(("user", ASK)) == 1
    assert stored[-1] == ("assistant", "Chickpeas are safe.")
    calls = mem.messages.list(session_id="chat")[-2].metadata["capture"]["tool_calls"]
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("lookup", {"q": "snacks"})]


def test_memory_failures_never_reach_the_call(
    mem: Memory, case: Case, caplog: pytest.LogCaptureFixture
) -> None:
    model = mem.llm.register(**{case.name: case.make()})

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("memory backend down")

    mem.get_memory = broken  # type: ignore[method-assign]
    mem.add_messages = broken  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR, "stratamem.capture"), mem.scope(user_id="ana"):
        assert model.invoke(ASK).text == ANSWER
        assert "".join(c.text for c in model.stream(ASK)) == ANSWER
        assert asyncio.run(model.ainvoke(ASK)).text == ANSWER
        assert mem.llm.flush(5)
    assert not any(MEMORY_PREAMBLE in s for s in case.system())
    assert "memory backend down" in caplog.text


def test_provider_errors_reach_the_caller_and_are_recorded(mem: Memory, case: Case) -> None:
    model = mem.llm.register(**{case.name: case.make()})
    case.server.fail_next(1, status=400)
    with mem.scope(user_id="ana", session_id="chat"), pytest.raises(Exception) as raised:
        model.invoke(ASK)
    assert "400" in str(raised.value) or "Validation" in str(raised.value)
    assert _stored(mem)[-1] == ("user", ASK)
    assert _capture(mem)["error"]


# -- layers: the framework captures, its SDK client stands down -------------------------------


def test_openai_client_under_a_registered_chatopenai_stands_down(mem: Memory) -> None:
    with FakeOpenAIServer() as oai:
        oai.chat_script = lambda body: ANSWER
        model = ChatOpenAI(model="gpt-test", base_url=oai.base_url, api_key="k", max_retries=0)
        mem.llm.register(chatopenai=model)
        mem.llm.register(model.root_client)
        mem.llm.register(model.root_async_client)
        streaming = ChatOpenAI(
            model="gpt-test", base_url=oai.base_url, api_key="k", max_retries=0, streaming=True
        )
        mem.llm.register(chatopenai=streaming)  # its _generate runs its own _stream
        with mem.scope(user_id="ana", session_id="chat"):
            model.invoke(ASK)
            list(model.stream("Stream it, no peanuts."))
            asyncio.run(model.ainvoke("Async, no peanuts."))
            streaming.invoke("Streamed invoke, no peanuts.")
            # The SDK client on its own is still captured.
            model.root_client.chat.completions.create(
                model="gpt-test", messages=[{"role": "user", "content": "Direct, no peanuts."}]
            )
        systems = [
            [m["content"] for m in b["messages"] if m["role"] == "system"]
            for b in oai.chat_requests()
        ]
    assert all(len(s) == 1 and _injected(s[0]) for s in systems)  # injected once each
    stored = _stored(mem)
    for question in (
        ASK,
        "Stream it, no peanuts.",
        "Async, no peanuts.",
        "Streamed invoke, no peanuts.",
        "Direct, no peanuts.",
    ):
        assert stored.count(("user", question)) == 1
    assert stored.count(("assistant", ANSWER)) == 5
    providers = [
        m.metadata["capture"]["provider"]
        for m in mem.messages.list(session_id="chat")[-10:]
        if m.role == "assistant"
    ]
    assert providers == ["langchain:ChatOpenAI"] * 4 + ["openai"]


def test_bedrock_client_under_a_registered_chatbedrockconverse_stands_down(mem: Memory) -> None:
    with FakeBedrockServer() as brk:
        brk.chat_script = lambda body: ANSWER
        client = _bedrock_client(brk)
        model = ChatBedrockConverse(model=BEDROCK_MODEL, client=client, region_name="us-east-1")
        mem.llm.register(bedrock=client)
        mem.llm.register(chatbedrockconverse=model)
        with mem.scope(user_id="ana", session_id="chat"):
            model.invoke(ASK)
            list(model.stream("Stream it, no peanuts."))
        systems = [body["system"] for _, _, body in brk.model_requests()]
    assert all(len(s) == 1 and _injected(s[0]["text"]) for s in systems)
    stored = _stored(mem)
    assert stored.count(("user", ASK)) == 1
    assert stored.count(("user", "Stream it, no peanuts.")) == 1
    assert stored.count(("assistant", ANSWER)) == 2


def test_unregister_restores_the_class_and_copies_are_their_own(mem: Memory) -> None:
    originals = {n: ChatOpenAI.__dict__.get(n) for n in ("_generate", "_stream", "_astream")}
    with FakeOpenAIServer() as oai:
        oai.chat_script = lambda body: ANSWER
        model = ChatOpenAI(model="gpt-test", base_url=oai.base_url, api_key="k", max_retries=0)
        other = ChatOpenAI(model="gpt-other", base_url=oai.base_url, api_key="k", max_retries=0)
        mem.llm.register(chatopenai=model)
        copied = model.model_copy(update={"model_name": "gpt-copy"})
        assert "_generate" not in vars(model)  # nothing was added to the instance
        with mem.scope(user_id="ana", session_id="chat"):
            other.invoke("Unregistered model, no peanuts.")
            copied.invoke("A copy, no peanuts.")
        # The copy calls with its own settings and is not captured.
        assert [b["model"] for b in oai.chat_requests()] == ["gpt-other", "gpt-copy"]
        assert all(len(b["messages"]) == 1 for b in oai.chat_requests())
        mem.llm.unregister(model)
        assert {n: ChatOpenAI.__dict__.get(n) for n in originals} == originals
        with mem.scope(user_id="ana", session_id="chat"):
            model.invoke("After unregistering, no peanuts.")
        assert len(oai.chat_requests()[-1]["messages"]) == 1
    stored = [c for _, c in _stored(mem)]
    assert not any("no peanuts" in c for c in stored)
