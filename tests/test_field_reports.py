"""Field reports (cases/field-reports.md): failures users hit in other resilience libraries that
stoic must not have, each generalised to the whole kind of fault across every policy it can
touch. Tests that already exist elsewhere (named in docs/field-reports.md) are not repeated;
this module adds what those leave out. Everything time-dependent runs on virtual time.
"""

from __future__ import annotations

import asyncio
import math
import random
import selectors
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

import stoic
from stoic import (
    IDEMPOTENT,
    Attempt,
    BlockingBulkhead,
    BlockingRateLimiter,
    BreakerState,
    Bulkhead,
    BulkheadFull,
    CircuitBreaker,
    CircuitOpen,
    CountWindow,
    DeadlineExceeded,
    Event,
    Hedge,
    OpenDuration,
    Pipeline,
    RateLimited,
    RateLimiter,
    RetryBudget,
    Retrying,
    Schedule,
    TimeWindow,
    retry,
)
from stoic.schedule import DEFAULT_CAP_NS, MAX_NS
from stoic.testing import RecordingSink, VirtualClock, fail_times, fail_with, reset_budgets, seeded, settle


class Boom(Exception):
    """The dependency failed."""


def sleeper(clock: VirtualClock, seconds: float) -> Callable[[], Awaitable[None]]:
    async def pause() -> None:
        await clock.sleep_until(clock.now_ns() + round(seconds * 1e9))

    return pause


# --- 1. A sink that raises changes no decision, in any policy ----------------------------------
class RaisingSink:
    """Raises on every event it is given."""

    level = stoic.Level.DEBUG

    def __init__(self) -> None:
        self.calls = 0

    def emit(self, event: Event) -> None:
        self.calls += 1
        raise RuntimeError("the sink is broken")


Outcome = tuple[str, float]
Scenario = Callable[[VirtualClock], Awaitable[list[Outcome]]]


def _outcome(task: asyncio.Task[Any], at: float) -> Outcome:
    if task.cancelled():
        return ("cancelled", at)
    error = task.exception()
    return (type(error).__name__ if error is not None else f"ok:{task.result()}", at)


async def _gather_timed(clock: VirtualClock, calls: list[Awaitable[Any]], cancel: int | None = None,
                        cancel_at: float = 0.0) -> list[Outcome]:
    """Start ``calls`` in order, optionally cancel one at ``cancel_at``, run to the end; return
    each call's outcome and the virtual instant it ended."""
    finished: dict[int, float] = {}
    tasks: list[asyncio.Task[Any]] = []
    for i, call in enumerate(calls):
        task = asyncio.ensure_future(call)
        task.add_done_callback(lambda _t, i=i: finished.__setitem__(i, clock.now()))
        tasks.append(task)
    await settle()
    if cancel is not None:
        await clock.advance(cancel_at)
        tasks[cancel].cancel()
    await clock.run_until_idle()
    await asyncio.gather(*tasks, return_exceptions=True)
    return [_outcome(t, finished[i]) for i, t in enumerate(tasks)]


async def _breaker_scenario(clock: VirtualClock) -> list[Outcome]:
    breaker = CircuitBreaker(label="b", window=CountWindow(6), minimum_calls=4, failure_rate_threshold=0.5,
                             open_duration=OpenDuration.fixed(2, jitter=0))
    outcomes: list[Outcome] = []
    for failed in (False, True, False, True, True, False, False, False):
        try:
            await breaker.execute(fail_with(Boom()) if failed else sleeper(clock, 0))
            outcomes.append(("ok", clock.now()))
        except Exception as error:
            outcomes.append((type(error).__name__, clock.now()))
    await clock.advance(2)
    outcomes.append((str(await breaker.execute(sleeper(clock, 0))), clock.now()))
    outcomes.append((breaker.state.value, clock.now()))
    return outcomes


async def _limiter_scenario(clock: VirtualClock) -> list[Outcome]:
    limiter = RateLimiter(2, per=1.0, queue_limit=3, label="l")
    return await _gather_timed(clock, [limiter.acquire(p) for p in (1, 1, 1, 2, 1, 1, 3)], cancel=4, cancel_at=0.2)


async def _bulkhead_scenario(clock: VirtualClock) -> list[Outcome]:
    bulkhead = Bulkhead(2, queue_limit=2, label="k")
    ops = [sleeper(clock, 1), fail_times(1, Boom(), takes=0.5), sleeper(clock, 1), sleeper(clock, 2),
           sleeper(clock, 1), sleeper(clock, 1)]
    return await _gather_timed(clock, [bulkhead.execute(op) for op in ops], cancel=3, cancel_at=0.7)


async def _retry_scenario(clock: VirtualClock) -> list[Outcome]:
    schedule = Schedule.exponential(0.1).jittered().attempts(4)
    budget = RetryBudget(ratio=0.5, reserve_per_second=0, reserve_capacity=2)
    ops = [fail_times(2, ConnectionError, then="a", takes=0.05), fail_times(9, ConnectionError, takes=0.05),
           fail_times(1, ConnectionError, then="c", takes=0.05)]
    return await _gather_timed(clock, [retry(schedule, op, budget=budget, label="r") for op in ops])


async def _hedge_scenario(clock: VirtualClock) -> list[Outcome]:
    policy = Hedge(0.1, max_attempts=3, budget=RetryBudget(ratio=0.5, reserve_per_second=0, reserve_capacity=2),
                   label="h")
    plans = [[0.5, 0.05, 1.0], [0.02], [1.0, 1.0, 0.05], [0.3, 0.3, 0.3]]

    def attempt_op(plan: list[float]) -> Callable[[Attempt], Awaitable[str]]:
        async def op(attempt: Attempt) -> str:
            await sleeper(clock, plan[attempt.number - 1])()
            return f"attempt {attempt.number}"

        return op

    return await _gather_timed(clock, [policy.execute(IDEMPOTENT, attempt_op(plan)) for plan in plans])


