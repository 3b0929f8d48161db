"""Webhooks for the PostgreSQL store: hook records, the delivery log and the async outbox.

A mixin of ``PostgresStore`` with the semantics of ``_sqlite_webhooks.py``: every change
to a hook bumps one counter in ``meta`` in the same transaction (cheap cache checks for
the pipeline, in any process); async deliveries are queued in the transaction that
completes their batch and claimed by senders under a lease (``FOR UPDATE SKIP LOCKED``,
so senders in many processes never take the same delivery).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

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
from ._connection import PgBase

if TYPE_CHECKING:
    import psycopg

__all__ = ["PostgresWebhooks"]


def _delivery(r: Sequence[Any]) -> WebhookDeliveryRow:
    return delivery_row(r, list(r[4]))


class PostgresWebhooks(PgBase):
    """Mixin: the webhook half of the ``Store`` port for PostgreSQL."""

    # -- hooks -------------------------------------------------------------------------

    @staticmethod
    def _bump_webhooks(c: psycopg.Connection[Any]) -> None:
        c.execute(
            "INSERT INTO meta (key, value) VALUES (%s, '1') ON CONFLICT (key) "
            "DO UPDATE SET value = (meta.value::bigint + 1)::text",
            (VERSION_KEY,),
        )

    def webhooks_version(self) -> int:
        with self._read() as c:
            row = c.execute("SELECT value FROM meta WHERE key = %s", (VERSION_KEY,)).fetchone()
        return 0 if row is None else int(row[0])

    def create_webhook(self, row: WebhookRow) -> WebhookRow:
        with self._write() as c:
            stored = c.execute(
                "INSERT INTO webhooks (id, project_id, name, resource, event, mode, target_url, "
                "secret, enabled, timeout_ms, created_at, updated_at) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
                f"RETURNING {HOOK_COLUMNS}",
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
            ).fetchone()
            self._bump_webhooks(c)
        assert stored is not None
        return hook_row(stored)

    def get_webhook(self, project_id: str, hook_id: str) -> WebhookRow | None:
        with self._read() as c:
            row = c.execute(
                f"SELECT {HOOK_COLUMNS} FROM webhooks WHERE project_id = %s AND id = %s",
                (project_id, hook_id),
            ).fetchone()
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
        sql = f"SELECT {HOOK_COLUMNS} FROM webhooks WHERE project_id = %s"
        if enabled_only:
            sql += " AND enabled"
        # SQLite's LIMIT -1 means "no limit"; PostgreSQL's LIMIT NULL does.
        with self._read() as c:
            rows = c.execute(
                sql + " ORDER BY pk LIMIT %s OFFSET %s",
                (project_id, None if limit < 0 else limit, offset),
            ).fetchall()
        return [hook_row(r) for r in rows]

    def update_webhook(
        self, project_id: str, hook_id: str, changes: dict[str, Any]
    ) -> WebhookRow | None:
        unknown = set(changes) - UPDATABLE
        if unknown:
            raise ValueError(f"not updatable: {sorted(unknown)}")
        values = {k: bool(v) if k == "enabled" else v for k, v in changes.items()}
        with self._write() as c:
            sets = "".join(f"{k} = %s, " for k in values)
            row = c.execute(
                f"UPDATE webhooks SET {sets}updated_at = %s WHERE project_id = %s AND id = %s "
                f"RETURNING {HOOK_COLUMNS}",
                (*values.values(), now_iso(), project_id, hook_id),
            ).fetchone()
            if row is None:
                return None
            self._bump_webhooks(c)
        return hook_row(row)

    def delete_webhook(self, project_id: str, hook_id: str) -> bool:
        """Delete a hook with its delivery log and queued deliveries."""
        with self._write() as c:
            row = c.execute(
                "DELETE FROM webhooks WHERE project_id = %s AND id = %s RETURNING pk",
                (project_id, hook_id),
            ).fetchone()
            if row is None:
                return False
            # The log and the outbox go with it (ON DELETE CASCADE).
            self._bump_webhooks(c)
        return True

    # -- delivery log ------------------------------------------------------------------

    @staticmethod
    def _insert_delivery(c: psycopg.Connection[Any], d: WebhookDeliveryRow, keep: int) -> None:
        row = c.execute(
            "INSERT INTO webhook_deliveries (id, hook_pk, project_id, user_id, message_ids, "
            "resource, event, mode, attempt, status, http_status, latency_ms, reason, request, "
            "response, at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, "
            "%s) RETURNING pk",
            (
                d.id,
                d.hook_pk,
                d.project_id,
                d.user_id,
                list(d.message_ids),
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
        ).fetchone()
        if row is not None and row[0] % PRUNE_EVERY == 0:
            c.execute(
                "DELETE FROM webhook_deliveries WHERE hook_pk = %s AND pk <= (SELECT pk FROM "
                "webhook_deliveries WHERE hook_pk = %s ORDER BY pk DESC LIMIT 1 OFFSET %s)",
                (d.hook_pk, d.hook_pk, keep),
            )

    def add_webhook_delivery(self, delivery: WebhookDeliveryRow, keep: int = 1000) -> None:
        """Log one delivery attempt; the log keeps about the last ``keep`` per hook."""
        with self._write() as c:
            # FOR KEY SHARE: a concurrent delete of the hook waits for this insert (or this
            # one sees the hook gone), so the foreign key never fails halfway.
            exists = c.execute(
                "SELECT 1 FROM webhooks WHERE pk = %s FOR KEY SHARE", (delivery.hook_pk,)
            ).fetchone()
            if exists is None:
                return  # deleted while the delivery was in flight: nothing to log it under
            self._insert_delivery(c, delivery, keep)

    def list_webhook_deliveries(
        self, project_id: str, hook_id: str, limit: int, offset: int
    ) -> list[WebhookDeliveryRow]:
        """A hook's delivery attempts, newest first."""
        with self._read() as c:
            rows = c.execute(
                f"SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries d "
                "JOIN webhooks w ON w.pk = d.hook_pk WHERE w.project_id = %s AND w.id = %s "
                "ORDER BY d.pk DESC LIMIT %s OFFSET %s",
                (project_id, hook_id, limit, offset),
            ).fetchall()
        return [_delivery(r) for r in rows]

    # -- async outbox ------------------------------------------------------------------

    @staticmethod
    def _enqueue_webhooks(c: psycopg.Connection[Any], items: Sequence[OutboxWrite]) -> None:
        """Queue async deliveries inside the caller's transaction (the batch's completion)."""
        if not items:
            return
        now, created = time.time(), now_iso()
        with c.cursor() as cur:
            cur.executemany(
                "INSERT INTO webhook_outbox (delivery_id, hook_pk, project_id, user_id, "
                "message_ids, payload, run_after, created_at) "
                "SELECT %s, %s, %s, %s, %s, %s, %s, %s "
                "WHERE EXISTS (SELECT 1 FROM webhooks WHERE pk = %s FOR KEY SHARE)",
                [
                    (
                        i.delivery_id,
                        i.hook_pk,
                        i.project_id,
                        i.user_id,
                        list(i.message_ids),
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
        with self._write() as c:
            row = c.execute(
                "SELECT o.pk, o.delivery_id, o.project_id, o.user_id, o.message_ids, o.payload, "
                "o.attempts, o.hook_pk FROM webhook_outbox o "
                "WHERE ((o.status = 'queued' AND o.run_after <= %s) "
                "OR (o.status = 'running' AND o.lease_until < %s)) "
                "AND o.project_id <> ALL(%s::text[]) "
                "ORDER BY o.run_after, o.pk LIMIT 1 FOR UPDATE SKIP LOCKED",
                (now, now, list(skip_projects)),
            ).fetchone()
            if row is None:
                return None
            c.execute(
                "UPDATE webhook_outbox SET status = 'running', lease_owner = %s, "
                "lease_until = %s, attempts = attempts + 1 WHERE pk = %s",
                (owner, now + lease_seconds, row[0]),
            )
            hook = c.execute(
                f"SELECT {HOOK_COLUMNS} FROM webhooks WHERE pk = %s", (row[7],)
            ).fetchone()
        assert hook is not None  # the outbox row goes with its hook (ON DELETE CASCADE)
        return OutboxItem(
            pk=row[0],
            delivery_id=row[1],
            project_id=row[2],
            user_id=row[3],
            message_ids=list(row[4]),
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
        if outcome not in ("done", "retry", "failed"):
            raise ValueError(f"unknown outcome {outcome!r}")
        with self._write() as c:
            held = c.execute(
                "SELECT 1 FROM webhook_outbox WHERE pk = %s AND status = 'running' "
                "AND lease_owner = %s FOR UPDATE",
                (item.pk, item.lease_owner),
            ).fetchone()
            if held is None:
                return False
            if outcome == "done":
                c.execute("DELETE FROM webhook_outbox WHERE pk = %s", (item.pk,))
            elif outcome == "retry":
                c.execute(
                    "UPDATE webhook_outbox SET status = 'queued', run_after = %s, "
                    "lease_owner = NULL, lease_until = NULL, last_error = %s WHERE pk = %s",
                    (retry_at, error, item.pk),
                )
            else:
                c.execute(
                    "UPDATE webhook_outbox SET status = 'failed', lease_owner = NULL, "
                    "lease_until = NULL, last_error = %s WHERE pk = %s",
                    (error, item.pk),
                )
            if log is not None:
                self._insert_delivery(c, log, keep)
        return True

    def next_webhook_time(self) -> float | None:
        with self._read() as c:
            row = c.execute(
                "SELECT min(CASE status WHEN 'queued' THEN run_after ELSE lease_until END) "
                "FROM webhook_outbox WHERE status IN ('queued', 'running')"
            ).fetchone()
        return None if row is None or row[0] is None else float(row[0])

    def webhook_outbox_counts(self, project_id: str | None = None) -> dict[str, int]:
        """Async deliveries by state: ``queued``, ``running``, ``failed`` (for good)."""
        sql = "SELECT status, count(*) FROM webhook_outbox"
        args: tuple[str, ...] = ()
        if project_id is not None:
            sql, args = sql + " WHERE project_id = %s", (project_id,)
        counts = {"queued": 0, "running": 0, "failed": 0}
        with self._read() as c:
            counts.update({s: int(n) for s, n in c.execute(sql + " GROUP BY status", args)})
        return counts

    # -- deletion ----------------------------------------------------------------------

    @staticmethod
    def _forget_webhook_traces(c: psycopg.Connection[Any], project_id: str, user_id: str) -> None:
        """Drop logged and queued deliveries that carried any message in ``gone_messages``:
        their request excerpts and payloads hold its content."""
        gone = "ARRAY(SELECT m.id FROM messages m JOIN gone_messages g ON g.pk = m.pk)"
        for table in ("webhook_deliveries", "webhook_outbox"):
            c.execute(
                f"DELETE FROM {table} WHERE project_id = %s AND user_id = %s "
                f"AND message_ids && {gone}",
                (project_id, user_id),
            )
