"""Google adapter (``google-genai``): ``models.generate_content`` and
``models.generate_content_stream`` on a ``genai.Client``, and the same two on its
``client.aio.models``.

Memory goes, by default, into the last user turn that has text, as one more text part
after the user's (a bare part joins the parts around it, which the SDK sends as one turn);
with ``injection="system"`` into ``config.system_instruction``: appended to the caller's own
instruction (text, ``Content``, ``Part`` or a list of parts), or as the whole instruction
when there is none. The caller's ``config`` and ``contents`` are never changed: the request
gets new objects (a new dict, ``model_copy`` of a pydantic config or ``Content``, a new
contents list).

SDK shapes this follows (checked against google-genai 1.x to 3.x):

* ``contents`` is a string, a part, a ``Content`` (or its dict), or a list of those; the SDK
  groups consecutive bare parts (strings, ``Part`` objects, part dicts) into one turn, the
  user's unless they are function calls.
* The sync ``generate_content_stream`` is a generator function: nothing is sent before the
  first ``next()``, so an HTTP error surfaces while iterating. The async one is a coroutine
  returning an async generator, which closes with ``aclose()`` (not ``close()``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

from google.genai import types

from ._capture import Capture, Exchange, Recalled
from ._shapes import field, said, usage_dict
from ._wrap import Endpoint, restore, wrap_method

__all__ = ["inject", "last_user_text", "wrap"]

log = logging.getLogger("stratamem.capture")

_PROVIDER = "google"

# stratamem's roles <-> Gemini's: the model's turns are "model" there.
_TO_GEMINI = {"user": "user", "assistant": "model"}
_FROM_GEMINI = {"user": "user", "model": "assistant", None: "user"}

_Turn = tuple[str, str]  # (stratamem role, text)


# -- reading contents ------------------------------------------------------------------


def _is_content(item: Any) -> bool:
    # A ContentDict is told from a PartDict by its keys, as the SDK does it.
    if isinstance(item, types.Content):
        return True
    return isinstance(item, dict) and ("parts" in item or "role" in item)


def _part_text(part: Any) -> str:
    if isinstance(part, str):
        return part
    if field(part, "thought"):  # the model's reasoning is not what it said
        return ""
    text = field(part, "text")
    return text if isinstance(text, str) else ""


def _is_call(part: Any) -> bool:
    return not isinstance(part, str) and field(part, "function_call") is not None


def _parts_text(parts: Any) -> str:
    if not isinstance(parts, Sequence) or isinstance(parts, str):
        return ""
    return "\n".join(t for t in (_part_text(p) for p in parts) if t)


def _turns(contents: Any) -> list[_Turn]:
    """``contents`` as (role, text) turns, grouped the way the SDK sends them."""
    if contents is None:
        return []
    items = contents if isinstance(contents, list) else [contents]
    turns: list[_Turn] = []
    group: list[Any] = []  # consecutive bare parts: one turn

    def close_group() -> None:
        if group:
            role = "assistant" if any(_is_call(p) for p in group) else "user"
            turns.append((role, _parts_text(group)))
            group.clear()

    for item in items:
        if _is_content(item):
            close_group()
            role = _FROM_GEMINI.get(field(item, "role"), "other")
            turns.append((role, _parts_text(field(item, "parts"))))
        elif isinstance(item, list):  # a list inside the list: one user turn of parts
            close_group()
            turns.append(("user", _parts_text(item)))
        else:
            group.append(item)
    close_group()
    return turns


def last_user_text(contents: Any) -> str | None:
    """The text of the last user turn that has text (a turn of function responses only is
    the SDK answering a call, not the user asking)."""
    for role, text in reversed(_turns(contents)):
        if role == "user" and text.strip():
            return text
    return None


# -- injecting -------------------------------------------------------------------------


def _with_block(instruction: Any, block: str) -> Any:
    """A new system instruction: the caller's (kept first) with ``block`` appended."""
    if instruction is None or instruction == "":
        return block
    if isinstance(instruction, str):
        return f"{instruction}\n\n{block}"
    if isinstance(instruction, types.Content):
        parts = [*(instruction.parts or []), types.Part(text=block)]
        return instruction.model_copy(update={"parts": parts})
    if isinstance(instruction, dict) and "parts" in instruction:
        return {**instruction, "parts": [*(instruction["parts"] or []), {"text": block}]}
    if isinstance(instruction, list):  # a list of parts
        return [*instruction, block]
    return [instruction, block]  # one part (Part, part dict, file, image)


