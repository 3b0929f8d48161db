"""PydanticAI: ``mem.llm.register(pydantic_ai=agent)`` for an ``Agent``, or
``mem.llm.register(pydantic_ai=model)`` for a ``Model``.

An agent is captured per run: every run — ``run``, ``run_sync``, ``run_stream``,
``run_stream_events``, ``iter`` — opens ``Agent.iter``, which is wrapped. Recall runs once,
for the run's user prompt, and its block is one more entry of the run's ``instructions``
(the agent's own stay as they are), so every model request of the run carries it, whatever
``injection`` says: a run has no request-only place in the user's turn (its user prompt
becomes the run's message history, which the application keeps). When
the run ends, the user prompt, the final output and the tool calls made on the way are
stored as one exchange: the model requests inside the run (and a registered model or SDK
client under it) stand down, so a tool loop is not stored step by step.

A model is captured per request (``Model.request`` and ``Model.request_stream``): the block
goes in as one more user prompt part of the request's last user prompt (a new list and
``ModelRequest``, the run's history stays as it is), or with ``injection="system"`` as one
more dynamic instruction part of the request parameters; the user's text is
stored only by a request that carries a user prompt (the requests that return tool results
store the answer and its tool calls).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

from pydantic import BaseModel
from pydantic_ai.agent import Agent
from pydantic_ai.messages import (
    InstructionPart,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    UserPromptPart,
)

from ._capture import Capture, Exchange, Recalled, elapsed_ms
from ._layers import Wrapper, bind, bound, outer
from ._shapes import said

__all__ = ["wrap"]

log = logging.getLogger("stratamem.capture")

_PROVIDER = "pydantic_ai"


def _prompt_text(prompt: Any) -> str | None:
    """The text of a user prompt: a string or a sequence of contents (text items only)."""
    if isinstance(prompt, str):
        return prompt or None
    if isinstance(prompt, Sequence):
        return "\n".join(p for p in prompt if isinstance(p, str)) or None
    return None


def _user_prompt(request: Any) -> str | None:
    if not isinstance(request, ModelRequest):
        return None
    texts = [_prompt_text(p.content) for p in request.parts if isinstance(p, UserPromptPart)]
    return "\n".join(t for t in texts if t) or None


def _query(messages: Sequence[Any]) -> str | None:
    for m in reversed(messages):
        text = _user_prompt(m)
        if text:
            return text
    return None


def _turns(messages: Any) -> Iterator[tuple[str, str | None]]:
    """A message history as (role, text): requests' user prompts, responses' text."""
    for m in messages if isinstance(messages, Sequence) else ():
        if isinstance(m, ModelRequest):
            yield "user", _user_prompt(m)
        elif isinstance(m, ModelResponse):
            yield "assistant", _text(m)


def _calls(responses: Sequence[Any], skip: str | None = None) -> list[dict[str, Any]]:
    return [
        {"id": p.tool_call_id, "name": p.tool_name, "arguments": p.args_as_json_str()}
        for r in responses
        if isinstance(r, ModelResponse)
        for p in r.parts
        if isinstance(p, ToolCallPart) and p.tool_name != skip
    ]


def _text(response: Any) -> str:
    if not isinstance(response, ModelResponse):
        return ""
    return "".join(p.content for p in response.parts if isinstance(p, TextPart))


def _usage(usage: Any) -> dict[str, Any] | None:
    if usage is None or not dataclasses.is_dataclass(usage):
        return None
    counts = {
        f.name: getattr(usage, f.name)
        for f in dataclasses.fields(usage)
        if isinstance(getattr(usage, f.name), int) and getattr(usage, f.name)
    }
    return counts or None


def _output_text(output: Any) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, BaseModel):
        return output.model_dump_json()
    try:
        return json.dumps(output, default=str)
    except (TypeError, ValueError):
        return str(output)


def _after(capture: Capture, make: Callable[[], Exchange]) -> None:
    try:
        capture.after(make())
    except Exception:  # an unexpected result shape must not fail the caller's run
        log.exception("stratamem: could not read a PydanticAI result")


def _error(exc: BaseException | None) -> str | None:
    return None if exc is None else f"{type(exc).__name__}: {exc}"


# -- agents ------------------------------------------------------------------------------------


def _with_instruction(given: Any, block: str) -> Any:
    if given is None:
        return block
    if isinstance(given, (str, bytes)) or callable(given) or not isinstance(given, Sequence):
        return [given, block]
    return [*given, block]


class _Run:
    """Stands in for the context manager ``Agent.iter`` returns: the caller gets the
    agent's own ``AgentRun``."""

    def __init__(
        self,
        original: Callable[..., Any],
        agent: Any,
        capture: Capture,
        user_prompt: Any,
        kwargs: dict[str, Any],
    ) -> None:
        self._original = original
        self._agent = agent
        self._capture = capture
        self._prompt = user_prompt
        self._kwargs = kwargs
        self._inner: Any = None
        self._run: Any = None
        self._recalled: Recalled | None = None
        self._guard: contextlib.ExitStack | None = None
        self._start = 0.0

    async def __aenter__(self) -> Any:
        kwargs = self._kwargs
        # Recall blocks (bounded by the recall timeout): keep it off the event loop.
        prompt = _prompt_text(self._prompt)
        history = self._kwargs.get("message_history")
        carried = said([*_turns(history), ("user", prompt)])
        recalled = await asyncio.to_thread(self._capture.before, prompt, carried)
        if recalled is not None and recalled.block:
            try:
                instructions = _with_instruction(kwargs.get("instructions"), recalled.block)
                kwargs = {**kwargs, "instructions": instructions}
            except Exception:
                log.exception("stratamem: could not add memory to a PydanticAI run")
        self._recalled = recalled
        self._inner = self._original(self._agent, self._prompt, **kwargs)
        if recalled is not None:
            self._guard = contextlib.ExitStack()
            self._guard.enter_context(outer(self._capture))
        self._start = time.perf_counter()
        try:
            self._run = await self._inner.__aenter__()
        except BaseException:
            self._release()
            raise
        return self._run

    def _release(self) -> None:
        if self._guard is not None:
            self._guard.close()
            self._guard = None

    async def __aexit__(self, et: Any, exc: Any, tb: Any) -> Any:
        self._release()
        try:
            return await self._inner.__aexit__(et, exc, tb)
        finally:
            if self._recalled is not None:
                recalled, run = self._recalled, self._run
                latency = elapsed_ms(self._start)
                _after(self._capture, lambda: self._exchange(recalled, run, exc, latency))

    def _exchange(self, recalled: Recalled, run: Any, exc: Any, latency: float) -> Exchange:
        result = getattr(run, "result", None)
        messages = list(run.new_messages()) if run is not None else []
        responses = [m for m in messages if isinstance(m, ModelResponse)]
        last = responses[-1] if responses else None
        skip = getattr(result, "_output_tool_name", None)
        # run_stream hands the final response over without finishing the graph: no result
        answer = _output_text(result.output) if result is not None else _text(last)
        done = result is not None or (
            last is not None and getattr(last, "finish_reason", None) is not None
        )
        return Exchange(
            provider=_PROVIDER,
            attribution=recalled.attribution,
            user_text=_prompt_text(self._prompt),
            answer=answer,
            model=getattr(last, "model_name", None),
            tool_calls=_calls(responses, skip),
            usage=_usage(getattr(run, "usage", None)),
            latency_ms=latency,
            partial=not done and exc is None,
            error=_error(exc),
        )


