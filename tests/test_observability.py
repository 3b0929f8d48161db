"""Traces, metrics and costs (docs/observability.md), read back as a monitoring stack would:
spans from OpenTelemetry's in-memory exporter, ``/metrics`` through Prometheus' own text
parser, OpenTelemetry metrics from an in-memory reader. Real stores, real HTTP to the
loopback fakes; nothing of stratamem's is mocked.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

import httpx
import openai
import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from fakes.memory_model import MemoryModel
from fakes.openai_server import FakeOpenAIServer
from fakes.webhook_receiver import WebhookReceiver
from inproc_server import InProcessServer
from stratamem import Memory, _metrics, _tracing
from stratamem.cli import main
from stratamem.proxy import create_proxy_app
from stratamem.server import create_app, load_server_settings

SECRET = "zanzibar"  # a word only the user says: it must not leak onto spans unless opted in
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


class Spans:
    """What the in-memory exporter holds, as a tree."""

    def __init__(self, exporter: InMemorySpanExporter) -> None:
        self.exporter = exporter

    @property
    def all(self) -> Sequence[ReadableSpan]:
        return self.exporter.get_finished_spans()

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.all if s.name == name]

    def one(self, name: str) -> ReadableSpan:
        found = self.named(name)
        assert len(found) == 1, (name, [s.name for s in self.all])
        return found[0]

    def children(self, parent: ReadableSpan) -> list[ReadableSpan]:
        return [s for s in self.all if s.parent is not None and s.parent.span_id == _id(parent)]

    def child_names(self, parent: ReadableSpan) -> set[str]:
        return {s.name for s in self.children(parent)}

    def under(self, ancestor: ReadableSpan, span: ReadableSpan) -> bool:
        by_id = {_id(s): s for s in self.all}
        while span.parent is not None:
            if span.parent.span_id == _id(ancestor):
                return True
            parent = by_id.get(span.parent.span_id)
            if parent is None:
                return False
            span = parent
        return False

    def wait_for(self, name: str, timeout: float = 10.0) -> ReadableSpan:
        deadline = time.monotonic() + timeout
        while not self.named(name):
            assert time.monotonic() < deadline, f"no span {name!r}"
            time.sleep(0.02)
        return self.named(name)[0]


def _id(span: ReadableSpan) -> int:
    context = span.get_span_context()
    assert context is not None
    return context.span_id


def _traceparent(span: ReadableSpan) -> str:
    """The W3C ``traceparent`` that names ``span`` as the parent."""
    c = span.get_span_context()
    assert c is not None
    return f"00-{c.trace_id:032x}-{c.span_id:016x}-{c.trace_flags:02x}"


def _attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


@pytest.fixture
def spans() -> Iterator[Spans]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _tracing.set_tracer_provider(provider)
    try:
        yield Spans(exporter)
    finally:
        _tracing.set_tracer_provider(None)
        provider.shutdown()


@pytest.fixture
def reader() -> Iterator[InMemoryMetricReader]:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    _metrics.set_meter_provider(provider)
    try:
        yield reader
    finally:
        _metrics.set_meter_provider(None)
        provider.shutdown()


def _seeded(make_memory: Any, **options: Any) -> Memory:
    mem = make_memory(**options)
    s = mem.sessions.create(user_id="ana", session_id="chat")
    s.add_messages(
        [{"role": "user", "content": f"I live in Berlin and my cat is called {SECRET}."}],
        sync=True,
    )
    return mem


def _llm_memory(make_memory: Any, server: FakeOpenAIServer, **options: Any) -> Memory:
    return make_memory(
        llm="openai:fake-chat",
        llm_base_url=server.base_url,
        llm_api_key="k",
        llm_max_retries=0,
        **options,
    )


def _no_secret(spans: Spans) -> None:
    for span in spans.all:
        for key, value in _attrs(span).items():
            assert SECRET not in str(value), (span.name, key)


# -- traces --------------------------------------------------------------------------------


def test_a_search_is_a_search_memory_span_with_its_stages(make_memory: Any, spans: Spans) -> None:
    mem = _seeded(make_memory)
    spans.exporter.clear()
    hits = mem.search("Where do I live?", user_id="ana")
    assert hits
    root = spans.one("search_memory")
    assert root.parent is None
    assert root.kind == trace.SpanKind.INTERNAL
    assert _attrs(root) == {
        "gen_ai.operation.name": "search_memory",
        "gen_ai.memory.store.id": mem.project_id,
        "user.id": "ana",
        "stratamem.recall": "search",
        "gen_ai.memory.record.count": len(hits),
    }
    assert spans.child_names(root) == {"stratamem.recall.retrieve", "stratamem.recall.score"}
    retrieve = spans.one("stratamem.recall.retrieve")
    # Full text runs in a pool thread: its span is still the retrieval's child.
    assert spans.child_names(retrieve) == {
        "embeddings v2:384",  # the hashing embedder's id: hash:v2:384
        "stratamem.recall.fulltext",
        "stratamem.recall.vectors",
    }
    (embedding,) = [s for s in spans.children(retrieve) if s.name.startswith("embeddings")]
    assert _attrs(embedding)["gen_ai.operation.name"] == "embeddings"
    assert _attrs(embedding)["gen_ai.provider.name"] == "hash"
    assert _attrs(embedding)["stratamem.embedder.texts"] >= 1
    assert _attrs(spans.one("stratamem.recall.fulltext"))["stratamem.recall.candidates"] >= 1
    assert all(s.context.trace_id == root.context.trace_id for s in spans.all)
    _no_secret(spans)


def test_query_and_memory_text_only_when_opted_in(make_memory: Any, spans: Spans) -> None:
    quiet = _seeded(make_memory)
    spans.exporter.clear()
    quiet.search(f"What is {SECRET}?", user_id="ana")
    quiet.sessions.get("chat").get_memory(f"Tell me about {SECRET}")
    assert {s.name for s in spans.all} >= {"search_memory"}
    _no_secret(spans)

    told = _seeded(make_memory, trace_content=True)
    spans.exporter.clear()
    hits = told.search(f"What is {SECRET}?", user_id="ana")
    span = spans.one("search_memory")
    assert _attrs(span)["gen_ai.memory.query.text"] == f"What is {SECRET}?"
    records = json.loads(_attrs(span)["gen_ai.memory.records"])
    assert [r["id"] for r in records] == [h.id for h in hits]
    assert any(SECRET in r["content"] for r in records)
    assert all(isinstance(r["score"], float) for r in records)


def test_writes_updates_and_deletes_are_memory_operations(make_memory: Any, spans: Spans) -> None:
    mem = make_memory(workers=0)
    mem.projects.create("Shop", project_id="shop")
    s = mem.sessions.create(user_id="ana", session_id="chat")
    added = s.add_messages([{"role": "user", "content": "I moved to Lisbon."}], sync=True)
    summary = mem.summaries.list(user_id="ana")[0]
    mem.set_status(summary.id, "archived", reason="test")
    mem.forget(user_id="ana", message_ids=added.message_ids)
    s2 = mem.sessions.create(user_id="bo")
    s2.add_messages([{"role": "user", "content": "Hi"}], sync=True)
    mem.erase_user("bo")

    store = spans.one("create_memory_store")
    assert _attrs(store)["gen_ai.memory.store.id"] == "shop"
    create = spans.named("create_memory")[0]
    assert _attrs(create) == {
        "gen_ai.operation.name": "create_memory",
        "gen_ai.memory.store.id": mem.project_id,
        "gen_ai.conversation.id": "chat",
        "gen_ai.memory.record.count": 1,
        "gen_ai.memory.record.id": added.message_ids[0],
    }
    update = spans.one("update_memory")
    assert _attrs(update)["gen_ai.memory.record.id"] == summary.id
    assert _attrs(update)["stratamem.summary.status"] == "archived"
    forget, erase = spans.named("delete_memory")
    assert _attrs(forget)["gen_ai.memory.record.id"] == added.message_ids[0]
    assert _attrs(forget)["gen_ai.memory.record.count"] >= 1
    assert "gen_ai.memory.record.id" not in _attrs(erase)  # all of the user's records
    assert _attrs(erase)["user.id"] == "bo"
    # The batch that processed the first message: its derived layers, written at once.
    batch = spans.named("stratamem.process_batch")[0]
    upsert = next(s for s in spans.children(batch) if s.name == "upsert_memory")
    assert _attrs(upsert)["gen_ai.memory.record.count"] >= 2  # a fact and a summary at least
    assert _attrs(batch)["stratamem.batch.messages"] == 1


def test_an_error_marks_the_span(make_memory: Any, spans: Spans) -> None:
    mem = make_memory()
    with pytest.raises(Exception, match="no session"):
        mem.get_memory("nope", "anything")
    with pytest.raises(Exception):  # noqa: B017 - the class is what the span must name
        mem.set_status("s_missing", "archived", reason="x")
    span = spans.one("update_memory")
    assert span.status.status_code == trace.StatusCode.ERROR
    assert _attrs(span)["error.type"] == "NotFoundError"


def test_a_processed_batch_traces_its_model_calls(
    make_memory: Any, openai_server: FakeOpenAIServer, spans: Spans
) -> None:
    mem = _llm_memory(make_memory, openai_server, workers=0)
    s = mem.sessions.create(user_id="ana", session_id="chat")
    s.add_messages([{"role": "user", "content": "I live in Berlin."}], sync=True)
    batch = spans.one("stratamem.process_batch")
    assert _attrs(batch)["gen_ai.memory.store.id"] == mem.project_id
    assert _attrs(batch)["user.id"] == "ana"
    chats = [s for s in spans.all if s.name == "chat fake-chat"]
    assert len(chats) == len(openai_server.chat_requests()) >= 2  # extract, consolidate, ...
    for chat in chats:
        assert spans.under(batch, chat)
        assert chat.kind == trace.SpanKind.CLIENT
        a = _attrs(chat)
        assert a["gen_ai.operation.name"] == "chat"
        assert a["gen_ai.provider.name"] == "openai"
        assert a["gen_ai.request.model"] == "fake-chat"
        assert a["gen_ai.usage.input_tokens"] > 0 and a["gen_ai.usage.output_tokens"] > 0
        assert a["server.address"] == "127.0.0.1"
    # Each call carried its own span's context to the provider.
    sent = [h["traceparent"] for h in openai_server.request_headers if "traceparent" in h]
    assert sorted(sent) == sorted(_traceparent(c) for c in chats)
    assert spans.child_names(batch) >= {"embeddings v2:384", "upsert_memory"}


def test_a_webhook_delivery_is_a_client_span_that_carries_the_trace(
    make_memory: Any, spans: Spans
) -> None:
    with WebhookReceiver() as receiver:
        mem = make_memory(webhook_allow="127.0.0.1", workers=0)
        hook, _ = mem.webhooks.create(
            resource="fact", event="before_add", target_url=receiver.url("/facts")
        )
        s = mem.sessions.create(user_id="ana")
        s.add_messages([{"role": "user", "content": "I live in Berlin."}], sync=True)
        (received,) = receiver.at("/facts")
    post = spans.one("POST")
    assert post.kind == trace.SpanKind.CLIENT
    assert _attrs(post) == {
        "http.request.method": "POST",
        "stratamem.webhook.id": hook.id,
        "stratamem.webhook.event": "fact.before_add",
        "stratamem.webhook.mode": "sync",
        "server.address": "127.0.0.1",
        "http.response.status_code": 200,
    }
    assert spans.under(spans.one("stratamem.process_batch"), post)
    assert received.headers["traceparent"] == _traceparent(post)
    assert "url.full" not in _attrs(post)  # a webhook URL may hold a secret


def test_a_rest_context_call_continues_the_callers_trace(
    make_memory: Any, spans: Spans, caplog: pytest.LogCaptureFixture
) -> None:
    mem = _seeded(make_memory)
    mem.projects.create("default", project_id=mem.project_id)
    _, key = mem.keys.create(mem.project_id)
    spans.exporter.clear()
    settings = load_server_settings(ui=False)
    with InProcessServer(create_app(mem, settings)) as server, caplog.at_level("INFO"):
        r = httpx.get(
            f"{server.url}/api/sessions/chat/context",
            params={"query": "Where do I live?"},
            headers={"Authorization": f"Api-Key {key}", "traceparent": TRACEPARENT},
        )
        assert r.status_code == 200, r.text
    route = "/api/sessions/{session_id}/context"
    served = spans.one(f"GET {route}")
    assert served.kind == trace.SpanKind.SERVER
    assert f"{served.context.trace_id:032x}" == TRACE_ID
    assert served.parent is not None and f"{served.parent.span_id:016x}" == PARENT_ID
    assert served.parent.is_remote
    a = _attrs(served)
    assert a["http.route"] == route and a["http.response.status_code"] == 200
    assert a["stratamem.request_id"] == r.headers["x-request-id"]
    recall = spans.one("search_memory")
    assert spans.under(served, recall)
    assert _attrs(recall)["stratamem.recall"] == "context"
    assert _attrs(recall)["gen_ai.conversation.id"] == "chat"
    assert spans.child_names(recall) == {"stratamem.recall.assemble"}
    # The access log line names the trace: from a log line to its spans.
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "stratamem.access"]
    assert [line.get("trace_id") for line in lines if line["path"] == route] == [TRACE_ID]
    _no_secret(spans)


def test_a_captured_call_recalls_under_the_callers_model_call_span(
    make_memory: Any, spans: Spans
) -> None:
    mem = _seeded(make_memory)
    spans.exporter.clear()
    tracer = spans_tracer()
    with FakeOpenAIServer() as llm:
        llm.chat_script = lambda body: "Noted!"
        client = mem.llm.register(openai.OpenAI(base_url=llm.base_url, api_key="k"))
        # A framework's instrumentation opens its model-call span before the SDK is
        # called (capture runs inside it): the recall is its child.
        with (
            tracer.start_as_current_span("chat gpt-test", kind=trace.SpanKind.CLIENT) as call,
            mem.scope(user_id="ana", session_id="chat"),
        ):
            client.chat.completions.create(
                model="gpt-test", messages=[{"role": "user", "content": "Where do I live?"}]
            )
        assert mem.llm.flush(10)
    recall = spans.one("stratamem.recall")
    assert recall.parent is not None and recall.parent.span_id == call.get_span_context().span_id
    assert _attrs(recall) == {
        "stratamem.face": "capture",
        "stratamem.request": "openai chat.completions",
        "stratamem.recall.outcome": "injected",
        "gen_ai.memory.record.count": _attrs(recall)["gen_ai.memory.record.count"],
    }
    # get_memory ran in capture's recall thread, in the caller's trace.
    search = spans.one("search_memory")
    assert spans.under(recall, search)
    # The exchange is stored later by the writer thread: a root span linked to the call.
    stored = spans.wait_for("stratamem.capture.store")
    assert stored.parent is None
    assert [link.context.span_id for link in stored.links] == [call.get_span_context().span_id]
    create = next(s for s in spans.named("create_memory") if spans.under(stored, s))
    assert _attrs(create)["gen_ai.memory.record.count"] == 2  # the turn and the answer
    _no_secret(spans)


def spans_tracer() -> trace.Tracer:
    """A tracer of the provider the ``spans`` fixture installed: the application's own."""
    provider = _tracing._provider
    assert provider is not None
    tracer: trace.Tracer = provider.get_tracer("the application")
    return tracer


