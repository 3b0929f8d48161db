"""StratamemStore: LangGraph's ``BaseStore`` contract, held against LangGraph's own
documented semantics (and its ``InMemoryStore`` where they are the same), and the store as
memory: what is put is learned, a changed value replaces the old one in what is recalled,
a deletion deletes in stratamem and the reverse; LangMem's memory tools and graphs that use
the store in their nodes, their model calls going to the fake OpenAI server; embedded on
both stores and against a real ``stratamem serve``.

langgraph ships no store conformance suite (``langgraph-checkpoint-conformance`` covers
checkpointers only), so the contract is written here from ``langgraph.store.base``'s
documentation.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from langgraph.store.base import (
    GetOp,
    InvalidNamespaceError,
    ListNamespacesOp,
    PutOp,
    SearchOp,
)
from langgraph.store.memory import InMemoryStore

from conftest import assert_names_the_extra, run_docs_example
from fakes.openai_server import FakeOpenAIServer
from stratamem import ConflictError, Memory, connect
from stratamem.api import MemoryAPI
from stratamem.integrations import _langgraph
from stratamem.integrations.langgraph import StratamemStore

NS = ("memories", "u1")


class Clock:
    """The store's clock, moved by the test (TTLs are minutes)."""

    def __init__(self) -> None:
        self.now = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, minutes: float) -> None:
        self.now += timedelta(minutes=minutes)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(_langgraph, "_now", c)
    return c


@pytest.fixture
def store(mem: Memory) -> StratamemStore:
    return StratamemStore(mem, user_index=1)


def _messages(mem: MemoryAPI, user_id: str = "u1") -> list[Any]:
    return mem.messages.list(user_id=user_id)


# -- get / put / delete --------------------------------------------------------------------

TRICKY = {
    "text": "naïve café 東京 😀 \u0000 NUL and a lone \ud800 surrogate",
    "big": 2**70,
    "floats": [0.1, 1e16, -0.0, 1.5e-300],
    "flags": [True, False, None, 1, 0],
    "nested": {"z": {"y": [], "x": {}}, "a": "/:.=%"},
    "": "empty key",
    "order": {"b": 1, "a": 2, "c": 3},
}


def test_a_document_round_trips_exactly(store: StratamemStore, clock: Clock) -> None:
    namespace = ("memories", "u1", "weird label/with:colons=and spaces é")
    store.put(namespace, "k/1:=", TRICKY)
    item = store.get(namespace, "k/1:=")
    assert item is not None
    assert item.value == TRICKY
    assert list(item.value) == list(TRICKY)  # key order too, on PostgreSQL as well
    assert list(item.value["order"]) == ["b", "a", "c"]
    assert isinstance(item.value["big"], int) and isinstance(item.value["floats"][1], float)
    assert [type(v) for v in item.value["flags"]] == [bool, bool, type(None), int, int]
    assert item.key == "k/1:=" and item.namespace == namespace
    assert item.created_at == item.updated_at == clock.now
    assert store.get(namespace, "other") is None
    assert store.get(("memories", "u2"), "k/1:=") is None


def test_a_put_replaces_the_value_keeps_created_at_and_forgets_the_old_message(
    mem: Memory, store: StratamemStore, clock: Clock
) -> None:
    store.put(NS, "k", {"content": "I live in Lisbon."})
    created = clock.now
    clock.advance(1)
    store.put(NS, "k", {"content": "I live in Berlin."})
    item = store.get(NS, "k")
    assert item is not None and item.value == {"content": "I live in Berlin."}
    assert item.created_at == created and item.updated_at == clock.now
    stored = _messages(mem)
    assert [m.content for m in stored] == ["I live in Berlin."]  # the old one is forgotten
    actions = [(a.action, a.reason) for a in mem.audit(user_id="u1")]
    assert ("forget", "langgraph store: put replaced the item") in actions


