"""Search and listing filters as SQL, written once over the dialect.

What a filter means is ``store/_filters.py``; the structure of its SQL (session, roles,
event types, time window, source-message metadata) is here, and one metadata condition on
a JSON document, which the backends really spell differently, is the dialect's
``metadata_sql``. Both functions return `` AND ...`` conditions to append (``""`` when
there are none) and their parameters.
"""

from __future__ import annotations

from typing import Any

from ..._time import to_iso
from .. import ItemFilters, SearchFilters
from .dialect import Dialect

__all__ = ["item_filter_sql", "search_filter_sql"]


def search_filter_sql(
    d: Dialect, filters: SearchFilters, alias: str = "m"
) -> tuple[str, list[Any]]:
    """``filters`` as conditions on messages aliased ``alias``."""
    clauses: list[str] = []
    params: list[Any] = []
    if filters.session_id:
        clauses.append(f"{alias}.session_id = ?")
        params.append(filters.session_id)
    for column, values in (("role", filters.roles), ("event_type", filters.event_types)):
        if values:
            sql, args = d.in_(f"{alias}.{column}", values)
            clauses.append(sql)
            params += args
    if filters.since:
        clauses.append(f"{alias}.ts >= ?")
        params.append(to_iso(filters.since))
    if filters.until:
        clauses.append(f"{alias}.ts < ?")
        params.append(to_iso(filters.until))
    for cond in filters.metadata:
        sql, args = d.metadata_sql(cond, f"{alias}.metadata")
        clauses.append(sql)
        params += args
    return "".join(f" AND {c}" for c in clauses), params


def item_filter_sql(
    d: Dialect, filters: ItemFilters, alias: str, when: str
) -> tuple[str, list[Any]]:
    """The time window (on the SQL ``when``) and the source-message metadata conditions of
    a fact or summary listing (``alias`` the facts or summaries row): an item passes when
    one of its source messages passes them all."""
    sql, params = "", []
    if filters.since:
        sql += f" AND {when} >= ?"
        params.append(filters.since)
    if filters.until:
        sql += f" AND {when} < ?"
        params.append(filters.until)
    if filters.metadata:
        where, args = search_filter_sql(d, SearchFilters(metadata=filters.metadata))
        sql += (
            f" AND EXISTS (SELECT 1 FROM messages m WHERE m.project_id = {alias}.project_id "
            f"AND {d.has(f'{alias}.message_ids', 'm.id')}{where})"
        )
        params += args
    return sql, params
