"""Slowing down credential guessing: failed checks per client address and credential kind.

Each (kind, address) has a token bucket of ``auth_failures_burst`` tokens that refills at
``auth_failures_per_minute``. Only a failed check (a wrong API key, admin token or
dashboard sign-in) takes a token; a correct one takes none, so a client with a valid key is
never slowed by anyone's failures, its own included, until it fails itself. An address
whose bucket is empty is answered 429 with ``Retry-After`` (the seconds until a token is
back) before its credential is even looked at, the right one included: a guesser cannot
tell a hit while it is held back. Buckets live in an LRU of at most
``auth_limiter_addresses`` entries, so memory stays bounded however many addresses come;
each replica keeps its own (an attacker spread over N replicas gets N times the rate, which
still rules out guessing a 128-bit key).

The address is the connection's peer, or the client a trusted reverse proxy names in
``X-Forwarded-For`` when ``forwarded_allow_ips`` lists that proxy (uvicorn applies it to the
ASGI scope before the app sees the request; ``stratamem serve`` passes the setting).
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Literal

from starlette.requests import HTTPConnection

from ._errors import ApiError
from ._settings import ServerSettings

__all__ = ["CredentialKind", "Throttle", "client_address"]

# A project API key (REST, MCP and the proxy's X-Stratamem-Api-Key alike: one secret space),
# the admin token of /admin, the dashboard's sign-in form (a key or the admin token).
CredentialKind = Literal["api_key", "admin_token", "sign_in"]


def client_address(connection: HTTPConnection) -> str:
    """Who is asking, as far as the server trusts: the peer's address (after uvicorn's
    trusted-proxy rewrite, see the module's docstring); "" when the transport has none."""
    client = connection.client
    return "" if client is None else client.host


class _Bucket:
    __slots__ = ("at", "tokens")

    def __init__(self, tokens: float, at: float) -> None:
        self.tokens = tokens
        self.at = at


class Throttle:
    """The failed-credential limiter of one app (thread-safe: checks run in worker threads)."""

    def __init__(
        self,
        *,
        burst: int,
        per_minute: float,
        max_addresses: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._burst = float(burst)
        self._rate = per_minute / 60.0  # tokens per second
        self._max = max_addresses
        self._clock = clock
        self._buckets: OrderedDict[tuple[str, str], _Bucket] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: ServerSettings) -> Throttle:
        return cls(
            burst=settings.auth_failures_burst,
            per_minute=settings.auth_failures_per_minute,
            max_addresses=settings.auth_limiter_addresses,
        )

    def _refilled(self, key: tuple[str, str], now: float) -> _Bucket | None:
        bucket = self._buckets.get(key)
        if bucket is None:
            return None
        bucket.tokens = min(self._burst, bucket.tokens + (now - bucket.at) * self._rate)
        bucket.at = now
        if bucket.tokens >= self._burst:  # full again: nothing to remember
            del self._buckets[key]
            return None
        return bucket

    def wait_seconds(self, kind: CredentialKind, address: str) -> int:
        """How long ``address`` must wait before its next ``kind`` credential is checked:
        0 if it may be checked now."""
        with self._lock:
            bucket = self._refilled((kind, address), self._clock())
            if bucket is None or bucket.tokens >= 1.0:
                return 0
            return max(1, math.ceil((1.0 - bucket.tokens) / self._rate))

    def check(self, kind: CredentialKind, address: str) -> None:
        """Raise a 429 ``ApiError`` (with ``Retry-After``) if ``address`` must wait."""
        wait = self.wait_seconds(kind, address)
        if wait:
            raise ApiError(
                429,
                f"too many failed {kind.replace('_', ' ')} attempts from this address; "
                f"try again in {wait} s",
                headers={"Retry-After": str(wait)},
            )

    def failed(self, kind: CredentialKind, address: str) -> None:
        """Count one failed ``kind`` credential check from ``address``."""
        key = (kind, address)
        with self._lock:
            now = self._clock()
            bucket = self._refilled(key, now)
            if bucket is None:
                bucket = self._buckets[key] = _Bucket(self._burst, now)
            self._buckets.move_to_end(key)
            bucket.tokens = max(0.0, bucket.tokens - 1.0)
            while len(self._buckets) > self._max:
                self._buckets.popitem(last=False)  # the least recently failing address
