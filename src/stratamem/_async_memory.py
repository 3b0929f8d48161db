"""``AsyncMemory``: every face and method of ``Memory``, with its signature, as coroutines.

SQLite and the local model block, so each call runs the sync face's method in a worker
thread (``asyncio.to_thread``) and the event loop stays free. The mirror is made, not
written: :func:`in_thread` turns a sync method into the coroutine method with the same
signature, for ``inspect``, ``help()`` and type checkers alike. Only what returns
something else than the sync face (sessions, ``for_project``) is written out.
``tests/test_api.py`` checks the mirror against ``Memory``.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, TypeVar

from ._dashboard import Users
from ._dashboard_sessions import DashboardSessions
from ._items import Facts, Item, Row, Summaries
from ._messages import Messages
from ._projects import ApiKeys, Projects
from ._recall_log import RecallLog
from ._topics import Topics
from ._webhooks import Webhooks
from .memory import Memory
from .store import FactRow, SummaryRow
from .types import AsyncSession, Fact, Summary

if TYPE_CHECKING:
    from .api import SessionsAPI
    from .capture import Attribution, Capture
    from .config import Settings
    from .embed import Embedder
    from .hooks import Hooks
    from .store import Store

__all__ = ["AsyncMemory", "in_thread"]

P = ParamSpec("P")
R = TypeVar("R")


def in_thread(
    method: Callable[Concatenate[Any, P], R],
) -> Callable[Concatenate[Any, P], Coroutine[Any, Any, R]]:
    """``method`` of a sync face as a coroutine method of its asyncio face, which holds
    the sync face (embedded, or a RemoteMemory's) in ``_sync``: the same signature, the
    same call, run in a worker thread."""
    name = method.__name__

    @functools.wraps(method)
    async def call(self: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return await asyncio.to_thread(getattr(self._sync, name), *args, **kwargs)

    return call


def _arguments_of(
    opener: Callable[P, Any],
) -> Callable[[Callable[..., None]], Callable[Concatenate[Any, P], None]]:
    """For an ``__init__`` that passes its arguments on to the class ``opener``: the
    parameters of ``opener``'s own ``__init__``, for type checkers, ``inspect`` and
    ``help()`` alike."""

    def take(init: Callable[..., None]) -> Callable[Concatenate[Any, P], None]:
        return functools.wraps(opener.__init__)(init)

    return take


class _Face:
    def __init__(self, sync: Any) -> None:
        self._sync = sync  # the sync face: Memory's, or a RemoteMemory's


class AsyncSessions:
    """``AsyncMemory.sessions``: sessions come back as :class:`~stratamem.types.AsyncSession`,
    bound to the AsyncMemory."""

    def __init__(self, sessions: SessionsAPI, owner: AsyncMemory) -> None:
        self._sync = sessions
        self._owner = owner

    async def create(
        self,
        user_id: str,
        *,
        title: str | None = None,
        metadata: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> AsyncSession:
        s = await asyncio.to_thread(
            self._sync.create, user_id, title=title, metadata=metadata, session_id=session_id
        )
        return AsyncSession(s, self._owner)

    async def get(self, session_id: str) -> AsyncSession:
        return AsyncSession(await asyncio.to_thread(self._sync.get, session_id), self._owner)

    async def list(
        self, *, user_id: str | None = None, limit: int = 100, offset: int = 0
    ) -> list[AsyncSession]:
        rows = await asyncio.to_thread(self._sync.list, user_id=user_id, limit=limit, offset=offset)
        return [AsyncSession(s, self._owner) for s in rows]


class AsyncMessages(_Face):
    """``AsyncMemory.messages``: ``Memory.messages`` as coroutines."""

    get = in_thread(Messages.get)
    list = in_thread(Messages.list)


class _AsyncItems(_Face, Generic[Item, Row]):
    # Generic as the sync face is, so a check of the mirror's types reads ``list[Item]``
    # with the face's own item type.
    pass


class AsyncFacts(_AsyncItems[Fact, FactRow]):
    """``AsyncMemory.facts``: ``Memory.facts`` as coroutines."""

    list = in_thread(Facts.list)
    get = in_thread(Facts.get)


class AsyncSummaries(_AsyncItems[Summary, SummaryRow]):
    """``AsyncMemory.summaries``: ``Memory.summaries`` as coroutines."""

    list = in_thread(Summaries.list)
    get = in_thread(Summaries.get)
    history = in_thread(Summaries.history)


class AsyncTopics(_Face):
    """``AsyncMemory.topics``: ``Memory.topics`` as coroutines (``merge`` only over an
    embedded Memory, as synchronously)."""

    list = in_thread(Topics.list)
    get = in_thread(Topics.get)
    merge = in_thread(Topics.merge)


class AsyncWebhooks(_Face):
    """``AsyncMemory.webhooks``: ``Memory.webhooks`` as coroutines (``wait`` only over an
    embedded Memory, as synchronously)."""

    create = in_thread(Webhooks.create)
    list = in_thread(Webhooks.list)
    get = in_thread(Webhooks.get)
    update = in_thread(Webhooks.update)
    enable = in_thread(Webhooks.enable)
    disable = in_thread(Webhooks.disable)
    delete = in_thread(Webhooks.delete)
    rotate_secret = in_thread(Webhooks.rotate_secret)
    deliveries = in_thread(Webhooks.deliveries)
    wait = in_thread(Webhooks.wait)


class AsyncProjects(_Face):
    """``AsyncMemory.projects``: ``Memory.projects`` as coroutines."""

    create = in_thread(Projects.create)
    get = in_thread(Projects.get)
    list = in_thread(Projects.list)


class AsyncApiKeys(_Face):
    """``AsyncMemory.keys``: ``Memory.keys`` as coroutines."""

    create = in_thread(ApiKeys.create)
    list = in_thread(ApiKeys.list)
    revoke = in_thread(ApiKeys.revoke)
    verify = in_thread(ApiKeys.verify)


class AsyncUsers(_Face):
    """``AsyncMemory.users``: ``Memory.users`` as coroutines (embedded only)."""

    count = in_thread(Users.count)
    list = in_thread(Users.list)
    standing = in_thread(Users.standing)


class AsyncDashboardSessions(_Face):
    """``AsyncMemory.dashboard_sessions``: ``Memory.dashboard_sessions`` as coroutines
    (embedded only)."""

    create = in_thread(DashboardSessions.create)
    get = in_thread(DashboardSessions.get)
    set_project = in_thread(DashboardSessions.set_project)
    delete = in_thread(DashboardSessions.delete)
    prune = in_thread(DashboardSessions.prune)


class AsyncRecallLog(_Face):
    """``AsyncMemory.recall_log``: the embedded Memory's recall log."""

    _sync: RecallLog
    record = in_thread(RecallLog.record)
    list = in_thread(RecallLog.list)
    latency = in_thread(RecallLog.latency)

    @property
    def enabled(self) -> bool:
        return self._sync.enabled


class AsyncMemory:
    """``Memory`` for asyncio code: the same faces and methods, as coroutines.

    It takes ``Memory``'s arguments and opens one (``sync``); with an ``http(s)://`` URL
    that is a :class:`~stratamem.client.RemoteMemory`, whose methods it runs the same way.
    ``llm``, ``scope``, ``hooks`` and ``for_project`` are not I/O and stay plain calls.
    """

    @_arguments_of(Memory)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._attach(Memory(*args, **kwargs))

    def _attach(self, sync: Memory) -> None:
        self.sync = self._sync = sync  # _sync: where in_thread finds the sync methods
        self.sessions = AsyncSessions(sync.sessions, self)
        self.messages = AsyncMessages(sync.messages)
        self.facts = AsyncFacts(sync.facts)
        self.summaries = AsyncSummaries(sync.summaries)
        self.topics = AsyncTopics(sync.topics)
        self.webhooks = AsyncWebhooks(sync.webhooks)
        # A RemoteMemory has no projects or keys: the server's operator manages those.
        if hasattr(sync, "projects"):
            self.projects = AsyncProjects(sync.projects)
            self.keys = AsyncApiKeys(sync.keys)
            self.recall_log = AsyncRecallLog(sync.recall_log)
        # Nor what the dashboard reads: it runs beside the engine.
        if hasattr(sync, "users"):
            self.users = AsyncUsers(sync.users)
            self.dashboard_sessions = AsyncDashboardSessions(sync.dashboard_sessions)

    # -- what is no I/O ----------------------------------------------------------------

    @property
    def project_id(self) -> str:
        return self.sync.project_id

    @property
    def settings(self) -> Settings:
        return self.sync.settings

    @property
    def llm(self) -> Capture:
        """``mem.llm``: register sync or async LLM clients (see docs/capture.md)."""
        return self.sync.llm

    @property
    def hooks(self) -> Hooks:
        """In-process pipeline hooks; they run in the worker threads, so they stay sync."""
        return self.sync.hooks

    @property
    def mode(self) -> str:
        return self.sync.mode

    @property
    def store(self) -> Store:
        return self.sync.store

    @property
    def embedder(self) -> Embedder:
        return self.sync.embedder

    def scope(
        self,
        user_id: str | None = None,
        session_id: str | None = None,
        process_id: str | None = None,
    ) -> AbstractContextManager[Attribution]:
        """The same context-variable scope as ``Memory.scope``; safe across asyncio tasks."""
        return self.sync.scope(user_id=user_id, session_id=session_id, process_id=process_id)

    def for_project(self, project_id: str) -> AsyncMemory:
        """``Memory.for_project`` as an AsyncMemory: the same engine, another project."""
        return _AsyncProjectView(self.sync.for_project(project_id))

    # -- I/O ---------------------------------------------------------------------------

    add_messages = in_thread(Memory.add_messages)
    wait = in_thread(Memory.wait)
    retry_failed = in_thread(Memory.retry_failed)
    reindex = in_thread(Memory.reindex)
    get_memory = in_thread(Memory.get_memory)
    search = in_thread(Memory.search)
    stats = in_thread(Memory.stats)
    usage = in_thread(Memory.usage)
    provenance = in_thread(Memory.provenance)
    activity = in_thread(Memory.activity)
    set_status = in_thread(Memory.set_status)
    forget = in_thread(Memory.forget)
    erase_user = in_thread(Memory.erase_user)
    export_user = in_thread(Memory.export_user)
    audit = in_thread(Memory.audit)
    processing_status = in_thread(Memory.processing_status)
    close = in_thread(Memory.close)

    async def __aenter__(self) -> AsyncMemory:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class _AsyncProjectView(AsyncMemory):
    """``AsyncMemory.for_project``: over a sync view, whose ``close()`` does nothing."""

    def __init__(self, sync: Memory) -> None:
        self._attach(sync)
