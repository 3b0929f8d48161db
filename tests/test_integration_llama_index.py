"""StratamemMemoryBlock: a LlamaIndex ``BaseMemoryBlock`` under LlamaIndex's own
``llama_index.core.memory.Memory`` (its short-term memory flushing turns into the block, its
``aget`` asking the block before a call), embedded on both stores and against a real
``stratamem serve``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from llama_index.core.llms import ChatMessage
from llama_index.core.memory import InsertMethod
from llama_index.core.memory import Memory as LlamaMemory

from conftest import assert_names_the_extra, run_docs_example
from server_proc import free_port
from stratamem import Memory, connect
from stratamem.api import MemoryAPI
from stratamem.client import APIConnectionError
from stratamem.integrations.llama_index import StratamemMemoryBlock


@pytest.fixture
def semantic(make_memory: Callable[..., Memory], local_embedder: Any) -> Memory:
    return make_memory(embedder=local_embedder)


def _chat_memory(block: StratamemMemoryBlock, session_id: str) -> LlamaMemory:
    """LlamaIndex's memory with a short-term memory so small that every earlier turn is
    flushed into the block, and the block's content put into the latest user message."""
    return LlamaMemory.from_defaults(
        session_id=session_id,
        token_limit=60,
        chat_history_token_ratio=0.5,
        token_flush_size=10,
        memory_blocks=[block],
        insert_method=InsertMethod.USER,
    )


def _say(memory: LlamaMemory, *turns: tuple[str, str]) -> None:
    async def put() -> None:
        for role, text in turns:
            await memory.aput(ChatMessage(role=role, content=text))

    asyncio.run(put())


def _last_user(messages: list[ChatMessage]) -> str:
    user = [m for m in messages if m.role == "user"][-1]
    return "\n".join(getattr(b, "text", "") for b in user.blocks)


PEANUTS = [
    ("user", "I'm allergic to peanuts, please remember that."),
    ("assistant", "Noted: no peanuts for you."),
    ("user", "Thanks. What is the weather in Paris today?"),
    ("assistant", "Sunny in Paris."),
]


def _conversation(memory: MemoryAPI) -> None:
    """ana says what she is allergic to in one conversation and asks about it in another;
    ben asks the same."""
    monday = _chat_memory(StratamemMemoryBlock(memory=memory, user_id="ana"), "monday")
    _say(monday, *PEANUTS)
    stored = memory.messages.list(session_id="monday", limit=100)
    assert [(m.role, m.content) for m in stored][:2] == [
        ("user", PEANUTS[0][1]),
        ("assistant", PEANUTS[1][1]),
    ]
    memory.wait()

    friday = _chat_memory(StratamemMemoryBlock(memory=memory, user_id="ana"), "friday")
    _say(friday, ("user", "Can you suggest a snack for me?"))
    asked = _last_user(asyncio.run(friday.aget()))
    assert "<memory>" in asked and "allergic to peanuts" in asked
    assert asked.rstrip().endswith("Can you suggest a snack for me?")
    other = _chat_memory(StratamemMemoryBlock(memory=memory, user_id="ben"), "ben-friday")
    _say(other, ("user", "Can you suggest a snack for me?"))
    assert "<memory>" not in _last_user(asyncio.run(other.aget()))


def test_memory_of_one_conversation_is_recalled_in_another(semantic: Memory) -> None:
    _conversation(semantic)


def test_another_project_recalls_nothing(semantic: Memory) -> None:
    _say(_chat_memory(StratamemMemoryBlock(memory=semantic, user_id="ana"), "p1"), *PEANUTS)
    semantic.wait()
    semantic.projects.create("other", project_id="other")
    elsewhere = StratamemMemoryBlock(memory=semantic.for_project("other"), user_id="ana")
    chat = _chat_memory(elsewhere, "p2")
    _say(chat, ("user", "Can you suggest a snack for me?"))
    assert "<memory>" not in _last_user(asyncio.run(chat.aget()))


def test_a_correction_replaces_the_old_value(semantic: Memory) -> None:
    block = StratamemMemoryBlock(memory=semantic, user_id="ana")
    asyncio.run(block.aput([ChatMessage(role="user", content="I drive a Honda Civic.")]))
    semantic.wait()
    correction = "Correction: I drive a Tesla Model 3 now."
    asyncio.run(block.aput([ChatMessage(role="user", content=correction)]))
    semantic.wait()
    got = asyncio.run(block.aget([ChatMessage(role="user", content="What car do I drive?")]))
    assert "Tesla" in got
    if "Honda" in got:  # history may be quoted, marked, after the current value
        assert got.index("Tesla") < got.index("Honda") and "(superseded)" in got


