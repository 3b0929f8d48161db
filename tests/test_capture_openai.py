"""mem.llm with the real openai SDK against a loopback fake server: recall injected before,
the exchange captured after, fail-open, attribution by scope."""

from __future__ import annotations

import asyncio
import copy
import gc
import threading
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest

import stratamem.capture._capture as capture_module
from dbsql import writes_held
from fakes.openai_server import FakeOpenAIServer
from stratamem import Memory
from stratamem._abandon import Abandoned, abandonable, check
from stratamem.capture import MEMORY_PREAMBLE
from stratamem.errors import ConfigError, ValidationError
from stratamem.recall._format import HISTORY_HEADER


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as s:
        s.chat_script = lambda body: "Noted!"
        yield s


@pytest.fixture
def mem(make_memory: Any) -> Memory:
    mem = make_memory()
    s = mem.sessions.create(user_id="ana", session_id="chat")
    s.add_messages([{"role": "user", "content": "I am allergic to peanuts."}], sync=True)
    return mem


def _client(server: FakeOpenAIServer, cls: Any = openai.OpenAI) -> Any:
    return cls(base_url=server.base_url, api_key="k", max_retries=0)


def _stored(mem: Memory, session_id: str) -> list[tuple[str, str]]:
    assert mem.llm.flush(5)
    return [(m.role, m.content) for m in mem.messages.list(session_id=session_id)]


def test_register_is_idempotent_exclusive_and_reversible(
    mem: Memory, make_memory: Any, server: FakeOpenAIServer
) -> None:
    client = _client(server)
    completions = client.chat.completions
    assert mem.llm.register(client) is client
    assert mem.llm.register(client) is client  # twice: a no-op
    assert "create" in vars(completions)
    other = make_memory()  # another Memory on the same store
    with pytest.raises(ValueError, match="another Memory"):
        other.llm.register(client)
    mem.llm.unregister(client)
    assert "create" not in vars(completions)  # the SDK's own method again
    other.llm.register(client)  # free again
    with pytest.raises(TypeError, match="does not know"):
        mem.llm.register(object())


def test_recall_is_injected_and_the_exchange_captured(
    mem: Memory, server: FakeOpenAIServer
) -> None:
    client = mem.llm.register(_client(server))
    messages = [
        {"role": "system", "content": "You are a helpful cook."},
        {"role": "user", "content": "Suggest a snack with peanuts?"},
    ]
    before = copy.deepcopy(messages)
    with mem.scope(user_id="ana", session_id="chat"):
        reply = client.chat.completions.create(model="gpt-test", messages=messages)
    assert reply.choices[0].message.content == "Noted!"
    assert messages == before  # the caller's list and dicts are untouched
    sent = server.chat_requests()[-1]["messages"]
    # By default memory goes into the last user turn, after its text: everything before
    # it (here the system prompt) is sent byte-identical, so prompt caches keep working.
    assert sent[:-1] == messages[:-1]
    assert sent[-1]["role"] == "user"
    question, block = sent[-1]["content"].split("\n\n", 1)
    assert question == "Suggest a snack with peanuts?"
    assert block.startswith(MEMORY_PREAMBLE) and "allergic to peanuts" in block
    stored = _stored(mem, "chat")
    assert stored[-2:] == [("user", "Suggest a snack with peanuts?"), ("assistant", "Noted!")]
    answer = mem.messages.list(session_id="chat")[-1]
    capture = answer.metadata["capture"]
    assert capture["provider"] == "openai" and capture["model"] == "gpt-test"
    assert capture["usage"]["total_tokens"] > 0 and capture["latency_ms"] >= 0
    # The injected block is not stored as something the user said.
    assert all(MEMORY_PREAMBLE not in c for _, c in stored)


def test_the_captured_user_turn_reuses_the_recall_query_vector(
    make_memory: Any, server: FakeOpenAIServer
) -> None:
    """The last user turn is embedded once: as the recall's query before the call; the
    pipeline storing it afterwards gets the same vector back from the local embedder."""
    mem = make_memory(embedder="local")
    client = mem.llm.register(_client(server))
    with mem.scope(user_id="ana", session_id="chat"):
        client.chat.completions.create(
            model="gpt-test", messages=[{"role": "user", "content": "Any snack ideas?"}]
        )
    assert mem.llm.flush(5)
    mem.wait()
    embedder = mem.embedder
    assert embedder.recent_hits == 1  # type: ignore[attr-defined]
    [hit] = mem.search("Any snack ideas?", user_id="ana", limit=1)
    assert hit.text == "Any snack ideas?" and hit.signals["vector"] == pytest.approx(1.0)


