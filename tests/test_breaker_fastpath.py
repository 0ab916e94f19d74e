"""The closed-state fast path: quick successes counted without the lock and folded into the
window later must give exactly the counts and decisions of recording each one at once."""

from __future__ import annotations

import functools

import pytest
from _breaker_helpers import Boom, StepClock

import stoic
from stoic import BreakerState, CircuitBreaker, CountWindow, TimeWindow
from stoic.testing import RecordingSink

MS = 1_000_000


def _boom() -> None:
    raise Boom("down")


def _fail(breaker: CircuitBreaker) -> None:
    with pytest.raises(Boom):
        breaker.call(_boom)


@pytest.mark.parametrize("window", [CountWindow(50), TimeWindow(60)])
def test_quick_successes_are_deferred_then_folded_exactly(window: CountWindow | TimeWindow) -> None:
    clock = StepClock()
    breaker = CircuitBreaker(label="fast", window=window, minimum_calls=5, failure_rate_threshold=0.5,
                             clock=clock)  # type: ignore[arg-type]
    for _ in range(4):
        breaker.call(lambda: None)
    assert breaker._pending_quick() == 0  # below minimum_calls every success is judged at once
    breaker.call(lambda: None)
    for _ in range(20):
        breaker.call(lambda: None)
    assert breaker._pending_quick() == 20  # deferred: counted without the lock
    snap = breaker.snapshot
    assert (snap.calls, snap.failures) == (25, 0)
    assert breaker._pending_quick() == 0  # the snapshot folded them in
    for _ in range(24):
        _fail(breaker)
    assert breaker.state is BreakerState.CLOSED  # 24 of 49
    _fail(breaker)
    assert breaker.state is BreakerState.OPEN  # 25 of 50: exactly at the threshold


def test_deferred_successes_are_folded_before_a_failure_is_judged() -> None:
    clock = StepClock()
    breaker = CircuitBreaker(label="order", window=CountWindow(4), minimum_calls=4, failure_rate_threshold=0.75,
                             clock=clock)  # type: ignore[arg-type]
    for _ in range(3):
        _fail(breaker)
    breaker.call(lambda: None)  # reaches minimum_calls: 3 of 4 failed -> opens
    assert breaker.state is BreakerState.OPEN
    breaker.reset()
    breaker.call(lambda: None)
    for _ in range(3):
        breaker.call(lambda: None)  # calls == 4 from the 4th on: later successes are deferred
    for _ in range(2):
        breaker.call(lambda: None)
    assert breaker._pending_quick() == 2
    _fail(breaker)
    _fail(breaker)  # ring: S S F F (the deferred successes went in first)
    assert breaker.state is BreakerState.CLOSED
    _fail(breaker)  # S F F F: 75%
    assert breaker.state is BreakerState.OPEN


