"""A webhook receiver on 127.0.0.1: a real HTTP server in a thread, scripted per path.

Each path answers with what its script returns for the parsed request; built-in paths
misbehave the ways a real receiver can: ``/hang`` never answers (until the server stops),
``/huge`` sends 10 MB, ``/trickle-head`` sends its status line and headers and
``/trickle-body`` its body one byte every ``trickle_seconds`` (over ``TRICKLE_BYTES``
bytes, so a client's per-read timeout never fires), ``/redirect`` answers 302,
``/status/<code>`` answers that status, ``/not-json`` answers text, ``/list`` answers a
JSON list, ``/data-string`` answers a ``data`` that is not an object. Every request is
recorded with its headers and raw body so tests can verify signatures the way a receiver
would. :func:`silent_port` is a port that takes connections and never says a word.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from typing_extensions import Self

__all__ = ["TRICKLE_BYTES", "Received", "WebhookReceiver", "silent_port"]

# (status, body): a dict/list is sent as JSON, bytes/str verbatim, None as an empty body.
Answer = tuple[int, Any]
Script = Callable[[dict[str, Any]], Answer]

HUGE_BYTES = 10 * 1024 * 1024
# A trickled answer of this many bytes takes TRICKLE_BYTES * trickle_seconds to arrive.
TRICKLE_BYTES = 200


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> dict[str, Any]:
        return json.loads(self.body)


class WebhookReceiver:
    """``with WebhookReceiver() as r: r.url("/x")``; ``r.script("/x", fn)`` sets answers."""

    def __init__(self, trickle_seconds: float = 0.05) -> None:
        self.trickle_seconds = trickle_seconds
        self.requests: list[Received] = []
        self._scripts: dict[str, Script] = {}
        self._lock = threading.Lock()
        self._release = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                # Head and body are separate writes: without this, the body waits ~40 ms
                # for the client's delayed ACK, which real servers (uvicorn) never make it do.
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length)
                with receiver._lock:
                    receiver.requests.append(
                        Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                    )
                status, answer = receiver._answer(self.path, body)
                if status == -1:  # /hang: hold the connection until the server stops
                    receiver._release.wait(30)
                    return
                if status == -2:  # /huge
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(HUGE_BYTES))
                    self.end_headers()
                    chunk = b" " * 65536
                    try:
                        for _ in range(HUGE_BYTES // len(chunk)):
                            self.wfile.write(chunk)
                    except OSError:
                        pass  # the client stopped reading at its cap: expected
                    return
                if status == -3:  # /trickle-head, /trickle-body
                    self._trickle(slow_head=answer == "head")
                    return
                if answer is None:
                    data = b""
                elif isinstance(answer, bytes):
                    data = answer
                elif isinstance(answer, str):
                    data = answer.encode()
                else:
                    data = json.dumps(answer).encode()
                self.send_response(status)
                if status in (301, 302, 307, 308):
                    self.send_header("Location", "http://169.254.169.254/latest/meta-data/")
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _trickle(self, *, slow_head: bool) -> None:
                body = b'{"data": {}}'.ljust(TRICKLE_BYTES)
                pad = "p" * TRICKLE_BYTES if slow_head else "-"
                head = f"HTTP/1.1 200 OK\r\nX-Pad: {pad}\r\nContent-Length: {len(body)}\r\n\r\n"
                fast, slow = (b"", head.encode() + body) if slow_head else (head.encode(), body)
                try:
                    self.wfile.write(fast)
                    for i in range(len(slow)):
                        if receiver._release.wait(receiver.trickle_seconds):
                            return
                        self.wfile.write(slow[i : i + 1])
                except OSError:
                    pass  # the client gave up: expected

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def script(self, path: str, fn: Script | Answer) -> None:
        """Answer requests to ``path`` with ``fn(payload)`` (or always the given answer)."""
        self._scripts[path] = fn if callable(fn) else (lambda _payload, a=fn: a)

    def release(self) -> None:
        """End every hanging and trickling answer now, as stopping the server would."""
        self._release.set()

    def at(self, path: str) -> list[Received]:
        with self._lock:
            return [r for r in self.requests if r.path == path]

    def _answer(self, path: str, body: bytes) -> Answer:
        if path == "/hang":
            return -1, None
        if path == "/huge":
            return -2, None
        if path in ("/trickle-head", "/trickle-body"):
            return -3, path.rsplit("-", 1)[1]
        if path == "/redirect":
            return 302, None
        if path.startswith("/status/"):
            return int(path.rsplit("/", 1)[1]), {"error": "scripted"}
        if path == "/not-json":
            return 200, "this is not JSON"
        if path == "/list":
            return 200, [1, 2, 3]
        if path == "/data-string":
            return 200, {"data": "not an object"}
        script = self._scripts.get(path)
        if script is None:
            return 200, {}
        return script(json.loads(body))

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
        self._server.shutdown()
        self._server.server_close()


@contextlib.contextmanager
def silent_port(*, accepting: bool = True) -> Iterator[int]:
    """A port on 127.0.0.1 that never reads nor answers: connections are completed by the
    kernel's backlog and never accepted (a TLS handshake there never gets a reply). With
    ``accepting=False`` the backlog is full, so connecting itself never completes."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        # Linux completes backlog + 1 connections: with backlog 0 and one held here, the
        # next SYN is dropped and its connect() hangs.
        listener.listen(8 if accepting else 0)
        port = int(listener.getsockname()[1])
        with contextlib.ExitStack() as held:
            if not accepting:
                held.enter_context(socket.create_connection(("127.0.0.1", port), timeout=5))
            yield port
