"""Anthropic models through the ``anthropic`` SDK.

Structured output uses ``output_config.format`` (a JSON schema); an endpoint that rejects
it (an older gateway, a proxy) gets the schema in the system prompt instead, once and for
all, and the answer is parsed strictly either way.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from typing import Any

from ..errors import ConfigError
from . import ChatResult, LLMError, sdk_error, traced_call, unavailable
from . import describe_error as _detail

__all__ = ["AnthropicChatModel"]

log = logging.getLogger("stratamem.llm")

_JSON_HINT = "\n\nAnswer with a single JSON object that follows this JSON schema:\n{schema}"


class AnthropicChatModel:
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
            import anthropic
        except ImportError as exc:
            raise ConfigError(
                "llm 'anthropic:' needs the anthropic package: pip install 'stratamem[anthropic]'"
            ) from exc
        key = api_key or os.environ.get("ANTHROPIC_API_KEY")
        if not key:
            raise ConfigError("llm 'anthropic:' needs llm_api_key or ANTHROPIC_API_KEY")
        self._anthropic = anthropic
        self._client = anthropic.Anthropic(
            api_key=key, base_url=base_url, timeout=timeout, max_retries=max_retries
        )
        self.model = model
        self._structured = True
        self._where = str(self._client.base_url).rstrip("/")

    @property
    def id(self) -> str:
        return f"anthropic:{self.model}"

    @property
    def name(self) -> str:
        return f"Anthropic {self.model!r} at {self._where}"

    def complete(
        self, system: str, user: str, *, schema: dict[str, Any] | None, max_tokens: int
    ) -> ChatResult:
        while True:
            structured = schema is not None and self._structured
            try:
                return traced_call(
                    "anthropic",
                    self.model,
                    self._where,
                    functools.partial(self._call, system, user, schema, structured, max_tokens),
                )
            except self._anthropic.BadRequestError as exc:
                if not structured or "output_config" not in str(exc).lower():
                    raise LLMError(f"{self.id} refused the request: {_detail(exc)}") from exc
                log.warning(
                    "%s does not accept output_config; schema goes in the prompt", self._where
                )
                self._structured = False
            except self._anthropic.AnthropicError as exc:
                raise sdk_error(self.id, exc) from exc
            except (ValueError, TypeError, AttributeError, KeyError) as exc:
                # A 200 whose body is not a Messages response: an outage like a 5xx.
                raise unavailable(self.id, f"returned a malformed response: {exc}") from exc

    def _call(
        self,
        system: str,
        user: str,
        schema: dict[str, Any] | None,
        structured: bool,
        max_tokens: int,
        headers: dict[str, str],
    ) -> ChatResult:
        kwargs: dict[str, Any] = {}
        if structured:
            kwargs["output_config"] = {"format": {"type": "json_schema", "schema": schema}}
        elif schema is not None:
            system = system + _JSON_HINT.format(schema=json.dumps(schema, ensure_ascii=False))
        started = time.perf_counter()
        response = self._client.messages.create(
            model=self.model,
            system=system,
            messages=[{"role": "user", "content": user}],
            max_tokens=max_tokens,
            extra_headers=headers or None,
            **kwargs,
        )
        latency = (time.perf_counter() - started) * 1000
        text = "".join(
            block.text for block in response.content if getattr(block, "type", "") == "text"
        )
        if response.stop_reason == "max_tokens":
            log.warning(
                "%s stopped at max_tokens=%d; the JSON is probably cut", self.id, max_tokens
            )
        usage = response.usage
        return ChatResult(
            text=text,
            model=response.model or self.model,
            prompt_tokens=getattr(usage, "input_tokens", 0) or 0,
            completion_tokens=getattr(usage, "output_tokens", 0) or 0,
            latency_ms=latency,
        )
