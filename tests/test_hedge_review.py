"""Hostile review of hedge, its adaptive delay and the budgets hedges and retries spend from."""

from __future__ import annotations

import asyncio
import math
import random

import pytest
from _hedge_script import Script, Step

from stoic import IDEMPOTENT, Hedge, RetryBudget, Schedule, hedge, retry, retry_sync
from stoic._quantile import WindowedQuantile
from stoic.testing import VirtualClock, reset_budgets


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


async def test_a_hedges_own_budget_refills_on_the_clock_it_was_given() -> None:
    # No ambient virtual clock: the hedge is given one. Its per-call-site budget's reserve must
    # refill on that clock (as Retrying's does), not on the system clock, where a test moving
    # virtual time never refills it and production code on a custom clock sees another time.
    virtual = VirtualClock()
    policy = Hedge(0.1, clock=virtual, label="h")
    assert policy.budget.tokens == 10.0
    for _ in range(10):
        assert policy.budget.try_spend()
    assert policy.budget.tokens < 1
    await virtual.advance(5.0)
    assert policy.budget.tokens == pytest.approx(5.0, abs=0.01)


@pytest.mark.parametrize("form", ["retry", "retry_sync"])
async def test_a_retrys_own_budget_refills_on_the_clock_it_was_given(form: str) -> None:
    # The same for retry() and retry_sync() given clock=: the call site's bucket refilled on
    # whatever clock was ambient when the site was first met, so after its reserve was spent,
    # five seconds of the retry's own time gave it nothing back.
    virtual = VirtualClock()
    attempts: list[int] = []

    async def failing() -> None:
        attempts.append(1)
        raise ConnectionError

    def failing_sync() -> None:
        attempts.append(1)
        raise ConnectionError

    async def one_call() -> int:
        attempts.clear()
        schedule = Schedule.fixed(0.01).attempts(100)
        if form == "retry":
            task = asyncio.ensure_future(retry(schedule, failing, clock=virtual, label="r"))
        else:
            task = asyncio.ensure_future(asyncio.to_thread(
                retry_sync, schedule, failing_sync, clock=virtual, label="r"))
        while not task.done():
            await virtual.advance(0.01)
            await asyncio.sleep(0.001 if form == "retry_sync" else 0)
        with pytest.raises(ConnectionError):
            await task
        return len(attempts)

    assert await one_call() == 11  # the first attempt and the ten tokens of the full reserve
    await virtual.advance(5.0)
    assert await one_call() == 1 + 5  # five tokens back (the two calls' 0.4 earned is no whole one)


async def test_a_hedge_built_before_a_budget_reset_spends_from_its_sites_fresh_bucket(clock: VirtualClock) -> None:
    # stoic's pytest plugin resets every budget between tests so that one test's spent tokens do
    # not carry into the next (docs/retry.md, "Tests and budgets"). Retrying re-resolves its
    # site's bucket on a reset; a Hedge built once (at import, say) kept the spent one for ever.
    policy = Hedge(0.1, label="h")
    while policy.budget.try_spend():
        pass
    reset_budgets()
    assert policy.budget.tokens == 10.0
    assert await call(clock, policy, Step(1.0, "slow"), Step(0.01, "hedge")) == "hedge"
    # A budget given explicitly is the caller's: a reset leaves it alone.
    given = RetryBudget(reserve_capacity=1)
    explicit = Hedge(0.1, budget=given, label="h")
    reset_budgets()
    assert explicit.budget is given


def test_a_retuned_hedges_budget_follows_resets_only_while_it_is_its_sites_own() -> None:
    policy = Hedge(0.1, label="h")
    policy._retune(budget=RetryBudget.UNLIMITED)
    reset_budgets()
    assert policy.budget is RetryBudget.UNLIMITED
    policy._retune(budget=RetryBudget.PER_CALL_SITE)
    while policy.budget.try_spend():
        pass
    reset_budgets()
    assert policy.budget.tokens == 10.0
    policy._retune(delay=0.2)  # the budget kept: still the site's own
    while policy.budget.try_spend():
        pass
    reset_budgets()
    assert policy.budget.tokens == 10.0


async def test_a_hedge_and_the_retry_it_runs_on_one_line_keep_the_retry_budget_at_its_ratio(
    clock: VirtualClock,
) -> None:
    # Seed 001: under a full outage retries add at most 20% load plus the reserve's trickle per
    # call site. A one-line hedge of a retry made both per-call-site budgets the line's one
    # bucket: each request deposited twice (the hedge's call and the retry's first attempt), so
    # the retry spent 40%.
    calls = 0

    async def fetch() -> None:
        nonlocal calls
        calls += 1
        await clock.sleep(0.001)
        raise ConnectionError

    schedule = Schedule.fixed(0).attempts(3)
    for _ in range(1000):
        with pytest.raises(ConnectionError):
            await clock.run(hedge(IDEMPOTENT, lambda: retry(schedule, fetch, label="r"), delay=10, label="h"))
    reserve = 10 + clock.now() * 1.0  # the full reserve and its refill at 1 token/s
    assert calls - 1000 <= 0.2 * 1000 + reserve + 1
