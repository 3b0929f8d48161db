"""Webhooks for the SQLite store: hook records, the delivery log and the async outbox.

A mixin of ``SQLiteStore`` (it uses the store's ``_conn`` and ``_write``). Every change to
a hook bumps one counter in ``meta`` in the same transaction, so the pipeline can keep the
hooks of a project cached and check a single row per batch to know the cache is current,
in this process or after another process (the server) changed them.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

from ..._time import now_iso
from .._webhook_rows import (
    DELIVERY_COLUMNS,
    HOOK_COLUMNS,
    PRUNE_EVERY,
    UPDATABLE,
    VERSION_KEY,
    OutboxItem,
    OutboxWrite,
    WebhookDeliveryRow,
    WebhookRow,
    delivery_row,
    hook_row,
)

__all__ = ["SQLiteWebhooks"]


def _delivery(r: Sequence[Any]) -> WebhookDeliveryRow:
    return delivery_row(r, json.loads(r[4]))


class SQLiteWebhooks:
    """Mixin: the webhook half of the ``Store`` port for SQLite."""

    def _conn(self) -> sqlite3.Connection:  # provided by SQLiteStore
        raise NotImplementedError

    def _write(self) -> AbstractContextManager[sqlite3.Connection]:  # provided by SQLiteStore
        raise NotImplementedError

    # -- hooks -------------------------------------------------------------------------

    @staticmethod
    def _bump_webhooks(c: sqlite3.Connection) -> None:
        c.execute(
            "INSERT INTO meta (key, value) VALUES (?, '1') ON CONFLICT (key) "
            "DO UPDATE SET value = CAST(CAST(value AS INTEGER) + 1 AS TEXT)",
            (VERSION_KEY,),
        )

    def webhooks_version(self) -> int:
        row = self._conn().execute("SELECT value FROM meta WHERE key = ?", (VERSION_KEY,))
        found = row.fetchone()
        return 0 if found is None else int(found[0])

    def create_webhook(self, row: WebhookRow) -> WebhookRow:
        with self._write() as c:
            cur = c.execute(
                "INSERT INTO webhooks (id, project_id, name, resource, event, mode, target_url, "
                "secret, enabled, timeout_ms, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    row.id,
                    row.project_id,
                    row.name,
                    row.resource,
                    row.event,
                    row.mode,
                    row.target_url,
                    row.secret,
                    int(row.enabled),
                    row.timeout_ms,
                    row.created_at,
                    row.updated_at,
                ),
            )
            self._bump_webhooks(c)
            stored = c.execute(
                f"SELECT {HOOK_COLUMNS} FROM webhooks WHERE pk = ?", (cur.lastrowid,)
            ).fetchone()
        return hook_row(stored)

    def get_webhook(self, project_id: str, hook_id: str) -> WebhookRow | None:
        row = (
            self._conn()
            .execute(
                f"SELECT {HOOK_COLUMNS} FROM webhooks WHERE project_id = ? AND id = ?",
                (project_id, hook_id),
            )
            .fetchone()
        )
        return None if row is None else hook_row(row)

    def list_webhooks(
        self,
        project_id: str,
        *,
        enabled_only: bool = False,
        limit: int = -1,
        offset: int = 0,
    ) -> list[WebhookRow]:
        """A project's hooks in creation order (the order hooks on one point run in)."""
        sql = f"SELECT {HOOK_COLUMNS} FROM webhooks WHERE project_id = ?"
        if enabled_only:
            sql += " AND enabled = 1"
        rows = self._conn().execute(
            sql + " ORDER BY pk LIMIT ? OFFSET ?", (project_id, limit, offset)
        )
        return [hook_row(r) for r in rows]

    def update_webhook(
        self, project_id: str, hook_id: str, changes: dict[str, Any]
    ) -> WebhookRow | None:
        unknown = set(changes) - UPDATABLE
        if unknown:
            raise ValueError(f"not updatable: {sorted(unknown)}")
        values = {k: int(v) if k == "enabled" else v for k, v in changes.items()}
        with self._write() as c:
            sets = "".join(f"{k} = ?, " for k in values)
            cur = c.execute(
                f"UPDATE webhooks SET {sets}updated_at = ? WHERE project_id = ? AND id = ?",
                (*values.values(), now_iso(), project_id, hook_id),
            )
            if cur.rowcount == 0:
                return None
            self._bump_webhooks(c)
            row = c.execute(
                f"SELECT {HOOK_COLUMNS} FROM webhooks WHERE project_id = ? AND id = ?",
                (project_id, hook_id),
            ).fetchone()
        return hook_row(row)

    def delete_webhook(self, project_id: str, hook_id: str) -> bool:
        """Delete a hook with its delivery log and queued deliveries."""
        with self._write() as c:
            row = c.execute(
                "SELECT pk FROM webhooks WHERE project_id = ? AND id = ?", (project_id, hook_id)
            ).fetchone()
            if row is None:
                return False
            # Explicit, not only ON DELETE CASCADE: a connection opened with foreign keys
            # off (an old tool, the sqlite3 shell) must not leave orphans behind.
            c.execute("DELETE FROM webhook_outbox WHERE hook_pk = ?", (row[0],))
            c.execute("DELETE FROM webhook_deliveries WHERE hook_pk = ?", (row[0],))
            c.execute("DELETE FROM webhooks WHERE pk = ?", (row[0],))
            self._bump_webhooks(c)
        return True

    # -- delivery log ------------------------------------------------------------------

    @staticmethod
    def _insert_delivery(c: sqlite3.Connection, d: WebhookDeliveryRow, keep: int) -> None:
        cur = c.execute(
            "INSERT INTO webhook_deliveries (id, hook_pk, project_id, user_id, message_ids, "
            "resource, event, mode, attempt, status, http_status, latency_ms, reason, request, "
            "response, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                d.id,
                d.hook_pk,
                d.project_id,
                d.user_id,
                json.dumps(d.message_ids),
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
        if (cur.lastrowid or 0) % PRUNE_EVERY == 0:
            c.execute(
                "DELETE FROM webhook_deliveries WHERE hook_pk = ? AND pk <= (SELECT pk FROM "
                "webhook_deliveries WHERE hook_pk = ? ORDER BY pk DESC LIMIT 1 OFFSET ?)",
                (d.hook_pk, d.hook_pk, keep),
            )

    def add_webhook_delivery(self, delivery: WebhookDeliveryRow, keep: int = 1000) -> None:
        """Log one delivery attempt; the log keeps about the last ``keep`` per hook."""
        with self._write() as c:
            exists = c.execute("SELECT 1 FROM webhooks WHERE pk = ?", (delivery.hook_pk,))
            if exists.fetchone() is None:
                return  # deleted while the delivery was in flight: nothing to log it under
            self._insert_delivery(c, delivery, keep)

    def list_webhook_deliveries(
        self, project_id: str, hook_id: str, limit: int, offset: int
    ) -> list[WebhookDeliveryRow]:
        """A hook's delivery attempts, newest first."""
        rows = self._conn().execute(
            f"SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries d "
            "JOIN webhooks w ON w.pk = d.hook_pk WHERE w.project_id = ? AND w.id = ? "
            "ORDER BY d.pk DESC LIMIT ? OFFSET ?",
            (project_id, hook_id, limit, offset),
        )
        return [_delivery(r) for r in rows]

    # -- async outbox ------------------------------------------------------------------

    @staticmethod
    def _enqueue_webhooks(c: sqlite3.Connection, items: Sequence[OutboxWrite]) -> None:
        """Queue async deliveries inside the caller's transaction (the batch's completion)."""
        if not items:
            return
        now, created = time.time(), now_iso()
        c.executemany(
            "INSERT INTO webhook_outbox (delivery_id, hook_pk, project_id, user_id, message_ids, "
            "payload, run_after, created_at) SELECT ?, ?, ?, ?, ?, ?, ?, ? "
            "WHERE EXISTS (SELECT 1 FROM webhooks WHERE pk = ?)",
            [
                (
                    i.delivery_id,
                    i.hook_pk,
                    i.project_id,
                    i.user_id,
                    json.dumps(i.message_ids),
                    i.body,
                    now,
                    created,
                    i.hook_pk,
                )
                for i in items
            ],
        )

    def claim_webhook_delivery(
        self, owner: str, lease_seconds: float, skip_projects: Sequence[str] = ()
    ) -> OutboxItem | None:
        """Take the next due async delivery under a lease (``None`` when nothing is due),
        oldest due first, of any project but ``skip_projects``."""
        now = time.time()
        skip = list(skip_projects)
        due = (
            "((o.status = 'queued' AND o.run_after <= ?) "
            "OR (o.status = 'running' AND o.lease_until < ?)) "
            f"AND o.project_id NOT IN ({','.join('?' * len(skip))})"
        )
        # Idle senders poll: look without taking the write lock first.
        probe = self._conn().execute(
            f"SELECT 1 FROM webhook_outbox o WHERE {due} LIMIT 1", (now, now, *skip)
        )
        if probe.fetchone() is None:
            return None
        with self._write() as c:
            row = c.execute(
                "SELECT o.pk, o.delivery_id, o.project_id, o.user_id, o.message_ids, o.payload, "
                f"o.attempts, o.hook_pk FROM webhook_outbox o WHERE {due} "
                "ORDER BY o.run_after, o.pk LIMIT 1",
                (now, now, *skip),
            ).fetchone()
            if row is None:
                return None
            c.execute(
                "UPDATE webhook_outbox SET status = 'running', lease_owner = ?, lease_until = ?, "
                "attempts = attempts + 1 WHERE pk = ?",
                (owner, now + lease_seconds, row[0]),
            )
            hook = c.execute(
                f"SELECT {HOOK_COLUMNS} FROM webhooks WHERE pk = ?", (row[7],)
            ).fetchone()
        return OutboxItem(
            pk=row[0],
            delivery_id=row[1],
            project_id=row[2],
            user_id=row[3],
            message_ids=json.loads(row[4]),
            body=row[5],
            attempts=row[6] + 1,
            lease_owner=owner,
            hook=hook_row(hook),
        )

    def finish_webhook_delivery(
        self,
        item: OutboxItem,
        outcome: str,
        *,
        retry_at: float | None = None,
        error: str | None = None,
        log: WebhookDeliveryRow | None = None,
        keep: int = 1000,
    ) -> bool:
        """Settle a claimed delivery: ``done`` (removed), ``retry`` at ``retry_at``, or
        ``failed`` for good; logs the attempt. False if the lease was lost meanwhile."""
        with self._write() as c:
            held = c.execute(
                "SELECT 1 FROM webhook_outbox WHERE pk = ? AND status = 'running' "
                "AND lease_owner = ?",
                (item.pk, item.lease_owner),
            ).fetchone()
            if held is None:
                return False
            if outcome == "done":
                c.execute("DELETE FROM webhook_outbox WHERE pk = ?", (item.pk,))
            elif outcome == "retry":
                c.execute(
                    "UPDATE webhook_outbox SET status = 'queued', run_after = ?, lease_owner = "
                    "NULL, lease_until = NULL, last_error = ? WHERE pk = ?",
                    (retry_at, error, item.pk),
                )
            elif outcome == "failed":
                c.execute(
                    "UPDATE webhook_outbox SET status = 'failed', lease_owner = NULL, "
                    "lease_until = NULL, last_error = ? WHERE pk = ?",
                    (error, item.pk),
                )
            else:
                raise ValueError(f"unknown outcome {outcome!r}")
            if log is not None:
                self._insert_delivery(c, log, keep)
        return True

    def next_webhook_time(self) -> float | None:
        row = (
            self._conn()
            .execute(
                "SELECT min(CASE status WHEN 'queued' THEN run_after ELSE lease_until END) "
                "FROM webhook_outbox WHERE status IN ('queued', 'running')"
            )
            .fetchone()
        )
        return None if row is None or row[0] is None else float(row[0])

    def webhook_outbox_counts(self, project_id: str | None = None) -> dict[str, int]:
        """Async deliveries by state: ``queued``, ``running``, ``failed`` (for good)."""
        sql = "SELECT status, count(*) FROM webhook_outbox"
        args: tuple[str, ...] = ()
        if project_id is not None:
            sql, args = sql + " WHERE project_id = ?", (project_id,)
        counts = {"queued": 0, "running": 0, "failed": 0}
        counts.update(dict(self._conn().execute(sql + " GROUP BY status", args).fetchall()))
        return counts

    # -- deletion ----------------------------------------------------------------------

    @staticmethod
    def _forget_webhook_traces(c: sqlite3.Connection, project_id: str, user_id: str) -> None:
        """Drop logged and queued deliveries that carried any message in
        ``temp.gone_messages``: their request excerpts and payloads hold its content."""
        gone = "(SELECT m.id FROM messages m JOIN temp.gone_messages g ON g.pk = m.pk)"
        for table in ("webhook_deliveries", "webhook_outbox"):
            c.execute(
                f"DELETE FROM {table} WHERE project_id = ? AND user_id = ? AND EXISTS "
                f"(SELECT 1 FROM json_each({table}.message_ids) j WHERE j.value IN {gone})",
                (project_id, user_id),
            )
