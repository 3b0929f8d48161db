"""Any OpenAI-compatible chat endpoint through the ``openai`` SDK.

OpenAI, Azure OpenAI, Ollama, vLLM, LM Studio, DeepSeek, Qwen and others speak this API;
they differ in which ``response_format`` they accept. We ask for a JSON schema first and
step down to ``json_object`` and then to plain text when the endpoint rejects it, and
remember what worked, so a local server costs one refused request, once.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from typing import Any

from ..errors import ConfigError
from . import ChatResult, LLMError, sdk_error, traced_call, unavailable
from . import describe_error as _detail

__all__ = ["OpenAIChatModel"]

log = logging.getLogger("stratamem.llm")

_MODES = ("json_schema", "json_object", "text")
_JSON_HINT = "\n\nAnswer with a single JSON object that follows this JSON schema:\n{schema}"


class OpenAIChatModel:
    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = 60.0,
        max_retries: int = 3,
    ) -> None:
        try:
            import openai
        except ImportError as exc:
            raise ConfigError(
                "llm 'openai:' needs the openai package: pip install 'stratamem[openai]'"
            ) from exc
        key = api_key or os.environ.get("OPENAI_API_KEY")
        if not key:
            if not (base_url or os.environ.get("OPENAI_BASE_URL")):
                raise ConfigError(
                    "llm 'openai:' needs an API key (llm_api_key or OPENAI_API_KEY); a key is "
                    "optional only with llm_base_url, for local servers"
                )
            key = "not-needed"
        self._openai = openai
        # The SDK retries connection errors, 408, 409, 429 and 5xx with exponential backoff
        # (honouring Retry-After); what still fails is an outage for the job queue, which
        # pauses processing and probes (sdk_error).
        self._client = openai.OpenAI(
            api_key=key, base_url=base_url, timeout=timeout, max_retries=max_retries
        )
        self.model = model
        self._mode = 0
        self._lock = threading.Lock()
        self._completion_tokens = False
        self._where = str(self._client.base_url).rstrip("/")

    @property
    def id(self) -> str:
        return f"openai:{self.model}"

    @property
    def name(self) -> str:
        return f"OpenAI-compatible chat {self.model!r} at {self._where}"

    def complete(
        self, system: str, user: str, *, schema: dict[str, Any] | None, max_tokens: int
    ) -> ChatResult:
        while True:
            with self._lock:
                step = self._mode
            mode = _MODES[step] if schema is not None else "text"
            try:
                return traced_call(
                    "openai",
                    self.model,
                    self._where,
                    functools.partial(self._call, system, user, schema, mode, max_tokens),
                )
            except self._openai.BadRequestError as exc:
                if not self._completion_tokens and _mentions(exc, "max_tokens", "temperature"):
                    # Reasoning models refuse max_tokens and temperature: use the newer
                    # max_completion_tokens and the model's own sampling from now on.
                    log.warning(
                        "%s refuses max_tokens/temperature; using max_completion_tokens", self.id
                    )
                    self._completion_tokens = True
                    continue
                if schema is None or mode == "text" or not _format_rejected(exc):
                    raise LLMError(f"{self.id} refused the request: {_detail(exc)}") from exc
                with self._lock:
                    # Concurrent calls rejected in the same mode step down once, together.
                    if self._mode == step:
                        log.warning(
                            "%s does not accept response_format=%s; falling back",
                            self._where,
                            mode,
                        )
                        self._mode = step + 1
            except self._openai.OpenAIError as exc:
                raise sdk_error(self.id, exc) from exc
            except (ValueError, TypeError, AttributeError, KeyError) as exc:
                # A 200 whose body is not a chat completion (a proxy's HTML page, broken
                # JSON): not the model answering, so an outage like a 5xx.
                raise unavailable(self.id, f"returned a malformed response: {exc}") from exc

    def _call(
        self,
        system: str,
        user: str,
        schema: dict[str, Any] | None,
        mode: str,
        max_tokens: int,
        headers: dict[str, str],
    ) -> ChatResult:
        kwargs: dict[str, Any] = {}
        if mode == "json_schema":
            kwargs["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "stratamem_output", "schema": schema, "strict": False},
            }
        elif mode == "json_object":
            kwargs["response_format"] = {"type": "json_object"}
        if schema is not None and mode != "json_schema":
            import json

            system = system + _JSON_HINT.format(schema=json.dumps(schema, ensure_ascii=False))
        started = time.perf_counter()
        if self._completion_tokens:
            kwargs["max_completion_tokens"] = max_tokens
        else:
            kwargs["max_tokens"] = max_tokens
            kwargs["temperature"] = 0
        response = self._client.chat.completions.create(
            model=self.model,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
            extra_headers=headers or None,
            **kwargs,
        )
        latency = (time.perf_counter() - started) * 1000
        if not response.choices:
            raise unavailable(self.id, "returned no choices")
        choice = response.choices[0]
        text = choice.message.content or ""
        if choice.finish_reason == "length":
            log.warning(
                "%s stopped at max_tokens=%d; the JSON is probably cut", self.id, max_tokens
            )
        usage = response.usage
        return ChatResult(
            text=text,
            model=response.model or self.model,
            prompt_tokens=getattr(usage, "prompt_tokens", 0) or 0,
            completion_tokens=getattr(usage, "completion_tokens", 0) or 0,
            latency_ms=latency,
        )


def _mentions(exc: Exception, *words: str) -> bool:
    # The SDK's message holds only error.message of an OpenAI-shaped body; other servers
    # (TGI, FastAPI-based ones, plain text) put the reason elsewhere in the body.
    response = getattr(exc, "response", None)
    body = getattr(response, "text", "") if response is not None else ""
    text = f"{exc} {body}".lower()
    return any(w in text for w in words)


def _format_rejected(exc: Exception) -> bool:
    return _mentions(exc, "response_format", "json_schema", "json schema")
