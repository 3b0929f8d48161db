"""The MCP face, driven by the official SDK's own client: in process (the tools on both
stores), over stdio (a real ``stratamem mcp`` process) and over streamable HTTP (a real
``stratamem serve``): what each tool returns, corrections and forgetting, bad arguments as
tool errors, and that neither another project's key nor a tool argument reaches another
user's memory.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import secrets
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult

from server_proc import ServerProcess
from stratamem import Memory
from stratamem.mcp import MemoryTools
from stratamem.mcp._server import PROFILE_URI, build_server

pytestmark = pytest.mark.slow

TOOLS = {
    "add_memory",
    "search_memories",
    "get_context",
    "list_memories",
    "get_memory",
    "update_memory",
    "delete_memory",
    "forget",
    "list_topics",
}
ADMIN = "admin-" + secrets.token_hex(8)


def _data(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, result.content
    assert result.structured_content is not None
    # The same data as text, for hosts that read only content blocks.
    assert json.loads(result.content[0].text) == result.structured_content  # type: ignore[union-attr]
    return result.structured_content


def _error(result: CallToolResult) -> str:
    assert result.is_error, result.structured_content
    text: str = result.content[0].text  # type: ignore[union-attr]
    return text


async def _call(c: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    return _data(await c.call_tool(tool, arguments))


# -- scenarios, each run over every transport ------------------------------------------------


async def remember_search_and_explain(c: Client) -> str:
    listed = await c.list_tools()
    assert {t.name for t in listed.tools} == TOOLS
    assert all(t.description and len(t.description) > 60 for t in listed.tools)
    search = next(t for t in listed.tools if t.name == "search_memories")
    assert "user_id" not in search.input_schema["properties"]  # the connection names the user

    added = await _call(c, "add_memory", text="I'm allergic to peanuts.", wait=True)
    assert added["processed"] is True
    (message_id,) = added["message_ids"]
    (learned,) = added["learned"]["summaries"]
    assert "peanut" in learned["text"].lower()

    found = (await _call(c, "search_memories", query="peanuts allergy", limit=5))["results"]
    top = next(h for h in found if h["id"] == learned["id"])
    assert top["layer"] == "summary" and top["date"]
    assert message_id in top["message_ids"]
    assert top["sources"][0]["content"] == "I'm allergic to peanuts."

    item = await _call(c, "get_memory", memory_id=learned["id"])
    assert item["memory"]["status"] == "active"
    assert [m["content"] for m in item["messages"]] == ["I'm allergic to peanuts."]
    assert item["facts"] and all(message_id in f["message_ids"] for f in item["facts"])
    assert [v["version"] for v in item["history"]] == [1]

    context = await _call(c, "get_context", query="Which snacks should I avoid buying?")
    assert "peanut" in context["formatted_context"].lower()
    topics = (await _call(c, "list_topics"))["topics"]
    assert sum(t["memories"] for t in topics) >= 1
    listed_memories = await _call(c, "list_memories")
    ids = [m["id"] for t in listed_memories["topics"] for m in t["memories"]]
    assert learned["id"] in ids + [m["id"] for m in listed_memories["unfiled"]]

    profile = await c.read_resource(PROFILE_URI)
    assert "peanuts" in profile.contents[0].text  # type: ignore[union-attr]
    return str(learned["id"])


async def correct_then_forget(c: Client) -> None:
    added = await _call(c, "add_memory", text="I live in Berlin.", wait=True)
    (old,) = added["learned"]["summaries"]
    corrected = await _call(c, "update_memory", memory_id=old["id"], text="I moved to Lisbon.")
    assert corrected["corrected"]["id"] == old["id"]
    assert corrected["corrected"]["status"] == "superseded"
    new = corrected["memory"]
    assert corrected["corrected"]["superseded_by"] == new["id"] and "Lisbon" in new["text"]

    current = (await _call(c, "search_memories", query="where does the user live"))["results"]
    assert old["id"] not in [h["id"] for h in current]
    assert new["id"] in [h["id"] for h in current]
    history = await _call(c, "search_memories", query="Berlin", include_superseded=True)
    assert old["id"] in [h["id"] for h in history["results"]]
    superseded = await _call(c, "list_memories", status="superseded")
    everything = [m for t in superseded["topics"] for m in t["memories"]] + superseded["unfiled"]
    assert [m["id"] for m in everything] == [old["id"]]
    versions = (await _call(c, "get_memory", memory_id=old["id"]))["history"]
    assert versions[-1]["status"] == "superseded"

    deleted = await _call(c, "delete_memory", memory_id=new["id"], reason="user asked")
    assert deleted["deleted"]["messages"] == 1
    gone = _error(await c.call_tool("get_memory", {"memory_id": new["id"]}))
    assert f"no memory {new['id']!r}" in gone
    session = corrected_session = added["session_id"]
    assert corrected_session.startswith("mcp-")
    forgotten = await _call(c, "forget", session_id=session)
    assert forgotten["deleted"]["messages"] >= 1
    left = await _call(c, "search_memories", query="where does the user live Berlin Lisbon")
    assert left["results"] == []


# One bad call of every tool: each is refused with one line naming the field and what it
# accepts, in stratamem's words, not pydantic's report (its model names, its links).
BAD_CALLS: list[tuple[str, dict[str, Any], str]] = [
    (
        "search_memories",
        {"query": "x", "layer": "bogus"},
        "invalid search_memories: layer: expected one of 'summary', 'fact' or 'message' "
        "(got 'bogus')",
    ),
    ("search_memories", {"query": "x", "limit": "ten"}, "limit: expected an integer (got 'ten')"),
    ("search_memories", {"query": "x", "since": "May"}, "since: expected an ISO-8601 datetime"),
    (
        "search_memories",
        {"query": "x", "include_superseded": "maybe"},
        "include_superseded: expected true or false (got 'maybe')",
    ),
    ("search_memories", {}, "invalid search_memories: query: required"),
    ("add_memory", {}, "invalid add_memory: text: required"),
    ("add_memory", {"text": "x", "metadata": "bad"}, "metadata: expected an object (got 'bad')"),
    ("add_memory", {"text": "x", "wait": "maybe"}, "wait: expected true or false (got 'maybe')"),
    ("get_context", {"query": 3}, "invalid get_context: query: expected a string (got 3)"),
    ("get_context", {"query": "x", "session_id": "a b"}, "session_id: expected 1-200 characters"),
    (
        "list_memories",
        {"status": "gone"},
        "status: expected one of 'active', 'deprioritized', 'archived', 'deleted' or "
        "'superseded' (got 'gone')",
    ),
    ("list_memories", {"limit": 1.5}, "limit: expected an integer (got 1.5)"),
    ("list_memories", {"offset": -1}, "offset: expected an integer from 0 to 1000000000 (got -1)"),
    ("get_memory", {}, "invalid get_memory: memory_id: required"),
    ("get_memory", {"memory_id": ""}, "memory_id: expected 1-200 characters"),
    ("update_memory", {"memory_id": "s_x"}, "invalid update_memory: text: required"),
    ("update_memory", {"memory_id": "f_x", "text": "y"}, "'f_x' is not a summary id"),
    ("delete_memory", {"memory_id": None}, "memory_id: expected a string (got None)"),
    ("forget", {}, "invalid forget: give session_id or topic_id"),
    ("forget", {"session_id": 3}, "invalid forget: session_id: expected a string (got 3)"),
    ("list_topics", {"x": 1}, ""),  # no parameters: an extra argument is ignored, not refused
]


async def refuse_bad_arguments(c: Client) -> None:
    listed = {t.name: t for t in (await c.list_tools()).tools}
    assert {name for name, _, _ in BAD_CALLS} == set(listed)
    for tool, arguments, says in BAD_CALLS:
        result = await c.call_tool(tool, arguments)
        if not says:
            assert not result.is_error, result.content
            continue
        text = _error(result)
        assert says in text, (tool, arguments, text)
        assert "\n" not in text and text.startswith(f"Error executing tool {tool}: ")
        for noise in ("pydantic", "http", "Arguments", "[type=", "Traceback", "ValidationError"):
            assert noise not in text, (tool, arguments, text)

    bad = _error(await c.call_tool("search_memories", {"query": "", "limit": 0}))
    assert "invalid search: query: expected a non-empty string (got ''); " in bad
    assert "limit: expected an integer from 1 to 1000 (got 0)" in bad
    assert "no memory 's_nothing'" in _error(
        await c.call_tool("get_memory", {"memory_id": "s_nothing"})
    )
    both = _error(await c.call_tool("forget", {"session_id": "s", "topic_id": "t_x"}))
    assert "give exactly one of" in both

    # update_memory takes summaries only, and says so: in its schema and when given another id.
    memory_id = listed["update_memory"].input_schema["properties"]["memory_id"]["description"]
    assert "(s_...)" in memory_id and "f_..." not in memory_id and "t_..." not in memory_id
    assert "Only summaries" in memory_id
    added = await _call(c, "add_memory", text="I play the cello.", wait=True)
    message_id = added["message_ids"][0]
    (fact,) = added["learned"]["facts"]
    for not_summary in (message_id, fact["id"]):
        refused = _error(
            await c.call_tool("update_memory", {"memory_id": not_summary, "text": "I play piano."})
        )
        assert f"{not_summary!r} is not a summary id: update_memory corrects a summary" in refused
        assert "search_memories with layer 'summary'" in refused


# Out-of-range arguments get the REST API's bounds (a page of 1 to 1000 from an offset of at
# most 10**9), and a refusal quotes at most a few dozen characters of what it was given
# (texts under the server's 1 MB body limit, which refuses larger requests before MCP).
HUGE_TEXT = "x" * 100_000
OUT_OF_RANGE: list[tuple[str, dict[str, Any], str]] = [
    (
        "list_memories",
        {"offset": 10**20},
        "offset: expected an integer from 0 to 1000000000 (got 100000000000000000000)",
    ),
    ("list_memories", {"offset": -(10**20)}, "offset: expected an integer from 0 to 1000000000"),
    ("list_memories", {"limit": 5000}, "limit: expected an integer from 1 to 1000 (got 5000)"),
    ("list_memories", {"limit": 10**20}, "limit: expected an integer from 1 to 1000"),
    ("search_memories", {"query": "x", "limit": 10**20}, "limit: expected an integer from 1"),
    ("search_memories", {"query": "x", "limit": 1e308}, "limit: expected an integer (got 1e+308)"),
    ("search_memories", {"query": "x", "limit": -(10**20)}, "limit: expected an integer from 1"),
    ("search_memories", {"query": HUGE_TEXT * 5}, "query: too long: 500000 characters"),
    ("search_memories", {"query": "x", "since": HUGE_TEXT}, "since: expected an ISO-8601"),
    ("search_memories", {"query": "x", "since": "9" * 400}, "since: epoch seconds out of range"),
    ("get_context", {"query": HUGE_TEXT * 5}, "query: too long: 500000 characters"),
    ("get_context", {"query": "x", "session_id": HUGE_TEXT}, "session_id: expected 1-200"),
    ("list_memories", {"topic_id": HUGE_TEXT}, "memory_id: expected 1-200"),
    ("get_memory", {"memory_id": HUGE_TEXT}, "memory_id: expected 1-200"),
    ("update_memory", {"memory_id": HUGE_TEXT, "text": "x"}, "memory_id: expected 1-200"),
    ("update_memory", {"memory_id": "s_x", "text": HUGE_TEXT * 5}, "no memory 's_x'"),
    ("delete_memory", {"memory_id": HUGE_TEXT}, "memory_id: expected 1-200"),
    ("add_memory", {"text": HUGE_TEXT * 5}, "content: 500000 characters; the limit is"),
    ("add_memory", {"text": "x", "session_id": HUGE_TEXT}, "session_id: expected 1-200"),
    ("add_memory", {"text": "x", "metadata": {"k": HUGE_TEXT * 5}}, "metadata: 500009 bytes"),
    ("forget", {"session_id": HUGE_TEXT}, "session_id: expected 1-200"),
    ("forget", {"topic_id": HUGE_TEXT}, "topic_id: expected 1-200"),
    ("forget", {"session_id": "s", "reason": HUGE_TEXT}, "reason: expected a non-empty string"),
]


async def refuse_out_of_range_arguments(c: Client) -> None:
    for tool, arguments, says in OUT_OF_RANGE:
        text = _error(await c.call_tool(tool, arguments))
        assert says in text, (tool, text[:300])
        assert len(text) < 400, (tool, len(text), text[:300])
    listed = await _call(c, "list_memories", offset=1_000_000_000, limit=1000)
    assert listed["count"] == 0 and listed["next_offset"] is None


async def stay_with_the_connections_user(c: Client, others_memory_id: str) -> None:
    """Whatever the model puts in the arguments, the connection's user is the only one."""
    result = await c.call_tool("search_memories", {"query": "peanuts", "user_id": "u-other"})
    hits = [] if result.is_error else result.structured_content["results"]  # type: ignore[index]
    assert all("peanut" not in h["text"].lower() for h in hits)
    assert "no memory" in _error(await c.call_tool("get_memory", {"memory_id": others_memory_id}))
    assert "no memory" in _error(
        await c.call_tool("delete_memory", {"memory_id": others_memory_id})
    )
    assert "no memory" in _error(
        await c.call_tool("update_memory", {"memory_id": others_memory_id, "text": "x"})
    )


