"""Hostile configuration for retry's constructors (issue 9, "What a hostile caller found"): every
value is refused at construction with a ValueError/TypeError naming the parameter, or accepted
and then behaves (a schedule steps, its totals are finite numbers)."""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoic import RetryBudget, RetryDecision, Retrying, Schedule, retry_sync, retrying
from stoic.schedule import MAX_NS

hostile = st.one_of(
    st.sampled_from([0, -1, -0.0, 1e-12, float("nan"), float("inf"), float("-inf"), 10**400, -(10**400),
                     2**63, True, False, None, b"1", "1", [], (), object(), len, lambda: None,
                     timedelta(days=-1), timedelta(0), timedelta(days=10**8)]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(10**30), 10**30),
)

# name -> (parameter named in the error, build with the hostile value)
CONSTRUCTORS: dict[str, tuple[str, Callable[[Any], object]]] = {
    "Schedule.fixed": ("delay", Schedule.fixed),
    "Schedule.linear": ("step", Schedule.linear),
    "Schedule.exponential base": ("base", Schedule.exponential),
    "Schedule.exponential factor": ("factor", lambda v: Schedule.exponential(1, factor=v)),
    "Schedule.fibonacci": ("base", Schedule.fibonacci),
    "Schedule.decorrelated cap": ("cap", lambda v: Schedule.decorrelated(0, v)),
    "Schedule.delays item": ("delays", lambda v: Schedule.delays([v])),
    "Schedule.delays": ("delays", Schedule.delays),
    "capped": ("at", lambda v: Schedule.fixed(1).capped(v)),
    "jittered": ("jitter", lambda v: Schedule.fixed(1).jittered(v)),
    "up_to": ("elapsed", lambda v: Schedule.fixed(1).up_to(v)),
    "attempts": ("count", lambda v: Schedule.fixed(1).attempts(v)),
    "worst_case": ("attempt_timeout", lambda v: Schedule.fixed(1).attempts(3).worst_case(v)),
    "RetryBudget ratio": ("ratio", lambda v: RetryBudget(ratio=v)),
    "RetryBudget reserve_per_second": ("reserve_per_second", lambda v: RetryBudget(reserve_per_second=v)),
    "RetryBudget reserve_capacity": ("reserve_capacity", lambda v: RetryBudget(reserve_capacity=v)),
    "RetryBudget earned_capacity": ("earned_capacity", lambda v: RetryBudget(earned_capacity=v)),
    "RetryBudget clock": ("clock", lambda v: RetryBudget(clock=v)),
    "Retrying label": ("label", lambda v: Retrying(Schedule.fixed(0).attempts(2), label=v)),
    "Retrying clock": ("clock", lambda v: Retrying(Schedule.fixed(0).attempts(2), label="x", clock=v)),
    "Retrying budget": ("budget", lambda v: Retrying(Schedule.fixed(0).attempts(2), label="x", budget=v)),
    "Retrying classify": ("classif", lambda v: Retrying(Schedule.fixed(0).attempts(2), label="x", classify=v)),
    "Retrying nesting": ("nesting", lambda v: Retrying(Schedule.fixed(0).attempts(2), label="x", nesting=v)),
    "Retrying schedule": ("schedule", lambda v: Retrying(v, label="x")),
    "retrying attempt_timeout": ("attempt_timeout",
                                 lambda v: retrying(Schedule.fixed(0).attempts(2), label="x", attempt_timeout=v)),
    "retry_sync label": ("label", lambda v: retry_sync(Schedule.fixed(0).attempts(2), lambda: 1, label=v)),
    "retry_after": ("seconds", RetryDecision.retry_after),
}


def _check(name: str, value: object) -> None:
    parameter, build = CONSTRUCTORS[name]
    try:
        built = build(value)
    except (ValueError, TypeError) as error:
        assert parameter in str(error).lower() or "bounded" in str(error).lower() or "schedule" in str(error), (
            f"{name}({value!r}) raised {error!r}, not naming {parameter}")
        return
    # Accepted: it must behave.
    if isinstance(built, Schedule):
        bounded = built.attempts(5) if not built.is_bounded else built
        total = bounded.maximum_total_delay  # type: ignore[attr-defined]
        assert 0 <= total <= MAX_NS / 1e9 and math.isfinite(total)
        assert all(0 <= d <= MAX_NS / 1e9 for d in bounded.maximal_delays(10))
    elif isinstance(built, float):
        assert math.isfinite(built) and built >= 0
    elif isinstance(built, RetryDecision):
        assert built.after is None or 0 < built.after <= MAX_NS / 1e9
    elif isinstance(built, RetryBudget):
        assert built.tokens >= 0


@pytest.mark.parametrize("name", sorted(CONSTRUCTORS))
@settings(max_examples=60, deadline=None, derandomize=True)
@given(value=hostile)
def test_hostile_configuration_is_refused_naming_the_parameter_or_behaves(name: str, value: object) -> None:
    _check(name, value)
