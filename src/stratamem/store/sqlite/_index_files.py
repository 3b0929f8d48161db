"""HNSW indexes kept beside the SQLite file, so that a process does not build them again.

An index over a long history takes long to build on one thread (a 1,000,000-message
user: 356 s, its searches exact and slow meanwhile) and every process on the file built
its own at start. Now the first build is saved in ``<file>-hnsw/`` and later processes
restore it; ``VectorScope`` checks every vector a restored index holds against the ones
it loaded from the table and repairs or rebuilds what differs, so a file here is a cache:
deleting the directory costs a rebuild, never an answer.

Files are named by hashes (a user id can be an e-mail address) and written whole under a
temporary name, then renamed into place. They hold vectors of what users said: removing
memory (``forget``, ``erase_user``) deletes the user's files after the removal commits,
and a save that raced it deletes its own file when it finds the generation it was built
from gone (the removal bumps it before deleting files).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._vector_cache import ScopeKey, _usearch_index

__all__ = ["SQLiteIndexFiles", "vector_generation"]

log = logging.getLogger("stratamem.store")

_SUFFIX = ".usearch"
_ABANDONED_SECONDS = 3600


def vector_generation(conn: sqlite3.Connection, project_id: str, user_id: str, kind: str) -> int:
    """The generation of a user's vectors of ``kind``: bumped whenever some are deleted, so
    that what was loaded (or saved) from the earlier rows is known to be stale."""
    row = conn.execute(
        "SELECT generation FROM vector_generations WHERE project_id = ? AND user_id = ? "
        "AND kind = ?",
        (project_id, user_id, kind),
    ).fetchone()
    return 0 if row is None else int(row[0])


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


class SQLiteIndexFiles:
    """``IndexFiles`` of a SQLite store: one file a scope in ``<database>-hnsw/``."""

    def __init__(self, database: str) -> None:
        self.database = database
        self.directory = database + "-hnsw"
        self._warned = threading.Event()

    def path(self, key: ScopeKey) -> str:
        project_id, user_id, kind, embedder = key
        name = f"{_digest(project_id, user_id)}-{kind}-{_digest(embedder)[:16]}{_SUFFIX}"
        return os.path.join(self.directory, name)

    def restore(self, key: ScopeKey) -> Any:
        path = self.path(key)
        if not os.path.exists(path):
            return None
        try:
            return _usearch_index().restore(path)
        except Exception as exc:  # any unreadable file is only a lost cache
            log.warning("HNSW index file %s unreadable, building again: %s", path, exc)
            with contextlib.suppress(OSError):
                os.unlink(path)
            return None

    def save(self, key: ScopeKey, index: Any, generation: int) -> bool:
        path = self.path(key)
        temporary = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            self._remove_abandoned(path)
            index.save(temporary)
            os.replace(temporary, path)
        except Exception as exc:  # a cache that cannot be kept is rebuilt
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            # Once a process: a read-only or full disk would say it at every build.
            if not self._warned.is_set():
                self._warned.set()
                log.warning("cannot keep HNSW index files in %s: %s", self.directory, exc)
            return False
        if self._generation(key) != generation:  # memory removed meanwhile (see module)
            with contextlib.suppress(OSError):
                os.unlink(path)
            return False
        return True

    def _remove_abandoned(self, path: str) -> None:
        # What a process killed while saving left (a save takes seconds, not an hour).
        for temporary in glob.glob(glob.escape(path) + ".*.tmp"):
            with contextlib.suppress(OSError):
                if time.time() - os.path.getmtime(temporary) > _ABANDONED_SECONDS:
                    os.unlink(temporary)

    def _generation(self, key: ScopeKey) -> int | None:
        # Its own short connection: saves run on build threads, which the store's
        # per-thread connections would outlive.
        try:
            uri = Path(self.database).absolute().as_uri() + "?mode=ro"  # never creates it
            conn = sqlite3.connect(uri, uri=True, timeout=5)
            try:
                return vector_generation(conn, *key[:3])
            finally:
                conn.close()
        except sqlite3.Error:
            return None

    def files(self) -> list[str]:
        """Every file in the directory (saves under way included)."""
        return glob.glob(os.path.join(glob.escape(self.directory), "*"))

    def remove_user(self, project_id: str, user_id: str) -> None:
        """Delete the files of every scope of a user (temporary ones included)."""
        user = f"{_digest(project_id, user_id)}-"
        self._remove(lambda name: name.startswith(user))

    def remove_other_embedders(self, embedder: str) -> None:
        """Delete the files of every scope not embedded by ``embedder``."""
        mine = f"-{_digest(embedder)[:16]}{_SUFFIX}"
        self._remove(lambda name: mine not in name)

    def _remove(self, doomed: Callable[[str], bool]) -> None:
        for path in self.files():
            if doomed(os.path.basename(path)):
                with contextlib.suppress(OSError):
                    os.unlink(path)
