"""Circuit-breaker behaviour that mutation testing found unchecked (issue 9, item 5; docs/mutation.md).

Seed 000, "CircuitBreaker": the snapshot while half-open and while (forced) open, the stream
of transitions around manual control, exact ``retry_after`` and open durations as they grow and
reset, the slow-call boundary, and probes that time out. Synchronous operations move a virtual
clock that starts far from zero, so instants and durations are never confused.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from decimal import Decimal
from fractions import Fraction

import pytest

import stoic
from stoic import BreakerState, CircuitBreaker, CircuitOpen, CountWindow, OpenDuration
from stoic.events import Level
from stoic.testing import RecordingSink, VirtualClock

START = 1000.0
CLOSED, OPEN, HALF_OPEN = BreakerState.CLOSED, BreakerState.OPEN, BreakerState.HALF_OPEN


class Clock(VirtualClock):
    def __init__(self) -> None:
        super().__init__(START)

    def step(self, seconds: float) -> None:
        self._set_now(self.now_ns() + round(seconds * 1e9))


class Boom(Exception):
    pass


def snapshot(breaker: CircuitBreaker):  # type: ignore[no-untyped-def]
    """The snapshot, whether it is read as a property or called (the API is changing to a property)."""
    snap = breaker.snapshot
    return snap() if callable(snap) else snap


def make(clock: Clock, **overrides: object) -> CircuitBreaker:
    config: dict[str, object] = {
        "window": CountWindow(4),
        "minimum_calls": 2,
        "failure_rate_threshold": 0.5,
        "open_duration": OpenDuration.fixed(10.0, jitter=0.0),
        "clock": clock,
    }
    config.update(overrides)
    return CircuitBreaker(label="b", **config)  # type: ignore[arg-type]


def succeed(breaker: CircuitBreaker, clock: Clock, takes: float = 0.0) -> None:
    def op() -> str:
        clock.step(takes)
        return "ok"

    assert breaker.call(op) == "ok"


def failing(breaker: CircuitBreaker, clock: Clock, takes: float = 0.0) -> None:
    def op() -> None:
        clock.step(takes)
        raise Boom

    with pytest.raises(Boom):
        breaker.call(op)


def trip(breaker: CircuitBreaker, clock: Clock, failures: int = 2) -> None:
    for _ in range(failures):
        failing(breaker, clock)
    assert breaker.state is OPEN


@pytest.fixture
def sink() -> Iterator[RecordingSink]:
    """Listening at INFO exactly (DEBUG would take the breaker off its lock-free path)."""
    recording = RecordingSink(level=Level.INFO)
    with stoic.use_sinks(recording):
        yield recording
    recording.assert_contract()


def attributes(sink: RecordingSink, name: str) -> list[dict[str, object]]:
    return [dict(e.attributes) for e in sink.events if e.name == name]


def drain(stream) -> list[BreakerState]:  # type: ignore[no-untyped-def]
    async def read() -> list[BreakerState]:
        return [await stream.__anext__() for _ in range(stream.pending)]

    return asyncio.run(read())


# --------------------------------------------------------------------------- snapshots

def test_the_snapshot_while_open_counts_down_retry_after_and_shows_the_evidence() -> None:
    clock = Clock()
    breaker = make(clock, minimum_calls=3)
    succeed(breaker, clock)
    failing(breaker, clock)
    failing(breaker, clock)  # 3 calls, 2 failures: 67% >= 50%
    snap = snapshot(breaker)
    assert (snap.state, snap.calls, snap.failures, snap.slow_calls, snap.trips) == (OPEN, 3, 2, 0, 1)
    assert snap.failure_rate == 2 / 3 and snap.slow_call_rate == 0.0
    assert snap.retry_after == 10.0
    clock.step(2.5)
    assert snapshot(breaker).retry_after == 7.5
    with pytest.raises(CircuitOpen) as refused:
        succeed(breaker, clock)
    assert refused.value.retry_after == 7.5 and refused.value.label == "b"


def test_the_snapshot_while_half_open_counts_the_probes_only() -> None:
    clock = Clock()
    breaker = make(clock, half_open_probes=3)
    trip(breaker, clock)
    clock.step(9.999999999)
    assert snapshot(breaker).state is OPEN
    clock.step(0.000000001)
    snap = snapshot(breaker)  # reading it applies the move to half-open, exactly at the end
    assert (snap.state, snap.calls, snap.failures, snap.slow_calls, snap.retry_after) == (HALF_OPEN, 0, 0, 0, None)
    assert snap.failure_rate == 0.0 and snap.trips == 1
    succeed(breaker, clock)
    succeed(breaker, clock)
    snap = snapshot(breaker)
    assert (snap.state, snap.calls, snap.failures, snap.slow_calls) == (HALF_OPEN, 2, 0, 0)
    failing(breaker, clock)  # the first failed probe re-opens, with the probes as its evidence
    snap = snapshot(breaker)
    assert (snap.state, snap.calls, snap.failures, snap.slow_calls, snap.trips) == (OPEN, 3, 1, 0, 2)
    assert snap.retry_after == 10.0


def test_the_snapshot_of_a_slow_probe_counts_it_as_slow_and_failed(sink: RecordingSink) -> None:
    clock = Clock()
    breaker = make(clock, slow_call_duration=1.0, half_open_probes=2)
    trip(breaker, clock)
    clock.step(10)
    succeed(breaker, clock, takes=1.5)
    snap = snapshot(breaker)
    assert (snap.state, snap.calls, snap.failures, snap.slow_calls) == (OPEN, 1, 0, 1)
    assert snap.slow_call_rate == 1.0
    assert attributes(sink, "breaker.opened")[-1] == {
        "trigger": "probe_slow", "calls": 1, "failures": 0, "slow_calls": 1, "trips": 2, "open_for": 10.0}


def test_probes_that_all_succeed_close_the_breaker_with_an_empty_window(sink: RecordingSink) -> None:
    clock = Clock()
    breaker = make(clock, half_open_probes=2)
    trip(breaker, clock)
    clock.step(10)
    succeed(breaker, clock)
    assert breaker.state is HALF_OPEN
    succeed(breaker, clock)
    snap = snapshot(breaker)
    assert (snap.state, snap.calls, snap.failures, snap.trips, snap.retry_after) == (CLOSED, 0, 0, 1, None)
    assert attributes(sink, "breaker.closed") == [{"reason": "probes_succeeded"}]
    assert attributes(sink, "breaker.half_open") == [{"probes": 2}]


def test_half_open_refuses_beyond_its_probe_permits_without_retry_after() -> None:
    clock = Clock()
    breaker = make(clock, half_open_probes=1)
    trip(breaker, clock)
    clock.step(10)

    async def main() -> None:
        gate = asyncio.Event()
        probe = asyncio.create_task(breaker.execute(gate.wait))
        await asyncio.sleep(0)
        with pytest.raises(CircuitOpen) as refused:
            await breaker.execute(gate.wait)
        assert refused.value.retry_after is None
        gate.set()
        await probe

    asyncio.run(main())
    assert breaker.state is CLOSED


def test_a_probe_in_flight_for_half_open_timeout_reopens_from_when_it_timed_out(sink: RecordingSink) -> None:
    clock = Clock()
    breaker = make(clock, half_open_timeout=5.0)
    trip(breaker, clock)
    clock.step(10)

    async def main() -> None:
        gate = asyncio.Event()
        probe = asyncio.create_task(breaker.execute(gate.wait))
        await asyncio.sleep(0)
        clock.step(4.999999999)
        assert breaker.state is HALF_OPEN
        clock.step(3.000000001)  # noticed 3 s after the probe timed out
        assert breaker.state is OPEN
        snap = snapshot(breaker)
        assert (snap.calls, snap.failures, snap.trips) == (1, 1, 2)
        assert snap.retry_after == 7.0  # the open period counts from the timeout, not the noticing
        gate.set()
        await probe  # the late probe is stale: it changes nothing

    asyncio.run(main())
    assert breaker.state is OPEN
    assert attributes(sink, "breaker.opened")[-1]["trigger"] == "probe_timeout"


# --------------------------------------------------------------------------- manual control and the stream

def test_state_changes_report_force_open_once_and_every_later_transition(sink: RecordingSink) -> None:
    clock = Clock()
    breaker = make(clock, minimum_calls=3)
    stream = breaker.state_changes()
    succeed(breaker, clock)
    failing(breaker, clock)
    succeed(breaker, clock)
    breaker.force_open()
    breaker.force_open()  # already forced open: no second transition, no second event
    snap = snapshot(breaker)
    assert (snap.state, snap.calls, snap.failures, snap.trips, snap.retry_after) == (OPEN, 3, 1, 0, None)
    clock.step(3600)
    assert breaker.state is OPEN  # a forced-open breaker never half-opens
    with pytest.raises(CircuitOpen) as refused:
        succeed(breaker, clock)
    assert refused.value.retry_after is None
    breaker.force_closed()
    trip(breaker, clock, failures=3)
    clock.step(10)
    assert breaker.state is HALF_OPEN
    breaker.force_open()  # from half-open
    breaker.reset()
    breaker.reset()  # already closed: reported as a reset, but no transition
    assert drain(stream) == [OPEN, CLOSED, OPEN, HALF_OPEN, OPEN, CLOSED]
    forced = [a for a in attributes(sink, "breaker.opened") if a["trigger"] == "forced"]
    assert forced == [
        {"trigger": "forced", "calls": 3, "failures": 1, "slow_calls": 0, "trips": 0},
        {"trigger": "forced", "calls": 0, "failures": 0, "slow_calls": 0, "trips": 1},
    ]
    assert attributes(sink, "breaker.closed") == [{"reason": "forced"}, {"reason": "reset"}]
    assert [e.name for e in sink.events].count("breaker.reset") == 2


def test_force_open_while_open_replaces_the_timed_period_with_no_end() -> None:
    clock = Clock()
    breaker = make(clock)
    trip(breaker, clock)
    breaker.force_open()
    snap = snapshot(breaker)
    assert (snap.state, snap.calls, snap.failures, snap.retry_after) == (OPEN, 2, 2, None)
    clock.step(60)
    assert breaker.state is OPEN


def test_force_closed_keeps_the_trip_count_and_reset_forgets_it(sink: RecordingSink) -> None:
    clock = Clock()
    breaker = make(clock, open_duration=OpenDuration.exponential(1.0, 2.0, 8.0, jitter=0.0))
    trip(breaker, clock)
    breaker.force_closed()
    trip(breaker, clock)
    assert snapshot(breaker).trips == 2 and snapshot(breaker).retry_after == 2.0
    breaker.reset()
    assert snapshot(breaker).trips == 0
    trip(breaker, clock)
    assert snapshot(breaker).retry_after == 1.0


# --------------------------------------------------------------------------- growth and reset of the open period

def test_open_periods_grow_by_the_factor_up_to_the_maximum(sink: RecordingSink) -> None:
    clock = Clock()
    breaker = make(clock, open_duration=OpenDuration.exponential(1.0, 2.0, 8.0, jitter=0.0))
    for _ in range(5):
        trip(breaker, clock)
        clock.step(snapshot(breaker).retry_after)
        failing(breaker, clock)  # the probe fails: open again, for longer
        clock.step(snapshot(breaker).retry_after)
        succeed(breaker, clock)  # the probe succeeds: closed, trip count kept
    opened = [a["open_for"] for a in attributes(sink, "breaker.opened")]
    assert opened == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0, 8.0, 8.0, 8.0, 8.0]


def test_the_trip_count_resets_after_staying_closed_for_reset_after(sink: RecordingSink) -> None:
    clock = Clock()
    duration = OpenDuration.exponential(1.0, 2.0, 8.0, jitter=0.0, reset_after=30.0)
    breaker = make(clock, open_duration=duration)
    trip(breaker, clock)
    clock.step(1)
    succeed(breaker, clock)  # closed again at START + 1
    clock.step(29.999999999)
    trip(breaker, clock)  # closed for just under reset_after: this trip is the second
    assert snapshot(breaker).retry_after == 2.0
    clock.step(2)
    succeed(breaker, clock)
    clock.step(30)
    assert snapshot(breaker).trips == 0  # a snapshot after reset_after shows the fresh start
    trip(breaker, clock)
    assert snapshot(breaker).retry_after == 1.0
    assert [a["trips"] for a in attributes(sink, "breaker.opened")] == [1, 2, 1]


# --------------------------------------------------------------------------- judging

def test_a_call_of_exactly_slow_call_duration_is_not_slow(sink: RecordingSink) -> None:
    clock = Clock()
    breaker = make(clock, slow_call_duration=1.0, slow_call_rate_threshold=0.5, failure_rate_threshold=1.0)
    succeed(breaker, clock, takes=1.0)
    succeed(breaker, clock, takes=1.0)
    snap = snapshot(breaker)
    assert (snap.state, snap.calls, snap.slow_calls) == (CLOSED, 2, 0)
    succeed(breaker, clock, takes=1.000000001)
    snap = snapshot(breaker)
    assert (snap.state, snap.calls, snap.slow_calls) == (CLOSED, 3, 1)
    succeed(breaker, clock, takes=1.000000001)  # 2 slow of 4: at the 50% threshold
    assert breaker.state is OPEN
    assert attributes(sink, "breaker.opened") == [
        {"trigger": "slow_calls", "calls": 4, "failures": 0, "slow_calls": 2, "trips": 1, "open_for": 10.0}]


def test_a_slow_failure_counts_in_both_rates() -> None:
    clock = Clock()
    breaker = make(clock, minimum_calls=3, slow_call_duration=1.0, failure_rate_threshold=1.0,
                   slow_call_rate_threshold=1.0)
    succeed(breaker, clock)
    failing(breaker, clock, takes=2.0)
    snap = snapshot(breaker)
    assert (snap.calls, snap.failures, snap.slow_calls) == (2, 1, 1)
    assert snap.failure_rate == 0.5 and snap.slow_call_rate == 0.5


def test_minimum_calls_is_exact_and_quick_successes_count_towards_it() -> None:
    clock = Clock()
    breaker = make(clock, window=CountWindow(8), minimum_calls=5, failure_rate_threshold=0.5)
    for _ in range(3):
        failing(breaker, clock)
    succeed(breaker, clock)
    assert breaker.state is CLOSED  # 3 of 4 failed, but 4 < minimum_calls
    succeed(breaker, clock)  # the fifth call, a success, makes the window judged: 3 of 5
    assert breaker.state is OPEN


def test_quick_successes_counted_without_the_lock_are_in_the_window() -> None:
    clock = Clock()
    breaker = make(clock, window=CountWindow(6), minimum_calls=4, failure_rate_threshold=0.5)
    for _ in range(4):
        succeed(breaker, clock)  # quick successes: no sink, the window already judged
    failing(breaker, clock)
    failing(breaker, clock)
    assert breaker.state is CLOSED  # 2 failures of 6
    failing(breaker, clock)  # 3 of 6: the quick successes were folded in before judging
    assert breaker.state is OPEN


def test_a_rejection_from_an_inner_policy_is_not_counted() -> None:
    clock = Clock()
    breaker = make(clock)

    def refused() -> None:
        raise stoic.BulkheadFull(label="inner")

    for _ in range(5):
        with pytest.raises(stoic.BulkheadFull):
            breaker.call(refused)
    assert snapshot(breaker).calls == 0 and breaker.state is CLOSED


def test_repr_names_label_state_and_window() -> None:
    clock = Clock()
    breaker = make(clock)
    assert repr(breaker) == "CircuitBreaker(label='b', state=closed, window=CountWindow(4))"
    trip(breaker, clock)
    assert repr(breaker) == "CircuitBreaker(label='b', state=open, window=CountWindow(4))"


def test_every_success_is_recorded_for_a_sink_listening_at_debug() -> None:
    # A DEBUG sink sees breaker.recorded for every call, so no success may take the lock-free path.
    clock = Clock()
    breaker = make(clock, window=CountWindow(8), minimum_calls=2)
    recording = RecordingSink(level=Level.DEBUG)

    async def ok() -> str:
        return "ok"

    async def main() -> None:
        for _ in range(4):
            await breaker.execute(ok)

    with stoic.use_sinks(recording):
        for _ in range(4):
            succeed(breaker, clock)
        asyncio.run(main())
    recorded = [dict(e.attributes) for e in recording.events if e.name == "breaker.recorded"]
    assert recorded == [{"outcome": "success", "slow": False, "state": "closed", "duration": 0.0}] * 8
    assert snapshot(breaker).calls == 8
    recording.assert_contract()


def test_a_sink_listening_below_debug_sees_every_success_and_late_refusal() -> None:
    clock = Clock()
    breaker = make(clock, window=CountWindow(8), minimum_calls=2)
    recording = RecordingSink(level=0)  # type: ignore[arg-type]  (below DEBUG: everything)

    async def late() -> None:
        async with stoic.timeout(0, clock=clock):
            with pytest.raises(stoic.DeadlineExceeded):
                breaker.call(lambda: None)

    with stoic.use_sinks(recording):
        for _ in range(4):
            succeed(breaker, clock)
        asyncio.run(late())
    names = [e.name for e in recording.events]
    assert names == ["breaker.recorded"] * 4 + ["breaker.rejected"]
    assert dict(recording.events[-1].attributes) == {"state": "closed", "reason": "deadline_exceeded"}


def test_a_call_slower_than_a_sub_millisecond_slow_call_duration_is_counted_slow() -> None:
    clock = Clock()
    breaker = make(clock, window=CountWindow(8), minimum_calls=2, slow_call_duration=0.0005,
                   slow_call_rate_threshold=1.0, failure_rate_threshold=1.0)
    succeed(breaker, clock)
    succeed(breaker, clock)  # the window is judged: quick successes may now skip the lock
    succeed(breaker, clock, takes=0.0006)  # slow, though well within the fold interval
    snap = snapshot(breaker)
    assert (snap.calls, snap.slow_calls) == (3, 1)


def test_a_free_probe_permit_admits_nobody_once_a_probe_has_reopened_the_breaker() -> None:
    clock = Clock()
    breaker = make(clock, half_open_probes=2)
    trip(breaker, clock)
    clock.step(10)
    failing(breaker, clock)  # the first probe fails: open again, one permit never used
    with pytest.raises(CircuitOpen) as refused:
        succeed(breaker, clock)
    assert refused.value.retry_after == 10.0
    assert snapshot(breaker).state is OPEN


def test_a_probe_ignored_after_another_timed_out_reports_the_reopening(sink: RecordingSink) -> None:
    clock = Clock()
    breaker = make(clock, half_open_probes=2, half_open_timeout=5.0)
    trip(breaker, clock)
    clock.step(10)

    def refused_later() -> None:
        clock.step(6)  # meanwhile the other probe passes half_open_timeout
        raise stoic.BulkheadFull(label="inner")

    async def main() -> None:
        gate = asyncio.Event()
        hung = asyncio.create_task(breaker.execute(gate.wait))
        await asyncio.sleep(0)
        with pytest.raises(stoic.BulkheadFull):
            breaker.call(refused_later)  # an inner refusal: ignored, and it notices the timeout
        gate.set()
        await hung

    asyncio.run(main())
    assert attributes(sink, "breaker.opened")[-1] == {
        "trigger": "probe_timeout", "calls": 1, "failures": 1, "slow_calls": 0, "trips": 2, "open_for": 10.0}


def test_a_sink_listening_at_exactly_error_receives_breaker_defect_and_the_defect_is_not_counted() -> None:
    clock = Clock()
    breaker = make(clock)
    recording = RecordingSink(level=Level.ERROR)

    def bug() -> None:
        raise stoic.Defect("our own bug")

    with stoic.use_sinks(recording):
        for _ in range(3):
            with pytest.raises(stoic.Defect):
                breaker.call(bug)
    assert [e.name for e in recording.events] == ["breaker.defect"] * 3
    assert dict(recording.events[0].attributes) == {"error.type": "Defect"}
    assert recording.events[0].level == Level.ERROR
    assert breaker.state is CLOSED and snapshot(breaker).calls == 0
    recording.assert_contract()


def test_a_sink_listening_below_debug_sees_the_refusal_of_an_open_breaker() -> None:
    clock = Clock()
    breaker = make(clock)
    trip(breaker, clock)
    recording = RecordingSink(level=0)  # type: ignore[arg-type]  (below DEBUG: everything)
    clock.step(4)
    with stoic.use_sinks(recording), pytest.raises(CircuitOpen):
        succeed(breaker, clock)
    assert [e.name for e in recording.events] == ["breaker.rejected"]
    assert dict(recording.events[0].attributes) == {"state": "open", "retry_after": 6.0}


def test_a_call_lasting_exactly_a_histogram_bound_lands_in_that_bounds_bucket() -> None:
    from stoic import _metrics

    clock = Clock()
    breaker = make(clock, window=CountWindow(100), minimum_calls=100, slow_call_duration=1000.0)
    before = _metrics.state.enabled
    _metrics.enable()
    try:
        for bound in _metrics.DURATION_BUCKETS:
            succeed(breaker, clock, takes=bound)
            failing(breaker, clock, takes=bound)
        recorder = breaker._recorder
        assert recorder is not None
        success = recorder.histograms[("stoic.breaker.call.duration", "success", "")]
        failure = recorder.histograms[("stoic.breaker.call.duration", "failure", "Boom")]
    finally:
        _metrics.state.enabled = before
    one_each = [1] * len(_metrics.DURATION_BUCKETS) + [0]  # le: a bound's own bucket, none above
    assert success.counts == one_each
    assert failure.counts == one_each


def test_force_open_while_half_open_reports_the_evidence_of_the_probes_so_far(sink: RecordingSink) -> None:
    clock = Clock()
    breaker = make(clock, half_open_probes=2)
    trip(breaker, clock)
    clock.step(10)
    succeed(breaker, clock)  # one of the two probes succeeded: still half-open
    assert breaker.state is HALF_OPEN
    breaker.force_open()
    assert attributes(sink, "breaker.opened")[-1] == {
        "trigger": "forced", "calls": 1, "failures": 0, "slow_calls": 0, "trips": 1}
    snap = snapshot(breaker)
    assert (snap.state, snap.calls, snap.failures, snap.retry_after) == (OPEN, 1, 0, None)


def test_pending_quick_successes_count_only_those_since_the_last_fold() -> None:
    clock = Clock()
    breaker = make(clock, window=CountWindow(50), minimum_calls=2)
    for _ in range(2):
        succeed(breaker, clock)  # judged under the lock until the window holds minimum_calls
    for _ in range(4):
        succeed(breaker, clock)
    assert breaker._pending_quick() == 4
    assert snapshot(breaker).calls == 6  # the snapshot folds them in
    assert breaker._pending_quick() == 0
    for _ in range(4):
        succeed(breaker, clock)
    assert breaker._pending_quick() == 4
    assert snapshot(breaker).calls == 10


def test_a_breaker_without_jitter_draws_nothing_from_its_call_sites_jitter_stream() -> None:
    def jittered_open_for(steady_trips_first: bool) -> float | None:
        clock = Clock()
        with stoic.testing.seeded(7):
            steady = make(clock)  # no jitter, made on the same line (the same site) as `jittered`
            jittered = make(clock, open_duration=OpenDuration.fixed(10.0, jitter=0.5))
            if steady_trips_first:
                trip(steady, clock)
            trip(jittered, clock)
            return snapshot(jittered).retry_after

    drawn = jittered_open_for(False)
    assert drawn is not None and 5.0 <= drawn < 10.0
    assert jittered_open_for(True) == drawn


@pytest.mark.parametrize(("parameter", "look_alike"), [
    ("minimum_calls", 10.0),
    ("failure_rate_threshold", Fraction(1, 2)),
    ("slow_call_duration", Decimal(10)),
    ("slow_call_rate_threshold", True),
    ("half_open_probes", True),
    ("half_open_timeout", Decimal(60)),
])
def test_a_value_equal_to_a_default_but_of_a_refused_type_is_refused(parameter: str, look_alike: object) -> None:
    # The defaults skip validation when passed as themselves (``is``): an equal value of another
    # type must still be validated, and refused naming the parameter.
    with pytest.raises((TypeError, ValueError), match=parameter):
        CircuitBreaker(label="b", **{parameter: look_alike})  # type: ignore[arg-type]
