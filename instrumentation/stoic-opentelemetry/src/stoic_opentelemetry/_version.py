"""The adapter's version (also the OpenTelemetry instrumentation scope version)."""

__version__ = "0.1.0"
