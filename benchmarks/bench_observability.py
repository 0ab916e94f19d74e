"""Cost per emitted event of each sink, measured with ``stoic.events.emit`` directly.

Rows (ns per event, best of 5):
- the guard a policy runs when no sink is installed (``min_level() <= level``), and an unguarded
  ``emit`` with no sink (what the guard saves: the attribute dict and the Event are never built);
- RecordingSink, LoggingSink (logger below the event's level, and a NullHandler), the OTel
  SpanEventSink inside a recording span, LogEventSink on an SDK provider with no processor,
  MetricsSink (counter + histogram for ``breaker.recorded``; a counter for ``hedge.started``), and
  StructlogSink with a processor chain that drops everything (explicit and lazily looked-up logger).

Run: ``python -m benchmarks observability``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator

import structlog
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from stoic_opentelemetry import LogEventSink, MetricsSink, SpanEventSink
from stoic_structlog import StructlogSink

from stoic.events import Level, LoggingSink, Sink, emit, min_level, use_sinks
from stoic.testing import RecordingSink

from ._harness import Result, report, time_sync

CALLS = 50_000
RECORDED = {"outcome": "success", "slow": False, "state": "closed", "duration": 0.012}
STARTED = {"attempt": 2, "elapsed": 0.05}


def _recorded() -> None:
    emit("breaker.recorded", "payments", Level.DEBUG, 0, RECORDED)


def _started() -> None:
    emit("hedge.started", "search", Level.INFO, 0, STARTED)


def _guarded() -> None:
    # What a policy runs per decision: the dict literal is only built when someone listens.
    if min_level() <= Level.DEBUG:
        emit("breaker.recorded", "payments", Level.DEBUG, 0,
             {"outcome": "success", "slow": False, "state": "closed", "duration": 0.012})


def _drop(logger: object, method: str, event_dict: object) -> object:
    raise structlog.DropEvent


def _time(sink: Sink | None, fn: Callable[[], None]) -> float:
    with use_sinks(sink) if sink is not None else contextlib.nullcontext():
        return time_sync(fn, calls=CALLS)


@contextlib.contextmanager
def _structlog_dropping_everything() -> Iterator[None]:
    structlog.configure(processors=[_drop], cache_logger_on_first_use=True)
    try:
        yield
    finally:
        structlog.reset_defaults()


def main() -> None:
    results = [
        Result("no sink, guarded (policy path)", _time(None, _guarded)),
        Result("no sink, unguarded emit()", _time(None, _recorded)),
    ]

    recording = RecordingSink()
    results.append(Result("RecordingSink", _time(recording, _recorded)))
    recording.clear()

    quiet = logging.getLogger("stoic.bench.quiet")
    quiet.setLevel(logging.WARNING)
    results.append(Result("LoggingSink, logger level above", _time(LoggingSink(quiet, Level.DEBUG), _recorded)))
    handled = logging.getLogger("stoic.bench.null")
    handled.setLevel(logging.DEBUG)
    handled.propagate = False
    handled.addHandler(logging.NullHandler())
    results.append(Result("LoggingSink, NullHandler", _time(LoggingSink(handled, Level.DEBUG), _recorded)))

    tracer = TracerProvider().get_tracer("bench")
    with tracer.start_as_current_span("call"):  # recording; the SDK keeps the newest 128 events
        results.append(Result("SpanEventSink, recording span", _time(SpanEventSink(Level.DEBUG), _recorded)))
    results.append(Result("SpanEventSink, no span", _time(SpanEventSink(Level.DEBUG), _recorded)))

    log_provider = LoggerProvider()
    results.append(Result("LogEventSink, SDK provider", _time(LogEventSink(log_provider, Level.DEBUG), _recorded)))

    reader = InMemoryMetricReader()
    metrics = MetricsSink(MeterProvider(metric_readers=[reader]))
    results.append(Result("MetricsSink, breaker.recorded", _time(metrics, _recorded)))
    results.append(Result("MetricsSink, hedge.started", _time(metrics, _started)))
    results.append(Result("MetricsSink, unused event", _time(metrics, lambda: emit(
        "hedge.attempt_failed", "search", Level.DEBUG, 0, {"attempt": 1, "running": 1, "error.type": "E"}))))

    dropping = structlog.wrap_logger(structlog.PrintLogger(), processors=[_drop])
    results.append(Result("StructlogSink, dropping logger", _time(StructlogSink(dropping, Level.DEBUG), _recorded)))
    with _structlog_dropping_everything():
        results.append(Result("StructlogSink, lazy get_logger", _time(StructlogSink(level=Level.DEBUG), _recorded)))

    report("Observability: cost per emitted event (ns/event, overhead over the no-sink guard)", results,
           baseline="no sink, guarded (policy path)")


if __name__ == "__main__":
    main()
