"""Anthropic adapter: ``messages.create`` (plain and ``stream=True``) and the
``messages.stream(...)`` context manager, sync and async.

Memory goes, by default, into the last user turn, after its text (a string content gets it
after a blank line, a list of blocks one more text block); with ``injection="system"`` into
``system``: appended to the caller's system prompt (a string, or a list of text blocks that
gets one more block), or as the system prompt when there is none.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from ._capture import Capture, Exchange, Recalled, elapsed_ms
from ._shapes import earlier_turns, into_user_turn, last_user_text, turn_texts, usage_dict
from ._streams import ObjectProxy
from ._wrap import Endpoint, error_text, prepared, restore, wrap_method

__all__ = ["wrap_async", "wrap_sync"]

log = logging.getLogger("stratamem.capture")


def _system(system: Any, block: str) -> Any:
    # The SDK's "not given" sentinels (Omit, NotGiven) mean no system prompt.
    if system is None or system == "" or type(system).__name__ in ("Omit", "NotGiven"):
        return block
    if isinstance(system, str):
        return f"{system}\n\n{block}"
    if isinstance(system, Sequence):
        return [*system, {"type": "text", "text": block}]
    return system  # an unknown shape: leave the caller's prompt alone


def _prepare(capture: Capture, kwargs: dict[str, Any]) -> tuple[Recalled | None, dict[str, Any]]:
    messages = kwargs.get("messages")
    recalled = capture.before(last_user_text(messages), turn_texts(messages))
    if recalled is None:
        return None, kwargs
    sent = dict(kwargs)
    turns = list(messages) if isinstance(messages, Sequence) else None
    block = recalled.block
    if (
        block
        and recalled.injection == "user"
        and turns is not None
        and into_user_turn(turns, block, {"type": "text", "text": block})
    ):
        sent["messages"] = turns
        block = None
    if block:
        sent["system"] = _system(kwargs.get("system"), block)
    if recalled.history and turns is not None and messages is not None:
        earlier = earlier_turns(recalled, messages)
        # The API wants the first turn to be the user's: drop a leading assistant turn.
        while earlier and earlier[0]["role"] != "user":
            earlier.pop(0)
        sent["messages"] = [*earlier, *turns]
    return recalled, sent


def _from_message(
    recalled: Recalled, kwargs: dict[str, Any], message: Any, latency_ms: float, **extra: Any
) -> Exchange:
    text: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in getattr(message, "content", None) or []:
        kind = getattr(block, "type", None)
        if kind == "text":
            text.append(block.text)
        elif kind == "tool_use":
            calls.append({"id": block.id, "name": block.name, "arguments": json.dumps(block.input)})
    return Exchange(
        provider="anthropic",
        attribution=recalled.attribution,
        user_text=last_user_text(kwargs.get("messages")),
        answer="".join(text),
        model=getattr(message, "model", None) or kwargs.get("model"),
        tool_calls=calls,
        usage=usage_dict(getattr(message, "usage", None)),
        latency_ms=latency_ms,
        **extra,
    )


class _Events:
    """Rebuilds the message from raw stream events (``messages.create(stream=True)``)."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.tools: dict[int, dict[str, Any]] = {}
        self.model: str | None = None
        self.usage: dict[str, Any] = {}
        # message_stop arrived: the answer is whole, even if the caller then leaves.
        self.stopped = False

    def add(self, event: Any) -> None:
        kind = getattr(event, "type", None)
        if kind == "message_stop":
            self.stopped = True
        elif kind == "message_start":
            self.model = event.message.model
            self.usage.update(usage_dict(event.message.usage) or {})
        elif kind == "content_block_start" and getattr(event.content_block, "type", "") in (
            "tool_use",
            "server_tool_use",
        ):
            block = event.content_block
            self.tools[event.index] = {"id": block.id, "name": block.name, "arguments": ""}
        elif kind == "content_block_delta":
            delta = event.delta
            if getattr(delta, "type", None) == "text_delta":
                self.text.append(delta.text)
            elif getattr(delta, "type", None) == "input_json_delta" and event.index in self.tools:
                self.tools[event.index]["arguments"] += delta.partial_json
        elif kind == "message_delta" and getattr(event, "usage", None) is not None:
            self.usage.update(usage_dict(event.usage) or {})

    def exchange(
        self,
        recalled: Recalled,
        kwargs: dict[str, Any],
        latency_ms: float,
        partial: bool,
        error: str | None,
    ) -> Exchange:
        return Exchange(
            provider="anthropic",
            attribution=recalled.attribution,
            user_text=_user(kwargs),
            answer="".join(self.text),
            model=self.model or kwargs.get("model"),
            tool_calls=[self.tools[i] for i in sorted(self.tools)],
            usage=self.usage or None,
            latency_ms=latency_ms,
            partial=partial and not self.stopped,
            error=error,
        )


