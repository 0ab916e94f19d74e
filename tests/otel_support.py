"""Shared helpers for the OpenTelemetry adapter tests: catalog-valid sample events and readers."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from opentelemetry.sdk._logs import export as _log_export
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, Metric

from stoic.events import CATALOG, AttributeValue, emit

# The SDK renamed it in 1.39; the adapter's floor is 1.38 (`make otel-floor`).
InMemoryLogRecordExporter: Any = (getattr(_log_export, "InMemoryLogRecordExporter", None)
                                  or _log_export.InMemoryLogExporter)  # type: ignore[attr-defined]

# One catalog-valid attribute set per catalog entry (test_catalog checks they stay valid and complete).
SAMPLES: dict[str, dict[str, AttributeValue]] = {
    "breaker.opened": {"trigger": "failure_rate", "calls": 10, "failures": 6, "slow_calls": 0, "trips": 1,
                       "open_for": 30.0},
    "breaker.half_open": {"probes": 1},
    "breaker.closed": {"reason": "probes_succeeded"},
    "breaker.reset": {},
    "breaker.rejected": {"state": "open", "retry_after": 12.5},
    "breaker.recorded": {"outcome": "success", "slow": False, "state": "closed", "duration": 0.05},
    "breaker.ignored": {"reason": "cancelled"},
    "breaker.defect": {"error.type": "Defect"},
    "ratelimiter.rejected": {"reason": "would_exceed_deadline", "permits": 1, "retry_after": 0.5},
    "ratelimiter.oversized": {"permits": 20, "burst": 10},
    "ratelimiter.waited": {"permits": 1, "waited": 0.2},
    "bulkhead.rejected": {"reason": "bulkhead_full", "capacity": 4, "waiting": 0, "sojourn": 0.25,
                          "criticality": "normal"},
    "bulkhead.limit_changed": {"old": 10, "new": 9, "cause": "backoff"},
    "throttle.rejected": {"probability": 0.4, "requests": 50, "accepts": 10},
    "hedge.started": {"attempt": 2, "elapsed": 0.1},
    "hedge.attempt_failed": {"attempt": 1, "running": 1, "error.type": "ConnectionError"},
    "hedge.won": {"attempt": 2, "started": 2, "latency": 0.15},
    "hedge.budget_exhausted": {"attempts": 1},
    "hedge.deadline_skip": {"attempts": 2},
    "hedge.all_failed": {"attempts": 3, "error.type": "ConnectionError"},
    "retry.attempt_failed": {"attempt": 1, "error.type": "ConnectionError", "decision": "retry", "next_delay": 0.1},
    "retry.succeeded": {"attempts": 2},
    "retry.exhausted": {"attempts": 3, "error.type": "ConnectionError"},
    "retry.budget_exhausted": {"attempt": 2, "error.type": "ConnectionError"},
    "retry.deadline_skip": {"attempt": 1, "error.type": "TimeoutError"},
    "retry.defect": {"attempt": 1, "error.type": "Defect"},
    "retry.permanent": {"attempt": 1, "error.type": "ValueError"},
    "retry.nested": {"error.type": "ConnectionError"},
    "retry.after_capped": {"requested": 600.0, "capped": 300.0},
    "timeout.expired": {},
    "fallback.substituted": {"error.type": "CircuitOpen"},
    "keyed.evicted": {"key": "api.example.com", "reason": "idle"},
    "keyed.full": {"keys": 1024},
    "control.forced_open": {"policies": 1, "key": "api.example.com", "actor": "oncall"},
    "control.cleared": {"policies": 1, "key": "api.example.com", "actor": "oncall"},
    "control.retuned": {"policies": 3, "parameters": "failure_rate_threshold", "actor": "oncall"},
    "fleet.store_error": {"operation": "limiter_take", "error.type": "ConnectionError", "unavailable": True},
    "fleet.store_recovered": {"outage": 2.5},
    "fleet.fail_open": {"policy": "ratelimiter", "unavailable": True},
    "fleet.fail_closed": {"policy": "breaker", "unavailable": True},
}


def fire(name: str, label: str = "svc", **overrides: AttributeValue) -> None:
    """Emit the sample event ``name`` (catalog level) with ``overrides`` applied to its attributes."""
    attrs = {**SAMPLES[name], **overrides}
    emit(name, label, CATALOG[name].level, 0, attrs)


def metric_provider() -> tuple[MeterProvider, InMemoryMetricReader]:
    reader = InMemoryMetricReader()
    return MeterProvider(metric_readers=[reader]), reader


def collect(reader: InMemoryMetricReader) -> dict[str, Metric]:
    """Every metric the reader sees, by name."""
    data = reader.get_metrics_data()
    out: dict[str, Metric] = {}
    if data is None:
        return out
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                out[metric.name] = metric
    return out


def points(metric: Metric) -> Iterator[Any]:
    yield from metric.data.data_points


def by_attrs(metric: Metric) -> dict[frozenset[tuple[str, Any]], Any]:
    """Data points keyed by their attribute set."""
    return {frozenset((p.attributes or {}).items()): p for p in points(metric)}


def key(**attrs: Any) -> frozenset[tuple[str, Any]]:
    return frozenset(_dotted(attrs).items())


def _dotted(attrs: Mapping[str, Any]) -> dict[str, Any]:
    # keyword arguments cannot contain dots: stoic_label -> stoic.label, error_type -> error.type
    return {k.replace("stoic_label", "stoic.label").replace("error_type", "error.type"): v for k, v in attrs.items()}


def delta_exporter() -> tuple[Any, list[Any]]:
    """A metric exporter that asks for delta temporality everywhere, and the list of what it exported."""
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