def test_without_a_system_message_memory_comes_first(mem: Memory, server: FakeOpenAIServer) -> None:
    mem.llm.injection = "system"
    client = mem.llm.register(_client(server))
    with mem.scope(user_id="ana", session_id="chat"):
        client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "What snacks are safe for me?"}]
        )
    sent = server.chat_requests()[-1]["messages"]
    assert sent[0]["role"] == "system" and sent[0]["content"].startswith(MEMORY_PREAMBLE)
    assert sent[1] == {"role": "user", "content": "What snacks are safe for me?"}


def test_a_changed_recall_config_applies_to_the_next_call(
    mem: Memory, server: FakeOpenAIServer
) -> None:
    """The capture recall's validated config is reused only while it stays the same."""
    client = mem.llm.register(_client(server))

    def injected() -> str:
        with mem.scope(user_id="ana", session_id="chat"):
            client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "What snacks are safe for me?"}]
            )
        return str(server.chat_requests()[-1]["messages"][0]["content"])

    assert "allergic to peanuts" in injected()
    assert "allergic to peanuts" in injected()
    mem.llm.recall_config = {"enable_long_term_recall": False}
    assert MEMORY_PREAMBLE not in injected()
    mem.llm.recall_config = {"token_budget": 400}
    assert "allergic to peanuts" in injected()


def test_no_user_means_no_recall_and_no_capture_unless_a_default(
    make_memory: Any, server: FakeOpenAIServer
) -> None:
    mem = make_memory()
    client = mem.llm.register(_client(server))
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert server.chat_requests()[-1]["messages"] == [{"role": "user", "content": "hi"}]
    assert mem.llm.flush(5) and mem.messages.list(user_id="anonymous") == []
    mem2 = make_memory(capture_default_user="anonymous")
    client2 = mem2.llm.register(_client(server))
    client2.chat.completions.create(model="m", messages=[{"role": "user", "content": "hello"}])
    assert ("user", "hello") in _stored(mem2, "llm-anonymous")
    mem2.llm.attribution(user_id="bob", session_id="b1")
    client2.chat.completions.create(model="m", messages=[{"role": "user", "content": "yo"}])
    assert ("user", "yo") in _stored(mem2, "b1")
    with pytest.raises(ValidationError, match="user_id"), mem2.scope(user_id="no spaces"):
        pass


def test_concurrent_scopes_never_mix_users(mem: Memory, server: FakeOpenAIServer) -> None:
    s = mem.sessions.create(user_id="bo", session_id="bo-chat")
    s.add_messages([{"role": "user", "content": "I keep bees on my roof."}], sync=True)
    server.chat_script = lambda body: "ok " + body["messages"][-1]["content"]
    client = mem.llm.register(_client(server))
    errors: list[BaseException] = []

    def worker(user: str, session: str, n: int) -> None:
        try:
            for i in range(n):
                with mem.scope(user_id=user, session_id=session):
                    client.chat.completions.create(
                        model="m", messages=[{"role": "user", "content": f"{user} question {i}"}]
                    )
        except BaseException as exc:  # pragma: no cover - surfaced below
            errors.append(exc)

    threads = [
        threading.Thread(target=worker, args=("ana", "chat", 5)),
        threading.Thread(target=worker, args=("bo", "bo-chat", 5)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for request in server.chat_requests():
        system = request["messages"][0]["content"]
        asked = request["messages"][-1]["content"]
        if asked.startswith("ana"):
            assert "bees" not in system
        else:
            assert "peanuts" not in system
    assert mem.llm.flush(5)
    for user, session in (("ana", "chat"), ("bo", "bo-chat")):
        texts = [m.content for m in mem.messages.list(session_id=session)]
        other = "bo" if user == "ana" else "ana"
        assert sum(t.startswith(f"{user} question") for t in texts) == 5
        assert not any(t.startswith(f"{other} question") for t in texts)


def test_async_client(mem: Memory, server: FakeOpenAIServer) -> None:
    client = mem.llm.register(_client(server, openai.AsyncOpenAI))

    async def scenario() -> None:
        async def ask(user: str) -> str:
            with mem.scope(user_id=user, session_id=f"{user}-async"):
                r = await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": f"hello from {user}"}]
                )
            return r.choices[0].message.content

        assert await asyncio.gather(ask("ana"), ask("cy")) == ["Noted!", "Noted!"]
        await client.close()

    asyncio.run(scenario())
    assert ("user", "hello from ana") in _stored(mem, "ana-async")
    assert ("user", "hello from cy") in _stored(mem, "cy-async")


def test_provider_errors_reach_the_caller_unchanged_and_are_logged_as_failed_calls(
    mem: Memory, server: FakeOpenAIServer
) -> None:
    client = mem.llm.register(_client(server))
    server.fail_next(1, status=400)
    with mem.scope(user_id="ana", session_id="chat"), pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "this fails"}]
        )
    assert mem.llm.flush(5)
    failed = [m for m in mem.messages.list(session_id="chat") if m.content == "this fails"]
    assert failed and "BadRequestError" in failed[0].metadata["capture"]["error"]


