"""Hostile stress for "no waiter, slot, permit or lease is ever leaked" (docs/design.md,
cancellation): hundreds of tasks arriving over virtual time, cancelled at random points (queued,
at hand-over, mid-operation), cut by ``stoic.timeout`` and ``asyncio.timeout``, operations
raising BaseException subclasses and a CancelledError of their own, random criticalities, and
live retunes of the queue options while callers wait. After each run every count is back at rest.

What the rest of the suite lacks and this adds: retunes of the managed queue's options (CoDel,
adaptive LIFO, prioritized) and of the adaptive bulkheads while waiters are parked; a breaker's
half-open probes behind a rate limiter and a managed bulkhead in one pipeline; a keyed family
evicting and rebuilding its policies under the same churn.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import pytest
from _churn import assert_at_rest, churn
from _keyed import record_builds

import stoic
from stoic import Criticality, bind_criticality
from stoic.testing import VirtualClock

SEEDS = range(6)


class Interrupt(BaseException):
    """A KeyboardInterrupt-like error raised by the operation."""


async def operation(clock: VirtualClock, rng: random.Random, failing: float) -> int:
    await clock.sleep(rng.choice([0, 0.001, 0.01, 0.05]))
    roll = rng.random()
    if roll < 0.1:
        raise Interrupt
    if roll < 0.2:
        raise asyncio.CancelledError  # raised by the operation, the task itself not cancelled
    if roll < 0.25:
        raise GeneratorExit
    if roll < 0.25 + failing:
        raise ValueError("dependency failed")
    return 1


async def caller(policy: Any, clock: VirtualClock, rng: random.Random, failing: float) -> None:
    mode = rng.random()
    with bind_criticality(rng.choice(list(Criticality))):
        try:
            if mode < 0.3:
                async with stoic.timeout(rng.choice([0.0005, 0.005, 0.02, 0.1])):
                    await policy.execute(operation, clock, rng, failing)
            elif mode < 0.4:
                async with asyncio.timeout(0):  # the loop's own timeout, at its next iteration
                    await policy.execute(operation, clock, rng, failing)
            else:
                await policy.execute(operation, clock, rng, failing)
        except (Exception, Interrupt, GeneratorExit, asyncio.CancelledError):
            pass


async def run(seed: int, policy: Any, clock: VirtualClock, *, failing: float = 0.1,
              retune: Callable[[random.Random], None] | None = None,
              observe: Callable[[], None] | None = None) -> None:
    """Callers of ``policy`` churned over 60 rounds of virtual time (_churn.churn), the policy
    retuned in about one round of seven."""
    rng = random.Random(seed)

    def each_round() -> None:
        if retune is not None and rng.random() < 0.15:
            retune(rng)
        if observe is not None:
            observe()

    await churn(clock, rng, lambda: caller(policy, clock, rng, failing), rounds=60, each_round=each_round)


def queue_retune(bulkhead: stoic.Bulkhead) -> Callable[[random.Random], None]:
    def retune(rng: random.Random) -> None:
        changes: dict[str, Any] = {"max_concurrent": rng.randrange(1, 6)}
        if rng.random() < 0.3:
            changes["queue_limit"] = rng.choice([1, 5, 20, None])
        if rng.random() < 0.3:
            changes["queue_target"] = target = rng.choice([None, 0.001, 0.004])
            if target is not None:
                changes["queue_interval"] = rng.choice([0.01, 0.05])
        if rng.random() < 0.3:
            changes["queue_adaptive_lifo"] = rng.random() < 0.5
        if rng.random() < 0.3:
            changes["prioritized"] = rng.random() < 0.5
        try:
            bulkhead._retune(**changes)
        except ValueError as refused:  # turning management on or off needs an empty queue
            assert bulkhead.queued_count and "on or off" in str(refused)
    return retune


def managed_bulkhead(kind: str, clock: VirtualClock) -> stoic.Bulkhead:
    if kind == "fixed":
        return stoic.Bulkhead(3, queue_limit=30, label="fixed", clock=clock, queue_adaptive_lifo=True)
    if kind == "aimd":
        return stoic.AdaptiveBulkhead(latency_threshold=0.005, max_concurrent=8, queue_limit=30, label="aimd",
                                      clock=clock, cooldown=0.01, prioritized=True)
    return stoic.GradientBulkhead(max_concurrent=8, queue_limit=30, label="gradient", clock=clock,
                                  queue_target=0.002, queue_interval=0.01)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("kind", ["fixed", "aimd", "gradient"])
async def test_managed_bulkheads_retuned_under_churn_leak_nothing(kind: str, seed: int) -> None:
    clock = VirtualClock()
    bulkhead = managed_bulkhead(kind, clock)
    await run(seed, bulkhead, clock, retune=queue_retune(bulkhead))
    assert_at_rest(bulkhead)


@pytest.mark.parametrize("seed", SEEDS)
async def test_rate_limiter_retuned_under_churn_leaks_nothing(seed: int) -> None:
    clock = VirtualClock()
    limiter = stoic.RateLimiter(20, per=1.0, burst=3, label="limiter", clock=clock)
    await run(seed, limiter, clock, retune=lambda rng: limiter._retune(rate=rng.randrange(5, 50)))
    assert_at_rest(limiter)


@pytest.mark.parametrize("seed", SEEDS)
async def test_pipeline_of_breaker_limiter_and_managed_bulkhead_leaks_nothing(seed: int) -> None:
    clock = VirtualClock()
    breaker = stoic.CircuitBreaker(label="breaker", clock=clock, window=stoic.CountWindow(5), minimum_calls=5,
                                   half_open_probes=3, open_duration=stoic.OpenDuration.fixed(0.01, jitter=0))
    limiter = stoic.RateLimiter(50, per=1.0, burst=5, label="limiter", clock=clock)
    bulkhead = stoic.Bulkhead(3, queue_limit=40, label="bulkhead", clock=clock, queue_target=0.002,
                              queue_interval=0.01, prioritized=True)
    seen: set[str] = set()
    stages: list[Any] = [breaker, limiter, bulkhead]
    await run(seed, stoic.Pipeline(*stages), clock, failing=0.5,
                observe=lambda: seen.add(str(breaker.state)))
    assert "half_open" in seen  # the probes were exercised
    assert_at_rest(breaker)
    assert_at_rest(limiter)
    assert_at_rest(bulkhead)


class _Routed:
    """Spreads the callers over a few keys of a family (a Policy for ``churn``)."""

    def __init__(self, family: stoic.Keyed[Any], rng: random.Random) -> None:
        self.family, self.rng = family, rng

    async def execute(self, fn: Any, *args: Any) -> Any:
        return await self.family.execute(self.rng.choice("abcde"), fn, *args)


@pytest.mark.parametrize("seed", SEEDS)
async def test_keyed_bulkheads_evicted_and_rebuilt_under_churn_leak_nothing(
        seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = VirtualClock()
    built: list[stoic.Bulkhead] = record_builds(monkeypatch)
    family = stoic.Keyed(stoic.Bulkhead, label="keyed", max_keys=3, idle_after=0.01, clock=clock,
                         max_concurrent=2, queue_limit=10, queue_target=0.002, queue_interval=0.01)

    def retune(rng: random.Random) -> None:
        family.retune(max_concurrent=rng.randrange(1, 4))

    await run(seed, _Routed(family, random.Random(seed)), clock, retune=retune)
    assert len(built) > 5  # keys were evicted and rebuilt meanwhile
    for bulkhead in built:
        assert_at_rest(bulkhead)
    assert all(not slot.calls for slot in family._slots.values())
