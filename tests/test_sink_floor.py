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
    monkeypatch.setattr(_sinks._process, "floor", _sinks._OFF)
    yield


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
