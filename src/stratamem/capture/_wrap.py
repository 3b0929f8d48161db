"""One wrapper for every generation method: prepare (recall, inject), call, capture — plain
results at once, streams when they end. Each provider supplies an :class:`Endpoint`.

The request an endpoint reads and rewrites is the call's keyword arguments (a dict), or, with
``positional=True``, its first positional argument (a gRPC stub's request message).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from .. import _tracing
from ._capture import Capture, Exchange, Recalled, elapsed_ms
from ._streams import AsyncStreamProxy, OpenedOnFirstRead, StreamProxy

if TYPE_CHECKING:
    from .._vocabulary import RecallSource

__all__ = [
    "Accumulator",
    "Endpoint",
    "ExchangeSink",
    "Unpack",
    "captured",
    "capturing",
    "error_text",
    "prepared",
    "restore",
    "stream_parts",
    "wrap_method",
]

log = logging.getLogger("stratamem.capture")


class Accumulator(Protocol):
    """Rebuilds an answer from stream chunks. ``exchange``'s ``partial`` says the caller
    stopped reading early; an accumulator that saw the answer finish (its finish reason or
    stop event) reports it whole all the same: what followed was usage, or the stream's end.
    Both faces rely on it: ``mem.llm``'s stream proxies and the memory proxy's relay."""

    def add(self, chunk: Any, /) -> None: ...

    def exchange(
        self,
        recalled: Recalled,
        request: Any,
        latency_ms: float,
        partial: bool,
        error: str | None,
        /,
    ) -> Exchange: ...


class ExchangeSink(Protocol):
    """Where a captured exchange goes: a :class:`Capture`, or the proxy's stand-in for the
    capture of a project still being looked up."""

    def after(self, exchange: Exchange, /) -> None: ...


# (the answer in what a call returned, what the caller gets for that answer or for its
# stream's proxy), or None: the result goes back as it is, not captured.
Unpack = Callable[[Any], tuple[Any, Callable[[Any], Any]] | None]


def _same(value: Any) -> Any:
    return value


def _itself(result: Any) -> tuple[Any, Callable[[Any], Any]]:
    return result, _same


def _requested_model(kwargs: dict[str, Any]) -> str | None:
    return kwargs.get("model")


def error_text(exc: BaseException) -> str:
    """What is stored as a captured exchange's ``error``: the exception and, when an SDK
    raised it from another one, that cause too. SDKs wrap a transport's error differently
    from release to release (anthropic 2.17 began to raise ``APIConnectionError`` from
    ``RemoteProtocolError`` where earlier releases let the latter through): either way the
    record names what broke."""
    text = f"{type(exc).__name__}: {exc}"
    cause = exc.__cause__
    if cause is None:
        return text
    said = str(cause)
    if said and said not in text:
        return f"{text} (from {type(cause).__name__}: {said})"
    return f"{text} (from {type(cause).__name__})"


@dataclass(frozen=True)
class Endpoint:
    provider: str
    # (capture, request) -> (recalled or None to leave the call alone, request to send)
    prepare: Callable[[Capture, Any], tuple[Recalled | None, Any]]
    user_text: Callable[[Any], str | None]
    from_result: Callable[[Recalled, Any, Any, float], Exchange]
    accumulator: Callable[[], Accumulator]
    model: Callable[[Any], str | None] = _requested_model
    positional: bool = False
    # Where the answer is in what the call returns: the result itself, unless the SDK hands
    # it over inside something else (botocore: a response dict with an event stream, or a
    # body that must be read to be captured and then given back readable).
    unpack: Unpack = _itself
    error_text: Callable[[BaseException], str] = error_text
    # What the recall log calls a call of this endpoint ("openai chat.completions");
    # the provider's name if empty.
    label: str = ""


def prepared(
    endpoint: Endpoint,
    capture: Capture,
    request: Any,
    *,
    source: RecallSource = "capture",
    label: str | None = None,
) -> tuple[Recalled | None, Any]:
    """Recall and inject for one call; the recall is logged as ``source``'s, under
    ``label`` (the endpoint's own by default). The proxy passes its own: it runs the same
    endpoints over a request body."""
    named = label or endpoint.label or endpoint.provider
    # The face's recall: under the caller's current span (a model-call span of an
    # instrumentation or framework that is active around this call, or the proxy's
    # request, which continues the caller's trace), with memory's own spans inside.
    with _tracing.span(
        "stratamem.recall", {"stratamem.face": source, "stratamem.request": named}
    ) as span:
        try:
            recalled, sent = endpoint.prepare(capture, request)
        except Exception as exc:  # fail open: the call goes out as the caller made it
            _tracing.failed(span, exc)
            log.exception("stratamem: could not prepare a %s call", endpoint.provider)
            return None, request
        if recalled is not None and span.is_recording():
            span.set_attribute("stratamem.recall.outcome", recalled.outcome)
            span.set_attribute(_tracing.RECORD_COUNT, recalled.hits)
    capture.log_recall(recalled, request=named, source=source)
    return recalled, sent


def _failed(
    endpoint: Endpoint,
    capture: Capture,
    recalled: Recalled,
    request: Any,
    exc: BaseException,
    start: float,
) -> None:
    try:
        capture.after(
            Exchange(
                provider=endpoint.provider,
                attribution=recalled.attribution,
                user_text=endpoint.user_text(request),
                model=endpoint.model(request),
                latency_ms=elapsed_ms(start),
                error=endpoint.error_text(exc),
            )
        )
    except Exception:
        log.exception("stratamem: could not capture a failed %s call", endpoint.provider)


def captured(
    endpoint: Endpoint,
    capture: ExchangeSink,
    recalled: Recalled,
    request: Any,
    answer: Any,
    start: float,
) -> None:
    try:
        capture.after(endpoint.from_result(recalled, request, answer, elapsed_ms(start)))
    except Exception:  # an unexpected result shape must not fail the caller's call
        log.exception("stratamem: could not read a %s response", endpoint.provider)


def stream_parts(
    endpoint: Endpoint, capture: ExchangeSink, recalled: Recalled, request: Any, start: float
) -> tuple[Callable[[Any], None], Callable[[bool, BaseException | None], None]]:
    acc = endpoint.accumulator()

    def finish(partial: bool, exc: BaseException | None) -> None:
        error = None if exc is None else endpoint.error_text(exc)
        capture.after(
            acc.exchange(recalled, request, elapsed_ms(start), partial and error is None, error)
        )

    return acc.add, finish


def _answered(
    endpoint: Endpoint,
    capture: Capture,
    recalled: Recalled,
    request: Any,
    result: Any,
    start: float,
    proxy: type[StreamProxy | AsyncStreamProxy] | None,
) -> Any:
    """What the caller gets: the result, captured now, or with its stream proxied."""
    unpacked = endpoint.unpack(result)
    if unpacked is None:
        return result
    answer, repack = unpacked
    if proxy is None:
        captured(endpoint, capture, recalled, request, answer, start)
        return repack(answer)
    return repack(proxy(answer, *stream_parts(endpoint, capture, recalled, request, start)))


def capturing(
    original: Callable[..., Any],
    endpoint: Endpoint,
    capture: Capture,
    *,
    is_async: bool,
    streams: bool | None = None,
    opens_on_read: bool = False,
) -> Callable[..., Any]:
    """A capturing wrapper of ``original``.

    ``streams``: whether the method returns a stream; None means it does when called with
    ``stream=True`` (OpenAI, Anthropic, LiteLLM), True that it always does (Google's
    ``generate_content_stream``, Bedrock's ``converse_stream``). ``opens_on_read`` (async
    only): the method is called without ``await`` and its stream read with ``async for``
    (a gRPC stream); recall, and so the call, wait for the first read.
    """

    def streamed(kwargs: dict[str, Any]) -> bool:
        return bool(kwargs.get("stream")) if streams is None else streams

    def request_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return args[0] if endpoint.positional else kwargs

    def send(args: tuple[Any, ...], kwargs: dict[str, Any], sent: Any) -> Any:
        if endpoint.positional:
            return original(sent, *args[1:], **kwargs)
        return original(*args, **sent)

    if not is_async:

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            request = request_of(args, kwargs)
            recalled, sent = prepared(endpoint, capture, request)
            if recalled is None:
                return original(*args, **kwargs)
            start = time.perf_counter()
            try:
                result = send(args, kwargs, sent)
            except Exception as exc:
                _failed(endpoint, capture, recalled, request, exc, start)
                raise
            proxy = StreamProxy if streamed(kwargs) else None
            return _answered(endpoint, capture, recalled, request, result, start, proxy)

        return wrapper

    async def call(*args: Any, **kwargs: Any) -> Any:
        request = request_of(args, kwargs)
        # Recall blocks (bounded by the recall timeout): keep it off the event loop.
        recalled, sent = await asyncio.to_thread(prepared, endpoint, capture, request)
        if recalled is None:
            result = original(*args, **kwargs)
            return result if opens_on_read else await result
        start = time.perf_counter()
        try:
            result = send(args, kwargs, sent)
            if not opens_on_read:
                result = await result
        except Exception as exc:
            _failed(endpoint, capture, recalled, request, exc, start)
            raise
        proxy = AsyncStreamProxy if streamed(kwargs) else None
        return _answered(endpoint, capture, recalled, request, result, start, proxy)

    if opens_on_read:

        @functools.wraps(original)
        def deferred(*args: Any, **kwargs: Any) -> Any:
            return OpenedOnFirstRead(functools.partial(call, *args, **kwargs))

        return deferred
    return functools.wraps(original)(call)


def wrap_method(
    resource: Any,
    name: str,
    endpoint: Endpoint,
    capture: Capture,
    *,
    is_async: bool,
    streams: bool | None = None,
) -> None:
    """Shadow ``resource.name`` with a capturing wrapper (an instance attribute)."""
    wrapper = capturing(
        getattr(resource, name), endpoint, capture, is_async=is_async, streams=streams
    )
    setattr(resource, name, wrapper)


def restore(resource: Any, *names: str) -> None:
    # Each wrapper is an instance attribute shadowing the class's method: removing it is
    # the whole restore.
    for name in names:
        resource.__dict__.pop(name, None)
