"""The metrics adapter: every metric of the table, from real policies' recorders read at collection
time, with the exact names, units, attributes and buckets the table fixes; bounded cardinality."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import tracemalloc
import warnings
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
from opentelemetry.sdk.metrics.export import Gauge, InMemoryMetricReader, Sum
from otel_support import by_attrs, collect, delta_exporter, key, metric_provider
from prometheus_client import CollectorRegistry, generate_latest
from stoic_opentelemetry import METRICS, SCHEMA_URL, SECOND_BUCKETS, HistogramBridge, Instrumentation, instrument
from stoic_opentelemetry._instrumentor import StoicInstrumentor

import stoic
from stoic import _metrics
from stoic.testing import VirtualClock


@pytest.fixture
def otel() -> Iterator[tuple[Instrumentation, InMemoryMetricReader, CollectorRegistry]]:
    provider, reader = metric_provider()
    registry = CollectorRegistry()
    inst = instrument(meter_provider=provider, span_events=False, prometheus_registry=registry)
    yield inst, reader, registry
    inst.uninstrument()
    provider.shutdown()


def mine(metric: Any, prefix: str) -> dict[frozenset[tuple[str, Any]], Any]:
    """Points of ``metric`` whose label starts with ``prefix`` (other tests' policies may be alive)."""
    return {k: p for k, p in by_attrs(metric).items() if str(dict(k).get("stoic.label", "")).startswith(prefix)}


class Boom(Exception):
    pass


async def _sleep(clock: VirtualClock, seconds: float) -> None:
    await clock.sleep_until(clock.now_ns() + round(seconds * 1e9))


async def _drive_everything(clock: VirtualClock, p: str) -> dict[str, object]:
    """Real policies doing real work on the virtual clock: every metric of the table gets a sample."""
    breaker = stoic.CircuitBreaker(label=f"{p}breaker", window=stoic.CountWindow(4), minimum_calls=2,
                                   failure_rate_threshold=0.6, open_duration=stoic.OpenDuration.fixed(10.0),
                                   clock=clock)

    async def ok() -> str:
        await _sleep(clock, 0.02)
        return "ok"

    async def fail() -> str:
        await _sleep(clock, 0.3)
        raise Boom

    async def run(coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        while not task.done():
            await clock.advance(0.01)
        error = task.exception()
        assert error is None or isinstance(error, Boom), error

    await run(breaker.execute(ok))
    for _ in range(2):
        await run(breaker.execute(fail))
    with pytest.raises(stoic.CircuitOpen):
        await breaker.execute(ok)

    limiter = stoic.RateLimiter(1, 1.0, label=f"{p}limiter", clock=clock)
    await limiter.acquire()
    await run(limiter.acquire())  # waits about a second
    with pytest.raises(stoic.RateLimited):
        await limiter.acquire(5)  # oversized: more than the burst

    bulkhead = stoic.Bulkhead(1, queue_limit=0, label=f"{p}bulkhead", clock=clock)
    gate = asyncio.Event()

    async def hold() -> None:
        await gate.wait()

    holder = asyncio.ensure_future(bulkhead.execute(hold))
    await asyncio.sleep(0)
    with pytest.raises(stoic.BulkheadFull):
        await bulkhead.execute(hold)

    hedge = stoic.Hedge(0.05, label=f"{p}hedge", clock=clock)

    async def slow_first(attempt: stoic.Attempt) -> int:
        await _sleep(clock, 1.0 if attempt.number == 1 else 0.01)
        return attempt.number

    await run(hedge.execute(stoic.IDEMPOTENT, slow_first))

    failures = iter([Boom(), None])

    async def flaky() -> str:
        error = next(failures)
        if error is not None:
            raise error
        return "ok"

    await run(stoic.retry(stoic.Schedule.fixed(0.1).attempts(3), flaky, label=f"{p}retry"))
    # stoic.fleet's decisions without a store (a real Redis is tests/integration/test_fleet_redis.py's).
    from stoic.fleet._limiter import fail_event
    from stoic.fleet._store import StoreError

    down = StoreError("unreachable", operation="limiter_take", unavailable=True)
    fail_event(f"{p}fleet", "ratelimiter", True, down, clock.now_ns())
    fail_event(f"{p}fleet", "ratelimiter", False, down, clock.now_ns())
    _metrics.count_shared("fleet", f"{p}fleet", ("stoic.fleet.store.errors", "ConnectionError"))
    _metrics.count_shared("fleet", f"{p}fleet", ("stoic.fleet.store.recoveries",))
    throttle = stoic.AdaptiveThrottle(label=f"{p}throttle", clock=clock)
    await run(throttle.execute(ok))

    async def down_hard() -> str:
        raise ConnectionError("down")

    for _ in range(200):  # the dependency fails: the throttle starts shedding (seeded draws)
        with contextlib.suppress(ConnectionError, stoic.Throttled):
            await throttle.execute(down_hard)
    return {"breaker": breaker, "limiter": limiter, "bulkhead": bulkhead, "hedge": hedge, "holder": holder,
            "gate": gate, "throttle": throttle}


async def test_every_metric_in_the_table_is_produced_from_real_policies(otel, clock):
    _, reader, registry = otel
    alive = await _drive_everything(clock, "t1-")
    got = collect(reader)
    kinds = {"counter": Sum, "gauge": Gauge}
    for spec in METRICS:
        if spec.kind == "histogram":
            continue  # served from the prometheus_client registry (below) or the bridge
        assert spec.name in got, f"{spec.name} was not produced"
        metric = got[spec.name]
        assert metric.unit == spec.unit, spec.name
        assert isinstance(metric.data, kinds[spec.kind]), spec.name
        points = mine(metric, "t1-")
        assert points, spec.name
        for attrs in points:
            assert {k for k, _ in attrs} <= set(spec.attributes), spec.name
    text = generate_latest(registry).decode()
    for spec in METRICS:
        if spec.kind == "histogram":
            assert f'{spec.prometheus_name}_bucket{{' in text and 't1-' in text, spec.name
    state = mine(got["stoic.breaker.state"], "t1-")
    assert state[key(stoic_label="t1-breaker", state="open")].value == 1
    assert state[key(stoic_label="t1-breaker", state="closed")].value == 0
    calls = mine(got["stoic.breaker.calls"], "t1-")
    assert calls[key(stoic_label="t1-breaker", outcome="success")].value == 1
    assert calls[key(stoic_label="t1-breaker", outcome="failure")].value == 2
    assert mine(got["stoic.breaker.transitions"], "t1-")[key(stoic_label="t1-breaker", state="open")].value == 1
    assert mine(got["stoic.breaker.rejections"], "t1-")[key(stoic_label="t1-breaker", state="open")].value == 1
    rl = mine(got["stoic.ratelimiter.rejections"], "t1-")
    assert rl[key(stoic_label="t1-limiter", reason="oversized")].value == 1
    assert mine(got["stoic.bulkhead.active"], "t1-")[key(stoic_label="t1-bulkhead")].value == 1
    bulkhead_rejections = mine(got["stoic.bulkhead.rejections"], "t1-")
    assert bulkhead_rejections[key(stoic_label="t1-bulkhead", reason="bulkhead_full")].value == 1
    assert mine(got["stoic.hedge.attempts"], "t1-")[key(stoic_label="t1-hedge")].value == 1
    assert mine(got["stoic.hedge.wins"], "t1-")[key(stoic_label="t1-hedge", attempt="2")].value == 1
    assert mine(got["stoic.hedge.delay"], "t1-")[key(stoic_label="t1-hedge")].value == pytest.approx(0.05)
    assert mine(got["stoic.retry.retries"], "t1-")[key(stoic_label="t1-retry", error_type="Boom")].value == 1
    assert mine(got["stoic.retry.outcomes"], "t1-")[key(stoic_label="t1-retry", outcome="succeeded")].value == 1
    alive["gate"].set()  # type: ignore[attr-defined]
    await alive["holder"]  # type: ignore[misc]


async def test_duration_histograms_are_exact_with_error_type_on_failures(otel, clock):
    inst, _, registry = otel
    alive = await _drive_everything(clock, "t2-")  # policies that are gone have no series: keep them
    assert inst.metrics is not None
    (duration,) = [m for m in inst.metrics.histogram_metrics() if m.name == "stoic.breaker.call.duration"]
    assert duration.unit == "s"
    points = {frozenset(p.attributes.items()): p for p in duration.data.data_points
              if p.attributes["stoic.label"] == "t2-breaker"}
    success = points[key(stoic_label="t2-breaker", outcome="success")]  # no error.type on a success
    failure = points[key(stoic_label="t2-breaker", outcome="failure", error_type="Boom")]
    assert list(success.explicit_bounds) == list(SECOND_BUCKETS)
    assert success.count == 1 and failure.count == 2
    # 0.02 s lands in the (0.01, 0.025] bucket; 0.3 s twice in (0.25, 0.5].
    assert success.bucket_counts[2] == 1 and sum(success.bucket_counts) == 1
    assert failure.bucket_counts[6] == 2 and sum(failure.bucket_counts) == 2
    assert failure.sum == pytest.approx(0.6, abs=0.03)
    text = generate_latest(registry).decode()
    line = ('stoic_breaker_call_duration_seconds_bucket{error_type="Boom",le="0.5",outcome="failure",'
            'stoic_label="t2-breaker"} 2.0')
    assert line in text
    alive["gate"].set()  # type: ignore[attr-defined]
    await alive["holder"]  # type: ignore[misc]


def test_the_scope_carries_the_schema_url_and_setup_enables_the_recorders():
    provider, reader = metric_provider()
    inst = instrument(meter_provider=provider, span_events=False)
    try:
        assert _metrics.state.enabled
        breaker = stoic.CircuitBreaker(label="scope-check")
        breaker.call(lambda: None)
        data = reader.get_metrics_data()
        scopes = {sm.scope.name: sm.scope for rm in data.resource_metrics for sm in rm.scope_metrics}
        assert scopes["stoic_opentelemetry"].schema_url == SCHEMA_URL
    finally:
        inst.uninstrument()


def test_a_garbage_collected_policy_disappears_at_the_next_collection(otel):
    _, reader, registry = otel
    breaker = stoic.CircuitBreaker(label="t3-gone")
    breaker.call(lambda: None)
    assert mine(collect(reader)["stoic.breaker.calls"], "t3-")
    del breaker
    gc.collect()
    got = collect(reader)
    assert not mine(got.get("stoic.breaker.calls", _Empty()), "t3-")
    assert not mine(got.get("stoic.breaker.state", _Empty()), "t3-")
    assert "t3-gone" not in generate_latest(registry).decode()


class _Empty:
    class data:
        data_points: ClassVar[list[Any]] = []


def _raise_boom() -> None:
    raise Boom


async def test_5000_short_lived_tenant_breakers_leave_the_live_one_under_its_own_label(otel, clock):
    """Field report 22: per-tenant breakers created and dropped while a live one trips."""
    _, reader, registry = otel
    live = stoic.CircuitBreaker(label="t4-live", window=stoic.CountWindow(4), minimum_calls=2, clock=clock)
    tracemalloc.start()
    try:
        baseline = None
        for round_ in range(10):
            tenants = [stoic.CircuitBreaker(label=f"t4-tenant-{round_}-{i}", window=stoic.CountWindow(1),
                                            minimum_calls=1, clock=clock) for i in range(500)]
            for i, tenant in enumerate(tenants):
                if i % 3:
                    tenant.call(lambda: None)
                else:  # a third are dropped while open, as in the report
                    with pytest.raises(Boom):
                        tenant.call(_raise_boom)
            assert tenants[0].state is stoic.BreakerState.OPEN
            del tenants, tenant
            gc.collect()
            got = collect(reader)
            generate_latest(registry)
            if round_ == 4:
                def boom() -> None:
                    raise Boom

                for _ in range(2):
                    with pytest.raises(Boom):
                        live.call(boom)
            if round_ == 1:
                baseline = tracemalloc.get_traced_memory()[0]
        grown = tracemalloc.get_traced_memory()[0] - (baseline or 0)
    finally:
        tracemalloc.stop()
    state = mine(got["stoic.breaker.state"], "t4-")
    assert state == {k: v for k, v in state.items() if dict(k)["stoic.label"] == "t4-live"}, "no dead tenant left"
    assert state[key(stoic_label="t4-live", state="open")].value == 1
    assert len(state) == 3
    assert grown < 2_000_000, f"memory grew by {grown} bytes over 4,000 dropped breakers"
    text = generate_latest(registry).decode()
    assert "t4-tenant" not in text


def test_live_breakers_within_max_labels_never_fall_into_the_sdks_overflow_series(otel, caplog):
    """Field report 22: 800 live breakers (within max_labels=1000) are 2,400 state series, past the
    SDK's default cardinality limit of 2,000 per instrument, beyond which the SDK folds series into one
    ``otel.metric.overflow`` point that has lost ``stoic.label`` and ``state``."""
    _, reader, _ = otel
    breakers = [stoic.CircuitBreaker(label=f"t9-{i:03}") for i in range(800)]
    for breaker in breakers:
        breaker.call(lambda: None)
    breakers[0].force_open()
    with caplog.at_level(logging.WARNING, logger="stoic"):
        first = by_attrs(collect(reader)["stoic.breaker.state"])
        second = by_attrs(collect(reader)["stoic.breaker.state"])
    for points in (first, second):
        assert len(points) <= 2000
        assert not [k for k in points if "otel.metric.overflow" in dict(k)], "series lost to the SDK's overflow"
        labels = {dict(k)["stoic.label"] for k in points}
        assert _metrics.OVERFLOW in labels
        for label in labels:  # a label is reported with all three states or not at all
            assert {dict(k)["state"] for k in points if dict(k)["stoic.label"] == label} == set(_metrics.BREAKER_STATES)
        # nothing lost: every live breaker is in exactly one state, under its label or _overflow
        assert sum(p.value for p in points.values()) >= 800
        assert sum(p.value for k, p in points.items() if dict(k)["state"] == "open") >= 1
    assert points[key(stoic_label="t9-000", state="open")].value == 1  # the first in order keeps its label
    assert set(first) == set(second)  # stable
    assert len([r for r in caplog.records if "cardinality limit" in r.getMessage()]) == 1
    del breakers, breaker


def test_labels_beyond_the_cap_go_to_one_overflow_series_with_one_warning():
    provider, reader = metric_provider()
    inst = instrument(meter_provider=provider, span_events=False, max_labels=5)
    try:
        breakers = [stoic.CircuitBreaker(label=f"t5-{i}") for i in range(8)]
        for b in breakers:
            b.call(lambda: None)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            first = collect(reader)
            second = collect(reader)
        calls = by_attrs(first["stoic.breaker.calls"])
        labels = {dict(k)["stoic.label"] for k in calls}
        assert len(labels) <= 5 and _metrics.OVERFLOW in labels
        total = sum(p.value for p in calls.values())
        assert total >= 8  # nothing lost: the overflow series sums the rest
        assert {dict(k)["stoic.label"] for k in by_attrs(second["stoic.breaker.calls"])} == labels  # stable
        messages = [str(w.message) for w in caught if "stoic.breaker.calls" in str(w.message)]
        # (other tests' policies may be alive: the label named is whichever overflowed first)
        assert len(messages) == 1 and "stoic.label" in messages[0] and "label '" in messages[0]
    finally:
        inst.uninstrument()


def test_a_gauge_property_that_raises_is_skipped_and_reported_once(otel, caplog, monkeypatch):
    _, reader, _ = otel
    limiter = stoic.RateLimiter(5, label="t6-limiter")

    def broken(self: object) -> int:
        raise RuntimeError("broken gauge")

    monkeypatch.setattr(stoic.RateLimiter, "available_permits", property(broken))
    with caplog.at_level(logging.ERROR, logger="stoic"):
        first = collect(reader)
        collect(reader)
    assert not mine(first.get("stoic.ratelimiter.permits.available", _Empty()), "t6-")
    assert mine(first["stoic.ratelimiter.waiters"], "t6-")  # the other gauge still reads
    assert len([r for r in caplog.records if "available_permits" in r.getMessage()]) == 1
    del limiter


def test_a_second_instrument_is_refused_and_the_instrumentor_instruments_once(caplog, monkeypatch):
    provider, _ = metric_provider()
    inst = instrument(meter_provider=provider, span_events=False)
    try:
        with pytest.raises(RuntimeError, match="already instrumented"):
            instrument(meter_provider=provider)
    finally:
        inst.uninstrument()
    instrumentor = StoicInstrumentor()
    assert StoicInstrumentor() is instrumentor  # a singleton, as contrib's instrumentors are
    with caplog.at_level(logging.WARNING):
        instrumentor.instrument(meter_provider=provider, span_events=False)
        try:
            instrumentor.instrument(meter_provider=provider, span_events=False)  # logs, does nothing
            assert any("already instrumented" in r.getMessage() for r in caplog.records)
        finally:
            instrumentor.uninstrument()
    assert not instrumentor.is_instrumented_by_opentelemetry
    monkeypatch.setenv("OTEL_PYTHON_DISABLED_INSTRUMENTATIONS", "requests, stoic")
    instrumentor.instrument(meter_provider=provider)
    try:
        from stoic_opentelemetry import active

        assert active() is None  # honoured: nothing installed
    finally:
        instrumentor.uninstrument()


def test_an_instrument_refused_for_a_bad_level_leaves_nothing_behind_and_can_be_retried():
    provider, reader = metric_provider()
    registry = CollectorRegistry()
    with pytest.raises(TypeError, match="level"):
        instrument(meter_provider=provider, log_events=True, level="INFO", prometheus_registry=registry)
    from stoic_opentelemetry import active

    assert active() is None
    assert not [s for s in stoic.events.process_sinks() if type(s).__module__.startswith("stoic_opentelemetry")]
    assert "stoic_breaker_call_duration_seconds" not in generate_latest(registry).decode()  # unregistered
    inst = instrument(meter_provider=provider, span_events=False, prometheus_registry=registry)  # not a duplicate
    try:
        breaker = stoic.CircuitBreaker(label="t10-retried")
        breaker.call(lambda: None)
        assert mine(collect(reader)["stoic.breaker.calls"], "t10-")
        assert 'stoic_label="t10-retried"' in generate_latest(registry).decode()
    finally:
        inst.uninstrument()
        provider.shutdown()


def test_the_entry_point_names_the_instrumentor():
    from importlib.metadata import entry_points

    (point,) = [e for e in entry_points(group="opentelemetry_instrumentor") if e.name == "stoic"]
    assert point.load() is StoicInstrumentor


def test_the_bridge_adds_exact_histograms_to_a_push_export():
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import (
        MetricExporter,
        MetricExportResult,
        PeriodicExportingMetricReader,
    )

    exported: list[Any] = []

    class Exporter(MetricExporter):
        def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
            exported.append(metrics_data)
            return MetricExportResult.SUCCESS

        def force_flush(self, timeout_millis: float = 10_000) -> bool:
            return True

        def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
            pass

    clock = VirtualClock()
    reader = PeriodicExportingMetricReader(HistogramBridge(Exporter()), export_interval_millis=3_600_000)
    provider = MeterProvider(metric_readers=[reader])
    inst = instrument(span_events=False, meter_provider=provider)
    try:
        breaker = stoic.CircuitBreaker(label="t7-bridge", clock=clock)
        breaker.call(lambda: None)
        provider.force_flush()
        names = {m.name for data in exported for rm in data.resource_metrics for sm in rm.scope_metrics
                 for m in sm.metrics}
        assert "stoic.breaker.call.duration" in names
        assert "stoic.breaker.calls" in names  # the SDK's own metrics are still exported
    finally:
        inst.uninstrument()
        provider.shutdown()


def test_a_failing_reading_of_the_recorders_never_breaks_the_sdk_collection(caplog, monkeypatch):
    provider, reader = metric_provider()
    inst = instrument(meter_provider=provider, span_events=False)
    try:
        assert inst.metrics is not None

        def broken() -> list[object]:
            raise RuntimeError("recorder bug")

        monkeypatch.setattr(inst.metrics._collector, "collect", broken)
        with caplog.at_level(logging.ERROR, logger="stoic"):
            first = collect(reader)
            collect(reader)
        assert not any(name.startswith("stoic.") and mine(m, "") for name, m in first.items())
        assert len([r for r in caplog.records if "reading stoic's metrics failed" in r.getMessage()]) == 1
    finally:
        inst.uninstrument()


@pytest.mark.parametrize("kind", ["bulkhead", "limiter", "adaptive", "throttle", "hedge"])
async def test_short_lived_policies_of_every_kind_leave_no_series_behind(otel, clock, kind):
    """Field report 22 beyond breakers: 1,200 per-tenant policies of one kind, used and dropped
    in rounds of 400 (more than the 1,000-label cap in all), leave only the live one's series,
    under its own label, and never trigger the overflow."""
    _, reader, registry = otel

    def build(label: str) -> Any:
        if kind == "bulkhead":
            return stoic.Bulkhead(2, label=label, clock=clock)
        if kind == "limiter":
            return stoic.RateLimiter(5, label=label, clock=clock)
        if kind == "adaptive":
            return stoic.AdaptiveBulkhead(latency_threshold=1.0, max_concurrent=4, label=label, clock=clock)
        if kind == "throttle":
            return stoic.AdaptiveThrottle(label=label, clock=clock)
        return stoic.Hedge(0.1, label=label, clock=clock)

    async def ok() -> int:
        return 1

    async def use(policy: Any) -> None:
        await (policy.execute(stoic.IDEMPOTENT, ok) if kind == "hedge" else policy.execute(ok))

    prefix = f"t6-{kind}-"
    live = build(f"{prefix}live")
    await use(live)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # an overflow warning fails the test
        for round_ in range(3):
            tenants = [build(f"{prefix}tenant-{round_}-{i}") for i in range(400)]
            for tenant in tenants:
                await use(tenant)
            del tenants, tenant
            gc.collect()
            got = collect(reader)
    labels = {dict(k)["stoic.label"] for metric in got.values() for k in mine(metric, prefix)}
    assert labels == {f"{prefix}live"}
    assert "tenant" not in "".join(line for line in generate_latest(registry).decode().splitlines()
                                   if prefix in line)


def test_a_gauge_beyond_64_bits_is_observed_as_a_float(otel):
    # OTLP's integer points are int64; a limiter built with a huge burst ("no limit, really") has
    # that many permits available, which an int observation could not export. A float can.
    _, reader, _ = otel
    limiter = stoic.RateLimiter(1, burst=2**70, label="t9-huge")
    (point,) = mine(collect(reader)["stoic.ratelimiter.permits.available"], "t9-").values()
    assert point.value == float(2**70) and isinstance(point.value, float)
    del limiter


def test_the_bridge_follows_an_exporter_that_prefers_delta_temporality():
    # Backends that take only delta (OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE=delta, as
    # several vendors ask) got the SDK's own metrics as deltas but stoic's histograms as cumulative
    # points in the same export. The bridge now reports them as deltas when the exporter asks.
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import AggregationTemporality, PeriodicExportingMetricReader

    exporter, exported = delta_exporter()
    delta = AggregationTemporality.DELTA

    def durations() -> Any:
        (metric,) = [m for rm in exported[-1].resource_metrics for sm in rm.scope_metrics for m in sm.metrics
                     if m.name == "stoic.breaker.call.duration"]
        (point,) = [p for p in metric.data.data_points if p.attributes.get("stoic.label") == "t8-delta"]
        return metric.data.aggregation_temporality, point

    reader = PeriodicExportingMetricReader(HistogramBridge(exporter), export_interval_millis=3_600_000)
    provider = MeterProvider(metric_readers=[reader])
    inst = instrument(span_events=False, meter_provider=provider)
    try:
        breaker = stoic.CircuitBreaker(label="t8-delta")
        breaker.call(lambda: None)
        provider.force_flush()
        temporality, first = durations()
        assert temporality is delta and first.count == 1 and sum(first.bucket_counts) == 1
        for _ in range(2):
            breaker.call(lambda: None)
        provider.force_flush()
        temporality, second = durations()
        assert temporality is delta and second.count == 2 and sum(second.bucket_counts) == 2
        assert second.start_time_unix_nano == first.time_unix_nano  # consecutive intervals
        provider.force_flush()
        assert durations()[1].count == 0  # nothing new in this interval
    finally:
        inst.uninstrument()
        provider.shutdown()
