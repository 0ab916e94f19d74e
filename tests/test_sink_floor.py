"""The sinks' floor: one attribute below which no sink in any context wants events, read by hot
paths instead of the context variable. It must never be above what some context's sinks want."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from _breaker_helpers import StepClock

import stoic
from stoic import CircuitBreaker, CountWindow, Level
from stoic.events import _sinks
from stoic.testing import RecordingSink


@pytest.fixture
def fresh_floor(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """As in a process where no scoped sink was ever installed (other tests install them)."""
    assert _sinks._process.entries == ()
    monkeypatch.setattr(_sinks._process, "scoped_floor", _sinks._OFF)
    monkeypatch.setattr(_sinks._process, "scoped_kinds", {})
    monkeypatch.setattr(_sinks._process, "floor", _sinks._OFF)
    saved = {k: (f.process, f.floor) for k, f in _sinks._process.kinds.items()}
    for kind in _sinks._process.kinds.values():
        _sinks._process._refresh(kind)
    yield
    for k, (process, floor) in saved.items():
        _sinks._process.kinds[k].process, _sinks._process.kinds[k].floor = process, floor


def _breaker() -> CircuitBreaker:
    return CircuitBreaker(label="floor", window=CountWindow(10), minimum_calls=1, clock=StepClock())  # type: ignore[arg-type]


@pytest.mark.usefixtures("fresh_floor")
def test_process_sinks_move_the_floor_both_ways() -> None:
    debug = RecordingSink()
    stoic.add_sink(debug)
    try:
        assert _sinks._process.floor == Level.DEBUG
    finally:
        stoic.remove_sink(debug)
    assert _sinks._process.floor == _sinks._OFF


@pytest.mark.usefixtures("fresh_floor")
def test_a_scoped_sink_lowers_the_floor_for_good() -> None:
    with stoic.use_sinks(RecordingSink(level=Level.INFO)):
        assert _sinks._process.floor == Level.INFO
    with stoic.use_sinks(RecordingSink()):
        assert _sinks._process.floor == Level.DEBUG
    assert _sinks._process.floor == Level.DEBUG  # a copied context may still hold the sink


@pytest.mark.usefixtures("fresh_floor")
async def test_a_task_that_outlives_its_sink_block_still_reports_every_success() -> None:
    breaker = _breaker()
    breaker.call(lambda: None)  # reaches minimum_calls: quick successes may now skip the lock
    go = asyncio.Event()
    recording = RecordingSink()

    async def later() -> None:
        await go.wait()
        for _ in range(3):
            breaker.call(lambda: None)

    with stoic.use_sinks(recording):
        task = asyncio.create_task(later())  # copies the context, sinks included
    breaker.call(lambda: None)  # outside the block: no debug sink here, the fast path
    assert breaker._pending_quick() == 1
    go.set()
    await task
    assert len(recording.of("breaker.recorded")) == 3  # the task's context still has the sink
    assert breaker._pending_quick() == 0  # and its successes were judged under the lock


@pytest.mark.usefixtures("fresh_floor")
def test_an_info_sink_keeps_the_fast_path() -> None:
    breaker = _breaker()
    breaker.call(lambda: None)
    with stoic.use_sinks(RecordingSink(level=Level.INFO)):
        for _ in range(5):
            breaker.call(lambda: None)
    assert breaker._pending_quick() == 5



class _WantsOnly:
    """A DEBUG sink naming the events it wants (``event_names``)."""

    level = Level.DEBUG

    def __init__(self, *names: str) -> None:
        self.event_names = frozenset(names)
        self.events: list[stoic.Event] = []

    def emit(self, event: stoic.Event) -> None:
        self.events.append(event)


@pytest.mark.usefixtures("fresh_floor")
def test_a_debug_sink_that_wants_no_breaker_event_keeps_the_breakers_fast_path() -> None:
    breaker = _breaker()
    breaker.call(lambda: None)
    elsewhere = _WantsOnly("hedge.won", "retry.succeeded")
    stoic.add_sink(elsewhere)
    try:
        assert _sinks._process.floor == Level.DEBUG  # the global floor moved...
        assert _sinks.kind_floor("breaker").floor == _sinks._OFF  # ...the breaker's did not
        assert _sinks.kind_floor("hedge").floor == Level.DEBUG
        assert _sinks.min_level("breaker") == _sinks._OFF and _sinks.min_level("retry") == Level.DEBUG
        for _ in range(5):
            breaker.call(lambda: None)
        assert breaker._pending_quick() == 5  # quick successes, no lock, no event built
    finally:
        stoic.remove_sink(elsewhere)
    assert elsewhere.events == []


@pytest.mark.usefixtures("fresh_floor")
def test_a_sink_naming_breaker_events_gets_exactly_those_and_turns_the_fast_path_off() -> None:
    breaker = _breaker()
    breaker.call(lambda: None)
    recorded = _WantsOnly("breaker.recorded")
    with stoic.use_sinks(recorded):
        assert _sinks.kind_floor("breaker").floor == Level.DEBUG
        breaker.call(lambda: None)
        breaker.force_open()  # breaker.opened: not named, not delivered
    assert [e.name for e in recorded.events] == ["breaker.recorded"]


def test_sinks_are_checked_when_installed() -> None:
    class NoLevel:
        level = "debug"

        def emit(self, event: stoic.Event) -> None:
            pass

    class BadNames:
        event_names = "breaker.opened"  # a str, not a collection of names

        def emit(self, event: stoic.Event) -> None:
            pass

    with pytest.raises(TypeError, match="emit"):
        stoic.add_sink(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="emit"):
        stoic.add_sink(object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="level must be"):
        stoic.add_sink(NoLevel())
    with pytest.raises(TypeError, match="event_names"):
        stoic.add_sink(BadNames())
    with pytest.raises(TypeError, match="level must be"), stoic.use_sinks(NoLevel()):
        pass
    assert _sinks._process.entries == ()
