"""Both window kinds against a reference model under random call sequences (seed 000,
"Testing": the model counts the last N calls, or the calls within the bucketed span, directly).

The model keeps every recorded call and recounts from scratch; the breaker keeps running
totals. After every call their open/closed decisions must agree, and whenever the test looks,
the snapshot's counts must equal the model's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction

from _breaker_helpers import Boom, StepClock
from hypothesis import given, settings
from hypothesis import strategies as st

from stoic import BreakerState, CircuitBreaker, CountWindow, OpenDuration, TimeWindow

MS = 1_000_000
SLOW_MS = 100


@dataclass
class Model:
    count: int | None  # N for a count window
    bucket_ns: int | None  # T/10 for a time window
    minimum: int
    failure_ppm: int
    slow_ppm: int
    records: list[tuple[int, bool, bool]] = field(default_factory=list)  # (end_ns, failed, slow)

    def window(self, now_ns: int) -> list[tuple[int, bool, bool]]:
        if self.count is not None:
            return self.records[-self.count:]
        assert self.bucket_ns is not None
        current = now_ns // self.bucket_ns
        return [r for r in self.records if r[0] // self.bucket_ns > current - 10]

    def counts(self, now_ns: int) -> tuple[int, int, int]:
        calls = self.window(now_ns)
        return len(calls), sum(1 for r in calls if r[1]), sum(1 for r in calls if r[2])

    def record(self, end_ns: int, failed: bool, slow: bool) -> bool:
        """Add a call; True when the model says the breaker opens."""
        self.records.append((end_ns, failed, slow))
        calls, failures, slow_calls = self.counts(end_ns)
        if calls < self.minimum:
            return False
        return (Fraction(failures, calls) >= Fraction(self.failure_ppm, 10**6)
                or Fraction(slow_calls, calls) >= Fraction(self.slow_ppm, 10**6))


thresholds = st.sampled_from([0.1, 0.2, 0.25, 1 / 3, 0.5, 0.6, 0.75, 0.9, 1.0]) | st.floats(0.001, 1.0)

_call = st.tuples(
    st.just("call"),
    st.booleans(),  # failed
    st.sampled_from([0, 0, 0, 1, SLOW_MS, SLOW_MS + 1, 2 * SLOW_MS]) | st.integers(0, 3 * SLOW_MS),  # ms taken
    st.booleans(),  # through execute (async) or call (sync)
    st.booleans(),  # take a snapshot afterwards
)
steps = st.lists(
    st.one_of(
        _call,
        _call,
        _call,
        st.tuples(st.just("advance"), st.sampled_from([0, 99, 100, 101, 900, 1_000]) | st.integers(0, 12_000)),
    ),
    max_size=150,
)


def run(breaker: CircuitBreaker, model: Model, clock: StepClock, script: list[tuple[object, ...]]) -> None:
    async def drive() -> None:
        for step in script:
            if step[0] == "advance":
                clock.t += int(step[1]) * MS  # type: ignore[call-overload]
                continue
            _, failed, duration_ms, via_async, observe = step
            slow = int(duration_ms) > SLOW_MS  # type: ignore[call-overload]

            def op(duration_ms: object = duration_ms, failed: object = failed) -> str:
                clock.t += int(duration_ms) * MS  # type: ignore[call-overload]
                if failed:
                    raise Boom("down")
                return "ok"

            async def aop(op: Callable[[], str] = op) -> str:
                return op()

            try:
                if via_async:
                    await breaker.execute(aop)
                else:
                    breaker.call(op)
            except Boom:
                pass
            opens = model.record(clock.t, bool(failed), slow)
            assert breaker.state is (BreakerState.OPEN if opens else BreakerState.CLOSED), (
                f"model says {'open' if opens else 'closed'} at {model.counts(clock.t)}"
            )
            if opens:
                breaker.force_closed()
                model.records.clear()
            if observe:
                snap = breaker.snapshot
                assert (snap.calls, snap.failures, snap.slow_calls) == model.counts(clock.t)

    asyncio.run(drive())


@settings(max_examples=500, deadline=None)
@given(
    size=st.integers(1, 12),
    data=st.data(),
    failure=thresholds,
    slow=thresholds,
    script=steps,
)
def test_count_window_matches_the_model(
    size: int, data: st.DataObject, failure: float, slow: float, script: list[tuple[object, ...]]
) -> None:
    minimum = data.draw(st.integers(1, size))
    clock = StepClock()
    breaker = CircuitBreaker(
        label="model", window=CountWindow(size), minimum_calls=minimum, failure_rate_threshold=failure,
        slow_call_rate_threshold=slow, slow_call_duration=SLOW_MS / 1000, clock=clock,  # type: ignore[arg-type]
        open_duration=OpenDuration.fixed(1, jitter=0),
    )
    model = Model(size, None, minimum, breaker._fppm, breaker._sppm)
    run(breaker, model, clock, script)


@settings(max_examples=500, deadline=None)
@given(
    span_ms=st.sampled_from([1_000, 3_000, 10_000]),
    minimum=st.integers(1, 15),
    failure=thresholds,
    slow=thresholds,
    script=steps,
    start_ms=st.integers(0, 10_000),
)
def test_time_window_matches_the_model(
    span_ms: int, minimum: int, failure: float, slow: float, script: list[tuple[object, ...]], start_ms: int
) -> None:
    clock = StepClock()
    clock.t = start_ms * MS
    breaker = CircuitBreaker(
        label="model", window=TimeWindow(span_ms / 1000), minimum_calls=minimum, failure_rate_threshold=failure,
        slow_call_rate_threshold=slow, slow_call_duration=SLOW_MS / 1000, clock=clock,  # type: ignore[arg-type]
        open_duration=OpenDuration.fixed(1, jitter=0),
    )
    model = Model(None, span_ms * MS // 10, minimum, breaker._fppm, breaker._sppm)
    run(breaker, model, clock, script)


def test_the_ppm_comparison_is_exact_at_the_boundary() -> None:
    # 1/3 is 333_333 ppm: 1 failure in 3 calls is 333_333.33.. ppm >= 333_333 -> opens;
    # with a float division 1/3 >= 0.333333 would agree, but 0.1 * 3 == 0.30000000000000004 would not.
    clock = StepClock()
    breaker = CircuitBreaker(label="ppm", window=CountWindow(10), minimum_calls=10, failure_rate_threshold=0.3,
                             clock=clock)  # type: ignore[arg-type]
    for _ in range(7):
        breaker.call(lambda: None)
    for _ in range(3):
        try:
            breaker.call(_boom)
        except Boom:
            pass
    assert breaker.state is BreakerState.OPEN  # exactly 30% trips


def _boom() -> None:
    raise Boom("down")


def test_a_success_after_a_snapshot_aged_out_old_successes_is_judged_in_full() -> None:
    clock = StepClock()
    breaker = CircuitBreaker(label="aged", window=TimeWindow(10), minimum_calls=4, failure_rate_threshold=0.6,
                             clock=clock)  # type: ignore[arg-type]
    for _ in range(4):
        breaker.call(lambda: None)  # t = 0
    clock.t = 5 * 10**9
    for _ in range(4):
        try:
            breaker.call(_boom)
        except Boom:
            pass
    assert breaker.state is BreakerState.CLOSED  # 4 of 8: 50% < 60%
    clock.t = 10 * 10**9
    assert breaker.snapshot.calls == 4  # the successes aged out; nothing judged yet
    breaker.call(lambda: None)  # 4 failures of 5 calls: 80%
    assert breaker.state is BreakerState.OPEN
