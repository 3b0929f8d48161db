"""What a monitoring stack reads of the server: a span and a metric per request, /metrics.

:class:`Telemetry` is plain ASGI middleware (the outermost): each HTTP request becomes an
OpenTelemetry server span that continues the caller's trace (W3C ``traceparent``, read with
the configured propagator) and is named by the route's template (``POST
/api/users/{user_id}/search``), and one observation of ``stratamem_http_request_duration
_seconds`` labelled by that template, never the raw path. :func:`metrics_route` is
``/metrics``: Prometheus' text format, behind ``metrics_token`` when one is set.
"""

from __future__ import annotations

import hmac
import time
from typing import TYPE_CHECKING, Any

from starlette.responses import PlainTextResponse, Response

from .. import _metrics, _tracing
from ..errors import ConfigError
from ._logging import NamedRoute

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from ._settings import ServerSettings

__all__ = ["Telemetry", "install", "metrics_route"]

_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_PROPAGATED = (b"traceparent", b"tracestate", b"baggage")


def _route(scope: Scope, root: str) -> str:
    """The route's template (``/api/sessions/{session_id}/context``); a mounted app's
    requests as ``<mount>/*`` (the dashboard); ``unmatched`` for paths no route took."""
    route = scope.get("route")
    template = getattr(route, "path_format", None)
    if isinstance(template, str):
        return template
    mounted = scope.get("root_path", root)
    if isinstance(mounted, str) and mounted != root:
        return f"{mounted.removeprefix(root)}/*"
    return "unmatched"


class Telemetry:
    """The request's server span and its HTTP metric."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        root = scope.get("root_path", "")
        method = scope["method"] if scope["method"] in _METHODS else "_OTHER"
        carried = {
            name.decode("latin-1"): value.decode("latin-1")
            for name, value in scope.get("headers", ())
            if name in _PROPAGATED
        }
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        attributes = {
            "http.request.method": method,
            "url.path": scope.get("path", ""),
            "url.scheme": scope.get("scheme", "http"),
        }
        with _tracing.span(
            method,
            attributes,
            kind="server",
            context=_tracing.extract(carried) if carried else None,
        ) as span:
            try:
                await self.app(scope, receive, send_status)
            finally:
                route = _route(scope, root)
                _metrics.http_request(method, route, status, time.perf_counter() - started)
                if span.is_recording():
                    span.update_name(f"{method} {route}")
                    span.set_attribute("http.route", route)
                    span.set_attribute("http.response.status_code", status)
                    if status >= 500:
                        span.set_attribute(_tracing.ERROR_TYPE, str(status))
                    request_id = scope.get("state", {}).get("request_id")
                    if request_id:
                        span.set_attribute("stratamem.request_id", request_id)


def metrics_route(settings: ServerSettings) -> NamedRoute:
    """``GET /metrics`` (the ``metrics`` setting): Prometheus' text format of this
    process's metrics; with ``metrics_token`` set, only for ``Authorization: Bearer
    <token>``. Raises ``ConfigError`` without prometheus-client."""
    try:
        _metrics.enable_prometheus()
    except ImportError:
        raise ConfigError(
            "metrics need prometheus-client: pip install 'stratamem[server]'"
        ) from None
    token = settings.metrics_token

    def scrape(request: Request) -> Response:
        if token is not None and not _bearer(request, token.get_secret_value()):
            return PlainTextResponse(
                "metrics need the metrics token: Authorization: Bearer <token>\n",
                status_code=401,
                headers={"WWW-Authenticate": 'Bearer realm="stratamem metrics"'},
            )
        body, content_type = _metrics.prometheus_exposition()
        return Response(body, media_type=content_type)

    return NamedRoute("/metrics", scrape, methods=["GET"], include_in_schema=False)


def _bearer(request: Request, expected: str) -> bool:
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        given.strip().encode(), expected.encode()
    )


def install(app: Any, settings: ServerSettings) -> None:
    """``/metrics`` when the settings ask for it, and the telemetry middleware (added last
    by the caller's order: the outermost, so it times and sees everything)."""
    if settings.metrics:
        app.router.routes.append(metrics_route(settings))
    app.add_middleware(Telemetry)
