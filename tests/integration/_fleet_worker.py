"""A replica for the stoic.fleet integration tests, run as its own process:

``python -m tests.integration._fleet_worker MODE URL LABEL [ARGS...]`` sets up, prints ``ready``,
reads a wall-clock start instant from stdin (so every replica starts together), runs MODE, and
prints one JSON line with what it saw.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from stoic import CircuitOpen, OpenDuration, RateLimited
from stoic.fleet import RedisStore, SharedCircuitBreaker, SharedRateLimiter


async def _ready() -> float:
    """Say ``ready`` and read the start instant (wall-clock seconds) from stdin: a replica slow
    to start cannot miss the start."""
    print("ready", flush=True)
    return float(await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline))


async def _until(start_at: float) -> None:
    await asyncio.sleep(max(0.0, start_at - time.time()))


async def limiter(url: str, label: str, seconds: float, tasks: int) -> dict[str, object]:
    """Several tasks taking permits of a shared 100/s bucket as fast as it grants them."""
    store = RedisStore(url, budget=0.25, probe_interval=0.5)
    shared = SharedRateLimiter(100, 1.0, store=store, label=label, queue_limit=None)
    grants: list[tuple[float, float]] = []
    refusals = 0

    async def take() -> None:
        nonlocal refusals
        while time.time() < end:
            asked = time.time()
            try:
                await shared.acquire()
            except RateLimited:
                refusals += 1
                continue
            # The server decided somewhere between asking and the answer.
            grants.append((asked, time.time()))

    assert await shared.try_acquire() is not None  # connected, script loaded (one permit spent)
    start_at = await _ready()
    end = start_at + seconds
    await _until(start_at)
    jobs = [asyncio.create_task(take()) for _ in range(tasks)]
    await asyncio.sleep(max(0.0, end - time.time()))
    for job in jobs:
        job.cancel()
    await asyncio.gather(*jobs, return_exceptions=True)
    await store.aclose()
    return {"grants": grants, "refusals": refusals}


async def probe(url: str, label: str, tasks: int) -> dict[str, object]:
    """``tasks`` calls arriving at once on a shared breaker whose open period has just ended.

    A replica slow to start cannot arrive after the probe has finished (see ``_ready``)."""
    store = RedisStore(url, budget=2.0, probe_interval=0.5)  # generous: 200 callers on a loaded machine
    breaker = SharedCircuitBreaker(label=label, store=store, open_duration=OpenDuration.fixed(60.0, jitter=0.0),
                                   refresh_interval=0.05, half_open_timeout=5.0)
    await breaker.refresh()
    start_at = await _ready()
    ran = 0
    refused = 0

    async def operation() -> None:
        nonlocal ran
        ran += 1
        await asyncio.sleep(1.0)  # the probe is still running when every other call arrives

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
    mode, url, label, *rest = sys.argv[1:]
    if mode == "limiter":
        result = asyncio.run(limiter(url, label, float(rest[0]), int(rest[1])))
    elif mode == "probe":
        result = asyncio.run(probe(url, label, int(rest[0])))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
