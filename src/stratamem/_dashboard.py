"""What the dashboard reads of a project: ``mem.users``, ``mem.provenance(id)`` and
``mem.activity()``. Embedded only, like ``stats()``: the dashboard runs beside the engine.
"""

from __future__ import annotations

import builtins
import math
import time
from datetime import datetime, timezone
from typing import Protocol

from ._checks import check_id, check_paging, int_problem
from ._convert import from_row
from ._strings import shown
from .errors import NotFoundError, ValidationError
from .recall._rows import fact_from_row, message_from_row, summary_from_row, topic_from_row
from .store import DashboardStore, FactRow, LayerStore, MessageRow, SummaryRow, UserRow
from .types import ActivityBucket, Fact, Message, Provenance, Summary, Topic, UserInfo

__all__ = ["MAX_BUCKETS", "Users", "UsersStore", "activity", "provenance"]

#: The most buckets one activity series may have (a chart's width, not a data export).
MAX_BUCKETS = 2000
_MAX_HOURS = 24 * 366
_MAX_SEARCH = 200  # an id is at most 200 characters


def _user(row: UserRow) -> UserInfo:
    return from_row(UserInfo, row)


def _search(search: str | None) -> str | None:
    if search is None:
        return None
    if not isinstance(search, str) or len(search) > _MAX_SEARCH:
        raise ValidationError(
            "invalid search", [f"search: expected a string of at most {_MAX_SEARCH} characters"]
        )
    return search or None


class UsersStore(DashboardStore, LayerStore, Protocol):
    """What ``mem.users`` reads: the project's users, and a user's standing items."""


class Users:
    """``mem.users``: the users of the project, for the dashboard (embedded only)."""

    def __init__(self, store: UsersStore, project_id: str) -> None:
        self._store = store
        self._project_id = project_id

    def count(self, *, search: str | None = None) -> int:
        """How many users have a session in the project (whose id holds ``search``, in
        any case)."""
        return self._store.count_users(self._project_id, search=_search(search))

    def list(
        self, *, search: str | None = None, limit: int = 50, offset: int = 0
    ) -> list[UserInfo]:
        """The project's users, most recently active first (then by id): those whose id
        holds ``search`` as a part, in any case (``%`` and ``_`` are plain characters)."""
        limit, offset = check_paging(limit, offset)
        rows = self._store.list_users(
            self._project_id, search=_search(search), limit=limit, offset=offset
        )
        return [_user(r) for r in rows]

    def standing(self, user_id: str) -> builtins.list[Fact]:
        """The user's current standing instructions and preferences, newest first: what
        recall may bring into a request's context unasked
        (docs/recall.md#standing-instructions)."""
        rows = self._store.standing_facts(self._project_id, check_id(user_id, "user_id"))
        return [fact_from_row(r.fact) for r in rows]


def provenance(store: DashboardStore, project_id: str, item_id: str) -> Provenance:
    """The message, fact, summary or topic ``item_id`` with what it is linked to both
    ways (``types.Provenance``); ``NotFoundError`` if the project has none (or only a
    deleted one)."""
    found = store.provenance(project_id, check_id(item_id, "item_id"))
    if found is None:
        raise NotFoundError(f"no message, fact, summary or topic {item_id!r}")
    item = found.item
    public: Message | Fact | Summary | Topic
    if isinstance(item, MessageRow):
        public = message_from_row(item)
    elif isinstance(item, FactRow):
        public = fact_from_row(item)
    elif isinstance(item, SummaryRow):
        public = summary_from_row(item)
    else:
        public = topic_from_row(item)
    return Provenance(
        kind=found.kind,
        item=public,
        messages=[message_from_row(r) for r in found.messages],
        facts=[fact_from_row(r) for r in found.facts],
        summaries=[summary_from_row(r) for r in found.summaries],
        topics=[topic_from_row(r) for r in found.topics],
    )


def activity(
    store: DashboardStore, project_id: str, *, hours: int, bucket_minutes: int
) -> list[ActivityBucket]:
    """The project's messages accepted, processed and failed for good per bucket of
    ``bucket_minutes`` over the last ``hours``, oldest first, every bucket present.

    Buckets start on multiples of ``bucket_minutes`` since the epoch (UTC), so a series
    asked twice lines up; the last one holds now."""
    problems = [
        f"{name}: {problem} (got {shown(value)})"
        for name, value, problem in (
            ("hours", hours, int_problem(hours, 1, _MAX_HOURS)),
            ("bucket_minutes", bucket_minutes, int_problem(bucket_minutes, 1, 24 * 60)),
        )
        if problem is not None
    ]
    if not problems and math.ceil(hours * 60 / bucket_minutes) > MAX_BUCKETS:
        problems.append(f"hours / bucket_minutes: more than {MAX_BUCKETS} buckets")
    if problems:
        raise ValidationError("invalid activity window", problems)
    width = bucket_minutes * 60
    count = math.ceil(hours * 60 / bucket_minutes)
    end = (int(time.time()) // width + 1) * width
    start = end - count * width
    counts = store.activity(project_id, float(start), float(end))
    totals = {name: [0] * count for name in ("added", "processed", "failed")}
    for name, series in (
        ("added", counts.added),
        ("processed", counts.processed),
        ("failed", counts.failed),
    ):
        for minute, n in series.items():
            at = datetime.fromisoformat(minute + ":00+00:00").timestamp()
            i = (int(at) - start) // width
            if 0 <= i < count:
                totals[name][i] += n
    return [
        ActivityBucket(
            start=datetime.fromtimestamp(start + i * width, timezone.utc),
            messages_added=totals["added"][i],
            messages_processed=totals["processed"][i],
            messages_failed=totals["failed"][i],
        )
        for i in range(count)
    ]
