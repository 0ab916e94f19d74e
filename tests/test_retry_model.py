"""retry against a reference model of seed 001's order of checks, over random timelines.

Random inputs: a list of delays (the schedule), what each attempt does (succeed, fail
transiently, fail permanently, fail with a Retry-After) and how long it takes, an ambient
deadline or none, and a budget of k tokens. The model walks the six checks by hand; retry on the
virtual clock must make the same calls at the same instants, emit the same events and end the
same way at the same time.
"""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

import stoic
from stoic import RetryBudget, RetryDecision, Schedule, retry
from stoic.testing import RecordingSink, VirtualClock, reset_budgets

ms = st.integers(0, 3000)
outcome = st.one_of(
    st.just(("ok", 0)), st.just(("transient", 0)), st.just(("stop", 0)),
    st.integers(0, 400_000).map(lambda x: ("after", x)),
)


class Transient(Exception):
    pass


class Permanent(Exception):
    retry_decision = RetryDecision.STOP


class Later(Exception):
    def __init__(self, after_ms: int) -> None:
        super().__init__(after_ms)
        self.retry_decision = RetryDecision.retry_after(after_ms / 1000)


def model(delays: list[int], steps: list[tuple[tuple[str, int], int]], deadline: int | None,
          tokens: int) -> tuple[str, list[str], list[int], int]:
    """(how it ended, event names, attempt start times, end time), all times in ms."""
    t, events, starts = 0, [], []
    for i, ((kind, after), duration) in enumerate(steps, start=1):
        starts.append(t)
        if deadline is not None and t + duration >= deadline:
            # The attempt is cut by the deadline: the deadline's error ends everything.
            return "deadline", events, starts, deadline
        t += duration
        if kind == "ok":
            if i > 1:
                events.append("retry.succeeded")
            return "ok", events, starts, t
        if kind == "stop":
            events.append("retry.permanent")
            return "Permanent", events, starts, t
        if i - 1 >= len(delays):
            events.append("retry.exhausted")
            return kind, events, starts, t
        delay = delays[i - 1]
        if kind == "after" and after > 0:  # a zero wait means "on the schedule" (field report 19)
            if after > 300_000:
                events.append("retry.after_capped")
            delay = min(after, 300_000)
        if deadline is not None and delay + duration >= deadline - t:
            events.append("retry.deadline_skip")
            return kind, events, starts, t
        if tokens == 0:
            events.append("retry.budget_exhausted")
            return kind, events, starts, t
        tokens -= 1
        events.append("retry.attempt_failed")
        t += delay
    raise AssertionError("more attempts than steps")


async def run(delays: list[int], steps: list[tuple[tuple[str, int], int]], deadline: int | None,
              tokens: int) -> tuple[str, list[str], list[int], int]:
    reset_budgets()
    clock = VirtualClock()
    sink = RecordingSink()
    starts: list[int] = []
    with stoic.use_clock(clock), stoic.use_sinks(sink):
        budget = RetryBudget(ratio=0.1, reserve_per_second=0, reserve_capacity=tokens)

        async def op() -> str:
            (kind, after), duration = steps[len(starts)]
            starts.append(clock.now_ns() // 1_000_000)
            await clock.sleep_until(clock.now_ns() + duration * 1_000_000)
            if kind == "transient":
                raise Transient
            if kind == "stop":
                raise Permanent
            if kind == "after":
                raise Later(after)
            return "ok"

        async def call() -> str:
            schedule = Schedule.delays([d / 1000 for d in delays])
            if deadline is None:
                return await retry(schedule, op, budget=budget, label="op")
            async with stoic.timeout(deadline / 1000):
                return await retry(schedule, op, budget=budget, label="op")

        try:
            ended = await clock.run(call())
        except stoic.DeadlineExceeded:
            ended = "deadline"
        except (Transient, Later) as error:
            ended = {Transient: "transient", Later: "after"}[type(error)]
        except Permanent:
            ended = "Permanent"
        sink.assert_contract()
        return ended, sink.names, starts, clock.now_ns() // 1_000_000


@settings(max_examples=300, deadline=None)
@given(st.lists(ms, max_size=6), st.lists(st.tuples(outcome, ms), min_size=7, max_size=7),
       st.one_of(st.none(), st.integers(1, 20_000)), st.integers(0, 4))
def test_retry_follows_the_reference_model(delays: list[int], steps: list[tuple[tuple[str, int], int]],
                                           deadline: int | None, tokens: int) -> None:
    assert asyncio.run(run(delays, steps, deadline, tokens)) == model(delays, steps, deadline, tokens)
