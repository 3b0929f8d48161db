"""OpenAI adapter: ``chat.completions.create`` (plain and ``stream=True``),
``chat.completions.parse`` and ``responses.create`` (plain and streaming), sync and async.

Memory goes, by default, into the last user turn: after its text (a string gets it after a
blank line, a list of parts one more text part), so everything before that turn stays
byte-identical. With ``injection="system"`` (or a user turn of an unknown shape) it goes
into the system slot. Chat: appended to the caller's leading system (or developer) message
when it is text, else a system message of its own in front. Responses: appended to
``instructions``. The caller's lists and dicts are never changed: the request gets new ones.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from ._capture import Capture, Exchange, Recalled
from ._shapes import (
    earlier_turns,
    field,
    into_user_turn,
    last_user_text,
    text_of,
    turn_texts,
    usage_dict,
)
from ._wrap import Endpoint, restore, wrap_method

__all__ = ["CHAT", "chat_endpoint", "wrap_async", "wrap_sync"]

_SYSTEM_ROLES = ("system", "developer")
_TEXT_PARTS = ("text", "input_text", "output_text")


def _text(content: Any) -> str:
    return text_of(content, _TEXT_PARTS)


def _last_user(items: Any) -> str | None:
    return last_user_text(items, _TEXT_PARTS)


# -- chat completions --------------------------------------------------------------------


def _chat_user(kwargs: dict[str, Any]) -> str | None:
    return _last_user(kwargs.get("messages"))


def _part(kind: str, text: str) -> dict[str, Any]:
    return {"type": kind, "text": text}


def inject_chat(messages: Sequence[Any], recalled: Recalled) -> list[Any]:
    out = list(messages)
    lead = 0
    while lead < len(out) and field(out[lead], "role") in _SYSTEM_ROLES:
        lead += 1
    out[lead:lead] = earlier_turns(recalled, messages, _TEXT_PARTS)
    block = recalled.block
    if block and not (
        recalled.injection == "user" and into_user_turn(out, block, _part("text", block))
    ):
        first = out[0] if out else None
        if (
            isinstance(first, dict)
            and first.get("role") in _SYSTEM_ROLES
            and isinstance(first.get("content"), str)
        ):
            out[0] = {**first, "content": f"{first['content']}\n\n{block}"}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out


def _chat_prepare(
    capture: Capture, kwargs: dict[str, Any]
) -> tuple[Recalled | None, dict[str, Any]]:
    messages = kwargs.get("messages")
    recalled = capture.before(_last_user(messages), turn_texts(messages, _text))
    if recalled is None or not isinstance(messages, Sequence):
        return recalled, kwargs
    if recalled.block or recalled.history:
        return recalled, {**kwargs, "messages": inject_chat(messages, recalled)}
    return recalled, kwargs


def _chat_result(
    provider: str, recalled: Recalled, kwargs: dict[str, Any], result: Any, latency_ms: float
) -> Exchange:
    choice = (getattr(result, "choices", None) or [None])[0]
    message = getattr(choice, "message", None)
    calls = [
        {"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
        for c in (getattr(message, "tool_calls", None) or [])
        if getattr(c, "function", None) is not None
    ]
    return Exchange(
        provider=provider,
        attribution=recalled.attribution,
        user_text=_chat_user(kwargs),
        answer=getattr(message, "content", None) or "",
        model=getattr(result, "model", None) or kwargs.get("model"),
        tool_calls=calls,
        usage=usage_dict(getattr(result, "usage", None)),
        latency_ms=latency_ms,
    )


class _ChatChunks:
    def __init__(self, provider: str) -> None:
        self.provider = provider
        self.text: list[str] = []
        self.tools: dict[int, dict[str, Any]] = {}
        self.usage: dict[str, Any] | None = None
        self.model: str | None = None
        # Whether each choice seen has its finish_reason: the answer is then whole, even if
        # the caller stops reading before the usage chunk or [DONE] (OpenAI's SDK closes
        # the stream at [DONE], before the body's end).
        self.finished: dict[int, bool] = {}

    def add(self, chunk: Any) -> None:
        self.model = getattr(chunk, "model", None) or self.model
        if getattr(chunk, "usage", None) is not None:
            self.usage = usage_dict(chunk.usage)
        for choice in getattr(chunk, "choices", None) or []:
            index = getattr(choice, "index", None) or 0
            done = getattr(choice, "finish_reason", None) is not None
            self.finished[index] = self.finished.get(index, False) or done
            delta = getattr(choice, "delta", None)
            if delta is None:
                continue
            if getattr(delta, "content", None):
                self.text.append(delta.content)
            for call in getattr(delta, "tool_calls", None) or []:
                slot = self.tools.setdefault(call.index, {"id": None, "name": "", "arguments": ""})
                slot["id"] = call.id or slot["id"]
                fn = getattr(call, "function", None)
                if fn is not None:
                    slot["name"] += fn.name or ""
                    slot["arguments"] += fn.arguments or ""

    def exchange(
        self,
        recalled: Recalled,
        kwargs: dict[str, Any],
        latency_ms: float,
        partial: bool,
        error: str | None,
    ) -> Exchange:
        return Exchange(
            provider=self.provider,
            attribution=recalled.attribution,
            user_text=_chat_user(kwargs),
            answer="".join(self.text),
            model=self.model or kwargs.get("model"),
            tool_calls=[self.tools[i] for i in sorted(self.tools)],
            usage=self.usage,
            latency_ms=latency_ms,
            partial=partial and not (self.finished and all(self.finished.values())),
            error=error,
        )


def chat_endpoint(provider: str) -> Endpoint:
    """The chat-completions endpoint, captured under ``provider``: for libraries that speak
    OpenAI's chat shape (``messages`` in; ``choices``/``delta`` objects out), e.g. LiteLLM."""
    return Endpoint(
        provider,
        _chat_prepare,
        _chat_user,
        functools.partial(_chat_result, provider),
        functools.partial(_ChatChunks, provider),
        label=f"{provider} chat.completions",
    )