def _iter(original: Callable[..., Any]) -> Callable[..., Any]:
    def run_iter(self: Any, user_prompt: Any = None, **kwargs: Any) -> Any:
        capture = bound(self)
        if capture is None:
            return original(self, user_prompt, **kwargs)
        return _Run(original, self, capture, user_prompt, kwargs)

    return run_iter


# -- models ------------------------------------------------------------------------------------


def _parameters(messages: Sequence[Any], parameters: Any, block: str) -> Any:
    parts = parameters.instruction_parts
    if parts is None:  # a direct model.request(): the model reads the messages' instructions
        given = next(
            (m.instructions for m in reversed(messages) if isinstance(m, ModelRequest)), None
        )
        parts = [InstructionPart(content=given)] if given else []
    extra = InstructionPart(content=block, dynamic=True)
    return dataclasses.replace(parameters, instruction_parts=[*parts, extra])


def _into_user_turn(messages: Sequence[Any], block: str) -> list[Any] | None:
    """New messages whose last request with a user prompt has ``block`` as one more user
    prompt part; None when there is none."""
    for i in range(len(messages) - 1, -1, -1):
        if _user_prompt(messages[i]):
            placed = dataclasses.replace(
                messages[i], parts=[*messages[i].parts, UserPromptPart(content=block)]
            )
            return [*messages[:i], placed, *messages[i + 1 :]]
    return None


