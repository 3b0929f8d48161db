"""xAI adapter (the official ``xai_sdk``, gRPC): ``Client`` and ``AsyncClient``.

``client.chat.create(...)`` returns the SDK's own ``Chat``; its ``sample()``/``stream()`` (and
``parse()`` and the batch variants, which use the same two RPCs) build the request proto
inside the SDK (a fresh copy of the conversation) and hand it to the chat's gRPC stub. That
stub is the one seam where the finished request passes, so each chat the wrapped ``create``
returns gets its own stub proxy: it recalls for the last user message, sends a modified
*copy* of the request with memory in that user message (one more text part after the
user's; with ``injection="system"``, in the system slot), and reads the answer back. The SDK's
code (tracing, multi-output detection, the ``Response`` it hands out) runs unchanged, the
caller's message protos and the chat's history (``chat.messages``) are never touched, and
no per-call state lives on the chat, so concurrent calls on one chat cannot mix.

As in the SDK, nothing is sent before a stream is first read: recall runs then too, so the
``mem.scope(...)`` must be active at the first read. ``defer()`` (polled RPCs) is not
captured.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime
from typing import Any

from xai_sdk.chat import Response, assistant, system, user
from xai_sdk.proto import chat_pb2

from .._time import utcnow
from ._capture import Capture, Exchange, Recalled, elapsed_ms
from ._streams import AsyncStreamProxy, StreamProxy

__all__ = ["inject", "last_user_text", "wrap_async", "wrap_sync"]

log = logging.getLogger("memstrata.capture")

_SYSTEM_ROLES = (chat_pb2.MessageRole.ROLE_SYSTEM, chat_pb2.MessageRole.ROLE_DEVELOPER)
# Recalled history turns, rebuilt with the SDK's own message helpers.
_TURNS: dict[str, tuple[int, Callable[..., Any]]] = {
    "user": (chat_pb2.MessageRole.ROLE_USER, user),
    "assistant": (chat_pb2.MessageRole.ROLE_ASSISTANT, assistant),
}


# -- the request ---------------------------------------------------------------------------


def _text(message: Any) -> str:
    # Only text parts: images and files are not something recall can search with.
    return "\n".join(part.text for part in message.content if part.text)


def last_user_text(messages: Iterable[Any]) -> str | None:
    for m in reversed(list(messages)):
        if m.role == chat_pb2.MessageRole.ROLE_USER:
            return _text(m) or None
    return None


def _into_user_turn(out: list[Any], block: str) -> bool:
    """Put ``block`` into the last user message (the recall's query) of ``out``: a new
    message with one more text part, the request's (and chat's) stays as it is."""
    for i in range(len(out) - 1, -1, -1):
        if out[i].role == chat_pb2.MessageRole.ROLE_USER:
            placed = chat_pb2.Message()
            placed.CopyFrom(out[i])
            placed.content.append(chat_pb2.Content(text=block))
            out[i] = placed
            return True
    return False


def inject(request: Any, recalled: Recalled) -> Any:
    """A copy of ``request`` with memory in the last user message (or the system slot) and,
    if asked, the session's earlier turns the conversation does not hold already.
    ``request`` is not changed."""
    out = list(request.messages)
    sent = {(m.role, _text(m)) for m in out}
    lead = 0
    while lead < len(out) and out[lead].role in _SYSTEM_ROLES:
        lead += 1
    history = []
    for h in recalled.history:
        turn = _TURNS.get(h.role)
        if turn is not None and (turn[0], h.content) not in sent:
            history.append(turn[1](h.content))
    out[lead:lead] = history
    block = recalled.block
    if block and not (recalled.injection == "user" and _into_user_turn(out, block)):
        first = out[0] if out else None
        if (
            first is not None
            and first.role in _SYSTEM_ROLES
            and first.content
            and first.content[-1].WhichOneof("content") == "text"
        ):
            merged = chat_pb2.Message()
            merged.CopyFrom(first)  # a new message: the request's (and chat's) stays as it is
            merged.content[-1].text = f"{merged.content[-1].text}\n\n{block}"
            out[0] = merged
        else:
            out.insert(0, system(block))
    copy = type(request)()
    copy.CopyFrom(request)
    copy.ClearField("messages")
    copy.messages.extend(out)  # extend copies each message into the new request
    return copy


def _prepare(reg: _Registration, request: Any) -> tuple[Recalled | None, Any]:
    if not reg.active:  # a chat made while registered, used after unregister
        return None, request
    try:
        recalled = reg.capture.before(last_user_text(request.messages))
        if recalled is None or not (recalled.block or recalled.history):
            return recalled, request
        return recalled, inject(request, recalled)
    except Exception:  # fail open: the call goes out as the caller made it
        log.exception("memstrata: could not add memory to an xAI request")
        return None, request


# -- the answer ----------------------------------------------------------------------------


def _index(request: Any) -> int | None:
    # ``None`` reads the last assistant output whatever its index, which is the answer both
    # in single-output mode and when server-side tools add outputs (what the SDK shows the
    # caller); with ``n > 1`` (batch) the first choice is the one captured.
    return 0 if request.n > 1 else None


def _plain(field: Any, value: Any) -> Any:
    enum = field.enum_type
    if enum is not None and value in enum.values_by_number:
        return enum.values_by_number[value].name
    return value


def _usage(usage: Any) -> dict[str, Any] | None:
    # Not json_format.MessageToDict: it turns int64 counters (cost ticks) into strings.
    out: dict[str, Any] = {}
    for field, value in usage.ListFields():
        if isinstance(value, bool | int | float | str):
            out[field.name] = _plain(field, value)
        else:  # a repeated field, e.g. the server-side tools used
            out[field.name] = [_plain(field, v) for v in value]
    return out or None


def _tool_calls(response: Response) -> list[dict[str, Any]]:
    calls = []
    for c in response.tool_calls:
        call: dict[str, Any] = {
            "id": c.id or None,
            "name": c.function.name,
            "arguments": c.function.arguments,
        }
        if c.type not in (
            chat_pb2.ToolCallType.TOOL_CALL_TYPE_INVALID,
            chat_pb2.ToolCallType.TOOL_CALL_TYPE_CLIENT_SIDE_TOOL,
        ):
            call["type"] = chat_pb2.ToolCallType.Name(c.type)  # run by xAI, not the caller
        calls.append(call)
    return calls


def _describe(exc: BaseException) -> str:
    # gRPC errors print over several indented lines; one line stores and reads better.
    return " ".join(f"{type(exc).__name__}: {exc}".split())


class _Call:
    """One captured call: what was asked, when, and how to hand the outcome over."""

    def __init__(self, capture: Capture, recalled: Recalled, request: Any) -> None:
        self.capture = capture
        self.recalled = recalled
        self.request = request  # the caller's request, not the copy with memory in it
        self.started: datetime = utcnow()
        self.start = time.perf_counter()

    def done(
        self,
        response: Response | None,
        partial: bool = False,
        error: str | None = None,
    ) -> None:
        try:
            self.capture.after(
                Exchange(
                    provider="xai",
                    attribution=self.recalled.attribution,
                    user_text=last_user_text(self.request.messages),
                    answer=response.content if response is not None else "",
                    model=(response.proto.model if response is not None else "")
                    or self.request.model
                    or None,
                    tool_calls=_tool_calls(response) if response is not None else [],
                    usage=_usage(response.usage) if response is not None else None,
                    latency_ms=elapsed_ms(self.start),
                    partial=partial and error is None,
                    error=error,
                    started=self.started,
                )
            )
        except Exception:  # an unexpected answer shape must not fail the caller's call
            log.exception("memstrata: could not read an xAI response")

    def answered(self, result: Any) -> None:
        try:
            response = Response(result, _index(self.request))  # reads; the SDK's stays as is
        except Exception:
            log.exception("memstrata: could not read an xAI response")
            return
        self.done(response)

    def failed(self, exc: BaseException) -> None:
        self.done(None, error=_describe(exc))

    def stream_parts(self) -> tuple[Callable[[Any], None], Callable[[bool, str | None], None]]:
        # The SDK's own accumulator rebuilds text, tool calls and usage from the chunks.
        acc = Response(chat_pb2.GetChatCompletionResponse(), _index(self.request))

        def finish(partial: bool, error: str | None) -> None:
            self.done(acc, partial, " ".join(error.split()) if error else None)

        return acc.process_chunk, finish


# -- the per-chat stubs ----------------------------------------------------------------------


class _Stub:
    """Stands in for one chat's gRPC stub; every RPC but the two completions passes through."""

    def __init__(self, inner: Any, reg: _Registration) -> None:
        self._inner = inner
        self._reg = reg

    def __getattr__(self, name: str) -> Any:
        inner = self.__dict__.get("_inner")  # absent while copy/pickle rebuild the object
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)


