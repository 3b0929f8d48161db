"""Stream proxies: every chunk passes through untouched; the exchange is captured once, when
the stream ends, fails, or is closed early by the caller."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

__all__ = ["AsyncStreamProxy", "StreamProxy"]

log = logging.getLogger("memstrata.capture")

# finish(partial, error): called exactly once.
Finish = Callable[[bool, str | None], None]


class _Base:
    def __init__(self, inner: Any, on_chunk: Callable[[Any], None], finish: Finish) -> None:
        self._inner = inner
        self._on_chunk = on_chunk
        self._finish_cb = finish
        self._finished = False

    def _finish(self, partial: bool, error: str | None = None) -> None:
        if self._finished:
            return
        self._finished = True
        try:
            self._finish_cb(partial, error)
        except Exception:
            log.exception("memstrata: capturing a stream failed")

    def _seen(self, chunk: Any) -> None:
        try:
            self._on_chunk(chunk)
        except Exception:  # a chunk we cannot read must not break the caller's stream
            log.exception("memstrata: could not read a stream chunk")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class StreamProxy(_Base):
    """Wraps a synchronous stream (an iterator that may be a context manager)."""

    def __init__(self, inner: Any, on_chunk: Callable[[Any], None], finish: Finish) -> None:
        super().__init__(inner, on_chunk, finish)
        self._it = iter(inner)

    def __iter__(self) -> StreamProxy:
        return self

    def __next__(self) -> Any:
        try:
            chunk = next(self._it)
        except StopIteration:
            self._finish(False)
            raise
        except BaseException as exc:
            self._finish(True, f"{type(exc).__name__}: {exc}")
            raise
        self._seen(chunk)
        return chunk

    def close(self) -> None:
        try:
            close = getattr(self._inner, "close", None)
            if close is not None:
                close()
        finally:
            self._finish(True)

    def __enter__(self) -> StreamProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # dropped without being read to the end or closed
        if not getattr(self, "_finished", True):
            self._finish(True)


class AsyncStreamProxy(_Base):
    """Wraps an asynchronous stream (an async iterator that may be a context manager)."""

    def __init__(self, inner: Any, on_chunk: Callable[[Any], None], finish: Finish) -> None:
        super().__init__(inner, on_chunk, finish)
        self._it = inner.__aiter__()

    def __aiter__(self) -> AsyncStreamProxy:
        return self

    async def __anext__(self) -> Any:
        try:
            chunk = await self._it.__anext__()
        except StopAsyncIteration:
            self._finish(False)
            raise
        except BaseException as exc:
            self._finish(True, f"{type(exc).__name__}: {exc}")
            raise
        self._seen(chunk)
        return chunk

    def close(self) -> Any:
        """Close the inner stream the way it closes: SDK streams have an async ``close()``
        (awaited by the caller, so this returns its awaitable), some (litellm) a synchronous
        one."""
        close = getattr(self._inner, "close", None)
        result = close() if close is not None else None
        if inspect.isawaitable(result):

            async def closing() -> None:
                try:
                    await result
                finally:
                    self._finish(True)

            return closing()
        self._finish(True)
        return None

    async def aclose(self) -> None:
        """Async generators (google-genai) and litellm's streams close with ``aclose()``."""
        try:
            aclose = getattr(self._inner, "aclose", None)
            if aclose is not None:
                await aclose()
            else:
                result = self.close()
                if inspect.isawaitable(result):
                    await result
        finally:
            self._finish(True)

    async def __aenter__(self) -> AsyncStreamProxy:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __del__(self) -> None:
        if not getattr(self, "_finished", True):
            self._finish(True)
