"""``mem.sessions``: conversation threads of a project."""

from __future__ import annotations

from typing import Any

from ._checks import check_id, check_metadata, check_storable, new_id
from ._queries import ListQuery, arguments
from ._time import now_iso
from .errors import ConflictError, NotFoundError, ValidationError
from .recall import parse_ts
from .store import SessionRow, SessionStore
from .types import Session

__all__ = ["Sessions"]


class Sessions:
    """``mem.sessions``: create and look up conversation threads.

    Sessions come back bound to ``owner`` (the facade), through which their
    ``add_messages`` / ``get_memory`` act."""

    def __init__(
        self, store: SessionStore, project_id: str, *, owner: Any, max_metadata_bytes: int
    ) -> None:
        self._store = store
        self._project_id = project_id
        self._owner = owner
        self._max_metadata_bytes = max_metadata_bytes

    def _bind(self, row: SessionRow) -> Session:
        session = Session(
            id=row.id,
            project_id=row.project_id,
            user_id=row.user_id,
            title=row.title,
            metadata=row.metadata,
            created_at=parse_ts(row.created_at),  # type: ignore[arg-type]
            updated_at=parse_ts(row.updated_at),  # type: ignore[arg-type]
        )
        session._memory = self._owner
        return session

    def create(
        self,
        user_id: str,
        *,
        title: str | None = None,
        metadata: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        """Create a session (or return it if ``session_id`` exists for the same user)."""
        check_id(user_id, "user_id")
        sid = new_id("s") if session_id is None else check_id(session_id, "session_id")
        if title is not None:
            if not isinstance(title, str) or len(title) > 500:
                problem = "title: expected a string of at most 500"
                raise ValidationError("invalid session", [problem])
            check_storable(title, "title")
        meta = check_metadata(metadata, "metadata", max_bytes=self._max_metadata_bytes)
        now = now_iso()
        row, created = self._store.create_session(
            SessionRow(self._project_id, sid, user_id, title, meta, now, now)
        )
        if not created and row.user_id != user_id:
            raise ConflictError(
                f"session {sid!r} already exists for another user; session ids are unique "
                "within a project"
            )
        return self._bind(row)

    def get(self, session_id: str) -> Session:
        row = self._store.get_session(self._project_id, check_id(session_id, "session_id"))
        if row is None:
            raise NotFoundError(f"no session {session_id!r}")
        return self._bind(row)

    def list(
        self, *, user_id: str | None = None, limit: int = 100, offset: int = 0
    ) -> list[Session]:
        q = ListQuery.build(arguments(locals()), what="sessions.list")
        rows = self._store.list_sessions(self._project_id, q.user_id, q.limit, q.offset)
        return [self._bind(r) for r in rows]
