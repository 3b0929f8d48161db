"""Stream proxies: every chunk passes through untouched; the exchange is captured once, when
the stream ends, fails, or is closed early by the caller.

A proxy is a ``wrapt.ObjectProxy``: it reports the SDK's class as its own, so
``isinstance(stream, openai.Stream)`` (``anthropic.AsyncStream``, botocore's ``EventStream``,
a generator, ...) holds, and every attribute it does not define itself (``response``,
``text_stream``, ``get_final_message()``, ...) is the SDK object's. This module is imported
only once a client is registered: ``import memstrata`` never loads wrapt.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import wrapt

__all__ = ["AsyncStreamProxy", "ObjectProxy", "OpenedOnFirstRead", "StreamProxy"]

log = logging.getLogger("memstrata.capture")

# finish(partial, error): called exactly once; error is what ended the stream, if anything.
Finish = Callable[[bool, BaseException | None], None]


if TYPE_CHECKING:
    ObjectProxy = wrapt.ObjectProxy[Any]
else:  # older wrapt (1.x, 2.1) cannot subscript it at run time
    ObjectProxy = wrapt.ObjectProxy


class _Proxy(ObjectProxy):
    # Attributes named _self_* live on the proxy; any other is the wrapped object's.
    def __init__(self, inner: Any, on_chunk: Callable[[Any], None], finish: Finish) -> None:
        super().__init__(inner)
        self._self_on_chunk = on_chunk
        self._self_finish_cb = finish
        self._self_finished = False

    def _self_finish(self, partial: bool, error: BaseException | None = None) -> None:
        if self._self_finished:
            return
        self._self_finished = True
        try:
            self._self_finish_cb(partial, error)
        except Exception:
            log.exception("memstrata: capturing a stream failed")

    def _self_seen(self, chunk: Any) -> None:
        try:
            self._self_on_chunk(chunk)
        except Exception:  # a chunk we cannot read must not break the caller's stream
            log.exception("memstrata: could not read a stream chunk")

    def __del__(self) -> None:  # dropped without being read to the end or closed
        try:
            finished = self._self_finished
        except Exception:  # __init__ did not get that far
            return
        if not finished:
            self._self_finish(True)


class StreamProxy(_Proxy):
    """Wraps a synchronous stream (an iterator that may be a context manager)."""

    def __init__(self, inner: Any, on_chunk: Callable[[Any], None], finish: Finish) -> None:
        super().__init__(inner, on_chunk, finish)
        self._self_it = iter(inner)

    def __iter__(self) -> StreamProxy:
        return self

    def __next__(self) -> Any:
        try:
            chunk = next(self._self_it)
        except StopIteration:
            self._self_finish(False)
            raise
        except BaseException as exc:
            self._self_finish(True, exc)
            raise
        self._self_seen(chunk)
        return chunk

    def close(self) -> None:
        try:
            close = getattr(self.__wrapped__, "close", None)
            if close is not None:
                close()
        finally:
            self._self_finish(True)

    def __enter__(self) -> StreamProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncStreamProxy(_Proxy):
    """Wraps an asynchronous stream (an async iterator that may be a context manager)."""

    def __init__(self, inner: Any, on_chunk: Callable[[Any], None], finish: Finish) -> None:
        super().__init__(inner, on_chunk, finish)
        self._self_it = inner.__aiter__()

    def __aiter__(self) -> AsyncStreamProxy:
        return self

    async def __anext__(self) -> Any:
        try:
            chunk = await self._self_it.__anext__()
        except StopAsyncIteration:
            self._self_finish(False)
            raise
        except BaseException as exc:
            self._self_finish(True, exc)
            raise
        self._self_seen(chunk)
        return chunk

    def close(self) -> Any:
        """Close the inner stream the way it closes: SDK streams have an async ``close()``
        (awaited by the caller, so this returns its awaitable), some (litellm) a synchronous
        one."""
        close = getattr(self.__wrapped__, "close", None)
        result = close() if close is not None else None
        if inspect.isawaitable(result):

            async def closing() -> None:
                try:
                    await result
                finally:
                    self._self_finish(True)

            return closing()
        self._self_finish(True)
        return None

    async def aclose(self) -> None:
        """Async generators (google-genai) and litellm's streams close with ``aclose()``."""
        try:
            aclose = getattr(self.__wrapped__, "aclose", None)
            if aclose is not None:
                await aclose()
            else:
                result = self.close()
                if inspect.isawaitable(result):
                    await result
        finally:
            self._self_finish(True)

    async def __aenter__(self) -> AsyncStreamProxy:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class OpenedOnFirstRead:
    """An async iterator that opens its stream when first read: for a method called without
    ``await`` whose request can only be prepared (recall, off the event loop) in a
    coroutine."""

    def __init__(self, open_stream: Callable[[], Awaitable[Any]]) -> None:
        self._open: Callable[[], Awaitable[Any]] | None = open_stream
        self._stream: Any = None
        self._it: Any = None

    def __aiter__(self) -> OpenedOnFirstRead:
        return self

    async def __anext__(self) -> Any:
        if self._it is None:
            if self._open is None:  # opening failed before: the stream is over
                raise StopAsyncIteration
            opener, self._open = self._open, None
            self._stream = await opener()
            self._it = self._stream.__aiter__()
        return await self._it.__anext__()

    def __getattr__(self, name: str) -> Any:
        # e.g. cancel(), once the call exists
        stream = self.__dict__.get("_stream")
        if stream is None:
            raise AttributeError(name)
        return getattr(stream, name)
