"""``mem.llm``: recall before an LLM call, capture after it, never in the caller's way.

A provider adapter (``_openai.py``, ...) wraps a client's generation methods and calls
:meth:`Capture.before` (memory to inject, within a bounded wait) and :meth:`Capture.after`
(hand the exchange to the background writer). Any memory error is logged and swallowed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, Protocol, get_args

from .. import _metrics, _tracing
from .._abandon import abandonable
from .._queries import MAX_EXCLUDE_TEXTS
from .._strings import text_problem
from .._time import utcnow
from ..errors import ConflictError, NotFoundError, StoreError, ValidationError
from ..recall._format import MEMORY_HEADER, MEMORY_OPEN, without_history
from ._layers import inside
from ._pauses import collector_pauses
from ._scope import Attribution, check, current

if TYPE_CHECKING:
    from .._recall_log import RecallLog
    from .._vocabulary import RecallOutcome, RecallSource
    from ..config import Settings
    from ..types import MemoryContext, Message, RecallConfig

__all__ = [
    "CAPTURE_RECALL",
    "MEMORY_PREAMBLE",
    "Capture",
    "CaptureTarget",
    "Exchange",
    "Injection",
    "Recalled",
]

Injection = Literal["user", "system"]

log = logging.getLogger("stratamem.capture")

# How every injected block begins: recall's formatted_context frames itself as data
# about the user, not instructions, within delimiters stored text cannot close.
MEMORY_PREAMBLE = f"{MEMORY_OPEN}\n{MEMORY_HEADER}"


@dataclass
class Exchange:
    """One captured call: what the user asked and what the model answered."""

    provider: str
    attribution: Attribution
    user_text: str | None
    answer: str = ""
    model: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    latency_ms: float = 0.0
    partial: bool = False  # the caller closed a stream before it ended
    error: str | None = None  # the call or the stream failed
    # When the exchange was made: as the call ended (its answer or its stream finished).
    finished: datetime = field(default_factory=utcnow)
    # The trace context the exchange was handed over in (the caller's span): the span
    # that stores it, later and in another thread, links to it.
    trace: Any = None

    @property
    def started(self) -> datetime:
        """When the call was sent: ``latency_ms`` before it finished."""
        return self.finished - timedelta(milliseconds=self.latency_ms)


@dataclass(frozen=True)
class Recalled:
    """What ``before`` found: the block to inject and, if asked, the session's turns."""

    attribution: Attribution
    block: str | None = None  # recall's formatted_context, framed and escaped
    history: tuple[Message, ...] = ()
    # Where the block goes: "user", into the turn recall searched with (after its text),
    # or "system", the provider's system slot (the adapters' docstrings say where exactly).
    injection: Injection = "user"
    # Recall was attempted but gave up (timed out or failed): the call went on without
    # memory. The proxy says so in a response header.
    skipped: bool = False
    # For the recall log: what was asked, how many items matched, and how long the call
    # waited for the recall (None: no recall was made, e.g. recall is off).
    query: str | None = None
    hits: int = 0
    latency_ms: float | None = None
    # Why the exchange cannot be stored as asked (the session belongs to another user):
    # found by the recall, which claims the session first. In-process, the call goes on (it
    # is not stored: logged); the proxy refuses the request (409) before relaying it.
    refused: str | None = None

    @property
    def outcome(self) -> RecallOutcome:
        """What the recall gave the call: ``injected``, ``none`` or ``skipped``."""
        if self.skipped:
            return "skipped"
        return "injected" if self.block or self.history else "none"


_STOP = object()

# Exchanges waiting for the background writer at most: past it a new one is dropped (counted
# in ``dropped``, logged), so a store that is down or slow costs bounded memory, and a
# process killed outright loses at most this many answered exchanges (normally the writer
# keeps up and holds a few).
MAX_QUEUED_EXCHANGES = 10_000
# While the store is unavailable (a database restarting), the writer retries an exchange
# this long, first after RETRY_FIRST_SECONDS, doubling up to RETRY_MAX_SECONDS, holding the
# ones behind it in the queue; at close, no longer than the close's own timeout.
STORE_RETRY_SECONDS = 120.0
RETRY_FIRST_SECONDS = 0.05
RETRY_MAX_SECONDS = 2.0

# The longest register() waits for the embedding model to load (normally ~0.3-0.5 s).
MODEL_LOAD_WAIT_SECONDS = 30.0

