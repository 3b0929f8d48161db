"""The dashboard (/ui) over HTTP, on both backends: sign-in and its cookie, CSRF on every
form, each page rendering real memory, governance actions and their audit, memory text
always escaped, and one project never seeing another's. The browser tests
(test_dashboard_browser.py) drive the same pages in Chromium."""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from markupsafe import escape
from starlette.testclient import TestClient

from fakes.memory_model import MemoryModel
from fakes.openai_server import FakeOpenAIServer
from stratamem import Memory
from stratamem.server import create_app
from stratamem.server._settings import ServerSettings

ADMIN = "admin-token-for-tests"
SCRIPT = "<script>alert('x')</script> likes tea"
IMG = '<img src=x onerror="alert(1)"> lives in Oslo'
CSRF_RE = re.compile(r'name="csrf" value="([^"]+)"')


class Dash:
    """A browser's view of the dashboard: a cookie jar, and the CSRF token of the last page."""

    def __init__(self, client: TestClient) -> None:
        self.client = client
        self.csrf = ""

    def get(self, path: str, **kw: Any) -> httpx.Response:
        r = self.client.get("/ui" + path, **kw)
        found = CSRF_RE.search(r.text)
        if found:
            self.csrf = found.group(1)
        return r

    def post(
        self,
        path: str,
        data: dict[str, str] | None = None,
        *,
        csrf: bool = True,
        confirm: bool = False,
    ) -> httpx.Response:
        form = dict(data or {})
        if csrf:
            form["csrf"] = self.csrf
        if confirm:
            form["confirm"] = "yes"
        return self.client.post("/ui" + path, data=form, follow_redirects=False)

    def sign_in(self, secret: str) -> httpx.Response:
        self.get("/login")
        return self.post("/login", {"key": secret})


@pytest.fixture
def world(make_memory: Callable[..., Memory]) -> dict[str, Any]:
    """Two projects with keys; alice (project a) has processed memory, hostile text included."""
    mem = make_memory()
    mem.projects.create("A", project_id="a")
    mem.projects.create("B", project_id="b")
    _, key_a = mem.keys.create("a", name="ui")
    _, key_b = mem.keys.create("b", name="ui")
    a = mem.for_project("a")
    s = a.sessions.create("alice", session_id="s1", title="trip")
    s.add_messages(
        [
            {"role": "user", "content": "I moved to Berlin last spring."},
            {"role": "user", "content": "My sister Ana is a nurse in Lisbon."},
            {"role": "user", "content": SCRIPT},
            {"role": "user", "content": IMG},
        ],
        sync=True,
    )
    b = mem.for_project("b")
    b.sessions.create("bob", session_id="s9").add_messages(
        [{"role": "user", "content": "Bob's secret is in project b."}], sync=True
    )
    return {"mem": mem, "a": a, "b": b, "key_a": key_a, "key_b": key_b}


@pytest.fixture
def dash(world: dict[str, Any]) -> Iterator[Dash]:
    app = create_app(world["mem"], ServerSettings(admin_token=ADMIN))
    with TestClient(app, base_url="http://testserver") as client:
        yield Dash(client)


@pytest.fixture
def signed_in(dash: Dash, world: dict[str, Any]) -> Dash:
    assert dash.sign_in(world["key_a"]).status_code == 303
    return dash


@pytest.fixture
def modelled(make_memory: Callable[..., Memory]) -> Iterator[tuple[Memory, str, FakeOpenAIServer]]:
    """A memory whose pipeline uses a fake model on 127.0.0.1 (to break it), and a key."""
    server = FakeOpenAIServer()
    server.chat_script = MemoryModel()
    server.start()
    try:
        mem = make_memory(
            llm="openai:fake-chat",
            llm_base_url=server.base_url,
            llm_api_key="k",
            llm_max_retries=0,
            job_max_attempts=1,
            job_backoff_seconds=0.01,
            outage_backoff_seconds=0.05,
            outage_backoff_max_seconds=0.2,
        )
        mem.projects.create("default", project_id=mem.project_id)
        _, key = mem.keys.create(mem.project_id)
        yield mem, key, server
    finally:
        server.close()


