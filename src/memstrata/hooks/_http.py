"""One webhook POST: resolved and checked once, pinned, bounded in time and size.

The request goes to the checked IP address with the original ``Host`` header and, for
https, the original name as TLS SNI and for certificate verification, so DNS is consulted
exactly once per delivery. Redirects are never followed, proxies from the environment
are ignored (they would connect wherever they like), the answer is read raw (no
decompression to inflate it) and cut at the size cap, and the whole exchange is bounded by
the hook's timeout. Nothing here raises: every outcome is an :class:`HttpResult`.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._ssrf import AllowList, DeliveryError, Resolver, parse_target, pin, system_resolver

if TYPE_CHECKING:
    import httpx

__all__ = ["EXCERPT_CHARS", "HttpResult", "WebhookHttp", "excerpt", "http_failure"]

_CHUNK = 65_536
# Clients are kept per (scheme, host, address, port): a pooled connection is only ever
# reused for the host name its TLS session was verified for.
_MAX_CLIENTS = 256
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
        user_agent: str = "memstrata-webhooks",
    ) -> None:
        self.allow = allow
        self.max_response_bytes = max_response_bytes
        self.resolver = resolver
        self.user_agent = user_agent
        self._clients: OrderedDict[tuple[str, str, str, int], httpx.Client] = OrderedDict()
        self._lock = threading.Lock()
        # ``tls``: trust other than the public CAs (a private CA); verification stays on.
        self._ssl = tls

    def _client(self, key: tuple[str, str, str, int]) -> httpx.Client:
        import httpx  # lazily: `import memstrata` must not pay for it

        with self._lock:
            client = self._clients.get(key)
            if client is not None:
                self._clients.move_to_end(key)
                return client
            transport = httpx.HTTPTransport(
                verify=self._tls() if key[0] == "https" else False,
                trust_env=False,
                limits=httpx.Limits(max_connections=32, keepalive_expiry=30.0),
                # The request goes out as two writes (head, then body): with Nagle on, the
                # body waits for the receiver's delayed ACK of the head, ~40 ms on Linux.
                socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
            )
            client = httpx.Client(trust_env=False, follow_redirects=False, transport=transport)
            self._clients[key] = client
            if len(self._clients) > _MAX_CLIENTS:
                # Not closed here: another thread may be mid-request on it. Its pooled
                # sockets close when it is collected.
                self._clients.popitem(last=False)
            return client

    def _tls(self) -> ssl.SSLContext:
        # Loading the CA bundle takes tens of milliseconds: once, not per target. Plain
        # http clients get verify=False only because they never start TLS at all.
        if self._ssl is None:
            import certifi

            self._ssl = ssl.create_default_context(cafile=certifi.where())
        return self._ssl

    def post(self, url: str, body: bytes, headers: dict[str, str], timeout_ms: int) -> HttpResult:
        import httpx

        started = time.perf_counter()
        timeout = timeout_ms / 1000
        deadline = started + timeout

        def elapsed() -> float:
            return (time.perf_counter() - started) * 1000

        try:
            target = parse_target(url)
            pinned = pin(target, self.allow, self.resolver, timeout)
        except DeliveryError as exc:
            return HttpResult(None, b"", elapsed(), str(exc))
        remaining = max(0.001, deadline - time.perf_counter())
        client = self._client((target.scheme, target.host, pinned.address, target.port))
        request = client.build_request(
            "POST",
            pinned.url,
            content=body,
            headers={
                **headers,
                "Host": target.host_header,
                "Content-Type": "application/json",
                "Accept": "application/json",
                "Accept-Encoding": "identity",
                "User-Agent": self.user_agent,
            },
            timeout=httpx.Timeout(remaining),
            extensions={"sni_hostname": target.host},
        )
        try:
            response = client.send(request, stream=True)
        except httpx.TimeoutException:
            return HttpResult(None, b"", elapsed(), f"timed out after {timeout_ms} ms")
        except (httpx.HTTPError, OSError) as exc:
            return HttpResult(None, b"", elapsed(), f"unreachable: {_describe(exc)}")
        status = response.status_code
        location = response.headers.get("location")
        chunks: list[bytes] = []
        size = 0
        error = None
        try:
            for chunk in response.iter_raw(_CHUNK):
                chunks.append(chunk)
                size += len(chunk)
                if size > self.max_response_bytes:
                    error = f"answer over {self.max_response_bytes} bytes (cut)"
                    break
                if time.perf_counter() > deadline:
                    error = f"timed out after {timeout_ms} ms (answer still arriving)"
                    break
        except httpx.TimeoutException:
            error = f"timed out after {timeout_ms} ms (reading the answer)"
        except (httpx.HTTPError, OSError) as exc:
            error = f"connection broken while reading the answer: {_describe(exc)}"
        finally:
            # Leaving an answer unread closes its connection instead of pooling it.
            response.close()
        data = b"".join(chunks)[: self.max_response_bytes]
        return HttpResult(status, data, elapsed(), error, location)

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), OrderedDict()
        for client in clients:
            client.close()


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
