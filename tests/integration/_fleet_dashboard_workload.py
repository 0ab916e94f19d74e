"""Shared policies on a real Redis, with their metrics on a Prometheus endpoint, for
test_fleet_dashboard.py: ``python -m tests.integration._fleet_dashboard_workload REDIS_URL PORT``.

Serves ``stoic_prometheus`` metrics on 127.0.0.1:PORT, then, every 20 ms until terminated: takes a
permit (30/s) of a fail-open and of a fail-closed ``SharedRateLimiter`` and runs a call (every fifth one
fails) through a fail-open ``SharedCircuitBreaker``, all on one ``RedisStore``. The test kills and
restarts the Redis underneath; this process never learns of it except through the store.
"""

from __future__ import annotations

import asyncio
import sys

import stoic_prometheus
from prometheus_client import CollectorRegistry, start_http_server

from stoic import Rejected
from stoic.fleet import RedisStore, SharedCircuitBreaker, SharedRateLimiter

STORE = "fleet-redis"
LIMITER = "partner-limit"
STRICT = "partner-strict-limit"
BREAKER = "partner-breaker"


class Flaky(Exception):
    """The dependency's failure (the breaker counts it)."""


async def main(url: str, port: int) -> None:
    registry = CollectorRegistry(auto_describe=True)
    stoic_prometheus.instrument(registry)
    start_http_server(port, addr="127.0.0.1", registry=registry)
    # A generous budget: a busy test machine must not look like an outage; a short probe interval,
    # so the store is found again soon after it is back.
    store = RedisStore(url, budget=0.25, probe_interval=0.25, label=STORE)
    # 30 permits/s for about 45 asks/s: the fallback bucket runs dry during an outage.
    limiter = SharedRateLimiter(30, 1.0, store=store, label=LIMITER)
    strict = SharedRateLimiter(30, 1.0, store=store, label=STRICT, fail_open_on_store_error=False)
    breaker = SharedCircuitBreaker(label=BREAKER, store=store, refresh_interval=0.1, minimum_calls=20,
                                   failure_rate_threshold=0.9)
    calls = 0

    async def dependency() -> int:
        if calls % 5 == 0:
            raise Flaky("the partner failed")
        return calls

    print("ready", flush=True)
    while True:
        calls += 1
        await limiter.try_acquire()
        await strict.try_acquire()
        try:
            await breaker.execute(dependency)
        except (Flaky, Rejected):
            pass
        await asyncio.sleep(0.02)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
