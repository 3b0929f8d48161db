"""Status changes, forgetting, erasure, export and audit of a project's memory: the
operator's side of the facade (``Memory.set_status``, ``forget``, ...)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ._checks import check_id, check_paging, check_text, optional_text
from ._convert import from_row
from ._queries import ForgetScope, ItemQuery
from ._time import now_iso, to_iso
from .errors import NotFoundError, ValidationError
from .recall._rows import fact_from_row, message_from_row, summary_from_row, topic_from_row
from .store import AuditRow, ItemFilters, Store, parse_metadata_filters
from .types import AuditRecord, Fact, MessageState, ProcessingStatus, Summary, Topic

if TYPE_CHECKING:
    from ._items import Summaries
    from ._sessions import Sessions

__all__ = ["SETTABLE_STATUSES", "Governance", "item_filters"]

# Operators may move a summary between these; "superseded" is the pipeline's verdict.
SETTABLE_STATUSES = ("active", "deprioritized", "archived", "deleted")

T = TypeVar("T")


def _audit(row: AuditRow) -> AuditRecord:
    return from_row(AuditRecord, row, rename={"id": "pk"})


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


def check_reason(reason: Any, *, required: bool) -> str | None:
    return optional_text(reason, "reason", max_len=2000, required=required)


def _actor(actor: str | None) -> str:
    if actor is None:
        return "local"
    return check_text(actor, "actor")


class Governance:
    """The bodies of the facade's governance methods, in ``project_id``.

    ``check_open`` raises once the Memory is closed; ``sessions`` and ``summaries`` are
    the facade's faces (an unknown session or summary is their ``NotFoundError``)."""

    def __init__(
        self,
        store: Store,
        project_id: str,
        *,
        check_open: Callable[[], None],
        sessions: Sessions,
        summaries: Summaries,
    ) -> None:
        self._store = store
        self._project_id = project_id
        self._check_open = check_open
        self._sessions = sessions
        self._summaries = summaries

    def set_status(
        self, summary_id: str, status: str, *, reason: str, actor: str | None = None
    ) -> Summary:
        self._check_open()
        check_id(summary_id, "summary_id")
        if status not in SETTABLE_STATUSES:
            raise ValidationError(
                "invalid status", [f"status: expected one of {', '.join(SETTABLE_STATUSES)}"]
            )
        reason = check_reason(reason, required=True) or ""
        if not self._store.set_summary_status(
            self._project_id, summary_id, status, reason, _actor(actor)
        ):
            raise NotFoundError(f"no summary {summary_id!r}")
        return self._summaries.get(summary_id)

    def forget(
        self,
        *,
        user_id: str,
        message_ids: Sequence[str] | None = None,
        session_id: str | None = None,
        topic_id: str | None = None,
        reason: str | None = None,
        actor: str | None = None,
    ) -> dict[str, int]:
        self._check_open()
        scope = {
            "user_id": user_id,
            "message_ids": message_ids,
            "session_id": session_id,
            "topic_id": topic_id,
            "reason": reason,
        }
        q = ForgetScope.build(scope, what="forget")
        counts = self._store.forget(
            self._project_id,
            q.user_id,
            message_ids=q.message_ids or [],
            session_id=q.session_id,
            topic_id=q.topic_id,
            actor=_actor(actor),
            reason=q.reason,
        )
        if counts is None:
            what = (
                f"session {q.session_id!r}"
                if q.session_id is not None
                else f"topic {q.topic_id!r}"
                if q.topic_id is not None
                else "messages"
            )
            raise NotFoundError(f"no {what} of user {q.user_id!r}")
        return counts

    def erase_user(
        self, user_id: str, *, reason: str | None = None, actor: str | None = None
    ) -> dict[str, int]:
        self._check_open()
        check_id(user_id, "user_id")
        counts = self._store.erase_user(
            self._project_id,
            user_id,
            actor=_actor(actor),
            reason=check_reason(reason, required=False),
        )
        if not any(counts.values()):
            raise NotFoundError(f"no user {user_id!r}")
        return counts

    def export_user(self, user_id: str) -> dict[str, Any]:
        """Everything stratamem holds about a user, as JSON-ready data."""
        self._check_open()
        check_id(user_id, "user_id")
        store, project = self._store, self._project_id
        sessions = list(_pages(lambda n, o: store.list_sessions(project, user_id, n, o)))
        messages = _pages(
            lambda n, o: store.list_messages(project, user_id=user_id, limit=n, offset=o)
        )
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
            "format": "stratamem.export/1",
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

    def audit(
        self,
        *,
        user_id: str | None = None,
        limit: int = 100,
        offset: int = 0,
        newest_first: bool = False,
    ) -> list[AuditRecord]:
        self._check_open()
        check_paging(limit, offset)
        if user_id is not None:
            check_id(user_id, "user_id")
        rows = self._store.list_audit(
            self._project_id, user_id, limit, offset, newest_first=newest_first
        )
        return [_audit(r) for r in rows]

    def processing_status(self, session_id: str) -> ProcessingStatus:
        self._check_open()
        self._sessions.get(session_id)
        states = self._store.session_status(self._project_id, session_id)
        out = ProcessingStatus(
            session_id=session_id,
            messages=[MessageState(id=i, status=s, error=e) for i, s, e in states],  # type: ignore[arg-type]
        )
        for _, status, _ in states:
            setattr(out, status, getattr(out, status) + 1)
        out.done = out.pending == 0
        return out