class _SyncStub(_Stub):
    def GetCompletion(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        recalled, sent = _prepare(self._reg, request)
        if recalled is None:
            return self._inner.GetCompletion(request, *args, **kwargs)
        call = _Call(self._reg.capture, recalled, request)
        try:
            result = self._inner.GetCompletion(sent, *args, **kwargs)
        except Exception as exc:
            call.failed(exc)
            raise
        call.answered(result)
        return result

    def GetCompletionChunk(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        recalled, sent = _prepare(self._reg, request)
        if recalled is None:
            return self._inner.GetCompletionChunk(request, *args, **kwargs)
        call = _Call(self._reg.capture, recalled, request)
        try:
            stream = self._inner.GetCompletionChunk(sent, *args, **kwargs)
        except Exception as exc:
            call.failed(exc)
            raise
        # The SDK iterates this inside chat.stream(); when the caller stops early, the SDK's
        # generator is closed and drops it, which the proxy records as a partial answer.
        return StreamProxy(stream, *call.stream_parts())


class _AsyncStub(_Stub):
    async def GetCompletion(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        # The SDK awaits what GetCompletion returns: a coroutine serves as well as the call.
        recalled, sent = await asyncio.to_thread(_prepare, self._reg, request)
        if recalled is None:
            return await self._inner.GetCompletion(request, *args, **kwargs)
        call = _Call(self._reg.capture, recalled, request)
        try:
            result = await self._inner.GetCompletion(sent, *args, **kwargs)
        except Exception as exc:
            call.failed(exc)
            raise
        call.answered(result)
        return result

    def GetCompletionChunk(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        # Called without await and read with ``async for``: recall (blocking, kept off the
        # event loop) can only run at the first read, so the RPC starts there too.
        async def open_stream() -> Any:
            recalled, sent = await asyncio.to_thread(_prepare, self._reg, request)
            if recalled is None:
                return self._inner.GetCompletionChunk(request, *args, **kwargs)
            call = _Call(self._reg.capture, recalled, request)
            try:
                stream = self._inner.GetCompletionChunk(sent, *args, **kwargs)
            except Exception as exc:
                call.failed(exc)
                raise
            return AsyncStreamProxy(stream, *call.stream_parts())

        return _OpenedOnFirstRead(open_stream)


class _OpenedOnFirstRead:
    """An async iterator that opens its stream when first read."""

    def __init__(self, open_stream: Callable[[], Awaitable[Any]]) -> None:
        self._open: Callable[[], Awaitable[Any]] | None = open_stream
        self._stream: Any = None
        self._it: Any = None

    def __aiter__(self) -> _OpenedOnFirstRead:
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


# -- registration ----------------------------------------------------------------------------


class _Registration:
    """One registered client: its capture, whether it still is, the chats it instrumented."""

    def __init__(self, capture: Capture) -> None:
        self.capture = capture
        self.active = True
        self._chats: weakref.WeakSet[Any] = weakref.WeakSet()
        self._lock = threading.Lock()

    def attach(self, chat: Any, stub_type: type[_Stub]) -> None:
        chat._stub = stub_type(chat._stub, self)
        with self._lock:
            self._chats.add(chat)

    def detach_all(self) -> None:
        self.active = False
        with self._lock:
            chats = list(self._chats)
            self._chats.clear()
        for chat in chats:
            stub = chat.__dict__.get("_stub")
            if isinstance(stub, _Stub) and stub._reg is self:
                chat._stub = stub._inner  # the SDK's stub again


def _wrap(client: Any, capture: Capture, stub_type: type[_Stub]) -> Callable[[], None]:
    chats = client.chat
    original = chats.create
    reg = _Registration(capture)

    @functools.wraps(original)
    def create(*args: Any, **kwargs: Any) -> Any:
        chat = original(*args, **kwargs)
        if reg.active:
            try:
                reg.attach(chat, stub_type)
            except Exception:  # fail open: the chat works, just without memory
                log.exception("memstrata: could not instrument an xAI chat")
        return chat

    chats.create = create

    def restore() -> None:
        # The wrapper is an instance attribute shadowing the class's method: removing it
        # restores ``create``; chats made meanwhile get their SDK stub back.
        chats.__dict__.pop("create", None)
        reg.detach_all()

    return restore


def wrap_sync(client: Any, capture: Capture) -> Callable[[], None]:
    return _wrap(client, capture, _SyncStub)


def wrap_async(client: Any, capture: Capture) -> Callable[[], None]:
    return _wrap(client, capture, _AsyncStub)
