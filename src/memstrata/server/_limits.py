"""Request body size limit (413), enforced before the body is parsed.

A declared ``Content-Length`` over the limit is refused at once, without reading the body.
A body sent without one (chunked) is counted while it streams in, and reading stops at the
first byte over the limit, so a client cannot make the server buffer more than the limit.
"""

from __future__ import annotations

import json

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ._errors import error_body

__all__ = ["BodyLimit"]


def _too_large(limit: int) -> str:
    return f"request body larger than {limit} bytes"


class BodyLimit:
    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.limit = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = None
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = None
                break
        if declared is not None and declared > self.limit:
            request_id = scope.get("state", {}).get("request_id")
            body = json.dumps(
                error_body(413, _too_large(self.limit), request_id=request_id)
            ).encode()
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
        limit = self.limit

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
