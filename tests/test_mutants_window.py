"""The breaker's windows against a reference model, on the lock-free path (issue 9, item 5).

Seed 000, "The window" and "Judging": a count window holds exactly the last N calls; a time
window the calls of the last ten buckets of T / 10 (the current one included). Without a DEBUG
sink the breaker counts quick successes without its lock and folds them into the window in
batches (``successes``), the path the other model tests (which listen at DEBUG) never take.
Sequences are drawn from a fixed seed; the model is the plain list of the calls.
"""

from __future__ import annotations

import random
import threading

import pytest

from stoic import BreakerState, CircuitBreaker, CountWindow, OpenDuration, TimeWindow
from stoic.testing import VirtualClock

START = 1000.0
FAILED, SLOW = 1, 2


class Clock(VirtualClock):
    def __init__(self) -> None:
        super().__init__(START)

    def step_ns(self, ns: int) -> None:
        self._set_now(VirtualClock.now_ns(self) + ns)


class Boom(Exception):
    pass


def snapshot(breaker: CircuitBreaker):  # type: ignore[no-untyped-def]
    snap = breaker.snapshot
    return snap() if callable(snap) else snap


def run(breaker: CircuitBreaker, clock: Clock, code: int, slow_ns: int) -> None:
    def op() -> None:
        if code & SLOW:
            clock.step_ns(slow_ns + 1)
        if code & FAILED:
            raise Boom

    try:
        breaker.call(op)
    except Boom:
        pass


def judge(calls: list[int], minimum: int, failure_ppm: int, slow_ppm: int) -> bool:
    n = len(calls)
    failures = sum(1 for c in calls if c & FAILED)
    slow = sum(1 for c in calls if c & SLOW)
    return n >= minimum and (failures * 10**6 >= failure_ppm * n or slow * 10**6 >= slow_ppm * n)


def counts(calls: list[int]) -> tuple[int, int, int]:
    return len(calls), sum(1 for c in calls if c & FAILED), sum(1 for c in calls if c & SLOW)


def check(breaker: CircuitBreaker, expected: list[int]) -> None:
    snap = snapshot(breaker)
    assert snap.state is BreakerState.CLOSED
    assert (snap.calls, snap.failures, snap.slow_calls) == counts(expected)


@pytest.mark.parametrize("size, minimum", [(1, 1), (5, 3), (8, 8), (16, 4)])
@pytest.mark.parametrize("seed", range(6))
def test_a_count_window_holds_exactly_the_last_n_calls_through_batched_successes(
    size: int, minimum: int, seed: int,
) -> None:
    rng = random.Random(f"count:{size}:{minimum}:{seed}")
    clock = Clock()
    slow_ns = 1_000_000_000
    breaker = CircuitBreaker(
        label="count", window=CountWindow(size), minimum_calls=minimum, failure_rate_threshold=0.6,
        slow_call_rate_threshold=0.6, slow_call_duration=1.0, open_duration=OpenDuration.fixed(1.0, jitter=0.0),
        clock=clock,
    )
    model: list[int] = []
    for _ in range(60):
        # A run of quick successes (sometimes longer than the window), then maybe another call.
        for _ in range(rng.choice([0, 1, 2, size - 1, size, size + 1, 3 * size])):
            run(breaker, clock, 0, slow_ns)
            model = ([*model, 0])[-size:]
            if judge(model, minimum, 600_000, 600_000):
                assert breaker.state is BreakerState.OPEN
                breaker.force_closed()
                model = []
        code = rng.choice([0, FAILED, SLOW, FAILED | SLOW, FAILED])
        run(breaker, clock, code, slow_ns)
        model = ([*model, code])[-size:]
        if judge(model, minimum, 600_000, 600_000):
            assert breaker.state is BreakerState.OPEN
            breaker.force_closed()
            model = []
        if rng.random() < 0.3:
            check(breaker, model)
    check(breaker, model)


