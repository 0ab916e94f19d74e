"""An ``up_to`` judges the jittered delay, the one actually waited, wherever the jitter is written
(docs/retry.md, "An up_to judges the capped delay"; ``Schedule.up_to``: stop once another attempt
*would start* past the limit)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st
from test_schedule_properties import durations, run, seconds, small, trees

from stoic import Schedule

kinds = st.sampled_from(["full", "equal", 0.0, 0.3, 1.0])
fractions = {"full": 1.0, "equal": 0.5}
deterministic = st.one_of(
    small.map(Schedule.fixed),
    small.map(Schedule.linear),
    st.tuples(small, st.sampled_from([1, 1.5, 2, 3])).map(lambda t: Schedule.exponential(t[0], factor=t[1])),
    small.map(Schedule.fibonacci),
    st.lists(small, max_size=8).map(Schedule.delays),
)


def model(raw: list[int], fraction: float, limit: int, rng: random.Random, attempt_ns: list[int]) -> list[int]:
    """The reference: draw the jitter, then go on only if the shortened wait starts the next
    attempt within the limit."""
    elapsed, out = attempt_ns[0], []
    for d in raw:
        waited = d - min(d, int(d * fraction * rng.random())) if d else 0
        if elapsed + waited > limit:
            break
        out.append(waited)
        elapsed += waited + attempt_ns[len(out) % len(attempt_ns)]
    return out


def test_a_jitter_written_after_up_to_does_not_stop_an_attempt_that_would_start_in_time() -> None:
    # fixed(8) jittered: with this seed the second wait is 1.22 s, so the third attempt starts at
    # 8.15 s, within 10 s; judging the unjittered 8 s (6.93 + 8 > 10) stopped it.
    for schedule in (Schedule.fixed(8).up_to(10).jittered(), Schedule.fixed(8).jittered().up_to(10)):
        got = run(schedule, random.Random(1), [0])
        assert got == model([8 * 10**9] * 60, 1.0, 10 * 10**9, random.Random(1), [0])
        assert len(got) == 2 and sum(got) <= 10 * 10**9


@settings(max_examples=300, deadline=None)
@given(deterministic, kinds, seconds, st.integers(0, 2**32), durations)
def test_up_to_then_jitter_against_a_reference_model(schedule: Schedule, kind: str | float, limit: float,
                                                      seed: int, attempt_ns: list[int]) -> None:
    raw = [round(d * 1e9) for d in schedule.maximal_delays(60)]
    want = model(raw, fractions.get(kind, kind), round(limit * 1e9), random.Random(seed), attempt_ns)  # type: ignore[arg-type]
    assert run(schedule.up_to(limit).jittered(kind), random.Random(seed), attempt_ns) == want
    assert run(schedule.jittered(kind).up_to(limit), random.Random(seed), attempt_ns) == want


@settings(max_examples=300, deadline=None)
@given(trees, kinds, seconds, st.integers(0, 2**32), durations)
def test_up_to_and_jitter_step_alike_in_either_order(schedule: Schedule, kind: str | float, limit: float,
                                                     seed: int, attempt_ns: list[int]) -> None:
    assert run(schedule.up_to(limit).jittered(kind), random.Random(seed), attempt_ns) == \
        run(schedule.jittered(kind).up_to(limit), random.Random(seed), attempt_ns)


def test_a_jitter_over_a_combinator_is_what_its_up_to_judges() -> None:
    # The intersection waits the longer delay (8 s jittered); its up_to side judges that wait.
    inter = Schedule.fixed(8).up_to(10).intersection(Schedule.fixed(1)).jittered()
    union = Schedule.fixed(8).up_to(10).union(Schedule.fixed(9).up_to(10)).jittered()
    then = Schedule.fixed(8).up_to(10).attempts(5).and_then(Schedule.fixed(1).attempts(2)).jittered()
    want = model([8 * 10**9] * 60, 1.0, 10 * 10**9, random.Random(1), [0])
    assert run(inter, random.Random(1), [0]) == want
    assert run(union, random.Random(1), [0]) == want  # the 9 s side judges its own, longer wait
    got = run(then, random.Random(1), [0])
    assert got[:2] == want and len(got) == 3  # then the second schedule's one retry
