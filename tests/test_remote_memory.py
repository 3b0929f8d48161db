"""``Memory("http://...")`` is the same facade over a real stratamem server."""

from __future__ import annotations

from pathlib import Path

import pytest

from server_proc import ServerProcess
from stratamem import Memory
from stratamem.client import RemoteMemory

pytestmark = pytest.mark.slow


def test_an_http_url_gives_the_remote_facade(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = ServerProcess(tmp_path).start()
    try:
        key = server.bootstrap_key()
        mem = Memory(server.url, api_key=key)
        assert isinstance(mem, RemoteMemory)
        session = mem.sessions.create("u1", session_id="s1")
        session.add_messages(
            [{"id": "m1", "role": "user", "content": "I moved to Berlin last May."}], sync=True
        )
        assert any("Berlin" in h.text for h in mem.search("Berlin", user_id="u1"))
        mem.close()

        # The same from the environment, as a deployed app would configure it.
        monkeypatch.setenv("STRATAMEM_DATABASE_URL", server.url)
        monkeypatch.setenv("STRATAMEM_API_KEY", key)
        with Memory() as remote:
            assert isinstance(remote, RemoteMemory)
            assert remote.sessions.get("s1").user_id == "u1"
    finally:
        server.stop()
    # Embedded URLs still give the embedded engine.
    local = Memory(f"sqlite:///{tmp_path / 'local.db'}", embedder="hash")
    try:
        assert type(local) is Memory
    finally:
        local.close()
