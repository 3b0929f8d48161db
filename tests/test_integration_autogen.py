"""StratamemMemory: AutoGen's ``autogen_core.memory.Memory`` protocol, under AutoGen's own
model contexts and a real ``AssistantAgent`` whose model is the fake OpenAI server's chat
completions (through autogen-ext's ``OpenAIChatCompletionClient``), embedded on both stores
and against a real ``stratamem serve``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from autogen_agentchat.agents import AssistantAgent
from autogen_core import Image
from autogen_core.memory import MemoryContent, MemoryMimeType
from autogen_core.model_context import UnboundedChatCompletionContext
from autogen_core.models import SystemMessage, UserMessage
from autogen_ext.models.openai import OpenAIChatCompletionClient

from conftest import assert_names_the_extra, run_docs_example
from fakes.openai_server import FakeOpenAIServer
from server_proc import free_port
from stratamem import Memory, connect
from stratamem.api import MemoryAPI
from stratamem.integrations.autogen import StratamemMemory


@pytest.fixture
def semantic(make_memory: Callable[..., Memory], local_embedder: Any) -> Memory:
    return make_memory(embedder=local_embedder)


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as s:
        yield s


def _note(text: str, **metadata: Any) -> MemoryContent:
    return MemoryContent(content=text, mime_type=MemoryMimeType.TEXT, metadata=metadata or None)


def _updated(memory: StratamemMemory, question: str) -> tuple[list[Any], Any]:
    async def run() -> tuple[list[Any], Any]:
        context = UnboundedChatCompletionContext()
        await context.add_message(UserMessage(content=question, source="user"))
        result = await memory.update_context(context)
        return await context.get_messages(), result

    return asyncio.run(run())


def _ask_agent(server: FakeOpenAIServer, memory: StratamemMemory, task: str) -> str:
    """A real AssistantAgent run; returns the text of the request's last system message."""
    server.chat_replies.append("Try an apple.")

    async def run() -> None:
        client = OpenAIChatCompletionClient(
            model="gpt-4o-mini", base_url=server.base_url, api_key="x"
        )
        agent = AssistantAgent("assistant", model_client=client, memory=[memory])
        await agent.run(task=task)
        await client.close()

    asyncio.run(run())
    messages = server.chat_requests()[-1]["messages"]
    return "\n".join(str(m.get("content")) for m in messages if m["role"] == "system")


def _conversation(memory: MemoryAPI, server: FakeOpenAIServer) -> None:
    ana = StratamemMemory(memory, user_id="ana")
    asyncio.run(ana.add(_note("I'm allergic to peanuts.", source="chat")))
    memory.wait()
    # A later run for the same user (a new StratamemMemory, as a new process would have).
    shown = _ask_agent(server, StratamemMemory(memory, user_id="ana"), "Suggest a snack for me.")
    assert "<memory>" in shown and "allergic to peanuts" in shown
    # The block is the last message: everything before it is as it was.
    messages = server.chat_requests()[-1]["messages"]
    assert messages[-1]["role"] == "system" and "<memory>" in messages[-1]["content"]
    assert messages[-2] == {"role": "user", "content": "Suggest a snack for me.", "name": "user"}
    ben = _ask_agent(server, StratamemMemory(memory, user_id="ben"), "Suggest a snack for me.")
    assert "<memory>" not in ben


def test_memory_of_one_run_is_recalled_in_another(
    semantic: Memory, server: FakeOpenAIServer
) -> None:
    _conversation(semantic, server)


def test_update_context_query_and_what_add_stores(semantic: Memory) -> None:
    memory = StratamemMemory(semantic, user_id="ana", session_id="notes")
    asyncio.run(memory.add(_note("I live in Lisbon.", origin="settings")))
    asyncio.run(
        memory.add(MemoryContent(content={"diet": "vegetarian"}, mime_type="application/json"))
    )
    semantic.wait()
    stored = semantic.messages.list(session_id="notes")
    assert [m.content for m in stored] == ["I live in Lisbon.", '{"diet":"vegetarian"}']
    assert stored[0].event_type == "memory" and stored[0].metadata == {
        "autogen": {"origin": "settings"}
    }
    messages, result = _updated(memory, "Where do I live?")
    assert isinstance(messages[-1], SystemMessage) and "Lisbon" in messages[-1].content
    assert any("Lisbon" in str(c.content) for c in result.memories.results)
    found = asyncio.run(memory.query("Where do I live?"))
    assert found.results and "Lisbon" in str(found.results[0].content)
    top = found.results[0].metadata or {}
    assert top["current"] is True and top["message_ids"]
    assert (
        asyncio.run(memory.query(_note("Where do I live?"), limit=1)).results[:1]
        == found.results[:1]
    )
    # Nothing to ask: the context is left as it was.
    empty, nothing = _updated(memory, "   ")
    assert len(empty) == 1 and nothing.memories.results == []