def _embedding_over_http(
    make_memory: Any, embeddings: FakeOpenAIServer, bound_ms: int = 50
) -> Memory:
    """A memory whose query embeddings go to ``embeddings``, with the default 50 ms bound."""
    return make_memory(
        embedder="openai:fake-embed",
        embedder_base_url=embeddings.base_url,
        embedder_api_key="k",
        capture_recall_timeout_ms=bound_ms,
    )


def test_a_hanging_memory_backend_costs_at_most_the_recall_timeout(
    make_memory: Any, server: FakeOpenAIServer
) -> None:
    with FakeOpenAIServer() as embeddings:
        mem = _embedding_over_http(make_memory, embeddings)
        client = mem.llm.register(_client(server))
        embeddings.delay_next(2.0, n=5)  # the memory side's embedding service hangs
        start = time.perf_counter()
        with mem.scope(user_id="ana", session_id="slow"):
            reply = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "still there?"}]
            )
        assert reply.choices[0].message.content == "Noted!"
        assert time.perf_counter() - start < 1.0
        assert server.chat_requests()[-1]["messages"] == [
            {"role": "user", "content": "still there?"}
        ]


def test_a_recall_given_up_on_stops_at_its_next_step(
    make_memory: Any, server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The call went on without memory; the recall no longer runs on for nobody (holding a
    recall thread and the pipeline's foreground gate): once its hanging embedding answers,
    it stops before searching the store."""
    with FakeOpenAIServer() as embeddings:
        mem = _embedding_over_http(make_memory, embeddings)
        client = mem.llm.register(_client(server))
        searched: list[int] = []
        search = mem.store.vector_layers

        def searching(*args: Any, **kwargs: Any) -> Any:
            searched.append(1)
            return search(*args, **kwargs)

        ended: list[BaseException] = []
        done = threading.Event()
        recall = mem.llm._recall_now

        def recalling(*args: Any, **kwargs: Any) -> Any:
            try:
                return recall(*args, **kwargs)
            except BaseException as exc:
                ended.append(exc)
                raise
            finally:
                done.set()

        monkeypatch.setattr(mem.store, "vector_layers", searching)
        monkeypatch.setattr(mem.llm, "_recall_now", recalling)
        # The embedding is held until the call has gone on without memory, then answers: a
        # fixed delay could end first on a loaded machine, whose collector pauses extend
        # the recall's bound (up to MAX_PAUSE_CREDIT_SECONDS).
        embeddings.hold.clear()
        with mem.scope(user_id="ana", session_id="slow"):
            client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "still there?"}]
            )
        assert server.chat_requests()[-1]["messages"][-1]["content"] == "still there?"
        assert not done.is_set()
        embeddings.hold.set()
        assert done.wait(10)
        assert searched == [] and len(ended) == 1 and isinstance(ended[0], Abandoned)


def test_abandoned_work_stops_only_where_it_checks_and_only_once_given_up() -> None:
    check()  # outside any abandonable work: nothing to stop
    flag = threading.Event()
    with abandonable(flag):
        check()
        flag.set()
        with pytest.raises(Abandoned):
            check()
    check()  # the flag belongs to the block


def _heap_with_a_slow_full_collection(seconds: float) -> list[Any]:
    """Enough tracked objects that a full garbage collection takes ``seconds`` or more."""
    junk: list[Any] = []
    while len(junk) < 3_000_000:
        junk.extend({"x": [i]} for i in range(250_000))
        start = time.perf_counter()
        gc.collect()
        if time.perf_counter() - start >= seconds:
            return junk
    pytest.skip("a full collection stays too short here to outlast the recall's bound")


def test_a_garbage_collection_during_the_recall_does_not_spend_its_bound(
    make_memory: Any, server: FakeOpenAIServer
) -> None:
    """A full collection stops every thread of the process, the call included (45-60 ms
    with the openai SDK loaded): a recall caught behind one went out without memory. The
    bound counts the recall's own time; a slow backend still gets no more (the test above)."""
    with FakeOpenAIServer() as embeddings:
        # The pass lasts at least twice the bound, so without the credit the recall is lost;
        # the bound leaves the recall's own work (an embedding over HTTP, a PostgreSQL
        # search) room on a busy 2-core machine, where 50 ms of it was lost now and then.
        mem = _embedding_over_http(make_memory, embeddings, bound_ms=150)
        s = mem.sessions.create(user_id="ana", session_id="chat")
        s.add_messages([{"role": "user", "content": "I am allergic to peanuts."}], sync=True)
        client = mem.llm.register(_client(server))
        answer = embeddings._embeddings

        def collect_then_answer(body: dict[str, Any]) -> Any:
            gc.collect()  # a full pass of 0.3 s or more while the recall waits for this
            return answer(body)

        # What earlier tests left on the heap is set aside (gc.freeze): in a long run a full
        # pass over it alone took 0.8-1.1 s, which with the pass below outlasted the credit.
        gc.freeze()
        junk: list[Any] = []
        try:
            junk = _heap_with_a_slow_full_collection(0.3)
            embeddings.route("/v1/embeddings", collect_then_answer)
            with mem.scope(user_id="ana", session_id="chat"):
                client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "What can't I eat?"}]
                )
        finally:
            embeddings.route("/v1/embeddings", answer)
            junk.clear()
            gc.unfreeze()
        asked = server.chat_requests()[-1]["messages"][-1]
        assert asked["role"] == "user"
        assert MEMORY_PREAMBLE in asked["content"] and "peanuts" in asked["content"]