async def _adaptive_scenario(clock: VirtualClock) -> list[Outcome]:
    bulkhead = stoic.AdaptiveBulkhead(latency_threshold=0.2, max_concurrent=3, min_concurrent=1, queue_limit=2,
                                      cooldown=0.1, label="a")

    async def times_out() -> None:
        await sleeper(clock, 0.1)()
        raise TimeoutError

    ops = [sleeper(clock, 0.5), times_out, sleeper(clock, 0.05), sleeper(clock, 0.3), sleeper(clock, 0.1),
           times_out, sleeper(clock, 0.1), sleeper(clock, 0.1)]
    outcomes = await _gather_timed(clock, [bulkhead.execute(op) for op in ops])
    return [*outcomes, ("limit", float(bulkhead.limit))]


async def _throttle_scenario(clock: VirtualClock) -> list[Outcome]:
    throttle = stoic.AdaptiveThrottle(label="t", min_throughput=4, k=1.5)
    outcomes: list[Outcome] = []
    for failed in [True] * 12 + [False] * 6:
        try:
            await throttle.execute(fail_with(ConnectionError()) if failed else sleeper(clock, 0))
            outcomes.append(("ok", clock.now()))
        except Exception as error:
            outcomes.append((type(error).__name__, clock.now()))
        await clock.advance(0.5)
    return [*outcomes, ("probability", throttle.probability)]


async def _keyed_scenario(clock: VirtualClock) -> list[Outcome]:
    family = stoic.Keyed(CircuitBreaker, label="fam", max_keys=2, window=CountWindow(4), minimum_calls=2,
                         open_duration=OpenDuration.fixed(2, jitter=0))
    outcomes: list[Outcome] = []
    for key, failed in [("a", True), ("b", False), ("a", True), ("a", False), ("c", True), ("b", True),
                        ("b", True), ("b", False)]:
        try:
            await family.execute(key, fail_with(Boom()) if failed else sleeper(clock, 0))
            outcomes.append((f"{key}:ok", clock.now()))
        except Exception as error:
            outcomes.append((f"{key}:{type(error).__name__}", clock.now()))
        await clock.advance(0.3)
    return outcomes


async def _pipeline_scenario(clock: VirtualClock) -> list[Outcome]:
    breaker = CircuitBreaker(label="p", window=CountWindow(4), minimum_calls=3, open_duration=OpenDuration.fixed(5))
    pipeline = Pipeline(Retrying(Schedule.fixed(0.1).attempts(2), label="p"), breaker,
                        Bulkhead(1, queue_limit=1, label="p"))
    ops = [fail_times(1, ConnectionError, then="a", takes=0.2), fail_times(5, ConnectionError, takes=0.2),
           sleeper(clock, 0.1), fail_times(5, ConnectionError, takes=0.2)]
    return await _gather_timed(clock, [pipeline.execute(op) for op in ops])


SCENARIOS: dict[str, Scenario] = {
    "breaker": _breaker_scenario,
    "rate_limiter": _limiter_scenario,
    "bulkhead": _bulkhead_scenario,
    "retry": _retry_scenario,
    "hedge": _hedge_scenario,
    "adaptive_bulkhead": _adaptive_scenario,
    "throttle": _throttle_scenario,
    "keyed": _keyed_scenario,
    "pipeline": _pipeline_scenario,
}


async def _decisions(scenario: Scenario, *, raising: bool) -> tuple[list[Outcome], list[tuple[Any, ...]], int]:
    clock = VirtualClock()
    recording = RecordingSink()
    raiser = RaisingSink()
    sinks = (raiser, recording) if raising else (recording,)  # the raising sink is served first
    reset_budgets()
    with stoic.use_clock(clock), stoic.use_sinks(*sinks), seeded(11):  # type: ignore[arg-type]
        outcomes = await scenario(clock)
    recording.assert_contract()
    events = [(e.name, e.label, e.level, dict(e.attributes), e.time_ns) for e in recording.events]
    return outcomes, events, raiser.calls


@pytest.mark.parametrize("policy", sorted(SCENARIOS))
async def test_a_raising_sink_changes_no_decision_of_any_policy(policy: str) -> None:
    """Report 1, every policy: the same calls give the same results at the same instants and the
    same events whether or not a sink that raises on every event is installed; the caller never
    sees the sink's exception (it would show up as a RuntimeError outcome)."""
    quiet = await _decisions(SCENARIOS[policy], raising=False)
    noisy = await _decisions(SCENARIOS[policy], raising=True)
    assert noisy[0] == quiet[0]
    assert noisy[1] == quiet[1]  # every decision still reached the healthy sink, in order
    assert not any(name == "RuntimeError" for name, _ in noisy[0])
    assert len(quiet[1]) >= 3  # the scenario really makes decisions worth reporting
    assert noisy[2] == len(quiet[1])  # and the broken sink was offered every one of them
    outcome_kinds = {name for name, _ in quiet[0]}
    assert len(outcome_kinds) >= 2, outcome_kinds  # both successes and refusals/failures happen


# --- 4. Interruptions pass through untouched and are never counted ---------------------------
# KeyboardInterrupt and SystemExit escape an asyncio Task into the event loop itself, so the
# async tests raise them only inside the test's own task, where they can be caught.
INTERRUPTIONS = [KeyboardInterrupt, SystemExit, GeneratorExit, asyncio.CancelledError]


