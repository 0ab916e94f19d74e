"""A replica for the stoic.fleet integration tests, run as its own process:

``python -m tests.integration._fleet_worker MODE URL LABEL START_AT [ARGS...]`` waits until the
wall-clock instant START_AT (so every replica starts together), runs MODE, and prints one JSON
line with what it saw.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from stoic import CircuitOpen, OpenDuration, RateLimited
from stoic.fleet import RedisStore, SharedCircuitBreaker, SharedRateLimiter


async def _until(start_at: float) -> None:
    await asyncio.sleep(max(0.0, start_at - time.time()))


async def limiter(url: str, label: str, start_at: float, seconds: float, tasks: int) -> dict[str, object]:
    """Several tasks taking permits of a shared 100/s bucket as fast as it grants them."""
    store = RedisStore(url, budget=0.25, probe_interval=0.5)
    shared = SharedRateLimiter(100, 1.0, store=store, label=label, queue_limit=None)
    grants: list[float] = []
    refusals = 0
    end = start_at + seconds

    async def take() -> None:
        nonlocal refusals
        while time.time() < end:
            try:
                await shared.acquire()
            except RateLimited:
                refusals += 1
                continue
            grants.append(time.time())

    await _until(start_at)
    jobs = [asyncio.create_task(take()) for _ in range(tasks)]
    await asyncio.sleep(max(0.0, end - time.time()))
    for job in jobs:
        job.cancel()
    await asyncio.gather(*jobs, return_exceptions=True)
    await store.aclose()
    return {"grants": grants, "refusals": refusals}


async def probe(url: str, label: str, start_at: float, tasks: int) -> dict[str, object]:
    """``tasks`` calls arriving at once on a shared breaker whose open period has just ended."""
    store = RedisStore(url, budget=0.5, probe_interval=0.5)
    breaker = SharedCircuitBreaker(label, store=store, open_duration=OpenDuration.fixed(60.0, jitter=0.0),
                                   refresh_interval=0.05, half_open_timeout=5.0)
    await breaker.refresh()
    ran = 0
    refused = 0

    async def operation() -> None:
        nonlocal ran
        ran += 1
        await asyncio.sleep(0.5)  # the probe is still running when every other call arrives

    async def one() -> None:
        nonlocal refused
        try:
            await breaker.execute(operation)
        except CircuitOpen:
            refused += 1

    await _until(start_at)
    await asyncio.gather(*(one() for _ in range(tasks)))
    await store.aclose()
    return {"ran": ran, "refused": refused, "degraded": breaker.degraded}


def main() -> None:
    mode, url, label, start_at, *rest = sys.argv[1:]
    if mode == "limiter":
        result = asyncio.run(limiter(url, label, float(start_at), float(rest[0]), int(rest[1])))
    elif mode == "probe":
        result = asyncio.run(probe(url, label, float(start_at), int(rest[0])))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
