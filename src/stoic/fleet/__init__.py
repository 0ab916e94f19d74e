"""Fleet-wide state on Redis (seed 003, fleet-wide state and ``fail_open_on_store_error``).

A rate limit and a circuit breaker shared by every replica of a service, held in Redis and
decided by one Lua script per decision, failing open (or closed, as configured) within a tight
per-call budget when the store cannot be used. See docs/fleet.md.

Needs the ``redis`` extra (``pip install 'stoic[redis]'``); redis-py is imported when a
:class:`RedisStore` is built, never by ``import stoic`` or ``import stoic.fleet``.
"""

from ._breaker import SharedCircuitBreaker
from ._latency import SharedLatency, SharedQuantile
from ._limiter import BlockingSharedRateLimiter, SharedRateLimiter
from ._store import RedisStore, StoreError

__all__ = [
    "BlockingSharedRateLimiter", "RedisStore", "SharedCircuitBreaker", "SharedLatency", "SharedQuantile",
    "SharedRateLimiter", "StoreError",
]