CHAT = chat_endpoint("openai")


# -- responses ---------------------------------------------------------------------------


def _responses_user(kwargs: dict[str, Any]) -> str | None:
    return _last_user(kwargs.get("input"))


def _responses_prepare(
    capture: Capture, kwargs: dict[str, Any]
) -> tuple[Recalled | None, dict[str, Any]]:
    given = kwargs.get("input")
    recalled = capture.before(_last_user(given), turn_texts(given, _text))
    if recalled is None:
        return None, kwargs
    sent = dict(kwargs)
    items = [{"role": "user", "content": given}] if isinstance(given, str) else given
    if not isinstance(items, Sequence):
        items = None
    block = recalled.block
    if block and recalled.injection == "user" and items is not None:
        placed = list(items)
        if into_user_turn(placed, block, _part("input_text", block)):
            # A string input stays a string: it is one user turn.
            sent["input"] = placed[0]["content"] if isinstance(given, str) else placed
            block = None
    if block:
        instructions = kwargs.get("instructions")
        sent["instructions"] = (
            f"{instructions}\n\n{block}"
            if isinstance(instructions, str) and instructions
            else block
        )
    if recalled.history and items is not None:
        earlier = earlier_turns(recalled, items, _TEXT_PARTS)
        if earlier:
            current = sent.get("input", given)
            turns = (
                [{"role": "user", "content": current}]
                if isinstance(current, str)
                else list(current or ())
            )
            sent["input"] = [*earlier, *turns]
    return recalled, sent


def _response_calls(output: Any) -> list[dict[str, Any]]:
    return [
        {"id": field(o, "call_id"), "name": field(o, "name"), "arguments": field(o, "arguments")}
        for o in output or []
        if field(o, "type") == "function_call"
    ]


def _response_text(response: Any) -> str:
    text = getattr(response, "output_text", None)
    if isinstance(text, str):
        return text
    return "".join(_text(field(o, "content")) for o in getattr(response, "output", None) or [])


def _responses_result(
    recalled: Recalled, kwargs: dict[str, Any], response: Any, latency_ms: float
) -> Exchange:
    return Exchange(
        provider="openai",
        attribution=recalled.attribution,
        user_text=_responses_user(kwargs),
        answer=_response_text(response),
        model=getattr(response, "model", None) or kwargs.get("model"),
        tool_calls=_response_calls(getattr(response, "output", None)),
        usage=usage_dict(getattr(response, "usage", None)),
        latency_ms=latency_ms,
    )


class _ResponseEvents:
    def __init__(self) -> None:
        self.text: list[str] = []
        self.final: Any = None

    def add(self, event: Any) -> None:
        kind = getattr(event, "type", None)
        if kind == "response.output_text.delta":
            self.text.append(event.delta)
        elif kind in ("response.completed", "response.incomplete", "response.failed"):
            self.final = event.response

    def exchange(
        self,
        recalled: Recalled,
        kwargs: dict[str, Any],
        latency_ms: float,
        partial: bool,
        error: str | None,
    ) -> Exchange:
        if self.final is not None:
            ex = _responses_result(recalled, kwargs, self.final, latency_ms)
            ex.error = error
            return ex
        return Exchange(
            provider="openai",
            attribution=recalled.attribution,
            user_text=_responses_user(kwargs),
            answer="".join(self.text),
            model=kwargs.get("model"),
            latency_ms=latency_ms,
            partial=partial,
            error=error,
        )


RESPONSES = Endpoint(
    "openai",
    _responses_prepare,
    _responses_user,
    _responses_result,
    _ResponseEvents,
    label="openai responses",
)


# -- registration --------------------------------------------------------------------------


def _wrap(client: Any, capture: Capture, is_async: bool) -> Callable[[], None]:
    completions = client.chat.completions
    responses = client.responses
    wrap_method(completions, "create", CHAT, capture, is_async=is_async)
    wrap_method(completions, "parse", CHAT, capture, is_async=is_async)
    wrap_method(responses, "create", RESPONSES, capture, is_async=is_async)

    def undo() -> None:
        restore(completions, "create", "parse")
        restore(responses, "create")

    return undo


def wrap_sync(client: Any, capture: Capture) -> Callable[[], None]:
    return _wrap(client, capture, is_async=False)


def wrap_async(client: Any, capture: Capture) -> Callable[[], None]:
    return _wrap(client, capture, is_async=True)
