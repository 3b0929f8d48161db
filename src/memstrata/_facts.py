"""``mem.facts``: the facts extracted from a project's messages."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from ._checks import check_id
from ._governance import item_filters
from ._queries import FactQuery, arguments
from .errors import NotFoundError
from .recall._rows import fact_from_row
from .store import LayerStore
from .types import Fact

__all__ = ["Facts"]


class Facts:
    """``mem.facts``: the facts extracted from a user's messages, with provenance."""

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
    ) -> list[Fact]:
        """Facts in extraction order. ``since``/``until`` bound when a fact happened (or
        was observed); ``metadata_filters`` match the metadata of its source messages."""
        q = FactQuery.build(arguments(locals()), what="facts.list")
        rows = self._store.list_facts(
            self._project_id, q.user_id, limit=q.limit, offset=q.offset, filters=item_filters(q)
        )
        return [fact_from_row(r) for r in rows]

    def get(self, fact_id: str) -> Fact:
        rows = self._store.get_facts(self._project_id, [check_id(fact_id, "fact_id")])
        if not rows:
            raise NotFoundError(f"no fact {fact_id!r}")
        return fact_from_row(rows[0])