def test_a_delete_forgets_the_item_in_stratamem(mem: Memory, store: StratamemStore) -> None:
    store.put(NS, "k", {"content": "I am allergic to peanuts."})
    mem.wait()
    assert any("peanuts" in f.text for f in mem.facts.list(user_id="u1"))
    store.delete(NS, "k")
    store.delete(NS, "k")  # deleting what is not there is no error
    assert store.get(NS, "k") is None
    assert _messages(mem) == [] and mem.facts.list(user_id="u1") == []
    assert mem.search("peanuts", user_id="u1") == []
    assert store.list_namespaces() == []


def test_a_forget_in_stratamem_is_no_longer_returned(mem: Memory, store: StratamemStore) -> None:
    store.put(NS, "a", {"content": "I like tea."})
    store.put(NS, "b", {"content": "I like chess."})
    store.put(("memories", "u2"), "c", {"content": "I like golf."})
    tea = next(m for m in _messages(mem) if "tea" in m.content)
    mem.forget(user_id="u1", message_ids=[tea.id])
    assert store.get(NS, "a") is None
    assert [i.key for i in store.search(NS)] == ["b"]
    mem.erase_user("u1")
    assert store.get(NS, "b") is None and store.search(("memories",)) != []
    assert store.list_namespaces() == [("memories", "u2")]
    store.put(NS, "d", {"content": "back again"})  # the namespace's session is made anew
    assert store.get(NS, "d") is not None


def test_another_project_sees_nothing(mem: Memory, store: StratamemStore) -> None:
    store.put(NS, "k", {"content": "I like tea."})
    mem.wait()
    mem.projects.create("other", project_id="other")
    elsewhere = StratamemStore(mem.for_project("other"), user_index=1)
    assert elsewhere.get(NS, "k") is None and elsewhere.list_namespaces() == []
    assert elsewhere.search(("memories",)) == [] and elsewhere.search(NS, query="tea") == []
    elsewhere.put(NS, "k", {"content": "I like coffee."})  # the same names, its own items
    assert store.get(NS, "k").value == {"content": "I like tea."}  # type: ignore[union-attr]
    assert elsewhere.get(NS, "k").value == {"content": "I like coffee."}  # type: ignore[union-attr]


def test_bad_input_is_refused_and_writes_nothing(mem: Memory, store: StratamemStore) -> None:
    for bad in ({"when": datetime.now()}, {1: "int key"}, {"x": float("nan")}):
        with pytest.raises(ValueError):
            store.put(NS, "k", bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidNamespaceError):
        store.put((), "k", {"a": 1})
    with pytest.raises(InvalidNamespaceError):
        store.put(("memories", "a.b"), "k", {"a": 1})
    with pytest.raises(InvalidNamespaceError):
        store.put(("langgraph", "u1"), "k", {"a": 1})
    with pytest.raises(InvalidNamespaceError, match="names the user"):
        store.put(("memories",), "k", {"a": 1})  # no label at user_index 1
    # One bad put fails the whole batch: the good one is not written either.
    with pytest.raises(ValueError):
        store.batch([PutOp(NS, "good", {"a": 1}), PutOp(NS, "bad", {"x": float("inf")})])
    assert _messages(mem) == [] and store.get(NS, "good") is None
    with pytest.raises(ValueError, match="user_index"):
        StratamemStore(mem, user_index=-1)


def test_a_slot_taken_by_another_writer_is_a_conflict_not_a_loss(
    mem: Memory, store: StratamemStore
) -> None:
    session = mem.sessions.create("u1", session_id="elsewhere")
    session.add_messages([{"id": "langgraph:memories/u1:k.a", "role": "user", "content": "x"}])
    with pytest.raises(ConflictError):
        store.put(NS, "k", {"content": "mine"})
    assert store.get(NS, "k") is None and mem.messages.get("langgraph:memories/u1:k.a")


