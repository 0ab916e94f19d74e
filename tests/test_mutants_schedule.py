"""Schedule behaviour that mutation testing found unchecked (issue 9, item 5; docs/mutation.md).

Seed 001, "Schedules are data" and "Bounded by type": a cap written after a combinator, jitter
or an attempt bound still holds everywhere (and sits beneath any randomness, field report 7);
``maximum_total_delay`` with ``up_to`` is a safe bound within the limit; delays saturate at
about 292 years; the repr is the code that builds the schedule. Jittered delays are observed
through ``retry_sync`` on a virtual clock with a seeded stream.
"""

from __future__ import annotations

import itertools
import pickle

import pytest

import stoic
from stoic import RetryBudget, Schedule
from stoic.testing import VirtualClock, seeded

MAX_SECONDS = (2**63 - 1) / 1e9


class JumpingClock(VirtualClock):
    def __init__(self) -> None:
        super().__init__(1000.0)

    def sleep_until_blocking(self, when_ns: int) -> None:
        self._set_now(when_ns)


def waits(schedule: Schedule, seed: int = 1) -> list[float]:
    """The delays ``retry_sync`` actually waits with ``schedule`` when every attempt fails at once."""
    clock = JumpingClock()
    starts: list[float] = []

    def op() -> None:
        starts.append(clock.now())
        raise ConnectionError("down")

    with stoic.use_clock(clock), seeded(seed), pytest.raises(ConnectionError):
        stoic.retry_sync(schedule, op, budget=RetryBudget.UNLIMITED, label="waits")  # type: ignore[arg-type]
    return [round(b - a, 9) for a, b in itertools.pairwise(starts)]


# --------------------------------------------------------------------------- caps written anywhere

def test_a_cap_after_a_union_caps_both_sides() -> None:
    schedule = Schedule.exponential(1).union(Schedule.fixed(10)).capped(3).attempts(6)
    assert schedule.maximal_delays() == [1, 2, 3, 3, 3]
    assert schedule.maximum_total_delay == 12


def test_a_cap_after_an_intersection_caps_the_longer_delay() -> None:
    schedule = Schedule.fixed(1).intersection(Schedule.linear(2)).capped(5).attempts(5)
    assert schedule.maximal_delays() == [2, 4, 5, 5]


def test_a_cap_after_and_then_caps_both_phases() -> None:
    schedule = Schedule.delays([4, 8]).and_then(Schedule.fixed(9).attempts(3)).capped(6)
    assert schedule.maximal_delays() == [4, 6, 6, 6]
    assert schedule.maximum_attempts == 5


def test_a_cap_after_attempts_and_up_to_still_holds() -> None:
    assert Schedule.linear(2).attempts(5).capped(5).maximal_delays() == [2, 4, 5, 5]
    assert Schedule.linear(2).up_to(100).attempts(5).capped(5).maximal_delays() == [2, 4, 5, 5]


def test_a_cap_directly_after_an_exponential_replaces_its_default_one() -> None:
    assert Schedule.exponential(100).capped(1000).attempts(6).maximal_delays() == [100, 200, 400, 800, 1000]
    assert Schedule.exponential(100).attempts(6).maximal_delays() == [100, 200, 300, 300, 300]
    assert Schedule.fibonacci(100).capped(600).attempts(8).maximal_delays() == [100, 100, 200, 300, 500, 600, 600]
    assert Schedule.fibonacci(100).attempts(6).maximal_delays() == [100, 100, 200, 300, 300]


def test_a_cap_written_after_a_combinator_only_ever_lowers_the_default_cap() -> None:
    # Past a wrapper the cap no longer replaces the base's five-minute default: it can only lower it.
    schedule = Schedule.exponential(100).union(Schedule.fixed(10_000)).capped(1000).attempts(6)
    assert schedule.maximal_delays() == [100, 200, 300, 300, 300]
    assert Schedule.exponential(100).capped(50).attempts(3).maximal_delays() == [50, 50]


