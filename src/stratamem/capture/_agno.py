"""Agno: ``mem.llm.register(agno=model)`` for a ``Model`` (``OpenAIChat``, ``Claude``, ...),
or ``mem.llm.register(agno=agent)`` for an ``Agent``, which registers the agent's model.

An Agno model answers an agent run in one call of ``response`` (``aresponse``,
``response_stream``, ``aresponse_stream``) that loops over the provider calls
(``invoke`` and its async and streaming variants) and the tools they ask for. The exchange
is captured at the ``response`` level — the user's turn, the final answer and the tool calls
made on the way, once — and memory is injected at the ``invoke`` level, into every
provider call of that loop (new ``Message`` objects, the agent's stay as they are): by
default into the last user message, after its text; with ``injection="system"`` merged into
the leading system message or a system message of its own in front. Agno appends the loop's
turns to the list it passed to ``response``; that list is left to Agno, the provider calls
get new lists.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextvars import ContextVar
from typing import Any

from agno.agent.agent import Agent
from agno.models.base import Model
from agno.models.message import Message
from agno.models.response import ModelResponse

from ._capture import Capture, Exchange, Recalled, elapsed_ms
from ._layers import Wrapper, bind, bound, outer
from ._shapes import into_user_message, turn_texts

__all__ = ["wrap"]

log = logging.getLogger("stratamem.capture")

_PROVIDER = "agno"

# (id of the model, block, injection): set by a captured response() for the invoke() calls
# it makes
_pending: ContextVar[tuple[int, str, str] | None] = ContextVar("stratamem_agno_block", default=None)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "\n".join(
            str(p.get("text") or "") for p in content if isinstance(p, dict) and "text" in p
        )
    return ""


def _query(messages: Sequence[Any]) -> str | None:
    for m in reversed(messages):
        if getattr(m, "role", None) == "user":
            return _text(m.content) or None
    return None


def _asked(messages: Sequence[Any]) -> str | None:
    if not messages or not _is_user(messages[-1]):
        return None
    return _text(messages[-1].content) or None


def _is_user(message: Any) -> bool:
    return getattr(message, "role", None) == "user"


def _inject(messages: Sequence[Any], block: str, injection: str) -> list[Any]:
    out = list(messages)
    if injection == "user" and into_user_message(out, block, _is_user):
        return out
    first = out[0] if out else None
    if (
        first is not None
        and getattr(first, "role", None) in ("system", "developer")
        and isinstance(first.content, str)
    ):
        out[0] = first.model_copy(update={"content": f"{first.content}\n\n{block}"})
    else:
        out.insert(0, Message(role="system", content=block))
    return out


def _exchange(
    model: Any,
    recalled: Recalled,
    messages: Sequence[Any],
    start_index: int,
    asked: str | None,
    latency: float,
    *,
    streamed: str = "",
    partial: bool = False,
    error: str | None = None,
) -> Exchange:
    # Agno appended the loop's assistant and tool turns to the list it was given.
    turns = [m for m in list(messages)[start_index:] if getattr(m, "role", None) == "assistant"]
    calls = [
        {
            "id": c.get("id"),
            "name": (c.get("function") or {}).get("name"),
            "arguments": (c.get("function") or {}).get("arguments"),
        }
        for m in turns
        for c in (m.tool_calls or [])
    ]
    usage: dict[str, int] = {}
    for m in turns:
        for key in ("input_tokens", "output_tokens", "total_tokens"):
            value = getattr(getattr(m, "metrics", None), key, 0)
            if isinstance(value, int) and value:
                usage[key] = usage.get(key, 0) + value
    # A stream closed early: Agno appends the assistant's turn only when it ends.
    answer = _text(turns[-1].content) if turns else streamed
    return Exchange(
        provider=_PROVIDER,
        attribution=recalled.attribution,
        user_text=asked,
        answer=answer,
        model=getattr(model, "id", None),
        tool_calls=calls,
        usage=usage or None,
        latency_ms=latency,
        partial=partial,
        error=error,
    )


def _after(capture: Capture, make: Callable[[], Exchange]) -> None:
    try:
        capture.after(make())
    except Exception:  # an unexpected shape must not fail the caller's run
        log.exception("stratamem: could not read an Agno response")


def _error(exc: BaseException | None) -> str | None:
    return None if exc is None else f"{type(exc).__name__}: {exc}"


def _recall(capture: Capture, messages: Sequence[Any]) -> Recalled | None:
    try:
        recalled = capture.before(_query(messages), turn_texts(messages, _text))
        capture.log_recall(recalled, request="agno model response")
        return recalled
    except Exception:  # before() never raises; reading the messages might
        log.exception("stratamem: could not prepare an Agno call")
        return None


class _Call:
    """One captured response(): marks the calls made inside it and captures when it ends."""

    def __init__(self, model: Any, capture: Capture, recalled: Recalled, kwargs: Any) -> None:
        self.model, self.capture, self.recalled = model, capture, recalled
        self.messages = kwargs.get("messages") or []
        self.start_index = len(self.messages)
        self.asked = _asked(self.messages)
        self.start = time.perf_counter()
        self.streamed: list[str] = []
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> _Call:
        self._stack.enter_context(outer(self.capture))
        if self.recalled.block:
            token = _pending.set((id(self.model), self.recalled.block, self.recalled.injection))
            self._stack.callback(_pending.reset, token)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def seen(self, item: Any) -> None:
        if isinstance(item, ModelResponse) and isinstance(item.content, str):
            self.streamed.append(item.content)

    def finish(self, partial: bool = False, exc: BaseException | None = None) -> None:
        latency = elapsed_ms(self.start)
        _after(
            self.capture,
            lambda: _exchange(
                self.model,
                self.recalled,
                self.messages,
                self.start_index,
                self.asked,
                latency,
                streamed="".join(self.streamed),
                partial=partial and exc is None,
                error=_error(exc),
            ),
        )


# -- response level: capture ------------------------------------------------------------------


def _response(original: Callable[..., Any]) -> Callable[..., Any]:
    def response(self: Any, *args: Any, **kwargs: Any) -> Any:
        capture = bound(self)
        recalled = _recall(capture, kwargs.get("messages") or []) if capture else None
        if capture is None or recalled is None or args:
            return original(self, *args, **kwargs)
        call = _Call(self, capture, recalled, kwargs)
        try:
            with call:
                result = original(self, **kwargs)
        except Exception as exc:
            call.finish(exc=exc)
            raise
        call.finish()
        return result

    return response


def _aresponse(original: Callable[..., Any]) -> Callable[..., Any]:
    async def aresponse(self: Any, *args: Any, **kwargs: Any) -> Any:
        capture = bound(self)
        if capture is None or args:
            return await original(self, *args, **kwargs)
        # Recall blocks (bounded by the recall timeout): keep it off the event loop.
        recalled = await asyncio.to_thread(_recall, capture, kwargs.get("messages") or [])
        if recalled is None:
            return await original(self, **kwargs)
        call = _Call(self, capture, recalled, kwargs)
        try:
            with call:
                result = await original(self, **kwargs)
        except Exception as exc:
            call.finish(exc=exc)
            raise
        call.finish()
        return result

    return aresponse


def _response_stream(original: Callable[..., Any]) -> Callable[..., Any]:
    def response_stream(self: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
        capture = bound(self)
        recalled = _recall(capture, kwargs.get("messages") or []) if capture else None
        if capture is None or recalled is None or args:
            yield from original(self, *args, **kwargs)
            return
        call = _Call(self, capture, recalled, kwargs)
        inner = original(self, **kwargs)
        partial, failure = True, None
        try:
            while True:
                with call:  # the provider's stream is read here
                    try:
                        item = next(inner)
                    except StopIteration:
                        partial = False
                        return
                call.seen(item)
                yield item
        except Exception as exc:
            failure = exc
            raise
        finally:
            if partial:
                with call:
                    inner.close()
            call.finish(partial=partial, exc=failure)

    return response_stream


def _aresponse_stream(original: Callable[..., Any]) -> Callable[..., Any]:
    async def aresponse_stream(self: Any, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        capture = bound(self)
        recalled = (
            await asyncio.to_thread(_recall, capture, kwargs.get("messages") or [])
            if capture is not None and not args
            else None
        )
        if capture is None or recalled is None:
            async for item in original(self, *args, **kwargs):
                yield item
            return
        call = _Call(self, capture, recalled, kwargs)
        inner = original(self, **kwargs)
        partial, failure = True, None
        try:
            while True:
                with call:
                    try:
                        item = await inner.__anext__()
                    except StopAsyncIteration:
                        partial = False
                        return
                call.seen(item)
                yield item
        except Exception as exc:
            failure = exc
            raise
        finally:
            if partial:
                with call:
                    await inner.aclose()
            call.finish(partial=partial, exc=failure)

    return aresponse_stream


# -- invoke level: injection ---------------------------------------------------------------------


def _injected(model: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    pending = _pending.get()
    messages = kwargs.get("messages")
    if pending is None or pending[0] != id(model) or not isinstance(messages, Sequence):
        return kwargs
    try:
        return {**kwargs, "messages": _inject(messages, pending[1], pending[2])}
    except Exception:  # fail open: the provider call goes out as Agno made it
        log.exception("stratamem: could not add memory to an Agno call")
        return kwargs


def _invoke(original: Callable[..., Any]) -> Callable[..., Any]:
    def invoke(self: Any, *args: Any, **kwargs: Any) -> Any:
        return original(self, *args, **_injected(self, kwargs))

    return invoke


def _ainvoke(original: Callable[..., Any]) -> Callable[..., Any]:
    async def ainvoke(self: Any, *args: Any, **kwargs: Any) -> Any:
        return await original(self, *args, **_injected(self, kwargs))

    return ainvoke


def _invoke_stream(original: Callable[..., Any]) -> Callable[..., Any]:
    def invoke_stream(self: Any, *args: Any, **kwargs: Any) -> Any:
        # Agno's are generator functions: the request is built on the first next(), which
        # runs inside the captured response, so the block is read there.
        return original(self, *args, **_injected(self, kwargs))

    return invoke_stream


_WRAPPERS: dict[str, Wrapper] = {
    "response": _response,
    "aresponse": _aresponse,
    "response_stream": _response_stream,
    "aresponse_stream": _aresponse_stream,
    "invoke": _invoke,
    "ainvoke": _ainvoke,
    "invoke_stream": _invoke_stream,
    "ainvoke_stream": _invoke_stream,
}


def wrap(obj: Any, capture: Capture) -> Callable[[], None]:
    model = obj
    if isinstance(obj, Agent):
        model = obj.model
        if not isinstance(model, Model):
            raise TypeError(
                "agno= registers an Agent through its model: give the agent a Model object "
                f"(e.g. OpenAIChat(...)) before registering it, not {type(model).__name__}"
            )
    if bound(model) is not None:
        raise ValueError("this Agno model is registered already (directly or by its agent)")
    return bind(model, capture, _WRAPPERS)
