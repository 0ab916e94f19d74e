"""What observability costs a call, side by side in one run (issue 11's targets).

Rows, each timed in turns (one repeat of every row per round, best of the rounds, ns per call):

- a breaker success with no sink and metrics off; the same with metrics on (the OpenTelemetry
  adapter installed: policies count into their recorders, read only at collection); the same with
  a DEBUG sink installed that wants no breaker event (``event_names`` naming a hedge event only);
- a four-stage pipeline (retry -> breaker -> rate limiter -> bulkhead) with metrics off and on,
  and the bare call through a lambda (the ratio of the two is of their overheads over it);
- per policy kind (rate limiter, bulkhead, retry, hedge, adaptive bulkhead), a call on a path that
  emits that kind's events on every call (a refusal; a retried failure; a hedged race), with no
  sink and with a DEBUG sink that wants no event of that kind: each kind reads its own floor, so
  the second must cost what the first does;
- the cost per emitted event of the event sinks, for reference (``emit`` called directly).

Metrics on/off alternate by flipping ``stoic._metrics.state.enabled`` between rounds (the adapter
stays installed: it costs nothing per call; what costs is the recorders' counting); the script
leaves it as it found it. The targets are ``benchmarks._harness.verdict`` rows (``python -m
benchmarks`` ends with them in one table); "no slower" allows 5 % (1.05x) for the noise of a
shared machine. ``STOIC_BENCH_SMOKE=1`` runs every row with tiny counts (a test that the script
works, not a measurement).

Run: ``python -m benchmarks observability``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import statistics
import time
from collections.abc import Awaitable, Callable

from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from stoic_opentelemetry import LogEventSink, SpanEventSink, instrument
from stoic_structlog import StructlogSink

import stoic
from benchmarks._harness import SMOKE, verdict
from stoic import _metrics
from stoic.events import Event, Level, LoggingSink, Sink, emit, min_level, use_sinks
from stoic.testing import RecordingSink

ROUNDS = 2 if SMOKE else 15
CALLS = 20 if SMOKE else 10_000
WARMUP = 10 if SMOKE else 1_000
RECORDED = {"outcome": "success", "slow": False, "state": "closed", "duration": 0.012}
NO_SLOWER = 1.05  # "no slower": a ratio within 5 %, the noise of rows interleaved on a shared machine
KINDS = ("limiter", "bulkhead", "retry", "hedge", "adaptive bulkhead")


class _Elsewhere:
    """A DEBUG sink that wants only events of another kind: it must not slow the policy down."""

    level = Level.DEBUG

    def __init__(self, *names: str) -> None:
        self.event_names = frozenset(names)

    def emit(self, event: Event) -> None:
        pass


async def _op() -> int:
    return 1


def _refused(policy_call: Callable[[], Awaitable[object]]) -> Callable[[], Awaitable[object]]:
    """A call that is refused (its kind emits a rejection event each time): the refusal swallowed."""
    async def call() -> object:
        with contextlib.suppress(stoic.Rejected):
            return await policy_call()
        return None

    return call


def _kind_rows() -> list[tuple[str, bool, Sink | None, Callable[[], Awaitable[object]]]]:
    """Per kind: the same call with no sink, and with a DEBUG sink that wants none of its events."""
    limiter = stoic.RateLimiter(1, 1e6, queue_limit=0, label="bench-kind-limiter")
    limiter.try_acquire()  # empty for the run: every acquire is refused (ratelimiter.rejected)
    bulkhead = stoic.Bulkhead(1, label="bench-kind-bulkhead")
    adaptive = stoic.AdaptiveBulkhead(latency_threshold=1.0, max_concurrent=1, label="bench-kind-adaptive")
    held = [bulkhead, adaptive]  # one slot each, taken for the run: every call is refused (bulkhead.rejected)
    bulkhead._active = adaptive._active = 1
    schedule = stoic.Schedule.fixed(0).attempts(2)
    hedger = stoic.Hedge(0, label="bench-kind-hedge", budget=stoic.RetryBudget.UNLIMITED)
    failed = [False]

    async def flaky() -> int:
        # Every other attempt fails: each call is one retried failure (retry.attempt_failed) and a success.
        failed[0] = not failed[0]
        if failed[0]:
            raise ConnectionError("flaky")
        return 1

    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "limiter": _refused(limiter.acquire),
        "bulkhead": _refused(lambda: held[0].execute(_op)),
        "retry": lambda: stoic.retry(schedule, flaky, label="bench-kind-retry", budget=stoic.RetryBudget.UNLIMITED),
        "hedge": lambda: hedger.execute(stoic.IDEMPOTENT, _op),  # a race: hedge.started and hedge.won
        "adaptive bulkhead": _refused(lambda: held[1].execute(_op)),
    }
    other = {"hedge": "breaker.recorded"}
    rows: list[tuple[str, bool, Sink | None, Callable[[], Awaitable[object]]]] = []
    for kind in KINDS:
        rows.append((f"{kind}, no sink", False, None, calls[kind]))
        rows.append((f"{kind}, DEBUG sink wanting no {kind} event", False, _Elsewhere(other.get(kind, "hedge.won")),
                     calls[kind]))
    return rows


def _rows() -> list[tuple[str, bool, Sink | None, Callable[[], Awaitable[object]]]]:
    breaker = stoic.CircuitBreaker(label="bench-breaker")
    pipeline = stoic.Pipeline(
        stoic.Retrying(stoic.Schedule.fixed(0.01).attempts(3), label="bench-retry"),
        stoic.CircuitBreaker(label="bench-pipeline-breaker"),
        stoic.RateLimiter(10**9, 1.0, label="bench-limiter"),
        stoic.Bulkhead(1_000, label="bench-bulkhead"),
    )
    return [
        ("bare await via lambda", False, None, lambda: _op()),  # the pipeline ratio is of overheads over this
        ("breaker, no sink, metrics off", False, None, lambda: breaker.execute(_op)),
        ("breaker, DEBUG sink wanting no breaker event", False, _Elsewhere("hedge.won"), lambda: breaker.execute(_op)),
        ("breaker, metrics on", True, None, lambda: breaker.execute(_op)),
        ("pipeline x4, metrics off", False, None, lambda: pipeline.execute(_op)),
        ("pipeline x4, metrics on", True, None, lambda: pipeline.execute(_op)),
        *_kind_rows(),
    ]


async def _time(make: Callable[[], Awaitable[object]]) -> float:
    gc.collect()
    start = time.perf_counter_ns()
    for _ in range(CALLS):
        await make()
    return (time.perf_counter_ns() - start) / CALLS


async def _policies() -> dict[str, list[float]]:
    """Every row's ns per call, one figure per round (rows timed in turns within a round)."""
    rows = _rows()
    was_enabled = _metrics.state.enabled
    rounds: dict[str, list[float]] = {name: [] for name, *_ in rows}
    try:
        for _name, enabled, _sink, make in rows:  # warm up every path once
            _metrics.state.enabled = enabled
            for _ in range(WARMUP):
                await make()
        for _ in range(ROUNDS):
            for name, enabled, sink, make in rows:
                _metrics.state.enabled = enabled
                if sink is not None:
                    stoic.add_sink(sink)
                try:
                    rounds[name].append(await _time(make))
                finally:
                    if sink is not None:
                        stoic.remove_sink(sink)
    finally:
        _metrics.state.enabled = was_enabled  # later rows (and later scripts) must not pay for metrics
    return rounds


