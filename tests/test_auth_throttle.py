"""Guessing credentials is slowed down (issue 39): a real ``stratamem serve`` on loopback,
hammered with wrong API keys (REST, MCP, the proxy), wrong admin tokens and wrong dashboard
sign-ins until it answers 429 with ``Retry-After``. While an address is held back even the
right credential is refused from it, never from another address (loopback has many:
127.0.0.2, ...), and it is accepted again once ``Retry-After`` has passed. Correct
credentials never count. ``X-Forwarded-For`` names the client only from a proxy the
settings trust.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from fakes.openai_server import FakeOpenAIServer
from server_proc import ServerProcess

pytestmark = pytest.mark.slow

ADMIN = "admin-" + secrets.token_hex(8)
BURST = 5
# One failure back per second: Retry-After is 1 s, so the tests wait about that long.
SETTINGS = {
    "STRATAMEM_ADMIN_TOKEN": ADMIN,
    "STRATAMEM_AUTH_FAILURES_BURST": str(BURST),
    "STRATAMEM_AUTH_FAILURES_PER_MINUTE": "60",
    # The proxy checks its key within the recall bound, else relays without memory and
    # checks later: a loaded test machine must not turn a wrong key into a relayed call.
    "STRATAMEM_CAPTURE_RECALL_TIMEOUT_MS": "5000",
}
CSRF_RE = re.compile(r'name="csrf" value="([^"]+)"')
WRONG_KEY = "sm_" + "x" * 40


class Served:
    def __init__(self, proc: ServerProcess) -> None:
        self.proc = proc
        self.url = proc.url
        self.key = proc.bootstrap_key()

    def client(self, address: str) -> httpx.Client:
        """A client whose connections come from ``address`` (any 127.x.y.z reaches the
        server on Linux's loopback)."""
        transport = httpx.HTTPTransport(local_address=address)
        return httpx.Client(base_url=self.url, transport=transport, timeout=30)


def _serve(workdir: Path, upstream: FakeOpenAIServer, **env: str) -> Served:
    env = {**SETTINGS, "STRATAMEM_PROXY_UPSTREAM": upstream.base_url, **env}
    return Served(ServerProcess(workdir, env=env).start())


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as server:
        server.chat_script = lambda body: "Noted."
        yield server


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, upstream: FakeOpenAIServer
) -> Iterator[Served]:
    srv = _serve(tmp_path_factory.mktemp("throttle"), upstream)
    try:
        yield srv
    finally:
        srv.proc.stop()


# -- one attempt of each kind of credential: (status when right, the answer) -------------------

Attempt = Callable[[httpx.Client, str], httpx.Response]


def _rest(c: httpx.Client, secret: str) -> httpx.Response:
    return c.get("/api/project", headers={"Authorization": f"Api-Key {secret}"})


def _admin(c: httpx.Client, secret: str) -> httpx.Response:
    return c.get("/admin/projects", headers={"Authorization": f"Bearer {secret}"})


def _mcp(c: httpx.Client, secret: str) -> httpx.Response:
    return c.post(
        "/mcp/users/u1",
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        headers={
            "Authorization": f"Api-Key {secret}",
            "Accept": "application/json, text/event-stream",
        },
    )


def _proxy(c: httpx.Client, secret: str) -> httpx.Response:
    return c.post(
        "/v1/chat/completions",
        json={"model": "gpt-fake", "messages": [{"role": "user", "content": "Hello?"}]},
        headers={
            "Authorization": "Bearer sk-caller",
            "X-Stratamem-Api-Key": secret,
            "X-Stratamem-User-Id": "u1",
        },
    )


def _sign_in(c: httpx.Client, secret: str) -> httpx.Response:
    c.cookies.clear()  # signed out: a signed-in browser is sent on from the form
    form = c.get("/ui/login")
    found = CSRF_RE.search(form.text)
    assert found, form.text[:300]
    return c.post("/ui/login", data={"key": secret, "csrf": found.group(1)})


# kind: (attempt, the right secret (None: the project key), status of a right attempt)
KINDS: dict[str, tuple[Attempt, str | None, int]] = {
    "rest": (_rest, None, 200),
    "admin": (_admin, ADMIN, 200),
    "mcp": (_mcp, None, 200),
    "proxy": (_proxy, None, 200),
    "sign-in": (_sign_in, None, 303),
}


def _hammer(attempt: Attempt, c: httpx.Client, wrong: str) -> httpx.Response:
    """Wrong credentials until the server answers 429; that answer."""
    for sent in range(1, 50):
        r = attempt(c, wrong)
        if r.status_code == 429:
            # The burst, and at most what came back meanwhile (one a second).
            assert BURST < sent <= BURST + 3, sent
            return r
        assert r.status_code in (401, 403), (sent, r.status_code, r.text[:200])
    raise AssertionError("never 429")


