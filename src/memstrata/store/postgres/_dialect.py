"""PostgreSQL's spelling of the core's dialect: ``%s`` placeholders, ``text[]`` arrays,
``jsonb`` documents, ``= ANY(array)``, ``FOR UPDATE`` row locks and a transaction-scoped
advisory lock per user."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any

from .._core.dialect import Dialect

__all__ = ["PostgresDialect", "user_lock_sql"]

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


class PostgresDialect(Dialect):
    name = "postgresql"
    for_update = " FOR UPDATE"

    def execute(self, raw: Any, sql: str, params: Sequence[Any]) -> Any:
        # Without parameters psycopg leaves the text alone ("LIKE 'a%'" stays as written).
        if not params:
            return raw.execute(sql)
        return raw.execute(_placeholders(sql), params)

    def executemany(self, raw: Any, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        rows = list(rows)
        if rows:
            with raw.cursor() as cur:
                cur.executemany(_placeholders(sql), rows)

    def insert(self, raw: Any, sql: str, params: Sequence[Any]) -> int:
        return int(raw.execute(_placeholders(f"{sql} RETURNING pk"), params).fetchone()[0])

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
        return f"{column} = ANY(?)", [list(values)]

    def has(self, array_column: str, value_sql: str) -> str:
        return f"{value_sql} = ANY({array_column})"

    def greatest(self, *exprs: str) -> str:
        return f"greatest({', '.join(exprs)})"

    def lock_user(self, raw: Any, project_id: str, user_id: str) -> None:
        raw.execute(f"SELECT pg_advisory_xact_lock({user_lock_sql})", (project_id, user_id))
