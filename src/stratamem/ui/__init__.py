"""The dashboard: see, explain and govern a project's memory in the browser (docs/dashboard.md).

Server-rendered pages over the embedded facade, mounted by ``stratamem serve`` at ``/ui``.
Everything it needs ships in the package (templates, one stylesheet); it runs no script in
the browser, so it needs no build step and its pages allow none.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.resources import files

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..memory import Memory
from ..server._throttle import Throttle
from . import _access, _audit, _items, _overview, _recall, _users, _webhooks
from ._render import SECURITY_HEADERS
from ._view import error_page

__all__ = ["create_dashboard"]

_CSS = files("stratamem.ui").joinpath("static/dashboard.css").read_bytes()


class _SecurityHeaders:
    """Every dashboard response says: no script, no framing, no sniffing, no caching
    (a response that already chose its own caching keeps it)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {k.lower() for k, _ in headers}
                for name, value in SECURITY_HEADERS.items():
                    if name.lower().encode() not in present:
                        headers.append((name.lower().encode(), value.encode()))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, with_headers)


async def _stylesheet(request: Request) -> Response:
    return Response(_CSS, media_type="text/css", headers={"Cache-Control": "public, max-age=3600"})


async def _not_found(request: Request, exc: Exception) -> Response:
    status = getattr(exc, "status_code", 404)
    message = "No such page." if status == 404 else "That method is not allowed here."
    return error_page(request, None, status, message)


def create_dashboard(
    memory: Callable[[], Memory], settings: object, throttle: Throttle
) -> Starlette:
    """The dashboard over the Memory ``memory()`` returns, with the server's ``settings``
    (admin token, sign-in lifetime) and its limiter of failed sign-ins; mount it at
    ``/ui``."""
    app = Starlette(
        routes=[
            Route("/static/dashboard.css", _stylesheet, methods=["GET"]),
            *_access.routes,
            *_overview.routes,
            *_users.routes,
            *_items.routes,
            *_recall.routes,
            *_webhooks.routes,
            *_audit.routes,
        ],
        exception_handlers={404: _not_found, 405: _not_found},
    )
    app.state.memory = memory
    app.state.settings = settings
    app.state.throttle = throttle
    app.add_middleware(_SecurityHeaders)
    return app
