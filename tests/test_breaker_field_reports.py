"""Field reports 1-5 (cases/field-reports.md, "Circuit breaker"): failures seen in other
resilience libraries that stoic's breaker must not have. Each test is named after the behaviour."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from _breaker_helpers import Boom, Gate, StepClock, fail, ok

import stoic
from stoic import BreakerState, CircuitBreaker, CircuitOpen, CountWindow, Event, OpenDuration, TimeWindow
from stoic.testing import RecordingSink, VirtualClock, settle


# --- 1. A sink or listener that raises -------------------------------------------------------
class RaisingSink:
    level = stoic.Level.DEBUG

    def __init__(self) -> None:
        self.calls = 0

    def emit(self, event: Event) -> None:
        self.calls += 1
        raise RuntimeError("the sink is broken")


def _trip_point(sinks: tuple[object, ...]) -> tuple[int, list[tuple[int, int, int]]]:
    """Drive a breaker with a fixed sequence; return the call index that opened it and the
    counts after every call."""
    clock = StepClock()
    breaker = CircuitBreaker(label="sink", window=CountWindow(10), minimum_calls=5, failure_rate_threshold=0.5,
                             clock=clock)  # type: ignore[arg-type]
    pattern = [True, False, True, False, False, True, False, True, True, True, True]
    history: list[tuple[int, int, int]] = []
    with stoic.use_sinks(*sinks):  # type: ignore[arg-type]
        for index, failed in enumerate(pattern):
            clock.t += 1_000_000
            try:
                breaker.call(_boom if failed else _fine)
            except Boom:
                pass
            snap = breaker.snapshot
            history.append((snap.calls, snap.failures, snap.slow_calls))
            if breaker.state is BreakerState.OPEN:
                return index, history
    raise AssertionError("never opened")


def _boom() -> None:
    raise Boom("down")


def _fine() -> str:
    return "fine"


def test_a_sink_that_raises_changes_nothing_the_breaker_decides() -> None:
    expected = _trip_point(())
    raising = RaisingSink()
    assert _trip_point((raising,)) == expected  # opens at exactly the same call, same counts
    assert raising.calls > len(expected[1])  # it was really called (recorded, opened, ...)


async def test_a_sink_that_raises_never_reaches_the_caller(clock: VirtualClock) -> None:
    breaker = CircuitBreaker(label="sink", window=CountWindow(2), minimum_calls=1,
                             open_duration=OpenDuration.fixed(1, jitter=0))
    with stoic.use_sinks(RaisingSink()):
        assert await breaker.execute(ok) == "ok"
        with pytest.raises(Boom):
            await breaker.execute(fail)
        with pytest.raises(CircuitOpen):
            await breaker.execute(ok)
        await clock.advance(1)
        assert await breaker.execute(ok) == "ok"
        breaker.force_open()
        breaker.reset()
    assert breaker.state is BreakerState.CLOSED


# --- 2. No lock held across the call ---------------------------------------------------------
def test_no_lock_is_held_across_a_synchronous_call() -> None:
    # Real threads: ten calls through a closed breaker must all be inside it at once to pass
    # the barrier in the call; a lock held across the call leaves the first alone there and
    # the barrier breaks after 10 s. (It was a wall-clock bound, ten 0.2 s calls in under
    # 0.4 s, which a machine stalled 0.2 s could fail with nothing wrong.)
    breaker = CircuitBreaker(label="threads", window=TimeWindow(60))
    inside = threading.Barrier(10, timeout=10)
    finished: list[int] = []

    def worker() -> None:
        finished.append(breaker.call(inside.wait))

    threads = [threading.Thread(target=worker) for _ in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(15)
    assert not inside.broken, "the calls could not all be inside the breaker at once"
    assert sorted(finished) == list(range(10))  # (Barrier.wait's return: each party's index)
    assert breaker.snapshot.calls == 10


# --- 3. Many failing callers at once ---------------------------------------------------------
async def test_a_hundred_concurrent_failures_open_the_breaker_once(clock: VirtualClock, sink: RecordingSink) -> None:
    breaker = CircuitBreaker(label="herd", window=CountWindow(20), minimum_calls=10, failure_rate_threshold=0.5)
    gate = Gate()
    tasks = [asyncio.create_task(breaker.execute(gate.op)) for _ in range(100)]
    await settle()
    assert gate.started == 100  # all admitted while closed
    gate.open(Boom("down"))
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, Boom) for r in results)
    assert breaker.state is BreakerState.OPEN
    assert len(sink.of("breaker.opened")) == 1
    assert sink.of("breaker.opened")[0].attributes["calls"] == 10
    ignored = [e.attributes["reason"] for e in sink.of("breaker.ignored")]
    assert ignored == ["stale"] * 90  # the rest finished after the breaker had opened


def test_a_hundred_threads_failing_at_once_open_the_breaker_once() -> None:
    recording = RecordingSink()
    breaker = CircuitBreaker(label="herd-threads", window=CountWindow(20), minimum_calls=10, failure_rate_threshold=0.5)
    barrier = threading.Barrier(100)
    outcomes: list[BaseException] = []

    def failing() -> None:
        barrier.wait()
        raise Boom("down")

    def worker() -> None:
        with stoic.use_sinks(recording):
            try:
                breaker.call(failing)
            except BaseException as error:
                outcomes.append(error)

    threads = [threading.Thread(target=worker) for _ in range(100)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(outcomes) == 100 and all(isinstance(e, Boom) for e in outcomes)
    assert breaker.state is BreakerState.OPEN
    assert len(recording.of("breaker.opened")) == 1
    recording.assert_contract()


# --- 4. Only real failures count -------------------------------------------------------------
INTERRUPTIONS = [KeyboardInterrupt, SystemExit, GeneratorExit, asyncio.CancelledError]


@pytest.mark.parametrize("kind", INTERRUPTIONS)
def test_interruptions_pass_through_a_plain_call_uncounted(kind: type[BaseException]) -> None:
    breaker = CircuitBreaker(label="base", window=CountWindow(1), minimum_calls=1)
    raised = kind()

    def interrupted() -> None:
        raise raised

    for _ in range(3):
        with pytest.raises(kind) as caught:
            breaker.call(interrupted)
        assert caught.value is raised  # untouched
    assert breaker.snapshot.calls == 0
    assert breaker.state is BreakerState.CLOSED


@pytest.mark.parametrize("kind", INTERRUPTIONS)
async def test_interruptions_pass_through_execute_uncounted(
    clock: VirtualClock, sink: RecordingSink, kind: type[BaseException]
) -> None:
    breaker = CircuitBreaker(label="base", window=CountWindow(1), minimum_calls=1,
                             open_duration=OpenDuration.fixed(1, jitter=0))
    raised = kind()

    async def interrupted() -> None:
        raise raised

    with pytest.raises(kind) as caught:
        await breaker.execute(interrupted)
    assert caught.value is raised
    assert breaker.snapshot.calls == 0
    assert sink.of("breaker.recorded") == []
    # A probe interrupted this way returns its permit.
    with pytest.raises(Boom):
        await breaker.execute(fail)
    await clock.advance(1)
    with pytest.raises(kind):
        await breaker.execute(interrupted)
    assert breaker.state is BreakerState.HALF_OPEN
    assert await breaker.execute(ok) == "ok"
    assert breaker.state is BreakerState.CLOSED


# --- 5. Clock jumps --------------------------------------------------------------------------
@pytest.fixture
def wall_clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The wall clock under the test's control, from before any policy is built: set
    ``wall_clock[0]`` to move it by that many seconds. (Patched only after construction, a
    policy that had bound ``time.time_ns`` as its clock would never see the jump.)"""
    jump = [0.0]
    real_time, real_time_ns = time.time, time.time_ns
    monkeypatch.setattr(time, "time", lambda: real_time() + jump[0])
    monkeypatch.setattr(time, "time_ns", lambda: real_time_ns() + int(jump[0] * 1e9))
    return jump


