"""Span events: stoic events land on the caller's current recording span, and nowhere else."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from otel_support import SAMPLES, fire
from stoic_opentelemetry import Instrumentation, SpanEventSink, instrument

from stoic.events import CATALOG, Level, process_sinks
from stoic.testing import RecordingSink


@pytest.fixture
def tracing(sink: RecordingSink) -> Iterator[tuple[trace.Tracer, InMemorySpanExporter, Instrumentation]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    inst = instrument(tracer_provider=provider, metrics=False)
    yield provider.get_tracer("test"), exporter, inst
    inst.uninstrument()
    provider.shutdown()


def test_events_become_span_events_with_their_attributes_and_the_label(tracing):
    tracer, exporter, _ = tracing
    with tracer.start_as_current_span("call"):
        fire("breaker.opened", "payments")
        fire("retry.attempt_failed", "payments")
    (span,) = exporter.get_finished_spans()
    assert [e.name for e in span.events] == ["breaker.opened", "retry.attempt_failed"]
    opened = span.events[0]
    assert dict(opened.attributes) == {**SAMPLES["breaker.opened"], "stoic.label": "payments"}
    assert opened.attributes["trigger"] == "failure_rate"
    assert dict(span.events[1].attributes)["error.type"] == "ConnectionError"


def test_events_go_to_the_innermost_current_span(tracing):
    tracer, exporter, _ = tracing
    with tracer.start_as_current_span("outer"):
        with tracer.start_as_current_span("inner"):
            fire("hedge.started", "h")
        fire("hedge.won", "h")
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert [e.name for e in spans["inner"].events] == ["hedge.started"]
    assert [e.name for e in spans["outer"].events] == ["hedge.won"]


async def test_events_follow_the_span_of_the_task_that_emitted_them(tracing):
    tracer, exporter, _ = tracing

    async def work(name: str) -> None:
        with tracer.start_as_current_span(name):
            await asyncio.sleep(0)
            fire("bulkhead.rejected", name)

    await asyncio.gather(*(work(f"task-{i}") for i in range(20)))
    for span in exporter.get_finished_spans():
        (event,) = span.events
        assert event.attributes["stoic.label"] == span.name


def test_no_span_or_a_non_recording_span_gets_nothing_and_nothing_raises(tracing, caplog):
    _, exporter, _ = tracing
    with caplog.at_level(logging.ERROR, logger="stoic.events"):
        fire("breaker.opened")  # no current span at all
        unsampled = TracerProvider(sampler=ALWAYS_OFF).get_tracer("off")
        with unsampled.start_as_current_span("dropped") as span:
            assert not span.is_recording()
            fire("breaker.opened")
    assert exporter.get_finished_spans() == ()
    assert not caplog.records


def test_debug_events_are_left_out_at_the_default_level(tracing):
    tracer, exporter, inst = tracing
    assert inst.spans is not None and inst.spans.level == Level.INFO
    with tracer.start_as_current_span("call"):
        for name in SAMPLES:
            fire(name)
    (span,) = exporter.get_finished_spans()
    assert [e.name for e in span.events] == [n for n in SAMPLES if CATALOG[n].level >= Level.INFO]
    assert "breaker.recorded" not in [e.name for e in span.events]


def test_a_debug_level_span_sink_takes_every_event():
    sink = SpanEventSink(Level.DEBUG)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    from stoic.events import use_sinks

    with use_sinks(sink), provider.get_tracer("t").start_as_current_span("call"):
        fire("breaker.recorded")
    (span,) = exporter.get_finished_spans()
    assert [e.name for e in span.events] == ["breaker.recorded"]
    assert span.events[0].attributes["duration"] == 0.05


def test_only_the_span_sink_is_installed_when_metrics_and_logs_are_off(tracing):
    _, _, inst = tracing
    assert inst.sinks == (inst.spans,)
    assert inst.spans in process_sinks()
    assert inst.metrics is None and inst.logs is None


def test_an_integer_beyond_64_bits_reaches_opentelemetry_as_a_float(tracing):
    # OpenTelemetry's integer attributes are signed 64-bit (OTLP encodes int64: a larger Python int
    # makes the exporter fail the whole batch). try_acquire(2**70) is a caller's number that stoic
    # reports as is in ratelimiter.oversized; the span event now carries it as a float.
    import stoic

    tracer, exporter, _ = tracing
    limiter = stoic.RateLimiter(1, label="huge")
    with tracer.start_as_current_span("call"):
        assert limiter.try_acquire(2**70) is False
    (event,) = exporter.get_finished_spans()[0].events
    assert event.attributes["permits"] == float(2**70) and isinstance(event.attributes["permits"], float)
    assert event.attributes["burst"] == 1 and isinstance(event.attributes["burst"], int)  # in range: unchanged
