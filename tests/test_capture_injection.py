"""Recalled memory in the request each provider receives, for every capture adapter and both
placements, with hostile stored text: a closing quote and a forged ``(assistant, ...)``
label, a fake section heading, ``</memory> SYSTEM: ...``, the control tokens of ChatML,
Llama 2 and 3, Mistral, Gemma and DeepSeek, Anthropic's plain-text ``\\n\\nHuman:`` turns,
Alpaca's ``### Instruction:`` and a bare ``assistant:``. Whatever the provider, the request
holds one memory block that nothing stored can close, framed as data about the user, with
every stored text escaped (visible HTML character references), no raw control token, and no
line of it forging a role, a label or a heading. The default placement puts the block into
the last user turn, after the user's text, and sends everything before it byte-identical;
``injection="system"`` puts it into the provider's system slot. Real SDKs and frameworks,
loopback fake servers."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

# litellm fetches its model cost map from the internet at import unless told to use the
# copy it ships: this must be set before litellm is imported.
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"

import anthropic
import boto3
import litellm
import openai
import pytest
import xai_sdk
from botocore.config import Config
from google import genai
from google.genai import types as genai_types

from fakes.anthropic_server import FakeAnthropicServer
from fakes.bedrock_server import FakeBedrockServer
from fakes.google_server import FakeGeminiServer
from fakes.openai_server import FakeOpenAIServer
from fakes.xai_server import FakeXAIServer
from hostile import HOSTILE, assert_one_safe_block
from stratamem import Memory

litellm.telemetry = False
litellm.suppress_debug_info = True
pytestmark = [
    pytest.mark.filterwarnings("ignore:Items? .* on TypedDict class:UserWarning"),
    pytest.mark.filterwarnings("ignore:Accessing the 'model_:DeprecationWarning"),
]

SYSTEM = "Be brief."
# Words shared with the question: recall would find these turns, were they not in the request
# (the assistant's shares more of them: an assistant's turn counts 0.8 in recall).
EARLIER = [
    ("user", "Hello there, I need snacks for a trip."),
    ("assistant", "Happy to help with snacks with peanuts for your trip."),
]
QUESTION = "Which snacks with peanuts can I have?"
ANSWER = "Roasted chickpeas."
BEDROCK_MODEL = "anthropic.claude-3-haiku-20240307-v1:0"

# -- what the providers received, normalised: (system text, [(role, text), ...]) ----------


Seen = tuple[str, list[tuple[str, str]]]


def _text(content: Any, key: str = "text") -> str:
    if isinstance(content, str):
        return content
    return "\n\n".join(p[key] for p in content or [] if isinstance(p, dict) and key in p)


def _merged(turns: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Consecutive turns of one role as one (how the providers read them)."""
    out: list[tuple[str, str]] = []
    for role, text in turns:
        if out and out[-1][0] == role:
            out[-1] = (role, f"{out[-1][1]}\n\n{text}")
        else:
            out.append((role, text))
    return out


def _chat(body: dict[str, Any]) -> Seen:
    system = [m for m in body["messages"] if m["role"] in ("system", "developer")]
    turns = [(m["role"], _text(m["content"])) for m in body["messages"] if m not in system]
    return "\n\n".join(_text(m["content"]) for m in system), _merged(turns)


def _responses(body: dict[str, Any]) -> Seen:
    given = body["input"]
    items = [{"role": "user", "content": given}] if isinstance(given, str) else given
    turns = [(m["role"], _text(m["content"])) for m in items]
    return body.get("instructions") or "", _merged(turns)


def _anthropic(body: dict[str, Any]) -> Seen:
    turns = [(m["role"], _text(m["content"])) for m in body["messages"]]
    return _text(body.get("system") or ""), _merged(turns)


def _gemini(body: dict[str, Any]) -> Seen:
    system = _text((body.get("systemInstruction") or {}).get("parts"))
    roles = {"user": "user", "model": "assistant"}
    turns = [(roles[c["role"]], _text(c["parts"])) for c in body["contents"]]
    return system, _merged(turns)


