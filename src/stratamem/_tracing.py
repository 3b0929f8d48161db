"""OpenTelemetry traces: spans when the ``otel`` extra is installed and the application set a
tracer provider, nothing otherwise.

``opentelemetry-api`` is imported on the first span asked for, never by ``import stratamem``;
without it, or without a configured provider (the API's default is a no-op proxy), ``span``
returns one shared no-op at the cost of a function call, so that instrumented code pays
nothing measurable when tracing is off. Child spans of a recall or a batch (``child=True``)
are made only under a recording span.

Names follow OpenTelemetry's GenAI semantic conventions where they exist (memory operations,
inference, embeddings; docs/observability.md lists what is emitted): a memory operation is a
span named by its ``gen_ai.operation.name``, a model call ``chat {model}``. What a user said
or what memory holds goes on a span only when the ``trace_content`` setting says so
(:func:`memory_records`, and the callers' ``gen_ai.memory.query.text``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Literal, ParamSpec, Protocol, TypeVar

__all__ = [
    "CONVERSATION_ID",
    "ERROR_TYPE",
    "INPUT_TOKENS",
    "NO_SPAN",
    "OPERATION",
    "OUTPUT_TOKENS",
    "PROVIDER",
    "QUERY_TEXT",
    "RECORDS",
    "RECORD_COUNT",
    "RECORD_ID",
    "REQUEST_MODEL",
    "RESPONSE_MODEL",
    "SERVER_ADDRESS",
    "SERVER_PORT",
    "STORE_ID",
    "USER_ID",
    "Span",
    "carry",
    "chat_span",
    "current_context",
    "current_trace_id",
    "embeddings_span",
    "extract",
    "failed",
    "headers_for",
    "memory_records",
    "memory_span",
    "name_embeddings",
    "open_span",
    "outgoing_headers",
    "set_tracer_provider",
    "span",
]

# GenAI semantic conventions (gen-ai-spans.md: "Memory", "Inference", "Embeddings").
OPERATION = "gen_ai.operation.name"
PROVIDER = "gen_ai.provider.name"
STORE_ID = "gen_ai.memory.store.id"
RECORD_ID = "gen_ai.memory.record.id"
RECORD_COUNT = "gen_ai.memory.record.count"
QUERY_TEXT = "gen_ai.memory.query.text"  # opt-in (trace_content)
RECORDS = "gen_ai.memory.records"  # opt-in (trace_content)
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
CONVERSATION_ID = "gen_ai.conversation.id"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
ERROR_TYPE = "error.type"
USER_ID = "user.id"

_SCOPE = "stratamem"

Kind = Literal["internal", "server", "client"]
Attributes = Mapping[str, Any]

_P = ParamSpec("_P")
_R = TypeVar("_R")


class Span(Protocol):
    """What instrumented code does with a span: an OpenTelemetry span, or the no-op."""

    def is_recording(self) -> bool: ...
    def set_attribute(self, key: str, value: Any) -> Any: ...
    def update_name(self, name: str) -> Any: ...
    def end(self) -> Any: ...


class _NoSpan:
    """The span of untraced code: every call does nothing."""

    def is_recording(self) -> bool:
        return False

    def set_attribute(self, key: str, value: Any) -> None:
        return None

    def update_name(self, name: str) -> None:
        return None

    def end(self) -> None:
        return None


NO_SPAN: Span = _NoSpan()


class _NoSpanContext(AbstractContextManager[Span]):
    def __enter__(self) -> Span:
        return NO_SPAN

    def __exit__(self, *exc: object) -> None:
        return None


_NOTHING = _NoSpanContext()


class _Api:
    """The parts of opentelemetry-api in use, imported once."""

    def __init__(self) -> None:
        from opentelemetry import context, propagate, trace

        self.trace = trace
        self.context = context
        self.propagate = propagate
        self.kinds = {
            "internal": trace.SpanKind.INTERNAL,
            "server": trace.SpanKind.SERVER,
            "client": trace.SpanKind.CLIENT,
        }
        self.unset = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)


_api: _Api | None = None
_absent = False
# A provider given by set_tracer_provider (tests, bench/): used instead of the global one.
_provider: Any = None
_tracer: Any = None
_tracer_of: Any = None


def _loaded() -> _Api | None:
    global _api, _absent
    if _api is None and not _absent:
        try:
            _api = _Api()
        except ImportError:
            _absent = True
    return _api


def set_tracer_provider(provider: Any) -> None:
    """Trace with ``provider`` instead of the global one (None: the global one again). For
    tests and benchmarks, which switch tracing on and off in one process; an application
    sets OpenTelemetry's global provider as usual."""
    global _provider, _tracer, _tracer_of
    _provider, _tracer, _tracer_of = provider, None, None


