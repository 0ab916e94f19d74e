"""hedge against a reference simulation over random timelines (seed 000, Testing: "a model over
random timelines: for random durations and outcomes the winner, the first failure, the number of
attempts started and 'nothing running at return' must match a reference simulation").

Durations are odd milliseconds and delays even ones, so an attempt never finishes at the instant
a hedge is due (that tie has no meaningful order). Two attempts finishing at one instant are
taken in start order, which is also the order their timers fire on the VirtualClock.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from _hedge_script import Script, Step
from hypothesis import given, settings
from hypothesis import strategies as st

import stoic
from stoic import IDEMPOTENT, RetryBudget, hedge
from stoic.testing import RecordingSink, VirtualClock

MS = 1_000_000  # ns


class Failed(Exception):
    def __init__(self, number: int) -> None:
        super().__init__(number)
        self.number = number


@dataclass(frozen=True)
class Plan:
    duration_ms: int  # odd
    ok: bool
    linger_ms: int  # how long it keeps running after being cancelled (0: stops at once)


@dataclass(frozen=True)
class Outcome:
    won: bool
    attempt: int  # the winner, or the attempt whose failure is raised
    started: int
    returned_ms: int
    budget_exhausted: bool


def simulate(plans: list[Plan], delay_ms: int, max_attempts: int, tokens: int) -> Outcome:
    """The reference: hedge's rules written as a plain event loop over integer milliseconds."""
    starts = {1: 0}
    running = {1}
    next_hedge: int | None = delay_ms
    first_failure: int | None = None
    exhausted = False
    while True:
        finish, number = min((starts[n] + plans[n - 1].duration_ms, n) for n in running)
        if next_hedge is not None and next_hedge < finish:
            now = next_hedge
            if tokens == 0:
                exhausted, next_hedge = True, None
                continue
            tokens -= 1
            new = len(starts) + 1
            starts[new] = now
            running.add(new)
            next_hedge = now + delay_ms if new < max_attempts else None
            continue
        running.discard(number)
        if plans[number - 1].ok:
            # Losers are cancelled now and awaited: the call returns when the last one stops.
            end = max([finish] + [finish + plans[n - 1].linger_ms for n in running])
            return Outcome(True, number, len(starts), end, exhausted)
        if first_failure is None:
            first_failure = number
        if not running:
            return Outcome(False, first_failure, len(starts), finish, exhausted)


plans_strategy = st.lists(
    st.builds(
        Plan,
        duration_ms=st.integers(0, 120).map(lambda k: 2 * k + 1),
        ok=st.booleans(),
        linger_ms=st.one_of(st.just(0), st.integers(0, 40).map(lambda k: 2 * k + 1)),
    ),
    min_size=4,
    max_size=4,
)


async def run_real(plans: list[Plan], delay_ms: int, max_attempts: int, tokens: int,
                   sink: RecordingSink) -> tuple[Outcome, set[int], Script]:
    clock = VirtualClock()
    steps = {
        n: Step(p.duration_ms / 1000, value=n, error=None if p.ok else Failed(n), linger=p.linger_ms / 1000)
        for n, p in enumerate(plans, start=1)
    }
    script = Script(clock, steps)
    budget = RetryBudget(ratio=0.001, reserve_per_second=0, reserve_capacity=tokens, clock=clock)

    async def observed() -> tuple[bool, int, int, set[int]]:
        try:
            value = await hedge(IDEMPOTENT, script, delay=delay_ms / 1000, max_attempts=max_attempts,
                                budget=budget, clock=clock, label="h")
            won, attempt = True, int(value)  # type: ignore[call-overload]
        except Failed as exc:
            won, attempt = False, exc.number
        return won, attempt, clock.now_ns(), set(script.running)

    with stoic.use_sinks(sink):
        won, attempt, at_ns, running = await clock.run(observed())
    outcome = Outcome(won, attempt, len(script.started()), at_ns // MS,
                      "hedge.budget_exhausted" in sink.names)
    assert at_ns % MS == 0
    return outcome, running, script


