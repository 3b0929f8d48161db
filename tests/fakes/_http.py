"""Plumbing shared by the fake provider servers: a loopback HTTP server in a thread.

:class:`FakeHTTPServer` owns everything that is not provider-specific: the socket, the
request threads and their clean shutdown, the request log, the route registry, scripted
failures and raw answers, the ``hold``/``held`` gate, injected delays and scripted chat
replies, and the writing of streamed (Server-Sent Events) answers with their injected
slowness (``chunk_delay``) and breakage (:meth:`FakeHTTPServer.fail_stream_after`).
Subclasses (``FakeOpenAIServer``, ``FakeAnthropicServer``) add their routes and say what
an error body looks like (:meth:`FakeHTTPServer.error_body`).
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, TypeAlias, TypedDict

from typing_extensions import NotRequired, Self

__all__ = [
    "AssistantTurn",
    "ChatReply",
    "ChatScript",
    "EventStream",
    "FakeHTTPServer",
    "Handler",
    "ScriptedToolCall",
    "ToolCall",
    "ToolCallsReply",
    "assistant_turn",
    "estimate_tokens",
    "split_fixed",
    "split_words",
    "sse_frame",
]


class ScriptedToolCall(TypedDict):
    """One tool call as a script writes it; ``arguments`` is the JSON text the model
    writes, or a dict serialised for it. Without ``id`` the server makes one up in the
    provider's style (``call_...``, ``toolu_...``)."""

    name: str
    arguments: str | dict[str, Any]
    id: NotRequired[str]


class ToolCallsReply(TypedDict):
    """A chat reply in which the assistant calls tools, optionally after some text."""

    tool_calls: list[ScriptedToolCall]
    content: NotRequired[str | None]


#: A route handler: parsed JSON body -> (HTTP status, JSON-serialisable response), or
#: ``(status, EventStream)`` for a streamed answer.
Handler: TypeAlias = Callable[[Any], tuple[int, Any]]

#: What a chat script answers: the assistant's text; a :class:`ToolCallsReply` (a dict with
#: a ``"tool_calls"`` key: the assistant calls tools); any other dict, a complete response
#: object sent as is (status 200, never streamed); or ``(status, body)`` where ``body`` is
#: JSON-serialisable, or ``bytes`` / ``str`` sent verbatim.
ChatReply: TypeAlias = str | ToolCallsReply | dict[str, Any] | tuple[int, Any]

#: A chat script: the parsed request body -> the reply.
ChatScript: TypeAlias = Callable[[dict[str, Any]], ChatReply]


def estimate_tokens(text: str) -> int:
    """The fakes' deterministic token count: one token per started 4 characters."""
    return (len(text) + 3) // 4


def _default_chat_script(body: dict[str, Any]) -> ChatReply:
    return "{}"


# -- scripted tool calls --


@dataclass(frozen=True)
class ToolCall:
    """A normalised scripted tool call: ``arguments`` is always JSON text."""

    name: str
    arguments: str
    id: str | None = None


@dataclass(frozen=True)
class AssistantTurn:
    """What the assistant says, provider-neutral: text (``None``: no text part) and the
    tool calls that follow it."""

    text: str | None
    tool_calls: tuple[ToolCall, ...] = ()

    def output_tokens(self) -> int:
        """The fakes' token count of everything the assistant wrote."""
        written = (self.text or "") + "".join(c.name + c.arguments for c in self.tool_calls)
        return estimate_tokens(written)


def assistant_turn(reply: str | ToolCallsReply | dict[str, Any]) -> AssistantTurn | None:
    """The turn a text or :class:`ToolCallsReply` reply scripts; ``None`` for any other dict
    (a complete response to send as is). Raises ``ValueError`` on a malformed tool call,
    so a mistake in a test's script surfaces as an error answer naming it."""
    if isinstance(reply, str):
        return AssistantTurn(text=reply)
    if "tool_calls" not in reply:
        return None
    calls = reply["tool_calls"]
    if not isinstance(calls, list) or not calls:
        raise ValueError("scripted 'tool_calls' must be a non-empty list")
    normalised = []
    for call in calls:
        name = call.get("name") if isinstance(call, dict) else None
        arguments = call.get("arguments") if isinstance(call, dict) else None
        if not isinstance(name, str) or not isinstance(arguments, str | dict):
            raise ValueError(f"scripted tool call needs a name and arguments: {call!r}")
        call_id = call.get("id")
        if call_id is not None and not isinstance(call_id, str):
            raise ValueError(f"scripted tool call id must be a string: {call!r}")
        if isinstance(arguments, dict):
            arguments = json.dumps(arguments)
        normalised.append(ToolCall(name=name, arguments=arguments, id=call_id))
    content = reply.get("content")
    if content is not None and not isinstance(content, str):
        raise ValueError("scripted 'content' must be a string or None")
    return AssistantTurn(text=content, tool_calls=tuple(normalised))


