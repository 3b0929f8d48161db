"""What the integrations that recall before a model call share: the recall configuration
and the texts the prompt already carries."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ._json import clean, limits

__all__ = ["RECALL_CONFIG", "excluded_texts"]

# Capture's compact recall (docs/capture.md, "What is injected, and where"; about 400
# tokens), without the session's recent turns: the framework's prompt has them.
RECALL_CONFIG: dict[str, Any] = {
    "proposition_top_k": 6,
    "observation_semantic_top_k": 0,
    "message_semantic_top_k": 6,
    "observation_context_top_k": 1,
    "candidate_pool": 10,
    "token_budget": 400,
    "message_recent_limit": 0,
}
_MAX_EXCLUDED = 1000  # get_memory's most exclude_texts


def excluded_texts(memory: object, carried: Iterable[str]) -> tuple[str, ...]:
    """The prompt's own texts as ``get_memory``'s ``exclude_texts``: each once, stripped,
    the last ``_MAX_EXCLUDED``; a text no message could hold (too long, or changed by
    ``clean``) is no stored message's, so it is left out."""
    most, _ = limits(memory)
    return tuple(
        dict.fromkeys(t.strip() for t in carried if t.strip() and len(t) <= most and clean(t) == t)
    )[-_MAX_EXCLUDED:]
