"""The small SQL dialect the store core is written against, and the transaction it runs in.

The core writes its SQL once, in the subset both backends speak (``RETURNING``,
``ON CONFLICT ... DO NOTHING / DO UPDATE``, ``coalesce``), with ``?`` placeholders. What
the two spell differently is a method here: placeholders, how a list or a JSON object is
bound and read back, "column is one of these values", "this array holds that value",
"this array shares a value with that subquery", a subquery's rows as an array, index
hints, ``greatest``, one metadata filter condition on a JSON document, the keys of rows
just inserted, row locks, the per-user lock and temporary tables of row keys. A backend
is one ``Dialect`` subclass (``store/sqlite/_dialect.py``, ``store/postgres/_dialect.py``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .._filters import MetadataCondition

__all__ = ["Dialect", "Tx"]


class Dialect(ABC):
    """How one backend spells what the core's SQL needs."""

    #: The backend's name, as ``Store.kind`` reports it.
    name: str
    #: Appended to a ``SELECT`` that reads rows the transaction will change (PostgreSQL's
    #: ``FOR UPDATE``; SQLite's write transaction already excludes other writers).
    for_update: str
    #: Appended to a ``SELECT`` of a row that must still exist when the transaction commits,
    #: shared with other readers (PostgreSQL's ``FOR KEY SHARE``: a concurrent delete of it
    #: waits; SQLite's write transaction already excludes one).
    for_key_share: str
    #: Appended to a ``SELECT ... LIMIT`` that takes rows off a queue: rows other
    #: transactions are taking are passed over (PostgreSQL's ``FOR UPDATE SKIP LOCKED``;
    #: in SQLite one writer at a time takes anything).
    skip_locked: str
    #: Whether a row-value comparison ``(a, b) < (x, y)`` is one seek of an index on
    #: ``(..., a, b)`` (PostgreSQL); SQLite walks every row with ``a = x`` instead.
    row_value_seek: bool = False
    #: A true boolean as a literal. A partial index's predicate (``WHERE standing``) is met
    #: by a literal only: against a parameter PostgreSQL planned a prepared statement for
    #: each call (its generic plan, unable to use the index, cost more), ~0.5 ms a search.
    true: str
    #: The store's clock, epoch seconds as a float: every process on one store reads the
    #: same one (SQLite: the machine's; PostgreSQL: the server's, whatever its clients').
    clock: str

    @abstractmethod
    def execute(self, raw: Any, sql: str, params: Sequence[Any] = ()) -> Any:
        """Run ``sql`` (``?`` placeholders) on the backend's connection; a cursor."""

    def executor(self, raw: Any) -> Callable[..., Any]:
        """``execute`` bound to one connection (what ``Tx.execute`` is)."""
        return partial(self.execute, raw)

    @abstractmethod
    def executemany(self, raw: Any, sql: str, rows: Iterable[Sequence[Any]]) -> None: ...

    @abstractmethod
    def insert_keys(self, raw: Any, sql: str, rows: Sequence[Sequence[Any]], key: str) -> list[int]:
        """Run ``sql``, an ``INSERT`` of one row, for each of ``rows``: the generated
        integer primary key ``key`` of each new row, in order."""

    def insert_key(self, raw: Any, sql: str, params: Sequence[Any], key: str) -> int:
        """``insert_keys`` of one row."""
        return self.insert_keys(raw, sql, [params], key)[0]

    def inserter(self, raw: Any) -> Callable[..., int]:
        """``insert_key`` bound to one connection (what ``Tx.insert`` is): ``(sql, params,
        key="pk")``."""

        def insert(sql: str, params: Sequence[Any], key: str = "pk") -> int:
            return self.insert_key(raw, sql, params, key)

        return insert

    @abstractmethod
    def array(self, values: Iterable[Any]) -> Any:
        """A list of strings bound to an array column (``message_ids``, ``labels``...)."""

    @abstractmethod
    def load_array(self, value: Any) -> list[Any]:
        """An array column as read back: a list."""

    @abstractmethod
    def json(self, value: Any) -> Any:
        """A JSON document bound to a JSON column (``metadata``, ``details``...)."""

    @abstractmethod
    def load_json(self, value: Any) -> Any:
        """A JSON column as read back: the Python value."""

    @abstractmethod
    def in_(self, column: str, values: Sequence[Any]) -> tuple[str, list[Any]]:
        """``column`` is one of ``values`` (any number of them): SQL and its parameters."""

    @abstractmethod
    def has(self, array_column: str, value_sql: str) -> str:
        """SQL true when the array ``array_column`` holds the value of ``value_sql``."""

    @abstractmethod
    def overlaps(self, array_column: str, subquery: str) -> str:
        """SQL true when the array ``array_column`` holds any value the one-column
        ``subquery`` returns (the subquery uncorrelated: it is evaluated once)."""

    @abstractmethod
    def summaries_holding(self, project_sql: str, fact_ids: str) -> str:
        """A one-column subquery: the pks of the project's summaries whose ``fact_ids`` hold
        any of the fact ids the one-column subquery ``fact_ids`` returns, found through an
        index (not by reading every summary of a long history)."""

    @abstractmethod
    def array_of(self, select: str) -> str:
        """SQL for the array of what the subquery ``select`` returns, in its order: one
        column named ``value`` (read back with ``load_array``)."""

    def ordered_array_agg(self, expr: str, order: str) -> str | None:
        """SQL aggregating ``expr`` over a group into an array in ``order`` (read back with
        ``load_array``); None where the backend cannot order an aggregate's input, which
        then takes ``array_of`` a correlated subquery per row."""
        return None

    @abstractmethod
    def indexed_by(self, index: str | None) -> str:
        """A hint to read the table just named through ``index``, or with None by its
        primary key alone (SQLite's ``INDEXED BY`` and ``NOT INDEXED``; empty where the
        backend has no hints)."""

    @abstractmethod
    def greatest(self, *exprs: str) -> str:
        """The largest of the SQL expressions (NULLs as each backend treats them: use
        ``coalesce`` where that matters)."""

    @abstractmethod
    def metadata_sql(self, cond: MetadataCondition, column: str) -> tuple[str, list[Any]]:
        """One condition of the filter vocabulary (``store/_filters.py``) on the JSON
        document ``column``: SQL and its parameters. Values compare as JSON: a number
        matches only a number, by exact decimal value (5 equals 5.0, 2**63 + 1 is above
        2**63), a string only a string (byte order for ranges), true only true, null only a
        present null; the negations ($ne, $nin) match a missing value too."""

    def together(self, raw: Any) -> AbstractContextManager[Any]:
        """A block whose statements go to the server together (PostgreSQL's pipeline: one
        round trip), their cursors read once it ends; elsewhere they run one by one."""
        return nullcontext()

    @abstractmethod
    def lock_user(self, raw: Any, project_id: str, user_id: str) -> None:
        """Serialise the writes of one user until the transaction ends."""

    def user_locker(self, raw: Any) -> Callable[[str, str], None]:
        """``lock_user`` bound to one connection (what ``Tx.lock_user`` is)."""
        return partial(self.lock_user, raw)

    @abstractmethod
    def temp_keys(self, raw: Any, table: str) -> None:
        """Make ``table`` an empty temporary table of row keys, one integer column ``pk``
        (the primary key), private to this connection. Its rows are not kept past the
        transaction: make it again at the start of each use."""

    @abstractmethod
    def lock(self, raw: Any, name: str) -> None:
        """Serialise the transactions that take the lock ``name`` until each ends (for
        writes to rows that may not exist yet, so cannot be locked themselves)."""


