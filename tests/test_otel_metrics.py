"""The metrics adapter: every metric of the table, from synthetic catalog-valid events and
duck-typed observed policies, with the exact names, units and attributes the table fixes."""

from __future__ import annotations

import enum
import gc
import logging
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import Gauge, Histogram, InMemoryMetricReader, Sum
from otel_support import SAMPLES, by_attrs, collect, fire, key, metric_provider, points
from prometheus_client import CollectorRegistry, generate_latest
from stoic_opentelemetry import METRICS, SECOND_BUCKETS, Instrumentation, MetricsSink, instrument
from stoic_opentelemetry._table import METRICS_BY_NAME, RETRY_OUTCOMES

import stoic
from stoic.events import CATALOG, Level, emit, enabled, process_sinks
from stoic.testing import RecordingSink


class State(enum.StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class FakeBreaker:
    def __init__(self, label: str, state: State = State.CLOSED) -> None:
        self.label = label
        self.state = state


class FakeLimiter:
    def __init__(self, label: str, available: float = 3, waiters: int = 2) -> None:
        self.label = label
        self.available_permits = available
        self.waiter_count = waiters


class FakeBulkhead:
    def __init__(self, label: str, active: int = 1, queued: int = 4) -> None:
        self.label = label
        self.active_count = active
        self.queued_count = queued


class FakeHedge:
    def __init__(self, label: str | None, delay: float | None = 0.25) -> None:
        self.label = label
        self.current_delay = delay


class Slotted:
    """No __weakref__ slot: observe() must keep it by a strong reference."""

    __slots__ = ("label", "active_count", "queued_count")

    def __init__(self) -> None:
        self.label = "slotted"
        self.active_count = 7
        self.queued_count = 0


@pytest.fixture
def otel(sink: RecordingSink) -> Iterator[tuple[Instrumentation, InMemoryMetricReader]]:
    """Metrics installed process-wide on an in-memory reader; every synthetic event is also
    checked against the catalog by the ``sink`` fixture."""
    provider, reader = metric_provider()
    inst = instrument(meter_provider=provider, span_events=False)
    yield inst, reader
    inst.uninstrument()
    provider.shutdown()


def emit_all(label: str = "svc") -> None:
    for name in SAMPLES:
        fire(name, label)


def test_every_metric_in_the_table_is_produced_with_its_kind_unit_and_attribute_keys(otel):
    inst, reader = otel
    emit_all()
    policies = (FakeBreaker("b"), FakeLimiter("rl"), FakeBulkhead("bh"), FakeHedge("h"))
    inst.observe(*policies)  # held weakly: the test keeps them alive, as an application does
    got = collect(reader)
    kinds = {"counter": Sum, "histogram": Histogram, "gauge": Gauge}
    for spec in METRICS:
        assert spec.name in got, f"{spec.name} was not produced"
        metric = got[spec.name]
        assert metric.unit == spec.unit, spec.name
        assert isinstance(metric.data, kinds[spec.kind]), spec.name
        if spec.kind == "counter":
            assert metric.data.is_monotonic
        data_points = list(points(metric))
        assert data_points, spec.name
        for point in data_points:
            assert tuple(sorted(point.attributes)) == tuple(sorted(spec.attributes)), spec.name
    assert set(got) == {spec.name for spec in METRICS}


def test_the_table_names_only_catalog_events_and_the_sink_handles_exactly_them():
    sources = {event for spec in METRICS for event in spec.events}
    assert sources <= set(CATALOG)
    assert MetricsSink(MeterProvider()).handled_events == sources
    for spec in METRICS:
        assert spec.name.startswith("stoic.") and spec.name == spec.name.lower()
        assert spec.attributes[0] == "stoic.label"
        assert "total" not in spec.name
        assert bool(spec.events) or bool(spec.properties)


def test_breaker_counters_by_outcome_and_state(otel):
    _, reader = otel
    fire("breaker.recorded", outcome="success", duration=0.01)
    fire("breaker.recorded", outcome="success", duration=0.02)
    fire("breaker.recorded", outcome="failure", duration=0.5)
    fire("breaker.rejected", state="open")
    fire("breaker.rejected", state="half_open")
    fire("breaker.rejected", state="half_open")
    fire("breaker.opened")
    fire("breaker.half_open")
    fire("breaker.closed")
    fire("breaker.opened", label="other")
    got = collect(reader)
    calls = by_attrs(got["stoic.breaker.calls"])
    assert calls[key(stoic_label="svc", outcome="success")].value == 2
    assert calls[key(stoic_label="svc", outcome="failure")].value == 1
    rejections = by_attrs(got["stoic.breaker.rejections"])
    assert rejections[key(stoic_label="svc", state="open")].value == 1
    assert rejections[key(stoic_label="svc", state="half_open")].value == 2
    transitions = by_attrs(got["stoic.breaker.transitions"])
    assert {k: p.value for k, p in transitions.items()} == {
        key(stoic_label="svc", state="open"): 1,
        key(stoic_label="svc", state="half_open"): 1,
        key(stoic_label="svc", state="closed"): 1,
        key(stoic_label="other", state="open"): 1,
    }
    durations = by_attrs(got["stoic.breaker.call.duration"])
    assert durations[key(stoic_label="svc", outcome="success")].count == 2
    assert durations[key(stoic_label="svc", outcome="success")].sum == pytest.approx(0.03)
    assert durations[key(stoic_label="svc", outcome="failure")].count == 1


def state_series(reader: InMemoryMetricReader, label: str) -> dict[str, int]:
    gauge = collect(reader)["stoic.breaker.state"]
    return {p.attributes["state"]: p.value for p in points(gauge) if p.attributes["stoic.label"] == label}


def test_breaker_state_gauge_follows_transition_events_with_all_three_series(otel):
    _, reader = otel
    fire("breaker.opened")
    assert state_series(reader, "svc") == {"closed": 0, "open": 1, "half_open": 0}
    fire("breaker.half_open")
    assert state_series(reader, "svc") == {"closed": 0, "open": 0, "half_open": 1}
    fire("breaker.closed")
    assert state_series(reader, "svc") == {"closed": 1, "open": 0, "half_open": 0}
    fire("breaker.opened")
    fire("breaker.reset")
    assert state_series(reader, "svc") == {"closed": 1, "open": 0, "half_open": 0}


def test_a_breaker_first_seen_through_a_call_or_rejection_is_known_in_that_state(otel):
    _, reader = otel
    fire("breaker.recorded", "quiet", state="closed")
    fire("breaker.rejected", "tripped", state="open")
    assert state_series(reader, "quiet") == {"closed": 1, "open": 0, "half_open": 0}
    assert state_series(reader, "tripped") == {"closed": 0, "open": 1, "half_open": 0}
    # a later recorded/rejected event never overrides a transition (they may race it across threads)
    fire("breaker.opened", "quiet")
    fire("breaker.recorded", "quiet", state="half_open")
    assert state_series(reader, "quiet") == {"closed": 0, "open": 1, "half_open": 0}


def test_an_observed_breaker_reports_its_state_property_over_its_events(otel):
    inst, reader = otel
    breaker = FakeBreaker("svc", State.HALF_OPEN)
    fire("breaker.opened")  # the events say open; the property is read at collection
    inst.observe(breaker)
    assert state_series(reader, "svc") == {"closed": 0, "open": 0, "half_open": 1}
    breaker.state = State.OPEN
    assert state_series(reader, "svc") == {"closed": 0, "open": 1, "half_open": 0}
    never = FakeBreaker("never-called", State.CLOSED)
    inst.observe(never)
    assert state_series(reader, "never-called") == {"closed": 1, "open": 0, "half_open": 0}


def bucket_of(point, value: float) -> int:
    bounds = list(point.explicit_bounds)
    return next((i for i, b in enumerate(bounds) if value <= b), len(bounds))


def test_duration_histograms_use_second_scale_buckets_so_50ms_and_2s_differ(otel):
    _, reader = otel
    fire("breaker.recorded", outcome="success", duration=0.05)
    fire("breaker.recorded", outcome="success", duration=2.0)
    fire("ratelimiter.waited", waited=0.05)
    fire("ratelimiter.waited", waited=2.0)
    got = collect(reader)
    for name in ("stoic.breaker.call.duration", "stoic.ratelimiter.wait.duration"):
        (point,) = points(got[name])
        assert tuple(point.explicit_bounds) == SECOND_BUCKETS
        counts = list(point.bucket_counts)
        assert sum(counts) == 2
        assert bucket_of(point, 0.05) != bucket_of(point, 2.0)
        assert counts[bucket_of(point, 0.05)] == 1 and counts[bucket_of(point, 2.0)] == 1


def test_limiter_bulkhead_hedge_and_retry_counters(otel):
    _, reader = otel
    for reason in ("would_exceed_deadline", "queue_full", "queue_full", "cancelled", "deadline_exceeded"):
        fire("ratelimiter.rejected", "rl", reason=reason)
    fire("ratelimiter.oversized", "rl")
    fire("bulkhead.rejected", "bh", reason="bulkhead_full")
    fire("bulkhead.rejected", "bh", reason="deadline_exceeded")
    fire("hedge.started", "h", attempt=2)
    fire("hedge.started", "h", attempt=3)
    fire("hedge.won", "h", attempt=3)
    fire("hedge.attempt_failed", "h")  # no metric: must not count anywhere
    fire("retry.attempt_failed", "r", **{"error.type": "ConnectionError"})
    fire("retry.attempt_failed", "r", **{"error.type": "ConnectionError"})
    fire("retry.attempt_failed", "r", **{"error.type": "TimeoutError"})
    for name in RETRY_OUTCOMES:
        fire(name, "r")
    got = collect(reader)
    limiter = {k: p.value for k, p in by_attrs(got["stoic.ratelimiter.rejections"]).items()}
    assert limiter == {
        key(stoic_label="rl", reason="would_exceed_deadline"): 1,
        key(stoic_label="rl", reason="queue_full"): 2,
        key(stoic_label="rl", reason="cancelled"): 1,
        key(stoic_label="rl", reason="deadline_exceeded"): 1,
        key(stoic_label="rl", reason="oversized"): 1,
    }
    bulkhead = {k: p.value for k, p in by_attrs(got["stoic.bulkhead.rejections"]).items()}
    assert bulkhead == {key(stoic_label="bh", reason="bulkhead_full"): 1,
                        key(stoic_label="bh", reason="deadline_exceeded"): 1}
    assert [p.value for p in points(got["stoic.hedge.attempts"])] == [2]
    wins = by_attrs(got["stoic.hedge.wins"])
    assert wins[key(stoic_label="h", attempt=3)].value == 1
    retries = {k: p.value for k, p in by_attrs(got["stoic.retry.retries"]).items()}
    assert retries == {key(stoic_label="r", error_type="ConnectionError"): 2,
                       key(stoic_label="r", error_type="TimeoutError"): 1}
    outcomes = {p.attributes["outcome"]: p.value for p in points(got["stoic.retry.outcomes"])}
    assert outcomes == dict.fromkeys(
        ("succeeded", "exhausted", "budget_exhausted", "deadline_skip", "permanent", "defect", "nested"), 1)
    assert "stoic.breaker.calls" not in got  # hedge.attempt_failed feeds no metric


def gauge_values(reader: InMemoryMetricReader) -> dict[tuple[str, str], float]:
    out: dict[tuple[str, str], float] = {}
    for spec in METRICS:
        if spec.kind != "gauge" or spec.name == "stoic.breaker.state":
            continue
        metric = collect(reader).get(spec.name)
        for p in points(metric) if metric is not None else ():
            out[(spec.name, p.attributes["stoic.label"])] = p.value
    return out


def test_observed_policies_feed_the_gauges_by_duck_typing(otel):
    inst, reader = otel
    limiter, bulkhead, hedge = FakeLimiter("rl", 2.5, 3), FakeBulkhead("bh", 5, 1), FakeHedge("h", 0.125)
    assert inst.observe(limiter, bulkhead, hedge) is inst
    inst.observe(limiter)  # observing twice does not double the series
    assert gauge_values(reader) == {
        ("stoic.ratelimiter.permits.available", "rl"): 2.5,
        ("stoic.ratelimiter.waiters", "rl"): 3,
        ("stoic.bulkhead.active", "bh"): 5,
        ("stoic.bulkhead.queued", "bh"): 1,
        ("stoic.hedge.delay", "h"): 0.125,
    }
    limiter.waiter_count = 9
    bulkhead.active_count = 0
    values = gauge_values(reader)
    assert values[("stoic.ratelimiter.waiters", "rl")] == 9
    assert values[("stoic.bulkhead.active", "bh")] == 0


def test_gauges_skip_dead_unlabelled_raising_and_non_numeric_policies(otel):
    inst, reader = otel

    class Exploding:
        label = "boom"

        @property
        def active_count(self) -> int:
            raise RuntimeError("broken property")

        @property
        def state(self) -> str:
            raise RuntimeError("broken property")

    limiter = FakeLimiter("gone")
    slotted = Slotted()
    others = (FakeHedge(None, 0.5), FakeHedge("fixed", None), Exploding(), FakeLimiter("weird", available=True))
    inst.observe(limiter, slotted, *others)
    values = gauge_values(reader)
    assert values[("stoic.hedge.delay", "fakehedge")] == 0.5  # no label: the type's name
    assert ("stoic.hedge.delay", "fixed") not in values  # None: not adaptive, nothing to report
    assert ("stoic.bulkhead.active", "boom") not in values
    assert ("stoic.ratelimiter.permits.available", "weird") not in values  # a bool is not a number
    assert values[("stoic.bulkhead.active", "slotted")] == 7
    assert ("stoic.ratelimiter.waiters", "gone") in values
    del limiter
    gc.collect()
    assert ("stoic.ratelimiter.waiters", "gone") not in gauge_values(reader)
    del slotted
    gc.collect()
    assert gauge_values(reader)[("stoic.bulkhead.active", "slotted")] == 7  # kept alive on purpose


def test_metrics_want_debug_events_and_uninstrument_removes_everything():
    provider, reader = metric_provider()
    assert not enabled(Level.DEBUG)
    inst = instrument(meter_provider=provider, span_events=False)
    try:
        assert enabled(Level.DEBUG)
        assert inst.installed and inst.metrics is not None
        assert inst.metrics in process_sinks()
        assert inst.metrics.level == Level.DEBUG
        with pytest.raises(RuntimeError, match="already instrumented"):
            instrument(meter_provider=provider)
        bulkhead = FakeBulkhead("bh")
        inst.observe(bulkhead)
        fire("breaker.recorded")
        got = collect(reader)
        assert [p.value for p in points(got["stoic.bulkhead.active"])] == [1]
        assert [p.value for p in points(got["stoic.breaker.calls"])] == [1]
    finally:
        inst.uninstrument()
    assert not inst.installed
    assert not enabled(Level.DEBUG)
    assert inst.metrics not in process_sinks()
    inst.uninstrument()  # idempotent
    fire("breaker.recorded")
    got = collect(reader)
    # observable instruments stop reporting; the synchronous histogram keeps its last value
    assert "stoic.breaker.calls" not in got or not list(points(got["stoic.breaker.calls"]))
    assert "stoic.bulkhead.active" not in got or not list(points(got["stoic.bulkhead.active"]))
    assert [p.count for p in points(got["stoic.breaker.call.duration"])] == [1]  # the second was not recorded
    again = instrument(meter_provider=provider, span_events=False)  # allowed once uninstrumented
    try:
        revived = FakeBulkhead("bh2", active=3)
        again.observe(revived)
        fire("breaker.recorded")
        got = collect(reader)
    finally:
        again.uninstrument()
        provider.shutdown()
    # OTel keeps an instrument name's first registration: the new sink must report through it,
    # and a counter carries on from its total rather than going back to zero.
    assert [p.value for p in points(got["stoic.breaker.calls"])] == [2]
    assert [p.value for p in points(got["stoic.bulkhead.active"])] == [3]
    assert [p.count for p in points(got["stoic.breaker.call.duration"])] == [2]


def test_malformed_events_never_raise_and_never_reach_the_error_log(caplog):
    provider, reader = metric_provider()
    inst = instrument(meter_provider=provider, span_events=False)
    try:
        with caplog.at_level(logging.ERROR, logger="stoic.events"):
            emit("breaker.recorded", "bad", Level.DEBUG, 0, {})
            emit("breaker.recorded", "bad", Level.DEBUG, 0, {"outcome": "success", "duration": "slow"})
            emit("ratelimiter.waited", "bad", Level.DEBUG, 0, {"waited": None})  # type: ignore[dict-item]
            emit("hedge.won", "bad", Level.INFO, 0, {})
            emit("not.in.catalog", "bad", Level.ERROR, 0, {"x": 1})
        assert not caplog.records
        calls = by_attrs(collect(reader)["stoic.breaker.calls"])
        assert calls[key(stoic_label="bad", outcome="unknown")].value == 1
    finally:
        inst.uninstrument()
        provider.shutdown()


def test_prometheus_exporter_names_match_the_table(otel):
    from opentelemetry.exporter.prometheus import PrometheusMetricReader

    registry = CollectorRegistry()
    prom_provider = MeterProvider(metric_readers=[PrometheusMetricReader(registry=registry)])
    inst, _ = otel
    extra = MetricsSink(prom_provider)
    with stoic.use_sinks(extra):
        emit_all("svc")
    policies = (FakeBreaker("svc"), FakeLimiter("svc"), FakeBulkhead("svc"), FakeHedge("svc"))
    extra.observe(*policies)
    text = generate_latest(registry).decode()
    for spec in METRICS:
        assert f"\n{spec.prometheus_name}{{" in text or f"\n{spec.prometheus_name}_bucket{{" in text, spec.name
    assert 'stoic_label="svc"' in text
    assert 'stoic_breaker_state{' in text and 'state="half_open"' in text
    assert "stoic_breaker_call_duration_seconds_bucket{" in text
    extra.close()
    prom_provider.shutdown()
    assert inst.installed


def test_the_table_is_consistent_with_the_brief():
    expected = {
        "stoic.breaker.state": ("gauge", "1", ("state",)),
        "stoic.breaker.calls": ("counter", "{call}", ("outcome",)),
        "stoic.breaker.rejections": ("counter", "{call}", ("state",)),
        "stoic.breaker.transitions": ("counter", "{transition}", ("state",)),
        "stoic.breaker.call.duration": ("histogram", "s", ("outcome",)),
        "stoic.ratelimiter.permits.available": ("gauge", "{permit}", ()),
        "stoic.ratelimiter.waiters": ("gauge", "{request}", ()),
        "stoic.ratelimiter.wait.duration": ("histogram", "s", ()),
        "stoic.ratelimiter.rejections": ("counter", "{request}", ("reason",)),
        "stoic.fleet.store.errors": ("counter", "{call}", ("error.type",)),
        "stoic.fleet.store.recoveries": ("counter", "{recovery}", ()),
        "stoic.fleet.fallbacks": ("counter", "{decision}", ("decision",)),
        "stoic.bulkhead.active": ("gauge", "{call}", ()),
        "stoic.bulkhead.queued": ("gauge", "{call}", ()),
        "stoic.bulkhead.rejections": ("counter", "{call}", ("reason",)),
        "stoic.hedge.attempts": ("counter", "{attempt}", ()),
        "stoic.hedge.wins": ("counter", "{call}", ("attempt",)),
        "stoic.hedge.delay": ("gauge", "s", ()),
        "stoic.retry.retries": ("counter", "{attempt}", ("error.type",)),
        "stoic.retry.outcomes": ("counter", "{call}", ("outcome",)),
    }
    assert {name: (s.kind, s.unit, s.attributes[1:]) for name, s in METRICS_BY_NAME.items()} == expected
    assert SECOND_BUCKETS == (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
    assert METRICS_BY_NAME["stoic.breaker.calls"].prometheus_name == "stoic_breaker_calls_total"
    assert METRICS_BY_NAME["stoic.breaker.call.duration"].prometheus_name == "stoic_breaker_call_duration_seconds"
    assert METRICS_BY_NAME["stoic.breaker.state"].prometheus_name == "stoic_breaker_state"


def test_counts_from_many_threads_are_exact():
    import threading

    provider, reader = metric_provider()
    inst = instrument(meter_provider=provider, span_events=False)
    barrier = threading.Barrier(8)

    def worker(n: int) -> None:
        barrier.wait()
        for i in range(2000):
            fire("breaker.recorded", f"b{n % 2}", outcome="success" if i % 4 else "failure")
            fire("hedge.started", "h")

    try:
        threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        got = collect(reader)
    finally:
        inst.uninstrument()
        provider.shutdown()
    calls = {(p.attributes["stoic.label"], p.attributes["outcome"]): p.value
             for p in points(got["stoic.breaker.calls"])}
    assert calls == {("b0", "success"): 6000, ("b0", "failure"): 2000, ("b1", "success"): 6000, ("b1", "failure"): 2000}
    assert [p.value for p in points(got["stoic.hedge.attempts"])] == [16000]
    assert sum(p.count for p in points(got["stoic.breaker.call.duration"])) == 16000


def test_a_provider_that_cannot_be_a_weak_key_still_gets_its_instruments():
    from opentelemetry.metrics import NoOpMeterProvider

    class Unhashable(NoOpMeterProvider):
        __hash__ = None  # type: ignore[assignment]

    sink = MetricsSink(Unhashable())
    with stoic.use_sinks(sink):
        fire("breaker.recorded")  # a no-op provider: nothing to see, nothing raised
    assert sink.handled_events
