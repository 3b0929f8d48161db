"""Projects, API keys, status changes, deletion, export and audit: the operator's side of
the facade. ``Memory`` exposes these as ``mem.projects``, ``mem.keys`` and methods."""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from ._checks import check_id, check_text, new_id
from ._queries import ItemQuery
from ._time import now_iso, to_iso
from .errors import NotFoundError
from .recall._rows import fact_from_row, message_from_row, summary_from_row, topic_from_row
from .store import ApiKeyRow, AuditRow, ItemFilters, ProjectRow, parse_metadata_filters
from .types import (
    ApiKey,
    AuditRecord,
    Fact,
    MessageState,
    ProcessingStatus,
    Project,
    Summary,
    Topic,
)

if TYPE_CHECKING:
    from .memory import Memory

__all__ = ["ApiKeys", "Projects", "item_filters", "key_hash"]

KEY_PREFIX = "ms_"
# Operators may move a summary between these; "superseded" is the pipeline's verdict.
SETTABLE_STATUSES = ("active", "deprioritized", "archived", "deleted")
# last_used_at is a hint for operators, not a log: one write per key per minute at most.
_TOUCH_EVERY_SECONDS = 60.0

T = TypeVar("T")


def key_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _project(row: ProjectRow) -> Project:
    return Project(id=row.id, name=row.name, created_at=row.created_at)


def _key(row: ApiKeyRow) -> ApiKey:
    return ApiKey(
        id=row.id,
        project_id=row.project_id,
        name=row.name,
        prefix=row.prefix,
        created_at=row.created_at,
        revoked_at=row.revoked_at,
        last_used_at=row.last_used_at,
    )


def _audit(row: AuditRow) -> AuditRecord:
    return AuditRecord(
        id=row.pk,
        project_id=row.project_id,
        user_id=row.user_id,
        action=row.action,  # type: ignore[arg-type]
        target=row.target,
        actor=row.actor,
        reason=row.reason,
        details=row.details,
        at=row.at,
    )


def _text(value: Any, name: str, *, max_len: int, required: bool = False) -> str | None:
    if value is None and not required:
        return None
    return check_text(value, name, max_len=max_len)


class Projects:
    """``mem.projects``: the tenants of a store."""

    def __init__(self, memory: Memory) -> None:
        self._m = memory

    def create(self, name: str, *, project_id: str | None = None) -> Project:
        """Create a project (or return it if ``project_id`` already exists)."""
        _text(name, "name", max_len=200, required=True)
        pid = new_id("p") if project_id is None else check_id(project_id, "project_id")
        row, _ = self._m.store.create_project(pid, name)
        return _project(row)

    def get(self, project_id: str) -> Project:
        row = self._m.store.get_project(check_id(project_id, "project_id"))
        if row is None:
            raise NotFoundError(f"no project {project_id!r}")
        return _project(row)

    def list(self) -> list[Project]:
        return [_project(r) for r in self._m.store.list_projects()]


class ApiKeys:
    """``mem.keys``: project-scoped API keys, stored hashed and shown once."""

    def __init__(self, memory: Memory) -> None:
        self._m = memory

    def create(self, project_id: str, *, name: str | None = None) -> tuple[ApiKey, str]:
        """A new key for ``project_id``: its record and the key itself (shown only now)."""
        self._m.projects.get(project_id)
        _text(name, "name", max_len=200)
        secret = KEY_PREFIX + secrets.token_urlsafe(32)
        row = ApiKeyRow(
            id="key_" + secrets.token_hex(8),
            project_id=project_id,
            name=name,
            prefix=secret[: len(KEY_PREFIX) + 6],
            created_at=now_iso(),
        )
        self._m.store.create_api_key(row, key_hash(secret))
        return _key(row), secret

    def list(self, project_id: str | None = None) -> list[ApiKey]:
        if project_id is not None:
            check_id(project_id, "project_id")
        return [_key(r) for r in self._m.store.list_api_keys(project_id)]

    def revoke(self, key_id: str) -> ApiKey:
        row = self._m.store.revoke_api_key(check_id(key_id, "key_id"))
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
        row = self._m.store.find_api_key(key_hash(secret))
        if row is None or row.revoked_at is not None:
            return None
        last = row.last_used_at
        if last is None or _age_seconds(last) > _TOUCH_EVERY_SECONDS:
            self._m.store.touch_api_key(row.id, now_iso())
        return _key(row)


def _age_seconds(iso: str) -> float:
    return time.time() - datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def item_filters(query: ItemQuery) -> ItemFilters:
    """The store's filters of a facts or summaries listing."""
    return ItemFilters(
        status=query.status,
        since=to_iso(query.since),
        until=to_iso(query.until),
        metadata=parse_metadata_filters(query.metadata_filters),
    )


def _pages(fetch: Callable[[int, int], list[T]], size: int = 500) -> Iterator[T]:
    offset = 0
    while True:
        rows = fetch(size, offset)
        yield from rows
        if len(rows) < size:
            return
        offset += size


def export_user(m: Memory, user_id: str) -> dict[str, Any]:
    """Everything memstrata holds about a user, as JSON-ready data."""
    store, project = m.store, m.project_id
    sessions = list(_pages(lambda n, o: store.list_sessions(project, user_id, n, o)))
    messages = _pages(lambda n, o: store.list_messages(project, user_id=user_id, limit=n, offset=o))
    facts: list[Fact] = [
        fact_from_row(r)
        for r in _pages(lambda n, o: store.list_facts(project, user_id, limit=n, offset=o))
    ]
    summaries: list[Summary] = [
        summary_from_row(r)
        for r in _pages(lambda n, o: store.list_summaries(project, user_id, limit=n, offset=o))
    ]
    topics: list[Topic] = [topic_from_row(t) for t in store.list_topics(project, user_id)]
    return {
        "format": "memstrata.export/1",
        "project_id": project,
        "user_id": user_id,
        "exported_at": now_iso(),
        "sessions": [
            {
                "id": s.id,
                "title": s.title,
                "metadata": s.metadata,
                "created_at": s.created_at,
                "updated_at": s.updated_at,
            }
            for s in sessions
        ],
        "messages": [message_from_row(r).model_dump(mode="json") for r in messages],
        "facts": [f.model_dump(mode="json") for f in facts],
        "summaries": [
            {**s.model_dump(mode="json"), "history": store.summary_history(project, s.id)}
            for s in summaries
        ],
        "topics": [t.model_dump(mode="json") for t in topics],
        "audit": [
            _audit(a).model_dump(mode="json")
            for a in _pages(lambda n, o: store.list_audit(project, user_id, n, o))
        ],
    }


def processing_status(m: Memory, session_id: str) -> ProcessingStatus:
    states = m.store.session_status(m.project_id, session_id)
    out = ProcessingStatus(
        session_id=session_id,
        messages=[MessageState(id=i, status=s, error=e) for i, s, e in states],  # type: ignore[arg-type]
    )
    for _, status, _ in states:
        setattr(out, status, getattr(out, status) + 1)
    out.done = out.pending == 0
    return out


def audit_records(m: Memory, user_id: str | None, limit: int, offset: int) -> list[AuditRecord]:
    return [_audit(r) for r in m.store.list_audit(m.project_id, user_id, limit, offset)]


def check_reason(reason: Any, *, required: bool) -> str | None:
    return _text(reason, "reason", max_len=2000, required=required)
