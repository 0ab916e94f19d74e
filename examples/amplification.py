"""Retry amplification: five layers, each retrying three times, against a dependency that is down.

Without nesting control every layer retries, and the dependency sees 3**5 = 243 calls for one
request. stoic's default (RetryNesting.SINGLE_ATTEMPT) makes a retry that starts inside another
retry's attempt try only once, so only the outermost layer retries: 3 calls. Budgets cap what
is left. Runs on virtual time; prints a table.

    python -m examples.amplification
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import stoic
from stoic import RetryBudget, RetryNesting, Schedule, retry
from stoic.testing import VirtualClock, reset_budgets

LAYERS = 5
SCHEDULE = Schedule.exponential(0.1).jittered().attempts(3)


async def one_request(nesting: RetryNesting, budget: RetryBudget) -> int:
    """One request through five layers; returns how many calls reached the dependency."""
    calls = 0

    async def dependency() -> None:
        nonlocal calls
        calls += 1
        raise ConnectionError("database down")

    def layer(inner: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
        async def call() -> None:
            await retry(SCHEDULE, inner, nesting=nesting, budget=budget, label="layer")

        return call

    operation: Callable[[], Awaitable[None]] = dependency
    for _ in range(LAYERS):
        operation = layer(operation)
    try:
        await operation()
    except ConnectionError:
        pass
    return calls


async def simulate(nesting: RetryNesting, budget: RetryBudget) -> int:
    reset_budgets()
    clock = VirtualClock()
    with stoic.use_clock(clock):
        return await clock.run(one_request(nesting, budget))


async def table() -> list[tuple[str, int]]:
    return [
        ("every layer retries (ALLOW), no budget", await simulate(RetryNesting.ALLOW, RetryBudget.UNLIMITED)),
        ("every layer retries (ALLOW), default budget (one site)",
         await simulate(RetryNesting.ALLOW, RetryBudget.PER_CALL_SITE)),
        ("stoic default (SINGLE_ATTEMPT)", await simulate(RetryNesting.SINGLE_ATTEMPT, RetryBudget.PER_CALL_SITE)),
    ]


def main() -> None:
    rows = asyncio.run(table())
    print(f"{LAYERS} layers x {SCHEDULE.maximum_attempts} attempts, dependency down, one request")
    print(f"{'configuration':<56}{'calls to the dependency':>25}")
    for name, calls in rows:
        print(f"{name:<56}{calls:>25}")


if __name__ == "__main__":
    main()
