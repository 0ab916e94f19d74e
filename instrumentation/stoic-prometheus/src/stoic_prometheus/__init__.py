"""stoic metrics in a ``prometheus_client`` registry.

``stoic_prometheus.instrument(registry)`` registers a :class:`StoicCollector` in ``registry``
(default: ``prometheus_client.REGISTRY``, the one ``start_http_server`` and most frameworks
serve). Every metric of ``stoic._metrics.METRICS`` appears under the same name, labels and
buckets as through stoic-opentelemetry's Prometheus exporter (``stoic_breaker_calls_total``,
``stoic_breaker_call_duration_seconds_bucket``...). Policies count into their in-process
recorders; the collector reads them when Prometheus scrapes, so the cost per call is the
recorders' and nothing more, and the series of a garbage-collected policy are gone at the next
scrape.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from stoic import _metrics
from stoic._metrics import DEFAULT_MAX_LABELS, DURATION_BUCKETS, METRICS, Histogram, MetricSpec

__all__ = ["StoicCollector", "__version__", "instrument", "uninstrument"]

__version__ = "0.1.0"

_log = logging.getLogger("stoic")
_LE = tuple(str(float(b)) for b in DURATION_BUCKETS)  # "0.005", ..., "1.0", "60.0" (as OTel's exporter writes them)
_KINDS = frozenset({"counter", "gauge", "histogram"})


def _family(spec: MetricSpec) -> CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily:
    labels = list(spec.prometheus_labels)
    if spec.kind == "counter":
        return CounterMetricFamily(spec.prometheus_name.removesuffix("_total"), spec.description, labels=labels)
    if spec.kind == "gauge":
        return GaugeMetricFamily(spec.prometheus_name, spec.description, labels=labels)
    return HistogramMetricFamily(spec.prometheus_name, spec.description, labels=labels)


class StoicCollector(Collector):
    """A ``prometheus_client`` collector of stoic's metrics, read at each scrape.

    ``kinds`` narrows the metric kinds it reports (``{"histogram"}`` is how stoic-opentelemetry
    serves exact histograms beside its observable counters and gauges). ``max_labels`` caps the
    distinct ``stoic_label`` values per metric (default 1,000; the rest are summed under
    ``stoic_label="_overflow"``, with one warning naming the first label that overflowed).
    A failure while collecting is logged once and that scrape reports no stoic metric; it never
    breaks the scrape of the registry's other collectors.
    """

    def __init__(self, *, max_labels: int = DEFAULT_MAX_LABELS, kinds: Iterable[str] = _KINDS) -> None:
        self.kinds = frozenset(kinds)
        if not self.kinds <= _KINDS:
            raise ValueError(f"kinds must be among {sorted(_KINDS)}, got {sorted(self.kinds)}")
        self._collector = _metrics.Collector(max_labels)
        self._failed = False
        self._lock = threading.Lock()

    def describe(self) -> Iterator[Metric]:
        """The families without samples (lets the registry refuse a duplicate name at registration)."""
        for spec in METRICS:
            if spec.kind in self.kinds:
                yield _family(spec)

    def collect(self) -> Iterator[Metric]:
        try:
            with self._lock:
                collected = self._collector.collect()
        except Exception:  # a scrape must never fail because of stoic
            if not self._failed:
                self._failed = True
                _log.error("stoic_prometheus: collecting stoic metrics failed (reported once)", exc_info=True)
            return
        for spec, samples in collected:
            if spec.kind not in self.kinds:
                continue
            family = _family(spec)
            for attrs, value in samples:
                labels = [str(v) for v in attrs]
                if isinstance(value, Histogram):
                    # +Inf (and so _count) from the same bucket counts: consistent even if the
                    # policy observed a call while this copy was taken.
                    cumulative = value.cumulative
                    buckets = [(le, float(n)) for le, n in zip(_LE, cumulative, strict=False)]
                    buckets.append(("+Inf", float(cumulative[-1])))
                    assert isinstance(family, HistogramMetricFamily)
                    family.add_metric(labels, buckets, value.sum_ns / 1e9)
                else:
                    assert not isinstance(family, HistogramMetricFamily)
                    family.add_metric(labels, value)
            yield family


def instrument(registry: CollectorRegistry = REGISTRY, *, max_labels: int = DEFAULT_MAX_LABELS) -> StoicCollector:
    """Register stoic's metrics in ``registry`` (default the global one) and start counting.

    Returns the collector (pass it to :func:`uninstrument`). Raises ``ValueError`` (from
    ``prometheus_client``) if ``registry`` already holds a metric of the same name, for instance
    a second stoic collector.
    """
    collector = StoicCollector(max_labels=max_labels)
    registry.register(collector)
    _metrics.enable()
    return collector


def uninstrument(collector: StoicCollector, registry: CollectorRegistry = REGISTRY) -> None:
    """Remove ``collector`` from ``registry``; its metrics stop appearing at the next scrape."""
    registry.unregister(collector)
