"""Every route of the REST server × every kind of credential, generated from its OpenAPI document.

The routes come from ``app.openapi()``, so a route added later is in the matrix at once; one
whose path parameters or body the tables below cannot fill is an error (add a row), never a
skip. Each (route, credential) must answer what docs/server.md promises:

- the owning project's key, ``Api-Key`` and ``Bearer`` forms: the route's documented 2xx;
- another project's key: exactly what that project gets for ids that exist nowhere (404 or
  the same success, the same body up to the ids asked about, times and generated ids), and
  no answer carries anything of the owner's data;
- no header, malformed headers (wrapping the right secret, so only the form is wrong), an
  unknown or revoked key, the admin token as a key, a project key on /admin: a 401 challenge,
  the same for a revoked key as for an unknown one;
- with the admin API disabled, every /admin route answers 403 to everyone.

The owner's data (two users with sessions, messages, facts, summaries, topics and audit
records; webhooks with deliveries; keys) is read before and after every refused and foreign
request and must be unchanged. The accepted requests run after that check, those that
destroy ids other rows use at the very end. One in-process app over a real Memory per
backend: about a thousand requests in a few seconds.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import httpx
import pytest
from fastapi.testclient import TestClient

from fakes.webhook_receiver import WebhookReceiver
from stratamem.server import ServerSettings, create_app

# Shaped like an API key, so the admin-token-as-key rows are refused by the key lookup and
# not merely by the prefix check in front of it.
ADMIN = "sm_admin" + secrets.token_urlsafe(24)
OWNER = "proj-" + secrets.token_hex(4)
CANARY = "canary" + secrets.token_hex(6)
TEXTS = (
    "I live in Lisbon with my partner.",
    "I am allergic to peanuts.",
    "I love hiking in the Alps every summer.",
)
# Only the owner's data holds these: no answer to anyone else may carry one.
CANARIES = (CANARY, OWNER, "Lisbon", "peanuts", "Alps", "hiking")
FORMS = ("Api-Key", "Bearer")

Ids = dict[str, str]
Fill = Callable[[Ids], Any]
Role = Literal["owner", "other", "admin", "refused"]

PUBLIC = {"GET /healthz"}

# The kind of id each path parameter takes; a parameter not here is an error.
PATH_IDS = {
    "session_id": "session",
    "user_id": "user",
    "message_id": "message",
    "fact_id": "fact",
    "summary_id": "summary",
    "topic_id": "topic",
    "hook_id": "webhook",
    "project_id": "project",
    "key_id": "key",
}
# Query parameters that are filled (ids, so they are tried across projects, and the text of
# a query); other optional ones are left out, a required one not here is an error.
QUERY: dict[str, Fill] = {
    "user_id": lambda i: i["user"],
    "query": lambda i: "where does the user live",
}
# A valid body for each request schema, by variant ("" when there is one); a schema not here
# is an error. Client-chosen ids (sessions, messages) are the owner's, so another project
# that reuses them must get a thing of its own. Writes are sync: nothing is still being
# processed when later rows run.
BODIES: dict[str, dict[str, Fill]] = {
    "CreateSession": {"": lambda i: {"user_id": i["user"], "session_id": i["session"]}},
    "AddMessages": {
        "": lambda i: {"messages": [{"role": "user", "content": "a probe"}], "sync": True},
        # The owner's message resent (a duplicate for the owner, new anywhere else).
        "user_id": lambda i: {
            "user_id": i["user"],
            "messages": [{"role": "user", "content": TEXTS[0], "id": i["message"]}],
            "sync": True,
        },
    },
    "ContextRequest": {"": lambda i: {"query": "where does the user live", "details": True}},
    "UserActions": {
        "": lambda i: {
            "user_id": i["user"],
            "session_id": i["session"],
            "event_type": "view",
            "sync": True,
        }
    },
    "SearchRequest": {"": lambda i: {"query": "where does the user live"}},
    "SummaryStatusChange": {"": lambda i: {"status": "deprioritized", "reason": "matrix"}},
    "ForgetScope": {
        "message_ids": lambda i: {"user_id": i["user"], "message_ids": [i["message"]]},
        "topic_id": lambda i: {"user_id": i["user"], "topic_id": i["topic"]},
        "session_id": lambda i: {"user_id": i["user"], "session_id": i["session"]},
    },
    "CreateProject": {"": lambda i: {"name": "matrix", "project_id": i["project"]}},
    "CreateKey": {"": lambda i: {"name": "matrix"}},
    "CreateWebhook": {
        "": lambda i: {
            "resource": "topic",
            "event": "before_add",
            # Disabled: never called, so its host is never resolved.
            "target_url": "https://hooks.example.com/matrix",
            "enabled": False,
        }
    },
    "UpdateWebhook": {"": lambda i: {"timeout_ms": 2000}},
    "RotateSecret": {"": lambda i: {"grace_seconds": 60}},
}
# Accepted rows that destroy ids other rows use run last, in this order.
TAIL = (
    "POST /api/forget (message_ids)",
    "POST /api/forget (topic_id)",
    "POST /api/forget (session_id)",
    "DELETE /api/webhooks/{hook_id}",
    "DELETE /admin/keys/{key_id}",
    "DELETE /api/users/{user_id}",
)


@dataclass(frozen=True)
class Row:
    """One request of the matrix: a route and, for a body with variants, which one."""

    method: str
    path: str
    operation: dict[str, Any]
    variant: str = ""

    @property
    def label(self) -> str:
        route = f"{self.method} {self.path}"
        return f"{route} ({self.variant})" if self.variant else route

    @property
    def kind(self) -> Literal["public", "api", "admin"]:
        if f"{self.method} {self.path}" in PUBLIC:
            return "public"
        if self.path.startswith("/admin/"):
            return "admin"
        if self.path.startswith("/api/"):
            return "api"
        raise LookupError(f"{self.label}: not under /api or /admin; add it to PUBLIC if open")

    @property
    def success(self) -> int:
        (status,) = [int(s) for s in self.operation["responses"] if s.startswith("2")]
        return status

    def request(self, ids: Ids) -> tuple[str, dict[str, Any]]:
        """The path and httpx arguments of this row for the given ids."""
        path, params = self.path, {}
        for p in self.operation.get("parameters", []):
            name, where = p["name"], p["in"]
            if where == "path" and name in PATH_IDS:
                path = path.replace(f"{{{name}}}", ids[PATH_IDS[name]])
            elif where == "query" and name in QUERY:
                params[name] = QUERY[name](ids)
            elif where == "path" or p.get("required"):
                raise LookupError(f"{self.label}: no fill for {where} parameter {name!r}")
        kwargs: dict[str, Any] = {"params": params}
        if "requestBody" in self.operation:
            kwargs["json"] = BODIES[body_schema(self)][self.variant](ids)
        return path, kwargs


def body_schema(row: Row) -> str:
    content = row.operation["requestBody"]["content"]
    if set(content) != {"application/json"}:
        raise LookupError(f"{row.label}: a body that is not JSON: {sorted(content)}")
    schema = content["application/json"]["schema"]
    refs = [s["$ref"] for s in schema.get("anyOf", [schema]) if "$ref" in s]  # optional bodies
    if len(refs) != 1:
        raise LookupError(f"{row.label}: cannot name the body schema {schema}")
    name = str(refs[0]).rsplit("/", 1)[1]
    if name not in BODIES:
        raise LookupError(f"{row.label}: no body for schema {name!r}; add it to BODIES")
    return name


def rows(openapi: dict[str, Any]) -> list[Row]:
    out = []
    for path, operations in openapi["paths"].items():
        for method, operation in operations.items():
            row = Row(method.upper(), path, operation)
            if row.kind != "public" and not operation.get("security"):
                raise LookupError(f"{row.label}: the OpenAPI document declares no security")
            variants = list(BODIES[body_schema(row)]) if "requestBody" in operation else [""]
            out += [Row(row.method, path, operation, v) for v in variants]
    return out


@dataclass(frozen=True)
class Cred:
    label: str
    role: Role
    # The Authorization header; for role "other", the scheme a fresh project's key follows.
    header: str | bytes | None
    # Which of the owner's two data sets the row uses, so each form can destroy its own.
    form: str = "Api-Key"


def credentials(owner_key: str, revoked: str, right: str) -> list[Cred]:
    """Every kind of credential; ``right`` is what the route takes (the admin token on
    /admin, the owner's key on /api), which the malformed headers wrap."""
    return [
        *(Cred(f"owner's key ({f})", "owner", f"{f} {owner_key}", f) for f in FORMS),
        *(Cred(f"another project's key ({f})", "other", f, f) for f in FORMS),
        *(Cred(f"admin token ({f})", "admin", f"{f} {ADMIN}", f) for f in FORMS),
        Cred("no header", "refused", None),
        Cred("empty header", "refused", ""),
        Cred("scheme only", "refused", "Bearer "),
        Cred("wrong scheme", "refused", f"Basic {right}"),
        Cred("no scheme", "refused", right),
        Cred("two values", "refused", f"Api-Key {right} {right}"),
        Cred("garbage", "refused", "Api-Key \"'%;--<>{}"),
        Cred("unknown key", "refused", "Api-Key sm_" + secrets.token_urlsafe(32)),
        Cred("very long", "refused", f"Bearer {right}{'A' * 65_536}"),
        Cred("non-ASCII", "refused", f"Api-Key {right}ключ".encode()),
        Cred("control characters", "refused", f"Api-Key {right}\x00\x1b\x7f".encode("latin-1")),
        Cred("revoked key", "refused", f"Api-Key {revoked}"),
    ]


def expected(row: Row, role: Role) -> int | None:
    """The documented status of ``row`` for ``role``; None: as for ids that exist nowhere."""
    if row.kind == "public":
        return row.success
    if role == ("admin" if row.kind == "admin" else "owner"):
        return row.success
    if role == "other" and row.kind == "api":
        return None
    return 401


# What differs between two otherwise equal answers: when, and what the server generated.
_VOLATILE_KEYS = {"request_id", "job_id", "secret", "latency_ms"}
_GENERATED = re.compile(r"\b[a-z]+_[0-9a-f]{16,}\b|\d{4}-\d\d-\d\dT[0-9:.]+Z")


def _normal(r: httpx.Response, ids: Ids) -> Any:
    """The answer with the ids it was asked about replaced by their kind, the rest of what
    varies between requests blanked."""
    text = r.text
    for value, kind in sorted(((v, k) for k, v in ids.items()), key=lambda vk: -len(vk[0])):
        text = text.replace(value, f"<{kind}>")

    def blank(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: None if k in _VOLATILE_KEYS else blank(x) for k, x in v.items()}
        return [blank(x) for x in v] if isinstance(v, list) else v

    return blank(json.loads(_GENERATED.sub("<generated>", text)))


def _problem(r: httpx.Response, want: int) -> str | None:
    """What is wrong with ``r`` as the documented answer of status ``want``, if anything."""
    if r.status_code != want:
        return f"expected {want}"
    try:
        body = r.json()
    except ValueError:
        return "not JSON"
    if not isinstance(body, dict) or body.get("success") is not (want < 400):
        return "not an envelope of its status"
    if want >= 400 and body["error"]["request_id"] != r.headers.get("x-request-id"):
        return "an error without its request id"
    if want == 401 and "www-authenticate" not in r.headers:
        return "a 401 without a challenge"
    return None


class Matrix:
    def __init__(self, tc: TestClient, mem: Any, sets: dict[str, Ids]) -> None:
        self.tc, self.mem, self.sets = tc, mem, sets
        self.failures: list[str] = []
        self.cells = 0
        self.refusals: dict[tuple[str, str], Any] = {}
        self._intruders = 0

    def report(self) -> str:
        return f"{len(self.failures)} of {self.cells} cells:\n" + "\n".join(self.failures)

    def send(self, row: Row, ids: Ids, header: str | bytes | None) -> httpx.Response:
        path, kwargs = row.request(ids)
        headers = {} if header is None else {"Authorization": header}
        return self.tc.request(row.method, path, headers=headers, **kwargs)

    def fail(self, row: Row, cred: Cred, why: str, r: httpx.Response) -> None:
        self.failures.append(
            f"{row.label} × {cred.label}: {why}; got {r.status_code} {r.text[:300]}"
        )

    def run(self, row: Row, cred: Cred, want: int | None) -> None:
        self.cells += 1
        if want is None:
            self._foreign(row, cred)
            return
        r = self.send(row, self.sets[cred.form], cred.header)
        if want != row.success:
            self._no_canary(row, cred, r)
        problem = _problem(r, want)
        if problem:
            self.fail(row, cred, problem, r)
        elif want == 401:
            self.refusals[(row.label, cred.label)] = _normal(r, {})

    def _foreign(self, row: Row, cred: Cred) -> None:
        ids = self.sets[cred.form]
        header = f"{cred.header} {self._intruder_key()}"
        # Ids of this row only (earlier rows created things under theirs).
        absent = {kind: f"nowhere{self._intruders}-{kind}" for kind in ids}
        nowhere = self.send(row, absent, header)
        r = self.send(row, ids, header)
        for what, answer in (("for ids that exist nowhere", nowhere), ("for the owner's", r)):
            self._no_canary(row, cred, answer)
            problem = _problem(answer, 404 if answer.status_code == 404 else row.success)
            if problem:
                self.fail(row, cred, f"{problem} (or 404) {what}", answer)
        if _normal(r, ids) != _normal(nowhere, absent):
            why = f"not the answer for ids that exist nowhere ({nowhere.text[:300]})"
            self.fail(row, cred, why, r)

    def _intruder_key(self) -> str:
        """A key of a project of its own with nothing in it yet: each foreign row starts
        clean, whatever the rows before it created."""
        self._intruders += 1
        pid = f"intruder-{self._intruders}"
        self.mem.projects.create(pid, project_id=pid)
        return str(self.mem.keys.create(pid, name="intruder")[1])

    def _no_canary(self, row: Row, cred: Cred, r: httpx.Response) -> None:
        leaked = [c for c in CANARIES if c in r.text]
        if leaked:
            self.fail(row, cred, f"the owner's data in the answer: {leaked}", r)


# -- the owner's data -------------------------------------------------------------------------


def _data(r: httpx.Response, status: int = 200) -> Any:
    assert r.status_code == status, r.text
    return r.json()["data"]


class Owner:
    """The project whose data everyone else tries to reach, made through the API."""

    def __init__(self, tc: TestClient, receiver: WebhookReceiver) -> None:
        self.tc = tc
        self.admin = {"Authorization": f"Bearer {ADMIN}"}
        # Made with the admin token: the admin-as-key rows try a live one.
        self._admin("POST", "/admin/projects", {"name": CANARY, "project_id": OWNER}, 201)
        self.key = self._new_key()["secret"]
        self.auth = {"Authorization": f"Api-Key {self.key}"}
        # The revoked key worked on the owner's data until it was revoked.
        revoked = self._new_key()
        self.revoked = revoked["secret"]
        me = tc.get("/api/project", headers={"Authorization": f"Api-Key {self.revoked}"})
        assert _data(me)["project_id"] == OWNER
        assert self._admin("DELETE", f"/admin/keys/{revoked['key']['id']}")["revoked_at"]

        hook = {"resource": "fact", "event": "before_add", "target_url": receiver.url("/owner")}
        hooks = [self._post("/api/webhooks", {**hook, "name": f"{CANARY} {f}"}, 201) for f in FORMS]
        self.sets = {
            form: self._fill(form, created["webhook"]["id"])
            for form, created in zip(FORMS, hooks, strict=True)
        }
        for ids in self.sets.values():  # each hook was called for both users' batches
            deliveries = tc.get(f"/api/webhooks/{ids['webhook']}/deliveries", headers=self.auth)
            assert len(_data(deliveries)["items"]) == 2

    def _admin(self, method: str, path: str, body: Any = None, status: int = 200) -> Any:
        return _data(self.tc.request(method, path, json=body, headers=self.admin), status)

    def _new_key(self) -> dict[str, Any]:
        return dict(self._admin("POST", f"/admin/projects/{OWNER}/keys", {}, 201))

    def _post(self, path: str, body: dict[str, Any], status: int = 200) -> Any:
        return _data(self.tc.post(path, json=body, headers=self.auth), status)

    def _fill(self, form: str, hook: str) -> Ids:
        user = f"user-{form.lower()}"
        session = f"{user}-thread"
        meta = {"canary": CANARY}
        self._post(
            "/api/sessions",
            {"user_id": user, "session_id": session, "title": CANARY, "metadata": meta},
        )
        messages = [
            {"role": "user", "content": t, "id": f"{user}-{n}", "metadata": meta}
            for n, t in enumerate(TEXTS)
        ]
        added = self._post(
            f"/api/sessions/{session}/messages", {"messages": messages, "sync": True}
        )
        assert added["processed"]

        def items(layer: str) -> list[dict[str, Any]]:
            found = _data(self.tc.get(f"/api/users/{user}/{layer}", headers=self.auth))["items"]
            assert len(found) == len(TEXTS), found
            return list(found)

        facts, summaries, topics = items("facts"), items("summaries"), items("topics")
        # An audit record; the rows' fact, summary and topic are the last message's, so
        # forgetting the first message leaves them for the forget-by-topic row.
        audited = {"status": "archived", "reason": CANARY}
        _data(
            self.tc.patch(f"/api/summaries/{summaries[1]['id']}", json=audited, headers=self.auth)
        )
        return {
            "user": user,
            "session": session,
            "message": messages[0]["id"],
            "fact": facts[2]["id"],
            "summary": summaries[2]["id"],
            "topic": topics[2]["id"],
            "webhook": hook,
            "project": OWNER,
            "key": self._new_key()["key"]["id"],  # revoked by the admin rows, at the end
        }

    def snapshot(self) -> dict[str, Any]:
        """Everything of the owner that its key or the admin token can read."""
        reads = ["/api/sessions", "/api/webhooks", "/api/audit"]
        for ids in self.sets.values():
            reads += [
                f"/api/users/{ids['user']}/export",
                f"/api/webhooks/{ids['webhook']}/deliveries",
            ]
        admin = [f"/admin/projects/{OWNER}", f"/admin/projects/{OWNER}/keys"]
        out = {}
        for path in reads + admin:
            body = self.tc.get(path, headers=self.admin if path in admin else self.auth).json()
            # Read times: the export's own, a key's last use (the snapshot itself uses one).
            if path.endswith("/export") and body["data"]:
                body["data"]["exported_at"] = None
            if path.endswith("/keys") and body["data"]:
                for key in body["data"]:
                    key["last_used_at"] = None
            out[path] = body
        return out


# -- the test ---------------------------------------------------------------------------------


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as r:
        yield r


def test_every_route_answers_every_credential_as_documented(
    make_memory: Callable[..., Any], receiver: WebhookReceiver
) -> None:
    mem = make_memory(webhook_allow="127.0.0.1")
    # A thousand refused credentials from one client: the limiter of failed credentials
    # (tests/test_auth_throttle.py) would answer most with 429; this matrix is about 401s.
    app = create_app(mem, ServerSettings(admin_token=ADMIN, auth_failures_burst=1_000_000))
    matrix_rows = rows(app.openapi())
    with TestClient(app, raise_server_exceptions=False) as tc:
        owner = Owner(tc, receiver)
        m = Matrix(tc, mem, owner.sets)
        creds = {
            kind: credentials(owner.key, owner.revoked, ADMIN if kind == "admin" else owner.key)
            for kind in ("public", "api", "admin")
        }
        cells = [(r, c, expected(r, c.role)) for r in matrix_rows for c in creds[r.kind]]

        # Everything refused or foreign first; then the owner's data must be as it was.
        before = owner.snapshot()
        for row, cred, want in cells:
            if want != row.success:
                m.run(row, cred, want)
        assert not m.failures, m.report()
        assert owner.snapshot() == before, "a refused or foreign request changed the owner's data"

        # The accepted rows; those that destroy what other rows use last.
        labels = {row.label for row in matrix_rows}
        assert labels.issuperset(TAIL), "TAIL names a row the API no longer has"
        order = {label: i for i, label in enumerate(TAIL, 1)}
        accepted = [cell for cell in cells if cell[2] == cell[0].success]
        for row, cred, want in sorted(accepted, key=lambda cell: order.get(cell[0].label, 0)):
            m.run(row, cred, want)

    # Without an admin token, /admin answers 403 to every credential, the old token's too.
    with TestClient(
        create_app(mem, ServerSettings(admin_token=None)), raise_server_exceptions=False
    ) as tc:
        m.tc = tc
        for row in matrix_rows:
            for cred in creds[row.kind] if row.kind == "admin" else ():
                m.run(row, cred, 403)

    assert not m.failures, m.report()
    # Nothing to probe: a revoked key gets the answer of a key that never existed.
    for row in matrix_rows:
        if row.kind != "public":
            revoked = m.refusals[(row.label, "revoked key")]
            assert revoked == m.refusals[(row.label, "unknown key")], row.label
    # The tables name nothing the API lacks, and every cell ran.
    params = [p for row in matrix_rows for p in row.operation.get("parameters", [])]
    assert {PATH_IDS[p["name"]] for p in params if p["in"] == "path"} == set(PATH_IDS.values())
    assert {body_schema(r) for r in matrix_rows if "requestBody" in r.operation} == set(BODIES)
    assert m.cells == len(cells) + sum(
        len(creds["admin"]) for r in matrix_rows if r.kind == "admin"
    )
