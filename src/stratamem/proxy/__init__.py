"""The memory proxy: OpenAI- and Anthropic-compatible endpoints that recall memory before
each call and capture the exchange after it, for applications in any language (change the
base URL). ``stratamem proxy`` runs it alone; ``stratamem serve`` mounts it. See
``docs/proxy.md``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from ._memories import OneMemory, ProjectMemories
from ._proxy import (
    KEY_HEADER,
    MEMORY_HEADER,
    PROCESS_HEADER,
    SESSION_HEADER,
    USER_HEADER,
    CaptureSource,
    MemoryProxy,
    refusal,
)
from ._upstream import Upstream, base_url, redacted

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from ..memory import Memory
    from ..server._settings import ServerSettings

__all__ = [
    "KEY_HEADER",
    "MEMORY_HEADER",
    "PROCESS_HEADER",
    "SESSION_HEADER",
    "USER_HEADER",
    "MemoryProxy",
    "OneMemory",
    "ProjectMemories",
    "build_proxy",
    "create_proxy_app",
    "redacted",
    "refusal",
]


def build_proxy(settings: ServerSettings, captures: CaptureSource) -> MemoryProxy:
    """The proxy the ``proxy_*`` settings describe."""
    key = settings.proxy_upstream_api_key
    secret = None if key is None else key.get_secret_value()
    openai = anthropic = None
    if settings.proxy_upstream:
        openai = Upstream(base_url(settings.proxy_upstream, "proxy_upstream"), secret)
    anthropic_url = settings.proxy_anthropic_upstream or settings.proxy_upstream
    if anthropic_url:
        url = base_url(anthropic_url, "proxy_anthropic_upstream")
        anthropic = Upstream(url, secret, key_header="x-api-key")
    return MemoryProxy(
        captures,
        openai=openai,
        anthropic=anthropic,
        require_user=settings.proxy_require_user,
        timeout_s=settings.proxy_timeout_s,
    )


def create_proxy_app(memory: Memory, settings: ServerSettings) -> Starlette:
    """``stratamem proxy``: the proxy alone over one memory (the caller closes it)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse

    from ..server._limits import BodyLimit
    from ..server._logging import NamedRoute, RequestContext
    from ..server._telemetry import install as install_telemetry

    proxy = build_proxy(settings, OneMemory(memory))

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await proxy.warm_up()  # before it listens: /health answers once memory can
        try:
            yield
        finally:
            await proxy.aclose()

    app = Starlette(routes=[NamedRoute("/health", health), *proxy.routes()], lifespan=lifespan)
    app.add_middleware(BodyLimit, max_body_bytes=settings.proxy_max_body_bytes, refusal=refusal)
    # Access logs as the server's: one JSON line, the route's template, never a header or
    # the query string (a provider key can travel in either).
    app.add_middleware(RequestContext)
    install_telemetry(app, settings)
    app.state.proxy = proxy
    return app