def test_a_batch_reads_before_it_writes_and_the_last_put_wins(store: StratamemStore) -> None:
    store.put(NS, "k", {"v": 0})
    results = store.batch(
        [
            PutOp(NS, "k", {"v": 1}),
            GetOp(NS, "k"),
            PutOp(NS, "k", {"v": 2}),
            SearchOp(("memories",)),
            ListNamespacesOp(match_conditions=None),
            PutOp(NS, "gone", None),
        ]
    )
    assert results[0] is None and results[2] is None and results[5] is None
    assert results[1] is not None and results[1].value == {"v": 0}  # type: ignore[union-attr]
    assert [i.value for i in results[3]] == [{"v": 0}]  # type: ignore[union-attr]
    assert results[4] == [NS]
    item = store.get(NS, "k")
    assert item is not None and item.value == {"v": 2}


# -- search and list_namespaces, as LangGraph defines them ---------------------------------

DOCS = [
    (
        ("docs", "u1"),
        "a",
        {"kind": "report", "stars": 5, "tags": ["x", "y"], "meta": {"lang": "en"}},
    ),
    (("docs", "u1", "drafts"), "b", {"kind": "report", "stars": 2.5, "flag": True}),
    (("docs", "u2"), "c", {"kind": "note", "stars": 4, "flag": 1}),
    (("docs", "u2", "drafts"), "d", {"kind": "note", "title": "zeta"}),
    (("docsx", "u1"), "e", {"kind": "report", "title": "alpha"}),
]
# Filters InMemoryStore answers as JSON does (its ranges raise on a missing key, and it
# takes True for 1): those are in test_filters_compare_as_json.
FILTERS: list[dict[str, Any] | None] = [
    None,
    {"kind": "report"},
    {"kind": {"$ne": "report"}},
    {"kind": {"$eq": "note"}},
    {"tags": ["x", "y"]},
    {"tags": ["y", "x"]},
    {"meta": {"lang": "en"}},
    {"kind": "report", "stars": 5},
    {"missing": None},
]


@pytest.fixture
def docs(store: StratamemStore, clock: Clock) -> InMemoryStore:
    """The same documents in stratamem and in LangGraph's InMemoryStore, one a minute."""
    reference = InMemoryStore()
    for namespace, key, value in DOCS:
        store.put(namespace, key, value)
        reference.put(namespace, key, value)
        clock.advance(1)
    return reference


@pytest.mark.parametrize("prefix", [(), ("docs",), ("docs", "u1"), ("docs", "u2", "drafts")])
def test_search_without_a_query_matches_langgraphs_own_store(
    store: StratamemStore, docs: InMemoryStore, prefix: tuple[str, ...]
) -> None:
    for conditions in FILTERS:
        ours = store.search(prefix, filter=conditions, limit=100)
        theirs = docs.search(prefix, filter=conditions, limit=100)
        assert {(i.namespace, i.key) for i in ours} == {(i.namespace, i.key) for i in theirs}, (
            conditions
        )
        # Newest first (LangGraph's PostgresStore: updated_at DESC), without scores.
        assert [i.updated_at for i in ours] == sorted((i.updated_at for i in ours), reverse=True)
        assert all(i.score is None for i in ours)


@pytest.mark.parametrize(
    ("conditions", "keys"),
    [
        ({"stars": {"$gt": 2.5}}, {"a", "c"}),
        ({"stars": {"$gte": 2.5, "$lt": 5}}, {"b", "c"}),
        ({"stars": {"$lte": 4}}, {"b", "c"}),
        ({"flag": True}, {"b"}),
        ({"flag": 1}, {"c"}),
        ({"title": {"$gt": "m"}}, {"d"}),
        ({"stars": {"$gt": "3"}}, set()),  # a string is not compared with numbers
    ],
)
def test_filters_compare_as_json(
    store: StratamemStore, docs: InMemoryStore, conditions: dict[str, Any], keys: set[str]
) -> None:
    assert {i.key for i in store.search(("docs",), filter=conditions)} == keys
    with pytest.raises(ValueError, match="Unsupported operator"):
        store.search(("docs",), filter={"stars": {"$regex": "x"}})


