"""Whose memory a proxied request uses: the proxy's one memory (``stratamem proxy``), or,
on ``stratamem serve``, the project that the request's stratamem key names.

On the server the key travels in ``X-Stratamem-Api-Key``: ``Authorization`` carries the
provider's key. A wrong key is refused (401). When the key cannot be checked within the
recall bound (the store is slow or down), the request goes on without memory and the check
goes on off the request path, retried while the store is down: the answered exchange is
stored once it is done (``capture_for`` returns the pending check). A proxy that holds an
upstream key of its own cannot relay first: the stratamem key is what keeps strangers from
spending it, so it waits longer for the check, and refuses (503) when it cannot be made.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from starlette.requests import Request

from ..server._auth import authenticate, throttle_of
from ..server._errors import ApiError
from ..server._throttle import client_address
from ._proxy import KEY_HEADER, Refused

if TYPE_CHECKING:
    from ..capture._capture import Capture
    from ..memory import Memory
    from ._proxy import Pending

__all__ = ["OneMemory", "ProjectMemories"]

log = logging.getLogger("stratamem.proxy")

# How long capture may take to store what it has queued when the proxy stops.
CLOSE_TIMEOUT_SECONDS = 10.0
# The longest a key check may take before a proxy with an upstream key of its own refuses.
STRICT_CHECK_SECONDS = 5.0
# How long a key check that failed (the store down or restarting) is retried, off the
# request path, so that the exchange of a request relayed meanwhile is stored.
RETRY_CHECK_SECONDS = 60.0
_FIRST_RETRY_SECONDS = 0.05
_LAST_RETRY_SECONDS = 1.0


class OneMemory:
    """Every request uses ``memory`` (an embedded Memory or a RemoteMemory); its owner
    closes it, which stores what its capture has queued."""

    def __init__(self, memory: Memory) -> None:
        self._capture: Capture = memory.llm
        from ..memory import Memory

        # A RemoteMemory's project is its key's, on its server: not asked for a log line.
        self.project_id: str | None = memory.project_id if isinstance(memory, Memory) else None

    async def capture_for(self, request: Request) -> Capture | Pending:
        return self._capture

    def warm_up(self) -> None:
        self._capture.warm_up()

    def close(self) -> None:
        self._capture.flush(CLOSE_TIMEOUT_SECONDS)


class ProjectMemories:
    """The memory of the project a request's ``X-Stratamem-Api-Key`` names, one capture per
    project (its writer and recall threads are shared by that project's requests)."""

    project_id: str | None = None  # each request's own, once its key is checked

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

    async def capture_for(self, request: Request) -> Capture | Pending:
        secret = request.headers.get(KEY_HEADER, "").strip()
        if not secret:
            raise Refused(
                401,
                f"send the stratamem project key in {KEY_HEADER} "
                "(Authorization carries the provider's key)",
                kind="authentication_error",
            )
        # Fail-open bounds the wait for the check like recall; a strict proxy refuses when
        # the check cannot be made, so a slow moment gets longer before a caller is refused.
        bound = self._check_timeout()
        if self._strict:
            bound = max(bound, STRICT_CHECK_SECONDS)
        check = asyncio.ensure_future(self._checked(self._memory(), secret, request))
        done, _ = await asyncio.wait({check}, timeout=bound)
        if not done:
            log.warning(
                "stratamem: the proxy could not check a key within %d ms; %s",
                bound * 1000,
                "the request is refused (503)"
                if self._strict
                else "the call goes on without memory, and is stored once the check is done",
            )
            if self._strict:
                check.cancel()
                raise Refused(503, "memory is unavailable; try again", kind="api_error")
            return check
        try:
            return check.result()
        except Refused:  # a wrong key
            raise
        except Exception as exc:  # strict, and the store is down
            log.warning("stratamem: the proxy could not check a key: %s", type(exc).__name__)
            raise Refused(503, "memory is unavailable; try again", kind="api_error") from None

    async def _checked(self, memory: Memory, secret: str, request: Request) -> Capture:
        """The capture of the project ``secret`` names; the check is retried while the store
        fails (for at most RETRY_CHECK_SECONDS, not when strict); a wrong key raises
        :class:`Refused`."""
        deadline = time.monotonic() + RETRY_CHECK_SECONDS
        pause = _FIRST_RETRY_SECONDS
        caller = None
        throttle, address = throttle_of(request), client_address(request)
        while caller is None:
            try:
                caller = await asyncio.to_thread(
                    authenticate, memory, f"Bearer {secret}", throttle=throttle, address=address
                )
            except ApiError as exc:
                limited = exc.status == 429
                raise Refused(
                    exc.status,
                    f"{KEY_HEADER}: {exc.detail}",
                    kind="rate_limit_error" if limited else "authentication_error",
                    headers=exc.headers if limited else None,
                ) from None
            except Exception:  # the store is down: it may be back soon
                if self._strict or time.monotonic() + pause > deadline:
                    raise
                await asyncio.sleep(pause)
                pause = min(pause * 2, _LAST_RETRY_SECONDS)
        request.state.project_id = caller.project_id  # for the access log
        with self._lock:
            capture = self._captures.get(caller.project_id)
            if capture is None:
                capture = self._captures[caller.project_id] = caller.memory.llm
        return capture

    def warm_up(self) -> None:
        # Every project's capture recalls with the one embedder of the server's Memory.
        self._memory().llm.warm_up()

    def close(self) -> None:
        with self._lock:
            captures, self._captures = list(self._captures.values()), {}
        for capture in captures:
            capture.close(CLOSE_TIMEOUT_SECONDS)