def test_forgetting_in_stratamem_removes_it_from_the_block(semantic: Memory) -> None:
    block = StratamemMemoryBlock(memory=semantic, user_id="ana", session_id="notes")
    asyncio.run(block.aput([ChatMessage(role="user", content="I'm allergic to peanuts.")]))
    semantic.wait()
    ask = [ChatMessage(role="user", content="Can you suggest a snack?")]
    assert "peanuts" in asyncio.run(block.aget(ask))
    semantic.forget(user_id="ana", session_id="notes")
    assert "peanuts" not in asyncio.run(block.aget(ask))
    # The block makes its session again for what comes next.
    asyncio.run(block.aput([ChatMessage(role="user", content="I live in Lisbon.")]))
    assert [m.content for m in semantic.messages.list(session_id="notes")] == ["I live in Lisbon."]


def test_what_is_stored_and_what_is_not(mem: Memory) -> None:
    block = StratamemMemoryBlock(memory=mem, user_id="ana", session_id="s")
    asyncio.run(
        block.aput(
            [
                ChatMessage(role="system", content="Be brief."),
                ChatMessage(role="user", content="Hello \u0000 café"),
                ChatMessage(role="tool", content="42"),
                ChatMessage(role="assistant", content=""),
                ChatMessage(role="assistant", content="Hi!"),
            ],
            session_id="named",  # LlamaIndex names the conversation: it is the session
        )
    )
    assert [(m.role, m.content) for m in mem.messages.list(session_id="named")] == [
        ("user", "Hello \ufffd café"),
        ("assistant", "Hi!"),
    ]
    # A question without text asks nothing.
    assert asyncio.run(block.aget([ChatMessage(role="user", content="")])) == ""
    assert asyncio.run(block.aget(None)) == ""


def test_long_turns_are_split_over_messages(make_memory: Callable[..., Memory]) -> None:
    small = make_memory(max_content_chars=1000)
    block = StratamemMemoryBlock(memory=small, user_id="ana", session_id="s")
    text = "x" * 2500
    asyncio.run(block.aput([ChatMessage(role="user", content=text)]))
    stored = [m.content for m in small.messages.list(session_id="s")]
    assert [len(c) for c in stored] == [1000, 1000, 500] and "".join(stored) == text
    # A run of white space longer than a message would leave a blank piece, which no store
    # takes: the runs become single spaces, and nothing else of the turn is lost.
    spaced = "a" * 999 + " " * 1500 + "b"
    asyncio.run(block.aput([ChatMessage(role="user", content=spaced)], session_id="t"))
    kept = [m.content for m in small.messages.list(session_id="t")]
    assert all(c.strip() and len(c) <= 1000 for c in kept)
    assert " ".join("".join(kept).split()) == "a" * 999 + " b"


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="stratamem Memory"):
        StratamemMemoryBlock(memory=object(), user_id="ana")
    dead = connect(f"http://127.0.0.1:{free_port()}", api_key="sm_x", max_retries=0)
    with pytest.raises(ValueError, match="user_id"):
        StratamemMemoryBlock(memory=dead, user_id="  ")
    dead.close()


def test_a_failed_recall_leaves_the_call_without_memory(caplog: pytest.LogCaptureFixture) -> None:
    dead = connect(f"http://127.0.0.1:{free_port()}", api_key="sm_x", max_retries=0)
    block = StratamemMemoryBlock(memory=dead, user_id="ana")
    with caplog.at_level(logging.WARNING, logger="stratamem.integrations.llama_index"):
        got = asyncio.run(block.aget([ChatMessage(role="user", content="Hi")]))
    assert got == "" and "recall failed" in caplog.text
    # A store that fails is not hidden: LlamaIndex's caller sees it.
    with pytest.raises(APIConnectionError):
        asyncio.run(block.aput([ChatMessage(role="user", content="Hi")]))
    dead.close()


# -- against a server ----------------------------------------------------------------------


@pytest.mark.slow
def test_against_a_server(served: str) -> None:
    url, key = served.split()
    with connect(url, api_key=key) as remote:
        _conversation(remote)
        remote.erase_user("ana")
        remote.erase_user("ben")


# -- packaging -----------------------------------------------------------------------------


def test_without_llama_index_the_module_names_the_extra() -> None:
    assert_names_the_extra("llama_index", "stratamem.integrations.llama_index", "llama-index")


def test_the_docs_example_runs(tmp_path: Path) -> None:
    assert "allergic to peanuts" in run_docs_example("llama-index.md", tmp_path)
