"""Composition under hostile churn: nothing leaks, whatever is stacked and in which order.

tests/test_leak_stress.py churns each policy, and one pipeline in the recommended order. Here:
five-stage pipelines (Retrying, a breaker, a limiter, a bulkhead, a gradient bulkhead) in a
random order, two pipelines sharing their stage objects at once, a Hedge around them, calls
through ``with_fallback`` whose predicate and fallback raise, ``stoic.timeout`` around the call
and inside the operation, operations that run a TaskGroup whose children fail (exception
groups, a BaseException in a group) or raise a CancelledError of their own, hundreds of callers
cancelled at random on virtual time; and all of it again with a sink that raises on every event
(now and then a BaseException). After each run every stage is at rest: no slot, waiter, permit or
probe permit left behind. A Keyed family of per-key pipelines evicts and rebuilds its keys under
the same churn and loses no call in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from _churn import assert_at_rest, churn
from _keyed import record_builds

import stoic
from stoic import Bulkhead, CircuitBreaker, CountWindow, GradientBulkhead, OpenDuration, Pipeline, RateLimiter
from stoic.events import Level
from stoic.testing import VirtualClock


class Interrupt(BaseException):
    """Not an Exception: a KeyboardInterrupt-like error."""


class RaisingSink:
    """Raises on every event it is handed; now and then a BaseException."""

    level = Level.DEBUG

    def __init__(self, seed: int, base: bool) -> None:
        self.rng = random.Random(seed)
        self.base = base
        self.handed = 0

    def emit(self, event: stoic.Event) -> None:
        self.handed += 1
        if self.base and self.rng.random() < 0.02:
            raise Interrupt("sink")
        raise RuntimeError("sink broken")


async def child(clock: VirtualClock, rng: random.Random) -> int:
    await clock.sleep(rng.choice([0, 0.001, 0.01, 0.05]))
    roll = rng.random()
    if roll < 0.05:
        raise Interrupt
    if roll < 0.1:
        raise asyncio.CancelledError  # the operation's own, the task not cancelled
    if roll < 0.5:
        raise ValueError("dependency failed")
    if roll < 0.55:
        raise ExceptionGroup("several", [ValueError("a"), KeyError("b")])
    return 1


async def operation(clock: VirtualClock, rng: random.Random) -> int:
    mode = rng.random()
    if mode < 0.2:
        async with asyncio.TaskGroup() as group:
            for _ in range(rng.randrange(1, 4)):
                group.create_task(child(clock, rng))
        return 1
    if mode < 0.35:
        async with stoic.timeout(rng.choice([0.001, 0.01])):  # the attempt's own deadline
            return await child(clock, rng)
    return await child(clock, rng)


def stages(clock: VirtualClock) -> list[Any]:
    return [
        stoic.Retrying(stoic.Schedule.fixed(0.001).attempts(3), label="retry", clock=clock),
        CircuitBreaker(label="breaker", clock=clock, window=CountWindow(5), minimum_calls=5, half_open_probes=3,
                       open_duration=OpenDuration.fixed(0.01, jitter=0)),
        RateLimiter(2000, burst=20, queue_limit=10, label="limiter", clock=clock),
        Bulkhead(3, queue_limit=10, label="bulkhead", clock=clock),
        GradientBulkhead(max_concurrent=8, queue_limit=30, label="gradient", clock=clock, queue_target=0.002,
                         queue_interval=0.01),
    ]


async def caller(pipelines: list[Pipeline], hedge: stoic.Hedge, clock: VirtualClock, rng: random.Random,
                 outcomes: dict[str, int]) -> None:
    pipeline = rng.choice(pipelines)
    mode = rng.random()

    def should_handle(error: Exception) -> bool:
        if rng.random() < 0.5:
            raise RuntimeError("predicate bug")
        return True

    async def fallback(error: Exception) -> int:
        await clock.sleep(rng.choice([0, 0.01]))
        if rng.random() < 0.3:
            raise KeyError("fallback failed")
        return 0

    try:
        if mode < 0.2:
            await hedge.execute(stoic.IDEMPOTENT, pipeline.execute, operation, clock, rng)
        elif mode < 0.4:
            await stoic.with_fallback(pipeline, operation, clock, rng, label="fallback", fallback=fallback,
                                      should_handle=should_handle)
        elif mode < 0.6:
            async with stoic.timeout(rng.choice([0.0005, 0.005, 0.02, 0.1])):
                await pipeline.execute(operation, clock, rng)
        else:
            await pipeline.execute(operation, clock, rng)
    except BaseException as error:  # (every outcome is one to survive)
        outcomes[type(error).__name__] = outcomes.get(type(error).__name__, 0) + 1
    else:
        outcomes["ok"] = outcomes.get("ok", 0) + 1


@contextlib.contextmanager
def sinks(kind: str, seed: int) -> Iterator[RaisingSink | None]:
    if kind == "none":
        yield None
        return
    sink = RaisingSink(seed, base=kind == "raising-base")
    logging.disable(logging.CRITICAL)  # (each failing sink is reported once: not this test's subject)
    try:
        with stoic.use_sinks(sink):
            yield sink
    finally:
        logging.disable(logging.NOTSET)


@pytest.mark.parametrize("sink_kind", ["none", "raising", "raising-base"])
@pytest.mark.parametrize("seed", range(4))
async def test_stacked_stages_in_any_order_shared_by_two_pipelines_leak_nothing(seed: int, sink_kind: str) -> None:
    clock = VirtualClock()
    rng = random.Random(seed)
    with stoic.use_clock(clock), sinks(sink_kind, seed) as sink, warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # (the failing predicate's one report)
        own = stages(clock)
        shuffled = own[:]
        rng.shuffle(shuffled)
        pipelines = [Pipeline(*shuffled), Pipeline(*own)]  # the same five objects in two orders
        hedge = stoic.Hedge(0.002, label="hedge", clock=clock, max_attempts=3)
        outcomes: dict[str, int] = {}
        seen: set[str] = set()

        async def start() -> None:
            # Reading the state publishes a transition the breaker has seen since (an open period
            # ended: half-open): a sink interrupting that event interrupts this read, the test's
            # own, not a call. (Task order decides which read meets it: eager tasks on 3.12+.)
            with contextlib.suppress(Interrupt):
                seen.add(str(own[1].state))
            await caller(pipelines, hedge, clock, rng, outcomes)

        await churn(clock, rng, start)
    for stage in own:
        assert_at_rest(stage)
    assert {"ok", "CancelledError", "ValueError", "DeadlineExceeded", "CircuitOpen", "KeyError"} <= set(outcomes)
    assert {"open", "half_open"} <= seen
    assert sink is None or sink.handed > 100


def per_key(*, label: str, clock: Any) -> Pipeline:
    return Pipeline(
        CircuitBreaker(label=label, clock=clock, window=CountWindow(4), minimum_calls=4, half_open_probes=2,
                       open_duration=OpenDuration.fixed(0.01, jitter=0)),
        RateLimiter(2000, burst=10, queue_limit=5, label=label, clock=clock),
        Bulkhead(2, queue_limit=4, label=label, clock=clock),
    )


@pytest.mark.parametrize("seed", range(4))
async def test_a_keyed_family_of_pipelines_evicts_under_churn_and_loses_no_call_in_flight(
        seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = VirtualClock()
    rng = random.Random(seed)
    built: list[Pipeline] = record_builds(monkeypatch)
    with stoic.use_clock(clock):
        family = stoic.Keyed(per_key, label="hosts", max_keys=3, idle_after=0.01, clock=clock)
        outcomes: dict[str, int] = {}
        dropped_busy: list[str] = []

        async def start() -> None:
            key = rng.choice("abcdef")
            slot = family._claim(key)  # (as execute claims it; checked while the call is in flight)
            try:
                try:
                    async with stoic.timeout(rng.choice([0.002, 0.02, 1.0])):
                        await slot.policy.execute(operation, clock, rng)  # type: ignore[attr-defined]
                finally:
                    if family._slots.get(key) is not slot and slot is not family._overflow:
                        dropped_busy.append(key)
                    family._unclaim(key, slot)
            except BaseException as error:
                outcomes[type(error).__name__] = outcomes.get(type(error).__name__, 0) + 1

        await churn(clock, rng, start)
    assert dropped_busy == []
    assert len(built) > 5  # keys were evicted and rebuilt meanwhile
    for pipeline in built:
        for stage in pipeline.stages:
            assert_at_rest(stage)
    assert all(not slot.calls for slot in family._slots.values())
