"""Property-based run of Schemathesis against the server's own /openapi.json: no 5xx, ever.

Every operation gets generated valid (positive) and invalid (negative) requests, sent with a
valid key (the admin token on /admin), to a real `stratamem serve` process. Each answer must
be a non-5xx envelope with a request id, with a declared status and a body matching the
schema declared for it. Bounded so it fits in the suite: a fixed number of examples per
operation and mode, no shrinking.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import (
    Failure,
    FailureGroup,
    response_schema_conformance,
    status_code_conformance,
)

from server_proc import ServerProcess

pytestmark = pytest.mark.slow

ADMIN = "admin-" + secrets.token_hex(8)
EXAMPLES = 15


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, module_db_url: str) -> Iterator[ServerProcess]:
    proc = ServerProcess(
        tmp_path_factory.mktemp("fuzz"), db_url=module_db_url, env={"STRATAMEM_ADMIN_TOKEN": ADMIN}
    ).start()
    try:
        yield proc
    finally:
        proc.stop()


class Run:
    def __init__(self) -> None:
        self.failures: list[str] = []
        self.statuses: dict[str, set[int]] = {}
        self.sent = 0

    def fuzz(self, operation: Any, mode: GenerationMode, auth: str) -> None:
        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,  # no .hypothesis directory in the checkout
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        def check(case: Any) -> None:
            response = case.call(headers={"Authorization": auth}, timeout=60)
            self.sent += 1
            self.statuses.setdefault(operation.label, set()).add(response.status_code)
            body = response.json() if response.content else None
            if response.status_code >= 500 or not isinstance(body, dict):
                self.failures.append(f"{response.status_code} {case.as_curl_command()}")
                return
            # Every answer, generated nonsense included, is an envelope with a request id.
            if body.get("success") is not (response.status_code < 400):
                self.failures.append(f"no envelope: {case.as_curl_command()} -> {body}")
            if "x-request-id" not in response.headers:
                self.failures.append(f"no request id: {case.as_curl_command()}")
            # The body matches the schema declared for its status, which is declared.
            try:
                case.validate_response(
                    response,
                    checks=[response_schema_conformance, status_code_conformance],
                )
            except (AssertionError, Failure, FailureGroup) as exc:
                self.failures.append(f"{case.as_curl_command()} -> {str(exc)[:600]}")

        try:
            check()
        except Unsatisfiable:
            # Nothing to make invalid (e.g. /healthz has no parameters): negative mode only.
            assert mode is GenerationMode.NEGATIVE, operation.label


def _server_errors(server: ServerProcess) -> str:
    # A 5xx is logged with its traceback; quote those records so an intermittent failure
    # can be diagnosed from the test report alone.
    lines = server.stderr().splitlines()
    keep = [i for i, line in enumerate(lines) if "failed" in line or "Traceback" in line]
    return "\n".join("\n".join(lines[i : i + 40]) for i in keep[:3])


def test_schemathesis_finds_no_server_error(server: ServerProcess) -> None:
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    key = server.bootstrap_key()
    operations = [result.ok() for result in schema.get_all_operations()]
    run = Run()
    for operation in operations:
        admin = operation.path.startswith("/admin")
        for mode in GenerationMode:
            run.fuzz(operation, mode, f"Bearer {ADMIN}" if admin else f"Api-Key {key}")

    assert not run.failures, "\n".join(run.failures[:20]) + "\n" + _server_errors(server)
    assert len(operations) >= 24 and set(run.statuses) == {op.label for op in operations}
    assert run.sent >= len(operations) * 2 * 5