# Recalls run at once: a recall waits on the store and on the embedding model (which both
# release the GIL) as much as it computes, so a few more than the cores keep them busy; many
# more would only share the cores among recalls that all miss their bound.
_RECALL_THREADS = 2 * min(os.cpu_count() or 1, 4)

# At most this much garbage-collection time extends one recall's wait (see Capture._result).
MAX_PAUSE_CREDIT_SECONDS = 1.0

# Recall before every call is on the call's critical path and its block goes into every
# prompt: a compact configuration (about half the default's time and tokens). 10 candidates
# per retriever and layer for at most 12 items, summaries and messages but no facts: a
# summary already states what its facts say (offline, most summaries are one fact, which
# recall then lists once, as the summary), so fact slots mostly went unused. Against 4
# summaries, 4 facts and 4 messages, the evidence turns in the block went 66.6 -> 71.2% on
# LoCoMo and 81.0 -> 86.9% on LongMemEval at the same token budget, in about the same time
# (bench/retrieval.py, "capture recall"; docs/benchmarks.md).
CAPTURE_RECALL = {
    "proposition_top_k": 6,
    "observation_semantic_top_k": 0,
    "message_semantic_top_k": 6,
    "observation_context_top_k": 1,
    "candidate_pool": 10,
    "token_budget": 400,
}


# (user_id, session_id, messages, began_at) -> whether stored: see Capture.
StoreExchange = Callable[[str, str, list[dict[str, Any]], float], bool]


class _SessionCreator(Protocol):
    def create(self, user_id: str, *, session_id: str) -> Any: ...


class CaptureTarget(Protocol):
    """What capture uses of a memory: its capture settings, the scoped session, recall
    before a call and the exchange's messages after it. An embedded ``Memory`` and a
    ``RemoteMemory`` both are one."""

    settings: Settings

    @property
    def sessions(self) -> _SessionCreator: ...

    def get_memory(
        self,
        session_id: str,
        query: str,
        *,
        recall_config: RecallConfig,
        exclude_texts: Sequence[str] = (),
        details: bool = False,
    ) -> MemoryContext: ...

    def add_messages(self, session_id: str, messages: list[dict[str, Any]]) -> Any: ...


