"""``Memory`` / ``AsyncMemory``: the facade that wires store, embedder, workers and recall."""

from __future__ import annotations

import asyncio
import atexit
import functools
import hashlib
import json
import logging
import os
import threading
import time
import weakref
from collections.abc import Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, Literal

from pydantic import ValidationError as PydanticValidationError

from ._checks import check_id as _check_id
from ._checks import check_paging as _check_paging
from ._checks import check_storable, check_text, new_id
from ._foreground import Foreground
from ._governance import (
    SETTABLE_STATUSES,
    ApiKeys,
    Projects,
    audit_records,
    check_reason,
    export_user,
    item_filters,
    processing_status,
)
from ._queries import (
    ContextQuery,
    FactQuery,
    ForgetScope,
    ListQuery,
    MessageQuery,
    SearchQuery,
    SummaryQuery,
    arguments,
)
from ._strings import UNICODE_RULE, value_problem
from ._time import now_iso, to_iso, utcnow
from ._webhooks import AsyncWebhooks, Webhooks
from .capture import Attribution, Capture
from .capture import scope as capture_scope
from .config import Settings, load_settings
from .embed import Embedder, make_embedder
from .errors import (
    ConfigError,
    ConflictError,
    EmbedderMismatchError,
    EmbeddingError,
    NotFoundError,
    ProcessingError,
    ValidationError,
)
from .hooks import Hooks
from .hooks._engine import WebhookEngine
from .jobs import FINISHED, JobQueue, job_states, open_queue, paused_because
from .llm import ChatModel, make_chat_model
from .pipeline import Pipeline, embedding_text
from .recall import Recaller, parse_ts, search_options
from .recall._rows import fact_from_row, message_from_row, summary_from_row, topic_from_row
from .store import (
    MessageRow,
    SearchFilters,
    SessionRow,
    Store,
    open_store,
    parse_metadata_filters,
)
from .types import (
    ROLES,
    AddResult,
    AuditRecord,
    Fact,
    Hit,
    MemoryContext,
    Message,
    MessageInput,
    ProcessingStatus,
    RecallConfig,
    Session,
    Summary,
    Topic,
)

__all__ = ["AsyncMemory", "Memory"]

log = logging.getLogger("memstrata")


def _pydantic_problems(exc: PydanticValidationError, prefix: str) -> list[str]:
    problems = []
    for err in exc.errors():
        loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"])
        msg = err["msg"]
        if err["type"] == "literal_error" and err["loc"][-1:] == ("role",):
            msg = f"must be one of {', '.join(repr(r) for r in ROLES)}"
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        if err["type"] == "string_unicode":  # pydantic-core's own refusal of a lone surrogate
            msg = UNICODE_RULE
        given = err.get("input")
        shown = "" if err["type"] in ("missing", "extra_forbidden") else f" (got {given!r:.60})"
        problems.append(f"{prefix}{loc}: {msg}{shown}")
    return problems


def _content_hash(session_id: str, m: MessageInput) -> str:
    fields = [session_id, m.role, m.content, m.event_type, m.page]
    if m.name is not None:  # appended only when set, so hashes of unnamed messages stay stable
        fields.append(m.name)
    key = json.dumps(fields, ensure_ascii=False)
    return hashlib.sha256(key.encode()).hexdigest()


def _session_from_row(row: SessionRow, memory: Memory | None) -> Session:
    session = Session(
        id=row.id,
        project_id=row.project_id,
        user_id=row.user_id,
        title=row.title,
        metadata=row.metadata,
        created_at=parse_ts(row.created_at),  # type: ignore[arg-type]
        updated_at=parse_ts(row.updated_at),  # type: ignore[arg-type]
    )
    session._memory = memory
    return session