def _last_user_turn(items: list[Any]) -> tuple[int, str] | None:
    """Where the last user turn with text ends in ``items``: the index of its last item and
    what that item is ("content", "list" of parts, or "parts": a group of bare parts)."""
    found: tuple[int, str] | None = None
    group: list[Any] = []

    def close_group(end: int) -> None:
        nonlocal found
        if group and not any(_is_call(p) for p in group) and _parts_text(group).strip():
            found = (end, "parts")
        group.clear()

    for i, item in enumerate(items):
        if _is_content(item) or isinstance(item, list):
            close_group(i - 1)
            content = _is_content(item)
            role = _FROM_GEMINI.get(field(item, "role"), "other") if content else "user"
            if role == "user" and _parts_text(field(item, "parts") if content else item).strip():
                found = (i, "content" if content else "list")
        else:
            group.append(item)
    close_group(len(items) - 1)
    return found


def _into_user_turn(contents: Any, block: str) -> list[Any] | None:
    """New contents with ``block`` as one more part of the last user turn with text."""
    items = list(contents) if isinstance(contents, list) else [contents]
    where = _last_user_turn(items)
    if where is None:
        return None
    i, kind = where
    item = items[i]
    if kind == "parts":
        items.insert(i + 1, block)  # a bare part next to bare parts: the same turn
    elif kind == "list":
        items[i] = [*item, block]
    elif isinstance(item, types.Content):
        items[i] = item.model_copy(update={"parts": [*(item.parts or []), types.Part(text=block)]})
    else:
        items[i] = {**item, "parts": [*(item.get("parts") or []), {"text": block}]}
    return items


def _with_instruction(config: Any, block: str) -> Any:
    if config is None:
        return {"system_instruction": block}
    if isinstance(config, dict):
        # Both spellings are accepted by the SDK's pydantic models; keep the caller's.
        key = "systemInstruction" if "systemInstruction" in config else "system_instruction"
        return {**config, key: _with_block(config.get(key), block)}
    if isinstance(config, types.GenerateContentConfig):
        update = {"system_instruction": _with_block(config.system_instruction, block)}
        return config.model_copy(update=update)
    raise TypeError(f"unexpected config type {type(config).__name__}")


def _history(contents: Any, recalled: Recalled) -> list[types.Content]:
    sent = set(_turns(contents))
    return [
        types.Content(role=_TO_GEMINI[h.role], parts=[types.Part(text=h.content)])
        for h in recalled.history
        if h.role in _TO_GEMINI and (h.role, h.content) not in sent
    ]


def inject(kwargs: dict[str, Any], recalled: Recalled) -> dict[str, Any]:
    """New call kwargs with memory in the last user turn (or ``config.system_instruction``)
    and, if asked, earlier turns of the session that the caller did not send already, in
    front of ``contents``."""
    sent = dict(kwargs)
    block = recalled.block
    if block and recalled.injection == "user" and "contents" in kwargs:
        placed = _into_user_turn(kwargs["contents"], block)
        if placed is not None:
            sent["contents"] = placed
            block = None
    if recalled.history and "contents" in kwargs:
        earlier = _history(kwargs["contents"], recalled)
        if earlier:
            current = sent["contents"]
            rest = list(current) if isinstance(current, list) else [current]
            sent["contents"] = [*earlier, *rest]
    if block:
        sent["config"] = _with_instruction(kwargs.get("config"), block)
    return sent


def _prepare(capture: Capture, kwargs: dict[str, Any]) -> tuple[Recalled | None, dict[str, Any]]:
    try:
        contents = kwargs.get("contents")
        recalled = capture.before(last_user_text(contents), said(_turns(contents)))
    except Exception:  # fail open: the call goes out as the caller made it, uncaptured
        log.exception("stratamem: could not read a Gemini call; it is not captured")
        return None, kwargs
    if recalled is None or not (recalled.block or recalled.history):
        return recalled, kwargs
    try:
        return recalled, inject(kwargs, recalled)
    except Exception:  # fail open: sent as the caller made it, still captured
        log.exception("stratamem: could not inject memory into a Gemini call")
        return recalled, kwargs


