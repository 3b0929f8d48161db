"""stratamem.client against a real `stratamem serve` process on 127.0.0.1.

Sync and async round trips in GUMem's SDK shape, typed errors for every refusal, timeouts
against a server that never answers, retries only where they are safe, RemoteMemory as the
Memory facade (parity of names and behaviour), and capture (`mem.llm.register`) writing to
and recalling from a server.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

import stratamem.errors as engine_errors
from fakes.openai_server import FakeOpenAIServer
from server_proc import ServerProcess, free_port
from stratamem import Memory
from stratamem.capture import MEMORY_PREAMBLE
from stratamem.client import (
    APIConnectionError,
    APIError,
    APIStatusError,
    APITimeoutError,
    AsyncMemoryClient,
    AuthenticationError,
    ConflictError,
    MemoryClient,
    NotFoundError,
    PayloadTooLargeError,
    RemoteMemory,
    ServerError,
    ValidationError,
)
from stratamem.types import AddResult, Fact, Hit, MemoryContext, RecallConfig, Session, Summary

pytestmark = pytest.mark.slow

MAX_CONTENT = 4_000
MAX_BODY = 262_144


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, module_db_url: str) -> Iterator[ServerProcess]:
    proc = ServerProcess(
        tmp_path_factory.mktemp("client"),
        db_url=module_db_url,
        env={
            "STRATAMEM_MAX_CONTENT_CHARS": str(MAX_CONTENT),
            "STRATAMEM_MAX_BODY_BYTES": str(MAX_BODY),
        },
    ).start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def client(server: ServerProcess) -> Iterator[MemoryClient]:
    with MemoryClient(api_key=server.bootstrap_key(), base_url=server.url) as c:
        yield c


@pytest.fixture
def remote(server: ServerProcess) -> Iterator[RemoteMemory]:
    # Recall crosses a socket here: give it more than the embedded default of 50 ms.
    mem = RemoteMemory(server.url, api_key=server.bootstrap_key(), capture_recall_timeout_ms=5_000)
    yield mem
    mem.close(timeout=5)


# -- sync and async round trips ------------------------------------------------------------


def test_sync_round_trip(client: MemoryClient) -> None:
    s = client.sessions.create(user_id="ana", title="kitchen", metadata={"channel": "web"})
    assert isinstance(s, Session) and s.user_id == "ana" and s.title == "kitchen"
    assert s.metadata == {"channel": "web"} and s.session_id == s.id
    assert client.sessions.get(s.id) == s

    queued = s.add_messages([{"role": "user", "content": "I am allergic to peanuts."}])
    assert isinstance(queued, AddResult) and not queued.processed
    client.wait(timeout=30)
    assert client.processing_status(s.id).done
    done = s.add_messages(
        [
            {"role": "assistant", "content": "Noted, no peanuts."},
            {"role": "user", "content": "I moved to Berlin in March.", "id": "ana-berlin"},
        ],
        sync=True,
    )
    assert done.processed and done.message_ids[1] == "ana-berlin"

    plain = s.get_memory("What is the user allergic to?")
    assert isinstance(plain, MemoryContext) and plain.session_id == s.id
    assert "peanuts" in plain.formatted_context and plain.matches is None
    assert [m.content for m in plain.history][:1] == ["I am allergic to peanuts."]
    assert plain.summary and "allergic to peanuts" in plain.summary

    detailed = s.get_memory("Where does the user live?", details=True)
    assert detailed.matches and all(isinstance(h, Hit) for h in detailed.matches)
    assert any("Berlin" in h.text for h in detailed.matches)

    # recall_config as a dict (GUM's and GUMem's spelling) and as RecallConfig.
    no_history = s.get_memory("peanuts", recall_config={"MessageRecentLimit": 0})
    assert no_history.history == [] and "peanuts" in no_history.formatted_context
    tight = s.get_memory("peanuts", recall_config=RecallConfig(message_recent_limit=1))
    assert len(tight.history) == 1

    # The same turn again with its id: a duplicate, not a second message.
    again = s.add_messages(
        [{"role": "user", "content": "I moved to Berlin in March.", "id": "ana-berlin"}]
    )
    assert again.duplicates == ["ana-berlin"]
    assert len(s.messages()) == 3


def test_gumem_sdk_forms(client: MemoryClient) -> None:
    s = client.sessions.create({"user_id": "gus", "title": "GUMem style"})
    assert s.user_id == "gus" and s.title == "GUMem style"
    s.add_messages(
        [
            {
                "role": "user",
                "content": "Use Berlin for Europe team scheduling.",
                "metadata": {"ping": "pong"},
            }
        ],
        sync=True,
    )
    ctx = s.get_memory(
        {
            "query": "which city for Europe scheduling",
            "details": True,
            "recall_config": {"MessageRecentLimit": 20, "MetadataFilters": {"ping": "pong"}},
        }
    )
    assert "Berlin" in ctx.formatted_context and ctx.matches is not None
    filtered = s.get_memory(
        "which city for Europe scheduling",
        recall_config={"MessageRecentLimit": 0, "MetadataFilters": {"ping": "other"}},
    )
    assert "Berlin" not in filtered.formatted_context
    # Ids may hold "/", "+", "@": each travels as one path segment.
    odd = client.sessions.create(user_id="gus", session_id="team/eu+1@x")
    assert client.sessions.get("team/eu+1@x").id == odd.id == "team/eu+1@x"
    assert odd.add_messages([{"role": "user", "content": "hello"}]).session_id == odd.id
    assert client.health()["status"] == "ok"


def test_get_memory_sends_the_texts_the_prompt_carries(
    client: MemoryClient, server: ServerProcess
) -> None:
    s = client.sessions.create(user_id="eve")
    grown = ["I grow tomatoes on my balcony.", "I grow basil in the kitchen."]
    s.add_messages([{"role": "user", "content": t} for t in grown], sync=True)
    config = {"MessageRecentLimit": 0}
    plain = s.get_memory("what do I grow", recall_config=config)
    assert all(t in plain.formatted_context for t in grown)
    ctx = s.get_memory("what do I grow", recall_config=config, exclude_texts=grown[:1])
    assert grown[0] not in ctx.formatted_context and grown[1] in ctx.formatted_context
    # GUMem's form: beside the query in the dict.
    gumem = s.get_memory(
        {"query": "what do I grow", "recall_config": config, "exclude_texts": grown[1:]}
    )
    assert grown[1] not in gumem.formatted_context and grown[0] in gumem.formatted_context

    async def from_async() -> str:
        async with AsyncMemoryClient(api_key=server.bootstrap_key(), base_url=server.url) as c:
            ctx = await c.get_memory(
                s.id, "what do I grow", recall_config=config, exclude_texts=grown
            )
            return ctx.formatted_context

    assert not any(t in asyncio.run(from_async()) for t in grown)
    # Refused before sending, by the engine's rules; the server's own limit on length.
    with pytest.raises(ValidationError, match=r"exclude_texts: expected a list"):
        s.get_memory("x", exclude_texts="I grow tomatoes")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match=r"exclude_texts\[0\]"):
        s.get_memory("x", exclude_texts=[3])  # type: ignore[list-item]
    with pytest.raises(ValidationError) as long:
        s.get_memory("x", exclude_texts=["x" * (MAX_CONTENT + 1)])
    assert long.value.status_code == 422 and long.value.problems[0].startswith("exclude_texts[0]")


def test_async_round_trip(server: ServerProcess) -> None:
    async def scenario() -> None:
        async with AsyncMemoryClient(api_key=server.bootstrap_key(), base_url=server.url) as c:
            s = await c.sessions.create(user_id="ada", title="async")
            assert s.user_id == "ada" and s.data.title == "async"
            first = await s.add_messages([{"role": "user", "content": "I play the cello."}])
            assert not first.processed
            await c.wait(timeout=30)
            await s.add_messages(
                [{"role": "user", "content": "I practise every morning at six."}], sync=True
            )
            ctx, detailed = await asyncio.gather(
                s.get_memory("What instrument does the user play?"),
                s.get_memory(
                    "When does the user practise?",
                    details=True,
                    recall_config={"message_recent_limit": 0},
                ),
            )
            assert "cello" in ctx.formatted_context and ctx.matches is None
            assert detailed.matches and detailed.history == []
            assert (await c.sessions.get(s.id)).id == s.id
            assert len(await s.messages()) == 2
            assert (await s.processing_status()).done
            facts = await c.facts.list(user_id="ada")
            assert facts and all(isinstance(f, Fact) for f in facts)
            with pytest.raises(NotFoundError):
                await c.sessions.get("nobody-here")

    asyncio.run(scenario())


# -- typed errors ----------------------------------------------------------------------------


def test_a_bad_or_missing_key_is_an_authentication_error(server: ServerProcess) -> None:
    with MemoryClient(api_key="sm_not-a-real-key-000000000000", base_url=server.url) as c:
        with pytest.raises(AuthenticationError) as info:
            c.sessions.create(user_id="x")
        assert info.value.status_code == 401 and info.value.code == "unauthorized"
        assert info.value.request_id
        assert isinstance(info.value, engine_errors.StratamemError)
        assert c.health()["status"] == "ok"  # no key needed there
    anonymous = MemoryClient(base_url=server.url)  # no key at all
    with anonymous, pytest.raises(AuthenticationError, match="Authorization"):
        anonymous.sessions.get("x")
    # The key may be given with its scheme, as copied from a curl example.
    with MemoryClient(api_key=f"Bearer {server.bootstrap_key()}", base_url=server.url) as c:
        assert c.sessions.create(user_id="bearer").user_id == "bearer"


def test_unknown_ids_conflicts_and_invalid_input_are_typed(client: MemoryClient) -> None:
    with pytest.raises(NotFoundError) as missing:
        client.sessions.get("no-such-session")
    assert isinstance(missing.value, engine_errors.NotFoundError)  # as with an embedded Memory
    assert missing.value.status_code == 404
    with pytest.raises(NotFoundError):
        client.add_messages("no-such-session", [{"role": "user", "content": "hi"}])
    with pytest.raises(NotFoundError):
        client.facts.get("f_nothing")

    client.sessions.create(user_id="cy", session_id="shared-id")
    with pytest.raises(ConflictError) as conflict:
        client.sessions.create(user_id="dee", session_id="shared-id")
    assert isinstance(conflict.value, engine_errors.ConflictError)

    s = client.sessions.get("shared-id")
    with pytest.raises(ValidationError) as bad:
        s.add_messages([{"role": "user", "content": "ok"}, {"role": "bot", "content": "hi"}])
    assert isinstance(bad.value, engine_errors.ValidationError)
    assert bad.value.status_code == 422
    assert any(p.startswith("messages[1].role:") for p in bad.value.problems)
    assert "messages[1].role" in str(bad.value)
    with pytest.raises(ValidationError, match="recall_config"):
        s.get_memory("x", recall_config={"no_such_key": 1})
    with pytest.raises(ValidationError, match="status"):
        client.set_status("s_whatever", "forgotten", reason="r")
    # Refused before any request: an id that cannot be one path segment of a real id, and a
    # body that cannot be JSON.
    with pytest.raises(ValidationError, match="session_id"):
        client.sessions.get("")
    with pytest.raises(ValidationError, match="JSON"):
        s.add_messages([{"role": "user", "content": "x", "metadata": {"o": object()}}])
    assert s.messages() == []  # nothing of the refused batch was stored


def test_oversized_input_is_a_payload_too_large_error(client: MemoryClient) -> None:
    s = client.sessions.create(user_id="big")
    with pytest.raises(PayloadTooLargeError) as content:
        s.add_messages([{"role": "user", "content": "x" * (MAX_CONTENT + 1)}])
    assert content.value.status_code == 413
    assert any(p.startswith("messages[0].content:") for p in content.value.problems)
    # A ValidationError too: the embedded engine reports the same limit as one.
    assert isinstance(content.value, engine_errors.ValidationError)
    with pytest.raises(PayloadTooLargeError, match="request body"):
        s.add_messages([{"role": "user", "content": "y" * 3_000}] * 100)
    assert s.messages() == []


# -- timeouts and retries ----------------------------------------------------------------


class _Silent:
    """A loopback server that accepts connections and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