def _paired(rounds: dict[str, list[float]], row: str, against: str) -> float:
    """The median over rounds of ``row`` / ``against`` timed in the same round: the two rows ran
    next to each other, so a load that comes and goes on a shared machine cancels out."""
    return statistics.median(a / b for a, b in zip(rounds[row], rounds[against], strict=True))


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
    was_enabled = _metrics.state.enabled  # instrument() turns metrics on: put back what was found
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    instrumentation = instrument(meter_provider=provider, span_events=False)
    try:
        rounds = asyncio.run(_policies())
        reader.get_metrics_data()  # a collection reads the recorders (not timed: it is not per call)
    finally:
        instrumentation.uninstrument()
        provider.shutdown()
        _metrics.state.enabled = was_enabled
    policies = {name: min(figures) for name, figures in rounds.items()}
    print("\n## Observability: cost per call (ns/call, best of rounds, rows timed in turns)")
    base = policies["breaker, no sink, metrics off"]
    for name, ns in policies.items():
        print(f"{name:<66}{ns:>10.0f}")
    events = _per_event()
    print("\n## Event sinks: cost per emitted event (ns/event), for reference")
    for name, ns in events.items():
        print(f"{name:<66}{ns:>10.0f}")

    print("\n## Targets")
    verdict("breaker success, metrics on: ns over no sink", policies["breaker, metrics on"] - base, 1000, " ns")
    # Of overheads (a ratio of whole calls would dilute what metrics add with the bare call's cost).
    bare = policies["bare await via lambda"]
    verdict("pipeline x4, metrics on / metrics off (overheads)",
            (policies["pipeline x4, metrics on"] - bare) / max(1e-9, policies["pipeline x4, metrics off"] - bare), 1.5)
    # "No slower": the median of the ratios of the two rows timed side by side in each round.
    verdict("breaker, DEBUG sink wanting no breaker event / no sink (no slower)",
            _paired(rounds, "breaker, DEBUG sink wanting no breaker event", "breaker, no sink, metrics off"), NO_SLOWER)
    for kind in KINDS:
        verdict(f"{kind}, DEBUG sink wanting no {kind} event / no sink (no slower)",
                _paired(rounds, f"{kind}, DEBUG sink wanting no {kind} event", f"{kind}, no sink"), NO_SLOWER)


if __name__ == "__main__":
    main()
