"""The breaker's state machine on virtual time (seed 000, "CircuitBreaker": states, judging,
open duration and growth, half-open probes, manual control)."""

from __future__ import annotations

import asyncio

import pytest
from _breaker_helpers import Boom, Gate, StepClock, fail, ok, take

import stoic
from stoic import BreakerState, CircuitBreaker, CircuitOpen, CountWindow, OpenDuration, TimeWindow
from stoic.testing import RecordingSink, VirtualClock


def make(**overrides: object) -> CircuitBreaker:
    config: dict[str, object] = {
        "window": CountWindow(10),
        "minimum_calls": 4,
        "failure_rate_threshold": 0.5,
        "open_duration": OpenDuration.fixed(10.0, jitter=0.0),
    }
    config.update(overrides)
    return CircuitBreaker(label="api", **config)  # type: ignore[arg-type]


async def run_failures(breaker: CircuitBreaker, count: int) -> None:
    for _ in range(count):
        with pytest.raises(Boom):
            await breaker.execute(fail)


async def test_stays_closed_below_minimum_calls_then_a_success_can_trip(
    clock: VirtualClock, sink: RecordingSink
) -> None:
    breaker = make(minimum_calls=5)
    await run_failures(breaker, 4)  # 100% failures, but only 4 calls
    assert breaker.state is BreakerState.CLOSED
    assert await breaker.execute(ok) == "ok"  # 5 calls, 4 failures: 80% >= 50%
    assert breaker.state is BreakerState.OPEN
    (opened,) = sink.of("breaker.opened")
    assert dict(opened.attributes) == {
        "trigger": "failure_rate", "calls": 5, "failures": 4, "slow_calls": 0, "trips": 1, "open_for": 10.0,
    }
    assert opened.label == "api"


async def test_opens_exactly_at_the_threshold_not_before(clock: VirtualClock) -> None:
    breaker = make(minimum_calls=4, failure_rate_threshold=0.5)
    for _ in range(3):
        await breaker.execute(ok)
    await run_failures(breaker, 2)  # 5 calls, 2 failures: 40%
    assert breaker.state is BreakerState.CLOSED
    await run_failures(breaker, 1)  # 6 calls, 3 failures: exactly 50% trips (>=)
    assert breaker.state is BreakerState.OPEN


async def test_threshold_of_one_needs_every_call_to_fail(clock: VirtualClock) -> None:
    breaker = make(failure_rate_threshold=1.0)
    await breaker.execute(ok)
    await run_failures(breaker, 9)
    assert breaker.state is BreakerState.CLOSED  # the window still holds one success
    await run_failures(breaker, 1)  # the success is evicted: 10 of 10 failed
    assert breaker.state is BreakerState.OPEN


async def test_slow_calls_trip_the_breaker(clock: VirtualClock, sink: RecordingSink) -> None:
    breaker = make(slow_call_duration=1.0, slow_call_rate_threshold=0.5)
    await breaker.execute(ok)
    await breaker.execute(ok)
    assert await clock.run(breaker.execute(take(clock, 1.0))) == "done"  # exactly 1 s: not slow
    assert breaker.state is BreakerState.CLOSED
    assert await clock.run(breaker.execute(take(clock, 1.5))) == "done"
    assert breaker.state is BreakerState.CLOSED  # 1 slow of 4
    assert await clock.run(breaker.execute(take(clock, 2.0))) == "done"
    assert breaker.state is BreakerState.CLOSED  # 2 slow of 5: 40%
    await clock.run(breaker.execute(take(clock, 2.0)))
    assert breaker.state is BreakerState.OPEN  # 3 of 6
    (opened,) = sink.of("breaker.opened")
    assert opened.attributes["trigger"] == "slow_calls"
    assert opened.attributes["slow_calls"] == 3
    slow_flags = [e.attributes["slow"] for e in sink.of("breaker.recorded")]
    assert slow_flags == [False, False, False, True, True, True]


async def test_a_slow_failure_counts_in_both_rates(clock: VirtualClock) -> None:
    breaker = make(slow_call_duration=1.0, minimum_calls=10)
    with pytest.raises(Boom):
        await clock.run(breaker.execute(take(clock, 2.0, error=Boom())))
    snap = breaker.snapshot
    assert (snap.calls, snap.failures, snap.slow_calls) == (1, 1, 1)
    assert snap.failure_rate == 1.0 and snap.slow_call_rate == 1.0


