"""stratamem: layered, traceable long-term memory for LLM applications.

>>> from stratamem import Memory, connect
>>> mem = Memory()                                   # ./stratamem.db, local embedder
>>> s = mem.sessions.create(user_id="u1")
>>> s.add_messages([{"role": "user", "content": "I moved to Berlin"}])
>>> mem.search("Where does the user live?", user_id="u1")
>>> remote = connect("http://127.0.0.1:8000", api_key="sm_...")  # a stratamem server's

Names are resolved lazily so that ``import stratamem`` stays fast and needs no model,
database driver or provider SDK until one is used.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "Memory": "stratamem.memory",
    "AsyncMemory": "stratamem._async_memory",
    "MemoryAPI": "stratamem.api",
    "AsyncMemoryAPI": "stratamem.api",
    "connect": "stratamem.client._remote",
    "AsyncSession": "stratamem.types",
    "AddResult": "stratamem.types",
    "Fact": "stratamem.types",
    "Hit": "stratamem.types",
    "MemoryContext": "stratamem.types",
    "Message": "stratamem.types",
    "MessageInput": "stratamem.types",
    "RecallConfig": "stratamem.types",
    "Session": "stratamem.types",
    "Summary": "stratamem.types",
    "Topic": "stratamem.types",
    "Settings": "stratamem.config",
    "StratamemError": "stratamem.errors",
    "ValidationError": "stratamem.errors",
    "ConfigError": "stratamem.errors",
    "ConflictError": "stratamem.errors",
    "NotFoundError": "stratamem.errors",
    "ProcessingError": "stratamem.errors",
    "StoreError": "stratamem.errors",
    "EmbeddingError": "stratamem.errors",
    "EmbedderMismatchError": "stratamem.errors",
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
    "Message",
    "MessageInput",
    "NotFoundError",
    "ProcessingError",
    "RecallConfig",
    "Session",
    "Settings",
    "StoreError",
    "StratamemError",
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
        NotFoundError,
        ProcessingError,
        StoreError,
        StratamemError,
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
        raise AttributeError(f"module 'stratamem' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
