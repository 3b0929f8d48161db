"""``RemoteMemory``: the ``Memory`` facade over a stratamem server.

``Memory("http://host:8000", api_key=...)`` gives one of these: the same sessions,
messages, recall, search, listings and governance calls as an embedded ``Memory``, the same
public types back, and ``mem.llm`` / ``mem.scope`` so captured LLM calls recall from and
write to the server, and ``mem.webhooks`` for the project's webhooks. What only makes sense
in-process (workers, reindex, in-process hooks, projects and keys) is not here; the server
and ``stratamem`` CLI own those.
"""

from __future__ import annotations

import atexit
import functools
import logging
import weakref
from collections.abc import Mapping
from contextlib import AbstractContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Any

import httpx

from ..config import Settings, load_settings
from ..errors import ConfigError
from ._http import DEFAULT_SYNC_TIMEOUT, Call
from ._sync import MemoryClient, default_base_url

if TYPE_CHECKING:
    from ..capture import Attribution, Capture

__all__ = ["RemoteMemory", "connect"]

log = logging.getLogger("stratamem")


def connect(url: str, *, api_key: str | None = None, **options: Any) -> RemoteMemory:
    """The memory a stratamem server at ``url`` holds: ``RemoteMemory(url, api_key=...)``.

    ``api_key`` defaults to ``STRATAMEM_API_KEY``; ``options`` are ``RemoteMemory``'s (HTTP
    timeouts and retries, ``settings`` or capture settings). The same as
    ``Memory("http://...", api_key=...)``, said explicitly.
    """
    return RemoteMemory(url, api_key=api_key, **options)


def _close_at_exit(ref: weakref.ReferenceType[RemoteMemory]) -> None:
    memory = ref()
    if memory is not None:
        memory.close()


class RemoteMemory(MemoryClient):
    """Long-term memory held by a stratamem server, behind ``Memory``'s interface.

    ``base_url`` is the server (default: an http(s) ``settings.database_url``, then
    ``STRATAMEM_BASE_URL``); ``api_key`` defaults to ``STRATAMEM_API_KEY``. ``settings``
    (or keyword ``options`` for :func:`stratamem.config.load_settings`) configure capture
    (``capture_recall_timeout_ms`` ...) as they do for an embedded Memory; over a network
    the recall wait may need more than the embedded default of 50 ms. The HTTP keywords
    are :class:`MemoryClient`'s. ``close()`` (a ``with`` block, or process exit) first
    stores the captured exchanges still queued.
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        settings: Settings | None = None,
        timeout: float | httpx.Timeout | None = None,
        connect_timeout: float | None = None,
        max_retries: int | None = None,
        sync_timeout: float = DEFAULT_SYNC_TIMEOUT,
        headers: Mapping[str, str] | None = None,
        http_client: httpx.Client | None = None,
        **options: Any,
    ) -> None:
        if base_url is None and settings is not None:
            url = settings.database_url
            base_url = url if url.lower().startswith(("http://", "https://")) else None
        base_url = base_url or default_base_url()
        if settings is None:
            settings = load_settings(database_url=base_url, **options)
        elif options:
            raise ConfigError(f"give settings or options, not both (got {sorted(options)})")
        super().__init__(
            api_key if api_key is not None else getattr(settings, "api_key", None),
            base_url,
            timeout=timeout,
            connect_timeout=connect_timeout,
            max_retries=max_retries,
            sync_timeout=sync_timeout,
            headers=headers,
            http_client=http_client,
        )
        self.settings = settings
        self._closed = False
        # Capture (and through it the recall package) loads only with a RemoteMemory, so
        # `import stratamem.client` stays light for plain MemoryClient users.
        from ..capture import Capture

        self.llm: Capture = Capture(self)
        self._atexit = functools.partial(_close_at_exit, weakref.ref(self))
        atexit.register(self._atexit)

    @property
    def project_id(self) -> str:
        """The project the API key belongs to (asked of the server once)."""
        if self._project_id is None:
            call = Call("GET", "/api/project", lambda data: str(data["project_id"]))
            self._project_id = self._send(call)
        return self._project_id

    def scope(
        self,
        user_id: str | None = None,
        session_id: str | None = None,
        process_id: str | None = None,
    ) -> AbstractContextManager[Attribution]:
        """Attribute the LLM calls of registered clients made inside the block (see
        ``mem.llm``); a context variable, so threads and asyncio tasks never mix."""
        from ..capture import scope

        return scope(user_id=user_id, session_id=session_id, process_id=process_id)

    def close(self, timeout: float | None = None) -> None:
        """Store the captured exchanges still queued (bounded by ``timeout``, default
        ``settings.close_timeout_seconds``), unregister captured clients, close the pool.
        Messages already sent stay on the server, which processes them on its own."""
        if self._closed:
            return
        self._closed = True
        try:
            # Before the pool closes: the capture writer stores through it.
            self.llm.close(self.settings.close_timeout_seconds if timeout is None else timeout)
        except Exception:
            log.exception("error while storing captured exchanges at close")
        super().close()
        atexit.unregister(self._atexit)

    def __enter__(self) -> RemoteMemory:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