@pytest.fixture
def silent() -> Iterator[_Silent]:
    s = _Silent()
    yield s
    s.close()


def test_a_server_that_never_answers_times_out_within_the_bound(silent: _Silent) -> None:
    with MemoryClient(api_key="k", base_url=silent.url, timeout=0.5) as c:
        start = time.monotonic()
        with pytest.raises(APITimeoutError) as info:
            c.sessions.get("s1")  # idempotent, yet a read timeout is not retried
        elapsed = time.monotonic() - start
    # Once, not 1 + max_retries times: a retried read timeout would take 1.5 s or more.
    assert 0.4 < elapsed < 1.3, elapsed
    assert isinstance(info.value, TimeoutError) and info.value.status_code is None

    async def scenario() -> float:
        async with AsyncMemoryClient(api_key="k", base_url=silent.url, timeout=0.5) as ac:
            t = time.monotonic()
            with pytest.raises(APITimeoutError):
                await ac.get_memory("s1", "anything")
            return time.monotonic() - t

    assert asyncio.run(scenario()) < 1.3


def test_a_refused_connection_is_retried_then_reported(silent: _Silent) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with MemoryClient(api_key="k", base_url=url, max_retries=2) as c:
        start = time.monotonic()
        with pytest.raises(APIConnectionError) as info:
            c.add_messages("s1", [{"role": "user", "content": "hi"}])
    assert not isinstance(info.value, APITimeoutError)
    assert "127.0.0.1" in str(info.value) and time.monotonic() - start < 5


