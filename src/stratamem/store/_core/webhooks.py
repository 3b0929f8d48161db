"""Webhooks: hook records, the delivery log and the async outbox, over the core's dialect.

Every change to a hook bumps one counter in ``meta`` in the same transaction, so the
pipeline can keep the hooks of a project cached and check a single row per batch to know
the cache is current, in this process or after another process (the server) changed them.
Async deliveries are queued in the transaction that completes their batch
(``enqueue_webhooks``) and claimed by senders under a lease; in PostgreSQL a claim passes
over rows another sender is taking (``skip_locked``), so senders in many processes never
take the same delivery, and SQLite's write transaction excludes every other claimer.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from ..._time import now_iso
from .._webhook_rows import OutboxItem, OutboxWrite, WebhookDeliveryRow, WebhookRow
from .dialect import Dialect, Tx

__all__ = [
    "DELIVERY_COLUMNS",
    "HOOK_COLUMNS",
    "PRUNE_EVERY",
    "UPDATABLE",
    "VERSION_KEY",
    "add_delivery",
    "any_due",
    "bump_version",
    "check_changes",
    "claim_delivery",
    "create_hook",
    "delete_hook",
    "delivery_row",
    "enqueue_webhooks",
    "finish_delivery",
    "forget_webhook_traces",
    "get_hook",
    "hook_row",
    "insert_delivery",
    "list_deliveries",
    "list_hooks",
    "next_time",
    "outbox_counts",
    "update_hook",
    "version",
]

# The columns are the rows' fields, in their order: the converters below cannot drift
# from the lists the queries select.
_HOOK_FIELDS = tuple(f.name for f in fields(WebhookRow))
_DELIVERY_FIELDS = tuple(f.name for f in fields(WebhookDeliveryRow))
HOOK_COLUMNS = ", ".join(_HOOK_FIELDS)
# A delivery's own columns (d) but for its hook's id, read from the joined hook (w).
DELIVERY_COLUMNS = ", ".join("w.id" if f == "hook_id" else f"d.{f}" for f in _DELIVERY_FIELDS)
_OUTBOX_COLUMNS = (
    "o.pk, o.delivery_id, o.project_id, o.user_id, o.message_ids, o.payload, o.attempts, o.hook_pk"
)
# Columns an update may change; anything else in a change set is a programming error.
UPDATABLE = frozenset(
    {
        "name",
        "resource",
        "event",
        "mode",
        "target_url",
        "secret",
        "enabled",
        "timeout_ms",
        "previous_secret",
        "previous_secret_until",
    }
)
VERSION_KEY = "webhooks_version"
# The delivery log keeps this many attempts per hook; older ones are pruned now and then.
PRUNE_EVERY = 64
# "No limit" as both databases take it (SQLite's LIMIT -1 is an error in PostgreSQL, and
# PostgreSQL's LIMIT NULL one in SQLite).
_NO_LIMIT = 2**63 - 1
_OUTCOMES = ("done", "retry", "failed")


def hook_row(r: Sequence[Any]) -> WebhookRow:
    """A ``WebhookRow`` from ``HOOK_COLUMNS``."""
    values = dict(zip(_HOOK_FIELDS, r, strict=True))
    values["enabled"] = bool(values["enabled"])
    return WebhookRow(**values)


def delivery_row(r: Sequence[Any], d: Dialect) -> WebhookDeliveryRow:
    """A ``WebhookDeliveryRow`` from ``DELIVERY_COLUMNS``."""
    values = dict(zip(_DELIVERY_FIELDS, r, strict=True))
    values["message_ids"] = d.load_array(values["message_ids"])
    return WebhookDeliveryRow(**values)


# -- hooks ---------------------------------------------------------------------------------


def bump_version(tx: Tx) -> None:
    tx.execute(
        "INSERT INTO meta (key, value) VALUES (?, '1') ON CONFLICT (key) "
        "DO UPDATE SET value = CAST(CAST(meta.value AS BIGINT) + 1 AS TEXT)",
        (VERSION_KEY,),
    )


def version(tx: Tx) -> int:
    value = tx.scalar("SELECT value FROM meta WHERE key = ?", (VERSION_KEY,))
    return 0 if value is None else int(value)


def create_hook(tx: Tx, row: WebhookRow) -> WebhookRow:
    stored = tx.one(
        "INSERT INTO webhooks (id, project_id, name, resource, event, mode, target_url, "
        "secret, enabled, timeout_ms, created_at, updated_at) "
        f"VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING {HOOK_COLUMNS}",
        (
            row.id,
            row.project_id,
            row.name,
            row.resource,
            row.event,
            row.mode,
            row.target_url,
            row.secret,
            bool(row.enabled),
            row.timeout_ms,
            row.created_at,
            row.updated_at,
        ),
    )
    bump_version(tx)
    return hook_row(stored)


def get_hook(tx: Tx, project_id: str, hook_id: str) -> WebhookRow | None:
    row = tx.one(
        f"SELECT {HOOK_COLUMNS} FROM webhooks WHERE project_id = ? AND id = ?",
        (project_id, hook_id),
    )
    return None if row is None else hook_row(row)


def list_hooks(
    tx: Tx, project_id: str, enabled_only: bool, limit: int, offset: int
) -> list[WebhookRow]:
    """A project's hooks in creation order (the order hooks on one point run in); a
    negative ``limit`` is none."""
    sql = f"SELECT {HOOK_COLUMNS} FROM webhooks WHERE project_id = ?"
    if enabled_only:
        sql += " AND enabled"
    rows = tx.all(
        sql + " ORDER BY pk LIMIT ? OFFSET ?",
        (project_id, _NO_LIMIT if limit < 0 else limit, offset),
    )
    return [hook_row(r) for r in rows]


def check_changes(changes: dict[str, Any]) -> None:
    """Refuse a change set naming a column an update may not change."""
    unknown = set(changes) - UPDATABLE
    if unknown:
        raise ValueError(f"not updatable: {sorted(unknown)}")


def update_hook(
    tx: Tx, project_id: str, hook_id: str, changes: dict[str, Any]
) -> WebhookRow | None:
    check_changes(changes)
    values = {k: bool(v) if k == "enabled" else v for k, v in changes.items()}
    sets = "".join(f"{k} = ?, " for k in values)
    row = tx.one(
        f"UPDATE webhooks SET {sets}updated_at = ? WHERE project_id = ? AND id = ? "
        f"RETURNING {HOOK_COLUMNS}",
        (*values.values(), now_iso(), project_id, hook_id),
    )
    if row is None:
        return None
    bump_version(tx)
    return hook_row(row)


def delete_hook(tx: Tx, project_id: str, hook_id: str) -> bool:
    """Delete a hook with its delivery log and queued deliveries."""
    pk = tx.scalar(
        f"SELECT pk FROM webhooks WHERE project_id = ? AND id = ?{tx.dialect.for_update}",
        (project_id, hook_id),
    )
    if pk is None:
        return False
    # Explicit, not only ON DELETE CASCADE: a SQLite connection opened with foreign keys
    # off (an old tool, the sqlite3 shell) must not leave orphans behind.
    tx.execute("DELETE FROM webhook_outbox WHERE hook_pk = ?", (pk,))
    tx.execute("DELETE FROM webhook_deliveries WHERE hook_pk = ?", (pk,))
    tx.execute("DELETE FROM webhooks WHERE pk = ?", (pk,))
    bump_version(tx)
    return True


# -- delivery log --------------------------------------------------------------------------


def insert_delivery(tx: Tx, d: WebhookDeliveryRow, keep: int) -> None:
    """Log one attempt; every ``PRUNE_EVERY``-th row prunes the hook's log to ``keep``."""
    pk = tx.scalar(
        "INSERT INTO webhook_deliveries (id, hook_pk, project_id, user_id, message_ids, "
        "resource, event, mode, attempt, status, http_status, latency_ms, reason, request, "
        "response, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING pk",
        (
            d.id,
            d.hook_pk,
            d.project_id,
            d.user_id,
            tx.dialect.array(d.message_ids),
            d.resource,
            d.event,
            d.mode,
            d.attempt,
            d.status,
            d.http_status,
            round(d.latency_ms, 3),
            d.reason,
            d.request,
            d.response,
            d.at,
        ),
    )
    if pk is not None and pk % PRUNE_EVERY == 0:
        tx.execute(
            "DELETE FROM webhook_deliveries WHERE hook_pk = ? AND pk <= (SELECT pk FROM "
            "webhook_deliveries WHERE hook_pk = ? ORDER BY pk DESC LIMIT 1 OFFSET ?)",
            (d.hook_pk, d.hook_pk, keep),
        )


