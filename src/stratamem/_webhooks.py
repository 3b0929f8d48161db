"""``mem.webhooks``: a project's stored webhooks (docs/webhooks.md) and their delivery log.

A webhook calls one hook point of the write pipeline (``fact``/``summary`` ×
``before_llm``/``after_llm``/``before_add``, ``topic.before_add``) over HTTP, signed the
Standard Webhooks way with a secret that is shown once. ``sync`` hooks are called as a
batch is processed and may change what is stored; ``async`` ones are queued with the batch
and sent in the background with retries. docs/webhooks.md has the payloads.
"""

from __future__ import annotations

import builtins
import ipaddress
from collections.abc import Callable
from datetime import timedelta
from typing import Any, cast

from ._checks import check_id, check_paging, new_id
from ._convert import from_row
from ._strings import shown, text_problem
from ._time import now_iso, parse_iso, to_iso, utcnow
from ._vocabulary import WebhookEvent, WebhookMode, WebhookResource
from .errors import NotFoundError, ValidationError
from .hooks import HOOK_POINTS
from .hooks._engine import WebhookEngine
from .hooks._signing import new_secret
from .hooks._ssrf import TargetRefused, forbidden_reason, parse_target
from .store import WebhookDeliveryRow, WebhookRow, WebhookStore
from .types import Webhook, WebhookDelivery

__all__ = ["MAX_GRACE_SECONDS", "MAX_TIMEOUT_MS", "MIN_TIMEOUT_MS", "Webhooks"]

MIN_TIMEOUT_MS = 100
MAX_TIMEOUT_MS = 30_000
MAX_GRACE_SECONDS = 7 * 86_400  # a rotated secret signs beside the new one at most a week
MODES = ("sync", "async")
_POINTS = ", ".join(sorted(f"{r}.{e}" for r, e in HOOK_POINTS))


def _webhook(row: WebhookRow) -> Webhook:
    grace = row.previous_secret_until if len(row.signing_secrets(now_iso())) > 1 else None
    return from_row(Webhook, row, rotation_grace_until=parse_iso(grace))


def _delivery(row: WebhookDeliveryRow) -> WebhookDelivery:
    return from_row(WebhookDelivery, row)


