"""The receivers of docs/webhooks.md work: each runs under uvicorn on 127.0.0.1 and the
engine calls it through a real webhook (the code is taken from the page, not copied here)."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from conftest import REPO
from fakes.memory_model import MemoryModel
from fakes.openai_server import FakeOpenAIServer
from stratamem import Memory

PAGE = (REPO / "docs" / "webhooks.md").read_text(encoding="utf-8")


def _receiver_code(name: str) -> str:
    blocks = re.findall(r"```python\n(# receiver: (\w+)\n.*?)```", PAGE, re.DOTALL)
    found = {n: code for code, n in blocks}
    assert set(found) == {"pii", "rules", "profile", "audit"}
    return found[name]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def _serve(name: str, port: int) -> Iterator[dict[str, Any]]:
    """Run the page's receiver ``name`` (its environment already set) on ``port``."""
    namespace: dict[str, Any] = {"__name__": f"receiver_{name}"}
    exec(compile(_receiver_code(name), f"docs/webhooks.md:{name}", "exec"), namespace)
    server = uvicorn.Server(
        uvicorn.Config(namespace["app"], host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "receiver did not start"
        time.sleep(0.01)
    try:
        yield namespace
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture
def llm() -> Iterator[tuple[FakeOpenAIServer, MemoryModel]]:
    model = MemoryModel()
    with FakeOpenAIServer() as server:
        server.chat_script = model
        yield server, model


def _llm_memory(make_memory: Any, server: FakeOpenAIServer, **kw: Any) -> Memory:
    return make_memory(
        llm="openai:fake-chat",
        llm_base_url=server.base_url,
        llm_api_key="k",
        llm_max_retries=0,
        webhook_allow="127.0.0.1",
        **kw,
    )


def test_pii_redaction_receiver(make_memory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    mem = make_memory(webhook_allow="127.0.0.1", workers=0)
    port = _port()
    hook, secret = mem.webhooks.create(
        resource="fact",
        event="before_add",
        target_url=f"http://127.0.0.1:{port}/stratamem/redact",
        timeout_ms=5000,
    )
    monkeypatch.setenv("STRATAMEM_HOOK_SECRET", secret)
    with _serve("pii", port):
        s = mem.sessions.create(user_id="ana")
        s.add_messages(
            [
                {"role": "user", "content": "My email is ana.silva@example.com, I live in Faro."},
                {"role": "user", "content": "Call me on +351 912 345 678 after six."},
                {"role": "user", "content": "My card is 4111 1111 1111 1111, keep it handy."},
            ],
            sync=True,
        )
    texts = " ".join(f.text for f in mem.facts.list(user_id="ana"))
    assert "[email]" in texts and "[phone]" in texts and "[card]" in texts, texts
    assert "example.com" not in texts and "912 345" not in texts and "4111" not in texts
    assert mem.webhooks.deliveries(hook.id)[0].status == "delivered"


def test_business_rules_receiver(
    make_memory: Any,
    llm: tuple[FakeOpenAIServer, MemoryModel],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server, model = llm
    mem = _llm_memory(make_memory, server, workers=0)
    port = _port()
    _, secret = mem.webhooks.create(
        resource="fact", event="before_llm", target_url=f"http://127.0.0.1:{port}/stratamem/rules"
    )
    monkeypatch.setenv("STRATAMEM_HOOK_SECRET", secret)
    with _serve("rules", port):
        s = mem.sessions.create(user_id="u")
        s.add_messages([{"role": "user", "content": "I prefer oat milk."}], sync=True)
    _, system, user = next(p for p in model.prompts if p[0] == "extract")
    assert "Additional instructions:\nNever record health or medical information." in user
    assert "Never record health" not in system


def test_profile_sync_receiver(make_memory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    mem = make_memory(webhook_allow="127.0.0.1", workers=0)
    port = _port()
    _, secret = mem.webhooks.create(
        resource="summary",
        event="before_add",
        mode="async",
        target_url=f"http://127.0.0.1:{port}/stratamem/profile",
    )
    monkeypatch.setenv("STRATAMEM_HOOK_SECRET", secret)
    with _serve("profile", port) as receiver:
        s = mem.sessions.create(user_id="bo")
        s.add_messages([{"role": "user", "content": "I live in Lisbon."}], sync=True)
        s.add_messages([{"role": "user", "content": "I work as a baker in the old town."}])
        mem.wait()
        mem.webhooks.wait(timeout=30)
        profile = receiver["PROFILES"]["bo"]
    stored = {x.id: x.text for x in mem.summaries.list(user_id="bo", status="active")}
    assert profile == stored and len(stored) == 2


def test_audit_receiver(
    make_memory: Any,
    llm: tuple[FakeOpenAIServer, MemoryModel],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    server, _ = llm
    mem = _llm_memory(make_memory, server)
    port = _port()
    secrets = {}
    for resource in ("fact", "summary"):
        hook, secrets[hook.id] = mem.webhooks.create(
            resource=resource,
            event="after_llm",
            mode="async",
            target_url=f"http://127.0.0.1:{port}/stratamem/audit",
        )
    log = tmp_path / "audit.jsonl"
    monkeypatch.setenv("STRATAMEM_HOOK_SECRETS", json.dumps(secrets))
    monkeypatch.setenv("AUDIT_LOG", str(log))
    with _serve("audit", port):
        s = mem.sessions.create(user_id="cy")
        s.add_messages([{"role": "user", "content": "I started learning the cello."}], sync=True)
        mem.webhooks.wait(timeout=30)
    records = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    assert sorted(r["point"] for r in records) == ["fact.after_llm", "summary.after_llm"]
    for r in records:
        assert r["user_id"] == "cy" and json.loads(r["raw_output"]) and r["parsed"]
    for hook in mem.webhooks.list():
        assert [d.status for d in mem.webhooks.deliveries(hook.id)] == ["delivered"]
