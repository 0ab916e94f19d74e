"""instrument() with no providers uses the global ones, even when the application sets them
after instrumenting. Run in a child process: a global provider can be set once per process."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    from opentelemetry import metrics, trace
    from opentelemetry._logs import set_logger_provider
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs import export as log_export
    from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
    InMemoryLogRecordExporter = getattr(log_export, "InMemoryLogRecordExporter", None) or log_export.InMemoryLogExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import stoic
    import stoic_opentelemetry
    from stoic.events import Level, emit

    otel = stoic_opentelemetry.instrument(log_events=True)  # before any provider is set

    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    trace.set_tracer_provider(tracer_provider)
    logs = InMemoryLogRecordExporter()
    logger_provider = LoggerProvider()
    logger_provider.add_log_record_processor(SimpleLogRecordProcessor(logs))
    set_logger_provider(logger_provider)

    with trace.get_tracer("app").start_as_current_span("request"):
        emit("hedge.started", "search", Level.INFO, 0, {"attempt": 2, "elapsed": 0.1})
        breaker = stoic.CircuitBreaker(label="db")
        breaker.call(lambda: None)

    data = reader.get_metrics_data()
    found = {m.name: [p for p in m.data.data_points]
             for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    db = [p for p in found["stoic.breaker.calls"] if p.attributes["stoic.label"] == "db"]
    assert [(p.attributes["outcome"], p.value) for p in db] == [("success", 1)], found
    (span,) = spans.get_finished_spans()
    assert [e.name for e in span.events] == ["hedge.started"], span.events
    assert [r.log_record.event_name for r in logs.get_finished_logs()] == ["hedge.started"]
    otel.uninstrument()
    print("ok")
    """
)


def test_instrument_follows_global_providers_set_later():
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