# -- reading responses -----------------------------------------------------------------


def _parts_of(response: Any) -> list[Any]:
    # The first candidate is what the SDK's own ``.text`` reads; reading the parts here
    # avoids ``.text``'s warning about non-text parts on every function call.
    candidates = getattr(response, "candidates", None) or []
    content = getattr(candidates[0], "content", None) if candidates else None
    return list(getattr(content, "parts", None) or [])


def _call(part: Any) -> dict[str, Any] | None:
    fc = getattr(part, "function_call", None)
    if fc is None:
        return None
    # The same keys as the other adapters (arguments as JSON text) so stored metadata reads
    # alike whatever the provider.
    return {
        "id": getattr(fc, "id", None),
        "name": getattr(fc, "name", None),
        "arguments": json.dumps(getattr(fc, "args", None) or {}, default=str),
    }


class _Accumulator:
    """Rebuilds the answer, function calls, usage and model from responses or chunks."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.calls: list[dict[str, Any]] = []
        self.usage: dict[str, Any] | None = None
        self.model: str | None = None
        # A candidate had its finish_reason: the answer is whole, even if the caller then
        # stops reading.
        self.finished = False

    def add(self, response: Any) -> None:
        self.model = getattr(response, "model_version", None) or self.model
        candidates = getattr(response, "candidates", None) or []
        if candidates and getattr(candidates[0], "finish_reason", None) is not None:
            self.finished = True
        usage = getattr(response, "usage_metadata", None)
        if usage is not None:  # every chunk carries it; the last one is the total
            self.usage = usage_dict(usage)
        for part in _parts_of(response):
            call = _call(part)
            if call is not None:
                self.calls.append(call)
            elif not getattr(part, "thought", None) and isinstance(
                getattr(part, "text", None), str
            ):
                self.text.append(part.text)

    def exchange(
        self,
        recalled: Recalled,
        kwargs: dict[str, Any],
        latency_ms: float,
        partial: bool = False,
        error: str | None = None,
    ) -> Exchange:
        requested = kwargs.get("model")
        return Exchange(
            provider=_PROVIDER,
            attribution=recalled.attribution,
            user_text=_user(kwargs),
            answer="".join(self.text),
            model=self.model or (requested if isinstance(requested, str) else None),
            tool_calls=self.calls,
            usage=self.usage,
            latency_ms=latency_ms,
            partial=partial and not self.finished,
            error=error,
        )


def _user(kwargs: dict[str, Any]) -> str | None:
    return last_user_text(kwargs.get("contents"))


def _result(
    recalled: Recalled, kwargs: dict[str, Any], response: Any, latency_ms: float
) -> Exchange:
    acc = _Accumulator()
    acc.add(response)
    return acc.exchange(recalled, kwargs, latency_ms)


GENERATE = Endpoint(
    _PROVIDER, _prepare, _user, _result, _Accumulator, label=f"{_PROVIDER} generate_content"
)


# -- wrapping --------------------------------------------------------------------------


def _wrap_models(models: Any, capture: Capture, is_async: bool) -> None:
    wrap_method(models, "generate_content", GENERATE, capture, is_async=is_async)
    # The sync stream is a generator and the async one a coroutine giving an async
    # generator: either way the request goes out on the first read.
    wrap_method(
        models, "generate_content_stream", GENERATE, capture, is_async=is_async, streams=True
    )


_METHODS = ("generate_content", "generate_content_stream")


def wrap(client: Any, capture: Capture) -> Callable[[], None]:
    """Wrap ``client.models`` and ``client.aio.models`` (one client serves both)."""
    sync_models = client.models
    async_models = client.aio.models
    _wrap_models(sync_models, capture, is_async=False)
    try:
        _wrap_models(async_models, capture, is_async=True)
    except BaseException:
        restore(sync_models, *_METHODS)  # all or nothing
        raise

    def undo() -> None:
        restore(sync_models, *_METHODS)
        restore(async_models, *_METHODS)

    return undo