class Sessions:
    """``mem.sessions``: create and look up conversation threads."""

    def __init__(self, memory: Memory) -> None:
        self._m = memory

    def create(
        self,
        user_id: str,
        *,
        title: str | None = None,
        metadata: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        """Create a session (or return it if ``session_id`` exists for the same user)."""
        m = self._m
        _check_id(user_id, "user_id")
        sid = new_id("s") if session_id is None else _check_id(session_id, "session_id")
        if title is not None:
            if not isinstance(title, str) or len(title) > 500:
                problem = "title: expected a string of at most 500"
                raise ValidationError("invalid session", [problem])
            check_storable(title, "title")
        meta = m._check_metadata(metadata, "metadata")
        now = now_iso()
        row, created = m._store.create_session(
            SessionRow(m.project_id, sid, user_id, title, meta, now, now)
        )
        if not created and row.user_id != user_id:
            raise ConflictError(
                f"session {sid!r} already exists for another user; session ids are unique "
                "within a project"
            )
        return _session_from_row(row, m)

    def get(self, session_id: str) -> Session:
        row = self._m._store.get_session(self._m.project_id, _check_id(session_id, "session_id"))
        if row is None:
            raise NotFoundError(f"no session {session_id!r}")
        return _session_from_row(row, self._m)

    def list(
        self, *, user_id: str | None = None, limit: int = 100, offset: int = 0
    ) -> list[Session]:
        q = ListQuery.build(arguments(locals()), what="sessions.list")
        rows = self._m._store.list_sessions(self._m.project_id, q.user_id, q.limit, q.offset)
        return [_session_from_row(r, self._m) for r in rows]


class Messages:
    """``mem.messages``: stored messages with their processing status."""

    def __init__(self, memory: Memory) -> None:
        self._m = memory

    def get(self, message_id: str) -> Message:
        row = self._m._store.get_message(self._m.project_id, _check_id(message_id, "message_id"))
        if row is None:
            raise NotFoundError(f"no message {message_id!r}")
        return message_from_row(row)

    def list(
        self,
        *,
        user_id: str | None = None,
        session_id: str | None = None,
        status: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[Message]:
        q = MessageQuery.build(arguments(locals()), what="messages.list")
        rows = self._m._store.list_messages(
            self._m.project_id,
            user_id=q.user_id,
            session_id=q.session_id,
            status=q.status,
            limit=q.limit,
            offset=q.offset,
        )
        return [message_from_row(r) for r in rows]


class _ReindexLog:
    def __init__(self) -> None:
        self.done = 0

    def __call__(self, n: int) -> None:
        self.done += n
        log.info("re-embedded %d messages", self.done)


class Facts:
    """``mem.facts``: the facts extracted from a user's messages, with provenance."""

    def __init__(self, memory: Memory) -> None:
        self._m = memory

    def list(
        self,
        *,
        user_id: str | None = None,
        status: str | Sequence[str] | None = None,
        since: datetime | str | None = None,
        until: datetime | str | None = None,
        metadata_filters: dict[str, Any] | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[Fact]:
        """Facts in extraction order. ``since``/``until`` bound when a fact happened (or
        was observed); ``metadata_filters`` match the metadata of its source messages."""
        q = FactQuery.build(arguments(locals()), what="facts.list")
        rows = self._m._store.list_facts(
            self._m.project_id, q.user_id, limit=q.limit, offset=q.offset, filters=item_filters(q)
        )
        return [fact_from_row(r) for r in rows]

    def get(self, fact_id: str) -> Fact:
        rows = self._m._store.get_facts(self._m.project_id, [_check_id(fact_id, "fact_id")])
        if not rows:
            raise NotFoundError(f"no fact {fact_id!r}")
        return fact_from_row(rows[0])


class Summaries:
    """``mem.summaries``: long-term memory, with status, evidence and version history."""

    def __init__(self, memory: Memory) -> None:
        self._m = memory

    def list(
        self,
        *,
        user_id: str | None = None,
        status: str | Sequence[str] | None = None,
        since: datetime | str | None = None,
        until: datetime | str | None = None,
        metadata_filters: dict[str, Any] | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[Summary]:
        """Summaries in creation order. ``since``/``until`` bound when a summary became
        valid (or was observed); ``metadata_filters`` match its source messages' metadata."""
        q = SummaryQuery.build(arguments(locals()), what="summaries.list")
        filters = item_filters(q)
        rows = self._m._store.list_summaries(
            self._m.project_id,
            q.user_id,
            status=filters.status,
            limit=q.limit,
            offset=q.offset,
            filters=filters,
        )
        return [summary_from_row(r) for r in rows]

    def get(self, summary_id: str) -> Summary:
        rows = self._m._store.get_summaries(
            self._m.project_id, [_check_id(summary_id, "summary_id")]
        )
        if not rows:
            raise NotFoundError(f"no summary {summary_id!r}")
        return summary_from_row(rows[0])

    def history(self, summary_id: str) -> list[dict[str, Any]]:
        """Every version of a summary: text, status, confidence, evidence, reason, when."""
        self.get(summary_id)
        return self._m._store.summary_history(self._m.project_id, summary_id)


class Topics:
    """``mem.topics``: the entry points that group a user's summaries."""

    def __init__(self, memory: Memory) -> None:
        self._m = memory

    def list(self, *, user_id: str) -> list[Topic]:
        _check_id(user_id, "user_id")
        return [topic_from_row(t) for t in self._m._store.list_topics(self._m.project_id, user_id)]

    def get(self, topic_id: str) -> Topic:
        row = self._m._store.get_topic(self._m.project_id, _check_id(topic_id, "topic_id"))
        if row is None:
            raise NotFoundError(f"no topic {topic_id!r}")
        return topic_from_row(row)

    def merge(self, source_id: str, into: str, *, user_id: str) -> int:
        """Move every summary of topic ``source_id`` under topic ``into`` and retire the
        source (kept with status ``merged`` and a link to ``into``). Returns summaries moved.
        """
        _check_id(user_id, "user_id")
        try:
            return self._m._store.merge_topics(
                self._m.project_id,
                user_id,
                _check_id(source_id, "source_id"),
                _check_id(into, "into"),
            )
        except KeyError as exc:
            raise NotFoundError(
                f"no active topic {exc.args[0]!r} for user {user_id!r} (or the same topic twice)"
            ) from None


def _close_at_exit(ref: weakref.ReferenceType[Memory]) -> None:
    memory = ref()
    if memory is not None:
        memory.close()


class Memory:
    """Long-term memory for an application, embedded in this process.

    ``Memory()`` opens ``./memstrata.db`` with the local embedder; every argument can also
    come from a ``MEMSTRATA_*`` environment variable (arguments win). Background worker
    threads process accepted messages; ``close()`` (or leaving a ``with`` block, or process
    exit) lets them finish what this process queued, within ``close_timeout_seconds``.

    With an ``http(s)://`` URL (argument, ``settings`` or ``MEMSTRATA_DATABASE_URL``) it is
    a :class:`~memstrata.client.RemoteMemory`: the same interface over a memstrata server.
    """

    def __new__(
        cls,
        database_url: str | None = None,
        *,
        api_key: str | None = None,
        settings: Settings | None = None,
        **options: Any,
    ) -> Any:
        url = database_url or (
            settings.database_url if settings else os.environ.get("MEMSTRATA_DATABASE_URL")
        )
        if cls is Memory and url and url.lower().startswith(("http://", "https://")):
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
        workers: int | None = None,
        settings: Settings | None = None,
        embedder_mismatch: Literal["error", "reindex"] = "error",
        **options: Any,
    ) -> None:
        if settings is None:
            settings = load_settings(
                database_url=database_url,
                project_id=project_id,
                embedder=embedder if isinstance(embedder, str) else None,
                workers=workers,
                **options,
            )
        self.settings = settings
        if api_key is not None and not settings.database_url.lower().startswith("http"):
            log.debug("api_key is used only with a remote server URL; ignored")
        self.project_id = _check_id(settings.project_id, "project_id")
        self._closed = False
        self._closing = False  # close() has begun; public methods work until _closed
        self._root = self
        self._lock = threading.Lock()
        self._warmup: threading.Thread | None = None
        self._store: Store = open_store(
            settings.database_url,
            busy_timeout_ms=settings.sqlite_busy_timeout_ms,
            vector_index_threshold=settings.vector_index_threshold,
            pool_size=settings.postgres_pool_size,
            ef_search=settings.postgres_ef_search,
        )
        try:
            self._embedder: Embedder = (
                embedder
                if embedder is not None and not isinstance(embedder, str)
                else make_embedder(
                    settings.embedder,
                    base_url=settings.embedder_base_url,
                    api_key=settings.embedder_api_key,
                    threads=settings.embedder_threads,
                    model_path=settings.local_model_path,
                    batch_nice=settings.worker_nice,
                )
            )
            if embedder_mismatch not in ("error", "reindex"):
                raise ConfigError("embedder_mismatch must be 'error' or 'reindex'")
            if embedder_mismatch == "error":
                self._check_embedder()
            elif self._store.get_meta("embedder") not in (None, self._embedder.id):
                log.warning("re-embedding %s with %s", self._store.url, self._embedder.id)
                self.reindex(progress=_ReindexLog())
            self._llm: ChatModel | None = make_chat_model(
                settings.llm,
                base_url=settings.llm_base_url,
                api_key=settings.llm_api_key,
                timeout=settings.llm_timeout_seconds,
                max_retries=settings.llm_max_retries,
            )
        except BaseException:
            self._store.close()
            raise
        self.hooks = Hooks()
        # Recalls go first: the pipeline waits for them at its safe points (bounded).
        self._foreground = Foreground()
        self._pipeline = Pipeline(
            self._store,
            self._embedder,
            self._llm,
            self.hooks,
            extract_chunk=settings.extract_chunk_messages,
            consolidate_chunk=settings.consolidate_chunk_facts,
            foreground=self._foreground,
        )
        self._recaller = Recaller(
            self._store, self._embedder, chat=self._llm, foreground=self._foreground
        )
        try:
            self._pool: JobQueue = open_queue(
                self._store,
                self._pipeline,
                database_url=settings.database_url,
                threads=settings.workers,
                lease_seconds=settings.job_lease_seconds,
                max_attempts=settings.job_max_attempts,
                backoff_seconds=settings.job_backoff_seconds,
                backoff_max_seconds=settings.job_backoff_max_seconds,
                outage_backoff_seconds=settings.outage_backoff_seconds,
                outage_backoff_max_seconds=settings.outage_backoff_max_seconds,
                batch_max_messages=settings.batch_max_messages,
                nice=settings.worker_nice,
            )
        except BaseException:
            self._store.close()
            raise
        self._my_jobs: set[int] = set()
        self._prune_at = 1024
        self.projects = Projects(self)
        self.keys = ApiKeys(self)
        self.hooks.remote = self._webhook_engine = WebhookEngine(self._store, settings)
        self._bind_faces()
        self._pool.start()
        self._webhook_engine.start()
        self._warm_up()
        self._atexit = functools.partial(_close_at_exit, weakref.ref(self))
        atexit.register(self._atexit)
        log.info(
            "memstrata ready: store=%s embedder=%s llm=%s workers=%d (%s queue) project=%s",
            self._store.url,
            self._embedder.name,
            self.mode,
            settings.workers,
            self._pool.name,
            self.project_id,
        )

    # -- housekeeping ------------------------------------------------------------------

    @property
    def mode(self) -> str:
        """Which write path is active, as the startup log states it."""
        if self._llm is None:
            return (
                "none (offline heuristics: sentence-level facts, similarity-grouped "
                "summaries, keyword topics)"
            )
        return self._llm.name

    @property
    def store(self) -> Store:
        return self._store

    @property
    def embedder(self) -> Embedder:
        return self._embedder

    def _warm_up(self) -> None:
        # Loading the local model takes ~0.5 s: do it now, off the caller's thread, so the
        # first search or batch does not pay for it.
        load = getattr(self._embedder, "load", None)
        if callable(load):

            def run() -> None:
                try:
                    load()
                except Exception as exc:  # the first real use reports it properly
                    log.warning("could not load the embedder in the background: %s", exc)

            self._warmup = threading.Thread(target=run, name="memstrata-warmup", daemon=True)
            self._warmup.start()

    def _await_warm_up(self, timeout: float | None = None) -> None:
        """Wait (at most ``timeout`` seconds) until the background model load is done."""
        if self._warmup is not None:
            self._warmup.join(timeout)

    def _check_embedder(self) -> None:
        stored = self._store.get_meta("embedder")
        if stored is None:
            return
        try:
            current = self._embedder.id
        except EmbeddingError as exc:
            log.warning("could not verify the embedder against the store yet: %s", exc)
            return
        if stored in getattr(self._embedder, "replaces", ()):
            raise EmbedderMismatchError(
                f"{self._store.url} holds vectors made by {stored!r}, an earlier version of "
                f"the bundled model, which this memstrata replaced with {current!r}. "
                "Re-embed the store once: `memstrata reindex`, or open it with "
                "Memory(..., embedder_mismatch='reindex')."
            )
        if stored != current:
            raise EmbedderMismatchError(
                f"{self._store.url} holds vectors made by {stored!r} but the configured "
                f"embedder is {current!r}. Open it with the original embedder "
                f"(MEMSTRATA_EMBEDDER), or re-embed everything with `memstrata reindex` "
                "(Memory.reindex())."
            )

    def _check_open(self) -> None:
        if self._root._closed:
            raise ProcessingError("this Memory is closed")

    def _check_metadata(self, metadata: Any, where: str) -> dict[str, Any]:
        if metadata is None:
            return {}
        if not isinstance(metadata, dict):
            raise ValidationError("invalid metadata", [f"{where}: expected an object"])
        try:
            # allow_nan=False: NaN and Infinity are not JSON (PostgreSQL's JSONB refuses them).
            dumped = json.dumps(metadata, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValidationError("invalid metadata", [f"{where}: not JSON ({exc})"]) from None
        # NUL and lone surrogates (see _strings) in any key or value: refused on every store.
        found = value_problem(metadata, dumped)
        if found is not None:
            raise ValidationError("invalid metadata", [f"{where}{found[0]}: {found[1]}"])
        size = len(dumped.encode())
        if size > self.settings.max_metadata_bytes:
            raise ValidationError(
                "invalid metadata",
                [f"{where}: {size} bytes of JSON; the limit is {self.settings.max_metadata_bytes}"],
            )
        return metadata

    def for_project(self, project_id: str) -> Memory:
        """This Memory acting in another project: same store, models and workers.

        The server uses one view per request's project. A view's ``close()`` does nothing;
        closing the Memory it came from closes every view.
        """
        self._check_open()
        view = object.__new__(Memory)
        view.__dict__.update(self.__dict__)
        view.project_id = _check_id(project_id, "project_id")
        view._bind_faces()
        return view

    def _bind_faces(self) -> None:
        self.sessions = Sessions(self)
        self.messages = Messages(self)
        self.facts = Facts(self)
        self.summaries = Summaries(self)
        self.topics = Topics(self)
        self.llm = Capture(self)
        self.webhooks = Webhooks(self)

    def close(self, timeout: float | None = None) -> None:
        """Finish this process's queued work (bounded by ``timeout``), then release files.

        Work not finished in time stays queued in the database; the next Memory or
        ``memstrata worker`` on this store processes it.
        """
        if self._root is not self:
            return
        with self._lock:
            if self._closing:
                return
            self._closing = True
        timeout = self.settings.close_timeout_seconds if timeout is None else timeout
        deadline = time.monotonic() + timeout
        # Exchanges captured from LLM calls become messages first, while the Memory is
        # still open for the capture writer; then their jobs finish, in what time is left.
        self.llm.close(timeout)
        with self._lock:
            self._closed = True
        if self._pool.running and self._my_jobs:
            paused = paused_because(self._store)
            if paused:
                # Waiting would only run the clock out: nothing is processed before the
                # outage ends, and the jobs stay queued for the next worker on this store.
                log.warning(
                    "closing without waiting for queued work (%s); it stays in %s",
                    paused,
                    self._store.url,
                )
            else:
                try:
                    left = max(0.0, deadline - time.monotonic())
                    self._pool.wait_jobs(sorted(self._my_jobs), left)
                except ProcessingError:
                    log.warning("closing with work still queued; it stays in %s", self._store.url)
                except Exception:
                    log.exception("error while finishing queued work at close")
        self._pool.stop(timeout=max(1.0, timeout))
        self._webhook_engine.close(timeout=max(1.0, timeout))
        self._recaller.close()
        # Native code (onnxruntime) must not be mid-load when the interpreter exits: that
        # aborts the process ("terminate called without an active exception").
        self._await_warm_up()
        self._store.close()
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

    def _validate_messages(self, session_id: str, messages: Any) -> list[tuple[MessageInput, str]]:
        if isinstance(messages, (str, bytes, dict)) or not isinstance(messages, Sequence):
            raise ValidationError(
                "invalid messages", ["messages: expected a list of message objects"]
            )
        if not messages:
            raise ValidationError("invalid messages", ["messages: the list is empty"])
        limit = self.settings.max_messages_per_call
        if len(messages) > limit:
            raise ValidationError(
                "too many messages",
                [f"messages: {len(messages)} in one call; the limit is {limit} (send batches)"],
            )
        problems: list[str] = []
        parsed: list[MessageInput] = []
        for i, raw in enumerate(messages):
            try:
                m = raw if isinstance(raw, MessageInput) else MessageInput.model_validate(raw)
            except PydanticValidationError as exc:
                problems.extend(_pydantic_problems(exc, f"messages[{i}]"))
                continue
            if len(m.content) > self.settings.max_content_chars:
                problems.append(
                    f"messages[{i}].content: {len(m.content)} characters; the limit is "
                    f"{self.settings.max_content_chars}"
                )
            try:
                self._check_metadata(m.metadata, f"messages[{i}].metadata")
            except ValidationError as exc:
                problems.extend(exc.problems)
            parsed.append(m)
        seen: dict[str, int] = {}
        for i, m in enumerate(parsed):
            if m.id is not None:
                if m.id in seen:
                    problems.append(f"messages[{i}].id: {m.id!r} repeats messages[{seen[m.id]}]")
                seen.setdefault(m.id, i)
        if problems:
            raise ValidationError("invalid messages; nothing was stored", problems)
        return [(m, _content_hash(session_id, m)) for m in parsed]

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
        _check_id(session_id, "session_id")
        validated = self._validate_messages(session_id, messages)
        session = self._store.get_session(self.project_id, session_id)
        if session is None:
            raise NotFoundError(f"no session {session_id!r}; create it with mem.sessions.create")
        now = utcnow()
        created = to_iso(now)
        rows = [
            MessageRow(
                project_id=self.project_id,
                id=m.id or new_id("m"),
                user_id=session.user_id,
                session_id=session.id,
                role=m.role,
                content=m.content,
                content_hash=digest,
                ts=to_iso(m.timestamp or now),
                created_at=created,
                process_id=m.process_id,
                event_type=m.event_type,
                page=m.page,
                name=m.name,
                metadata=m.metadata,
            )
            for m, digest in validated
        ]
        outcome = self._store.add_messages(self.project_id, session, rows)
        result = AddResult(
            session_id=session.id,
            message_ids=outcome.message_ids,
            duplicates=outcome.duplicates,
            job_id=outcome.job_id,
        )
        if outcome.job_id is not None:
            self._track_job(outcome.job_id)
            self._pool.notify()
        if sync:
            self._wait_processed(result)
        return result

    def _wait_processed(self, result: AddResult) -> None:
        ids = [] if result.job_id is None else [result.job_id]
        # Duplicates may still be in flight from the first send: wait for those too.
        if result.duplicates:
            for mid in result.duplicates:
                row = self._store.get_message(self.project_id, mid)
                if row is not None and row.job_id is not None:
                    ids.append(row.job_id)
        states = self._pool.wait_jobs(ids, self.settings.sync_timeout_seconds)
        self._forget_jobs(ids)
        failed = [j for j, s in states.items() if s == "failed"]
        if failed:
            errors = [
                m.error
                for m in self._store.list_messages(
                    self.project_id,
                    session_id=result.session_id,
                    status="failed",
                    limit=5,
                    newest_first=True,
                )
                if m.error
            ]
            raise ProcessingError(
                f"processing failed for good after {self.settings.job_max_attempts} attempts "
                f"({errors[0] if errors else 'see message errors'}); the messages are "
                "stored with status 'failed' and can be retried with Memory.retry_failed()"
            )
        result.processed = True

    def _track_job(self, job_id: int) -> None:
        # close() waits for the jobs this process queued. Finished ones are dropped now and
        # then; the next prune waits until the set has doubled, so a backlog that cannot be
        # pruned yet costs each call O(1) amortised, not a query over every tracked job.
        with self._lock:
            self._my_jobs.add(job_id)
            prune = len(self._my_jobs) >= self._prune_at
            ids = sorted(self._my_jobs) if prune else []
        if prune:
            states = job_states(self._store, ids)
            self._forget_jobs([j for j in ids if states[j] in FINISHED])
            with self._lock:
                self._prune_at = max(1024, 2 * len(self._my_jobs))

    def _forget_jobs(self, ids: Sequence[int]) -> None:
        with self._lock:
            self._my_jobs.difference_update(ids)

    def wait(self, timeout: float | None = None) -> None:
        """Block until no work is queued or running in this store (scripts, tests).

        Without worker threads (``workers=0``) the work is done in the calling thread.
        Raises ``ProcessingError`` if ``timeout`` seconds pass first.
        """
        self._check_open()
        self._pool.wait_until(
            lambda: self._store.unfinished_jobs() == 0, timeout, what="queued work"
        )
        with self._lock:
            self._my_jobs.clear()

    def retry_failed(self, user_id: str | None = None) -> int:
        """Queue messages whose processing failed for good again; returns jobs requeued."""
        self._check_open()
        count = self._store.retry_failed(self.project_id, user_id)
        if count:
            self._pool.notify()
        return count

    def reindex(self, *, batch_size: int = 256, progress: Any = None) -> int:
        """Re-embed every processed message, fact and summary with the configured embedder.

        Use after changing the embedder; vectors of the previous embedder are removed.
        Returns the number of items embedded. ``progress(n)`` is called per batch.
        """
        self._check_open()
        embedder_id = self._embedder.id
        self._store.drop_vectors_except(embedder_id)
        done, after = 0, 0
        while rows := self._store.messages_missing_vectors(embedder_id, after, batch_size):
            vectors = self._embedder.embed([embedding_text(r) for r in rows])
            self._store.put_message_vectors(embedder_id, rows, vectors)
            after = rows[-1].pk or after
            done += len(rows)
            if progress is not None:
                progress(len(rows))
        for kind in ("fact", "summary"):
            after = 0
            while items := self._store.layer_items_missing_vectors(
                embedder_id, kind, after, batch_size
            ):
                vectors = self._embedder.embed([text for _, _, _, text in items])
                self._store.put_layer_vectors(embedder_id, kind, items, vectors)
                after = items[-1][0]
                done += len(items)
                if progress is not None:
                    progress(len(items))
        return done

    # -- read --------------------------------------------------------------------------

    def get_memory(
        self,
        session_id: str,
        query: str | None = None,
        *,
        details: bool = False,
        recall_config: RecallConfig | dict[str, Any] | None = None,
        metadata_filters: dict[str, Any] | None = None,
    ) -> MemoryContext:
        """What to put before the next model call in this session."""
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
        return self._recaller.context(
            project_id=self.project_id,
            session=session,
            query=q.query,
            config=config,
            filters=filters,
            details=q.details,
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
        filters = SearchFilters(
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
        return self._recaller.search(
            self.project_id, q.user_id, q.query, limit=q.limit, filters=filters, options=options
        )

    # -- governance ----------------------------------------------------------------------

    def set_status(
        self, summary_id: str, status: str, *, reason: str, actor: str | None = None
    ) -> Summary:
        """Move a summary to ``active``, ``deprioritized``, ``archived`` or ``deleted``.

        The change is a new version in the summary's history and an audit record, both
        with ``reason`` and ``actor``. Recall skips archived and deleted summaries and
        down-weights deprioritized ones.
        """
        self._check_open()
        _check_id(summary_id, "summary_id")
        if status not in SETTABLE_STATUSES:
            raise ValidationError(
                "invalid status", [f"status: expected one of {', '.join(SETTABLE_STATUSES)}"]
            )
        reason = check_reason(reason, required=True) or ""
        if not self._store.set_summary_status(
            self.project_id, summary_id, status, reason, self._actor(actor)
        ):
            raise NotFoundError(f"no summary {summary_id!r}")
        return self.summaries.get(summary_id)

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
        empty are removed with it, from rows, full-text indexes and vectors. Returns counts
        by layer; an audit record keeps who, when, why and those counts.
        """
        self._check_open()
        scope = {
            "user_id": user_id,
            "message_ids": message_ids,
            "session_id": session_id,
            "topic_id": topic_id,
            "reason": reason,
        }
        q = ForgetScope.build(scope, what="forget")
        counts = self._store.forget(
            self.project_id,
            q.user_id,
            message_ids=q.message_ids or [],
            session_id=q.session_id,
            topic_id=q.topic_id,
            actor=self._actor(actor),
            reason=q.reason,
        )
        if counts is None:
            what = (
                f"session {q.session_id!r}"
                if q.session_id is not None
                else f"topic {q.topic_id!r}"
                if q.topic_id is not None
                else "messages"
            )
            raise NotFoundError(f"no {what} of user {q.user_id!r}")
        return counts

    def erase_user(
        self, user_id: str, *, reason: str | None = None, actor: str | None = None
    ) -> dict[str, int]:
        """Remove everything held about ``user_id``: sessions, messages, facts, summaries
        with their history, topics, vectors, index entries and queued jobs. The audit
        record of the erasure (who, when, counts) is all that remains. ``NotFoundError``
        if nothing is held about the user."""
        self._check_open()
        _check_id(user_id, "user_id")
        counts = self._store.erase_user(
            self.project_id,
            user_id,
            actor=self._actor(actor),
            reason=check_reason(reason, required=False),
        )
        if not any(counts.values()):
            raise NotFoundError(f"no user {user_id!r}")
        return counts

    def export_user(self, user_id: str) -> dict[str, Any]:
        """A user's whole memory as JSON-ready data: sessions, messages, facts, summaries
        (with history), topics and the audit records about them."""
        self._check_open()
        return export_user(self, _check_id(user_id, "user_id"))

    def audit(
        self, *, user_id: str | None = None, limit: int = 100, offset: int = 0
    ) -> list[AuditRecord]:
        """Status changes, forgets and erasures in this project, oldest first."""
        self._check_open()
        _check_paging(limit, offset)
        if user_id is not None:
            _check_id(user_id, "user_id")
        return audit_records(self, user_id, limit, offset)

    def processing_status(self, session_id: str) -> ProcessingStatus:
        """How far a session's messages are through the write pipeline."""
        self._check_open()
        self.sessions.get(session_id)
        return processing_status(self, session_id)

    @staticmethod
    def _actor(actor: str | None) -> str:
        if actor is None:
            return "local"
        return check_text(actor, "actor")

    def stats(self) -> dict[str, Any]:
        self._check_open()
        data = self._store.stats(self.project_id)
        data["embedder_configured"] = self._embedder.name
        return data


class AsyncSession:
    """The asyncio face of :class:`~memstrata.types.Session`."""

    def __init__(self, session: Session, owner: AsyncMemory) -> None:
        self.data = session
        self._owner = owner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.data, name)

    async def add_messages(
        self, messages: Sequence[MessageInput | dict[str, Any]], *, sync: bool = False
    ) -> AddResult:
        return await self._owner.add_messages(self.data.id, messages, sync=sync)

    async def get_memory(self, query: str | None = None, **kwargs: Any) -> MemoryContext:
        return await self._owner.get_memory(self.data.id, query, **kwargs)


class _AsyncSessions:
    def __init__(self, owner: AsyncMemory) -> None:
        self._owner = owner

    async def create(self, user_id: str, **kwargs: Any) -> AsyncSession:
        s = await asyncio.to_thread(self._owner.sync.sessions.create, user_id, **kwargs)
        return AsyncSession(s, self._owner)

    async def get(self, session_id: str) -> AsyncSession:
        s = await asyncio.to_thread(self._owner.sync.sessions.get, session_id)
        return AsyncSession(s, self._owner)

    async def list(self, **kwargs: Any) -> list[AsyncSession]:
        rows = await asyncio.to_thread(self._owner.sync.sessions.list, **kwargs)
        return [AsyncSession(s, self._owner) for s in rows]


class _AsyncMessages:
    def __init__(self, owner: AsyncMemory) -> None:
        self._owner = owner

    async def get(self, message_id: str) -> Message:
        return await asyncio.to_thread(self._owner.sync.messages.get, message_id)

    async def list(self, **kwargs: Any) -> list[Message]:
        return await asyncio.to_thread(self._owner.sync.messages.list, **kwargs)


class AsyncMemory:
    """``Memory`` for asyncio code: the same methods as coroutines.

    SQLite and the local model are blocking, so each call runs in a worker thread and the
    event loop stays free; the engine underneath is the same ``Memory``.
    """

    def __init__(self, database_url: str | None = None, **kwargs: Any) -> None:
        self.sync = Memory(database_url, **kwargs)
        self.sessions = _AsyncSessions(self)
        self.messages = _AsyncMessages(self)
        self.webhooks = AsyncWebhooks(self.sync.webhooks)

    @property
    def project_id(self) -> str:
        return self.sync.project_id

    @property
    def llm(self) -> Capture:
        """``mem.llm``: register sync or async LLM clients (see docs/capture.md)."""
        return self.sync.llm

    def scope(
        self,
        user_id: str | None = None,
        session_id: str | None = None,
        process_id: str | None = None,
    ) -> AbstractContextManager[Attribution]:
        """The same context-variable scope as ``Memory.scope``; safe across asyncio tasks."""
        return self.sync.scope(user_id=user_id, session_id=session_id, process_id=process_id)

    async def add_messages(
        self, session_id: str, messages: Any, *, sync: bool = False
    ) -> AddResult:
        return await asyncio.to_thread(self.sync.add_messages, session_id, messages, sync=sync)

    async def get_memory(
        self, session_id: str, query: str | None = None, **kwargs: Any
    ) -> MemoryContext:
        return await asyncio.to_thread(self.sync.get_memory, session_id, query, **kwargs)

    async def search(self, query: str, **kwargs: Any) -> list[Hit]:
        return await asyncio.to_thread(self.sync.search, query, **kwargs)

    async def wait(self, timeout: float | None = None) -> None:
        await asyncio.to_thread(self.sync.wait, timeout)

    async def retry_failed(self, user_id: str | None = None) -> int:
        return await asyncio.to_thread(self.sync.retry_failed, user_id)

    async def stats(self) -> dict[str, Any]:
        return await asyncio.to_thread(self.sync.stats)

    async def set_status(self, summary_id: str, status: str, **kwargs: Any) -> Summary:
        return await asyncio.to_thread(self.sync.set_status, summary_id, status, **kwargs)

    async def forget(self, **kwargs: Any) -> dict[str, int]:
        return await asyncio.to_thread(self.sync.forget, **kwargs)

    async def erase_user(self, user_id: str, **kwargs: Any) -> dict[str, int]:
        return await asyncio.to_thread(self.sync.erase_user, user_id, **kwargs)

    async def export_user(self, user_id: str) -> dict[str, Any]:
        return await asyncio.to_thread(self.sync.export_user, user_id)

    async def audit(self, **kwargs: Any) -> list[AuditRecord]:
        return await asyncio.to_thread(self.sync.audit, **kwargs)

    async def processing_status(self, session_id: str) -> ProcessingStatus:
        return await asyncio.to_thread(self.sync.processing_status, session_id)

    async def close(self, timeout: float | None = None) -> None:
        await asyncio.to_thread(self.sync.close, timeout)

    async def __aenter__(self) -> AsyncMemory:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
