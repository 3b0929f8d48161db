"""A fake OpenAI-compatible HTTP server for tests: real sockets, real SDK, no network.

Usage::

    with FakeOpenAIServer(dim=8) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="x")
        ...
        server.fail_next(2, status=500)     # the next two POSTs answer HTTP 500
        server.respond_raw_next(b"{oops")   # the next POST answers these exact bytes
        server.delay_next(2.0)              # the next POST is answered after 2 s
        server.hold.clear()                 # POSTs now wait at the gate ...
        server.held.wait(5)                 # ... until one is waiting
        server.hold.set()                   # ... and let them through

        server.chat_replies.append('{"a": 1}')           # next chat answer (FIFO)
        server.chat_script = lambda body: '{"b": 2}'     # answer when the queue is empty
        server.reject_response_format({"json_schema"})   # such requests answer HTTP 400

        server.chat_replies.append(                      # the assistant calls a tool
            {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}
        )
        server.chunk_delay = 0.05       # streamed answers: 50 ms between SSE chunks
        server.fail_stream_after(3)     # the next streamed answer breaks after 3 chunks

        server.fault(503)               # an outage: every POST answers 503 ...
        server.fault("refuse")          # ... or nothing listens ("hang", "invalid_json",
        server.heal()                   # "wrong_schema" too), until healed

Endpoints are a registry by path (:meth:`FakeOpenAIServer.route`); ``/v1/embeddings``,
``/v1/chat/completions`` and ``/v1/responses`` (each plain or ``"stream": true``) and
``GET /v1/models`` are built in. The plumbing lives in :mod:`fakes._http`.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import struct
import time
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
    "FakeOpenAIServer",
    "Handler",
    "ScriptedToolCall",
    "ToolCallsReply",
    "fake_vector",
]


def fake_vector(text: str, dim: int, model: str = "") -> list[float]:
    """The deterministic, deliberately non-normalised vector the server returns for
    ``text``: components in [-1, 1] derived from a hash of model and text."""
    raw = hashlib.shake_256(f"{model}\x00{text}".encode()).digest(4 * dim)
    return [v / 2**31 - 1.0 for v in struct.unpack(f"<{dim}I", raw)]


def _error_body(
    message: str, kind: str = "server_error", param: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


def _message_text(content: Any) -> str:
    """The text of a chat message's ``content``: a string or a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def _input_text(items: Any) -> str:
    """The text of a Responses API ``input``: a string, or a list of input items (messages
    with a ``content``, tool outputs with an ``output``)."""
    if isinstance(items, str):
        return items
    if not isinstance(items, list):
        return ""
    texts = []
    for item in items:
        if isinstance(item, dict):
            texts.append(_message_text(item.get("content")))
            texts.append(_message_text(item.get("output")))
    return "".join(texts)


