"""``mem.topics``: the entry points that group a user's summaries."""

from __future__ import annotations

from ._checks import check_id
from .errors import NotFoundError
from .recall._rows import topic_from_row
from .store import LayerStore
from .types import Topic

__all__ = ["Topics"]


class Topics:
    """``mem.topics``: the entry points that group a user's summaries."""

    def __init__(self, store: LayerStore, project_id: str) -> None:
        self._store = store
        self._project_id = project_id

    def list(self, *, user_id: str) -> list[Topic]:
        check_id(user_id, "user_id")
        return [topic_from_row(t) for t in self._store.list_topics(self._project_id, user_id)]

    def get(self, topic_id: str) -> Topic:
        row = self._store.get_topic(self._project_id, check_id(topic_id, "topic_id"))
        if row is None:
            raise NotFoundError(f"no topic {topic_id!r}")
        return topic_from_row(row)

    def merge(self, source_id: str, into: str, *, user_id: str) -> int:
        """Move every summary of topic ``source_id`` under topic ``into`` and retire the
        source (kept with status ``merged`` and a link to ``into``). Returns summaries moved.
        """
        check_id(user_id, "user_id")
        try:
            return self._store.merge_topics(
                self._project_id,
                user_id,
                check_id(source_id, "source_id"),
                check_id(into, "into"),
            )
        except KeyError as exc:
            raise NotFoundError(
                f"no active topic {exc.args[0]!r} for user {user_id!r} (or the same topic twice)"
            ) from None
