"""A fake Anthropic Messages API server for tests: real sockets, real SDK, no network.

Usage::

    with FakeAnthropicServer() as server:
        client = anthropic.Anthropic(base_url=server.base_url, api_key="k")
        server.chat_replies.append('{"a": 1}')        # next answer's text (FIFO)
        server.chat_script = lambda body: '{"b": 2}'  # answer when the queue is empty
        server.fail_next(2, status=529)               # overloaded, twice, then normal
        server.reject_output_config()                 # requests with output_config -> 400
        server.delay_next(2.0)                        # the next POST waits 2 s
        server.chat_replies.append(                   # the assistant uses a tool
            {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}
        )
        server.chunk_delay = 0.05       # streamed answers: 50 ms between SSE events
        server.fail_stream_after(3)     # the next streamed answer breaks after 3 events
        server.fault(529)               # overloaded until server.heal() (see fault())

The plumbing (request log, ``hold``/``held`` gate, ``respond_raw_next``, clean shutdown)
is :class:`fakes._http.FakeHTTPServer`'s.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from ._http import (
    AssistantTurn,
    ChatReply,
    ChatScript,
    EventStream,
    FakeHTTPServer,
    Handler,
    ScriptedToolCall,
    ToolCallsReply,
    assistant_turn,
    estimate_tokens,
    split_fixed,
    split_words,
    sse_frame,
)

__all__ = [
    "ChatReply",
    "ChatScript",
    "FakeAnthropicServer",
    "Handler",
    "ScriptedToolCall",
    "ToolCallsReply",
]

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


def _text(content: Any) -> str:
    """The text of a ``system`` or message ``content``: a string or a list of blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            block.get("text", "")
            for block in content
            if isinstance(block, dict) and block.get("type") == "text"
        )
    return ""


