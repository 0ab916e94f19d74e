"""Property tests over random schedule trees (seed 001, "Testing")."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from stoic import BoundedSchedule, Schedule
from stoic.schedule import MAX_NS, _max_retries, _prefix_bound

seconds = st.integers(0, 400_000).map(lambda ms: ms / 1000)
small = st.integers(0, 5_000).map(lambda ms: ms / 1000)

leaves = st.one_of(
    small.map(Schedule.fixed),
    small.map(Schedule.linear),
    st.tuples(small, st.sampled_from([1, 1.5, 2, 3, 10])).map(lambda t: Schedule.exponential(t[0], factor=t[1])),
    small.map(Schedule.fibonacci),
    st.tuples(small, seconds).map(lambda t: Schedule.decorrelated(min(t), max(t))),
    st.lists(small, max_size=6).map(Schedule.delays),
)


def _extend(children: st.SearchStrategy[Schedule]) -> st.SearchStrategy[Schedule]:
    return st.one_of(
        st.tuples(children, seconds).map(lambda t: t[0].capped(t[1])),
        st.tuples(children, st.sampled_from(["full", "equal", 0.0, 0.3])).map(lambda t: t[0].jittered(t[1])),
        st.tuples(children, seconds).map(lambda t: t[0].up_to(t[1])),
        st.tuples(children, children).map(lambda t: t[0].union(t[1])),
        st.tuples(children, children).map(lambda t: t[0].intersection(t[1])),
        st.tuples(children, children).map(lambda t: t[0].and_then(t[1])),
        st.tuples(children, st.integers(1, 12)).map(lambda t: t[0].attempts(t[1])),
    )


trees = st.recursive(leaves, _extend, max_leaves=6)
no_up_to = trees.filter(lambda s: "up_to" not in repr(s))
durations = st.lists(st.integers(0, 10**10), min_size=1, max_size=8)


def run(schedule: Schedule, rng: random.Random | None, attempt_ns: list[int], limit: int = 60) -> list[int]:
    """Step ``schedule`` as retry would: each attempt takes the next of ``attempt_ns`` (cycled)."""
    step = schedule._stepper(rng)
    elapsed = attempt_ns[0]
    out: list[int] = []
    while len(out) < limit:
        d = step.next(elapsed)
        if d is None:
            break
        out.append(d)
        elapsed += d + attempt_ns[len(out) % len(attempt_ns)]
    return out


@settings(max_examples=300, deadline=None)
@given(trees, st.integers(0, 2**32), durations)
def test_delays_are_never_negative_and_within_every_bound(schedule: Schedule, seed: int, attempt_ns: list[int]) -> None:
    got = run(schedule, random.Random(seed), attempt_ns)
    for i, d in enumerate(got, start=1):
        assert isinstance(d, int)
        assert 0 <= d <= MAX_NS
        assert d <= _prefix_bound(schedule._node, i)


@settings(max_examples=200, deadline=None)
@given(trees, seconds, st.integers(0, 2**32), durations)
def test_a_cap_holds_in_any_tree_whatever_the_jitter(schedule: Schedule, cap: float, seed: int,
                                                     attempt_ns: list[int]) -> None:
    for capped in (schedule.capped(cap), schedule.capped(cap).jittered(), schedule.jittered().capped(cap)):
        assert all(0 <= d <= round(cap * 1e9) for d in run(capped, random.Random(seed), attempt_ns))


@settings(max_examples=300, deadline=None)
@given(no_up_to, st.integers(0, 2**32), durations)
def test_attempt_bounds_are_exact(schedule: Schedule, seed: int, attempt_ns: list[int]) -> None:
    retries = _max_retries(schedule._node)
    got = run(schedule, random.Random(seed), attempt_ns, limit=200)
    if retries is None:
        assert len(got) == 200
        assert not isinstance(schedule, BoundedSchedule)
    else:
        assert isinstance(schedule, BoundedSchedule)
        assert len(got) == retries == schedule.maximum_attempts - 1


@settings(max_examples=200, deadline=None)
@given(trees, st.integers(0, 2**32), durations)
def test_up_to_only_ever_ends_a_schedule_earlier(schedule: Schedule, seed: int, attempt_ns: list[int]) -> None:
    got = run(schedule, random.Random(seed), attempt_ns, limit=100)
    if isinstance(schedule, BoundedSchedule):
        assert len(got) <= schedule.maximum_attempts - 1


@settings(max_examples=300, deadline=None)
@given(trees, trees, durations)
def test_union_and_intersection_are_commutative(a: Schedule, b: Schedule, attempt_ns: list[int]) -> None:
    # Maximal mode (no randomness) so that the order in which children draw cannot matter.
    assert run(a.union(b), None, attempt_ns) == run(b.union(a), None, attempt_ns)
    assert run(a.intersection(b), None, attempt_ns) == run(b.intersection(a), None, attempt_ns)
    assert a.union(b).is_bounded == b.union(a).is_bounded
    assert a.intersection(b).is_bounded == b.intersection(a).is_bounded


@settings(max_examples=300, deadline=None)
@given(no_up_to, no_up_to)
def test_union_and_intersection_against_a_reference_model(a: Schedule, b: Schedule) -> None:
    da, db = a.maximal_delays(40), b.maximal_delays(40)
    union, inter = [], []
    for i in range(40):
        alive = [d[i] for d in (da, db) if i < len(d)]
        if alive:
            union.append(min(alive))
        if len(alive) == 2:
            inter.append(max(alive))
    assert a.union(b).maximal_delays(40) == union
    assert a.intersection(b).maximal_delays(40) == inter


@settings(max_examples=300, deadline=None)
@given(trees, seconds, seconds, st.integers(0, 2**32), durations)
def test_up_to_is_monotone(schedule: Schedule, x: float, y: float, seed: int, attempt_ns: list[int]) -> None:
    low, high = sorted((x, y))
    shorter = run(schedule.up_to(low), random.Random(seed), attempt_ns)
    longer = run(schedule.up_to(high), random.Random(seed), attempt_ns)
    assert len(shorter) <= len(longer)
    assert longer[: len(shorter)] == shorter


@settings(max_examples=200, deadline=None)
@given(trees, st.integers(1, 10), st.integers(0, 2**32), durations)
def test_the_total_delay_never_exceeds_maximum_total_delay(schedule: Schedule, n: int, seed: int,
                                                           attempt_ns: list[int]) -> None:
    bounded = schedule.attempts(n)
    got = run(bounded, random.Random(seed), attempt_ns)
    assert len(got) <= bounded.maximum_attempts - 1
    assert sum(got) <= bounded._total_delay_ns()
    slowest = max(attempt_ns)
    if slowest > 0:
        # The run's own length: its delays and the attempts it made, each no longer than the
        # slowest (not every attempt taken at the slowest: under up_to, that run stops sooner).
        total = sum(got) + sum(attempt_ns[i % len(attempt_ns)] for i in range(len(got) + 1))
        assert total <= round(bounded.worst_case(slowest / 1e9) * 1e9) + len(got) + 2


@settings(max_examples=100, deadline=None)
@given(trees, st.integers(0, 2**32))
def test_saturating_math_never_traps(schedule: Schedule, seed: int) -> None:
    # A long run with instant attempts: no OverflowError, every delay an int within range.
    got = run(schedule, random.Random(seed), [0], limit=3000)
    assert all(0 <= d <= MAX_NS for d in got)


@settings(max_examples=150, deadline=None)
@given(trees)
def test_repr_round_trips(schedule: Schedule) -> None:
    rebuilt = eval(repr(schedule), {"Schedule": Schedule})
    assert rebuilt == schedule and hash(rebuilt) == hash(schedule)


@settings(max_examples=200, deadline=None)
@given(trees, trees, trees, durations)
def test_union_and_intersection_are_associative(a: Schedule, b: Schedule, c: Schedule, attempt_ns: list[int]) -> None:
    assert run(a.union(b).union(c), None, attempt_ns) == run(a.union(b.union(c)), None, attempt_ns)
    assert run(a.intersection(b).intersection(c), None, attempt_ns) == \
        run(a.intersection(b.intersection(c)), None, attempt_ns)


@settings(max_examples=200, deadline=None)
@given(trees, durations)
def test_union_with_itself_and_intersection_with_itself_change_nothing(a: Schedule, attempt_ns: list[int]) -> None:
    assert run(a.union(a), None, attempt_ns) == run(a, None, attempt_ns)
    assert run(a.intersection(a), None, attempt_ns) == run(a, None, attempt_ns)
