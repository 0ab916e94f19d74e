"""Hostile review of hedge, its adaptive delay and the budgets hedges and retries spend from."""

from __future__ import annotations

import pytest
from _hedge_script import Script, Step

from stoic import IDEMPOTENT, Hedge, RetryBudget
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
