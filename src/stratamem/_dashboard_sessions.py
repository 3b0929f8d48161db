"""``mem.dashboard_sessions``: the dashboard's sign-ins, kept in the store so that any
server process (and a restarted one) knows them.

A sign-in is a random token handed to the browser (a cookie); the store keeps only its
SHA-256, so the table leaks no usable session. Each has a CSRF token for the forms of its
pages. A sign-in with an API key ends when the key is revoked (the store deletes it in the
revocation's transaction), and any sign-in ends at ``expires_at``.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from datetime import datetime, timezone

from ._checks import check_id, int_problem
from ._strings import shown
from ._vocabulary import UiSessionKind
from .errors import NotFoundError, ValidationError
from .store import DashboardStore, UiSessionRow
from .types import DashboardSession

__all__ = ["DashboardSessions"]

# last_seen is a hint for an operator, not a log: one write per sign-in per minute at most.
_TOUCH_EVERY_SECONDS = 60.0
_MAX_TTL_SECONDS = 90 * 24 * 3600
# Expired rows are deleted now and then, by a sign-in being made, not on every read.
_PRUNE_EVERY_SECONDS = 600.0


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _epoch(value: float) -> datetime:
    return datetime.fromtimestamp(value, timezone.utc)


def _record(row: UiSessionRow) -> DashboardSession:
    return DashboardSession(
        kind=row.kind,
        key_id=row.key_id,
        project_id=row.project_id,
        csrf_token=row.csrf_token,
        created_at=_epoch(row.created_at),
        expires_at=_epoch(row.expires_at),
        last_seen=_epoch(row.last_seen),
    )


def _token_ok(token: object) -> bool:
    # token_urlsafe(32) is 43 characters; anything much longer or not ASCII is no token.
    return isinstance(token, str) and 0 < len(token) <= 200 and token.isascii()


class DashboardSessions:
    """``mem.dashboard_sessions``: create, read, re-point and end dashboard sign-ins.
    Not scoped to the facade's project: a sign-in names its own."""

    def __init__(self, store: DashboardStore) -> None:
        self._store = store
        self._pruned_at = 0.0

    def create(
        self, kind: UiSessionKind, key_id: str | None, project_id: str | None, ttl_seconds: int
    ) -> tuple[str, DashboardSession]:
        """A new sign-in: its token (for the cookie; shown only now) and its record."""
        problems = []
        if kind not in ("key", "admin"):
            problems.append(f"kind: expected 'key' or 'admin' (got {shown(kind)})")
        elif kind == "key" and key_id is None:
            problems.append("key_id: a 'key' sign-in names its API key")
        problem = int_problem(ttl_seconds, 1, _MAX_TTL_SECONDS)
        if problem is not None:
            problems.append(f"ttl_seconds: {problem} (got {shown(ttl_seconds)})")
        if problems:
            raise ValidationError("invalid dashboard session", problems)
        if key_id is not None:
            check_id(key_id, "key_id")
        if project_id is not None:
            check_id(project_id, "project_id")
        now = time.time()
        if now - self._pruned_at > _PRUNE_EVERY_SECONDS:
            self._pruned_at = now
            self._store.prune_ui_sessions(now)
        token = secrets.token_urlsafe(32)
        row = UiSessionRow(
            id_hash=_hash(token),
            kind=kind,
            key_id=key_id,
            project_id=project_id,
            csrf_token=secrets.token_urlsafe(32),
            created_at=now,
            expires_at=now + ttl_seconds,
            last_seen=now,
        )
        if not self._store.create_ui_session(row):
            raise NotFoundError(f"no active API key {key_id!r}")
        return token, _record(row)

    def get(self, token: str) -> DashboardSession | None:
        """The sign-in of ``token``, or None (unknown, expired, ended, or its key
        revoked)."""
        if not _token_ok(token):
            return None
        id_hash = _hash(token)
        row = self._store.get_ui_session(id_hash)
        if row is None:
            return None
        now = time.time()
        if now - row.last_seen > _TOUCH_EVERY_SECONDS:
            self._store.touch_ui_session(id_hash, now)
        return _record(row)

    def set_project(self, token: str, project_id: str | None) -> bool:
        """Make the sign-in act in ``project_id`` (an admin picking a project); False if
        the sign-in is gone."""
        if project_id is not None:
            check_id(project_id, "project_id")
        if not _token_ok(token):
            return False
        return self._store.update_ui_session_project(_hash(token), project_id)

    def delete(self, token: str) -> bool:
        """End the sign-in (signing out); False if it was gone already."""
        if not _token_ok(token):
            return False
        return self._store.delete_ui_session(_hash(token))

    def prune(self) -> int:
        """Delete the expired sign-ins now: how many."""
        now = time.time()
        self._pruned_at = now
        return self._store.prune_ui_sessions(now)