def _raiser(error: BaseException) -> Callable[..., Awaitable[None]]:
    calls: list[int] = []

    async def op(*_: object) -> None:
        calls.append(1)
        raise error

    op.calls = calls  # type: ignore[attr-defined]
    return op


@pytest.mark.parametrize("kind", INTERRUPTIONS)
async def test_interruptions_are_never_retried_by_retry_or_retrying(
    clock: VirtualClock, sink: RecordingSink, kind: type[BaseException]
) -> None:
    """Report 4, retry: each interruption from an async operation propagates as the same object
    after one attempt, with no backoff, no budget spent and no event (retry and Retrying)."""
    budget = RetryBudget(ratio=0.5, reserve_per_second=0, reserve_capacity=3)
    for runner in (lambda op: retry(Schedule.fixed(1).attempts(5), op, budget=budget, label="op"),
                   lambda op: Retrying(Schedule.fixed(1).attempts(5), budget=budget, label="op").execute(op),
                   lambda op: Pipeline(Retrying(Schedule.fixed(1).attempts(5), budget=budget, label="op")).execute(op)):
        raised = kind()
        op = _raiser(raised)
        with pytest.raises(kind) as caught:
            await runner(op)
        assert caught.value is raised
        assert op.calls == [1]  # type: ignore[attr-defined]
    assert clock.now() == 0.0 and clock.pending_timers == 0
    assert budget.tokens == 3 + 3 * 0.5  # three first attempts deposited; no retry spent a token
    assert sink.events == []


@pytest.mark.parametrize("kind", INTERRUPTIONS)
async def test_interruptions_return_the_bulkhead_slot(clock: VirtualClock, sink: RecordingSink,
                                                       kind: type[BaseException]) -> None:
    """Report 4, bulkhead: an interrupted call passes its interruption through and gives its
    slot back, to a queued waiter if there is one; nothing is counted as a rejection."""
    bulkhead = Bulkhead(1, queue_limit=1, label="k")
    raised = kind()
    gate = asyncio.Event()

    async def interrupted() -> None:
        await gate.wait()
        raise raised

    async def first() -> BaseException | None:
        try:
            await bulkhead.execute(interrupted)
        except BaseException as error:  # caught inside this task, see the note above
            return error
        return None

    holder = asyncio.ensure_future(first())
    await settle()
    waiter = asyncio.ensure_future(bulkhead.execute(sleeper(clock, 0)))
    await settle()
    assert (bulkhead.active_count, bulkhead.queued_count) == (1, 1)
    gate.set()
    assert await holder is raised
    await waiter
    assert (bulkhead.active_count, bulkhead.queued_count) == (0, 0)
    assert sink.of("bulkhead.rejected") == []
    # And the synchronous compartment, with the interruption raised in this very thread.
    blocking = BlockingBulkhead(1, label="kb")

    def sync_interrupted() -> None:
        raise raised

    with pytest.raises(kind) as caught:
        blocking.call(sync_interrupted)
    assert caught.value is raised
    assert blocking.active_count == 0
    assert blocking.call(lambda: "free") == "free"


@pytest.mark.parametrize("kind", INTERRUPTIONS)
async def test_interruptions_leave_the_rate_limiter_consistent(clock: VirtualClock, sink: RecordingSink,
                                                                kind: type[BaseException]) -> None:
    """Report 4, rate limiter: an interruption passes through execute untouched; its permit is
    spent like any attempt's (never duplicated, never lost twice) and the next waiter is served on
    time; a waiter interrupted while queued takes nothing."""
    limiter = RateLimiter(1, per=1.0, label="l")
    blocking = BlockingRateLimiter(1, per=1.0, label="lb")
    raised = kind()
    with pytest.raises(kind) as caught:
        await limiter.execute(_raiser(raised))
    assert caught.value is raised
    assert limiter.available_permits == 0 and limiter.waiter_count == 0
    served: list[float] = []

    async def later() -> None:
        await limiter.acquire()
        served.append(clock.now())

    queued = [asyncio.ensure_future(later()) for _ in range(2)]
    await settle()
    queued[0].cancel()  # interrupted while waiting
    await clock.run_until_idle()
    assert served == [1.0]  # the other waiter, exactly when the next permit was earned
    assert queued[0].cancelled() and limiter.waiter_count == 0

    def sync_interrupted() -> None:
        raise raised

    with pytest.raises(kind) as caught:
        blocking.call(sync_interrupted)
    assert caught.value is raised
    assert blocking.waiter_count == 0
    assert [e.attributes["reason"] for e in sink.of("ratelimiter.rejected")] in ([], ["cancelled"])


@pytest.mark.parametrize("kind", INTERRUPTIONS)
async def test_interruptions_of_the_first_hedged_attempt_pass_through_and_stop_every_hedge(
    clock: VirtualClock, sink: RecordingSink, kind: type[BaseException]
) -> None:
    """Report 4, hedge: the first attempt runs in the caller's task; its interruption, raised
    before or after hedges started, ends the call as the same object, every hedge is cancelled and
    awaited first, and no failure is recorded for it."""
    running: set[int] = set()

    # An operation that raises CancelledError itself once hedges run is one attempt's outcome
    # (see docs/field-reports.md); the caller's own cancellation is covered in test_hedge.py.
    timings = (0.05,) if kind is asyncio.CancelledError else (0.05, 0.25)
    for raise_after in timings:  # before the first hedge, and with two hedges running
        raised = kind()

        async def op(attempt: Attempt, raised: BaseException = raised, after: float = raise_after) -> str:
            running.add(attempt.number)
            try:
                await sleeper(clock, after if attempt.number == 1 else 5)()
                if attempt.number == 1:
                    raise raised
                return "late"
            finally:
                running.discard(attempt.number)

        async def call() -> BaseException | None:
            try:
                await Hedge(0.1, max_attempts=3, budget=RetryBudget.UNLIMITED, label="h").execute(IDEMPOTENT, op)
            except BaseException as error:  # caught inside this task (see the note above)
                return error
            return None

        assert await clock.run(call()) is raised
        assert running == set()
        assert clock.pending_timers == 0
    failed = [e.attributes["attempt"] for e in sink.of("hedge.attempt_failed")]
    assert 1 not in failed
    assert sink.of("hedge.won") == []


