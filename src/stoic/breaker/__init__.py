"""The circuit breaker (seed 000, "CircuitBreaker"): stop calling a failing dependency, probe
it gradually once it may have recovered, and report every decision as an event."""

from ._breaker import CircuitBreaker
from ._config import BreakerSnapshot, BreakerState, CountWindow, OpenDuration, TimeWindow
from ._stream import StateStream

__all__ = [
    "BreakerSnapshot",
    "BreakerState",
    "CircuitBreaker",
    "CountWindow",
    "OpenDuration",
    "StateStream",
    "TimeWindow",
]
