"""The ``Store`` port: everything the engine needs from a database, and nothing more.

Adapters (``sqlite/`` and ``postgres/``, both over the shared core in ``_core/``) implement
it; the engine never issues SQL itself. The port is split by role (``_ports.py``: sessions
and messages, jobs, layers, search, governance, webhooks, the dashboard, and the database
itself), and each consumer declares the roles it uses; ``Store`` is their union. Rows cross
the port as the small dataclasses of ``_rows.py`` (the dashboard's: ``_dashboard_rows.py``),
what recall ranks on as those of ``_briefs.py``; the facade turns rows into the public
pydantic types.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from . import _briefs, _ports, _rows
from ._briefs import *  # noqa: F403  (recall's briefs: MessageBrief, FactBrief, SummaryBrief)
from ._dashboard_rows import ActivityCounts, ProvenanceRows, UiSessionRow, UserRow
from ._filters import MetadataCondition, SearchFilters, parse_metadata_filters
from ._ports import *  # noqa: F403  (the role protocols, Store, LeaseLostError)
from ._ports import Store
from ._rows import *  # noqa: F403  (the row dataclasses)
from ._webhook_rows import OutboxItem, OutboxWrite, WebhookDeliveryRow, WebhookRow

__all__ = [
    "ActivityCounts",
    "MetadataCondition",
    "OutboxItem",
    "OutboxWrite",
    "ProvenanceRows",
    "SearchFilters",
    "UiSessionRow",
    "UserRow",
    "WebhookDeliveryRow",
    "WebhookRow",
    "mask_url",
    "open_store",
    "parse_metadata_filters",
    "store_exists",
]
__all__ += _ports.__all__
__all__ += _rows.__all__
__all__ += _briefs.__all__


# Options each adapter understands; the facade passes all of them, whatever the URL.
_SQLITE_OPTIONS = frozenset(
    {"busy_timeout_ms", "synchronous", "vector_index_threshold", "mmap_bytes"}
)
_POSTGRES_OPTIONS = frozenset({"pool_size", "vector_index_threshold", "ef_search"})


def open_store(url: str, **options: Any) -> Store:
    """Open the store a database URL names: ``sqlite:///path`` (bare paths are SQLite) or
    ``postgresql://...``; a database without one gets one (its tables are created).
    Options an adapter does not use are ignored."""
    if _backend(url) == "sqlite":
        from .sqlite import SQLiteStore

        return SQLiteStore(url, **{k: v for k, v in options.items() if k in _SQLITE_OPTIONS})
    # Imported here: `import stratamem` must not need psycopg.
    from .postgres import PostgresStore

    return PostgresStore(url, **{k: v for k, v in options.items() if k in _POSTGRES_OPTIONS})


def mask_url(url: str) -> str:
    """The URL without its password, fit for logs, messages and ``Store.url``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = netloc[0].split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[1]}"))


def store_exists(url: str) -> bool:
    """Whether the database ``url`` names already holds a store (``open_store`` would
    create one): the SQLite file exists, or the PostgreSQL schema has stratamem's tables.
    Read-only commands use it so that a mistyped URL is an error, not a new empty store."""
    if _backend(url) == "sqlite":
        from .sqlite import sqlite_path

        return os.path.exists(sqlite_path(url))
    from .postgres import has_store

    return has_store(url)


def _backend(url: str) -> str:
    from ..errors import ConfigError

    lowered = url.lower()
    if lowered.startswith("sqlite:") or "://" not in url:
        return "sqlite"
    if lowered.startswith(("postgresql:", "postgres:")):
        return "postgresql"
    if lowered.startswith(("http:", "https:")):
        raise ConfigError(
            "a remote stratamem server is not a database; use Memory(url) "
            "(stratamem.Memory opens a remote server itself) or sqlite:///path.db"
        )
    raise ConfigError(
        f"unsupported database URL {url!r}: expected sqlite:///path.db or postgresql://..."
    )
