"""worst_case under an elapsed-time limit: no attempt starts past up_to's limit."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_schedule_totals import bounded_trees

import stoic
from stoic import BoundedSchedule, DeadlineExceeded, RetryBudget, Schedule, retry
from stoic.schedule import _top_limit
from stoic.testing import VirtualClock, hang, seeded


def test_an_up_to_limit_bounds_the_worst_case_by_the_limit_plus_one_attempt() -> None:
    # No attempt starts more than the limit after the first began, so the call ends by then
    # plus one attempt's timeout; the attempt count alone said 10 x 1 + 2.5.
    assert Schedule.fixed(1).up_to(2.5).attempts(10).worst_case(1) == 3.5
    assert Schedule.fixed(0).up_to(2.0).attempts(1000).worst_case(0.5) == 2.5
    assert Schedule.exponential(0.1).jittered().up_to(5).attempts(50).worst_case(2) == 7.0
    # Where the count is the tighter bound, it stays.
    assert Schedule.fixed(2).up_to(100).attempts(3).worst_case(1) == 3 + 4
    # A limit on one side of a union does not stop the other side: no tightening there.
    either = Schedule.fixed(1).up_to(2).attempts(5).union(Schedule.fixed(1).attempts(5))
    assert either.worst_case(1) == 5 * 1 + 4


@pytest.mark.parametrize("delay", [0.0, 0.25, 0.5, 1.0])
async def test_an_outer_timeout_sized_by_worst_case_under_up_to_never_fires_first(
    clock: VirtualClock, delay: float,
) -> None:
    schedule = Schedule.fixed(delay).up_to(2.5).attempts(10)
    op = hang()

    async def call() -> None:
        async with stoic.timeout(schedule.worst_case(1) + 0.001):
            await retry(schedule, op, attempt_timeout=1, budget=RetryBudget.UNLIMITED, label="op")

    with pytest.raises(DeadlineExceeded):
        await clock.run(call())
    assert clock.now() <= schedule.worst_case(1)  # the retry's last attempt timed out, not the watchdog
    assert op.calls >= 2


@settings(max_examples=150, deadline=None, derandomize=True)
@given(bounded_trees.filter(lambda s: _top_limit(s._node) is not None), st.sampled_from([0.001, 0.3, 1.0, 7.0]))
def test_a_retry_never_outlasts_its_schedules_worst_case(schedule: BoundedSchedule, timeout: float) -> None:
    # Run on virtual time with every attempt hanging until its timeout: the call ends within
    # worst_case, the tightened bound included.
    async def main() -> float:
        clock = VirtualClock()
        with stoic.use_clock(clock), seeded(7):
            with pytest.raises(DeadlineExceeded):
                await clock.run(retry(schedule, hang(), attempt_timeout=timeout, budget=RetryBudget.UNLIMITED,
                                      label="op"))
            return clock.now_ns()

    assert asyncio.run(main()) <= round(schedule.worst_case(timeout) * 1e9) + 1
