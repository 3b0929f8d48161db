"""Input no store can hold, over HTTP against a real `stratamem serve` process, each backend.

A lone UTF-16 surrogate (a JSON ``"\\ud800"`` escape, or the raw bytes ED A0 80) in any text
field, and percent-escapes that are not UTF-8 (``%ED%A0%80``) in a path or query string,
are a 422 naming the field, with an error body that is valid UTF-8 JSON, and nothing is
stored. Numbers beyond 64 bits in metadata filters and epoch seconds beyond year 9999 answer
alike on both backends.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from server_proc import ServerProcess, client

pytestmark = pytest.mark.slow

ADMIN = "admin-" + secrets.token_hex(8)
LONE = "\ud800"
BAD = "%ED%A0%80"  # the UTF-8-like bytes of U+D800: not UTF-8
MSG = {"role": "user", "content": "hello"}


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory, module_db_url: str) -> Iterator[ServerProcess]:
    proc = ServerProcess(
        tmp_path_factory.mktemp("server"),
        db_url=module_db_url,
        env={"STRATAMEM_ADMIN_TOKEN": ADMIN},
    ).start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def api(srv: ServerProcess) -> Iterator[httpx.Client]:
    with client(srv.url, srv.bootstrap_key()) as c:
        yield c


def _send(c: httpx.Client, method: str, path: str, body: Any = None) -> httpx.Response:
    if body is None:
        return c.request(method, path)
    # json.dumps writes a lone surrogate as the escape "\ud800"; bytes are sent as they are.
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return c.request(method, path, content=content, headers={"Content-Type": "application/json"})


def _held(c: httpx.Client) -> dict[str, Any]:
    """What a refused request could have written in the key's project."""

    def items(path: str) -> Any:
        r = c.get(path, params={"limit": 1000})
        assert r.status_code == 200, r.text
        return r.json()["data"]["items"]

    return {
        "sessions": items("/api/sessions"),
        # Ids only: the worker may be processing earlier tests' messages meanwhile.
        "messages": [
            [m["id"] for m in items(f"/api/sessions/{s['id']}/messages")]
            for s in items("/api/sessions")
        ],
        "webhooks": items("/api/webhooks"),
        "audit": items("/api/audit"),
    }


def _refused(r: httpx.Response, field: str) -> None:
    assert r.status_code == 422, r.text
    body = json.loads(r.content.decode("utf-8"))  # strict UTF-8, as any client decodes it
    assert body["success"] is False and body["error"]["code"] == "validation_error", body
    named = [p["field"] for p in body["error"]["problems"]]
    assert any(f.startswith(field) for f in named), body["error"]


