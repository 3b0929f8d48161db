"""Stream proxies: every chunk passes through untouched; the exchange is captured once, when
the stream ends, fails, or is closed early by the caller.

A proxy is a ``wrapt.ObjectProxy``: it reports the SDK's class as its own, so
``isinstance(stream, openai.Stream)`` (``anthropic.AsyncStream``, botocore's ``EventStream``,
a generator, ...) holds, and every attribute it does not define itself (``response``,
``text_stream``, ``get_final_message()``, ...) is the SDK object's. This module is imported
only once a client is registered: ``import stratamem`` never loads wrapt.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import wrapt

__all__ = ["AsyncStreamProxy", "ObjectProxy", "OpenedOnFirstRead", "StreamProxy"]

log = logging.getLogger("stratamem.capture")

# finish(partial, error): called exactly once; error is what ended the stream, if anything.
Finish = Callable[[bool, BaseException | None], None]


if TYPE_CHECKING:
    ObjectProxy = wrapt.ObjectProxy[Any]
else:  # older wrapt (1.x, 2.1) cannot subscript it at run time
    ObjectProxy = wrapt.ObjectProxy


class _Tap:
    """A proxy's own state, kept on a plain object: each attribute of the proxy itself is
    looked up through wrapt's (slower) attribute access, so a chunk costs one such lookup."""

    __slots__ = ("finished", "it", "on_chunk", "on_finish")

    def __init__(self, it: Any, on_chunk: Callable[[Any], None], finish: Finish) -> None:
        self.it = it
        self.on_chunk = on_chunk
        self.on_finish = finish
        self.finished = False

    def finish(self, partial: bool, error: BaseException | None = None) -> None:
        if self.finished:
            return
        self.finished = True
        try:
            self.on_finish(partial, error)
        except Exception:
            log.exception("stratamem: capturing a stream failed")

    def seen(self, chunk: Any) -> None:
        try:
            self.on_chunk(chunk)
        except Exception:  # a chunk we cannot read must not break the caller's stream
            log.exception("stratamem: could not read a stream chunk")


class _Proxy(ObjectProxy):
    # Attributes named _self_* live on the proxy; any other is the wrapped object's.
    _self_tap: _Tap

    def __del__(self) -> None:  # dropped without being read to the end or closed
        try:
            tap = self._self_tap
        except Exception:  # __init__ did not get that far
            return
        tap.finish(True)


class StreamProxy(_Proxy):
    """Wraps a synchronous stream (an iterator that may be a context manager)."""

    def __init__(self, inner: Any, on_chunk: Callable[[Any], None], finish: Finish) -> None:
        super().__init__(inner)
        self._self_tap = _Tap(iter(inner), on_chunk, finish)

    def __iter__(self) -> StreamProxy:
        return self

    def __next__(self) -> Any:
        tap = self._self_tap
        try:
            chunk = next(tap.it)
        except StopIteration:
            tap.finish(False)
            raise
        except BaseException as exc:
            tap.finish(True, exc)
            raise
        tap.seen(chunk)
        return chunk

    def close(self) -> None:
        try:
            close = getattr(self.__wrapped__, "close", None)
            if close is not None:
                close()
        finally:
            self._self_tap.finish(True)

    def __enter__(self) -> StreamProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncStreamProxy(_Proxy):
    """Wraps an asynchronous stream (an async iterator that may be a context manager)."""

    def __init__(self, inner: Any, on_chunk: Callable[[Any], None], finish: Finish) -> None:
        super().__init__(inner)
        self._self_tap = _Tap(inner.__aiter__(), on_chunk, finish)

    def __aiter__(self) -> AsyncStreamProxy:
        return self

    async def __anext__(self) -> Any:
        tap = self._self_tap
        try:
            chunk = await tap.it.__anext__()
        except StopAsyncIteration:
            tap.finish(False)
            raise
        except BaseException as exc:
            tap.finish(True, exc)
            raise
        tap.seen(chunk)
        return chunk

    def close(self) -> Any:
        """Close the inner stream the way it closes: SDK streams have an async ``close()``
        (awaited by the caller, so this returns its awaitable), some (litellm) a synchronous
        one."""
        tap = self._self_tap
        close = getattr(self.__wrapped__, "close", None)
        result = close() if close is not None else None
        if inspect.isawaitable(result):

            async def closing() -> None:
                try:
                    await result
                finally:
                    tap.finish(True)

            return closing()
        tap.finish(True)
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
            self._self_tap.finish(True)

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
