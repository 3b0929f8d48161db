"""``/mcp`` on ``stratamem serve``: the MCP server over streamable HTTP, stateless.

Each request is authenticated before MCP sees it, exactly as the REST API authenticates
(``Authorization: Api-Key <key>`` or ``Bearer <key>``; 401 otherwise): the key names the
project, and the URL names the user (``/mcp/users/{user_id}``, or ``X-Stratamem-User-Id``
on ``/mcp``). What the request may act on is fixed here, in the ASGI scope, and read by
the server's middleware; no tool argument can change it.

The SDK takes over a second to import, so the MCP server is built (off the event loop) on
the first request to ``/mcp``, not when ``serve`` starts; its session manager then runs in
a task until the app shuts down (``aclose``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import anyio
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from .._checks import check_id
from ..errors import ValidationError
from ..server._auth import Caller, authenticate, throttle_of
from ..server._errors import ApiError, error_response
from ..server._throttle import client_address
from ._tools import MemoryTools

if TYPE_CHECKING:
    from mcp.server.context import ServerRequestContext
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

    from ..memory import Memory

__all__ = ["USER_HEADER", "McpEndpoint"]

log = logging.getLogger("stratamem.mcp")

USER_HEADER = "x-stratamem-user-id"
_SCOPE_KEY = "stratamem.mcp"
_BY_USER = SimpleNamespace(path_format="/mcp/users/{user_id}")
_BY_HEADER = SimpleNamespace(path_format="/mcp")


def _identify(ctx: ServerRequestContext[Any, Any]) -> MemoryTools:
    """The caller ``McpEndpoint`` put in the request's scope."""
    request = ctx.request
    tools = None if request is None else request.scope.get(_SCOPE_KEY)
    if not isinstance(tools, MemoryTools):  # never reached through the endpoint
        raise RuntimeError("MCP request without an authenticated caller")
    return tools


def _user_of(request: Request) -> str:
    """The user a request names: ``/mcp/users/{user_id}``, or the header on ``/mcp``."""
    named = request.path_params.get("user_id")
    header = request.headers.get(USER_HEADER)
    if named is not None and header is not None and header != named:
        raise ApiError(400, f"the URL names user {named!r} and {USER_HEADER} {header!r}")
    user = named if named is not None else header
    if user is None:
        raise ApiError(
            400,
            "no user: connect to /mcp/users/{user_id}, or send the user in "
            f"the {USER_HEADER} header",
        )
    try:
        return check_id(user, "user_id")
    except ValidationError as exc:
        raise ApiError(400, str(exc)) from None


class McpEndpoint:
    """The ASGI app the server mounts at ``/mcp`` over the app's ``Memory``."""

    def __init__(self, memory: Callable[[], Memory]) -> None:
        self._memory = memory
        self._manager: StreamableHTTPSessionManager | None = None
        self._starting: asyncio.Lock | None = None
        self._stop: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        # The access log names a request by its route's template (server/_logging.py), which
        # FastAPI's router sets for its own routes only.
        by_user = "user_id" in scope.get("path_params", {})
        scope.setdefault("route", _BY_USER if by_user else _BY_HEADER)
        request = Request(scope)
        if request.method != "POST":
            # Stateless: no stream to open (GET would hold one open with nothing ever on
            # it) and no session to end (DELETE).
            detail = "the MCP endpoint is stateless: send JSON-RPC requests with POST"
            await error_response(request, 405, detail, headers={"Allow": "POST"})(
                scope, receive, send
            )
            return
        try:
            caller: Caller = await anyio.to_thread.run_sync(
                functools.partial(
                    authenticate,
                    self._memory(),
                    request.headers.get("authorization"),
                    throttle=throttle_of(request),
                    address=client_address(request),
                )
            )
            user = _user_of(request)
        except ApiError as exc:
            await error_response(request, exc.status, exc.detail, headers=exc.headers)(
                scope, receive, send
            )
            return
        scope.setdefault("state", {})["project_id"] = caller.project_id  # for the access log
        scope[_SCOPE_KEY] = MemoryTools(caller.memory, user, actor=f"mcp:{caller.actor}")
        try:
            manager = await self._ready()
        except ModuleNotFoundError as exc:
            detail = f"MCP needs the mcp package ({exc.name}): pip install 'stratamem[mcp]'"
            await error_response(request, 501, detail)(scope, receive, send)
            return
        await manager.handle_request(scope, receive, send)

    async def _ready(self) -> StreamableHTTPSessionManager:
        if self._manager is not None:
            return self._manager
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._manager is None:
                manager = await anyio.to_thread.run_sync(_build_manager)
                started, self._stop = asyncio.Event(), asyncio.Event()
                self._task = asyncio.create_task(self._run(manager, started, self._stop))
                waiting = asyncio.create_task(started.wait())
                await asyncio.wait({waiting, self._task}, return_when=asyncio.FIRST_COMPLETED)
                if not started.is_set():
                    waiting.cancel()
                    self._task.result()  # the manager could not start: its error, here
                self._manager = manager
        return self._manager

    @staticmethod
    async def _run(
        manager: StreamableHTTPSessionManager, started: asyncio.Event, stop: asyncio.Event
    ) -> None:
        async with manager.run():
            started.set()
            await stop.wait()

    async def aclose(self) -> None:
        """Stop the session manager, if a request started it."""
        if self._task is not None and self._stop is not None:
            self._stop.set()
            await self._task
            self._task = None


def _build_manager() -> StreamableHTTPSessionManager:
    from mcp.server.transport_security import TransportSecuritySettings

    from ._server import build_server

    server = build_server(_identify)
    # Stateless and JSON: any replica answers any request, no session to keep. No DNS-
    # rebinding guard: every request carries an API key, which a rebound page cannot.
    server.streamable_http_app(
        stateless_http=True,
        json_response=True,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    return server.session_manager
