"""Metrics: stoic's in-process recorders, read by OpenTelemetry at collection time.

Policies count every call into their recorder (``stoic._metrics``); nothing is built per call
for OpenTelemetry. At collection, :class:`Metrics` reads every live recorder and policy once
(:class:`stoic._metrics.Collector`, which caps the labels per metric) and reports:

- counters through observable counters and gauges through observable gauges (SDK callbacks);
  a policy that has been garbage-collected is simply not observed again, and the SDK drops its
  series;
- histograms exactly (bucket counts, sum, count), which OpenTelemetry's API cannot take from a
  callback, by one of two routes: ``prometheus_registry=`` registers them as a collector in the
  ``prometheus_client`` registry the OpenTelemetry Prometheus exporter serves (same names,
  buckets and labels as the exporter would give them), and :class:`HistogramBridge` wraps any
  push exporter (OTLP) to append them to every export as cumulative histogram points.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from opentelemetry.metrics import CallbackOptions, Meter, MeterProvider, Observation, get_meter_provider

from stoic import _metrics
from stoic._metrics import DEFAULT_MAX_LABELS, METRICS, Histogram, MetricSpec, Sample

from ._table import SCHEMA_URL
from ._table import value as otel_value
from ._version import __version__

_log = logging.getLogger("stoic")

SDK_SERIES = 2000
"""The OpenTelemetry SDK's default cardinality limit: the distinct attribute sets one instrument
keeps per reader. Beyond it the SDK folds every further series into one ``otel.metric.overflow``
series without ``stoic.label`` (nor ``state``...). A label has several series (three for
``stoic.breaker.state``, one per reason for the rejections), so 1,000 labels can pass it: the
observable instruments report at most this many, whole labels beyond it summed under ``_overflow``."""


def _attributes(spec: MetricSpec, values: tuple[str, ...]) -> dict[str, Any]:
    # An empty value (error.type of a success) is left out, as OpenTelemetry's conventions want.
    return {key: value for key, value in zip(spec.attributes, values, strict=False) if value != ""}


class _Instruments:
    """The observable instruments of one meter provider, created once (OpenTelemetry keeps the first
    registration of a name and ignores a later one's callbacks); they report for the attached
    :class:`Metrics`, and nothing while none is."""

    def __init__(self, meter: Meter) -> None:
        self.source: Metrics | None = None
        # The SDK calls the callbacks in registration order: the first one reads the recorders
        # afresh and the others report from that reading (one consistent snapshot per collection).
        self._first = next(spec.name for spec in METRICS if spec.kind != "histogram")
        for spec in METRICS:
            if spec.kind == "counter":
                meter.create_observable_counter(spec.name, [self._callback(spec)], spec.unit, spec.description)
            elif spec.kind == "gauge":
                meter.create_observable_gauge(spec.name, [self._callback(spec)], spec.unit, spec.description)

    def _callback(self, spec: MetricSpec) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            source = self.source
            if source is None:
                return []
            samples = source.samples(spec.name, refresh=spec.name == self._first)
            return [Observation(otel_value(number), _attributes(spec, attrs)) for attrs, number in samples]

        return callback


_registry_lock = threading.Lock()
_by_provider: weakref.WeakKeyDictionary[MeterProvider, _Instruments] = weakref.WeakKeyDictionary()


def _meter(provider: MeterProvider) -> Meter:
    return provider.get_meter("stoic_opentelemetry", __version__, schema_url=SCHEMA_URL)


def _instruments_for(provider: MeterProvider) -> _Instruments:
    with _registry_lock:
        try:
            instruments = _by_provider.get(provider)
        except TypeError:  # a provider without weakref support: cannot be shared, make its own
            return _Instruments(_meter(provider))
        if instruments is None:
            instruments = _by_provider[provider] = _Instruments(_meter(provider))
        return instruments


class Metrics:
    """stoic's metrics (:data:`stoic_opentelemetry.METRICS`) on an OpenTelemetry meter provider.

    Creating it turns the recorders on (``stoic._metrics.enable()``). ``meter_provider``
    defaults to the global one. ``max_labels`` caps the distinct ``stoic.label`` values per
    metric (default 1,000; beyond it values are summed under ``_overflow``, with one warning).
    ``prometheus_registry``: a ``prometheus_client`` registry (the one the OpenTelemetry
    Prometheus exporter serves, ``prometheus_client.REGISTRY`` unless you gave it another) to
    serve the duration histograms from; requires stoic-prometheus. For push exporters wrap the
    exporter in :class:`HistogramBridge` instead.

    A failure while reading the recorders is logged once and that collection reports nothing
    from stoic; it never breaks the SDK's collection.
    """

    def __init__(self, meter_provider: MeterProvider | None = None, *, max_labels: int = DEFAULT_MAX_LABELS,
                 prometheus_registry: Any = None) -> None:
        self._collector = _metrics.Collector(max_labels)
        self._lock = threading.Lock()
        self._read: dict[str, list[Sample]] | None = None
        self._failed = False
        self._closed = False
        self._fitted: dict[str, set[str]] = {}  # per metric, the labels reported by the last reading
        self._warned: set[str] = set()
        self._prometheus: tuple[Any, Any] | None = None
        provider = meter_provider if meter_provider is not None else get_meter_provider()
        if prometheus_registry is not None:
            from stoic_prometheus import StoicCollector  # the optional route: imported only when asked for

            histograms = StoicCollector(max_labels=max_labels, kinds={"histogram"})
            prometheus_registry.register(histograms)
            self._prometheus = (prometheus_registry, histograms)
        self._instruments = _instruments_for(provider)
        self._instruments.source = self  # the newest Metrics on a provider feeds its instruments
        _metrics.enable()

    def samples(self, name: str, *, refresh: bool = True) -> list[Sample]:
        """The samples of metric ``name``: read afresh, or with ``refresh=False`` from the last reading."""
        if self._closed:
            return []
        with self._lock:
            if refresh or self._read is None:
                try:
                    self._read = {spec.name: samples if spec.kind == "histogram" else self._fit(spec, samples)
                                  for spec, samples in self._collector.collect()}
                except Exception:
                    if not self._failed:
                        self._failed = True
                        _log.error("stoic_opentelemetry: reading stoic's metrics failed (reported once)",
                                   exc_info=True)
                    self._read = {}
            return self._read.get(name, [])

    def _fit(self, spec: MetricSpec, samples: list[Sample]) -> list[Sample]:
        """``samples`` within :data:`SDK_SERIES`: labels reported by the last reading first, then the
        others in sorted order, each with all its series, while they fit beside the ``_overflow``
        series the rest are summed into (one warning per metric)."""
        if len(samples) <= SDK_SERIES:
            self._fitted[spec.name] = {attrs[0] for attrs, _ in samples}
            return samples
        by_label: dict[str, int] = {}
        for attrs, _ in samples:
            by_label[attrs[0]] = by_label.get(attrs[0], 0) + 1
        room = SDK_SERIES - len({attrs[1:] for attrs, _ in samples})  # at most one overflow series per rest
        previous = self._fitted.get(spec.name, set())
        kept: set[str] = set()
        for label in sorted(by_label, key=lambda label: (label not in previous, label)):
            if label == _metrics.OVERFLOW:
                continue
            if by_label[label] > room:
                break
            kept.add(label)
            room -= by_label[label]
        self._fitted[spec.name] = kept
        out: dict[tuple[str, ...], Any] = {}
        for attrs, number in samples:
            if attrs[0] not in kept:
                attrs = (_metrics.OVERFLOW, *attrs[1:])
            out[attrs] = out.get(attrs, 0) + number
        if spec.name not in self._warned:
            self._warned.add(spec.name)
            _log.warning("stoic_opentelemetry: %s has more than %d series (the SDK's default cardinality limit); "
                         "the labels beyond are reported as %s=%r (warned once per metric)",
                         spec.name, SDK_SERIES, _metrics.LABEL, _metrics.OVERFLOW)
        return list(out.items())

    def histogram_metrics(self) -> list[Any]:
        """The duration histograms as OpenTelemetry SDK ``Metric`` objects (cumulative, exact
        buckets, sum and count; min and max are not tracked and are NaN). Used by :class:`HistogramBridge`."""
        from opentelemetry.sdk.metrics.export import AggregationTemporality, HistogramDataPoint, Metric
        from opentelemetry.sdk.metrics.export import Histogram as HistogramData

        out = []
        now = time.time_ns()
        self.samples("", refresh=True)
        for spec in METRICS:
            if spec.kind != "histogram":
                continue
            points = []
            for attrs, value in self.samples(spec.name, refresh=False):
                assert isinstance(value, Histogram)
                points.append(HistogramDataPoint(
                    attributes=_attributes(spec, attrs), start_time_unix_nano=_STARTED, time_unix_nano=now,
                    count=sum(value.counts), sum=value.sum_ns / 1e9, bucket_counts=list(value.counts),
                    explicit_bounds=list(_metrics.DURATION_BUCKETS), min=math.nan, max=math.nan))
            if points:
                out.append(Metric(spec.name, spec.description, spec.unit,
                                  HistogramData(points, AggregationTemporality.CUMULATIVE)))
        return out

    def close(self) -> None:
        """Stop reporting: counters and gauges report nothing, the histogram collector is unregistered."""
        self._closed = True
        if self._instruments.source is self:
            self._instruments.source = None
        if self._prometheus is not None:
            registry, collector = self._prometheus
            self._prometheus = None
            registry.unregister(collector)

    def __repr__(self) -> str:
        return f"Metrics(max_labels={self._collector.max_labels}, closed={self._closed})"


_STARTED = time.time_ns()


class HistogramBridge:
    """Wraps a push ``MetricExporter`` (OTLP...) so every export also carries stoic's duration
    histograms, exactly: ``PeriodicExportingMetricReader(HistogramBridge(OTLPMetricExporter()))``.

    ``metrics`` is the :class:`Metrics` to read; by default, at each export, the one of the
    active instrumentation (:func:`stoic_opentelemetry.instrument`), nothing while there is none.
    The histograms are appended to the first resource as a scope ``stoic_opentelemetry``; a
    failure to build them is logged once and the export goes on without them. They follow the
    exporter's preferred temporality for histograms: cumulative by default, delta when the
    exporter asks for it (each point then counts the calls since the previous export; a series
    whose figures went down, its policy collected and made again, starts over in full; an export
    while no instrumentation is active carries none and forgets nothing, so the calls made
    meanwhile are in the next one, once).
    """

    def __init__(self, exporter: Any, metrics: Metrics | None = None) -> None:
        self._exporter = exporter
        self._metrics = metrics
        self._failed = False
        # What a MetricReader reads off its exporter.
        self._preferred_temporality = getattr(exporter, "_preferred_temporality", None)
        self._preferred_aggregation = getattr(exporter, "_preferred_aggregation", None)
        self._delta = _prefers_delta(self._preferred_temporality)
        # For delta: each series' cumulative figures at the previous export (only the series
        # reported then: nothing grows with series no longer seen), and when that was.
        self._lock = threading.Lock()
        self._last: dict[tuple[str, frozenset[tuple[str, Any]]], tuple[list[int], float]] = {}
        self._last_ns = _STARTED

    def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> Any:
        try:
            metrics = self._metrics
            if metrics is None:
                from . import active

                instrumentation = active()
                metrics = instrumentation.metrics if instrumentation is not None else None
            extra = metrics.histogram_metrics() if metrics is not None else []
            if self._delta and metrics is not None:
                # (not without one: forgetting what was sent would send it all again, as new,
                # once an instrumentation is active again; the recorders kept counting)
                extra = self._deltas(extra)
            if extra:
                metrics_data = _with_scope(metrics_data, extra)
        except Exception:
            if not self._failed:
                self._failed = True
                _log.error("stoic_opentelemetry: adding stoic's histograms to an export failed (reported once)",
                           exc_info=True)
        return self._exporter.export(metrics_data, timeout_millis=timeout_millis, **kwargs)

    def _deltas(self, cumulative: Sequence[Any]) -> list[Any]:
        """``cumulative`` histogram metrics as delta ones: each point minus the same series' point
        of the previous export (in full for a series new, or whose figures went down)."""
        from opentelemetry.sdk.metrics.export import AggregationTemporality, HistogramDataPoint, Metric
        from opentelemetry.sdk.metrics.export import Histogram as HistogramData

        with self._lock:
            start, now, seen, out = self._last_ns, self._last_ns, {}, []
            for metric in cumulative:
                points = []
                for point in metric.data.data_points:
                    key = (metric.name, frozenset(point.attributes.items()))
                    counts, total = list(point.bucket_counts), point.sum
                    seen[key] = (counts, total)
                    previous = self._last.get(key)
                    if previous is not None and all(n >= p for n, p in zip(counts, previous[0], strict=True)):
                        counts = [n - p for n, p in zip(counts, previous[0], strict=True)]
                        total -= previous[1]
                    now = max(now, point.time_unix_nano)
                    points.append(HistogramDataPoint(
                        attributes=point.attributes, start_time_unix_nano=start, time_unix_nano=point.time_unix_nano,
                        count=sum(counts), sum=total, bucket_counts=counts, explicit_bounds=point.explicit_bounds,
                        min=math.nan, max=math.nan))
                out.append(Metric(metric.name, metric.description, metric.unit,
                                  HistogramData(points, AggregationTemporality.DELTA)))
            self._last, self._last_ns = seen, now
        return out

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return bool(self._exporter.force_flush(timeout_millis=timeout_millis))

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._exporter.shutdown(timeout_millis=timeout_millis, **kwargs)


def _prefers_delta(preferred: Any) -> bool:
    """Whether an exporter's preferred temporality (a mapping of SDK instrument classes) asks for
    delta histograms."""
    if not preferred:
        return False
    from opentelemetry.sdk.metrics import Histogram as HistogramInstrument
    from opentelemetry.sdk.metrics.export import AggregationTemporality

    return bool(preferred.get(HistogramInstrument) == AggregationTemporality.DELTA)


def _with_scope(metrics_data: Any, extra: Sequence[Any]) -> Any:
    from opentelemetry.sdk.metrics.export import MetricsData, ResourceMetrics, ScopeMetrics
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    scope = ScopeMetrics(InstrumentationScope("stoic_opentelemetry", __version__, SCHEMA_URL), list(extra),
                         SCHEMA_URL)
    resources = list(metrics_data.resource_metrics) if metrics_data is not None else []
    if not resources:
        return MetricsData([ResourceMetrics(Resource.get_empty(), [scope], "")])
    first = resources[0]
    resources[0] = ResourceMetrics(first.resource, [*first.scope_metrics, scope], first.schema_url)
    return MetricsData(resources)