class Capture:
    """``mem.llm``: register clients; attribution defaults; the background writer.

    An embedded memory also passes ``await_model(timeout)``, which waits for its embedding
    model to load, ``before_store()``, which lets the recalls running now go first,
    ``store_exchange(user_id, session_id, messages, began_at)``, which stores an exchange
    with its session in one transaction unless the user was erased after it began (False
    then), and its ``recall_log`` when recalls are to be logged (``log_recall``)."""

    def __init__(
        self,
        memory: CaptureTarget,
        *,
        await_model: Callable[[float], None] | None = None,
        before_store: Callable[[], object] | None = None,
        store_exchange: StoreExchange | None = None,
        recall_log: RecallLog | None = None,
    ) -> None:
        self._m = memory
        self._recall_log = recall_log
        self._await_model_load = await_model
        self._before_store = before_store
        self._store_exchange = store_exchange
        s = memory.settings
        self.recall = s.capture_recall
        self.recall_timeout = s.capture_recall_timeout_ms / 1000
        self.default_user = s.capture_default_user
        self.inject_history = s.capture_inject_history
        self._injection: Injection = s.capture_injection
        self._defaults = Attribution()
        self._recall_config: dict[str, Any] = dict(CAPTURE_RECALL)
        self._validated: tuple[dict[str, Any], RecallConfig] | None = None
        self._clients: dict[int, tuple[Any, Callable[[], None]]] = {}
        self._lock = threading.Lock()
        self._queue: queue.Queue[Any] = queue.Queue(MAX_QUEUED_EXCHANGES)
        self._writer: threading.Thread | None = None
        self._recall_pool: ThreadPoolExecutor | None = None
        self._sessions: set[tuple[str, str]] = set()
        self._closed = False
        self._give_up_at: float | None = None  # while closing: when the writer stops retrying
        self.written = 0  # exchanges stored, for tests and stats
        self.dropped = 0  # exchanges dropped: the queue was full, or the store stayed down
        # Exchanges not stored because their user was erased after they began.
        self.erased = 0

    # -- public -------------------------------------------------------------------------

    def register(self, client: Any = None, /, **named: Any) -> Any:
        """Wrap ``client``'s generation methods; returns the same client. Idempotent.

        Framework objects go by name (``register(chatopenai=model)``, ``pydantic_ai=``,
        ``agno=``, ``bedrock=``, ...; see ``docs/capture.md``): one of them can reach several
        providers, so the name says which integration wraps it."""
        from ._adapters import adapter_for

        self._await_model()
        if named:
            from ._frameworks import register_named

            return register_named(self, client, named)
        with self._lock:
            owner = getattr(client, "_stratamem_capture", None)
            if owner is self:
                return client
            if owner is not None:
                raise ValueError(
                    "this client is already registered with another Memory; "
                    "unregister it there first (one client, one memory)"
                )
            restore = adapter_for(client)(client, self)
            client._stratamem_capture = self
            self._clients[id(client)] = (client, restore)
        return client

    def warm_up(self) -> None:
        """Wait (at most MODEL_LOAD_WAIT_SECONDS) until a recall can be made within its
        bound, as :meth:`register` does: the proxy's readiness waits for this."""
        self._await_model()

    def _await_model(self) -> None:
        # A new Memory loads the local model in the background (~0.5 s). A recall before
        # that is done would outlast its bound (50 ms), so the first calls of a process, and
        # every call of a short script, would go out without memory: registering, usually
        # done at start-up, waits for the load instead.
        if (self.recall or self.inject_history) and self._await_model_load is not None:
            self._await_model_load(MODEL_LOAD_WAIT_SECONDS)

    def unregister(self, client: Any) -> None:
        """Restore ``client``'s original methods (no-op if it was not registered here)."""
        with self._lock:
            entry = self._clients.pop(id(client), None)
        if entry is None:
            return
        entry[1]()
        with contextlib.suppress(AttributeError):  # framework objects carry no marker
            del client._stratamem_capture

    def attribution(
        self,
        user_id: str | None = None,
        session_id: str | None = None,
        process_id: str | None = None,
    ) -> None:
        """Defaults for calls made outside any ``mem.scope(...)``."""
        self._defaults = check(user_id=user_id, session_id=session_id, process_id=process_id)

    @property
    def recall_config(self) -> dict[str, Any]:
        """The recall_config of the recall before each call (compact by default); assign a
        dict to change it, e.g. ``mem.llm.recall_config = {"token_budget": 800}``."""
        return dict(self._recall_config)

    @recall_config.setter
    def recall_config(self, value: dict[str, Any]) -> None:
        from ..types import RecallConfig

        RecallConfig.model_validate(value)  # unknown keys and bad values fail here
        self._recall_config = dict(value)

    @property
    def injection(self) -> Injection:
        """Where the recalled block goes (``capture_injection``): ``"user"``, into the last
        user turn, or ``"system"``, the provider's system slot; assign to change it."""
        return self._injection

    @injection.setter
    def injection(self, value: Injection) -> None:
        if value not in get_args(Injection):
            raise ValidationError(
                "invalid injection", [f"injection: expected 'user' or 'system', got {value!r}"]
            )
        self._injection = value

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every captured exchange is stored; False if ``timeout`` ran out."""
        done = threading.Event()
        try:
            self._queue.put(done, timeout=timeout)
        except queue.Full:
            return False
        self._ensure_writer()
        return done.wait(timeout)

    def close(self, timeout: float) -> None:
        """Unregister every client, store what is queued within ``timeout``, stop the
        writer. The Memory stays open until this returns: the writer stores through it."""
        for client, _ in list(self._clients.values()):
            self.unregister(client)
        with self._lock:
            self._closed = True  # a call still in flight is no longer queued
            self._give_up_at = time.monotonic() + timeout
        if self._writer is not None:
            drained = self.flush(timeout)
            # The store is slow or down: what is still queued is dropped, and said so.
            dropped = 0 if drained else self._discard_queue()
            self.dropped += dropped
            self._queue.put(_STOP)
            # The write in progress is let finish (bounded by the store's own timeouts, e.g.
            # SQLite's busy timeout): the store must not be closed under it (closing a
            # SQLite connection another thread is using crashes the process).
            self._writer.join(timeout=1.0 if drained else max(timeout, 1.0))
            if not drained:
                log.warning(
                    "stratamem: closing: %d captured exchange(s) not stored within %.1f s; dropped",
                    dropped,
                    timeout,
                )
        if self._recall_pool is not None:
            self._recall_pool.shutdown(wait=False, cancel_futures=True)

    # -- adapter side --------------------------------------------------------------------

    def resolve(self) -> Attribution | None:
        """The attribution of a call made now, or None when it must not be captured."""
        who = self._defaults.merged(current())
        if who.user_id is None:
            if self.default_user is None:
                return None
            who = Attribution(self.default_user, who.session_id, who.process_id)
        return in_default_session(who)

    def before(self, query: str | None, carried: Sequence[str] = ()) -> Recalled | None:
        """Attribution and recalled memory for a call about to be made. ``carried``: the
        texts of the request's user and assistant turns as the caller sent them (without
        the memory block), which recall leaves out of the block: the request holds them
        already. Never raises; gives up on recall after ``capture_recall_timeout_ms``."""
        if inside(self):  # a registered framework around this call captures it
            return None
        try:
            who = self.resolve()
        except Exception:
            log.exception("stratamem: attribution failed; the call is not captured")
            return None
        if who is None:
            return None
        if not (self.recall or self.inject_history) or not query:
            return Recalled(who)
        start = time.perf_counter()
        future: Future[Recalled] | None = None
        given_up = threading.Event()
        try:
            texts = self._exclusions(carried)
            future = self._pool().submit(_tracing.carry(self._recall), who, query, texts, given_up)
            recalled = self._result(future)
            return dataclasses.replace(recalled, query=query, latency_ms=elapsed_ms(start))
        except FutureTimeout:
            # Nobody waits for it any more: not started yet, it is not run; running, it stops
            # at its next step (under load, recalls run for calls long gone would make every
            # later one late too).
            assert future is not None
            given_up.set()
            how = (
                "never started: the recall threads were busy"
                if future.cancel()
                else "ran; stopped at its next step"
            )
            log.warning(
                "stratamem: recall took longer than %d ms (%s); the call goes on without memory",
                self.recall_timeout * 1000,
                how,
            )
        except ConflictError as exc:
            log.warning("stratamem: %s; the call is not captured", exc)
            return Recalled(who, skipped=True, query=query, refused=str(exc))
        except Exception:
            log.exception("stratamem: recall failed; the call goes on without memory")
        return Recalled(who, skipped=True, query=query, latency_ms=elapsed_ms(start))

    def log_recall(
        self, recalled: Recalled | None, *, request: str, source: RecallSource = "capture"
    ) -> None:
        """Count the recall ``before`` made (metrics) and add it to the recall log (when the
        memory keeps one):
        ``request`` names what asked (``"openai chat.completions"``, the proxy's
        ``"POST /v1/messages"``). A call without a recall is not logged. Never raises."""
        if recalled is None or recalled.latency_ms is None:
            return
        outcome = recalled.outcome
        _metrics.recall(source, outcome, recalled.latency_ms / 1000)
        if self._recall_log is None:
            return
        try:
            who = recalled.attribution
            assert who.user_id is not None  # resolve() gave the recall a user
            self._recall_log.record(
                user_id=who.user_id,
                session_id=who.session_id,
                source=source,
                request=request,
                query=recalled.query,
                outcome=outcome,
                formatted_context=recalled.block or "",
                hits=recalled.hits,
                latency_ms=recalled.latency_ms,
            )
        except Exception:
            log.exception("stratamem: could not log a recall")

    def after(self, exchange: Exchange) -> None:
        """Queue the exchange for storage and return at once. Never raises."""
        if self._closed:
            log.warning("stratamem: the Memory is closed; a captured exchange is not stored")
            return
        try:
            if exchange.trace is None:
                exchange.trace = _tracing.current_context()
            self._queue.put_nowait(exchange)
        except queue.Full:
            self.dropped += 1
            if self.dropped % 1000 == 1:  # the first, then every thousandth
                log.warning(
                    "stratamem: %d captured exchange(s) waiting to be stored already; one "
                    "more dropped (%d so far): the store is down or too slow",
                    MAX_QUEUED_EXCHANGES,
                    self.dropped,
                )
            return
        try:
            self._ensure_writer()
        except Exception:
            log.exception("stratamem: could not queue a captured exchange")

    # -- internals ----------------------------------------------------------------------

    def _result(self, future: Future[Recalled]) -> Recalled:
        """The recall, waited for ``recall_timeout`` of its own time: garbage collections
        meanwhile stopped the whole process, the call included, so their length is waited
        again (up to MAX_PAUSE_CREDIT_SECONDS in all) rather than the call going out
        without memory. A slow backend gets no more than the bound (see ``_pauses.py``)."""
        pauses = collector_pauses()
        paused_before = pauses.seconds()
        start = time.perf_counter()
        while True:
            credit = min(pauses.seconds() - paused_before, MAX_PAUSE_CREDIT_SECONDS)
            left = self.recall_timeout + credit - (time.perf_counter() - start)
            if left <= 0:
                raise FutureTimeout
            try:
                return future.result(timeout=left)
            except FutureTimeout:
                continue  # a collection during the wait leaves time left: wait that long

    def _pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._recall_pool is None:
                self._recall_pool = ThreadPoolExecutor(
                    _RECALL_THREADS, thread_name_prefix="stratamem-capture-recall"
                )
            return self._recall_pool

    def _session(self, who: Attribution) -> str:
        assert who.user_id is not None and who.session_id is not None
        key = (who.user_id, who.session_id)
        if key not in self._sessions:
            self._m.sessions.create(who.user_id, session_id=who.session_id)
            self._sessions.add(key)
        return who.session_id

    def _config(self) -> RecallConfig:
        """The recall_config of a capture recall, validated once while it stays the same."""
        from ..types import RecallConfig

        config = {
            **self._recall_config,
            "message_recent_limit": 20 if self.inject_history else 0,
        }
        if not self.recall:
            config["enable_long_term_recall"] = False
        cached = self._validated
        if cached is not None and cached[0] == config:
            return cached[1]
        validated = RecallConfig.model_validate(config)
        self._validated = (config, validated)
        return validated

    def _exclusions(self, carried: Sequence[str]) -> tuple[str, ...]:
        """``carried`` within get_memory's rules: each text once, stripped; none longer than
        a stored message can be or that no store could hold (neither is any message's);
        of a longer conversation, its latest MAX_EXCLUDE_TEXTS."""
        most = self._m.settings.max_content_chars
        texts = (t.strip() for t in carried if isinstance(t, str))
        kept = [t for t in texts if t and len(t) <= most and text_problem(t) is None]
        return tuple(dict.fromkeys(reversed(kept)))[:MAX_EXCLUDE_TEXTS][::-1]

    def _recall(
        self, who: Attribution, query: str, carried: tuple[str, ...], given_up: threading.Event
    ) -> Recalled:
        with abandonable(given_up):
            return self._recall_now(who, query, carried)

    def _recall_now(self, who: Attribution, query: str, carried: tuple[str, ...]) -> Recalled:
        sid = self._session(who)
        # The matches (free in process) count the log's hits; a remote memory logs nothing
        # and is not asked for them.
        logged = self._recall_log is not None
        config = self._config()
        try:
            ctx = self._m.get_memory(
                sid, query, recall_config=config, exclude_texts=carried, details=logged
            )
        except NotFoundError:
            # The session was forgotten or its user erased since it was made (by any
            # process): the user is calling again now, so the session is made again.
            self._sessions.discard((who.user_id or "", sid))
            sid = self._session(who)
            ctx = self._m.get_memory(
                sid, query, recall_config=config, exclude_texts=carried, details=logged
            )
        text = ctx.formatted_context if self.recall else None
        if text and ctx.history:
            text = without_history(text)  # the history goes in as turns
        history = tuple(ctx.history) if self.inject_history else ()
        hits = len(ctx.matches or ()) if self.recall else 0
        return Recalled(who, text or None, history, self._injection, hits=hits)

    def _discard_queue(self) -> int:
        dropped = 0
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return dropped
            dropped += isinstance(item, Exchange)

    def _ensure_writer(self) -> None:
        with self._lock:
            if self._writer is None or not self._writer.is_alive():
                self._writer = threading.Thread(
                    target=self._write_loop, name="stratamem-capture", daemon=True
                )
                self._writer.start()

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            if isinstance(item, threading.Event):
                item.set()
                continue
            try:
                with _tracing.span("stratamem.capture.store", links=(item.trace,)):
                    stored = self._stored(item)
                if stored:
                    self.written += 1
            except Exception:
                self.dropped += 1
                log.exception("stratamem: a captured exchange could not be stored")

    def _stored(self, ex: Exchange) -> bool:
        """``_store``, retried while the store is unavailable (see STORE_RETRY_SECONDS)."""
        deadline = time.monotonic() + STORE_RETRY_SECONDS
        pause = RETRY_FIRST_SECONDS
        while True:
            try:
                return self._store(ex)
            except StoreError as exc:
                now = time.monotonic()
                give_up = deadline if self._give_up_at is None else min(deadline, self._give_up_at)
                if now + pause > give_up:
                    raise
                log.warning("stratamem: storing a captured exchange: %s; retrying", exc)
                time.sleep(pause)
                pause = min(pause * 2, RETRY_MAX_SECONDS)

    def _store(self, ex: Exchange) -> bool:
        """Store ``ex``; False when it is not (nothing to store, or its user was erased
        after it began)."""
        who = ex.attribution
        assert who.user_id is not None and who.session_id is not None  # resolve() made them
        capture: dict[str, Any] = {
            "provider": ex.provider,
            "model": ex.model,
            "latency_ms": round(ex.latency_ms, 3),
        }
        if ex.usage:
            capture["usage"] = ex.usage
        if ex.tool_calls:
            capture["tool_calls"] = ex.tool_calls
        if ex.partial:
            capture["partial"] = True
        if ex.error:
            capture["error"] = ex.error[:500]
        messages: list[dict[str, Any]] = []
        base = {"timestamp": ex.started, "process_id": who.process_id}
        if ex.user_text and ex.user_text.strip():
            messages.append({"role": "user", "content": ex.user_text, **base})
        answer = ex.answer
        if not answer.strip() and ex.tool_calls:
            answer = "; ".join(
                f"[tool call] {c.get('name')}({c.get('arguments', '')})" for c in ex.tool_calls
            )
        if answer.strip():
            messages.append(
                {
                    **base,
                    "role": "assistant",
                    "content": answer,
                    "metadata": {"capture": capture},
                    "timestamp": ex.finished,
                }
            )
        elif messages:
            messages[0]["metadata"] = {"capture": capture}
        if not messages:
            return False
        most = self._m.settings.max_content_chars
        for m in messages:
            if m["process_id"] is None:
                del m["process_id"]
            chars = len(m["content"])
            if chars > most:  # stored cut, rather than not at all
                m["content"], kept = truncated(m["content"], most)
                meta = m.setdefault("metadata", {}).setdefault("capture", {})
                meta["truncated"] = {"chars": chars, "kept": kept}
        # The next call's recall is likely running now: store after it (bounded wait).
        if self._before_store is not None:
            self._before_store()
        if self._store_exchange is None:  # a remote memory: the server stores it
            try:
                self._m.add_messages(self._session(who), messages)
            except NotFoundError:  # forgotten or erased since: made again next time
                self._sessions.discard((who.user_id, who.session_id))
                raise
            return True
        # The memory injected into the call came from a recall that began at most its bound
        # (and the collection pauses credited to it) before the call was sent.
        began = ex.started.timestamp() - self.recall_timeout - MAX_PAUSE_CREDIT_SECONDS
        if self._store_exchange(who.user_id, who.session_id, messages, began):
            self._sessions.add((who.user_id, who.session_id))
            return True
        self.erased += 1
        log.warning(
            "stratamem: a captured exchange of user %r began before the user was erased; "
            "it is not stored",
            who.user_id,
        )
        return False


# Ends a captured text cut to max_content_chars (what a message may hold): the beginning is
# kept, which is where a question or an answer says most; the metadata has the length.
TRUNCATION_MARK = "\n[stratamem: truncated, {kept} of {chars} characters kept]"


def truncated(text: str, most: int) -> tuple[str, int]:
    """``text`` cut to at most ``most`` characters, the cut marked; and how many it kept."""
    mark = TRUNCATION_MARK.format(kept="0" * len(str(most)), chars=len(text))
    kept = max(most - len(mark), 0)
    mark = TRUNCATION_MARK.format(kept=kept, chars=len(text))
    return (text[:kept] + mark)[:most], kept


def in_default_session(who: Attribution) -> Attribution:
    """``who`` with a user, in its session or by default the user's ``llm-<user>``."""
    if who.session_id is None and who.user_id is not None:
        return Attribution(who.user_id, f"llm-{who.user_id}"[:200], who.process_id)
    return who


def elapsed_ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000
