"""The memory proxy: provider APIs in front of an upstream, with memory around each call.

``POST /v1/chat/completions`` and ``/v1/responses`` (OpenAI's shapes) and ``/v1/messages``
(Anthropic's) recall memory for the user the request names, inject it, forward the request,
relay the answer as it arrives and capture the exchange. The recall, the injection and the
reading of answers are capture's own endpoints (``capture/_openai.py``,
``capture/_anthropic.py``) applied to the request body, exactly as ``mem.llm.register``
applies them to an SDK call's keyword arguments. Any other ``/v1/...`` request is relayed
without memory, so a client that also lists models or embeds text needs only the one base
URL.

Memory never stands in the way: when it is slow or down the request goes upstream as the
caller sent it, and ``X-Stratamem-Memory`` says what happened (``injected``, ``none``,
``skipped``, ``off``). Upstream answers, errors included, reach the caller as the upstream
sent them. An answered exchange is stored, or counted and logged (``MemoryProxy.unstored``)
when it cannot be: never dropped silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

import anyio
import httpx
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from .. import _tracing
from ..capture._anthropic import MESSAGES
from ..capture._capture import Recalled, in_default_session
from ..capture._openai import CHAT, RESPONSES
from ..capture._scope import Attribution, check, scope
from ..capture._wrap import Endpoint, ExchangeSink, captured, prepared, stream_parts
from ..errors import ValidationError
from ..server._logging import NamedRoute
from ._json import loads
from ._sse import EventDecoder, EventTooLarge
from ._upstream import UnsafePath, Upstream, body_decoder, response_headers

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from ..capture._capture import Capture, Exchange

    # A project key check still running: the request went on without memory, and its
    # exchange goes to the project's capture once the check is done.
    Pending: TypeAlias = asyncio.Future[Capture]

__all__ = [
    "KEY_HEADER",
    "MEMORY_HEADER",
    "PROCESS_HEADER",
    "SESSION_HEADER",
    "USER_HEADER",
    "CaptureSource",
    "MemoryProxy",
    "Refused",
    "Unstored",
    "refusal",
]

log = logging.getLogger("stratamem.proxy")

USER_HEADER = "x-stratamem-user-id"
SESSION_HEADER = "x-stratamem-session-id"
PROCESS_HEADER = "x-stratamem-process-id"
KEY_HEADER = "x-stratamem-api-key"
MEMORY_HEADER = "x-stratamem-memory"

_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]
_RECALL_THREADS = 64
# Upstream connections are spread over several httpx clients: httpcore's pool walks every
# connection it holds on each request and each response's end (a poll() per idle socket),
# so with 64 concurrent streams one pool's bookkeeping took a fifth of the event loop. A
# request goes to the first pool with fewer than _SPREAD_AT answers in flight (else to the
# least busy): light traffic keeps reusing the first pool's warm connections (a new TLS
# connection to a provider costs tens of milliseconds), heavy traffic is spread.
_POOLS = 8
_SPREAD_AT = 8
_CONNECTIONS_PER_POOL = 32
# How long closing waits for key checks still running (their exchanges are stored after).
CLOSE_WAIT_SECONDS = 10.0


# What a handler returns when its caller has gone: nobody reads it.
_GONE = Response(status_code=499)


class Refused(Exception):
    """A request the proxy answers itself (no user, a bad id, a wrong stratamem key)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: str = "invalid_request_error",
        headers: Mapping[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.headers = headers  # e.g. a 429's Retry-After


class CaptureSource(Protocol):
    """Where a request's memory is: one memory (``stratamem proxy``), or the project its
    stratamem key names (``stratamem serve``)."""

    # The project of every request (the access log names it), if there is only one.
    project_id: str | None

    async def capture_for(self, request: Request) -> Capture | Pending:
        """The request's capture, or the check still running that will give it (the
        request then goes on without memory). Raises :class:`Refused`."""
        ...

    def warm_up(self) -> None:
        """Block until recall can answer within its bound (the embedding model loaded)."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class _Api:
    path: str
    endpoint: Endpoint
    anthropic: bool  # the upstream, key header and error shape are Anthropic's
    request: str  # what the recall log calls a call of this route


_APIS = {
    path: _Api(path, endpoint, anthropic=anthropic, request=f"POST {path}")
    for path, endpoint, anthropic in (
        ("/v1/chat/completions", CHAT, False),
        ("/v1/responses", RESPONSES, False),
        ("/v1/messages", MESSAGES, True),
    )
}


def _error_body(message: str, *, anthropic: bool, kind: str) -> dict[str, Any]:
    if anthropic:
        return {"type": "error", "error": {"type": kind, "message": message}}
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


def _error(
    status: int,
    message: str,
    *,
    anthropic: bool,
    kind: str,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """An error the proxy itself answers, in the provider's shape, so the caller's SDK
    raises it with the message intact."""
    body = _error_body(message, anthropic=anthropic, kind=kind)
    return JSONResponse(body, status_code=status, headers={MEMORY_HEADER: "off", **(headers or {})})


def refusal(path: str, message: str) -> dict[str, Any] | None:
    """A body refused before the proxy reads it (over the size limit), in the provider's
    shape on the proxy's paths; None elsewhere (``server/_limits.py``)."""
    if not path.startswith("/v1/"):
        return None
    return _error_body(message, anthropic=path == "/v1/messages", kind="invalid_request_error")


async def _body(request: Request, anthropic: bool) -> bytes | JSONResponse:
    """The request's body, or the provider-shaped 413 of a body that grew past the limit
    while it streamed in (one with a Content-Length over it never gets here)."""
    try:
        return await request.body()
    except HTTPException as exc:
        # Its headers close the connection: the rest of the body is never read.
        return _error(
            exc.status_code,
            str(exc.detail),
            anthropic=anthropic,
            kind="invalid_request_error",
            headers=exc.headers,
        )


def _identity(request: Request) -> Attribution | None:
    headers = request.headers
    user = headers.get(USER_HEADER)
    session = headers.get(SESSION_HEADER)
    process = headers.get(PROCESS_HEADER)
    if user is None:
        if session is not None or process is not None:
            raise Refused(400, f"{SESSION_HEADER} and {PROCESS_HEADER} need {USER_HEADER}")
        return None
    try:
        return check(user_id=user, session_id=session, process_id=process)
    except ValidationError as exc:
        problems = "; ".join(exc.problems) if exc.problems else str(exc)
        raise Refused(400, f"invalid stratamem header: {problems}") from None


def _json_object(raw: bytes) -> dict[str, Any] | None:
    try:
        body = json.loads(raw)
    except ValueError:
        return None
    except RecursionError:  # no provider reads it either: said now, in the provider's shape
        raise Refused(400, "the JSON body nests too deeply") from None
    return body if isinstance(body, dict) else None


class Unstored:
    """Answered exchanges the proxy could not store, counted by reason and each logged."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def __call__(self, reason: str) -> None:
        with self._lock:
            self.counts[reason] += 1
            n = self.counts[reason]
        log.warning("stratamem: an answered exchange is not stored: %s (%d so far)", reason, n)

    @property
    def total(self) -> int:
        return sum(self.counts.values())


class _Later:
    """The capture of a request whose project key check outlasted the recall bound: the
    exchange goes to the project's capture once the check is done (it is retried off the
    request path while the store is down), or is counted as unstored."""

    def __init__(self, check: Pending, unstored: Unstored) -> None:
        self._check = check
        self._unstored = unstored

    def after(self, exchange: Exchange) -> None:
        def checked(check: Pending) -> None:
            if check.cancelled():
                self._unstored("the proxy stopped before the project key was checked")
            elif isinstance(error := check.exception(), Refused):
                self._unstored(f"the project key was refused after the call ({error})")
            elif error is not None:
                self._unstored(f"the project key could not be checked ({type(error).__name__})")
            else:
                check.result().after(exchange)

        self._check.add_done_callback(checked)


def _prepare(
    api: _Api, capture: Capture, who: Attribution, body: dict[str, Any]
) -> tuple[Recalled | None, Any]:
    # In a worker thread: recall blocks (bounded by capture_recall_timeout_ms).
    with scope(who.user_id, who.session_id, who.process_id):
        return prepared(api.endpoint, capture, body, source="proxy", label=api.request)


@dataclass
class _Call:
    """One proxied call with memory: what capture needs once the answer is in.

    Only answers are captured (whole, or partial when the caller left a stream early). An
    attempt the upstream refused or failed is not: each of an SDK's retries is a request of
    its own here, so storing every failed attempt would store the user's turn once per try.
    """

    endpoint: Endpoint
    capture: ExchangeSink
    recalled: Recalled
    body: dict[str, Any]
    unstored: Unstored
    start: float = 0.0

    def answered(self, raw: bytes) -> None:
        try:
            answer = loads(raw)
        except ValueError:
            self.unstored("the upstream's answer is not JSON")
            return
        except RecursionError:
            self.unstored("the upstream's answer nests too deeply to read")
            return
        captured(self.endpoint, self.capture, self.recalled, self.body, answer, self.start)


def _upstream_span(method: str, target: httpx.URL, path: str) -> _tracing.Span:
    """The upstream call's HTTP client span: its route (``/v1/chat/completions``; other
    paths as ``/v1/{path}``) and host, never the query (a key may travel in it)."""
    route = path if path in _APIS else "/v1/{path}"
    return _tracing.open_span(
        f"{method} {route}",
        {
            "http.request.method": method,
            "url.template": route,
            _tracing.SERVER_ADDRESS: target.host,
            _tracing.SERVER_PORT: target.port or (443 if target.scheme == "https" else 80),
        },
    )


def _traced(headers: list[tuple[str, str]], span: _tracing.Span) -> list[tuple[str, str]]:
    """The upstream request's headers with the trace context of its span: the caller's
    own ``traceparent`` is replaced (the upstream's parent is the proxy's call); without
    tracing they go as they came."""
    carried = _tracing.headers_for(span)
    if not carried:
        return headers
    kept = [(k, v) for k, v in headers if k.lower() not in carried]
    return [*kept, *carried.items()]


async def _raw_body(answer: httpx.Response) -> bytes:
    """The answer's bytes as the upstream sent them (``aread`` would decode them)."""
    return b"".join([chunk async for chunk in answer.aiter_raw()])


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _unless_gone(request: Request, work: Awaitable[Any]) -> Any:
    """``work``'s result, or None when the caller disconnects first (``work`` is then
    cancelled: the upstream stops generating an answer nobody will read)."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_until_disconnect(request.receive))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(BaseException):
        await task
    return None


class _Relay:
    """The upstream's streamed answer, relayed chunk by chunk as it arrives.

    The client's disconnect is watched while the upstream is awaited, so a client that
    goes away stops the upstream's generation at once (not at its next chunk) and its
    exchange is captured as partial. ``finish(partial, error)`` runs exactly once."""

    def __init__(
        self,
        upstream: httpx.Response,
        headers: list[tuple[bytes, bytes]],
        on_chunk: Callable[[bytes], None] | None = None,
        finish: Callable[[bool, BaseException | None], None] | None = None,
        *,
        span: _tracing.Span = _tracing.NO_SPAN,
    ) -> None:
        self.upstream = upstream
        self.headers = headers
        self.on_chunk = on_chunk
        self.finish = finish
        self.span = span  # the upstream call's, ended with the relay

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ended, error = False, None
        try:
            async with anyio.create_task_group() as group:

                async def watch() -> None:
                    await _until_disconnect(receive)
                    group.cancel_scope.cancel()

                group.start_soon(watch)
                ended, error = await self._pump(send)
                group.cancel_scope.cancel()
        finally:
            if self.finish is not None:
                self._finish(not ended and error is None, error)
            if error is not None:
                _tracing.failed(self.span, error)
            self.span.end()
            # Not read to its end: the connection is closed, so the upstream stops.
            with anyio.CancelScope(shield=True):
                await self.upstream.aclose()
        if error is not None:
            # Headers are sent: aborting the connection is how the client learns the
            # stream broke (a clean end would pass a truncated answer for a whole one).
            raise error

    async def _pump(self, send: Send) -> tuple[bool, BaseException | None]:
        """(whether the whole answer was relayed, the upstream's error if it broke)."""
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": self.upstream.status_code,
                    "headers": self.headers,
                }
            )
            # Raw: the bytes as the upstream sent them (compressed or not); every chunk
            # that arrived before a break is relayed before the break is.
            async for chunk in self.upstream.aiter_raw():
                if self.on_chunk is not None:
                    self.on_chunk(chunk)
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except httpx.HTTPError as exc:
            return False, exc
        except OSError:  # the client went away while a chunk was being sent
            return False, None
        return True, None

    def _finish(self, partial: bool, error: BaseException | None) -> None:
        assert self.finish is not None
        try:
            self.finish(partial, error)
        except Exception:
            log.exception("stratamem: capturing a proxied stream failed")


