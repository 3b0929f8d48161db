"""Which HTTP error statuses of a provider mean that a service cannot be used right now
(the LLM and the remote embedder classify their SDKs' errors with this)."""

from __future__ import annotations

__all__ = ["unavailable_status"]


def unavailable_status(status: int) -> bool:
    """Whether an HTTP error status says the service cannot be used now, whatever is asked:
    down or overloaded (408, 409, 429, 5xx; Anthropic's 529 included) or refusing the
    configuration (401 key, 403 permissions, 404 model or URL). Other 4xx (400, 413, 422)
    are about the request itself, and so count against the batch that made it."""
    return status in (401, 403, 404, 408, 409, 429) or status >= 500
