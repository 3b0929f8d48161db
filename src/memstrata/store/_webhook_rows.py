"""Rows of the webhook half of the ``Store`` port (hooks, delivery log, async outbox)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DELIVERY_COLUMNS",
    "HOOK_COLUMNS",
    "PRUNE_EVERY",
    "UPDATABLE",
    "VERSION_KEY",
    "OutboxItem",
    "OutboxWrite",
    "WebhookDeliveryRow",
    "WebhookRow",
    "delivery_row",
    "hook_row",
]

# Both stores select these columns in this order; the converters below read them.
HOOK_COLUMNS = (
    "pk, id, project_id, name, resource, event, mode, target_url, secret, enabled, "
    "timeout_ms, created_at, updated_at, previous_secret, previous_secret_until"
)
DELIVERY_COLUMNS = (
    "d.id, d.hook_pk, d.project_id, d.user_id, d.message_ids, d.resource, d.event, d.mode, "
    "d.attempt, d.status, d.http_status, d.latency_ms, d.reason, d.request, d.response, d.at, "
    "w.id, d.pk"
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


@dataclass(frozen=True)
class WebhookRow:
    pk: int
    id: str
    project_id: str
    name: str
    resource: str
    event: str
    mode: str
    target_url: str
    # Signs deliveries; kept out of repr so a logged or printed row never shows it.
    secret: str = field(repr=False)
    enabled: bool
    timeout_ms: int
    created_at: str
    updated_at: str
    # The secret a rotation replaced, still signing beside the new one until the end of
    # its grace period (ISO UTC), so receivers can switch without rejecting deliveries.
    previous_secret: str | None = field(default=None, repr=False)
    previous_secret_until: str | None = None

    def signing_secrets(self, now: str) -> list[str]:
        """The secrets a delivery made at ``now`` (ISO UTC) is signed with, newest first."""
        if self.previous_secret and self.previous_secret_until and now < self.previous_secret_until:
            return [self.secret, self.previous_secret]
        return [self.secret]


@dataclass(frozen=True)
class WebhookDeliveryRow:
    """One delivery attempt as the log keeps it (``request``/``response`` are excerpts)."""

    id: str
    hook_pk: int
    project_id: str
    user_id: str | None
    message_ids: list[str]
    resource: str
    event: str
    mode: str
    attempt: int
    status: str
    http_status: int | None
    latency_ms: float
    reason: str
    request: str
    response: str
    at: str
    hook_id: str = ""
    pk: int = 0


@dataclass(frozen=True)
class OutboxWrite:
    """An async delivery to queue with the batch that triggered it."""

    delivery_id: str
    hook_pk: int
    project_id: str
    user_id: str | None
    message_ids: list[str]
    body: str  # the JSON payload as it will be signed and sent


@dataclass(frozen=True)
class OutboxItem:
    """A claimed async delivery, with the hook as it is now (it may have changed since)."""

    pk: int
    delivery_id: str
    project_id: str
    user_id: str | None
    message_ids: list[str]
    body: str
    attempts: int
    lease_owner: str
    hook: WebhookRow


def hook_row(r: Sequence[Any]) -> WebhookRow:
    """A ``WebhookRow`` from ``HOOK_COLUMNS``."""
    return WebhookRow(
        pk=r[0],
        id=r[1],
        project_id=r[2],
        name=r[3],
        resource=r[4],
        event=r[5],
        mode=r[6],
        target_url=r[7],
        secret=r[8],
        enabled=bool(r[9]),
        timeout_ms=r[10],
        created_at=r[11],
        updated_at=r[12],
        previous_secret=r[13],
        previous_secret_until=r[14],
    )


def delivery_row(r: Sequence[Any], message_ids: list[str]) -> WebhookDeliveryRow:
    """A ``WebhookDeliveryRow`` from ``DELIVERY_COLUMNS``; ``message_ids`` decoded by the
    store (a JSON text in SQLite, an array in PostgreSQL)."""
    return WebhookDeliveryRow(
        id=r[0],
        hook_pk=r[1],
        project_id=r[2],
        user_id=r[3],
        message_ids=message_ids,
        resource=r[5],
        event=r[6],
        mode=r[7],
        attempt=r[8],
        status=r[9],
        http_status=r[10],
        latency_ms=r[11],
        reason=r[12],
        request=r[13],
        response=r[14],
        at=r[15],
        hook_id=r[16],
        pk=r[17],
    )
