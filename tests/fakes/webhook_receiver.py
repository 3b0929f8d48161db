"""A webhook receiver on 127.0.0.1: a real HTTP server in a thread, scripted per path.

Each path answers with what its script returns for the parsed request; built-in paths
misbehave the ways a real receiver can: ``/hang`` never answers (until the server stops),
``/huge`` sends 10 MB, ``/redirect`` answers 302, ``/status/<code>`` answers that status,
``/not-json`` answers text, ``/list`` answers a JSON list, ``/data-string`` answers a
``data`` that is not an object, ``/trickle-body`` sends its status line and headers at once
and then its body one byte every ``trickle_interval`` seconds, ``/trickle-head`` sends even
the status line and headers that way (a client's per-read timeout never fires on either;
the answer would take ``trickle_seconds`` at least). Every request is recorded with its
headers and raw body so tests can verify signatures the way a receiver would, and with when
it arrived and when the exchange ended (the answer was complete, or the client hung up), so
that a test can time a sender from the receiver's side. :func:`silent_port` is a port that
takes connections and never says a word.
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from typing_extensions import Self

__all__ = ["Received", "WebhookReceiver", "silent_port"]

# (status, body): a dict/list is sent as JSON, bytes/str verbatim, None as an empty body.
Answer = tuple[int, Any]
Script = Callable[[dict[str, Any]], Answer]

HUGE_BYTES = 10 * 1024 * 1024


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    #: ``time.monotonic()`` when the request had been read, and when the exchange ended:
    #: the whole answer was sent, or the client was seen hanging up (``None`` until then).
    arrived: float = 0.0
    ended: float | None = None

    @property
    def seconds(self) -> float | None:
        """How long the client stayed for the answer, as the receiver saw it."""
        return None if self.ended is None else self.ended - self.arrived

    @property
    def json(self) -> dict[str, Any]:
        return json.loads(self.body)


class WebhookReceiver:
    """``with WebhookReceiver() as r: r.url("/x")``; ``r.script("/x", fn)`` sets answers."""

    def __init__(self, *, trickle_interval: float = 0.05, trickle_seconds: float = 10.0) -> None:
        self.requests: list[Received] = []
        #: ``/trickle-*``: seconds between two bytes, and how long a trickle goes on at most
        #: before the receiver gives up and closes (the answer is never complete).
        self.trickle_interval = trickle_interval
        self.trickle_seconds = trickle_seconds
        #: The size of a trickled body: more bytes than ``trickle_seconds`` lets through.
        self.trickle_bytes = int(trickle_seconds / trickle_interval) + 10
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
                received = Received(
                    self.path,
                    {k.lower(): v for k, v in self.headers.items()},
                    body,
                    arrived=time.monotonic(),
                )
                with receiver._lock:
                    receiver.requests.append(received)
                try:
                    self._respond(body)
                finally:
                    received.ended = time.monotonic()

            def _respond(self, body: bytes) -> None:
                status, answer = receiver._answer(self.path, body)
                if status == -1:  # /hang: hold the connection until the client goes
                    while not receiver._release.wait(0.02) and not self._client_gone():
                        pass
                    self.close_connection = True
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
                if status in (-3, -4):  # /trickle-head, /trickle-body
                    self._trickle(head_too=status == -3)
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

            def _trickle(self, *, head_too: bool) -> None:
                # An answer (valid JSON, were it ever complete) that would take longer than
                # trickle_seconds to arrive.
                size = receiver.trickle_bytes
                body = b'{"data": {}}'.ljust(size)
                head = (
                    f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {size}\r\n\r\n"
                ).encode()
                stream = head + body
                if not head_too:
                    self.wfile.write(head)
                    stream = body
                self.close_connection = True
                give_up = time.monotonic() + receiver.trickle_seconds
                try:
                    for i in range(len(stream)):
                        if self._client_gone() or time.monotonic() > give_up:
                            return
                        self.wfile.write(stream[i : i + 1])
                        if receiver._release.wait(receiver.trickle_interval):
                            return
                except OSError:
                    return  # the client hung up between two bytes

            def _client_gone(self) -> bool:
                # The request has been read whole: anything readable now is the client's
                # end of the connection (EOF or a reset).
                try:
                    readable, _, _ = select.select([self.connection], [], [], 0)
                    return bool(readable) and not self.connection.recv(1, socket.MSG_PEEK)
                except OSError:
                    return True

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
        if path == "/trickle-head":
            return -3, None
        if path == "/trickle-body":
            return -4, None
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