@pytest.mark.parametrize("seed", range(8))
def test_a_time_window_holds_the_calls_of_the_last_ten_buckets_through_batched_successes(seed: int) -> None:
    rng = random.Random(f"time:{seed}")
    clock = Clock()
    bucket_ns = 1_000_000_000  # TimeWindow(10): ten buckets of one second
    slow_ns = 5 * bucket_ns  # slow calls are rare and long: they move time a lot
    minimum = 4
    breaker = CircuitBreaker(
        label="time", window=TimeWindow(10.0), minimum_calls=minimum, failure_rate_threshold=0.6,
        slow_call_rate_threshold=0.6, slow_call_duration=5.0, open_duration=OpenDuration.fixed(1.0, jitter=0.0),
        clock=clock,
    )
    model: list[tuple[int, int]] = []  # (bucket of the call's end, code)

    def live() -> list[int]:
        head = clock.now_ns() // bucket_ns
        return [code for bucket, code in model if bucket > head - 10]

    for _ in range(120):
        gap = rng.choice([0, 0, 1, 250_000_000, 999_999_999, bucket_ns, 3 * bucket_ns, 12 * bucket_ns])
        clock.step_ns(gap)
        code = rng.choice([0, 0, 0, 0, FAILED, SLOW])
        run(breaker, clock, code, slow_ns)
        model.append((clock.now_ns() // bucket_ns, code))
        if judge(live(), minimum, 600_000, 600_000):
            assert breaker.state is BreakerState.OPEN
            breaker.force_closed()
            model = []
        else:
            assert breaker.state is BreakerState.CLOSED
        if rng.random() < 0.25:
            check(breaker, live())
    check(breaker, live())


def test_old_buckets_age_out_and_a_success_after_them_is_judged_in_full() -> None:
    clock = Clock()
    breaker = CircuitBreaker(label="age", window=TimeWindow(10.0), minimum_calls=4, failure_rate_threshold=0.5,
                             open_duration=OpenDuration.fixed(1.0, jitter=0.0), clock=clock)
    for _ in range(4):
        run(breaker, clock, 0, 0)  # four quick successes in one bucket
    clock.step_ns(9_000_000_000)
    for _ in range(3):
        run(breaker, clock, FAILED, 0)  # 3 of 7: closed
    assert breaker.state is BreakerState.CLOSED
    clock.step_ns(1_000_000_000)  # the successes' bucket leaves the window
    run(breaker, clock, 0, 0)  # 3 failures of 4: this success trips it
    assert breaker.state is BreakerState.OPEN


class NegativeClock(Clock):
    """A monotonic clock whose readings are negative (its origin is arbitrary, seed 000 "Clock")."""

    def now_ns(self) -> int:
        return super().now_ns() - 2**61


@pytest.mark.parametrize("window", [TimeWindow(10.0), CountWindow(8)])
def test_the_windows_work_on_a_clock_whose_readings_are_negative(window: TimeWindow | CountWindow) -> None:
    clock = NegativeClock()
    breaker = CircuitBreaker(label="negative", window=window, minimum_calls=4, failure_rate_threshold=0.5,
                             open_duration=OpenDuration.fixed(1.0, jitter=0.0), clock=clock)
    for _ in range(2):
        run(breaker, clock, 0, 0)
    assert (snapshot(breaker).calls, breaker.state) == (2, BreakerState.CLOSED)
    for _ in range(2):
        run(breaker, clock, FAILED, 0)  # 2 of 4: at the threshold once minimum_calls are in
    assert breaker.state is BreakerState.OPEN
    breaker.force_closed()
    for _ in range(3):
        run(breaker, clock, FAILED, 0)
    clock.step_ns(20_000_000_000)
    run(breaker, clock, 0, 0)
    if isinstance(window, TimeWindow):  # the failures aged out: one call in the window
        assert (snapshot(breaker).calls, breaker.state) == (1, BreakerState.CLOSED)
    else:  # the last 4 calls: 3 failures
        assert breaker.state is BreakerState.OPEN


def test_a_batch_of_quick_successes_evicts_slow_and_slow_failed_calls_exactly() -> None:
    clock = Clock()
    breaker = CircuitBreaker(label="evict", window=CountWindow(6), minimum_calls=6, failure_rate_threshold=1.0,
                             slow_call_rate_threshold=1.0, slow_call_duration=1.0,
                             open_duration=OpenDuration.fixed(1.0, jitter=0.0), clock=clock)
    for code in (SLOW, FAILED | SLOW, SLOW, FAILED | SLOW, FAILED, FAILED):
        run(breaker, clock, code, 1_000_000_000)
    check(breaker, [SLOW, FAILED | SLOW, SLOW, FAILED | SLOW, FAILED, FAILED])
    for _ in range(4):
        run(breaker, clock, 0, 0)  # quick successes, folded in one batch by the next read
    check(breaker, [FAILED, FAILED, 0, 0, 0, 0])


def test_a_success_bringing_a_time_window_to_minimum_calls_is_judged() -> None:
    clock = Clock()
    breaker = CircuitBreaker(label="judge-at", window=TimeWindow(10.0), minimum_calls=4, failure_rate_threshold=0.5,
                             open_duration=OpenDuration.fixed(1.0, jitter=0.0), clock=clock)
    run(breaker, clock, FAILED, 0)
    run(breaker, clock, FAILED, 0)
    clock.step_ns(1_000_000_000)  # a new bucket: two calls in the older ones
    run(breaker, clock, 0, 0)
    assert breaker.state is BreakerState.CLOSED  # 3 calls: below minimum_calls
    run(breaker, clock, 0, 0)  # the fourth call: 2 failures of 4 reach the threshold
    assert breaker.state is BreakerState.OPEN


class HoldingClock(Clock):
    """A thread listed in ``hold`` reads the time, then waits for its event before it gets it
    (a thread descheduled between finishing its call and recording it)."""

    def __init__(self) -> None:
        super().__init__()
        self.hold: dict[threading.Thread, threading.Event] = {}
        self.held = threading.Event()

    def now_ns(self) -> int:
        value = super().now_ns()
        event = self.hold.pop(threading.current_thread(), None)
        if event is not None:
            self.held.set()
            event.wait(10)
        return value


def test_a_call_recorded_after_a_later_one_counts_in_the_current_bucket() -> None:
    clock = HoldingClock()
    breaker = CircuitBreaker(label="late", window=TimeWindow(10.0), minimum_calls=10, failure_rate_threshold=1.0,
                             open_duration=OpenDuration.fixed(1.0, jitter=0.0), clock=clock)
    release = threading.Event()

    def slow_to_record() -> None:
        clock.hold[threading.current_thread()] = release  # its end is read now, recorded later
        raise Boom

    def call_late() -> None:
        try:
            breaker.call(slow_to_record)
        except Boom:
            pass

    late = threading.Thread(target=call_late, daemon=True)
    late.start()
    assert clock.held.wait(5)
    clock.step_ns(1_000_000_000)
    run(breaker, clock, FAILED, 0)  # recorded first, in the next bucket
    clock.step_ns(1_000_000_000)
    assert snapshot(breaker).calls == 1  # a read in a third bucket: the next call is judged in full
    release.set()
    late.join(5)
    snap = snapshot(breaker)
    assert (snap.calls, snap.failures) == (2, 2)  # the late one counts in the current (third) bucket
    clock.step_ns(9_000_000_000)
    assert snapshot(breaker).calls == 1  # the second bucket has aged out, the third not yet
    clock.step_ns(1_000_000_000)
    assert snapshot(breaker).calls == 0