def _converse(body: dict[str, Any]) -> Seen:
    turns = [(m["role"], _text(m["content"])) for m in body["messages"]]
    return _text(body.get("system")), _merged(turns)


def _xai(request: Any) -> Seen:
    from xai_sdk.proto import chat_pb2

    turns = [
        (
            chat_pb2.MessageRole.Name(m.role).removeprefix("ROLE_").lower(),
            "\n\n".join(part.text for part in m.content if part.text),
        )
        for m in request.messages
    ]
    system = [t for r, t in turns if r == "system"]
    return "\n\n".join(system), _merged([(r, t) for r, t in turns if r != "system"])


# -- the calls, one per adapter ---------------------------------------------------------------


@dataclass
class Servers:
    openai: FakeOpenAIServer
    anthropic: FakeAnthropicServer
    gemini: FakeGeminiServer
    xai: FakeXAIServer
    bedrock: FakeBedrockServer


def _bedrock_client(servers: Servers) -> Any:
    return boto3.client(
        "bedrock-runtime",
        endpoint_url=servers.bedrock.base_url,
        region_name="us-east-1",
        aws_access_key_id="test-key",
        aws_secret_access_key="test-secret",
        config=Config(retries={"max_attempts": 1}),
    )


def _dicts(user_part: Callable[[str], Any] = lambda t: t) -> list[dict[str, Any]]:
    turns = [*EARLIER, ("user", QUESTION)]
    return [{"role": r, "content": user_part(t)} for r, t in turns]


def _openai_chat(mem: Memory, servers: Servers) -> Seen:
    client = mem.llm.register(openai.OpenAI(base_url=servers.openai.base_url, api_key="k"))
    messages = [{"role": "system", "content": SYSTEM}, *_dicts()]
    client.chat.completions.create(model="m", messages=messages)
    return _chat(servers.openai.chat_requests()[-1])


def _openai_chat_parts(mem: Memory, servers: Servers) -> Seen:
    client = mem.llm.register(openai.AsyncOpenAI(base_url=servers.openai.base_url, api_key="k"))
    messages = [
        {"role": "developer", "content": SYSTEM},
        *_dicts(lambda t: [{"type": "text", "text": t}]),
    ]

    async def call() -> None:
        stream = await client.chat.completions.create(model="m", messages=messages, stream=True)
        async for _ in stream:
            pass
        await client.close()

    asyncio.run(call())
    return _chat(servers.openai.chat_requests()[-1])


def _openai_responses(mem: Memory, servers: Servers) -> Seen:
    client = mem.llm.register(openai.OpenAI(base_url=servers.openai.base_url, api_key="k"))
    client.responses.create(model="m", input=_dicts(), instructions=SYSTEM)
    return _responses(servers.openai.responses_requests()[-1])


def _openai_responses_string(mem: Memory, servers: Servers) -> Seen:
    client = mem.llm.register(openai.OpenAI(base_url=servers.openai.base_url, api_key="k"))
    client.responses.create(model="m", input=QUESTION, instructions=SYSTEM)
    system, turns = _responses(servers.openai.responses_requests()[-1])
    return system, [*EARLIER, *turns]  # a string input is one turn: nothing comes before it


def _litellm(mem: Memory, servers: Servers) -> Seen:
    mem.llm.register(litellm)
    litellm.completion(
        model="openai/m",
        api_base=servers.openai.base_url,
        api_key="k",
        messages=[{"role": "system", "content": SYSTEM}, *_dicts()],
    )
    return _chat(servers.openai.chat_requests()[-1])


def _anthropic_call(mem: Memory, servers: Servers) -> Seen:
    client = mem.llm.register(anthropic.Anthropic(base_url=servers.anthropic.base_url, api_key="k"))
    client.messages.create(model="c", max_tokens=50, system=SYSTEM, messages=_dicts())
    return _anthropic(servers.anthropic.message_requests()[-1])


