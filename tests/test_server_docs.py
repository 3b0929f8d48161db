"""The server's docs name what exists: every route has a curl example, every setting a row."""

from __future__ import annotations

import re
from typing import Any

from conftest import REPO
from stratamem.server import ServerSettings, create_app


def _operations(make_memory: Any) -> list[tuple[str, str]]:
    spec = create_app(make_memory(workers=0), ServerSettings()).openapi()
    return [(method.upper(), path) for path, ops in spec["paths"].items() for method in ops]


def test_every_route_has_a_curl_example(make_memory: Any) -> None:
    page = (REPO / "docs" / "server.md").read_text(encoding="utf-8")
    curl_lines = [line for line in page.splitlines() if "curl " in line]
    operations = _operations(make_memory)
    assert len(operations) >= 25
    missing = []
    for method, path in operations:
        # /api/sessions/{session_id}/messages matches $URL/api/sessions/s_0195c2/messages
        pattern = re.compile(
            r"\$URL" + re.sub(r"\\\{\w+\\\}", r"[^/\\s\"'?]+", re.escape(path)) + r"(?=[\s\"'?]|$)"
        )
        sent = [line for line in curl_lines if pattern.search(line)]
        if method == "GET":
            ok = any("-X" not in line for line in sent)
        else:
            ok = any(f"-X {method}" in line for line in sent)
        if not ok:
            missing.append(f"{method} {path}")
    assert not missing, missing


def test_every_server_setting_is_documented() -> None:
    page = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    for name in ServerSettings.model_fields:
        assert f"| `{name}` | `STRATAMEM_{name.upper()}` |" in page, name


def test_openapi_declares_a_response_model_for_every_operation(make_memory: Any) -> None:
    # The Python client is written against this document: every success response must
    # have a schema, every operation a summary.
    spec = create_app(make_memory(workers=0), ServerSettings()).openapi()
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            assert op.get("summary"), (method, path)
            ok = next(v for k, v in op["responses"].items() if k.startswith("2"))
            schema = ok["content"]["application/json"]["schema"]
            assert "$ref" in schema, (method, path, schema)
            if path.startswith(("/api", "/admin")):
                for status in ("401", "404", "413", "422"):
                    error = op["responses"][status]["content"]["application/json"]["schema"]
                    assert error == {"$ref": "#/components/schemas/ErrorEnvelope"}, (path, status)
