"""Adversarial review of the bulkhead: deadlines, cancellations and both entry forms at once."""

from __future__ import annotations

import asyncio
import contextlib
import random

import pytest

import stoic
from stoic import BulkheadFull, DeadlineExceeded
from stoic.bulkhead import Bulkhead
from stoic.testing import RecordingSink, VirtualClock, settle


@pytest.mark.parametrize("seed", range(5))
async def test_deadlines_and_cancellations_among_300_callers_never_leak_a_slot(
    clock: VirtualClock, sink: RecordingSink, seed: int
) -> None:
    rng = random.Random(seed)
    capacity = rng.randint(1, 5)
    bulkhead = Bulkhead(capacity, queue_limit=rng.choice([0, 3, 300]), label="review", clock=clock)
    running = 0
    most = 0
    waiting: list[asyncio.Task[object]] = []  # callers not yet running, in arrival order

    async def op(seconds: float) -> None:
        nonlocal running, most
        waiting.remove(asyncio.current_task())  # type: ignore[arg-type]
        running += 1
        most = max(most, running)
        try:
            await clock.sleep_until(clock.now_ns() + round(seconds * 1e9))
        finally:
            running -= 1
            if waiting and rng.random() < 0.3:
                # Cancel the longest waiter just after this slot is handed to it (woken, not yet
                # running): the hand-over race.
                asyncio.get_running_loop().call_soon(waiting[0].cancel)

    async def enter(seconds: float, as_context: bool) -> None:
        if as_context:
            async with bulkhead:
                await op(seconds)
        else:
            await bulkhead.execute(op, seconds)

    async def caller(seconds: float, deadline: float | None, as_context: bool) -> None:
        me: asyncio.Task[object] = asyncio.current_task()  # type: ignore[assignment]
        waiting.append(me)
        try:
            if deadline is None:
                await enter(seconds, as_context)
            else:
                async with stoic.timeout(deadline):
                    await enter(seconds, as_context)
        finally:
            if me in waiting:
                waiting.remove(me)

    tasks: list[asyncio.Task[None]] = []
    for _ in range(300):
        roll = rng.random()
        if roll < 0.6:
            deadline = rng.choice([None, rng.uniform(0, 3), 0.0])
            task = asyncio.create_task(caller(rng.uniform(0, 2), deadline, rng.random() < 0.5))
            tasks.append(task)
            if rng.random() < 0.2:
                clock.call_at(clock.now_ns() + round(rng.choice([0.0, rng.uniform(0, 2)]) * 1e9), task.cancel)
        elif roll < 0.7:
            await settle()
        else:
            await clock.advance(rng.choice([0.0, rng.uniform(0, 1)]))
        assert running <= capacity and bulkhead.active_count <= capacity
        assert bulkhead.active_count >= running
        # What the fast paths rely on: nobody waits while a slot is free.
        assert not bulkhead.queued_count or bulkhead.active_count == capacity
    await clock.run_until_idle()
    await settle()
    assert all(task.done() for task in tasks), "a caller still waits with every operation finished"
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert most <= capacity
    assert (bulkhead.active_count, bulkhead.queued_count) == (0, 0)
    for result in results:
        assert result is None or isinstance(result, (BulkheadFull, DeadlineExceeded, asyncio.CancelledError))
    reasons = {e.attributes["reason"] for e in sink.of("bulkhead.rejected")}
    assert reasons <= {"bulkhead_full", "cancelled", "deadline_exceeded"}


@pytest.mark.parametrize("seed", range(4))
async def test_with_queue_management_nobody_waits_while_a_slot_is_free(clock: VirtualClock, seed: int) -> None:
    # execute and async with admit at once on a free slot without looking at the queue: that is
    # right only if a waiter exists only while every slot is taken, whatever sheds or skips it.
    rng = random.Random(seed)
    capacity = rng.randint(1, 4)
    bulkhead = Bulkhead(capacity, queue_limit=rng.choice([2, 50]), label="managed", clock=clock,
                        queue_target=rng.choice([None, 0.05]), queue_adaptive_lifo=rng.random() < 0.5,
                        prioritized=rng.random() < 0.5)
    running = 0

    async def op(seconds: float) -> None:
        nonlocal running
        running += 1
        try:
            await clock.sleep_until(clock.now_ns() + round(seconds * 1e9))
        finally:
            running -= 1

    async def caller(seconds: float, deadline: float | None, as_context: bool, tier: stoic.Criticality) -> None:
        with stoic.bind_criticality(tier):
            scope = contextlib.nullcontext() if deadline is None else stoic.timeout(deadline)
            async with scope:
                if as_context:
                    async with bulkhead:
                        await op(seconds)
                else:
                    await bulkhead.execute(op, seconds)

    tasks: list[asyncio.Task[None]] = []
    for _ in range(300):
        roll = rng.random()
        if roll < 0.6:
            task = asyncio.create_task(caller(rng.uniform(0, 0.3), rng.choice([None, rng.uniform(0, 0.4)]),
                                              rng.random() < 0.5, rng.choice(list(stoic.Criticality))))
            tasks.append(task)
            if rng.random() < 0.2:
                clock.call_at(clock.now_ns() + round(rng.uniform(0, 0.2) * 1e9), task.cancel)
        elif roll < 0.7:
            await settle()
        else:
            await clock.advance(rng.uniform(0, 0.1))
        assert running <= bulkhead.active_count <= capacity
        assert not bulkhead.queued_count or bulkhead.active_count == capacity
    await clock.run_until_idle()
    await settle()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert (bulkhead.active_count, bulkhead.queued_count) == (0, 0)


def test_async_with_works_across_event_loops_returns_the_bulkhead_and_never_swallows_errors() -> None:
    bulkhead = Bulkhead(1, queue_limit=1, label="loops")

    async def use() -> None:
        async with bulkhead as entered:
            assert entered is bulkhead and bulkhead.active_count == 1
        assert bulkhead.active_count == 0
        with pytest.raises(KeyError):
            async with bulkhead:
                raise KeyError("mine")  # __aexit__'s completed future holds None: not suppressed
        assert bulkhead.active_count == 0
        # The waiting path still returns the bulkhead.
        gate = asyncio.Event()

        async def hold() -> None:
            async with bulkhead:
                await gate.wait()

        held = asyncio.create_task(hold())
        await settle()

        async def wait_then_enter() -> object:
            async with bulkhead as again:
                return again

        waiting = asyncio.create_task(wait_then_enter())
        await settle()
        assert bulkhead.queued_count == 1
        gate.set()
        assert await waiting is bulkhead
        await held

    asyncio.run(use())
    asyncio.run(use())  # a second loop: the completed futures of the first still serve
    assert (bulkhead.active_count, bulkhead.queued_count) == (0, 0)


def test_async_with_outside_an_asyncio_loop_takes_no_slot() -> None:
    # The completed futures async with awaits are made on the first entry, on the running loop;
    # with none (another async library, or a direct call) the entry fails before taking a slot.
    bulkhead = Bulkhead(1, label="no-loop")
    with pytest.raises(RuntimeError):
        bulkhead.__aenter__()
    assert bulkhead.active_count == 0

    async def use() -> Bulkhead:
        async with bulkhead as entered:
            assert bulkhead.active_count == 1
            return entered

    assert asyncio.run(use()) is bulkhead
    assert bulkhead.active_count == 0
