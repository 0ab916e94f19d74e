"""Retry-budget behaviour that mutation testing found unchecked (issue 9, item 5; docs/mutation.md).

Seed 001, "Budgets": each first attempt earns ``ratio`` tokens (capped), a reserve of
``reserve_capacity`` tokens refilling at ``reserve_per_second`` lets a quiet caller retry, and a
retry spends one token, earned ones first. The defaults are ``RetryBudget(ratio=0.2,
reserve_per_second=1.0, reserve_capacity=10)`` for a budget of its own, a named one and a
call site's own.
"""

from __future__ import annotations

import math

import pytest

import stoic
from stoic import RetryBudget, Schedule
from stoic.testing import VirtualClock, reset_budgets

START = 1000.0


class Clock(VirtualClock):
    def __init__(self) -> None:
        super().__init__(START)

    def step(self, seconds: float) -> None:
        self._set_now(self.now_ns() + round(seconds * 1e9))


def spend_all(budget: RetryBudget, limit: int = 10_000) -> int:
    spent = 0
    while spent < limit and budget.try_spend():
        spent += 1
    return spent


def test_the_default_reserve_is_ten_tokens_refilling_one_a_second() -> None:
    clock = Clock()
    budget = RetryBudget(clock=clock)
    assert (budget.ratio, budget.reserve_per_second, budget.reserve_capacity) == (0.2, 1.0, 10)
    assert budget.tokens == 10.0
    assert spend_all(budget) == 10
    clock.step(0.999999999)
    assert not budget.try_spend()
    assert budget.tokens == pytest.approx(0.999999999, abs=1e-12)
    clock.step(0.000000001)
    assert budget.try_spend()  # exactly one second: exactly one token
    clock.step(3600)
    assert budget.tokens == 10.0  # never more than the capacity
    assert spend_all(budget) == 10


def test_a_named_budget_has_the_same_defaults_and_refills_on_its_own_clock(clock: VirtualClock) -> None:
    budget = RetryBudget.named("defaults")
    assert (budget.ratio, budget.reserve_per_second, budget.reserve_capacity) == (0.2, 1.0, 10)
    assert RetryBudget.named("defaults", 0.2, 1.0, 10) is budget
    assert budget.tokens == 10.0


async def test_a_named_budgets_reserve_refills_one_token_a_second(clock: VirtualClock) -> None:
    budget = RetryBudget.named("refill")
    assert spend_all(budget) == 10
    await clock.advance(2.0)
    assert spend_all(budget) == 2


def test_a_call_sites_own_budget_has_the_defaults() -> None:
    budget = RetryBudget.for_call_site("here.py:1")
    assert (budget.ratio, budget.reserve_per_second, budget.reserve_capacity) == (0.2, 1.0, 10)
    assert RetryBudget.PER_CALL_SITE.resolve("here.py:1") is budget
    assert RetryBudget.UNLIMITED.resolve("here.py:1") is RetryBudget.UNLIMITED


def test_an_earned_capacity_of_zero_banks_nothing() -> None:
    budget = RetryBudget(ratio=1.0, reserve_per_second=0, reserve_capacity=1, earned_capacity=0, clock=Clock())
    for _ in range(100):
        budget.deposit()
    assert budget.tokens == 1.0  # the reserve only
    assert spend_all(budget) == 1


def test_the_default_earned_capacity_follows_a_larger_reserve_capacity() -> None:
    budget = RetryBudget(ratio=1.0, reserve_per_second=0, reserve_capacity=15, clock=Clock())
    assert spend_all(budget) == 15
    for _ in range(100):
        budget.deposit()
    assert budget.tokens == 15.0  # earned capped at max(10, reserve_capacity)
    assert spend_all(budget) == 15


def test_earned_tokens_are_spent_before_the_reserve_which_keeps_refilling_meanwhile() -> None:
    clock = Clock()
    budget = RetryBudget(ratio=0.5, reserve_per_second=2.0, reserve_capacity=2, clock=clock)
    for _ in range(4):
        budget.deposit()  # 2 earned tokens
    assert budget.tokens == 4.0
    assert budget.try_spend() and budget.try_spend()
    assert budget.tokens == 2.0  # the reserve untouched
    assert spend_all(budget) == 2
    clock.step(0.25)
    assert budget.tokens == 0.5
    clock.step(0.25)
    assert spend_all(budget) == 1


