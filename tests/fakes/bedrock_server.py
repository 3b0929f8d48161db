"""A fake AWS Bedrock runtime server for tests: real sockets, real ``boto3``, no network.

Usage::

    with FakeBedrockServer() as server:
        client = boto3.client(
            "bedrock-runtime", endpoint_url=server.base_url, region_name="us-east-1",
            aws_access_key_id="k", aws_secret_access_key="s",
        )
        server.chat_replies.append("Hello!")          # next answer's text (FIFO)
        server.chat_script = lambda body: "Hi"        # answer when the queue is empty
        server.chat_replies.append(                   # the model uses a tool
            {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}
        )
        server.fail_next(1, status=400)               # the next POST answers HTTP 400
        server.fail_stream_after(3)     # the next streamed answer breaks after 3 events
        server.model_requests()         # (operation, model id, body) of the calls so far

Operations, by path ``/model/{modelId}/{operation}``:

* ``converse`` and ``converse-stream``: the Converse API (JSON in; JSON out, or an AWS
  event stream of ``messageStart``, ``contentBlockStart``/``Delta``/``Stop``,
  ``messageStop`` and ``metadata`` events).
* ``invoke`` and ``invoke-with-response-stream``: the model's native body; this fake speaks
  Anthropic's Messages format on Bedrock (``anthropic_version: "bedrock-2023-05-31"``), the
  stream being ``chunk`` events whose ``bytes`` are Anthropic's stream events.

Event streams use AWS's binary framing (``application/vnd.amazon.eventstream``): a
prelude (total length, headers length, CRC32), string headers (``:message-type``,
``:event-type``, ``:content-type``), the JSON payload and a CRC32 of the whole message,
which botocore parses and checks. Errors answer ``{"message": ...}`` with the error's
type in ``x-amzn-ErrorType``, as the service does.
"""

from __future__ import annotations

import base64
import functools
import itertools
import json
import re
import struct
import zlib
from typing import Any
from urllib.parse import unquote

from ._http import (
    AssistantTurn,
    EventStream,
    FakeHTTPServer,
    assistant_turn,
    estimate_tokens,
    split_fixed,
    split_words,
)

__all__ = ["FakeBedrockServer", "event_frame"]

_OPERATION = re.compile(
    r"/model/(?P<model>[^/]+)/(?P<op>converse|converse-stream|invoke|invoke-with-response-stream)"
)

_ERROR_TYPES = {
    400: "ValidationException",
    403: "AccessDeniedException",
    404: "ResourceNotFoundException",
    429: "ThrottlingException",
    500: "InternalServerException",
    503: "ServiceUnavailableException",
}

EVENTSTREAM = "application/vnd.amazon.eventstream"


def _header(name: str, value: str) -> bytes:
    raw_name, raw_value = name.encode(), value.encode()
    # type 7: a string, its length on two bytes
    return (
        struct.pack("!B", len(raw_name))
        + raw_name
        + struct.pack("!BH", 7, len(raw_value))
        + (raw_value)
    )


def event_frame(event_type: str, payload: dict[str, Any]) -> bytes:
    """One event-stream message: ``:event-type`` ``event_type`` with a JSON payload."""
    headers = (
        _header(":event-type", event_type)
        + _header(":content-type", "application/json")
        + _header(":message-type", "event")
    )
    body = json.dumps(payload).encode()
    total = 12 + len(headers) + len(body) + 4
    prelude = struct.pack("!II", total, len(headers))
    head = prelude + struct.pack("!I", zlib.crc32(prelude)) + headers + body
    return head + struct.pack("!I", zlib.crc32(head))


