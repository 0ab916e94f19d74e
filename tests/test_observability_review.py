"""A hostile review of the observability paths: sinks added and removed while events fly,
failing sinks that must not be kept alive, state streams whose consumer's loop is gone or who
fall behind, counters that must never go down, and dashboards checked against the metric table."""

from __future__ import annotations

import asyncio
import gc
import logging
import weakref

import pytest

import stoic
from stoic import BreakerState, CircuitBreaker, CountWindow
from stoic.events import Event, Level

CLOSED, OPEN = BreakerState.CLOSED, BreakerState.OPEN


# ------------------------------------------------------------------ state streams
def test_a_consumer_left_on_a_closed_loop_does_not_break_the_breaker() -> None:
    # Manual loop management: a consumer task is still waiting when its loop is closed. A
    # transition published later from the same thread must not raise "Event loop is closed"
    # out of the breaker (it did: force_open raised RuntimeError, breaker.opened was never emitted).
    breaker = CircuitBreaker(label="closed-loop")
    changes = breaker.state_changes()
    other = breaker.state_changes()
    loop = asyncio.new_event_loop()
    try:
        consumer = loop.create_task(anext(changes))
        loop.run_until_complete(asyncio.sleep(0))
    finally:
        loop.close()
    seen: list[Event] = []

    class Opened:
        def emit(self, event: Event) -> None:
            seen.append(event)

    with stoic.use_sinks(Opened()):
        breaker.force_open()
    assert breaker.state is OPEN
    assert [e.name for e in seen] == ["breaker.opened"]
    assert other.pending() == 1  # the other streams still got the transition
    breaker.force_closed()
    assert other.pending() == 2
    del consumer