def _summary_id(mem: Memory, user: str = "alice") -> str:
    return next(s.id for s in mem.summaries.list(user_id=user) if "Berlin" in s.text)


# -- sign-in ---------------------------------------------------------------------------------


def test_pages_need_a_session(dash: Dash) -> None:
    for path in ("/", "/users", "/users/alice", "/recall", "/webhooks", "/audit"):
        r = dash.get(path, follow_redirects=False)
        assert r.status_code == 303, path
        assert r.headers["location"].startswith("/ui/login?next=")
    r = dash.post("/users/alice/erase", {"reason": "x"}, csrf=False, confirm=True)
    assert r.status_code == 401


def test_sign_in_sets_a_strict_http_only_cookie(dash: Dash, world: dict[str, Any]) -> None:
    r = dash.sign_in(world["key_a"])
    assert r.status_code == 303 and r.headers["location"] == "/ui/"
    cookie = next(c for c in r.headers.get_list("set-cookie") if c.startswith("stratamem_ui="))
    attrs = {p.strip().split("=")[0].lower() for p in cookie.split(";")}
    assert {"httponly", "samesite", "path"} <= attrs
    assert "samesite=strict" in cookie.lower() and "path=/ui" in cookie.lower()
    token = cookie.split(";")[0].split("=", 1)[1]
    # The store keeps a hash of the token, never the token.
    assert world["mem"].store.get_ui_session(token) is None
    page = dash.get("/")
    assert page.status_code == 200 and "Overview" in page.text


@pytest.mark.parametrize("secret", ["sm_wrong_key_1234567890abcdef", "", "admin-token-for-test"])
def test_a_wrong_key_is_refused(dash: Dash, secret: str) -> None:
    r = dash.sign_in(secret)
    assert r.status_code in (400, 401)
    assert not [c for c in r.headers.get_list("set-cookie") if c.startswith("stratamem_ui=")]
    assert dash.get("/", follow_redirects=False).status_code == 303


def test_sign_in_without_its_csrf_token_is_refused(dash: Dash, world: dict[str, Any]) -> None:
    dash.get("/login")
    r = dash.post("/login", {"key": world["key_a"]}, csrf=False)
    assert r.status_code == 403
    assert dash.get("/", follow_redirects=False).status_code == 303


def test_sign_in_goes_back_to_the_page_asked_for_never_elsewhere(
    dash: Dash, world: dict[str, Any]
) -> None:
    dash.get("/login")
    r = dash.post("/login", {"key": world["key_a"], "next": "/ui/users?q=al"})
    assert r.headers["location"] == "/ui/users?q=al"
    for evil in ("//evil.example/ui/", "https://evil.example/", "/other", "/ui\\@evil"):
        dash.client.cookies.clear()
        dash.get("/login")
        r = dash.post("/login", {"key": world["key_a"], "next": evil})
        assert r.headers["location"] == "/ui/", evil


def test_sign_out_ends_the_session_on_the_server(signed_in: Dash) -> None:
    token = signed_in.client.cookies.get("stratamem_ui")
    signed_in.get("/")
    assert signed_in.post("/logout").status_code == 303
    # The old cookie, replayed, opens nothing: the session is gone from the store.
    signed_in.client.cookies.set("stratamem_ui", token, path="/ui")
    assert signed_in.get("/", follow_redirects=False).status_code == 303


def test_revoking_the_key_ends_its_dashboard_sessions(
    signed_in: Dash, world: dict[str, Any]
) -> None:
    key_id = next(k.id for k in world["mem"].keys.list("a"))
    world["mem"].keys.revoke(key_id)
    assert signed_in.get("/", follow_redirects=False).status_code == 303


