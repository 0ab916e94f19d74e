"""The breaker's events against the catalog (seed 000, "Events"): every name, level and
attribute set, driven through every path; and nothing built when no sink listens."""

from __future__ import annotations

import asyncio

import pytest
from _breaker_helpers import Boom, Gate, fail, ok, take

import stoic
from stoic import CATALOG, CircuitBreaker, CountWindow, Defect, Level, OpenDuration
from stoic.testing import RecordingSink, VirtualClock, settle


async def test_every_breaker_event_is_emitted_and_matches_the_catalog(clock: VirtualClock, sink: RecordingSink) -> None:
    breaker = CircuitBreaker(label="cat", window=CountWindow(4), minimum_calls=2, slow_call_duration=1.0,
                             half_open_timeout=5.0, open_duration=OpenDuration.fixed(10, jitter=0.1))
    await breaker.execute(ok)  # recorded
    with pytest.raises(Boom):
        await breaker.execute(fail)  # recorded, opened
    with pytest.raises(stoic.CircuitOpen):
        await breaker.execute(ok)  # rejected
    await clock.advance(10)
    gate = Gate()
    probe = asyncio.create_task(breaker.execute(gate.op))  # half_open
    await settle()
    await clock.advance(5)
    assert breaker.state is stoic.BreakerState.OPEN  # probe_timeout
    gate.open()
    await probe  # ignored: stale

    async def bug() -> None:
        raise Defect("bug")

    breaker.force_closed()  # closed (forced)
    with pytest.raises(Defect):
        await breaker.execute(bug)  # defect

    async def refused() -> None:
        raise stoic.BulkheadFull()

    with pytest.raises(stoic.BulkheadFull):
        await breaker.execute(refused)  # ignored: rejection
    breaker.force_open()  # opened (forced)
    breaker.reset()  # closed (reset), reset
    with pytest.raises(stoic.DeadlineExceeded):
        async with stoic.timeout(0):
            await breaker.execute(ok)  # rejected: deadline_exceeded
    await clock.run(breaker.execute(take(clock, 2.0)))  # recorded, slow

    sink.assert_contract()
    emitted = set(sink.names)
    breaker_events = {name for name in CATALOG if name.startswith("breaker.")}
    assert emitted == breaker_events
    for event in sink.events:
        assert event.label == "cat"
        assert event.level is CATALOG[event.name].level
    assert sink.of("breaker.recorded")[-1].attributes["slow"] is True
    assert sink.of("breaker.recorded")[-1].attributes["duration"] == 2.0
    triggers = [e.attributes["trigger"] for e in sink.of("breaker.opened")]
    assert triggers == ["failure_rate", "probe_timeout", "forced"]
    assert [e.attributes["reason"] for e in sink.of("breaker.closed")] == ["forced", "reset"]
    assert sorted({e.attributes["reason"] for e in sink.of("breaker.ignored")}) == ["rejection", "stale"]


async def test_event_times_are_on_the_breaker_clock(clock: VirtualClock, sink: RecordingSink) -> None:
    breaker = CircuitBreaker(label="t", window=CountWindow(1), minimum_calls=1)
    await clock.advance(42)
    with pytest.raises(Boom):
        await breaker.execute(fail)
    assert {e.time_ns for e in sink.events} == {42_000_000_000}


async def test_no_event_is_built_when_no_sink_listens(clock: VirtualClock, monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[str] = []

    def spy(name: str, *args: object) -> None:
        built.append(name)

    from stoic.breaker import _breaker

    monkeypatch.setattr(_breaker, "emit", spy)
    breaker = CircuitBreaker(label="quiet", window=CountWindow(2), minimum_calls=1)
    await breaker.execute(ok)
    with pytest.raises(Boom):
        await breaker.execute(fail)
    with pytest.raises(stoic.CircuitOpen):
        await breaker.execute(ok)
    breaker.reset()
    assert built == []
    with stoic.use_sinks(RecordingSink(level=Level.WARNING)):
        await breaker.execute(ok)
        await breaker.execute(ok)
        assert built == []  # debug events are not built for a warning-level sink
        with pytest.raises(Boom):
            await breaker.execute(fail)  # one failure of two: 50% opens it
    assert built == ["breaker.opened"]


async def test_a_warning_sink_gets_the_opening_but_no_debug_events(clock: VirtualClock) -> None:
    recording = RecordingSink(level=Level.WARNING)
    breaker = CircuitBreaker(label="warn", window=CountWindow(1), minimum_calls=1)
    with stoic.use_sinks(recording):
        await breaker.execute(ok)
        with pytest.raises(Boom):
            await breaker.execute(fail)
    assert recording.names == ["breaker.opened"]