# -- streaming --


@dataclass
class EventStream:
    """A streamed answer: Server-Sent Events frames written one by one (HTTP chunked
    encoding, as the real APIs do), ``chunk_delay`` apart, the body's end ``end_delay``
    after the last. ``fail_after`` (set by the server from
    :meth:`FakeHTTPServer.fail_stream_after`) cuts the connection after that many frames,
    before the end of the body."""

    frames: list[bytes]
    fail_after: int | None = field(default=None, compare=False)


def sse_frame(data: Any, event: str | None = None) -> bytes:
    """One SSE frame: an optional ``event:`` line and a ``data:`` line (JSON, or a ``str``
    sent as is, e.g. ``"[DONE]"``), then the blank line that ends the event."""
    payload = data if isinstance(data, str) else json.dumps(data)
    head = f"event: {event}\n" if event is not None else ""
    return f"{head}data: {payload}\n\n".encode()


_WORD = re.compile(r"\s*\S+|\s+$")


def split_words(text: str) -> list[str]:
    """``text`` in word pieces carrying their leading whitespace, as token streams look;
    the pieces join back to ``text`` exactly."""
    return _WORD.findall(text)


def split_fixed(text: str, size: int = 8) -> list[str]:
    """``text`` in pieces of ``size`` characters (tool arguments arrive cut anywhere,
    mid-string included, and clients must reassemble them)."""
    return [text[i : i + size] for i in range(0, len(text), size)]


class _Server(ThreadingHTTPServer):
    # Request threads are joined on close, and open keep-alive connections are shut down
    # first so that joining cannot hang on a client that keeps its connection idle.
    daemon_threads = False
    block_on_close = True
    # socketserver's default backlog is 5: under a load benchmark's bursts of new
    # connections the kernel dropped or reset some, which a provider's servers never do.
    request_queue_size = 1024

    def __init__(
        self, address: tuple[str, int], fake: FakeHTTPServer, bound: socket.socket | None = None
    ) -> None:
        self.fake = fake
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()
        super().__init__(address, _RequestHandler, bind_and_activate=bound is None)
        if bound is not None:  # listen on a socket already bound to the address
            self.socket.close()
            self.socket = bound
            self.server_address = bound.getsockname()
            self.server_activate()

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
        # Clients hanging up (a timed-out request, our own shutdown) are normal; stay quiet.
        pass


