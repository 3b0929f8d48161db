"""The embedded backend: one SQLite file, FTS5 full text, vectors searched in-process."""

from ._store import SQLiteStore, latest_schema_version, sqlite_path

__all__ = ["SQLiteStore", "latest_schema_version", "sqlite_path"]