def test_a_proxied_call_continues_the_trace_to_the_upstream(make_memory: Any, spans: Spans) -> None:
    mem = _seeded(make_memory)
    spans.exporter.clear()
    with FakeOpenAIServer() as llm:
        llm.chat_script = lambda body: "Noted!"
        settings = load_server_settings(proxy_upstream=llm.base_url)
        with InProcessServer(create_proxy_app(mem, settings)) as proxy:
            r = httpx.post(
                f"{proxy.url}/v1/chat/completions",
                json={"model": "gpt-test", "messages": [{"role": "user", "content": "Hi?"}]},
                headers={
                    "traceparent": TRACEPARENT,
                    "x-stratamem-user-id": "ana",
                    "x-stratamem-session-id": "chat",
                },
                timeout=30,
            )
            assert r.status_code == 200, r.text
        assert mem.llm.flush(10)
        (upstream_headers,) = [h for h in llm.request_headers if "traceparent" in h]
    (served,) = [
        s for s in spans.named("POST /v1/chat/completions") if s.kind == trace.SpanKind.SERVER
    ]
    assert served.parent is not None and f"{served.parent.span_id:016x}" == PARENT_ID
    recall = spans.one("stratamem.recall")
    assert recall.parent is not None and recall.parent.span_id == _id(served)
    assert _attrs(recall)["stratamem.face"] == "proxy"
    assert spans.under(recall, spans.one("search_memory"))  # across the proxy's thread
    (upstream,) = [
        s for s in spans.named("POST /v1/chat/completions") if s.kind == trace.SpanKind.CLIENT
    ]
    assert upstream.parent is not None and upstream.parent.span_id == _id(served)
    assert _attrs(upstream)["url.template"] == "/v1/chat/completions"
    assert _attrs(upstream)["http.response.status_code"] == 200
    # The upstream's parent is the proxy's call, not the caller's span.
    assert upstream_headers["traceparent"] == _traceparent(upstream)
    assert _traceparent(upstream).startswith(f"00-{TRACE_ID}-")