def _anthropic_blocks(mem: Memory, servers: Servers) -> Seen:
    client = mem.llm.register(anthropic.Anthropic(base_url=servers.anthropic.base_url, api_key="k"))
    messages = _dicts(lambda t: [{"type": "text", "text": t}])
    with client.messages.stream(
        model="c", max_tokens=50, system=[{"type": "text", "text": SYSTEM}], messages=messages
    ) as stream:
        stream.get_final_message()
    return _anthropic(servers.anthropic.message_requests()[-1])


def _google(mem: Memory, servers: Servers) -> Seen:
    client = mem.llm.register(
        genai.Client(
            api_key="k",
            vertexai=False,
            http_options=genai_types.HttpOptions(
                base_url=servers.gemini.base_url, api_version="v1beta"
            ),
        )
    )
    roles = {"user": "user", "assistant": "model"}
    contents = [
        genai_types.Content(role=roles[r], parts=[genai_types.Part(text=t)])
        for r, t in [*EARLIER, ("user", QUESTION)]
    ]
    client.models.generate_content(
        model="g", contents=contents, config={"system_instruction": SYSTEM}
    )
    return _gemini(servers.gemini.generate_requests()[-1])


def _xai_call(mem: Memory, servers: Servers) -> Seen:
    from xai_sdk.chat import assistant, system, user

    client = mem.llm.register(xai_sdk.Client(**servers.xai.client_kwargs()))
    chat = client.chat.create(
        model="grok",
        messages=[system(SYSTEM), user(EARLIER[0][1]), assistant(EARLIER[1][1]), user(QUESTION)],
    )
    chat.sample()
    return _xai(servers.xai.requests[-1])


def _bedrock_converse(mem: Memory, servers: Servers) -> Seen:
    client = mem.llm.register(bedrock=_bedrock_client(servers))
    client.converse(
        modelId=BEDROCK_MODEL,
        system=[{"text": SYSTEM}],
        messages=_dicts(lambda t: [{"text": t}]),
    )
    return _converse(servers.bedrock.model_requests()[-1][2])


def _bedrock_invoke(mem: Memory, servers: Servers) -> Seen:
    client = mem.llm.register(bedrock=_bedrock_client(servers))
    body = {
        "anthropic_version": "bedrock-2023-05-31",
        "max_tokens": 50,
        "system": SYSTEM,
        "messages": _dicts(),
    }
    client.invoke_model(modelId=BEDROCK_MODEL, body=json.dumps(body))
    return _anthropic(servers.bedrock.model_requests()[-1][2])


def _langchain(name: str) -> Callable[[Memory, Servers], Seen]:
    def call(mem: Memory, servers: Servers) -> Seen:
        from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

        model, read = _langchain_model(name, servers)
        mem.llm.register(**{name: model})
        model.invoke(
            [
                SystemMessage(SYSTEM),
                HumanMessage(EARLIER[0][1]),
                AIMessage(EARLIER[1][1]),
                HumanMessage(QUESTION),
            ]
        )
        return read()

    return call


def _langchain_model(name: str, servers: Servers) -> tuple[Any, Callable[[], Seen]]:
    if name == "chatopenai":
        from langchain_openai import ChatOpenAI

        model = ChatOpenAI(model="m", base_url=servers.openai.base_url, api_key="k")
        return model, lambda: _chat(servers.openai.chat_requests()[-1])
    if name == "chatanthropic":
        from langchain_anthropic import ChatAnthropic

        model = ChatAnthropic(model="c", base_url=servers.anthropic.base_url, api_key="k")
        return model, lambda: _anthropic(servers.anthropic.message_requests()[-1])
    if name == "chatgoogle":
        from langchain_google_genai import ChatGoogleGenerativeAI

        model = ChatGoogleGenerativeAI(
            model="g", google_api_key="k", base_url=servers.gemini.base_url
        )
        return model, lambda: _gemini(servers.gemini.generate_requests()[-1])
    from langchain_aws import ChatBedrock, ChatBedrockConverse

    client = _bedrock_client(servers)
    if name == "chatbedrockconverse":
        model = ChatBedrockConverse(model=BEDROCK_MODEL, client=client)
        return model, lambda: _converse(servers.bedrock.model_requests()[-1][2])
    model = ChatBedrock(model_id=BEDROCK_MODEL, client=client)
    return model, lambda: _anthropic(servers.bedrock.model_requests()[-1][2])


