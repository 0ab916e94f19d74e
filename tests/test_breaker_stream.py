"""``state_changes()``: every transition in order, newest 16 kept, no replay, any thread,
consumers that stop or are cancelled unsubscribe (seed 000, "Observation")."""

from __future__ import annotations

import asyncio
import gc
import threading

import pytest
from _breaker_helpers import Boom, fail, ok

from stoic import BreakerState, CircuitBreaker, CountWindow, OpenDuration
from stoic.testing import VirtualClock, settle

CLOSED, OPEN, HALF_OPEN = BreakerState.CLOSED, BreakerState.OPEN, BreakerState.HALF_OPEN


def make() -> CircuitBreaker:
    return CircuitBreaker(label="s", window=CountWindow(2), minimum_calls=1, failure_rate_threshold=1.0,
                          open_duration=OpenDuration.fixed(1.0, jitter=0.0))


async def cycle(breaker: CircuitBreaker, clock: VirtualClock) -> None:
    """closed -> open -> half_open -> closed."""
    with pytest.raises(Boom):
        await breaker.execute(fail)
    await clock.advance(1)
    await breaker.execute(ok)


async def test_transitions_arrive_in_order_without_replaying_the_current_state(clock: VirtualClock) -> None:
    breaker = make()
    changes = breaker.state_changes()
    assert breaker.state is CLOSED  # read after subscribing; not replayed
    await cycle(breaker, clock)
    with pytest.raises(Boom):
        await breaker.execute(fail)
    breaker.force_open()  # already open: an event, but no change of state to stream
    breaker.reset()
    received = [await anext(changes) for _ in range(5)]
    assert received == [OPEN, HALF_OPEN, CLOSED, OPEN, CLOSED]
    assert changes.pending == 0


async def test_each_call_is_its_own_stream(clock: VirtualClock) -> None:
    breaker = make()
    first = breaker.state_changes()
    with pytest.raises(Boom):
        await breaker.execute(fail)
    second = breaker.state_changes()  # subscribes after the first transition
    await clock.advance(1)
    assert breaker.state is HALF_OPEN
    assert [await anext(first), await anext(first)] == [OPEN, HALF_OPEN]
    assert await anext(second) == HALF_OPEN


async def test_a_slow_consumer_keeps_the_newest_16(clock: VirtualClock) -> None:
    breaker = make()
    changes = breaker.state_changes()
    for _ in range(10):  # 30 transitions
        await cycle(breaker, clock)
    assert changes.pending == 16
    received = [await anext(changes) for _ in range(16)]
    expected = [OPEN, HALF_OPEN, CLOSED] * 10
    assert received == expected[-16:]


async def test_a_waiting_consumer_is_woken_by_a_transition(clock: VirtualClock) -> None:
    breaker = make()
    changes = breaker.state_changes()
    got: list[BreakerState] = []

    async def consume() -> None:
        async for state in changes:
            got.append(state)
            if len(got) == 3:
                return

    consumer = asyncio.create_task(consume())
    await settle()
    await cycle(breaker, clock)
    await asyncio.wait_for(consumer, 1)
    assert got == [OPEN, HALF_OPEN, CLOSED]


async def test_consumers_cancelled_mid_stream_unsubscribe_and_others_see_everything(clock: VirtualClock) -> None:
    breaker = make()
    streams = [breaker.state_changes() for _ in range(200)]
    seen: list[list[BreakerState]] = [[] for _ in streams]

    async def consume(i: int) -> None:
        async for state in streams[i]:
            seen[i].append(state)

    tasks = [asyncio.create_task(consume(i)) for i in range(len(streams))]
    await settle()
    with pytest.raises(Boom):
        await breaker.execute(fail)  # open
    await settle()
    for task in tasks[::2]:  # half of the consumers are cancelled while waiting
        task.cancel()
    await settle()
    await clock.advance(1)
    await breaker.execute(ok)  # half_open, closed
    await settle()
    for i, task in enumerate(tasks):
        if i % 2 == 0:
            assert task.cancelled()
            assert seen[i] == [OPEN]
        else:
            assert seen[i] == [OPEN, HALF_OPEN, CLOSED]
    assert len(breaker._streams or ()) == 100  # the cancelled ones unsubscribed
    for task in tasks[1::2]:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert len(breaker._streams or ()) == 0


async def test_a_consumer_cancelled_after_being_woken_unsubscribes(clock: VirtualClock) -> None:
    # The transition wakes the waiter, which is cancelled before it runs: the cancellation wins,
    # the stream is unsubscribed, and another consumer still receives the transition.
    breaker = make()
    changes = breaker.state_changes()
    other = breaker.state_changes()
    waiter = asyncio.create_task(anext(changes))
    await settle()
    with pytest.raises(Boom):
        await breaker.execute(fail)  # wakes the waiter ...
    waiter.cancel()  # ... which is cancelled before it runs
    (result,) = await asyncio.gather(waiter, return_exceptions=True)
    assert isinstance(result, asyncio.CancelledError)
    assert len(breaker._streams or ()) == 1
    assert await anext(other) == OPEN


async def test_aclose_and_async_with_unsubscribe(clock: VirtualClock) -> None:
    breaker = make()
    changes = breaker.state_changes()
    waiter = asyncio.create_task(anext(changes))
    await settle()
    await changes.aclose()
    with pytest.raises(StopAsyncIteration):
        await waiter
    async with breaker.state_changes() as scoped:
        assert len(breaker._streams or ()) == 1
        del scoped
    assert len(breaker._streams or ()) == 0


async def test_a_dropped_stream_is_not_kept_alive(clock: VirtualClock) -> None:
    breaker = make()
    changes = breaker.state_changes()
    del changes
    gc.collect()
    assert len(breaker._streams or ()) == 0
    stream = breaker.state_changes()
    with pytest.raises(Boom):
        await breaker.execute(fail)
    async for state in stream:  # a consumer that stops iterating without closing the stream
        assert state == OPEN
        break
    del stream
    gc.collect()
    assert len(breaker._streams or ()) == 0


async def test_publishing_from_another_thread_wakes_the_consumer() -> None:
    breaker = CircuitBreaker(label="threads", window=CountWindow(1), minimum_calls=1)
    changes = breaker.state_changes()
    consumer = asyncio.create_task(anext(changes))
    await asyncio.sleep(0)

    def worker() -> None:
        with pytest.raises(Boom):
            breaker.call(_boom)

    thread = threading.Thread(target=worker)
    thread.start()
    assert await asyncio.wait_for(consumer, 5) == OPEN
    thread.join()
    assert breaker.state is OPEN


def _boom() -> None:
    raise Boom("down")


def test_a_breaker_built_at_import_time_streams_under_two_event_loops() -> None:
    breaker = CircuitBreaker(label="loops", window=CountWindow(1), minimum_calls=1)
    changes = breaker.state_changes()

    async def first() -> BreakerState:
        with pytest.raises(Boom):
            breaker.call(_boom)
        return await anext(changes)

    async def second() -> BreakerState:
        waiter = asyncio.create_task(anext(changes))
        await asyncio.sleep(0)
        breaker.force_closed()
        return await waiter

    assert asyncio.run(first()) == OPEN
    assert asyncio.run(second()) == CLOSED
