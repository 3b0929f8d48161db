"""One HTTP layer under the sync and async clients: URL, key, timeouts, retries, envelope.

A client method describes its request as a :class:`Call` (method, path, body, how to read
the answer); :class:`Transport` and :class:`AsyncTransport` carry it out. Everything but
the I/O itself (headers, timeouts, when to retry, reading the envelope, mapping errors) is
shared, so the two clients cannot drift apart.

Retries: a request that never reached the server (connection refused, connect timeout) is
always safe to resend. A request that may have reached it is resent only when it is
idempotent (reads, and writes the server deduplicates: ``_calls`` gives messages, events and
new sessions their ids before the first try) and the connection dropped or the server
answered 503 (or a reverse proxy in front of it 502/504). A read timeout is never retried:
the bound the caller set is the bound.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx
from pydantic import ValidationError as PydanticValidationError
from pydantic_core import PydanticSerializationError, to_jsonable_python

from .. import __version__, _tracing
from .._checks import MAX_PAGE
from .._strings import value_problem
from ..errors import ConfigError, ProcessingError
from ._errors import (
    APIConnectionError,
    APIError,
    APIStatusError,
    APITimeoutError,
    ValidationError,
    error_for_status,
)

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_MAX_RETRIES",
    "DEFAULT_SYNC_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "AsyncTransport",
    "Call",
    "Transport",
    "path_segment",
]

T = TypeVar("T")

DEFAULT_TIMEOUT = 30.0
DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_MAX_RETRIES = 2
# add_messages(sync=True) holds the request open while the server processes; the server
# gives up after its own sync_timeout_seconds (120 s by default) and answers 503.
DEFAULT_SYNC_TIMEOUT = 150.0
_BACKOFF_BASE = 0.25
_BACKOFF_CAP = 8.0
_RETRY_AFTER_CAP = 30.0
_IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})
_UNAVAILABLE = frozenset({502, 503, 504})


def path_segment(value: str) -> str:
    # Ids may hold "/" (the server matches them as paths) and "+", "=", "@", ":": encode
    # everything so an id is always exactly one segment on the wire.
    return quote(value, safe="")


@dataclass(frozen=True)
class Call(Generic[T]):
    """One API request and how to turn the envelope's ``data`` into the caller's value.

    ``paged=(limit, offset)`` marks a list route: the transport follows ``next_offset``
    across server pages until ``limit`` items are collected, then ``parse`` gets the items.
    """

    method: str
    path: str
    parse: Callable[[Any], T]
    params: Mapping[str, Any] | None = None
    body: Any = None
    idempotent: bool | None = None
    read_timeout: float | None = None
    paged: tuple[int, int] | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    # A 503 (or a proxy's 502/504) to a write with sync=True usually means its messages are
    # stored and their processing failed or outlasted the server's sync_timeout_seconds: a
    # resend would only wait as long again, so such a call is resent after a dropped
    # connection only.
    resend_unavailable: bool = True

    @property
    def retry_safe(self) -> bool:
        if self.idempotent is not None:
            return self.idempotent
        return self.method in _IDEMPOTENT_METHODS


def normalize_base_url(base_url: str) -> str:
    if not isinstance(base_url, str) or not base_url.strip():
        raise ConfigError("base_url: expected the server's URL, e.g. http://127.0.0.1:8000")
    url = base_url.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    if not url.lower().startswith(("http://", "https://")):
        raise ConfigError(f"base_url: expected an http:// or https:// URL (got {base_url!r})")
    return url


def authorization(api_key: str | None) -> dict[str, str]:
    if api_key is None:
        return {}
    key = api_key.strip()
    if not key:
        raise ConfigError("api_key: empty")
    scheme, _, rest = key.partition(" ")
    # A key pasted with its scheme ("Api-Key ...", "Bearer ...") is sent as it is.
    if rest.strip() and scheme.lower() in ("api-key", "bearer"):
        return {"Authorization": f"{scheme} {rest.strip()}"}
    return {"Authorization": f"Api-Key {key}"}


def _timeout_config(
    timeout: float | httpx.Timeout | None, connect_timeout: float | None
) -> httpx.Timeout:
    if isinstance(timeout, httpx.Timeout):
        return timeout
    read = DEFAULT_TIMEOUT if timeout is None else float(timeout)
    connect = DEFAULT_CONNECT_TIMEOUT if connect_timeout is None else float(connect_timeout)
    if read <= 0 or connect <= 0:
        raise ConfigError("timeout and connect_timeout must be positive numbers of seconds")
    return httpx.Timeout(read, connect=min(connect, read))


MAX_REDIRECTS = 5
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _delay(attempt: int, response: httpx.Response | None) -> float:
    if response is not None:
        hint = response.headers.get("retry-after")
        try:
            if hint is not None:
                return min(_RETRY_AFTER_CAP, max(0.0, float(hint)))
        except ValueError:
            pass
    # Full jitter: many clients retrying after one outage must not arrive in step.
    return random.uniform(0, min(_BACKOFF_CAP, _BACKOFF_BASE * 2**attempt))


def _malformed(call: Call[Any], why: str) -> APIError:
    # A server of another version, or something else answering at base_url: say so rather
    # than let a parsing error from deep inside look like a bug of the caller.
    err = APIError(
        f"{call.method} {call.path}: the server's answer is not what this client "
        f"expects ({why[:300]})"
    )
    err.detail = str(err)
    return err


def _origin(url: httpx.URL) -> tuple[str, str, int | None]:
    return url.scheme, url.host, url.port or _DEFAULT_PORTS.get(url.scheme)


def _redirect_target(call: Call[Any], response: httpx.Response, hops: int) -> str | None:
    """Where a redirect on the server's own origin leads (to be sent again with the same
    method, body and key), or None if ``response`` is no redirect. A redirect to another
    origin is refused: following it would carry the request and the key to another host
    (httpx drops ``Authorization`` there, not the body nor custom headers)."""
    location = response.headers.get("location")
    if not 300 <= response.status_code < 400 or location is None:
        return None
    target = response.url.join(location)
    why = None
    if _origin(target) != _origin(response.url):
        why = f"a redirect to another origin ({target.scheme}://{target.netloc.decode()})"
    elif hops >= MAX_REDIRECTS:
        why = f"more than {MAX_REDIRECTS} redirects"
    if why is None:
        return str(target)
    err = APIStatusError(
        f"{call.method} {call.path}: the server answered {response.status_code}, {why}, not "
        "followed: it would carry the request and its key elsewhere; set base_url to the "
        "server's own URL"
    )
    err.status_code, err.detail = response.status_code, str(err)
    raise err


def _decode(call: Call[Any], response: httpx.Response) -> Any:
    try:
        body: Any = response.json()
    except ValueError:
        body = response.text
    if response.status_code >= 400:
        raise error_for_status(response.status_code, body, response.headers)
    if not isinstance(body, dict) or "success" not in body:
        exc = APIStatusError(
            f"{call.method} {call.path}: the server answered {response.status_code} without "
            "stratamem's envelope; is base_url a stratamem server?"
        )
        exc.status_code, exc.body = response.status_code, body
        raise exc
    if body.get("success") is False:
        raise error_for_status(500, body, response.headers)
    return body.get("data")


class _Base:
    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        *,
        timeout: float | httpx.Timeout | None,
        connect_timeout: float | None,
        max_retries: int | None,
        headers: Mapping[str, str] | None,
    ) -> None:
        self.base_url = normalize_base_url(base_url)
        self.timeout = _timeout_config(timeout, connect_timeout)
        retries = DEFAULT_MAX_RETRIES if max_retries is None else max_retries
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ConfigError("max_retries: expected an integer >= 0")
        self.max_retries = retries
        self.headers = {
            "Accept": "application/json",
            "User-Agent": f"stratamem-client/{__version__}",
            **authorization(api_key),
            **(headers or {}),
        }
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise ProcessingError("this client is closed")

    def _request_args(self, call: Call[Any], params: Mapping[str, Any] | None) -> dict[str, Any]:
        timeout = self.timeout
        if call.read_timeout is not None and call.read_timeout > (timeout.read or 0):
            timeout = httpx.Timeout(
                connect=timeout.connect,
                read=call.read_timeout,
                write=timeout.write,
                pool=timeout.pool,
            )
        args: dict[str, Any] = {
            "method": call.method,
            "url": self.base_url + call.path,
            "params": {k: v for k, v in (params or {}).items() if v is not None} or None,
            # The caller's trace continues on the server (traceparent), when traced.
            "headers": {**self.headers, **call.headers, **_tracing.outgoing_headers()},
            "timeout": timeout,
            # Whatever the http_client given says: redirects are followed here, on the
            # server's own origin only (_redirect_target).
            "follow_redirects": False,
        }
        # Text UTF-8 cannot encode (a lone surrogate) would fail inside the encoders; the
        # server would refuse it anyway, so it is the same ValidationError, naming the field.
        for part in (args["params"], call.body):
            if (found := value_problem(part)) is not None:
                problem = f"{found[0].lstrip('.')}: {found[1]}"
                raise ValidationError("invalid request; nothing was sent", [problem])
        if call.body is not None:
            try:
                args["json"] = to_jsonable_python(call.body)
            except PydanticSerializationError as exc:
                raise ValidationError(
                    "invalid request; nothing was sent", [f"body: not JSON-serialisable ({exc})"]
                ) from None
        return args

    def _connection_error(
        self, call: Call[Any], exc: httpx.TransportError, timeout: httpx.Timeout
    ) -> APIError:
        where = f"{call.method} {self.base_url}{call.path}"
        err: APIError
        if isinstance(exc, httpx.ConnectTimeout):
            err = APITimeoutError(f"{where}: no connection within {timeout.connect} s")
        elif isinstance(exc, httpx.TimeoutException):
            err = APITimeoutError(f"{where}: no answer within the timeout ({exc})")
        else:
            err = APIConnectionError(f"{where}: {type(exc).__name__}: {exc}")
        err.detail = str(err)
        return err

    def _parse(self, call: Call[T], data: Any) -> T:
        try:
            return call.parse(data)
        except (PydanticValidationError, TypeError, ValueError, KeyError) as exc:
            raise _malformed(call, f"{type(exc).__name__}: {exc}") from exc

    @staticmethod
    def _items(call: Call[Any], data: Any) -> tuple[list[Any], int | None]:
        if not isinstance(data, dict) or not isinstance(data.get("items"), list):
            raise _malformed(call, "expected a page {items, limit, offset, next_offset}")
        following = data.get("next_offset")
        return data["items"], following if isinstance(following, int) else None

    @staticmethod
    def _retryable(call: Call[Any], exc: BaseException | None, response: Any) -> bool:
        if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
            return True  # the request never left this process
        if not call.retry_safe:
            return False
        if exc is not None:
            return isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError))
        # 502/504: a reverse proxy in front of a server that is restarting or slow.
        return (
            response is not None
            and response.status_code in _UNAVAILABLE
            and call.resend_unavailable
        )


class Transport(_Base):
    """Blocking requests on one ``httpx.Client`` (pooled connections, thread-safe)."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        timeout: float | httpx.Timeout | None = None,
        connect_timeout: float | None = None,
        max_retries: int | None = None,
        headers: Mapping[str, str] | None = None,
        http_client: httpx.Client | None = None,
    ) -> None:
        super().__init__(
            base_url,
            api_key,
            timeout=timeout,
            connect_timeout=connect_timeout,
            max_retries=max_retries,
            headers=headers,
        )
        self._owned = http_client is None
        self._http = http_client or httpx.Client(timeout=self.timeout)
        self._lock = threading.Lock()

    def send(self, call: Call[T]) -> T:
        if call.paged is None:
            return self._parse(call, self._request(call, call.params))
        limit, offset = call.paged
        items: list[Any] = []
        while True:
            size = min(limit - len(items), MAX_PAGE)
            data = self._request(call, {**(call.params or {}), "limit": size, "offset": offset})
            page, following = self._items(call, data)
            items.extend(page)
            if following is None or len(items) >= limit:
                return self._parse(call, items)
            offset = following

    def _request(self, call: Call[Any], params: Mapping[str, Any] | None) -> Any:
        self._check_open()
        args = self._request_args(call, params)
        attempt = hops = 0
        while True:
            response: httpx.Response | None = None
            try:
                response = self._http.request(**args)
            except httpx.TransportError as exc:
                if attempt >= self.max_retries or not self._retryable(call, exc, None):
                    raise self._connection_error(call, exc, args["timeout"]) from exc
            else:
                if (target := _redirect_target(call, response, hops)) is not None:
                    args, hops = {**args, "url": target, "params": None}, hops + 1
                    continue
                if attempt >= self.max_retries or not self._retryable(call, None, response):
                    return _decode(call, response)
            time.sleep(_delay(attempt, response))
            attempt += 1

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._owned:
            self._http.close()


