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

import functools
import logging
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from xai_sdk.chat import Response, assistant, system, user
from xai_sdk.proto import chat_pb2

from ._capture import Capture, Exchange, Recalled
from ._shapes import said
from ._streams import ObjectProxy
from ._wrap import Endpoint, capturing

__all__ = ["inject", "last_user_text", "wrap_async", "wrap_sync"]

log = logging.getLogger("stratamem.capture")

_SYSTEM_ROLES = (chat_pb2.MessageRole.ROLE_SYSTEM, chat_pb2.MessageRole.ROLE_DEVELOPER)
# Recalled history turns, rebuilt with the SDK's own message helpers.
_TURNS: dict[str, tuple[int, Callable[..., Any]]] = {
    "user": (chat_pb2.MessageRole.ROLE_USER, user),
    "assistant": (chat_pb2.MessageRole.ROLE_ASSISTANT, assistant),
}
_ROLE_NAMES = {role: name for name, (role, _) in _TURNS.items()}


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


def _prepare(reg: _Registration, capture: Capture, request: Any) -> tuple[Recalled | None, Any]:
    if not reg.active:  # a chat made while registered, used after unregister
        return None, request
    recalled = capture.before(_user(request), _said(request))
    if recalled is None or not (recalled.block or recalled.history):
        return recalled, request
    return recalled, inject(request, recalled)


def _user(request: Any) -> str | None:
    return last_user_text(request.messages)


def _said(request: Any) -> tuple[str, ...]:
    return said((_ROLE_NAMES.get(m.role), _text(m)) for m in request.messages)


def _model(request: Any) -> str | None:
    return request.model or None


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


def _result(
    recalled: Recalled,
    request: Any,
    result: Any,
    latency_ms: float,
    partial: bool = False,
    error: str | None = None,
) -> Exchange:
    response = Response(result, _index(request))  # reads; the SDK's own stays as it is
    return Exchange(
        provider="xai",
        attribution=recalled.attribution,
        user_text=_user(request),  # the caller's request, not the copy with memory in it
        answer=response.content,
        model=response.proto.model or _model(request),
        tool_calls=_tool_calls(response),
        usage=_usage(response.usage),
        latency_ms=latency_ms,
        partial=partial,
        error=error,
    )


class _Chunks:
    """The SDK's own accumulator rebuilds text, tool calls and usage from the chunks."""

    def __init__(self) -> None:
        self._response = Response(chat_pb2.GetChatCompletionResponse(), None)

    def add(self, chunk: Any) -> None:
        self._response.process_chunk(chunk)

    def exchange(
        self,
        recalled: Recalled,
        request: Any,
        latency_ms: float,
        partial: bool,
        error: str | None,
    ) -> Exchange:
        # .proto holds all chunks so far; _result reads it as it reads a whole answer.
        return _result(recalled, request, self._response.proto, latency_ms, partial, error)


# -- the per-chat stubs ----------------------------------------------------------------------


class _Stub(ObjectProxy):
    """Stands in for one chat's gRPC stub (a ``ChatStub`` to ``isinstance``): the two
    completion RPCs go through the capturing wrapper, every other RPC passes through."""

    def __init__(self, inner: Any, reg: _Registration) -> None:
        super().__init__(inner)
        self._self_reg = reg
        wrap = functools.partial(capturing, endpoint=reg.endpoint, capture=reg.capture)
        self._self_sample = wrap(inner.GetCompletion, is_async=reg.is_async, streams=False)
        # The SDK iterates the stream inside chat.stream(); when the caller stops early, the
        # SDK's generator is closed and drops it, which the proxy records as a partial
        # answer. The async stream is called without await: recall waits for its first read.
        self._self_stream = wrap(
            inner.GetCompletionChunk,
            is_async=reg.is_async,
            streams=True,
            opens_on_read=reg.is_async,
        )

    def GetCompletion(self, *args: Any, **kwargs: Any) -> Any:
        return self._self_sample(*args, **kwargs)

    def GetCompletionChunk(self, *args: Any, **kwargs: Any) -> Any:
        return self._self_stream(*args, **kwargs)


# -- registration ----------------------------------------------------------------------------


class _Registration:
    """One registered client: its capture, whether it still is, the chats it instrumented."""

    def __init__(self, capture: Capture, is_async: bool) -> None:
        self.capture = capture
        self.is_async = is_async
        self.active = True
        self.endpoint = Endpoint(
            "xai",
            functools.partial(_prepare, self),
            _user,
            _result,
            _Chunks,
            model=_model,
            positional=True,  # a stub's RPC takes the request message first
            error_text=_describe,
            label="xai chat",
        )
        self._chats: weakref.WeakSet[Any] = weakref.WeakSet()
        self._lock = threading.Lock()

    def attach(self, chat: Any) -> None:
        chat._stub = _Stub(chat._stub, self)
        with self._lock:
            self._chats.add(chat)

    def detach_all(self) -> None:
        self.active = False
        with self._lock:
            chats = list(self._chats)
            self._chats.clear()
        for chat in chats:
            stub = chat.__dict__.get("_stub")
            if isinstance(stub, _Stub) and stub._self_reg is self:
                chat._stub = stub.__wrapped__  # the SDK's stub again


def _wrap(client: Any, capture: Capture, is_async: bool) -> Callable[[], None]:
    chats = client.chat
    original = chats.create
    reg = _Registration(capture, is_async)

    @functools.wraps(original)
    def create(*args: Any, **kwargs: Any) -> Any:
        chat = original(*args, **kwargs)
        if reg.active:
            try:
                reg.attach(chat)
            except Exception:  # fail open: the chat works, just without memory
                log.exception("stratamem: could not instrument an xAI chat")
        return chat

    chats.create = create

    def restore() -> None:
        # The wrapper is an instance attribute shadowing the class's method: removing it
        # restores ``create``; chats made meanwhile get their SDK stub back.
        chats.__dict__.pop("create", None)
        reg.detach_all()

    return restore


def wrap_sync(client: Any, capture: Capture) -> Callable[[], None]:
    return _wrap(client, capture, is_async=False)


def wrap_async(client: Any, capture: Capture) -> Callable[[], None]:
    return _wrap(client, capture, is_async=True)