async def test_open_rejects_with_the_exact_time_left(clock: VirtualClock, sink: RecordingSink) -> None:
    breaker = make()
    await run_failures(breaker, 4)
    assert breaker.state is BreakerState.OPEN
    await clock.advance(3.25)
    calls = 0

    async def counted() -> str:
        nonlocal calls
        calls += 1
        return "ran"

    with pytest.raises(CircuitOpen) as caught:
        await breaker.execute(counted)
    assert calls == 0
    assert caught.value.retry_after == pytest.approx(6.75, abs=1e-12)
    assert caught.value.label == "api"
    assert caught.value.reason is stoic.RejectionReason.CIRCUIT_OPEN
    rejected = sink.of("breaker.rejected")[-1]
    assert dict(rejected.attributes) == {"state": "open", "retry_after": caught.value.retry_after}
    snap = breaker.snapshot
    assert snap.state is BreakerState.OPEN and snap.retry_after == pytest.approx(6.75)
    assert (snap.calls, snap.failures) == (4, 4)  # the evidence that tripped it


async def test_half_open_is_observed_lazily_when_the_period_ends(clock: VirtualClock, sink: RecordingSink) -> None:
    breaker = make()
    await run_failures(breaker, 4)
    await clock.advance(9.999999999)
    assert breaker.state is BreakerState.OPEN
    await clock.advance(0.000000001)
    assert sink.of("breaker.half_open") == []  # nothing runs in the background
    assert breaker.state is BreakerState.HALF_OPEN
    (half_open,) = sink.of("breaker.half_open")
    assert dict(half_open.attributes) == {"probes": 1}


async def test_exactly_n_concurrent_probes_and_the_rest_rejected(clock: VirtualClock, sink: RecordingSink) -> None:
    breaker = make(half_open_probes=3)
    await run_failures(breaker, 4)
    await clock.advance(10)
    gate = Gate()
    tasks = [asyncio.create_task(breaker.execute(gate.op)) for _ in range(300)]
    await stoic.testing.settle()
    assert gate.started == 3
    rejected = [t for t in tasks if t.done()]
    assert len(rejected) == 297
    for task in rejected:
        error = task.exception()
        assert isinstance(error, CircuitOpen) and error.retry_after is None
    assert breaker.state is BreakerState.HALF_OPEN
    gate.open()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert results.count("done") == 3
    assert breaker.state is BreakerState.CLOSED
    assert sink.of("breaker.closed")[-1].attributes["reason"] == "probes_succeeded"
    assert breaker.snapshot.calls == 0  # closed with an empty window


async def test_a_probe_success_does_not_hand_its_permit_on(clock: VirtualClock) -> None:
    breaker = make(half_open_probes=2)
    await run_failures(breaker, 4)
    await clock.advance(10)
    assert await breaker.execute(ok) == "ok"  # first probe succeeds: one permit left
    gate = Gate()
    second = asyncio.create_task(breaker.execute(gate.op))
    await stoic.testing.settle()
    with pytest.raises(CircuitOpen):
        await breaker.execute(ok)  # both permits are used for this episode
    gate.open()
    assert await second == "done"
    assert breaker.state is BreakerState.CLOSED


async def test_probe_failure_reopens_for_longer(clock: VirtualClock, sink: RecordingSink) -> None:
    breaker = make(open_duration=OpenDuration.exponential(initial=10, factor=2, maximum=35, jitter=0))
    await run_failures(breaker, 4)
    expected = [10.0, 20.0, 35.0, 35.0]  # x2 per consecutive trip, capped at the maximum
    for trip, open_for in enumerate(expected, start=1):
        assert breaker.snapshot.retry_after == pytest.approx(open_for)
        assert breaker.snapshot.trips == trip
        await clock.advance(open_for)
        if trip < len(expected):
            with pytest.raises(Boom):
                await breaker.execute(fail)  # the probe fails
    opened = sink.of("breaker.opened")
    assert [e.attributes["open_for"] for e in opened] == expected
    assert [e.attributes["trigger"] for e in opened] == ["failure_rate"] + ["probe_failed"] * 3
    assert [e.attributes["trips"] for e in opened] == [1, 2, 3, 4]
    assert dict(opened[1].attributes) | {} == {
        "trigger": "probe_failed", "calls": 1, "failures": 1, "slow_calls": 0, "trips": 2, "open_for": 20.0,
    }


async def test_a_slow_probe_is_a_failed_probe(clock: VirtualClock, sink: RecordingSink) -> None:
    breaker = make(slow_call_duration=1.0)
    await run_failures(breaker, 4)
    await clock.advance(10)
    assert await clock.run(breaker.execute(take(clock, 1.5))) == "done"  # the caller still gets its result
    assert breaker.state is BreakerState.OPEN
    assert sink.of("breaker.opened")[-1].attributes["trigger"] == "probe_slow"
    assert sink.of("breaker.opened")[-1].attributes["slow_calls"] == 1