@settings(max_examples=300, deadline=None)
@given(
    plans=plans_strategy,
    delay_ms=st.integers(1, 60).map(lambda k: 2 * k),
    max_attempts=st.integers(2, 4),
    tokens=st.integers(0, 3),
)
def test_hedge_matches_the_reference_simulation(plans: list[Plan], delay_ms: int, max_attempts: int,
                                                tokens: int) -> None:
    sink = RecordingSink()
    real, running, script = asyncio.run(run_real(plans, delay_ms, max_attempts, tokens, sink))
    expected = simulate(plans, delay_ms, max_attempts, tokens)
    assert real == expected
    assert running == set()  # nothing of the call still running at return
    assert script.started() == list(range(1, expected.started + 1))
    # Every attempt still running at the decision, and only those, was cancelled as superseded.
    if expected.won:
        assert all(message == "superseded" for message in script.cancel_messages.values())
    else:
        assert script.cancel_messages == {}
    # The events tell the same story.
    sink.assert_contract()
    names = sink.names
    assert names.count("hedge.started") == expected.started - 1
    assert names.count("hedge.won") == (1 if expected.won and expected.started > 1 else 0)
    assert names.count("hedge.all_failed") == (1 if not expected.won and expected.started > 1 else 0)
    failures = [e.attributes["attempt"] for e in sink.of("hedge.attempt_failed")]
    if not expected.won:
        assert failures[0] == expected.attempt
        assert sorted(failures) == list(range(1, expected.started + 1))


@settings(max_examples=200, deadline=None)
@given(
    plans=plans_strategy,
    delay_ms=st.integers(1, 60).map(lambda k: 2 * k),
    max_attempts=st.integers(2, 4),
    cancel_half_ms=st.integers(0, 400).map(lambda k: 2 * k + 1),  # odd half-milliseconds: no ties
)
def test_cancelling_the_caller_at_any_moment_stops_everything(plans: list[Plan], delay_ms: int, max_attempts: int,
                                                             cancel_half_ms: int) -> None:
    """Cancelled before the reference decides: CancelledError, and nothing left running once
    the call has ended. Cancelled after: the reference's outcome, unchanged."""
    # Lingering is left out here: a loser's linger would be cut short by the second cancellation.
    plans = [Plan(p.duration_ms, p.ok, 0) for p in plans]
    expected = simulate(plans, delay_ms, max_attempts, tokens=3)
    cancel_ns = cancel_half_ms * MS // 2

    async def scenario() -> tuple[str, set[int], int]:
        clock = VirtualClock()
        steps = {n: Step(p.duration_ms / 1000, value=n, error=None if p.ok else Failed(n))
                 for n, p in enumerate(plans, start=1)}
        script = Script(clock, steps)
        budget = RetryBudget(ratio=0.001, reserve_per_second=0, reserve_capacity=3, clock=clock)
        outer = asyncio.ensure_future(hedge(IDEMPOTENT, script, delay=delay_ms / 1000, max_attempts=max_attempts,
                                            budget=budget, clock=clock, label="h"))
        await clock.advance(cancel_ns / 1e9)
        outer.cancel()
        await clock.run_until_idle()
        await asyncio.sleep(0)
        assert outer.done()
        if outer.cancelled():
            kind = "cancelled"
        elif outer.exception() is not None:
            kind = f"failed {outer.exception().number}"  # type: ignore[union-attr]
        else:
            kind = f"won {outer.result()}"
        return kind, set(script.running), clock.pending_timers

    kind, running, timers = asyncio.run(scenario())
    if cancel_ns < expected.returned_ms * MS:
        assert kind == "cancelled"
    else:
        assert kind == (f"won {expected.attempt}" if expected.won else f"failed {expected.attempt}")
    assert running == set()
    assert timers == 0
