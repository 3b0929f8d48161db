"""The write path: what a worker does with a claimed batch of messages.

At this stage a batch is embedded (one vector per message, computed once and stored with
the id of the embedder that made it) and committed atomically with the messages' status,
so a batch is either wholly processed or not at all. Fact extraction, consolidation and
topics plug in here as the layered pipeline lands.
"""

from __future__ import annotations

from ..embed import Embedder
from ..store import ClaimedBatch, MessageRow, Store

__all__ = ["MessageProcessor", "embedding_text"]


def embedding_text(message: MessageRow) -> str:
    """The text a message is embedded as: behaviour events carry their kind and page."""
    if message.event_type:
        parts = [f"{message.event_type.replace('_', ' ')}: {message.content}"]
        if message.page:
            parts.append(f"(page: {message.page})")
        return " ".join(parts)
    return message.content


class MessageProcessor:
    """Embeds a claimed batch and commits it; raises so the worker retries on failure."""

    def __init__(self, store: Store, embedder: Embedder) -> None:
        self.store = store
        self.embedder = embedder

    def __call__(self, batch: ClaimedBatch) -> None:
        vectors = self.embedder.embed([embedding_text(m) for m in batch.messages])
        self.store.complete_batch(batch, embedder=self.embedder.id, vectors=vectors)
