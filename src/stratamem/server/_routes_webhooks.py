"""Webhooks of the calling key's project: create, list, change, delete, rotate, delivery log.

The signing secret is in the responses that create or rotate it and nowhere else. The
rules (hook points, modes, URL checks, timeout bounds) are the engine's; its validation
errors become 422s naming the field. See docs/webhooks.md.
"""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter
from pydantic import BaseModel, Field

from .._webhooks import MAX_GRACE_SECONDS, MAX_TIMEOUT_MS, MIN_TIMEOUT_MS
from ..types import Webhook, WebhookDelivery
from ._auth import CallerDep
from ._common import API_ERRORS, Limit, Offset, page
from ._models import Envelope, Page, RequestBody

router = APIRouter(prefix="/api/webhooks", tags=["webhooks"], responses=API_ERRORS)

Resource = Literal["fact", "summary", "topic"]
Event = Literal["before_llm", "after_llm", "before_add"]
Mode = Literal["sync", "async"]


class CreateWebhook(RequestBody):
    resource: Resource
    event: Event = Field(
        description="fact and summary: before_llm, after_llm, before_add; topic: before_add."
    )
    target_url: str = Field(
        min_length=1,
        max_length=2000,
        description="http(s) URL; hosts resolving to non-public addresses are refused "
        "unless STRATAMEM_WEBHOOK_ALLOW permits them.",
    )
    mode: Mode = Field(
        default="sync",
        description="sync: called as the batch is processed, may change what is stored; "
        "async: queued with the batch, retried, answer ignored.",
    )
    name: str | None = Field(default=None, min_length=1, max_length=200)
    timeout_ms: int | None = Field(
        default=None,
        ge=MIN_TIMEOUT_MS,
        le=MAX_TIMEOUT_MS,
        description="Default STRATAMEM_WEBHOOK_TIMEOUT_MS.",
    )
    enabled: bool = True


class UpdateWebhook(RequestBody):
    """Fields to change; those left out (or null) stay as they are."""

    name: str | None = Field(default=None, min_length=1, max_length=200)
    resource: Resource | None = None
    event: Event | None = None
    target_url: str | None = Field(default=None, min_length=1, max_length=2000)
    mode: Mode | None = None
    timeout_ms: int | None = Field(default=None, ge=MIN_TIMEOUT_MS, le=MAX_TIMEOUT_MS)
    enabled: bool | None = None


class RotateSecret(RequestBody):
    grace_seconds: int = Field(
        default=0,
        ge=0,
        le=MAX_GRACE_SECONDS,
        description="Keep signing with the old secret too for this long (a second "
        "signature in `webhook-signature`), so receivers can switch without rejecting "
        "deliveries; 0 stops the old secret at once.",
    )


class WebhookSecret(BaseModel):
    webhook: Webhook
    secret: str = Field(
        description="The signing secret (`whsec_...`), for Standard Webhooks verification. "
        "Shown only in this response."
    )


@router.post(
    "",
    summary="Create a webhook",
    description="Call `target_url` at one hook point of the write pipeline. The response "
    "carries the signing secret (`data.secret`); it cannot be shown again (rotate it to get "
    "a new one). Webhooks at one point run in creation order.",
    response_model=Envelope[WebhookSecret],
    status_code=201,
)
def create_webhook(body: CreateWebhook, caller: CallerDep) -> Envelope[WebhookSecret]:
    hook, secret = caller.memory.webhooks.create(
        resource=body.resource,
        event=body.event,
        target_url=body.target_url,
        mode=body.mode,
        name=body.name,
        timeout_ms=body.timeout_ms,
        enabled=body.enabled,
    )
    return Envelope(data=WebhookSecret(webhook=hook, secret=secret))


@router.get(
    "",
    summary="List webhooks",
    description="The project's webhooks in creation order (never their secrets).",
    response_model=Envelope[Page[Webhook]],
)
def list_webhooks(
    caller: CallerDep, limit: Limit = 100, offset: Offset = 0
) -> Envelope[Page[Webhook]]:
    def fetch(n: int, skip: int) -> list[Webhook]:
        return caller.memory.webhooks.list(limit=n, offset=skip)

    return Envelope(data=page(fetch, limit, offset))


@router.get(
    "/{hook_id}",
    summary="Get a webhook",
    response_model=Envelope[Webhook],
)
def get_webhook(hook_id: str, caller: CallerDep) -> Envelope[Webhook]:
    return Envelope(data=caller.memory.webhooks.get(hook_id))


@router.patch(
    "/{hook_id}",
    summary="Change, enable or disable a webhook",
    description="Change any of name, resource, event, target_url, mode, timeout_ms, enabled "
    '(`{"enabled": false}` disables it). Batches that start afterwards see the change.',
    response_model=Envelope[Webhook],
)
def update_webhook(hook_id: str, body: UpdateWebhook, caller: CallerDep) -> Envelope[Webhook]:
    hook = caller.memory.webhooks.update(hook_id, **body.model_dump(exclude_none=True))
    return Envelope(data=hook)


@router.delete(
    "/{hook_id}",
    summary="Delete a webhook",
    description="Deletes the webhook with its delivery log and queued async deliveries. "
    "`data`: the webhook as it was.",
    response_model=Envelope[Webhook],
)
def delete_webhook(hook_id: str, caller: CallerDep) -> Envelope[Webhook]:
    hook = caller.memory.webhooks.get(hook_id)
    caller.memory.webhooks.delete(hook_id)
    return Envelope(data=hook)


@router.post(
    "/{hook_id}/rotate-secret",
    summary="Rotate a webhook's secret",
    description="A new signing secret replaces the old one (retries of queued deliveries "
    "are signed with it too), at once or after `grace_seconds` during which deliveries "
    "carry a signature with each. Shown only in this response. The body is optional.",
    response_model=Envelope[WebhookSecret],
)
def rotate_secret(
    hook_id: str, caller: CallerDep, body: RotateSecret | None = None
) -> Envelope[WebhookSecret]:
    grace = body.grace_seconds if body is not None else 0
    secret = caller.memory.webhooks.rotate_secret(hook_id, grace_seconds=grace)
    hook = caller.memory.webhooks.get(hook_id)
    return Envelope(data=WebhookSecret(webhook=hook, secret=secret))


@router.get(
    "/{hook_id}/deliveries",
    summary="A webhook's delivery log",
    description="Delivery attempts, newest first: `at`, `status` (delivered, failed, "
    "retrying), `http_status`, `latency_ms`, `reason`, `attempt`, and the first characters "
    "of the request and the answer.",
    response_model=Envelope[Page[WebhookDelivery]],
)
def deliveries(
    hook_id: str, caller: CallerDep, limit: Limit = 100, offset: Offset = 0
) -> Envelope[Page[WebhookDelivery]]:
    caller.memory.webhooks.get(hook_id)  # an unknown hook is a 404, not an empty page

    def fetch(n: int, skip: int) -> list[WebhookDelivery]:
        return caller.memory.webhooks.deliveries(hook_id, limit=n, offset=skip)

    return Envelope(data=page(fetch, limit, offset))
