"""Hostile review of hedge, its adaptive delay and the budgets hedges and retries spend from."""

from __future__ import annotations

import math
import random

import pytest
from _hedge_script import Script, Step

from stoic import IDEMPOTENT, Hedge, RetryBudget
from stoic._quantile import WindowedQuantile
from stoic.testing import VirtualClock


async def call(clock: VirtualClock, policy: Hedge, *steps: Step) -> object:
    return await clock.run(policy.execute(IDEMPOTENT, Script(clock, dict(enumerate(steps, start=1)))))


async def test_a_delay_max_of_zero_is_accepted_and_races_every_call(clock: VirtualClock) -> None:
    # delay_min and delay_max are documented as seconds >= 0: a delay_max of 0 is an adaptive
    # hedge clamped to a race. It was refused with an error about an internal "cap".
    policy = Hedge(0.5, quantile=0.5, delay_max=0, budget=RetryBudget.UNLIMITED, label="h")
    for _ in range(20):
        await call(clock, policy, Step(0.010, "ok"))
    assert policy.current_delay == 0.0
    assert await call(clock, policy, Step(1.0, "slow"), Step(0.01, "hedge")) == "hedge"
    assert clock.now() == pytest.approx(20 * 0.010 + 0.01)


@pytest.mark.parametrize("window", [5, 10, 20, 40])
@pytest.mark.parametrize("p", [0.9, 0.95, 0.99])
def test_a_short_window_still_estimates_its_quantile_not_the_median(window: int, p: float) -> None:
    # A window shorter than the default warm-up is trusted after `window` samples, before the
    # P-squared markers (which start at the median and move one rank per sample) can reach the
    # quantile: at window=5 the "p95" was the median of each epoch, so about half of all calls
    # were hedged instead of one in twenty. With few samples the estimate must be the exact
    # nearest-rank quantile of those samples, never lower.
    rng = random.Random(window * 1000 + round(p * 100))
    estimate = WindowedQuantile(p, window)
    for _ in range(200):
        epoch = [rng.lognormvariate(0, 0.5) for _ in range(window)]
        for x in epoch:
            estimate.add(x)
        ordered = sorted(epoch)
        assert estimate.value == ordered[math.ceil(p * window) - 1]


async def test_a_short_window_hedges_about_as_often_as_its_quantile_says(clock: VirtualClock) -> None:
    policy = Hedge(1.0, quantile=0.95, window=20, budget=RetryBudget.UNLIMITED, label="h")
    rng = random.Random(3)
    for _ in range(200):  # warm up: every primary wins before the 1 s delay
        await call(clock, policy, Step(rng.lognormvariate(-4, 0.5), "ok"))
    hedged = 0
    for _ in range(2000):
        latency = rng.lognormvariate(-4, 0.5)
        hedged += latency > policy.current_delay  # (the hedge is slower: the primary still wins)
        await call(clock, policy, Step(latency, "ok"), Step(10.0, "late"))
    assert hedged / 2000 < 0.12  # was 0.2 and more: the estimate lagged far under the p95