SID = "/api/sessions/s1"
# (method, path, JSON body or raw bytes, the field the 422 must name)
CASES: list[tuple[str, str, Any, str]] = [
    ("POST", "/api/sessions", {"user_id": f"u{LONE}"}, "user_id"),
    ("POST", "/api/sessions", {"user_id": "u", "session_id": LONE}, "session_id"),
    ("POST", "/api/sessions", {"user_id": "u", "title": f"trip {LONE}"}, "title"),
    ("POST", "/api/sessions", {"user_id": "u", "metadata": {"a": [{"b": LONE}]}}, "metadata"),
    ("POST", "/api/sessions", {"user_id": "u", "metadata": {LONE: 1}}, "metadata"),
    ("POST", "/api/sessions", b'{"user_id": "u", "title": "\xed\xa0\x80"}', "title"),
    ("POST", f"{SID}/messages", {"user_id": LONE, "messages": [MSG]}, "user_id"),
    (
        "POST",
        f"{SID}/messages",
        {"user_id": "u", "messages": [MSG, {**MSG, "content": f"x {LONE}"}]},
        "messages[1].content",
    ),
    *(
        (
            "POST",
            f"{SID}/messages",
            {"user_id": "u", "messages": [{**MSG, k: v}]},
            f"messages[0].{k}",
        )
        for k, v in (
            ("metadata", {"k": {"nested": ["\udfff"]}}),
            ("page", LONE),
            ("name", LONE),
            ("event_type", LONE),
            ("id", LONE),
            ("process_id", LONE),
            ("timestamp", LONE),
        )
    ),
    ("POST", f"/api/sessions/{BAD}/messages", {"user_id": "u", "messages": [MSG]}, "session_id"),
    ("POST", "/api/user/actions", {"user_id": LONE, "event_type": "view"}, "user_id"),
    ("POST", "/api/user/actions", {"user_id": "u", "event_type": LONE}, "event_type"),
    ("POST", "/api/user/actions", {"user_id": "u", "event_type": "v", "page": LONE}, "page"),
    ("POST", "/api/user/actions", {"user_id": "u", "event_type": "v", "content": LONE}, "content"),
    (
        "POST",
        "/api/user/actions",
        {"user_id": "u", "event_type": "v", "metadata": {"k": LONE}},
        "metadata",
    ),
    (
        "POST",
        "/api/user/actions",
        {"user_id": "u", "event_type": "v", "session_id": LONE},
        "session_id",
    ),
    (
        "POST",
        "/api/user/actions",
        {"user_id": "u", "events": [{"event_type": "v"}, {"event_type": "v", "id": LONE}]},
        "events[1].id",
    ),
    ("POST", "/api/users/u/search", {"query": f"q {LONE}"}, "query"),
    ("POST", "/api/users/u/search", {"query": "q", "filters": {"k": LONE}}, "filters"),
    ("POST", "/api/users/u/search", {"query": "q", "filters": {"k": {"$in": [LONE]}}}, "filters"),
    ("POST", "/api/users/u/search", {"query": "q", "event_types": [LONE]}, "event_types"),
    ("POST", "/api/users/u/search", {"query": "q", "session_id": LONE}, "session_id"),
    ("POST", "/api/users/u/search", {"query": "q", "since": LONE}, "since"),
    ("POST", f"/api/users/{BAD}/search", {"query": "q"}, "user_id"),
    (
        "POST",
        "/api/users/u/search?x=1",
        {"query": "q", "recall_config": {LONE: 1}},
        "recall_config",
    ),
    ("POST", f"{SID}/context", {"query": LONE}, "query"),
    ("POST", f"{SID}/context", {"metadata_filters": {"k": LONE}}, "metadata_filters"),
    (
        "POST",
        f"{SID}/context",
        {"recall_config": {"MetadataFilters": {"k": LONE}}},
        "recall_config",
    ),
    ("POST", f"{SID}/context?query={BAD}", None, "query"),
    ("GET", f"{SID}/context?query={BAD}", None, "query"),
    ("GET", f"{SID}/context?query=ok&details=true&{BAD}=1", None, "\\xed"),
    ("GET", f"/api/sessions/{BAD}/context?query=q", None, "session_id"),
    ("GET", f"/api/sessions/{BAD}", None, "session_id"),
    ("GET", f"/api/sessions?user_id={BAD}", None, "user_id"),
    ("GET", f"/api/messages/{BAD}", None, "message_id"),
    ("GET", f"/api/facts/{BAD}", None, "fact_id"),
    ("GET", f"/api/users/{BAD}/facts", None, "user_id"),
    ("GET", f"/api/users/u/facts?metadata={BAD}", None, "metadata"),
    ("GET", "/api/users/u/facts?metadata=%7B%22k%22%3A%22%5Cud800%22%7D", None, "metadata"),
    ("GET", f"/api/users/u/summaries?since={BAD}", None, "since"),
    ("PATCH", "/api/summaries/s_x", {"status": "archived", "reason": f"why {LONE}"}, "reason"),
    ("POST", "/api/forget", {"user_id": "u", "session_id": "s1", "reason": LONE}, "reason"),
    ("POST", "/api/forget", {"user_id": "u", "message_ids": ["m", LONE]}, "message_ids"),
    ("POST", "/api/forget", {"user_id": "u", "topic_id": LONE}, "topic_id"),
    ("DELETE", f"/api/users/u?reason={BAD}", None, "reason"),
    ("GET", f"/api/users/{BAD}/export", None, "user_id"),
    (
        "POST",
        "/api/webhooks",
        {"resource": "fact", "event": "after_llm", "target_url": f"https://example.com/{LONE}"},
        "target_url",
    ),
    (
        "POST",
        "/api/webhooks",
        {"resource": "fact", "event": "after_llm", "target_url": "https://e.com/", "name": LONE},
        "name",
    ),
    ("PATCH", "/api/webhooks/wh_x", {"name": LONE}, "name"),
]


@pytest.mark.parametrize(("method", "path", "body", "field"), CASES)
def test_text_no_store_can_hold_is_a_422_naming_the_field(
    api: httpx.Client, method: str, path: str, body: Any, field: str
) -> None:
    before = _held(api)
    _refused(_send(api, method, path, body), field)
    assert _held(api) == before