def test_search_pages_with_limit_and_offset(store: StratamemStore, docs: InMemoryStore) -> None:
    everything = [i.key for i in store.search(("docs",), limit=100)]
    assert everything == ["d", "c", "b", "a"]
    assert [i.key for i in store.search(("docs",), limit=2)] == ["d", "c"]
    assert [i.key for i in store.search(("docs",), limit=2, offset=3)] == ["a"]
    assert store.search(("docs",), limit=0) == []


def test_list_namespaces_matches_langgraphs_own_store(
    store: StratamemStore, docs: InMemoryStore
) -> None:
    cases: list[dict[str, Any]] = [
        {},
        {"prefix": ("docs",)},
        {"prefix": ("docs", "u1")},
        {"suffix": ("drafts",)},
        {"prefix": ("docs",), "suffix": ("drafts",)},
        {"prefix": ("docs", "*", "drafts")},
        {"suffix": ("*", "drafts")},
        {"max_depth": 1},
        {"prefix": ("docs",), "max_depth": 2},
        {"limit": 2},
        {"offset": 3},
        {"prefix": ("nothing",)},
    ]
    for case in cases:
        assert store.list_namespaces(**case) == docs.list_namespaces(**case), case
    store.delete(("docs", "u2", "drafts"), "d")
    assert ("docs", "u2", "drafts") not in store.list_namespaces()


# -- TTL -----------------------------------------------------------------------------------


def test_an_item_expires_after_its_ttl_and_is_forgotten(
    mem: Memory, store: StratamemStore, clock: Clock
) -> None:
    store.put(NS, "short", {"content": "a passing thought"}, ttl=10)
    store.put(NS, "long", {"content": "I keep this"})
    clock.advance(9)
    assert store.get(NS, "short", refresh_ttl=False) is not None
    clock.advance(2)
    assert store.get(NS, "short") is None
    assert [m.content for m in _messages(mem)] == ["I keep this"]  # forgotten when found
    assert [i.key for i in store.search(NS)] == ["long"]


def test_reads_refresh_the_ttl(mem: Memory, store: StratamemStore, clock: Clock) -> None:
    store.put(NS, "k", {"content": "refresh me"}, ttl=10)
    clock.advance(0.5)
    store.get(NS, "k")  # within the slack (1 minute of 10): no rewrite
    assert len(mem.audit(user_id="u1")) == 0
    clock.advance(5)
    item = store.get(NS, "k")  # refreshed: now expires at +10 from here
    assert item is not None and item.value == {"content": "refresh me"}
    clock.advance(8)
    found = store.search(NS)  # alive (would have expired without the refresh); refreshes
    assert [i.key for i in found] == ["k"]
    assert found[0].updated_at == found[0].created_at  # a refresh is no update
    clock.advance(9)
    assert store.get(NS, "k", refresh_ttl=False) is not None
    clock.advance(2)
    assert store.get(NS, "k", refresh_ttl=False) is None
    assert [m.content for m in _messages(mem)] == []