class FakeAnthropicServer(FakeHTTPServer):
    """Anthropic-compatible server on 127.0.0.1 in a background thread (a context manager).

    ``POST /v1/messages`` answers in the real Messages shape (one ``text`` block,
    ``stop_reason`` ``"end_turn"``) with the text that ``chat_replies`` (consumed first) or
    ``chat_script`` give, ``"{}"`` by default; a :class:`~fakes._http.ToolCallsReply`
    (``{"tool_calls": [{"name", "arguments"[, "id"]}], "content"?}``) answers ``tool_use``
    blocks (after a ``text`` block when ``content`` is given) with ``stop_reason``
    ``"tool_use"``; any other ``dict`` reply is sent as the whole response, a ``(status,
    body)`` reply as is. ``usage.input_tokens`` is :func:`~fakes._http.estimate_tokens` of
    the system prompt plus that of each message, ``output_tokens`` that of the reply.
    Errors use Anthropic's ``{"type": "error", "error": {...}}`` shape and carry
    ``retry-after-ms`` (``retry_after_ms``, default 1) so the SDK retries at once;
    ``None`` omits the header.

    With ``"stream": true`` the answer is Server-Sent Events with ``event:`` lines:
    ``message_start``, then per block ``content_block_start``, ``content_block_delta``
    events (``text_delta`` word by word, ``input_json_delta`` in pieces) and
    ``content_block_stop`` (a ``ping`` after the first start, as the real API sends), then
    ``message_delta`` (``stop_reason``, ``usage.output_tokens``) and ``message_stop``.
    """

    thread_name = "fake-anthropic-server"

    def __init__(self, *, port: int = 0, retry_after_ms: int | None = 1) -> None:
        super().__init__(port=port, retry_after_ms=retry_after_ms)
        #: Whether requests carrying ``output_config`` answer HTTP 400.
        self.rejects_output_config = False
        self._ids = itertools.count(1)
        self.route("/v1/messages", self._messages)

    @property
    def base_url(self) -> str:
        """What to pass as the SDK's ``base_url`` (``http://127.0.0.1:PORT``; the SDK
        appends ``/v1/messages``)."""
        return self.origin

    def error_body(self, status: int, message: str, kind: str | None = None) -> dict[str, Any]:
        if kind is None:
            kind = _ERROR_TYPES.get(
                status, "api_error" if status >= 500 else "invalid_request_error"
            )
        return {"type": "error", "error": {"type": kind, "message": message}}

    def reject_output_config(self, reject: bool = True) -> None:
        """Answer requests with ``output_config`` with HTTP 400, as an endpoint that does
        not know structured outputs does (``reject=False`` accepts them again)."""
        self.rejects_output_config = reject

    def message_requests(self) -> list[Any]:
        """Bodies of the ``/v1/messages`` requests received so far."""
        return self.bodies("/v1/messages")

    # -- routes (run on the server's request threads) --

    def _messages(self, body: dict[str, Any]) -> tuple[int, Any]:
        model = body.get("model")
        messages = body.get("messages")
        max_tokens = body.get("max_tokens")
        if not isinstance(model, str) or not model:
            return 400, self.error_body(400, "model: Field required")
        if not isinstance(max_tokens, int) or max_tokens < 1:
            return 400, self.error_body(400, "max_tokens: Field required")
        if not isinstance(messages, list) or not messages:
            return 400, self.error_body(400, "messages: at least one message is required")
        if not all(
            isinstance(m, dict) and m.get("role") in ("user", "assistant") for m in messages
        ):
            return 400, self.error_body(400, "messages: each message needs a user/assistant role")
        if self.rejects_output_config and "output_config" in body:
            return 400, self.error_body(400, "output_config: Extra inputs are not permitted")
        reply = self.next_chat_reply(body)
        if isinstance(reply, tuple):
            return reply
        try:
            turn = assistant_turn(reply)
            blocks = self._content_blocks(turn) if turn is not None else []
        except ValueError as exc:
            return 500, self.error_body(500, f"fake server: bad scripted reply: {exc}")
        if turn is None:
            return 200, reply
        input_tokens = estimate_tokens(_text(body.get("system"))) + sum(
            estimate_tokens(_text(m.get("content"))) for m in messages
        )
        message = {
            "id": f"msg_fake{next(self._ids):06d}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": blocks,
            "stop_reason": "tool_use" if turn.tool_calls else "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": turn.output_tokens()},
        }
        if body.get("stream") is True:
            return 200, _message_stream(message, turn)
        return 200, message

    def _content_blocks(self, turn: AssistantTurn) -> list[dict[str, Any]]:
        """The ``content`` of a message for ``turn``; a tool call's arguments must be a
        JSON object (``tool_use.input``)."""
        blocks: list[dict[str, Any]] = []
        if turn.text is not None:
            blocks.append({"type": "text", "text": turn.text})
        for call in turn.tool_calls:
            try:
                arguments = json.loads(call.arguments)
            except ValueError:
                arguments = None
            if not isinstance(arguments, dict):
                raise ValueError(f"tool call arguments must be a JSON object: {call.arguments!r}")
            blocks.append(
                {
                    "type": "tool_use",
                    "id": call.id or f"toolu_fake{next(self._ids):06d}",
                    "name": call.name,
                    "input": arguments,
                }
            )
        return blocks


def _message_stream(message: dict[str, Any], turn: AssistantTurn) -> EventStream:
    """The SSE events of a streamed answer that ends as ``message``, as Anthropic sends
    them; tool input arrives as the JSON text the script gave, in pieces."""
    frames: list[bytes] = []

    def emit(kind: str, **fields: Any) -> None:
        frames.append(sse_frame({"type": kind, **fields}, kind))

    # The start carries no content and a token or so of output; the final count comes
    # with message_delta.
    usage = message["usage"]
    start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
    emit("message_start", message=start)
    # tool_use blocks follow the turn's tool calls in order; stream their JSON text as is.
    arguments = iter(call.arguments for call in turn.tool_calls)
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            emit("content_block_start", index=index, content_block={**block, "text": ""})
            deltas = [{"type": "text_delta", "text": piece} for piece in split_words(block["text"])]
        else:
            emit("content_block_start", index=index, content_block={**block, "input": {}})
            pieces = ["", *split_fixed(next(arguments))]  # the API opens with an empty piece
            deltas = [{"type": "input_json_delta", "partial_json": piece} for piece in pieces]
        if index == 0:
            emit("ping")
        for delta in deltas:
            emit("content_block_delta", index=index, delta=delta)
        emit("content_block_stop", index=index)
    emit(
        "message_delta",
        delta={"stop_reason": message["stop_reason"], "stop_sequence": None},
        usage={"output_tokens": usage["output_tokens"]},
    )
    emit("message_stop")
    return EventStream(frames)
