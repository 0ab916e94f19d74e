"""The adaptive hedge delay (seed 003, "Hedge": the observed quantile of primary latencies)."""

from __future__ import annotations

import bisect
import math
import random

import pytest
from _hedge_script import Script, Step

from stoic import IDEMPOTENT, Hedge, RetryBudget
from stoic.testing import RecordingSink, VirtualClock


async def call(clock: VirtualClock, policy: Hedge, *steps: Step) -> object:
    return await clock.run(policy.execute(IDEMPOTENT, Script(clock, dict(enumerate(steps, start=1)))))


async def test_the_fixed_delay_is_used_until_the_estimate_warms_up(clock: VirtualClock) -> None:
    policy = Hedge(0.2, quantile=0.5, budget=RetryBudget.UNLIMITED, label="h")  # warm-up: 20 samples at p50
    assert policy.current_delay == 0.2
    for _ in range(19):
        await call(clock, policy, Step(0.010, "ok"))
    assert policy.current_delay == 0.2
    await call(clock, policy, Step(0.010, "ok"))
    assert policy.current_delay == pytest.approx(0.010)


async def test_the_delay_follows_the_quantile_of_primary_latencies(clock: VirtualClock) -> None:
    policy = Hedge(1.0, quantile=0.9, budget=RetryBudget.UNLIMITED, label="h")  # warm-up: 50 samples
    for i in range(200):
        await call(clock, policy, Step((10 + i % 10) / 1000, "ok"))  # 10..19 ms, evenly
    assert policy.current_delay == pytest.approx(0.019, abs=0.0015)


async def test_the_adaptive_delay_is_the_one_hedges_wait(clock: VirtualClock, sink: RecordingSink) -> None:
    policy = Hedge(1.0, quantile=0.5, budget=RetryBudget.UNLIMITED, label="h")
    for _ in range(20):
        await call(clock, policy, Step(0.030, "ok"))
    sink.clear()
    assert await call(clock, policy, Step(0.5, "slow"), Step(0.01, "hedge")) == "hedge"
    assert sink.of("hedge.started")[0].attributes["elapsed"] == pytest.approx(0.030)


async def test_the_estimate_is_clamped_to_delay_min_and_delay_max(clock: VirtualClock) -> None:
    low = Hedge(1.0, quantile=0.5, delay_min=0.05, delay_max=0.5, budget=RetryBudget.UNLIMITED, label="h")
    high = Hedge(0.01, quantile=0.5, delay_min=0.05, delay_max=0.5, budget=RetryBudget.UNLIMITED, label="h")
    for _ in range(20):
        await call(clock, low, Step(0.002, "fast"))
        await call(clock, high, Step(2.0, "slow"))
    assert low.current_delay == pytest.approx(0.05)
    assert high.current_delay == pytest.approx(0.5)


async def test_failed_primaries_never_feed_the_estimate(clock: VirtualClock) -> None:
    policy = Hedge(0.1, quantile=0.5, budget=RetryBudget.UNLIMITED, label="h")
    for _ in range(30):  # fast failures say nothing about latency
        with pytest.raises(RuntimeError):
            await call(clock, policy, Step(0.001, error=RuntimeError()))
    for _ in range(30):  # nor does a primary that failed while its hedge ran (the hedge won later)
        await call(clock, policy, Step(0.12, error=RuntimeError()), Step(0.05, "hedge"))
    assert policy.current_delay == 0.1
    for _ in range(20):  # a primary that wins after a hedge started counts
        await call(clock, policy, Step(0.15, "primary"), Step(1.0, "late hedge"))
    assert policy.current_delay == pytest.approx(0.15)


async def test_a_primary_a_hedge_beat_counts_as_long_as_it_ran(clock: VirtualClock) -> None:
    policy = Hedge(0.1, quantile=0.5, budget=RetryBudget.UNLIMITED, label="h")  # warm-up: 20 samples
    for _ in range(20):  # hedged at 0.1 s, won at 0.11 s: each primary took at least 0.11 s
        await call(clock, policy, Step(1.0, "slow"), Step(0.01, "hedge"))
    assert policy.current_delay == pytest.approx(0.11)


async def test_the_delay_settles_on_the_quantile_of_primary_latencies_under_hedging(clock: VirtualClock) -> None:
    # Primaries and hedges from one lognormal distribution (median 20 ms): leaving out the
    # primaries a hedge beat (the slowest ones) settled the p95 delay at the p86, hedging
    # almost three times as many calls; counted at the time they had run, it is the p95.
    rng = random.Random(7)

    def draw() -> float:
        return rng.lognormvariate(math.log(0.02), 1.0)

    async def op() -> None:
        await clock.sleep(draw())

    policy = Hedge(0.1, quantile=0.95, budget=RetryBudget.UNLIMITED, label="h", clock=clock)

    async def run() -> None:
        for _ in range(4000):
            await policy.execute(IDEMPOTENT, op)

    await clock.run(run())
    latencies = sorted(draw() for _ in range(20000))
    rank = bisect.bisect_left(latencies, policy.current_delay) / len(latencies)
    assert 0.92 <= rank <= 0.98


async def test_the_delay_forgets_old_traffic(clock: VirtualClock) -> None:
    policy = Hedge(1.0, quantile=0.5, window=100, budget=RetryBudget.UNLIMITED, label="h")
    for _ in range(300):
        await call(clock, policy, Step(0.010, "ok"))
    assert policy.current_delay == pytest.approx(0.010)
    for _ in range(120):  # one window and the new epoch's warm-up of slower (but winning) primaries
        await call(clock, policy, Step(0.040, "ok"), Step(1.0, "late"))
    assert policy.current_delay == pytest.approx(0.040)


def test_repr_and_properties() -> None:
    policy = Hedge(0.25, max_attempts=3, quantile=0.95, label="users")
    assert (policy.max_attempts, policy.quantile, policy.label, policy.window) == (3, 0.95, "users", 1000)
    assert "quantile=0.95" in repr(policy) and "current_delay=0.25" in repr(policy)


async def test_one_very_slow_primary_cannot_lift_the_delay_to_delay_max(clock: VirtualClock) -> None:
    # P-squared's markers move towards their neighbours, the largest value seen among them: fed
    # raw, one 60 s primary among 10-12 ms ones lifted the p95 estimate to seconds, and the delay
    # sat at delay_max for the rest of the epoch. Latencies above delay_max are fed as delay_max.
    policy = Hedge(0.5, quantile=0.95, delay_max=1.0, budget=RetryBudget.UNLIMITED, label="h")
    rng = random.Random(1)
    for _ in range(100):
        await call(clock, policy, Step(rng.uniform(0.010, 0.012), "ok"))
    assert policy.current_delay < 0.013
    await call(clock, policy, Step(60.0, "primary"), Step(100.0, "late hedge"))  # the primary wins at 60 s
    delays = []
    for _ in range(200):
        await call(clock, policy, Step(rng.uniform(0.010, 0.012), "ok"))
        delays.append(policy.current_delay)
    assert max(delays) < 0.1
    assert delays[-1] < 0.013
