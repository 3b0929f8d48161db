"""The engine: what every ``Memory`` over one store shares, opened and closed in order.

One engine owns the store, the embedder, the chat model, the write pipeline, recall, the
job queue, the webhook engine, the in-process hooks and the foreground gate (recalls go
first). It knows no project: a ``Memory`` is a facade over ``(engine, project_id)``, and
``Memory.for_project`` is another facade over the same engine. Only the facade that opened
the engine closes it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

from . import _metrics
from ._foreground import Foreground
from ._recall_log import RecallRecorder
from .config import Settings
from .embed import Embedder, ObservedEmbedder, make_embedder
from .errors import ConfigError, EmbedderMismatchError, EmbeddingError, ProcessingError
from .hooks import Hooks
from .hooks._engine import WebhookEngine
from .jobs import FINISHED, JobQueue, job_states, open_queue, paused_because
from .llm import ChatModel, make_chat_model
from .pipeline import Pipeline, embedding_text, layer_embedding_text, speaker_names
from .recall import Recaller
from .store import Store, open_store

__all__ = ["Engine"]

log = logging.getLogger("stratamem")


class _ReindexLog:
    def __init__(self) -> None:
        self.done = 0

    def __call__(self, n: int) -> None:
        self.done += n
        log.info("re-embedded %d messages", self.done)


class Engine:
    """Store, models, pipeline, recall, queue and webhooks of one ``settings``.

    ``embedder`` and ``chat`` are instances to use instead of the ones ``settings`` names.
    Raises what opening raises (``ConfigError``, ``StoreError``, ``EmbedderMismatchError``)
    with nothing left open.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        embedder: Embedder | None = None,
        chat: ChatModel | None = None,
        embedder_mismatch: Literal["error", "reindex"] = "error",
    ) -> None:
        self.settings = settings
        self.closed = False
        self._closing = False  # close() has begun; the facades work until ``closed``
        self._lock = threading.Lock()
        self._warmup: threading.Thread | None = None
        self.store: Store = open_store(
            settings.database_url,
            busy_timeout_ms=settings.sqlite_busy_timeout_ms,
            mmap_bytes=settings.sqlite_mmap_bytes,
            vector_index_threshold=settings.vector_index_threshold,
            pool_size=settings.postgres_pool_size,
            ef_search=settings.postgres_ef_search,
        )
        try:
            self.embedder: Embedder = (
                embedder
                if embedder is not None
                else make_embedder(
                    settings.embedder,
                    base_url=settings.embedder_base_url,
                    api_key=settings.embedder_api_key,
                    threads=settings.embedder_threads,
                    model_path=settings.local_model_path,
                    batch_nice=settings.worker_nice,
                )
            )
            # Recall, the pipeline and reindexing embed through this one: spans and
            # metrics of each call.
            self.observed = ObservedEmbedder(self.embedder)
            if embedder_mismatch not in ("error", "reindex"):
                raise ConfigError("embedder_mismatch must be 'error' or 'reindex'")
            if embedder_mismatch == "error":
                self._check_embedder()
            elif self.store.get_meta("embedder") not in (None, self.embedder.id):
                log.warning("re-embedding %s with %s", self.store.url, self.embedder.id)
                self.reindex(progress=_ReindexLog())
            self.chat: ChatModel | None = (
                chat
                if chat is not None
                else make_chat_model(
                    settings.llm,
                    base_url=settings.llm_base_url,
                    api_key=settings.llm_api_key,
                    timeout=settings.llm_timeout_seconds,
                    max_retries=settings.llm_max_retries,
                )
            )
        except BaseException:
            self.store.close()
            raise
        self.hooks = Hooks()
        # Recalls go first: the pipeline waits for them at its safe points (bounded).
        self.foreground = Foreground()
        self.pipeline = Pipeline(
            self.store,
            self.observed,
            self.chat,
            self.hooks,
            extract_chunk=settings.extract_chunk_messages,
            consolidate_chunk=settings.consolidate_chunk_facts,
            foreground=self.foreground,
        )
        self.recaller = Recaller(
            self.store, self.observed, chat=self.chat, foreground=self.foreground
        )
        try:
            self.queue: JobQueue = open_queue(
                self.store,
                self.pipeline,
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
            self.store.close()
            raise
        self._my_jobs: set[int] = set()
        self._prune_at = 1024
        # The recall log's buffer and writer (None: the log is off).
        self.recall_log: RecallRecorder | None = (
            RecallRecorder(
                self.store,
                max_entries=settings.recall_log_max_entries,
                retention_hours=settings.recall_log_retention_hours,
            )
            if settings.recall_log
            else None
        )
        self.hooks.remote = self.webhook_engine = WebhookEngine(self.store, settings)
        self.queue.start()
        self.webhook_engine.start()
        _metrics.watch(self.store.url, self._queue_state)
        if settings.warm_up:
            self._warm_up()

    @property
    def mode(self) -> str:
        """Which write path is active, as the startup log states it."""
        if self.chat is None:
            return (
                "none (offline heuristics: sentence-level facts, similarity-grouped "
                "summaries, keyword topics)"
            )
        return self.chat.name

    def _queue_state(self) -> _metrics.StoreState:
        """What metrics report of this store when they are collected."""
        now = time.time()
        queue = [
            _metrics.QueueSample(q.project_id, q.status, q.jobs, max(now - q.oldest_created_at, 0))
            for q in self.store.queue_state()
        ]
        return _metrics.StoreState(queue, [o.service for o in self.store.outages()])

    def check_open(self) -> None:
        if self.closed:
            raise ProcessingError("this Memory is closed")

    # -- the embedder ------------------------------------------------------------------

    def _warm_up(self) -> None:
        # Loading the local model takes ~0.5 s: do it now, off the caller's thread, so the
        # first search or batch does not pay for it.
        load = getattr(self.embedder, "load", None)
        if callable(load):

            def run() -> None:
                try:
                    load()
                except Exception as exc:  # the first real use reports it properly
                    log.warning("could not load the embedder in the background: %s", exc)

            self._warmup = threading.Thread(target=run, name="stratamem-warmup", daemon=True)
            self._warmup.start()

    def await_warm_up(self, timeout: float | None = None) -> None:
        """Wait (at most ``timeout`` seconds) until the background model load is done."""
        if self._warmup is not None:
            self._warmup.join(timeout)

    def _check_embedder(self) -> None:
        stored = self.store.get_meta("embedder")
        if stored is None:
            return
        try:
            current = self.embedder.id
        except EmbeddingError as exc:
            log.warning("could not verify the embedder against the store yet: %s", exc)
            return
        if stored in getattr(self.embedder, "replaces", ()):
            raise EmbedderMismatchError(
                f"{self.store.url} holds vectors made by {stored!r}, an earlier version of "
                f"the bundled model, which this stratamem replaced with {current!r}. "
                "Re-embed the store once: `stratamem reindex`, or open it with "
                "Memory(..., embedder_mismatch='reindex')."
            )
        if stored != current:
            raise EmbedderMismatchError(
                f"{self.store.url} holds vectors made by {stored!r} but the configured "
                f"embedder is {current!r}. Open it with the original embedder "
                f"(STRATAMEM_EMBEDDER), or re-embed everything with `stratamem reindex` "
                "(Memory.reindex())."
            )

    def reindex(self, *, batch_size: int = 256, progress: Any = None) -> int:
        """Re-embed every processed message, fact and summary (see ``Memory.reindex``)."""
        embedder_id = self.embedder.id
        self.store.drop_vectors_except(embedder_id)
        done, after = 0, 0
        while rows := self.store.messages_missing_vectors(embedder_id, after, batch_size):
            vectors = self.observed.embed([embedding_text(r) for r in rows])
            self.store.put_message_vectors(embedder_id, rows, vectors)
            after = rows[-1].pk or after
            done += len(rows)
            if progress is not None:
                progress(len(rows))
        for kind in ("fact", "summary"):
            after = 0
            while items := self.store.layer_items_missing_vectors(
                embedder_id, kind, after, batch_size
            ):
                vectors = self.observed.embed(self._layer_texts(kind, items))
                self.store.put_layer_vectors(embedder_id, kind, items, vectors)
                after = items[-1][0]
                done += len(items)
                if progress is not None:
                    progress(len(items))
        return done

    def _layer_texts(self, kind: str, items: Sequence[tuple[int, str, str, str]]) -> list[str]:
        """What the pipeline embedded these facts or summaries as: their text with the name
        of their messages' speaker read as "User" (``layer_embedding_text``), so that a
        reindexed store ranks as one processed with the new embedder would."""
        pks = [pk for pk, _, _, _ in items]
        rows = self.store.facts_by_pk(pks) if kind == "fact" else self.store.summaries_by_pk(pks)
        wanted: dict[str, set[str]] = {}
        for row in rows.values():
            wanted.setdefault(row.project_id, set()).update(row.message_ids)
        # Message ids are unique within a project only: one name table per project.
        names = {
            project_id: speaker_names(
                list(self.store.get_messages(project_id, sorted(ids)).values())
            )
            for project_id, ids in wanted.items()
        }
        return [
            layer_embedding_text(
                text, rows[pk].message_ids if pk in rows else [], names.get(project_id, {})
            )
            for pk, project_id, _, text in items
        ]

    # -- the jobs this process queued --------------------------------------------------

    def track_job(self, job_id: int) -> None:
        # close() waits for the jobs this process queued. Finished ones are dropped now and
        # then; the next prune waits until the set has doubled, so a backlog that cannot be
        # pruned yet costs each call O(1) amortised, not a query over every tracked job.
        with self._lock:
            self._my_jobs.add(job_id)
            prune = len(self._my_jobs) >= self._prune_at
            ids = sorted(self._my_jobs) if prune else []
        if prune:
            states = job_states(self.store, ids)
            self.forget_jobs([j for j in ids if states[j] in FINISHED])
            with self._lock:
                self._prune_at = max(1024, 2 * len(self._my_jobs))

    def forget_jobs(self, ids: Sequence[int]) -> None:
        with self._lock:
            self._my_jobs.difference_update(ids)

    def wait(self, timeout: float | None = None) -> None:
        """Block until no work is queued or running in the store (see ``Memory.wait``)."""
        self.queue.wait_until(
            lambda: self.store.unfinished_jobs() == 0, timeout, what="queued work"
        )
        with self._lock:
            self._my_jobs.clear()
        if self.recall_log is not None:
            self.recall_log.flush()

    # -- lifetime ----------------------------------------------------------------------

    def close(
        self, timeout: float | None = None, *, drain: Callable[[float], None] | None = None
    ) -> None:
        """Finish this process's queued work (bounded by ``timeout``), then release files.

        ``drain(timeout)`` runs first, while the facades still work: the opener's capture
        stores the exchanges it holds, whose jobs are then waited for in what time is left.
        """
        with self._lock:
            if self._closing:
                return
            self._closing = True
        timeout = self.settings.close_timeout_seconds if timeout is None else timeout
        deadline = time.monotonic() + timeout
        if drain is not None:
            drain(timeout)
        with self._lock:
            self.closed = True
        # Capture has stopped recalling: what its recalls logged is stored now.
        if self.recall_log is not None:
            self.recall_log.close()
        if self.queue.running and self._my_jobs:
            paused = paused_because(self.store)
            if paused:
                # Waiting would only run the clock out: nothing is processed before the
                # outage ends, and the jobs stay queued for the next worker on this store.
                log.warning(
                    "closing without waiting for queued work (%s); it stays in %s",
                    paused,
                    self.store.url,
                )
            else:
                try:
                    left = max(0.0, deadline - time.monotonic())
                    self.queue.wait_jobs(sorted(self._my_jobs), left)
                except ProcessingError:
                    log.warning("closing with work still queued; it stays in %s", self.store.url)
                except Exception:
                    log.exception("error while finishing queued work at close")
        _metrics.unwatch(self.store.url, self._queue_state)
        self.queue.stop(timeout=max(1.0, timeout))
        self.webhook_engine.close(timeout=max(1.0, timeout))
        self.recaller.close()
        # Native code (onnxruntime) must not be mid-load when the interpreter exits: that
        # aborts the process ("terminate called without an active exception").
        self.await_warm_up()
        self.store.close()
