"""Which adapter wraps a client: exact SDK classes, imported only when that SDK is installed."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["adapter_for"]

# (module, class names, adapter module, adapter function)
_KNOWN: tuple[tuple[str, tuple[str, ...], str, str], ...] = (
    ("openai", ("OpenAI", "AzureOpenAI"), "._openai", "wrap_sync"),
    ("openai", ("AsyncOpenAI", "AsyncAzureOpenAI"), "._openai", "wrap_async"),
    ("anthropic", ("Anthropic",), "._anthropic", "wrap_sync"),
    ("anthropic", ("AsyncAnthropic",), "._anthropic", "wrap_async"),
    # One genai.Client carries both surfaces (client.models and client.aio.models).
    ("google.genai", ("Client",), "._google", "wrap"),
    # xai_sdk: the SDK's gRPC clients; chats made by client.chat.create are instrumented.
    ("xai_sdk", ("Client",), "._xai", "wrap_sync"),
    ("xai_sdk", ("AsyncClient",), "._xai", "wrap_async"),
)


Adapter = Callable[[Any, Any], Callable[[], None]]


def _adapter(module: str, name: str) -> Adapter:
    wrap: Adapter = getattr(importlib.import_module(module, __package__), name)
    return wrap


def adapter_for(client: Any) -> Adapter:
    """The function that wraps ``client`` and returns a restore callback."""
    # LiteLLM has no client class: the module itself is registered (its functions are
    # wrapped). Identity, not a name test: only the real, imported litellm module matches.
    if client is not None and client is _loaded("litellm"):
        return _adapter("._litellm", "wrap")
    for module, names, adapter, fn in _KNOWN:
        sdk = _loaded(module)
        if sdk is None:
            continue
        classes = tuple(getattr(sdk, n) for n in names if hasattr(sdk, n))
        if classes and isinstance(client, classes):
            return _adapter(adapter, fn)
    from ._frameworks import named_hint

    hint = named_hint(client)
    if hint is not None:
        raise TypeError(hint)
    raise TypeError(
        f"mem.llm.register does not know {type(client).__module__}.{type(client).__qualname__}; "
        "supported: openai.OpenAI, AsyncOpenAI, AzureOpenAI, AsyncAzureOpenAI; "
        "anthropic.Anthropic, AsyncAnthropic; google.genai.Client; "
        "xai_sdk.Client, AsyncClient; "
        "the litellm module (litellm.completion, acompletion)"
    )


def _loaded(module: str) -> Any:
    # A client of an SDK can only exist if the SDK was imported: never import one here.
    import sys

    return sys.modules.get(module)
