"""AWS Bedrock runtime adapter (``boto3.client("bedrock-runtime")``), registered as
``mem.llm.register(bedrock=client)``: ``converse``, ``converse_stream``, ``invoke_model`` and
``invoke_model_with_response_stream``.

Memory goes, by default, into the last user turn that has text, as one more text block
after the user's (``{"text": ...}`` in Converse, ``{"type": "text", ...}`` in an Anthropic
body); with ``injection="system"`` into the request's system slot. Converse: one more
``{"text": ...}`` block at the end of ``system`` (or ``system`` of its own).
``invoke_model``: the body is the model's native JSON; Anthropic's Messages body
(``anthropic_version`` and ``messages``) gets it in ``system`` as the Anthropic adapter
does. A body in any other model family's format (or not JSON, or a file object) is sent as
it is and not captured: there is no place memstrata knows to fill.

What the caller gets back is botocore's, with two stand-ins: the event streams
(``response["stream"]``, ``response["body"]`` of the streaming invoke) are proxies that pass
every event through and capture the answer when the stream ends or is closed; the
``invoke_model`` body has been read to capture the answer, so the caller gets a new
``StreamingBody`` over the same bytes, which it reads as before.

Only the user's turn that ends the request is stored: in a tool loop, the requests that
carry tool results store the model's answer (and its tool calls) without repeating the
user's question.
"""

from __future__ import annotations

import functools
import io
import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from ._anthropic import _system as anthropic_system
from ._capture import Capture, Exchange, Recalled, elapsed_ms
from ._shapes import into_user_turn
from ._streams import StreamProxy

__all__ = ["wrap"]

log = logging.getLogger("memstrata.capture")

_PROVIDER = "bedrock"
_ANTHROPIC_VERSION = "anthropic_version"


# -- reading Converse and Anthropic messages ------------------------------------------------


def _block_text(content: Any) -> str:
    """The text blocks of a message: ``{"text": ...}`` (Converse) or ``{"type": "text"}``
    (Anthropic); tool results, images and documents are not what the user said."""
    if isinstance(content, str):
        return content
    if not isinstance(content, Sequence):
        return ""
    texts = []
    for block in content:
        text = block.get("text") if isinstance(block, dict) else None
        if isinstance(text, str) and block.get("type", "text") == "text":
            texts.append(text)
    return "\n".join(texts)


def _last_user(messages: Any) -> str | None:
    """The last user turn with text: the recall query."""
    if not isinstance(messages, Sequence):
        return None
    for m in reversed(messages):
        if isinstance(m, dict) and m.get("role") == "user":
            text = _block_text(m.get("content"))
            if text.strip():
                return text
    return None


def _asked(messages: Any) -> str | None:
    """The user's text when the request ends with the user's turn, None when it ends with
    tool results (a later step of the same exchange, whose question is stored already)."""
    if not isinstance(messages, Sequence) or not messages:
        return None
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role") != "user":
        return None
    return _block_text(last.get("content")) or None


def _earlier(recalled: Recalled, messages: Sequence[Any], converse: bool) -> list[dict[str, Any]]:
    """The session's earlier turns the caller did not send, in the request's format; the
    first turn must be the user's."""
    already = {
        (m.get("role"), _block_text(m.get("content"))) for m in messages if isinstance(m, dict)
    }
    turns = [
        {"role": h.role, "content": [{"text": h.content}] if converse else h.content}
        for h in recalled.history
        if h.role in ("user", "assistant") and (h.role, h.content) not in already
    ]
    while turns and turns[0]["role"] != "user":
        turns.pop(0)
    return turns


def _usage(usage: Any) -> dict[str, Any] | None:
    return dict(usage) if isinstance(usage, dict) and usage else None


def _placed(recalled: Recalled, messages: Any, part: dict[str, Any]) -> list[Any] | None:
    """The messages with the block in the last user turn with text (the default
    placement); None when it goes to the system slot instead."""
    if not recalled.block or recalled.injection != "user" or not isinstance(messages, Sequence):
        return None
    turns = list(messages)
    return turns if into_user_turn(turns, recalled.block, part, _block_text) else None


# -- converse --------------------------------------------------------------------------------