def test_caps_compose_to_the_lowest() -> None:
    assert Schedule.fixed(10).capped(7).capped(8).attempts(3).maximal_delays() == [7, 7]
    assert Schedule.fixed(10).capped(8).capped(7).attempts(3).maximal_delays() == [7, 7]
    assert repr(Schedule.fixed(10).capped(8).capped(7)) == "Schedule.fixed(10).capped(7)"


def test_a_cap_is_pushed_beneath_jitter_wherever_it_is_written() -> None:
    assert repr(Schedule.exponential(1).jittered().capped(2)) == "Schedule.exponential(1).capped(2).jittered()"
    assert repr(Schedule.fixed(5).jittered("equal").attempts(4).capped(2)) == (
        "Schedule.fixed(5).capped(2).jittered(\"equal\").attempts(4)")
    assert repr(Schedule.fixed(5).jittered(0.25).up_to(30).capped(2)) == (
        "Schedule.fixed(5).capped(2).jittered(0.25).up_to(30)")
    assert repr(Schedule.fixed(5).jittered().union(Schedule.fixed(9)).capped(2)) == (
        "Schedule.fixed(5).capped(2).jittered().union(Schedule.fixed(9).capped(2))")
    assert repr(Schedule.fixed(5).jittered().intersection(Schedule.fixed(9)).capped(2)) == (
        "Schedule.fixed(5).capped(2).jittered().intersection(Schedule.fixed(9).capped(2))")
    assert repr(Schedule.fixed(5).jittered().and_then(Schedule.fixed(9)).capped(2)) == (
        "Schedule.fixed(5).capped(2).jittered().and_then(Schedule.fixed(9).capped(2))")
    # Without randomness the cap stays where it is written.
    assert repr(Schedule.fixed(5).union(Schedule.fixed(9)).capped(2)) == (
        "Schedule.fixed(5).union(Schedule.fixed(9)).capped(2)")
    assert repr(Schedule.fixed(5).capped(3).jittered().capped(2)) == "Schedule.fixed(5).capped(2).jittered()"


def test_a_cap_pushed_through_a_random_combinator_only_lowers_a_default_cap_beneath() -> None:
    jittered = Schedule.fixed(5).jittered()
    assert repr(jittered.union(Schedule.exponential(100)).capped(1000)) == (
        "Schedule.fixed(5).capped(1000).jittered().union(Schedule.exponential(100))")
    assert repr(jittered.and_then(Schedule.exponential(100)).capped(1000)) == (
        "Schedule.fixed(5).capped(1000).jittered().and_then(Schedule.exponential(100))")
    assert repr(jittered.intersection(Schedule.fibonacci(100)).capped(1000)) == (
        "Schedule.fixed(5).capped(1000).jittered().intersection(Schedule.fibonacci(100))")
    assert repr(jittered.union(Schedule.exponential(100)).capped(200)) == (
        "Schedule.fixed(5).capped(200).jittered().union(Schedule.exponential(100).capped(200))")


def test_whole_seconds_print_as_integers_however_large() -> None:
    assert repr(Schedule.fixed(10**9)) == "Schedule.fixed(1000000000)"
    assert repr(Schedule.linear(3 * 10**9).attempts(2)) == "Schedule.linear(3000000000).attempts(2)"
    assert repr(Schedule.fixed(0.5)) == "Schedule.fixed(0.5)"


def test_a_cap_below_a_decorrelated_base_is_kept_above_it() -> None:
    assert repr(Schedule.decorrelated(1, 100).capped(10)) == "Schedule.decorrelated(1, 10)"
    assert repr(Schedule.decorrelated(5, 100).capped(2)) == "Schedule.decorrelated(5, 100).capped(2)"
    assert Schedule.decorrelated(5, 100).capped(2).attempts(3).maximal_delays() == [2, 2]
    assert Schedule.decorrelated(1, 100).capped(10).attempts(5).maximal_delays() == [3, 9, 10, 10]


