"""PostgreSQL's spelling of the core's dialect: ``%s`` placeholders, ``text[]`` arrays,
``jsonb`` documents (metadata conditions through ``#>``), ``= ANY(array)``, ``FOR UPDATE``
row locks and a transaction-scoped advisory lock per user."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from functools import lru_cache
from typing import Any, cast

from .._core.dialect import Dialect
from .._filters import MetadataCondition

__all__ = ["PostgresDialect", "int_array", "user_lock_sql"]

# One transaction-scoped advisory lock per (schema, project, user): taken by everything that
# writes a user's messages or memory, so writes of one user are serialised (job ids are
# then allocated in commit order, which per-user processing order relies on) while
# different users never wait for each other.
user_lock_sql = "hashtextextended(current_schema() || chr(31) || %s || chr(31) || %s, 7)"


@lru_cache(maxsize=4096)
def _placeholders(sql: str) -> str:
    # The core's SQL holds no literal "?" (no jsonb ? operator) and, once bound, psycopg
    # reads "%" as the start of a placeholder: double it.
    return sql.replace("%", "%%").replace("?", "%s")


def int_array(values: Iterable[int]) -> str:
    """Integers (pks) as one array literal, to be cast to ``bigint[]``: psycopg types a
    list by scanning it and dumps each element (a 60-pk list ~19 µs a statement, the
    literal ~5; a search sends about ten)."""
    return "{" + ",".join(map(str, values)) + "}"


class PostgresDialect(Dialect):
    name = "postgresql"
    true = "TRUE"
    for_update = " FOR UPDATE"
    for_key_share = " FOR KEY SHARE"
    skip_locked = " FOR UPDATE SKIP LOCKED"
    clock = "extract(epoch FROM clock_timestamp())::double precision"
    row_value_seek = True

    def execute(self, raw: Any, sql: str, params: Sequence[Any] = ()) -> Any:
        # Without parameters psycopg leaves the text alone ("LIKE 'a%'" stays as written).
        if not params:
            return raw.execute(sql)
        return raw.execute(_placeholders(sql), params)

    def executemany(self, raw: Any, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        rows = list(rows)
        if rows:
            with raw.cursor() as cur:
                cur.executemany(_placeholders(sql), rows)

    def insert_keys(self, raw: Any, sql: str, rows: Sequence[Sequence[Any]], key: str) -> list[int]:
        sql = _placeholders(f"{sql} RETURNING {key}")
        if len(rows) == 1:
            return [int(raw.execute(sql, rows[0]).fetchone()[0])]
        out: list[int] = []
        # One pipelined round trip; each statement's RETURNING is one result set.
        with raw.cursor() as cur:
            cur.executemany(sql, rows, returning=True)
            while True:
                got = cur.fetchone()
                assert got is not None
                out.append(int(got[0]))
                if not cur.nextset():
                    break
        return out

    def array(self, values: Iterable[Any]) -> list[Any]:
        return list(values)

    def load_array(self, value: Any) -> list[Any]:
        return [] if value is None else list(value)

    def json(self, value: Any) -> Any:
        from psycopg.types.json import Jsonb

        return Jsonb(value)

    def load_json(self, value: Any) -> Any:
        return value  # psycopg decodes jsonb

    def in_(self, column: str, values: Sequence[Any]) -> tuple[str, list[Any]]:
        if values and all(type(v) is int for v in values):
            return f"{column} = ANY(?::bigint[])", [int_array(values)]
        return f"{column} = ANY(?)", [list(values)]

    def has(self, array_column: str, value_sql: str) -> str:
        return f"{value_sql} = ANY({array_column})"

    def overlaps(self, array_column: str, subquery: str) -> str:
        # && over text[] is what the GIN index on facts.message_ids serves.
        return f"{array_column} && ARRAY({subquery})"

    def summaries_holding(self, project_sql: str, fact_ids: str) -> str:
        # && over text[] is what the GIN index on summaries.fact_ids serves.
        return (
            f"SELECT pk FROM summaries WHERE project_id = {project_sql} "
            f"AND fact_ids && ARRAY({fact_ids})"
        )

    def array_of(self, select: str) -> str:
        return f"ARRAY({select})"

    def ordered_array_agg(self, expr: str, order: str) -> str | None:
        return f"array_agg({expr} ORDER BY {order})"

    def indexed_by(self, index: str | None) -> str:
        return ""

    def greatest(self, *exprs: str) -> str:
        return f"greatest({', '.join(exprs)})"

    def metadata_sql(self, cond: MetadataCondition, column: str) -> tuple[str, list[Any]]:
        # 5 and 5.0 are equal as jsonb's numeric has it; strings in byte order (COLLATE "C").
        path = list(cond.path)
        value = f"({column} #> ?::text[])"
        op, arg = cond.op, cond.value
        if op == "$exists":
            return f"{value} IS {'NOT ' if arg else ''}NULL", [path]
        if op in ("$eq", "$ne", "$in", "$nin"):
            values = [json.dumps(v) for v in (arg if op in ("$in", "$nin") else [arg])]
            sql = f"{value} = ANY(?::jsonb[])"
            if op in ("$ne", "$nin"):
                sql = f"NOT coalesce({sql}, false)"
            return sql, [path, values]
        sql_op = {"$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}[op]
        if isinstance(arg, str):
            return (
                f"(jsonb_typeof({value}) = 'string' AND "
                f'({column} #>> ?::text[]) COLLATE "C" {sql_op} ?)',
                [path, path, arg],
            )
        # The bound as numeric too (from its JSON text): against a float parameter PostgreSQL
        # would compare in double precision, rounding 2**63 + 1 and failing on 10**400. CASE,
        # because AND does not keep PostgreSQL from casting a stored string first (an error).
        return (
            f"(CASE WHEN jsonb_typeof({value}) = 'number' "
            f"THEN ({value})::numeric {sql_op} ?::numeric END)",
            [path, path, json.dumps(arg)],
        )

    def together(self, raw: Any) -> AbstractContextManager[Any]:
        return cast("AbstractContextManager[Any]", raw.pipeline())

    def lock_user(self, raw: Any, project_id: str, user_id: str) -> None:
        raw.execute(f"SELECT pg_advisory_xact_lock({user_lock_sql})", (project_id, user_id))

    def temp_keys(self, raw: Any, table: str) -> None:
        raw.execute(f"CREATE TEMP TABLE {table} (pk bigint PRIMARY KEY) ON COMMIT DROP")

    def lock(self, raw: Any, name: str) -> None:
        raw.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (name,))
