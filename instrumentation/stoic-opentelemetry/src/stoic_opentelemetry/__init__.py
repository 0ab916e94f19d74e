"""stoic into OpenTelemetry: span events, log-based events and metrics.

``instrument()`` installs process-wide sinks (:func:`stoic.add_sink`) that turn stoic's
decisions (events) into span events on the caller's current span and, optionally, OTel log
records with an event name; and it exports the metrics of :data:`METRICS`, read at collection
time from the policies' in-process recorders (:class:`Metrics`). ``opentelemetry-instrument``
does the same through the ``opentelemetry_instrumentor`` entry point (:class:`StoicInstrumentor`).
The core ``stoic`` package never imports OpenTelemetry; this distribution is the only place it is used.
"""

from __future__ import annotations

import threading
from typing import Any

from opentelemetry._logs import LoggerProvider
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import TracerProvider

import stoic
from stoic._metrics import DEFAULT_MAX_LABELS
from stoic.events import Level, Sink

from ._logs import LogEventSink
from ._metrics import HistogramBridge, Metrics
from ._spans import SpanEventSink
from ._table import LABEL, METRICS, SCHEMA_URL, SECOND_BUCKETS, MetricSpec
from ._version import __version__

__all__ = [
    "LABEL",
    "METRICS",
    "SCHEMA_URL",
    "SECOND_BUCKETS",
    "HistogramBridge",
    "Instrumentation",
    "LogEventSink",
    "MetricSpec",
    "Metrics",
    "SpanEventSink",
    "__version__",
    "instrument",
]

_active_lock = threading.Lock()
_active: Instrumentation | None = None


class Instrumentation:
    """What :func:`instrument` installed, until :meth:`uninstrument`.

    ``spans`` and ``logs`` are the installed sinks and ``metrics`` the :class:`Metrics` (each
    ``None`` when turned off).
    """

    def __init__(self, spans: SpanEventSink | None, logs: LogEventSink | None, metrics: Metrics | None) -> None:
        self.spans = spans
        self.logs = logs
        self.metrics = metrics
        self._installed = False

    @property
    def sinks(self) -> tuple[Sink, ...]:
        """The installed sinks, in installation order."""
        return tuple(s for s in (self.spans, self.logs) if s is not None)

    @property
    def installed(self) -> bool:
        """Whether the sinks are installed (``False`` after :meth:`uninstrument`)."""
        return self._installed

    def _install(self) -> None:
        for sink in self.sinks:
            stoic.add_sink(sink)
        self._installed = True

    def uninstrument(self) -> None:
        """Remove the sinks and stop reporting metrics. Idempotent. (The policies' recorders keep
        counting: another exporter may read them.)"""
        global _active
        for sink in self.sinks:
            stoic.remove_sink(sink)
        if self.metrics is not None:
            self.metrics.close()
        self._installed = False
        with _active_lock:
            if _active is self:
                _active = None

    def __repr__(self) -> str:
        return f"Instrumentation(sinks={list(self.sinks)!r}, metrics={self.metrics!r}, installed={self._installed})"


def instrument(
    tracer_provider: TracerProvider | None = None,
    meter_provider: MeterProvider | None = None,
    logger_provider: LoggerProvider | None = None,
    *,
    span_events: bool = True,
    log_events: bool = False,
    metrics: bool = True,
    level: Level = Level.INFO,
    prometheus_registry: Any = None,
    max_labels: int = DEFAULT_MAX_LABELS,
) -> Instrumentation:
    """Send stoic to OpenTelemetry, process-wide.

    - ``span_events``: each event at ``level`` or above (default INFO) becomes an event on the
      caller's current recording span (``SpanEventSink``). Span events attach to whatever span is
      current, so ``tracer_provider`` is accepted for symmetry with other instrumentors and
      otherwise unused.
    - ``log_events``: each event at ``level`` or above becomes an OTel log record with
      ``event_name`` (``LogEventSink``), on ``logger_provider`` (default: the global one).
    - ``metrics``: the metrics of :data:`METRICS` on ``meter_provider`` (default: the global one),
      read from the policies' recorders at collection time (no per-call cost beyond theirs).
      Counters and gauges are observable instruments; the duration histograms are served from
      ``prometheus_registry`` (a ``prometheus_client`` registry, the one the OpenTelemetry
      Prometheus exporter serves) when given, or through :class:`HistogramBridge` around a push
      exporter. ``max_labels`` caps the labels per metric (default 1,000).

    Returns the :class:`Instrumentation`; ``.uninstrument()`` removes everything. Raises
    ``RuntimeError`` if an instrumentation is already installed (uninstrument it first: two
    would report every event twice).
    """
    del tracer_provider  # span events go to the current span, whichever provider made it
    global _active
    with _active_lock:
        if _active is not None:
            raise RuntimeError("stoic is already instrumented; call uninstrument() on the active Instrumentation first")
        result = Instrumentation(
            SpanEventSink(level) if span_events else None,
            LogEventSink(logger_provider, level) if log_events else None,
            Metrics(meter_provider, max_labels=max_labels, prometheus_registry=prometheus_registry)
            if metrics else None,
        )
        try:
            result._install()
        except BaseException:
            # (a sink refused, its level not a number): undo what was made, or its histogram
            # collector stays in the registry and the corrected call is refused as a duplicate
            for sink in result.sinks:
                stoic.remove_sink(sink)
            if result.metrics is not None:
                result.metrics.close()
            raise
        _active = result
    return result


def active() -> Instrumentation | None:
    """The installed :class:`Instrumentation`, or ``None``."""
    return _active
