"""The traced demo service: ``python -m examples.demo`` (``make demo``).

A client calls a real HTTP dependency (another process, see :mod:`examples.demo.dependency`)
through a :class:`stoic.CircuitBreaker`, inside OpenTelemetry spans, with metrics served for
Prometheus. The dependency follows a script (healthy, failing, slow, recovered), and the
terminal shows the breaker's transitions live, then a summary. docs/demo.md walks through it.
"""