def test_admin_routes_refuse_it_too(srv: ServerProcess) -> None:
    with httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {ADMIN}"}) as a:
        projects = a.get("/admin/projects").json()["data"]
        _refused(_send(a, "POST", "/admin/projects", {"name": f"Acme {LONE}"}), "name")
        _refused(
            _send(a, "POST", "/admin/projects", {"name": "A", "project_id": LONE}), "project_id"
        )
        _refused(_send(a, "POST", "/admin/projects/default/keys", {"name": LONE}), "name")
        _refused(a.get(f"/admin/projects/{BAD}"), "project_id")
        assert a.get("/admin/projects").json()["data"] == projects


def test_valid_unicode_is_stored_and_echoed_as_sent(api: httpx.Client) -> None:
    # A surrogate pair is one character (U+1F600); U+FFFD sent as UTF-8 is text like any other.
    r = _send(api, "POST", "/api/sessions", {"user_id": "uni", "title": "\ud83d\ude00 \ufffd"})
    assert r.status_code == 200, r.text
    assert r.json()["data"]["title"] == "😀 \ufffd"
    r = api.get("/api/sessions", params={"user_id": "uni"})
    assert [s["title"] for s in r.json()["data"]["items"]] == ["😀 \ufffd"]


# -- numbers and times that the backends used to read differently ---------------------------


def test_huge_numbers_in_filters_answer_alike_on_search_and_lists(api: httpx.Client) -> None:
    big = 2**63 + 1
    r = _send(
        api,
        "POST",
        "/api/sessions/nums/messages",
        {
            "user_id": "nums",
            "sync": True,
            "messages": [
                {
                    "id": "n-big",
                    "role": "user",
                    "content": "I live in Berlin",
                    "metadata": {"n": big},
                },
                {
                    "id": "n-small",
                    "role": "user",
                    "content": "I live in Paris",
                    "metadata": {"n": 5},
                },
            ],
        },
    )
    assert r.status_code == 200, r.text

    def found(flt: dict[str, Any]) -> set[str]:
        body = {"query": "where do I live", "layers": ["message"], "filters": flt}
        r = _send(api, "POST", "/api/users/nums/search", body)
        assert r.status_code == 200, r.text
        return {h["id"] for h in r.json()["data"]}

    assert found({"n": {"$gt": 2**63}}) == {"n-big"}
    assert found({"n": big}) == {"n-big"}
    assert found({"n": 2**63}) == set()  # 2**63 + 1 is not 2**63, on SQLite too
    assert found({"n": {"$lt": 10**400}}) == {"n-big", "n-small"}
    assert found({"n": {"$gt": 10**400}}) == set()
    assert found({"n": {"$in": [2**64, 5]}}) == {"n-small"}

    def sources(path: str, flt: dict[str, Any]) -> set[str]:
        r = api.get(f"/api/users/nums/{path}", params={"metadata": json.dumps(flt)})
        assert r.status_code == 200, r.text
        return {m for item in r.json()["data"]["items"] for m in item["message_ids"]}

    for path in ("facts", "summaries"):
        assert sources(path, {"n": {"$gte": big}}) == {"n-big"}
        assert sources(path, {"n": {"$gt": 10**400}}) == set()
        assert sources(path, {"n": {"$ne": 2**64}}) == {"n-big", "n-small"}


