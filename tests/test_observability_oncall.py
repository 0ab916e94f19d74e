"""The observability paths as an on-call engineer meets them: a sink that can never receive an
event must be refused when installed, not accepted and starved."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

import stoic
from stoic.events import Event, _sinks
from stoic.testing import VirtualClock


class _AsyncSink:
    level = stoic.Level.INFO

    def __init__(self) -> None:
        self.got: list[str] = []

    async def emit(self, event: Event) -> None:  # an exporter's async client, a common slip
        self.got.append(event.name)


class _GeneratorSink:
    def emit(self, event: Event) -> Iterator[None]:
        yield None


class _AsyncGeneratorSink:
    async def emit(self, event: Event) -> AsyncIterator[None]:
        yield None


@pytest.mark.parametrize("make", [_AsyncSink, _GeneratorSink, _AsyncGeneratorSink])
def test_a_sink_whose_emit_only_makes_a_coroutine_or_generator_is_refused_at_install(make: type) -> None:
    # Calling such an emit runs none of its body: every event would be dropped in silence (a
    # "coroutine was never awaited" warning at best, once), while the sink looks installed.
    with pytest.raises(TypeError, match="synchronous"):
        stoic.add_sink(make())
    with pytest.raises(TypeError, match="synchronous"), stoic.use_sinks(make()):
        pass
    assert _sinks._process.entries == ()


def test_a_plain_emit_of_any_callable_kind_is_still_accepted() -> None:
    class Bound:
        def emit(self, event: Event) -> None:
            pass

    class Static:
        @staticmethod
        def emit(event: Event) -> None:
            pass

    class Callable_:
        def __init__(self) -> None:
            self.emit = lambda event: None

    class Builtin:
        def __init__(self) -> None:
            self.emit = [].append  # no __code__: accepted as before

    for sink in (Bound(), Static(), Callable_(), Builtin()):
        stoic.add_sink(sink)
        stoic.remove_sink(sink)


# ------------------------------------------------------------------ zero-code OpenTelemetry

def _exporter(exported: list[object]) -> object:
    from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult

    class Exporter(MetricExporter):
        def export(self, metrics_data: object, timeout_millis: float = 10_000, **kwargs: object) -> MetricExportResult:
            exported.append(metrics_data)
            return MetricExportResult.SUCCESS

        def force_flush(self, timeout_millis: float = 10_000) -> bool:
            return True

        def shutdown(self, timeout_millis: float = 30_000, **kwargs: object) -> None:
            pass

    return Exporter()


def test_opentelemetry_instrument_serves_the_duration_histograms_through_the_readers_it_finds() -> None:
    # `opentelemetry-instrument` calls StoicInstrumentor().instrument() with no argument: nobody
    # can pass prometheus_registry= or wrap the exporter in HistogramBridge, so the duration
    # histograms (the dashboards' p50/p99 and failures-by-error-type panels) were exported by
    # no route at all. The instrumentor now finds the provider's Prometheus reader (and serves
    # them from its registry) and its push readers (whose exporter it bridges), and undoes it.
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from prometheus_client import CollectorRegistry, generate_latest
    from stoic_opentelemetry import HistogramBridge
    from stoic_opentelemetry._instrumentor import StoicInstrumentor

    registry = CollectorRegistry()
    exported: list[object] = []
    exporter = _exporter(exported)
    push = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)  # type: ignore[arg-type]
    provider = MeterProvider(metric_readers=[PrometheusMetricReader(registry=registry), push])
    instrumentor = StoicInstrumentor()
    instrumentor.instrument(meter_provider=provider, span_events=False)
    try:
        breaker = stoic.CircuitBreaker(label="oncall-zero-code", clock=VirtualClock())
        breaker.call(lambda: None)
        scraped = generate_latest(registry).decode()
        assert 'stoic_breaker_call_duration_seconds_bucket{error_type="",le="0.005",outcome="success",' \
               'stoic_label="oncall-zero-code"} 1.0' in scraped
        assert 'stoic_breaker_calls_total{' in scraped  # the SDK's own route, as before
        provider.force_flush()
        names = {m.name for data in exported for rm in data.resource_metrics  # type: ignore[attr-defined]
                 for sm in rm.scope_metrics for m in sm.metrics}
        assert {"stoic.breaker.call.duration", "stoic.breaker.calls"} <= names
    finally:
        instrumentor.uninstrument()
    assert "stoic_breaker_call_duration_seconds" not in generate_latest(registry).decode()  # unregistered
    assert push._exporter is exporter and not isinstance(push._exporter, HistogramBridge)  # unwrapped
    provider.shutdown()


# ------------------------------------------------------------------ dashboards

def _limiters() -> list[object]:
    from stoic.fleet import BlockingSharedRateLimiter, RedisStore, SharedRateLimiter

    url = "redis://127.0.0.1:1/0"  # never connected to: building a limiter asks the store nothing
    return [stoic.RateLimiter(5, label="oncall-local"),
            stoic.BlockingRateLimiter(5, label="oncall-blocking"),
            SharedRateLimiter(5, store=RedisStore(url), label="oncall-shared"),
            BlockingSharedRateLimiter(5, store=RedisStore(url), label="oncall-blocking-shared")]


def _bulkheads() -> list[object]:
    return [stoic.Bulkhead(2, label="oncall-bulkhead"), stoic.BlockingBulkhead(2, label="oncall-blocking"),
            stoic.AdaptiveBulkhead(max_concurrent=4, latency_threshold=0.5, label="oncall-aimd"),
            stoic.GradientBulkhead(max_concurrent=4, label="oncall-gradient")]


@pytest.mark.parametrize(("dashboard", "make"), [("stoic-ratelimiters.json", _limiters),
                                                 ("stoic-bulkheads.json", _bulkheads)])
def test_every_policy_of_a_dashboards_kind_can_be_picked_in_its_policy_variable(dashboard: str, make: object) -> None:
    # The variable lists the labels of one series; a policy without that series cannot be picked,
    # so its panels can only be read mixed with every other policy's ("All"). A shared rate
    # limiter (stoic.fleet) has no permits_available gauge (its credit is in the store), which
    # the rate-limiter dashboard's variable read: no shared limiter could ever be selected.
    import re

    from prometheus_client import CollectorRegistry, generate_latest
    from stoic_prometheus import StoicCollector

    from dashboards.queries import load
    from stoic import _metrics

    (variable,) = [v for v in load(dashboard)["templating"]["list"]
                   if v.get("type") == "query" and v["name"] not in ("job", "instance")]
    metric = re.match(r"label_values\((\w+)\{", variable["query"])
    assert metric is not None, variable["query"]
    policies = make()  # type: ignore[operator]
    registry = CollectorRegistry()
    registry.register(StoicCollector())
    before = _metrics.state.enabled
    _metrics.enable()
    try:
        scraped = generate_latest(registry).decode()
    finally:
        _metrics.state.enabled = before
    listed = set(re.findall(rf'^{metric.group(1)}\{{.*?stoic_label="([^"]*)"', scraped, re.MULTILINE))
    missing = [p.label for p in policies if p.label not in listed]  # type: ignore[attr-defined]
    assert missing == [], f"{dashboard} ${variable['name']} ({metric.group(1)}) cannot list {missing}"


# ------------------------------------------------------------------ labels no exposition can encode

_LONE = "caf\udce9"  # what json.loads('"caf\\udce9"') gives: a str, but not encodable as UTF-8


def test_a_label_no_exposition_can_encode_never_breaks_the_scrape_of_the_whole_registry() -> None:
    # A lone surrogate is a valid Python str (JSON's "\udce9" escape, os.fsdecode, surrogateescape)
    # that neither the Prometheus text format nor OTLP can encode: one such label made every
    # scrape of the registry fail with UnicodeEncodeError, the application's own metrics too.
    from prometheus_client import CollectorRegistry, Counter, generate_latest
    from prometheus_client.openmetrics.exposition import generate_latest as openmetrics
    from stoic_prometheus import StoicCollector

    from stoic import _metrics

    registry = CollectorRegistry()
    Counter("oncall_app_requests", "the application's own", registry=registry).inc()
    registry.register(StoicCollector())
    before = _metrics.state.enabled
    _metrics.enable()
    try:
        breaker = stoic.CircuitBreaker(label=_LONE, clock=VirtualClock())
        breaker.call(lambda: None)
        scraped = generate_latest(registry).decode()
        openmetrics(registry)
    finally:
        _metrics.state.enabled = before
    assert "oncall_app_requests_total 1.0" in scraped
    assert 'stoic_breaker_calls_total{outcome="success",stoic_label="caf\ufffd"} 1.0' in scraped


def test_a_keyed_familys_key_no_exposition_can_encode_reaches_every_sink_encodable() -> None:
    # Keys are data (a tenant id from a request body): its policy's label and the keyed events'
    # key went out as given, so a strict UTF-8 log handler lost the record ("--- Logging error
    # ---") and an OTLP export would fail its whole batch over one string.
    import io
    import json
    import logging

    from stoic.testing import RecordingSink

    key = json.loads('"caf\\udce9"')  # the JSON escape of a lone surrogate
    assert key == _LONE
    stream = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict", write_through=True)
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("stoic.oncall-encodable")
    logger.addHandler(handler)
    logger.propagate = False
    failures: list[object] = []
    handler.handleError = failures.append  # type: ignore[method-assign]  # (what logging prints)
    recorded = RecordingSink()
    family = stoic.Keyed(stoic.CircuitBreaker, label="tenants", max_keys=1, clock=VirtualClock())
    try:
        with stoic.use_sinks(recorded, stoic.LoggingSink(logger)):
            family.call(key, lambda: None)
            family.get(key).force_open()
            family.get(key).force_closed()
            family.call("other", lambda: None)  # room needed: the first key is dropped
    finally:
        logger.removeHandler(handler)
    assert {"breaker.opened", "breaker.closed", "keyed.evicted"} <= set(recorded.names)
    for event in recorded.events:
        event.label.encode("utf-8")
        for value in event.attributes.values():
            if isinstance(value, str):
                value.encode("utf-8")
    assert failures == []
    assert family.get("other").label == "tenants:other"
    assert recorded.of("keyed.evicted")[0].attributes["key"] == "caf\ufffd"


def test_an_operators_key_and_actor_reach_the_control_events_encodable() -> None:
    # The admin endpoint takes both from a request (a JSON body, a header): the same hazard.
    from stoic.testing import RecordingSink

    plane = stoic.ControlPlane()
    family = plane.register(stoic.Keyed(stoic.CircuitBreaker, label="plane-tenants", clock=VirtualClock()))
    family.call(_LONE, lambda: None)
    recorded = RecordingSink()
    with stoic.use_sinks(recorded):
        plane.force_open("plane-tenants", _LONE, actor=_LONE)
        plane.clear_forced_open("plane-tenants", _LONE, actor=_LONE)
    assert [e.name for e in recorded.events if e.name.startswith("control.")] == ["control.forced_open",
                                                                                 "control.cleared"]
    for event in recorded.events:
        assert event.label.encode("utf-8")
        for value in event.attributes.values():
            if isinstance(value, str):
                value.encode("utf-8")


def test_opentelemetry_instrument_beside_a_registry_that_serves_stoic_already_still_instruments() -> None:
    # stoic_prometheus.instrument(REGISTRY) and the OpenTelemetry Prometheus reader on the same
    # registry: the histograms are served already, and finding that registry must not make the
    # zero-code instrumentation fail (DuplicatedTimeseries) and install nothing.
    import stoic_prometheus
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import MeterProvider
    from prometheus_client import CollectorRegistry
    from stoic_opentelemetry import active
    from stoic_opentelemetry._instrumentor import StoicInstrumentor

    registry = CollectorRegistry()
    collector = stoic_prometheus.instrument(registry)
    provider = MeterProvider(metric_readers=[PrometheusMetricReader(registry=registry)])
    instrumentor = StoicInstrumentor()
    try:
        instrumentor.instrument(meter_provider=provider)
        installed = active()
        assert installed is not None and installed.spans is not None and installed.metrics is not None
    finally:
        instrumentor.uninstrument()
        stoic_prometheus.uninstrument(collector, registry)
        provider.shutdown()