def add_delivery(tx: Tx, d: WebhookDeliveryRow, keep: int) -> None:
    """Log one attempt, unless its hook was deleted while the delivery was in flight."""
    # Key-share locked (PostgreSQL): a concurrent delete of the hook waits for this insert
    # (or this one sees the hook gone), so the foreign key never fails halfway.
    exists = tx.one(f"SELECT 1 FROM webhooks WHERE pk = ?{tx.dialect.for_key_share}", (d.hook_pk,))
    if exists is not None:
        insert_delivery(tx, d, keep)


def list_deliveries(
    tx: Tx, project_id: str, hook_id: str, limit: int, offset: int
) -> list[WebhookDeliveryRow]:
    """A hook's delivery attempts, newest first."""
    rows = tx.all(
        f"SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries d "
        "JOIN webhooks w ON w.pk = d.hook_pk WHERE w.project_id = ? AND w.id = ? "
        "ORDER BY d.pk DESC LIMIT ? OFFSET ?",
        (project_id, hook_id, limit, offset),
    )
    return [delivery_row(r, tx.dialect) for r in rows]


# -- async outbox --------------------------------------------------------------------------


def enqueue_webhooks(tx: Tx, items: Sequence[OutboxWrite]) -> None:
    """Queue async deliveries inside the caller's transaction (the batch's completion);
    one for a hook deleted meanwhile is dropped."""
    if not items:
        return
    now, created = time.time(), now_iso()
    tx.many(
        "INSERT INTO webhook_outbox (delivery_id, hook_pk, project_id, user_id, message_ids, "
        "payload, run_after, created_at) SELECT ?, ?, ?, ?, ?, ?, ?, ? WHERE EXISTS "
        f"(SELECT 1 FROM webhooks WHERE pk = ?{tx.dialect.for_key_share})",
        [
            (
                i.delivery_id,
                i.hook_pk,
                i.project_id,
                i.user_id,
                tx.dialect.array(i.message_ids),
                i.body,
                now,
                created,
                i.hook_pk,
            )
            for i in items
        ],
    )


