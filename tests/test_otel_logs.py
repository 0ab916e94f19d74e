"""Log-based events: each stoic event as an OpenTelemetry log record with an event name."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry._logs import SeverityNumber
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.trace import TracerProvider
from otel_support import SAMPLES, InMemoryLogRecordExporter, fire
from stoic_opentelemetry import Instrumentation, LogEventSink, instrument

from stoic.events import CATALOG, Level
from stoic.testing import RecordingSink


@pytest.fixture
def logs(sink: RecordingSink) -> Iterator[tuple[InMemoryLogRecordExporter, Instrumentation]]:
    exporter = InMemoryLogRecordExporter()
    provider = LoggerProvider()
    provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))
    inst = instrument(logger_provider=provider, span_events=False, log_events=True, metrics=False)
    yield exporter, inst
    inst.uninstrument()
    provider.shutdown()


def records(exporter: InMemoryLogRecordExporter) -> list:
    return [r.log_record for r in exporter.get_finished_logs()]


def test_each_event_is_a_log_record_with_event_name_severity_and_attributes(logs):
    exporter, inst = logs
    assert isinstance(inst.logs, LogEventSink)
    fire("breaker.opened", "payments")
    fire("retry.defect", "payments")
    fire("breaker.closed", "payments")
    opened, defect, closed = records(exporter)
    assert opened.event_name == "breaker.opened"
    assert opened.severity_number == SeverityNumber.WARN and opened.severity_text == "WARN"
    assert dict(opened.attributes) == {**SAMPLES["breaker.opened"], "stoic.label": "payments"}
    assert opened.body == "breaker.opened"
    assert defect.severity_number == SeverityNumber.ERROR
    assert defect.attributes["error.type"] == "Defect"
    assert closed.severity_number == SeverityNumber.INFO


def test_records_carry_the_current_span_context(logs):
    exporter, _ = logs
    tracer = TracerProvider().get_tracer("t")
    with tracer.start_as_current_span("call") as span:
        fire("hedge.won")
    (record,) = records(exporter)
    assert record.trace_id == span.get_span_context().trace_id
    assert record.span_id == span.get_span_context().span_id


def test_level_filters_records(logs):
    exporter, _ = logs
    for name in SAMPLES:
        fire(name)
    assert [r.event_name for r in records(exporter)] == [n for n in SAMPLES if CATALOG[n].level >= Level.INFO]


def test_a_debug_sink_maps_debug_severity():
    from stoic.events import use_sinks

    exporter = InMemoryLogRecordExporter()
    provider = LoggerProvider()
    provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))
    with use_sinks(LogEventSink(provider, Level.DEBUG)):
        fire("ratelimiter.waited")
    (record,) = records(exporter)
    assert record.severity_number == SeverityNumber.DEBUG
    assert record.attributes["waited"] == 0.2


def test_records_are_stamped_with_the_wall_clock_instant_of_the_decision(logs, clock):
    # The record's Timestamp was left unset (None: exported as 0, which backends that index on it
    # file under 1970). It is the wall-clock time of the decision, never the event's time_ns, an
    # instant on the policy's monotonic (here virtual) clock.
    import time

    import stoic

    exporter, _ = logs
    before = time.time_ns()
    stoic.CircuitBreaker(label="stamped").force_open()
    after = time.time_ns()
    (record,) = records(exporter)
    assert record.timestamp is not None and before <= record.timestamp <= after
    assert record.timestamp != clock.now_ns()


def test_an_integer_beyond_64_bits_reaches_the_log_record_as_a_float(logs):
    import stoic

    exporter, _ = logs
    assert stoic.RateLimiter(1, label="huge").try_acquire(-(2**64) + 2**70) is False
    (record,) = records(exporter)
    assert isinstance(record.attributes["permits"], float) and isinstance(record.attributes["burst"], int)


def test_a_defect_record_carries_the_exception_being_handled(logs):
    # LoggingSink and StructlogSink attach the exception to error-level events; the OTel log
    # record had only error.type, so a backend showed a defect with no message or traceback.
    import stoic

    exporter, _ = logs
    breaker = stoic.CircuitBreaker(label="defect-otel")

    def buggy() -> None:
        raise stoic.Defect("invariant broken")

    with pytest.raises(stoic.Defect):
        breaker.call(buggy)
    breaker.force_open()  # a WARNING event, nothing being handled: no exception attributes
    by_name = {r.event_name: r for r in records(exporter)}
    defect = by_name["breaker.defect"].attributes
    assert defect["exception.type"] == "Defect"
    assert defect["exception.message"] == "invariant broken"
    assert "in buggy" in defect["exception.stacktrace"] and "Defect: invariant broken" in defect["exception.stacktrace"]
    assert "exception.type" not in by_name["breaker.opened"].attributes


def test_a_defect_whose_message_cannot_be_rendered_still_reaches_the_log(logs):
    # Seen failing before the fix: str(error) raised inside the sink, so the breaker.defect
    # record was never emitted (the stdlib and structlog sinks logged it, with the traceback's
    # "<exception str() failed>").
    import stoic

    class Unprintable(stoic.Defect):
        def __str__(self) -> str:
            raise RuntimeError("no message")

    exporter, _ = logs
    breaker = stoic.CircuitBreaker(label="unprintable")

    def buggy() -> None:
        raise Unprintable()

    with pytest.raises(Unprintable):
        breaker.call(buggy)
    (record,) = [r for r in records(exporter) if r.event_name == "breaker.defect"]
    assert record.attributes["exception.type"].endswith("<locals>.Unprintable")
    assert record.attributes["exception.message"] == "<exception str() failed>"
    assert "Unprintable: <exception str() failed>" in record.attributes["exception.stacktrace"]
