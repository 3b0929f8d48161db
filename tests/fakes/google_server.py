"""A fake Gemini API (Google AI ``generativelanguage``) server for tests: real sockets, the
real ``google-genai`` SDK, no network.

Usage::

    with FakeGeminiServer() as server:
        client = genai.Client(
            api_key="k",
            http_options=types.HttpOptions(base_url=server.base_url, api_version="v1beta"),
        )
        server.chat_replies.append("Hello!")          # next answer's text (FIFO)
        server.chat_script = lambda body: "Hi"        # answer when the queue is empty
        server.chat_replies.append(                   # the model calls a function
            {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}
        )
        server.model_version = "gemini-test-001"      # modelVersion of the answers
        server.fail_next(1, status=400)               # the next POST answers HTTP 400
        server.chunk_delay = 0.05       # streamed answers: 50 ms between SSE chunks
        server.fail_stream_after(2)     # the next streamed answer breaks after 2 chunks
        server.generate_requests()      # bodies of the generate requests so far

The SDK calls ``{base_url}/{api_version}/models/{model}:generateContent`` and, to stream,
``...:streamGenerateContent?alt=sse``; the api version is ``v1beta`` in the SDK's 1.x
releases and ``v1`` by default in later ones, so every version segment (``v1``,
``v1beta``, ``v1alpha``) and every model name is served. The plumbing (request log,
``hold``/``held`` gate, ``respond_raw_next``, delays, clean shutdown) is
:class:`fakes._http.FakeHTTPServer`'s.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
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
    split_words,
    sse_frame,
)

__all__ = [
    "ChatReply",
    "ChatScript",
    "FakeGeminiServer",
    "Handler",
    "ScriptedToolCall",
    "ToolCallsReply",
]

# Google APIs name an error by its gRPC status as well as its HTTP code.
_STATUSES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}

_GENERATE = re.compile(
    r"/(?P<version>v1|v1beta|v1alpha)/models/(?P<model>[^/:]+)"
    r":(?P<method>generateContent|streamGenerateContent)"
)


def _parts_text(parts: Any) -> str:
    """The text of a list of ``parts`` (JSON, as the SDK sends them)."""
    if not isinstance(parts, list):
        return ""
    return "".join(str(p.get("text", "")) for p in parts if isinstance(p, dict))


class FakeGeminiServer(FakeHTTPServer):
    """Gemini-API-compatible server on 127.0.0.1 in a background thread (a context manager).

    ``POST /{version}/models/{model}:generateContent`` answers a ``GenerateContentResponse``
    (one candidate, ``role: "model"``, ``finishReason: "STOP"``) whose parts are the text
    that ``chat_replies`` (consumed first) or ``chat_script`` give, ``"{}"`` by default; a
    :class:`~fakes._http.ToolCallsReply` (``{"tool_calls": [{"name", "arguments"[, "id"]}],
    "content"?}``) answers ``functionCall`` parts (after a text part when ``content`` is
    given; the arguments must be a JSON object); any other ``dict`` reply is sent as the
    whole response, a ``(status, body)`` reply as is. ``usageMetadata.promptTokenCount`` is
    :func:`~fakes._http.estimate_tokens` of the system instruction plus that of each
    content, ``candidatesTokenCount`` that of the reply. ``modelVersion`` is
    ``model_version`` when set, else the model named in the path.

    ``:streamGenerateContent?alt=sse`` answers Server-Sent Events, each ``data:`` line a
    ``GenerateContentResponse`` JSON: the text word by word, then each function call whole
    (as the API sends them); every chunk carries ``usageMetadata`` with the prompt count,
    the last one the full count and ``finishReason``.

    Errors use Google's ``{"error": {"code", "message", "status"}}`` shape. The SDK does
    not retry by default, so ``fail_next`` fails exactly the next call.
    """

    thread_name = "fake-gemini-server"

    def __init__(self, *, port: int = 0, retry_after_ms: int | None = 1) -> None:
        super().__init__(port=port, retry_after_ms=retry_after_ms)
        #: ``modelVersion`` of the answers; ``None``: the model named in the request path.
        self.model_version: str | None = None
        self._ids = itertools.count(1)

    @property
    def base_url(self) -> str:
        """What to pass as ``HttpOptions(base_url=...)``: ``http://127.0.0.1:PORT`` (the SDK
        appends ``/{api_version}/models/...``)."""
        return self.origin

    def error_body(self, status: int, message: str, kind: str | None = None) -> dict[str, Any]:
        if kind is None:
            kind = _STATUSES.get(status, "INTERNAL" if status >= 500 else "FAILED_PRECONDITION")
        return {"error": {"code": status, "message": message, "status": kind}}

    def generate_requests(self) -> list[Any]:
        """Bodies of the ``generateContent`` and ``streamGenerateContent`` requests so far."""
        return [body for path, body in self.requests if _GENERATE.match(path)]

    def generate_paths(self) -> list[str]:
        """Paths (with query) of the generate requests so far, e.g. to tell streams apart."""
        return [path for path, _ in self.requests if _GENERATE.match(path)]

    # -- request handling (runs on the server's request threads) --

    def _dispatch(self, path: str, body: Any) -> tuple[int, bytes | EventStream, dict[str, str]]:
        # Routes are registered by exact path but the model is part of it: register each
        # generate path the first time it is asked for, then dispatch as usual.
        match = _GENERATE.fullmatch(path.split("?", 1)[0])
        if match is not None and match[0] not in self._routes:
            stream = match["method"] == "streamGenerateContent"
            self.route(match[0], functools.partial(self._generate, match["model"], stream))
        return super()._dispatch(path, body)

    def _generate(self, model: str, stream: bool, body: dict[str, Any]) -> tuple[int, Any]:
        contents = body.get("contents")
        if not isinstance(contents, list) or not contents:
            return 400, self.error_body(
                400, "* GenerateContentRequest.contents: contents is not specified"
            )
        for content in contents:
            if not isinstance(content, dict) or not isinstance(content.get("parts"), list):
                return 400, self.error_body(
                    400, "* GenerateContentRequest.contents: parts required"
                )
            if content.get("role", "user") not in ("user", "model"):
                return 400, self.error_body(
                    400, "Please use a valid role: user, model.", "INVALID_ARGUMENT"
                )
        reply = self.next_chat_reply(body)
        if isinstance(reply, tuple):
            return reply
        try:
            turn = assistant_turn(reply)
            parts = _parts(turn) if turn is not None else []
        except ValueError as exc:
            return 500, self.error_body(500, f"fake server: bad scripted reply: {exc}")
        if turn is None:
            return 200, reply
        system = body.get("systemInstruction")
        prompt = estimate_tokens(_parts_text(system.get("parts"))) if system else 0
        prompt += sum(estimate_tokens(_parts_text(c["parts"])) for c in contents)
        output = turn.output_tokens()
        usage = {
            "promptTokenCount": prompt,
            "candidatesTokenCount": output,
            "totalTokenCount": prompt + output,
        }
        head = {
            "modelVersion": self.model_version or model,
            "responseId": f"fake-response-{next(self._ids):06d}",
        }
        if stream:
            return 200, _stream(head, parts, usage)
        return 200, {
            "candidates": [
                {
                    "content": {"parts": parts, "role": "model"},
                    "finishReason": "STOP",
                    "index": 0,
                }
            ],
            "usageMetadata": usage,
            **head,
        }


def _parts(turn: AssistantTurn) -> list[dict[str, Any]]:
    """The ``parts`` of the model's content for ``turn``; a function call's arguments must
    be a JSON object (``functionCall.args``)."""
    parts: list[dict[str, Any]] = []
    if turn.text is not None:
        parts.append({"text": turn.text})
    for call in turn.tool_calls:
        try:
            args = json.loads(call.arguments)
        except ValueError:
            args = None
        if not isinstance(args, dict):
            raise ValueError(f"function call arguments must be a JSON object: {call.arguments!r}")
        function_call: dict[str, Any] = {"name": call.name, "args": args}
        if call.id is not None:
            function_call["id"] = call.id
        parts.append({"functionCall": function_call})
    return parts


def _stream(
    head: dict[str, Any], parts: list[dict[str, Any]], usage: dict[str, Any]
) -> EventStream:
    """The SSE chunks of a streamed answer whose parts are ``parts``."""
    pieces: list[dict[str, Any]] = []
    for part in parts:
        if "text" in part:
            pieces.extend({"text": word} for word in split_words(part["text"]))
        else:
            pieces.append(part)  # function calls arrive whole, never cut
    if not pieces:
        pieces.append({"text": ""})
    prompt_only = {
        "promptTokenCount": usage["promptTokenCount"],
        "totalTokenCount": usage["promptTokenCount"],
    }
    frames = []
    for index, piece in enumerate(pieces):
        last = index == len(pieces) - 1
        candidate: dict[str, Any] = {"content": {"parts": [piece], "role": "model"}, "index": 0}
        if last:
            candidate["finishReason"] = "STOP"
        chunk = {"candidates": [candidate], "usageMetadata": usage if last else prompt_only}
        frames.append(sse_frame({**chunk, **head}))
    return EventStream(frames)