def _tap(
    call: _Call, decode: Callable[[bytes], bytes]
) -> tuple[Callable[[bytes], None], Callable[[bool, BaseException | None], None]]:
    """What reads a copy of the stream for capture: SSE events into the endpoint's
    accumulator, and the exchange when the stream ends. ``decode`` undoes a compression
    the upstream applied although asked not to (the caller gets the bytes as sent). An
    event past the decoder's bound stops the reading (the rest is relayed only) and the
    exchange is counted as unstored: what was read of it is not the answer."""
    add, finish = stream_parts(call.endpoint, call.capture, call.recalled, call.body, call.start)
    decoder: EventDecoder | None = EventDecoder()

    def on_chunk(chunk: bytes) -> None:
        nonlocal decoder
        if decoder is None:
            return
        try:
            for event in decoder.feed(decode(chunk)):
                add(event)
        except EventTooLarge as exc:
            decoder = None
            call.unstored(f"the answer's stream has {exc}: relayed, not read")
        except Exception:  # an event we cannot read must not break the caller's stream
            log.exception("stratamem: could not read a proxied stream event")

    def finished(partial: bool, error: BaseException | None) -> None:
        if decoder is not None:
            finish(partial, error)

    return on_chunk, finished


class _CountingTransport(httpx.AsyncHTTPTransport):
    """An upstream pool that knows how many of its answers are still being read."""

    in_flight = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.in_flight += 1
        try:
            response = await super().handle_async_request(request)
        except BaseException:
            self.in_flight -= 1
            raise
        response.stream = _Counted(response.stream, self)
        return response


