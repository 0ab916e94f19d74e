"""Schedules under a hostile review: composition laws the docs state, checked against models."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_schedule_properties import durations, run, seconds, small, trees

from stoic import Schedule, retry
from stoic.testing import VirtualClock, fail_times

Pair = tuple[Schedule, Schedule]

# The same schedule written twice, once with jitter wherever the strategy puts one and once
# without: jitter only ever shortens, so at its longest (maximal mode) the two must step alike.
pair_leaves = st.one_of(
    small.map(Schedule.fixed),
    small.map(Schedule.linear),
    st.tuples(small, st.sampled_from([1, 1.5, 2, 3])).map(lambda t: Schedule.exponential(t[0], factor=t[1])),
    small.map(Schedule.fibonacci),
    st.lists(small, max_size=5).map(Schedule.delays),
).map(lambda s: (s, s))


limits = st.one_of(small, seconds)  # short caps and limits too, so that they bind within a run


def _pair_extend(children: st.SearchStrategy[Pair]) -> st.SearchStrategy[Pair]:
    return st.one_of(
        st.tuples(children, limits).map(lambda t: (t[0][0].capped(t[1]), t[0][1].capped(t[1]))),
        st.tuples(children, st.sampled_from(["full", "equal", 0.0, 0.3])).map(
            lambda t: (t[0][0].jittered(t[1]), t[0][1])),
        st.tuples(children, limits).map(lambda t: (t[0][0].up_to(t[1]), t[0][1].up_to(t[1]))),
        st.tuples(children, children).map(lambda t: (t[0][0].union(t[1][0]), t[0][1].union(t[1][1]))),
        st.tuples(children, children).map(lambda t: (t[0][0].intersection(t[1][0]), t[0][1].intersection(t[1][1]))),
        st.tuples(children, children).map(lambda t: (t[0][0].and_then(t[1][0]), t[0][1].and_then(t[1][1]))),
        st.tuples(children, st.integers(1, 12)).map(lambda t: (t[0][0].attempts(t[1]), t[0][1].attempts(t[1]))),
    )


pairs = st.recursive(pair_leaves, _pair_extend, max_leaves=6)


class TestCapAndUpTo:
    def test_an_up_to_judges_the_capped_delay_whichever_order_they_are_written_in(self) -> None:
        # "Also stop once another attempt would start more than 30 s after the first began": with
        # a 5 s cap written after it, attempts go on until 27 s, not until the uncapped 32 s
        # exponential step would overshoot at 17 s.
        written = Schedule.exponential(1).up_to(30).capped(5).attempts(100)
        assert written == Schedule.exponential(1).capped(5).up_to(30).attempts(100)
        assert written.maximal_delays() == [1, 2, 4, 5, 5, 5, 5]
        # Jitter only ever shortens: at its longest it is the same schedule.
        jittered = Schedule.exponential(1).jittered().up_to(30).capped(5).attempts(100)
        assert jittered.maximal_delays() == written.maximal_delays()
        assert Schedule.fixed(5).up_to(7).attempts(3).capped(1).maximal_delays() == [1, 1]
        assert Schedule.fixed(5).up_to(7).union(Schedule.fixed(9).attempts(2)).capped(1).maximal_delays(9) == [1] * 7

    async def test_retry_keeps_going_until_the_limit_under_a_later_cap(self, clock: VirtualClock) -> None:
        op = fail_times(100, ConnectionError)
        with pytest.raises(ConnectionError):
            await clock.run(retry(Schedule.exponential(1).up_to(30).capped(5).attempts(100), op, label="op"))
        assert op.started_at == [0, 1, 3, 7, 12, 17, 22, 27]

    @settings(max_examples=400, deadline=None)
    @given(pairs, durations)
    @example((Schedule.fixed(5).jittered().up_to(7).capped(1), Schedule.fixed(5).up_to(7).capped(1)), [0])
    @example((Schedule.exponential(1).jittered().up_to(30).attempts(50).capped(5),
              Schedule.exponential(1).up_to(30).attempts(50).capped(5)), [0, 10**9])
    def test_jitter_at_its_longest_steps_as_the_schedule_without_it(self, pair: Pair, attempt_ns: list[int]) -> None:
        with_jitter, without = pair
        assert run(with_jitter, None, attempt_ns) == run(without, None, attempt_ns)
        assert with_jitter.maximal_delays(40) == without.maximal_delays(40)
        assert with_jitter.is_bounded == without.is_bounded


class TestIntersectionAndUpTo:
    def test_an_intersection_never_waits_past_a_limit_of_either_side(self) -> None:
        # The left side's up_to judged its own 2 s step at 25 s (27 <= 30); the intersection then
        # waits the longer 25 s and would start an attempt at 50 s, past the limit no attempt may
        # start after. "Go on while both go on": at that wait the left side does not go on.
        schedule = Schedule.exponential(1).up_to(30).intersection(Schedule.fixed(25)).attempts(5)
        assert schedule.maximal_delays() == [25]
        assert Schedule.fixed(25).intersection(Schedule.exponential(1).up_to(30)).attempts(5).maximal_delays() == [25]
        # Within the limit nothing changes.
        assert Schedule.fixed(1).up_to(30).intersection(Schedule.fixed(10)).attempts(9).maximal_delays() == [10] * 3

    async def test_retry_starts_no_attempt_past_the_limit_of_an_intersection_side(self, clock: VirtualClock) -> None:
        op = fail_times(10, ConnectionError)
        with pytest.raises(ConnectionError):
            await clock.run(retry(Schedule.exponential(1).up_to(30).intersection(Schedule.fixed(25)).attempts(5),
                                  op, label="op"))
        assert op.started_at == [0, 25]

    @settings(max_examples=300, deadline=None)
    @given(trees, durations)
    def test_no_attempt_starts_past_the_limit_of_an_up_to_under_an_intersection(
            self, schedule: Schedule, attempt_ns: list[int]) -> None:
        # Every delay an up_to (limit L) under any intersection judged must keep the next start
        # within L of the first attempt: check with the up_to as one side of an intersection.
        limited = schedule.up_to(30).intersection(Schedule.fixed(20))
        elapsed = attempt_ns[0]
        for i, d in enumerate(run(limited, None, attempt_ns)):
            assert elapsed + d <= 30 * 10**9
            elapsed += d + attempt_ns[(i + 1) % len(attempt_ns)]

    def test_the_total_delay_of_an_intersection_is_within_a_sides_limit(self) -> None:
        # No attempt starts past either side's limit, so neither does the sum of the waits: the
        # bound a caller sizes a watchdog from is the 30 s limit, not four 25 s waits.
        schedule = Schedule.exponential(1).up_to(30).intersection(Schedule.fixed(25)).attempts(5)
        assert schedule.maximum_total_delay == 30
        assert schedule.worst_case(1) == 30 + 1  # and no attempt starts past it: one more attempt at most
        both = Schedule.fixed(3).up_to(40).intersection(Schedule.fixed(2).up_to(10)).attempts(100)
        assert both.maximum_total_delay == 10
        assert Schedule.fixed(1).up_to(100).intersection(Schedule.fixed(25)).attempts(9).maximum_total_delay == 100
