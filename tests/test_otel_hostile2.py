"""Hostile review of the OpenTelemetry adapter, second pass: delta histograms across instrumentations."""

from __future__ import annotations

from typing import Any

from stoic_opentelemetry import HistogramBridge, instrument
from stoic_opentelemetry._instrumentor import StoicInstrumentor

import stoic


def _delta_exporter() -> tuple[Any, list[Any]]:
    from opentelemetry.sdk.metrics import Counter, Histogram, ObservableCounter
    from opentelemetry.sdk.metrics.export import AggregationTemporality, MetricExporter, MetricExportResult

    exported: list[Any] = []
    delta = AggregationTemporality.DELTA

    class DeltaExporter(MetricExporter):
        def __init__(self) -> None:
            super().__init__(preferred_temporality={Counter: delta, ObservableCounter: delta, Histogram: delta})

        def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
            exported.append(metrics_data)
            return MetricExportResult.SUCCESS

        def force_flush(self, timeout_millis: float = 10_000) -> bool:
            return True

        def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
            pass

    return DeltaExporter(), exported


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

    exporter, exported = _delta_exporter()
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

    exporter, exported = _delta_exporter()
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