def test_registering_waits_for_the_model_so_the_first_call_gets_its_memory(
    make_memory: Any, db_url: str, server: FakeOpenAIServer
) -> None:
    """A new Memory loads the local model in the background (~0.3-0.5 s). A recall before
    that outlasts its 50 ms bound, so the first calls of a process (every call of a short
    script) went out without memory; registering, done at start-up, waits for the load."""
    pytest.importorskip("onnxruntime")
    first = make_memory(embedder="local")
    first.sessions.create(user_id="ana", session_id="chat").add_messages(
        [{"role": "user", "content": "I am allergic to peanuts."}], sync=True
    )
    first.llm.register(_client(server))  # the adapter is imported: registering is quick
    first.close()
    # A bound that a first recall fits in (~25 ms here) even on a loaded CI machine.
    mem = make_memory(db_url, embedder="local", capture_recall_timeout_ms=300)
    client = mem.llm.register(_client(server))
    assert mem.embedder._session is not None  # loaded before register returned
    with mem.scope(user_id="ana", session_id="chat"):
        client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "A snack with peanuts?"}]
        )
    assert "allergic to peanuts" in server.chat_requests()[-1]["messages"][0]["content"]


def test_a_closed_memory_never_breaks_the_call(make_memory: Any, server: FakeOpenAIServer) -> None:
    mem = make_memory()
    client = _client(server)
    mem.llm.register(client)
    mem.close()  # unregisters: the client is the SDK's again
    with mem.scope(user_id="ana"):
        reply = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
    assert reply.choices[0].message.content == "Noted!"


def test_history_injection_never_duplicates_turns(
    make_memory: Any, server: FakeOpenAIServer
) -> None:
    mem = make_memory(capture_inject_history=True)
    s = mem.sessions.create(user_id="ana", session_id="chat")
    s.add_messages(
        [
            {"role": "user", "content": "My cat is called Miso."},
            {"role": "assistant", "content": "What a lovely name!"},
            {"role": "user", "content": "She likes tuna."},
        ],
        sync=True,
    )
    client = mem.llm.register(_client(server))
    messages = [
        {"role": "user", "content": "She likes tuna."},  # the caller resends one turn
        {"role": "user", "content": "What should I feed my cat?"},
    ]
    with mem.scope(user_id="ana", session_id="chat"):
        client.chat.completions.create(model="m", messages=messages)
    sent = server.chat_requests()[-1]["messages"]
    turns = [(m["role"], m["content"]) for m in sent]
    assert turns[:-1] == [
        ("user", "My cat is called Miso."),
        ("assistant", "What a lovely name!"),
        ("user", "She likes tuna."),
    ]
    # The memories go into the caller's last turn; the turns went in as turns, not there.
    asked, block = turns[-1][1].split("\n\n", 1)
    assert turns[-1][0] == "user" and asked == "What should I feed my cat?"
    assert block.startswith(MEMORY_PREAMBLE) and HISTORY_HEADER not in block