def test_without_a_tracer_provider_nothing_is_traced_and_nothing_is_sent(
    make_memory: Any, openai_server: FakeOpenAIServer
) -> None:
    mem = _llm_memory(make_memory, openai_server, workers=0)
    s = mem.sessions.create(user_id="ana")
    s.add_messages([{"role": "user", "content": "I live in Berlin."}], sync=True)
    assert mem.search("Berlin", user_id="ana")
    assert openai_server.request_headers
    assert not [h for h in openai_server.request_headers if "traceparent" in h]
    with _tracing.span("x") as span:
        assert not span.is_recording()


def test_without_opentelemetry_installed_everything_works() -> None:
    code = (
        "import sys\n"
        "sys.modules['opentelemetry'] = None  # as if the otel extra were not installed\n"
        "import tempfile\n"
        "from stratamem import Memory, _metrics, _tracing\n"
        "with Memory(f'sqlite:///{tempfile.mkdtemp()}/m.db', embedder='hash', workers=0) as m:\n"
        "    s = m.sessions.create(user_id='u')\n"
        "    s.add_messages([{'role': 'user', 'content': 'I live in Oslo.'}], sync=True)\n"
        "    assert m.search('Oslo', user_id='u')\n"
        "    with _tracing.span('x') as span:\n"
        "        assert not span.is_recording()\n"
        "    assert _tracing.outgoing_headers() == {}\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


# -- metrics -------------------------------------------------------------------------------


# metric name -> its samples' sorted labels -> value
Samples = dict[str, dict[tuple[tuple[str, str], ...], float]]


def _scrape(url: str, token: str | None = None) -> Samples:
    """``/metrics`` as Prometheus reads it (its own text parser)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    r = httpx.get(f"{url}/metrics", headers=headers)
    assert r.status_code == 200, r.text
    samples: Samples = {}
    for family in text_string_to_metric_families(r.text):
        for sample in family.samples:
            key = tuple(sorted(sample.labels.items()))
            samples.setdefault(sample.name, {})[key] = sample.value
    return samples


def _delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return _value(after, name, **labels) - _value(before, name, **labels)


def _value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels`` (0 when none)."""
    return sum(
        v for key, v in samples.get(name, {}).items() if all((k, labels[k]) in key for k in labels)
    )


def test_metrics_are_off_by_default_and_behind_their_token(make_memory: Any) -> None:
    mem = make_memory()
    with InProcessServer(create_app(mem, load_server_settings(ui=False))) as server:
        assert httpx.get(f"{server.url}/metrics").status_code == 404
    settings = load_server_settings(ui=False, metrics=True, metrics_token="scrape-me")
    with InProcessServer(create_app(mem, settings)) as server:
        refused = httpx.get(f"{server.url}/metrics")
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"].startswith("Bearer")
        wrong = httpx.get(f"{server.url}/metrics", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        assert "stratamem_http_request_duration_seconds_count" in _scrape(server.url, "scrape-me")


def test_metrics_count_requests_recalls_and_jobs(make_memory: Any) -> None:
    mem = _seeded(make_memory)
    mem.projects.create("default", project_id=mem.project_id)
    _, key = mem.keys.create(mem.project_id)
    auth = {"Authorization": f"Api-Key {key}"}
    settings = load_server_settings(ui=False, metrics=True)
    route = "/api/sessions/{session_id}/context"
    with InProcessServer(create_app(mem, settings)) as server:
        before = _scrape(server.url)
        for _ in range(3):
            r = httpx.get(f"{server.url}/api/sessions/chat/context?query=Berlin", headers=auth)
            assert r.status_code == 200
        assert httpx.get(f"{server.url}/api/sessions/nope/context", headers=auth).status_code == 404
        r = httpx.post(
            f"{server.url}/api/sessions/chat/messages",
            json={"messages": [{"role": "user", "content": "I also like chess."}]},
            headers=auth,
        )
        assert r.status_code in (200, 201), r.text
        mem.wait(30)
        after = _scrape(server.url)
    http = "stratamem_http_request_duration_seconds_count"
    assert _delta(before, after, http, route=route, status="200") == 3
    assert _delta(before, after, http, route=route, status="404") == 1
    assert _delta(before, after, http, route="/metrics") == 1  # the first scrape
    assert _delta(before, after, http, route="unmatched") == 0
    # No raw path (no session id) in any label.
    assert not [k for k in after[http] if any("/sessions/chat" in v for _, v in k)]
    assert _delta(before, after, "stratamem_recall_duration_seconds_count", face="rest") == 3
    project = mem.project_id
    assert _delta(before, after, "stratamem_jobs_processed_total", project=project) >= 1
    texts = "stratamem_embedder_texts_total"
    assert _delta(before, after, texts, embedder="hash:v2:384") > 0
    assert _value(after, "stratamem_processing_paused") == 0


def test_queue_depth_and_lag_are_read_from_the_store(make_memory: Any) -> None:
    mem = make_memory(workers=0)  # nothing processes: the job waits
    s = mem.sessions.create(user_id="ana")
    s.add_messages([{"role": "user", "content": "Queued."}])
    time.sleep(0.05)
    _metrics.enable_prometheus()
    text = _metrics.prometheus_exposition()[0].decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    project = mem.project_id
    assert samples[("stratamem_queue_jobs", (("project", project), ("state", "queued")))] >= 1
    lag = samples[("stratamem_queue_oldest_job_age_seconds", (("project", project),))]
    assert lag >= 0.05
    mem.wait(30)
    text = _metrics.prometheus_exposition()[0].decode()
    assert f'stratamem_queue_jobs{{project="{project}",state="queued"}}' not in text


def test_pipeline_tokens_and_recalls_reach_opentelemetry_metrics(
    make_memory: Any, openai_server: FakeOpenAIServer, reader: InMemoryMetricReader
) -> None:
    mem = _llm_memory(make_memory, openai_server, workers=0)
    s = mem.sessions.create(user_id="ana", session_id="chat")
    s.add_messages([{"role": "user", "content": "I live in Berlin."}], sync=True)
    data = reader.get_metrics_data()
    points: dict[str, list[Any]] = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                points.setdefault(metric.name, []).extend(metric.data.data_points)
    usage = points["gen_ai.client.token.usage"]
    by_type = {
        p.attributes["gen_ai.token.type"]: p
        for p in usage
        if p.attributes["stratamem.pipeline.stage"] == "extract"
    }
    calls = [c for c in mem.store.stats(mem.project_id)["llm_usage"].items() if "extract" in c[0]]
    ((_, extract),) = calls
    assert by_type["input"].sum == extract["prompt_tokens"]
    assert by_type["output"].sum == extract["completion_tokens"]
    attrs = by_type["input"].attributes
    assert attrs["gen_ai.provider.name"] == "openai"
    assert attrs["gen_ai.request.model"] == "fake-chat"
    assert attrs["stratamem.project.id"] == mem.project_id
    assert sum(p.count for p in points["gen_ai.client.operation.duration"]) == len(
        openai_server.chat_requests()
    )
    assert sum(p.value for p in points["stratamem.jobs.processed"]) >= 1
    observed = {
        (p.attributes["stratamem.job.state"], p.value)
        for p in points.get("stratamem.queue.jobs", [])
        if p.attributes["stratamem.project.id"] == mem.project_id
    }
    assert ("queued", 1) not in observed  # processed: nothing waits


def test_project_labels_are_bounded() -> None:
    seen = len(_metrics._projects)
    for i in range(_metrics.MAX_PROJECT_LABELS - seen + 3):
        _metrics.project_label(f"bounded-{i}")
    assert _metrics.project_label("one-more") == "_other"
    assert len(_metrics._projects) == _metrics.MAX_PROJECT_LABELS + 1


# -- costs ---------------------------------------------------------------------------------


def test_usage_counts_tokens_per_day_and_model_and_prices_them(
    make_memory: Any, openai_server: FakeOpenAIServer
) -> None:
    prices = {"fake-chat": {"prompt": 2.0, "completion": 8.0}}
    mem = _llm_memory(make_memory, openai_server, workers=0, llm_prices=prices)
    s = mem.sessions.create(user_id="ana")
    s.add_messages(
        [
            {"role": "user", "content": "I live in Berlin."},
            {"role": "user", "content": "I play chess on Sundays."},
        ],
        sync=True,
    )
    calls = mem.stats()["llm_usage"]
    prompt = sum(c["prompt_tokens"] for c in calls.values())
    completion = sum(c["completion_tokens"] for c in calls.values())
    assert prompt and completion

    usage = mem.usage(days=3)
    assert len(usage.days) == 3 and usage.days[-1].day == usage.since.fromordinal(
        usage.since.toordinal() + 2
    )
    today = usage.days[-1]
    assert today.messages_processed == 2
    assert (today.prompt_tokens, today.completion_tokens) == (prompt, completion)
    assert today.tokens_per_message == round((prompt + completion) / 2, 1)
    (model,) = usage.models
    assert model.model == "openai:fake-chat"
    assert model.calls == sum(c["calls"] for c in calls.values())
    expected = (prompt * 2.0 + completion * 8.0) / 1_000_000
    assert model.cost == pytest.approx(expected)
    assert usage.cost == pytest.approx(expected) and today.cost == pytest.approx(expected)
    assert usage.unpriced == []
    assert [d.tokens_per_message for d in usage.days[:-1]] == [None, None]

    unpriced = _llm_memory(make_memory, openai_server, workers=0)
    assert unpriced.usage(days=1).cost is None
    assert unpriced.usage(days=1).unpriced == ["openai:fake-chat"]
    with pytest.raises(Exception, match="days"):
        mem.usage(days=0)


def test_usage_over_rest_and_in_stats(
    make_memory: Any,
    db_url: str,
    openai_server: FakeOpenAIServer,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    prices = {"openai:fake-chat": {"prompt": 1.0, "completion": 1.0}}
    mem = _llm_memory(make_memory, openai_server, workers=0, llm_prices=prices)
    mem.projects.create("default", project_id=mem.project_id)
    _, key = mem.keys.create(mem.project_id)
    s = mem.sessions.create(user_id="ana")
    s.add_messages([{"role": "user", "content": "I live in Berlin."}], sync=True)
    expected = mem.usage(days=7)
    with InProcessServer(create_app(mem, load_server_settings(ui=False))) as server:
        auth = {"Authorization": f"Api-Key {key}"}
        r = httpx.get(f"{server.url}/api/usage", params={"days": 7}, headers=auth)
        assert r.status_code == 200, r.text
        assert r.json()["data"] == json.loads(expected.model_dump_json())
        bad = httpx.get(f"{server.url}/api/usage", params={"days": 400}, headers=auth)
        assert bad.status_code == 422
        assert httpx.get(f"{server.url}/api/usage").status_code == 401

    (model,) = expected.models
    assert model.cost is not None
    monkeypatch.setenv("STRATAMEM_LLM_PRICES", json.dumps(prices))
    assert main(["--db", db_url, "--embedder", "hash", "stats"]) == 0
    out = capsys.readouterr().out
    assert f"cost (7 days): {model.cost:.4f}" in out
    assert (
        f"openai:fake-chat: {model.calls} calls, {model.prompt_tokens} prompt + "
        f"{model.completion_tokens} completion tokens, cost {model.cost:.4f}"
    ) in out
    today = expected.days[-1]
    assert f"{today.day}: 1 messages processed" in out
    assert main(["--db", db_url, "--embedder", "hash", "stats", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["usage"]
    assert shown["cost"] == pytest.approx(model.cost)
    assert shown["models"][0]["prompt_tokens"] == model.prompt_tokens


def test_a_failed_batchs_tokens_are_counted_too(
    make_memory: Any, openai_server: FakeOpenAIServer, model: MemoryModel
) -> None:
    # The extraction answers; consolidation is refused (HTTP 400): the attempt's tokens
    # were spent all the same, and stored with the failure.
    def script(body: dict[str, Any]) -> Any:
        system = body["messages"][0]["content"]
        refused = "You maintain a user's long-term memory" in system
        return (400, {"error": {"message": "no"}}) if refused else model(body)

    openai_server.chat_script = script
    mem = _llm_memory(make_memory, openai_server, workers=0, job_max_attempts=1)
    s = mem.sessions.create(user_id="ana")
    with pytest.raises(Exception, match="failed"):
        s.add_messages([{"role": "user", "content": "I live in Berlin."}], sync=True)
    (model_usage,) = mem.usage(days=1).models
    assert model_usage.failed >= 1 and model_usage.prompt_tokens > 0
