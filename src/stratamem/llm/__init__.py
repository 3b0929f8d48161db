"""The ``ChatModel`` port: one structured-output call, and the adapters behind it.

The pipeline asks a model for JSON that follows a schema. Adapters use the provider's
structured-output feature where the endpoint supports it and fall back to JSON in plain
text otherwise; either way the answer is parsed strictly (:func:`parse_json_object`) and a
malformed one gets one repair attempt (:func:`complete_json`). Provider SDKs are imported
only by the adapter that needs them.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from .. import _tracing
from .._unavailable import unavailable_status
from ..errors import ConfigError, StratamemError, UnavailableError

__all__ = [
    "ChatModel",
    "ChatResult",
    "LLMError",
    "LLMOutputError",
    "LLMUnavailableError",
    "complete_json",
    "describe_error",
    "make_chat_model",
    "parse_json_object",
    "sdk_error",
    "traced_call",
    "unavailable",
]

log = logging.getLogger("stratamem.llm")


class LLMError(StratamemError):
    """The model call failed (after the SDK's retries). As such (e.g. HTTP 400, 413, 422)
    the request was refused, which counts against the batch that made it; the subclasses
    say the model is unavailable, or answered unusably."""


class LLMUnavailableError(LLMError, UnavailableError):
    """The model cannot be used right now: unreachable, timed out, overloaded (408, 409,
    429, 5xx), answering something that is not a model response, or refusing the
    configured key, permissions or model (401, 403, 404). Nothing about the request's
    content: the job queue pauses processing until the model answers again."""


class LLMOutputError(LLMError):
    """The model answered, but not with valid JSON of the expected shape (after repair)."""

    def __init__(self, message: str, raw: str = "") -> None:
        super().__init__(message)
        self.raw = raw


@dataclass
class ChatResult:
    """One model call: the raw text and what it cost."""

    text: str
    model: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms: float = 0.0


@dataclass
class CallLog:
    """Every call made for one pipeline step, for token accounting."""

    calls: list[ChatResult] = field(default_factory=list)

    @property
    def prompt_tokens(self) -> int:
        return sum(c.prompt_tokens for c in self.calls)

    @property
    def completion_tokens(self) -> int:
        return sum(c.completion_tokens for c in self.calls)


class ChatModel(Protocol):
    """A chat model that can be asked for JSON following a schema."""

    @property
    def id(self) -> str:
        """Provider and model, recorded with every item the model produced."""
        ...

    @property
    def name(self) -> str:
        """Human-readable, for the startup log."""
        ...

    def complete(
        self, system: str, user: str, *, schema: dict[str, Any] | None, max_tokens: int
    ) -> ChatResult: ...


_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.S | re.I)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json_object(text: str) -> dict[str, Any]:
    """The JSON object in a model answer; raises ``ValueError`` saying what is wrong.

    Accepts the object alone, optionally inside one Markdown code fence. Anything else
    (prose around it, several objects, a list, truncated output) is an error: guessing at
    a partial answer is how facts get silently dropped.
    """
    fenced = _FENCE.match(text)
    body = (fenced.group(1) if fenced else text).strip()
    if not body:
        raise ValueError("the answer is empty")
    try:
        value = json.loads(body, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {type(value).__name__}")
    return value


_REPAIR = (
    "Your previous answer could not be used: {error}.\n"
    "Answer again with only the JSON object that follows the schema, no other text.\n"
    "Your previous answer was:\n{previous}"
)


_Valid = TypeVar("_Valid")


def complete_json(
    model: ChatModel,
    system: str,
    user: str,
    *,
    schema: dict[str, Any],
    validate: Callable[[dict[str, Any]], _Valid],
    max_tokens: int = 4096,
    calls: CallLog | None = None,
) -> tuple[_Valid, str]:
    """Ask for JSON, validate it, and repair once. Returns (validated value, raw text).

    ``validate`` turns the parsed object into the caller's type and raises ``ValueError``
    (pydantic's ValidationError is one) when the content is wrong. Raises
    :class:`LLMOutputError` when the repaired answer is still unusable.
    """
    calls = calls if calls is not None else CallLog()
    result = model.complete(system, user, schema=schema, max_tokens=max_tokens)
    calls.calls.append(result)
    try:
        return validate(parse_json_object(result.text)), result.text
    except ValueError as first:
        error = _short(first)
        log.warning("model %s gave an unusable answer (%s); asking it to repair", model.id, error)
    repair = _REPAIR.format(error=error, previous=result.text[:4000])
    second = model.complete(system, f"{user}\n\n{repair}", schema=schema, max_tokens=max_tokens)
    calls.calls.append(second)
    try:
        return validate(parse_json_object(second.text)), second.text
    except ValueError as exc:
        raise LLMOutputError(
            f"model {model.id} gave unusable JSON twice: {_short(exc)}", raw=second.text
        ) from None


def traced_call(
    provider: str, model: str, server: str, call: Callable[[dict[str, str]], ChatResult]
) -> ChatResult:
    """``call(headers)`` as a GenAI inference span (``chat {model}``, a child of the batch
    or recall that asked), the headers carrying the trace to the provider; the span gets
    the answer's model and tokens."""
    with _tracing.chat_span(provider, model, server) as span:
        result = call(_tracing.outgoing_headers())
        if span.is_recording():
            span.set_attribute(_tracing.RESPONSE_MODEL, result.model)
            span.set_attribute(_tracing.INPUT_TOKENS, result.prompt_tokens)
            span.set_attribute(_tracing.OUTPUT_TOKENS, result.completion_tokens)
    return result


def describe_error(exc: Exception) -> str:
    """An SDK error in one line: the HTTP status when there is one, then the message."""
    status = getattr(exc, "status_code", None)
    text = " ".join(str(exc).split())[:300]
    return f"HTTP {status}: {text}" if status else f"{type(exc).__name__}: {text}"


def unavailable(model_id: str, what: str) -> LLMUnavailableError:
    """An outage of the model ``model_id`` (``ChatModel.id``; the service ``llm <id>``):
    "<id> <what>"."""
    return LLMUnavailableError(f"{model_id} {what}", service=f"llm {model_id}")


def sdk_error(model_id: str, exc: Exception) -> LLMError:
    """What a provider SDK's error (after its own retries) means: an outage when the
    model could not be reached or its status says so (:func:`unavailable_status`), else a
    refusal of this request. Connection errors and timeouts carry no status."""
    what = f"failed: {describe_error(exc)}"
    status = getattr(exc, "status_code", None)
    if not isinstance(status, int) or unavailable_status(status):
        return unavailable(model_id, what)
    return LLMError(f"{model_id} {what}")


def _short(exc: Exception) -> str:
    return " ".join(str(exc).split())[:300]


def make_chat_model(
    spec: str,
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    timeout: float = 60.0,
    max_retries: int = 3,
) -> ChatModel | None:
    """The model named by ``spec``: ``none``, ``openai:<model>`` or ``anthropic:<model>``.

    ``none`` returns ``None``: the pipeline then runs its offline heuristics.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError("llm must be 'none', 'openai:<model>' or 'anthropic:<model>'")
    kind, sep, model = spec.strip().partition(":")
    kind = kind.lower()
    if kind == "none" and not sep:
        return None
    if not sep or not model.strip():
        raise ConfigError(
            f"invalid llm {spec!r}: use 'none', 'openai:<model>' (any OpenAI-compatible "
            "server via llm_base_url) or 'anthropic:<model>'"
        )
    if kind == "openai":
        from .openai import OpenAIChatModel

        return OpenAIChatModel(
            model.strip(),
            base_url=base_url,
            api_key=api_key,
            timeout=timeout,
            max_retries=max_retries,
        )
    if kind == "anthropic":
        from .anthropic import AnthropicChatModel

        return AnthropicChatModel(
            model.strip(),
            base_url=base_url,
            api_key=api_key,
            timeout=timeout,
            max_retries=max_retries,
        )
    raise ConfigError(f"unknown llm provider {kind!r} in {spec!r}: use openai or anthropic")
