"""GUMem's documented cURL commands, run with curl against `stratamem serve`.

The commands below are kept as literal text and run through bash; only the host
(``http://localhost:8000``) and the key (``your_api_key``) are replaced. The add-memory and
GET query commands are GUMem's documentation verbatim (eak.eazo.ai/docs/gumem, "Add Memory"
and "Query Memory"); they use the placeholder session id ``session_xxx``, which the
create-session command creates. That command and the POST query are written in the same
form from the same pages: the create body is the Quick Start's (``user_id``, ``title``) plus
``session_id``; the POST query carries the page's recall config (``MessageRecentLimit: 20``,
``MetadataFilters: {"ping": "pong"}``), once in the body and once as GUMem's SDK sends it
(``query`` and ``details`` in the query string, ``recall_config`` in the body).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from server_proc import ServerProcess, client

pytestmark = pytest.mark.slow

CREATE_SESSION = """\
curl -X POST "http://localhost:8000/api/sessions" \\
  -H "Authorization: Api-Key your_api_key" \\
  -H "Content-Type: application/json" \\
  -d '{
    "user_id": "user_123",
    "title": "Team scheduling session",
    "session_id": "session_xxx"
  }'
"""

# GUMem docs, "Add Memory" (verbatim).
ADD_MESSAGES = """\
curl -X POST "http://localhost:8000/api/sessions/session_xxx/messages" \\
  -H "Authorization: Api-Key your_api_key" \\
  -H "Content-Type: application/json" \\
  -d '{
    "messages": [
      {
        "role": "user",
        "content": "Please remember that I will travel to Shanghai next Wednesday.",
        "metadata": {
          "source": "chat"
        },
        "timestamp": "2026-04-24T10:30:00Z"
      }
    ]
  }'
"""

# The Quick Start's conversation, in the same request form.
ADD_QUICKSTART = """\
curl -X POST "http://localhost:8000/api/sessions/session_xxx/messages" \\
  -H "Authorization: Api-Key your_api_key" \\
  -H "Content-Type: application/json" \\
  -d '{
    "messages": [
      {
        "role": "user",
        "content": "For team scheduling, use Berlin when I mention Europe and Toronto when I mention the Americas."
      },
      {
        "role": "assistant",
        "content": "Got it. I will use Berlin for Europe scheduling and Toronto for Americas scheduling."
      }
    ]
  }'
"""  # noqa: E501 (a command kept as it is typed)

# GUMem docs, "Query Memory" (verbatim).
QUERY_GET = """\
curl -G "http://localhost:8000/api/sessions/session_xxx/context" \\
  -H "Authorization: Api-Key your_api_key" \\
  --data-urlencode "query=which city should be used for Europe or Americas team scheduling" \\
  --data-urlencode "details=false"
"""

QUERY_POST = """\
curl -X POST "http://localhost:8000/api/sessions/session_xxx/context" \\
  -H "Authorization: Api-Key your_api_key" \\
  -H "Content-Type: application/json" \\
  -d '{
    "query": "which city should be used for Europe or Americas team scheduling",
    "details": true,
    "recall_config": {
      "MessageRecentLimit": 20,
      "MetadataFilters": {
        "ping": "pong"
      }
    }
  }'
"""

QUERY_POST_SDK_FORM = """\
curl -X POST "http://localhost:8000/api/sessions/session_xxx/context?query=which%20city%20should%20be%20used%20for%20Europe%20or%20Americas%20team%20scheduling&details=true" \\
  -H "Authorization: Api-Key your_api_key" \\
  -H "Content-Type: application/json" \\
  -d '{
    "recall_config": {
      "MessageRecentLimit": 20,
      "MetadataFilters": {
        "ping": "pong"
      }
    }
  }'
"""  # noqa: E501 (a command kept as it is typed)

CONTEXT_FIELDS = {
    "project_id",
    "user_id",
    "session_id",
    "history",
    "facts",
    "summary",
    "topics",
    "formatted_context",
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, module_db_url: str) -> Iterator[ServerProcess]:
    proc = ServerProcess(tmp_path_factory.mktemp("gumem"), db_url=module_db_url).start()
    try:
        yield proc
    finally:
        proc.stop()


def run(command: str, server: ServerProcess) -> dict[str, Any]:
    assert shutil.which("curl"), "these tests run GUMem's documented commands with curl"
    assert command.count("http://localhost:8000") == 1 and "your_api_key" in command
    command = command.replace("http://localhost:8000", server.url).replace(
        "your_api_key", server.bootstrap_key()
    )
    proc = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    body = json.loads(proc.stdout)
    assert body["success"] is True and body["error"] is None, body
    return dict(body["data"])


def test_gumem_documented_curl_commands(server: ServerProcess) -> None:
    created = run(CREATE_SESSION, server)
    assert created["session_id"] == "session_xxx" and created["user_id"] == "user_123"

    added = run(ADD_MESSAGES, server)
    assert added["session_id"] == "session_xxx" and len(added["message_ids"]) == 1
    assert len(run(ADD_QUICKSTART, server)["message_ids"]) == 2
    with client(server.url, server.bootstrap_key()) as c:
        deadline = time.monotonic() + 60
        while not c.get("/api/sessions/session_xxx/status").json()["data"]["done"]:
            assert time.monotonic() < deadline
            time.sleep(0.1)

    # Without a recall config.
    ctx = run(QUERY_GET, server)
    assert set(ctx) >= CONTEXT_FIELDS
    assert ctx["project_id"] == "default" and ctx["user_id"] == "user_123"
    assert ctx["session_id"] == "session_xxx" and ctx["matches"] is None
    stored = ctx["history"][0]
    assert stored["content"] == "Please remember that I will travel to Shanghai next Wednesday."
    assert stored["metadata"] == {"source": "chat"}
    assert stored["timestamp"].startswith("2026-04-24T10:30:00")
    assert "Berlin" in ctx["formatted_context"] and "Toronto" in ctx["formatted_context"]

    # With the documented recall config, both request forms.
    for command in (QUERY_POST, QUERY_POST_SDK_FORM):
        ctx = run(command, server)
        assert set(ctx) >= CONTEXT_FIELDS
        assert ctx["query"] == "which city should be used for Europe or Americas team scheduling"
        assert len(ctx["history"]) == 3  # MessageRecentLimit 20: the whole session
        assert isinstance(ctx["matches"], list)
        assert all(isinstance(m["score"], float) for m in ctx["matches"])
        # MetadataFilters ping=pong: no stored message carries it, so none matches.
        assert [m for m in ctx["matches"] if m["layer"] == "message"] == []
