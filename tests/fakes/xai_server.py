"""A fake xAI Chat service for tests: a real gRPC server on 127.0.0.1, the SDK's own protos.

Usage::

    with FakeXAIServer() as server:
        client = xai_sdk.Client(**server.client_kwargs())   # insecure loopback channel
        server.replies.append("Hi!")                     # next answer (FIFO)
        server.script = lambda request: "Hello"          # answer when the queue is empty
        server.replies.append(                           # the assistant calls a tool
            {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}
        )
        server.fail_next(1)             # the next RPC fails: INVALID_ARGUMENT
        server.fail_stream_after(2)     # the next streamed answer breaks (INTERNAL) after 2
        server.chunk_delay = 0.05       # streamed answers: 50 ms between chunks
        server.requests[-1]             # the GetCompletionsRequest protos received
        server.messages()               # the last request's messages as (role, text)

``GetCompletion`` (``chat.sample()``) and ``GetCompletionChunk`` (``chat.stream()``, server
streaming: one chunk per word, tool calls and usage in the last) are implemented; any other
RPC answers UNIMPLEMENTED. Failures use status codes the SDK's channel does not retry
(it retries UNAVAILABLE), so a failing test stays fast.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any, TypeAlias

import grpc
from typing_extensions import Self
from xai_sdk.proto import chat_pb2, chat_pb2_grpc, sample_pb2, usage_pb2

from ._http import AssistantTurn, ToolCallsReply, assistant_turn, estimate_tokens, split_words

__all__ = ["FakeXAIServer", "XAIReply", "XAIScript"]

#: What a script answers: the assistant's text, or a :class:`ToolCallsReply`.
XAIReply: TypeAlias = str | ToolCallsReply
#: A script: the request proto received -> the reply.
XAIScript: TypeAlias = Callable[[chat_pb2.GetCompletionsRequest], XAIReply]

_ROLE = chat_pb2.MessageRole


def _text(message: chat_pb2.Message) -> str:
    return "\n".join(part.text for part in message.content if part.text)


class _Failure:
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self.code = code
        self.details = details


class _Servicer(chat_pb2_grpc.ChatServicer):
    def __init__(self, server: FakeXAIServer) -> None:
        self._server = server

    def GetCompletion(
        self, request: chat_pb2.GetCompletionsRequest, context: grpc.ServicerContext
    ) -> chat_pb2.GetChatCompletionResponse:
        turn, failure, _ = self._server._take(request, streamed=False)
        if failure is not None:
            context.abort(failure.code, failure.details)
        assert turn is not None
        calls = self._server._tool_calls(turn)
        return chat_pb2.GetChatCompletionResponse(
            id=self._server._next_id(),
            model=request.model,
            outputs=[
                chat_pb2.CompletionOutput(
                    index=0,
                    finish_reason=_finish(turn),
                    message=chat_pb2.CompletionMessage(
                        role=_ROLE.ROLE_ASSISTANT, content=turn.text or "", tool_calls=calls
                    ),
                )
            ],
            usage=_usage(request, turn),
        )

    def GetCompletionChunk(
        self, request: chat_pb2.GetCompletionsRequest, context: grpc.ServicerContext
    ) -> Iterator[chat_pb2.GetChatCompletionChunk]:
        turn, failure, break_after = self._server._take(request, streamed=True)
        if failure is not None:
            context.abort(failure.code, failure.details)
        assert turn is not None
        rid = self._server._next_id()
        pieces = split_words(turn.text or "")
        calls = self._server._tool_calls(turn)
        for i, piece in enumerate([*pieces, None]):
            if break_after is not None and i >= break_after:
                context.abort(grpc.StatusCode.INTERNAL, "stream broke")
            last = piece is None
            output = chat_pb2.CompletionOutputChunk(
                index=0,
                delta=chat_pb2.Delta(
                    role=_ROLE.ROLE_ASSISTANT,
                    content=piece or "",
                    tool_calls=calls if last else [],
                ),
                finish_reason=_finish(turn) if last else sample_pb2.FinishReason.REASON_INVALID,
            )
            yield chat_pb2.GetChatCompletionChunk(
                id=rid,
                model=request.model,
                outputs=[output],
                usage=_usage(request, turn) if last else None,
            )
            if self._server.chunk_delay and not last:
                time.sleep(self._server.chunk_delay)


def _finish(turn: AssistantTurn) -> int:
    reason = "REASON_TOOL_CALLS" if turn.tool_calls else "REASON_STOP"
    return sample_pb2.FinishReason.Value(reason)


def _usage(request: chat_pb2.GetCompletionsRequest, turn: AssistantTurn) -> usage_pb2.SamplingUsage:
    prompt = estimate_tokens("".join(_text(m) for m in request.messages))
    completion = turn.output_tokens()
    return usage_pb2.SamplingUsage(
        prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion
    )


class FakeXAIServer:
    """The xAI Chat service on an ephemeral loopback port (see the module docstring)."""

    def __init__(self) -> None:
        self.replies: deque[XAIReply] = deque()
        self.script: XAIScript = lambda request: "ok"
        self.chunk_delay = 0.0
        self.requests: list[chat_pb2.GetCompletionsRequest] = []
        self._lock = threading.Lock()
        self._failures: deque[_Failure] = deque()
        self._break_after: deque[int] = deque()
        self._ids = 0
        self._server = grpc.server(ThreadPoolExecutor(max_workers=8))
        chat_pb2_grpc.add_ChatServicer_to_server(_Servicer(self), self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self.api_host = f"127.0.0.1:{self.port}"

    # -- setup --------------------------------------------------------------------------

    def client_kwargs(self, **extra: Any) -> dict[str, Any]:
        """Arguments for ``xai_sdk.Client`` / ``AsyncClient`` that reach this server."""
        return {
            "api_key": "test-key",
            "api_host": self.api_host,
            "use_insecure_channel": True,  # the API key still goes along as metadata
            "timeout": 10,
            **extra,
        }

    def fail_next(
        self,
        n: int = 1,
        code: grpc.StatusCode = grpc.StatusCode.INVALID_ARGUMENT,
        details: str = "scripted failure",
    ) -> None:
        """The next ``n`` completion RPCs fail with ``code`` before answering."""
        with self._lock:
            self._failures.extend(_Failure(code, details) for _ in range(n))

    def fail_stream_after(self, chunks: int) -> None:
        """The next streamed answer sends ``chunks`` chunks, then fails with INTERNAL."""
        with self._lock:
            self._break_after.append(chunks)

    # -- inspection ---------------------------------------------------------------------

    def messages(self, index: int = -1) -> list[tuple[str, str]]:
        """A received request's messages as ``(role, text)``, role as ``"system"``, ..."""
        with self._lock:
            request = self.requests[index]
        return [
            (_ROLE.Name(m.role).removeprefix("ROLE_").lower(), _text(m)) for m in request.messages
        ]

    # -- internals ----------------------------------------------------------------------

    def _take(
        self, request: chat_pb2.GetCompletionsRequest, *, streamed: bool
    ) -> tuple[AssistantTurn | None, _Failure | None, int | None]:
        copy = chat_pb2.GetCompletionsRequest()
        copy.CopyFrom(request)
        with self._lock:
            self.requests.append(copy)
            if self._failures:
                return None, self._failures.popleft(), None
            reply = self.replies.popleft() if self.replies else None
            break_after = self._break_after.popleft() if streamed and self._break_after else None
        if reply is None:
            reply = self.script(copy)
        turn = assistant_turn(reply)
        if turn is None:
            raise ValueError(f"an xAI script answers text or tool calls, not {reply!r}")
        return turn, None, break_after

    def _next_id(self) -> str:
        with self._lock:
            self._ids += 1
            return f"resp-{self._ids}"

    def _tool_calls(self, turn: AssistantTurn) -> list[chat_pb2.ToolCall]:
        calls = []
        for call in turn.tool_calls:
            calls.append(
                chat_pb2.ToolCall(
                    id=call.id or f"call_{self._next_id()}",
                    type=chat_pb2.ToolCallType.TOOL_CALL_TYPE_CLIENT_SIDE_TOOL,
                    function=chat_pb2.FunctionCall(name=call.name, arguments=call.arguments),
                )
            )
        return calls

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> Self:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop(grace=None).wait(5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