def _run(scenario: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(asyncio.wait_for(scenario(), timeout=240))


# -- in process, on both stores --------------------------------------------------------------


@asynccontextmanager
async def _inproc(mem: Memory, user_id: str) -> AsyncIterator[Client]:
    tools = MemoryTools(mem, user_id)
    async with Client(build_server(lambda _request: tools), read_timeout_seconds=60) as c:
        yield c


def test_tools_in_process(make_memory: Callable[..., Memory]) -> None:
    mem = make_memory()

    async def scenario() -> None:
        async with _inproc(mem, "u1") as c:
            others = await remember_search_and_explain(c)
        async with _inproc(mem, "u2") as c:
            await stay_with_the_connections_user(c, others)
            assert (await _call(c, "list_topics"))["topics"] == []
        async with _inproc(mem, "u1") as c:
            await correct_then_forget(c)
            await refuse_bad_arguments(c)
            await refuse_out_of_range_arguments(c)
        # Deletions through MCP are audited with the tools' actor.
        actions = {(r.action, r.actor) for r in mem.audit(user_id="u1")}
        assert ("forget", "mcp") in actions

    _run(scenario)


def test_a_user_id_that_is_no_id_is_refused_before_serving(tmp_path: Path) -> None:
    with (
        Memory(str(tmp_path / "m.db"), embedder="hash", workers=0) as mem,
        pytest.raises(ValueError, match="user_id"),
    ):
        MemoryTools(mem, "two words")


# -- stdio: a real `stratamem mcp` process ---------------------------------------------------


def _stdio(db_url: str, *args: str) -> StdioServerParameters:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATAMEM_")}
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "stratamem", "--embedder", "hash", "mcp", "--database-url", db_url, *args],
        env=env,
    )


