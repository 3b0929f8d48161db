"""Rows of the webhook half of the ``Store`` port (hooks, delivery log, async outbox).

The columns the store reads them from and the converters are the core's
(``store/_core/webhooks.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .._vocabulary import DeliveryStatus, WebhookEvent, WebhookMode, WebhookResource

__all__ = ["OutboxItem", "OutboxWrite", "WebhookDeliveryRow", "WebhookRow"]


@dataclass(frozen=True)
class WebhookRow:
    pk: int
    id: str
    project_id: str
    name: str
    resource: WebhookResource
    event: WebhookEvent
    mode: WebhookMode
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
    mode: WebhookMode
    attempt: int
    status: DeliveryStatus
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
