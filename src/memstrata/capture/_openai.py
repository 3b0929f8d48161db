"""OpenAI adapter: ``chat.completions.create`` (plain and ``stream=True``), sync and async.

Memory goes into the system slot: appended to the caller's leading system (or developer)
message when it is text, else as a system message of its own in front. The caller's list and
dicts are never changed: the request gets new ones.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from ._capture import Capture, Exchange, Recalled, elapsed_ms
from ._streams import AsyncStreamProxy, StreamProxy

__all__ = ["wrap_async", "wrap_sync"]

log = logging.getLogger("memstrata.capture")

_SYSTEM_ROLES = ("system", "developer")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "\n".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


def _field(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


def last_user_text(messages: Any) -> str | None:
    if not isinstance(messages, Sequence):
        return None
    for m in reversed(messages):
        if _field(m, "role") == "user":
            return _text(_field(m, "content")) or None
    return None


def inject(messages: Sequence[Any], recalled: Recalled) -> list[Any]:
    """A new message list with memory in the system slot and, if asked, earlier turns of the
    session that the caller did not send already."""
    out = list(messages)
    sent = {(_field(m, "role"), _text(_field(m, "content"))) for m in out}
    lead = 0
    while lead < len(out) and _field(out[lead], "role") in _SYSTEM_ROLES:
        lead += 1
    history = [
        {"role": h.role, "content": h.content}
        for h in recalled.history
        if h.role in ("user", "assistant") and (h.role, h.content) not in sent
    ]
    out[lead:lead] = history
    block = recalled.block
    if block:
        first = out[0] if out else None
        if (
            first is not None
            and isinstance(first, dict)
            and _field(first, "role") in _SYSTEM_ROLES
            and isinstance(first.get("content"), str)
        ):
            out[0] = {**first, "content": f"{first['content']}\n\n{block}"}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out


def _prepare(capture: Capture, kwargs: dict[str, Any]) -> tuple[Recalled | None, dict[str, Any]]:
    try:
        messages = kwargs.get("messages")
        recalled = capture.before(last_user_text(messages))
        if recalled is None or not isinstance(messages, Sequence):
            return recalled, kwargs
        if recalled.block or recalled.history:
            return recalled, {**kwargs, "messages": inject(messages, recalled)}
        return recalled, kwargs
    except Exception:  # fail open: the call goes out as the caller made it
        return None, kwargs


class _Accumulator:
    """Rebuilds the answer, tool calls and usage from streamed chunks."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.tools: dict[int, dict[str, Any]] = {}
        self.usage: dict[str, Any] | None = None
        self.model: str | None = None

    def add(self, chunk: Any) -> None:
        self.model = getattr(chunk, "model", None) or self.model
        usage = getattr(chunk, "usage", None)
        if usage is not None:
            self.usage = _usage(usage)
        for choice in getattr(chunk, "choices", None) or []:
            delta = getattr(choice, "delta", None)
            if delta is None:
                continue
            if getattr(delta, "content", None):
                self.text.append(delta.content)
            for call in getattr(delta, "tool_calls", None) or []:
                slot = self.tools.setdefault(call.index, {"id": None, "name": "", "arguments": ""})
                slot["id"] = call.id or slot["id"]
                fn = getattr(call, "function", None)
                if fn is not None:
                    slot["name"] += fn.name or ""
                    slot["arguments"] += fn.arguments or ""


def _usage(usage: Any) -> dict[str, Any]:
    dump = getattr(usage, "model_dump", None)
    return dump(exclude_none=True) if dump else dict(usage)


