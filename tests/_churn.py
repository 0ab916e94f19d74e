"""The hostile churn of the stress tests (test_leak_stress, test_compose_stress), and what "at
rest" means for each stage once it is over.

``churn`` starts 100 callers, then for each round starts up to 6 more, cancels up to 4 at random
(queued, at hand-over or mid-operation), runs the round's hook (a retune, a state read), lets the
loop run a little and moves virtual time on by a random step. Then it runs every caller to its
end, checks that no timer is left, and raises any error a caller let out: the callers swallow
every outcome they expect, so an error escaping one is the test's failure.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any

import stoic
from stoic.testing import VirtualClock

STEPS = (0, 0.0005, 0.001, 0.005, 0.02)


async def churn(clock: VirtualClock, rng: random.Random, start: Callable[[], Awaitable[None]], *,
                rounds: int = 80, each_round: Callable[[], None] | None = None) -> None:
    tasks = [asyncio.ensure_future(start()) for _ in range(100)]
    for _ in range(rounds):
        tasks += [asyncio.ensure_future(start()) for _ in range(rng.randrange(7))]
        for _ in range(rng.randrange(5)):
            task = rng.choice(tasks)
            if not task.done():
                task.cancel()
        if each_round is not None:
            each_round()
        for _ in range(rng.randrange(3)):
            await asyncio.sleep(0)
        await clock.advance(rng.choice(STEPS))
    while not all(task.done() for task in tasks):
        await clock.advance(0.05)
    await clock.run_until_idle()
    assert clock.pending_timers == 0
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]


def assert_at_rest(stage: Any) -> None:
    """No slot, waiter, permit or probe permit left behind by ``stage``."""
    if isinstance(stage, stoic.CircuitBreaker):
        episode = stage._episode
        if episode is not None:  # half-open: every permit free, or spent by a successful probe
            assert episode.inflight == {}
            assert episode.free + episode.ok == episode.probes
    elif isinstance(stage, stoic.RateLimiter):
        assert (stage.waiter_count, stage._queued) == (0, 0)
    elif isinstance(stage, stoic.Bulkhead):  # the adaptive bulkheads too
        assert (stage.active_count, stage.queued_count) == (0, 0)
        assert stage._managed is None or stage._managed.parked == {}
    elif not isinstance(stage, stoic.Retrying):  # (a retry holds nothing between its calls)
        raise AssertionError(f"no at-rest rule for {stage!r}")
