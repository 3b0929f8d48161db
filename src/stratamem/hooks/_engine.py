"""Stored webhooks at the pipeline's hook points: lookup, sync delivery, async queueing.

:class:`Hooks` asks the engine for a project's enabled webhooks once per batch
(:meth:`WebhookEngine.snapshot`: one row read to learn whether its cache is current), calls
sync ones over HTTP as the batch runs, and queues async ones on the batch's context; those
are written to the outbox in the transaction that completes the batch and sent later by
:class:`~stratamem.hooks._outbox.OutboxSender`.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import _metrics
from .._time import now_iso
from ..store import OutboxWrite, WebhookDeliveryRow, WebhookRow, WebhookStore
from ._http import HttpResult, WebhookHttp, excerpt, http_failure, traced_post
from ._outbox import OutboxSender
from ._signing import signature_headers
from ._ssrf import AllowList, Resolver, system_resolver

if TYPE_CHECKING:
    from ..config import Settings
    from . import HookContext

__all__ = ["WebhookEngine", "judge", "parse_answer"]

log = logging.getLogger("stratamem.hooks")

Apply = Callable[[dict[str, Any] | None], str]


def encode(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()


def parse_answer(body: bytes) -> dict[str, Any] | None:
    """The ``data`` of a 2xx answer: ``None`` for "no change" (empty body, no ``data``)."""
    if not body.strip():
        return None
    try:
        answer = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"answer is not valid JSON ({exc})") from None
    if not isinstance(answer, dict):
        raise ValueError(f"answer is {type(answer).__name__}, not an object")
    data = answer.get("data")
    if data is None:
        return None
    if not isinstance(data, dict):
        raise ValueError("answer.data is not an object")
    return data


def judge(result: HttpResult, apply: Apply | None) -> tuple[bool, str]:
    """(ok, reason) of a delivery; ``apply`` consumes the answer's data (``None``: the
    answer is ignored) and raises when it breaks the point's rules."""
    failure = http_failure(result)
    if failure is not None:
        return False, failure
    if apply is None:
        return True, f"HTTP {result.status} (answers are ignored)"
    try:
        return True, apply(parse_answer(result.body))
    except Exception as exc:
        return False, reason_of(exc)


def reason_of(exc: BaseException) -> str:
    text = " ".join(str(exc).split())[:300]
    if isinstance(exc, ValueError) and text.startswith("answer"):
        return text
    return f"{type(exc).__name__}: {text}"


class WebhookEngine:
    """The project's stored webhooks as :class:`Hooks` sees them."""

    def __init__(
        self, store: WebhookStore, settings: Settings, *, resolver: Resolver | None = None
    ):
        self.store = store
        self.settings = settings
        self.http = WebhookHttp(
            AllowList.parse(settings.webhook_allow),
            max_response_bytes=settings.webhook_max_response_bytes,
            resolver=resolver or system_resolver,
        )
        self.outbox = OutboxSender(store, self.http, settings)
        self._cache: dict[str, tuple[int, tuple[WebhookRow, ...]]] = {}
        self._lock = threading.Lock()

    @property
    def allow(self) -> AllowList:
        return self.http.allow

    # -- lookup ------------------------------------------------------------------------

    def snapshot(self, project_id: str) -> tuple[WebhookRow, ...]:
        """The project's enabled webhooks in creation order, cached until any hook changes."""
        version = self.store.webhooks_version()
        with self._lock:
            cached = self._cache.get(project_id)
        if cached is not None and cached[0] == version:
            return cached[1]
        # Read after the version: a change racing this read bumps the version again, so
        # the next batch reloads rather than keeping a stale list.
        hooks = tuple(self.store.list_webhooks(project_id, enabled_only=True))
        with self._lock:
            self._cache[project_id] = (version, hooks)
        return hooks

    # -- delivery ----------------------------------------------------------------------

    def deliver(
        self, hook: WebhookRow, ctx: HookContext, payload: dict[str, Any], apply: Apply | None
    ) -> None:
        """POST a sync delivery now and let ``apply`` use its answer; log the attempt."""
        body = encode(payload)
        silent = ctx.silent.get(hook.id)
        if silent is not None:
            result = HttpResult(None, b"", 0.0, f"not sent: earlier in this batch, {silent}")
        else:
            headers = signature_headers(
                hook.signing_secrets(now_iso()), payload["delivery_id"], body
            )
            result = traced_post(self.http, hook, "sync", body, headers)
            if result.status is None and result.error is not None:
                ctx.silent[hook.id] = result.error
        ok, reason = judge(result, apply)
        _metrics.webhook_delivery(
            hook.project_id, "sync", "delivered" if ok else "failed", result.latency_ms / 1000
        )
        self._log(
            WebhookDeliveryRow(
                id=payload["delivery_id"],
                hook_pk=hook.pk,
                project_id=hook.project_id,
                user_id=ctx.user_id,
                message_ids=ctx.traced(),
                resource=hook.resource,
                event=hook.event,
                mode="sync",
                attempt=1,
                status="delivered" if ok else "failed",
                http_status=result.status,
                latency_ms=result.latency_ms,
                reason=reason,
                request=excerpt(body),
                response=excerpt(result.body),
                at=now_iso(),
            ),
            hook,
        )

    def queue(self, hook: WebhookRow, ctx: HookContext, payload: dict[str, Any]) -> None:
        """Hold an async delivery on the batch's context until the batch commits."""
        ctx.outbox.append(
            OutboxWrite(
                delivery_id=payload["delivery_id"],
                hook_pk=hook.pk,
                project_id=hook.project_id,
                user_id=ctx.user_id,
                message_ids=ctx.traced(),
                # Encoded now: later hooks at the same point may edit the items in place.
                body=encode(payload).decode(),
            )
        )

    def _log(self, row: WebhookDeliveryRow, hook: WebhookRow) -> None:
        if row.status != "delivered":
            log.warning(
                "webhook %s (%s, %s.%s) failed: %s",
                hook.name,
                hook.id,
                hook.resource,
                hook.event,
                row.reason,
            )
        try:
            self.store.add_webhook_delivery(row, keep=self.settings.webhook_log_keep)
        except Exception:
            # The log is for operators; failing to write it must not fail the batch.
            log.exception("could not log webhook delivery %s", row.id)

    # -- lifecycle ---------------------------------------------------------------------

    def notify(self) -> None:
        """Async deliveries were committed in this process: send them now."""
        self.outbox.notify()

    def start(self) -> None:
        if self.settings.workers > 0:
            self.outbox.start()

    def wait(self, project_id: str | None, timeout: float | None) -> None:
        self.outbox.wait(project_id, timeout)

    def close(self, timeout: float = 5.0) -> None:
        # Async deliveries are not work this process owes before exiting: they stay queued
        # in the store. Only a short wait for those in flight, so a hanging receiver cannot
        # hold close() for its whole timeout.
        self.outbox.stop(min(timeout, 2.0))
        self.http.close()
