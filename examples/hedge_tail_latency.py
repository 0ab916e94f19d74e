"""What a hedge buys and what it costs: a hundred requests where one in twenty stalls.

Run: ``python -m examples.hedge_tail_latency``. Deterministic and offline: the service lives on
a :class:`stoic.testing.VirtualClock`, so the numbers below are the numbers you get.

The service answers in 20-25 ms (drawn from a generator seeded per request and attempt), except
that the first attempt of every twentieth request hits a stalled connection and takes 600 ms; a
second attempt goes elsewhere and answers normally. Three ways to call it:

- no policy: one attempt per request;
- a fixed hedge: a second attempt 50 ms after the first, if the first has not answered;
- an adaptive hedge: a second attempt after the observed p90 of first-attempt latencies (seed
  003), learnt over 1,000 earlier requests of the same traffic, with 50 ms until then. The p90,
  not the p95: with one first attempt in twenty stalled, the p95 sits on the edge of the stalls,
  anywhere between 25 and 600 ms; the quantile has to be below the share of calls to rescue.

For each: p50, p99 and max latency of the hundred requests (nearest rank), and how many calls
reached the backend.
"""

from __future__ import annotations

import asyncio
import math
import random
from dataclasses import dataclass

import stoic
from stoic import IDEMPOTENT, Attempt, Hedge, RetryBudget
from stoic.testing import VirtualClock

REQUESTS = 100
WARMUP_REQUESTS = 1000
STALL_EVERY = 20
STALL = 0.600
FIXED_DELAY = 0.050


def latency(request: int, attempt: int) -> float:
    """Seconds the backend takes for ``attempt`` of ``request``: deterministic."""
    if attempt == 1 and request % STALL_EVERY == STALL_EVERY - 1:
        return STALL
    return random.Random(f"{request}:{attempt}").uniform(0.020, 0.025)


@dataclass(frozen=True)
class Row:
    name: str
    p50_ms: float
    p99_ms: float
    max_ms: float
    backend_calls: int
    delay_ms: float | None = None  # the hedge delay in force during the measured requests


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(p * len(ordered))) - 1]


class Backend:
    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self.calls = 0

    async def handle(self, request: int, attempt: Attempt) -> int:
        self.calls += 1
        await self.clock.sleep_until(self.clock.now_ns() + round(latency(request, attempt.number) * 1e9))
        return request


async def _measure(name: str, policy: Hedge | None, clock: VirtualClock, first_request: int) -> Row:
    backend = Backend(clock)
    latencies: list[float] = []
    for request in range(first_request, first_request + REQUESTS):
        started = clock.now()
        if policy is None:
            await clock.run(backend.handle(request, Attempt(1)))
        else:
            await clock.run(policy.execute(IDEMPOTENT, backend.handle, request))
        latencies.append(clock.now() - started)
    delay = None if policy is None else policy.current_delay * 1000
    return Row(name, percentile(latencies, 0.5) * 1000, percentile(latencies, 0.99) * 1000,
               max(latencies) * 1000, backend.calls, delay)


async def _table() -> list[Row]:
    clock = VirtualClock()
    with stoic.use_clock(clock):
        rows = [await _measure("no policy", None, clock, 0)]
        fixed = Hedge(FIXED_DELAY, budget=RetryBudget(clock=clock), label="fixed")
        rows.append(await _measure("fixed hedge (50 ms)", fixed, clock, 0))
        adaptive = Hedge(FIXED_DELAY, quantile=0.9, delay_min=0.005, delay_max=0.2,
                         budget=RetryBudget(clock=clock), label="adaptive")
        warmup = Backend(clock)
        # Warm-up traffic of the same kind (other request ids, the same stall pattern); then the
        # same hundred requests as the other rows.
        for request in range(REQUESTS, REQUESTS + WARMUP_REQUESTS):
            await clock.run(adaptive.execute(IDEMPOTENT, warmup.handle, request))
        rows.append(await _measure("adaptive hedge (p90)", adaptive, clock, 0))
    return rows


def tail_latency_table() -> list[Row]:
    """The three rows of the table, computed on virtual time."""
    return asyncio.run(_table())


def format_table(rows: list[Row]) -> str:
    lines = [f"{'':<22}{'p50':>8}{'p99':>8}{'max':>8}{'backend calls':>15}{'delay':>9}"]
    for r in rows:
        delay = "" if r.delay_ms is None else f"{r.delay_ms:.1f} ms"
        lines.append(f"{r.name:<22}{r.p50_ms:>5.0f} ms{r.p99_ms:>5.0f} ms{r.max_ms:>5.0f} ms"
                     f"{r.backend_calls:>15}{delay:>9}")
    return "\n".join(lines)


def main() -> None:
    print(format_table(tail_latency_table()))


if __name__ == "__main__":
    main()