def _active_tracer() -> tuple[_Api, Any] | None:
    """The API and a tracer, when spans would be recorded somewhere."""
    api = _api if _api is not None else _loaded()
    if api is None:
        return None
    global _tracer, _tracer_of
    provider = _provider if _provider is not None else api.trace.get_tracer_provider()
    if isinstance(provider, api.unset):
        return None  # no SDK configured: every span would be a no-op
    if _tracer is None or _tracer_of is not provider:
        _tracer, _tracer_of = provider.get_tracer(_SCOPE), provider
    return api, _tracer


def span(
    name: str,
    attributes: Attributes | None = None,
    *,
    kind: Kind = "internal",
    links: Sequence[Any] = (),
    context: Any = None,
    child: bool = False,
) -> AbstractContextManager[Span]:
    """A span around the block, current inside it; an exception leaving the block is
    recorded with its ``error.type``. ``child``: only under a recording span (a stage of
    something traced). ``context``: the parent (an incoming request's, :func:`extract`),
    instead of the current one. ``links``: span contexts this work follows from."""
    active = _active_tracer()
    if active is None:
        return _NOTHING
    api, tracer = active
    if child and not api.trace.get_current_span().is_recording():
        return _NOTHING
    started = tracer.start_span(
        name,
        context=context,
        kind=api.kinds[kind],
        attributes=attributes,
        links=[api.trace.Link(c) for c in links if c is not None and c.is_valid] if links else None,
    )
    return _Recorded(api, started)


class _Recorded(AbstractContextManager[Span]):
    """A recording span, current inside the block. Written out rather than through the
    API's ``start_as_current_span``: two generator-based context managers fewer per span
    (a recall makes about ten), which keeps tracing within a few percent of a search."""

    __slots__ = ("_api", "_span", "_token")

    def __init__(self, api: _Api, span: Any) -> None:
        self._api = api
        self._span = span
        self._token: Any = None

    def __enter__(self) -> Span:
        api = self._api
        self._token = api.context.attach(api.trace.set_span_in_context(self._span))
        span: Span = self._span
        return span

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any
    ) -> None:
        span, api = self._span, self._api
        try:
            if exc is not None and span.is_recording():
                span.set_attribute(ERROR_TYPE, type(exc).__qualname__)
                span.record_exception(exc)
                span.set_status(
                    api.trace.Status(api.trace.StatusCode.ERROR, f"{type(exc).__name__}: {exc}")
                )
        finally:
            api.context.detach(self._token)
            span.end()


def open_span(name: str, attributes: Attributes, *, kind: Kind = "client") -> Span:
    """A span started now under the current one and ended by the caller (``end()``): work
    that outlives the block that starts it (a streamed answer relayed)."""
    active = _active_tracer()
    if active is None:
        return NO_SPAN
    api, tracer = active
    started: Span = tracer.start_span(name, kind=api.kinds[kind], attributes=dict(attributes))
    return started


def headers_for(current: Span) -> dict[str, str]:
    """The headers that carry ``current`` (an :func:`open_span`) to a service it calls."""
    if not current.is_recording() or _api is None:
        return {}
    carrier: dict[str, str] = {}
    _api.propagate.inject(carrier, context=_api.trace.set_span_in_context(current))
    return carrier


def failed(current: Span, exc: BaseException, *, error_type: str | None = None) -> None:
    """Mark ``current`` failed by ``exc``, handled inside it (a span that an exception
    leaves is marked by :func:`span` itself); ``error.type`` is the exception's class
    unless given."""
    if not current.is_recording():
        return
    api = _api
    assert api is not None
    current.set_attribute(ERROR_TYPE, error_type or type(exc).__qualname__)
    recorded: Any = current
    recorded.record_exception(exc)
    recorded.set_status(api.trace.Status(api.trace.StatusCode.ERROR, str(exc)[:300]))


