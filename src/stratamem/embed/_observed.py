"""An embedder seen by traces and metrics: each ``embed`` is a GenAI embeddings span (under
the recall or batch that asked) and counts its texts and time."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .. import _metrics, _tracing

if TYPE_CHECKING:
    import numpy as np

    from . import Embedder

__all__ = ["ObservedEmbedder"]


class ObservedEmbedder:
    """``inner`` with its calls observed; anything else it offers (``load``,
    ``foreground``, ``replaces``...) is its own."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self._label: str | None = None  # its id

    @property
    def id(self) -> str:
        return self.inner.id

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def dim(self) -> int:
        return self.inner.dim

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        # The id is read once the inner embedder has embedded something: before that, the
        # OpenAI adapter may not know its dimension and would ask the service for it.
        label = self._label
        started = time.perf_counter()
        with _tracing.embeddings_span(label, len(texts)) as span:
            vectors = self.inner.embed(texts)
            if label is None:
                label = self._label = self.inner.id
                _tracing.name_embeddings(span, label)
        _metrics.embedded(label, len(texts), time.perf_counter() - started)
        return vectors