# --- 6. Cancelled from outside by asyncio.wait_for -------------------------------------------
class _TimeTravelLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock is virtual: when it would block waiting for a timer it jumps
    straight to it. asyncio.wait_for and asyncio.sleep then run on virtual time too."""

    def __init__(self) -> None:
        super().__init__(selectors.DefaultSelector())
        self.virtual_ns = 0
        real_select = self._selector.select  # type: ignore[attr-defined]

        def select(timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
            if timeout is None:
                raise RuntimeError("the loop would block forever: nothing is scheduled")
            if timeout > 0:
                self.virtual_ns += math.ceil(timeout * 1e9)
            return real_select(0)  # type: ignore[no-any-return]

        self._selector.select = select  # type: ignore[attr-defined]

    def time(self) -> float:
        return self.virtual_ns / 1e9


class _LoopClock:
    """A stoic Clock on the time-travel loop's time, so stoic's timers and asyncio's share it."""

    def __init__(self, loop: _TimeTravelLoop) -> None:
        self.loop = loop

    def now_ns(self) -> int:
        return self.loop.virtual_ns

    def call_at(self, when_ns: int, callback: Callable[[], object]) -> asyncio.TimerHandle:
        return self.loop.call_at(when_ns / 1e9, callback)

    async def sleep_until(self, when_ns: int) -> None:
        await asyncio.sleep(max(0, when_ns - self.loop.virtual_ns) / 1e9)

    def sleep_until_blocking(self, when_ns: int) -> None:
        raise AssertionError("not used: everything here is async")


@pytest.fixture
def travel_loop() -> Iterator[_TimeTravelLoop]:
    loop = _TimeTravelLoop()
    try:
        yield loop
    finally:
        loop.close()


@pytest.mark.parametrize("schedule", [Schedule.fixed(0).attempts(5), Schedule.exponential(0.5).attempts(5),
                                      Schedule.delays([0.1, 0.2]).jittered()], ids=repr)
@pytest.mark.parametrize("how", ["retry", "Retrying", "Pipeline"])
def test_asyncio_wait_for_cancels_a_retry_during_its_first_attempt(
    travel_loop: _TimeTravelLoop, schedule: Schedule, how: str
) -> None:
    """Report 6 as written: asyncio.wait_for(..., 1) around a retried call whose first attempt
    takes 3 s. It ends at exactly 1 s with TimeoutError; there is no second attempt, no backoff
    sleep, no event, and nothing is left scheduled — whatever the schedule's first delay."""
    loop = travel_loop
    clock = _LoopClock(loop)
    recording = RecordingSink()
    starts: list[float] = []

    async def three_second_attempt() -> str:
        starts.append(loop.time())
        await asyncio.sleep(3)
        raise ConnectionError("slow and failing")

    async def main() -> float:
        bounded = schedule if isinstance(schedule, stoic.BoundedSchedule) else schedule.attempts(3)
        call: Awaitable[str]
        if how == "retry":
            call = retry(bounded, three_second_attempt, budget=RetryBudget.UNLIMITED, label="op")
        elif how == "Retrying":
            call = Retrying(bounded, budget=RetryBudget.UNLIMITED, clock=clock,
                    label="op").execute(three_second_attempt)
        else:
            call = Pipeline(Retrying(bounded, budget=RetryBudget.UNLIMITED, clock=clock,
                    label="op")).execute(three_second_attempt)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(call, 1)
        ended = loop.time()
        assert not [h for h in loop._scheduled if not h.cancelled()]  # type: ignore[attr-defined]
        await asyncio.sleep(60)  # a backoff or second attempt left behind would show now
        return ended

    with stoic.use_clock(clock), stoic.use_sinks(recording):  # type: ignore[arg-type]
        ended = loop.run_until_complete(main())
    assert ended == pytest.approx(1.0, abs=1e-6)
    assert starts == [0.0]
    assert recording.events == []


# --- 8. Huge attempt numbers, for every schedule kind ----------------------------------------
def _kinds(base: float) -> dict[str, Schedule]:
    return {
        "fixed": Schedule.fixed(base),
        "linear": Schedule.linear(base),
        "exponential": Schedule.exponential(base),
        "exponential x10": Schedule.exponential(base, factor=10),
        "fibonacci": Schedule.fibonacci(base),
        "decorrelated": Schedule.decorrelated(base, 10 * base),
        "delays": Schedule.delays([base, 2 * base, 3 * base]),
    }


def _shapes(schedule: Schedule) -> dict[str, Schedule]:
    return {
        "plain": schedule,
        "full jitter": schedule.jittered(),
        "equal jitter": schedule.jittered("equal"),
        "capped 60": schedule.capped(60),
        "jittered then capped": schedule.jittered(0.3).capped(60),
        "capped then jittered": schedule.capped(60).jittered(),
    }


HUGE = 1_000_000
DEEP_SHAPES = ("plain", "jittered then capped")  # a million attempts deep; the rest 50,000 deep


