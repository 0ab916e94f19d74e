"""maximum_total_delay and worst_case in closed form (issue 9, "What a hostile caller found"):
exactly the stepping result on small schedules, at once on huge attempt counts."""

from __future__ import annotations

import sys

from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_schedule_properties import trees

from stoic import BoundedSchedule, Schedule
from stoic.schedule import MAX_NS, _has_up_to, _prefix_bound, _top_limit

bounded_trees = st.tuples(trees, st.integers(1, 40)).map(lambda t: t[0].attempts(t[1]))


def stepped_total_ns(schedule: BoundedSchedule) -> int:
    """The reference model: the stepping algorithm maximum_total_delay used before (linear in
    the attempt count), kept here to check the closed form against."""
    retries = schedule.maximum_attempts - 1
    node = schedule._node
    if not _has_up_to(node):
        return min(MAX_NS, sum(schedule._delays_ns(None, retries)))
    total = 0
    limit = _top_limit(node)
    for i in range(1, retries + 1):
        total += _prefix_bound(node, i)
        if limit is not None and total >= limit:
            total = limit
            break
    return min(MAX_NS, total)


@settings(max_examples=600, deadline=None, derandomize=True)
@given(st.one_of(bounded_trees, trees.filter(lambda s: s.is_bounded)))
@example(Schedule.linear(1).union(Schedule.fixed(3.5)).attempts(12))
@example(Schedule.fixed(5).intersection(Schedule.linear(2)).attempts(9))
@example(Schedule.delays([1, 9, 2]).and_then(Schedule.exponential(1, 3).capped(20)).attempts(15))
@example(Schedule.exponential(0.5).up_to(30).attempts(25))
@example(Schedule.linear(2).up_to(7).union(Schedule.fixed(1).attempts(3)).attempts(10))
def test_maximum_total_delay_equals_stepping_through_every_attempt(schedule: Schedule) -> None:
    assert isinstance(schedule, BoundedSchedule)
    assert schedule._total_delay_ns() == stepped_total_ns(schedule)


def test_maximum_total_delay_of_a_billion_attempts_returns_at_once() -> None:
    # Exact: 30 s of up_to, reached long before the billionth attempt.
    assert Schedule.exponential(0.1).up_to(30).attempts(10**9).maximum_total_delay == 30.0
    assert Schedule.fixed(0).up_to(30).attempts(10**9).maximum_total_delay == 0.0
    huge = Schedule.exponential(1).attempts(sys.maxsize)
    # 9 delays below the 300 s cap (1+2+...+256 = 511 s), the rest at the cap, saturating at MAX_NS.
    assert huge.maximum_total_delay == MAX_NS / 1e9
    assert Schedule.fixed(1).attempts(10**9).maximum_total_delay == 10**9 - 1
    assert Schedule.linear(1).attempts(10**4).maximum_total_delay == (10**4 - 1) * 10**4 / 2
    assert Schedule.linear(1).attempts(10**9).maximum_total_delay == MAX_NS / 1e9  # saturates


def test_worst_case_of_a_huge_schedule_returns_at_once_and_saturates() -> None:
    assert Schedule.fixed(1).attempts(10**9).worst_case(2) == 2 * 10**9 + 10**9 - 1
    assert Schedule.exponential(1).attempts(sys.maxsize).worst_case(1) == MAX_NS / 1e9
    small = Schedule.delays([1, 2, 4])
    assert small.worst_case(0.5) == 4 * 0.5 + 7


@settings(max_examples=200, deadline=None, derandomize=True)
@given(bounded_trees, st.integers(1, 5))
def test_worst_case_is_attempts_times_timeout_plus_the_total_delay(schedule: BoundedSchedule, timeout: int) -> None:
    # Or, under an up_to limit governing the whole schedule, that limit plus one attempt when it
    # is less: no attempt starts past the limit (tests/test_schedule_worst_case.py runs it).
    expected = schedule.maximum_attempts * timeout * 10**9 + stepped_total_ns(schedule)
    limit = _top_limit(schedule._node)
    if limit is not None:
        expected = min(expected, limit + timeout * 10**9)
    assert schedule.worst_case(timeout) == min(MAX_NS, expected) / 1e9
