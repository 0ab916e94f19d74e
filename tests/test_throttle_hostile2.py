"""Hostile review of the adaptive throttle and the adaptive bulkheads (seed 003): what they
have learnt about a failing dependency must survive the places that forget policies."""

from __future__ import annotations

import contextlib

from stoic import AdaptiveThrottle, Keyed, Throttled
from stoic.keyed import at_rest
from stoic.testing import VirtualClock


async def _down() -> None:
    raise ConnectionError("down")


async def _up() -> str:
    return "ok"


async def test_a_keyed_throttle_that_is_shedding_is_not_at_rest_and_not_evicted(clock: VirtualClock) -> None:
    # A throttle shedding for a failing host is what an open breaker is for a breaker: forgetting
    # it hands that host every call again until a fresh window fills. Keyed keeps a key that is
    # not at rest; a throttle is at rest once its shed probability is back to 0.
    hosts = Keyed(AdaptiveThrottle, label="hosts", max_keys=2, idle_after=30.0, clock=clock)
    for _ in range(40):
        with contextlib.suppress(ConnectionError, Throttled):
            await hosts.execute("down", _down)
    shedding = hosts.get("down")
    assert shedding.probability > 0.5
    assert not at_rest(shedding)

    # Capacity: two more keys arrive; the LRU key at rest goes, never the shedding one.
    await clock.advance(1.0)
    await hosts.execute("b", _up)
    await hosts.execute("c", _up)
    assert hosts.get("down") is shedding
    assert "b" not in hosts

    # Idle: unused for idle_after (30 s), still inside its window (120 s): still shedding, kept.
    await clock.advance(31.0)
    assert shedding.probability > 0.5
    hosts.sweep()
    assert hosts.get("down") is shedding

    # Once its window has rolled past the outage it sheds nothing: at rest, and may go.
    await clock.advance(130.0)
    assert shedding.probability == 0.0
    assert at_rest(shedding)
    assert hosts.sweep() >= 1
    assert "down" not in hosts