@pytest.mark.parametrize("window", [CountWindow(10), TimeWindow(60)])
def test_quick_successes_skip_the_lock_at_one_call_per_10_ms_and_stay_exact(
    window: CountWindow | TimeWindow, monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = StepClock()
    breaker = CircuitBreaker(label="slow-rate", window=window, minimum_calls=5, clock=clock)  # type: ignore[arg-type]
    locked = 0
    settle = CircuitBreaker._settle

    def counting(self: CircuitBreaker, *args: object) -> None:
        nonlocal locked
        locked += 1
        settle(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(CircuitBreaker, "_settle", counting)
    for _ in range(2950):  # 29.5 s at one call per 10 ms
        clock.t += 10 * MS
        breaker.call(lambda: None)
    # Below minimum_calls every success is judged under the lock; then a time window takes it
    # once per bucket (6 s: 5 buckets in 30 s), a count window once per slow_call_duration
    # (10 s: its proof that a call was quick lasts that long from the step that placed it).
    assert locked <= (5 + 6 if isinstance(window, TimeWindow) else 5 + 3)
    assert breaker._pending_quick() > 0  # counted without the lock: one integer, nothing stored per call
    expected = 10 if isinstance(window, CountWindow) else 2950
    assert breaker.snapshot.calls == expected
    assert breaker._pending_quick() == 0
    _fail(breaker)
    assert breaker.snapshot.failures == 1


def test_a_time_window_bucket_change_folds_and_judges() -> None:
    clock = StepClock()
    breaker = CircuitBreaker(label="bucket", window=TimeWindow(10), minimum_calls=2, failure_rate_threshold=0.5,
                             clock=clock)  # type: ignore[arg-type]
    breaker.call(lambda: None)
    breaker.call(lambda: None)
    _fail(breaker)  # 1 of 3
    clock.t = 10 * 1_000_000_000 + 1  # bucket [0 s, 1 s) has aged out with all three calls
    _fail(breaker)
    assert breaker.snapshot.calls == 1
    assert breaker.state is BreakerState.CLOSED  # one call: below minimum_calls
    breaker.call(lambda: None)  # 1 of 2 failed: 50%
    assert breaker.state is BreakerState.OPEN


def test_a_debug_sink_sees_every_success_recorded() -> None:
    clock = StepClock()
    breaker = CircuitBreaker(label="debug", window=CountWindow(10), minimum_calls=1, clock=clock)  # type: ignore[arg-type]
    recording = RecordingSink()
    with stoic.use_sinks(recording):
        for _ in range(30):
            breaker.call(lambda: None)
    assert len(recording.of("breaker.recorded")) == 30
    info = RecordingSink(level=stoic.Level.INFO)
    with stoic.use_sinks(info):
        for _ in range(30):
            breaker.call(lambda: None)
    assert breaker._pending_quick() == 30  # an info sink does not need the slow path
    assert info.events == []


def test_a_process_wide_debug_sink_disables_deferral() -> None:
    clock = StepClock()
    breaker = CircuitBreaker(label="global", window=CountWindow(10), minimum_calls=1, clock=clock)  # type: ignore[arg-type]
    recording = RecordingSink()
    stoic.add_sink(recording)
    try:
        for _ in range(5):
            breaker.call(lambda: None)
    finally:
        stoic.remove_sink(recording)
    assert len(recording.of("breaker.recorded")) == 5
    assert breaker._pending_quick() == 0


@pytest.mark.parametrize("window", [CountWindow(10), TimeWindow(60)])
@pytest.mark.parametrize("through", ["decorator", "call"])
def test_a_retuned_slow_call_duration_applies_to_the_lock_free_path_at_once(
    window: CountWindow | TimeWindow, through: str,
) -> None:
    # A @breaker wrapper made before the retune once kept the old slow_call_duration on its
    # lock-free path, so a 2 s success counted as quick under a 1 s threshold.
    clock = StepClock()
    breaker = CircuitBreaker(label="retuned", window=window, minimum_calls=2, clock=clock)  # type: ignore[arg-type]

    def two_seconds() -> int:
        clock.t += 2_000_000_000
        return 1

    slow = breaker(two_seconds) if through == "decorator" else functools.partial(breaker.call, two_seconds)
    quick = breaker(lambda: 1)
    quick()
    quick()
    slow()  # 2 s < 10 s: quick, taken without the lock
    assert breaker.snapshot.slow_calls == 0
    breaker._retune(slow_call_duration=1.0)
    quick()
    quick()  # the new window holds minimum_calls: the lock-free path is open again
    slow()
    snap = breaker.snapshot
    assert (snap.calls, snap.slow_calls) == (3, 1)


@pytest.mark.parametrize("window", [CountWindow(1000), TimeWindow(600)])
def test_a_call_proven_quick_by_two_comparisons_is_never_a_slow_one(window: CountWindow | TimeWindow) -> None:
    # The lock-free path proves a success quick when it started at or after _quick_from and
    # ended before _defer_until, placed exactly slow_call_duration apart from a locked step. A
    # count window (and a time window whose bucket outlasts slow_call_duration) places them from
    # that step; each call below lasts just under, exactly at, or just over the slow limit, and
    # starts at every offset from the pair's placement.
    clock = StepClock()
    breaker = CircuitBreaker(label="proof", window=window, minimum_calls=1, slow_call_duration=1.0,
                             slow_call_rate_threshold=1.0, failure_rate_threshold=1.0, clock=clock)  # type: ignore[arg-type]
    expected_slow = 0
    calls = 0
    for gap_ms in (0, 1, 400, 999, 1000, 1001, 2500):
        for duration_ms in (0, 999, 1000, 1001, 3000):
            clock.t += gap_ms * MS

            def op(duration_ms: int = duration_ms) -> None:
                clock.t += duration_ms * MS

            breaker.call(op)
            calls += 1
            expected_slow += duration_ms > 1000  # slow: strictly longer than slow_call_duration
    # A call in flight across the locked step that placed the pair started before it: timed by
    # subtraction, so 1.4 s is slow even though it ends well inside the pair.
    def inner_fails() -> None:
        clock.t += 10 * MS
        raise Boom("a failure takes the locked step, which places the pair")

    def outer() -> None:
        clock.t += 500 * MS
        with pytest.raises(Boom):
            breaker.call(inner_fails)
        clock.t += 900 * MS

    breaker.call(outer)
    calls += 2
    expected_slow += 1
    snapshot = breaker.snapshot
    assert (snapshot.calls, snapshot.failures, snapshot.slow_calls) == (calls, 1, expected_slow)
