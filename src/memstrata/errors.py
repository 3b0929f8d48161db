"""Exceptions raised by memstrata's public API.

Every error a caller can act on derives from :class:`MemstrataError`, so
``except memstrata.MemstrataError`` catches them all; input problems also derive
from :class:`ValueError` so code written against plain Python keeps working.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "ConflictError",
    "EmbedderMismatchError",
    "EmbeddingError",
    "EmbeddingUnavailableError",
    "MemstrataError",
    "NotFoundError",
    "ProcessingError",
    "StoreError",
    "UnavailableError",
    "ValidationError",
]


class MemstrataError(Exception):
    """Base class of every memstrata error."""


class ValidationError(MemstrataError, ValueError):
    """Input was rejected before anything was written.

    ``problems`` lists one readable line per offending field, e.g.
    ``"messages[2].role: must be one of 'user', 'assistant', ... (got 'bot')"``.
    """

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        self.problems = list(problems or [])
        if self.problems:
            message = message + ":\n  " + "\n  ".join(self.problems)
        super().__init__(message)


class ConfigError(MemstrataError, ValueError):
    """A configuration value is invalid or names something that is not installed."""


class NotFoundError(MemstrataError, LookupError):
    """The session, message or item does not exist (or belongs to another project)."""


class ConflictError(MemstrataError):
    """The request contradicts stored state (e.g. a message id resent with other content)."""


class StoreError(MemstrataError):
    """The database could not be opened, migrated or written."""


class UnavailableError(MemstrataError):
    """A service that processing needs (the LLM, a remote embedder) is down, overloaded or
    refuses the configured credentials, after the SDK's own retries.

    Not the fault of the messages being processed: the job queue pauses processing and
    probes the service with backoff instead of counting an attempt (docs/pipeline.md).
    ``service`` names it, as ``memstrata stats`` shows it.
    """

    def __init__(self, message: str, *, service: str) -> None:
        super().__init__(message)
        self.service = service


class EmbeddingError(MemstrataError):
    """The embedder failed (model file corrupt, embedding endpoint down or malformed)."""


class EmbeddingUnavailableError(EmbeddingError, UnavailableError):
    """The embedding endpoint cannot be reached, times out, or answers 408/409/429/5xx or
    401/403/404."""


class EmbedderMismatchError(MemstrataError):
    """The store holds vectors made by another embedder than the one configured.

    Mixing vector spaces silently would make search return nonsense, so memstrata refuses
    and says how to resolve it (open with the original embedder, or ``memstrata reindex``).
    """


class ProcessingError(MemstrataError):
    """Background processing of accepted messages failed or did not finish in time.

    The messages themselves are stored; failed jobs are retried with backoff.
    """
