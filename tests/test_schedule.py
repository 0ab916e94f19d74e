"""Schedules as data: bases, refinements, bounds, repr/equality, validation (seed 001)."""

from __future__ import annotations

import pickle
import random
from datetime import timedelta

import pytest

from stoic import BoundedSchedule, Schedule
from stoic.schedule import MAX_NS


def delays(schedule: Schedule, n: int, seed: int | None = None) -> list[float]:
    rng = None if seed is None else random.Random(seed)
    return [d / 1e9 for d in schedule._delays_ns(rng, n)]


class TestBases:
    def test_fixed(self) -> None:
        assert Schedule.fixed(0.5).maximal_delays(4) == [0.5] * 4

    def test_linear(self) -> None:
        assert Schedule.linear(0.5).maximal_delays(4) == [0.5, 1.0, 1.5, 2.0]

    def test_exponential_doubles_up_to_its_default_five_minute_cap(self) -> None:
        got = Schedule.exponential(1).maximal_delays(12)
        assert got == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]

    def test_exponential_factor(self) -> None:
        assert Schedule.exponential(0.1, factor=3).maximal_delays(4) == pytest.approx([0.1, 0.3, 0.9, 2.7])
        assert Schedule.exponential(1.0, factor=1.5).maximal_delays(3) == [1.0, 1.5, 2.25]

    def test_fibonacci_with_default_cap(self) -> None:
        assert Schedule.fibonacci(1).maximal_delays(8) == [1, 1, 2, 3, 5, 8, 13, 21]
        assert Schedule.fibonacci(100).maximal_delays(6)[-1] == 300

    def test_decorrelated_stays_within_base_and_cap(self) -> None:
        got = delays(Schedule.decorrelated(0.1, 2), 500, seed=3)
        assert all(0.1 <= d <= 2 for d in got)
        assert len(set(got)) > 100  # really random
        assert Schedule.decorrelated(1, 20).maximal_delays(4) == [3, 9, 20, 20]

    def test_delays_list_then_stop(self) -> None:
        s = Schedule.delays([0.1, 0.2, timedelta(milliseconds=300)])
        assert isinstance(s, BoundedSchedule)
        assert s.maximal_delays() == [0.1, 0.2, 0.3]
        assert s.maximum_attempts == 4
        assert Schedule.delays([]).maximum_attempts == 1

    def test_zero_base_gives_zero(self) -> None:
        for s in (Schedule.exponential(0), Schedule.fibonacci(0), Schedule.linear(0), Schedule.fixed(0)):
            assert delays(s.jittered(), 50, seed=1) == [0.0] * 50


class TestCapsAndJitter:
    def test_capped_directly_after_a_base_replaces_its_default_cap(self) -> None:
        assert Schedule.exponential(1).capped(600).maximal_delays(12)[-1] == 600
        assert Schedule.fibonacci(1).capped(1000).maximal_delays(20)[-1] == 1000
        assert Schedule.exponential(1).capped(10).maximal_delays(6) == [1, 2, 4, 8, 10, 10]

    def test_a_later_cap_only_lowers(self) -> None:
        s = Schedule.exponential(1).capped(10).capped(600)
        assert s.maximal_delays(8)[-1] == 10
        assert Schedule.fixed(5).capped(2).capped(3).maximal_delays(1) == [2]

    def test_cap_holds_whichever_order_capped_and_jittered_are_written(self) -> None:
        a = Schedule.exponential(1).jittered().capped(10)
        b = Schedule.exponential(1).capped(10).jittered()
        assert a == b
        assert repr(a) == "Schedule.exponential(1).capped(10).jittered()"
        for seed in range(20):
            assert max(delays(a, 40, seed)) <= 10

    def test_jitter_keeps_working_at_the_cap(self) -> None:
        # Field report 7: no lockstep at exactly the cap, and never above it.
        for schedule in (Schedule.exponential(1).capped(10).jittered(),
                         Schedule.exponential(1).jittered().capped(10),
                         Schedule.exponential(1).jittered("equal").capped(10)):
            tail = delays(schedule, 200, seed=7)[10:]
            assert all(0 <= d <= 10 for d in tail)
            assert len(set(tail)) > 150, "delays at the cap must still be spread"
            assert tail.count(10.0) < 5

    def test_jitter_keeps_working_at_a_cap_written_after_attempts_up_to_or_a_combinator(self) -> None:
        # Field report 7, the whole kind: a cap written anywhere after the jitter (past an attempt
        # bound, an elapsed limit or a combinator) must not put every delay at exactly the cap.
        for schedule in (Schedule.exponential(1).jittered().attempts(200).capped(10),
                         Schedule.exponential(1).jittered().up_to(10**6).capped(10).attempts(200),
                         Schedule.exponential(1).jittered().union(Schedule.fixed(100).jittered()).capped(10),
                         Schedule.fixed(1).attempts(3).and_then(Schedule.exponential(1).jittered()).capped(10),
                         Schedule.exponential(1).jittered().intersection(Schedule.fixed(0.5)).capped(10),
                         Schedule.decorrelated(1, 100).capped(10),
                         Schedule.decorrelated(1, 100).attempts(200).capped(10)):
            tail = delays(schedule, 199, seed=7)[20:]
            assert all(0 <= d <= 10 for d in tail), schedule
            assert len(set(tail)) > 150, f"delays at the cap must still be spread: {schedule!r}"
            assert max(schedule.maximal_delays(199)) == 10
        bounded = Schedule.exponential(1).jittered().attempts(5).capped(10)
        assert isinstance(bounded, BoundedSchedule) and bounded.maximum_attempts == 5
        assert bounded == Schedule.exponential(1).capped(10).jittered().attempts(5)
        # A cap past a wrapper still only lowers: it never raises the default five-minute cap.
        assert Schedule.exponential(1).jittered().attempts(20).capped(600).maximal_delays()[-1] == 300

    def test_equal_jitter_keeps_at_least_half(self) -> None:
        got = delays(Schedule.fixed(2).jittered("equal"), 300, seed=11)
        assert all(1 <= d <= 2 for d in got)
        assert min(got) < 1.1 and max(got) > 1.9

    def test_fractional_jitter(self) -> None:
        got = delays(Schedule.fixed(10).jittered(0.2), 300, seed=5)
        assert all(8 <= d <= 10 for d in got)
        assert delays(Schedule.fixed(10).jittered(0), 5, seed=5) == [10.0] * 5