SCRIPT = """
import sys, openai
from stratamem import Memory
mem = Memory(sys.argv[1], embedder="hash")
client = mem.llm.register(openai.OpenAI(base_url=sys.argv[2], api_key="k", max_retries=0))
with mem.scope(user_id="u", session_id="s"):
    client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "remember the blue door"}]
    )
# exits at once: no close, no flush
"""


def test_a_short_script_loses_nothing_at_exit(
    tmp_path: Any, make_memory: Any, server: FakeOpenAIServer
) -> None:
    import subprocess
    import sys

    db = f"sqlite:///{tmp_path / 'script.db'}"
    subprocess.run([sys.executable, "-c", SCRIPT, db, server.base_url], check=True, timeout=120)
    mem = make_memory(db)
    stored = [(m.role, m.content) for m in mem.messages.list(session_id="s")]
    assert stored == [("user", "remember the blue door"), ("assistant", "Noted!")]


def test_async_memory_exposes_capture(db_url: str, server: FakeOpenAIServer) -> None:
    from stratamem import AsyncMemory

    async def scenario() -> None:
        async with AsyncMemory(db_url, embedder="hash") as amem:
            client = amem.llm.register(_client(server, openai.AsyncOpenAI))
            with amem.scope(user_id="zed", session_id="z1"):
                await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "async hello"}]
                )
            assert amem.llm.flush(5)
            texts = [m.content for m in amem.sync.messages.list(session_id="z1")]
            assert texts == ["async hello", "Noted!"]
            await client.close()

    asyncio.run(scenario())


# -- close() right after captured calls -----------------------------------------------------
#
# The calls are made while another connection holds the store's write lock, released just
# before close(): the capture writer is held at its first exchange, so every other one is
# still queued when close() begins, whatever the machine's speed. Recall is off: it would
# wait for the lock too (it creates the session), and it is not what is tested.


def _asked(n: int) -> list[str]:
    return [f"question {i}: remember the blue door" for i in range(n)]


def _exchanges(n: int) -> list[tuple[str, str]]:
    return [turn for text in _asked(n) for turn in (("user", text), ("assistant", "Noted!"))]


def _reopened(make_memory: Any, db_url: str, session_id: str) -> list[tuple[str, str]]:
    """What the store holds, read by a new Memory (nothing of the closed one is used)."""
    mem = make_memory(db_url)
    return [(m.role, m.content) for m in mem.messages.list(session_id=session_id, limit=1000)]


@pytest.mark.parametrize("n", [5, 50])
def test_close_right_after_captured_calls_stores_every_exchange(
    make_memory: Any, db_url: str, server: FakeOpenAIServer, n: int
) -> None:
    """close() marked the Memory closed before the capture writer had drained its queue:
    the exchanges still queued failed ("this Memory is closed")."""
    mem = make_memory(capture_recall=False)
    client = mem.llm.register(_client(server))
    with writes_held(db_url), mem.scope(user_id="u", session_id="s"):
        for text in _asked(n):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": text}])
    mem.close()
    assert _reopened(make_memory, db_url, "s") == _exchanges(n)


def test_leaving_a_with_block_after_streamed_calls_stores_every_exchange(
    make_memory: Any, db_url: str, server: FakeOpenAIServer
) -> None:
    with make_memory(capture_recall=False) as mem:
        client = mem.llm.register(_client(server))
        with writes_held(db_url), mem.scope(user_id="u", session_id="s"):
            for text in _asked(5):
                stream = client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": text}], stream=True
                )
                assert "".join(c.choices[0].delta.content or "" for c in stream) == "Noted!"
    assert _reopened(make_memory, db_url, "s") == _exchanges(5)