def _snapshot_finish(
    capture: Capture, recalled: Recalled, kwargs: dict[str, Any], start: float
) -> Callable[[Any, str | None], None]:
    """For the stream helper: the SDK keeps the message it has rebuilt so far."""

    def finish(stream: Any, error: str | None) -> None:
        try:
            snapshot = getattr(stream, "current_message_snapshot", None)
        except Exception:  # no event arrived before the block ended
            snapshot = None
        try:
            done = snapshot is not None and getattr(snapshot, "stop_reason", None) is not None
            if snapshot is None:
                ex = Exchange(
                    provider="anthropic",
                    attribution=recalled.attribution,
                    user_text=last_user_text(kwargs.get("messages")),
                    model=kwargs.get("model"),
                    partial=error is None,
                    error=error,
                )
            else:
                ex = _from_message(
                    recalled,
                    kwargs,
                    snapshot,
                    elapsed_ms(start),
                    partial=not done and error is None,
                    error=error,
                )
            capture.after(ex)
        except Exception:
            log.exception("stratamem: capturing an Anthropic stream failed")

    return finish


class _Manager(ObjectProxy):
    """Stands in for ``MessageStreamManager`` (it is one to ``isinstance``): the caller gets
    the SDK's own stream, captured when the block ends."""

    def __init__(self, inner: Any, finish: Callable[[Any, str | None], None]) -> None:
        super().__init__(inner)
        self._self_finish = finish
        self._self_stream: Any = None

    def __enter__(self) -> Any:
        self._self_stream = self.__wrapped__.__enter__()
        return self._self_stream

    def __exit__(self, et: Any, exc: Any, tb: Any) -> Any:
        self._self_finish(self._self_stream, None if exc is None else error_text(exc))
        return self.__wrapped__.__exit__(et, exc, tb)

    async def __aenter__(self) -> Any:
        self._self_stream = await self.__wrapped__.__aenter__()
        return self._self_stream

    async def __aexit__(self, et: Any, exc: Any, tb: Any) -> Any:
        self._self_finish(self._self_stream, None if exc is None else error_text(exc))
        return await self.__wrapped__.__aexit__(et, exc, tb)


def _user(kwargs: dict[str, Any]) -> str | None:
    return last_user_text(kwargs.get("messages"))


def _result(
    recalled: Recalled, kwargs: dict[str, Any], message: Any, latency_ms: float
) -> Exchange:
    return _from_message(recalled, kwargs, message, latency_ms)


MESSAGES = Endpoint("anthropic", _prepare, _user, _result, _Events, label="anthropic messages")


def _wrap_stream_helper(messages: Any, capture: Capture) -> None:
    original = messages.stream

    @functools.wraps(original)
    def stream(*args: Any, **kwargs: Any) -> Any:
        # stream() returns a (sync or async) context manager without I/O, also on the
        # async client, so recall runs here, bounded by its timeout.
        recalled, sent = prepared(MESSAGES, capture, kwargs)
        if recalled is None:
            return original(*args, **kwargs)
        finish = _snapshot_finish(capture, recalled, kwargs, time.perf_counter())
        return _Manager(original(*args, **sent), finish)

    messages.stream = stream


def _wrap(client: Any, capture: Capture, is_async: bool) -> Callable[[], None]:
    messages = client.messages
    wrap_method(messages, "create", MESSAGES, capture, is_async=is_async)
    _wrap_stream_helper(messages, capture)
    return lambda: restore(messages, "create", "stream")


def wrap_sync(client: Any, capture: Capture) -> Callable[[], None]:
    return _wrap(client, capture, is_async=False)


def wrap_async(client: Any, capture: Capture) -> Callable[[], None]:
    return _wrap(client, capture, is_async=True)