class _Counted(httpx.AsyncByteStream):
    """An answer's body; its pool's count goes down once, when it is closed."""

    def __init__(self, inner: Any, transport: _CountingTransport) -> None:
        self._inner = inner
        self._transport: _CountingTransport | None = transport

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            yield chunk

    async def aclose(self) -> None:
        if self._transport is not None:
            self._transport.in_flight -= 1
            self._transport = None
        await self._inner.aclose()


class MemoryProxy:
    """The proxy's routes. ``openai`` is the upstream of the OpenAI-shaped routes and of
    every other ``/v1`` path, ``anthropic`` that of ``/v1/messages``; a route whose upstream
    is None answers 501. ``require_user``: a memory route without ``X-Stratamem-User-Id``
    is refused (400) rather than relayed without memory."""

    def __init__(
        self,
        captures: CaptureSource,
        *,
        openai: Upstream | None,
        anthropic: Upstream | None,
        require_user: bool = True,
        timeout_s: float = 600.0,
    ) -> None:
        self._captures = captures
        self._openai = openai
        self._anthropic = anthropic
        self.require_user = require_user
        self._timeout_s = timeout_s
        self._clients: list[httpx.AsyncClient] = []
        self._transports: list[_CountingTransport] = []
        self.unstored = Unstored()
        # Key checks still running for exchanges relayed meanwhile: awaited when closing.
        self._pending: set[Pending] = set()
        # Each call's recall blocks a thread for up to its bound: a pool of the proxy's own,
        # so that many concurrent calls neither queue behind asyncio's small default pool
        # (min(32, cores + 4) threads) nor starve what else uses it.
        self._pool = ThreadPoolExecutor(_RECALL_THREADS, thread_name_prefix="stratamem-proxy")

    def routes(self) -> list[Route]:
        memory = [NamedRoute(path, self._with_memory, methods=["POST"]) for path in _APIS]
        return [*memory, NamedRoute("/v1/{path:path}", self._relay_only, methods=_METHODS)]

    async def warm_up(self) -> None:
        """Wait until recall can answer within its bound: a server's readiness (its
        lifespan's start, before it listens) waits for this, so that its first requests
        do not go out without memory while the embedding model loads."""
        if self._openai is not None or self._anthropic is not None:
            await asyncio.to_thread(self._captures.warm_up)

    async def aclose(self) -> None:
        """Close the upstream connections and store what capture has queued."""
        if self._pending:  # their exchanges go to capture once their key is checked
            await asyncio.wait(self._pending, timeout=CLOSE_WAIT_SECONDS)
            await asyncio.sleep(0)  # the checks' callbacks hand the exchanges over
        clients, self._clients = self._clients, []
        for client in clients:
            await client.aclose()
        await asyncio.to_thread(self._captures.close)
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- routes -------------------------------------------------------------------------

    async def _with_memory(self, request: Request) -> Response | _Relay:
        request.state.project_id = self._captures.project_id
        api = _APIS[request.url.path]
        upstream = self._anthropic if api.anthropic else self._openai
        if upstream is None:
            return self._unconfigured(api.anthropic)
        raw = await _body(request, api.anthropic)
        if isinstance(raw, JSONResponse):
            return raw
        try:
            who = _identity(request)
            if who is None and self.require_user:
                raise Refused(
                    400,
                    f"no user: send {USER_HEADER} (and optionally {SESSION_HEADER}) so the "
                    "call is remembered for that user; without it every caller would share "
                    "one memory",
                )
            call, state, raw = await self._memory(request, api, upstream, who, raw)
        except Refused as exc:
            return _error(
                exc.status, str(exc), anthropic=api.anthropic, kind=exc.kind, headers=exc.headers
            )
        return await self._forward(request, upstream, api.path, raw, state, call)

    async def _relay_only(self, request: Request) -> Response | _Relay:
        request.state.project_id = self._captures.project_id
        upstream = self._openai
        if upstream is None:
            return self._unconfigured(anthropic=False)
        if upstream.key is not None:  # the proxy's key is spent only for a known caller
            try:
                await self._captures.capture_for(request)
            except Refused as exc:
                return _error(
                    exc.status, str(exc), anthropic=False, kind=exc.kind, headers=exc.headers
                )
        raw = await _body(request, anthropic=False)
        if isinstance(raw, JSONResponse):
            return raw
        # As the caller sent it: what the upstream decodes is what is checked.
        path = request.scope.get("raw_path", request.url.path.encode()).decode("latin-1")
        return await self._forward(request, upstream, path, raw, "off", None)

    # -- internals -----------------------------------------------------------------------

    async def _memory(
        self,
        request: Request,
        api: _Api,
        upstream: Upstream,
        who: Attribution | None,
        raw: bytes,
    ) -> tuple[_Call | None, str, bytes]:
        """(the call to capture, the memory header's value, the body to send)."""
        body = _json_object(raw)  # not JSON: sent as it is, the upstream says what is wrong
        remembered = who is not None and body is not None
        if not remembered and upstream.key is None:
            return None, "off", raw
        # With the proxy's own upstream key, this also keeps strangers from spending it.
        capture = await self._captures.capture_for(request)
        if who is None or body is None:
            return None, "off", raw
        if isinstance(capture, asyncio.Future):  # no memory now; stored once it is checked
            self._pending.add(capture)
            capture.add_done_callback(self._pending.discard)
            later = _Later(capture, self.unstored)
            skipped = Recalled(in_default_session(who), skipped=True)
            return _Call(api.endpoint, later, skipped, body, self.unstored), "skipped", raw
        if capture.recall or capture.inject_history:
            recalled, sent = await asyncio.get_running_loop().run_in_executor(
                self._pool, _tracing.carry(_prepare), api, capture, who, body
            )
        else:  # nothing to wait for: no thread hop (on a busy machine, a wake-up costs)
            recalled, sent = _prepare(api, capture, who, body)
        if recalled is None:  # preparing failed (logged): the call goes as it came
            self.unstored("preparing the call failed (logged above)")
            return None, "skipped", raw
        if recalled.refused is not None:  # the exchange could not be stored as asked
            raise Refused(409, recalled.refused)
        call = _Call(api.endpoint, capture, recalled, body, self.unstored)
        # Nothing injected: the caller's bytes go. (The Responses and Anthropic endpoints
        # return a copy of the request even when they put nothing into it.)
        if sent is body or sent == body:
            return call, "skipped" if recalled.skipped else "none", raw
        encoded = json.dumps(sent, ensure_ascii=False, separators=(",", ":")).encode()
        return call, "injected", encoded

    async def _forward(
        self,
        request: Request,
        upstream: Upstream,
        path: str,
        raw: bytes,
        state: str,
        call: _Call | None,
    ) -> Response | _Relay:
        try:
            target = upstream.target(path, request.url.query)
        except UnsafePath:
            return _error(
                400,
                "the path has a '.' or '..' segment (raw or percent-encoded): it would leave /v1",
                anthropic=False,
                kind="invalid_request_error",
            )
        client = self._http()
        span = _upstream_span(request.method, target, path)
        outgoing = client.build_request(
            request.method,
            target,
            headers=_traced(upstream.headers(request.headers.items()), span),
            content=raw,
        )
        if call is not None:
            call.start = time.perf_counter()
        try:
            # Until its headers arrive, a plain call's answer is the whole wait: a caller
            # that gives up meanwhile cancels it (nothing is stored; its SDK retries).
            answer: httpx.Response | None = await _unless_gone(
                request, client.send(outgoing, stream=True)
            )
        except httpx.HTTPError as exc:
            _tracing.failed(span, exc)
            span.end()
            return self._unreachable(request, upstream, exc)
        if answer is None:
            span.end()
            return _GONE
        span.set_attribute("http.response.status_code", answer.status_code)
        if answer.status_code >= 500:
            span.set_attribute(_tracing.ERROR_TYPE, str(answer.status_code))
        headers = [
            *response_headers(answer.headers.raw),
            (MEMORY_HEADER.encode(), state.encode()),
        ]
        decode = body_decoder(answer.headers.get("content-encoding"))
        streamed = answer.headers.get("content-type", "").startswith("text/event-stream")
        if call is None or answer.status_code >= 400 or decode is None:
            return _Relay(answer, headers, span=span)  # relayed as it comes, not captured
        if streamed:
            return _Relay(answer, headers, *_tap(call, decode), span=span)
        try:
            content: bytes | None = await _unless_gone(request, _raw_body(answer))
        except httpx.HTTPError as exc:
            _tracing.failed(span, exc)
            return self._unreachable(request, upstream, exc)
        finally:
            span.end()
            await answer.aclose()
        if content is None:
            return _GONE
        call.answered(decode(content))
        relayed = Response(content, status_code=answer.status_code)
        relayed.raw_headers.extend(headers)
        return relayed

    def _http(self) -> httpx.AsyncClient:
        """The upstream client of the next request (see _POOLS)."""
        if not self._clients:
            limits = httpx.Limits(
                max_connections=_CONNECTIONS_PER_POOL,
                max_keepalive_connections=_CONNECTIONS_PER_POOL,
            )
            # The caller's request decides; never the proxy's environment.
            self._transports = [
                _CountingTransport(limits=limits, trust_env=False) for _ in range(_POOLS)
            ]
            self._clients = [
                httpx.AsyncClient(
                    transport=transport,
                    timeout=httpx.Timeout(self._timeout_s, connect=10.0),
                    follow_redirects=False,
                    trust_env=False,
                )
                for transport in self._transports
            ]
        busy = [t.in_flight for t in self._transports]
        free = next((i for i, n in enumerate(busy) if n < _SPREAD_AT), None)
        return self._clients[busy.index(min(busy)) if free is None else free]

    @staticmethod
    def _unreachable(request: Request, upstream: Upstream, exc: BaseException) -> JSONResponse:
        reason = type(exc).__name__
        log.warning("stratamem: the upstream %s failed: %s", upstream.shown, reason)
        return _error(
            502,
            f"stratamem proxy: the upstream {upstream.shown} failed ({reason})",
            anthropic=request.url.path == "/v1/messages",
            kind="api_error",
        )

    def _unconfigured(self, anthropic: bool) -> JSONResponse:
        which = "STRATAMEM_PROXY_ANTHROPIC_UPSTREAM or " if anthropic else ""
        return _error(
            501,
            f"the stratamem proxy has no upstream for this route: set {which}"
            "STRATAMEM_PROXY_UPSTREAM (stratamem proxy --upstream URL)",
            anthropic=anthropic,
            kind="api_error",
        )
