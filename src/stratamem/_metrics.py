"""Metrics: what the engine and the server count and time, for Prometheus and OpenTelemetry.

Every event is recorded through the functions below, into two sinks, each optional:

* **Prometheus** (``prometheus-client``, in the ``server`` extra): a registry of stratamem's
  own that ``stratamem serve`` exposes at ``/metrics`` once :func:`enable_prometheus` is
  called (the ``metrics`` server setting); before that nothing is kept.
* **OpenTelemetry's metrics API** (``opentelemetry-api``, the ``otel`` extra): instruments of
  the meter ``stratamem``, no-ops until the application sets a meter provider. Names follow
  the semantic conventions where they exist (``http.server.request.duration``,
  ``gen_ai.client.token.usage``, ``gen_ai.client.operation.duration``), ``stratamem.*``
  otherwise.

Neither library is imported by ``import stratamem``. Labels are bounded: no user or session
ids; routes are templates; models, embedders and services come from the configuration; a
project id is a label for the first :data:`MAX_PROJECT_LABELS` projects this process sees
(projects are created by an operator, never by a caller with an API key) and ``_other``
beyond them. Queue depth, processing lag and outages are read from each open store when
metrics are collected (:func:`watch`). docs/observability.md lists every metric.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "MAX_PROJECT_LABELS",
    "QueueSample",
    "StoreState",
    "embedded",
    "enable_prometheus",
    "http_request",
    "job_outcome",
    "llm_call",
    "project_label",
    "prometheus_exposition",
    "recall",
    "recall_log_dropped",
    "recall_log_written",
    "set_meter_provider",
    "shared_between_processes",
    "unwatch",
    "watch",
    "webhook_delivery",
]

log = logging.getLogger("stratamem")

MAX_PROJECT_LABELS = 500
OTHER = "_other"

# Seconds. Recall sits between a millisecond and the capture bound; model calls and
# webhooks between tens of milliseconds and a minute.
_FAST = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_SLOW = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
# gen_ai.client.token.usage's advised boundaries (gen-ai-metrics.md).
_TOKENS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304)

Kind = Literal["counter", "histogram"]


@dataclass(frozen=True)
class _Def:
    """One instrument, as each sink names it: ``labels`` pairs a Prometheus label with the
    OpenTelemetry attribute of the same value. A sink whose name is empty does not keep it."""

    kind: Kind
    prom: str
    otel: str
    doc: str
    unit: str
    labels: tuple[tuple[str, str], ...]
    buckets: tuple[float, ...] = _FAST


_PROJECT = ("project", "stratamem.project.id")
_HTTP = _Def(
    "histogram",
    "stratamem_http_request_duration_seconds",
    "http.server.request.duration",
    "HTTP requests served, by route template and status (the count is the request rate).",
    "s",
    (
        ("method", "http.request.method"),
        ("route", "http.route"),
        ("status", "http.response.status_code"),
    ),
)
_RECALL = _Def(
    "histogram",
    "stratamem_recall_duration_seconds",
    "stratamem.recall.duration",
    "Recalls made for a face (capture, proxy, rest, mcp): how long the caller waited.",
    "s",
    (("face", "stratamem.face"), ("outcome", "stratamem.recall.outcome")),
)
_SKIPPED = _Def(
    "counter",
    "stratamem_recall_skipped_total",
    "stratamem.recall.skipped",
    "Recalls given up (timed out or failed): the call went on without memory.",
    "{recall}",
    (("face", "stratamem.face"),),
)
_JOBS = {
    outcome: _Def(
        "counter",
        f"stratamem_jobs_{outcome}_total",
        f"stratamem.jobs.{outcome}",
        doc,
        "{job}",
        (_PROJECT,),
    )
    for outcome, doc in (
        ("processed", "Jobs the pipeline processed."),
        ("failed", "Jobs failed for good (after their last attempt)."),
        ("retried", "Failed job attempts queued again for a retry."),
        ("paused", "Job attempts put back because a service was unavailable (an outage)."),
    )
}
_WEBHOOKS = _Def(
    "counter",
    "stratamem_webhook_deliveries_total",
    "stratamem.webhook.deliveries",
    "Webhook delivery attempts by mode (sync, async) and outcome (delivered, retrying, failed).",
    "{delivery}",
    (_PROJECT, ("mode", "stratamem.webhook.mode"), ("outcome", "stratamem.webhook.outcome")),
)
_WEBHOOK_TIME = _Def(
    "histogram",
    "stratamem_webhook_delivery_duration_seconds",
    "stratamem.webhook.delivery.duration",
    "How long webhook delivery attempts took, by mode and outcome.",
    "s",
    (("mode", "stratamem.webhook.mode"), ("outcome", "stratamem.webhook.outcome")),
    _SLOW,
)
_LOG_LAG = _Def(
    "histogram",
    "stratamem_recall_log_write_lag_seconds",
    "stratamem.recall_log.write_lag",
    "From a recall to its record being stored (the oldest of each batch written).",
    "s",
    (),
    _SLOW,
)
_LOG_DROPPED = _Def(
    "counter",
    "stratamem_recall_log_dropped_total",
    "stratamem.recall_log.dropped",
    "Recall log records lost: the writer fell behind a full buffer, or the store failed.",
    "{record}",
    (),
)
_LLM_CALLS = _Def(
    "counter",
    "stratamem_llm_calls_total",
    "",
    "Model calls of the write pipeline, by project, model, stage and outcome.",
    "{call}",
    (_PROJECT, ("model", ""), ("stage", ""), ("outcome", "")),
)
_LLM_TOKENS = _Def(
    "counter",
    "stratamem_llm_tokens_total",
    "",
    "Tokens of the pipeline's model calls, by project, model, stage and type (prompt, completion).",
    "{token}",
    (_PROJECT, ("model", ""), ("stage", ""), ("type", "")),
)
_GENAI_TOKENS = _Def(
    "histogram",
    "",
    "gen_ai.client.token.usage",
    "Tokens of the pipeline's model calls (input, output).",
    "{token}",
    (
        ("", "gen_ai.operation.name"),
        ("", "gen_ai.provider.name"),
        ("", "gen_ai.request.model"),
        ("", "gen_ai.token.type"),
        _PROJECT,
        ("", "stratamem.pipeline.stage"),
    ),
    _TOKENS,
)
_LLM_TIME = _Def(
    "histogram",
    "stratamem_llm_call_duration_seconds",
    "",
    "How long the pipeline's model calls took, by model.",
    "s",
    (("model", ""),),
    _SLOW,
)
_GENAI_TIME = _Def(
    "histogram",
    "",
    "gen_ai.client.operation.duration",
    "How long the pipeline's model calls took.",
    "s",
    (
        ("", "gen_ai.operation.name"),
        ("", "gen_ai.provider.name"),
        ("", "gen_ai.request.model"),
        ("", "error.type"),
    ),
    _SLOW,
)
_EMBED_TEXTS = _Def(
    "counter",
    "stratamem_embedder_texts_total",
    "stratamem.embedder.texts",
    "Texts embedded (for recall, the pipeline and reindexing), by embedder.",
    "{text}",
    (("embedder", "stratamem.embedder"),),
)
_EMBED_TIME = _Def(
    "histogram",
    "stratamem_embedder_duration_seconds",
    "stratamem.embedder.duration",
    "How long embedding calls took, by embedder.",
    "s",
    (("embedder", "stratamem.embedder"),),
)
_DEFS = (
    _HTTP,
    _RECALL,
    _SKIPPED,
    *_JOBS.values(),
    _WEBHOOKS,
    _WEBHOOK_TIME,
    _LOG_LAG,
    _LOG_DROPPED,
    _LLM_CALLS,
    _LLM_TOKENS,
    _GENAI_TOKENS,
    _LLM_TIME,
    _GENAI_TIME,
    _EMBED_TEXTS,
    _EMBED_TIME,
)


# -- what stores report when metrics are collected ---------------------------------------


@dataclass(frozen=True)
class QueueSample:
    """Unfinished jobs of one project in one state, and how long the oldest has waited."""

    project_id: str
    state: str  # queued | running
    jobs: int
    oldest_age_seconds: float


@dataclass(frozen=True)
class StoreState:
    queue: Sequence[QueueSample]
    outages: Sequence[str]  # the services down now (processing is paused)


_sources: dict[str, Callable[[], StoreState]] = {}
_sources_lock = threading.Lock()


def watch(key: str, read: Callable[[], StoreState]) -> None:
    """Report ``read()`` (one open store's queue and outages) whenever metrics are
    collected, under ``key`` (the store's URL: two engines on one store report once)."""
    with _sources_lock:
        _sources[key] = read


def unwatch(key: str, read: Callable[[], StoreState]) -> None:
    with _sources_lock:
        if _sources.get(key) == read:
            del _sources[key]


def _states() -> list[StoreState]:
    with _sources_lock:
        reads = list(_sources.values())
    out = []
    for read in reads:
        try:
            out.append(read())
        except Exception:  # a store that is down is said by its outage, not by a crash here
            log.warning("stratamem: could not read the queue state for metrics", exc_info=True)
    return out


def _queue() -> tuple[dict[tuple[str, str], int], dict[str, float], set[str]]:
    """(jobs by project and state, the oldest queued job's age by project, services down),
    summed over the watched stores."""
    jobs: dict[tuple[str, str], int] = {}
    age: dict[str, float] = {}
    down: set[str] = set()
    for state in _states():
        for q in state.queue:
            project = project_label(q.project_id)
            jobs[(project, q.state)] = jobs.get((project, q.state), 0) + q.jobs
            if q.state == "queued":
                age[project] = max(age.get(project, 0.0), q.oldest_age_seconds)
        down.update(state.outages)
    return jobs, age, down


# -- bounded project labels ----------------------------------------------------------------

_projects: set[str] = set()
_projects_lock = threading.Lock()


def project_label(project_id: str) -> str:
    """The project's label value: its id, while fewer than MAX_PROJECT_LABELS projects
    were seen by this process, ``_other`` past them (said once in the log)."""
    if project_id in _projects:
        return project_id
    with _projects_lock:
        if len(_projects) < MAX_PROJECT_LABELS:
            _projects.add(project_id)
            return project_id
        if OTHER not in _projects:
            _projects.add(OTHER)
            log.warning(
                "stratamem: more than %d projects; metrics label the others %r",
                MAX_PROJECT_LABELS,
                OTHER,
            )
    return OTHER


# -- the sinks -----------------------------------------------------------------------------


class _Prometheus:
    """stratamem's own registry (not the process-wide default one)."""

    def __init__(self) -> None:
        import prometheus_client as pc

        self.pc = pc
        self.registry = pc.CollectorRegistry()
        self.instruments: dict[_Def, Any] = {}
        for d in _DEFS:
            if not d.prom:
                continue
            labels = [p for p, _ in d.labels if p]
            made: Any
            if d.kind == "counter":
                made = pc.Counter(
                    d.prom.removesuffix("_total"), d.doc, labels, registry=self.registry
                )
            else:
                made = pc.Histogram(
                    d.prom, d.doc, labels, registry=self.registry, buckets=d.buckets
                )
            self.instruments[d] = made
        self.registry.register(_StateCollector())

    def record(self, d: _Def, value: float, values: Sequence[Any]) -> None:
        instrument = self.instruments.get(d)
        if instrument is None:
            return
        shown = [str(v) for (p, _), v in zip(d.labels, values, strict=True) if p]
        child = instrument.labels(*shown) if shown else instrument
        if d.kind == "counter":
            child.inc(value)
        else:
            child.observe(value)


class _StateCollector:
    """Queue depth, processing lag and outages, read from the stores at scrape time."""

    def describe(self) -> list[Any]:
        return []  # collected on demand only (describing would query the stores)

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        jobs, age, down = _queue()
        depth = GaugeMetricFamily(
            "stratamem_queue_jobs",
            "Unfinished jobs by project and state (queued, running).",
            labels=["project", "state"],
        )
        for (project, state), n in sorted(jobs.items()):
            depth.add_metric([project, state], n)
        lag = GaugeMetricFamily(
            "stratamem_queue_oldest_job_age_seconds",
            "How long the oldest queued job of each project has waited (processing lag).",
            labels=["project"],
        )
        for project, seconds in sorted(age.items()):
            lag.add_metric([project], seconds)
        paused = GaugeMetricFamily(
            "stratamem_processing_paused",
            "1 while processing is paused by an outage of a service it needs, else 0.",
        )
        paused.add_metric([], 1 if down else 0)
        outage = GaugeMetricFamily(
            "stratamem_outage",
            "1 for each service that is down now (the LLM, the remote embedder).",
            labels=["service"],
        )
        for service in sorted(down):
            outage.add_metric([service], 1)
        yield from (depth, lag, paused, outage)


class _OpenTelemetry:
    """The instruments of the meter ``stratamem`` of one meter provider."""

    def __init__(self, provider: Any) -> None:
        from opentelemetry import metrics

        self.metrics = metrics
        meter = (provider or metrics.get_meter_provider()).get_meter("stratamem")
        self.instruments: dict[_Def, Any] = {}
        for d in _DEFS:
            if not d.otel:
                continue
            if d.kind == "counter":
                made = meter.create_counter(d.otel, unit=d.unit, description=d.doc)
            else:
                made = meter.create_histogram(
                    d.otel,
                    unit=d.unit,
                    description=d.doc,
                    explicit_bucket_boundaries_advisory=list(d.buckets),
                )
            self.instruments[d] = made
        meter.create_observable_gauge(
            "stratamem.queue.jobs",
            [self._depth],
            unit="{job}",
            description="Unfinished jobs by project and state (queued, running).",
        )
        meter.create_observable_gauge(
            "stratamem.queue.oldest_job_age",
            [self._lag],
            unit="s",
            description="How long the oldest queued job of each project has waited.",
        )
        meter.create_observable_gauge(
            "stratamem.outage",
            [self._outages],
            unit="1",
            description="1 for each service that is down now (processing is paused).",
        )

    def record(self, d: _Def, value: float, values: Sequence[Any]) -> None:
        instrument = self.instruments.get(d)
        if instrument is None:
            return
        attributes = {o: v for (_, o), v in zip(d.labels, values, strict=True) if o and v != ""}
        if d.kind == "counter":
            instrument.add(value, attributes)
        else:
            instrument.record(value, attributes)

    def _depth(self, options: Any) -> list[Any]:
        jobs, _, _ = _queue()
        return [
            self.metrics.Observation(n, {_PROJECT[1]: p, "stratamem.job.state": s})
            for (p, s), n in jobs.items()
        ]

    def _lag(self, options: Any) -> list[Any]:
        _, age, _ = _queue()
        return [self.metrics.Observation(a, {_PROJECT[1]: p}) for p, a in age.items()]

    def _outages(self, options: Any) -> list[Any]:
        _, _, down = _queue()
        return [self.metrics.Observation(1, {"stratamem.service": s}) for s in down]


_prometheus: _Prometheus | None = None
_otel: _OpenTelemetry | None = None
_otel_absent = False
_meter_provider: Any = None  # set_meter_provider's (tests, benchmarks); None: the global one
_sinks_lock = threading.Lock()


def enable_prometheus() -> None:
    """Keep metrics for Prometheus from now on (the server, when ``metrics`` is on).
    Raises ``ImportError`` without prometheus-client."""
    global _prometheus
    with _sinks_lock:
        if _prometheus is None:
            _prometheus = _Prometheus()


def prometheus_exposition() -> tuple[bytes, str]:
    """The registry in Prometheus' text format, and its content type."""
    enable_prometheus()
    assert _prometheus is not None
    pc = _prometheus.pc
    registry = _prometheus.registry
    if os.environ.get(_SHARED_DIR):
        # Several processes (see shared_between_processes): a scrape reaches one of them
        # and answers for all, from the files each keeps its counts in.
        from prometheus_client import multiprocess

        registry = pc.CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        registry.register(_StateCollector())
    return pc.generate_latest(registry), pc.CONTENT_TYPE_LATEST


_SHARED_DIR = "PROMETHEUS_MULTIPROC_DIR"  # prometheus-client's name for it


@contextlib.contextmanager
def shared_between_processes() -> Iterator[None]:
    """Counts of the server processes started inside this block summed at each one's
    ``/metrics``: prometheus-client's multiprocess mode, each process's counts in a file of
    a directory made for the block (or the one ``PROMETHEUS_MULTIPROC_DIR`` names, kept).
    The mode is chosen when a process imports prometheus-client: for spawned processes."""
    if os.environ.get(_SHARED_DIR):
        yield
        return
    with tempfile.TemporaryDirectory(prefix="stratamem-metrics-") as directory:
        os.environ[_SHARED_DIR] = directory
        try:
            yield
        finally:
            del os.environ[_SHARED_DIR]


def set_meter_provider(provider: Any) -> None:
    """Record OpenTelemetry metrics with ``provider`` instead of the global one (None: the
    global one again). For tests and benchmarks; an application sets the global provider."""
    global _otel, _meter_provider
    with _sinks_lock:
        _meter_provider, _otel = provider, None


def _otel_sink() -> _OpenTelemetry | None:
    global _otel, _otel_absent
    if _otel is None and not _otel_absent:
        with _sinks_lock:
            if _otel is None and not _otel_absent:
                try:
                    _otel = _OpenTelemetry(_meter_provider)
                except ImportError:
                    _otel_absent = True
    return _otel


def _record(d: _Def, value: float, *values: Any) -> None:
    if _prometheus is not None:
        _prometheus.record(d, value, values)
    otel = _otel if _otel is not None or _otel_absent else _otel_sink()
    if otel is not None:
        otel.record(d, value, values)


# -- events --------------------------------------------------------------------------------


def http_request(method: str, route: str, status: int, seconds: float) -> None:
    _record(_HTTP, seconds, method, route, status)


def recall(face: str, outcome: str, seconds: float) -> None:
    """A recall a face made: ``outcome`` injected, none or skipped."""
    _record(_RECALL, seconds, face, outcome)
    if outcome == "skipped":
        _record(_SKIPPED, 1, face)


def job_outcome(project_id: str, outcome: str, jobs: int) -> None:
    """``outcome``: processed, failed (for good), retried or paused (an outage)."""
    _record(_JOBS[outcome], jobs, project_label(project_id))


def webhook_delivery(project_id: str, mode: str, outcome: str, seconds: float) -> None:
    _record(_WEBHOOKS, 1, project_label(project_id), mode, outcome)
    _record(_WEBHOOK_TIME, seconds, mode, outcome)


def recall_log_written(oldest: float) -> None:
    """A batch of recall records stored; ``oldest`` is when its oldest was made (epoch)."""
    _record(_LOG_LAG, max(time.time() - oldest, 0.0))


def recall_log_dropped(records: int) -> None:
    if records:
        _record(_LOG_DROPPED, records)


def llm_call(
    project_id: str,
    model: str,
    stage: str,
    *,
    ok: bool,
    prompt_tokens: int,
    completion_tokens: int,
    seconds: float,
) -> None:
    """One model call of the pipeline; ``model`` is the model's id (``openai:gpt-4o``)."""
    project = project_label(project_id)
    provider, _, name = model.partition(":")
    if not name:
        provider, name = "", model
    _record(_LLM_CALLS, 1, project, model, stage, "ok" if ok else "failed")
    _record(_LLM_TOKENS, prompt_tokens, project, model, stage, "prompt")
    _record(_LLM_TOKENS, completion_tokens, project, model, stage, "completion")
    _record(_LLM_TIME, seconds, model)
    _record(_GENAI_TIME, seconds, "chat", provider, name, "" if ok else "_OTHER")
    for kind, tokens in (("input", prompt_tokens), ("output", completion_tokens)):
        if tokens:
            _record(_GENAI_TOKENS, tokens, "chat", provider, name, kind, project, stage)


def embedded(embedder: str, texts: int, seconds: float) -> None:
    if texts and math.isfinite(seconds):
        _record(_EMBED_TEXTS, texts, embedder)
        _record(_EMBED_TIME, seconds, embedder)