class FakeOpenAIServer(FakeHTTPServer):
    """OpenAI-compatible server on 127.0.0.1 in a background thread (a context manager).

    ``requests`` records every POST as ``(path, parsed JSON body)``. Embeddings are
    :func:`fake_vector` of each input, ``dim`` components (or the request's
    ``dimensions``), in the real response shape; ``encoding_format: "base64"`` is honoured.

    Chat completions answer in the real ``chat.completion`` shape with the content that
    ``chat_replies`` (consumed first) or ``chat_script`` give, ``"{}"`` by default; a
    :class:`~fakes._http.ToolCallsReply` (``{"tool_calls": [{"name", "arguments"[, "id"]}],
    "content"?}``) answers ``message.tool_calls`` with ``finish_reason: "tool_calls"``; any
    other ``dict`` reply is sent as the whole response, a ``(status, body)`` reply as is.
    Usage is :func:`~fakes._http.estimate_tokens` of the messages' contents (summed) and of
    the reply. :meth:`reject_response_format` makes requests with some ``response_format``
    types answer HTTP 400, as local servers do.

    With ``"stream": true`` the answer is Server-Sent Events of ``chat.completion.chunk``
    objects: the role first, the content word by word, tool calls as ``delta.tool_calls``
    (a head with id and name, then the arguments in pieces), a chunk with the
    ``finish_reason``, a usage chunk (``choices: []``) when
    ``stream_options.include_usage`` is true, then ``data: [DONE]``.

    ``POST /v1/responses`` (the Responses API) answers from the same replies (the script
    sees the Responses request body: ``input``, ``instructions``) with a ``response``
    object: an ``output`` message with one ``output_text`` part and/or ``function_call``
    items; streamed, it sends the typed events (``response.created`` ...
    ``response.completed``) with ``event:`` lines and a ``sequence_number`` each.

    Scripted failures carry ``retry-after-ms`` (``retry_after_ms``, default 1) so the SDK
    retries at once instead of backing off for seconds; ``None`` omits the header.
    """

    thread_name = "fake-openai-server"

    def __init__(self, dim: int = 8, *, port: int = 0, retry_after_ms: int | None = 1) -> None:
        super().__init__(port=port, retry_after_ms=retry_after_ms)
        self.dim = dim
        #: ``response_format.type`` values answered with HTTP 400 (see
        #: :meth:`reject_response_format`).
        self.rejected_formats: frozenset[str] = frozenset()
        self._ids = itertools.count(1)
        self.route("/v1/embeddings", self._embeddings)
        self.route("/v1/chat/completions", self._chat_completions)
        self.route("/v1/responses", self._responses)
        self.route_get("/v1/models", self._models)

    @property
    def base_url(self) -> str:
        """What to pass as the SDK's ``base_url``, e.g. ``http://127.0.0.1:PORT/v1``."""
        return f"{self.origin}/v1"

    def error_body(self, status: int, message: str, kind: str | None = None) -> dict[str, Any]:
        if kind is None:
            kind = "invalid_request_error" if 400 <= status < 500 else "server_error"
            if status == 429:
                kind = "rate_limit_exceeded"
        return _error_body(message, kind)

    def reject_response_format(self, kinds: set[str] | frozenset[str]) -> None:
        """From now on, answer chat requests whose ``response_format.type`` is in
        ``kinds`` (e.g. ``{"json_schema", "json_object"}``) with HTTP 400 and an
        OpenAI-style ``invalid_request_error`` naming ``response_format``. An empty set
        accepts every format again."""
        self.rejected_formats = frozenset(kinds)

    def embedding_requests(self) -> list[Any]:
        """Bodies of the ``/v1/embeddings`` requests received so far."""
        return self.bodies("/embeddings")

    def chat_requests(self) -> list[Any]:
        """Bodies of the ``/v1/chat/completions`` requests received so far."""
        return self.bodies("/chat/completions")

    def responses_requests(self) -> list[Any]:
        """Bodies of the ``/v1/responses`` requests received so far."""
        return self.bodies("/v1/responses")

    # -- routes (run on the server's request threads) --

    def _models(self, path: str) -> tuple[int, Any]:
        names = ("gpt-fake", "gpt-fake-mini", "text-embedding-fake")
        return 200, {
            "object": "list",
            "data": [
                {"id": name, "object": "model", "created": 1700000000, "owned_by": "fake"}
                for name in names
            ],
        }

    def _embeddings(self, body: dict[str, Any]) -> tuple[int, Any]:
        model = body.get("model")
        inputs = body.get("input")
        if isinstance(inputs, str):
            inputs = [inputs]
        if not isinstance(model, str) or not isinstance(inputs, list) or not inputs:
            return 400, _error_body(
                "'model' and a non-empty 'input' are required", "invalid_request_error"
            )
        if not all(isinstance(text, str) and text for text in inputs):
            return 400, _error_body(
                "every input must be a non-empty string", "invalid_request_error"
            )
        dim = body.get("dimensions") or self.dim
        base64_out = body.get("encoding_format") == "base64"
        data = []
        for index, text in enumerate(inputs):
            vector: Any = fake_vector(text, dim, model)
            if base64_out:
                vector = base64.b64encode(struct.pack(f"<{dim}f", *vector)).decode()
            data.append({"object": "embedding", "index": index, "embedding": vector})
        tokens = sum(len(text.split()) for text in inputs)
        return 200, {
            "object": "list",
            "data": data,
            "model": model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    def _chat_completions(self, body: dict[str, Any]) -> tuple[int, Any]:
        model = body.get("model")
        messages = body.get("messages")
        if not isinstance(model, str) or not model or not isinstance(messages, list):
            return 400, _error_body("'model' and 'messages' are required", "invalid_request_error")
        if not messages or not all(isinstance(m, dict) and "role" in m for m in messages):
            return 400, _error_body(
                "'messages' must be a non-empty list of messages with a role",
                "invalid_request_error",
                "messages",
            )
        response_format = body.get("response_format")
        if response_format is not None:
            kind = response_format.get("type") if isinstance(response_format, dict) else None
            if kind in self.rejected_formats:
                return 400, _error_body(
                    f"Invalid parameter: 'response_format' of type '{kind}' is not "
                    "supported with this model.",
                    "invalid_request_error",
                    "response_format",
                )
        reply = self.next_chat_reply(body)
        if isinstance(reply, tuple):
            return reply
        try:
            turn = assistant_turn(reply)
        except ValueError as exc:
            return 500, _error_body(f"fake server: bad scripted reply: {exc}")
        if turn is None:
            return 200, reply
        prompt_tokens = sum(estimate_tokens(_message_text(m.get("content"))) for m in messages)
        completion_tokens = turn.output_tokens()
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        head = {
            "id": f"chatcmpl-fake{next(self._ids):06d}",
            "created": int(time.time()),
            "model": model,
        }
        call_ids = [call.id or f"call_fake{next(self._ids):06d}" for call in turn.tool_calls]
        finish_reason = "tool_calls" if turn.tool_calls else "stop"
        if body.get("stream") is True:
            stream_options = body.get("stream_options")
            include_usage = isinstance(stream_options, dict) and bool(
                stream_options.get("include_usage")
            )
            return 200, _chat_stream(head, turn, call_ids, finish_reason, usage, include_usage)
        message: dict[str, Any] = {"role": "assistant", "content": turn.text, "refusal": None}
        if turn.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for call_id, call in zip(call_ids, turn.tool_calls, strict=True)
            ]
        return 200, {
            **head,
            "object": "chat.completion",
            "choices": [
                {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}
            ],
            "usage": usage,
        }

    def _responses(self, body: dict[str, Any]) -> tuple[int, Any]:
        model = body.get("model")
        if not isinstance(model, str) or not model:
            return 400, _error_body("Missing required parameter: 'model'.", param="model")
        if not isinstance(body.get("input"), str | list):
            return 400, _error_body(
                "'input' must be a string or a list of input items",
                "invalid_request_error",
                "input",
            )
        reply = self.next_chat_reply(body)
        if isinstance(reply, tuple):
            return reply
        try:
            turn = assistant_turn(reply)
        except ValueError as exc:
            return 500, _error_body(f"fake server: bad scripted reply: {exc}")
        if turn is None:
            return 200, reply
        input_tokens = estimate_tokens(_message_text(body.get("instructions"))) + estimate_tokens(
            _input_text(body.get("input"))
        )
        output_tokens = turn.output_tokens()
        usage = {
            "input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + output_tokens,
        }
        items = self._output_items(turn)
        created_at = int(time.time())
        response = {
            "id": f"resp_fake{next(self._ids):06d}",
            "object": "response",
            "created_at": created_at,
            "status": "completed",
            "completed_at": created_at,
            "background": False,
            "error": None,
            "incomplete_details": None,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "model": model,
            "output": items,
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": body.get("previous_response_id"),
            "reasoning": {"effort": None, "summary": None},
            "temperature": body.get("temperature", 1.0),
            "text": body.get("text", {"format": {"type": "text"}}),
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools", []),
            "top_p": body.get("top_p", 1.0),
            "truncation": body.get("truncation", "disabled"),
            "usage": usage,
            "user": body.get("user"),
            "metadata": body.get("metadata", {}),
        }
        if body.get("stream") is True:
            return 200, _responses_stream(response)
        return 200, response

    def _output_items(self, turn: AssistantTurn) -> list[dict[str, Any]]:
        """The completed ``output`` items of a Responses answer for ``turn``."""
        items: list[dict[str, Any]] = []
        if turn.text is not None:
            items.append(
                {
                    "id": f"msg_fake{next(self._ids):06d}",
                    "type": "message",
                    "status": "completed",
                    "role": "assistant",
                    "content": [_output_text(turn.text)],
                }
            )
        for call in turn.tool_calls:
            items.append(
                {
                    "id": f"fc_fake{next(self._ids):06d}",
                    "type": "function_call",
                    "status": "completed",
                    "call_id": call.id or f"call_fake{next(self._ids):06d}",
                    "name": call.name,
                    "arguments": call.arguments,
                }
            )
        return items