def test_a_store_ttl_config_and_the_sweeper(mem: Memory, clock: Clock) -> None:
    store = StratamemStore(mem, user_index=1, ttl={"default_ttl": 5, "refresh_on_read": False})
    store.put(NS, "a", {"content": "one"})
    store.put(("memories", "u2"), "b", {"content": "two"})
    store.put(NS, "c", {"content": "three"}, ttl=None)
    clock.advance(3)
    store.get(NS, "a")  # refresh_on_read is off: no refresh
    clock.advance(3)
    assert store.sweep_ttl() == 2
    assert store.list_namespaces() == [NS]
    assert [m.content for m in _messages(mem)] == ["three"]
    assert _messages(mem, "u2") == []
    # The sweeper thread sweeps every interval (here 60 ms) until stopped.
    store.put(NS, "d", {"content": "four"}, ttl=1)
    clock.advance(2)
    done = store.start_ttl_sweeper(sweep_interval_minutes=0.001)  # type: ignore[arg-type]
    deadline = time.monotonic() + 30
    while any(m.content == "four" for m in _messages(mem)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [m.content for m in _messages(mem)] == ["three"]
    assert store.stop_ttl_sweeper(timeout=10) and done.result(timeout=10) is None


# -- the store as memory -------------------------------------------------------------------


@pytest.fixture
def semantic(make_memory: Callable[..., Memory], local_embedder: Any) -> Memory:
    return make_memory(embedder=local_embedder)


def test_a_query_uses_stratamems_hybrid_recall(semantic: Memory) -> None:
    store = StratamemStore(semantic, user_index=1)
    store.put(NS, "food", {"content": "I am vegetarian and allergic to peanuts."})
    store.put(NS, "job", {"content": "I work as a nurse at the city hospital."})
    store.put(NS, "pet", {"content": "My dog is called Biscuit."})
    store.put(("memories", "u1", "raw"), "cfg", {"content": "vegetarian settings"}, index=False)
    store.put(("memories", "u2"), "other", {"content": "I am allergic to shellfish."})
    semantic.wait()
    hits = store.search(("memories", "u1"), query="What foods should I avoid?")
    assert hits[0].key == "food" and hits[0].score is not None
    assert {h.key for h in hits} <= {"food", "job", "pet"}  # never u2's, nor the unindexed
    assert [h.key for h in store.search(NS, query="hospital work", limit=1)] == ["job"]
    assert store.search(NS, query="hospital work", limit=1, offset=1)[0].key != "job"
    # A filter narrows the query's results; a query across users searches each.
    assert store.search(NS, query="dog", filter={"content": "x"}) == []
    across = store.search(("memories",), query="allergic", limit=10)
    assert {h.namespace[1] for h in across} == {"u1", "u2"}
    # The unindexed item is kept and listed, not learned and not found by a query.
    assert [i.key for i in store.search(("memories", "u1", "raw"))] == ["cfg"]
    assert not any("settings" in f.text for f in semantic.facts.list(user_id="u1"))


def test_what_is_put_is_learned_and_a_changed_value_replaces_the_old(semantic: Memory) -> None:
    store = StratamemStore(semantic, user_index=1)
    store.put(NS, "home", {"content": "User lives in Lisbon."})
    semantic.wait()
    chat = semantic.sessions.create("u1", session_id="chat-1")
    block = chat.get_memory("Where does the user live?").formatted_context
    assert "Lisbon" in block
    store.put(NS, "home", {"content": "User lives in Berlin."})
    semantic.wait()
    block = chat.get_memory("Where does the user live?").formatted_context
    assert "Berlin" in block and "Lisbon" not in block
    assert [h.value for h in store.search(NS, query="where does the user live")] == [
        {"content": "User lives in Berlin."}
    ]
    # Another user's memory never holds it.
    other = semantic.sessions.create("u2", session_id="chat-2")
    assert "Berlin" not in other.get_memory("Where does the user live?").formatted_context


def test_the_text_learned_from_a_document(mem: Memory) -> None:
    store = StratamemStore(mem, user_index=1, fields=["title", "body"])
    store.put(NS, "a", {"title": "Diet", "body": "I eat no meat.", "id": 7})
    store.put(NS, "b", {"title": "x", "body": "ignored", "note": "I ride a bike."}, index=["note"])
    whole = StratamemStore(mem, user_index=1)
    whole.put(NS, "c", {"name": "Alex", "age": 41, "pets": ["cat", "dog"], "x": None})
    whole.put(NS, "d", {"title": ""})  # no text at all: kept, not learned
    contents = {m.id.rsplit(":", 1)[1]: (m.role, m.content) for m in _messages(mem)}
    assert contents["a.a"] == ("user", "Diet\nI eat no meat.")
    assert contents["b.a"] == ("user", "I ride a bike.")
    assert contents["c.a"] == ("user", "name: Alex\nage: 41\npets: cat, dog")
    assert contents["d.a"] == ("tool", "[LangGraph store item 'd', not indexed]")


def test_async_forms(store: StratamemStore) -> None:
    async def run() -> None:
        await store.aput(NS, "k", {"content": "async"})
        item = await store.aget(NS, "k")
        assert item is not None and item.value == {"content": "async"}
        assert [i.key for i in await store.asearch(("memories",))] == ["k"]
        assert await store.alist_namespaces(prefix=("memories",)) == [NS]
        await store.adelete(NS, "k")
        assert await store.aget(NS, "k") is None

    asyncio.run(run())


# -- LangMem's tools and graphs that use the store -----------------------------------------


@pytest.fixture
def chat_server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as server:
        yield server


def _chat_model(server: FakeOpenAIServer) -> Any:
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(model="gpt-4o-mini", base_url=server.base_url, api_key="x", max_retries=0)


def test_langmem_tools_in_an_agent(semantic: Memory, chat_server: FakeOpenAIServer) -> None:
    from langchain.agents import create_agent
    from langchain.agents.middleware import ModelRequest, dynamic_prompt
    from langgraph.config import get_config, get_store
    from langmem import create_manage_memory_tool, create_search_memory_tool

    store = StratamemStore(semantic, user_index=1, sync=True)
    namespace = ("memories", "{langgraph_user_id}")

    @dynamic_prompt
    def prompt(request: ModelRequest) -> str:
        user = get_config()["configurable"]["langgraph_user_id"]
        question = request.state["messages"][-1].content
        found = get_store().search(("memories", user), query=question)
        memories = "\n".join(f"- {i.value['content']}" for i in found)
        return f"Memories:\n{memories}"

    agent = create_agent(
        _chat_model(chat_server),
        tools=[create_manage_memory_tool(namespace), create_search_memory_tool(namespace)],
        middleware=[prompt],
        store=store,
    )

    def ask(user: str, text: str) -> None:
        agent.invoke(
            {"messages": [{"role": "user", "content": text}]},
            config={"configurable": {"langgraph_user_id": user}},
        )

    def remember(content: str, **extra: Any) -> None:
        call = {"name": "manage_memory", "arguments": {"content": content, **extra}}
        chat_server.chat_replies.extend([{"tool_calls": [call]}, "Noted."])

    remember("User is allergic to peanuts.")
    ask("u1", "Remember: I'm allergic to peanuts.")
    [item] = store.search(("memories", "u1"))
    assert item.value == {"content": "User is allergic to peanuts."}

    # A later conversation recalls it through the prompt's search, for u1 only.
    chat_server.chat_replies.extend(["Try an apple.", "Try an apple."])
    ask("u1", "What snack is safe for me?")
    ask("u2", "What snack is safe for me?")
    systems = [r["messages"][0]["content"] for r in chat_server.chat_requests()[-2:]]
    assert "peanuts" in systems[0] and "peanuts" not in systems[1]

    # The agent's search tool, then an update through the tool replaces the value.
    call = {"name": "search_memory", "arguments": {"query": "allergies"}}
    chat_server.chat_replies.extend([{"tool_calls": [call]}, "You are allergic to peanuts."])
    ask("u1", "What am I allergic to?")
    tool_reply = chat_server.chat_requests()[-1]["messages"][-1]
    assert tool_reply["role"] == "tool" and "peanuts" in tool_reply["content"]
    remember("User is allergic to shellfish, not peanuts.", action="update", id=item.key)
    ask("u1", "Correction: shellfish, not peanuts.")
    [updated] = store.search(("memories", "u1"))
    assert updated.key == item.key and "shellfish" in updated.value["content"]
    block = semantic.sessions.create("u1", session_id="chat").get_memory("allergies")
    assert "shellfish" in block.formatted_context
    assert "allergic to peanuts" not in block.formatted_context

    # Deleting through the tool deletes in stratamem.
    chat_server.chat_replies.extend(
        [
            {
                "tool_calls": [
                    {"name": "manage_memory", "arguments": {"action": "delete", "id": item.key}}
                ]
            },
            "Done.",
        ]
    )
    ask("u1", "Forget my allergies.")
    assert store.search(("memories", "u1")) == []
    assert semantic.search("shellfish", user_id="u1") == []


def test_a_graph_whose_nodes_use_the_store(semantic: Memory) -> None:
    from typing import TypedDict

    from langgraph.config import get_config, get_store
    from langgraph.graph import END, START, StateGraph

    class State(TypedDict):
        said: str
        recalled: list[str]

    def remember(state: State) -> dict[str, Any]:
        user = get_config()["configurable"]["user"]
        if state["said"].startswith("remember "):
            key = str(len(get_store().search(("users", user), limit=100)))
            get_store().put(("users", user), key, {"content": state["said"][9:]})
        return {}

    def recall(state: State) -> dict[str, Any]:
        user = get_config()["configurable"]["user"]
        found = get_store().search(("users", user), query=state["said"], limit=3)
        return {"recalled": [i.value["content"] for i in found]}

    builder = StateGraph(State)
    builder.add_node("remember", remember)
    builder.add_node("recall", recall)
    builder.add_edge(START, "remember")
    builder.add_edge("remember", "recall")
    builder.add_edge("recall", END)
    graph = builder.compile(store=StratamemStore(semantic, user_index=1, sync=True))

    def run(user: str, said: str) -> list[str]:
        out = graph.invoke({"said": said, "recalled": []}, {"configurable": {"user": user}})
        return list(out["recalled"])

    run("ana", "remember I play the cello in an orchestra.")
    run("ana", "remember My sister lives in Porto.")
    run("ben", "remember I play football on Sundays.")
    assert run("ana", "Which instrument do I play?")[0] == "I play the cello in an orchestra."
    assert all("football" not in r for r in run("ana", "Which sport do I play?"))
    assert run("ben", "Which sport do I play?") == ["I play football on Sundays."]


# -- against a server ----------------------------------------------------------------------


@pytest.mark.slow
def test_against_a_server(served: str, clock: Clock) -> None:
    url, key = served.split()
    with connect(url, api_key=key) as remote:
        store = StratamemStore(remote, user_index=1)
        store.put(NS, "k/1", TRICKY)
        store.put(NS, "food", {"content": "I am allergic to peanuts."})
        store.put(("memories", "u2"), "x", {"content": "I like golf."})
        item = store.get(NS, "k/1")
        assert item is not None and item.value == TRICKY and list(item.value) == list(TRICKY)
        clock.advance(1)
        store.put(NS, "food", {"content": "I am allergic to shellfish."})
        remote.wait()
        [hit] = store.search(NS, query="allergic", filter={"content": {"$ne": "x"}})
        assert hit.value == {"content": "I am allergic to shellfish."} and hit.score
        assert store.list_namespaces(prefix=("memories",)) == [NS, ("memories", "u2")]
        assert not any("peanuts" in f.text for f in remote.facts.list(user_id="u1"))
        store.put(NS, "temp", {"content": "soon gone"}, ttl=1)
        clock.advance(2)
        assert store.get(NS, "temp") is None
        store.delete(NS, "food")
        assert not any("shellfish" in h.text for h in remote.search("shellfish", user_id="u1"))
        remote.erase_user("u2")
        assert store.list_namespaces() == [NS]
        remote.erase_user("u1")
        assert store.search(("memories",)) == []


# -- packaging -----------------------------------------------------------------------------


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parent
    )


def test_importing_stratamem_imports_no_framework() -> None:
    proc = _python(
        "import sys, stratamem, stratamem.integrations\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('langgraph', 'langmem', 'langchain_core', 'agents')))"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_without_langgraph_the_module_names_the_extra() -> None:
    assert_names_the_extra("langgraph", "stratamem.integrations.langgraph", "langgraph")


def test_the_docs_example_runs(tmp_path: Path, chat_server: FakeOpenAIServer) -> None:
    call = {"name": "manage_memory", "arguments": {"content": "User is allergic to peanuts."}}
    chat_server.chat_replies.extend([{"tool_calls": [call]}, "Noted."])
    out = run_docs_example(
        "langgraph.md", tmp_path, OPENAI_API_KEY="k", OPENAI_BASE_URL=chat_server.base_url
    )
    assert "{'content': 'User is allergic to peanuts.'}" in out
    assert "- [" in out and "User is allergic to peanuts." in out.split("<memory>")[1]
