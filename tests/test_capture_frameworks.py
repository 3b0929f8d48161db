"""Framework integrations are optional: importing stratamem and using mem.llm load none of
them, and their absence breaks neither the import nor registration of other clients."""

from __future__ import annotations

import json
import subprocess
import sys

FRAMEWORKS = ("langchain_core", "pydantic_ai", "agno", "boto3", "botocore")


def _run(code: str) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_stratamem_loads_no_framework(tmp_path: object) -> None:
    code = (
        "import json, sys\n"
        "from stratamem import Memory\n"
        f"mem = Memory('sqlite:///{tmp_path}/m.db', embedder='hash')\n"
        "try:\n"
        "    mem.llm.register(object())\n"
        "except TypeError as exc:\n"
        "    error = str(exc)\n"
        f"loaded = [m for m in {FRAMEWORKS!r} if m in sys.modules]\n"
        "mem.close(timeout=1)\n"
        "print(json.dumps({'loaded': loaded, 'error': error}))\n"
    )
    out = _run(code)
    assert out["loaded"] == []
    assert "does not know builtins.object" in str(out["error"])


def test_missing_frameworks_break_nothing(tmp_path: object) -> None:
    # None in sys.modules makes an import fail, as when the package is not installed.
    blocked = "".join(f"sys.modules[{m!r}] = None\n" for m in FRAMEWORKS)
    code = (
        "import json, sys\n" + blocked + "from stratamem import Memory\n"
        f"mem = Memory('sqlite:///{tmp_path}/m.db', embedder='hash')\n"
        "errors = []\n"
        "for kwargs in ({'chatopenai': object()}, {'bedrock': object()}, {'agno': 1}):\n"
        "    try:\n"
        "        mem.llm.register(**kwargs)\n"
        "    except TypeError as exc:\n"
        "        errors.append(str(exc))\n"
        "mem.close(timeout=1)\n"
        "print(json.dumps({'errors': errors}))\n"
    )
    errors = _run(code)["errors"]
    assert len(errors) == 3
    assert errors[0].startswith("chatopenai= takes a langchain-openai ChatOpenAI")
    assert errors[1].startswith('bedrock= takes a boto3 client("bedrock-runtime")')
    assert errors[2].startswith("agno= takes an Agno Agent or Model")