def _depth(shape: str) -> int:
    return HUGE if shape in DEEP_SHAPES else 50_000


@pytest.mark.parametrize("kind", sorted(_kinds(1)))
def test_a_million_attempts_give_finite_bounded_delays_for_every_schedule_kind(kind: str) -> None:
    """Report 8, every kind and shape: the delays of attempts 1 to 1,000,000 are computed without
    raising, are finite integers, never negative and never above the cap (the explicit one, else
    the kind's default cap, else stoic's ceiling); the public float totals stay finite."""
    for shape, schedule in _shapes(_kinds(1)[kind]).items():
        got = schedule._delays_ns(random.Random(3), _depth(shape))
        if kind != "delays":
            assert len(got) == _depth(shape), shape
        cap = 60 * 10**9 if "60" in shape else (
            DEFAULT_CAP_NS if kind in ("exponential", "exponential x10", "fibonacci") else MAX_NS)
        if kind == "decorrelated" and "60" not in shape:
            cap = 10 * 10**9
        assert all(type(d) is int for d in got[-1000:]), shape
        assert min(got) >= 0, shape
        assert max(got) <= cap, (shape, max(got), cap)
        if shape in DEEP_SHAPES:
            total = schedule.attempts(HUGE).maximum_total_delay
            assert math.isfinite(total) and 0 <= total <= (HUGE - 1) * cap / 1e9, shape


@pytest.mark.parametrize("kind", sorted(_kinds(0)))
def test_a_zero_base_gives_zero_for_every_schedule_kind(kind: str) -> None:
    """Report 8: a zero base gives zero delays for every kind and shape, a million attempts deep
    (and quickly: a zero base must not keep growing its internal sequence)."""
    for shape, schedule in _shapes(_kinds(0)[kind]).items():
        got = schedule._delays_ns(random.Random(5), _depth(shape))
        assert set(got) <= {0}, shape
        if shape in DEEP_SHAPES:
            assert schedule.attempts(HUGE).maximum_total_delay == 0, shape
    if kind == "fibonacci":
        # It used to keep growing fib(n) (0 * fib(n) never reaches the cap): by a million
        # attempts each step added numbers hundreds of thousands of digits long.
        step = Schedule.fibonacci(0)._stepper(None)
        for _ in range(10_000):
            step.next(0)
        assert step.a.bit_length() < 64  # type: ignore[attr-defined]


# --- 10. Zero never means unlimited, for every zero-able parameter ---------------------------
ZERO_REJECTED: list[tuple[str, Callable[[], object], str]] = [
    ("breaker minimum_calls", lambda: CircuitBreaker(label="b", minimum_calls=0), "minimum_calls"),
    ("CountWindow calls", lambda: CountWindow(0), "calls"),
    ("TimeWindow seconds", lambda: TimeWindow(0), "seconds"),
    ("breaker failure_rate_threshold", lambda: CircuitBreaker(label="b", failure_rate_threshold=0),
     "failure_rate_threshold"),
    ("breaker slow_call_rate_threshold", lambda: CircuitBreaker(label="b", slow_call_rate_threshold=0),
     "slow_call_rate_threshold"),
    ("breaker slow_call_duration", lambda: CircuitBreaker(label="b", slow_call_duration=0), "slow_call_duration"),
    ("breaker half_open_probes", lambda: CircuitBreaker(label="b", half_open_probes=0), "half_open_probes"),
    ("breaker half_open_timeout", lambda: CircuitBreaker(label="b", half_open_timeout=0), "half_open_timeout"),
    ("OpenDuration.fixed seconds", lambda: OpenDuration.fixed(0), "open_duration seconds"),
    ("OpenDuration initial", lambda: OpenDuration.exponential(initial=0), "initial"),
    ("OpenDuration maximum", lambda: OpenDuration.exponential(maximum=0), "maximum"),
    ("OpenDuration reset_after", lambda: OpenDuration.exponential(reset_after=0), "reset_after"),
    ("limiter rate", lambda: RateLimiter(0, label="l"), "rate"),
    ("limiter per", lambda: RateLimiter(1, per=0, label="l"), "per"),
    ("limiter burst", lambda: RateLimiter(1, burst=0, label="l"), "burst"),
    ("blocking limiter rate", lambda: BlockingRateLimiter(0, label="l"), "rate"),
    ("blocking limiter per", lambda: BlockingRateLimiter(1, per=0, label="l"), "per"),
    ("blocking limiter burst", lambda: BlockingRateLimiter(1, burst=0, label="l"), "burst"),
    ("bulkhead max_concurrent", lambda: Bulkhead(0, label="k"), "max_concurrent"),
    ("blocking bulkhead max_concurrent", lambda: BlockingBulkhead(0, label="k"), "max_concurrent"),
    ("hedge max_attempts", lambda: Hedge(0.1, max_attempts=0, label="h"), "max_attempts"),
    ("hedge function max_attempts",
     lambda: stoic.hedge(IDEMPOTENT, _raiser(Boom()), delay=0.1, max_attempts=0, label="h"),
     "max_attempts"),
    ("hedge window", lambda: Hedge(0.1, quantile=0.9, window=0, label="h"), "window"),
    ("hedge quantile", lambda: Hedge(0.1, quantile=0, label="h"), "quantile"),
    ("budget ratio", lambda: RetryBudget(ratio=0), "ratio"),
    ("attempts(0)", lambda: Schedule.fixed(1).attempts(0), "count"),
    ("Retrying of attempts(0)", lambda: Retrying(Schedule.fixed(1).attempts(0), label="op"), "count"),
    ("exponential factor", lambda: Schedule.exponential(1, factor=0), "factor"),
    ("worst_case attempt_timeout", lambda: Schedule.fixed(1).attempts(2).worst_case(0), "attempt_timeout"),
    ("retry attempt_timeout", lambda: retry(Schedule.fixed(1).attempts(2), _raiser(Boom()), attempt_timeout=0,
            label="op"),
     "attempt_timeout"),
]