def test_deposits_between_spends_add_up_exactly() -> None:
    budget = RetryBudget(ratio=0.25, reserve_per_second=0, reserve_capacity=0, clock=Clock())
    total = 0
    for round_ in range(1, 9):
        for _ in range(round_):
            budget.deposit()
        total += round_
        spent = spend_all(budget)
        assert spent == total // 4
        total -= 4 * spent
        assert budget.tokens == total / 4


def test_unlimited_has_infinite_tokens_and_per_call_site_is_not_a_bucket() -> None:
    assert RetryBudget.UNLIMITED.tokens == math.inf
    assert all(RetryBudget.UNLIMITED.try_spend() for _ in range(1000))
    assert repr(RetryBudget.UNLIMITED) == "RetryBudget.UNLIMITED"
    assert repr(RetryBudget.PER_CALL_SITE) == "RetryBudget.PER_CALL_SITE"


def test_repr_shows_the_parameters_and_the_name() -> None:
    assert repr(RetryBudget(0.5, 2.0, 3, clock=Clock())) == (
        "RetryBudget(ratio=0.5, reserve_per_second=2.0, reserve_capacity=3)")
    assert repr(RetryBudget.named("shown", 0.5, 2.0, 3)) == (
        "RetryBudget(ratio=0.5, reserve_per_second=2.0, reserve_capacity=3, name='shown')")


@pytest.mark.parametrize("kwargs, parameter", [
    ({"reserve_per_second": -0.1}, "reserve_per_second"),
    ({"reserve_per_second": math.inf}, "reserve_per_second"),
    ({"reserve_capacity": -1}, "reserve_capacity"),
    ({"earned_capacity": -1}, "earned_capacity"),
    ({"ratio": 0.0}, "ratio"),
])
def test_out_of_range_parameters_are_refused_naming_them(kwargs: dict[str, float], parameter: str) -> None:
    with pytest.raises(ValueError, match=parameter):
        RetryBudget(**kwargs)  # type: ignore[arg-type]


def test_zero_reserve_rate_and_capacity_are_allowed() -> None:
    budget = RetryBudget(reserve_per_second=0, reserve_capacity=0, clock=Clock())
    assert budget.tokens == 0.0 and not budget.try_spend()


# --------------------------------------------------------------------------- one budget per call site

SCHEDULE = Schedule.fixed(0).attempts(12)


class Failing:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1
        raise ConnectionError("down")


def attempts_at_site_a(op: Failing) -> int:
    before = op.calls
    with pytest.raises(ConnectionError):
        stoic.retry_sync(SCHEDULE, op, label="site")
    return op.calls - before


def attempts_at_site_b(op: Failing) -> int:
    before = op.calls
    with pytest.raises(ConnectionError):
        stoic.retry_sync(SCHEDULE, op, label="site")
    return op.calls - before


def test_each_call_site_has_its_own_budget_kept_across_calls(clock: VirtualClock) -> None:
    op = Failing()
    assert attempts_at_site_a(op) == 11  # the first attempt, then the reserve's 10 tokens
    assert attempts_at_site_a(op) == 1  # the same site: its budget is spent
    # Another function whose retry sits at the same bytecode offset is another site.
    assert attempts_at_site_b(op) == 11
    assert attempts_at_site_b(op) == 1
    assert attempts_at_site_a(op) == 1


def test_reset_budgets_gives_every_site_and_decorated_function_a_fresh_budget(clock: VirtualClock) -> None:
    op = Failing()

    @stoic.retrying(SCHEDULE, label="decorated")
    def decorated() -> None:
        op()

    def attempts_of_decorated() -> int:
        before = op.calls
        with pytest.raises(ConnectionError):
            decorated()
        return op.calls - before

    assert attempts_of_decorated() == 11
    assert attempts_of_decorated() == 1
    assert attempts_at_site_a(op) == 11
    reset_budgets()
    assert attempts_of_decorated() == 11  # the decorated function took its site's new budget
    assert attempts_at_site_a(op) == 11