def _output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _chat_stream(
    head: dict[str, Any],
    turn: AssistantTurn,
    call_ids: list[str],
    finish_reason: str,
    usage: dict[str, Any],
    include_usage: bool,
) -> EventStream:
    """The SSE frames of a streamed chat completion, as OpenAI sends them."""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        data: dict[str, Any] = {
            **head,
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if include_usage:
            data["usage"] = None  # every chunk carries the key; only the last one a value
        return sse_frame(data)

    deltas: list[dict[str, Any]] = []
    if turn.text is not None:
        deltas.append({"role": "assistant", "content": "", "refusal": None})
        deltas.extend({"content": piece} for piece in split_words(turn.text))
    for index, (call_id, call) in enumerate(zip(call_ids, turn.tool_calls, strict=True)):
        function = {"name": call.name, "arguments": ""}
        delta: dict[str, Any] = {
            "tool_calls": [
                {"index": index, "id": call_id, "type": "function", "function": function}
            ]
        }
        if not deltas:  # without text, the role arrives with the first tool call
            delta = {"role": "assistant", "content": None, "refusal": None, **delta}
        deltas.append(delta)
        deltas.extend(
            {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}
            for piece in split_fixed(call.arguments)
        )
    frames = [chunk(delta) for delta in deltas]
    frames.append(chunk({}, finish_reason))
    if include_usage:
        frames.append(
            sse_frame({**head, "object": "chat.completion.chunk", "choices": [], "usage": usage})
        )
    frames.append(sse_frame("[DONE]"))
    return EventStream(frames)


def _responses_stream(response: dict[str, Any]) -> EventStream:
    """The typed SSE events of a streamed Responses answer that ends as ``response``."""
    frames: list[bytes] = []

    def emit(kind: str, **fields: Any) -> None:
        frames.append(sse_frame({"type": kind, **fields, "sequence_number": len(frames)}, kind))

    pending = {**response, "status": "in_progress", "completed_at": None, "output": []}
    pending["usage"] = None
    emit("response.created", response=pending)
    emit("response.in_progress", response=pending)
    for index, item in enumerate(response["output"]):
        ids = {"item_id": item["id"], "output_index": index}
        if item["type"] == "message":
            text = item["content"][0]["text"]
            emit(
                "response.output_item.added",
                output_index=index,
                item={**item, "status": "in_progress", "content": []},
            )
            emit("response.content_part.added", **ids, content_index=0, part=_output_text(""))
            for piece in split_words(text):
                emit("response.output_text.delta", **ids, content_index=0, delta=piece, logprobs=[])
            emit("response.output_text.done", **ids, content_index=0, text=text, logprobs=[])
            emit("response.content_part.done", **ids, content_index=0, part=_output_text(text))
        else:
            emit(
                "response.output_item.added",
                output_index=index,
                item={**item, "status": "in_progress", "arguments": ""},
            )
            for piece in split_fixed(item["arguments"]):
                emit("response.function_call_arguments.delta", **ids, delta=piece)
            emit(
                "response.function_call_arguments.done",
                **ids,
                name=item["name"],
                arguments=item["arguments"],
            )
        emit("response.output_item.done", output_index=index, item=item)
    emit("response.completed", response=response)
    return EventStream(frames)