@pytest.mark.parametrize("build, parameter", [(b, p) for _, b, p in ZERO_REJECTED],
                         ids=[name for name, _, _ in ZERO_REJECTED])
def test_a_zero_that_would_mean_nothing_or_everything_is_refused_naming_the_parameter(
    build: Callable[[], object], parameter: str
) -> None:
    """Report 10, every parameter where zero has no sensible meaning: a ValueError at
    construction that names it and its range — never a silent "unlimited"."""
    with pytest.raises(ValueError, match=parameter) as caught:
        build()
    assert any(word in str(caught.value) for word in (">", "(0", "in [", "in ("))  # says the range


async def test_zero_queue_limits_and_timeouts_mean_no_waiting(clock: VirtualClock) -> None:
    """Report 10, every zero that is accepted about waiting: queue_limit=0 (limiter, bulkhead)
    refuses at once instead of queueing; a blocking acquire with timeout=0 does not wait; a zero
    stoic.timeout ends its block at once."""
    limiter = RateLimiter(1, per=1.0, queue_limit=0, label="l")
    await limiter.acquire()
    with pytest.raises(RateLimited):
        await limiter.acquire()
    assert limiter.waiter_count == 0
    bulkhead = Bulkhead(1, queue_limit=0, label="k")
    hold = asyncio.ensure_future(bulkhead.execute(sleeper(clock, 1)))
    await settle()
    with pytest.raises(BulkheadFull):
        await bulkhead.execute(sleeper(clock, 0))
    await clock.advance(1)
    await hold
    blocking_limiter = BlockingRateLimiter(1, per=1.0, label="lb")
    blocking_limiter.acquire(timeout=0)  # a free permit is still taken with a zero timeout
    with pytest.raises((RateLimited, DeadlineExceeded)):
        blocking_limiter.acquire(timeout=0)
    assert blocking_limiter.waiter_count == 0
    blocking_bulkhead = BlockingBulkhead(1, queue_limit=5, label="kb")
    blocking_bulkhead.acquire(timeout=0)
    with pytest.raises((BulkheadFull, DeadlineExceeded)):
        blocking_bulkhead.acquire(timeout=0)
    assert blocking_bulkhead.queued_count == 0
    blocking_bulkhead.release()
    ran: list[int] = []
    began = clock.now()

    async def block() -> None:
        async with stoic.timeout(0):
            ran.append(1)
            await sleeper(clock, 1)()
            ran.append(2)

    with pytest.raises(DeadlineExceeded):
        await clock.run(block())
    assert 2 not in ran  # the block ended at once, not after its one-second sleep
    assert clock.now() == began and clock.pending_timers == 0


async def test_zero_schedule_and_budget_parameters_mean_exactly_what_they_say(
    clock: VirtualClock, sink: RecordingSink
) -> None:
    """Report 10, the zeros a schedule or budget accepts: up_to(0) allows no retry, capped(0)
    retries at once but still only as many times as attempts() says, an empty delay list is one
    attempt, maximal_delays(0) is empty, and a budget with no reserve and no earned capacity never
    pays for a retry however many first attempts deposit."""
    for schedule, calls in ((Schedule.fixed(1).attempts(5).up_to(0), 1),
                            (Schedule.exponential(1).capped(0).attempts(4), 4),
                            (Schedule.delays([]), 1), (Schedule.delays([0, 0]), 3)):
        op = fail_times(10, ConnectionError)
        with pytest.raises(ConnectionError):
            await clock.run(retry(schedule, op, budget=RetryBudget.UNLIMITED, label="op"))  # type: ignore[arg-type]
        assert op.calls == calls, schedule
    assert clock.now() == 0.0  # zero caps and delays slept nothing
    assert Schedule.fixed(1).maximal_delays(0) == []
    starved = RetryBudget(ratio=1.0, reserve_per_second=0, reserve_capacity=0, earned_capacity=0)
    for _ in range(1000):
        starved.deposit()
    await clock.advance(3600)
    assert not starved.try_spend()
    op = fail_times(10, ConnectionError)
    with pytest.raises(ConnectionError):
        await clock.run(retry(Schedule.fixed(0).attempts(5), op, budget=starved, label="op"))
    assert op.calls == 1