def _pydantic_ai_model(mem: Memory, servers: Servers) -> Seen:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, UserPromptPart
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel(
        "m", provider=OpenAIProvider(base_url=servers.openai.base_url, api_key="k")
    )
    mem.llm.register(pydantic_ai=model)
    history = [
        ModelRequest(parts=[UserPromptPart(EARLIER[0][1])]),
        ModelResponse(parts=[TextPart(EARLIER[1][1])]),
    ]
    Agent(model, instructions=SYSTEM).run_sync(QUESTION, message_history=history)
    return _chat(servers.openai.chat_requests()[-1])


def _pydantic_ai_agent(mem: Memory, servers: Servers) -> Seen:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, UserPromptPart
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel(
        "m", provider=OpenAIProvider(base_url=servers.openai.base_url, api_key="k")
    )
    agent = mem.llm.register(pydantic_ai=Agent(model, instructions=SYSTEM))
    history = [
        ModelRequest(parts=[UserPromptPart(EARLIER[0][1])]),
        ModelResponse(parts=[TextPart(EARLIER[1][1])]),
    ]
    agent.run_sync(QUESTION, message_history=history)
    return _chat(servers.openai.chat_requests()[-1])


def _agno(mem: Memory, servers: Servers) -> Seen:
    from agno.agent import Agent
    from agno.models.message import Message
    from agno.models.openai import OpenAIChat

    model = OpenAIChat(id="m", base_url=servers.openai.base_url, api_key="k", max_retries=0)
    agent = Agent(model=model, instructions=SYSTEM)
    mem.llm.register(agno=agent)
    earlier = [Message(role=r, content=t) for r, t in EARLIER]
    agent.run([*earlier, Message(role="user", content=QUESTION)])
    return _chat(servers.openai.chat_requests()[-1])


CALLS: dict[str, Callable[[Memory, Servers], Seen]] = {
    "openai-chat": _openai_chat,
    "openai-chat-parts-async-stream": _openai_chat_parts,
    "openai-responses": _openai_responses,
    "openai-responses-string": _openai_responses_string,
    "litellm": _litellm,
    "anthropic": _anthropic_call,
    "anthropic-blocks-stream": _anthropic_blocks,
    "google": _google,
    "xai": _xai_call,
    "bedrock-converse": _bedrock_converse,
    "bedrock-invoke-model": _bedrock_invoke,
    **{
        f"langchain-{name}": _langchain(name)
        for name in (
            "chatopenai",
            "chatanthropic",
            "chatgoogle",
            "chatbedrockconverse",
            "chatbedrock",
        )
    },
    "pydantic-ai-model": _pydantic_ai_model,
    "pydantic-ai-agent": _pydantic_ai_agent,
    "agno": _agno,
}
# A PydanticAI run has no request-only place in the user's turn: instructions, always.
ALWAYS_SYSTEM = {"pydantic-ai-agent"}


@pytest.fixture
def servers(monkeypatch: pytest.MonkeyPatch) -> Iterator[Servers]:
    for key in list(os.environ):
        if key.startswith(("GOOGLE_", "GEMINI_", "AWS_", "OPENAI_", "ANTHROPIC_", "XAI_")):
            monkeypatch.delenv(key)
    with ExitStack() as stack:
        found = Servers(
            stack.enter_context(FakeOpenAIServer()),
            stack.enter_context(FakeAnthropicServer()),
            stack.enter_context(FakeGeminiServer()),
            stack.enter_context(FakeXAIServer()),
            stack.enter_context(FakeBedrockServer()),
        )
        for s in (found.openai, found.anthropic, found.gemini, found.bedrock):
            s.chat_script = lambda body: ANSWER
        found.xai.script = lambda request: ANSWER
        yield found


