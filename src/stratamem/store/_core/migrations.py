"""Finding a backend's migrations: the numbered SQL files of its ``migrations`` package.

Each backend applies them its own way (SQLite's ``user_version``, PostgreSQL's
``schema_migrations`` table); which files there are and in what order is the same rule.
"""

from __future__ import annotations

from importlib import resources

__all__ = ["latest_version", "read_migrations"]


def read_migrations(package: str) -> list[tuple[int, str, str]]:
    """(version, file name, SQL) of each ``NNNN_*.sql`` file of ``package``, oldest first."""
    found = []
    for entry in resources.files(package).iterdir():
        name = entry.name
        if name.endswith(".sql") and name[:4].isdigit():
            found.append((int(name[:4]), name, entry.read_text(encoding="utf-8")))
    return sorted(found)


def latest_version(package: str) -> int:
    """The newest schema version ``package``'s migrations reach."""
    return read_migrations(package)[-1][0]
