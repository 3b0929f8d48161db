"""Exceptions raised by stratamem's public API.

Every error a caller can act on derives from :class:`StratamemError`, so
``except stratamem.StratamemError`` catches them all; input problems also derive
from :class:`ValueError` so code written against plain Python keeps working.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "ConflictError",
    "EmbedderMismatchError",
    "EmbeddingError",
    "EmbeddingUnavailableError",
    "NotFoundError",
    "ProcessingError",
    "StoreError",
    "StratamemError",
    "UnavailableError",
    "ValidationError",
]


class StratamemError(Exception):
    """Base class of every stratamem error."""


class ValidationError(StratamemError, ValueError):
    """Input was rejected before anything was written.

    ``problems`` lists one readable line per offending field, e.g.
    ``"messages[2].role: must be one of 'user', 'assistant', ... (got 'bot')"``.
    """

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        self.problems = list(problems or [])
        if self.problems:
            message = message + ":\n  " + "\n  ".join(self.problems)
        super().__init__(message)


class ConfigError(StratamemError, ValueError):
    """A configuration value is invalid or names something that is not installed."""


class NotFoundError(StratamemError, LookupError):
    """The session, message or item does not exist (or belongs to another project)."""


class ConflictError(StratamemError):
    """The request contradicts stored state (e.g. a message id resent with other content)."""


class StoreError(StratamemError):
    """The database could not be opened, migrated or written."""


class UnavailableError(StratamemError):
    """A service that processing needs (the LLM, a remote embedder) is down, overloaded or
    refuses the configured credentials, after the SDK's own retries.

    Not the fault of the messages being processed: the job queue pauses processing and
    probes the service with backoff instead of counting an attempt (docs/pipeline.md).
    ``service`` names it, as ``stratamem stats`` shows it.
    """

    def __init__(self, message: str, *, service: str) -> None:
        super().__init__(message)
        self.service = service


class EmbeddingError(StratamemError):
    """The embedder failed (model file corrupt, embedding endpoint down or malformed)."""


class EmbeddingUnavailableError(EmbeddingError, UnavailableError):
    """The embedding endpoint cannot be reached, times out, or answers 408/409/429/5xx or
    401/403/404."""


class EmbedderMismatchError(StratamemError):
    """The store holds vectors made by another embedder than the one configured.

    Mixing vector spaces silently would make search return nonsense, so stratamem refuses
    and says how to resolve it (open with the original embedder, or ``stratamem reindex``).
    """


class ProcessingError(StratamemError):
    """Background processing of accepted messages failed or did not finish in time.

    The messages themselves are stored; failed jobs are retried with backoff.
    """
