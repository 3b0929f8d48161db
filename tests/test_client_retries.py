"""A write whose answer is lost after it committed is resent by the client and stored once.

A fault-injecting proxy (``fakes.fault_proxy``) sits between the client and a real
`stratamem serve` on 127.0.0.1: it lets each write reach the server and commit, then drops
the connection or answers 503 instead of the server's answer. The sync client, the async
client and the remote ``Memory`` resend (they gave the messages, events and sessions their
ids before the first try), and every message and session exists exactly once, on both
backends. What cannot be resent safely (a webhook's creation, a ``sync=True`` write after a
503) is sent once and reported.
"""

from __future__ import annotations

import asyncio
import inspect
import re
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from fakes import FakeOpenAIServer
from fakes.fault_proxy import Fault, FaultProxy
from server_proc import ServerProcess
from stratamem import Memory
from stratamem.client import (
    APIConnectionError,
    AsyncMemoryClient,
    ConflictError,
    MemoryClient,
    RemoteMemory,
    ServerError,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, module_db_url: str) -> Iterator[ServerProcess]:
    proc = ServerProcess(
        tmp_path_factory.mktemp("retries"),
        db_url=module_db_url,
        env={"STRATAMEM_WEBHOOK_ALLOW": "127.0.0.1"},
    ).start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def key(server: ServerProcess) -> str:
    return server.bootstrap_key()


@pytest.fixture
def proxy(server: ServerProcess) -> Iterator[FaultProxy]:
    p = FaultProxy(server.url)
    yield p
    p.close()


@pytest.fixture
def direct(server: ServerProcess, key: str) -> Iterator[MemoryClient]:
    """A client straight to the server, to see what is stored."""
    with MemoryClient(api_key=key, base_url=server.url) as c:
        yield c


async def _done(value: Any) -> Any:
    # One scenario for the sync and the async faces: await what is awaitable.
    return await value if inspect.isawaitable(value) else value


def _resent(proxy: FaultProxy, path: str, fault: Fault) -> None:
    """The write reached the server and succeeded twice: the lost answer, then the resend."""
    sent = proxy.sent("POST", path)
    assert [got for _, got in sent] == [fault, "answer"], sent
    assert all(status < 300 for status, _ in sent), sent


async def _writes_once(client: Any, proxy: FaultProxy, direct: MemoryClient, fault: Fault) -> None:
    user = f"u-{fault}-{type(client).__name__}"

    proxy.arm(fault, "POST", "/api/sessions")
    session = await _done(client.sessions.create(user_id=user, title="moving"))
    _resent(proxy, "/api/sessions", fault)
    assert [s.id for s in direct.sessions.list(user_id=user)] == [session.id]

    path = f"/api/sessions/{session.id}/messages"
    said = [
        {"role": "user", "content": "I moved to Lisbon in May."},
        {"role": "assistant", "content": "Noted: Lisbon since May."},
        {"role": "user", "content": "My dog is called Figo.", "id": f"{user}-figo"},
    ]
    proxy.arm(fault, "POST", path)
    result = await _done(client.add_messages(session.id, said))
    _resent(proxy, path, fault)
    assert result.message_ids[2] == f"{user}-figo"  # the caller's own id is kept
    assert result.duplicates == result.message_ids  # the resend found all of them stored
    stored = direct.messages.list(session_id=session.id)
    assert [(m.id, m.content) for m in stored] == [
        (mid, m["content"]) for mid, m in zip(result.message_ids, said, strict=True)
    ]

    proxy.arm(fault, "POST", "/api/user/actions")
    await _done(client.user_actions.record(user, event_type="search", content="rain jackets"))
    proxy.arm(fault, "POST", "/api/user/actions")
    events = [{"event_type": "view", "page": "/p/42"}, {"event_type": "click", "page": "/cart"}]
    await _done(client.user_actions.record(user, events=events))
    assert [got for _, got in proxy.sent("POST", "/api/user/actions")] == [
        fault,
        "answer",
        fault,
        "answer",
    ]
    recorded = direct.messages.list(session_id=f"actions-{user}")
    assert [m.event_type for m in recorded] == ["search", "view", "click"]


@pytest.mark.parametrize("fault", ["drop", "503"])
@pytest.mark.parametrize("face", ["sync", "async", "remote"])
def test_a_write_whose_answer_is_lost_is_resent_and_stored_once(
    face: str, fault: Fault, key: str, proxy: FaultProxy, direct: MemoryClient
) -> None:
    async def scenario() -> None:
        if face == "async":
            async with AsyncMemoryClient(api_key=key, base_url=proxy.url) as ac:
                await _writes_once(ac, proxy, direct, fault)
            return
        client = (
            MemoryClient(api_key=key, base_url=proxy.url)
            if face == "sync"
            else Memory(proxy.url, api_key=key)
        )
        with client:
            await _writes_once(client, proxy, direct, fault)

    asyncio.run(scenario())


