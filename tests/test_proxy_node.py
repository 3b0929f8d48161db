"""The memory proxy from another language: a Node.js program using the official ``openai``
npm package (``tests/node``: package.json and its committed package-lock.json) with its
``baseURL`` pointed at the proxy, a plain and a streamed chat completion, against the
proxy in this process over a real store and the loopback fake OpenAI server.

The package is installed with ``npm ci`` once per lockfile into a cache outside the
checkout and reused by later runs. Without ``node`` and ``npm`` the test fails: CI
installs them (``.ci/run``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fakes.openai_server import FakeOpenAIServer
from inproc_server import InProcessServer
from node_packages import installed_packages, node_tool
from stratamem import Memory
from stratamem.capture import MEMORY_PREAMBLE
from stratamem.proxy import create_proxy_app
from stratamem.server import load_server_settings

NODE_PROJECT = Path(__file__).parent / "node"
SECRET = "sk-test-SECRET123"


def _tool(name: str) -> str:
    return node_tool(name, "The proxy's Node.js test")


def _node_modules() -> Path:
    """tests/node's packages (the official openai SDK)."""
    return installed_packages(NODE_PROJECT, "stratamem-node", "openai")


@pytest.fixture(scope="module")
def node_modules() -> Path:
    _tool("node")
    return _node_modules()


@pytest.fixture
def upstream() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as server:
        server.chat_script = lambda body: "Noted."
        server.answer_headers = {"x-request-id": "req_node1"}
        yield server


def _run_node(
    node_modules: Path, workdir: Path, base_url: str, user: str, *questions: str
) -> dict[str, Any]:
    """tests/node/chat.mjs, run as an application would be (its packages beside it)."""
    script = workdir / "chat.mjs"
    if not script.exists():
        shutil.copy(NODE_PROJECT / "chat.mjs", script)
        (workdir / "node_modules").symlink_to(node_modules, target_is_directory=True)
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(workdir), "OPENAI_API_KEY": SECRET}
    done = subprocess.run(
        [_tool("node"), str(script), base_url, user, *questions],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_a_node_application_through_the_proxy(
    node_modules: Path, make_memory: Any, upstream: FakeOpenAIServer, tmp_path: Path
) -> None:
    mem: Memory = make_memory()
    facts = mem.sessions.create(user_id="ana", session_id="facts")
    facts.add_messages([{"role": "user", "content": "I am allergic to peanuts."}], sync=True)
    app = create_proxy_app(mem, load_server_settings(proxy_upstream=upstream.base_url))
    with InProcessServer(app) as proxy:
        base_url = f"{proxy.url}/v1"
        upstream.chat_replies.extend(["Try the almond cookies.", "Plain rice crackers are fine."])
        first = _run_node(
            node_modules,
            tmp_path,
            base_url,
            "ana",
            "Can you suggest a snack with peanuts?",
            "Are rice crackers with peanuts fine?",
        )
        assert (
            first["openai"]
            == json.loads((NODE_PROJECT / "package.json").read_text())["dependencies"]["openai"]
        )
        assert first["plain"] == {
            "answer": "Try the almond cookies.",
            "memory": "injected",
            "requestId": "req_node1",
        }
        assert first["streamed"]["answer"] == "Plain rice crackers are fine."
        assert first["streamed"]["chunks"] == 5 and first["streamed"]["memory"] == "injected"
        for body, question in zip(
            upstream.chat_requests(),
            ["Can you suggest a snack with peanuts?", "Are rice crackers with peanuts fine?"],
            strict=True,
        ):
            asked, _, block = body["messages"][-1]["content"].partition("\n\n")
            assert asked == question
            assert block.startswith(MEMORY_PREAMBLE) and "allergic to peanuts" in block
        assert upstream.chat_requests()[1]["stream"] is True
        for headers in upstream.request_headers:
            assert headers["authorization"] == f"Bearer {SECRET}"
            assert headers["x-stainless-lang"] == "js"
            assert not [h for h in headers if h.startswith("x-stratamem")]

        assert _messages(mem, 4) == [
            ("user", "Can you suggest a snack with peanuts?"),
            ("assistant", "Try the almond cookies."),
            ("user", "Are rice crackers with peanuts fine?"),
            ("assistant", "Plain rice crackers are fine."),
        ]

        # Another run of the program, later: what it was told is memory now.
        again = _run_node(
            node_modules,
            tmp_path,
            base_url,
            "ana",
            "Which almond cookies did you suggest?",
            "Hello again!",
        )
        assert again["plain"]["memory"] == "injected"
        block = upstream.chat_requests()[2]["messages"][-1]["content"]
        assert "Try the almond cookies." in block
        # Another user's program gets none of it.
        other = _run_node(
            node_modules, tmp_path, base_url, "bob", "Any snack with peanuts?", "Cookies?"
        )
        assert other["plain"]["memory"] == "none"
        for body in upstream.chat_requests()[-2:]:
            text = body["messages"][-1]["content"]
            assert "allergic" not in text and "almond" not in text


def _messages(mem: Memory, at_least: int) -> list[tuple[str, str]]:
    """ana's captured turns, once at least ``at_least`` are stored."""
    deadline = time.monotonic() + 10
    while True:
        assert mem.llm.flush(10)
        found = [(m.role, m.content) for m in mem.messages.list(session_id="llm-ana")]
        if len(found) >= at_least or time.monotonic() > deadline:
            return found
        time.sleep(0.02)