def _text_of(content: Any) -> str:
    """The text of a Converse or Anthropic ``content`` / ``system``: a string or blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(b.get("text", "")) for b in content if isinstance(b, dict) and "text" in b
        )
    return ""


class FakeBedrockServer(FakeHTTPServer):
    """Bedrock-runtime-compatible server on 127.0.0.1 in a background thread.

    Answers are the text that ``chat_replies`` (first) or ``chat_script`` give for the
    request body, ``"{}"`` by default, or a :class:`~fakes._http.ToolCallsReply`; a
    ``(status, body)`` reply is sent as is. Usage counts are
    :func:`~fakes._http.estimate_tokens` of the system and message texts and of the reply.
    """

    thread_name = "fake-bedrock-server"

    def __init__(self, *, port: int = 0, retry_after_ms: int | None = None) -> None:
        super().__init__(port=port, retry_after_ms=retry_after_ms)
        self._ids = itertools.count(1)

    @property
    def base_url(self) -> str:
        """What to pass as ``endpoint_url``."""
        return self.origin

    def error_body(self, status: int, message: str, kind: str | None = None) -> dict[str, Any]:
        return {"message": message, "__type": kind or _ERROR_TYPES.get(status, "ServiceError")}

    def model_requests(self) -> list[tuple[str, str, Any]]:
        """``(operation, model id, body)`` of the model calls so far."""
        out = []
        for path, body in self.requests:
            match = _OPERATION.fullmatch(path.split("?", 1)[0])
            if match is not None:
                out.append((match["op"], unquote(match["model"]), body))
        return out

    # -- request handling (runs on the server's request threads) --

    def _headers_for(self, status: int) -> dict[str, str]:
        headers = {"x-amzn-RequestId": f"fake-{next(self._ids):06d}"}
        if status >= 400:
            headers["x-amzn-ErrorType"] = _ERROR_TYPES.get(status, "ServiceError")
        return headers

    def _dispatch(self, path: str, body: Any) -> tuple[int, bytes | EventStream, dict[str, str]]:
        match = _OPERATION.fullmatch(path.split("?", 1)[0])
        if match is not None and match[0] not in self._routes:
            model = unquote(match["model"])
            handler = {
                "converse": functools.partial(self._converse, model, False),
                "converse-stream": functools.partial(self._converse, model, True),
                "invoke": functools.partial(self._invoke, model, False),
                "invoke-with-response-stream": functools.partial(self._invoke, model, True),
            }[match["op"]]
            self.route(match[0], handler)
        status, payload, headers = super()._dispatch(path, body)
        if isinstance(payload, EventStream):
            headers = {**headers, "Content-Type": EVENTSTREAM}
        return status, payload, headers

    def _turn(self, body: dict[str, Any]) -> tuple[int, Any] | AssistantTurn:
        reply = self.next_chat_reply(body)
        if isinstance(reply, tuple):
            return reply
        try:
            turn = assistant_turn(reply)
        except ValueError as exc:
            return 500, self.error_body(500, f"fake server: bad scripted reply: {exc}")
        if turn is None:
            return 500, self.error_body(500, "fake server: a whole-response reply is not served")
        return turn

    def _prompt_tokens(self, body: dict[str, Any]) -> int:
        messages = body.get("messages") or []
        texts = [_text_of(body.get("system"))]
        texts += [_text_of(m.get("content")) for m in messages if isinstance(m, dict)]
        return sum(estimate_tokens(t) for t in texts if t)

    # -- Converse --

    def _converse(self, model: str, stream: bool, body: dict[str, Any]) -> tuple[int, Any]:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return 400, self.error_body(400, "A conversation must start with a user message.")
        for m in messages:
            if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
                return 400, self.error_body(400, "messages: role must be user or assistant")
            if not isinstance(m.get("content"), list):
                return 400, self.error_body(400, "messages: content must be a list of blocks")
        system = body.get("system")
        if system is not None and not isinstance(system, list):
            return 400, self.error_body(400, "system must be a list of blocks")
        turn = self._turn(body)
        if isinstance(turn, tuple):
            return turn
        prompt, output = self._prompt_tokens(body), turn.output_tokens()
        usage = {"inputTokens": prompt, "outputTokens": output, "totalTokens": prompt + output}
        stop = "tool_use" if turn.tool_calls else "end_turn"
        if stream:
            return 200, _converse_stream(turn, stop, usage)
        content: list[dict[str, Any]] = []
        if turn.text is not None:
            content.append({"text": turn.text})
        for i, call in enumerate(turn.tool_calls):
            content.append(
                {
                    "toolUse": {
                        "toolUseId": call.id or f"tooluse_{i:04d}",
                        "name": call.name,
                        "input": json.loads(call.arguments),
                    }
                }
            )
        return 200, {
            "output": {"message": {"role": "assistant", "content": content}},
            "stopReason": stop,
            "usage": usage,
            "metrics": {"latencyMs": 1},
        }

    # -- InvokeModel (Anthropic's Messages format) --

    def _invoke(self, model: str, stream: bool, body: dict[str, Any]) -> tuple[int, Any]:
        if body.get("anthropic_version") != "bedrock-2023-05-31":
            return 400, self.error_body(400, "this fake serves Anthropic message bodies only")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return 400, self.error_body(400, "messages: at least one message is required")
        if not isinstance(body.get("max_tokens"), int):
            return 400, self.error_body(400, "max_tokens: required")
        turn = self._turn(body)
        if isinstance(turn, tuple):
            return turn
        prompt, output = self._prompt_tokens(body), turn.output_tokens()
        stop = "tool_use" if turn.tool_calls else "end_turn"
        message_id = f"msg_bdrk_{next(self._ids):06d}"
        if stream:
            return 200, _anthropic_stream(message_id, model, turn, stop, prompt, output)
        return 200, {
            "id": message_id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": _anthropic_blocks(turn),
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {"input_tokens": prompt, "output_tokens": output},
        }


def _anthropic_blocks(turn: AssistantTurn) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if turn.text is not None:
        blocks.append({"type": "text", "text": turn.text})
    for i, call in enumerate(turn.tool_calls):
        blocks.append(
            {
                "type": "tool_use",
                "id": call.id or f"toolu_bdrk_{i:04d}",
                "name": call.name,
                "input": json.loads(call.arguments),
            }
        )
    return blocks


def _converse_stream(turn: AssistantTurn, stop: str, usage: dict[str, int]) -> EventStream:
    frames = [event_frame("messageStart", {"role": "assistant"})]
    index = 0
    if turn.text is not None:
        for word in split_words(turn.text) or [""]:
            frames.append(
                event_frame("contentBlockDelta", {"delta": {"text": word}, "contentBlockIndex": 0})
            )
        frames.append(event_frame("contentBlockStop", {"contentBlockIndex": 0}))
        index = 1
    for i, call in enumerate(turn.tool_calls, start=index):
        start = {"toolUse": {"toolUseId": call.id or f"tooluse_{i:04d}", "name": call.name}}
        frames.append(event_frame("contentBlockStart", {"start": start, "contentBlockIndex": i}))
        for piece in split_fixed(call.arguments):
            delta = {"toolUse": {"input": piece}}
            frames.append(
                event_frame("contentBlockDelta", {"delta": delta, "contentBlockIndex": i})
            )
        frames.append(event_frame("contentBlockStop", {"contentBlockIndex": i}))
    frames.append(event_frame("messageStop", {"stopReason": stop}))
    frames.append(event_frame("metadata", {"usage": usage, "metrics": {"latencyMs": 1}}))
    return EventStream(frames)


def _chunk(event: dict[str, Any]) -> bytes:
    raw = base64.b64encode(json.dumps(event).encode()).decode()
    return event_frame("chunk", {"bytes": raw})


def _anthropic_stream(
    message_id: str, model: str, turn: AssistantTurn, stop: str, prompt: int, output: int
) -> EventStream:
    message = {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": prompt, "output_tokens": 1},
    }
    frames = [_chunk({"type": "message_start", "message": message})]
    index = 0
    if turn.text is not None:
        frames.append(
            _chunk(
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "text", "text": ""},
                }
            )
        )
        for word in split_words(turn.text):
            delta = {"type": "text_delta", "text": word}
            frames.append(_chunk({"type": "content_block_delta", "index": 0, "delta": delta}))
        frames.append(_chunk({"type": "content_block_stop", "index": 0}))
        index = 1
    for i, call in enumerate(turn.tool_calls, start=index):
        block = {
            "type": "tool_use",
            "id": call.id or f"toolu_bdrk_{i:04d}",
            "name": call.name,
            "input": {},
        }
        frames.append(_chunk({"type": "content_block_start", "index": i, "content_block": block}))
        for piece in split_fixed(call.arguments):
            delta = {"type": "input_json_delta", "partial_json": piece}
            frames.append(_chunk({"type": "content_block_delta", "index": i, "delta": delta}))
        frames.append(_chunk({"type": "content_block_stop", "index": i}))
    frames.append(
        _chunk(
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": output},
            }
        )
    )
    frames.append(
        _chunk(
            {
                "type": "message_stop",
                "amazon-bedrock-invocationMetrics": {
                    "inputTokenCount": prompt,
                    "outputTokenCount": output,
                    "invocationLatency": 1,
                    "firstByteLatency": 1,
                },
            }
        )
    )
    return EventStream(frames)