def test_stdio_process(db_url: str) -> None:
    async def scenario() -> None:
        async with Client(_stdio(db_url, "--user-id", "u1"), read_timeout_seconds=60) as c:
            others = await remember_search_and_explain(c)
            async with Client(_stdio(db_url, "--user-id", "u2"), read_timeout_seconds=60) as c2:
                await stay_with_the_connections_user(c2, others)
            await correct_then_forget(c)
            await refuse_bad_arguments(c)
            await refuse_out_of_range_arguments(c)

    _run(scenario)


def test_stdio_needs_a_user(tmp_path: Path) -> None:
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATAMEM_")}
    cmd = [sys.executable, "-m", "stratamem", "mcp", "--database-url", f"{tmp_path}/m.db"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2
    assert "--user-id or STRATAMEM_MCP_USER_ID" in done.stderr
    bad = subprocess.run([*cmd, "--user-id", "a b"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and "user_id" in bad.stderr and not bad.stdout


# -- streamable HTTP: a real `stratamem serve` -----------------------------------------------


class Served:
    def __init__(self, proc: ServerProcess) -> None:
        self.proc = proc
        self.url = proc.url
        self.key = proc.bootstrap_key()

    def key_of_new_project(self, project_id: str) -> str:
        admin = {"Authorization": f"Bearer {ADMIN}"}
        with httpx.Client(base_url=self.url, headers=admin, timeout=60) as a:
            assert a.post("/admin/projects", json={"name": project_id, "project_id": project_id})
            r = a.post(f"/admin/projects/{project_id}/keys", json={"name": "mcp tests"})
            assert r.status_code == 201, r.text
            return str(r.json()["data"]["secret"])

    @asynccontextmanager
    async def connect(
        self, path: str = "/mcp/users/u1", key: str | None = None, **headers: str
    ) -> AsyncIterator[Client]:
        headers["Authorization"] = f"Api-Key {key or self.key}"
        async with httpx2.AsyncClient(headers=headers, timeout=60) as http:
            transport = streamable_http_client(self.url + path, http_client=http)
            async with Client(transport, read_timeout_seconds=60) as c:
                yield c


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, module_db_url: str) -> Iterator[Served]:
    proc = ServerProcess(
        tmp_path_factory.mktemp("mcp-server"),
        db_url=module_db_url,
        env={"STRATAMEM_ADMIN_TOKEN": ADMIN},
    ).start()
    try:
        yield Served(proc)
    finally:
        proc.stop()


def test_http_tools(served: Served) -> None:
    other_key = served.key_of_new_project("elsewhere")

    async def scenario() -> None:
        async with served.connect() as c:
            others = await remember_search_and_explain(c)
        async with served.connect("/mcp/users/u2") as c:
            await stay_with_the_connections_user(c, others)
        # Another project's key, the same user id: another project's memory, which is empty.
        async with served.connect(key=other_key) as c:
            await stay_with_the_connections_user(c, others)
            assert (await _call(c, "list_memories"))["count"] == 0
        # The user in a header instead of the URL.
        async with served.connect("/mcp", **{"X-Stratamem-User-Id": "u1"}) as c:
            hits = await _call(c, "search_memories", query="peanuts")
            assert others in [h["id"] for h in hits["results"]]
            await correct_then_forget(c)
            await refuse_bad_arguments(c)
            await refuse_out_of_range_arguments(c)

    _run(scenario)
    with httpx.Client(base_url=served.url, timeout=30) as api:
        audit = api.get(
            "/api/audit",
            params={"user_id": "u1"},
            headers={"Authorization": f"Api-Key {served.key}"},
        ).json()["data"]["items"]
    assert {r["actor"].split(":", 1)[0] for r in audit} == {"mcp"}  # mcp:api_key:<key id>
    log = [json.loads(line) for line in served.proc.stderr().splitlines() if '"path"' in line]
    mcp_lines = [e for e in log if e["path"] == "/mcp/users/{user_id}"]
    assert mcp_lines and {e["project_id"] for e in mcp_lines} == {"default", "elsewhere"}


def test_stdio_against_the_server(served: Served) -> None:
    """``stratamem mcp`` with an http(s) URL and a key: the tools over the remote memory."""

    async def scenario() -> None:
        params = _stdio(served.url, "--user-id", "u-remote", "--api-key", served.key)
        async with Client(params, read_timeout_seconds=60) as c:
            added = await _call(c, "add_memory", text="I collect vinyl records.", wait=True)
            (summary,) = added["learned"]["summaries"]
            hits = (await _call(c, "search_memories", query="vinyl records"))["results"]
            assert summary["id"] in [h["id"] for h in hits]
            item = await _call(c, "get_memory", memory_id=summary["id"])
            assert item["messages"][0]["content"] == "I collect vinyl records."

    _run(scenario)
    with httpx.Client(base_url=served.url, timeout=30) as api:
        listed = api.get(
            "/api/users/u-remote/summaries", headers={"Authorization": f"Api-Key {served.key}"}
        ).json()["data"]["items"]
    assert [s["text"] for s in listed] == ["User collects vinyl records."]


@pytest.mark.parametrize(
    ("path", "headers", "status", "says"),
    [
        ("/mcp/users/u1", {}, 401, "missing or malformed Authorization"),
        (
            "/mcp/users/u1",
            {"Authorization": "Api-Key sm_wrong_key_0123456789abcdef"},
            401,
            "invalid",
        ),
        ("/mcp/users/u1", {"Authorization": "Basic dTE6cHc="}, 401, "malformed"),
        ("/mcp", {"key": ""}, 400, "no user"),
        ("/mcp/users/u1", {"key": "", "X-Stratamem-User-Id": "u2"}, 400, "names user"),
        ("/mcp/users/a%20b", {"key": ""}, 400, "user_id"),
    ],
)
def test_http_refuses_before_mcp(
    served: Served, path: str, headers: dict[str, str], status: int, says: str
) -> None:
    if "key" in headers:
        headers = {k: v for k, v in headers.items() if k != "key"}
        headers["Authorization"] = f"Api-Key {served.key}"
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    accept = {"Accept": "application/json, text/event-stream"}
    r = httpx.post(served.url + path, json=body, headers={**accept, **headers}, timeout=30)
    assert r.status_code == status, r.text
    assert says in r.json()["error"]["detail"]
    if status == 401:
        assert "Api-Key" in r.headers["www-authenticate"]


def test_http_without_the_sdk_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fastapi.testclient import TestClient

    import stratamem.mcp._http as endpoint
    from stratamem.server import create_app

    def without_sdk() -> None:
        raise ModuleNotFoundError("No module named 'mcp'", name="mcp")

    monkeypatch.setattr(endpoint, "_build_manager", without_sdk)  # as if mcp were not installed
    with Memory(str(tmp_path / "m.db"), embedder="hash", workers=0) as mem:
        mem.projects.create("default", project_id="default")
        _, secret = mem.keys.create("default")
        with TestClient(create_app(mem)) as api:
            r = api.post(
                "/mcp/users/u1",
                json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                headers={"Authorization": f"Api-Key {secret}"},
            )
            assert api.get("/healthz").status_code == 200  # the REST API is unaffected
    assert r.status_code == 501
    assert "pip install 'stratamem[mcp]'" in r.json()["error"]["detail"]


def test_http_get_is_refused_and_a_huge_user_is_quoted_short(served: Served) -> None:
    """The endpoint is stateless: there is no event stream to open (GET) and no session to
    end (DELETE), so both are a 405 naming POST, at once rather than a stream that never
    ends. A 100 KB user id is refused quoting only its start."""
    auth = {"Authorization": f"Api-Key {served.key}", "Accept": "text/event-stream"}
    for method in ("GET", "DELETE"):
        for path in ("/mcp/users/u1", "/mcp"):
            r = httpx.request(
                method, served.url + path, headers={**auth, "X-Stratamem-User-Id": "u1"}, timeout=10
            )
            assert r.status_code == 405, (method, path, r.text)
            assert r.headers["allow"] == "POST"
            assert "POST" in r.json()["error"]["detail"]
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    accept = {"Accept": "application/json, text/event-stream"}
    huge = "u" * 100_000
    for path, headers in ((f"/mcp/users/{huge}", {}), ("/mcp", {"X-Stratamem-User-Id": huge})):
        # http.client: httpx refuses to send a URL this long.
        conn = http.client.HTTPConnection("127.0.0.1", served.proc.port, timeout=30)
        try:
            conn.request(
                "POST",
                path,
                body=json.dumps(body),
                headers={**accept, **headers, "Authorization": f"Api-Key {served.key}"},
            )
            answer = conn.getresponse()
            status, content = answer.status, answer.read()
        finally:
            conn.close()
        assert status == 400, content[:300]
        assert "user_id: expected 1-200 characters" in json.loads(content)["error"]["detail"]
        assert len(content) < 1000, len(content)
