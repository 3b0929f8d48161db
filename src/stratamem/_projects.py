"""``mem.projects`` and ``mem.keys``: the tenants of a store and their API keys. Neither is
scoped to the facade's project: the server's operator manages every tenant through them."""

from __future__ import annotations

import hashlib
import secrets
import time
from datetime import datetime

from . import _tracing
from ._checks import check_id, new_id, optional_text
from ._convert import from_row
from ._time import now_iso
from .errors import NotFoundError
from .store import ApiKeyRow, GovernanceStore, ProjectRow
from .types import ApiKey, Project

__all__ = ["ApiKeys", "Projects", "key_hash"]

KEY_PREFIX = "sm_"
# last_used_at is a hint for operators, not a log: one write per key per minute at most.
_TOUCH_EVERY_SECONDS = 60.0


def key_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _project(row: ProjectRow) -> Project:
    return from_row(Project, row)


def _key(row: ApiKeyRow) -> ApiKey:
    return from_row(ApiKey, row)


class Projects:
    """``mem.projects``: the tenants of a store."""

    def __init__(self, store: GovernanceStore) -> None:
        self._store = store

    def create(self, name: str, *, project_id: str | None = None) -> Project:
        """Create a project (or return it if ``project_id`` already exists)."""
        optional_text(name, "name", max_len=200, required=True)
        pid = new_id("p") if project_id is None else check_id(project_id, "project_id")
        with _tracing.memory_span("create_memory_store", pid) as span:
            row, created = self._store.create_project(pid, name)
            span.set_attribute("stratamem.project.created", created)
        return _project(row)

    def get(self, project_id: str) -> Project:
        row = self._store.get_project(check_id(project_id, "project_id"))
        if row is None:
            raise NotFoundError(f"no project {project_id!r}")
        return _project(row)

    def list(self) -> list[Project]:
        return [_project(r) for r in self._store.list_projects()]


class ApiKeys:
    """``mem.keys``: project-scoped API keys, stored hashed and shown once."""

    def __init__(self, store: GovernanceStore, projects: Projects) -> None:
        self._store = store
        self._projects = projects

    def create(self, project_id: str, *, name: str | None = None) -> tuple[ApiKey, str]:
        """A new key for ``project_id``: its record and the key itself (shown only now)."""
        self._projects.get(project_id)
        optional_text(name, "name", max_len=200)
        secret = KEY_PREFIX + secrets.token_urlsafe(32)
        row = ApiKeyRow(
            id="key_" + secrets.token_hex(8),
            project_id=project_id,
            name=name,
            prefix=secret[: len(KEY_PREFIX) + 6],
            created_at=now_iso(),
        )
        self._store.create_api_key(row, key_hash(secret))
        return _key(row), secret

    def list(self, project_id: str | None = None) -> list[ApiKey]:
        if project_id is not None:
            check_id(project_id, "project_id")
        return [_key(r) for r in self._store.list_api_keys(project_id)]

    def revoke(self, key_id: str) -> ApiKey:
        row = self._store.revoke_api_key(check_id(key_id, "key_id"))
        if row is None:
            raise NotFoundError(f"no API key {key_id!r}")
        return _key(row)

    def verify(self, secret: str) -> ApiKey | None:
        """The active key record for ``secret``, or ``None`` (unknown or revoked)."""
        if (
            not isinstance(secret, str)
            or not secret.startswith(KEY_PREFIX)
            or len(secret) > 200
            or not secret.isascii()  # keys are; anything else (a lone surrogate) is no key
        ):
            return None
        row = self._store.find_api_key(key_hash(secret))
        if row is None or row.revoked_at is not None:
            return None
        last = row.last_used_at
        if last is None or _age_seconds(last) > _TOUCH_EVERY_SECONDS:
            self._store.touch_api_key(row.id, now_iso())
        return _key(row)


def _age_seconds(iso: str) -> float:
    return time.time() - datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()
