"""Whose memory a proxied request uses: the proxy's one memory (``stratamem proxy``), or,
on ``stratamem serve``, the project that the request's stratamem key names.

On the server the key travels in ``X-Stratamem-Api-Key``: ``Authorization`` carries the
provider's key. A wrong key is refused (401). When the key cannot be checked at all (the
store is slow or down), the request goes on without memory, unless the proxy holds an
upstream key of its own: then the stratamem key is what keeps strangers from spending it,
and the request is refused (503).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from starlette.requests import Request

from ..server._auth import authenticate
from ..server._errors import ApiError
from ._proxy import KEY_HEADER, Refused

if TYPE_CHECKING:
    from ..capture._capture import Capture
    from ..memory import Memory

__all__ = ["OneMemory", "ProjectMemories"]

log = logging.getLogger("stratamem.proxy")

# How long capture may take to store what it has queued when the proxy stops.
CLOSE_TIMEOUT_SECONDS = 10.0
# The longest a key check may take before a proxy with an upstream key of its own refuses.
STRICT_CHECK_SECONDS = 5.0


class OneMemory:
    """Every request uses ``memory`` (an embedded Memory or a RemoteMemory); its owner
    closes it, which stores what its capture has queued."""

    def __init__(self, memory: Memory) -> None:
        self._capture: Capture = memory.llm

    async def capture_for(self, request: Request) -> Capture | None:
        return self._capture

    def close(self) -> None:
        self._capture.flush(CLOSE_TIMEOUT_SECONDS)


class ProjectMemories:
    """The memory of the project a request's ``X-Stratamem-Api-Key`` names, one capture per
    project (its writer and recall threads are shared by that project's requests)."""

    def __init__(
        self,
        memory: Callable[[], Memory],
        *,
        check_timeout: Callable[[], float],
        strict: bool,
    ) -> None:
        self._memory = memory
        self._check_timeout = check_timeout
        self._strict = strict
        self._captures: dict[str, Capture] = {}
        self._lock = threading.Lock()

    async def capture_for(self, request: Request) -> Capture | None:
        secret = request.headers.get(KEY_HEADER, "").strip()
        if not secret:
            raise Refused(
                401,
                f"send the stratamem project key in {KEY_HEADER} "
                "(Authorization carries the provider's key)",
                kind="authentication_error",
            )
        memory = self._memory()
        # Fail-open bounds the check like recall; a strict proxy refuses when the check
        # fails, so a slow moment gets longer before a caller is turned away.
        bound = self._check_timeout()
        if self._strict:
            bound = max(bound, STRICT_CHECK_SECONDS)
        try:
            caller = await asyncio.wait_for(
                asyncio.to_thread(authenticate, memory, f"Bearer {secret}"), timeout=bound
            )
        except ApiError as exc:
            raise Refused(
                exc.status, f"{KEY_HEADER}: {exc.detail}", kind="authentication_error"
            ) from None
        except Exception as exc:  # the store is slow or down
            log.warning("stratamem: the proxy could not check a key: %s", type(exc).__name__)
            if self._strict:
                raise Refused(503, "memory is unavailable; try again", kind="api_error") from None
            return None
        with self._lock:
            capture = self._captures.get(caller.project_id)
            if capture is None:
                capture = self._captures[caller.project_id] = caller.memory.llm
        return capture

    def close(self) -> None:
        with self._lock:
            captures, self._captures = list(self._captures.values()), {}
        for capture in captures:
            capture.close(CLOSE_TIMEOUT_SECONDS)
