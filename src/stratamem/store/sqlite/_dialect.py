"""SQLite's spelling of the core's dialect: arrays and JSON as JSON text, lists of values
through ``json_each`` when they exceed what SQLite binds, metadata conditions through
``json_type``/``json_extract`` (and ``stratamem_number_cmp`` for numbers beyond doubles),
no row or user locks (a write transaction, ``BEGIN IMMEDIATE``, already excludes every
other writer)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from decimal import Decimal
from typing import Any

from .._core.dialect import Dialect
from .._filters import MetadataCondition

__all__ = ["NUMBER_CMP", "SQLiteDialect", "number_cmp"]

# Up to this many values are bound one by one (the planner sees a literal list); more go
# as one JSON array (SQLite binds at most 32,766 parameters, and a long list is slower).
_BOUND_VALUES = 500
# json.dumps builds an encoder per call when given options: one, made once, is ~a third
# faster (arrays are bound for every fact and summary a batch writes).
_encode = json.JSONEncoder(ensure_ascii=False).encode

# json.loads' own decoder's scanner (the C one): one JSON value at an offset, and its end.
# typeshed does not declare scan_once, the attribute JSONDecoder.__init__ sets.
_scan: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]

# SQLite compares JSON numbers as 64-bit integers or doubles: exactly as their decimal
# value (the filter semantics, see _filters.py) only while a filter number stays below 2**53
# in magnitude (a stored integer beyond 2**63 becomes a rounded double, a float filter of
# 2.0**60 equals the integer 2**60 although their JSON differ). Larger filter numbers are
# compared by number_cmp, in Python, on the stored JSON text itself: the store registers
# it on each connection as NUMBER_CMP.
_NATIVE_LIMIT = 2**53
NUMBER_CMP = "stratamem_number_cmp"


def number_cmp(document: str | None, dotted: str, number: str) -> int | None:
    """-1, 0 or 1 as the JSON number at ``dotted`` in ``document`` is below, equal to or
    above the JSON number ``number``, compared by exact decimal value (as PostgreSQL's
    numeric does); NULL when the value is missing or not a number."""
    if document is None:
        return None
    value = json.loads(document, parse_int=Decimal, parse_float=Decimal)
    for key in dotted.split("."):
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    if not isinstance(value, Decimal):
        return None
    target = Decimal(number)
    return (value > target) - (value < target)


def _json_path(path: tuple[str, ...]) -> str:
    return "$" + "".join(f'."{p}"' for p in path)


def _native(value: int | float) -> bool:
    return abs(value) < _NATIVE_LIMIT


def _equals_sql(column: str, path: tuple[str, ...], values: Sequence[Any]) -> tuple[str, list[Any]]:
    """The value at ``path`` equals one of ``values``, compared as JSON: a number matches
    only a number, a string only a string, true only true, null only a present null (as in
    the PostgreSQL store; bare json_extract would make true equal 1 and "5" greater than 3)."""
    where = _json_path(path)
    kind = f"json_type({column}, ?)"
    value = f"json_extract({column}, ?)"
    parts: list[str] = []
    params: list[Any] = []
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    native = [v for v in numbers if _native(v)]
    strings = [v for v in values if isinstance(v, str)]
    for group, types in ((native, "('integer', 'real')"), (strings, "('text')")):
        if group:
            parts.append(f"({kind} IN {types} AND {value} IN ({','.join('?' * len(group))}))")
            params += [where, where, *group]
    for big in (v for v in numbers if not _native(v)):
        parts.append(f"({kind} IN ('integer', 'real') AND {NUMBER_CMP}({column}, ?, ?) = 0)")
        params += [where, ".".join(path), json.dumps(big)]
    literals = sorted(
        {
            "null" if v is None else str(v).lower()
            for v in values
            if v is None or isinstance(v, bool)
        }
    )
    if literals:
        parts.append(f"{kind} IN ({','.join('?' * len(literals))})")
        params += [where, *literals]
    return "(" + " OR ".join(parts) + ")", params


def _padded(values: Sequence[Any]) -> list[Any]:
    """``values`` for a bound IN list: more than one is as long as the next power of two
    (at most ``_BOUND_VALUES``), the last value repeated to fill it.

    Each width is one SQL text, so one statement in the connection's statement cache (128
    by default). With one text per length, a search's brief reads (a different number of
    candidates each time) missed the cache about three times a search and were parsed and
    planned again, ~0.2 ms for the messages' read, as long as running it. A repeated value
    changes neither IN nor NOT IN; the planner reckons with up to twice the lookups, and a
    single value stays an equality (eight of the same made it choose worse)."""
    n = len(values)
    if n <= 1:
        return list(values)
    width = min(1 << (n - 1).bit_length(), max(n, _BOUND_VALUES))
    return [*values, *([values[-1]] * (width - n))]


class SQLiteDialect(Dialect):
    name = "sqlite"
    true = "1"
    for_update = ""
    for_key_share = ""
    skip_locked = ""
    clock = "((julianday('now') - 2440587.5) * 86400.0)"

    def execute(self, raw: Any, sql: str, params: Sequence[Any] = ()) -> Any:
        return raw.execute(sql, params)

    def executor(self, raw: Any) -> Callable[..., Any]:
        execute: Callable[..., Any] = raw.execute  # SQLite's own placeholders: no rewriting
        return execute

    def executemany(self, raw: Any, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        raw.executemany(sql, rows)

    def insert_keys(self, raw: Any, sql: str, rows: Sequence[Sequence[Any]], key: str) -> list[int]:
        # ``key`` is an INTEGER PRIMARY KEY, the rowid: lastrowid is it, and costs less
        # than RETURNING (sqlite3's executemany gives neither).
        return [raw.execute(sql, row).lastrowid for row in rows]

    def insert_key(self, raw: Any, sql: str, params: Sequence[Any], key: str) -> int:
        # sqlite3 sets lastrowid (an int) on every execute() of an INSERT.
        rowid: int = raw.execute(sql, params).lastrowid
        return rowid

    def inserter(self, raw: Any) -> Callable[..., int]:
        execute = raw.execute

        def insert(sql: str, params: Sequence[Any], key: str = "pk") -> int:
            rowid: int = execute(sql, params).lastrowid
            return rowid

        return insert

    def array(self, values: Iterable[Any]) -> str:
        return _encode(list(values))

    def load_array(self, value: Any) -> list[Any]:
        if not value:
            return []
        # Most arrays read are compact JSON as written here: json's own C scanner decodes
        # them without json.loads' Python layers (a search reads some 160 of them). Only a
        # value it reads whole is taken; anything else goes through json.loads as before.
        try:
            found, end = _scan(value, 0)
        except (StopIteration, TypeError):  # not JSON from its first character, or bytes
            found, end = None, -1
        array: list[Any] = found if end == len(value) else json.loads(value)
        return array

    def json(self, value: Any) -> str:
        return _encode(value)

    def load_json(self, value: Any) -> Any:
        return None if value is None else json.loads(value)

    def in_(self, column: str, values: Sequence[Any]) -> tuple[str, list[Any]]:
        if len(values) <= _BOUND_VALUES:
            bound = _padded(values)
            return f"{column} IN ({','.join('?' * len(bound))})", bound
        return f"{column} IN (SELECT value FROM json_each(?))", [json.dumps(list(values))]

    def has(self, array_column: str, value_sql: str) -> str:
        # IN rather than EXISTS (... WHERE value = ...): when value_sql is an indexed column
        # (m.id of "the messages an item came from") the planner then probes its index
        # once per element instead of scanning the table.
        return f"{value_sql} IN (SELECT value FROM json_each({array_column}))"

    def overlaps(self, array_column: str, subquery: str) -> str:
        return (
            f"EXISTS (SELECT 1 FROM json_each({array_column}) AS overlap "
            f"WHERE overlap.value IN ({subquery}))"
        )

    def summaries_holding(self, project_sql: str, fact_ids: str) -> str:
        # summary_facts: the reverse of summaries.fact_ids, kept by triggers (migration 18).
        return (
            f"SELECT summary_pk FROM summary_facts WHERE project_id = {project_sql} "
            f"AND fact_id IN ({fact_ids})"
        )

    def array_of(self, select: str) -> str:
        return f"(SELECT json_group_array(value) FROM ({select}))"

    def indexed_by(self, index: str | None) -> str:
        return " NOT INDEXED" if index is None else f" INDEXED BY {index}"

    def greatest(self, *exprs: str) -> str:
        return f"max({', '.join(exprs)})"

    def metadata_sql(self, cond: MetadataCondition, column: str) -> tuple[str, list[Any]]:
        path = _json_path(cond.path)
        op, arg = cond.op, cond.value
        if op == "$exists":
            return f"json_type({column}, ?) IS {'NOT ' if arg else ''}NULL", [path]
        if op in ("$eq", "$ne", "$in", "$nin"):
            sql, params = _equals_sql(column, cond.path, arg if op in ("$in", "$nin") else [arg])
            # Negations match a missing value too.
            return (f"NOT IFNULL({sql}, 0)" if op in ("$ne", "$nin") else sql), params
        sql_op = {"$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}[op]
        if isinstance(arg, str):
            return (
                f"(json_type({column}, ?) = 'text' AND json_extract({column}, ?) {sql_op} ?)",
                [path, path, arg],
            )
        if _native(arg):
            return (
                f"(json_type({column}, ?) IN ('integer', 'real') AND "
                f"json_extract({column}, ?) {sql_op} ?)",
                [path, path, arg],
            )
        return (
            f"(json_type({column}, ?) IN ('integer', 'real') AND "
            f"{NUMBER_CMP}({column}, ?, ?) {sql_op} 0)",
            [path, ".".join(cond.path), json.dumps(arg)],
        )

    def lock_user(self, raw: Any, project_id: str, user_id: str) -> None:
        pass

    def user_locker(self, raw: Any) -> Callable[[str, str], None]:
        return _no_lock

    def temp_keys(self, raw: Any, table: str) -> None:
        # Kept by the connection (in memory: temp_store) and emptied for each use.
        raw.execute(f"CREATE TEMP TABLE IF NOT EXISTS {table} (pk INTEGER PRIMARY KEY)")
        raw.execute(f"DELETE FROM temp.{table}")

    def lock(self, raw: Any, name: str) -> None:
        pass


def _no_lock(project_id: str, user_id: str) -> None:
    """SQLite's user lock: its write transaction already excludes every other writer."""
