"""Schedules as values: equal schedules print alike and step alike; refusals name the parameter
(seed 001, "Schedules are data"; docs/retry.md, "Validation")."""

from __future__ import annotations

import datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_schedule_properties import run

from stoic import Schedule


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 12), st.integers(1, 10**6), st.integers(1, 60))
def test_an_integral_float_factor_is_the_same_schedule_as_the_int(factor: int, base_ns: int, n: int) -> None:
    as_int = Schedule.exponential(base_ns / 1e9, factor=factor).capped(10**9).attempts(n)
    as_float = Schedule.exponential(base_ns / 1e9, factor=float(factor)).capped(10**9).attempts(n)
    assert as_int == as_float and hash(as_int) == hash(as_float)
    assert repr(as_int) == repr(as_float)  # equal values print alike
    assert as_int.maximal_delays() == as_float.maximal_delays()
    assert run(as_int, None, [0]) == run(as_float, None, [0])
    assert as_int.maximum_total_delay == as_float.maximum_total_delay


def test_factor_three_and_three_point_zero_step_alike_at_nanosecond_precision() -> None:
    # 3.0**34 is exact but 3.0**35 is not: the float power drifted from the int one at attempt 35.
    as_int = Schedule.exponential(1e-9, factor=3).capped(10**9).attempts(40)
    as_float = Schedule.exponential(1e-9, factor=3.0).capped(10**9).attempts(40)
    assert repr(as_float) == "Schedule.exponential(1e-09, factor=3).capped(1000000000).attempts(40)"
    assert as_float.maximal_delays()[35] == 3**35 / 1e9
    assert as_float.maximal_delays() == as_int.maximal_delays()


@pytest.mark.parametrize("duration", [
    datetime.timedelta(days=100, microseconds=3),  # a float of its seconds reads back 1 ns short
    datetime.timedelta(days=1000, microseconds=123457),  # a float of its seconds is 8 ns off
    datetime.timedelta(days=100_000, seconds=7, microseconds=999_999),
])
def test_a_timedelta_beyond_a_floats_nanoseconds_prints_as_the_timedelta(duration: datetime.timedelta) -> None:
    # The float nearest a long timedelta's seconds need not read back as its nanoseconds (past
    # 2**53 ns, about 104 days, no float holds every microsecond): the repr would rebuild a
    # schedule some ns away. It prints the timedelta itself (datetime's own repr) instead.
    for schedule in [Schedule.fixed(duration), Schedule.linear(duration).capped(duration),
                     Schedule.exponential(1).up_to(duration), Schedule.delays([duration, 0.5]),
                     Schedule.decorrelated(duration, duration)]:
        text = repr(schedule)
        assert "datetime.timedelta(" in text
        rebuilt = eval(text, {"Schedule": Schedule, "datetime": datetime})
        assert rebuilt == schedule and hash(rebuilt) == hash(schedule)


@pytest.mark.parametrize("value", [0.1, 9072000.5, 86400000.123456, 3.5e11, 1e12,
                                   datetime.timedelta(days=103, microseconds=1)])
def test_a_duration_a_float_holds_still_prints_as_the_float(value: float | datetime.timedelta) -> None:
    schedule = Schedule.fixed(value)
    assert "timedelta" not in repr(schedule)
    assert eval(repr(schedule), {"Schedule": Schedule}) == schedule


@pytest.mark.parametrize("factor", [1, 2, 3, 10, 2**53, 2**60, 10**300])
def test_equal_factors_make_equal_schedules_that_print_alike(factor: int) -> None:
    as_int, as_float = Schedule.exponential(1, factor=factor), Schedule.exponential(1, factor=float(factor))
    if float(factor) == factor:
        assert as_int == as_float and repr(as_int) == repr(as_float)
        assert eval(repr(as_float), {"Schedule": Schedule}) == as_float
    assert len(repr(as_float)) < 60


@pytest.mark.parametrize(("digits", "sign"), [(400, 1), (5000, 1), (5000, -1)])
def test_a_huge_int_factor_is_refused_naming_factor_and_its_range(digits: int, sign: int) -> None:
    # repr() of an int past 4,300 digits raises its own ValueError, naming neither.
    with pytest.raises(ValueError, match=r"^factor must be a finite number >= 1, got ") as caught:
        Schedule.exponential(1, factor=sign * 10**digits)
    assert len(str(caught.value)) < 100


@pytest.mark.parametrize("method", ["union", "intersection", "and_then"])
@pytest.mark.parametrize("start", [Schedule.fixed(1), Schedule.fixed(1).attempts(3)])
def test_a_combinator_given_no_schedule_names_other(method: str, start: Schedule) -> None:
    with pytest.raises(TypeError, match=r"^other must be a Schedule \(or BoundedSchedule\), got int$"):
        getattr(start, method)(3)


def test_a_negative_zero_jitter_is_the_zero_jitter_and_prints_so() -> None:
    zero = Schedule.fixed(1).jittered(0.0)
    assert Schedule.fixed(1).jittered(-0.0) == zero
    assert repr(Schedule.fixed(1).jittered(-0.0)) == repr(zero) == "Schedule.fixed(1).jittered(0.0)"
