"""What observability costs a call, side by side in one run (issue 11's targets).

Rows, each timed in turns (one repeat of every row per round, best of the rounds, ns per call):

- a breaker success with no sink and metrics off; the same with metrics on (the OpenTelemetry
  adapter installed: policies count into their recorders, read only at collection); the same with
  a DEBUG sink installed that wants no breaker event (``event_names`` naming a hedge event only);
- a four-stage pipeline (retry -> breaker -> rate limiter -> bulkhead) with metrics off and on;
- the cost per emitted event of the event sinks, for reference (``emit`` called directly).

Metrics on/off alternate by flipping ``stoic._metrics.state.enabled`` between rounds (the adapter
stays installed: it costs nothing per call; what costs is the recorders' counting). Ends with a
target / measured / met table.

Run: ``python -m benchmarks observability``.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Awaitable, Callable

from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from stoic_opentelemetry import LogEventSink, SpanEventSink, instrument
from stoic_structlog import StructlogSink

import stoic
from stoic import _metrics
from stoic.events import Event, Level, LoggingSink, Sink, emit, min_level, use_sinks
from stoic.testing import RecordingSink

ROUNDS = 15
CALLS = 10_000
RECORDED = {"outcome": "success", "slow": False, "state": "closed", "duration": 0.012}


class _Elsewhere:
    """A DEBUG sink that wants one hedge event only: it must not slow the breaker down."""

    level = Level.DEBUG
    event_names = frozenset({"hedge.won"})

    def emit(self, event: Event) -> None:
        pass


async def _op() -> int:
    return 1


def _rows() -> list[tuple[str, bool, Sink | None, Callable[[], Awaitable[object]]]]:
    breaker = stoic.CircuitBreaker(label="bench-breaker")
    pipeline = stoic.Pipeline(
        stoic.Retrying(stoic.Schedule.fixed(0.01).attempts(3), label="bench-retry"),
        stoic.CircuitBreaker(label="bench-pipeline-breaker"),
        stoic.RateLimiter(10**9, 1.0, label="bench-limiter"),
        stoic.Bulkhead(1_000, label="bench-bulkhead"),
    )
    return [
        ("breaker, no sink, metrics off", False, None, lambda: breaker.execute(_op)),
        ("breaker, metrics on", True, None, lambda: breaker.execute(_op)),
        ("breaker, DEBUG sink wanting no breaker event", False, _Elsewhere(), lambda: breaker.execute(_op)),
        ("pipeline x4, metrics off", False, None, lambda: pipeline.execute(_op)),
        ("pipeline x4, metrics on", True, None, lambda: pipeline.execute(_op)),
    ]


async def _time(make: Callable[[], Awaitable[object]]) -> float:
    gc.collect()
    start = time.perf_counter_ns()
    for _ in range(CALLS):
        await make()
    return (time.perf_counter_ns() - start) / CALLS


async def _policies() -> dict[str, float]:
    rows = _rows()
    was_enabled = _metrics.state.enabled
    best = {name: float("inf") for name, *_ in rows}
    for _name, enabled, _sink, make in rows:  # warm up every path once
        _metrics.state.enabled = enabled
        for _ in range(1_000):
            await make()
    for _ in range(ROUNDS):
        for name, enabled, sink, make in rows:
            _metrics.state.enabled = enabled
            if sink is not None:
                stoic.add_sink(sink)
            try:
                best[name] = min(best[name], await _time(make))
            finally:
                if sink is not None:
                    stoic.remove_sink(sink)
    _metrics.state.enabled = was_enabled  # later rows (and later scripts) must not pay for metrics
    return best


def _per_event() -> dict[str, float]:
    """ns per emitted breaker.recorded, for each sink (reference figures)."""
    def recorded() -> None:
        emit("breaker.recorded", "payments", Level.DEBUG, 0, RECORDED)

    def guarded() -> None:
        if min_level() <= Level.DEBUG:
            emit("breaker.recorded", "payments", Level.DEBUG, 0, dict(RECORDED))

    quiet = logging.getLogger("stoic.bench.quiet")
    quiet.setLevel(logging.WARNING)
    tracer = TracerProvider().get_tracer("bench")
    sinks: list[tuple[str, Sink | None, Callable[[], None]]] = [
        ("no sink, guarded (policy path)", None, guarded),
        ("RecordingSink", RecordingSink(), recorded),
        ("LoggingSink, logger level above", LoggingSink(quiet, Level.DEBUG), recorded),
        ("SpanEventSink, no span", SpanEventSink(Level.DEBUG), recorded),
        ("LogEventSink, SDK provider", LogEventSink(LoggerProvider(), Level.DEBUG), recorded),
        ("StructlogSink, level disabled", StructlogSink(_DisabledLogger(), Level.DEBUG), recorded),
    ]
    best = {name: float("inf") for name, *_ in sinks}
    for _ in range(ROUNDS):
        for name, sink, fn in sinks:
            with use_sinks(sink) if sink is not None else _null():
                gc.collect()
                start = time.perf_counter_ns()
                for _ in range(CALLS):
                    fn()
                best[name] = min(best[name], (time.perf_counter_ns() - start) / CALLS)
    with tracer.start_as_current_span("call"):
        pass
    return best


class _DisabledLogger:
    def is_enabled_for(self, level: int) -> bool:
        return False


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def main() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    instrumentation = instrument(meter_provider=provider, span_events=False)
    try:
        policies = asyncio.run(_policies())
        reader.get_metrics_data()  # a collection reads the recorders (not timed: it is not per call)
    finally:
        instrumentation.uninstrument()
        provider.shutdown()
    print("\n## Observability: cost per call (ns/call, best of rounds, rows timed in turns)")
    base = policies["breaker, no sink, metrics off"]
    for name, ns in policies.items():
        print(f"{name:<48}{ns:>10.0f}")
    events = _per_event()
    print("\n## Event sinks: cost per emitted event (ns/event), for reference")
    for name, ns in events.items():
        print(f"{name:<48}{ns:>10.0f}")

    metrics_extra = policies["breaker, metrics on"] - base
    pipe_ratio = policies["pipeline x4, metrics on"] / policies["pipeline x4, metrics off"]
    elsewhere = policies["breaker, DEBUG sink wanting no breaker event"] / base
    print("\n## Targets")
    print(f"{'target':<62}{'measured':>14}{'met':>6}")
    for target, measured, met in (
        ("breaker success, metrics on: at most +1000 ns over no sink", f"+{metrics_extra:.0f} ns",
         metrics_extra <= 1000),
        ("pipeline x4, metrics on: at most 1.5x metrics off", f"{pipe_ratio:.2f}x", pipe_ratio <= 1.5),
        ("breaker with a DEBUG sink wanting none of its events: no slower", f"{elsewhere:.2f}x", elsewhere <= 1.10),
    ):
        print(f"{target:<62}{measured:>14}{'yes' if met else 'NO':>6}")


if __name__ == "__main__":
    main()