def test_epoch_seconds_are_seconds_whatever_their_size(api: httpx.Client) -> None:
    year_3000 = 32_503_680_000  # above 2e10, which pydantic alone would read as milliseconds

    def add(sid: str, timestamp: Any) -> httpx.Response:
        msg = {**MSG, "timestamp": timestamp}
        return _send(
            api, "POST", f"/api/sessions/{sid}/messages", {"user_id": "t", "messages": [msg]}
        )

    assert add("t1", year_3000).status_code == 200
    assert add("t1", 1_700_000_000.25).status_code == 200
    assert add("t1", "1700000001").status_code == 200  # a numeric string is seconds too
    stamps = [m["timestamp"] for m in api.get("/api/sessions/t1/messages").json()["data"]["items"]]
    assert stamps == [
        "3000-01-01T00:00:00Z",
        "2023-11-14T22:13:20.250000Z",
        "2023-11-14T22:13:21Z",
    ]
    before = _held(api)
    for bad in (253_402_300_800, -62_135_596_801, 10**400, "253402300800", True):
        r = add("t2", bad)
        _refused(r, "messages[0].timestamp")
        if not isinstance(bad, bool):
            assert "years 1 to 9999" in r.text
    r = _send(
        api,
        "POST",
        "/api/user/actions",
        {"user_id": "t", "event_type": "v", "timestamp": 253_402_300_800},
    )
    _refused(r, "timestamp")
    r = _send(api, "POST", "/api/users/t/search", {"query": "hello", "as_of": 253_402_300_800})
    _refused(r, "as_of")
    _refused(api.get("/api/users/t/facts", params={"since": "253402300800"}), "since")
    assert _held(api) == before
    r = api.get("/api/users/t/facts", params={"until": str(year_3000)})
    assert r.status_code == 200, r.text
    r = _send(api, "POST", "/api/users/t/search", {"query": "hello", "until": year_3000})
    assert r.status_code == 200, r.text


def test_the_remote_memory_refuses_it_before_sending(srv: ServerProcess, api: httpx.Client) -> None:
    from stratamem import Memory, ValidationError

    with Memory(srv.url, api_key=srv.bootstrap_key()) as remote:
        session = remote.sessions.create("remote-u", session_id="remote-s")
        before = _held(api)
        calls = [
            (lambda: remote.search(f"q {LONE}", user_id="u"), "query"),
            (lambda: remote.search("q", user_id="u", filters={"k": LONE}), "filters"),
            (lambda: session.get_memory(LONE), "query"),
            (lambda: session.add_messages([{**MSG, "content": LONE}]), "messages[0].content"),
            (
                lambda: session.add_messages([{**MSG, "metadata": {LONE: 1}}]),
                "messages[0].metadata",
            ),
            (lambda: remote.sessions.create("u", title=LONE), "title"),
            (lambda: remote.sessions.create("u", metadata={"k": [LONE]}), "metadata"),
            (lambda: remote.facts.list(user_id="u", metadata_filters={"k": LONE}), "metadata"),
            (lambda: remote.forget(user_id="u", session_id="remote-s", reason=LONE), "reason"),
        ]
        for call, field in calls:
            with pytest.raises(ValidationError) as info:
                call()
            assert any(p.startswith(field) for p in info.value.problems), info.value.problems
    assert _held(api) == before


# -- what a refusal quotes of its input --------------------------------------------------------

HUGE = "h" * 60_000  # under httpx's longest URL (64 KiB), far over any id


def _quotes_little(r: httpx.Response, where: str) -> None:
    assert 400 <= r.status_code < 500, (where, r.status_code)
    assert len(r.content) < 2000, (where, r.status_code, len(r.content), r.text[:200])


def test_a_refusal_quotes_little_of_a_huge_value(srv: ServerProcess, api: httpx.Client) -> None:
    """Every path parameter of every route, and every string query parameter, given a 60 KB
    value: the refusal quotes at most a few dozen characters of it, never all of it."""
    spec = api.get("/openapi.json").json()
    admin = {"Authorization": f"Bearer {ADMIN}"}
    tried = 0
    for template, operations in spec["paths"].items():
        for method, op in operations.items():
            params = op.get("parameters", [])
            path_names = [p["name"] for p in params if p["in"] == "path"]
            strings = [
                p["name"]
                for p in params
                if p["in"] == "query" and "string" in json.dumps(p.get("schema", {}))
            ]
            headers = admin if template.startswith("/admin") else {}
            for name in path_names:
                path = template
                for other in path_names:
                    path = path.replace("{" + other + "}", HUGE if other == name else "x1")
                body = {} if method in ("post", "put", "patch") else None
                r = api.request(method.upper(), path, json=body, headers=headers)
                _quotes_little(r, f"{method} {template} {name}")
                tried += 1
            if strings and not path_names:
                for name in strings:
                    r = api.request(method.upper(), template, params={name: HUGE}, headers=headers)
                    _quotes_little(r, f"{method} {template} ?{name}")
                    tried += 1
    body = {"user_id": HUGE, "session_id": HUGE}
    _quotes_little(api.post("/api/sessions", json=body), "POST /api/sessions")
    search = {"query": "x", "since": HUGE, "metadata_filters": {"k": {"$gt": HUGE}}}
    _quotes_little(api.post("/api/users/u1/search", json=search), "POST search")
    assert tried > 20
