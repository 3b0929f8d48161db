"""The write path: Message → Facts → Summary → Topic (docs/pipeline.md).

A worker hands each claimed batch (one user's pending messages, in order) to
:class:`Pipeline`, which embeds the messages, extracts grounded facts, consolidates them
into summaries (add, strengthen or supersede), files new summaries under topics, and
commits all of it atomically with the batch. With an LLM configured each stage is a
structured-output call whose prompt lives in :mod:`.prompts`; without one, the offline
heuristics keep every stage working.
"""

from __future__ import annotations

from ._heuristics import is_small_talk
from ._pipeline import Pipeline, embedding_text, layer_embedding_text, speaker_names

__all__ = ["Pipeline", "embedding_text", "is_small_talk", "layer_embedding_text", "speaker_names"]
