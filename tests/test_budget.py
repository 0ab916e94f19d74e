"""RetryBudget: earned tokens from first attempts, a reserve refilling on the budget's clock,
shared and per-call-site buckets, validation."""

from __future__ import annotations

import asyncio
import math
import threading
from typing import Any

import pytest

import stoic
import stoic.testing
from stoic import RetryBudget
from stoic.testing import VirtualClock, fail_with, reset_budgets


def spend_all(budget: RetryBudget, limit: int = 10_000) -> int:
    spent = 0
    while spent < limit and budget.try_spend():
        spent += 1
    return spent


def test_each_first_attempt_earns_ratio_tokens(clock):
    budget = RetryBudget(ratio=0.2, reserve_per_second=0, reserve_capacity=0)
    assert budget.tokens == 0 and not budget.try_spend()
    for _ in range(4):
        budget.deposit()
    assert budget.tokens == pytest.approx(0.8)
    assert not budget.try_spend()  # 0.8 of a token is not a token
    budget.deposit()
    assert budget.tokens == 1.0  # exact: integer arithmetic, no 0.2 * 5 float drift
    assert budget.try_spend()
    assert not budget.try_spend()
    for _ in range(50):
        budget.deposit()
    assert spend_all(budget) == 10  # 50 x 0.2


def test_earned_tokens_are_capped_so_a_quiet_streak_cannot_bank_a_burst(clock):
    budget = RetryBudget(ratio=1.0, reserve_per_second=0, reserve_capacity=0, earned_capacity=3)
    for _ in range(1000):
        budget.deposit()
    assert budget.tokens == 3 and spend_all(budget) == 3
    default = RetryBudget(ratio=1.0, reserve_per_second=0, reserve_capacity=0)
    for _ in range(1000):
        default.deposit()
    assert spend_all(default) == 10  # max(10, reserve_capacity)


async def test_the_reserve_starts_full_and_refills_on_virtual_time_up_to_its_capacity(clock):
    budget = RetryBudget(ratio=0.1, reserve_per_second=0.5, reserve_capacity=3)
    assert budget.tokens == 3
    assert spend_all(budget) == 3
    await clock.advance(1.9)
    assert not budget.try_spend()  # 0.95 of a token
    await clock.advance(0.1)
    assert budget.try_spend()  # 2 s at 0.5/s = 1 token
    await clock.advance(3600)
    assert budget.tokens == 3  # capped, however long the quiet
    assert spend_all(budget) == 3


async def test_earned_tokens_are_spent_before_the_reserve(clock):
    budget = RetryBudget(ratio=1.0, reserve_per_second=0, reserve_capacity=2)
    budget.deposit()
    assert budget.tokens == 3
    assert budget.try_spend()
    assert budget.tokens == 2  # the reserve is untouched
    assert spend_all(budget) == 2


async def test_under_a_full_outage_retries_are_bounded_by_ratio_plus_reserve(clock):
    budget = RetryBudget(ratio=0.2, reserve_per_second=1, reserve_capacity=10)
    retries = 0
    for _ in range(1000):  # 1000 first attempts over 10 s, each failing and wanting a retry
        budget.deposit()
        retries += budget.try_spend()
        await clock.advance(0.01)
    assert retries <= 0.2 * 1000 + 10 + 10  # earned + initial reserve + 10 s of refill
    assert retries >= 0.2 * 1000


def test_an_explicit_clock_drives_the_reserve():
    virtual = VirtualClock()
    budget = RetryBudget(reserve_per_second=1, reserve_capacity=1, clock=virtual)
    assert budget.try_spend() and not budget.try_spend()


def test_named_budgets_are_shared_per_name(clock):
    a = RetryBudget.named("payments")
    assert RetryBudget.named("payments") is a
    assert RetryBudget.named("search") is not a
    assert a.name == "payments" and "payments" in repr(a)
    with pytest.raises(ValueError, match="payments"):  # two call sites disagreeing is an error
        RetryBudget.named("payments", ratio=0.9)
    reset_budgets()
    assert RetryBudget.named("payments") is not a


def test_per_call_site_resolves_one_bucket_per_site(clock):
    per_site = RetryBudget.PER_CALL_SITE
    here = per_site.resolve("app.py:10")
    assert per_site.resolve("app.py:10") is here
    assert per_site.resolve("app.py:20") is not here
    assert RetryBudget.for_call_site("app.py:10") is here
    explicit = RetryBudget()
    assert explicit.resolve("app.py:10") is explicit  # a concrete bucket is its own everywhere
    assert repr(per_site) == "RetryBudget.PER_CALL_SITE"


