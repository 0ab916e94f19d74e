"""Hostile review of the OpenTelemetry adapter, second pass: delta histograms across instrumentations,
and the spans of the requests that only observe state."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from otel_support import delta_exporter
from stoic_opentelemetry import HistogramBridge, instrument
from stoic_opentelemetry._instrumentor import StoicInstrumentor

import stoic
from stoic.testing import RecordingSink, VirtualClock


def _count(exported: list[Any], label: str) -> int | None:
    """The count of ``label``'s success durations in the last export (None: no such point)."""
    points = [p for rm in exported[-1].resource_metrics for sm in rm.scope_metrics for m in sm.metrics
              if m.name == "stoic.breaker.call.duration" for p in m.data.data_points
              if p.attributes.get("stoic.label") == label]
    return sum(p.count for p in points) if points else None


def test_a_delta_bridge_does_not_export_again_what_it_exported_before_an_export_without_instrumentation():
    # A bridge left on the reader (metrics=None: the active instrumentation's) exported one call,
    # then one export ran with no instrumentation active; the next one, instrumented again, sent
    # that call again as new (the bridge had forgotten what it had sent): a delta backend
    # counted it twice.
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    exporter, exported = delta_exporter()
    reader = PeriodicExportingMetricReader(HistogramBridge(exporter), export_interval_millis=3_600_000)
    provider = MeterProvider(metric_readers=[reader])
    breaker = stoic.CircuitBreaker(label="h2-gap")
    mine = provider.get_meter("app").create_counter("app.requests")  # the application's own: exported
    inst = instrument(span_events=False, meter_provider=provider)
    try:
        breaker.call(lambda: None)
        provider.force_flush()
        assert _count(exported, "h2-gap") == 1
        inst.uninstrument()
        mine.add(1)
        provider.force_flush()  # nothing of stoic's in this one
        assert _count(exported, "h2-gap") is None
        inst = instrument(span_events=False, meter_provider=provider)
        provider.force_flush()
        assert _count(exported, "h2-gap") == 0  # nothing new since the first export
        breaker.call(lambda: None)
        provider.force_flush()
        assert _count(exported, "h2-gap") == 1
    finally:
        inst.uninstrument()
        provider.shutdown()


def test_the_instrumentor_instrumented_again_does_not_export_again_what_it_exported_as_deltas():
    # StoicInstrumentor wraps each push reader's exporter in a new HistogramBridge at every
    # instrument(); a new bridge knew nothing of what the previous one had sent, so after
    # uninstrument() and instrument() the first delta export carried every call since the
    # process started counting, again.
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    exporter, exported = delta_exporter()
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
    provider = MeterProvider(metric_readers=[reader])
    breaker = stoic.CircuitBreaker(label="h2-again")
    instrumentor = StoicInstrumentor()
    try:
        instrumentor.instrument(meter_provider=provider, span_events=False)
        breaker.call(lambda: None)
        provider.force_flush()
        assert _count(exported, "h2-again") == 1
        instrumentor.uninstrument()
        breaker.call(lambda: None)  # between the two: never exported yet
        instrumentor.instrument(meter_provider=provider, span_events=False)
        provider.force_flush()
        assert _count(exported, "h2-again") == 1
    finally:
        instrumentor.uninstrument()
        provider.shutdown()


def _tripped_breaker(label: str, clock: VirtualClock) -> stoic.CircuitBreaker:
    breaker = stoic.CircuitBreaker(label=label, window=stoic.CountWindow(2), minimum_calls=2,
                                   open_duration=stoic.OpenDuration.fixed(10.0, jitter=0), clock=clock)

    def fail() -> None:
        raise ConnectionError

    for _ in range(2):
        with contextlib.suppress(ConnectionError):
            breaker.call(fail)
    assert breaker.snapshot.state is stoic.BreakerState.OPEN
    return breaker


@contextlib.contextmanager
def _traced() -> Iterator[tuple[Any, Any]]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    inst = instrument(span_events=True, metrics=False)
    try:
        yield provider.get_tracer("app"), exporter
    finally:
        inst.uninstrument()
        provider.shutdown()


