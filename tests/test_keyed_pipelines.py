"""A Keyed family whose factory builds a Pipeline per key (a breaker and a bulkhead per host, say).

The family judges whether a key is at rest by its policy's state: a Pipeline has none of its own,
so it is judged by its stages. A per-key pipeline holding an open (or forced-open, or half-open)
breaker, a bulkhead with slots taken through ``get(key)``, or a limiter with waiters must never
be dropped for idleness or for room, exactly as the bare policy would not be: dropping it would
forget the breaker that protects a failing dependency and send the next call straight to it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from _keyed import IDLE, MAX_KEYS, Model, ops
from hypothesis import given, settings

import stoic
from stoic import Bulkhead, CircuitBreaker, CountWindow, Keyed, OpenDuration, Pipeline, RateLimiter
from stoic.keyed import OVERFLOW_KEY, at_rest
from stoic.testing import VirtualClock


def per_host(*, label: str, clock: Any) -> Pipeline:
    breaker = CircuitBreaker(label=label, clock=clock, window=CountWindow(2), minimum_calls=2,
                             open_duration=OpenDuration.fixed(3600, jitter=0))
    limiter = RateLimiter(100, burst=10, label=label, clock=clock)
    return Pipeline(breaker, limiter, Bulkhead(2, label=label, clock=clock))


async def down() -> None:
    raise ConnectionError("down")


async def fine() -> int:
    return 1


async def test_a_key_whose_pipeline_holds_an_open_breaker_is_not_dropped_for_room(clock: VirtualClock) -> None:
    family = Keyed(per_host, label="hosts", max_keys=2, clock=clock)
    for _ in range(2):
        with pytest.raises(ConnectionError):
            await family.execute("a", down)
    breaker = family.get("a").stages[0]
    assert breaker.state == "open"
    await family.execute("b", fine)
    await clock.advance(1.0)  # (every limiter's bucket full again)
    await family.execute("c", fine)  # room is needed: "b" goes, "a" is protecting its host
    assert "a" in family and "b" not in family
    assert family.get("a").stages[0] is breaker
    with pytest.raises(stoic.CircuitOpen):
        await family.execute("a", fine)


async def test_a_key_whose_pipeline_holds_an_open_breaker_is_not_dropped_when_idle(clock: VirtualClock) -> None:
    family = Keyed(per_host, label="hosts", idle_after=10.0, clock=clock)
    for _ in range(2):
        with pytest.raises(ConnectionError):
            await family.execute("a", down)
    await clock.advance(11.0)
    assert family.sweep() == 0
    assert family.get("a").stages[0].state == "open"


async def test_a_pipeline_is_at_rest_only_when_every_stage_is(clock: VirtualClock) -> None:
    pipeline = per_host(label="p", clock=clock)
    breaker, limiter, bulkhead = pipeline.stages
    assert at_rest(pipeline)
    assert at_rest(Pipeline()) and at_rest(Pipeline(Pipeline(), pipeline))
    started, release = asyncio.Event(), asyncio.Event()

    async def held() -> None:
        started.set()
        await release.wait()

    task = asyncio.ensure_future(bulkhead.execute(held))
    await started.wait()
    assert not at_rest(pipeline) and not at_rest(Pipeline(stoic.Retrying(stoic.Schedule.fixed(1).attempts(2),
                                                                           label="r"), pipeline))
    release.set()
    await task
    assert at_rest(pipeline)
    breaker.force_open()
    assert not at_rest(pipeline)
    breaker.force_closed()
    assert at_rest(pipeline)
    assert limiter.available_permits == 10


# The reference model (tests/_keyed.py) for a family of per-key pipelines: a key
# whose breaker is forced open is never dropped, whatever wraps the breaker.
def wrapped_breaker(*, label: str, clock: Any) -> Pipeline:
    return Pipeline(Pipeline(CircuitBreaker(label=label, clock=clock)), Bulkhead(2, label=label, clock=clock))


@settings(max_examples=150, deadline=None)
@given(ops)
def test_a_family_of_pipelines_holds_what_the_model_holds(steps: list[tuple[str, Any]]) -> None:
    clock = VirtualClock()
    family = Keyed(wrapped_breaker, label="m", max_keys=MAX_KEYS, idle_after=IDLE, clock=clock)
    model = Model()
    for op, arg in steps:
        if op == "wait":
            clock._set_now(clock.now_ns() + round(arg * 1e9))
            model.now += arg
            continue
        key = f"k{arg}"
        if op == "get":
            own = model.get(key)
            policy = family.get(key)
            assert (policy.stages[0].label != f"m:{OVERFLOW_KEY}") is own
        elif key in model.held:
            if op == "force":
                family.get(key).stages[0].force_open()
                model.forced.add(key)
                model.touch(key)
            else:
                family.get(key)  # (a use, in both)
                model.touch(key)
                family.get(key).stages[0].force_closed()
                model.forced.discard(key)
        assert list(family) == list(model.held), (list(family), list(model.held))


def breaker_pair(*, label: str, clock: Any, limit: int = 2) -> Pipeline:
    return Pipeline(CircuitBreaker(label=f"{label}/outer", clock=clock), Bulkhead(limit, label=label, clock=clock),
                    CircuitBreaker(label=f"{label}/inner", clock=clock))


async def test_a_retune_keeps_a_breaker_forced_open_inside_a_per_key_pipeline_forced(clock: VirtualClock) -> None:
    # A family of one's own factory is retuned by building every key's policy anew; a forced
    # breaker stays forced (the operator's kill switch), and that holds for the breaker a
    # per-key pipeline holds: the one forced, not its neighbour.
    family = Keyed(breaker_pair, label="hosts", clock=clock, limit=2)
    await family.execute("a", fine)
    await family.execute("b", fine)
    family.get("a").stages[2].force_open()
    assert family.retune(limit=3) == 2
    outer, bulkhead, inner = family.get("a").stages
    assert bulkhead.max_concurrent == 3
    assert inner.state == "open" and outer.state == "closed"
    with pytest.raises(stoic.CircuitOpen):
        await family.execute("a", fine)
    assert all(stage.state == "closed" for stage in family.get("b").stages[::2])
    inner.force_closed()
    assert await family.execute("a", fine) == 1


def maybe_guarded(*, label: str, clock: Any, guarded: bool = True) -> Pipeline:
    bulkhead = Bulkhead(2, label=label, clock=clock)
    return Pipeline(CircuitBreaker(label=label, clock=clock), bulkhead) if guarded else Pipeline(bulkhead)


async def test_a_retune_that_would_lift_a_forced_breaker_is_refused_and_changes_nothing(clock: VirtualClock) -> None:
    family = Keyed(maybe_guarded, label="hosts", clock=clock)
    breaker = family.get("a").stages[0]
    breaker.force_open()
    with pytest.raises(TypeError, match="keep forced"):
        family.retune(guarded=False)
    assert family.get("a").stages[0] is breaker and family.config == {}
    breaker.force_closed()
    assert family.retune(guarded=False) == 1 and len(family.get("a").stages) == 1