@pytest.mark.parametrize("kind", list(KINDS))
def test_wrong_credentials_are_slowed_down_per_address(served: Served, kind: str) -> None:
    attempt, right, ok = KINDS[kind]
    right = right or served.key
    host = 10 + list(KINDS).index(kind)  # each kind its own addresses
    with (
        served.client(f"127.0.0.{host}") as guesser,
        served.client(f"127.0.1.{host}") as other,
    ):
        # Correct credentials cost nothing, however many.
        for _ in range(3 * BURST):
            assert attempt(guesser, right).status_code == ok
        limited = _hammer(attempt, guesser, WRONG_KEY)
        wait = int(limited.headers["retry-after"])
        assert 1 <= wait <= 2, wait
        assert "too many failed" in limited.text.lower()
        # Held back: the right credential too, so a guesser cannot tell a hit.
        held = attempt(guesser, right)
        assert held.status_code == 429 and "retry-after" in held.headers
        # Another address is not: its right credential works, its wrong one is a plain 401.
        assert attempt(other, right).status_code == ok
        assert attempt(other, WRONG_KEY).status_code in (401, 403)
        # Once Retry-After has passed, the right credential is accepted again.
        time.sleep(wait + 0.1)
        assert attempt(guesser, right).status_code == ok


def test_other_kinds_of_credential_are_not_held_back(served: Served) -> None:
    """Failed admin tokens hold back admin tokens; the same address's API key still works."""
    with served.client("127.0.0.30") as c:
        _hammer(_admin, c, "wrong-admin-token")
        assert _admin(c, ADMIN).status_code == 429
        assert _rest(c, served.key).status_code == 200
        assert _mcp(c, served.key).status_code == 200


def test_x_forwarded_for_is_trusted_only_from_the_proxies_the_settings_name(
    served: Served, tmp_path: Path, upstream: FakeOpenAIServer
) -> None:
    # Not trusted by default: a new X-Forwarded-For on each attempt is the same address.
    with served.client("127.0.0.40") as c:
        limited = None
        for sent in range(1, 20):
            r = c.get(
                "/api/project",
                headers={
                    "Authorization": f"Api-Key {WRONG_KEY}",
                    "X-Forwarded-For": f"10.9.{sent}.1",
                },
            )
            if r.status_code == 429:
                limited = sent
                break
        assert limited is not None and limited <= BURST + 3
    # Trusted from 127.0.0.41: it names the client, and each client has its own allowance.
    behind = _serve(tmp_path, upstream, STRATAMEM_FORWARDED_ALLOW_IPS="127.0.0.41")
    try:
        with behind.client("127.0.0.41") as proxy, behind.client("127.0.0.42") as direct:

            def as_client(address: str) -> Attempt:
                def attempt(c: httpx.Client, secret: str) -> httpx.Response:
                    return c.get(
                        "/api/project",
                        headers={"Authorization": f"Api-Key {secret}", "X-Forwarded-For": address},
                    )

                return attempt

            _hammer(as_client("10.0.0.1"), proxy, WRONG_KEY)
            assert as_client("10.0.0.1")(proxy, behind.key).status_code == 429
            assert as_client("10.0.0.2")(proxy, behind.key).status_code == 200
            # From an address the settings do not name, the header is ignored.
            _hammer(as_client("10.0.0.3"), direct, WRONG_KEY)
            assert as_client("10.0.0.4")(direct, behind.key).status_code == 429
    finally:
        behind.proc.stop()


def test_the_limiter_remembers_a_bounded_number_of_addresses() -> None:
    """Memory stays bounded however many addresses fail: past ``max_addresses`` the least
    recently failing one is forgotten (and starts afresh)."""
    from stratamem.server._throttle import Throttle

    now = [0.0]
    throttle = Throttle(burst=2, per_minute=60, max_addresses=100, clock=lambda: now[0])
    for _ in range(2):
        throttle.failed("api_key", "10.0.0.1")
    assert throttle.wait_seconds("api_key", "10.0.0.1") == 1
    assert throttle.wait_seconds("admin_token", "10.0.0.1") == 0  # another kind
    now[0] = 0.5  # half a failure back: still a second to wait, rounded up
    assert throttle.wait_seconds("api_key", "10.0.0.1") == 1
    for i in range(100):
        throttle.failed("api_key", f"10.1.{i // 250}.{i % 250}")
    assert throttle.wait_seconds("api_key", "10.0.0.1") == 0  # forgotten: 100 came after
    assert throttle.wait_seconds("api_key", "10.1.0.99") == 0  # one failure of two
