"""pytest plugin loaded by tools/mutation.py for every mutant's run (``-p _mutation_pytest``).

Hypothesis derandomized and without its example database: the same mutant meets the same
examples on every run, and a failure found for one mutant is never replayed against the next.
No deadlines or health checks: a slow shared machine must not count as a killed mutant.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

settings.register_profile(
    "stoic-mutation", derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck)
)
settings.load_profile("stoic-mutation")
