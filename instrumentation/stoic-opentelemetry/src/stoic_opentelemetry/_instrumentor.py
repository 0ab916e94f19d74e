"""``opentelemetry-instrument`` support: the ``stoic`` entry point of group ``opentelemetry_instrumentor``.

:class:`StoicInstrumentor` follows contrib's ``BaseInstrumentor`` contract (it is one): a
singleton; ``instrument()`` twice logs a warning and does nothing the second time;
``uninstrument()`` undoes it; ``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=stoic`` makes the
auto-instrumentation skip it (and this class honours the variable too when called directly).

Zero-code instrumentation calls ``instrument()`` with no argument, so nobody can pass
``prometheus_registry=`` or wrap an exporter in :class:`HistogramBridge`: the instrumentor finds
the routes of the duration histograms itself on the meter provider's readers (see
:func:`_histogram_routes`), so they are exported wherever the counters and gauges are.
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Collection
from typing import Any, ClassVar

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]
from opentelemetry.metrics import get_meter_provider

from . import Instrumentation, instrument
from ._metrics import HistogramBridge

_log = logging.getLogger(__name__)

NAME = "stoic"
"""The entry point name (what OTEL_PYTHON_DISABLED_INSTRUMENTATIONS lists to turn it off)."""


def _disabled() -> bool:
    value = os.environ.get("OTEL_PYTHON_DISABLED_INSTRUMENTATIONS", "")
    names = {n.strip() for n in value.split(",")}
    return NAME in names or "*" in names


def _histogram_routes(provider: Any) -> tuple[Any, list[Any]]:
    """The routes of the duration histograms on an SDK ``provider``'s readers: the registry of its
    OpenTelemetry Prometheus reader (``None`` without one, or when that reader adds a name prefix
    the histograms would not carry), and its push readers (``PeriodicExportingMetricReader``)
    whose exporter is not bridged yet. A provider that is not the SDK's has neither."""
    readers = getattr(provider, "_metric_readers", None)
    if readers is None:
        readers = getattr(getattr(provider, "_sdk_config", None), "metric_readers", ())
    try:
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    except ImportError:  # (no SDK: no reader to find)
        return None, []
    prometheus: Any
    try:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader as prometheus
    except ImportError:
        prometheus = None
    registry, push = None, []
    for reader in list(readers or ()):
        if prometheus is not None and isinstance(reader, prometheus):
            if registry is None and not getattr(reader, "_prefix", ""):
                from prometheus_client import REGISTRY

                registry = getattr(reader, "_registry", REGISTRY)
        elif isinstance(reader, PeriodicExportingMetricReader) and not isinstance(
                getattr(reader, "_exporter", None), (HistogramBridge, type(None))):
            push.append(reader)
    return registry, push


class StoicInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Instruments stoic for OpenTelemetry: ``StoicInstrumentor().instrument(**kwargs)`` calls
    :func:`stoic_opentelemetry.instrument` with the same keyword arguments (``tracer_provider``,
    ``meter_provider``, ``logger_provider``, ``span_events``, ``log_events``, ``metrics``,
    ``level``, ``prometheus_registry``, ``max_labels``).

    With metrics on and no ``prometheus_registry`` given, the duration histograms are served
    through the meter provider's own readers (the global one unless ``meter_provider`` is
    given): from the registry of its OpenTelemetry Prometheus reader, and appended to the
    exports of each push reader, whose exporter is wrapped in :class:`HistogramBridge` until
    ``uninstrument()``."""

    _instrumentation: Instrumentation | None = None
    _bridged: tuple[tuple[Any, Any], ...] = ()  # (push reader, its own exporter) while bridged
    # Each push reader's bridge, kept for the next instrument() (weakly: a reader shut down and
    # dropped takes its bridge with it).
    _bridges: ClassVar[weakref.WeakKeyDictionary[Any, HistogramBridge]] = weakref.WeakKeyDictionary()

    def instrumentation_dependencies(self) -> Collection[str]:
        return ("stoic >= 0.1.0",)

    def _instrument(self, **kwargs: Any) -> None:
        if _disabled():
            _log.info("stoic instrumentation disabled by OTEL_PYTHON_DISABLED_INSTRUMENTATIONS")
            return
        push: list[Any] = []
        if kwargs.get("metrics", True) and kwargs.get("prometheus_registry") is None:
            provider = kwargs.get("meter_provider")
            registry, push = _histogram_routes(provider if provider is not None else get_meter_provider())
            if registry is not None:
                try:
                    self._instrumentation = instrument(**{**kwargs, "prometheus_registry": registry})
                except ValueError:  # the registry serves them already (stoic_prometheus.instrument)
                    registry = None
            if registry is not None:
                self._bridge(push)
                return
        self._instrumentation = instrument(**kwargs)
        self._bridge(push)

    def _bridge(self, push: list[Any]) -> None:
        bridged = []
        for reader in push:
            original = reader._exporter
            # The bridge of an earlier instrument() on this reader, if it wrapped the same
            # exporter: for delta temporality it remembers what it sent, and a new one would send
            # every call counted so far again, as new.
            bridge = self._bridges.get(reader)
            if bridge is None or bridge._exporter is not original:
                bridge = HistogramBridge(original)  # reads the active instrumentation's metrics
                self._bridges[reader] = bridge
            reader._exporter = bridge
            bridged.append((reader, original))
        self._bridged = tuple(bridged)

    def _uninstrument(self, **kwargs: Any) -> None:
        instrumentation, self._instrumentation = self._instrumentation, None
        bridged, self._bridged = self._bridged, ()
        for reader, original in bridged:
            if isinstance(reader._exporter, HistogramBridge) and reader._exporter._exporter is original:
                reader._exporter = original
        if instrumentation is not None:
            instrumentation.uninstrument()
