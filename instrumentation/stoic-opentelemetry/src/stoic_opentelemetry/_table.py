"""The metric table, re-exported from the core (``stoic._metrics.METRICS``): the one list of every
metric, shared with stoic-prometheus and docs/metrics.md. Names, units and attribute keys are
fixed (dashboards and alerts query them)."""

from __future__ import annotations

from stoic._metrics import BREAKER_STATES, DURATION_BUCKETS, LABEL, METRICS, METRICS_BY_NAME, MetricSpec

SECOND_BUCKETS = DURATION_BUCKETS
"""Histogram boundaries for durations in seconds (the SDK's defaults are made for milliseconds)."""

SCHEMA_URL = "https://opentelemetry.io/schemas/1.37.0"
"""The semantic-conventions schema the attribute names follow (``error.type``), on the instrumentation scope."""

__all__ = ["BREAKER_STATES", "LABEL", "METRICS", "METRICS_BY_NAME", "SCHEMA_URL", "SECOND_BUCKETS", "MetricSpec"]
