"""A fake OpenAI-compatible HTTP server for tests: real sockets, real SDK, no network.

Usage::

    with FakeOpenAIServer(dim=8) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="x")
        ...
        server.fail_next(2, status=500)     # the next two POSTs answer HTTP 500
        server.respond_raw_next(b"{oops")   # the next POST answers these exact bytes
        server.hold.clear()                 # POSTs now wait at the gate ...
        server.held.wait(5)                 # ... until one is waiting
        server.hold.set()                   # ... and let them through

Endpoints are a registry by path (:meth:`FakeOpenAIServer.route`); ``/v1/embeddings`` is
built in, so ``/v1/chat/completions`` can be added later without touching the plumbing.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import socket
import struct
import threading
from collections import deque
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

__all__ = ["FakeOpenAIServer", "Handler", "fake_vector"]

#: A route handler: parsed JSON body -> (HTTP status, JSON-serialisable response).
Handler = Callable[[Any], tuple[int, Any]]


def fake_vector(text: str, dim: int, model: str = "") -> list[float]:
    """The deterministic, deliberately non-normalised vector the server returns for
    ``text``: components in [-1, 1] derived from a hash of model and text."""
    raw = hashlib.shake_256(f"{model}\x00{text}".encode()).digest(4 * dim)
    return [v / 2**31 - 1.0 for v in struct.unpack(f"<{dim}I", raw)]


def _error_body(message: str, kind: str = "server_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


class _Server(ThreadingHTTPServer):
    # Request threads are joined on close, and open keep-alive connections are shut down
    # first so that joining cannot hang on a client that keeps its connection idle.
    daemon_threads = False
    block_on_close = True

    def __init__(self, address: tuple[str, int], fake: FakeOpenAIServer) -> None:
        self.fake = fake
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()
        super().__init__(address, _RequestHandler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.connections_lock:
            self.connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.connections_lock:
            self.connections.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        with self.connections_lock:
            connections = list(self.connections)
        for conn in connections:
            with contextlib.suppress(OSError):  # already closed by the client
                conn.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients hanging up (and our own shutdown) are normal here; stay quiet.
        pass


class _RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the SDK's HTTP client expects
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._send(404, json.dumps(_error_body(f"no route GET {self.path}")).encode())

    def do_POST(self) -> None:
        fake = self.server.fake
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = None
        fake.requests.append((self.path, body))
        with fake._in_flight():
            status, payload, headers = fake._dispatch(self.path, body)
            self._send(status, payload, headers)


class FakeOpenAIServer:
    """OpenAI-compatible server on 127.0.0.1 in a background thread (a context manager).

    ``requests`` records every POST as ``(path, parsed JSON body)``. Embeddings are
    :func:`fake_vector` of each input, ``dim`` components (or the request's
    ``dimensions``), in the real response shape; ``encoding_format: "base64"`` is honoured.
    Scripted failures carry ``retry-after-ms`` (``retry_after_ms``, default 1) so the SDK
    retries at once instead of backing off for seconds; ``None`` omits the header.
    """

    def __init__(self, dim: int = 8, *, port: int = 0, retry_after_ms: int | None = 1) -> None:
        self.dim = dim
        self.retry_after_ms = retry_after_ms
        self.requests: list[tuple[str, Any]] = []
        #: Gate for POSTs: cleared -> requests wait until it is set again. Set initially.
        self.hold = threading.Event()
        self.hold.set()
        #: Set while at least one request is waiting at the gate.
        self.held = threading.Event()
        self._waiting = 0
        self._lock = threading.Lock()
        self._active = 0
        self._idle = threading.Condition(self._lock)
        self._scripted: deque[tuple[int, bytes]] = deque()
        self._closing = False
        self._routes: dict[str, Handler] = {"/v1/embeddings": self._embeddings}
        self._server = _Server(("127.0.0.1", port), self)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def base_url(self) -> str:
        """What to pass as the SDK's ``base_url``, e.g. ``http://127.0.0.1:PORT/v1``."""
        return f"http://127.0.0.1:{self.port}/v1"

    def route(self, path: str, handler: Handler) -> None:
        """Serve POST ``path`` (e.g. ``"/v1/chat/completions"``) with ``handler``."""
        self._routes[path] = handler

    def fail_next(self, n: int = 1, status: int = 500) -> None:
        """Answer the next ``n`` POSTs with HTTP ``status`` and an OpenAI-style error body."""
        body = json.dumps(_error_body(f"injected failure (HTTP {status})")).encode()
        with self._lock:
            self._scripted.extend([(status, body)] * n)

    def respond_raw_next(self, body: bytes, status: int = 200) -> None:
        """Answer the next POST with exactly ``body`` (e.g. malformed JSON)."""
        with self._lock:
            self._scripted.append((status, body))

    def embedding_requests(self) -> list[Any]:
        """Bodies of the ``/v1/embeddings`` requests received so far."""
        return [body for path, body in self.requests if path.endswith("/embeddings")]

    def start(self) -> FakeOpenAIServer:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._server.serve_forever,
                kwargs={"poll_interval": 0.05},
                name="fake-openai-server",
                daemon=True,
            )
            self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving, release held requests, close connections and join all threads."""
        self._closing = True
        self.hold.set()
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        # Let released requests send their answers before their connections are cut.
        with self._idle:
            self._idle.wait_for(lambda: self._active == 0, timeout=5)
        self._server.close_connections()
        self._server.server_close()

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- request handling (runs on the server's request threads) --

    @contextlib.contextmanager
    def _in_flight(self) -> Iterator[None]:
        with self._lock:
            self._active += 1
        try:
            yield
        finally:
            with self._idle:
                self._active -= 1
                self._idle.notify_all()

    def _wait_at_gate(self) -> None:
        if self.hold.is_set():
            return
        with self._lock:
            self._waiting += 1
            self.held.set()
        try:
            while not self.hold.wait(0.05) and not self._closing:
                pass
        finally:
            with self._lock:
                self._waiting -= 1
                if self._waiting == 0:
                    self.held.clear()

    def _dispatch(self, path: str, body: Any) -> tuple[int, bytes, dict[str, str]]:
        self._wait_at_gate()
        with self._lock:
            scripted = self._scripted.popleft() if self._scripted else None
        if scripted is not None:
            status, raw = scripted
            headers = {}
            if status >= 400 and self.retry_after_ms is not None:
                headers["retry-after-ms"] = str(self.retry_after_ms)
            return status, raw, headers
        handler = self._routes.get(path)
        if handler is None:
            status, payload = 404, _error_body(f"no route POST {path}", "invalid_request_error")
        elif not isinstance(body, dict):
            status, payload = (
                400,
                _error_body("body must be a JSON object", "invalid_request_error"),
            )
        else:
            status, payload = handler(body)
        return status, json.dumps(payload).encode(), {}

    def _embeddings(self, body: dict[str, Any]) -> tuple[int, Any]:
        model = body.get("model")
        inputs = body.get("input")
        if isinstance(inputs, str):
            inputs = [inputs]
        if not isinstance(model, str) or not isinstance(inputs, list) or not inputs:
            return 400, _error_body(
                "'model' and a non-empty 'input' are required", "invalid_request_error"
            )
        if not all(isinstance(text, str) and text for text in inputs):
            return 400, _error_body(
                "every input must be a non-empty string", "invalid_request_error"
            )
        dim = body.get("dimensions") or self.dim
        base64_out = body.get("encoding_format") == "base64"
        data = []
        for index, text in enumerate(inputs):
            vector: Any = fake_vector(text, dim, model)
            if base64_out:
                vector = base64.b64encode(struct.pack(f"<{dim}f", *vector)).decode()
            data.append({"object": "embedding", "index": index, "embedding": vector})
        tokens = sum(len(text.split()) for text in inputs)
        return 200, {
            "object": "list",
            "data": data,
            "model": model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