def test_delays_at_a_cap_under_jitter_still_spread_out() -> None:
    delays = waits(Schedule.exponential(1).jittered().capped(2).attempts(12))
    assert len(delays) == 11
    assert all(0 < d <= 2 for d in delays)
    assert len(set(delays[1:])) > 5  # not all at exactly the cap


def test_jitter_only_ever_shortens_by_at_most_its_fraction() -> None:
    for seed in range(5):
        equal = waits(Schedule.fixed(4).jittered("equal").attempts(8), seed)
        assert all(2 <= d <= 4 for d in equal) and len(set(equal)) > 1
        quarter = waits(Schedule.fixed(4).jittered(0.25).attempts(8), seed)
        assert all(3 <= d <= 4 for d in quarter) and len(set(quarter)) > 1
        full = waits(Schedule.fixed(4).jittered().attempts(8), seed)
        assert all(0 <= d <= 4 for d in full) and min(full) < 2
    assert waits(Schedule.fixed(4).jittered(0.0).attempts(4)) == [4, 4, 4]
    assert waits(Schedule.fixed(0).jittered().attempts(3)) == [0, 0]


def test_decorrelated_delays_stay_between_base_and_three_times_the_previous() -> None:
    for seed in range(5):
        delays = waits(Schedule.decorrelated(1, 50).attempts(12), seed)
        previous = 1.0
        for d in delays:
            assert 1 <= d <= min(50, 3 * previous) + 1e-9
            previous = d
        assert len(set(delays)) > 3
    assert Schedule.decorrelated(1, 50).attempts(6).maximal_delays() == [3, 9, 27, 50, 50]


# --------------------------------------------------------------------------- totals with up_to

def test_maximum_total_delay_with_up_to_is_a_bound_within_the_limit() -> None:
    schedule = Schedule.exponential(1).up_to(10).attempts(5)
    assert schedule.maximal_delays() == [1, 2, 4]  # the next, 8 s at 7 s, would start past 10 s
    assert 7 <= schedule.maximum_total_delay <= 10
    fixed = Schedule.fixed(1).up_to(2.5).attempts(10)
    assert fixed.maximal_delays() == [1, 1]
    assert 2 <= fixed.maximum_total_delay <= 2.5


def test_maximum_total_delay_with_an_up_to_that_never_binds_is_exact() -> None:
    assert Schedule.fixed(1).up_to(100).attempts(4).maximum_total_delay == 3
    assert Schedule.linear(1).up_to(100).attempts(4).maximum_total_delay == 6
    assert Schedule.delays([1, 2, 3]).up_to(100).maximum_total_delay == 6
    assert Schedule.exponential(1).capped(3).up_to(100).attempts(5).maximum_total_delay == 9
    assert Schedule.fibonacci(1).up_to(100).attempts(5).maximum_total_delay == 7  # 1 + 1 + 2 + 3


def test_worst_case_adds_every_attempts_timeout_to_the_total_delay() -> None:
    schedule = Schedule.delays([1, 2, 3])
    assert schedule.maximum_attempts == 4
    assert schedule.worst_case(0.5) == 4 * 0.5 + 6
    assert Schedule.fixed(2).up_to(100).attempts(3).worst_case(1) == 3 + 4
    with pytest.raises(ValueError, match="attempt_timeout"):
        schedule.worst_case(-1)


def test_up_to_stops_when_the_next_attempt_would_start_after_the_limit() -> None:
    assert Schedule.fixed(2).up_to(6).attempts(10).maximal_delays() == [2, 2, 2]  # the third starts at 6 exactly
    assert Schedule.fixed(2).up_to(5.999999999).attempts(10).maximal_delays() == [2, 2]
    assert Schedule.fixed(2).up_to(0).attempts(10).maximal_delays() == []


# --------------------------------------------------------------------------- saturation and structure

def test_delays_saturate_at_about_292_years() -> None:
    assert Schedule.linear(10**9).attempts(12).maximal_delays()[-1] == MAX_SECONDS
    assert Schedule.linear(10**9).attempts(12).maximal_delays()[:9] == [10**9 * k for k in range(1, 10)]
    assert Schedule.fixed(10**9).attempts(12).maximum_total_delay == MAX_SECONDS
    huge = Schedule.exponential(10**9).capped(10**12).attempts(5)
    assert huge.maximum_total_delay == MAX_SECONDS


