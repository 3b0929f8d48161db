"""The REST server over HTTP, against a real `stratamem serve` process on 127.0.0.1.

Every route, authentication and the admin API, limits and errors, the structured access log,
and a cross-project matrix in which one project's key meets another project's ids.
"""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from hostile import ESCAPED, HOSTILE, assert_one_safe_block
from server_proc import ServerProcess, client
from stratamem import Memory
from stratamem._queries import MAX_EXCLUDE_TEXTS
from stratamem.recall._format import MEMORY_CLOSE, MEMORY_HEADER, MEMORY_OPEN

pytestmark = pytest.mark.slow

ADMIN = "admin-" + secrets.token_hex(8)
MAX_BODY = 65_536
MAX_CONTENT = 4_000

# Every response body seen by the tests, to check at the end that none carries a traceback.
BODIES: list[str] = []


def _record(response: httpx.Response) -> None:
    response.read()
    BODIES.append(response.text)


class Srv:
    def __init__(self, proc: ServerProcess) -> None:
        self.proc = proc
        self.url = proc.url
        self.key = proc.bootstrap_key()

    def api(self, key: str | None = None, **kwargs: Any) -> httpx.Client:
        c = client(self.url, key or self.key, **kwargs)
        c.event_hooks["response"].append(_record)
        return c

    def admin(self) -> httpx.Client:
        c = httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=60
        )
        c.event_hooks["response"].append(_record)
        return c

    def new_project(self, project_id: str) -> str:
        """A project and a key for it (through the admin API); returns the key."""
        with self.admin() as a:
            assert a.post("/admin/projects", json={"name": project_id, "project_id": project_id})
            r = a.post(f"/admin/projects/{project_id}/keys", json={"name": "tests"})
            assert r.status_code == 201, r.text
            return str(r.json()["data"]["secret"])


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory, module_db_url: str) -> Iterator[Srv]:
    proc = ServerProcess(
        tmp_path_factory.mktemp("server"),
        db_url=module_db_url,
        env={
            "STRATAMEM_ADMIN_TOKEN": ADMIN,
            "STRATAMEM_MAX_BODY_BYTES": str(MAX_BODY),
            "STRATAMEM_MAX_CONTENT_CHARS": str(MAX_CONTENT),
        },
    ).start()
    try:
        yield Srv(proc)
    finally:
        proc.stop()


def ok(r: httpx.Response, status: int = 200) -> Any:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["success"] is True and body["error"] is None, body
    return body["data"]