class Webhooks:
    """Create, list, change and delete the project's webhooks; read their delivery log.

    ``delivery`` is the engine that calls them (its allow-list judges literal target
    addresses); ``check_open`` raises once the Memory is closed."""

    def __init__(
        self,
        store: WebhookStore,
        project_id: str,
        *,
        delivery: WebhookEngine,
        check_open: Callable[[], None],
        default_timeout_ms: int,
    ) -> None:
        self._store = store
        self._project_id = project_id
        self._delivery = delivery
        self._check_open = check_open
        self._default_timeout_ms = default_timeout_ms

    # -- validation --------------------------------------------------------------------

    def _check(self, fields: dict[str, Any]) -> list[str]:
        problems = []
        if "resource" in fields or "event" in fields:
            point = (fields.get("resource"), fields.get("event"))
            if point not in HOOK_POINTS:
                problems.append(
                    f"event: {point[0]}.{point[1]} is not a hook point; supported are {_POINTS}"
                )
        if "mode" in fields and fields["mode"] not in MODES:
            problems.append(f"mode: expected 'sync' or 'async' (got {shown(fields['mode'])})")
        if "name" in fields:
            name = fields["name"]
            if not isinstance(name, str) or not name.strip() or len(name) > 200:
                problems.append("name: expected a string of 1 to 200 characters")
            elif (problem := text_problem(name)) is not None:
                problems.append(f"name: {problem}")
        if "timeout_ms" in fields:
            t = fields["timeout_ms"]
            if (
                isinstance(t, bool)
                or not isinstance(t, int)
                or not (MIN_TIMEOUT_MS <= t <= MAX_TIMEOUT_MS)
            ):
                problems.append(
                    f"timeout_ms: expected an integer from {MIN_TIMEOUT_MS} to "
                    f"{MAX_TIMEOUT_MS} (got {shown(t)})"
                )
        if "enabled" in fields and not isinstance(fields["enabled"], bool):
            problems.append("enabled: expected true or false")
        if "target_url" in fields:
            problems.extend(self._check_url(fields["target_url"]))
        return problems

    def _check_url(self, url: Any) -> list[str]:
        try:
            target = parse_target(url)
        except TargetRefused as exc:
            return [str(exc)]
        # A literal address is refused now, when the mistake is made; host names are
        # checked at every delivery, against what they resolve to then.
        try:
            addr = ipaddress.ip_address(target.host)
        except ValueError:
            return []
        allow = self._delivery.allow
        reason = forbidden_reason(addr)
        if reason is None or allow.permits_address(addr):
            return []
        return [f"target_url: {addr} is {reason}; add it to STRATAMEM_WEBHOOK_ALLOW to permit it"]

    def _row(self, hook_id: str) -> WebhookRow:
        check_id(hook_id, "hook_id")
        row = self._store.get_webhook(self._project_id, hook_id)
        if row is None:
            raise NotFoundError(f"no webhook {hook_id!r}")
        return row

    # -- the API -----------------------------------------------------------------------

    def create(
        self,
        *,
        resource: str,
        event: str,
        target_url: str,
        mode: str = "sync",
        name: str | None = None,
        timeout_ms: int | None = None,
        enabled: bool = True,
    ) -> tuple[Webhook, str]:
        """Add a webhook at ``resource.event``; returns it and its signing secret.

        The secret (``whsec_...``) is shown only here: store it with the receiver, which
        verifies each delivery's ``webhook-signature`` with it. Webhooks at one point run
        in creation order, after the point's in-process hooks.
        """
        self._check_open()
        fields: dict[str, Any] = {
            "resource": resource,
            "event": event,
            "target_url": target_url,
            "mode": mode,
            "name": f"{resource}.{event}" if name is None else name,
            "timeout_ms": self._default_timeout_ms if timeout_ms is None else timeout_ms,
            "enabled": enabled,
        }
        problems = self._check(fields)
        if problems:
            raise ValidationError("invalid webhook", problems)
        secret = new_secret()
        now = now_iso()
        row = self._store.create_webhook(
            WebhookRow(
                pk=0,
                id=new_id("wh"),
                project_id=self._project_id,
                name=fields["name"].strip(),
                # _check has held them to their vocabularies.
                resource=cast(WebhookResource, resource),
                event=cast(WebhookEvent, event),
                mode=cast(WebhookMode, mode),
                target_url=target_url.strip(),
                secret=secret,
                enabled=enabled,
                timeout_ms=fields["timeout_ms"],
                created_at=now,
                updated_at=now,
            )
        )
        return _webhook(row), secret

    def list(self, *, limit: int = 100, offset: int = 0) -> list[Webhook]:
        """The project's webhooks in creation order."""
        self._check_open()
        check_paging(limit, offset)
        rows = self._store.list_webhooks(self._project_id, limit=limit, offset=offset)
        return [_webhook(r) for r in rows]

    def get(self, hook_id: str) -> Webhook:
        self._check_open()
        return _webhook(self._row(hook_id))

    def update(
        self,
        hook_id: str,
        *,
        name: str | None = None,
        resource: str | None = None,
        event: str | None = None,
        target_url: str | None = None,
        mode: str | None = None,
        timeout_ms: int | None = None,
        enabled: bool | None = None,
    ) -> Webhook:
        """Change some of a webhook's fields (``None`` leaves a field as it is). Batches
        that start after the change see it."""
        self._check_open()
        current = self._row(hook_id)
        changes = {
            k: v
            for k, v in (
                ("name", name),
                ("resource", resource),
                ("event", event),
                ("target_url", target_url),
                ("mode", mode),
                ("timeout_ms", timeout_ms),
                ("enabled", enabled),
            )
            if v is not None
        }
        check = dict(changes)
        if "resource" in changes or "event" in changes:
            check.setdefault("resource", current.resource)
            check.setdefault("event", current.event)
        problems = self._check(check)
        if problems:
            raise ValidationError("invalid webhook", problems)
        if not changes:
            return _webhook(current)
        for key in ("name", "target_url"):
            value = changes.get(key)
            if isinstance(value, str):
                changes[key] = value.strip()
        row = self._store.update_webhook(self._project_id, hook_id, changes)
        if row is None:
            raise NotFoundError(f"no webhook {hook_id!r}")
        return _webhook(row)

    def enable(self, hook_id: str) -> Webhook:
        return self.update(hook_id, enabled=True)

    def disable(self, hook_id: str) -> Webhook:
        """Stop calling the webhook; async deliveries still queued for it fail."""
        return self.update(hook_id, enabled=False)

    def delete(self, hook_id: str) -> None:
        """Delete the webhook with its delivery log and queued deliveries."""
        self._check_open()
        if not isinstance(hook_id, str) or not self._store.delete_webhook(
            self._project_id, hook_id
        ):
            raise NotFoundError(f"no webhook {hook_id!r}")

    def rotate_secret(self, hook_id: str, *, grace_seconds: int = 0) -> str:
        """Replace the signing secret and return the new one (shown only here). Deliveries
        from now on, including retries of queued async ones, are signed with it.

        With ``grace_seconds`` (at most a week), they are also signed with the old secret
        until then (a second signature in ``webhook-signature``), so receivers can switch
        secrets without rejecting a delivery; 0 (the default, for a leaked secret) stops
        the old one at once. Rotating again ends an earlier grace period."""
        self._check_open()
        if (
            isinstance(grace_seconds, bool)
            or not isinstance(grace_seconds, int)
            or not 0 <= grace_seconds <= MAX_GRACE_SECONDS
        ):
            raise ValidationError(
                "invalid webhook",
                [
                    f"grace_seconds: an integer, 0 to {MAX_GRACE_SECONDS} "
                    f"(got {shown(grace_seconds)})"
                ],
            )
        old = self._row(hook_id)
        secret = new_secret()
        until = utcnow() + timedelta(seconds=grace_seconds)
        changes: dict[str, Any] = {
            "secret": secret,
            "previous_secret": old.secret if grace_seconds else None,
            "previous_secret_until": to_iso(until) if grace_seconds else None,
        }
        if self._store.update_webhook(self._project_id, hook_id, changes) is None:
            raise NotFoundError(f"no webhook {hook_id!r}")
        return secret

    def deliveries(
        self, hook_id: str, *, limit: int = 100, offset: int = 0
    ) -> builtins.list[WebhookDelivery]:
        """The webhook's delivery attempts, newest first: when, status, HTTP status,
        latency, reason, and the start of the request and the answer."""
        self._check_open()
        check_paging(limit, offset)
        self._row(hook_id)
        rows = self._store.list_webhook_deliveries(self._project_id, hook_id, limit, offset)
        return [_delivery(r) for r in rows]

    def wait(self, timeout: float | None = None) -> None:
        """Block until the project's async deliveries are settled (delivered or failed
        for good); without worker threads they are sent in the calling thread."""
        self._check_open()
        self._delivery.wait(self._project_id, timeout)