def test_a_zero_base_stays_zero_under_any_cap() -> None:
    assert Schedule.exponential(0).capped(1e-9).attempts(3).maximal_delays() == [0, 0]
    assert Schedule.fibonacci(0).capped(1e-9).attempts(3).maximal_delays() == [0, 0]
    assert Schedule.exponential(1e-9).capped(1e-9).attempts(3).maximal_delays() == [1e-9, 1e-9]


def test_combinators_keep_or_lose_the_bound_as_documented() -> None:
    bounded, unbounded = Schedule.fixed(1).attempts(3), Schedule.fixed(2)
    assert bounded.union(unbounded).is_bounded is False
    assert bounded.intersection(unbounded).maximum_attempts == 3
    assert unbounded.intersection(bounded).maximum_attempts == 3
    assert bounded.and_then(Schedule.delays([5])).maximum_attempts == 4
    assert bounded.union(Schedule.delays([5, 5, 5])).maximum_attempts == 4
    assert bounded.intersection(Schedule.delays([5])).maximum_attempts == 2
    assert bounded.attempts(2).maximum_attempts == 2 and bounded.attempts(9).maximum_attempts == 3
    assert Schedule.fixed(1).up_to(5).is_bounded is False


def test_union_waits_the_shorter_and_goes_on_while_either_does() -> None:
    schedule = Schedule.delays([5, 1]).union(Schedule.delays([2, 3, 4]))
    assert schedule.maximal_delays() == [2, 1, 4]


def test_intersection_waits_the_longer_and_stops_when_either_does() -> None:
    schedule = Schedule.delays([5, 1]).intersection(Schedule.delays([2, 3, 4]))
    assert schedule.maximal_delays() == [5, 3]


def test_and_then_starts_the_second_schedule_with_its_own_elapsed_clock() -> None:
    schedule = Schedule.delays([3, 3]).and_then(Schedule.fixed(1).up_to(2).attempts(10))
    assert schedule.maximal_delays() == [3, 3, 1, 1]  # on the total elapsed time it would stop at once


def test_the_repr_is_the_code_that_builds_the_schedule_and_round_trips() -> None:
    cases = [
        "Schedule.exponential(0.5, factor=3).capped(10).jittered(0.3).up_to(60).attempts(5)",
        "Schedule.fibonacci(2).capped(30).attempts(4)",
        "Schedule.linear(1.5).attempts(3)",
        "Schedule.delays([1, 0.25, 3])",
        "Schedule.fixed(1).union(Schedule.fixed(2)).attempts(3)",
        "Schedule.exponential(1).attempts(2)",
    ]
    for text in cases:
        schedule = eval(text, {"Schedule": Schedule})
        assert repr(schedule) == text
        assert pickle.loads(pickle.dumps(schedule)) == schedule
        assert hash(eval(text, {"Schedule": Schedule})) == hash(schedule)
    assert Schedule.fixed(1) != Schedule.fixed(2) and Schedule.fixed(1) != "Schedule.fixed(1)"


def test_schedules_are_immutable() -> None:
    schedule = Schedule.fixed(1)
    with pytest.raises(AttributeError, match="immutable"):
        schedule._node = None  # type: ignore[misc]


def test_invalid_arguments_are_refused_naming_them() -> None:
    with pytest.raises(ValueError, match="factor"):
        Schedule.exponential(1, factor=0.5)
    with pytest.raises(ValueError, match="factor"):
        Schedule.exponential(1, factor=True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cap"):
        Schedule.decorrelated(2, 1)
    with pytest.raises(ValueError, match="jitter"):
        Schedule.fixed(1).jittered("wide")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="jitter"):
        Schedule.fixed(1).jittered(1.5)
    with pytest.raises(ValueError, match="count"):
        Schedule.fixed(1).attempts(0)
    with pytest.raises(ValueError, match="limit"):
        Schedule.fixed(1).attempts(3).maximal_delays(-1)
    with pytest.raises(TypeError, match="Schedule"):
        Schedule.fixed(1).union(5)  # type: ignore[arg-type]
    assert Schedule.fixed(1).attempts(5).maximal_delays(2) == [1, 1]
    assert Schedule.fixed(1).maximal_delays(3) == [1, 1, 1]