class TestCombinators:
    def test_union_takes_the_shorter_while_either_goes_on(self) -> None:
        s = Schedule.delays([5, 5, 5]).union(Schedule.delays([1, 9]))
        assert s.maximal_delays() == [1, 5, 5]
        assert s.maximum_attempts == 4

    def test_intersection_takes_the_longer_while_both_go_on(self) -> None:
        s = Schedule.fixed(2).intersection(Schedule.delays([1, 9]))
        assert isinstance(s, BoundedSchedule)
        assert s.maximal_delays() == [2, 9]

    def test_and_then_switches_when_the_first_stops(self) -> None:
        s = Schedule.delays([0.1, 0.1]).and_then(Schedule.exponential(1).attempts(3))
        assert s.maximal_delays() == [0.1, 0.1, 1, 2]
        assert s.maximum_attempts == 5

    def test_up_to_stops_before_an_attempt_would_start_after_the_limit(self) -> None:
        s = Schedule.fixed(1).up_to(3)
        assert not s.is_bounded
        assert s.maximal_delays(10) == [1, 1, 1]

    def test_up_to_in_the_first_part_of_and_then_has_its_own_clock(self) -> None:
        s = Schedule.fixed(1).up_to(2).and_then(Schedule.fixed(5).up_to(10))
        assert s.maximal_delays(10) == [1, 1, 5, 5]


class TestBounds:
    def test_attempts_is_the_way_to_bound(self) -> None:
        s = Schedule.exponential(0.2).attempts(3)
        assert isinstance(s, BoundedSchedule)
        assert not isinstance(Schedule.exponential(0.2), BoundedSchedule)
        assert s.maximum_attempts == 3
        assert s.maximal_delays() == [0.2, 0.4]
        assert s.maximum_total_delay == pytest.approx(0.6)

    def test_attempts_of_attempts_takes_the_smaller(self) -> None:
        assert Schedule.fixed(1).attempts(5).attempts(3).maximum_attempts == 3
        assert Schedule.fixed(1).attempts(3).attempts(5).maximum_attempts == 3

    def test_attempts_of_a_shorter_list(self) -> None:
        assert Schedule.delays([1, 2]).attempts(10).maximum_attempts == 3

    def test_worst_case_derives_the_outer_timeout(self) -> None:
        start = Schedule.fixed(0.65).attempts(2)
        assert start.worst_case(2.5) == pytest.approx(5.65)

    def test_worst_case_with_up_to_is_a_safe_bound(self) -> None:
        s = Schedule.exponential(1).up_to(10).and_then(Schedule.fixed(5)).attempts(5)
        # Attempts taking 3 s push the switch earlier: delays 1, 2, 5, 5 = 13 s of waiting.
        assert s.maximum_total_delay >= 13

    def test_one_attempt_has_no_delay(self) -> None:
        s = Schedule.exponential(1).attempts(1)
        assert s.maximal_delays() == []
        assert s.maximum_total_delay == 0
        assert s.worst_case(2) == 2


