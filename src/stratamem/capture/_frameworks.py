"""Registration of framework objects by name: ``mem.llm.register(chatopenai=model)``.

A framework object can reach several providers (a LangChain model over Bedrock runs
Anthropic, Meta or Amazon models; an agent switches models), so it is named by the
integration that wraps it, never guessed from a positional argument. Each integration's
module is imported only when an object is registered under its name, and its framework is
never imported here: an object of a framework can only exist once that framework is loaded.
"""

from __future__ import annotations

import importlib
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._capture import Capture

__all__ = ["NAMES", "named_hint", "register_named"]


@dataclass(frozen=True)
class _Spec:
    name: str
    what: str  # for messages: what the name accepts
    classes: tuple[tuple[str, str], ...]  # (module, class) pairs, any of which matches
    adapter: str  # module in this package, with a ``wrap(obj, capture)`` function

    def matches(self, obj: Any) -> bool:
        if self.name == "bedrock":
            return _is_bedrock_runtime(obj)
        for module, name in self.classes:
            cls = getattr(sys.modules.get(module), name, None)
            if isinstance(cls, type) and isinstance(obj, cls):
                return True
        return False


_LC = "langchain_core.language_models.chat_models"

# Order matters for hints: the specific LangChain classes before the generic one.
_SPECS: tuple[_Spec, ...] = (
    _Spec(
        "chatopenai",
        "a langchain-openai ChatOpenAI or AzureChatOpenAI",
        (("langchain_openai.chat_models.base", "BaseChatOpenAI"),),
        "._langchain",
    ),
    _Spec(
        "chatanthropic",
        "a langchain-anthropic ChatAnthropic",
        (("langchain_anthropic.chat_models", "ChatAnthropic"),),
        "._langchain",
    ),
    _Spec(
        "chatbedrockconverse",
        "a langchain-aws ChatBedrockConverse",
        (("langchain_aws.chat_models.bedrock_converse", "ChatBedrockConverse"),),
        "._langchain",
    ),
    _Spec(
        "chatbedrock",
        "a langchain-aws ChatBedrock",
        (("langchain_aws.chat_models.bedrock", "ChatBedrock"),),
        "._langchain",
    ),
    _Spec(
        "chatgoogle",
        "a langchain-google-genai ChatGoogleGenerativeAI",
        (("langchain_google_genai.chat_models", "ChatGoogleGenerativeAI"),),
        "._langchain",
    ),
    _Spec(
        "langchain",
        "any other LangChain chat model (a langchain_core BaseChatModel)",
        ((_LC, "BaseChatModel"),),
        "._langchain",
    ),
    _Spec(
        "pydantic_ai",
        "a PydanticAI Agent or Model",
        (("pydantic_ai.agent", "Agent"), ("pydantic_ai.models", "Model")),
        "._pydantic_ai",
    ),
    _Spec(
        "agno",
        "an Agno Agent or Model",
        (("agno.agent.agent", "Agent"), ("agno.models.base", "Model")),
        "._agno",
    ),
    _Spec("bedrock", 'a boto3 client("bedrock-runtime")', (), "._bedrock"),
)

NAMES: tuple[str, ...] = tuple(s.name for s in _SPECS)
_BY_NAME = {s.name: s for s in _SPECS}

# id(obj) -> its Capture: one object, one memory (the object itself carries no marker, so
# a copy of it is a different, unregistered object)
_owners: dict[int, Capture] = {}
_lock = threading.Lock()


def _is_bedrock_runtime(obj: Any) -> bool:
    base = getattr(sys.modules.get("botocore.client"), "BaseClient", None)
    if not isinstance(base, type) or not isinstance(obj, base):
        return False
    model = getattr(getattr(obj, "meta", None), "service_model", None)
    return getattr(model, "service_name", None) == "bedrock-runtime"


def _spec_for(obj: Any) -> _Spec | None:
    return next((s for s in _SPECS if s.matches(obj)), None)


def _describe(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def named_hint(obj: Any) -> str | None:
    """For an object passed positionally: the sentence saying which name to use."""
    spec = _spec_for(obj)
    if spec is None:
        return None
    return (
        f"{_describe(obj)} is a framework object, registered by name: "
        f"mem.llm.register({spec.name}=...)"
    )


def register_named(capture: Capture, positional: Any, named: dict[str, Any]) -> Any:
    if positional is not None:
        raise TypeError(
            "mem.llm.register takes either one client positionally or one framework object "
            "by name, not both"
        )
    if len(named) != 1:
        raise TypeError(
            "mem.llm.register takes one framework object per call, e.g. "
            f"mem.llm.register(chatopenai=model); names: {', '.join(NAMES)}"
        )
    ((name, obj),) = named.items()
    spec = _BY_NAME.get(name)
    if spec is None:
        raise TypeError(f"mem.llm.register got an unknown name {name!r}; names: {', '.join(NAMES)}")
    if not spec.matches(obj):
        fits = _spec_for(obj)
        hint = f"; this one registers as {fits.name}=" if fits is not None else ""
        raise TypeError(f"{name}= takes {spec.what}, not {_describe(obj)}{hint}")
    wrap: Callable[[Any, Capture], Callable[[], None]] = importlib.import_module(
        spec.adapter, __package__
    ).wrap
    key = id(obj)
    with _lock:
        owner = _owners.get(key)
        if owner is capture:
            return obj
        if owner is not None:
            raise ValueError(
                "this object is already registered with another Memory; "
                "unregister it there first (one client, one memory)"
            )
        restore = wrap(obj, capture)
        _owners[key] = capture

    def undo() -> None:
        with _lock:
            _owners.pop(key, None)
        restore()

    with capture._lock:
        capture._clients[key] = (obj, undo)
    return obj