async def test_trip_count_resets_only_after_staying_closed_for_reset_after(clock: VirtualClock) -> None:
    duration = OpenDuration.exponential(initial=10, factor=2, maximum=100, jitter=0, reset_after=50)
    breaker = make(open_duration=duration)

    async def trip_and_recover() -> float:
        await run_failures(breaker, 4)
        open_for = breaker.snapshot.retry_after
        assert open_for is not None
        await clock.advance(open_for)
        await breaker.execute(ok)  # the probe succeeds: closed
        assert breaker.state is BreakerState.CLOSED
        return open_for

    assert await trip_and_recover() == 10.0
    assert await trip_and_recover() == 20.0  # closing did not reset the count
    await clock.advance(49.9)
    assert await trip_and_recover() == 40.0  # closed 49.9 s < 50 s: still growing
    await clock.advance(50)
    assert breaker.snapshot.trips == 0  # sustained health: a fresh start
    assert await trip_and_recover() == 10.0


async def test_reset_after_defaults_to_the_maximum(clock: VirtualClock) -> None:
    duration = OpenDuration.exponential(initial=1, factor=3, maximum=20, jitter=0)
    assert duration.reset_after == 20.0
    breaker = make(open_duration=duration)
    await run_failures(breaker, 4)
    await clock.advance(1)
    await breaker.execute(ok)
    await clock.advance(19.999)
    assert breaker.snapshot.trips == 1
    await clock.advance(0.001)
    assert breaker.snapshot.trips == 0


async def test_jitter_only_shortens_and_is_reproducible_under_a_seed(clock: VirtualClock) -> None:
    def open_periods(seed: int) -> list[float]:
        periods = []
        with stoic.testing.seeded(seed):
            for _ in range(20):
                breaker = CircuitBreaker(
                    label="j", window=CountWindow(1), minimum_calls=1,
                    open_duration=OpenDuration.fixed(10.0, jitter=0.5),
                )
                with pytest.raises(Boom):
                    breaker.call(_raise_boom)
                retry_after = breaker.snapshot.retry_after
                assert retry_after is not None
                periods.append(retry_after)
        return periods

    first = open_periods(7)
    assert first == open_periods(7)
    assert all(5.0 <= p <= 10.0 for p in first)
    assert len(set(first)) > 1  # each trip draws anew


def _raise_boom() -> None:
    raise Boom("down")


async def test_force_open_has_no_end_and_is_never_probed(clock: VirtualClock, sink: RecordingSink) -> None:
    breaker = make()
    breaker.force_open()
    assert breaker.state is BreakerState.OPEN
    await clock.advance(10_000)
    assert breaker.state is BreakerState.OPEN
    with pytest.raises(CircuitOpen) as caught:
        await breaker.execute(ok)
    assert caught.value.retry_after is None
    assert breaker.snapshot.retry_after is None
    (opened,) = sink.of("breaker.opened")
    assert opened.attributes["trigger"] == "forced" and "open_for" not in opened.attributes
    assert dict(sink.of("breaker.rejected")[-1].attributes) == {"state": "open"}
    breaker.force_open()  # idempotent: no second event
    assert len(sink.of("breaker.opened")) == 1


async def test_force_closed_closes_now_with_an_empty_window_and_is_not_a_latch(
    clock: VirtualClock, sink: RecordingSink
) -> None:
    breaker = make()
    await run_failures(breaker, 3)
    breaker.force_open()
    breaker.force_closed()
    assert breaker.state is BreakerState.CLOSED
    assert breaker.snapshot.calls == 0
    assert sink.of("breaker.closed")[-1].attributes["reason"] == "forced"
    await run_failures(breaker, 4)  # judging resumes
    assert breaker.state is BreakerState.OPEN
    assert breaker.snapshot.trips == 1  # forcing open did not count as a trip


async def test_force_closed_keeps_the_trip_count_and_reset_forgets_it(clock: VirtualClock, sink: RecordingSink) -> None:
    breaker = make(open_duration=OpenDuration.exponential(initial=10, factor=2, maximum=100, jitter=0))
    await run_failures(breaker, 4)
    breaker.force_closed()
    await run_failures(breaker, 4)
    assert breaker.snapshot.retry_after == 20.0  # second consecutive trip
    sink.clear()
    breaker.reset()
    assert sink.names == ["breaker.closed", "breaker.reset"]
    assert sink.of("breaker.closed")[0].attributes["reason"] == "reset"
    assert breaker.snapshot.trips == 0
    await run_failures(breaker, 4)
    assert breaker.snapshot.retry_after == 10.0


