"""``Memory``: the facade over an engine and a project; ``AsyncMemory`` is its asyncio face.

A ``Memory`` opens an :class:`~stratamem._engine.Engine` (store, models, pipeline, recall,
queue, webhooks) from its settings and acts in one project through faces that each get what
they need of the engine: ``sessions``, ``messages``, ``facts``, ``summaries``, ``topics``,
``webhooks``, ``projects``, ``keys``, ``llm`` (capture), ``recall_log``, and governance;
for the dashboard ``users``, ``provenance``, ``activity`` and ``dashboard_sessions``.
``for_project`` is another facade over the same engine.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import weakref
from collections.abc import Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, Literal

from . import _tracing
from ._checks import check_id as _check_id
from ._dashboard import Users
from ._dashboard import activity as _activity
from ._dashboard import provenance as _provenance
from ._dashboard_sessions import DashboardSessions
from ._engine import Engine
from ._governance import Governance
from ._ingest import add_captured, add_messages
from ._items import Facts, Summaries
from ._messages import Messages
from ._projects import ApiKeys, Projects
from ._queries import ContextQuery, SearchQuery, arguments
from ._recall_log import RecallLog
from ._sessions import Sessions
from ._topics import Topics
from ._usage import usage as _usage
from ._webhooks import Webhooks
from .capture import Attribution, Capture
from .capture import scope as capture_scope
from .config import Settings, load_settings
from .embed import Embedder
from .errors import ConfigError, NotFoundError
from .llm import ChatModel
from .recall import search_options
from .store import SearchFilters, Store, parse_metadata_filters
from .types import (
    ActivityBucket,
    AddResult,
    AuditRecord,
    Hit,
    MemoryContext,
    MessageInput,
    ProcessingStatus,
    Provenance,
    RecallConfig,
    Summary,
    Usage,
)

__all__ = ["Memory"]  # and AsyncMemory, through __getattr__ below

log = logging.getLogger("stratamem")


def _close_at_exit(ref: weakref.ReferenceType[Memory]) -> None:
    memory = ref()
    if memory is not None:
        memory.close()


class Memory:
    """Long-term memory for an application, embedded in this process.

    ``Memory()`` opens ``./stratamem.db`` with the local embedder; every argument can also
    come from a ``STRATAMEM_*`` environment variable (arguments win). Background worker
    threads process accepted messages; ``close()`` (or leaving a ``with`` block, or process
    exit) lets them finish what this process queued, within ``close_timeout_seconds``.

    With an ``http(s)://`` URL (argument, ``settings`` or ``STRATAMEM_DATABASE_URL``) it is
    a :class:`~stratamem.client.RemoteMemory`: the same interface over a stratamem server.
    """

    def __new__(
        cls,
        database_url: str | None = None,
        *,
        api_key: str | None = None,
        settings: Settings | None = None,
        **options: Any,
    ) -> Any:
        if cls is Memory:  # not for_project's views, which are Memories over an engine
            url = database_url or (
                settings.database_url if settings else os.environ.get("STRATAMEM_DATABASE_URL")
            )
            if url and url.lower().startswith(("http://", "https://")):
                from .client import RemoteMemory

                return RemoteMemory(url, api_key=api_key, settings=settings, **options)
        return super().__new__(cls)

    def __init__(
        self,
        database_url: str | None = None,
        *,
        api_key: str | None = None,
        project_id: str | None = None,
        embedder: str | Embedder | None = None,
        llm: str | ChatModel | None = None,
        workers: int | None = None,
        settings: Settings | None = None,
        embedder_mismatch: Literal["error", "reindex"] = "error",
        **options: Any,
    ) -> None:
        if not (llm is None or isinstance(llm, str) or callable(getattr(llm, "complete", None))):
            raise ConfigError(
                "llm must be a spec string ('none', 'openai:<model>', 'anthropic:<model>') "
                f"or a ChatModel (with id, name and complete(...)); got {llm!r:.60}"
            )
        if settings is None:
            settings = load_settings(
                database_url=database_url,
                project_id=project_id,
                embedder=embedder if isinstance(embedder, str) else None,
                llm=llm if isinstance(llm, str) else None,
                workers=workers,
                **options,
            )
        if api_key is not None and not settings.database_url.lower().startswith("http"):
            log.debug("api_key is used only with a remote server URL; ignored")
        project = _check_id(settings.project_id, "project_id")
        engine = Engine(
            settings,
            embedder=None if isinstance(embedder, str) else embedder,
            chat=None if isinstance(llm, str) else llm,
            embedder_mismatch=embedder_mismatch,
        )
        self._attach(engine, project)
        self._atexit = functools.partial(_close_at_exit, weakref.ref(self))
        atexit.register(self._atexit)
        log.info(
            "stratamem ready: store=%s embedder=%s llm=%s workers=%d (%s queue) project=%s",
            engine.store.url,
            engine.embedder.name,
            engine.mode,
            settings.workers,
            engine.queue.name,
            project,
        )

    def _attach(self, engine: Engine, project_id: str) -> None:
        self._engine = engine
        self.settings = settings = engine.settings
        self.project_id = project_id
        self.hooks = engine.hooks
        self._store = store = engine.store
        self._recaller = engine.recaller
        self.sessions = Sessions(
            store, project_id, owner=self, max_metadata_bytes=settings.max_metadata_bytes
        )
        self.messages = Messages(store, project_id)
        self.facts = Facts(store, project_id)
        self.summaries = Summaries(store, project_id)
        self.topics = Topics(store, project_id)
        self.webhooks = Webhooks(
            store,
            project_id,
            delivery=engine.webhook_engine,
            check_open=engine.check_open,
            default_timeout_ms=settings.webhook_timeout_ms,
        )
        self.projects = Projects(store)
        self.keys = ApiKeys(store, self.projects)
        self.users = Users(store, project_id)
        self.dashboard_sessions = DashboardSessions(store)
        self._governance = Governance(
            store,
            project_id,
            check_open=engine.check_open,
            sessions=self.sessions,
            summaries=self.summaries,
        )
        self.recall_log = RecallLog(
            store, project_id, recorder=engine.recall_log, check_open=engine.check_open
        )
        self.llm = Capture(
            self,
            await_model=engine.await_warm_up,
            before_store=engine.foreground.pause,
            store_exchange=self._add_captured,
            recall_log=self.recall_log if self.recall_log.enabled else None,
        )

    # -- housekeeping ------------------------------------------------------------------

    @property
    def mode(self) -> str:
        """Which write path is active, as the startup log states it."""
        return self._engine.mode

    @property
    def store(self) -> Store:
        return self._engine.store

    @property
    def embedder(self) -> Embedder:
        return self._engine.embedder

    def _check_open(self) -> None:
        self._engine.check_open()

    def for_project(self, project_id: str) -> Memory:
        """This Memory acting in another project: same store, models and workers.

        The server uses one view per request's project. A view's ``close()`` does nothing;
        closing the Memory it came from closes every view.
        """
        self._check_open()
        return _ProjectView(engine=self._engine, project_id=project_id, opener=self)

    def close(self, timeout: float | None = None) -> None:
        """Finish this process's queued work (bounded by ``timeout``), then release files.

        Work not finished in time stays queued in the database; the next Memory or
        ``stratamem worker`` on this store processes it.
        """
        # Exchanges captured from LLM calls become messages first, while the Memory is
        # still open for the capture writer; then their jobs finish, in what time is left.
        self._engine.close(timeout, drain=self.llm.close)
        atexit.unregister(self._atexit)

    def scope(
        self,
        user_id: str | None = None,
        session_id: str | None = None,
        process_id: str | None = None,
    ) -> AbstractContextManager[Attribution]:
        """Attribute the LLM calls of registered clients made inside the block (see
        ``mem.llm``). A context variable: concurrent threads and asyncio tasks never mix."""
        return capture_scope(user_id=user_id, session_id=session_id, process_id=process_id)

    def __enter__(self) -> Memory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- write -------------------------------------------------------------------------

    def add_messages(
        self,
        session_id: str,
        messages: Sequence[MessageInput | dict[str, Any]],
        *,
        sync: bool = False,
    ) -> AddResult:
        """Store messages durably and queue their processing, in one transaction.

        Returns as soon as they are committed (``sync=False``) or once they are processed
        (``sync=True``). Resending a message with the same ``id`` and content is a no-op.
        """
        self._check_open()
        count = len(messages) if isinstance(messages, Sequence) else None
        with _tracing.memory_span(
            "create_memory", self.project_id, session_id=session_id, count=count
        ) as span:
            result = add_messages(self._engine, self.project_id, session_id, messages, sync=sync)
            if span.is_recording():
                if len(result.message_ids) == 1:
                    span.set_attribute(_tracing.RECORD_ID, result.message_ids[0])
                if self.settings.trace_content:
                    span.set_attribute(_tracing.RECORDS, _message_records(result, messages))
        return result

    def _add_captured(
        self, user_id: str, session_id: str, messages: list[dict[str, Any]], began_at: float
    ) -> bool:
        """Capture's writer: store an exchange that began at ``began_at`` (epoch seconds)
        into ``user_id``'s session, creating it, unless the user was erased since (by any
        process); whether it was stored."""
        self._check_open()
        with _tracing.memory_span(
            "create_memory", self.project_id, session_id=session_id, count=len(messages)
        ):
            stored = add_captured(
                self._engine, self.project_id, user_id, session_id, messages, began_at=began_at
            )
        return stored is not None

    def wait(self, timeout: float | None = None) -> None:
        """Block until no work is queued or running in this store (scripts, tests).

        Without worker threads (``workers=0``) the work is done in the calling thread.
        Raises ``ProcessingError`` if ``timeout`` seconds pass first.
        """
        self._check_open()
        self._engine.wait(timeout)

    def retry_failed(self, user_id: str | None = None) -> int:
        """Queue messages whose processing failed for good again; returns jobs requeued."""
        self._check_open()
        if user_id is not None:
            _check_id(user_id, "user_id")
        count = self._store.retry_failed(self.project_id, user_id)
        if count:
            self._engine.queue.notify()
        return count

    def reindex(self, *, batch_size: int = 256, progress: Any = None) -> int:
        """Re-embed every processed message, fact and summary with the configured embedder.

        Use after changing the embedder; vectors of the previous embedder are removed.
        Returns the number of items embedded. ``progress(n)`` is called per batch.
        """
        self._check_open()
        return self._engine.reindex(batch_size=batch_size, progress=progress)

    # -- read --------------------------------------------------------------------------

    def get_memory(
        self,
        session_id: str,
        query: str | None = None,
        *,
        details: bool = False,
        recall_config: RecallConfig | dict[str, Any] | None = None,
        metadata_filters: dict[str, Any] | None = None,
        exclude_texts: Sequence[str] = (),
    ) -> MemoryContext:
        """What to put before the next model call in this session.

        ``exclude_texts`` are texts the prompt already carries (the request's own turns,
        say): a message whose content equals one of them, leading and trailing whitespace
        aside, is left out of the block, the matches and the history, and the slot of a
        match left out goes to the next memory (see docs/api.md#recall).
        """
        self._check_open()
        q = ContextQuery.build(
            arguments(locals()), what="get_memory", max_chars=self.settings.max_content_chars
        )
        config = q.recall_config or RecallConfig()
        if "token_budget" not in config.model_fields_set:
            config = config.model_copy(update={"token_budget": self.settings.token_budget})
        session = self._store.get_session(self.project_id, q.session_id)
        if session is None:
            raise NotFoundError(f"no session {q.session_id!r}")
        filters = SearchFilters(metadata=parse_metadata_filters(q.metadata_filters))
        with self._recall_span("context", session.user_id, q.query, session.id) as span:
            ctx = self._recaller.context(
                project_id=self.project_id,
                session=session,
                query=q.query,
                config=config,
                filters=filters,
                details=q.details,
                exclude_texts=q.exclude_texts,
            )
            if span.is_recording():
                span.set_attribute(_tracing.RECORD_COUNT, len(ctx.matches or ()))
                span.set_attribute("stratamem.context.tokens", ctx.token_estimate)
                if self.settings.trace_content and ctx.formatted_context:
                    records = [{"content": ctx.formatted_context}]
                    span.set_attribute(_tracing.RECORDS, _tracing.memory_records(records))
        return ctx

    def _recall_span(
        self, operation: str, user_id: str, query: str | None, session_id: str | None = None
    ) -> AbstractContextManager[_tracing.Span]:
        """The ``search_memory`` span of a search or a context (``stratamem.recall``
        says which); the query on it when ``trace_content`` allows."""
        return _tracing.memory_span(
            "search_memory",
            self.project_id,
            user_id=user_id,
            session_id=session_id,
            attributes={
                "stratamem.recall": operation,
                _tracing.QUERY_TEXT: query if self.settings.trace_content else None,
            },
        )

    def search(
        self,
        query: str,
        *,
        user_id: str,
        limit: int = 10,
        filters: dict[str, Any] | None = None,
        session_id: str | None = None,
        since: datetime | str | None = None,
        until: datetime | str | None = None,
        roles: Sequence[str] | None = None,
        event_types: Sequence[str] | None = None,
        as_of: datetime | str | None = None,
        layers: Sequence[str] | None = None,
        include_superseded: bool | None = None,
        recall_config: RecallConfig | dict[str, Any] | None = None,
    ) -> list[Hit]:
        """Ranked memories of ``user_id`` for ``query``, each traceable to its messages.

        Hits of every layer (summaries, facts, messages; ``layers`` narrows) are ranked on
        one scale, each with the ids of the messages it came from. ``filters`` are metadata
        filters (see docs/api.md); the keyword filters narrow by session, time window
        (``since`` inclusive, ``until`` exclusive), role and event type, and apply to
        messages only. ``as_of`` is when the question is asked (default: now): periods
        such as "last spring" are resolved against it. Superseded facts and summaries are
        left out unless ``include_superseded`` (default: the recall_config's, off);
        ``recall_config`` sets the router, rerank and fusion (see docs/recall.md).
        """
        self._check_open()
        q = SearchQuery.build(
            arguments(locals()), what="search", max_chars=self.settings.max_content_chars
        )
        scope = SearchFilters(
            session_id=q.session_id,
            roles=tuple(q.roles or ()),
            event_types=tuple(q.event_types or ()),
            since=q.since,
            until=q.until,
            metadata=parse_metadata_filters(q.filters, "filters"),
        )
        options = search_options(
            q.recall_config or RecallConfig(),
            as_of=q.as_of,
            layers=tuple(q.layers) if q.layers else None,
            include_superseded=q.include_superseded,
        )
        with self._recall_span("search", q.user_id, q.query, q.session_id) as span:
            hits = self._recaller.search(
                self.project_id,
                q.user_id,
                q.query,
                limit=q.limit,
                filters=scope,
                options=options,
                standing=True,
            )
            if span.is_recording():
                span.set_attribute(_tracing.RECORD_COUNT, len(hits))
                if self.settings.trace_content:
                    records = [{"id": h.id, "content": h.text, "score": h.score} for h in hits]
                    span.set_attribute(_tracing.RECORDS, _tracing.memory_records(records))
        return hits

    # -- governance ----------------------------------------------------------------------

    def set_status(
        self, summary_id: str, status: str, *, reason: str, actor: str | None = None
    ) -> Summary:
        """Move a summary to ``active``, ``deprioritized``, ``archived`` or ``deleted``.

        The change is a new version in the summary's history and an audit record, both
        with ``reason`` and ``actor``. Recall skips archived and deleted summaries and
        down-weights deprioritized ones.
        """
        with _tracing.memory_span(
            "update_memory",
            self.project_id,
            record_id=summary_id,
            count=1,
            attributes={"stratamem.summary.status": status if isinstance(status, str) else None},
        ):
            return self._governance.set_status(summary_id, status, reason=reason, actor=actor)

    def forget(
        self,
        *,
        user_id: str,
        message_ids: Sequence[str] | None = None,
        session_id: str | None = None,
        topic_id: str | None = None,
        reason: str | None = None,
        actor: str | None = None,
    ) -> dict[str, int]:
        """Delete some of a user's memory, working from provenance upward.

        Give exactly one scope: ``message_ids``, a ``session_id`` (the session goes too) or
        a ``topic_id`` (the messages its summaries came from). Every fact citing a removed
        message, every summary citing a removed fact or message, and every topic left
        empty are removed with it, from rows, full-text indexes and vectors, and so are all
        of the user's recall log records. Returns counts by layer; an audit record keeps
        who, when, why and those counts.
        """
        one = message_ids[0] if message_ids is not None and len(message_ids) == 1 else None
        with _tracing.memory_span(
            "delete_memory",
            self.project_id,
            user_id=user_id,
            session_id=session_id,
            record_id=one if isinstance(one, str) else topic_id,
        ) as span:
            self._store_recall_log()
            removed = self._governance.forget(
                user_id=user_id,
                message_ids=message_ids,
                session_id=session_id,
                topic_id=topic_id,
                reason=reason,
                actor=actor,
            )
            span.set_attribute(_tracing.RECORD_COUNT, _removed(removed))
        return removed

    def erase_user(
        self, user_id: str, *, reason: str | None = None, actor: str | None = None
    ) -> dict[str, int]:
        """Remove everything held about ``user_id``: sessions, messages, facts, summaries
        with their history, topics, vectors, index entries, queued jobs and recall log
        records. The audit record of the erasure (who, when, counts) is all that remains.
        ``NotFoundError`` if nothing is held about the user."""
        # No record id: every record of the user (the conventions' "delete all").
        with _tracing.memory_span("delete_memory", self.project_id, user_id=user_id) as span:
            self._store_recall_log()
            removed = self._governance.erase_user(user_id, reason=reason, actor=actor)
            span.set_attribute(_tracing.RECORD_COUNT, _removed(removed))
        return removed

    def _store_recall_log(self) -> None:
        # Records still in this process's buffer would be written after the deletion and
        # outlive it: they go to the store first, so the deletion takes them too.
        if self._engine.recall_log is not None:
            self._engine.recall_log.flush()

    def export_user(self, user_id: str) -> dict[str, Any]:
        """A user's whole memory as JSON-ready data: sessions, messages, facts, summaries
        (with history), topics and the audit records about them."""
        return self._governance.export_user(user_id)

    def audit(
        self,
        *,
        user_id: str | None = None,
        limit: int = 100,
        offset: int = 0,
        newest_first: bool = False,
    ) -> list[AuditRecord]:
        """Status changes, forgets and erasures in this project, oldest first (or newest
        first: the dashboard's order)."""
        return self._governance.audit(
            user_id=user_id, limit=limit, offset=offset, newest_first=newest_first
        )

    def processing_status(self, session_id: str) -> ProcessingStatus:
        """How far a session's messages are through the write pipeline."""
        return self._governance.processing_status(session_id)

    def stats(self) -> dict[str, Any]:
        self._check_open()
        data = self._store.stats(self.project_id)
        data["embedder_configured"] = self._engine.embedder.name
        return data

    def usage(self, *, days: int = 30) -> Usage:
        """What memory cost this project over the last ``days`` UTC days (1-366, today
        included): the pipeline's model calls and tokens per day and per model, the
        messages processed each day and the tokens per processed message, and their cost
        where the ``llm_prices`` setting prices the model."""
        self._check_open()
        return _usage(self._store, self.project_id, self.settings.llm_prices, days=days)

    # -- what the dashboard reads (embedded only, like stats) -----------------------------

    def provenance(self, item_id: str) -> Provenance:
        """The message, fact, summary or topic ``item_id`` of this project with what it is
        linked to, both ways: down to the messages it came from, up to the summaries and
        topics built on it (see ``types.Provenance``). Superseded, deprioritized and
        archived items are included, deleted ones never; ``NotFoundError`` if there is no
        such item."""
        self._check_open()
        return _provenance(self._store, self.project_id, item_id)

    def activity(self, *, hours: int = 48, bucket_minutes: int = 60) -> list[ActivityBucket]:
        """This project's messages accepted, processed and failed for good per
        ``bucket_minutes`` over the last ``hours``: every bucket (zeros included), oldest
        first, the last one holding now."""
        self._check_open()
        return _activity(self._store, self.project_id, hours=hours, bucket_minutes=bucket_minutes)


def _removed(counts: dict[str, int]) -> int:
    """How many memory records a forget or an erasure removed (its counts by layer)."""
    return sum(n for layer, n in counts.items() if layer in _RECORD_LAYERS)


_RECORD_LAYERS = ("messages", "facts", "summaries", "topics")


def _message_records(result: AddResult, messages: Sequence[Any]) -> str:
    """``gen_ai.memory.records`` of messages added (``trace_content`` only)."""
    contents = [m.content if isinstance(m, MessageInput) else m.get("content") for m in messages]
    records = [
        {"id": mid, "content": content}
        for mid, content in zip(result.message_ids, contents, strict=False)
    ]
    return _tracing.memory_records(records)


class _ProjectView(Memory):
    """``Memory.for_project``: a Memory over another Memory's engine, in ``project_id``.

    The engine is its opener's: closing the view does nothing, and closing the opener
    closes the view too (its calls then raise ``ProcessingError``). The view keeps its
    opener alive, so that interpreter exit still closes the engine under it."""

    def __init__(self, *, engine: Engine, project_id: str, opener: Memory) -> None:
        self._attach(engine, _check_id(project_id, "project_id"))
        self._opener = opener

    def close(self, timeout: float | None = None) -> None:
        """Nothing: the Memory this view came from closes the engine."""


def __getattr__(name: str) -> Any:
    # The asyncio face builds on Memory; it stays importable from here, as it always was.
    if name == "AsyncMemory":
        from ._async_memory import AsyncMemory

        return AsyncMemory
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