class AsyncTransport(_Base):
    """The same requests on one ``httpx.AsyncClient``."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        timeout: float | httpx.Timeout | None = None,
        connect_timeout: float | None = None,
        max_retries: int | None = None,
        headers: Mapping[str, str] | None = None,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        super().__init__(
            base_url,
            api_key,
            timeout=timeout,
            connect_timeout=connect_timeout,
            max_retries=max_retries,
            headers=headers,
        )
        self._owned = http_client is None
        self._http = http_client or httpx.AsyncClient(timeout=self.timeout)

    async def send(self, call: Call[T]) -> T:
        if call.paged is None:
            return self._parse(call, await self._request(call, call.params))
        limit, offset = call.paged
        items: list[Any] = []
        while True:
            size = min(limit - len(items), MAX_PAGE)
            params = {**(call.params or {}), "limit": size, "offset": offset}
            data = await self._request(call, params)
            page, following = self._items(call, data)
            items.extend(page)
            if following is None or len(items) >= limit:
                return self._parse(call, items)
            offset = following

    async def _request(self, call: Call[Any], params: Mapping[str, Any] | None) -> Any:
        self._check_open()
        args = self._request_args(call, params)
        attempt = hops = 0
        while True:
            response: httpx.Response | None = None
            try:
                response = await self._http.request(**args)
            except httpx.TransportError as exc:
                if attempt >= self.max_retries or not self._retryable(call, exc, None):
                    raise self._connection_error(call, exc, args["timeout"]) from exc
            else:
                if (target := _redirect_target(call, response, hops)) is not None:
                    args, hops = {**args, "url": target, "params": None}, hops + 1
                    continue
                if attempt >= self.max_retries or not self._retryable(call, None, response):
                    return _decode(call, response)
            await asyncio.sleep(_delay(attempt, response))
            attempt += 1

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._owned:
            await self._http.aclose()