def _exchange(
    recalled: Recalled, kwargs: dict[str, Any], result: Any, latency_ms: float
) -> Exchange:
    choice = (getattr(result, "choices", None) or [None])[0]
    message = getattr(choice, "message", None)
    calls = [
        {"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
        for c in (getattr(message, "tool_calls", None) or [])
        if getattr(c, "function", None) is not None
    ]
    usage = getattr(result, "usage", None)
    return Exchange(
        provider="openai",
        attribution=recalled.attribution,
        user_text=last_user_text(kwargs.get("messages")),
        answer=getattr(message, "content", None) or "",
        model=getattr(result, "model", None) or kwargs.get("model"),
        tool_calls=calls,
        usage=_usage(usage) if usage is not None else None,
        latency_ms=latency_ms,
    )


def _captured(
    capture: Capture, recalled: Recalled, kwargs: dict[str, Any], result: Any, start: float
) -> None:
    try:
        capture.after(_exchange(recalled, kwargs, result, elapsed_ms(start)))
    except Exception:  # an unexpected result shape must not fail the caller's call
        log.exception("memstrata: could not read an OpenAI response")


def _stream_parts(
    capture: Capture, recalled: Recalled, kwargs: dict[str, Any], start: float
) -> tuple[Callable[[Any], None], Callable[[bool, str | None], None]]:
    acc = _Accumulator()

    def finish(partial: bool, error: str | None) -> None:
        capture.after(
            Exchange(
                provider="openai",
                attribution=recalled.attribution,
                user_text=last_user_text(kwargs.get("messages")),
                answer="".join(acc.text),
                model=acc.model or kwargs.get("model"),
                tool_calls=[acc.tools[i] for i in sorted(acc.tools)],
                usage=acc.usage,
                latency_ms=elapsed_ms(start),
                partial=partial and error is None,
                error=error,
            )
        )

    return acc.add, finish


def _failed(capture: Capture, recalled: Recalled, kwargs: dict[str, Any], exc: Exception) -> None:
    capture.after(
        Exchange(
            provider="openai",
            attribution=recalled.attribution,
            user_text=last_user_text(kwargs.get("messages")),
            model=kwargs.get("model"),
            error=f"{type(exc).__name__}: {exc}",
        )
    )


def wrap_sync(client: Any, capture: Capture) -> Callable[[], None]:
    completions = client.chat.completions
    original = completions.create

    @functools.wraps(original)
    def create(*args: Any, **kwargs: Any) -> Any:
        recalled, sent = _prepare(capture, kwargs)
        if recalled is None:
            return original(*args, **kwargs)
        start = time.perf_counter()
        try:
            result = original(*args, **sent)
        except Exception as exc:
            _failed(capture, recalled, kwargs, exc)
            raise
        if kwargs.get("stream"):
            on_chunk, finish = _stream_parts(capture, recalled, kwargs, start)
            return StreamProxy(result, on_chunk, finish)
        _captured(capture, recalled, kwargs, result, start)
        return result

    completions.create = create
    return lambda: _restore(completions, "create")


def wrap_async(client: Any, capture: Capture) -> Callable[[], None]:
    completions = client.chat.completions
    original = completions.create

    @functools.wraps(original)
    async def create(*args: Any, **kwargs: Any) -> Any:
        recalled, sent = await _in_thread(_prepare, capture, kwargs)
        if recalled is None:
            return await original(*args, **kwargs)
        start = time.perf_counter()
        try:
            result = await original(*args, **sent)
        except Exception as exc:
            _failed(capture, recalled, kwargs, exc)
            raise
        if kwargs.get("stream"):
            on_chunk, finish = _stream_parts(capture, recalled, kwargs, start)
            return AsyncStreamProxy(result, on_chunk, finish)
        _captured(capture, recalled, kwargs, result, start)
        return result

    completions.create = create
    return lambda: _restore(completions, "create")


async def _in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    # Recall blocks (bounded by the recall timeout): keep it off the event loop.
    import asyncio

    return await asyncio.to_thread(fn, *args)


def _restore(resource: Any, name: str) -> None:
    # The wrapper is an instance attribute shadowing the class's method: removing it is
    # the whole restore.
    resource.__dict__.pop(name, None)
