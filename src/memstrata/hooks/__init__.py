"""Pipeline hook points and their semantics (DESIGN §5), independent of transport.

The write path calls :class:`Hooks` at seven points (fact / summary ``before_llm``,
``after_llm``, ``before_add``; topic ``before_add``). Each registered hook receives the
DESIGN §5 payload and answers like a webhook would: ``{"data": {...}}`` or nothing.

- ``before_llm``: ``data.instruction`` strings are appended to the default *user* prompt,
  concatenated in registration order; they never replace the prompt or touch the system
  prompt.
- ``after_llm``: informational; answers are ignored.
- ``before_add``: ``data.observations`` / ``data.propositions`` / ``data.topics`` replace
  the items about to be stored, chained in registration order, and are validated exactly
  like the engine's own output (an answer that fails validation is skipped as a whole).

A hook that raises, times out, or answers with something malformed is skipped, the
delivery is recorded with its reason, and the pipeline continues with the unmodified data.
This module is the in-process implementation; HTTP delivery plugs in as a hook callable.
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
from typing import Any

from ..errors import ValidationError

__all__ = ["HOOK_POINTS", "ITEMS_KEY", "Delivery", "HookContext", "Hooks"]

log = logging.getLogger("memstrata.hooks")

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

HookFn = Callable[[dict[str, Any]], Any]


@dataclass(frozen=True)
class HookContext:
    project_id: str
    user_id: str
    session_ids: tuple[str, ...]
    message_ids: tuple[str, ...]

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


class Hooks:
    """Registered hooks and the semantics of calling them."""

    def __init__(self, *, max_log: int = 1000) -> None:
        self._hooks: list[_Hook] = []
        self._lock = threading.Lock()
        self.deliveries: deque[Delivery] = deque(maxlen=max_log)

    def register(self, resource: str, event: str, fn: HookFn, *, name: str | None = None) -> str:
        """Add ``fn`` at ``resource.event``; hooks at one point run in registration order."""
        if (resource, event) not in HOOK_POINTS:
            points = ", ".join(sorted(f"{r}.{e}" for r, e in HOOK_POINTS))
            raise ValidationError("invalid hook", [f"{resource}.{event}: supported are {points}"])
        if not callable(fn):
            raise ValidationError("invalid hook", ["fn: expected a callable"])
        hook = _Hook(
            f"hook_{secrets.token_hex(6)}",
            name or getattr(fn, "__name__", "hook"),
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

    def _deliver(
        self, hook: _Hook, ctx: HookContext, data: dict[str, Any]
    ) -> tuple[dict[str, Any] | None, float]:
        payload = {
            "hook_id": hook.id,
            "hook_name": hook.name,
            "project_id": ctx.project_id,
            "resource": hook.resource,
            "event": hook.event,
            "mode": "sync",
            "triggered_at": datetime.now(timezone.utc).isoformat(),
            "context": ctx.wire(),
            "data": data,
        }
        started = time.perf_counter()
        answer = hook.fn(payload)
        latency = (time.perf_counter() - started) * 1000
        if answer is None:
            return None, latency
        if not isinstance(answer, dict):
            raise ValueError(f"answer is {type(answer).__name__}, not an object")
        if "data" not in answer or answer["data"] is None:
            return None, latency  # a 2xx without data means "no change"
        if not isinstance(answer["data"], dict):
            raise ValueError("answer.data is not an object")
        return answer["data"], latency

    def _log(self, hook: _Hook, ok: bool, reason: str, latency: float) -> None:
        self.deliveries.append(
            Delivery(hook.id, hook.name, hook.resource, hook.event, ok, reason, latency)
        )
        if not ok:
            log.warning("hook %s (%s.%s) skipped: %s", hook.name, hook.resource, hook.event, reason)

    def before_llm(self, resource: str, ctx: HookContext, data: dict[str, Any]) -> str:
        """Instructions to append to the user prompt (empty string if none)."""
        parts: list[str] = []
        for hook in self._at(resource, "before_llm"):
            try:
                answer, latency = self._deliver(hook, ctx, data)
                instruction = None if answer is None else answer.get("instruction")
                if instruction is not None and not isinstance(instruction, str):
                    raise ValueError("data.instruction is not a string")
            except Exception as exc:
                self._log(hook, False, _reason(exc), 0.0)
                continue
            if instruction and instruction.strip():
                parts.append(instruction.strip()[:4000])
            self._log(hook, True, "instruction" if instruction else "no change", latency)
        return "\n".join(parts)

    def after_llm(self, resource: str, ctx: HookContext, data: dict[str, Any]) -> None:
        for hook in self._at(resource, "after_llm"):
            try:
                _, latency = self._deliver(hook, ctx, data)
            except Exception as exc:
                self._log(hook, False, _reason(exc), 0.0)
                continue
            self._log(hook, True, "delivered (answers are ignored)", latency)

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
        for hook in self._at(resource, "before_add"):
            try:
                answer, latency = self._deliver(hook, ctx, {key: current, **(extra or {})})
                if answer is None or key not in answer:
                    self._log(hook, True, "no change", latency)
                    continue
                replacement = answer[key]
                if not isinstance(replacement, list):
                    raise ValueError(f"data.{key} is not a list")
                validate(replacement)  # raises if it breaks the engine's rules
                current = replacement
                changed = True
            except Exception as exc:
                self._log(hook, False, _reason(exc), 0.0)
                continue
            self._log(hook, True, f"{len(current)} {key}", latency)
        return current if changed else None


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
