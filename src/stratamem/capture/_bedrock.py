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
it is and not captured: there is no place stratamem knows to fill.

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

import io
import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from ._anthropic import _system as anthropic_system
from ._capture import Capture, Exchange, Recalled
from ._shapes import into_user_turn, turn_texts
from ._wrap import Endpoint, Unpack, restore, wrap_method

__all__ = ["wrap"]

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
    recalled = capture.before(_last_user(messages), turn_texts(messages, _block_text))
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
        # messageStop arrived: the answer is whole, even if the caller leaves before the
        # metadata event that follows it.
        self.stopped = False

    def add(self, event: Any) -> None:
        if "messageStop" in event:
            self.stopped = True
        elif "contentBlockStart" in event:
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
            partial=partial and not self.stopped,
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
    recalled = capture.before(_last_user(messages), turn_texts(messages, _block_text))
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
        self.stopped = False  # message_stop arrived: the answer is whole

    def add(self, event: Any) -> None:
        raw = (event.get("chunk") or {}).get("bytes")
        if raw is None:
            return
        data = json.loads(raw)
        kind = data.get("type")
        if kind == "message_stop":
            self.stopped = True
        elif kind == "message_start":
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
            partial=partial and not self.stopped,
            error=error,
        )


# -- wrapping --------------------------------------------------------------------------------


def _converse_user(kwargs: dict[str, Any]) -> str | None:
    return _asked(kwargs.get("messages"))


def _invoke_user(kwargs: dict[str, Any]) -> str | None:
    return _asked((_anthropic_body(kwargs) or {}).get("messages"))


def _model_id(kwargs: dict[str, Any]) -> str | None:
    return kwargs.get("modelId")


def _event_stream(key: str) -> Unpack:
    """The event stream at ``response[key]``; the caller gets the response with its proxy."""

    def unpack(result: Any) -> tuple[Any, Callable[[Any], Any]] | None:
        if not isinstance(result, dict) or key not in result:
            return None
        return result[key], lambda proxy: {**result, key: proxy}

    return unpack


def _read_body(result: Any) -> tuple[Any, Callable[[Any], Any]] | None:
    """The ``invoke_model`` body's bytes; the caller gets a new ``StreamingBody`` over them."""
    body = result.get("body") if isinstance(result, dict) else None
    if body is None or not hasattr(body, "read"):
        return None
    data = body.read()  # a provider error here is the call's, raised as reading it would
    return data, lambda read: {**result, "body": _rewrapped_body(read)}


def _rewrapped_body(data: bytes) -> Any:
    # botocore is loaded: the registered client is one of its objects.
    from botocore.response import StreamingBody

    return StreamingBody(io.BytesIO(data), len(data))


def _invoke_result(
    recalled: Recalled, kwargs: dict[str, Any], data: bytes, latency_ms: float
) -> Exchange:
    message = json.loads(data)
    text, calls = _message_parts(message)
    return _invoke_exchange(
        recalled,
        kwargs,
        text,
        calls,
        message.get("model"),
        _usage(message.get("usage")),
        latency_ms,
    )


_CONVERSE = Endpoint(
    _PROVIDER,
    _converse_prepare,
    _converse_user,
    _converse_result,
    _ConverseEvents,
    model=_model_id,
    label=f"{_PROVIDER} converse",
)
_INVOKE = Endpoint(
    _PROVIDER,
    _invoke_prepare,
    _invoke_user,
    _invoke_result,
    _AnthropicChunks,
    model=_model_id,
    unpack=_read_body,
    label=f"{_PROVIDER} invoke_model",
)
# name: (endpoint, whether it streams)
_METHODS: dict[str, tuple[Endpoint, bool]] = {
    "converse": (_CONVERSE, False),
    "converse_stream": (replace(_CONVERSE, unpack=_event_stream("stream")), True),
    "invoke_model": (_INVOKE, False),
    "invoke_model_with_response_stream": (replace(_INVOKE, unpack=_event_stream("body")), True),
}


def wrap(client: Any, capture: Capture) -> Callable[[], None]:
    # botocore makes each client's API methods on a class of its own; an instance attribute
    # shadows them for this client only.
    for name, (endpoint, streams) in _METHODS.items():
        wrap_method(client, name, endpoint, capture, is_async=False, streams=streams)
    return lambda: restore(client, *_METHODS)
