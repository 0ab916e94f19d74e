"""Retry-budget configuration at its edges (issue 9, item 5: mutants that survived the suite).

Seed 001, "Budgets"; issue 9's hostile caller: ``reserve_per_second`` is a number of tokens per
second in [0, 10**15] (a bool is refused, not taken for 1), and ``RetryBudget.named`` refuses a
second caller who disagrees about any parameter, whichever way they differ.
"""

from __future__ import annotations

import pytest

from stoic import RetryBudget
from stoic.testing import VirtualClock

MAX_TOKENS = 10**15


@pytest.mark.parametrize("rate", [MAX_TOKENS, float(MAX_TOKENS)])
def test_the_largest_reserve_rate_is_accepted(rate: float) -> None:
    budget = RetryBudget(reserve_per_second=rate, clock=VirtualClock(0.0))
    assert budget.reserve_per_second == 1e15


@pytest.mark.parametrize("rate", [MAX_TOKENS + 1, 2.0 * MAX_TOKENS, 1e300])
def test_a_reserve_rate_beyond_the_largest_is_refused_naming_it(rate: float) -> None:
    with pytest.raises(ValueError, match="reserve_per_second"):
        RetryBudget(reserve_per_second=rate)


@pytest.mark.parametrize("rate", [True, False, "1", None])
def test_a_reserve_rate_that_is_not_a_number_is_refused_naming_it(rate: object) -> None:
    with pytest.raises(TypeError, match="reserve_per_second"):
        RetryBudget(reserve_per_second=rate)  # type: ignore[arg-type]


@pytest.mark.parametrize(("first", "second"), [
    ((0.5, 1.0, 10), (0.2, 1.0, 10)),  # the second asks for less...
    ((0.2, 1.0, 10), (0.5, 1.0, 10)),  # ...or for more
    ((0.2, 3.0, 10), (0.2, 1.0, 10)),
    ((0.2, 1.0, 20), (0.2, 1.0, 10)),
])
def test_a_named_budget_refuses_other_parameters_whichever_way_they_differ(
    first: tuple[float, float, int], second: tuple[float, float, int],
) -> None:
    name = f"bounds-{first}-{second}"
    budget = RetryBudget.named(name, *first)
    with pytest.raises(ValueError, match="already exists"):
        RetryBudget.named(name, *second)
    assert RetryBudget.named(name, *first) is budget
