"""``opentelemetry-instrument`` support: the ``stoic`` entry point of group ``opentelemetry_instrumentor``.

:class:`StoicInstrumentor` follows contrib's ``BaseInstrumentor`` contract (it is one): a
singleton; ``instrument()`` twice logs a warning and does nothing the second time;
``uninstrument()`` undoes it; ``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=stoic`` makes the
auto-instrumentation skip it (and this class honours the variable too when called directly).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection
from typing import Any

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]

from . import Instrumentation, instrument

_log = logging.getLogger(__name__)

NAME = "stoic"
"""The entry point name (what OTEL_PYTHON_DISABLED_INSTRUMENTATIONS lists to turn it off)."""


def _disabled() -> bool:
    value = os.environ.get("OTEL_PYTHON_DISABLED_INSTRUMENTATIONS", "")
    names = {n.strip() for n in value.split(",")}
    return NAME in names or "*" in names


class StoicInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Instruments stoic for OpenTelemetry: ``StoicInstrumentor().instrument(**kwargs)`` calls
    :func:`stoic_opentelemetry.instrument` with the same keyword arguments (``tracer_provider``,
    ``meter_provider``, ``logger_provider``, ``span_events``, ``log_events``, ``metrics``,
    ``level``, ``prometheus_registry``, ``max_labels``)."""

    _instrumentation: Instrumentation | None = None

    def instrumentation_dependencies(self) -> Collection[str]:
        return ("stoic >= 0.1.0",)

    def _instrument(self, **kwargs: Any) -> None:
        if _disabled():
            _log.info("stoic instrumentation disabled by OTEL_PYTHON_DISABLED_INSTRUMENTATIONS")
            return
        self._instrumentation = instrument(**kwargs)

    def _uninstrument(self, **kwargs: Any) -> None:
        instrumentation, self._instrumentation = self._instrumentation, None
        if instrumentation is not None:
            instrumentation.uninstrument()
