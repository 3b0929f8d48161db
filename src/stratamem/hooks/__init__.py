"""Pipeline hook points and their semantics, independent of transport (docs/pipeline.md).

The write path calls :class:`Hooks` at seven points (fact / summary ``before_llm``,
``after_llm``, ``before_add``; topic ``before_add``). Each registered hook receives the
payload a webhook does (docs/webhooks.md) and answers like one: ``{"data": {...}}`` or
nothing.

- ``before_llm``: ``data.instruction`` strings are appended to the default *user* prompt,
  concatenated in registration order; they never replace the prompt or touch the system
  prompt.
- ``after_llm``: informational; answers are ignored.
- ``before_add``: ``data.observations`` / ``data.propositions`` / ``data.topics`` replace
  the items about to be stored, chained in registration order, and are validated exactly
  like the engine's own output (an answer that fails validation is skipped as a whole).

A hook that raises, times out, or answers with something malformed is skipped, the
delivery is recorded with its reason, and the pipeline continues with the unmodified data.

Two kinds of hook share these semantics: callables registered in this process
(``mem.hooks.register``; deliveries in ``Hooks.deliveries``) and the project's stored
webhooks (``mem.webhooks``; delivered over HTTP by ``WebhookEngine``, logged in the store).
At each point the in-process hooks run first, then the webhooks, each in creation order.
Sync webhooks are called as the batch runs; async ones are queued on the batch's context
and sent once the batch has committed (their answers are ignored).

Every payload carries ``version`` (:data:`PAYLOAD_VERSION`), the version of the ``data``
shapes documented in docs/webhooks.md, and a unique ``delivery_id``.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from ..errors import ValidationError
from ._signing import new_delivery_id

if TYPE_CHECKING:
    from ..store import OutboxWrite, WebhookRow
    from ._engine import WebhookEngine

__all__ = [
    "HOOK_POINTS",
    "ITEMS_KEY",
    "PAYLOAD_VERSION",
    "Delivery",
    "HookContext",
    "Hooks",
    "payload",
]

log = logging.getLogger("stratamem.hooks")

HOOK_POINTS: frozenset[tuple[str, str]] = frozenset(
    {
        ("fact", "before_llm"),
        ("fact", "after_llm"),
        ("fact", "before_add"),
        ("summary", "before_llm"),
        ("summary", "after_llm"),
        ("summary", "before_add"),
        ("topic", "before_add"),
    }
)
# The wire names of the items a before_add answer may carry, per resource.
ITEMS_KEY = {"fact": "observations", "summary": "propositions", "topic": "topics"}
# Version of the payload's ``data`` shapes (docs/webhooks.md); bumped on any change that
# is not purely additive, so receivers can tell which shape they were sent.
PAYLOAD_VERSION = 1

HookFn = Callable[[dict[str, Any]], Any]


@dataclass(frozen=True)
class HookContext:
    """One batch as hooks see it; built by :meth:`Hooks.context` once per batch."""

    project_id: str
    user_id: str
    session_ids: tuple[str, ...]
    message_ids: tuple[str, ...]
    # The project's enabled webhooks when the batch began, in creation order.
    webhooks: tuple[WebhookRow, ...] = ()
    # Async deliveries triggered so far, committed with the batch (LayerWrite.outbox).
    outbox: list[OutboxWrite] = field(default_factory=list, compare=False, repr=False)
    # Messages behind stored items that later payloads of the batch quote (a summary
    # being strengthened keeps the words of the messages it was built from).
    quoted: set[str] = field(default_factory=set, compare=False, repr=False)
    # Sync webhooks that gave no answer in this batch (timed out, unreachable), by id, with
    # why: they are not called again until the next batch, so a receiver that is down or
    # slow costs a batch one timeout, not one per hook point and chunk.
    silent: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    def traced(self) -> list[str]:
        """Every message whose content this batch's deliveries may carry: the batch's own
        and the quoted ones. A delivery is logged and queued under these, so forgetting
        any of them removes it with its copy of the content."""
        return [*self.message_ids, *sorted(self.quoted.difference(self.message_ids))]

    def wire(self) -> dict[str, Any]:
        session = self.session_ids[-1] if self.session_ids else None
        return {
            "user_id": self.user_id,
            "session_id": session,
            "thread_id": session,
            "session_ids": list(self.session_ids),
            "message_ids": list(self.message_ids),
        }


@dataclass
class Delivery:
    hook_id: str
    hook_name: str
    resource: str
    event: str
    ok: bool
    reason: str
    latency_ms: float
    at: float = field(default_factory=time.time)


@dataclass
class _Hook:
    id: str
    name: str
    resource: str
    event: str
    fn: HookFn


def payload(
    hook_id: str,
    hook_name: str,
    mode: str,
    resource: str,
    event: str,
    ctx: HookContext,
    data: dict[str, Any],
) -> dict[str, Any]:
    """The request body of one delivery (docs/webhooks.md, "The request")."""
    return {
        "version": PAYLOAD_VERSION,
        "delivery_id": new_delivery_id(),
        "hook_id": hook_id,
        "hook_name": hook_name,
        "project_id": ctx.project_id,
        "resource": resource,
        "event": event,
        "mode": mode,
        "triggered_at": datetime.now(timezone.utc).isoformat(),
        "context": ctx.wire(),
        "data": data,
    }


Apply = Callable[[dict[str, Any] | None], str]


class Hooks:
    """Registered hooks and the semantics of calling them."""

    def __init__(self, *, max_log: int = 1000) -> None:
        self._hooks: list[_Hook] = []
        self._lock = threading.Lock()
        self.deliveries: deque[Delivery] = deque(maxlen=max_log)
        # The project's stored webhooks (set by Memory); None: in-process hooks only.
        self.remote: WebhookEngine | None = None

    def context(
        self,
        project_id: str,
        user_id: str,
        session_ids: tuple[str, ...],
        message_ids: tuple[str, ...],
    ) -> HookContext:
        """The context of one batch, with the project's webhooks looked up once for it."""
        webhooks = self.remote.snapshot(project_id) if self.remote is not None else ()
        return HookContext(project_id, user_id, session_ids, message_ids, webhooks)

    def committed(self, ctx_outbox: Sequence[OutboxWrite]) -> None:
        """A batch committed with async deliveries: have them sent now."""
        if ctx_outbox and self.remote is not None:
            self.remote.notify()

    def register(self, resource: str, event: str, fn: HookFn, *, name: str | None = None) -> str:
        """Add ``fn`` at ``resource.event``; hooks at one point run in registration order."""
        if (resource, event) not in HOOK_POINTS:
            points = ", ".join(sorted(f"{r}.{e}" for r, e in HOOK_POINTS))
            raise ValidationError("invalid hook", [f"{resource}.{event}: supported are {points}"])
        if not callable(fn):
            raise ValidationError("invalid hook", ["fn: expected a callable"])
        hook = _Hook(
            f"hook_{secrets.token_hex(6)}",
            name if name else getattr(fn, "__name__", "hook"),
            resource,
            event,
            fn,
        )
        with self._lock:
            self._hooks.append(hook)
        return hook.id

    def unregister(self, hook_id: str) -> bool:
        with self._lock:
            before = len(self._hooks)
            self._hooks = [h for h in self._hooks if h.id != hook_id]
            return len(self._hooks) != before

    def _at(self, resource: str, event: str) -> list[_Hook]:
        with self._lock:
            return [h for h in self._hooks if h.resource == resource and h.event == event]

    def _run(
        self,
        resource: str,
        event: str,
        ctx: HookContext,
        data: Callable[[], dict[str, Any]],
        apply: Apply | None,
    ) -> None:
        """Every hook at ``resource.event``: in-process ones, then the project's webhooks.

        ``data()`` is the point's data as it stands (before_add chains, so it changes as
        hooks answer); ``apply`` takes a hook's answer data (``None``: no change) and
        returns what happened, or raises when the answer breaks the point's rules;
        ``None`` means answers are ignored.
        """
        for hook in self._at(resource, event):
            self._call(hook, ctx, data(), apply)
        if self.remote is None:
            return
        for webhook in ctx.webhooks:
            if webhook.resource != resource or webhook.event != event:
                continue
            body = payload(webhook.id, webhook.name, webhook.mode, resource, event, ctx, data())
            if webhook.mode == "async":
                self.remote.queue(webhook, ctx, body)
            else:
                self.remote.deliver(webhook, ctx, body, apply)

    def _call(
        self, hook: _Hook, ctx: HookContext, data: dict[str, Any], apply: Apply | None
    ) -> None:
        started = time.perf_counter()
        try:
            answer = hook.fn(
                payload(hook.id, hook.name, "sync", hook.resource, hook.event, ctx, data)
            )
            outcome = _answer_data(answer)
            result = "delivered (answers are ignored)" if apply is None else apply(outcome)
        except Exception as exc:
            self._log(hook, False, _reason(exc), (time.perf_counter() - started) * 1000)
            return
        self._log(hook, True, result, (time.perf_counter() - started) * 1000)

    def _log(self, hook: _Hook, ok: bool, reason: str, latency: float) -> None:
        self.deliveries.append(
            Delivery(hook.id, hook.name, hook.resource, hook.event, ok, reason, latency)
        )
        if not ok:
            log.warning("hook %s (%s.%s) skipped: %s", hook.name, hook.resource, hook.event, reason)

    def before_llm(self, resource: str, ctx: HookContext, data: dict[str, Any]) -> str:
        """Instructions to append to the user prompt (empty string if none)."""
        parts: list[str] = []

        def apply(answer: dict[str, Any] | None) -> str:
            instruction = None if answer is None else answer.get("instruction")
            if instruction is not None and not isinstance(instruction, str):
                raise ValueError("data.instruction is not a string")
            if instruction and instruction.strip():
                parts.append(instruction.strip()[:4000])
                return "instruction"
            return "no change"

        self._run(resource, "before_llm", ctx, lambda: data, apply)
        return "\n".join(parts)

    def after_llm(self, resource: str, ctx: HookContext, data: dict[str, Any]) -> None:
        self._run(resource, "after_llm", ctx, lambda: data, None)

    def before_add(
        self,
        resource: str,
        ctx: HookContext,
        items: Sequence[dict[str, Any]],
        validate: Callable[[list[Any]], list[Any]],
        extra: dict[str, Any] | None = None,
    ) -> list[dict[str, Any]] | None:
        """The items to store after every hook had its say, or ``None`` if none changed them.

        ``validate`` applies the engine's own rules to a hook's replacement list and raises
        ``ValueError`` (or ``ValidationError``) when it breaks them; the next hook receives
        the replacement as that hook sent it.
        """
        key = ITEMS_KEY[resource]
        current = list(items)
        changed = False

        def apply(answer: dict[str, Any] | None) -> str:
            nonlocal current, changed
            if answer is None or key not in answer:
                return "no change"
            replacement = answer[key]
            if not isinstance(replacement, list):
                raise ValueError(f"data.{key} is not a list")
            try:
                validate(replacement)  # raises if it breaks the engine's rules
            except Exception as exc:
                raise ValueError(f"failed validation: {exc}") from None
            current, changed = replacement, True
            return f"{len(current)} {key}"

        self._run(resource, "before_add", ctx, lambda: {key: current, **(extra or {})}, apply)
        return current if changed else None


def _answer_data(answer: Any) -> dict[str, Any] | None:
    """The ``data`` of an in-process hook's answer (``None``: no change)."""
    if answer is None:
        return None
    if not isinstance(answer, dict):
        raise ValueError(f"answer is {type(answer).__name__}, not an object")
    if answer.get("data") is None:
        return None  # an answer without data means "no change"
    if not isinstance(answer["data"], dict):
        raise ValueError("answer.data is not an object")
    return answer["data"]


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