def _converse_prepare(
    capture: Capture, kwargs: dict[str, Any]
) -> tuple[Recalled | None, dict[str, Any]]:
    messages = kwargs.get("messages")
    recalled = capture.before(_last_user(messages))
    if recalled is None:
        return None, kwargs
    sent = dict(kwargs)
    turns = _placed(recalled, messages, {"text": recalled.block})
    if turns is not None:
        sent["messages"] = turns
    elif recalled.block:
        system = kwargs.get("system")
        given = list(system) if isinstance(system, Sequence) else []
        sent["system"] = [*given, {"text": recalled.block}]
    if recalled.history and isinstance(messages, Sequence):
        current = sent.get("messages", messages)
        sent["messages"] = [*_earlier(recalled, messages, converse=True), *current]
    return recalled, sent


def _converse_exchange(
    recalled: Recalled,
    kwargs: dict[str, Any],
    text: str,
    calls: list[dict[str, Any]],
    usage: dict[str, Any] | None,
    latency_ms: float,
    **extra: Any,
) -> Exchange:
    return Exchange(
        provider=_PROVIDER,
        attribution=recalled.attribution,
        user_text=_asked(kwargs.get("messages")),
        answer=text,
        model=kwargs.get("modelId"),
        tool_calls=calls,
        usage=usage,
        latency_ms=latency_ms,
        **extra,
    )


def _converse_result(
    recalled: Recalled, kwargs: dict[str, Any], response: Any, latency_ms: float
) -> Exchange:
    message = ((response or {}).get("output") or {}).get("message") or {}
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in message.get("content") or []:
        if isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif isinstance(block.get("toolUse"), dict):
            use = block["toolUse"]
            calls.append(
                {
                    "id": use.get("toolUseId"),
                    "name": use.get("name"),
                    "arguments": json.dumps(use.get("input")),
                }
            )
    return _converse_exchange(
        recalled, kwargs, "".join(texts), calls, _usage(response.get("usage")), latency_ms
    )


class _ConverseEvents:
    """Rebuilds the answer from ``converse_stream`` events."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.tools: dict[int, dict[str, Any]] = {}
        self.usage: dict[str, Any] | None = None

    def add(self, event: Any) -> None:
        if "contentBlockStart" in event:
            start = event["contentBlockStart"]
            use = (start.get("start") or {}).get("toolUse")
            if use is not None:
                self.tools[start.get("contentBlockIndex", 0)] = {
                    "id": use.get("toolUseId"),
                    "name": use.get("name"),
                    "arguments": "",
                }
        elif "contentBlockDelta" in event:
            body = event["contentBlockDelta"]
            delta = body.get("delta") or {}
            if isinstance(delta.get("text"), str):
                self.text.append(delta["text"])
            elif "toolUse" in delta:
                slot = self.tools.get(body.get("contentBlockIndex", 0))
                if slot is not None:
                    slot["arguments"] += delta["toolUse"].get("input") or ""
        elif "metadata" in event:
            self.usage = _usage(event["metadata"].get("usage"))

    def exchange(
        self,
        recalled: Recalled,
        kwargs: dict[str, Any],
        latency_ms: float,
        partial: bool,
        error: str | None,
    ) -> Exchange:
        calls = [self.tools[i] for i in sorted(self.tools)]
        return _converse_exchange(
            recalled,
            kwargs,
            "".join(self.text),
            calls,
            self.usage,
            latency_ms,
            partial=partial,
            error=error,
        )


# -- invoke_model (Anthropic's Messages body) --------------------------------------------------


def _anthropic_body(kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """The request body as JSON when it is Anthropic's Messages format, else None."""
    body = kwargs.get("body")
    if not isinstance(body, (bytes, bytearray, str)):
        return None  # a file object: reading it would consume the caller's stream
    try:
        parsed = json.loads(body)
    except ValueError:
        return None
    if not isinstance(parsed, dict) or _ANTHROPIC_VERSION not in parsed:
        return None
    return parsed if isinstance(parsed.get("messages"), list) else None


