"""stoic events into OpenTelemetry: span events, log-based events and metrics.

``instrument()`` installs process-wide sinks (:func:`stoic.add_sink`) that turn every stoic
event into span events on the caller's current span, optionally OTel log records with an event
name, and the metrics of :data:`METRICS` (counters and histograms from events, gauges from the
policies given to :meth:`Instrumentation.observe`). The core ``stoic`` package never imports
OpenTelemetry; this distribution is the only place it is used.
"""

from __future__ import annotations

import threading

from opentelemetry._logs import LoggerProvider
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import TracerProvider

import stoic
from stoic.events import Level, Sink

from ._logs import LogEventSink
from ._metrics import MetricsSink
from ._spans import SpanEventSink
from ._table import LABEL, METRICS, SECOND_BUCKETS, MetricSpec
from ._version import __version__

__all__ = [
    "LABEL",
    "METRICS",
    "SECOND_BUCKETS",
    "Instrumentation",
    "LogEventSink",
    "MetricSpec",
    "MetricsSink",
    "SpanEventSink",
    "__version__",
    "instrument",
]

_active_lock = threading.Lock()
_active: Instrumentation | None = None


class Instrumentation:
    """What :func:`instrument` installed: its sinks, until :meth:`uninstrument`.

    ``spans``, ``logs`` and ``metrics`` are the installed sinks (``None`` when turned off).
    """

    def __init__(self, spans: SpanEventSink | None, logs: LogEventSink | None, metrics: MetricsSink | None) -> None:
        self.spans = spans
        self.logs = logs
        self.metrics = metrics
        self._installed = False

    @property
    def sinks(self) -> tuple[Sink, ...]:
        """The installed sinks, in installation order."""
        return tuple(s for s in (self.spans, self.logs, self.metrics) if s is not None)

    @property
    def installed(self) -> bool:
        """Whether the sinks are installed (``False`` after :meth:`uninstrument`)."""
        return self._installed

    def observe(self, *policies: object) -> Instrumentation:
        """Register policies whose properties feed the gauges; returns ``self`` for chaining.

        Any object works (duck typing): ``.state`` (a breaker's ``BreakerState``) feeds
        ``stoic.breaker.state``; ``.available_permits`` and ``.waiter_count`` the rate limiter
        gauges; ``.active_count`` and ``.queued_count`` the bulkhead gauges; ``.current_delay``
        (seconds) ``stoic.hedge.delay``. The series' ``stoic.label`` is the object's ``.label``
        (its lowercased type name when it has none). Properties are read when metrics are
        collected; one that raises or is not a number is skipped. Policies are held weakly when
        they support it, so observing one does not keep it alive. A no-op with ``metrics=False``.
        """
        if self.metrics is not None:
            self.metrics.observe(*policies)
        return self

    def _install(self) -> None:
        for sink in self.sinks:
            stoic.add_sink(sink)
        self._installed = True

    def uninstrument(self) -> None:
        """Remove the sinks: events stop reaching OpenTelemetry. Idempotent.

        Counters and gauges (observable instruments) stop reporting; OpenTelemetry cannot delete
        instruments, so the duration histograms keep their last values in the meter provider.
        """
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
        return f"Instrumentation(sinks={list(self.sinks)!r}, installed={self._installed})"


def instrument(
    tracer_provider: TracerProvider | None = None,
    meter_provider: MeterProvider | None = None,
    logger_provider: LoggerProvider | None = None,
    *,
    span_events: bool = True,
    log_events: bool = False,
    metrics: bool = True,
    level: Level = Level.INFO,
) -> Instrumentation:
    """Send every stoic event to OpenTelemetry, process-wide.

    - ``span_events``: each event at ``level`` or above (default INFO) becomes an event on the
      caller's current recording span (``SpanEventSink``). Span events attach to whatever span is
      current, so ``tracer_provider`` is accepted for symmetry with other instrumentors and
      otherwise unused.
    - ``log_events``: each event at ``level`` or above becomes an OTel log record with
      ``event_name`` (``LogEventSink``), on ``logger_provider`` (default: the global one).
    - ``metrics``: the metrics of :data:`METRICS` on ``meter_provider`` (default: the global
      one). Metrics need debug events, so policies build those while metrics are on.

    Returns the :class:`Instrumentation`; call ``.observe(*policies)`` to feed the gauges and
    ``.uninstrument()`` to remove everything. Raises ``RuntimeError`` if an instrumentation is
    already installed (uninstrument it first: two would count every event twice).
    """
    del tracer_provider  # span events go to the current span, whichever provider made it
    global _active
    with _active_lock:
        if _active is not None:
            raise RuntimeError("stoic is already instrumented; call uninstrument() on the active Instrumentation first")
        result = Instrumentation(
            SpanEventSink(level) if span_events else None,
            LogEventSink(logger_provider, level) if log_events else None,
            MetricsSink(meter_provider) if metrics else None,
        )
        result._install()
        _active = result
    return result