def _due(tx: Tx, now: float, skip_projects: Sequence[str]) -> tuple[str, list[Any]]:
    """Deliveries due at ``now``: queued and past their time, or running past their lease;
    of any project but ``skip_projects``."""
    sql = (
        "((o.status = 'queued' AND o.run_after <= ?) "
        "OR (o.status = 'running' AND o.lease_until < ?))"
    )
    params: list[Any] = [now, now]
    if skip_projects:
        skip, values = tx.dialect.in_("o.project_id", list(skip_projects))
        sql, params = f"{sql} AND NOT ({skip})", params + values
    return sql, params


def any_due(tx: Tx, now: float, skip_projects: Sequence[str]) -> bool:
    """Whether a delivery is due: what idle senders poll, without a write transaction."""
    due, params = _due(tx, now, skip_projects)
    return tx.one(f"SELECT 1 FROM webhook_outbox o WHERE {due} LIMIT 1", params) is not None


def claim_delivery(
    tx: Tx, owner: str, lease_seconds: float, skip_projects: Sequence[str], now: float
) -> OutboxItem | None:
    """Take the next due delivery under a lease, oldest due first (``None`` if none is)."""
    due, params = _due(tx, now, skip_projects)
    row = tx.one(
        f"SELECT {_OUTBOX_COLUMNS} FROM webhook_outbox o WHERE {due} "
        f"ORDER BY o.run_after, o.pk LIMIT 1{tx.dialect.skip_locked}",
        params,
    )
    if row is None:
        return None
    tx.execute(
        "UPDATE webhook_outbox SET status = 'running', lease_owner = ?, lease_until = ?, "
        "attempts = attempts + 1 WHERE pk = ?",
        (owner, now + lease_seconds, row[0]),
    )
    hook = tx.one(f"SELECT {HOOK_COLUMNS} FROM webhooks WHERE pk = ?", (row[7],))
    assert hook is not None  # the outbox row goes with its hook (delete_hook)
    return OutboxItem(
        pk=row[0],
        delivery_id=row[1],
        project_id=row[2],
        user_id=row[3],
        message_ids=tx.dialect.load_array(row[4]),
        body=row[5],
        attempts=row[6] + 1,
        lease_owner=owner,
        hook=hook_row(hook),
    )