class _Quiet(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


class _Loopback:
    """A threaded HTTP server on 127.0.0.1 (``url``) answering with a handler class."""

    def _serve(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _Flaky(_Loopback):
    """Answers ``status`` to the first ``failures`` requests, then a stratamem envelope
    (after ``delay`` seconds); counts the requests each path received."""

    def __init__(self, failures: int, status: int = 503, delay: float = 0.0) -> None:
        self.failures = failures
        self.seen: dict[str, int] = {}
        flaky = self

        class Handler(_Quiet):
            def _answer(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                self.rfile.read(length)
                flaky.seen[self.path] = flaky.seen.get(self.path, 0) + 1
                if flaky.failures > 0:
                    flaky.failures -= 1
                    status, body = (
                        flaky.status,
                        {
                            "success": False,
                            "data": None,
                            "message": "busy",
                            "error": {"code": "unavailable", "detail": "busy", "request_id": "r1"},
                        },
                    )
                else:
                    time.sleep(flaky.delay)
                    data: dict[str, Any] = {"status": "ok", "version": "x"}
                    if self.path.endswith(("/messages", "/actions")):
                        data = {"session_id": "s", "message_ids": ["m1"]}
                    status, body = (
                        200,
                        {
                            "success": True,
                            "data": data,
                            "message": None,
                            "error": None,
                        },
                    )
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(raw)))
                self.send_header("retry-after", "0")
                self.end_headers()
                self.wfile.write(raw)

            do_GET = do_POST = _answer

        self.status, self.delay = status, delay
        self._serve(Handler)


def test_503_is_retried_only_for_idempotent_requests() -> None:
    flaky = _Flaky(failures=2)
    try:
        with MemoryClient(api_key="k", base_url=flaky.url, max_retries=2) as c:
            assert c.health() == {"status": "ok", "version": "x"}  # GET: third try answers
            assert flaky.seen["/healthz"] == 3
            flaky.failures = 1
            with pytest.raises(ServerError) as info:
                # No id makes a second webhook creation a no-op, so no resend.
                c.webhooks.create(resource="fact", event="after_llm", target_url="http://h/")
            assert flaky.seen["/api/webhooks"] == 1
            assert info.value.status_code == 503 and info.value.request_id == "r1"
            flaky.failures = 1
            # Messages get their ids before the first try, so the server deduplicates the
            # resend; it is safe and made (tests/test_client_retries.py against a server).
            result = c.add_messages("s2", [{"role": "user", "content": "hi"}])
            assert result.message_ids == ["m1"]
            assert flaky.seen["/api/sessions/s2/messages"] == 2
            # Something that is not a stratamem answer is reported as such.
            with pytest.raises(APIError, match="not what this client expects"):
                c.sessions.get("s3")
    finally:
        flaky.close()


@pytest.mark.parametrize("status", [502, 504])
def test_a_proxys_502_and_504_are_retried_like_503(status: int) -> None:
    # What nginx answers while the stratamem server behind it restarts (502) or is slow
    # (504): safe to resend for what a resend cannot duplicate, as a 503 is.
    flaky = _Flaky(failures=1, status=status)
    try:
        with MemoryClient(api_key="k", base_url=flaky.url, max_retries=2) as c:
            assert c.health() == {"status": "ok", "version": "x"}
            assert flaky.seen["/healthz"] == 2
            flaky.failures = 1
            assert c.add_messages("s1", [{"role": "user", "content": "hi"}]).message_ids
            assert flaky.seen["/api/sessions/s1/messages"] == 2
            flaky.failures = 1
            with pytest.raises(ServerError) as info:
                c.webhooks.create(resource="fact", event="after_llm", target_url="http://h/")
            assert info.value.status_code == status and flaky.seen["/api/webhooks"] == 1
            flaky.failures = 1
            with pytest.raises(ServerError):
                # Processing outlasted a bound: a resend would wait as long again.
                c.add_messages("s2", [{"role": "user", "content": "hi"}], sync=True)
            assert flaky.seen["/api/sessions/s2/messages"] == 1
    finally:
        flaky.close()


class _Redirecting(_Loopback):
    """Answers a request with a ``status`` redirect to ``where(path)``, or when that is None
    with a stratamem envelope; records each request's method, path, Authorization, body."""

    def __init__(self, where: Callable[[str], str | None], status: int = 307) -> None:
        self.seen: list[tuple[str, str, str | None, bytes]] = []
        outer = self

        class Handler(_Quiet):
            def _answer(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                outer.seen.append((self.command, self.path, self.headers["authorization"], body))
                target = where(self.path)
                if target is None:
                    data = {"session_id": "s1", "message_ids": ["m1"]}
                    raw = json.dumps({"success": True, "data": data}).encode()
                    self.send_response(200)
                    self.send_header("content-type", "application/json")
                else:
                    raw = b""
                    self.send_response(status)
                    self.send_header("location", target)
                self.send_header("content-length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            do_GET = do_POST = _answer

        self._serve(Handler)


def test_a_redirect_to_another_origin_is_refused_whatever_the_http_client() -> None:
    """Nothing of a request, the key least of all, is sent where a redirect points on
    another origin (another port is one), even with an ``httpx`` client of your own that
    follows redirects; the error says why."""
    elsewhere = _Flaky(failures=0)
    redirecting = _Redirecting(lambda path: elsewhere.url + path)
    message = {"role": "user", "content": "hi"}
    try:
        for http_client in (None, httpx.Client(follow_redirects=True)):
            with MemoryClient(
                api_key="sm_secret", base_url=redirecting.url, http_client=http_client
            ) as c:
                for call in (c.health, lambda: c.add_messages("s1", [message])):
                    with pytest.raises(APIStatusError, match="redirect to another origin") as info:
                        call()
                    assert info.value.status_code == 307
            if http_client is not None:
                http_client.close()
        assert len(redirecting.seen) == 4
        assert elsewhere.seen == {}
    finally:
        redirecting.close()
        elsewhere.close()


def test_a_redirect_on_the_same_origin_is_followed_with_method_body_and_key() -> None:
    server = _Redirecting(
        lambda path: path.removeprefix("/old") if path.startswith("/old/") else None, 308
    )
    try:
        with MemoryClient(api_key="sm_secret", base_url=server.url + "/old") as c:
            result = c.add_messages("s1", [{"id": "m1", "role": "user", "content": "hi"}])
        assert result.message_ids == ["m1"]
        (first, second) = server.seen
        assert first[:3] == ("POST", "/old/api/sessions/s1/messages", "Api-Key sm_secret")
        assert second[:3] == ("POST", "/api/sessions/s1/messages", "Api-Key sm_secret")
        assert first[3] == second[3] and b'"hi"' in first[3]
    finally:
        server.close()


def test_recording_events_with_sync_waits_up_to_sync_timeout() -> None:
    # The server answers a sync=True record once the events are processed, as it does
    # add_messages(sync=True): the call's read timeout is sync_timeout, not timeout.
    flaky = _Flaky(failures=0, delay=0.6)
    try:
        with MemoryClient(
            api_key="k", base_url=flaky.url, timeout=0.2, sync_timeout=10, max_retries=0
        ) as c:
            assert c.user_actions.record("u1", event_type="click", sync=True).message_ids
            with pytest.raises(APITimeoutError):
                c.user_actions.record("u1", event_type="click")
    finally:
        flaky.close()


# -- RemoteMemory: the Memory facade over the server --------------------------------------

# Where the two faces differ on purpose: the server records the calling API key as the
# actor of governance changes, so the remote calls take no `actor`.
_SERVER_OWNED = {"actor"}


def _params(fn: Any) -> list[str]:
    names = [p for p in inspect.signature(fn).parameters if p != "self"]
    return [p for p in names if p not in _SERVER_OWNED]


def test_remote_memory_offers_the_facade_with_the_same_signatures(remote: RemoteMemory) -> None:
    embedded = Memory  # compared by class: no store is opened
    for name in (
        "add_messages",
        "get_memory",
        "search",
        "wait",
        "set_status",
        "forget",
        "erase_user",
        "export_user",
        "audit",
        "processing_status",
        "scope",
        "close",
    ):
        assert _params(getattr(RemoteMemory, name)) == _params(getattr(embedded, name)), name
    from stratamem import memory as local

    faces = {
        "sessions": (local.Sessions, ("create", "get", "list")),
        "messages": (local.Messages, ("get", "list")),
        "facts": (local.Facts, ("list", "get")),
        "summaries": (local.Summaries, ("list", "get", "history")),
        "topics": (local.Topics, ("list", "get")),
    }
    for face, (cls, methods) in faces.items():
        for method in methods:
            mine = getattr(getattr(remote, face), method)
            assert _params(mine) == _params(getattr(cls, method)), f"{face}.{method}"
    assert remote.settings.database_url == remote.base_url
    assert type(remote.llm).__name__ == "Capture"


def test_remote_memory_behaves_like_an_embedded_one(remote: RemoteMemory, make_memory: Any) -> None:
    turns = [
        {"role": "user", "content": "I adopted a cat named Miso in 2024."},
        {"role": "user", "content": "I work as a nurse in Lyon."},
        {"role": "user", "content": "Correction: I now work as a nurse in Grenoble."},
    ]
    local = make_memory()
    results = []
    for mem in (local, remote):
        s = mem.sessions.create(user_id="parity", session_id="parity-1")
        s.add_messages(turns, sync=True)
        ctx = s.get_memory("Where does the user work?", details=True)
        hits = mem.search("What is the cat called?", user_id="parity", limit=5)
        results.append(
            (
                sorted(f.text for f in mem.facts.list(user_id="parity")),
                sorted((x.text, x.status) for x in mem.summaries.list(user_id="parity")),
                sorted(t.name for t in mem.topics.list(user_id="parity")),
                [(h.layer, h.text) for h in hits],
                [(h.layer, h.text) for h in ctx.matches or []],
                [m.content for m in ctx.history],
            )
        )
    assert results[0] == results[1]
    assert any("Miso" in text for _, text in results[1][3])


def test_remote_memory_reads_governs_and_deletes(remote: RemoteMemory) -> None:
    s = remote.sessions.create(user_id="gov", session_id="gov-1", title="one")
    other = remote.sessions.create("gov", session_id="gov-2")
    assert remote.project_id == s.project_id == "default"
    s.add_messages([{"role": "user", "content": "I collect vintage typewriters.", "id": "g1"}])
    other.add_messages([{"role": "user", "content": "My favourite colour is teal.", "id": "g2"}])
    remote.wait(timeout=30)
    assert [x.id for x in remote.sessions.list(user_id="gov")] == ["gov-1", "gov-2"]
    assert remote.messages.get("g1").status == "processed"
    assert [m.id for m in remote.messages.list(session_id="gov-2")] == ["g2"]
    assert remote.messages.list(session_id="gov-2", user_id="someone-else") == []
    assert remote.processing_status("gov-1").processed == 1

    fact = remote.facts.list(user_id="gov", metadata_filters={})[0]
    assert remote.facts.get(fact.id) == fact and fact.message_ids
    summaries = remote.summaries.list(user_id="gov", status="active")
    teal = next(x for x in summaries if "teal" in x.text)
    assert remote.summaries.get(teal.id) == teal
    changed = remote.set_status(teal.id, "archived", reason="user asked")
    assert isinstance(changed, Summary) and changed.status == "archived"
    assert [v["status"] for v in remote.summaries.history(teal.id)][-1] == "archived"
    assert all(
        "teal" not in h.text for h in remote.search("colour", user_id="gov", layers=["summary"])
    )
    topics = remote.topics.list(user_id="gov")
    assert topics and remote.topics.get(topics[0].id) == topics[0]

    counts = remote.forget(user_id="gov", session_id="gov-1", reason="test")
    assert counts["messages"] == 1
    with pytest.raises(NotFoundError):
        remote.sessions.get("gov-1")
    assert all("typewriter" not in f.text for f in remote.facts.list(user_id="gov"))
    ctx = other.get_memory("What does the user collect?")
    assert "typewriter" not in ctx.formatted_context

    exported = remote.export_user("gov")
    assert exported["user_id"] == "gov" and [m["id"] for m in exported["messages"]] == ["g2"]
    actions = [a.action for a in remote.audit(user_id="gov")]
    assert actions == ["set_status", "forget"]
    erased = remote.erase_user("gov", reason="account closed")
    assert erased["messages"] == 1
    assert remote.sessions.list(user_id="gov") == []
    assert [a.action for a in remote.audit(user_id="gov")][-1] == "erase_user"

    remote.close()
    with pytest.raises(engine_errors.ProcessingError, match="closed"):
        remote.sessions.get("gov-2")


def test_paging_beyond_one_server_page_and_wait_bound(tmp_path: Path) -> None:
    # No worker: messages stay pending, so wait() must give up at its bound.
    proc = ServerProcess(tmp_path).start("--no-worker")
    try:
        with MemoryClient(api_key=proc.bootstrap_key(), base_url=proc.url) as c:
            s = c.sessions.create(user_id="many")
            for batch in range(2):
                s.add_messages(
                    [{"role": "user", "content": f"note {batch}-{i}"} for i in range(550)]
                )
            start = time.monotonic()
            with pytest.raises(engine_errors.ProcessingError, match="unprocessed"):
                c.wait(timeout=0.5)
            assert time.monotonic() - start < 3
            everything = s.messages(limit=1100)  # the server pages at 1000
            assert len(everything) == 1100
            assert everything[0].content == "note 0-0" and everything[-1].content == "note 1-549"
            assert all(m.status == "pending" for m in everything)
            tail = c.messages.list(session_id=s.id, limit=5, offset=1098)
            assert [m.content for m in tail] == ["note 1-548", "note 1-549"]
    finally:
        proc.stop()


# -- capture through a server ---------------------------------------------------------------


@pytest.fixture
def llm() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as fake:
        fake.chat_script = lambda body: "Noted!"
        yield fake


def test_capture_recalls_from_and_writes_to_the_server(
    remote: RemoteMemory, llm: FakeOpenAIServer
) -> None:
    s = remote.sessions.create(user_id="cap", session_id="cap-1")
    s.add_messages([{"role": "user", "content": "I am allergic to peanuts."}], sync=True)
    client = remote.llm.register(openai.OpenAI(base_url=llm.base_url, api_key="k", max_retries=0))
    question = [
        {"role": "user", "content": "Suggest a snack with peanuts? My sister Lena lives in Porto."}
    ]
    with remote.scope(user_id="cap", session_id="cap-1"):
        reply = client.chat.completions.create(model="gpt-test", messages=question)
    assert reply.choices[0].message.content == "Noted!"
    (sent,) = llm.chat_requests()[-1]["messages"]  # the memory goes into the user's turn
    asked, block = sent["content"].split("\n\n", 1)
    assert sent["role"] == "user" and asked == question[0]["content"]
    assert block.startswith(MEMORY_PREAMBLE) and "allergic to peanuts" in block

    assert remote.llm.flush(10)
    stored = [(m.role, m.content) for m in remote.messages.list(session_id="cap-1")]
    assert stored[-2:] == [("user", question[0]["content"]), ("assistant", "Noted!")]
    answer = remote.messages.list(session_id="cap-1")[-1]
    assert answer.metadata["capture"]["provider"] == "openai"

    # The stored exchange is memory now: a call in another session recalls it.
    remote.wait(timeout=30)
    with remote.scope(user_id="cap", session_id="cap-2"):
        client.chat.completions.create(
            model="gpt-test", messages=[{"role": "user", "content": "Where does my sister live?"}]
        )
    assert "Porto" in llm.chat_requests()[-1]["messages"][0]["content"]

    # A follow-up in cap-1 carries the first exchange: its block does not repeat it, which
    # the same recall without the request's turns would.
    follow = [
        *question,
        {"role": "assistant", "content": "Noted!"},
        {"role": "user", "content": "And a snack with peanuts for Lena in Porto?"},
    ]
    config = {**remote.llm.recall_config, "message_recent_limit": 0}
    unfiltered = remote.get_memory("cap-1", follow[-1]["content"], recall_config=config)
    assert question[0]["content"] in unfiltered.formatted_context
    with remote.scope(user_id="cap", session_id="cap-1"):
        client.chat.completions.create(model="gpt-test", messages=follow)
    block = llm.chat_requests()[-1]["messages"][-1]["content"].split("\n\n", 1)[1]
    assert block.startswith(MEMORY_PREAMBLE) and "allergic to peanuts" in block
    assert question[0]["content"] not in block


def test_capture_with_an_async_client(remote: RemoteMemory, llm: FakeOpenAIServer) -> None:
    client = remote.llm.register(openai.AsyncOpenAI(base_url=llm.base_url, api_key="k"))

    async def ask(user: str) -> str:
        with remote.scope(user_id=user, session_id=f"{user}-async"):
            r = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": f"hello from {user}"}]
            )
        return r.choices[0].message.content or ""

    async def both() -> list[str]:
        try:
            return list(await asyncio.gather(ask("ana-a"), ask("cy-a")))
        finally:
            await client.close()

    assert asyncio.run(both()) == ["Noted!", "Noted!"]
    assert remote.llm.flush(10)
    for user in ("ana-a", "cy-a"):
        contents = [m.content for m in remote.messages.list(session_id=f"{user}-async")]
        assert contents == [f"hello from {user}", "Noted!"]


def test_a_server_that_hangs_costs_a_captured_call_only_the_recall_wait(
    silent: _Silent, llm: FakeOpenAIServer
) -> None:
    mem = RemoteMemory(silent.url, api_key="k", timeout=1.0, capture_recall_timeout_ms=200)
    client = mem.llm.register(openai.OpenAI(base_url=llm.base_url, api_key="k", max_retries=0))
    asked = [{"role": "user", "content": "hi"}]
    start = time.monotonic()
    with mem.scope(user_id="u", session_id="s"):
        reply = client.chat.completions.create(model="m", messages=asked)
    assert time.monotonic() - start < 1.5
    assert reply.choices[0].message.content == "Noted!"
    assert llm.chat_requests()[-1]["messages"] == asked  # no memory, no error
    start = time.monotonic()
    mem.close(timeout=2)  # the writer cannot store; close is still bounded
    assert time.monotonic() - start < 5


def test_closing_right_after_captured_calls_stores_every_exchange(
    server: ServerProcess, client: MemoryClient, llm: FakeOpenAIServer
) -> None:
    mem = RemoteMemory(server.url, api_key=server.bootstrap_key(), capture_recall=False)
    c = mem.llm.register(openai.OpenAI(base_url=llm.base_url, api_key="k", max_retries=0))
    asked = [f"question {i}" for i in range(5)]
    with mem.scope(user_id="close", session_id="close-1"):
        for text in asked:
            c.chat.completions.create(model="m", messages=[{"role": "user", "content": text}])
    mem.close()
    contents = [m.content for m in client.messages.list(session_id="close-1")]
    assert contents == [turn for text in asked for turn in (text, "Noted!")]


def test_a_short_script_loses_no_captured_exchange_at_exit(
    server: ServerProcess, client: MemoryClient, llm: FakeOpenAIServer
) -> None:
    script = f"""
import openai
from stratamem.client import RemoteMemory
mem = RemoteMemory({server.url!r}, api_key={server.bootstrap_key()!r})
c = mem.llm.register(openai.OpenAI(base_url={llm.base_url!r}, api_key="k", max_retries=0))
with mem.scope(user_id="exit", session_id="exit-1"):
    said = [{{"role": "user", "content": "Code word: tangerine."}}]
    c.chat.completions.create(model="m", messages=said)
"""
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    contents = [m.content for m in client.messages.list(session_id="exit-1")]
    assert contents == ["Code word: tangerine.", "Noted!"]


def test_importing_the_client_package_does_not_load_httpx() -> None:
    code = (
        "import sys\n"
        "import stratamem.client\n"
        "from stratamem.client import NotFoundError, APIError\n"
        "print('httpx' in sys.modules)\n"
        "stratamem.client.MemoryClient\n"
        "print('httpx' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]
