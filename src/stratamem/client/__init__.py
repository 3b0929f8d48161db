"""Python client of a stratamem server (``stratamem serve``), sync and async.

>>> from stratamem.client import MemoryClient
>>> client = MemoryClient(api_key="...", base_url="http://127.0.0.1:8000")
>>> session = client.sessions.create(user_id="u1", title="trip planning")
>>> session.add_messages([{"role": "user", "content": "I moved to Berlin"}])
>>> session.get_memory("Where does the user live?").formatted_context

``AsyncMemoryClient`` is the same with coroutines; ``RemoteMemory`` is the ``Memory``
facade (with ``mem.llm`` capture) over a server. Errors are typed (``AuthenticationError``,
``NotFoundError``, ``ValidationError``, ``PayloadTooLargeError``, ``APITimeoutError`` ...)
and derive from :class:`stratamem.StratamemError`. The clients import httpx when first
used, so importing the errors alone is cheap.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from ._errors import (
    APIConnectionError,
    APIError,
    APIStatusError,
    APITimeoutError,
    AuthenticationError,
    ConflictError,
    NotFoundError,
    PayloadTooLargeError,
    RateLimitError,
    ServerError,
    ValidationError,
)

__all__ = [
    "APIConnectionError",
    "APIError",
    "APIStatusError",
    "APITimeoutError",
    "AsyncMemoryClient",
    "AsyncSession",
    "AuthenticationError",
    "ConflictError",
    "MemoryClient",
    "NotFoundError",
    "PayloadTooLargeError",
    "RateLimitError",
    "RemoteMemory",
    "ServerError",
    "ValidationError",
]

_LAZY = {
    "MemoryClient": "stratamem.client._sync",
    "AsyncMemoryClient": "stratamem.client._async",
    "AsyncSession": "stratamem.client._async",
    "RemoteMemory": "stratamem.client._remote",
}

if TYPE_CHECKING:
    from ._async import AsyncMemoryClient, AsyncSession
    from ._remote import RemoteMemory
    from ._sync import MemoryClient


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'stratamem.client' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
