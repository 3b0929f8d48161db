"""The embedder as one recall sees it: each text embedded once.

A recall embeds its question for retrieval, and again to find which of the user's standing
instructions apply to it (``_standing.applicable``); ``get_memory`` does both around one
search. The bundled model remembers its recent texts, so that cost nothing there; a remote
embedder (OpenAI's) was sent the question twice, one request more per recall of every user
with a standing item. ``RecallEmbedder`` lives for one recall, so nothing it holds goes
stale.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..embed import Embedder

__all__ = ["RecallEmbedder"]


class RecallEmbedder:
    """``embedder`` for one recall: a text it has embedded is not embedded again; the rest
    of a call's texts go to ``embedder`` together, in one call. One recall's thread."""

    def __init__(self, embedder: Embedder) -> None:
        self.embedder = embedder
        self._known: dict[str, np.ndarray] = {}

    @property
    def id(self) -> str:
        return self.embedder.id

    @property
    def name(self) -> str:
        return self.embedder.name

    @property
    def dim(self) -> int:
        return self.embedder.dim

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """``Embedder.embed``: float32 ``(len(texts), dim)``."""
        missing = [t for t in dict.fromkeys(texts) if t not in self._known]
        if missing:
            self._known.update(zip(missing, self.embedder.embed(missing), strict=True))
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.asarray([self._known[t] for t in texts], dtype=np.float32)