def test_another_project_recalls_nothing(semantic: Memory) -> None:
    asyncio.run(StratamemMemory(semantic, user_id="ana").add(_note("I'm allergic to peanuts.")))
    semantic.wait()
    semantic.projects.create("other", project_id="other")
    elsewhere = StratamemMemory(semantic.for_project("other"), user_id="ana")
    messages, result = _updated(elsewhere, "Suggest a snack for me.")
    assert len(messages) == 1 and result.memories.results == []
    assert asyncio.run(elsewhere.query("peanuts")).results == []


def test_a_correction_replaces_the_old_value(semantic: Memory) -> None:
    memory = StratamemMemory(semantic, user_id="ana")
    asyncio.run(memory.add(_note("I drive a Honda Civic.")))
    semantic.wait()
    asyncio.run(memory.add(_note("Correction: I drive a Tesla Model 3 now.")))
    semantic.wait()
    messages, _ = _updated(memory, "What car do I drive?")
    block = messages[-1].content
    assert "Tesla" in block
    if "Honda" in block:  # history may be quoted, marked, after the current value
        assert block.index("Tesla") < block.index("Honda") and "(superseded)" in block


def test_clear_forgets_what_it_added_and_forgetting_in_stratamem_is_seen(
    semantic: Memory,
) -> None:
    memory = StratamemMemory(semantic, user_id="ana", session_id="notes")
    other = StratamemMemory(semantic, user_id="ana", session_id="elsewhere")
    asyncio.run(memory.add(_note("I'm allergic to peanuts.")))
    asyncio.run(other.add(_note("I live in Lisbon.")))
    semantic.wait()
    asyncio.run(memory.clear())
    assert not any(
        "peanuts" in str(c.content) for c in asyncio.run(memory.query("peanuts")).results
    )
    assert semantic.messages.list(session_id="elsewhere")  # clear is this memory's only
    semantic.forget(user_id="ana", session_id="elsewhere")  # the reverse: gone for the seam
    assert not any("Lisbon" in str(c.content) for c in asyncio.run(other.query("Lisbon")).results)
    asyncio.run(memory.clear())  # nothing left to clear: no error
    asyncio.run(memory.add(_note("I like tea.")))  # the session is made again
    assert [m.content for m in semantic.messages.list(session_id="notes")] == ["I like tea."]
    asyncio.run(memory.close())


def test_bad_input_is_refused_and_nothing_is_stored(mem: Memory) -> None:
    memory = StratamemMemory(mem, user_id="ana", session_id="s")
    image = Image.from_base64(
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4DwABBAEAHnOcQAAAAABJRU5ErkJggg=="
    )
    for bad in (
        MemoryContent(content=image, mime_type=MemoryMimeType.IMAGE),
        MemoryContent(content=b"\x00", mime_type=MemoryMimeType.BINARY),
        MemoryContent(content=b"text", mime_type=MemoryMimeType.TEXT),
        _note("   "),
        _note("x" * (mem.settings.max_content_chars + 1)),
    ):
        with pytest.raises(ValueError, match=r"stratamem stores text|limit"):
            asyncio.run(memory.add(bad))
    with pytest.raises(TypeError):
        StratamemMemory(object(), user_id="ana")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        StratamemMemory(mem, user_id=" ")
    with pytest.raises(ValueError):
        StratamemMemory(mem, user_id="ana", limit=0)
    assert mem.messages.list(session_id="s") == []  # nothing was stored


def test_a_failed_recall_leaves_the_call_without_memory(caplog: pytest.LogCaptureFixture) -> None:
    dead = connect(f"http://127.0.0.1:{free_port()}", api_key="sm_x", max_retries=0)
    memory = StratamemMemory(dead, user_id="ana")
    with caplog.at_level(logging.WARNING, logger="stratamem.integrations.autogen"):
        messages, result = _updated(memory, "Hi")
    assert len(messages) == 1 and result.memories.results == []
    assert "recall failed" in caplog.text
    dead.close()


# -- against a server ----------------------------------------------------------------------


@pytest.mark.slow
def test_against_a_server(served: str, server: FakeOpenAIServer) -> None:
    url, key = served.split()
    with connect(url, api_key=key) as remote:
        _conversation(remote, server)
        remote.erase_user("ana")
        remote.erase_user("ben")


def test_without_autogen_the_module_names_the_extra() -> None:
    assert_names_the_extra("autogen_core", "stratamem.integrations.autogen", "autogen")


def test_the_docs_example_runs(tmp_path: Path, server: FakeOpenAIServer) -> None:
    server.chat_replies.append("Try an apple.")
    out = run_docs_example(
        "autogen.md", tmp_path, OPENAI_API_KEY="k", OPENAI_BASE_URL=server.base_url
    )
    assert out.strip() == "Try an apple."
    block = server.chat_requests()[-1]["messages"][-1]
    assert block["role"] == "system" and "User is allergic to peanuts." in block["content"]
