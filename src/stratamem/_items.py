"""``mem.facts`` and ``mem.summaries``: a project's items of the two middle layers.

Both are listed the same way (a user's items in order, by status, time and the metadata of
their source messages) and read by id; summaries also have a version history.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Generic, TypeVar

from ._checks import check_id
from ._governance import item_filters
from ._queries import FactQuery, ItemQuery, SummaryQuery, arguments
from .errors import NotFoundError
from .recall._rows import fact_from_row, summary_from_row
from .store import FactRow, LayerStore, SummaryRow
from .types import Fact, Summary

__all__ = ["Facts", "Summaries"]

Item = TypeVar("Item", Fact, Summary)
Row = TypeVar("Row", FactRow, SummaryRow)


class _Items(Generic[Item, Row]):
    def __init__(
        self,
        store: LayerStore,
        project_id: str,
        *,
        what: str,
        query: type[ItemQuery],
        convert: Callable[[Row], Item],
    ) -> None:
        self._store = store
        self._project_id = project_id
        self._what = what
        self._query = query
        self._convert: Callable[[Row], Item] = convert

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
    ) -> list[Item]:
        """The user's items in the order they were made. ``since``/``until`` bound when an
        item happened or became valid (or was observed); ``metadata_filters`` match the
        metadata of its source messages."""
        q = self._query.build(arguments(locals()), what=f"{self._what}.list")
        return [self._convert(r) for r in self._rows(q)]

    def _rows(self, q: ItemQuery) -> Sequence[Row]:
        raise NotImplementedError

    def _get(
        self, item_id: str, name: str, rows: Callable[[str, builtins.list[str]], builtins.list[Row]]
    ) -> Item:
        found = rows(self._project_id, [check_id(item_id, name)])
        if not found:
            raise NotFoundError(f"no {name.removesuffix('_id')} {item_id!r}")
        return self._convert(found[0])


class Facts(_Items[Fact, FactRow]):
    """``mem.facts``: the facts extracted from a user's messages, with provenance."""

    def __init__(self, store: LayerStore, project_id: str) -> None:
        super().__init__(store, project_id, what="facts", query=FactQuery, convert=fact_from_row)

    def _rows(self, q: ItemQuery) -> Sequence[FactRow]:
        filters = item_filters(q)
        return self._store.list_facts(
            self._project_id, q.user_id, limit=q.limit, offset=q.offset, filters=filters
        )

    def get(self, fact_id: str) -> Fact:
        return self._get(fact_id, "fact_id", self._store.get_facts)


class Summaries(_Items[Summary, SummaryRow]):
    """``mem.summaries``: long-term memory, with status, evidence and version history."""

    def __init__(self, store: LayerStore, project_id: str) -> None:
        super().__init__(
            store, project_id, what="summaries", query=SummaryQuery, convert=summary_from_row
        )

    def _rows(self, q: ItemQuery) -> Sequence[SummaryRow]:
        filters = item_filters(q)
        return self._store.list_summaries(
            self._project_id,
            q.user_id,
            status=filters.status,
            limit=q.limit,
            offset=q.offset,
            filters=filters,
        )

    def get(self, summary_id: str) -> Summary:
        return self._get(summary_id, "summary_id", self._store.get_summaries)

    def history(self, summary_id: str) -> builtins.list[dict[str, Any]]:
        """Every version of a summary: text, status, confidence, evidence, reason, when."""
        self.get(summary_id)
        return self._store.summary_history(self._project_id, summary_id)