JUMPS = (+86_400.0, -86_400.0, +10 * 365 * 86_400.0)


def test_moving_the_wall_clock_does_not_change_the_open_period(wall_clock: list[float]) -> None:
    breaker = CircuitBreaker(label="jump", window=CountWindow(1), minimum_calls=1,
                             open_duration=OpenDuration.fixed(600, jitter=0))  # the system clock
    with pytest.raises(Boom):
        breaker.call(_boom)
    for jump in JUMPS:
        wall_clock[0] = jump
        assert breaker.state is BreakerState.OPEN
        with pytest.raises(CircuitOpen) as caught:
            breaker.call(_fine)
        assert caught.value.retry_after is not None
        assert 599.0 < caught.value.retry_after <= 600.0  # neither shortened nor lengthened


def test_moving_the_wall_clock_changes_no_other_policys_sense_of_time(wall_clock: list[float]) -> None:
    """Report 5, the whole kind: everything stoic measures on the system clock (a time
    window's buckets, a rate limiter's refill, a retry budget's reserve) ignores wall-clock
    jumps: a day forward earns no permit or token and expires no failure; a day back
    freezes nothing."""
    windowed = CircuitBreaker(label="jump-window", window=TimeWindow(600), minimum_calls=2,
                              failure_rate_threshold=1.0)
    limiter = stoic.RateLimiter(1, per=3600.0, label="jump")
    blocking = stoic.BlockingRateLimiter(1, per=3600.0, label="jump")
    budget = stoic.RetryBudget(ratio=0.1, reserve_per_second=1 / 3600, reserve_capacity=1)
    assert limiter.try_acquire() and blocking.try_acquire() and budget.try_spend()
    with pytest.raises(Boom):
        windowed.call(_boom)
    for jump in JUMPS:
        wall_clock[0] = jump
        assert not limiter.try_acquire()
        assert not blocking.try_acquire()
        assert not budget.try_spend()
    with pytest.raises(Boom):
        windowed.call(_boom)  # the first failure is still in the window: two of two failed
    assert windowed.state is BreakerState.OPEN