class TestValueSemantics:
    @pytest.mark.parametrize("schedule", [
        Schedule.exponential(0.2).jittered().attempts(3),
        Schedule.exponential(0.5, factor=1.5).capped(7.5).jittered(0.3).up_to(60).attempts(4),
        Schedule.fibonacci(0.1).capped(3).jittered("equal"),
        Schedule.decorrelated(0.1, 5).union(Schedule.linear(0.3)).intersection(Schedule.fixed(1)),
        Schedule.delays([0.1, 0.25]).and_then(Schedule.fixed(2).attempts(2)),
    ])
    def test_repr_is_the_code_that_builds_it(self, schedule: Schedule) -> None:
        rebuilt = eval(repr(schedule), {"Schedule": Schedule})
        assert rebuilt == schedule
        assert hash(rebuilt) == hash(schedule)
        assert type(rebuilt) is type(schedule)
        assert pickle.loads(pickle.dumps(schedule)) == schedule

    def test_equality_is_structural(self) -> None:
        assert Schedule.exponential(1, factor=2) == Schedule.exponential(1.0)
        assert Schedule.exponential(1) != Schedule.exponential(2)
        assert Schedule.fixed(1).attempts(3) != Schedule.fixed(1).attempts(4)
        assert len({Schedule.fixed(1), Schedule.fixed(1.0), Schedule.fixed(timedelta(seconds=1))}) == 1

    def test_immutable(self) -> None:
        s = Schedule.fixed(1)
        with pytest.raises(AttributeError):
            s._node = None  # type: ignore[misc]


class TestValidation:
    @pytest.mark.parametrize("build, name", [
        (lambda: Schedule.fixed(-1), "delay"),
        (lambda: Schedule.fixed(float("nan")), "delay"),
        (lambda: Schedule.linear(float("inf")), "step"),
        (lambda: Schedule.exponential(-0.1), "base"),
        (lambda: Schedule.exponential(1, factor=0.5), "factor"),
        (lambda: Schedule.exponential(1, factor=float("inf")), "factor"),
        (lambda: Schedule.fibonacci(-2), "base"),
        (lambda: Schedule.decorrelated(2, 1), "cap"),
        (lambda: Schedule.delays([0.1, -0.1]), "delays[1]"),
        (lambda: Schedule.fixed(1).capped(-1), "at"),
        (lambda: Schedule.fixed(1).jittered(1.5), "jitter"),
        (lambda: Schedule.fixed(1).jittered(-0.1), "jitter"),
        (lambda: Schedule.fixed(1).jittered("half"), "jitter"),  # type: ignore[arg-type]
        (lambda: Schedule.fixed(1).up_to(-3), "elapsed"),
        (lambda: Schedule.fixed(1).attempts(0), "count"),
        (lambda: Schedule.fixed(1).attempts(-1), "count"),
        (lambda: Schedule.fixed(1).attempts(2).worst_case(0), "attempt_timeout"),
    ])
    def test_invalid_configuration_names_the_parameter(self, build: object, name: str) -> None:
        with pytest.raises(ValueError, match=rf"{name.replace('[', '.').replace(']', '.')}"):
            build()  # type: ignore[operator]

    def test_attempts_zero_never_means_unlimited(self) -> None:
        # Field report 10.
        with pytest.raises(ValueError, match="count must be >= 1"):
            Schedule.exponential(1).attempts(0)


def test_huge_attempt_numbers_saturate_at_the_cap() -> None:
    # Field report 8: attempts 1 to 1,000,000 are finite, within the cap, never negative, never raise.
    for schedule in (Schedule.exponential(1), Schedule.exponential(1e-9, factor=1.0001).capped(60),
                     Schedule.fibonacci(1), Schedule.exponential(0.5, factor=10).jittered()):
        got = schedule._delays_ns(random.Random(1), 1_000_000)
        assert len(got) == 1_000_000
        assert min(got) >= 0
        assert max(got) <= 300 * 10**9
    linear = Schedule.linear(10**9)._delays_ns(None, 1000)
    assert all(0 <= d <= MAX_NS for d in linear)
    assert Schedule.exponential(0).maximal_delays(1000) == [0.0] * 1000
    big = Schedule.exponential(1).attempts(1_000_000)
    assert big.maximum_total_delay == pytest.approx(511 + 300 * (999_999 - 9))
