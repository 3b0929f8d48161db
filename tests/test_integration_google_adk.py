"""StratamemMemoryService: Google ADK's ``BaseMemoryService``, driven by ADK itself — its
session service and events, and a real ``Runner`` whose Gemini calls go to the suite's fake
Gemini server with ADK's ``PreloadMemoryTool`` — embedded on both stores and against a real
``stratamem serve``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from google.adk.agents import LlmAgent
from google.adk.events.event import Event
from google.adk.memory.memory_entry import MemoryEntry
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService
from google.adk.tools.preload_memory_tool import PreloadMemoryTool
from google.genai import types

from conftest import assert_names_the_extra, run_docs_example
from fakes.google_server import FakeGeminiServer
from stratamem import Memory, connect
from stratamem.api import MemoryAPI
from stratamem.integrations.google_adk import StratamemMemoryService

APP = "shop"


@pytest.fixture
def semantic(make_memory: Callable[..., Memory], local_embedder: Any) -> Memory:
    return make_memory(embedder=local_embedder)


@pytest.fixture
def gemini(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeGeminiServer]:
    with FakeGeminiServer() as server:
        monkeypatch.setenv("GOOGLE_API_KEY", "k")
        monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", server.base_url)
        monkeypatch.delenv("GOOGLE_GENAI_USE_VERTEXAI", raising=False)
        yield server


def _content(role: str, text: str) -> types.Content:
    return types.Content(role=role, parts=[types.Part(text=text)])


def _session_with(user: str, session_id: str, *turns: tuple[str, str]) -> Any:
    """An ADK session (ADK's own session service) holding ``turns`` (author, text)."""

    async def make() -> Any:
        sessions = InMemorySessionService()
        session = await sessions.create_session(app_name=APP, user_id=user, session_id=session_id)
        for author, text in turns:
            role = "user" if author == "user" else "model"
            event = Event(invocation_id="i1", author=author, content=_content(role, text))
            await sessions.append_event(session, event)
        return session

    return asyncio.run(make())


def _search(service: StratamemMemoryService, user: str, query: str) -> list[MemoryEntry]:
    found = asyncio.run(service.search_memory(app_name=APP, user_id=user, query=query))
    return list(found.memories)


def _texts(entries: list[MemoryEntry]) -> str:
    return "\n".join(p.text or "" for e in entries for p in (e.content.parts or []))


def _run_agent(service: StratamemMemoryService, user: str, text: str) -> None:
    """A real ADK run: an agent with ADK's PreloadMemoryTool (it searches the memory
    service for the user's message and puts what it finds in a turn before it)."""

    async def run() -> None:
        sessions = InMemorySessionService()
        agent = LlmAgent(
            name="assistant",
            model="gemini-2.0-flash",
            instruction="Be brief.",
            tools=[PreloadMemoryTool()],
        )
        runner = Runner(agent=agent, app_name=APP, session_service=sessions, memory_service=service)
        session = await sessions.create_session(app_name=APP, user_id=user)
        async for _ in runner.run_async(
            user_id=user, session_id=session.id, new_message=_content("user", text)
        ):
            pass
        done = await sessions.get_session(app_name=APP, user_id=user, session_id=session.id)
        assert done is not None
        await service.add_session_to_memory(done)

    asyncio.run(run())


def _conversation(memory: MemoryAPI, gemini: FakeGeminiServer) -> None:
    service = StratamemMemoryService(memory, app_name=APP)
    gemini.chat_replies.append("Noted, no peanuts.")
    _run_agent(service, "ana", "I'm allergic to peanuts.")
    memory.wait()
    stored = memory.messages.list(user_id="ana", limit=10)
    assert ("user", "I'm allergic to peanuts.") in [(m.role, m.content) for m in stored]
    assert ("assistant", "Noted, no peanuts.") in [(m.role, m.content) for m in stored]

    gemini.chat_replies.append("Try an apple.")
    _run_agent(service, "ana", "Can you suggest a snack for me?")
    # ADK puts what the memory service found in a user turn of its own (transient).
    asked = str(gemini.generate_requests()[-1]["contents"])
    assert "<PAST_CONVERSATIONS>" in asked and "allergic to peanuts" in asked
    gemini.chat_replies.append("Try an apple.")
    _run_agent(service, "ben", "Can you suggest a snack for me?")
    assert "peanuts" not in str(gemini.generate_requests()[-1]["contents"])


def test_memory_of_one_session_is_recalled_in_another(
    semantic: Memory, gemini: FakeGeminiServer
) -> None:
    _conversation(semantic, gemini)


def test_adding_a_session_again_stores_only_its_new_events(semantic: Memory) -> None:
    service = StratamemMemoryService(semantic, app_name=APP)
    session = _session_with("ana", "s1", ("user", "I live in Lisbon."), ("assistant", "Nice."))
    asyncio.run(service.add_session_to_memory(session))
    asyncio.run(service.add_session_to_memory(session))
    stored = semantic.messages.list(session_id="s1")
    assert [(m.role, m.content) for m in stored] == [
        ("user", "I live in Lisbon."),
        ("assistant", "Nice."),
    ]
    assert stored[0].metadata == {"google_adk": {"author": "user"}}
    events = [Event(author="user", content=_content("user", "I have a cat."))]
    asyncio.run(service.add_events_to_memory(app_name=APP, user_id="ana", events=events))
    assert [m.content for m in semantic.messages.list(session_id="adk-ana")] == ["I have a cat."]


def test_add_memory_search_and_what_an_entry_says(semantic: Memory) -> None:
    service = StratamemMemoryService(semantic, app_name=APP)
    entry = MemoryEntry(content=_content("user", "I prefer window seats."), id="pref-1")
    asyncio.run(
        service.add_memory(
            app_name=APP, user_id="ana", memories=[entry], custom_metadata={"source": "form"}
        )
    )
    semantic.wait()
    (note,) = semantic.messages.list(session_id="adk-memories-ana")
    assert note.event_type == "memory" and note.metadata == {"google_adk": {"source": "form"}}
    found = _search(service, "ana", "Which seat do I like?")
    assert "window seats" in _texts(found)
    top = found[0]
    assert top.id and top.custom_metadata["current"] is True and top.custom_metadata["message_ids"]
    assert _search(service, "ana", "   ") == []


def test_another_user_app_or_project_sees_nothing(semantic: Memory) -> None:
    service = StratamemMemoryService(semantic, app_name=APP)
    asyncio.run(
        service.add_session_to_memory(
            _session_with("ana", "s", ("user", "I'm allergic to peanuts."))
        )
    )
    semantic.wait()
    assert "peanuts" not in _texts(_search(service, "ben", "peanuts allergy"))
    (found, *_) = _search(service, "ana", "peanuts allergy")
    with pytest.raises(ValueError, match="not user 'ben'"):  # ben cannot delete ana's
        asyncio.run(service.delete_memory(app_name=APP, user_id="ben", memory_id=found.id))
    with pytest.raises(ValueError, match="serves the ADK app 'shop'"):
        asyncio.run(service.search_memory(app_name="other", user_id="ana", query="peanuts"))
    semantic.projects.create("other", project_id="other")
    elsewhere = StratamemMemoryService(semantic.for_project("other"), app_name=APP)
    assert _search(elsewhere, "ana", "peanuts allergy") == []


def test_a_correction_replaces_the_old_value(semantic: Memory) -> None:
    service = StratamemMemoryService(semantic, app_name=APP)
    asyncio.run(
        service.add_session_to_memory(
            _session_with("ana", "c1", ("user", "I drive a Honda Civic."))
        )
    )
    semantic.wait()
    later = _session_with("ana", "c2", ("user", "Correction: I drive a Tesla Model 3 now."))
    asyncio.run(service.add_session_to_memory(later))
    semantic.wait()
    found = _search(service, "ana", "What car do I drive?")
    assert "Tesla" in _texts(found[:1])


def test_deleting_through_the_seam_deletes_in_stratamem_and_the_reverse(semantic: Memory) -> None:
    service = StratamemMemoryService(semantic, app_name=APP)
    session = _session_with(
        "ana", "d1", ("user", "I'm allergic to peanuts."), ("user", "I live in Lisbon.")
    )
    asyncio.run(service.add_session_to_memory(session))
    semantic.wait()
    for entry in _search(service, "ana", "peanuts allergy"):
        if "peanuts" in _texts([entry]):
            asyncio.run(service.delete_memory(app_name=APP, user_id="ana", memory_id=entry.id))
    assert "peanuts" not in _texts(_search(service, "ana", "peanuts allergy"))
    assert [m.content for m in semantic.messages.list(session_id="d1")] == ["I live in Lisbon."]
    # ADK adds the session again after the next turn: the deleted event stays deleted.
    asyncio.run(service.add_session_to_memory(session))
    assert [m.content for m in semantic.messages.list(session_id="d1")] == ["I live in Lisbon."]
    # Deleted in stratamem: the seam no longer finds it; deleting again is no error.
    semantic.forget(user_id="ana", session_id="d1")
    assert "Lisbon" not in _texts(_search(service, "ana", "Where do I live?"))
    asyncio.run(service.delete_memory(app_name=APP, user_id="ana", memory_id="m_gone"))
    # The forgotten session is made again for what ADK adds to it next.
    cat = [Event(author="user", content=_content("user", "I have a cat."))]
    asyncio.run(
        service.add_events_to_memory(app_name=APP, user_id="ana", events=cat, session_id="d1")
    )
    assert [m.content for m in semantic.messages.list(session_id="d1")] == ["I have a cat."]


def test_bad_input_is_refused(mem: Memory) -> None:
    service = StratamemMemoryService(mem, app_name=APP)
    with pytest.raises(TypeError):
        StratamemMemoryService(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        StratamemMemoryService(mem, limit=0)
    with pytest.raises(ValueError, match="user_id"):
        asyncio.run(service.search_memory(app_name=APP, user_id=" ", query="x"))
    empty = MemoryEntry(content=types.Content(role="user", parts=[]))
    with pytest.raises(ValueError, match="without text"):
        asyncio.run(service.add_memory(app_name=APP, user_id="ana", memories=[empty]))
    assert mem.messages.list(user_id="ana") == []


# -- against a server ----------------------------------------------------------------------


@pytest.mark.slow
def test_against_a_server(served: str, gemini: FakeGeminiServer) -> None:
    url, key = served.split()
    with connect(url, api_key=key) as remote:
        _conversation(remote, gemini)
        remote.erase_user("ana")
        remote.erase_user("ben")


def test_without_adk_the_module_names_the_extra() -> None:
    assert_names_the_extra("google.adk", "stratamem.integrations.google_adk", "google-adk")


def test_the_docs_example_runs(tmp_path: Path) -> None:
    with FakeGeminiServer() as fake:
        fake.chat_replies.extend(["Noted.", "Try an apple."])
        out = run_docs_example(
            "google-adk.md",
            tmp_path,
            GOOGLE_API_KEY="k",
            GOOGLE_GEMINI_BASE_URL=fake.base_url,
            GOOGLE_GENAI_USE_VERTEXAI="false",
        )
        assert out.split("\n")[:2] == ["Noted.", "Try an apple."]
        assert "allergic to peanuts" in str(fake.generate_requests()[-1]["contents"])
