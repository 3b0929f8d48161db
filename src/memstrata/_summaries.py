"""``mem.summaries``: a project's long-term memory with status, evidence and history."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from ._checks import check_id, check_paging
from ._governance import item_filters
from .errors import NotFoundError
from .recall._rows import summary_from_row
from .store import LayerStore
from .types import Summary

__all__ = ["Summaries"]


class Summaries:
    """``mem.summaries``: long-term memory, with status, evidence and version history."""

    STATUSES = ("active", "deprioritized", "archived", "deleted", "superseded")

    def __init__(self, store: LayerStore, project_id: str) -> None:
        self._store = store
        self._project_id = project_id

    def list(
        self,
        *,
        user_id: str | None = None,
        status: str | Sequence[str] | None = None,
        since: datetime | str | None = None,
        until: datetime | str | None = None,
        metadata_filters: dict[str, Any] | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[Summary]:
        """Summaries in creation order. ``since``/``until`` bound when a summary became
        valid (or was observed); ``metadata_filters`` match its source messages' metadata."""
        check_paging(limit, offset)
        if user_id is not None:
            check_id(user_id, "user_id")
        filters = item_filters(
            status=status,
            allowed=self.STATUSES,
            since=since,
            until=until,
            metadata_filters=metadata_filters,
        )
        rows = self._store.list_summaries(
            self._project_id,
            user_id,
            status=filters.status,
            limit=limit,
            offset=offset,
            filters=filters,
        )
        return [summary_from_row(r) for r in rows]

    def get(self, summary_id: str) -> Summary:
        rows = self._store.get_summaries(self._project_id, [check_id(summary_id, "summary_id")])
        if not rows:
            raise NotFoundError(f"no summary {summary_id!r}")
        return summary_from_row(rows[0])

    def history(self, summary_id: str) -> list[dict[str, Any]]:
        """Every version of a summary: text, status, confidence, evidence, reason, when."""
        self.get(summary_id)
        return self._store.summary_history(self._project_id, summary_id)
