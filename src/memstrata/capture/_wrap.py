"""One wrapper for every generation method: prepare (recall, inject), call, capture — plain
results at once, streams when they end. Each provider supplies an :class:`Endpoint`."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ._capture import Capture, Exchange, Recalled, elapsed_ms
from ._streams import AsyncStreamProxy, StreamProxy

__all__ = ["Accumulator", "Endpoint", "prepared", "restore", "wrap_method"]

log = logging.getLogger("memstrata.capture")


class Accumulator(Protocol):
    """Rebuilds an answer from stream chunks."""

    def add(self, chunk: Any) -> None: ...

    def exchange(
        self,
        recalled: Recalled,
        kwargs: dict[str, Any],
        latency_ms: float,
        partial: bool,
        error: str | None,
    ) -> Exchange: ...


@dataclass(frozen=True)
class Endpoint:
    provider: str
    # (capture, caller's kwargs) -> (recalled or None to leave the call alone, kwargs to send)
    prepare: Callable[[Capture, dict[str, Any]], tuple[Recalled | None, dict[str, Any]]]
    user_text: Callable[[dict[str, Any]], str | None]
    from_result: Callable[[Recalled, dict[str, Any], Any, float], Exchange]
    accumulator: Callable[[], Accumulator]


def prepared(
    endpoint: Endpoint, capture: Capture, kwargs: dict[str, Any]
) -> tuple[Recalled | None, dict[str, Any]]:
    try:
        return endpoint.prepare(capture, kwargs)
    except Exception:  # fail open: the call goes out as the caller made it
        log.exception("memstrata: could not prepare a %s call", endpoint.provider)
        return None, kwargs


def _failed(
    endpoint: Endpoint, capture: Capture, recalled: Recalled, kwargs: dict[str, Any], exc: Any
) -> None:
    try:
        capture.after(
            Exchange(
                provider=endpoint.provider,
                attribution=recalled.attribution,
                user_text=endpoint.user_text(kwargs),
                model=kwargs.get("model"),
                error=f"{type(exc).__name__}: {exc}",
            )
        )
    except Exception:
        log.exception("memstrata: could not capture a failed %s call", endpoint.provider)


def _captured(
    endpoint: Endpoint,
    capture: Capture,
    recalled: Recalled,
    kwargs: dict[str, Any],
    result: Any,
    start: float,
) -> None:
    try:
        capture.after(endpoint.from_result(recalled, kwargs, result, elapsed_ms(start)))
    except Exception:  # an unexpected result shape must not fail the caller's call
        log.exception("memstrata: could not read a %s response", endpoint.provider)


def _stream_parts(
    endpoint: Endpoint, capture: Capture, recalled: Recalled, kwargs: dict[str, Any], start: float
) -> tuple[Callable[[Any], None], Callable[[bool, str | None], None]]:
    acc = endpoint.accumulator()

    def finish(partial: bool, error: str | None) -> None:
        capture.after(
            acc.exchange(recalled, kwargs, elapsed_ms(start), partial and error is None, error)
        )

    return acc.add, finish


def wrap_method(
    resource: Any,
    name: str,
    endpoint: Endpoint,
    capture: Capture,
    *,
    is_async: bool,
    streams: bool | None = None,
) -> None:
    """Shadow ``resource.name`` with a capturing wrapper (an instance attribute).

    ``streams``: whether the method returns a stream; None means it does when called with
    ``stream=True`` (OpenAI, Anthropic, LiteLLM), True that it always does (Google's
    ``generate_content_stream``).
    """
    original = getattr(resource, name)

    def streamed(kwargs: dict[str, Any]) -> bool:
        return bool(kwargs.get("stream")) if streams is None else streams

    if is_async:

        @functools.wraps(original)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            # Recall blocks (bounded by the recall timeout): keep it off the event loop.
            recalled, sent = await asyncio.to_thread(prepared, endpoint, capture, kwargs)
            if recalled is None:
                return await original(*args, **kwargs)
            start = time.perf_counter()
            try:
                result = await original(*args, **sent)
            except Exception as exc:
                _failed(endpoint, capture, recalled, kwargs, exc)
                raise
            if streamed(kwargs):
                on_chunk, finish = _stream_parts(endpoint, capture, recalled, kwargs, start)
                return AsyncStreamProxy(result, on_chunk, finish)
            _captured(endpoint, capture, recalled, kwargs, result, start)
            return result

    else:

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            recalled, sent = prepared(endpoint, capture, kwargs)
            if recalled is None:
                return original(*args, **kwargs)
            start = time.perf_counter()
            try:
                result = original(*args, **sent)
            except Exception as exc:
                _failed(endpoint, capture, recalled, kwargs, exc)
                raise
            if streamed(kwargs):
                on_chunk, finish = _stream_parts(endpoint, capture, recalled, kwargs, start)
                return StreamProxy(result, on_chunk, finish)
            _captured(endpoint, capture, recalled, kwargs, result, start)
            return result

    setattr(resource, name, wrapper)


def restore(resource: Any, *names: str) -> None:
    # Each wrapper is an instance attribute shadowing the class's method: removing it is
    # the whole restore.
    for name in names:
        resource.__dict__.pop(name, None)