class Tx:
    """A connection of one backend as the core uses it: the dialect's SQL, plain results.

    Inside ``SQLStore._transaction()`` it is one transaction; from ``_query()`` each
    statement commits on its own. ``raw`` is the backend's own connection, for backend
    code only.
    """

    __slots__ = ("dialect", "execute", "insert", "lock_user", "raw")

    #: Run ``sql`` (``?`` placeholders) with ``params``: a cursor. The dialect's executor,
    #: bound once (on SQLite the connection's own ``execute``: a statement costs no hop).
    execute: Callable[..., Any]
    #: Serialise the writes of one user (``project_id, user_id``) until the transaction
    #: ends; bound once like ``execute`` (on SQLite a no-op: writers already queue).
    lock_user: Callable[[str, str], None]
    #: Insert one row (``sql`` without ``RETURNING``, then ``params``, then the name of its
    #: generated key, ``"pk"`` unless given): that key. Bound once like ``execute``.
    insert: Callable[..., int]

    def __init__(self, raw: Any, dialect: Dialect) -> None:
        self.raw = raw
        self.dialect = dialect
        self.execute = dialect.executor(raw)
        self.lock_user = dialect.user_locker(raw)
        self.insert = dialect.inserter(raw)

    # A Tx is also its own context manager, so that a backend whose reads need no
    # setup or cleanup (SQLite: one connection per thread, autocommit) hands out the same
    # one for every read without wrapping it.
    def __enter__(self) -> Tx:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def together(self) -> AbstractContextManager[Any]:
        """See ``Dialect.together``."""
        return self.dialect.together(self.raw)

    def many(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        self.dialect.executemany(self.raw, sql, rows)

    def insert_many(self, sql: str, rows: Sequence[Sequence[Any]], key: str = "pk") -> list[int]:
        """Insert each of ``rows``: their primary keys ``key``, in order."""
        return self.dialect.insert_keys(self.raw, sql, rows, key)

    def one(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """The first row, or None."""
        return self.execute(sql, params).fetchone()

    def all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return list(self.execute(sql, params).fetchall())

    def scalar(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """The first column of the first row, or None without a row."""
        row = self.execute(sql, params).fetchone()
        return None if row is None else row[0]

    def lock(self, name: str) -> None:
        self.dialect.lock(self.raw, name)
