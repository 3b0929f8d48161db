"""/api/webhooks over HTTP, against a real `stratamem serve` process on 127.0.0.1.

The server's pipeline calls real receivers on 127.0.0.1 (allowed through the server's own
STRATAMEM_WEBHOOK_ALLOW); signatures are checked with the ``standardwebhooks`` package.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import standardwebhooks

from fakes.webhook_receiver import WebhookReceiver
from server_proc import ServerProcess, client

pytestmark = pytest.mark.slow

ADMIN = "admin-" + secrets.token_hex(8)


class Srv:
    def __init__(self, proc: ServerProcess) -> None:
        self.proc = proc
        self.url = proc.url
        self.key = proc.bootstrap_key()

    def api(self, key: str | None = None) -> httpx.Client:
        return client(self.url, key or self.key)

    def new_project(self, project_id: str) -> str:
        with httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=60
        ) as admin:
            admin.post("/admin/projects", json={"name": project_id, "project_id": project_id})
            r = admin.post(f"/admin/projects/{project_id}/keys", json={"name": "tests"})
            assert r.status_code == 201, r.text
            return str(r.json()["data"]["secret"])


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory, module_db_url: str) -> Iterator[Srv]:
    proc = ServerProcess(
        tmp_path_factory.mktemp("server-webhooks"),
        db_url=module_db_url,
        env={
            "STRATAMEM_ADMIN_TOKEN": ADMIN,
            "STRATAMEM_WEBHOOK_ALLOW": "127.0.0.1",
            "STRATAMEM_WEBHOOK_BACKOFF_SECONDS": "0.01",
            "STRATAMEM_WEBHOOK_MAX_ATTEMPTS": "2",
        },
    ).start()
    try:
        yield Srv(proc)
    finally:
        proc.stop()


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as r:
        yield r


def _data(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["success"] is True and body["error"] is None
    return body["data"]


def _problems(response: httpx.Response) -> list[str]:
    assert response.status_code == 422, response.text
    return [p["field"] for p in response.json()["error"]["problems"]]


def _add(api: httpx.Client, user: str, text: str) -> None:
    sid = _data(api.post("/api/sessions", json={"user_id": user}))["session_id"]
    messages = [{"role": "user", "content": text}]
    _data(api.post(f"/api/sessions/{sid}/messages", json={"messages": messages, "sync": True}))


def test_manage_webhooks_over_http(srv: Srv, receiver: WebhookReceiver) -> None:
    with srv.api() as api:
        r = api.post(
            "/api/webhooks",
            json={
                "resource": "summary",
                "event": "after_llm",
                "target_url": receiver.url("/a"),
                "mode": "async",
                "name": "audit",
            },
        )
        created = _data(r, 201)
        hook, secret = created["webhook"], created["secret"]
        assert secret.startswith("whsec_") and "secret" not in hook
        assert (hook["name"], hook["mode"], hook["enabled"], hook["timeout_ms"]) == (
            "audit",
            "async",
            True,
            5000,
        )
        hid = hook["id"]

        listed = api.get("/api/webhooks")
        assert hid in [h["id"] for h in _data(listed)["items"]]
        got = api.get(f"/api/webhooks/{hid}")
        assert _data(got) == hook
        for response in (listed, got):
            assert (
                secret.removeprefix("whsec_") not in response.text and "secret" not in response.text
            )

        changed = _data(api.patch(f"/api/webhooks/{hid}", json={"enabled": False, "name": "x"}))
        assert (changed["enabled"], changed["name"], changed["mode"]) == (False, "x", "async")
        assert _data(api.patch(f"/api/webhooks/{hid}", json={})) == changed

        rotated = _data(api.post(f"/api/webhooks/{hid}/rotate-secret"))
        assert rotated["secret"] != secret and rotated["webhook"]["id"] == hid

        page = _data(api.get(f"/api/webhooks/{hid}/deliveries"))
        assert page == {"items": [], "limit": 100, "offset": 0, "next_offset": None}

        gone = _data(api.delete(f"/api/webhooks/{hid}"))
        assert gone["id"] == hid
        for method, path in (
            ("GET", f"/api/webhooks/{hid}"),
            ("PATCH", f"/api/webhooks/{hid}"),
            ("DELETE", f"/api/webhooks/{hid}"),
            ("POST", f"/api/webhooks/{hid}/rotate-secret"),
            ("GET", f"/api/webhooks/{hid}/deliveries"),
        ):
            r = api.request(method, path, json={} if method == "PATCH" else None)
            assert r.status_code == 404, (method, path, r.text)
            assert r.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"resource": "topic", "event": "before_llm"}, "event"),
        ({"resource": "message"}, "resource"),
        ({"mode": "later"}, "mode"),
        ({"target_url": "http://10.0.0.1/x"}, "target_url"),
        ({"target_url": "http://169.254.169.254/latest/meta-data/"}, "target_url"),
        ({"target_url": "http://[::1]/x"}, "target_url"),
        ({"target_url": "gopher://example.com/"}, "target_url"),
        ({"timeout_ms": 50}, "timeout_ms"),
        ({"timeout_ms": 30_001}, "timeout_ms"),
        ({"secret": "whsec_mine"}, "secret"),
    ],
)
def test_invalid_webhooks_are_422(srv: Srv, body: dict[str, Any], field: str) -> None:
    request = {
        "resource": "fact",
        "event": "before_add",
        "target_url": "https://hooks.example.com/x",
        **body,
    }
    with srv.api() as api:
        assert field in _problems(api.post("/api/webhooks", json=request))


def test_patch_validates_the_resulting_hook(srv: Srv) -> None:
    with srv.api() as api:
        created = api.post(
            "/api/webhooks",
            json={"resource": "topic", "event": "before_add", "target_url": "https://h.example/t"},
        )
        hid = _data(created, 201)["webhook"]["id"]
        assert "event" in _problems(api.patch(f"/api/webhooks/{hid}", json={"event": "after_llm"}))
        assert "target_url" in _problems(
            api.patch(f"/api/webhooks/{hid}", json={"target_url": "http://10.0.0.1:9/x"})
        )
        assert _data(api.get(f"/api/webhooks/{hid}"))["event"] == "before_add"
        api.delete(f"/api/webhooks/{hid}")


def test_the_servers_pipeline_calls_webhooks(srv: Srv, receiver: WebhookReceiver) -> None:
    def redact(payload: dict[str, Any]) -> tuple[int, Any]:
        items = payload["data"]["observations"]
        for o in items:
            o["text"] = o["text"].replace("4111 1111 1111 1111", "[card]")
        return 200, {"data": {"observations": items}}

    receiver.script("/redact", redact)
    key = srv.new_project("hooks-e2e")
    with srv.api(key) as api:
        r = api.post(
            "/api/webhooks",
            json={
                "resource": "fact",
                "event": "before_add",
                "target_url": receiver.url("/redact"),
            },
        )
        created = _data(r, 201)
        hid, secret = created["webhook"]["id"], created["secret"]
        failing = _data(
            api.post(
                "/api/webhooks",
                json={
                    "resource": "topic",
                    "event": "before_add",
                    "target_url": receiver.url("/status/500"),
                    "mode": "async",
                },
            ),
            201,
        )["webhook"]["id"]
        _add(api, "dana", "My card number is 4111 1111 1111 1111 and I live in Lisbon.")

        (request,) = receiver.at("/redact")
        payload = standardwebhooks.Webhook(secret).verify(request.body, request.headers)
        assert payload["project_id"] == "hooks-e2e" and payload["context"]["user_id"] == "dana"
        facts = _data(api.get("/api/users/dana/facts"))["items"]
        assert facts and all("4111" not in f["text"] for f in facts)
        assert any("[card]" in f["text"] for f in facts)

        log = _data(api.get(f"/api/webhooks/{hid}/deliveries"))["items"]
        assert [(d["status"], d["http_status"], d["attempt"]) for d in log] == [
            ("delivered", 200, 1)
        ]
        assert log[0]["latency_ms"] > 0 and log[0]["request"].startswith('{"version":1,')

        # The async hook is retried by the server's background sender, then given up.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            attempts = _data(api.get(f"/api/webhooks/{failing}/deliveries"))["items"]
            if attempts and attempts[0]["status"] == "failed":
                break
            time.sleep(0.05)
        assert [(d["attempt"], d["status"]) for d in attempts] == [(2, "failed"), (1, "retrying")]
        assert len(receiver.at("/status/500")) == 2

        new_secret = _data(api.post(f"/api/webhooks/{hid}/rotate-secret"))["secret"]
        _add(api, "dana", "I moved to Porto.")
        second = receiver.at("/redact")[1]
        standardwebhooks.Webhook(new_secret).verify(second.body, second.headers)
        with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):
            standardwebhooks.Webhook(secret).verify(second.body, second.headers)

        # A rotation with a grace period: deliveries verify with either secret meanwhile.
        bad = api.post(f"/api/webhooks/{hid}/rotate-secret", json={"grace_seconds": 8 * 86_400})
        assert bad.status_code == 422 and "grace_seconds" in bad.text
        graced = _data(api.post(f"/api/webhooks/{hid}/rotate-secret", json={"grace_seconds": 600}))
        assert graced["webhook"]["rotation_grace_until"] is not None
        _add(api, "dana", "I moved to Lisbon.")
        third = receiver.at("/redact")[2]
        for key in (new_secret, graced["secret"]):
            standardwebhooks.Webhook(key).verify(third.body, third.headers)
        new_secret = graced["secret"]

    logs = srv.proc.stdout() + srv.proc.stderr()
    assert "webhook" in logs  # the failed async attempts were logged ...
    for value in (secret, new_secret):
        assert value.removeprefix("whsec_") not in logs  # ... never a secret


def test_webhooks_are_project_scoped(srv: Srv) -> None:
    mine = srv.new_project("hooks-mine")
    theirs = srv.new_project("hooks-theirs")
    with srv.api(mine) as api:
        hid = _data(
            api.post(
                "/api/webhooks",
                json={"resource": "fact", "event": "before_llm", "target_url": "https://a.example"},
            ),
            201,
        )["webhook"]["id"]
    with srv.api(theirs) as other:
        assert _data(other.get("/api/webhooks"))["items"] == []
        assert other.get(f"/api/webhooks/{hid}").status_code == 404
        assert other.patch(f"/api/webhooks/{hid}", json={"enabled": False}).status_code == 404
        assert other.post(f"/api/webhooks/{hid}/rotate-secret").status_code == 404
        assert other.get(f"/api/webhooks/{hid}/deliveries").status_code == 404
        assert other.delete(f"/api/webhooks/{hid}").status_code == 404
    with srv.api(mine) as api:
        assert _data(api.get(f"/api/webhooks/{hid}"))["enabled"] is True
    with httpx.Client(base_url=srv.url, timeout=30) as anonymous:
        assert anonymous.get("/api/webhooks").status_code == 401


def test_python_clients_manage_webhooks(srv: Srv, receiver: WebhookReceiver) -> None:
    from stratamem.client import AsyncMemoryClient, MemoryClient, NotFoundError, ValidationError

    key = srv.new_project("client-hooks")
    with MemoryClient(api_key=key, base_url=srv.url) as c:
        hook, secret = c.webhooks.create(
            resource="fact", event="before_add", target_url=receiver.url("/client"), mode="async"
        )
        assert secret.startswith("whsec_") and hook.mode == "async"
        assert [h.id for h in c.webhooks.list()] == [hook.id]
        assert c.webhooks.disable(hook.id).enabled is False
        assert c.webhooks.update(hook.id, name="audit", enabled=True).name == "audit"
        new_secret = c.webhooks.rotate_secret(hook.id, grace_seconds=60)
        assert new_secret.startswith("whsec_") and new_secret != secret
        assert c.webhooks.get(hook.id).rotation_grace_until is not None

        s = c.sessions.create(user_id="hooked")
        s.add_messages([{"role": "user", "content": "I moved to Porto."}], sync=True)
        deadline = time.monotonic() + 30
        while not (log := c.webhooks.deliveries(hook.id)):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert log[0].status in ("delivered", "retrying", "failed")
        # The receiver verifies with the rotated secret, as the server signed with it.
        sent = next(r for r in receiver.requests if r.path == "/client")
        standardwebhooks.Webhook(new_secret).verify(sent.body, sent.headers)

        with pytest.raises(ValidationError):
            c.webhooks.create(resource="topic", event="after_llm", target_url=receiver.url("/x"))
        c.webhooks.delete(hook.id)
        with pytest.raises(NotFoundError):
            c.webhooks.get(hook.id)

    async def run() -> None:
        async with AsyncMemoryClient(api_key=key, base_url=srv.url) as ac:
            made, _ = await ac.webhooks.create(
                resource="summary", event="before_add", target_url=receiver.url("/async")
            )
            assert (await ac.webhooks.get(made.id)).event == "before_add"
            await ac.webhooks.delete(made.id)
            assert await ac.webhooks.list() == []

    import asyncio

    asyncio.run(run())