def test_closing_an_async_memory_after_async_calls_stores_every_exchange(
    make_memory: Any, db_url: str, server: FakeOpenAIServer
) -> None:
    from stratamem import AsyncMemory

    async def scenario() -> None:
        async with AsyncMemory(db_url, embedder="hash", capture_recall=False) as amem:
            client = amem.llm.register(_client(server, openai.AsyncOpenAI))
            with writes_held(db_url), amem.scope(user_id="u", session_id="s"):
                for i, text in enumerate(_asked(6)):
                    messages = [{"role": "user", "content": text}]
                    if i % 2:
                        await client.chat.completions.create(model="m", messages=messages)
                    else:
                        stream = await client.chat.completions.create(
                            model="m", messages=messages, stream=True
                        )
                        async for _ in stream:
                            pass
            await client.close()

    asyncio.run(scenario())
    assert _reopened(make_memory, db_url, "s") == _exchanges(6)


@pytest.mark.sqlite_only
def test_close_stays_bounded_when_the_store_cannot_take_the_queued_exchanges(
    make_memory: Any, db_url: str, server: FakeOpenAIServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Another process holds the file's write lock throughout: every write waits 0.3 s,
    then fails. close() gives the queue close_timeout_seconds (1 s), lets the write in
    progress end, drops the rest and says so; storing the 40 exchanges one by one would
    take 12 s and more."""
    mem = make_memory(capture_recall=False, sqlite_busy_timeout_ms=300, close_timeout_seconds=1)
    client = mem.llm.register(_client(server))
    with writes_held(db_url):
        with mem.scope(user_id="u", session_id="s"):
            for text in _asked(40):
                client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": text}]
                )
        start = time.perf_counter()
        mem.close()
        took = time.perf_counter() - start
    assert took < 6
    assert any("not stored within 1.0 s; dropped" in r.getMessage() for r in caplog.records)


def test_the_placement_is_a_setting_and_can_change_at_run_time(
    make_memory: Any, server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigError, match="capture_injection"):
        make_memory(capture_injection="prompt")
    monkeypatch.setenv("STRATAMEM_CAPTURE_INJECTION", "system")
    mem = make_memory()
    assert mem.llm.injection == "system"
    mem.sessions.create(user_id="ana", session_id="chat").add_messages(
        [{"role": "user", "content": "I am allergic to peanuts."}], sync=True
    )
    client = mem.llm.register(_client(server))

    def sent() -> list[dict[str, Any]]:
        with mem.scope(user_id="ana", session_id="chat"):
            client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "Snacks with peanuts?"}]
            )
        return list(server.chat_requests()[-1]["messages"])

    first = sent()
    assert [m["role"] for m in first] == ["system", "user"]
    assert first[1]["content"] == "Snacks with peanuts?"
    with pytest.raises(ValidationError, match="injection"):
        mem.llm.injection = "prompt"  # type: ignore[assignment]
    mem.llm.injection = "user"
    (turn,) = sent()
    assert turn["content"].startswith(f"Snacks with peanuts?\n\n{MEMORY_PREAMBLE}")


def test_a_user_turn_of_unknown_shape_gets_the_block_in_the_system_slot() -> None:
    from stratamem.capture import Attribution
    from stratamem.capture._capture import Recalled
    from stratamem.capture._openai import inject_chat

    recalled = Recalled(Attribution("ana"), f"{MEMORY_PREAMBLE}\n</memory>")
    odd = [{"role": "user", "content": 42}]
    assert inject_chat(odd, recalled) == [
        {"role": "system", "content": recalled.block},
        {"role": "user", "content": 42},
    ]


# Each names what the other session's memory is about, so that recall finds it by its words
# (the hashing embedder matches words, not meaning).
QUESTIONS = [
    "What about peanuts?",
    "What about peanuts on the train?",
    "What about peanuts at the hotel?",
    "What about peanuts for the kids?",
    "What about peanuts near the beach?",
    "What about peanuts after the hike?",
    "What about food with peanuts?",
]


def test_a_conversation_is_not_recalled_back_into_its_own_requests(
    mem: Memory, openai_server: FakeOpenAIServer
) -> None:
    """Issue 24: in a 7-turn conversation the block listed the caller's own turns of the
    session, which the request's messages held already. Each request's block now leaves them
    out, and still recalls memory of another session."""
    openai_server.chat_script = lambda body: (
        f"Food tip: {body['messages'][-1]['content'].split(chr(10))[0].lower()} Pack food."
    )
    client = mem.llm.register(_client(openai_server))
    messages: list[dict[str, str]] = []
    with mem.scope(user_id="ana"):  # the capture session: llm-ana
        for question in QUESTIONS:
            messages.append({"role": "user", "content": question})
            reply = client.chat.completions.create(model="m", messages=messages)
            messages.append({"role": "assistant", "content": reply.choices[0].message.content})
            assert mem.llm.flush(5)
    stored = _stored(mem, "llm-ana")
    assert [c for _, c in stored] == [m["content"] for m in messages]
    requests = openai_server.chat_requests()
    assert len(requests) == len(QUESTIONS)
    for n, body in enumerate(requests):
        sent = body["messages"]
        carried = [m["content"] for m in messages[: 2 * n]]  # the turns before this one
        assert [m["content"] for m in sent[:-1]] == carried  # sent as the caller gave them
        asked, block = sent[-1]["content"].split("\n\n", 1)
        assert asked == QUESTIONS[n] and block.startswith(MEMORY_PREAMBLE)
        assert "allergic to peanuts" in block  # the other session's memory
        assert not [t for t in carried if t in block], (n, block)
    # Without leaving them out, the same recall would have quoted this conversation back.
    config = {**mem.llm.recall_config, "message_recent_limit": 0}
    again = mem.get_memory("llm-ana", QUESTIONS[-1], recall_config=config).formatted_context
    assert sum(m["content"] in again for m in messages) >= 3


def test_a_long_request_still_gets_its_memory(make_memory: Any, server: FakeOpenAIServer) -> None:
    """Turns beyond get_memory's limits (more than it takes, longer than a message can be,
    text no store could hold) are not passed on: recall is not refused for them."""
    mem = make_memory(max_content_chars=80)
    mem.sessions.create(user_id="ana", session_id="notes").add_messages(
        [{"role": "user", "content": "I am allergic to peanuts."}], sync=True
    )
    mem.sessions.create(user_id="ana", session_id="chat").add_messages(
        [{"role": "user", "content": "Peanut snacks, please."}], sync=True
    )
    client = mem.llm.register(_client(server))
    earlier = [{"role": "user", "content": f"Turn {i} about snacks."} for i in range(1200)]
    earlier += [
        {"role": "user", "content": "snacks " * 20},  # longer than max_content_chars
        {"role": "assistant", "content": "Peanut snacks, please."},  # the latest turns count
    ]
    with mem.scope(user_id="ana", session_id="chat"):
        client.chat.completions.create(
            model="m", messages=[*earlier, {"role": "user", "content": "Peanut snacks?"}]
        )
    block = server.chat_requests()[-1]["messages"][-1]["content"].split("\n\n", 1)[1]
    assert block.startswith(MEMORY_PREAMBLE) and "allergic to peanuts" in block
    assert "Peanut snacks, please." not in block
    # What the adapters hand over is taken as it comes (text no store could hold too).
    with mem.scope(user_id="ana", session_id="chat"):
        recalled = mem.llm.before(
            "Peanut snacks?", ["Peanut snacks \ud800", "Peanut snacks, please."]
        )
    assert recalled is not None and recalled.block is not None
    assert "allergic to peanuts" in recalled.block
    assert "Peanut snacks, please." not in recalled.block


def test_the_writers_queue_is_bounded_and_says_what_it_dropped(
    make_memory: Any,
    db_url: str,
    server: FakeOpenAIServer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """While the store cannot take them, at most MAX_QUEUED_EXCHANGES exchanges wait in
    memory (so a killed process loses at most that many); the ones past it are dropped,
    counted and logged, and the calls are never held up. The store back, what waited is
    stored."""
    monkeypatch.setattr(capture_module, "MAX_QUEUED_EXCHANGES", 3)
    mem = make_memory(capture_recall=False, sqlite_busy_timeout_ms=20_000)
    client = mem.llm.register(_client(server))
    calls = 8
    with writes_held(db_url):
        with mem.scope(user_id="u", session_id="s"):
            for text in _asked(calls):
                client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": text}]
                )
        # One exchange in the writer's hands (waiting for the lock), three in the queue.
        assert mem.llm.dropped >= calls - 4
    assert mem.llm.flush(30)
    assert mem.llm.written == calls - mem.llm.dropped >= 3
    assert len(mem.messages.list(session_id="s")) == 2 * mem.llm.written
    assert any("3 captured exchange(s) waiting" in r.getMessage() for r in caplog.records)
