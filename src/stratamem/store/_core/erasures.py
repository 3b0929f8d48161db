"""Tombstones of forgotten and erased users, so that no process writes back what it held of
a user from before a forget or an erasure.

A process buffers some of a user's text before it writes it: the recall log's records
(``recall_log.py``) and capture's exchanges wait in memory for a background writer. A
forget or an erasure in another process cannot reach those buffers. Instead it leaves a
tombstone: when the user's memory was last forgotten (``forgotten_at``: forget and erasure)
and erased (``erased_at``), in the store's clock. A writer checks the tombstone in the
transaction that would insert, under the user's lock, and drops what *began* before it: a
recall that started before the erasure may have read the erased memory, however late it is
written. What began after it (a user who comes back) is written.

The tombstone is set by ``seal``, in a transaction of its own *after* the removal has
committed: a recall running during the removal still read the old rows (the removal was not
committed yet), so only the commit's time bounds what it could have seen. In the seal's
transaction the user's recall log rows are deleted once more: those a writer inserted
between the commit and the seal (checked against the older tombstone) go with them.

Clocks: a record's times are the writing process's wall clock; the tombstone is the
store's. ``clock_offset`` measures the difference inside the writer's transaction, so
writers on other machines than the database's compare in one clock (to within the
query's round trip, erring towards dropping).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Literal

from .dialect import Tx

__all__ = ["began_before", "clock_offset", "seal", "tombstones"]

Mark = Literal["forgotten_at", "erased_at"]


def seal(tx: Tx, project_id: str, user_id: str, *, erased: bool) -> None:
    """Record, under the user's lock, that ``user_id``'s memory was forgotten (and
    ``erased``) now; the caller then deletes what was written since the removal."""
    tx.lock_user(project_id, user_id)
    now = tx.dialect.clock
    erased_at = now if erased else "erasures.erased_at"
    tx.execute(
        "INSERT INTO erasures (project_id, user_id, forgotten_at, erased_at) "
        f"VALUES (?, ?, {now}, {now if erased else 'NULL'}) "
        "ON CONFLICT (project_id, user_id) DO UPDATE SET "
        f"forgotten_at = {now}, erased_at = {erased_at}",
        (project_id, user_id),
    )


def clock_offset(tx: Tx) -> float:
    """The store's clock minus this process's (``time.time()``). This process's time is
    read after the store's, so the offset errs low: a time converted with it comes out
    early, and a record that began just after a tombstone may be dropped, never one that
    began just before it kept."""
    store_now = float(tx.scalar(f"SELECT {tx.dialect.clock}"))
    return store_now - time.time()


def tombstones(
    tx: Tx, users: Iterable[tuple[str, str]], mark: Mark
) -> dict[tuple[str, str], float]:
    """``mark`` of each of ``users`` ((project, user) pairs) that has one, taking each
    user's lock first (in a fixed order: no two writers wait on each other)."""
    by_project: dict[str, list[str]] = {}
    for project_id, user_id in sorted(set(users)):
        tx.lock_user(project_id, user_id)
        by_project.setdefault(project_id, []).append(user_id)
    found: dict[tuple[str, str], float] = {}
    for project_id, user_ids in by_project.items():
        in_users, params = tx.dialect.in_("user_id", user_ids)
        for user_id, at in tx.all(
            f"SELECT user_id, {mark} FROM erasures WHERE project_id = ? AND {in_users} "
            f"AND {mark} IS NOT NULL",
            (project_id, *params),
        ):
            found[(project_id, user_id)] = float(at)
    return found


def began_before(began: float, offset: float, tombstone: float | None) -> bool:
    """Whether something that began at ``began`` (this process's clock) began before the
    ``tombstone`` (the store's clock; None: there is none)."""
    return tombstone is not None and began + offset <= tombstone
