"""The examples of docs/capture.md run as written (the first one, and each framework's), each
in a fresh interpreter, against loopback fake providers reached through the SDKs' own
environment variables."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fakes.bedrock_server import FakeBedrockServer
from fakes.openai_server import FakeOpenAIServer
from stratamem.capture import MEMORY_PREAMBLE

DOC = Path(__file__).resolve().parent.parent / "docs" / "capture.md"
ANSWER = "Pasta with tomatoes."


def _examples() -> dict[str, str]:
    text = DOC.read_text()
    section = text.split("## Frameworks and AWS Bedrock", 1)[1].split("\n## ", 1)[0]
    found = re.findall(r"\n([A-Za-z ()0-9]+):\n\n```python\n(.*?)```", section, re.S)
    return {title.split()[0].rstrip(":"): code for title, code in found}


PRELUDE = """
import json, sys
from stratamem import Memory
mem = Memory(sys.argv[1], embedder="hash", capture_recall_timeout_ms=10_000)
mem.sessions.create(user_id="u1", session_id="llm-u1").add_messages(
    [{"role": "user", "content": "I cook tonight for my vegetarian sister."}], sync=True
)
"""
EPILOGUE = """
assert mem.llm.flush(10)
print()  # the LangChain example ends its streamed line without a newline
print(json.dumps([[m.role, m.content] for m in mem.messages.list(session_id="llm-u1")]))
"""


def test_first_example_recalls_the_first_call_in_the_second(tmp_path: Path) -> None:
    """The page's first example makes two calls back to back, as a script does: the second is
    sent with the memory of the first, because the example waits for it in between."""
    code = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert code is not None and "mem.llm.flush()" in code.group(1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATAMEM_")}
    with FakeOpenAIServer() as oai:
        oai.chat_script = lambda body: "Noted."
        env |= {"OPENAI_API_KEY": "k", "OPENAI_BASE_URL": oai.base_url}
        # A loaded test machine may take longer than the default 50 ms to recall.
        env["STRATAMEM_CAPTURE_RECALL_TIMEOUT_MS"] = "10000"
        run = subprocess.run(
            [sys.executable, "-c", code.group(1)],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,  # Memory() is ./stratamem.db
            timeout=120,
        )
        assert run.returncode == 0, run.stderr[-3000:]
        first, second = [body["messages"][-1]["content"] for body in oai.chat_requests()]
    assert first == "I'm allergic to peanuts."
    question, _, block = second.partition("\n\n")
    assert question == "Can you suggest a snack?"
    assert block.startswith(MEMORY_PREAMBLE) and "User is allergic to peanuts." in block


def test_every_framework_has_an_example() -> None:
    assert set(_examples()) == {"LangChain", "PydanticAI", "Agno", "AWS"}


@pytest.mark.parametrize("name", ["LangChain", "PydanticAI", "Agno", "AWS"])
def test_example_runs(name: str, tmp_path: Path) -> None:
    code = PRELUDE + _examples()[name] + EPILOGUE
    with FakeOpenAIServer() as oai, FakeBedrockServer() as brk:
        oai.chat_script = brk.chat_script = lambda body: ANSWER
        env = {
            **os.environ,
            "OPENAI_API_KEY": "k",
            "OPENAI_BASE_URL": oai.base_url,
            "OPENAI_API_BASE": oai.base_url,
            "AWS_ENDPOINT_URL_BEDROCK_RUNTIME": brk.base_url,
            "AWS_ACCESS_KEY_ID": "test-key",
            "AWS_SECRET_ACCESS_KEY": "test-secret",
            "AWS_MAX_ATTEMPTS": "1",
        }
        run = subprocess.run(
            [sys.executable, "-c", code, f"sqlite:///{tmp_path / 'm.db'}"],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert run.returncode == 0, run.stderr[-3000:]
        bodies = [json.dumps(b) for _, b in oai.requests + brk.requests]
    # The first question recalls the stored turn (follow-ups may find nothing to inject).
    preamble = json.dumps(MEMORY_PREAMBLE)[1:-1]  # as it reads inside a JSON body
    assert bodies and preamble in bodies[0] and "vegetarian sister" in bodies[0]
    stored = json.loads(run.stdout.strip().splitlines()[-1])
    assert ["user", "What should I cook tonight?"] in stored
    assert stored.count(["assistant", ANSWER]) >= 1
