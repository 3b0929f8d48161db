"""memstrata: layered, traceable long-term memory for LLM applications.

>>> from memstrata import Memory, connect
>>> mem = Memory()                                   # ./memstrata.db, local embedder
>>> s = mem.sessions.create(user_id="u1")
>>> s.add_messages([{"role": "user", "content": "I moved to Berlin"}])
>>> mem.search("Where does the user live?", user_id="u1")
>>> remote = connect("http://127.0.0.1:8000", api_key="ms_...")  # a memstrata server's

Names are resolved lazily so that ``import memstrata`` stays fast and needs no model,
database driver or provider SDK until one is used.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "Memory": "memstrata.memory",
    "AsyncMemory": "memstrata._async_memory",
    "MemoryAPI": "memstrata.api",
    "AsyncMemoryAPI": "memstrata.api",
    "connect": "memstrata.client._remote",
    "AsyncSession": "memstrata.types",
    "AddResult": "memstrata.types",
    "Fact": "memstrata.types",
    "Hit": "memstrata.types",
    "MemoryContext": "memstrata.types",
    "Message": "memstrata.types",
    "MessageInput": "memstrata.types",
    "RecallConfig": "memstrata.types",
    "Session": "memstrata.types",
    "Summary": "memstrata.types",
    "Topic": "memstrata.types",
    "Settings": "memstrata.config",
    "MemstrataError": "memstrata.errors",
    "ValidationError": "memstrata.errors",
    "ConfigError": "memstrata.errors",
    "ConflictError": "memstrata.errors",
    "NotFoundError": "memstrata.errors",
    "ProcessingError": "memstrata.errors",
    "StoreError": "memstrata.errors",
    "EmbeddingError": "memstrata.errors",
    "EmbedderMismatchError": "memstrata.errors",
}

__all__ = [
    "AddResult",
    "AsyncMemory",
    "AsyncMemoryAPI",
    "AsyncSession",
    "ConfigError",
    "ConflictError",
    "EmbedderMismatchError",
    "EmbeddingError",
    "Fact",
    "Hit",
    "Memory",
    "MemoryAPI",
    "MemoryContext",
    "MemstrataError",
    "Message",
    "MessageInput",
    "NotFoundError",
    "ProcessingError",
    "RecallConfig",
    "Session",
    "Settings",
    "StoreError",
    "Summary",
    "Topic",
    "ValidationError",
    "__version__",
    "connect",
]

if TYPE_CHECKING:
    from ._async_memory import AsyncMemory
    from .api import AsyncMemoryAPI, MemoryAPI
    from .client._remote import connect
    from .config import Settings
    from .errors import (
        ConfigError,
        ConflictError,
        EmbedderMismatchError,
        EmbeddingError,
        MemstrataError,
        NotFoundError,
        ProcessingError,
        StoreError,
        ValidationError,
    )
    from .memory import Memory
    from .types import (
        AddResult,
        AsyncSession,
        Fact,
        Hit,
        MemoryContext,
        Message,
        MessageInput,
        RecallConfig,
        Session,
        Summary,
        Topic,
    )


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'memstrata' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
