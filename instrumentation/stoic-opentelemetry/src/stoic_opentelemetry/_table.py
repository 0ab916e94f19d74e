"""The metric table, re-exported from the core (``stoic._metrics.METRICS``): the one list of every
metric, shared with stoic-prometheus and docs/metrics.md. Names, units and attribute keys are
fixed (dashboards and alerts query them)."""

from __future__ import annotations

from typing import Any

from stoic._metrics import BREAKER_STATES, DURATION_BUCKETS, LABEL, METRICS, METRICS_BY_NAME, MetricSpec, encodable
from stoic.events import Event

SECOND_BUCKETS = DURATION_BUCKETS
"""Histogram boundaries for durations in seconds (the SDK's defaults are made for milliseconds)."""

SCHEMA_URL = "https://opentelemetry.io/schemas/1.37.0"
"""The semantic-conventions schema the attribute names follow (``error.type``), on the instrumentation scope."""

_INT64 = range(-(2**63), 2**63)


def value(number: Any) -> Any:
    """``number`` as OpenTelemetry can carry it: its integers are signed 64-bit (OTLP encodes
    int64, and a larger Python int fails the whole export), so an int outside that range becomes
    a float (its magnitude kept); its strings are UTF-8, so a lone surrogate in a ``str`` becomes
    U+FFFD (``stoic._metrics.encodable``). Anything else is returned as is."""
    if type(number) is int and number not in _INT64:
        return float(number)
    if type(number) is str:
        return encodable(number)
    return number


def attributes(event: Event) -> dict[str, Any]:
    """The OpenTelemetry attributes of ``event``: its own (integers and text made safe by
    :func:`value`) plus ``stoic.label`` (a label from data may hold a lone surrogate too)."""
    made = {key: value(item) for key, item in event.attributes.items()}
    made[LABEL] = encodable(event.label)
    return made


__all__ = ["BREAKER_STATES", "LABEL", "METRICS", "METRICS_BY_NAME", "SCHEMA_URL", "SECOND_BUCKETS", "MetricSpec"]
