"""Request body size limit (413), enforced before the body is parsed.

A declared ``Content-Length`` over the limit is refused at once, without reading the body.
A body sent without one (chunked) is counted while it streams in, and reading stops at the
first byte over the limit, so a client cannot make the server buffer more than the limit.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ._errors import error_body

__all__ = ["BodyLimit", "Refusal"]

# (path, message) -> the body of the 413 for that path, or None for stratamem's envelope.
Refusal = Callable[[str, str], dict[str, Any] | None]


def _too_large(limit: int) -> str:
    return f"request body larger than {limit} bytes"


class BodyLimit:
    def __init__(
        self,
        app: ASGIApp,
        max_body_bytes: int,
        by_prefix: dict[str, int] | None = None,
        refusal: Refusal | None = None,
    ) -> None:
        self.app = app
        self.default = max_body_bytes
        # A body of another shape for some paths (the proxy's: the provider's error shape,
        # which the caller's SDK reads the message from); None: stratamem's envelope.
        self.refusal = refusal
        # Paths with a limit of their own (the proxy's /v1/: prompts carry images inline).
        self.by_prefix = sorted((by_prefix or {}).items(), key=lambda kv: -len(kv[0]))

    def _limit(self, path: str) -> int:
        for prefix, limit in self.by_prefix:
            if path.startswith(prefix):
                return limit
        return self.default

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self._limit(scope.get("path", ""))
        declared = None
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = None
                break
        if declared is not None and declared > limit:
            request_id = scope.get("state", {}).get("request_id")
            message = _too_large(limit)
            shaped = self.refusal(scope.get("path", ""), message) if self.refusal else None
            if shaped is None:
                shaped = error_body(413, message, request_id=request_id)
            body = json.dumps(shaped).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 413,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                        # The unread body makes the connection unusable for another request.
                        (b"connection", b"close"),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return

        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    # Raised inside the route's body parsing; the error handlers turn it
                    # into the 413 envelope.
                    raise HTTPException(413, _too_large(limit), headers={"connection": "close"})
            return message

        await self.app(scope, counting_receive, send)