async def test_a_transition_a_scrape_notices_is_not_put_on_the_scrape_requests_span():
    # The state gauge reads .state, which applies the lazy open -> half-open transition; its
    # breaker.half_open event was emitted in the scrape's context and so became a span event of
    # the GET /metrics request's span (and reached the sinks scoped to it), where nobody looking
    # at the protected calls finds it, on a request the breaker never served. It now goes to the
    # process-wide sinks only, outside any request's context.
    import stoic_prometheus
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    collector = stoic_prometheus.instrument(registry)
    clock = VirtualClock()
    breaker = _tripped_breaker("h2-scraped", clock)
    everywhere, scoped = RecordingSink(), RecordingSink()
    stoic.add_sink(everywhere)
    try:
        with _traced() as (tracer, spans):
            await clock.advance(10.0)
            with tracer.start_as_current_span("GET /metrics"), stoic.use_sinks(scoped):
                text = generate_latest(registry).decode()
            assert 'stoic_breaker_state{state="half_open",stoic_label="h2-scraped"} 1.0' in text
            (scrape,) = spans.get_finished_spans()
            assert [e.name for e in scrape.events] == []
            assert scoped.names == []
            assert [e.label for e in everywhere.of("breaker.half_open")] == ["h2-scraped"]
            assert breaker.state is stoic.BreakerState.HALF_OPEN
    finally:
        stoic.remove_sink(everywhere)
        stoic_prometheus.uninstrument(collector, registry)


async def test_a_transition_the_admin_endpoints_read_notices_is_not_put_on_its_requests_span():
    # GET /policies reads every breaker's snapshot, which applies the lazy transition: the same
    # breaker.half_open on the admin request's span, not on any call's.
    from stoic.admin import admin_app

    clock = VirtualClock()
    breaker = _tripped_breaker("h2-admin", clock)
    control = stoic.ControlPlane()
    control.register(breaker, name="payments")
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    everywhere = RecordingSink()
    stoic.add_sink(everywhere)
    try:
        with _traced() as (tracer, spans):
            await clock.advance(10.0)
            scope = {"type": "http", "method": "GET", "path": "/policies", "headers": [],
                     "server": ("127.0.0.1", 8080), "client": ("127.0.0.1", 5000)}
            with tracer.start_as_current_span("GET /policies"):
                await admin_app(control)(scope, receive, send)
            assert sent[0]["status"] == 200 and b"half_open" in sent[1]["body"]
            (request,) = spans.get_finished_spans()
            assert [e.name for e in request.events] == []
            assert [e.label for e in everywhere.of("breaker.half_open")] == ["h2-admin"]
    finally:
        stoic.remove_sink(everywhere)


def _utf8(attributes: Any) -> list[str]:
    """The attribute values (and keys) OTLP could not encode: a str must be valid UTF-8."""
    bad = []
    for key, value in dict(attributes).items():
        for text in (key, value):
            if isinstance(text, str):
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError:
                    bad.append(key)
    return bad


def test_span_events_and_log_records_carry_only_text_otlp_can_encode():
    # A label from data (a tenant's name read from JSON's "\udce9", a path from os.fsdecode) and a
    # defect's message naming a file with undecodable bytes went to OpenTelemetry as lone
    # surrogates, which no UTF-8 encoder (OTLP's protobuf) takes: the exporter failed the whole
    # batch, every other span or record in it lost. The metrics route already gave such text U+FFFD
    # (stoic._metrics.encodable); span events and log records now do too.
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from otel_support import InMemoryLogRecordExporter

    spans, logs = InMemorySpanExporter(), InMemoryLogRecordExporter()
    tracer_provider, logger_provider = TracerProvider(), LoggerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    logger_provider.add_log_record_processor(SimpleLogRecordProcessor(logs))
    inst = instrument(logger_provider=logger_provider, log_events=True, metrics=False)
    breaker = stoic.CircuitBreaker(label="tenant:caf\udce9")

    def buggy() -> None:
        raise stoic.Defect("cannot read /data/caf\udce9.json")

    try:
        with tracer_provider.get_tracer("app").start_as_current_span("call"):
            with contextlib.suppress(stoic.Defect):
                breaker.call(buggy)
            breaker.force_open()
    finally:
        inst.uninstrument()
        tracer_provider.shutdown()
        logger_provider.shutdown()
    (span,) = spans.get_finished_spans()
    assert [e.name for e in span.events] == ["breaker.defect", "breaker.opened"]
    for event in span.events:
        assert _utf8(event.attributes) == [], event.name
        assert event.attributes["stoic.label"] == "tenant:caf\ufffd"
    records = [r.log_record for r in logs.get_finished_logs()]
    assert [r.event_name for r in records] == ["breaker.defect", "breaker.opened"]
    for record in records:
        assert _utf8(record.attributes) == [], record.event_name
    assert records[0].attributes["exception.message"] == "cannot read /data/caf\ufffd.json"
