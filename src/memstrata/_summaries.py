"""``mem.summaries``: a project's long-term memory with status, evidence and history."""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from ._checks import check_id
from ._governance import item_filters
from ._queries import SummaryQuery, arguments
from .errors import NotFoundError
from .recall._rows import summary_from_row
from .store import LayerStore
from .types import Summary

__all__ = ["Summaries"]


class Summaries:
    """``mem.summaries``: long-term memory, with status, evidence and version history."""

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
        q = SummaryQuery.build(arguments(locals()), what="summaries.list")
        filters = item_filters(q)
        rows = self._store.list_summaries(
            self._project_id,
            q.user_id,
            status=filters.status,
            limit=q.limit,
            offset=q.offset,
            filters=filters,
        )
        return [summary_from_row(r) for r in rows]

    def get(self, summary_id: str) -> Summary:
        rows = self._store.get_summaries(self._project_id, [check_id(summary_id, "summary_id")])
        if not rows:
            raise NotFoundError(f"no summary {summary_id!r}")
        return summary_from_row(rows[0])

    def history(self, summary_id: str) -> builtins.list[dict[str, Any]]:
        """Every version of a summary: text, status, confidence, evidence, reason, when."""
        self.get(summary_id)
        return self._store.summary_history(self._project_id, summary_id)