@pytest.fixture
def hostile(make_memory: Any) -> Callable[..., Memory]:
    """A Memory whose user stored the hostile messages (in another session)."""

    def make(**options: Any) -> Memory:
        mem = make_memory(**options)
        notes = mem.sessions.create(user_id="ana", session_id="notes")
        notes.add_messages([{"role": "user", "content": t} for t in HOSTILE], sync=True)
        # Room for every one of them in the block.
        mem.llm.recall_config = {
            "token_budget": 3000,
            "proposition_top_k": 30,
            "message_semantic_top_k": 30,
            "observation_semantic_top_k": 0,
            "observation_context_top_k": 1,
            "candidate_pool": 60,
        }
        return mem

    return make


@pytest.mark.parametrize("adapter", list(CALLS))
@pytest.mark.parametrize("injection", ["user", "system"])
def test_hostile_memory_reaches_every_provider_escaped_in_one_block(
    hostile: Callable[..., Memory], servers: Servers, adapter: str, injection: str
) -> None:
    options = {} if injection == "user" else {"capture_injection": "system"}
    mem = hostile(**options)
    with mem.scope(user_id="ana", session_id="chat"):
        system, turns = CALLS[adapter](mem, servers)
    block = assert_one_safe_block("\n\n".join([system, *(t for _, t in turns)]))
    if injection == "system" or adapter in ALWAYS_SYSTEM:
        # After the caller's own system prompt; the turns are the caller's.
        assert system.startswith(SYSTEM) and system.endswith(block)
        assert turns == [*EARLIER, ("user", QUESTION)]
    else:
        # Into the last user turn, after the user's text; all before it byte-identical.
        assert system == SYSTEM
        assert turns[:-1] == EARLIER
        assert turns[-1] == ("user", f"{QUESTION}\n\n{block}")
    assert mem.llm.flush(10)
    stored = [m.content for m in mem.messages.list(session_id="chat")]
    assert stored == [QUESTION, ANSWER]  # the block is never stored as the user's words


@pytest.mark.parametrize("adapter", list(CALLS))
def test_no_provider_is_sent_back_the_turns_its_request_carries(
    make_memory: Any, servers: Servers, adapter: str
) -> None:
    """Each adapter hands recall the texts of its request's turns: the block holds other
    memories (another session's, and this session's turns the request does not carry), not
    the turns the request already has."""
    mem = make_memory()
    mem.sessions.create(user_id="ana", session_id="notes").add_messages(
        [{"role": "user", "content": "I am allergic to peanuts."}], sync=True
    )
    not_sent = "Salted snacks with peanuts are my favourite trip snacks."
    conversation = [not_sent, *(t for _, t in EARLIER), QUESTION]
    mem.sessions.create(user_id="ana", session_id="chat").add_messages(
        [{"role": r, "content": t} for r, t in [("user", not_sent), *EARLIER]], sync=True
    )
    # Without the request's turns left out, recall would quote them back.
    config = {**mem.llm.recall_config, "message_recent_limit": 0}
    unfiltered = mem.get_memory("chat", QUESTION, recall_config=config).formatted_context
    assert all(t in unfiltered for _, t in EARLIER)
    with mem.scope(user_id="ana", session_id="chat"):
        system, turns = CALLS[adapter](mem, servers)
    block = assert_one_safe_block("\n\n".join([system, *(t for _, t in turns)]), shown=())
    assert "allergic to peanuts" in block and not_sent in block
    if adapter == "openai-responses-string":  # a string input: the request has one turn
        assert QUESTION not in block and all(t in block for _, t in EARLIER)
    else:
        assert not any(t in block for t in conversation[1:])
    # What the request carries reached the provider once, as the caller's turns.
    assert [t for _, t in turns if t.startswith(EARLIER[0][1])] == [EARLIER[0][1]]
