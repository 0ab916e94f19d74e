"""A shared breaker's state read from two threads at once (the event loop's calls and a metrics
scrape reading ``.state`` for the ``stoic.breaker.state`` gauge): each transition reaches the
streams and the transitions counter once. The interleaving is forced with a line trace that
holds one reader between its check and its record of the state seen (no timing involved)."""

from __future__ import annotations

import asyncio
import inspect
import sys
import threading
from types import FrameType
from typing import Any

from stoic import BreakerState, CircuitOpen, _metrics
from stoic.fleet import RedisStore, SharedCircuitBreaker
from stoic.fleet import _breaker as fleet_breaker
from stoic.testing import VirtualClock

URL = "redis://127.0.0.1:1/0"  # never connected to: the round trip is replaced


def _answer(store: RedisStore, reply: Any) -> None:
    async def timed(script: Any, keys: Any, args: Any, *rest: Any) -> Any:
        return reply

    store._timed = timed  # type: ignore[method-assign]


def _line_of(function: Any, text: str) -> int:
    lines, first = inspect.getsourcelines(function)
    (offset,) = [i for i, line in enumerate(lines) if line.strip() == text]
    return first + offset


def _held_at(line: int, paused: threading.Event, resume: threading.Event) -> Any:
    code = fleet_breaker.SharedCircuitBreaker._observe.__code__

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line" and frame.f_lineno == line:
            paused.set()
            resume.wait(10)
        return local

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        return local if frame.f_code is code else None

    return tracer


def test_a_transition_seen_by_two_threads_at_once_is_published_and_counted_once() -> None:
    clock = VirtualClock()
    store = RedisStore(URL)
    # st OPEN, trips 1, 5 s left, generation 1, no probe granted, opened for 5 s
    _answer(store, [1, 1, 5000, 1, 0, 5])
    breaker = SharedCircuitBreaker(label="observe-race", store=store, clock=clock)
    stream = breaker.state_changes()
    before = _metrics.state.enabled
    _metrics.enable()
    try:
        async def trip() -> None:
            async def ok() -> int:
                return 1
            try:
                await breaker.execute(ok)
            except CircuitOpen:
                pass
            await clock.advance(6)  # the open period is over: the next read sees half-open

        asyncio.run(trip())
        assert breaker._seen is BreakerState.OPEN
        paused, resume = threading.Event(), threading.Event()
        # held on the first line of the branch taken on a change: after its check, before it records
        line = _line_of(fleet_breaker.SharedCircuitBreaker._observe, "if state is not self._seen:") + 1

        def scrape() -> None:
            sys.settrace(_held_at(line, paused, resume))
            try:
                assert breaker.state is BreakerState.HALF_OPEN
            finally:
                sys.settrace(None)

        reader = threading.Thread(target=scrape)
        reader.start()
        assert paused.wait(10)  # the scrape saw the change and has not recorded it yet
        assert breaker.state is BreakerState.HALF_OPEN  # the event loop's read, meanwhile
        resume.set()
        reader.join(10)
        assert not reader.is_alive()
        recorder = breaker._recorder
        assert recorder is not None
        assert recorder.counters.get(("stoic.breaker.transitions", "half_open")) == 1
    finally:
        _metrics.state.enabled = before

    async def drain() -> list[BreakerState]:
        return [await stream.__anext__() for _ in range(stream.pending)]

    assert asyncio.run(drain()) == [BreakerState.OPEN, BreakerState.HALF_OPEN]
