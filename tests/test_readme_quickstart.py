"""The README's curl lines, run verbatim (host and key aside) against `stratamem serve`."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest

from server_proc import ServerProcess

pytestmark = pytest.mark.slow

README = Path(__file__).resolve().parent.parent / "README.md"


def _curl_block() -> list[str]:
    text = README.read_text(encoding="utf-8")
    blocks = [b.split("```", 1)[0].strip() for b in text.split("```bash\n")[1:]]
    return next(b for b in blocks if b.startswith("curl")).splitlines()


def test_readme_curl_lines_add_and_query_memory(tmp_path: Path) -> None:
    lines = _curl_block()
    assert len(lines) == 2  # the README promises two lines
    server = ServerProcess(tmp_path).start()
    try:
        env = {**os.environ, "KEY": server.bootstrap_key()}
        answers = []
        for line in lines:
            line = line.replace("localhost:8000", f"127.0.0.1:{server.port}")
            done = subprocess.run(
                ["bash", "-c", line], capture_output=True, text=True, env=env, timeout=60
            )
            assert done.returncode == 0, done.stderr
            answers.append(json.loads(done.stdout))
        added, context = answers
        assert added["success"] and added["data"]["processed"] is True
        assert context["success"] and "Berlin" in context["data"]["formatted_context"]
        # The structured answer holds what the block says: the summary, the fact it was drawn
        # from (with its source message and date), and its topic naming that summary.
        data = context["data"]
        (message_id,) = added["data"]["message_ids"]
        (fact,) = data["facts"]
        assert "Berlin" in fact["text"] and fact["message_ids"] == [message_id]
        assert fact["occurred_at"]  # "last May", resolved
        (topic,) = data["topics"]
        (summary_id,) = topic["summary_ids"]
        with httpx.Client(
            base_url=server.url, headers={"Authorization": f"Api-Key {env['KEY']}"}
        ) as c:
            summary = c.get(f"/api/summaries/{summary_id}").json()["data"]
        assert summary["text"] == data["summary"] and summary["fact_ids"] == [fact["id"]]
    finally:
        server.stop()