def test_a_zero_delay_draws_no_jitter_so_the_next_delays_are_jittered_as_if_it_were_not_there() -> None:
    for seed in range(3):
        alone = waits(Schedule.delays([4, 4, 4]).jittered(), seed)
        after_zero = waits(Schedule.delays([0, 4, 4, 4]).jittered(), seed)
        assert after_zero[0] == 0
        assert after_zero[1:] == alone
        assert len(set(alone)) > 1  # really jittered


@pytest.mark.parametrize(("low", "high"), [
    (Schedule.fixed(1), Schedule.linear(1)),
    (Schedule.fixed(2), Schedule.exponential(2, factor=1.5).capped(9)),
    (Schedule.delays([3, 3, 3, 3]), Schedule.linear(3)),
])
def test_totals_of_two_schedules_that_start_together_and_then_part(low: Schedule, high: Schedule) -> None:
    """Equal first delays, different growth: a union follows the slower-growing side and an
    intersection the faster, in either order, and the totals are those of the delays stepped."""
    for a, b in ((low, high), (high, low)):
        union, meet = a.union(b).attempts(5), a.intersection(b).attempts(5)
        assert union.maximal_delays() == low.attempts(5).maximal_delays()
        assert meet.maximal_delays() == high.attempts(5).maximal_delays()
        assert union.maximum_total_delay == sum(low.attempts(5).maximal_delays())
        assert meet.maximum_total_delay == sum(high.attempts(5).maximal_delays())


_BASES = [
    Schedule.fixed(0.5), Schedule.fixed(1.5), Schedule.fixed(3.5), Schedule.linear(0.5), Schedule.linear(1),
    Schedule.linear(1.5), Schedule.exponential(1).capped(5), Schedule.delays([3, 1, 4, 1, 5, 9, 2]),
    Schedule.fibonacci(1).capped(6),
]


@pytest.mark.parametrize("combine", ["union", "intersection", "and_then"])
def test_the_closed_form_total_of_two_combined_bases_is_the_sum_of_the_delays_stepped(combine: str) -> None:
    """Every ordered pair of small bases (progressions that cross, meet at an end or part) and
    every short attempt bound: maximum_total_delay is exactly the sum of the stepped delays."""
    for a, b in itertools.product(_BASES, repeat=2):
        for attempts in range(2, 9):
            schedule = getattr(a, combine)(b).attempts(attempts)
            assert schedule.maximum_total_delay == pytest.approx(sum(schedule.maximal_delays()), abs=1e-9), schedule


def test_an_exponential_with_factor_one_totals_its_base_however_many_attempts() -> None:
    # Past the explicit prefix the total must not fall back to the (default, 300 s) cap.
    assert Schedule.exponential(1, factor=1).attempts(200_001).maximum_total_delay == 200_000.0
    assert Schedule.exponential(2, factor=1).capped(10).attempts(10**9).maximum_total_delay == 2 * (10**9 - 1)


@pytest.mark.parametrize("base", [Schedule.fibonacci(1), Schedule.exponential(1)])
def test_a_cap_equal_to_the_default_one_written_past_randomness_changes_nothing(base: Schedule) -> None:
    schedule = base.jittered().attempts(5)
    same = schedule.capped(300)  # the default cap, pushed beneath the jitter: nothing to lower
    assert same == schedule
    assert repr(same) == repr(schedule)
    lower = schedule.capped(299)
    assert lower != schedule
    assert repr(lower) == f"{base!r}.capped(299).jittered().attempts(5)"