def test_the_admin_token_opens_every_project(dash: Dash, world: dict[str, Any]) -> None:
    assert dash.sign_in(ADMIN).status_code == 303
    r = dash.get("/", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/ui/projects"
    page = dash.get("/projects")
    assert "<code>a</code>" in page.text and "<code>b</code>" in page.text
    assert dash.post("/projects", {"project_id": "b"}).status_code == 303
    assert "bob" in dash.get("/users").text
    assert dash.post("/projects", {"project_id": "a"}).status_code == 303
    users = dash.get("/users").text
    assert "alice" in users and "bob" not in users


def test_a_project_key_cannot_switch_projects(signed_in: Dash) -> None:
    signed_in.get("/")
    assert signed_in.post("/projects", {"project_id": "b"}).status_code == 403
    assert "bob" not in signed_in.get("/users").text


# -- pages -----------------------------------------------------------------------------------


def test_every_page_renders_with_a_policy_that_allows_no_script(
    signed_in: Dash, world: dict[str, Any]
) -> None:
    a: Memory = world["a"]
    ids = {
        "message": a.messages.list(user_id="alice")[0].id,
        "fact": a.facts.list(user_id="alice")[0].id,
        "summary": _summary_id(a),
        "topic": a.topics.list(user_id="alice")[0].id,
    }
    paths = [
        "/",
        "/users",
        "/users?q=ali",
        "/users/alice",
        "/users/alice?tab=facts",
        "/users/alice?tab=messages",
        "/users/alice?tab=sessions",
        "/recall",
        "/recall?user_id=alice&query=where+does+she+live",
        "/recall/log",
        "/webhooks",
        "/audit",
        *(f"/items/{i}" for i in ids.values()),
    ]
    for path in paths:
        r = signed_in.get(path)
        assert r.status_code == 200, (path, r.text[:500])
        assert "script-src" not in r.headers["content-security-policy"]
        assert "default-src 'none'" in r.headers["content-security-policy"]
        assert r.headers["x-frame-options"] == "DENY"
        assert "<script" not in r.text.lower()


def test_memory_text_is_shown_as_text(signed_in: Dash, world: dict[str, Any]) -> None:
    pages = [signed_in.get("/users/alice?tab=messages").text]
    pages.append(signed_in.get("/recall?user_id=alice&query=tea+Oslo").text)
    for m in world["a"].messages.list(user_id="alice"):
        pages.append(signed_in.get(f"/items/{m.id}").text)
    joined = "\n".join(pages)
    assert "<script>" not in joined and "<img" not in joined
    assert str(escape(SCRIPT)) in joined and str(escape(IMG)) in joined


def test_a_users_memory_follows_provenance_both_ways(
    signed_in: Dash, world: dict[str, Any]
) -> None:
    a: Memory = world["a"]
    summary = a.summaries.get(_summary_id(a))
    page = signed_in.get("/users/alice").text
    assert f"/ui/items/{summary.id}" in page
    down = signed_in.get(f"/items/{summary.id}").text
    for fact_id in summary.fact_ids:
        assert f"/ui/items/{fact_id}" in down
    message_id = summary.message_ids[0]
    assert f"/ui/items/{message_id}" in down
    up = signed_in.get(f"/items/{message_id}").text
    assert f"/ui/items/{summary.id}" in up
    assert "I moved to Berlin last spring." in up


def test_another_projects_items_are_not_found(signed_in: Dash, world: dict[str, Any]) -> None:
    b: Memory = world["b"]
    message = b.messages.list(user_id="bob")[0]
    r = signed_in.get(f"/items/{message.id}")
    assert r.status_code == 404 and "Bob's secret" not in r.text
    assert "bob" not in signed_in.get("/users").text


def test_users_are_searched_and_paged(signed_in: Dash, world: dict[str, Any]) -> None:
    a: Memory = world["a"]
    for i in range(60):
        a.sessions.create(f"user-{i:03d}", session_id=f"sx{i}")
    first = signed_in.get("/users?q=user-").text
    assert "60 users" in first and "Page 1 of 2" in first
    second = signed_in.get("/users?q=user-&page=2").text
    shown = set(re.findall(r"user-\d{3}", first)) | set(re.findall(r"user-\d{3}", second))
    assert len(shown) == 60
    assert signed_in.get("/users?page=0").status_code == 400


def test_recall_shows_every_layer_and_the_exact_context(
    signed_in: Dash, world: dict[str, Any]
) -> None:
    a: Memory = world["a"]
    expected = a.get_memory("s1", "Where does she live?").formatted_context
    page = signed_in.get("/recall?user_id=alice&session_id=s1&query=Where+does+she+live%3F").text
    for layer in ("Summary hits", "Fact hits", "Message hits"):
        assert layer in page
    assert str(escape(expected)) in page
    assert "Berlin" in page


# -- actions ---------------------------------------------------------------------------------


def test_every_form_needs_the_csrf_token(signed_in: Dash, world: dict[str, Any]) -> None:
    a: Memory = world["a"]
    sid = _summary_id(a)
    signed_in.get(f"/items/{sid}")
    posts = [
        (f"/items/{sid}/status", {"status": "archived", "reason": "csrf"}),
        ("/users/alice/erase", {"reason": "csrf"}),
        ("/users/alice/forget", {"session_id": "s1"}),
        ("/users/alice/export", {}),
        ("/retry", {}),
        ("/webhooks", {"resource": "fact", "event": "after_llm", "target_url": "http://x"}),
        ("/logout", {}),
    ]
    for path, data in posts:
        r = signed_in.post(path, data, csrf=False, confirm=True)
        assert r.status_code == 403, path
        assert "security token" in r.text
        bad = signed_in.post(path, {**data, "csrf": "not-the-token"}, csrf=False, confirm=True)
        assert bad.status_code == 403, path
    assert a.summaries.get(sid).status == "active"
    assert a.messages.list(user_id="alice") and not a.webhooks.list()
    assert signed_in.get("/").status_code == 200  # still signed in


def test_a_status_change_is_confirmed_then_in_the_history(
    signed_in: Dash, world: dict[str, Any]
) -> None:
    a: Memory = world["a"]
    sid = _summary_id(a)
    signed_in.get(f"/items/{sid}")
    asked = signed_in.post(f"/items/{sid}/status", {"status": "archived", "reason": "outdated"})
    assert asked.status_code == 200 and "Confirm" in asked.text
    assert a.summaries.get(sid).status == "active"  # not before it is confirmed
    done = signed_in.post(
        f"/items/{sid}/status", {"status": "archived", "reason": "outdated"}, confirm=True
    )
    assert done.status_code == 303
    assert a.summaries.get(sid).status == "archived"
    page = signed_in.get(done.headers["location"].removeprefix("/ui")).text
    assert "Status changed" in page and "outdated" in page
    key_id = next(k.id for k in world["mem"].keys.list("a"))
    assert f"ui:api_key:{key_id}" in page
    record = a.audit(user_id="alice")[-1]
    assert record.actor == f"ui:api_key:{key_id}" and record.reason == "outdated"


@pytest.mark.parametrize(
    ("form", "message"),
    [
        ({"status": "superseded", "reason": "x"}, "status: expected one of"),
        ({"status": "archived", "reason": "  "}, "reason"),
    ],
)
def test_a_bad_status_change_is_explained(
    signed_in: Dash, world: dict[str, Any], form: dict[str, str], message: str
) -> None:
    sid = _summary_id(world["a"])
    signed_in.get(f"/items/{sid}")
    r = signed_in.post(f"/items/{sid}/status", form, confirm=True)
    assert r.status_code == 400 and message in r.text


def test_forget_a_message_export_and_erase_a_user(signed_in: Dash, world: dict[str, Any]) -> None:
    a: Memory = world["a"]
    message = next(m for m in a.messages.list(user_id="alice") if "Lisbon" in m.content)
    signed_in.get(f"/items/{message.id}")
    r = signed_in.post("/users/alice/forget", {"message_id": message.id}, confirm=True)
    assert r.status_code == 303
    assert all("Lisbon" not in m.content for m in a.messages.list(user_id="alice"))

    signed_in.get("/users/alice?tab=sessions")
    export = signed_in.post("/users/alice/export", confirm=True)
    assert export.status_code == 200
    assert export.headers["content-disposition"].startswith("attachment;")
    assert "Berlin" in export.text

    asked = signed_in.post("/users/alice/erase", {"reason": "user asked"})
    assert "cannot be undone" in asked.text
    assert a.messages.list(user_id="alice")
    done = signed_in.post("/users/alice/erase", {"reason": "user asked"}, confirm=True)
    assert done.status_code == 303
    assert not a.messages.list(user_id="alice") and not a.summaries.list(user_id="alice")
    assert "alice" not in signed_in.get("/users").text
    audit = signed_in.get("/audit").text
    assert "erase_user" in audit and "user asked" in audit


def test_webhooks_are_managed_and_their_secret_shown_once(
    signed_in: Dash, world: dict[str, Any]
) -> None:
    a: Memory = world["a"]
    signed_in.get("/webhooks")
    bad = signed_in.post(
        "/webhooks",
        {"resource": "fact", "event": "after_llm", "target_url": "not a url", "mode": "sync"},
    )
    assert bad.status_code == 400 and "target_url" in bad.text
    created = signed_in.post(
        "/webhooks",
        {
            "name": "<b>audit</b>",
            "resource": "fact",
            "event": "after_llm",
            "mode": "async",
            "target_url": "https://hooks.example.com/in",
            "enabled": "on",
        },
    )
    assert created.status_code == 200 and "shown only once" in created.text
    secret = re.search(r'value="(whsec_[^"]+)"', created.text)
    assert secret
    hook = a.webhooks.list()[0]
    assert hook.enabled and hook.name == "<b>audit</b>"
    page = signed_in.get(f"/webhooks/{hook.id}").text
    assert secret.group(1) not in page and "&lt;b&gt;audit&lt;/b&gt;" in page
    assert signed_in.post(f"/webhooks/{hook.id}/enabled", {"enabled": "no"}).status_code == 303
    assert not a.webhooks.get(hook.id).enabled
    signed_in.get(f"/webhooks/{hook.id}")
    rotated = signed_in.post(f"/webhooks/{hook.id}/rotate", {"grace_seconds": "60"}, confirm=True)
    new = re.search(r'value="(whsec_[^"]+)"', rotated.text)
    assert new and new.group(1) != secret.group(1)
    signed_in.get(f"/webhooks/{hook.id}")
    assert signed_in.post(f"/webhooks/{hook.id}/delete", confirm=True).status_code == 303
    assert not a.webhooks.list()


def test_overview_shows_failures_and_retries_them(signed_in: Dash, world: dict[str, Any]) -> None:
    page = signed_in.get("/").text
    assert "Messages processed per hour" in page and "Recall latency per hour" in page
    assert "Failed messages" in page
    r = signed_in.post("/retry", confirm=True)
    assert r.status_code == 303 and r.headers["location"].startswith("/ui/?done=retried")


def test_unknown_pages_and_methods_answer_in_html(signed_in: Dash) -> None:
    r = signed_in.get("/nope")
    assert r.status_code == 404 and "text/html" in r.headers["content-type"]
    assert signed_in.get("/items/nope-404").status_code == 404


def test_the_dashboard_can_be_switched_off(world: dict[str, Any]) -> None:
    app = create_app(world["mem"], ServerSettings(ui=False))
    with TestClient(app) as client:
        assert client.get("/ui/login").status_code == 404


def test_failed_messages_show_their_error_and_are_retried(
    modelled: tuple[Memory, str, FakeOpenAIServer],
) -> None:
    mem, key, server = modelled
    server.fault("invalid_json")
    mem.sessions.create("carol", session_id="c1").add_messages(
        [{"role": "user", "content": "I adopted a cat named Miso."}]
    )
    mem.wait(timeout=60)
    failed = mem.messages.list(status="failed")
    assert failed and failed[0].error
    app = create_app(mem, ServerSettings())
    with TestClient(app) as client:
        dash = Dash(client)
        dash.sign_in(key)
        page = dash.get("/").text
        assert failed[0].id in page and str(escape(failed[0].error)) in page
        assert "Retry all failed messages" in page
        server.heal()
        asked = dash.post("/retry")
        assert "processed again" in asked.text
        r = dash.post("/retry", confirm=True)
        assert r.status_code == 303 and r.headers["location"] == "/ui/?done=retried%3A1"
        assert "1 job queued again." in dash.get("/?done=retried:1").text
        assert "2 jobs queued again." in dash.get("/?done=retried:2").text
        mem.wait(timeout=60)
        assert mem.messages.list(status="failed") == []
        assert dash.get("/?done=<b>forged</b>").text.count("forged") == 0


def test_a_correction_is_shown_both_ways_and_the_old_summary_stays_reachable(
    signed_in: Dash, world: dict[str, Any]
) -> None:
    a: Memory = world["a"]
    s = a.sessions.get("s1")
    s.add_messages([{"role": "user", "content": "My cat is called Mio."}], sync=True)
    s.add_messages(
        [{"role": "user", "content": "Correction: my cat is called Miso, not Mio."}], sync=True
    )
    old = next(x for x in a.summaries.list(user_id="alice", status="superseded"))
    new = a.summaries.get(str(old.superseded_by))
    memory_tab = signed_in.get("/users/alice").text
    assert "Superseded and archived summaries (1)" in memory_tab
    assert f"/ui/items/{old.id}" in memory_tab  # reachable, folded away
    old_page = signed_in.get(f"/items/{old.id}").text
    assert "superseded by" in old_page and f"/ui/items/{new.id}" in old_page
    new_page = signed_in.get(f"/items/{new.id}").text
    assert "Replaces" in new_page and f"/ui/items/{old.id}" in new_page


def test_forget_a_session_and_a_topic(signed_in: Dash, world: dict[str, Any]) -> None:
    a: Memory = world["a"]
    a.sessions.create("alice", session_id="s2").add_messages(
        [{"role": "user", "content": "I collect vintage fountain pens."}], sync=True
    )
    signed_in.get("/users/alice?tab=sessions")
    asked = signed_in.post("/users/alice/forget", {"session_id": "s2"})
    assert "Forget session s2" in asked.text
    done = signed_in.post("/users/alice/forget", {"session_id": "s2"}, confirm=True)
    assert done.status_code == 303
    assert [x.id for x in a.sessions.list(user_id="alice")] == ["s1"]
    topic = a.topics.list(user_id="alice")[0]
    signed_in.get(f"/items/{topic.id}")
    done = signed_in.post("/users/alice/forget", {"topic_id": topic.id}, confirm=True)
    assert done.status_code == 303
    assert topic.id not in {t.id for t in a.topics.list(user_id="alice")}
    actions = [r.action for r in a.audit(user_id="alice")]
    assert actions.count("forget") == 2


def test_duplicates_and_stale_summaries_are_pointed_out(
    signed_in: Dash, world: dict[str, Any]
) -> None:
    a: Memory = world["a"]
    mem: Memory = world["mem"]

    # The pipeline merges what it sees as one; hooks make the two cases to point out: a
    # summary stored twice, and a fact whose validity ended years ago.
    def twice(payload: dict[str, Any]) -> Any:
        props = payload["data"]["propositions"]
        copies = [{k: v for k, v in p.items() if k != "id"} for p in props if "violin" in p["text"]]
        return {"data": {"propositions": props + copies}}

    def ended(payload: dict[str, Any]) -> Any:
        for o in payload["data"]["observations"]:
            if "Rome" in o["text"]:
                o["valid_from"], o["valid_to"] = "2019-01-01T00:00:00Z", "2021-12-31T00:00:00Z"
        return {"data": {"observations": payload["data"]["observations"]}}

    mem.hooks.register("fact", "before_add", ended)
    session = a.sessions.create("dora", session_id="d1")
    session.add_messages(
        [{"role": "user", "content": "I lived in Rome from 2019 to 2021."}], sync=True
    )
    mem.hooks.register("summary", "before_add", twice)
    session.add_messages([{"role": "user", "content": "I play the violin."}], sync=True)
    violin = [s for s in a.summaries.list(user_id="dora") if "violin" in s.text]
    rome = next(s for s in a.summaries.list(user_id="dora") if "Rome" in s.text)
    assert len(violin) == 2 and rome.valid_to is not None
    page = signed_in.get("/users/dora").text
    look = page.split('id="look-h"', 1)[1].split("</section>", 1)[0]
    assert "Summaries saying the same thing (1)" in look
    assert all(f"/ui/items/{s.id}" in look for s in violin)
    assert "their validity has ended (1)" in look and f"/ui/items/{rome.id}" in look
    assert "Worth a look" not in signed_in.get("/users/alice").text


def test_the_cookie_is_secure_over_https(world: dict[str, Any]) -> None:
    app = create_app(world["mem"], ServerSettings())
    with TestClient(app, base_url="https://memory.example") as client:
        dash = Dash(client)
        r = dash.sign_in(world["key_a"])
        cookie = next(c for c in r.headers.get_list("set-cookie") if c.startswith("stratamem_ui="))
        assert "secure" in cookie.lower().split("; ")


def test_a_malformed_form_is_refused_cleanly(signed_in: Dash) -> None:
    headers = {"content-type": "multipart/form-data; boundary=x"}
    for path in ("/ui/login", "/ui/retry"):
        # Unreadable, or read as a form without its token: refused either way, never a 500.
        r = signed_in.client.post(path, content=b"--x\r\nbroken", headers=headers)
        assert r.status_code in (400, 403) and "text/html" in r.headers["content-type"], path
    too_many = "&".join(f"f{i}=1" for i in range(100))
    r = signed_in.client.post(
        "/ui/retry",
        content=too_many,
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert r.status_code == 400


def test_paused_processing_is_shown_with_its_cause(
    modelled: tuple[Memory, str, FakeOpenAIServer],
) -> None:
    mem, key, server = modelled
    server.fault(503)
    mem.sessions.create("erin", session_id="e1").add_messages(
        [{"role": "user", "content": "I ordered a parcel for my sister."}]
    )
    deadline = time.monotonic() + 60
    while not mem.stats()["processing"]["paused"]:
        assert time.monotonic() < deadline, "no outage recorded"
        time.sleep(0.02)
    with TestClient(create_app(mem, ServerSettings())) as client:
        dash = Dash(client)
        dash.sign_in(key)
        page = dash.get("/").text
        assert "Processing is paused" in page
        assert "llm openai:fake-chat" in page and "HTTP 503" in page
        server.heal()
        mem.wait(timeout=60)
        page = dash.get("/").text
        assert "Processing is paused" not in page and "Running." in page


def test_webhook_failures_are_on_the_overview(make_memory: Callable[..., Memory]) -> None:
    mem = make_memory(webhook_allow=["127.0.0.1"])
    mem.projects.create("default", project_id=mem.project_id)
    _, key = mem.keys.create(mem.project_id)
    with socket.socket() as s:  # a port nothing listens on: every delivery is refused
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    hook, _ = mem.webhooks.create(
        resource="fact", event="before_add", target_url=f"http://127.0.0.1:{closed}/hook"
    )
    mem.sessions.create("finn", session_id="f1").add_messages(
        [{"role": "user", "content": "I adopted a cat named Miso."}], sync=True
    )
    [delivery] = mem.webhooks.deliveries(hook.id)
    assert delivery.status == "failed"
    with TestClient(create_app(mem, ServerSettings())) as client:
        dash = Dash(client)
        dash.sign_in(key)
        section = dash.get("/").text.split('id="hookfail"', 1)[1].split("</section>", 1)[0]
        assert f"/ui/webhooks/{hook.id}" in section and "fact.before_add" in section
        assert str(escape(delivery.reason)) in section
        log = dash.get(f"/webhooks/{hook.id}").text
        assert "failed" in log and str(escape(delivery.reason)) in log


# -- what the pages say ----------------------------------------------------------------------

_COUNTED = re.compile(r"\b1 (users|sessions|messages|facts|summaries|topics|hits|recalls|tokens)\b")


def test_counts_of_one_are_singular(signed_in: Dash, world: dict[str, Any]) -> None:
    """Every page that counts says "1 summary", never "1 summaries" nor "summary(s)"."""
    a: Memory = world["a"]
    api = {"Authorization": f"Api-Key {world['key_a']}"}
    recalled = signed_in.client.get("/api/sessions/s1/context?query=Ana", headers=api)
    assert recalled.status_code == 200  # one recall in the log (REST recalls are logged)
    single = next(t for t in a.topics.list(user_id="alice") if len(t.summary_ids) == 1)
    summary = a.summaries.get(single.summary_ids[0])
    assert len(summary.fact_ids) == len(summary.message_ids) == 1
    user = signed_in.get("/users/alice").text
    assert f'{escape(single.name)}</a> <span class="dim">topic · 1 summary</span>' in user
    assert "v1 · 1 fact · 1 message · updated" in user
    pages = {
        path: signed_in.get(path).text
        for path in ("/", "/users", "/users/alice", "/recall/log", "/recall?user_id=alice&query=x")
    }
    assert "1 user<" in pages["/users"].replace("</p>", "<").replace(".", "<")
    assert '<span class="n">1</span> user</div>' in pages["/"]
    assert '<span class="n">1</span> session</div>' in pages["/"]
    assert "1 recall logged" in pages["/"]
    for path, text in pages.items():
        assert "(s)" not in text, path
        assert not _COUNTED.search(text), (path, _COUNTED.search(text))
    signed_in.get("/users/alice?tab=sessions")
    forgotten = signed_in.post(
        "/users/alice/forget", {"message_id": summary.message_ids[0]}, confirm=True
    )
    notice = signed_in.get(forgotten.headers["location"].removeprefix("/ui")).text
    assert re.search(r"Forgotten: \d+ items? removed\.", notice)
    assert "item(s)" not in notice


def test_the_audit_log_is_newest_first(signed_in: Dash, world: dict[str, Any]) -> None:
    a: Memory = world["a"]
    first, second = (s.id for s in a.summaries.list(user_id="alice")[:2])
    a.set_status(first, "archived", reason="first change")
    a.set_status(second, "archived", reason="second change")
    page = signed_in.get("/audit").text
    assert page.index("second change") < page.index("first change")
    assert "newest first" in page
    assert [r.reason for r in a.audit(newest_first=True)] == ["second change", "first change"]
    assert [r.reason for r in a.audit()] == ["first change", "second change"]
    assert [r.reason for r in a.audit(newest_first=True, limit=1, offset=1)] == ["first change"]


def test_a_behaviour_event_is_shown_as_an_event_of_its_type(
    signed_in: Dash, world: dict[str, Any]
) -> None:
    a: Memory = world["a"]
    added = a.sessions.get("s1").add_messages(
        [
            {
                "role": "user",
                "content": "trail running shoes",
                "event_type": "search",
                "page": "/shop/search",
            }
        ],
        sync=True,
    )
    (event_id,) = added.message_ids
    event = '<span class="badge event">search</span> event on <code>/shop/search</code>'
    messages = signed_in.get("/users/alice?tab=messages").text
    row = next(r for r in messages.split("<tr>") if "trail running shoes" in r)
    assert event in row and ">user<" not in row
    item = signed_in.get(f"/items/{event_id}").text
    assert f"<dt>From</dt><dd>{event}</dd>" in item
    # A turn is still its role's.
    said = next(r for r in messages.split("<tr>") if "nurse in Lisbon" in r)
    assert '<td data-label="Who">user</td>' in said


def test_a_topic_left_without_current_summaries_is_not_listed(
    signed_in: Dash, world: dict[str, Any]
) -> None:
    a: Memory = world["a"]
    topic = next(t for t in a.topics.list(user_id="alice") if len(t.summary_ids) == 1)
    heading = f'href="/ui/items/{topic.id}"'
    assert heading in signed_in.get("/users/alice").text
    a.set_status(topic.summary_ids[0], "deleted", reason="wrong")
    assert topic.id in [t.id for t in a.topics.list(user_id="alice")]  # the topic remains
    page = signed_in.get("/users/alice").text
    assert heading not in page and "0 summaries" not in page
