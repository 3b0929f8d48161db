"""Signing in and out, and an admin's choice of project."""

from __future__ import annotations

import hmac

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..server._throttle import Throttle, client_address
from ._render import render
from ._signin import (
    LOGIN_COOKIE,
    SESSION_COOKIE,
    Viewer,
    current_viewer,
    new_login_token,
    set_cookie,
    sign_in,
)
from ._view import Form, endpoint, error_page, root_memory, see_other

__all__ = ["routes"]

_LOGIN_COOKIE_SECONDS = 3600


def _safe_next(request: Request, value: str | None) -> str:
    """Where to go after signing in: a dashboard path, never another site."""
    base = request.scope.get("root_path", "")
    if value and value.startswith(base + "/") and not value.startswith("//") and "\\" not in value:
        return value[len(base) :]
    return "/"


def _login_form(
    request: Request, *, status: int = 200, error: str | None = None, next_: str = ""
) -> Response:
    token = new_login_token()
    response = render(request, "login.html", status, csrf=token, error=error, next=next_)
    set_cookie(response, request, LOGIN_COOKIE, token, _LOGIN_COOKIE_SECONDS)
    return response


async def login_page(request: Request) -> Response:
    viewer = await run_in_threadpool(current_viewer, request, root_memory(request))
    if viewer is not None:
        return see_other(request, "/")
    return _login_form(request, next_=request.query_params.get("next", ""))


async def login(request: Request) -> Response:
    try:
        form = await request.form(max_files=0, max_fields=10)
    except Exception:  # multipart's own errors: a malformed or oversized form
        return _login_form(request, status=400, error="The form could not be read.")
    given, expected = form.get("csrf"), request.cookies.get(LOGIN_COOKIE)
    if (
        not isinstance(given, str)
        or not expected
        or not hmac.compare_digest(given.encode(), expected.encode())
    ):
        return _login_form(
            request, status=403, error="The sign-in form expired. Please sign in again."
        )
    secret = form.get("key")
    next_ = form.get("next")
    next_ = next_ if isinstance(next_, str) else ""
    if not isinstance(secret, str) or not secret.strip():
        return _login_form(request, status=400, error="Enter an API key.", next_=next_)
    settings = request.app.state.settings
    throttle: Throttle = request.app.state.throttle
    address = client_address(request)
    wait = throttle.wait_seconds("sign_in", address)
    if wait:  # the right key too: a guesser must not learn it hit while held back
        response = _login_form(
            request,
            status=429,
            error=f"Too many failed sign-ins from your address. Try again in {wait} s.",
            next_=next_,
        )
        response.headers["Retry-After"] = str(wait)
        return response
    ttl = max(1, round(settings.ui_session_hours * 3600))
    token = await run_in_threadpool(sign_in, request, root_memory(request), secret, ttl)
    if token is None:
        throttle.failed("sign_in", address)
        # One answer for unknown, revoked and malformed keys, as the API gives.
        return _login_form(request, status=401, error="That key was not accepted.", next_=next_)
    response = see_other(request, _safe_next(request, next_))
    set_cookie(response, request, SESSION_COOKIE, token, ttl)
    response.delete_cookie(LOGIN_COOKIE, path=request.scope.get("root_path") or "/")
    return response


def _logout(request: Request, viewer: Viewer, form: Form) -> Response:
    root_memory(request).dashboard_sessions.delete(viewer.token)
    response = see_other(request, "/login")
    response.delete_cookie(SESSION_COOKIE, path=request.scope.get("root_path") or "/")
    return response


def _projects(request: Request, viewer: Viewer, form: Form) -> Response:
    if not viewer.admin:
        return see_other(request, "/")
    return render(
        request, "projects.html", viewer=viewer, projects=root_memory(request).projects.list()
    )


def _choose_project(request: Request, viewer: Viewer, form: Form) -> Response:
    if not viewer.admin:
        return error_page(request, viewer, 403, "Only the admin token can switch projects.")
    root = root_memory(request)
    project = root.projects.get(form.get("project_id", ""))
    root.dashboard_sessions.set_project(viewer.token, project.id)
    return see_other(request, "/")


routes = [
    Route("/login", login_page, methods=["GET"]),
    Route("/login", login, methods=["POST"]),
    Route("/logout", endpoint(_logout, post=True, needs_project=False), methods=["POST"]),
    Route("/projects", endpoint(_projects, needs_project=False), methods=["GET"]),
    Route("/projects", endpoint(_choose_project, post=True, needs_project=False), methods=["POST"]),
]