def _invoke_prepare(
    capture: Capture, kwargs: dict[str, Any]
) -> tuple[Recalled | None, dict[str, Any]]:
    body = _anthropic_body(kwargs)
    if body is None:
        return None, kwargs
    messages = body["messages"]
    recalled = capture.before(_last_user(messages))
    if recalled is None or not (recalled.block or recalled.history):
        return recalled, kwargs
    sent_body = dict(body)
    turns = _placed(recalled, messages, {"type": "text", "text": recalled.block})
    if turns is not None:
        sent_body["messages"] = turns
    elif recalled.block:
        sent_body["system"] = anthropic_system(body.get("system"), recalled.block)
    if recalled.history:
        current = sent_body["messages"]
        sent_body["messages"] = [*_earlier(recalled, messages, converse=False), *current]
    return recalled, {**kwargs, "body": json.dumps(sent_body).encode()}


def _invoke_exchange(
    recalled: Recalled,
    kwargs: dict[str, Any],
    text: str,
    calls: list[dict[str, Any]],
    model: str | None,
    usage: dict[str, Any] | None,
    latency_ms: float,
    **extra: Any,
) -> Exchange:
    body = _anthropic_body(kwargs) or {}
    return Exchange(
        provider=_PROVIDER,
        attribution=recalled.attribution,
        user_text=_asked(body.get("messages")),
        answer=text,
        model=model or kwargs.get("modelId"),
        tool_calls=calls,
        usage=usage,
        latency_ms=latency_ms,
        **extra,
    )