class _RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the SDKs' HTTP clients expect
    server: _Server

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in separate writes; without TCP_NODELAY, Nagle's
        # algorithm and the client's delayed ACK add ~40 ms to every answer.
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        fake = self.server.fake
        headers = {"Content-Type": "application/json", **fake.answer_headers, **(headers or {})}
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        fake.answers.append(body)
        self.wfile.write(body)

    def do_GET(self) -> None:
        fake = self.server.fake
        fake.get_requests.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
        handler = fake._get_routes.get(_route_path(self.path))
        if handler is None:
            status, payload = 404, fake.error_body(404, f"no route GET {self.path}")
        else:
            status, payload = handler(self.path)
        self._send(status, json.dumps(payload).encode())

    def _send_stream(self, status: int, stream: EventStream, headers: dict[str, str]) -> None:
        fake = self.server.fake
        self.send_response(status)
        content_type = {"Content-Type": "text/event-stream; charset=utf-8"}
        for key, value in {**content_type, **fake.answer_headers, **headers}.items():
            self.send_header(key, value)
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        broken = stream.fail_after is not None
        written: list[bytes] = []
        with fake._lock:
            fake.answers.append(b"")  # grows as the frames go out
            slot = len(fake.answers) - 1
        try:
            for index, frame in enumerate(stream.frames[: stream.fail_after]):
                if index and fake.chunk_delay > 0:
                    # Ends early when the server closes, so close() is not kept waiting.
                    fake._closing.wait(fake.chunk_delay)
                # Recorded before it goes out: a client that has a frame finds it recorded
                # (after a failed write, the record holds one frame the client never got).
                written.append(frame)
                fake.answers[slot] = b"".join(written)
                self.wfile.write(b"%x\r\n%s\r\n" % (len(frame), frame))
            if not broken:
                if fake.end_delay > 0:
                    fake._closing.wait(fake.end_delay)
                self.wfile.write(b"0\r\n\r\n")  # the chunked body's terminator
                return
        except OSError:  # the client went away mid-stream (closed the stream early)
            self.close_connection = True
            fake.streams_abandoned += 1
            return
        # Injected breakage: cut the connection without the chunked body's terminator,
        # as a crashed upstream or a dropped proxy connection does.
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def do_POST(self) -> None:
        fake = self.server.fake
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = None
        fake.requests.append((self.path, body))
        fake.raw_requests.append(raw)
        fake.request_headers.append({k.lower(): v for k, v in self.headers.items()})
        with fake._in_flight():
            status, payload, headers = fake._dispatch(self.path, body)
            if isinstance(payload, EventStream):
                self._send_stream(status, payload, headers)
            else:
                self._send(status, payload, headers)


