"""LangChain chat models: ``mem.llm.register(chatopenai=model)`` (or ``chatanthropic=``,
``chatbedrock=``, ``chatbedrockconverse=``, ``chatgoogle=``, ``langchain=`` for any other
``BaseChatModel``).

Every public path of a chat model — ``invoke``, ``ainvoke``, ``stream``, ``astream``,
``batch``, ``generate``, chains and agents built on it, ``bind_tools`` and
``with_structured_output`` — ends in one of four methods that receive the final list of
messages: ``_generate``, ``_agenerate``, ``_stream``, ``_astream``. Those are wrapped
(the ones the model's class implements; LangChain's defaults delegate to them), so the
exchange is captured once per model call whichever path led there, and memory goes in as
LangChain messages (new message objects, the caller's are never changed): by default into
the last ``HumanMessage``, after its text (a string content gets it after a blank line, a
list of content blocks one more text block); with ``injection="system"`` appended to the
leading ``SystemMessage`` or a ``SystemMessage`` of its own in front, which every
integration maps to its provider's system slot.

The model's own SDK client stands down while the wrapper runs (see ``_layers``), so a
``ChatOpenAI`` whose ``openai`` client is registered too is still captured once. Only a
request that ends with the user's turn stores the user's text; in a tool loop the
requests ending with tool results store the answer and its tool calls.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage

from ._capture import Capture, Exchange, Recalled, elapsed_ms
from ._layers import Wrapper, bind, bound, outer
from ._shapes import into_user_message, said

__all__ = ["wrap"]

log = logging.getLogger("stratamem.capture")

_ROLES = {"human": "user", "ai": "assistant"}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "\n".join(
            str(p.get("text") or "")
            for p in content
            if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


def _query(messages: Sequence[BaseMessage]) -> str | None:
    for m in reversed(messages):
        if isinstance(m, HumanMessage):
            return _text(m.content) or None
    return None


def _said(messages: Sequence[BaseMessage]) -> tuple[str, ...]:
    return said((_ROLES.get(m.type), _text(m.content)) for m in messages)


def _asked(messages: Sequence[BaseMessage]) -> str | None:
    last = messages[-1] if messages else None
    return _text(last.content) or None if isinstance(last, HumanMessage) else None


def _inject(messages: Sequence[BaseMessage], recalled: Recalled) -> list[BaseMessage]:
    out = list(messages)
    if recalled.history:
        sent = {(_ROLES.get(m.type), _text(m.content)) for m in messages}
        earlier: list[BaseMessage] = [
            HumanMessage(h.content) if h.role == "user" else AIMessage(h.content)
            for h in recalled.history
            if h.role in ("user", "assistant") and (h.role, h.content) not in sent
        ]
        lead = 0
        while lead < len(out) and isinstance(out[lead], SystemMessage):
            lead += 1
        out[lead:lead] = earlier
    block = recalled.block
    if block and not (
        recalled.injection == "user"
        and into_user_message(out, block, lambda m: isinstance(m, HumanMessage))
    ):
        first = out[0] if out else None
        if isinstance(first, SystemMessage) and isinstance(first.content, str):
            out[0] = first.model_copy(update={"content": f"{first.content}\n\n{block}"})
        elif isinstance(first, SystemMessage) and isinstance(first.content, list):
            extra = {"type": "text", "text": block}
            out[0] = first.model_copy(update={"content": [*first.content, extra]})
        else:
            out.insert(0, SystemMessage(block))
    return out


def _prepare(
    capture: Capture, messages: Sequence[BaseMessage]
) -> tuple[Recalled | None, list[BaseMessage] | None]:
    """Recall for the call; the messages to send (None: the caller's, unchanged)."""
    try:
        recalled = capture.before(_query(messages), _said(messages))
        capture.log_recall(recalled, request="langchain chat model")
        if recalled is None or not (recalled.block or recalled.history):
            return recalled, None
        return recalled, _inject(messages, recalled)
    except Exception:  # fail open: the call goes out as the caller made it
        log.exception("stratamem: could not prepare a LangChain call")
        return None, None


def _model_name(model: BaseChatModel, message: Any) -> str | None:
    meta = getattr(message, "response_metadata", None) or {}
    for key in ("model_name", "model", "model_id"):
        named = meta.get(key)
        if isinstance(named, str):
            return named
    for attr in ("model_name", "model", "model_id"):
        value = getattr(model, attr, None)
        if isinstance(value, str):
            return value
    return None


def _exchange(
    model: BaseChatModel,
    recalled: Recalled,
    messages: Sequence[BaseMessage],
    message: Any,
    latency_ms: float,
    **extra: Any,
) -> Exchange:
    calls = [
        {"id": c.get("id"), "name": c.get("name"), "arguments": json.dumps(c.get("args"))}
        for c in (getattr(message, "tool_calls", None) or [])
    ]
    usage = getattr(message, "usage_metadata", None)
    return Exchange(
        provider=f"langchain:{type(model).__name__}",
        attribution=recalled.attribution,
        user_text=_asked(messages),
        answer=_text(getattr(message, "content", "")) if message is not None else "",
        model=_model_name(model, message),
        tool_calls=calls,
        usage=dict(usage) if usage else None,
        latency_ms=latency_ms,
        **extra,
    )


def _after(capture: Capture, make: Callable[[], Exchange]) -> None:
    try:
        capture.after(make())
    except Exception:  # an unexpected result shape must not fail the caller's call
        log.exception("stratamem: could not read a LangChain response")


def _result_message(result: Any) -> Any:
    generations = getattr(result, "generations", None) or []
    return getattr(generations[0], "message", None) if generations else None


class _Chunks:
    """Merges streamed ``ChatGenerationChunk`` messages the way LangChain does (``+``)."""

    def __init__(self) -> None:
        self.message: Any = None

    def add(self, chunk: Any) -> None:
        try:
            piece = chunk.message
            self.message = piece if self.message is None else self.message + piece
        except Exception:  # a chunk we cannot merge must not break the caller's stream
            log.exception("stratamem: could not read a LangChain stream chunk")


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


# -- the four wrappers -------------------------------------------------------------------------


def _generate(original: Callable[..., Any]) -> Callable[..., Any]:
    def _generate(self: Any, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> Any:
        capture = bound(self)
        recalled, sent = _prepare(capture, messages) if capture else (None, None)
        if capture is None or recalled is None:
            return original(self, messages, *args, **kwargs)
        start = time.perf_counter()
        try:
            with outer(capture):
                result = original(self, sent or messages, *args, **kwargs)
        except Exception as exc:
            failed = _error(exc)
            _after(capture, lambda: _exchange(self, recalled, messages, None, 0, error=failed))
            raise
        latency = elapsed_ms(start)
        _after(
            capture,
            lambda: _exchange(self, recalled, messages, _result_message(result), latency),
        )
        return result

    return _generate


def _agenerate(original: Callable[..., Any]) -> Callable[..., Any]:
    async def _agenerate(self: Any, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> Any:
        capture = bound(self)
        if capture is None:
            return await original(self, messages, *args, **kwargs)
        # Recall blocks (bounded by the recall timeout): keep it off the event loop.
        recalled, sent = await asyncio.to_thread(_prepare, capture, messages)
        if recalled is None:
            return await original(self, messages, *args, **kwargs)
        start = time.perf_counter()
        try:
            with outer(capture):
                result = await original(self, sent or messages, *args, **kwargs)
        except Exception as exc:
            failed = _error(exc)
            _after(capture, lambda: _exchange(self, recalled, messages, None, 0, error=failed))
            raise
        latency = elapsed_ms(start)
        _after(
            capture,
            lambda: _exchange(self, recalled, messages, _result_message(result), latency),
        )
        return result

    return _agenerate


def _stream(original: Callable[..., Any]) -> Callable[..., Any]:
    def _stream(self: Any, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> Iterator[Any]:
        capture = bound(self)
        recalled, sent = _prepare(capture, messages) if capture else (None, None)
        if capture is None or recalled is None:
            yield from original(self, messages, *args, **kwargs)
            return
        start = time.perf_counter()
        inner = original(self, sent or messages, *args, **kwargs)
        chunks = _Chunks()
        partial, error = True, None
        try:
            while True:
                with outer(capture):  # the chunks are fetched here: the SDK stands down
                    try:
                        chunk = next(inner)
                    except StopIteration:
                        partial = False
                        return
                chunks.add(chunk)
                yield chunk
        except Exception as exc:
            error = _error(exc)
            raise
        finally:
            if partial:
                with outer(capture):
                    inner.close()
            latency = elapsed_ms(start)
            _after(
                capture,
                lambda: _exchange(
                    self,
                    recalled,
                    messages,
                    chunks.message,
                    latency,
                    partial=partial and error is None,
                    error=error,
                ),
            )

    return _stream


def _astream(original: Callable[..., Any]) -> Callable[..., Any]:
    async def _astream(
        self: Any, messages: list[BaseMessage], *args: Any, **kwargs: Any
    ) -> AsyncIterator[Any]:
        capture = bound(self)
        recalled, sent = (
            await asyncio.to_thread(_prepare, capture, messages) if capture else (None, None)
        )
        if capture is None or recalled is None:
            async for chunk in original(self, messages, *args, **kwargs):
                yield chunk
            return
        start = time.perf_counter()
        inner = original(self, sent or messages, *args, **kwargs)
        chunks = _Chunks()
        partial, error = True, None
        try:
            while True:
                with outer(capture):
                    try:
                        chunk = await inner.__anext__()
                    except StopAsyncIteration:
                        partial = False
                        return
                chunks.add(chunk)
                yield chunk
        except Exception as exc:
            error = _error(exc)
            raise
        finally:
            if partial:
                with outer(capture):
                    await inner.aclose()
            latency = elapsed_ms(start)
            _after(
                capture,
                lambda: _exchange(
                    self,
                    recalled,
                    messages,
                    chunks.message,
                    latency,
                    partial=partial and error is None,
                    error=error,
                ),
            )

    return _astream


_WRAPPERS: dict[str, Wrapper] = {
    "_generate": _generate,
    "_agenerate": _agenerate,
    "_stream": _stream,
    "_astream": _astream,
}


def wrap(model: Any, capture: Capture) -> Callable[[], None]:
    cls = type(model)
    # LangChain's own _agenerate/_stream/_astream delegate to the model's other methods (or
    # say streaming is not implemented, which LangChain detects by identity): wrap only what
    # the model's class implements.
    wrappers = {
        name: make
        for name, make in _WRAPPERS.items()
        if getattr(getattr(cls, name), "__stratamem_original__", getattr(cls, name))
        is not vars(BaseChatModel).get(name)
    }
    return bind(model, capture, wrappers)
