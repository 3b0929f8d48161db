"""Who is looking: dashboard sign-in, its session cookie and the CSRF token of every form.

A sign-in with a project API key (or the admin token) opens a server-side session: the
browser holds only a random token in an HttpOnly, SameSite=Strict cookie scoped to the
dashboard's path; the store keeps a hash of it, the project, the key, the expiry and the
session's CSRF token. So signing out, revoking the key or changing the admin token ends
the session on every replica at once, which a signed cookie alone could not do.

Every POST carries the session's CSRF token in a hidden field (the sign-in form, which has
no session yet, a token it got in a short-lived cookie: double submit). SameSite=Strict
already keeps other sites' forms from sending the cookie; the token also covers a
same-site attacker (another app on a sibling subdomain).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ..memory import Memory

__all__ = [
    "LOGIN_COOKIE",
    "SESSION_COOKIE",
    "Viewer",
    "admin_fingerprint",
    "csrf_matches",
    "current_viewer",
    "new_login_token",
    "set_cookie",
    "sign_in",
]

SESSION_COOKIE = "stratamem_ui"
LOGIN_COOKIE = "stratamem_ui_login"


@dataclass(frozen=True)
class Viewer:
    """A signed-in dashboard session.

    ``memory`` is the project's view (``None`` while an admin has not chosen a project);
    ``actor`` is what governance changes made through the dashboard are audited as."""

    token: str
    csrf: str
    admin: bool
    project_id: str | None
    memory: Memory | None
    actor: str
    label: str  # who, for the page header: the key's prefix or "admin"

    @property
    def project(self) -> Memory:
        """The project's memory: pages that need one are reached only once an admin has
        chosen a project (``endpoint`` sends them to the projects page before)."""
        if self.memory is None:
            raise RuntimeError("no project chosen")
        return self.memory


def admin_fingerprint(admin_token: str) -> str:
    # Stored with an admin session so that a changed admin token ends it.
    return "admin:" + hashlib.sha256(admin_token.encode()).hexdigest()[:24]


def _admin_token(request: Request) -> str | None:
    token = request.app.state.settings.admin_token
    return None if token is None else str(token.get_secret_value())


def sign_in(request: Request, root: Memory, secret: str, ttl_seconds: int) -> str | None:
    """A new session's token for ``secret`` (a project API key or the admin token), or
    ``None`` when it opens nothing."""
    secret = secret.strip()
    admin = _admin_token(request)
    sessions = root.dashboard_sessions
    if admin is not None and hmac.compare_digest(secret.encode(), admin.encode()):
        token, _ = sessions.create(
            kind="admin", key_id=admin_fingerprint(admin), project_id=None, ttl_seconds=ttl_seconds
        )
        return token
    key = root.keys.verify(secret)
    if key is None:
        return None
    token, _ = sessions.create(
        kind="key", key_id=key.id, project_id=key.project_id, ttl_seconds=ttl_seconds
    )
    return token


def current_viewer(request: Request, root: Memory) -> Viewer | None:
    """The session the request's cookie names, if it is still valid."""
    token = request.cookies.get(SESSION_COOKIE)
    if not token or len(token) > 200:
        return None
    record = root.dashboard_sessions.get(token)
    if record is None:
        return None
    if record.kind == "admin":
        admin = _admin_token(request)
        if admin is None or record.key_id != admin_fingerprint(admin):
            return None
        actor, label = "ui:admin", "admin"
    else:
        actor, label = f"ui:api_key:{record.key_id}", f"key {record.key_id}"
    pid = record.project_id
    return Viewer(
        token=token,
        csrf=record.csrf_token,
        admin=record.kind == "admin",
        project_id=pid,
        memory=None if pid is None else root.for_project(pid),
        actor=actor,
        label=label,
    )


def csrf_matches(expected: str, form: Mapping[str, Any]) -> bool:
    given = form.get("csrf")
    return isinstance(given, str) and hmac.compare_digest(given.encode(), expected.encode())


def new_login_token() -> str:
    return secrets.token_urlsafe(24)


def set_cookie(
    response: Response, request: Request, name: str, value: str, max_age: int | None
) -> None:
    """A dashboard cookie: HttpOnly, SameSite=Strict, only sent to the dashboard's paths,
    Secure when the dashboard is served over https."""
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path=request.scope.get("root_path") or "/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