# --- 11. Every policy object reused across event loops ----------------------------------------
def test_every_policy_built_outside_a_loop_works_under_successive_asyncio_runs() -> None:
    """Report 11, every policy: a breaker (and its state stream), limiter, bulkhead, Retrying,
    Pipeline and Hedge built with no loop running (as at import time) behave identically under
    three successive asyncio.run calls, with waiters and timers in play each time."""
    clock = VirtualClock()
    with stoic.use_clock(clock):
        breaker = CircuitBreaker(label="loops", window=CountWindow(2), minimum_calls=2,
                                 open_duration=OpenDuration.fixed(1, jitter=0))
        limiter = RateLimiter(2, per=1.0, label="loops")
        bulkhead = Bulkhead(1, queue_limit=10, label="loops")
        retrying = Retrying(Schedule.fixed(0.5).attempts(3), budget=RetryBudget.UNLIMITED,
                label="loops")
        pipeline = Pipeline(Retrying(Schedule.fixed(0.25).attempts(2), budget=RetryBudget.UNLIMITED,
                label="op"), bulkhead,
                            limiter)
        hedger = Hedge(0.1, budget=RetryBudget.UNLIMITED, label="loops")

    async def scenario() -> list[object]:
        start = clock.now()
        seen: list[object] = []
        states: list[BreakerState] = []

        async def watch() -> None:
            async for state in breaker.state_changes():
                states.append(state)

        watcher = asyncio.ensure_future(watch())
        await settle()
        for _ in range(2):
            with pytest.raises(Boom):
                await breaker.execute(_raiser(Boom()))
        with pytest.raises(CircuitOpen):
            await breaker.execute(sleeper(clock, 0))
        await clock.advance(1)
        await breaker.execute(sleeper(clock, 0))
        await settle()
        seen.append(breaker.state)
        seen.append(states[-3:])
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)

        async def slow_hedged(attempt: Attempt) -> int:
            await sleeper(clock, 1 if attempt.number == 1 else 0.2)()
            return attempt.number

        tries: list[int] = []

        async def op() -> str:  # on the policies' clock: no ambient clock inside asyncio.run
            tries.append(1)
            await sleeper(clock, 0.1)()
            if len(tries) < 3:
                raise ConnectionError("flaky")
            return "r"

        piped = [pipeline.execute(sleeper(clock, 0.1)) for _ in range(4)]
        results = await clock.run(asyncio.gather(retrying.execute(op), hedger.execute(IDEMPOTENT, slow_hedged),
                                                 *piped))
        seen.append(results[:2])
        seen.append((limiter.waiter_count, bulkhead.active_count, bulkhead.queued_count))
        seen.append(round(clock.now() - start, 6))
        await clock.advance(10)  # refill the limiter for the next run
        return seen

    first = asyncio.run(scenario())
    assert first[0] is BreakerState.CLOSED
    assert first[1] == [BreakerState.OPEN, BreakerState.HALF_OPEN, BreakerState.CLOSED]
    assert first[2] == ["r", 2]
    assert first[3] == (0, 0, 0)
    assert asyncio.run(scenario()) == first
    assert asyncio.run(scenario()) == first


# --- 16. Generators are not successes: the blocking stages refuse them too ----------------------
def _numbers() -> Iterator[int]:
    yield 1


async def _async_numbers() -> Any:
    yield 1


def _blocking_shared_limiter() -> Any:
    from stoic.fleet import BlockingSharedRateLimiter, RedisStore

    return BlockingSharedRateLimiter(1, store=RedisStore("redis://127.0.0.1:1/0"), label="gen")  # never contacted


@pytest.mark.parametrize("fn", [_numbers, _async_numbers], ids=["generator", "async generator"])
@pytest.mark.parametrize("make", [
    lambda: BlockingBulkhead(1, label="gen"),
    lambda: BlockingRateLimiter(1, label="gen"),
    lambda: _blocking_shared_limiter(),
], ids=["BlockingBulkhead", "BlockingRateLimiter", "BlockingSharedRateLimiter"])
def test_the_blocking_stages_refuse_generator_functions_at_decoration(make: Callable[[], Any],
                                                                     fn: Callable[[], Any]) -> None:
    """A wrapper would take the slot (or permit), create the generator and give the slot back at
    once: the body would run while the caller iterates, outside the stage."""
    stage = make()
    with pytest.raises(TypeError, match="generator"):
        stage(fn)
    if isinstance(stage, BlockingBulkhead):
        assert stage.in_use == 0


# --- 17 and 18 together: a real TaskGroup's failed fan-out inside the call ----------------------
# On Python 3.11 and early 3.12 a TaskGroup whose child fails while the body waits in
# ``__aexit__`` cancels its parent task and never takes that request back: ``cancelling()``
# rises by one *during* the call, and the call ends with the group's ExceptionGroup. The count
# rose since the policy's entry, yet nobody is cancelling the caller. ``_own_group_cancel``
# leaves the same trace on every version (its own request, swallowed, then a group).
async def _failed_fan_out() -> None:
    async def child() -> None:
        raise ConnectionError("refused")

    async with asyncio.TaskGroup() as group:
        group.create_task(child())
        group.create_task(asyncio.sleep(0))


async def _own_group_cancel() -> None:
    task = asyncio.current_task()
    assert task is not None
    task.cancel()
    try:
        await asyncio.sleep(0)
    except asyncio.CancelledError:
        pass  # a TaskGroup's own abort request, caught inside its __aexit__
    raise ExceptionGroup("unhandled errors in a TaskGroup", [ConnectionError("refused")])


FAN_OUTS = {"TaskGroup": _failed_fan_out, "emulated": _own_group_cancel}
# What the operation makes of the group: lets it through, raises its first leaf, or raises an
# error of its own from ``except*`` (how an API keeps its exception types over a fan-out).
UNWRAPPINGS = ["group", "raise leaf", "except*"]


def _unwrapping(fan_out: Callable[[], Awaitable[None]], how: str) -> Callable[[], Awaitable[None]]:
    async def op() -> None:
        if how == "group":
            await fan_out()
        elif how == "raise leaf":
            try:
                await fan_out()
            except ExceptionGroup as group:
                raise group.exceptions[0] from None
        else:
            try:
                await fan_out()
            except* ConnectionError:
                raise ConnectionError("the fan-out failed") from None

    return op