def finish_delivery(
    tx: Tx,
    item: OutboxItem,
    outcome: str,
    retry_at: float | None,
    error: str | None,
    log: WebhookDeliveryRow | None,
    keep: int,
) -> bool:
    """Settle a claimed delivery: ``done`` (removed), ``retry`` at ``retry_at``, or
    ``failed`` for good; logs the attempt. False if the lease was lost meanwhile."""
    if outcome not in _OUTCOMES:
        raise ValueError(f"unknown outcome {outcome!r}")
    held = tx.one(
        "SELECT 1 FROM webhook_outbox WHERE pk = ? AND status = 'running' "
        f"AND lease_owner = ?{tx.dialect.for_update}",
        (item.pk, item.lease_owner),
    )
    if held is None:
        return False
    if outcome == "done":
        tx.execute("DELETE FROM webhook_outbox WHERE pk = ?", (item.pk,))
    elif outcome == "retry":
        tx.execute(
            "UPDATE webhook_outbox SET status = 'queued', run_after = ?, lease_owner = NULL, "
            "lease_until = NULL, last_error = ? WHERE pk = ?",
            (retry_at, error, item.pk),
        )
    else:
        tx.execute(
            "UPDATE webhook_outbox SET status = 'failed', lease_owner = NULL, "
            "lease_until = NULL, last_error = ? WHERE pk = ?",
            (error, item.pk),
        )
    if log is not None:
        insert_delivery(tx, log, keep)
    return True


def next_time(tx: Tx) -> float | None:
    """When the next queued delivery is due or a running one's lease runs out."""
    value = tx.scalar(
        "SELECT min(CASE status WHEN 'queued' THEN run_after ELSE lease_until END) "
        "FROM webhook_outbox WHERE status IN ('queued', 'running')"
    )
    return None if value is None else float(value)


def outbox_counts(tx: Tx, project_id: str | None) -> dict[str, int]:
    """Async deliveries by state: ``queued``, ``running``, ``failed`` (for good)."""
    sql = "SELECT status, count(*) FROM webhook_outbox"
    params: tuple[str, ...] = ()
    if project_id is not None:
        sql, params = sql + " WHERE project_id = ?", (project_id,)
    counts = {"queued": 0, "running": 0, "failed": 0}
    counts.update({s: int(n) for s, n in tx.all(sql + " GROUP BY status", params)})
    return counts


# -- deletion ------------------------------------------------------------------------------


def forget_webhook_traces(tx: Tx, project_id: str, user_id: str) -> None:
    """Drop logged and queued deliveries that carried any message in the temporary table
    ``gone_messages``: their request excerpts and payloads hold its content."""
    gone = "SELECT m.id FROM messages m JOIN gone_messages g ON g.pk = m.pk"
    for table in ("webhook_deliveries", "webhook_outbox"):
        tx.execute(
            f"DELETE FROM {table} WHERE project_id = ? AND user_id = ? "
            f"AND {tx.dialect.overlaps(f'{table}.message_ids', gone)}",
            (project_id, user_id),
        )