def _message_parts(message: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in message.get("content") or []:
        if block.get("type") == "text":
            texts.append(block.get("text") or "")
        elif block.get("type") == "tool_use":
            calls.append(
                {
                    "id": block.get("id"),
                    "name": block.get("name"),
                    "arguments": json.dumps(block.get("input")),
                }
            )
    return "".join(texts), calls


class _AnthropicChunks:
    """Rebuilds the answer from the ``chunk`` events of ``invoke_model_with_response_stream``:
    each carries one Anthropic stream event as JSON bytes."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.tools: dict[int, dict[str, Any]] = {}
        self.model: str | None = None
        self.usage: dict[str, Any] = {}

    def add(self, event: Any) -> None:
        raw = (event.get("chunk") or {}).get("bytes")
        if raw is None:
            return
        data = json.loads(raw)
        kind = data.get("type")
        if kind == "message_start":
            message = data.get("message") or {}
            self.model = message.get("model")
            self.usage.update(message.get("usage") or {})
        elif kind == "content_block_start":
            block = data.get("content_block") or {}
            if block.get("type") == "tool_use":
                self.tools[data.get("index", 0)] = {
                    "id": block.get("id"),
                    "name": block.get("name"),
                    "arguments": "",
                }
        elif kind == "content_block_delta":
            delta = data.get("delta") or {}
            if delta.get("type") == "text_delta":
                self.text.append(delta.get("text") or "")
            elif delta.get("type") == "input_json_delta" and data.get("index") in self.tools:
                self.tools[data["index"]]["arguments"] += delta.get("partial_json") or ""
        elif kind == "message_delta":
            self.usage.update(data.get("usage") or {})

    def exchange(
        self,
        recalled: Recalled,
        kwargs: dict[str, Any],
        latency_ms: float,
        partial: bool,
        error: str | None,
    ) -> Exchange:
        return _invoke_exchange(
            recalled,
            kwargs,
            "".join(self.text),
            [self.tools[i] for i in sorted(self.tools)],
            self.model,
            self.usage or None,
            latency_ms,
            partial=partial,
            error=error,
        )


# -- wrapping --------------------------------------------------------------------------------

Prepare = Callable[[Capture, dict[str, Any]], tuple[Recalled | None, dict[str, Any]]]


def _prepared(
    prepare: Prepare, capture: Capture, kwargs: dict[str, Any]
) -> tuple[Recalled | None, dict[str, Any]]:
    try:
        return prepare(capture, kwargs)
    except Exception:  # fail open: the call goes out as the caller made it
        log.exception("memstrata: could not prepare a Bedrock call")
        return None, kwargs


def _after(capture: Capture, make: Callable[[], Exchange]) -> None:
    try:
        capture.after(make())
    except Exception:  # an unexpected response shape must not fail the caller's call
        log.exception("memstrata: could not read a Bedrock response")


def _failed(capture: Capture, recalled: Recalled, kwargs: dict[str, Any], exc: Exception) -> None:
    def make() -> Exchange:
        messages = kwargs.get("messages") or (_anthropic_body(kwargs) or {}).get("messages")
        return Exchange(
            provider=_PROVIDER,
            attribution=recalled.attribution,
            user_text=_asked(messages),
            model=kwargs.get("modelId"),
            error=f"{type(exc).__name__}: {exc}",
        )

    _after(capture, make)


def _stream_proxy(
    inner: Any,
    acc: Any,
    capture: Capture,
    recalled: Recalled,
    kwargs: dict[str, Any],
    start: float,
) -> StreamProxy:
    def finish(partial: bool, error: str | None) -> None:
        capture.after(
            acc.exchange(recalled, kwargs, elapsed_ms(start), partial and error is None, error)
        )

    return StreamProxy(inner, acc.add, finish)


def _rewrapped_body(data: bytes) -> Any:
    # botocore is loaded: the registered client is one of its objects.
    from botocore.response import StreamingBody

    return StreamingBody(io.BytesIO(data), len(data))


def _wrap_method(
    client: Any,
    name: str,
    prepare: Prepare,
    on_result: Callable[[Capture, Recalled, dict[str, Any], Any, float], Any],
    capture: Capture,
) -> None:
    original = getattr(client, name)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        recalled, sent = _prepared(prepare, capture, kwargs)
        if recalled is None:
            return original(*args, **kwargs)
        start = time.perf_counter()
        try:
            result = original(*args, **sent)
        except Exception as exc:
            _failed(capture, recalled, kwargs, exc)
            raise
        return on_result(capture, recalled, kwargs, result, start)

    setattr(client, name, wrapper)


def _on_converse(
    capture: Capture, recalled: Recalled, kwargs: dict[str, Any], result: Any, start: float
) -> Any:
    latency = elapsed_ms(start)
    _after(capture, lambda: _converse_result(recalled, kwargs, result, latency))
    return result


def _on_converse_stream(
    capture: Capture, recalled: Recalled, kwargs: dict[str, Any], result: Any, start: float
) -> Any:
    if not isinstance(result, dict) or "stream" not in result:
        return result
    proxy = _stream_proxy(result["stream"], _ConverseEvents(), capture, recalled, kwargs, start)
    return {**result, "stream": proxy}


def _on_invoke(
    capture: Capture, recalled: Recalled, kwargs: dict[str, Any], result: Any, start: float
) -> Any:
    body = result.get("body") if isinstance(result, dict) else None
    if body is None or not hasattr(body, "read"):
        return result
    data = body.read()  # a provider error here is the call's, raised as reading it would
    latency = elapsed_ms(start)

    def make() -> Exchange:
        message = json.loads(data)
        text, calls = _message_parts(message)
        return _invoke_exchange(
            recalled,
            kwargs,
            text,
            calls,
            message.get("model"),
            _usage(message.get("usage")),
            latency,
        )

    _after(capture, make)
    return {**result, "body": _rewrapped_body(data)}


def _on_invoke_stream(
    capture: Capture, recalled: Recalled, kwargs: dict[str, Any], result: Any, start: float
) -> Any:
    if not isinstance(result, dict) or "body" not in result:
        return result
    proxy = _stream_proxy(result["body"], _AnthropicChunks(), capture, recalled, kwargs, start)
    return {**result, "body": proxy}


_METHODS: dict[str, tuple[Prepare, Callable[..., Any]]] = {
    "converse": (_converse_prepare, _on_converse),
    "converse_stream": (_converse_prepare, _on_converse_stream),
    "invoke_model": (_invoke_prepare, _on_invoke),
    "invoke_model_with_response_stream": (_invoke_prepare, _on_invoke_stream),
}


def wrap(client: Any, capture: Capture) -> Callable[[], None]:
    # botocore makes each client's API methods on a class of its own; an instance attribute
    # shadows them for this client only.
    for name, (prepare, on_result) in _METHODS.items():
        _wrap_method(client, name, prepare, on_result, capture)

    def undo() -> None:
        for name in _METHODS:
            client.__dict__.pop(name, None)

    return undo
