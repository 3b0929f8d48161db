"""Capture: ``mem.llm.register(client)`` gives an existing LLM client recall before each
call and capture after it (docs/capture.md). Adapters import their SDK lazily: ``import
stratamem`` never needs a provider package."""

from __future__ import annotations

from ._capture import MEMORY_PREAMBLE, Capture, Exchange
from ._scope import Attribution, current, scope

__all__ = ["MEMORY_PREAMBLE", "Attribution", "Capture", "Exchange", "current", "scope"]