def _retry_forms() -> dict[str, Callable[[Callable[[], Awaitable[None]]], Awaitable[object]]]:
    three = Schedule.fixed(0.5).attempts(3)
    policy = Retrying(three, budget=RetryBudget.UNLIMITED, label="fan")
    pipeline = Pipeline(Retrying(three, budget=RetryBudget.UNLIMITED, label="fan"),
                        CircuitBreaker(label="fan", minimum_calls=100))

    def decorated(op: Callable[[], Awaitable[None]]) -> Awaitable[object]:
        @stoic.retrying(three, budget=RetryBudget.UNLIMITED, label="fan")
        async def wrapped() -> None:
            await op()

        return wrapped()

    return {
        "retry": lambda op: retry(three, op, budget=RetryBudget.UNLIMITED, label="fan"),
        "Retrying.execute": policy.execute,
        "@retrying": decorated,
        "Pipeline": pipeline.execute,
    }


@pytest.mark.parametrize("how", UNWRAPPINGS)
@pytest.mark.parametrize("fan_out", list(FAN_OUTS))
@pytest.mark.parametrize("form", list(_retry_forms()))
async def test_a_failed_task_group_fan_out_is_retried_as_often_as_the_schedule_says(
    clock: VirtualClock, form: str, fan_out: str, how: str
) -> None:
    """Reports 17 and 18 as they arrive: the retried operation is a TaskGroup fan-out whose child
    fails with a ConnectionError, raised as the group or unwrapped by the operation. Every
    attempt is made (three, on the schedule's delays), not one: the cancel request the
    TaskGroup left in the task is not the caller's."""
    starts: list[float] = []
    inner = _unwrapping(FAN_OUTS[fan_out], how)

    async def op() -> None:
        starts.append(clock.now())
        await inner()

    with pytest.raises((ConnectionError, ExceptionGroup)) as caught:
        await clock.run(_retry_forms()[form](op))
    assert isinstance(caught.value, ConnectionError) or caught.group_contains(ConnectionError)
    assert starts == [0.0, 0.5, 1.0]


@pytest.mark.parametrize("how", UNWRAPPINGS)
@pytest.mark.parametrize("body", ["waiting", "done"])
@pytest.mark.parametrize("form", list(_retry_forms()))
async def test_a_caller_cancelling_a_fan_out_whose_children_fail_on_the_way_out_stops_the_retry(
    clock: VirtualClock, form: str, body: str, how: str
) -> None:
    """The other side: the caller cancels the task while the fan-out runs (its body still
    waiting, or already in ``__aexit__``), and every child turns its CancelledError into a
    ConnectionError on the way out, so a group arrives, or what the operation makes of it. That
    is the caller being cancelled: no second attempt, on every Python version."""
    starts: list[float] = []

    async def child() -> None:
        try:
            await sleeper(clock, 10)()
        except asyncio.CancelledError:
            raise ConnectionError("cleanup failed") from None

    async def fan_out() -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(child())
            group.create_task(child())
            if body == "waiting":
                await sleeper(clock, 10)()

    inner = _unwrapping(fan_out, how)

    async def op() -> None:
        starts.append(clock.now())
        await inner()

    task = asyncio.ensure_future(_retry_forms()[form](op))
    await clock.advance(1)
    task.cancel()
    await clock.run_until_idle()
    with pytest.raises((asyncio.CancelledError, ConnectionError, ExceptionGroup)):  # (3.11: not CancelledError)
        await task
    assert starts == [0.0]
    assert clock.pending_timers == 0


@pytest.mark.parametrize("how", UNWRAPPINGS)
@pytest.mark.parametrize("fan_out", list(FAN_OUTS))
async def test_a_failed_task_group_in_the_first_hedged_attempt_waits_for_the_running_hedge(
    clock: VirtualClock, fan_out: str, how: str
) -> None:
    """Reports 17 and 18 for hedge: the first attempt (in the caller's task) fails as a TaskGroup
    fan-out after a hedge started. The hedge still running wins, as after any failed first
    attempt; the TaskGroup's own cancel request is not the caller's."""
    inner = _unwrapping(FAN_OUTS[fan_out], how)

    async def op(attempt: Attempt) -> str:
        if attempt.number == 1:
            await sleeper(clock, 0.2)()
            await inner()
        await sleeper(clock, 0.3)()
        return f"attempt {attempt.number}"

    policy = Hedge(0.1, max_attempts=2, budget=RetryBudget.UNLIMITED, label="fan")
    assert await clock.run(policy.execute(IDEMPOTENT, op)) == "attempt 2"
    assert clock.now() == pytest.approx(0.4)


@pytest.mark.parametrize("form", ["execute", "decorator"])
async def test_a_caller_cancelling_a_fan_out_through_a_breaker_is_never_counted(clock: VirtualClock,
                                                                               form: str) -> None:
    """Report 17's rule for groups at the breaker: the caller cancels a fan-out whose children
    turn their CancelledError into ConnectionErrors on the way out. The group they make is no
    evidence about the dependency, as the same error from a single operation is not (3.13's
    TaskGroup re-requests the cancel, 3.11's does not: the verdict must not depend on that)."""
    breaker = CircuitBreaker(label="fan", window=CountWindow(5), minimum_calls=5)

    async def child() -> None:
        try:
            await sleeper(clock, 10)()
        except asyncio.CancelledError:
            raise ConnectionError("cleanup failed") from None

    async def fan_out() -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(child())
            group.create_task(child())

    wrapped = breaker(fan_out)
    for _ in range(5):
        task = asyncio.ensure_future(breaker.execute(fan_out) if form == "execute" else wrapped())
        await clock.advance(1)
        task.cancel()
        await clock.run_until_idle()
        await asyncio.gather(task, return_exceptions=True)
        assert task.cancelled() or isinstance(task.exception(), ExceptionGroup)
    assert (breaker.snapshot.calls, breaker.snapshot.failures) == (0, 0)
    assert breaker.state is BreakerState.CLOSED