def test_a_sync_write_is_resent_after_a_drop_not_after_a_503(
    key: str, proxy: FaultProxy, direct: MemoryClient
) -> None:
    with MemoryClient(api_key=key, base_url=proxy.url) as c:
        session = c.sessions.create(user_id="sync-writer")
        path = f"/api/sessions/{session.id}/messages"
        proxy.arm("drop", "POST", path)
        oslo = [{"role": "user", "content": "I live in Oslo."}]
        done = c.add_messages(session.id, oslo, sync=True)
        assert done.processed
        _resent(proxy, path, "drop")
        # A 503 to sync=True mostly means processing outlasted the server's wait: a resend
        # would wait as long again, so the caller hears of it at once.
        proxy.arm("503", "POST", path)
        with pytest.raises(ServerError) as info:
            c.add_messages(session.id, [{"role": "user", "content": "I cycle."}], sync=True)
        assert info.value.status_code == 503
        assert [got for _, got in proxy.sent("POST", path)][2:] == ["503"]
    contents = [m.content for m in direct.messages.list(session_id=session.id)]
    assert contents == ["I live in Oslo.", "I cycle."]


def test_a_webhook_whose_creation_answer_is_lost_is_not_created_twice(
    key: str, proxy: FaultProxy, direct: MemoryClient
) -> None:
    # No id makes a second POST /api/webhooks a no-op, so the client does not resend it.
    before = len(direct.webhooks.list())
    proxy.arm("drop", "POST", "/api/webhooks")
    with MemoryClient(api_key=key, base_url=proxy.url) as c, pytest.raises(APIConnectionError):
        c.webhooks.create(
            resource="fact",
            event="after_llm",
            target_url="http://127.0.0.1:9/hook",
            mode="async",
            enabled=False,
        )
    assert [got for _, got in proxy.sent("POST", "/api/webhooks")] == ["drop"]
    assert len(direct.webhooks.list()) == before + 1


def test_a_captured_exchange_whose_answer_is_lost_is_stored_once(
    key: str, proxy: FaultProxy, direct: MemoryClient
) -> None:
    with FakeOpenAIServer() as llm:
        llm.chat_script = lambda body: "Noted!"
        mem = RemoteMemory(proxy.url, api_key=key, capture_recall_timeout_ms=5_000)
        chat = mem.llm.register(openai.OpenAI(base_url=llm.base_url, api_key="k", max_retries=0))
        proxy.arm("drop", "POST", "/api/sessions/cap-lost/messages")
        with mem.scope(user_id="cap", session_id="cap-lost"):
            asked = [{"role": "user", "content": "My cat is called Miso."}]
            chat.chat.completions.create(model="m", messages=asked)
        assert mem.llm.flush(10)
        mem.close(timeout=5)
    _resent(proxy, "/api/sessions/cap-lost/messages", "drop")
    stored = [(m.role, m.content) for m in direct.messages.list(session_id="cap-lost")]
    assert stored == [("user", "My cat is called Miso."), ("assistant", "Noted!")]


def test_ids_the_client_gives_have_the_servers_form(
    server: ServerProcess, key: str, direct: MemoryClient
) -> None:
    form = re.compile(r"[sm]_[0-9a-f]{24}")
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Api-Key {key}"}) as raw:
        made = raw.post("/api/sessions", json={"user_id": "form"}).json()["data"]["session_id"]
        body = {"messages": [{"role": "user", "content": "server-made id"}]}
        answer = raw.post(f"/api/sessions/{made}/messages", json=body).json()["data"]
    session = direct.sessions.create(user_id="form")
    result = session.add_messages([{"role": "user", "content": "client-made id"}])
    for sid in (made, session.id):
        assert form.fullmatch(sid) and sid.startswith("s_"), sid
    for mid in (*answer["message_ids"], *result.message_ids):
        assert form.fullmatch(mid) and mid.startswith("m_"), mid

    # What makes the resends safe, on this backend: the same id and content is a duplicate,
    # the same id with other content a conflict, and neither stores anything.
    mid = result.message_ids[0]
    again = session.add_messages([{"id": mid, "role": "user", "content": "client-made id"}])
    assert again.duplicates == [mid] and again.job_id is None
    with pytest.raises(ConflictError):
        session.add_messages([{"id": mid, "role": "user", "content": "other content"}])
    assert [m.content for m in session.messages()] == ["client-made id"]
