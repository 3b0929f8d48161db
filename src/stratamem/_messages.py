"""``mem.messages``: the stored messages of a project."""

from __future__ import annotations

from ._checks import check_id
from ._queries import MessageQuery, arguments
from .errors import NotFoundError
from .recall._rows import message_from_row
from .store import SessionStore
from .types import Message

__all__ = ["Messages"]


class Messages:
    """``mem.messages``: stored messages with their processing status."""

    def __init__(self, store: SessionStore, project_id: str) -> None:
        self._store = store
        self._project_id = project_id

    def get(self, message_id: str) -> Message:
        row = self._store.get_message(self._project_id, check_id(message_id, "message_id"))
        if row is None:
            raise NotFoundError(f"no message {message_id!r}")
        return message_from_row(row)

    def list(
        self,
        *,
        user_id: str | None = None,
        session_id: str | None = None,
        status: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[Message]:
        q = MessageQuery.build(arguments(locals()), what="messages.list")
        rows = self._store.list_messages(
            self._project_id,
            user_id=q.user_id,
            session_id=q.session_id,
            status=q.status,
            limit=q.limit,
            offset=q.offset,
        )
        return [message_from_row(r) for r in rows]