def test_unlimited_never_refuses():
    unlimited = RetryBudget.UNLIMITED
    assert unlimited.resolve("x") is unlimited
    unlimited.deposit()
    assert all(unlimited.try_spend() for _ in range(10_000))
    assert unlimited.tokens == math.inf
    assert repr(unlimited) == "RetryBudget.UNLIMITED"


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"ratio": 0}, "ratio"),
        ({"ratio": -0.1}, "ratio"),
        ({"ratio": 1.5}, "ratio"),
        ({"ratio": math.nan}, "ratio"),
        ({"ratio": True}, "ratio"),
        ({"reserve_per_second": -1}, "reserve_per_second"),
        ({"reserve_per_second": math.inf}, "reserve_per_second"),
        ({"reserve_per_second": math.nan}, "reserve_per_second"),
        ({"reserve_capacity": -1}, "reserve_capacity"),
        ({"earned_capacity": -1}, "earned_capacity"),
        ({"reserve_capacity": 2.5}, "reserve_capacity"),
        ({"reserve_capacity": True}, "reserve_capacity"),
        ({"earned_capacity": 1.5}, "earned_capacity"),
    ],
)
def test_invalid_parameters_are_refused_naming_them(kwargs, parameter):
    with pytest.raises(ValueError, match=parameter):
        RetryBudget(**kwargs)


def test_concurrent_spenders_never_take_more_than_there_is(clock):
    budget = RetryBudget(ratio=1.0, reserve_per_second=0, reserve_capacity=0, earned_capacity=500)
    for _ in range(500):
        budget.deposit()
    wins: list[int] = []
    lock = threading.Lock()
    barrier = threading.Barrier(16)

    def spender() -> None:
        barrier.wait()
        mine = spend_all(budget)
        with lock:
            wins.append(mine)

    threads = [threading.Thread(target=spender) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(wins) == 500
    assert budget.tokens == 0


def test_a_named_budget_asked_for_with_other_parameters_is_a_configuration_error() -> None:
    first = RetryBudget.named("api.example.com", ratio=0.1)
    assert RetryBudget.named("api.example.com", ratio=0.1) is first
    with pytest.raises(ValueError, match=r"api\.example\.com"):
        RetryBudget.named("api.example.com")


@pytest.mark.parametrize("attribute", ["ratio", "reserve_per_second", "reserve_capacity", "name"])
def test_a_budgets_settings_are_read_only(attribute: str) -> None:
    # Writing one changed what the budget printed and what named() compared, never how it
    # earned or refilled (those run on values derived at construction): budget.ratio = 1.0
    # showed ratio=1.0 while it still earned 0.2 per call, and named(..., ratio=1.0) matched it.
    budget = RetryBudget.named("api.read-only", ratio=0.2, reserve_per_second=0, reserve_capacity=0)
    shown = repr(budget)
    with pytest.raises(AttributeError):
        setattr(budget, attribute, 1.0)
    assert repr(budget) == shown
    assert (budget.ratio, budget.reserve_per_second, budget.reserve_capacity, budget.name) == (
        0.2, 0.0, 0, "api.read-only")
    with pytest.raises(ValueError, match="already exists"):
        RetryBudget.named("api.read-only", ratio=1.0, reserve_per_second=0, reserve_capacity=0)
    with pytest.raises(AttributeError):
        RetryBudget.UNLIMITED.ratio = 0.5  # type: ignore[misc]


def _site_policy() -> Any:
    return stoic.Retrying(stoic.Schedule.fixed(0).attempts(100), label="site")  # one call site


def test_a_site_bucket_follows_the_clock_of_the_policy_built_there_after_a_reset() -> None:
    # A policy left over from an earlier test (on the system clock) re-resolves its site's bucket
    # when budgets are reset; a policy built at the same site under a VirtualClock must then get
    # a bucket refilling on that clock, not in real time while the test runs.
    leftover = _site_policy()
    stoic.testing.reset_budgets()
    virtual = VirtualClock()
    with stoic.use_clock(virtual):
        policy = _site_policy()
        op = fail_with(ConnectionError())
        with pytest.raises(ConnectionError):
            policy.call(op.sync)
        assert op.calls == 11  # the reserve of 10, on a still clock
        asyncio.run(virtual.advance(3.0))  # three tokens refill on the virtual clock
        with pytest.raises(ConnectionError):
            policy.call(op.sync)
        assert op.calls == 11 + 4
    assert leftover is not policy
