"""LiteLLM adapter: ``litellm.completion`` and ``litellm.acompletion``, plain and
``stream=True``.

LiteLLM has no client object: ``mem.llm.register(litellm)`` registers the module itself and
replaces its ``completion`` and ``acompletion`` attributes with capturing wrappers;
``unregister`` puts the original functions back. Calls made as ``litellm.completion(...)``
are captured. Code that ran ``from litellm import completion`` before registering holds its
own reference to the unwrapped function and is not captured: a module function can only be
replaced where it is looked up.

Requests, ``ModelResponse`` and the streamed chunks are OpenAI-shaped, so the OpenAI chat
endpoint does the work (memory into the system slot of ``messages``), captured under the
provider ``"litellm"``. This module is imported only once ``litellm`` is registered, and it
never imports ``litellm`` itself: the registered module is all it touches.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any

from ._capture import Capture
from ._openai import chat_endpoint
from ._wrap import wrap_method

__all__ = ["wrap"]

_CHAT = chat_endpoint("litellm")
_NAMES = ("completion", "acompletion")
# litellm.completion(model, messages, ...) accepts these two positionally; the endpoint reads
# them from the keywords, so a positional call would otherwise go out without memory.
_POSITIONAL = ("model", "messages")


def _as_keywords(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if not args or len(args) > len(_POSITIONAL):
        return args, kwargs
    named = dict(zip(_POSITIONAL, args, strict=False))  # args may be the shorter
    if named.keys() & kwargs.keys():  # given twice: let litellm raise its own TypeError
        return args, kwargs
    return (), {**named, **kwargs}


def wrap(module: Any, capture: Capture) -> Callable[[], None]:
    originals = {name: getattr(module, name) for name in _NAMES}
    # wrap_method shadows an attribute and restore() pops it from __dict__, which on a module
    # would delete the function: wrap on a stand-in, put the wrappers on the module, and
    # reassign the originals to undo.
    holder = types.SimpleNamespace(**originals)
    wrap_method(holder, "completion", _CHAT, capture, is_async=False)
    wrap_method(holder, "acompletion", _CHAT, capture, is_async=True)
    captured_sync: Callable[..., Any] = holder.completion
    captured_async: Callable[..., Any] = holder.acompletion

    @functools.wraps(originals["acompletion"])
    async def acompletion(*args: Any, **kwargs: Any) -> Any:
        args, kwargs = _as_keywords(args, kwargs)
        return await captured_async(*args, **kwargs)

    @functools.wraps(originals["completion"])
    def completion(*args: Any, **kwargs: Any) -> Any:
        args, kwargs = _as_keywords(args, kwargs)
        if kwargs.get("acompletion") is True:
            # litellm hands completion(..., acompletion=True) to acompletion and returns its
            # coroutine; do the same so the call is captured as async, not as a sync result.
            if args:  # more positionals than model/messages: litellm's own binding, as is
                return originals["completion"](*args, **kwargs)
            return acompletion(**{k: v for k, v in kwargs.items() if k != "acompletion"})
        return captured_sync(*args, **kwargs)

    module.completion = completion
    module.acompletion = acompletion

    def undo() -> None:
        for name, original in originals.items():
            setattr(module, name, original)

    return undo
