"""The FastAPI application: routes, error handlers, limits and access logs around one Memory."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI

from ..mcp._http import McpEndpoint
from ..proxy import ProjectMemories, build_proxy, refusal
from ..ui import create_dashboard
from . import (
    _routes_actions,
    _routes_admin,
    _routes_governance,
    _routes_health,
    _routes_memory,
    _routes_project,
    _routes_sessions,
    _routes_webhooks,
)
from . import _telemetry as telemetry
from ._errors import install_error_handlers
from ._limits import BodyLimit
from ._logging import NamedRoute, RequestContext
from ._settings import ServerSettings, load_server_settings
from ._throttle import Throttle
from ._urls import check_url_text

__all__ = ["create_app"]

_DESCRIPTION = """\
Long-term memory for LLM applications, as a service: sessions, messages and context in
GUMem's wire format, plus facts, summaries and topics with provenance, governance, deletion
and audit.

Authenticate with `Authorization: Api-Key <key>` (or `Bearer <key>`). Every response is an
envelope `{"success", "data", "message", "error"}`; errors carry a real status code and
`error.code`, `error.detail`, `error.problems` (the offending fields) and `error.request_id`.
"""


def create_app(memory: Any = None, settings: ServerSettings | None = None) -> FastAPI:
    """The REST API over ``memory`` (a :class:`stratamem.Memory`).

    Without ``memory`` the app opens ``Memory()`` from the ``STRATAMEM_*`` environment when
    it starts and closes it when it stops; a Memory passed in stays the caller's to close.
    ``settings`` default to :class:`ServerSettings` from the environment.
    """
    settings = settings or load_server_settings()
    owned = memory is None

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if owned:
            from ..memory import Memory

            app.state.memory = Memory()
        # Before it listens: with the proxy mounted, its first requests get memory.
        await proxy.warm_up()
        try:
            yield
        finally:
            await mcp.aclose()
            await proxy.aclose()  # stores what it captured while the memory is still open
            if owned:
                app.state.memory.close()

    app = FastAPI(
        title="stratamem",
        description=_DESCRIPTION,
        version=_routes_health._VERSION,
        lifespan=lifespan,
        # Before any route reads its parameters: bytes that are not UTF-8 are refused.
        dependencies=[Depends(check_url_text)],
    )
    app.state.memory = memory
    app.state.settings = settings
    # Failed credentials per client address: REST, /admin, MCP, the proxy, the dashboard.
    app.state.throttle = throttle = Throttle.from_settings(settings)
    install_error_handlers(app)
    for module in (
        _routes_health,
        _routes_sessions,
        _routes_actions,
        _routes_project,
        _routes_memory,
        _routes_governance,
        _routes_admin,
        _routes_webhooks,
    ):
        app.include_router(module.router)
    # MCP over streamable HTTP: /mcp/users/{user_id} (or /mcp with the user in a header).
    mcp = McpEndpoint(lambda: app.state.memory)
    for path in ("/mcp/users/{user_id:path}", "/mcp"):
        app.router.routes.append(NamedRoute(path, endpoint=mcp, methods=["GET", "POST", "DELETE"]))
    # The memory proxy: /v1/chat/completions, /v1/responses, /v1/messages (docs/proxy.md).
    proxy = build_proxy(
        settings,
        ProjectMemories(
            lambda: app.state.memory,
            check_timeout=lambda: app.state.memory.settings.capture_recall_timeout_ms / 1000,
            strict=settings.proxy_upstream_api_key is not None,
        ),
    )
    app.router.routes.extend(proxy.routes())
    # The dashboard: server-rendered pages at /ui (docs/dashboard.md).
    if settings.ui:
        app.mount("/ui", create_dashboard(lambda: app.state.memory, settings, throttle))
    # Added last = outermost: the request id exists before the body limit can refuse.
    app.add_middleware(
        BodyLimit,
        max_body_bytes=settings.max_body_bytes,
        by_prefix={"/v1/": settings.proxy_max_body_bytes},
        refusal=refusal,
    )
    app.add_middleware(RequestContext)
    telemetry.install(app, settings)
    return app
