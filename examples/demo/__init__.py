"""The traced demo service: ``python -m examples.demo`` (``make demo``).

A client calls a real HTTP dependency (another process, see :mod:`examples.demo.dependency`)
through httpx clients whose transport is :class:`stoic.httpx.AsyncResilientTransport` (retry,
breaker, adaptive throttle, rate limiter, adaptive bulkhead, attempt timeout; hedged reads),
inside OpenTelemetry spans, with metrics served for Prometheus and the control plane served on
loopback. The dependency follows a script (healthy, failing, slow, recovered), and the terminal
shows the breaker's transitions live, then a summary. docs/demo.md walks through it.
"""