async def test_reset_when_closed_still_forgets_the_trips(clock: VirtualClock, sink: RecordingSink) -> None:
    breaker = make()
    await run_failures(breaker, 4)
    breaker.force_closed()
    sink.clear()
    breaker.reset()
    assert sink.names == ["breaker.reset"]  # already closed: no transition to report
    assert breaker.snapshot.trips == 0


async def test_probe_timeout_reopens_and_the_late_probe_is_stale(clock: VirtualClock, sink: RecordingSink) -> None:
    breaker = make(half_open_timeout=5.0, slow_call_duration=100.0)
    await run_failures(breaker, 4)
    await clock.advance(10)
    hung = Gate()
    probe = asyncio.create_task(breaker.execute(hung.op))
    await stoic.testing.settle()
    with pytest.raises(CircuitOpen) as caught:
        await breaker.execute(ok)  # permit taken
    assert caught.value.retry_after is None
    await clock.advance(4.999)
    assert breaker.state is BreakerState.HALF_OPEN
    await clock.advance(0.001)
    assert breaker.state is BreakerState.OPEN  # the state read noticed the hung probe
    opened = sink.of("breaker.opened")[-1]
    assert opened.attributes["trigger"] == "probe_timeout"
    assert opened.attributes["trips"] == 2
    sink.clear()
    hung.open()
    assert await probe == "done"  # the caller still gets its result
    assert [dict(e.attributes) for e in sink.of("breaker.ignored")] == [{"reason": "stale"}]
    assert breaker.state is BreakerState.OPEN


async def test_probe_timeout_is_noticed_by_the_next_call(clock: VirtualClock) -> None:
    breaker = make(half_open_timeout=5.0, open_duration=OpenDuration.fixed(10.0, jitter=0.0))
    await run_failures(breaker, 4)
    await clock.advance(10)
    hung = Gate()
    probe = asyncio.create_task(breaker.execute(hung.op))
    await stoic.testing.settle()
    await clock.advance(6)
    with pytest.raises(CircuitOpen) as caught:
        await breaker.execute(ok)
    assert caught.value.retry_after == pytest.approx(9.0)  # re-opened at t=15 (timeout), now t=16
    probe.cancel()
    with pytest.raises(asyncio.CancelledError):
        await probe


async def test_time_window_forgets_old_failures(clock: VirtualClock) -> None:
    breaker = make(window=TimeWindow(10.0), minimum_calls=4)
    await run_failures(breaker, 3)
    await clock.advance(10.0)  # their bucket has aged out
    assert breaker.snapshot.calls == 0
    await run_failures(breaker, 1)
    assert breaker.state is BreakerState.CLOSED
    assert breaker.snapshot.calls == 1


async def test_time_window_spans_nine_to_ten_buckets(clock: VirtualClock) -> None:
    breaker = make(window=TimeWindow(10.0), minimum_calls=100)
    await clock.advance(0.5)
    await run_failures(breaker, 2)  # bucket [0, 1)
    await clock.advance(9.0)  # t = 9.5: bucket [9, 10); [0, 1) is still inside
    assert breaker.snapshot.calls == 2
    await clock.advance(0.5)  # t = 10.0: bucket [10, 11); [0, 1) has aged out
    assert breaker.snapshot.calls == 0


def test_sync_call_runs_the_same_state_machine() -> None:
    clock = StepClock()
    breaker = CircuitBreaker(label="sync", window=CountWindow(4), minimum_calls=2, clock=clock,
                             open_duration=OpenDuration.fixed(5, jitter=0))
    assert breaker.call(lambda: 41 + 1) == 42
    with pytest.raises(Boom):
        breaker.call(_raise_boom)
    assert breaker.state is BreakerState.OPEN
    with pytest.raises(CircuitOpen) as caught:
        breaker.call(lambda: 1)
    assert caught.value.retry_after == 5.0
    clock.t += 5_000_000_000
    assert breaker.call(lambda: "probe") == "probe"
    assert breaker.state is BreakerState.CLOSED


async def test_the_clock_is_fixed_at_construction(clock: VirtualClock) -> None:
    breaker = make()
    other = VirtualClock(start=1_000.0)
    with stoic.use_clock(other):
        await run_failures(breaker, 4)
        assert breaker.snapshot.retry_after == 10.0  # measured on the construction clock
    await clock.advance(10)
    assert breaker.state is BreakerState.HALF_OPEN
