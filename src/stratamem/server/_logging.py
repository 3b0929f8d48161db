"""Request ids, structured access logs, and the last line of defence against 500 tracebacks.

Written as plain ASGI middleware (not Starlette's BaseHTTPMiddleware) so it sees every
request, including those refused before routing, without buffering response bodies.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import uuid
from typing import Any

from starlette.routing import Match, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import _tracing
from ._errors import error_body

__all__ = ["ACCESS_LOGGER", "NamedRoute", "RequestContext"]

ACCESS_LOGGER = "stratamem.access"

access_log = logging.getLogger(ACCESS_LOGGER)
log = logging.getLogger("stratamem.server")

# An incoming X-Request-ID is echoed only when it is short and plain: it ends up in logs,
# so it must not be able to forge log lines or carry arbitrary data.
_SANE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def _incoming_id(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id":
            try:
                text = value.decode("ascii")
            except UnicodeDecodeError:
                return None
            return text if _SANE_ID.match(text) else None
    return None


class NamedRoute(Route):
    """A Starlette route that names itself in the request's scope, as FastAPI's routes
    do: the access log and the request's span and metric then say its template
    (``/v1/{path}``, ``/mcp/users/{user_id}``), never the raw path."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child = super().matches(scope)
        if match is not Match.NONE:
            child["route"] = self
        return match, child


class RequestContext:
    """Gives each request an id (``X-Request-ID``), logs one JSON line when it ends, and
    turns an exception that escaped every handler into a 500 envelope quoting the id."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        request_id = _incoming_id(scope) or uuid.uuid4().hex
        state: dict[str, Any] = scope.setdefault("state", {})
        state["request_id"] = request_id
        status = 500
        response_started = False

        async def send_with_id(message: Message) -> None:
            nonlocal status, response_started
            if message["type"] == "http.response.start":
                response_started = True
                status = message["status"]
                headers = list(message.get("headers", []))
                # A response that names its own id keeps it: the proxy relays the
                # upstream's, which the caller's SDK reports (a second one would be merged).
                if not any(name.lower() == b"x-request-id" for name, _ in headers):
                    headers.append((b"x-request-id", request_id.encode()))
                    message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            log.exception("request %s failed", request_id)
            if not response_started:
                body = json.dumps(
                    error_body(
                        500,
                        f"internal error (request id {request_id})",
                        request_id=request_id,
                    )
                ).encode()
                await send_with_id(
                    {
                        "type": "http.response.start",
                        "status": 500,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                        ],
                    }
                )
                await send_with_id({"type": "http.response.body", "body": body})
        finally:
            route = scope.get("route")
            line = {
                "request_id": request_id,
                "method": scope.get("method"),
                # The route's template, not the raw path: ids stay out of the log.
                "path": getattr(route, "path_format", None),
                "status": status,
                "duration_ms": round((time.perf_counter() - started) * 1000, 2),
                "project_id": state.get("project_id"),
                "pid": os.getpid(),  # which process answered, with --processes above 1
            }
            trace_id = _tracing.current_trace_id()
            if trace_id is not None:  # the request's trace: from a log line to its spans
                line["trace_id"] = trace_id
            access_log.info(json.dumps(line))
