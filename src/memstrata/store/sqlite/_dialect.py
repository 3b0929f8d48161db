"""SQLite's spelling of the core's dialect: arrays and JSON as JSON text, lists of values
through ``json_each`` when they exceed what SQLite binds, no row or user locks (a write
transaction, ``BEGIN IMMEDIATE``, already excludes every other writer)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from .._core.dialect import Dialect

__all__ = ["SQLiteDialect"]

# Up to this many values are bound one by one (the planner sees a literal list); more go
# as one JSON array (SQLite binds at most 32,766 parameters, and a long list is slower).
_BOUND_VALUES = 500
# json.dumps builds an encoder per call when given options: one, made once, is ~a third
# faster (arrays are bound for every fact and summary a batch writes).
_encode = json.JSONEncoder(ensure_ascii=False).encode


class SQLiteDialect(Dialect):
    name = "sqlite"
    for_update = ""

    def execute(self, raw: Any, sql: str, params: Sequence[Any]) -> Any:
        return raw.execute(sql, params)

    def executemany(self, raw: Any, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        raw.executemany(sql, rows)

    def insert(self, raw: Any, sql: str, params: Sequence[Any]) -> int:
        # The rowid (every pk is an INTEGER PRIMARY KEY): cheaper than RETURNING here.
        return int(raw.execute(sql, params).lastrowid)

    def array(self, values: Iterable[Any]) -> str:
        return _encode(list(values))

    def load_array(self, value: Any) -> list[Any]:
        return json.loads(value) if value else []

    def json(self, value: Any) -> str:
        return _encode(value)

    def load_json(self, value: Any) -> Any:
        return None if value is None else json.loads(value)

    def in_(self, column: str, values: Sequence[Any]) -> tuple[str, list[Any]]:
        if len(values) <= _BOUND_VALUES:
            return f"{column} IN ({','.join('?' * len(values))})", list(values)
        return f"{column} IN (SELECT value FROM json_each(?))", [json.dumps(list(values))]

    def has(self, array_column: str, value_sql: str) -> str:
        return f"EXISTS (SELECT 1 FROM json_each({array_column}) WHERE value = {value_sql})"

    def greatest(self, *exprs: str) -> str:
        return f"max({', '.join(exprs)})"

    def lock_user(self, raw: Any, project_id: str, user_id: str) -> None:
        pass