def _prepare(
    capture: Capture, messages: list[Any], parameters: Any
) -> tuple[Recalled | None, list[Any], Any]:
    """Recall for the request; the messages and parameters to send."""
    try:
        recalled = capture.before(_query(messages), said(_turns(messages)))
        capture.log_recall(recalled, request="pydantic_ai model request")
        if recalled is None or not recalled.block:
            return recalled, messages, parameters
        if recalled.injection == "user":
            placed = _into_user_turn(messages, recalled.block)
            if placed is not None:
                return recalled, placed, parameters
        return recalled, messages, _parameters(messages, parameters, recalled.block)
    except Exception:  # fail open: the request goes out as the caller made it
        log.exception("stratamem: could not prepare a PydanticAI model request")
        return None, messages, parameters


def _model_exchange(
    recalled: Recalled,
    messages: Sequence[Any],
    response: Any,
    latency: float,
    *,
    partial: bool = False,
    error: str | None = None,
) -> Exchange:
    asked = _user_prompt(messages[-1]) if messages else None
    return Exchange(
        provider=_PROVIDER,
        attribution=recalled.attribution,
        user_text=asked,
        answer=_text(response),
        model=getattr(response, "model_name", None),
        tool_calls=_calls([response]) if response is not None else [],
        usage=_usage(getattr(response, "usage", None)),
        latency_ms=latency,
        partial=partial,
        error=error,
    )


def _request(original: Callable[..., Any]) -> Callable[..., Any]:
    async def request(
        self: Any, messages: list[Any], settings: Any, parameters: Any, *args: Any, **kw: Any
    ) -> Any:
        capture = bound(self)
        if capture is None:
            return await original(self, messages, settings, parameters, *args, **kw)
        recalled, turns, sent = await asyncio.to_thread(_prepare, capture, messages, parameters)
        if recalled is None:
            return await original(self, messages, settings, parameters, *args, **kw)
        start = time.perf_counter()
        try:
            with outer(capture):
                response = await original(self, turns, settings, sent, *args, **kw)
        except Exception as exc:
            failed = _error(exc)
            _after(capture, lambda: _model_exchange(recalled, messages, None, 0, error=failed))
            raise
        latency = elapsed_ms(start)
        _after(capture, lambda: _model_exchange(recalled, messages, response, latency))
        return response

    return request


def _request_stream(original: Callable[..., Any]) -> Callable[..., Any]:
    @contextlib.asynccontextmanager
    async def request_stream(
        self: Any, messages: list[Any], settings: Any, parameters: Any, *args: Any, **kw: Any
    ) -> AsyncIterator[Any]:
        capture = bound(self)
        recalled, turns, sent = (
            await asyncio.to_thread(_prepare, capture, messages, parameters)
            if capture is not None
            else (None, messages, parameters)
        )
        if capture is None or recalled is None:
            async with original(self, messages, settings, parameters, *args, **kw) as streamed:
                yield streamed
            return
        start = time.perf_counter()
        streamed = None
        error: str | None = None
        try:
            with outer(capture):
                async with original(self, turns, settings, sent, *args, **kw) as streamed:
                    yield streamed
        except BaseException as exc:
            error = _error(exc)
            raise
        finally:
            latency = elapsed_ms(start)

            def make() -> Exchange:
                response = streamed.get() if streamed is not None else None
                finished = getattr(response, "finish_reason", None) is not None
                return _model_exchange(
                    recalled,
                    messages,
                    response,
                    latency,
                    partial=not finished and error is None,
                    error=error,
                )

            _after(capture, make)

    return request_stream


def wrap(obj: Any, capture: Capture) -> Callable[[], None]:
    if isinstance(obj, Agent):
        return bind(obj, capture, {"iter": _iter})
    wrappers: dict[str, Wrapper] = {"request": _request, "request_stream": _request_stream}
    return bind(obj, capture, wrappers)
