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

Endpoints are a registry by path (:meth:`FakeOpenAIServer.route`); ``/v1/embeddings`` and
``/v1/chat/completions`` are built in. The plumbing lives in :mod:`fakes._http`.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import struct
import time
from typing import Any

from ._http import ChatReply, ChatScript, FakeHTTPServer, Handler, estimate_tokens

__all__ = ["ChatReply", "ChatScript", "FakeOpenAIServer", "Handler", "fake_vector"]


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


class FakeOpenAIServer(FakeHTTPServer):
    """OpenAI-compatible server on 127.0.0.1 in a background thread (a context manager).

    ``requests`` records every POST as ``(path, parsed JSON body)``. Embeddings are
    :func:`fake_vector` of each input, ``dim`` components (or the request's
    ``dimensions``), in the real response shape; ``encoding_format: "base64"`` is honoured.

    Chat completions answer in the real ``chat.completion`` shape with the content that
    ``chat_replies`` (consumed first) or ``chat_script`` give, ``"{}"`` by default; a
    ``dict`` reply is sent as the whole response, a ``(status, body)`` reply as is. Usage
    is :func:`~fakes._http.estimate_tokens` of the messages' contents (summed) and of the
    reply. :meth:`reject_response_format` makes requests with some ``response_format``
    types answer HTTP 400, as local servers do.

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

    # -- routes (run on the server's request threads) --

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
        if isinstance(reply, dict):
            return 200, reply
        prompt_tokens = sum(estimate_tokens(_message_text(m.get("content"))) for m in messages)
        completion_tokens = estimate_tokens(reply)
        return 200, {
            "id": f"chatcmpl-fake{next(self._ids):06d}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": reply, "refusal": None},
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