def err(r: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["success"] is False and body["data"] is None, body
    e = body["error"]
    assert e["request_id"] == r.headers["x-request-id"]
    assert body["message"] == e["detail"]
    if code is not None:
        assert e["code"] == code, e
    return dict(e)


def fields(e: dict[str, Any]) -> set[str]:
    return {p["field"] for p in e["problems"]}


def wait_done(c: httpx.Client, session_id: str, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        status = ok(c.get(f"/api/sessions/{session_id}/status"))
        if status["done"]:
            return dict(status)
        assert time.monotonic() < deadline, status
        time.sleep(0.1)


def session(c: httpx.Client, user_id: str, session_id: str | None = None) -> str:
    body: dict[str, Any] = {"user_id": user_id}
    if session_id is not None:
        body["session_id"] = session_id
    return str(ok(c.post("/api/sessions", json=body))["session_id"])


# -- health, request ids, access log ------------------------------------------------------


def test_healthz_needs_no_key_and_every_response_has_a_request_id(srv: Srv) -> None:
    r = httpx.get(f"{srv.url}/healthz")
    assert ok(r)["status"] == "ok"
    assert re.fullmatch(r"[0-9a-f]{32}", r.headers["x-request-id"])

    r = httpx.get(f"{srv.url}/healthz", headers={"X-Request-ID": "trace-42.a:b"})
    assert r.headers["x-request-id"] == "trace-42.a:b"
    # An id that could forge log lines or carry data is replaced, not echoed.
    r = httpx.get(f"{srv.url}/healthz", headers={"X-Request-ID": 'x" "y' + "z" * 200})
    assert re.fullmatch(r"[0-9a-f]{32}", r.headers["x-request-id"])


def test_access_log_is_one_json_line_per_request(srv: Srv) -> None:
    with srv.api() as c:
        sid = session(c, "log-user", "log-session-secret-id")
        r = c.get(f"/api/sessions/{sid}", headers={"X-Request-ID": "log-probe-1"})
        ok(r)
        err(c.get("/api/sessions/nope", headers={"X-Request-ID": "log-probe-2"}), 404)
    deadline = time.monotonic() + 10
    lines: dict[str, dict[str, Any]] = {}
    while time.monotonic() < deadline and len(lines) < 2:
        for line in srv.proc.stderr().splitlines():
            if line.startswith("{") and "log-probe-" in line:
                rec = json.loads(line)
                lines[rec["request_id"]] = rec
        time.sleep(0.1)
    first, second = lines["log-probe-1"], lines["log-probe-2"]
    assert first["method"] == "GET"
    assert first["path"] == "/api/sessions/{session_id}"  # the template: no ids in the log
    assert first["status"] == 200 and second["status"] == 404
    assert first["project_id"] == "default"
    assert isinstance(first["duration_ms"], float) and first["duration_ms"] >= 0
    assert "log-session-secret-id" not in srv.proc.stderr()


def test_serve_prints_the_url_and_a_bootstrap_key_only_on_first_start(tmp_path: Path) -> None:
    first = ServerProcess(tmp_path).start()
    try:
        out = first.stdout()
        assert f"http://127.0.0.1:{first.port}" in out
        key = first.bootstrap_key()
        assert "shown once" in out
        with client(first.url, key) as c:
            ok(c.get("/api/sessions"))
    finally:
        first.stop()
    # Only a hash is stored: the key is nowhere in the database file.
    assert key.encode() not in (tmp_path / "m.db").read_bytes()

    again = ServerProcess(tmp_path).start()
    try:
        assert "sm_" not in again.stdout()
        with client(again.url, key) as c:
            ok(c.get("/api/sessions"))  # the first key still works
    finally:
        again.stop()


def test_no_worker_serves_the_api_and_leaves_messages_queued(tmp_path: Path) -> None:
    proc = ServerProcess(tmp_path).start("--no-worker")
    try:
        with client(proc.url, proc.bootstrap_key()) as c:
            sid = session(c, "queued-user")
            ok(c.post(f"/api/sessions/{sid}/messages", json={"messages": [_msg("hello")]}))
            time.sleep(1.0)
            status = ok(c.get(f"/api/sessions/{sid}/status"))
            assert status["pending"] == 1 and status["done"] is False
    finally:
        proc.stop()


# -- authentication and the admin API -----------------------------------------------------


def test_project_route_names_the_keys_project(srv: Srv) -> None:
    key = srv.new_project("whoami")
    with srv.api(key) as c:
        me = ok(c.get("/api/project"))
    assert me["project_id"] == "whoami" and me["name"] == "whoami"
    assert key.startswith(me["key"]["prefix"]) and me["key"]["name"] == "tests"
    assert key not in json.dumps(me)
    with srv.api("sm_not-a-key") as c:
        err(c.get("/api/project"), 401)


def test_keys_are_required_and_both_header_forms_work(srv: Srv) -> None:
    url = f"{srv.url}/api/sessions"
    e = err(httpx.get(url), 401, "unauthorized")
    assert "Authorization" in e["detail"]
    assert httpx.get(url).headers["www-authenticate"].startswith("Api-Key")
    for header in (
        f"Basic {srv.key}",
        f"Api-Key {srv.key}x",
        "Api-Key sm_notakeyatallnotakeyatall",
        f"Api-Key  {srv.key} extra",
        "Bearer",
    ):
        err(httpx.get(url, headers={"Authorization": header}), 401, "unauthorized")
    for header in (f"Api-Key {srv.key}", f"Bearer {srv.key}", f"api-key {srv.key}"):
        ok(httpx.get(url, headers={"Authorization": header}))


def test_revoked_keys_are_refused_like_unknown_ones(srv: Srv) -> None:
    with srv.admin() as a:
        created = ok(a.post("/admin/projects/default/keys", json={"name": "short-lived"}), 201)
    secret, key_id = created["secret"], created["key"]["id"]
    assert secret.startswith("sm_") and created["key"]["prefix"] == secret[:9]
    with srv.api(secret) as c:
        ok(c.get("/api/sessions"))
    with srv.admin() as a:
        revoked = ok(a.delete(f"/admin/keys/{key_id}"))
        assert revoked["revoked_at"] is not None
    with srv.api(secret) as c:
        refused = err(c.get("/api/sessions"), 401, "unauthorized")
    with srv.api("sm_" + "x" * 43) as c:
        unknown = err(c.get("/api/sessions"), 401, "unauthorized")
    assert {**refused, "request_id": None} == {**unknown, "request_id": None}


def test_admin_api(srv: Srv) -> None:
    err(httpx.get(f"{srv.url}/admin/projects"), 401)
    err(
        httpx.get(f"{srv.url}/admin/projects", headers={"Authorization": f"Bearer {ADMIN}x"}),
        401,
    )
    with srv.admin() as a:
        p = ok(a.post("/admin/projects", json={"name": "Admin test", "project_id": "adm-p"}), 201)
        assert p == {"id": "adm-p", "name": "Admin test", "created_at": p["created_at"]}
        assert "adm-p" in {x["id"] for x in ok(a.get("/admin/projects"))}
        assert ok(a.get("/admin/projects/adm-p"))["name"] == "Admin test"
        err(a.get("/admin/projects/no-such-project"), 404, "not_found")
        generated = ok(a.post("/admin/projects", json={"name": "generated id"}), 201)
        assert generated["id"] != "generated id"

        made = ok(a.post("/admin/projects/adm-p/keys", json={"name": "ci"}), 201)
        listed = a.get("/admin/projects/adm-p/keys")
        keys = ok(listed)
        assert [k["id"] for k in keys] == [made["key"]["id"]]
        assert made["secret"] not in listed.text and "secret" not in keys[0]
        err(a.get("/admin/projects/no-such-project/keys"), 404, "not_found")
        err(a.post("/admin/projects/no-such-project/keys", json={}), 404, "not_found")
        err(a.delete("/admin/keys/key_nonexistent"), 404, "not_found")
        e = err(a.post("/admin/projects", json={"project_id": "x"}), 422, "validation_error")
        assert fields(e) == {"name"}
        # Ids may hold "/": such a project is reached like any other, escaped or not.
        ok(a.post("/admin/projects", json={"name": "team a", "project_id": "team/a"}), 201)
        for path in ("team/a", "team%2Fa"):
            assert ok(a.get(f"/admin/projects/{path}"))["id"] == "team/a"
        slash_key = ok(a.post("/admin/projects/team%2Fa/keys", json={"name": "k"}), 201)
        assert [k["id"] for k in ok(a.get("/admin/projects/team/a/keys"))] == [
            slash_key["key"]["id"]
        ]
    # The new project's key acts in that project only.
    with srv.api(made["secret"]) as c:
        assert ok(c.post("/api/sessions", json={"user_id": "u"}))["project_id"] == "adm-p"


def test_admin_api_is_off_without_a_token(make_memory: Any) -> None:
    from fastapi.testclient import TestClient

    from stratamem.server import ServerSettings, create_app

    app = create_app(make_memory(), ServerSettings(admin_token=None))
    with TestClient(app) as tc:
        e = err(tc.get("/admin/projects", headers={"Authorization": "Bearer anything"}), 403)
        assert "STRATAMEM_ADMIN_TOKEN" in e["detail"]


def test_an_unexpected_error_is_a_500_with_a_request_id_and_nothing_else(
    make_memory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from fastapi.testclient import TestClient

    from stratamem.server import ServerSettings, create_app

    mem: Memory = make_memory()

    def explode(secret: str) -> None:
        raise RuntimeError("boom at /srv/secret/path.py line 3")

    mem.keys.verify = explode  # type: ignore[method-assign]
    app = create_app(mem, ServerSettings())
    with TestClient(app, raise_server_exceptions=False) as tc:
        r = tc.get("/api/sessions", headers={"Authorization": "Api-Key sm_x"})
    e = err(r, 500, "internal_error")
    assert e["request_id"] in e["detail"]
    for leak in ("boom", "secret", "Traceback", "RuntimeError", ".py"):
        assert leak not in r.text
    assert any("boom" in (rec.exc_text or "") or rec.exc_info for rec in caplog.records)


def test_the_server_package_imports_without_fastapi() -> None:
    # `stratamem.server` is importable (settings, create_app) before FastAPI is needed.
    code = (
        "import sys, stratamem, stratamem.server\n"
        "print(sorted(m for m in ('fastapi', 'starlette', 'uvicorn') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- sessions, messages, context ----------------------------------------------------------


def _msg(content: str, **extra: Any) -> dict[str, Any]:
    return {"role": "user", "content": content, **extra}


def test_sessions(srv: Srv) -> None:
    with srv.api() as c:
        created = ok(c.post("/api/sessions", json={"user_id": "s-user", "title": "t"}))
        sid = created["session_id"]
        assert created["id"] == sid and created["user_id"] == "s-user"
        assert created["title"] == "t" and created["project_id"] == "default"
        assert ok(c.get(f"/api/sessions/{sid}")) == created

        chosen = {"user_id": "s-user", "session_id": "team/a:1@x", "metadata": {"k": 1}}
        first = ok(c.post("/api/sessions", json=chosen))
        assert first["session_id"] == "team/a:1@x" and first["metadata"] == {"k": 1}
        assert ok(c.post("/api/sessions", json=chosen)) == first  # same user: returned as is
        e = err(
            c.post("/api/sessions", json={**chosen, "user_id": "someone-else"}), 409, "conflict"
        )
        assert "another user" in e["detail"]
        # An id with "/" reaches every session route.
        ok(c.post("/api/sessions/team/a:1@x/messages", json={"messages": [_msg("hi there")]}))
        assert ok(c.get("/api/sessions/team/a:1@x"))["session_id"] == "team/a:1@x"
        assert ok(c.get("/api/sessions/team/a:1@x/context"))["session_id"] == "team/a:1@x"

        listed = ok(c.get("/api/sessions", params={"user_id": "s-user", "limit": 1}))
        assert [s["session_id"] for s in listed["items"]] == [sid]
        assert listed["next_offset"] == 1
        listed = ok(c.get("/api/sessions", params={"user_id": "s-user", "offset": 1}))
        assert [s["session_id"] for s in listed["items"]] == ["team/a:1@x"]
        assert listed["next_offset"] is None

        err(c.get("/api/sessions/missing-session"), 404, "not_found")
        e = err(c.post("/api/sessions", json={"title": "no user"}), 422, "validation_error")
        assert fields(e) == {"user_id"}
        e = err(c.post("/api/sessions", json={"user_id": "has space"}), 422)
        assert fields(e) == {"user_id"} and "letters, digits" in e["problems"][0]["message"]
        e = err(c.post("/api/sessions", json={"user_id": "u", "colour": "red"}), 422)
        assert e["problems"] == [{"field": "colour", "message": "unknown field"}]


def test_messages_are_stored_then_processed(srv: Srv) -> None:
    with srv.api() as c:
        sid = session(c, "m-user")
        msgs = [
            _msg("I moved to Berlin last week", id="m-user-1", timestamp="2026-04-24T10:30:00Z"),
            {"role": "assistant", "content": "Noted, Berlin it is.", "id": "m-user-2"},
        ]
        added = ok(c.post(f"/api/sessions/{sid}/messages", json={"messages": msgs}))
        assert added["message_ids"] == ["m-user-1", "m-user-2"]
        assert added["processed"] is False and added["session_id"] == sid
        status = wait_done(c, sid)
        assert status["processed"] == 2 and status["pending"] == 0 and status["failed"] == 0
        assert {m["id"]: m["status"] for m in status["messages"]} == {
            "m-user-1": "processed",
            "m-user-2": "processed",
        }

        again = ok(c.post(f"/api/sessions/{sid}/messages", json={"messages": msgs}))
        assert again["duplicates"] == ["m-user-1", "m-user-2"]
        changed = [{**msgs[0], "content": "I moved to Paris"}]
        err(c.post(f"/api/sessions/{sid}/messages", json={"messages": changed}), 409, "conflict")
        e = err(
            c.post(
                f"/api/sessions/{sid}/messages",
                json={"messages": [_msg("x")], "user_id": "someone-else"},
            ),
            409,
        )
        assert "another user" in e["detail"]
        # GUMem's SDK sends the session's user along: accepted when it matches.
        ok(
            c.post(
                f"/api/sessions/{sid}/messages", json={"messages": [_msg("y")], "user_id": "m-user"}
            )
        )

        synced = ok(
            c.post(
                f"/api/sessions/{sid}/messages",
                json={"messages": [_msg("My sister lives in Lisbon")], "sync": True},
            )
        )
        assert synced["processed"] is True

        page = ok(c.get(f"/api/sessions/{sid}/messages", params={"status": "processed"}))
        assert "m-user-1" in [m["id"] for m in page["items"]]
        one = ok(c.get("/api/messages/m-user-1"))
        assert one["content"] == "I moved to Berlin last week"
        assert one["timestamp"].startswith("2026-04-24T10:30:00")
        err(c.get("/api/messages/no-such-message"), 404)
        err(c.get("/api/sessions/missing/messages"), 404)
        err(c.get("/api/sessions/missing/status"), 404)

        bad = [_msg("ok"), {"role": "bot", "content": "x"}, {"role": "user", "content": "", "x": 1}]
        e = err(c.post(f"/api/sessions/{sid}/messages", json={"messages": bad}), 422)
        assert {"messages[1].role", "messages[2].content", "messages[2].x"} <= fields(e)
        e = err(c.post(f"/api/sessions/{sid}/messages", json={"messages": []}), 422)
        assert fields(e) == {"messages"}
        err(c.post("/api/sessions/missing/messages", json={"messages": [_msg("x")]}), 404)
        # With the user named, a new session id is created on the way in.
        added = ok(
            c.post(
                "/api/sessions/new-thread/messages",
                json={"user_id": "m-user", "messages": [_msg("z")], "sync": True},
            )
        )
        assert added["processed"] is True
        assert ok(c.get("/api/sessions/new-thread"))["user_id"] == "m-user"


def test_context_formatted_context_is_framed_and_escaped(srv: Srv) -> None:
    """The REST block comes from the same formatter as the injected one: stored text cannot
    close it, forge a line, a quote's label or a heading, or carry control tokens."""
    with srv.api() as c:
        notes = session(c, "hostile-user")
        said = [_msg(t) for t in HOSTILE[:4]]
        ok(c.post(f"/api/sessions/{notes}/messages", json={"messages": said, "sync": True}))
        sid = session(c, "hostile-user")
        ctx = ok(c.get(f"/api/sessions/{sid}/context", params={"query": "peanuts"}))
    text = ctx["formatted_context"]
    assert text.startswith(f"{MEMORY_OPEN}\n{MEMORY_HEADER}\n") and text.endswith(MEMORY_CLOSE)
    assert_one_safe_block(text, ESCAPED[:4])


def test_context_get_and_post(srv: Srv) -> None:
    with srv.api() as c:
        sid = session(c, "ctx-user")
        msgs = [
            _msg("I love sailing on the lake", metadata={"channel": "web"}),
            _msg("I love skiing in the Alps", metadata={"channel": "app"}),
            _msg("My favourite book is Dune"),
        ]
        ok(c.post(f"/api/sessions/{sid}/messages", json={"messages": msgs, "sync": True}))

        plain = ok(c.get(f"/api/sessions/{sid}/context", params={"query": "what do I love"}))
        for key in ("project_id", "user_id", "session_id", "history", "facts", "summary"):
            assert key in plain
        assert {"topics", "formatted_context"} <= set(plain)
        assert plain["user_id"] == "ctx-user" and plain["matches"] is None
        assert "sailing" in plain["formatted_context"]

        detailed = ok(
            c.get(f"/api/sessions/{sid}/context", params={"query": "sailing", "details": "true"})
        )
        assert detailed["matches"] and all(
            isinstance(m["score"], float) for m in detailed["matches"]
        )

        for config in ({"MessageRecentLimit": 1}, {"message_recent_limit": 1}):
            body = {"query": "what do I love", "recall_config": config}
            data = ok(c.post(f"/api/sessions/{sid}/context", json=body))
            assert len(data["history"]) == 1

        # GUMem's SDK: query and details in the query string, MetadataFilters in the config.
        data = ok(
            c.post(
                f"/api/sessions/{sid}/context",
                params={"query": "I love", "details": "true"},
                json={
                    "recall_config": {
                        "MessageRecentLimit": 0,
                        "MetadataFilters": {"channel": "web"},
                    }
                },
            )
        )
        assert data["query"] == "I love"
        messages = [m for m in data["matches"] if m["layer"] == "message"]
        assert messages and all(m["metadata"].get("channel") == "web" for m in messages)
        data = ok(
            c.post(
                f"/api/sessions/{sid}/context",
                json={
                    "query": "I love",
                    "details": True,
                    "recall_config": {"message_recent_limit": 0},
                    "metadata_filters": {"channel": "app"},
                },
            )
        )
        messages = [m for m in data["matches"] if m["layer"] == "message"]
        assert messages and all(m["metadata"].get("channel") == "app" for m in messages)
        ok(c.post(f"/api/sessions/{sid}/context"))  # no body at all: recent history only

        e = err(c.post(f"/api/sessions/{sid}/context", json={"recall_config": {"bogus": 1}}), 422)
        assert fields(e) == {"recall_config.bogus"}
        e = err(
            c.post(f"/api/sessions/{sid}/context", json={"recall_config": {"TopicTopK": 999}}),
            422,
        )
        assert all(f.startswith("recall_config.") for f in fields(e)) and fields(e)
        e = err(
            c.post(f"/api/sessions/{sid}/context", json={"metadata_filters": {"a": {"$x": 1}}}), 422
        )
        assert fields(e)
        e = err(c.get(f"/api/sessions/{sid}/context", params={"details": "maybe"}), 422)
        assert fields(e) == {"details"}
        err(c.get("/api/sessions/missing/context"), 404)
        err(c.post("/api/sessions/missing/context", json={}), 404)


def test_context_leaves_out_the_texts_the_prompt_carries(srv: Srv) -> None:
    with srv.api() as c:
        notes = session(c, "carry-user")
        said = [_msg("I love sailing on the lake"), _msg("I love skiing in the Alps")]
        ok(c.post(f"/api/sessions/{notes}/messages", json={"messages": said, "sync": True}))
        sid = session(c, "carry-user")
        turns = [_msg("What do I love to do?"), {"role": "assistant", "content": "You love it."}]
        ok(c.post(f"/api/sessions/{sid}/messages", json={"messages": turns, "sync": True}))
        body = {"query": "what do I love", "details": True}
        plain = ok(c.post(f"/api/sessions/{sid}/context", json=body))
        assert "What do I love to do?" in plain["formatted_context"]
        carried = [" What do I love to do? ", "You love it.", "I love skiing in the Alps"]
        data = ok(c.post(f"/api/sessions/{sid}/context", json={**body, "exclude_texts": carried}))
        text = data["formatted_context"]
        assert "sailing" in text and not any(t.strip() in text for t in carried)
        assert data["history"] == []  # both of this session's turns are in the prompt
        assert not {m["text"] for m in data["matches"]} & {t.strip() for t in carried}

        for given, field in [
            ("What do I love to do?", "exclude_texts"),
            ([1, "ok"], "exclude_texts[0]"),
            (["x" * (MAX_CONTENT + 1)], "exclude_texts[0]"),
            (["ok"] * (MAX_EXCLUDE_TEXTS + 1), "exclude_texts"),
        ]:
            r = c.post(f"/api/sessions/{sid}/context", json={"query": "x", "exclude_texts": given})
            assert fields(err(r, 422, "validation_error")) == {field}, given


def test_user_actions(srv: Srv) -> None:
    with srv.api() as c:
        one = {
            "user_id": "shopper",
            "event_type": "search",
            "content": "light running shoes",
            "page": "/shop/search",
            "timestamp": "2026-05-01T09:00:00Z",
        }
        data = ok(c.post("/api/user/actions", json=one))
        assert data["session_id"] == "actions-shopper" and data["user_id"] == "shopper"
        stored = ok(c.get(f"/api/messages/{data['message_ids'][0]}"))
        assert stored["event_type"] == "search" and stored["page"] == "/shop/search"
        assert stored["content"] == "light running shoes" and stored["role"] == "user"

        many = {
            "user_id": "shopper",
            "session_id": "shop-visit-1",
            "sync": True,
            "events": [
                {"event_type": "view", "page": "/p/42", "metadata": {"item": "Nike Pegasus"}},
                {"event_type": "click", "content": "add to cart", "id": "evt-1"},
            ],
        }
        data = ok(c.post("/api/user/actions", json=many))
        assert data["session_id"] == "shop-visit-1" and data["processed"] is True
        assert data["message_ids"][1] == "evt-1"
        view = ok(c.get(f"/api/messages/{data['message_ids'][0]}"))
        assert view["content"] == "view on /p/42 (item=Nike Pegasus)"
        assert view["metadata"] == {"item": "Nike Pegasus"}
        assert ok(c.get("/api/sessions/shop-visit-1"))["user_id"] == "shopper"
        wait_done(c, "actions-shopper")
        hits = ok(c.post("/api/users/shopper/search", json={"query": "running shoes"}))
        assert any(h["event_type"] == "search" for h in hits)

        e = err(c.post("/api/user/actions", json={"user_id": "shopper"}), 422)
        assert fields(e) == {"event_type"}
        both = {**many, "event_type": "view"}
        e = err(c.post("/api/user/actions", json=both), 422)
        assert fields(e) == {"event_type"}
        session(c, "other-shopper", "someone-elses-session")
        e = err(
            c.post(
                "/api/user/actions",
                json={**one, "session_id": "someone-elses-session"},
            ),
            409,
        )
        assert "another user" in e["detail"]


def test_search(srv: Srv) -> None:
    with srv.api() as c:
        sid = session(c, "search-user")
        msgs = [_msg("We adopted a cat named Miso"), _msg("I work as a nurse in Leeds")]
        ok(c.post(f"/api/sessions/{sid}/messages", json={"messages": msgs, "sync": True}))
        hits = ok(
            c.post(
                "/api/users/search-user/search",
                json={"query": "what is the cat called", "limit": 3, "layers": ["message"]},
            )
        )
        assert hits[0]["text"] == "We adopted a cat named Miso"
        assert hits[0]["layer"] == "message" and hits[0]["message_ids"]
        e = err(c.post("/api/users/search-user/search", json={"query": "x", "limit": 0}), 422)
        assert fields(e) == {"limit"}
        assert ok(c.post("/api/users/nobody-here/search", json={"query": "cat"})) == []


# -- facts, summaries, topics; governance and deletion ------------------------------------


def _fill(c: httpx.Client, user: str, sid: str) -> dict[str, Any]:
    msgs = [
        _msg("I live in Lisbon with my partner.", id=f"{user}-home", metadata={"channel": "web"}),
        _msg("I am allergic to peanuts.", id=f"{user}-allergy", metadata={"channel": "app"}),
        _msg("I love hiking in the Alps every summer.", id=f"{user}-hiking"),
    ]
    session(c, user, sid)
    ok(c.post(f"/api/sessions/{sid}/messages", json={"messages": msgs, "sync": True}))
    facts = ok(c.get(f"/api/users/{user}/facts"))["items"]
    summaries = ok(c.get(f"/api/users/{user}/summaries"))["items"]
    topics = ok(c.get(f"/api/users/{user}/topics"))["items"]
    assert facts and summaries and topics
    return {"facts": facts, "summaries": summaries, "topics": topics}


def test_items_with_provenance_filters_and_paging(srv: Srv) -> None:
    with srv.api() as c:
        items = _fill(c, "items-user", "items-session")
        fact = items["facts"][0]
        assert fact["message_ids"] and fact["user_id"] == "items-user"
        assert ok(c.get(f"/api/facts/{fact['id']}")) == fact
        summary = items["summaries"][0]
        assert summary["fact_ids"] and summary["message_ids"]
        assert ok(c.get(f"/api/summaries/{summary['id']}"))["text"] == summary["text"]
        history = ok(c.get(f"/api/summaries/{summary['id']}/history"))
        assert history and history[0]["text"]
        topic = items["topics"][0]
        assert ok(c.get(f"/api/topics/{topic['id']}")) == topic

        n = len(items["facts"])
        assert n >= 2
        first = ok(c.get("/api/users/items-user/facts", params={"limit": 1}))
        assert first["next_offset"] == 1 and len(first["items"]) == 1
        rest = ok(c.get("/api/users/items-user/facts", params={"limit": 1000, "offset": 1}))
        assert [f["id"] for f in first["items"] + rest["items"]] == [
            f["id"] for f in items["facts"]
        ]
        assert rest["next_offset"] is None

        def fact_texts(**params: Any) -> list[str]:
            return [
                f["text"] for f in ok(c.get("/api/users/items-user/facts", params=params))["items"]
            ]

        web = fact_texts(metadata=json.dumps({"channel": "web"}))
        assert web and all("Lisbon" in t for t in web)
        assert fact_texts(metadata=json.dumps({"channel": "fax"})) == []
        assert fact_texts(since="2999-01-01T00:00:00Z") == []
        assert len(fact_texts(until="2999-01-01T00:00:00Z")) == n
        assert fact_texts(status="superseded") == []
        summaries = ok(c.get("/api/users/items-user/summaries", params={"status": "active"}))
        assert len(summaries["items"]) == len(items["summaries"])
        assert ok(c.get("/api/users/items-user/topics", params={"limit": 1}))["items"] == [topic]

        e = err(c.get("/api/users/items-user/facts", params={"status": "gone"}), 422)
        assert fields(e) == {"status"}
        e = err(c.get("/api/users/items-user/summaries", params={"limit": 0}), 422)
        assert fields(e) == {"limit"}
        e = err(c.get("/api/users/items-user/facts", params={"metadata": "[1]"}), 422)
        assert fields(e) == {"metadata"}
        e = err(c.get("/api/users/items-user/facts", params={"since": "last tuesday"}), 422)
        assert fields(e) == {"since"}
        for path in ("facts", "summaries", "topics"):
            err(c.get(f"/api/{path}/no-such-item"), 404, "not_found")
        err(c.get("/api/summaries/no-such-item/history"), 404, "not_found")
        assert ok(c.get("/api/users/nobody-here/facts"))["items"] == []

        # A user's messages across sessions, with paging and a status filter.
        other = session(c, "items-user")
        ok(c.post(f"/api/sessions/{other}/messages", json={"messages": [_msg("later")]}))
        wait_done(c, other)
        listed = ok(c.get("/api/users/items-user/messages", params={"status": "processed"}))
        sessions_seen = {m["session_id"] for m in listed["items"]}
        assert sessions_seen == {"items-session", other}
        assert all(m["user_id"] == "items-user" for m in listed["items"])
        one = ok(c.get("/api/users/items-user/messages", params={"limit": 1}))
        assert one["items"] == listed["items"][:1] and one["next_offset"] == 1
        assert ok(c.get("/api/users/items-user/messages", params={"status": "failed"})) == {
            "items": [],
            "limit": 100,
            "offset": 0,
            "next_offset": None,
        }
        assert ok(c.get("/api/users/nobody-here/messages"))["items"] == []


def _key_id(srv: Srv, project: str = "default", name: str = "bootstrap") -> str:
    with srv.admin() as a:
        keys = ok(a.get(f"/admin/projects/{project}/keys"))
    return str(next(k["id"] for k in keys if k["name"] == name))


def test_summary_status_changes_are_audited_with_the_key(srv: Srv) -> None:
    with srv.api() as c:
        items = _fill(c, "gov-user", "gov-session")
        target = next(s for s in items["summaries"] if "Lisbon" in s["text"])
        changed = ok(
            c.patch(
                f"/api/summaries/{target['id']}",
                json={"status": "archived", "reason": "user asked"},
            )
        )
        assert changed["status"] == "archived" and changed["id"] == target["id"]
        history = ok(c.get(f"/api/summaries/{target['id']}/history"))
        assert history[-1]["status"] == "archived" and history[-1]["reason"] == "user asked"
        ctx = ok(
            c.get("/api/sessions/gov-session/context", params={"query": "Lisbon", "details": True})
        )
        assert target["id"] not in [m["id"] for m in ctx["matches"]]

        audit = ok(c.get("/api/audit", params={"user_id": "gov-user"}))["items"]
        record = audit[-1]
        assert record["action"] == "set_status" and record["target"] == target["id"]
        assert record["actor"] == f"api_key:{_key_id(srv)}"
        assert record["reason"] == "user asked"

        e = err(c.patch(f"/api/summaries/{target['id']}", json={"status": "archived"}), 422)
        assert fields(e) == {"reason"}
        e = err(
            c.patch(f"/api/summaries/{target['id']}", json={"status": "superseded", "reason": "r"}),
            422,
        )
        assert fields(e) == {"status"}
        err(c.patch("/api/summaries/no-such", json={"status": "active", "reason": "r"}), 404)


def test_forget_removes_from_every_recall_path(srv: Srv) -> None:
    with srv.api() as c:
        _fill(c, "fgt-user", "fgt-session")
        assert "peanut" in json.dumps(ok(c.get("/api/users/fgt-user/export")))
        counts = ok(
            c.post(
                "/api/forget",
                json={"user_id": "fgt-user", "message_ids": ["fgt-user-allergy"], "reason": "r"},
            )
        )
        assert counts["messages"] == 1
        err(c.get("/api/messages/fgt-user-allergy"), 404)
        exported = json.dumps(ok(c.get("/api/users/fgt-user/export")))
        assert "peanut" not in exported and "Lisbon" in exported
        hits = ok(c.post("/api/users/fgt-user/search", json={"query": "allergic to peanuts"}))
        assert all("peanut" not in h["text"] for h in hits)
        ctx = ok(c.get("/api/sessions/fgt-session/context", params={"query": "peanuts allergy"}))
        ctx.pop("query")  # the question itself is echoed back
        assert "peanut" not in json.dumps(ctx)

        topic = ok(c.get("/api/users/fgt-user/topics"))["items"][0]
        ok(c.post("/api/forget", json={"user_id": "fgt-user", "topic_id": topic["id"]}))
        err(c.get(f"/api/topics/{topic['id']}"), 404)

        ok(c.post("/api/forget", json={"user_id": "fgt-user", "session_id": "fgt-session"}))
        err(c.get("/api/sessions/fgt-session"), 404)
        assert ok(c.get("/api/users/fgt-user/facts"))["items"] == []

        actions = [
            r["action"] for r in ok(c.get("/api/audit", params={"user_id": "fgt-user"}))["items"]
        ]
        assert actions == ["forget", "forget", "forget"]

        for body in (
            {"user_id": "fgt-user"},
            {"user_id": "fgt-user", "session_id": "a", "topic_id": "b"},
        ):
            e = err(c.post("/api/forget", json=body), 422)
            assert fields(e) == {"message_ids", "session_id", "topic_id"}
        err(c.post("/api/forget", json={"user_id": "fgt-user", "session_id": "gone"}), 404)


def test_export_and_erase(srv: Srv) -> None:
    with srv.api() as c:
        _fill(c, "erase-user", "erase-session")
        exported = ok(c.get("/api/users/erase-user/export"))
        assert exported["format"] == "stratamem.export/1" and exported["user_id"] == "erase-user"
        assert len(exported["messages"]) == 3 and exported["facts"] and exported["summaries"]
        assert exported["summaries"][0]["history"]

        counts = ok(c.delete("/api/users/erase-user", params={"reason": "GDPR request"}))
        assert counts["messages"] == 3 and counts["sessions"] == 1
        err(c.get("/api/sessions/erase-session"), 404)
        err(c.get("/api/messages/erase-user-home"), 404)
        for layer in ("facts", "summaries", "topics"):
            assert ok(c.get(f"/api/users/erase-user/{layer}"))["items"] == []
        assert ok(c.post("/api/users/erase-user/search", json={"query": "Lisbon"})) == []
        after = ok(c.get("/api/users/erase-user/export"))
        assert after["messages"] == after["facts"] == after["summaries"] == after["topics"] == []
        audit = ok(c.get("/api/audit", params={"user_id": "erase-user"}))["items"]
        assert audit[-1]["action"] == "erase_user" and audit[-1]["reason"] == "GDPR request"
        assert audit[-1]["actor"] == f"api_key:{_key_id(srv)}"
        assert "Lisbon" not in json.dumps(audit)


def test_audit_pages(srv: Srv) -> None:
    with srv.api() as c:
        everything = ok(c.get("/api/audit", params={"limit": 1000}))["items"]
        assert len(everything) >= 2
        first = ok(c.get("/api/audit", params={"limit": 1}))
        assert first["items"] == everything[:1] and first["next_offset"] == 1


# -- limits and errors --------------------------------------------------------------------


def test_request_size_limits_are_413(srv: Srv) -> None:
    with srv.api() as c:
        sid = session(c, "big-user")
        big = json.dumps({"messages": [_msg("a" * (MAX_BODY + 10))]}).encode()
        e = err(
            c.post(
                f"/api/sessions/{sid}/messages",
                content=big,
                headers={"Content-Type": "application/json"},
            ),
            413,
            "payload_too_large",
        )
        assert str(MAX_BODY) in e["detail"]

        def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it streams in
            for i in range(0, len(big), 8192):
                yield big[i : i + 8192]

        err(
            c.post(
                f"/api/sessions/{sid}/messages",
                content=chunks(),
                headers={"Content-Type": "application/json"},
            ),
            413,
            "payload_too_large",
        )

        long = [_msg("ok"), _msg("b" * (MAX_CONTENT + 1))]
        e = err(c.post(f"/api/sessions/{sid}/messages", json={"messages": long}), 413)
        assert fields(e) == {"messages[1].content"}
        e = err(
            c.post(
                "/api/user/actions",
                json={
                    "user_id": "big-user",
                    "event_type": "paste",
                    "content": "c" * (MAX_CONTENT + 1),
                },
            ),
            413,
        )
        assert fields(e) == {"content"}
        many = {"messages": [_msg("m") for _ in range(1001)]}
        e = err(c.post(f"/api/sessions/{sid}/messages", json=many), 413)
        assert fields(e) == {"messages"}
        # Nothing of a refused request was stored.
        assert ok(c.get(f"/api/sessions/{sid}/messages"))["items"] == []


def test_malformed_requests(srv: Srv) -> None:
    with srv.api() as c:
        err(
            c.post(
                "/api/sessions", content=b"{not json", headers={"Content-Type": "application/json"}
            ),
            400,
            "bad_request",
        )
        err(c.get("/api/no-such-route"), 404, "not_found")
        err(c.put("/api/sessions"), 405, "method_not_allowed")
        e = err(c.get("/api/sessions", params={"limit": "many"}), 422)
        assert fields(e) == {"limit"}
        e = err(c.post("/api/sessions", json=[1, 2]), 422)
        assert e["problems"]


# -- cross-project isolation ---------------------------------------------------------------


def _normal(r: httpx.Response, ids: dict[str, str]) -> Any:
    """A response with the ids it was asked about replaced by their kind, and the parts
    that differ between any two requests (request id, export time) blanked."""
    body = r.json()
    if body.get("error"):
        body["error"]["request_id"] = None
    if isinstance(body.get("data"), dict) and "exported_at" in body["data"]:
        body["data"]["exported_at"] = None
    text = json.dumps(body)
    for value, kind in sorted(ids.items(), key=lambda kv: -len(kv[0])):
        text = text.replace(value, f"<{kind}>")
    return json.loads(text)


def test_one_projects_key_never_reaches_another_projects_data(srv: Srv) -> None:
    key_a, key_b = srv.new_project("iso-a"), srv.new_project("iso-b")
    with srv.api(key_b) as b:
        items = _fill(b, "iso-user", "iso-session")
        action = ok(b.post("/api/user/actions", json={"user_id": "iso-user", "event_type": "view"}))
        wait_done(b, action["session_id"])
        ids = {
            "session": "iso-session",
            "message": "iso-user-home",
            "fact": items["facts"][0]["id"],
            "summary": items["summaries"][0]["id"],
            "topic": items["topics"][0]["id"],
            "user": "iso-user",
        }
        before = ok(b.get("/api/users/iso-user/export"))

    def requests(kind_id: dict[str, str]) -> list[tuple[str, str, dict[str, Any]]]:
        s, m, f = kind_id["session"], kind_id["message"], kind_id["fact"]
        sm, t, u = kind_id["summary"], kind_id["topic"], kind_id["user"]
        return [
            ("GET", f"/api/sessions/{s}", {}),
            ("GET", f"/api/sessions/{s}/messages", {}),
            ("GET", f"/api/sessions/{s}/status", {}),
            ("GET", f"/api/sessions/{s}/context", {"params": {"query": "Lisbon"}}),
            ("POST", f"/api/sessions/{s}/context", {"json": {"query": "Lisbon"}}),
            ("POST", f"/api/sessions/{s}/messages", {"json": {"messages": [_msg("x")]}}),
            ("GET", f"/api/messages/{m}", {}),
            ("GET", f"/api/facts/{f}", {}),
            ("GET", f"/api/summaries/{sm}", {}),
            ("GET", f"/api/summaries/{sm}/history", {}),
            ("PATCH", f"/api/summaries/{sm}", {"json": {"status": "deleted", "reason": "x"}}),
            ("GET", f"/api/topics/{t}", {}),
            ("POST", "/api/forget", {"json": {"user_id": u, "message_ids": [m]}}),
            ("POST", "/api/forget", {"json": {"user_id": u, "session_id": s}}),
            ("POST", "/api/forget", {"json": {"user_id": u, "topic_id": t}}),
            ("GET", f"/api/users/{u}/facts", {}),
            ("GET", f"/api/users/{u}/summaries", {}),
            ("GET", f"/api/users/{u}/topics", {}),
            ("POST", f"/api/users/{u}/search", {"json": {"query": "Lisbon"}}),
            ("GET", "/api/audit", {"params": {"user_id": u}}),
            ("GET", f"/api/users/{u}/export", {}),
            ("DELETE", f"/api/users/{u}", {}),
        ]

    foreign = requests(ids)
    missing = requests({k: f"absent-{k}" for k in ids})
    with srv.api(key_a) as a:
        for (method, path, kw), (_, missing_path, missing_kw) in zip(foreign, missing, strict=True):
            got = a.request(method, path, **kw)
            expected = a.request(method, missing_path, **missing_kw)
            assert got.status_code in (200, 404), (path, got.text)
            if got.status_code == 200:
                # User-scoped lists answer for a user with nothing in this project: empty.
                assert "Lisbon" not in got.text and "iso-session" not in got.text, path
            assert got.status_code == expected.status_code, (path, got.text, expected.text)
            foreign_ids = {v: k for k, v in ids.items()}
            missing_ids = {f"absent-{k}": k for k in ids}
            assert _normal(got, foreign_ids) == _normal(expected, missing_ids), path
        # Creating a session with another project's id is creating a new one, as for any id.
        created = ok(
            a.post("/api/sessions", json={"user_id": "iso-user", "session_id": "iso-session"})
        )
        assert created["project_id"] == "iso-a"

    with srv.api(key_b) as b:  # project B is untouched
        after = ok(b.get("/api/users/iso-user/export"))
        assert [m["id"] for m in after["messages"]] == [m["id"] for m in before["messages"]]
        assert after["summaries"] == before["summaries"] and after["facts"] == before["facts"]
        assert ok(b.get("/api/audit"))["items"] == []
        assert [s["id"] for s in ok(b.get("/api/sessions"))["items"]] == [
            "iso-session",
            action["session_id"],
        ]


# -- last: nothing leaked ------------------------------------------------------------------


def test_no_response_or_log_carries_a_traceback(srv: Srv) -> None:
    assert len(BODIES) > 100
    for text in BODIES:
        assert "Traceback" not in text and 'File "' not in text, text[:500]
    assert "Traceback" not in srv.proc.stderr()
