"""An httpcore network backend whose sockets never outlast the exchange's deadline.

httpcore (and so httpx) applies its timeouts to each socket operation: a receiver that
sends one byte before each timeout runs out keeps a request going for as long as it likes.
Here every operation (connect, TLS handshake, each send, each read) gets only the time
left until the deadline of the exchange this thread is making, so the exchange as a whole
ends by then whatever the peer does. The deadline is the thread's: a sync httpcore
request runs entirely in its caller's thread, and a pooled connection serves one request
at a time.
"""

from __future__ import annotations

import ssl
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import httpcore

__all__ = ["DeadlineBackend"]


class _Exchange(threading.local):
    """The exchange this thread is making: when it must end, and what it is doing."""

    deadline: float | None = None  # time.monotonic()
    phase: str = ""


class DeadlineBackend(httpcore.NetworkBackend):
    """``httpcore.SyncBackend`` under the deadline :meth:`bound` sets for this thread."""

    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()
        self._exchange = _Exchange()

    @contextmanager
    def bound(self, deadline: float) -> Iterator[None]:
        """Socket operations of this thread end by ``deadline`` (``time.monotonic()``)."""
        self._exchange.deadline, self._exchange.phase = deadline, ""
        try:
            yield
        finally:
            self._exchange.deadline = None

    @property
    def phase(self) -> str:
        """What this thread's exchange was doing last: the step a timeout cut short."""
        return self._exchange.phase

    def left(self, phase: str, timeout: float | None, expired: type[Exception]) -> float | None:
        """The timeout of the next operation of ``phase``; raises ``expired`` once the
        deadline has passed (a zero timeout would make the socket non-blocking instead)."""
        self._exchange.phase = phase
        deadline = self._exchange.deadline
        if deadline is None:
            return timeout
        left = deadline - time.monotonic()
        if left <= 0:
            raise expired("the delivery's deadline has passed")
        return left if timeout is None else min(timeout, left)

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> _DeadlineStream:
        timeout = self.left("connecting", timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(
            self._inner.connect_tcp(host, port, timeout, local_address, socket_options), self
        )

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class _DeadlineStream(httpcore.NetworkStream):
    """A connection of :class:`DeadlineBackend` (plain or TLS)."""

    def __init__(self, stream: httpcore.NetworkStream, backend: DeadlineBackend) -> None:
        self._stream = stream
        self._backend = backend

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        # One recv: bounded by the time it is given (on TLS, CPython bounds the whole
        # record read by it too).
        timeout = self._backend.left(
            "waiting for the status line and headers", timeout, httpcore.ReadTimeout
        )
        return self._stream.read(max_bytes, timeout)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        # httpcore's write repeats send() under one timeout until all is sent, so a receiver
        # that reads slowly gets the full timeout per send. Each send here gets what is left.
        sock = self._stream.get_extra_info("socket")
        view = memoryview(buffer)
        try:
            while view:
                sock.settimeout(
                    self._backend.left("sending the request", timeout, httpcore.WriteTimeout)
                )
                view = view[sock.send(view) :]
        except TimeoutError as exc:
            raise httpcore.WriteTimeout(exc) from exc
        except OSError as exc:
            raise httpcore.WriteError(exc) from exc

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> _DeadlineStream:
        # The handshake is one blocking call, which CPython bounds by the socket's timeout
        # as a whole (not per read), whatever the peer trickles.
        timeout = self._backend.left("in the TLS handshake", timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(
            self._stream.start_tls(ssl_context, server_hostname, timeout), self._backend
        )

    def close(self) -> None:
        self._stream.close()

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)
