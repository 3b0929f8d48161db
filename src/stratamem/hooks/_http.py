"""One webhook POST: resolved and checked once, pinned, bounded in time and size.

The request goes to the checked IP address with the original ``Host`` header and, for
https, the original name as TLS SNI and for certificate verification, so DNS is consulted
exactly once per delivery. Redirects are never followed and no proxy is used (httpcore's
pool does neither), the answer is read raw (no decompression to inflate it) and cut at the
size cap, and the whole exchange ends by the hook's timeout in wall-clock time: resolution,
connecting, the TLS handshake, sending the request, the status line and headers and the
body together, however slowly the receiver trickles them (``_deadline.py``). Nothing here
raises: every outcome is an :class:`HttpResult`, and a timeout says which step it cut short.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from .. import _tracing
from ._ssrf import AllowList, DeliveryError, Resolver, parse_target, pin, system_resolver

if TYPE_CHECKING:
    import httpcore

    from ..store import WebhookRow
    from ._deadline import DeadlineBackend

__all__ = ["EXCERPT_CHARS", "HttpResult", "WebhookHttp", "excerpt", "http_failure", "traced_post"]

# Pools are kept per (scheme, host, address, port): a pooled connection is only ever
# reused for the host name its TLS session was verified for.
_MAX_POOLS = 256
# How much of a request and an answer the delivery log keeps.
EXCERPT_CHARS = 4096


@dataclass(frozen=True)
class HttpResult:
    """What came back. ``error`` is set when no complete answer arrived (refused,
    unreachable, timed out, over the size cap); ``status`` is then the status if one came."""

    status: int | None
    body: bytes
    latency_ms: float
    error: str | None = None
    location: str | None = None


class WebhookHttp:
    """Sends webhook requests. Thread-safe; keeps connections alive per checked target."""

    def __init__(
        self,
        allow: AllowList,
        *,
        max_response_bytes: int = 1_048_576,
        resolver: Resolver = system_resolver,
        tls: ssl.SSLContext | None = None,
        user_agent: str = "stratamem-webhooks",
    ) -> None:
        self.allow = allow
        self.max_response_bytes = max_response_bytes
        self.resolver = resolver
        self.user_agent = user_agent
        self._pools: OrderedDict[tuple[str, str, str, int], httpcore.ConnectionPool] = OrderedDict()
        self._backend: DeadlineBackend | None = None
        self._lock = threading.Lock()
        # ``tls``: trust other than the public CAs (a private CA); verification stays on.
        self._ssl = tls

    def _pool(
        self, key: tuple[str, str, str, int]
    ) -> tuple[httpcore.ConnectionPool, DeadlineBackend]:
        # Lazily: `import stratamem` must not pay for httpcore.
        import httpcore

        from ._deadline import DeadlineBackend

        with self._lock:
            if self._backend is None:
                self._backend = DeadlineBackend()
            pool = self._pools.get(key)
            if pool is not None:
                self._pools.move_to_end(key)
                return pool, self._backend
            pool = httpcore.ConnectionPool(
                ssl_context=self._tls() if key[0] == "https" else None,
                max_connections=32,
                keepalive_expiry=30.0,
                # The request goes out as two writes (head, then body): with Nagle on, the
                # body waits for the receiver's delayed ACK of the head, ~40 ms on Linux.
                socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
                network_backend=self._backend,
            )
            self._pools[key] = pool
            if len(self._pools) > _MAX_POOLS:
                # Not closed here: another thread may be mid-request on it. Its pooled
                # sockets close when it is collected.
                self._pools.popitem(last=False)
            return pool, self._backend

    def _tls(self) -> ssl.SSLContext:
        # Loading the CA bundle takes tens of milliseconds: once, not per target.
        if self._ssl is None:
            import certifi

            self._ssl = ssl.create_default_context(cafile=certifi.where())
        return self._ssl

    def post(self, url: str, body: bytes, headers: dict[str, str], timeout_ms: int) -> HttpResult:
        import httpcore

        started = time.monotonic()
        deadline = started + timeout_ms / 1000

        def elapsed() -> float:
            return (time.monotonic() - started) * 1000

        def timed_out(step: str) -> str:
            return f"timed out after {elapsed():.0f} ms {step} (timeout {timeout_ms} ms)"

        try:
            target = parse_target(url)
            pinned = pin(target, self.allow, self.resolver, timeout_ms / 1000)
        except DeliveryError as exc:
            return HttpResult(None, b"", elapsed(), str(exc))
        left = deadline - time.monotonic()
        if left <= 0:
            return HttpResult(None, b"", elapsed(), timed_out(f"resolving {target.host}"))
        pool, backend = self._pool((target.scheme, target.host, pinned.address, target.port))
        status: int | None = None
        location: str | None = None
        chunks: list[bytes] = []
        size = 0
        error = None
        with backend.bound(deadline):
            try:
                with pool.stream(
                    "POST",
                    httpcore.URL(
                        scheme=target.scheme,
                        host=pinned.address,
                        port=target.port,
                        target=target.path,
                    ),
                    # As pairs: httpcore types a mapping of headers as one whose keys may
                    # be bytes too, which a dict of str is not.
                    headers=list(
                        {
                            **headers,
                            "Host": target.host_header,
                            "Content-Type": "application/json",
                            "Accept": "application/json",
                            "Accept-Encoding": "identity",
                            "User-Agent": self.user_agent,
                        }.items()
                    ),
                    content=body,
                    extensions={
                        # Waiting for a pooled connection is the one wait outside the
                        # backend's reach; the others are cut at the deadline anyway.
                        "timeout": dict.fromkeys(("pool", "connect", "read", "write"), left),
                        "sni_hostname": target.host,
                    },
                ) as response:
                    status = response.status
                    location = next(
                        (
                            v.decode("latin-1")
                            for k, v in response.headers
                            if k.lower() == b"location"
                        ),
                        None,
                    )
                    # Leaving an answer unread (the cap) closes its connection, not pools it.
                    for chunk in response.iter_stream():
                        chunks.append(chunk)
                        size += len(chunk)
                        if size > self.max_response_bytes:
                            error = f"answer over {self.max_response_bytes} bytes (cut)"
                            break
            except httpcore.PoolTimeout:
                error = timed_out("waiting for a free connection to the receiver")
            except httpcore.TimeoutException:
                step = (
                    backend.phase
                    if status is None
                    else f"reading the answer body ({size} bytes in)"
                )
                error = timed_out(step)
            except (
                httpcore.NetworkError,
                httpcore.ProtocolError,
                httpcore.UnsupportedProtocol,
                OSError,
            ) as exc:
                if status is None:
                    error = f"unreachable: {_describe(exc)}"
                else:
                    error = f"connection broken while reading the answer: {_describe(exc)}"
        data = b"".join(chunks)[: self.max_response_bytes]
        return HttpResult(status, data, elapsed(), error, location)

    def close(self) -> None:
        with self._lock:
            pools, self._pools = list(self._pools.values()), OrderedDict()
        for pool in pools:
            pool.close()


def traced_post(
    http: WebhookHttp, hook: WebhookRow, mode: str, body: bytes, headers: dict[str, str]
) -> HttpResult:
    """POST one delivery of ``hook`` as an HTTP client span (``POST``; no URL on it: a
    webhook's path or query may hold a secret), the trace's ``traceparent`` sent along."""
    target = urlsplit(hook.target_url)
    attributes: dict[str, Any] = {
        "http.request.method": "POST",
        "stratamem.webhook.id": hook.id,
        "stratamem.webhook.event": f"{hook.resource}.{hook.event}",
        "stratamem.webhook.mode": mode,
    }
    if target.hostname:
        attributes[_tracing.SERVER_ADDRESS] = target.hostname
    with _tracing.span("POST", attributes, kind="client") as span:
        sent = {**headers, **_tracing.outgoing_headers()}
        result = http.post(hook.target_url, body, sent, hook.timeout_ms)
        if span.is_recording():
            if result.status is not None:
                span.set_attribute("http.response.status_code", result.status)
            failure = http_failure(result)
            if failure is not None:
                kind = str(result.status) if result.error is None else "_OTHER"
                _tracing.failed(span, _DeliveryFailed(failure), error_type=kind)
    return result


class _DeliveryFailed(Exception):
    """Why a delivery failed, as the span records it."""


def http_failure(result: HttpResult) -> str | None:
    """Why an exchange failed before its answer is even read (``None``: a 2xx arrived)."""
    if result.error is not None:
        return result.error
    status = result.status or 0
    if 300 <= status < 400:
        to = f" to {result.location[:200]}" if result.location else ""
        return f"HTTP {status}: redirect{to} not followed"
    if not 200 <= status < 300:
        return f"HTTP {status}"
    return None


def excerpt(data: bytes | str) -> str:
    """The start of a request or answer, as the delivery log keeps it."""
    text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
    if len(text) <= EXCERPT_CHARS:
        return text
    return text[:EXCERPT_CHARS] + f"... [{len(text) - EXCERPT_CHARS} more characters]"


def _describe(exc: BaseException) -> str:
    text = " ".join(str(exc).split())[:200]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
