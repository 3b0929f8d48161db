"""A loopback HTTP proxy in front of a real server that loses answers on purpose.

Every request is forwarded to the upstream server and answered there, so a write has
committed before anything goes wrong; then, for the requests a test armed a fault for, the
answer is lost on the way back: the connection is dropped without a byte of it
(``"drop"``, as when a server or a load balancer restarts) or a stratamem 503 envelope
goes back instead (``"503"``, as when the store fails after the commit)::

    proxy = FaultProxy(server.url)
    proxy.arm("drop", "POST", "/api/sessions/s1/messages")   # the next such request
    client = MemoryClient(api_key=key, base_url=proxy.url)
    ...
    proxy.log   # [(method, path, upstream status, what the client got), ...]
    proxy.close()
"""

from __future__ import annotations

import json
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

import httpx

__all__ = ["Fault", "FaultProxy"]

Fault = Literal["drop", "503"]

# Hop-by-hop and framing headers: the proxy's own connections decide those.
_NOT_FORWARDED = frozenset({"host", "connection", "content-length", "accept-encoding"})


def _unavailable() -> bytes:
    body = {
        "success": False,
        "data": None,
        "message": "PostgreSQL error: the connection was lost",
        "error": {
            "code": "unavailable",
            "detail": "PostgreSQL error: the connection was lost",
            "problems": [],
            "request_id": "fault-proxy",
        },
    }
    return json.dumps(body).encode()


class FaultProxy:
    def __init__(self, upstream: str) -> None:
        self.log: list[tuple[str, str, int, str]] = []
        self._armed: list[tuple[Fault, str, str]] = []
        self._lock = threading.Lock()
        self._upstream = httpx.Client(base_url=upstream, timeout=60.0)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as a real server: httpx pools it
            disable_nagle_algorithm = True

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _NOT_FORWARDED}
                answer = proxy._upstream.request(
                    self.command, self.path, headers=headers, content=body
                )
                path = self.path.split("?", 1)[0]
                fault = proxy._take(self.command, path)
                proxy.log.append((self.command, path, answer.status_code, fault or "answer"))
                if fault == "drop":
                    self.close_connection = True  # closed without a byte of the answer
                    return
                status, raw = (
                    (503, _unavailable()) if fault else (answer.status_code, answer.content)
                )
                head = (
                    f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
                    f"content-type: application/json\r\ncontent-length: {len(raw)}\r\n\r\n"
                )
                self.wfile.write(head.encode() + raw)

            do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _forward

            def log_message(self, *args: Any) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    def arm(self, fault: Fault, method: str, path: str) -> None:
        """Lose the answer to the next ``method`` request on exactly ``path``."""
        with self._lock:
            self._armed.append((fault, method, path))

    def _take(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for i, (fault, m, p) in enumerate(self._armed):
                if (m, p) == (method, path):
                    del self._armed[i]
                    return fault
        return None

    def sent(self, method: str, path: str) -> list[tuple[int, str]]:
        """(upstream status, what the client got) of each such request, in order."""
        return [(status, got) for m, p, status, got in self.log if (m, p) == (method, path)]

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._upstream.close()