def memory_span(
    operation: str,
    project_id: str,
    *,
    user_id: str | None = None,
    session_id: str | None = None,
    record_id: str | None = None,
    count: int | None = None,
    attributes: Attributes | None = None,
) -> AbstractContextManager[Span]:
    """A GenAI memory operation (``search_memory``, ``create_memory``, ``update_memory``,
    ``delete_memory``, ``create_memory_store``...): its span is named by the operation, and
    ``gen_ai.memory.store.id`` is the project (stratamem's memory store is a project)."""
    if _active_tracer() is None:
        return _NOTHING
    given: dict[str, Any] = {OPERATION: operation, STORE_ID: project_id}
    if user_id is not None:
        given[USER_ID] = user_id
    if session_id is not None:
        given[CONVERSATION_ID] = session_id
    if record_id is not None:
        given[RECORD_ID] = record_id
    if count is not None:
        given[RECORD_COUNT] = count
    given.update({k: v for k, v in (attributes or {}).items() if v is not None})
    return span(operation, given)


def chat_span(provider: str, model: str, server: str | None = None) -> AbstractContextManager[Span]:
    """A model call (a GenAI inference client span, ``chat {model}``): the caller sets the
    usage and the response model on it."""
    if _active_tracer() is None:
        return _NOTHING
    attributes: dict[str, Any] = {OPERATION: "chat", PROVIDER: provider, REQUEST_MODEL: model}
    attributes.update(_server(server))
    return span(f"chat {model}", attributes, kind="client")


def embeddings_span(embedder: str | None, texts: int) -> AbstractContextManager[Span]:
    """Texts embedded, under the recall or batch that asked (a GenAI embeddings span,
    ``embeddings {model}``): ``embedder`` is the embedder's id (``local:all-MiniLM...``,
    ``openai:text-embedding-3-small:1536``; None while not known yet)."""
    if _active_tracer() is None:
        return _NOTHING
    name, attributes = _embedder_names(embedder)
    attributes.update({OPERATION: "embeddings", "stratamem.embedder.texts": texts})
    return span(name, attributes, child=True)


def name_embeddings(current: Span, embedder: str) -> None:
    """Name an embeddings span made before its embedder's id was known."""
    if current.is_recording():
        name, attributes = _embedder_names(embedder)
        current.update_name(name)
        for key, value in attributes.items():
            current.set_attribute(key, value)


def _embedder_names(embedder: str | None) -> tuple[str, dict[str, Any]]:
    """The span name and attributes of an embedder's id: its provider is the part before
    the first colon (``local``, ``hash``, ``openai``), its model the rest."""
    if embedder is None:
        return "embeddings", {}
    provider, _, model = embedder.partition(":")
    model = model or provider
    return f"embeddings {model}", {PROVIDER: provider, REQUEST_MODEL: model}


def _server(url: str | None) -> dict[str, Any]:
    if not url:
        return {}
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return {}
    return {SERVER_ADDRESS: parts.hostname, SERVER_PORT: port} if parts.hostname else {}


def memory_records(records: Sequence[Mapping[str, Any]]) -> str:
    """``gen_ai.memory.records`` as a JSON string (the conventions' memory records schema:
    ``content`` and, when known, ``id``, ``score``, ``metadata``); for opted-in spans only."""
    return json.dumps([dict(r) for r in records], ensure_ascii=False, default=str)


def carry(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """``fn`` running in this thread's trace context wherever it is called (a pool thread
    does not inherit it); ``fn`` itself when nothing is traced."""
    active = _active_tracer()
    if active is None:
        return fn
    api = active[0]
    if not api.trace.get_current_span().get_span_context().is_valid:
        return fn
    context = api.context.get_current()

    def run(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        token = api.context.attach(context)
        try:
            return fn(*args, **kwargs)
        finally:
            api.context.detach(token)

    return run


def current_context() -> Any:
    """The current span's context, to link later work to (None when nothing is traced)."""
    active = _active_tracer()
    if active is None:
        return None
    context = active[0].trace.get_current_span().get_span_context()
    return context if context.is_valid else None


def current_trace_id() -> str | None:
    """The current trace's id (32 hex digits), for log lines; None outside a trace."""
    api = _api  # never imports: without a span made, there is no trace
    if api is None:
        return None
    context = api.trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else None


def extract(headers: Mapping[str, str]) -> Any:
    """The trace context an incoming request carries (W3C ``traceparent``/``tracestate``,
    or whatever the configured propagator reads), for :func:`span`'s ``context``."""
    active = _active_tracer()
    if active is None:
        return None
    return active[0].propagate.extract(headers)


def outgoing_headers() -> dict[str, str]:
    """The headers that carry the current trace to a service called now (``traceparent``
    ...); empty when nothing is traced."""
    active = _active_tracer()
    if active is None:
        return {}
    api = active[0]
    if not api.trace.get_current_span().get_span_context().is_valid:
        return {}
    carrier: dict[str, str] = {}
    api.propagate.inject(carrier)
    return carrier