class FakeHTTPServer:
    """A JSON-over-HTTP server on 127.0.0.1 (ephemeral port) in a background thread.

    Use it as a context manager, or :meth:`start` / :meth:`close`. Every POST is recorded
    in ``requests`` as ``(path, parsed JSON body)`` (``None`` when the body is not JSON),
    its bytes in ``raw_requests`` and its headers (lower-cased names) in
    ``request_headers``, before anything else happens to it. Then, in this order:

    1. the ``hold`` gate: while ``hold`` is cleared, POSTs wait (``held`` is set meanwhile);
    2. an injected delay (:meth:`delay_next`);
    3. a persistent HTTP error status set by :meth:`fault`, until :meth:`heal`;
    4. a scripted answer (:meth:`fail_next`, :meth:`respond_raw_next`), whatever the path;
    5. the route registered for the path (:meth:`route`), 404 without one.

    :meth:`fault` also makes the service hang, refuse connections, or (chat routes) answer
    what is not JSON or JSON of another shape, until :meth:`heal`: an outage, or a model
    gone bad, and then its recovery.

    A route may answer with an :class:`EventStream`; its frames are then written
    ``chunk_delay`` seconds apart, and :meth:`fail_stream_after` breaks the next ones.

    Answers with an HTTP status >= 400 carry ``retry-after-ms: <retry_after_ms>`` (default
    1) so the SDKs retry at once instead of backing off for seconds; ``None`` omits it.
    Every answer carries ``answer_headers`` too, and its body is recorded in ``answers``
    as written (what a proxy in between must relay byte for byte). GETs are answered by
    the routes of :meth:`route_get` (404 otherwise) and recorded in ``get_requests``.
    """

    #: Name of the thread running ``serve_forever`` (tests check it is gone after close).
    thread_name = "fake-http-server"

    def __init__(self, *, port: int = 0, retry_after_ms: int | None = 1) -> None:
        self.retry_after_ms = retry_after_ms
        self.requests: list[tuple[str, Any]] = []
        #: The bytes of each POST's body, as received (same order as ``requests``).
        self.raw_requests: list[bytes] = []
        self.request_headers: list[dict[str, str]] = []
        #: GETs as ``(path with query, headers)``; answered by :meth:`route_get` routes.
        self.get_requests: list[tuple[str, dict[str, str]]] = []
        #: The body of every answer as written (a stream's frames so far, joined).
        self.answers: list[bytes] = []
        #: Headers added to every answer (e.g. ``x-request-id``, rate-limit headers).
        self.answer_headers: dict[str, str] = {}
        #: Streamed answers whose client went away before their end.
        self.streams_abandoned = 0
        #: Gate for POSTs: cleared -> requests wait until it is set again. Set initially.
        self.hold = threading.Event()
        self.hold.set()
        #: Set while at least one request is waiting at the gate.
        self.held = threading.Event()
        #: Replies of chat-style routes, consumed first (FIFO) while not empty.
        self.chat_replies: deque[ChatReply] = deque()
        #: Reply of chat-style routes when ``chat_replies`` is empty; default ``"{}"``.
        self.chat_script: ChatScript = _default_chat_script
        #: Seconds between two frames of a streamed answer (0: as fast as possible).
        self.chunk_delay = 0.0
        #: Seconds between a streamed answer's last frame and the end of its body (a
        #: client may leave once it has the last event, before the body ends).
        self.end_delay = 0.0
        self._waiting = 0
        self._lock = threading.Lock()
        self._active = 0
        self._idle = threading.Condition(self._lock)
        self._scripted: deque[tuple[int, bytes, str]] = deque()
        self._delays: deque[float] = deque()
        self._stream_failures: deque[int] = deque()
        self._closing = threading.Event()
        self._routes: dict[str, Handler] = {}
        self._get_routes: dict[str, Callable[[str], tuple[int, Any]]] = {}
        self._fault: str | int | None = None
        self._server = _Server(("127.0.0.1", port), self)
        self._thread: threading.Thread | None = None
        # While refusing connections: the port, bound but not listening (kept for heal()).
        self._reserved: socket.socket | None = None

    # -- provider-specific --

    def error_body(self, status: int, message: str, kind: str | None = None) -> dict[str, Any]:
        """The provider's error object for ``status`` (subclasses override)."""
        return {"error": {"message": message, "type": kind or "error"}}

    # -- configuration --

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def open_connections(self) -> int:
        """Client connections open now (kept alive between requests included)."""
        with self._server.connections_lock:
            return len(self._server.connections)

    @property
    def origin(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    def route(self, path: str, handler: Handler) -> None:
        """Serve POST ``path`` (query string ignored) with ``handler``."""
        self._routes[path] = handler

    def route_get(self, path: str, handler: Callable[[str], tuple[int, Any]]) -> None:
        """Serve GET ``path`` with ``handler``: the request's path and query -> (status,
        JSON-serialisable body). GETs skip the gate, delays and scripted failures."""
        self._get_routes[path] = handler

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no request is being answered (a stream whose client went away ends
        at its next write); False if ``timeout`` ran out first."""
        with self._idle:
            return self._idle.wait_for(lambda: self._active == 0, timeout=timeout)

    def fail_next(self, n: int = 1, status: int = 500) -> None:
        """Answer the next ``n`` POSTs with HTTP ``status`` and the provider's error body."""
        body = json.dumps(self.error_body(status, f"injected failure (HTTP {status})")).encode()
        with self._lock:
            self._scripted.extend([(status, body, "application/json")] * n)

    def respond_raw_next(
        self, body: bytes, status: int = 200, content_type: str = "application/json"
    ) -> None:
        """Answer the next POST with exactly ``body`` (e.g. malformed JSON, or an HTML
        page from a misconfigured proxy with ``content_type="text/html"``)."""
        with self._lock:
            self._scripted.append((status, body, content_type))

    def delay_next(self, seconds: float, n: int = 1) -> None:
        """Sleep ``seconds`` before answering each of the next ``n`` POSTs.

        The sleep ends early when the server closes, so a client that timed out does not
        keep :meth:`close` waiting.
        """
        with self._lock:
            self._delays.extend([seconds] * n)

    def fail_stream_after(self, n_chunks: int, times: int = 1) -> None:
        """Break the next ``times`` streamed answers: send their headers and first
        ``n_chunks`` SSE frames (events, as the provider sends them), then close the
        connection abruptly, without ending the chunked body. Plain answers are not
        affected and do not consume it."""
        with self._lock:
            self._stream_failures.extend([n_chunks] * times)

    def fault(self, mode: str | int) -> None:
        """Break the service until :meth:`heal`:

        * ``"hang"``: POSTs wait (``hold`` is cleared) and clients time out;
        * an HTTP status (``500``, ``429``, ``529``, ``401`` ...): every POST answers it
          with the provider's error body (and ``retry-after-ms``);
        * ``"refuse"``: nothing listens on the port (connecting fails at once, open
          connections are closed);
        * ``"invalid_json"`` / ``"wrong_schema"``: chat answers are prose that is not
          JSON / a JSON object without the fields asked for.
        """
        if mode not in ("hang", "refuse", "invalid_json", "wrong_schema") and not (
            isinstance(mode, int) and mode >= 400
        ):
            raise ValueError(f"unknown fault {mode!r}")
        self.heal()
        self._fault = mode
        if mode == "hang":
            self.hold.clear()
        elif mode == "refuse":
            self._stop_listening()
            reserved = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            reserved.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            reserved.bind(("127.0.0.1", self.port))  # bound, not listening: refused
            self._reserved = reserved

    def heal(self) -> None:
        """End the :meth:`fault`: answer normally again, on the same port."""
        fault, self._fault = self._fault, None
        if fault == "hang":
            self.hold.set()
        elif fault == "refuse" and self._reserved is not None:
            self._server = _Server(("127.0.0.1", self.port), self, bound=self._reserved)
            self._reserved = None
            self.start()

    def bodies(self, path_suffix: str) -> list[Any]:
        """Bodies of the POSTs received so far whose path (sans query) ends with the suffix."""
        return [body for path, body in self.requests if _route_path(path).endswith(path_suffix)]

    # -- lifecycle --

    def start(self) -> Self:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._server.serve_forever,
                kwargs={"poll_interval": 0.01},
                name=self.thread_name,
                daemon=True,
            )
            self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving, release held and delayed requests, close connections, join."""
        self._closing.set()
        self.hold.set()
        self._stop_listening()
        if self._reserved is not None:
            self._reserved.close()
            self._reserved = None

    def _stop_listening(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        # Let released requests send their answers before their connections are cut.
        with self._idle:
            self._idle.wait_for(lambda: self._active == 0, timeout=5)
        self._server.close_connections()
        self._server.server_close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- request handling (runs on the server's request threads) --

    def next_chat_reply(self, body: dict[str, Any]) -> ChatReply:
        """The next queued reply, else what ``chat_script`` says for ``body`` (unless a
        :meth:`fault` says otherwise)."""
        if self._fault == "invalid_json":
            return 'Here is what I found: {"facts": ['
        if self._fault == "wrong_schema":
            return '{"answer": "the user said several things"}'
        try:
            return self.chat_replies.popleft()
        except IndexError:
            return self.chat_script(body)

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
            while not self.hold.wait(0.05) and not self._closing.is_set():
                pass
        finally:
            with self._lock:
                self._waiting -= 1
                if self._waiting == 0:
                    self.held.clear()

    def _headers_for(self, status: int) -> dict[str, str]:
        if status >= 400 and self.retry_after_ms is not None:
            return {"retry-after-ms": str(self.retry_after_ms)}
        return {}

    def _dispatch(self, path: str, body: Any) -> tuple[int, bytes | EventStream, dict[str, str]]:
        self._wait_at_gate()
        with self._lock:
            delay = self._delays.popleft() if self._delays else None
        if delay is not None:
            self._closing.wait(delay)
        fault = self._fault
        if isinstance(fault, int):
            raw = json.dumps(self.error_body(fault, f"injected outage (HTTP {fault})")).encode()
            return fault, raw, self._headers_for(fault)
        with self._lock:
            scripted = self._scripted.popleft() if self._scripted else None
        if scripted is not None:
            status, raw, content_type = scripted
            return status, raw, {"Content-Type": content_type, **self._headers_for(status)}
        handler = self._routes.get(_route_path(path))
        if handler is None:
            status, payload = 404, self.error_body(404, f"no route POST {path}")
        elif not isinstance(body, dict):
            status, payload = 400, self.error_body(400, "body must be a JSON object")
        else:
            status, payload = handler(body)
        if isinstance(payload, EventStream):
            with self._lock:
                payload.fail_after = (
                    self._stream_failures.popleft() if self._stream_failures else None
                )
            return status, payload, self._headers_for(status)
        if isinstance(payload, bytes | str):
            raw = payload.encode() if isinstance(payload, str) else payload
        else:
            raw = json.dumps(payload).encode()
        return status, raw, self._headers_for(status)


def _route_path(path: str) -> str:
    return path.split("?", 1)[0]
