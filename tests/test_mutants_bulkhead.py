"""Bulkhead behaviour that mutation testing found unchecked (issue 9, item 5; docs/mutation.md).

Seed 000, "Bulkhead": at most ``max_concurrent`` run, ``queue_limit`` more wait FIFO, the next is
refused; a waiter that leaves (cancelled, timed out, cut by a deadline, interrupted) never takes
a slot and never gives back one it did not hold. The blocking bulkhead is driven on a virtual
clock that only the test moves; a waiting thread is woken as that clock moves, so a step of
virtual time past a timeout ends the wait at once, with no real waiting.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
from _threads import InterruptingClock, eventually, process_wide

import stoic
from stoic import BulkheadFull, DeadlineExceeded
from stoic.bulkhead import BlockingBulkhead, Bulkhead
from stoic.events import Level
from stoic.testing import RecordingSink, VirtualClock

START = 1000.0  # a clock far from zero: an instant and a duration are never confused


class SteppingClock(InterruptingClock):
    """An :class:`InterruptingClock` (moved by ``step``, interrupting marked threads) from START."""

    def __init__(self) -> None:
        super().__init__(START)


@pytest.fixture
def events() -> Iterator[RecordingSink]:
    """Process-wide (worker threads start with a fresh context) and listening at INFO exactly,
    the level of every bulkhead event."""
    yield from process_wide(RecordingSink(level=Level.INFO))


def rejections(sink: RecordingSink) -> list[dict[str, object]]:
    return [dict(e.attributes) for e in sink.events if e.name == "bulkhead.rejected"]


class Waiter(threading.Thread):
    """Acquires a slot (optionally under an ambient deadline of ``deadline`` seconds) and
    holds it until ``done`` is set."""

    def __init__(self, bulkhead: BlockingBulkhead, clock: SteppingClock, *, timeout: float | None = None,
                 deadline: float | None = None) -> None:
        super().__init__(daemon=True)
        self.bulkhead, self.clock, self.timeout, self.deadline = bulkhead, clock, timeout, deadline
        self.entered_at: float | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()

    def _acquire(self) -> None:
        self.bulkhead.acquire(timeout=self.timeout)

    async def _acquire_under_deadline(self) -> None:
        assert self.deadline is not None
        async with stoic.timeout(self.deadline, clock=self.clock):
            self._acquire()

    def run(self) -> None:
        try:
            if self.deadline is None:
                self._acquire()
            else:
                asyncio.run(self._acquire_under_deadline())
        except BaseException as exc:
            self.error = exc
            return
        self.entered_at = self.clock.now()
        self.done.wait(10)
        self.bulkhead.release()


def queued(bulkhead: BlockingBulkhead, n: int) -> None:
    eventually(lambda: bulkhead.queued_count == n)


# --------------------------------------------------------------------------- configuration

def test_queue_limit_reads_back_as_configured_and_none_as_unbounded() -> None:
    assert Bulkhead(1, queue_limit=None, label="q").queue_limit is None
    assert Bulkhead(1, queue_limit=3, label="q").queue_limit == 3
    assert BlockingBulkhead(1, label="q").queue_limit == 0
    huge = 2**70  # beyond any queue that can form, but still a number the caller chose
    assert BlockingBulkhead(1, queue_limit=huge, label="q").queue_limit == huge


def test_repr_and_gauges_show_slots_taken_and_callers_waiting() -> None:
    bulkhead = BlockingBulkhead(2, queue_limit=1, label="gauge")
    bulkhead.acquire()
    assert (bulkhead.max_concurrent, bulkhead.active_count, bulkhead.queued_count) == (2, 1, 0)
    assert repr(bulkhead) == "BlockingBulkhead(max_concurrent=2, queue_limit=1, label='gauge', active=1, queued=0)"
    bulkhead.release()
    assert bulkhead.active_count == 0


# --------------------------------------------------------------------------- asyncio bulkhead

async def test_a_full_bulkhead_refuses_with_the_waiting_count_at_info(events: RecordingSink) -> None:
    clock = VirtualClock(START)
    bulkhead = Bulkhead(1, queue_limit=1, label="full", clock=clock)
    gate = asyncio.Event()
    holder = asyncio.create_task(bulkhead.execute(gate.wait))
    waiter = asyncio.create_task(bulkhead.execute(gate.wait))
    await asyncio.sleep(0)
    assert (bulkhead.active_count, bulkhead.queued_count) == (1, 1)
    with pytest.raises(BulkheadFull) as refused:
        await bulkhead.execute(gate.wait)
    assert refused.value.label == "full"
    gate.set()
    await asyncio.gather(holder, waiter)
    assert (bulkhead.active_count, bulkhead.queued_count) == (0, 0)
    assert rejections(events) == [{"reason": "bulkhead_full", "capacity": 1, "waiting": 1}]
    assert [e.time_ns for e in events.events] == [clock.now_ns()]


async def test_an_expired_ambient_deadline_is_refused_even_with_a_free_slot(events: RecordingSink) -> None:
    clock = VirtualClock(START)
    bulkhead = Bulkhead(2, label="late", clock=clock)
    ran = []

    async def op() -> None:
        ran.append(clock.now())

    async with stoic.timeout(0, clock=clock):
        with pytest.raises(DeadlineExceeded):
            await bulkhead.execute(op)
    assert ran == [] and bulkhead.active_count == 0
    async with stoic.timeout(1e-9, clock=clock):  # one nanosecond left: still in time
        await bulkhead.execute(op)
    assert ran == [START] and bulkhead.active_count == 0
    assert rejections(events) == [{"reason": "deadline_exceeded", "capacity": 2}]


async def test_under_a_live_deadline_a_free_slot_is_taken_and_the_queue_limit_holds() -> None:
    clock = VirtualClock(START)
    bulkhead = Bulkhead(1, queue_limit=1, label="scoped", clock=clock)
    gate = asyncio.Event()

    async def run_under_deadline() -> None:
        async with stoic.timeout(60, clock=clock):
            await bulkhead.execute(gate.wait)

    first = asyncio.create_task(run_under_deadline())
    await asyncio.sleep(0)
    assert (bulkhead.active_count, bulkhead.queued_count) == (1, 0)
    second = asyncio.create_task(run_under_deadline())
    await asyncio.sleep(0)
    assert (bulkhead.active_count, bulkhead.queued_count) == (1, 1)
    with pytest.raises(BulkheadFull):
        await run_under_deadline()
    gate.set()
    await asyncio.gather(first, second)
    assert (bulkhead.active_count, bulkhead.queued_count) == (0, 0)


async def test_a_cancelled_waiter_leaves_the_queue_and_is_reported_at_info(events: RecordingSink) -> None:
    clock = VirtualClock(START)
    bulkhead = Bulkhead(1, queue_limit=2, label="cancel", clock=clock)
    gate = asyncio.Event()
    order: list[str] = []

    async def op(name: str) -> None:
        order.append(name)
        await gate.wait()

    holder = asyncio.create_task(bulkhead.execute(op, "holder"))
    leaver = asyncio.create_task(bulkhead.execute(op, "leaver"))
    stayer = asyncio.create_task(bulkhead.execute(op, "stayer"))
    await asyncio.sleep(0)
    assert bulkhead.queued_count == 2
    leaver.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leaver
    assert (bulkhead.active_count, bulkhead.queued_count) == (1, 1)
    gate.set()
    await asyncio.gather(holder, stayer)
    assert order == ["holder", "stayer"]
    assert (bulkhead.active_count, bulkhead.queued_count) == (0, 0)
    assert rejections(events) == [{"reason": "cancelled", "capacity": 1}]


async def test_a_waiter_cut_by_its_deadline_is_reported_as_deadline_exceeded(events: RecordingSink) -> None:
    clock = VirtualClock(START)
    bulkhead = Bulkhead(1, queue_limit=1, label="cut", clock=clock)
    gate = asyncio.Event()
    holder = asyncio.create_task(bulkhead.execute(gate.wait))
    await asyncio.sleep(0)

    async def wait_for_a_slot() -> None:
        async with stoic.timeout(2.0, clock=clock):
            await bulkhead.execute(gate.wait)

    waiter = asyncio.create_task(wait_for_a_slot())
    await clock.advance(2.0)
    with pytest.raises(DeadlineExceeded):
        await waiter
    assert (bulkhead.active_count, bulkhead.queued_count) == (1, 0)
    gate.set()
    await holder
    assert bulkhead.active_count == 0
    assert rejections(events) == [{"reason": "deadline_exceeded", "capacity": 1}]


async def test_async_with_holds_a_slot_and_hands_it_to_the_first_waiter() -> None:
    bulkhead = Bulkhead(1, queue_limit=1, label="cm", clock=VirtualClock(START))
    entered: list[str] = []

    async def enter(name: str) -> None:
        async with bulkhead:
            entered.append(name)
            await asyncio.sleep(0)

    async with bulkhead:
        waiter = asyncio.create_task(enter("waiter"))
        await asyncio.sleep(0)
        assert (bulkhead.active_count, bulkhead.queued_count) == (1, 1)
    assert (bulkhead.active_count, bulkhead.queued_count) == (1, 0)  # handed over, not freed
    await waiter
    assert entered == ["waiter"] and bulkhead.active_count == 0


# --------------------------------------------------------------------------- blocking bulkhead

def test_a_blocking_waiter_gives_up_exactly_at_its_timeout_and_never_takes_the_slot(events: RecordingSink) -> None:
    clock = SteppingClock()
    bulkhead = BlockingBulkhead(1, queue_limit=1, label="timeout", clock=clock)
    bulkhead.acquire()
    waiter = Waiter(bulkhead, clock, timeout=0.02)
    waiter.start()
    queued(bulkhead, 1)
    clock.step(0.019)
    time.sleep(0.06)  # woken by the step, time to leave wrongly: one millisecond is still left
    assert waiter.error is None and bulkhead.queued_count == 1
    clock.step(0.001)
    waiter.join(5)
    assert isinstance(waiter.error, DeadlineExceeded)
    assert (bulkhead.active_count, bulkhead.queued_count) == (1, 0)
    bulkhead.release()
    assert bulkhead.active_count == 0  # the slot was not handed to the waiter that left
    assert rejections(events) == [{"reason": "deadline_exceeded", "capacity": 1}]


def test_a_blocking_waiter_handed_the_slot_in_time_takes_it() -> None:
    clock = SteppingClock()
    bulkhead = BlockingBulkhead(1, queue_limit=1, label="in-time", clock=clock)
    bulkhead.acquire()
    waiter = Waiter(bulkhead, clock, timeout=0.02)
    waiter.start()
    queued(bulkhead, 1)
    clock.step(0.01)
    bulkhead.release()
    eventually(lambda: waiter.entered_at is not None)
    assert waiter.entered_at == START + 0.01
    assert (bulkhead.active_count, bulkhead.queued_count) == (1, 0)  # the slot changed hands
    waiter.done.set()
    waiter.join(5)
    assert waiter.error is None and bulkhead.active_count == 0


def test_a_blocking_acquire_under_an_expired_deadline_is_refused_even_with_a_free_slot(
    events: RecordingSink,
) -> None:
    clock = SteppingClock()
    bulkhead = BlockingBulkhead(2, label="late", clock=clock)

    async def under(seconds: float) -> None:
        async with stoic.timeout(seconds, clock=clock):
            bulkhead.acquire(timeout=5)

    with pytest.raises(DeadlineExceeded):
        asyncio.run(under(0))
    assert bulkhead.active_count == 0
    asyncio.run(under(1e-9))  # one nanosecond left: in time, and the slot is free
    assert bulkhead.active_count == 1
    bulkhead.release()
    assert rejections(events) == [{"reason": "deadline_exceeded", "capacity": 2}]


def test_an_ambient_deadline_shorter_than_the_timeout_bounds_a_blocking_wait() -> None:
    clock = SteppingClock()
    bulkhead = BlockingBulkhead(1, queue_limit=1, label="ambient", clock=clock)
    bulkhead.acquire()
    waiter = Waiter(bulkhead, clock, timeout=30.0, deadline=0.02)
    waiter.start()
    queued(bulkhead, 1)
    clock.step(0.02)
    waiter.join(5)
    assert isinstance(waiter.error, DeadlineExceeded)
    assert (bulkhead.active_count, bulkhead.queued_count) == (1, 0)
    bulkhead.release()
    assert bulkhead.active_count == 0


def test_a_timeout_shorter_than_the_ambient_deadline_bounds_a_blocking_wait() -> None:
    clock = SteppingClock()
    bulkhead = BlockingBulkhead(1, queue_limit=1, label="own", clock=clock)
    bulkhead.acquire()
    waiter = Waiter(bulkhead, clock, timeout=0.02, deadline=30.0)
    waiter.start()
    queued(bulkhead, 1)
    clock.step(0.02)
    waiter.join(5)
    assert isinstance(waiter.error, DeadlineExceeded)
    bulkhead.release()
    assert (bulkhead.active_count, bulkhead.queued_count) == (0, 0)


def test_an_ambient_deadline_alone_bounds_a_blocking_wait_without_timeout() -> None:
    clock = SteppingClock()
    bulkhead = BlockingBulkhead(1, queue_limit=1, label="only-ambient", clock=clock)
    bulkhead.acquire()
    waiter = Waiter(bulkhead, clock, deadline=0.02)
    waiter.start()
    queued(bulkhead, 1)
    clock.step(0.02)
    waiter.join(5)
    assert isinstance(waiter.error, DeadlineExceeded)
    bulkhead.release()
    assert (bulkhead.active_count, bulkhead.queued_count) == (0, 0)


def test_an_interrupted_blocking_waiter_leaves_the_queue_without_giving_back_a_slot() -> None:
    clock = SteppingClock()
    bulkhead = BlockingBulkhead(1, queue_limit=2, label="interrupt", clock=clock)
    bulkhead.acquire()
    first = Waiter(bulkhead, clock, timeout=0.02)
    first.start()
    queued(bulkhead, 1)
    second = Waiter(bulkhead, clock, timeout=0.02)
    second.start()
    queued(bulkhead, 2)
    clock.interrupted.add(first)
    clock.step(0)  # wakes the waiters: "first" reads the clock, and is interrupted
    first.join(5)
    assert isinstance(first.error, KeyboardInterrupt)
    assert (bulkhead.active_count, bulkhead.queued_count) == (1, 1)  # still held by the main thread
    bulkhead.release()  # handed to the second waiter, not to the one that left
    eventually(lambda: second.entered_at is not None)
    assert (bulkhead.active_count, bulkhead.queued_count) == (1, 0)
    second.done.set()
    second.join(5)
    assert second.error is None
    assert (bulkhead.active_count, bulkhead.queued_count) == (0, 0)


def test_the_blocking_queue_limit_is_exact(events: RecordingSink) -> None:
    clock = SteppingClock()
    bulkhead = BlockingBulkhead(1, queue_limit=2, label="exact", clock=clock)
    bulkhead.acquire()
    waiters = [Waiter(bulkhead, clock, timeout=0.05) for _ in range(2)]
    for n, waiter in enumerate(waiters, start=1):
        waiter.start()
        queued(bulkhead, n)
    with pytest.raises(BulkheadFull) as refused:
        bulkhead.acquire(timeout=0.05)
    assert refused.value.label == "exact"
    assert rejections(events) == [{"reason": "bulkhead_full", "capacity": 1, "waiting": 2}]
    bulkhead.release()
    for waiter in waiters:
        eventually(lambda w=waiter: w.entered_at is not None)
        waiter.done.set()
        waiter.join(5)
        assert waiter.error is None
    assert (bulkhead.active_count, bulkhead.queued_count) == (0, 0)


def test_a_blocking_call_releases_its_slot_however_it_ends() -> None:
    bulkhead = BlockingBulkhead(1, label="call", clock=SteppingClock())
    assert bulkhead.call(lambda a, b: a + b, 2, b=3) == 5  # type: ignore[misc]
    with pytest.raises(KeyError):
        bulkhead.call(lambda: {}["missing"])  # type: ignore[misc]
    assert bulkhead.active_count == 0
    with bulkhead:
        assert bulkhead.active_count == 1
        with pytest.raises(BulkheadFull):
            bulkhead.call(lambda: None)
    assert bulkhead.active_count == 0


def test_a_blocking_call_under_a_live_deadline_takes_a_free_slot_and_releases_it() -> None:
    clock = SteppingClock()
    bulkhead = BlockingBulkhead(1, label="call-deadline", clock=clock)
    seen: list[int] = []

    async def main() -> None:
        async with stoic.timeout(5, clock=clock):
            bulkhead.call(lambda: seen.append(bulkhead.active_count))

    asyncio.run(main())
    assert seen == [1] and bulkhead.active_count == 0


def test_decorated_functions_keep_their_name_and_docstring() -> None:
    blocking = BlockingBulkhead(1, label="meta", clock=SteppingClock())
    asynchronous = Bulkhead(1, label="meta", clock=SteppingClock())

    @blocking
    def plain() -> int:
        """Plain."""
        return 1

    @asynchronous
    async def coroutine() -> int:
        """Coroutine."""
        return 2

    assert (plain.__name__, plain.__doc__, plain()) == ("plain", "Plain.", 1)
    assert (coroutine.__name__, coroutine.__doc__) == ("coroutine", "Coroutine.")
    assert asyncio.run(coroutine()) == 2  # type: ignore[arg-type]


def test_a_blocking_queue_limit_of_hundreds_is_exact(events: RecordingSink) -> None:
    # Above 256 waiting callers (past CPython's small-int cache) the limit is still compared by value.
    limit = 300
    clock = SteppingClock()
    bulkhead = BlockingBulkhead(1, queue_limit=limit, label="hundreds", clock=clock)
    bulkhead.acquire()
    done: list[int] = []
    threads = [threading.Thread(target=lambda: bulkhead.call(done.append, 1), daemon=True) for _ in range(limit)]
    for thread in threads:
        thread.start()
    queued(bulkhead, limit)
    refused: list[BaseException] = []

    def one_too_many() -> None:
        try:
            bulkhead.acquire()
        except BulkheadFull as exc:
            refused.append(exc)

    late = threading.Thread(target=one_too_many, daemon=True)  # a wrong verdict would wait for ever
    late.start()
    late.join(5)
    assert len(refused) == 1
    assert rejections(events) == [{"reason": "bulkhead_full", "capacity": 1, "waiting": limit}]
    assert bulkhead.queued_count == limit
    bulkhead.release()
    for thread in threads:
        thread.join(10)
    assert len(done) == limit and (bulkhead.active_count, bulkhead.queued_count) == (0, 0)


# --------------------------------------------------------------------------- second pass (new source)
# The survivors of the draw on 124c157 (docs/mutation.md): queue management switched on by each
# option alone and its default interval, a queue or a slot limit retuned below what is already
# queued or running, the ambient deadline at entry and at wake on every entry path.


async def turns(times: int = 10) -> None:
    """Let the loop run the tasks just woken (no time passes)."""
    for _ in range(times):
        await asyncio.sleep(0)


class Held:
    """Asyncio operations that record their start and hold their slot until released by name."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.gates: dict[str, asyncio.Event] = {}

    async def op(self, name: str) -> None:
        self.order.append(name)
        await self.gates.setdefault(name, asyncio.Event()).wait()

    def release(self, name: str) -> None:
        self.gates.setdefault(name, asyncio.Event()).set()


class CriticalWaiter(Waiter):
    """A :class:`Waiter` whose thread runs at ``criticality``."""

    def __init__(self, bulkhead: BlockingBulkhead, clock: SteppingClock, criticality: stoic.Criticality) -> None:
        super().__init__(bulkhead, clock)
        self.criticality = criticality

    def _acquire(self) -> None:
        with stoic.bind_criticality(self.criticality):
            self.bulkhead.acquire()


async def test_adaptive_lifo_alone_serves_the_newest_once_the_oldest_waited_past_a_tenth_of_a_second() -> None:
    # queue_adaptive_lifo without a target is queue management on its own, congested once the
    # oldest waiter has waited more than queue_interval, whose default is 0.1 s.
    clock = SteppingClock()
    bulkhead = Bulkhead(1, queue_limit=None, label="lifo", clock=clock, queue_adaptive_lifo=True)
    held = Held()
    tasks = []
    for name in "HAB":
        tasks.append(asyncio.create_task(bulkhead.execute(held.op, name)))
        await turns()
    clock.step(0.1)  # the oldest waited exactly the interval: not congested, first in first out
    held.release("H")
    await turns()
    tasks.append(asyncio.create_task(bulkhead.execute(held.op, "C")))
    await turns()
    clock.step(0.1)  # B has waited 0.2 s: congested, the newest (C) goes first
    held.release("A")
    await turns()
    assert held.order == ["H", "A", "C"]
    held.release("C")
    held.release("B")
    await asyncio.gather(*tasks)
    assert held.order == ["H", "A", "C", "B"]
    assert (bulkhead.in_use, bulkhead.queued) == (0, 0)


def test_a_blocking_adaptive_lifo_alone_serves_the_newest_once_the_oldest_waited_past_a_tenth_of_a_second() -> None:
    clock = SteppingClock()
    bulkhead = BlockingBulkhead(1, queue_limit=None, label="lifo", clock=clock, queue_adaptive_lifo=True)
    bulkhead.acquire()
    a, b, c = (Waiter(bulkhead, clock) for _ in range(3))
    a.start()
    queued(bulkhead, 1)
    b.start()
    queued(bulkhead, 2)
    clock.step(0.1)  # the oldest waited exactly the interval: first in first out
    bulkhead.release()
    eventually(lambda: a.entered_at is not None)
    c.start()
    queued(bulkhead, 2)
    clock.step(0.1)  # b has waited 0.2 s: congested, the newest (c) goes first
    a.done.set()
    eventually(lambda: c.entered_at is not None)
    assert b.entered_at is None and bulkhead.queued_count == 1
    c.done.set()
    eventually(lambda: b.entered_at is not None)
    b.done.set()
    for waiter in (a, b, c):
        waiter.join(5)
        assert waiter.error is None
    assert (bulkhead.in_use, bulkhead.queued) == (0, 0)


async def test_prioritized_alone_hands_a_released_slot_to_the_most_critical_waiter() -> None:
    clock = SteppingClock()
    bulkhead = Bulkhead(1, queue_limit=None, label="prio", clock=clock, prioritized=True)
    held = Held()

    async def at(criticality: stoic.Criticality, name: str) -> None:
        with stoic.bind_criticality(criticality):
            await bulkhead.execute(held.op, name)

    tasks = [asyncio.create_task(bulkhead.execute(held.op, "H"))]
    await turns()
    for criticality, name in ((stoic.Criticality.BEST_EFFORT, "low"), (stoic.Criticality.CRITICAL, "high")):
        tasks.append(asyncio.create_task(at(criticality, name)))
        await turns()
    held.release("H")
    await turns()
    assert held.order == ["H", "high"]
    held.release("high")
    held.release("low")
    await asyncio.gather(*tasks)
    assert held.order == ["H", "high", "low"]


def test_a_blocking_prioritized_alone_hands_a_released_slot_to_the_most_critical_waiter() -> None:
    clock = SteppingClock()
    bulkhead = BlockingBulkhead(1, queue_limit=None, label="prio", clock=clock, prioritized=True)
    bulkhead.acquire()
    low = CriticalWaiter(bulkhead, clock, stoic.Criticality.BEST_EFFORT)
    high = CriticalWaiter(bulkhead, clock, stoic.Criticality.CRITICAL)
    low.start()
    queued(bulkhead, 1)
    high.start()
    queued(bulkhead, 2)
    bulkhead.release()
    eventually(lambda: high.entered_at is not None)
    assert low.entered_at is None
    high.done.set()
    eventually(lambda: low.entered_at is not None)
    low.done.set()
    for waiter in (low, high):
        waiter.join(5)
        assert waiter.error is None
    assert (bulkhead.in_use, bulkhead.queued) == (0, 0)


async def codel_sheds_after_two_default_intervals(bulkhead: Bulkhead, clock: SteppingClock) -> None:
    """With a target of 10 ms and the default 0.1 s interval: three waiters queue at once, and
    the queue is never overloaded (its first interval saw it empty), so the allowance is the
    interval: the first release, 99 ms later, serves A; the second, at 101 ms, sheds the two left
    (past the interval). A default off by two milliseconds either way fails one or the other."""
    held = Held()
    holder = asyncio.create_task(bulkhead.execute(held.op, "H"))
    await turns()
    waiters = [asyncio.create_task(bulkhead.execute(held.op, name)) for name in "ABC"]
    await turns()
    clock.step(0.099)
    held.release("H")
    await turns()
    assert held.order == ["H", "A"]
    clock.step(0.002)
    held.release("A")
    await turns()
    assert all(task.done() for task in waiters)  # the two left were shed, not handed the slot
    await asyncio.gather(holder, waiters[0])
    for task in waiters[1:]:
        with pytest.raises(stoic.Shed):
            await task
    assert held.order == ["H", "A"]
    assert (bulkhead.in_use, bulkhead.queued) == (0, 0)


async def test_a_queue_target_alone_sheds_under_congestion_measured_over_the_default_interval() -> None:
    clock = SteppingClock()
    bulkhead = Bulkhead(1, queue_limit=None, label="codel", clock=clock, queue_target=0.01)
    await codel_sheds_after_two_default_intervals(bulkhead, clock)


async def test_a_queue_target_retuned_on_keeps_the_default_interval() -> None:
    clock = SteppingClock()
    bulkhead = Bulkhead(1, queue_limit=None, label="codel-retuned", clock=clock)
    bulkhead._retune(queue_target=0.01)
    await codel_sheds_after_two_default_intervals(bulkhead, clock)


def test_a_blocking_queue_target_alone_sheds_under_congestion_measured_over_the_default_interval() -> None:
    clock = SteppingClock()
    bulkhead = BlockingBulkhead(1, queue_limit=None, label="codel", clock=clock, queue_target=0.01)
    bulkhead.acquire()
    waiters = [Waiter(bulkhead, clock) for _ in range(3)]
    for n, waiter in enumerate(waiters, start=1):
        waiter.start()
        queued(bulkhead, n)
    clock.step(0.099)  # within the default interval: A is served
    bulkhead.release()
    eventually(lambda: waiters[0].entered_at is not None)
    clock.step(0.002)  # past it: the two left are shed
    waiters[0].done.set()
    for waiter in waiters:
        waiter.join(5)
    assert waiters[0].error is None
    assert all(isinstance(w.error, stoic.Shed) for w in waiters[1:])
    assert (bulkhead.in_use, bulkhead.queued) == (0, 0)


@pytest.mark.parametrize("managed", [False, True], ids=["fifo", "prioritized"])
async def test_a_queue_retuned_below_its_waiters_refuses_the_next_caller(managed: bool) -> None:
    clock = SteppingClock()
    bulkhead = Bulkhead(1, queue_limit=3, label="shrunk-queue", clock=clock, prioritized=managed)
    held = Held()
    tasks = [asyncio.create_task(bulkhead.execute(held.op, name)) for name in "HABC"]
    await turns()
    assert bulkhead.queued == 3
    bulkhead._retune(queue_limit=1)
    late = asyncio.create_task(bulkhead.execute(held.op, "late"))
    await turns()
    assert late.done()
    with pytest.raises(BulkheadFull):
        await late
    for name in "HABC":
        held.release(name)
    await asyncio.gather(*tasks)
    assert held.order == list("HABC") and (bulkhead.in_use, bulkhead.queued) == (0, 0)


@pytest.mark.parametrize("managed", [False, True], ids=["fifo", "prioritized"])
def test_a_blocking_queue_retuned_below_its_waiters_refuses_the_next_caller(
    managed: bool, events: RecordingSink,
) -> None:
    clock = SteppingClock()
    bulkhead = BlockingBulkhead(1, queue_limit=3, label="shrunk-queue", clock=clock, prioritized=managed)
    bulkhead.acquire()
    waiters = [Waiter(bulkhead, clock) for _ in range(3)]
    for n, waiter in enumerate(waiters, start=1):
        waiter.start()
        queued(bulkhead, n)
    bulkhead._retune(queue_limit=1)
    late = Waiter(bulkhead, clock)  # without a timeout: a wrong verdict would queue it for ever
    late.start()
    late.join(5)
    assert isinstance(late.error, BulkheadFull)
    assert rejections(events) == [{"reason": "bulkhead_full", "capacity": 1, "waiting": 3}]
    bulkhead.release()
    for waiter in waiters:
        eventually(lambda w=waiter: w.entered_at is not None)
        waiter.done.set()
        waiter.join(5)
        assert waiter.error is None
    assert (bulkhead.in_use, bulkhead.queued) == (0, 0)


@pytest.mark.parametrize("managed", [False, True], ids=["fifo", "prioritized"])
async def test_after_the_limit_is_retuned_below_the_slots_taken_no_entry_path_admits_a_newcomer(
    managed: bool,
) -> None:
    clock = SteppingClock()
    bulkhead = Bulkhead(3, queue_limit=None if managed else 0, label="shrunk", clock=clock, prioritized=managed)
    held = Held()
    running = [asyncio.create_task(bulkhead.execute(held.op, name)) for name in "ABC"]
    await turns()
    bulkhead._retune(max_concurrent=1)

    async def under_a_live_deadline() -> None:
        async with stoic.timeout(60, clock=clock):
            await bulkhead.execute(held.op, "scoped")

    async def with_block() -> None:
        async with bulkhead:
            held.order.append("with")

    newcomers = [asyncio.create_task(bulkhead.execute(held.op, "plain")),
                 asyncio.create_task(with_block()),
                 asyncio.create_task(under_a_live_deadline())]
    await turns()
    assert all(task.done() for task in newcomers) is not managed  # refused at once, or waiting
    if not managed:
        for task in newcomers:
            with pytest.raises(BulkheadFull):
                await task
    held.release("A")
    held.release("B")
    await turns()
    assert held.order == list("ABC") and bulkhead.in_use == 1  # two slots retired, none handed on
    held.release("C")
    await asyncio.gather(*running)
    if managed:  # they waited: the slot went to them one at a time
        for name in ("plain", "scoped"):
            held.release(name)
        await asyncio.gather(*newcomers)
        assert sorted(held.order[3:]) == ["plain", "scoped", "with"]
    assert (bulkhead.in_use, bulkhead.queued) == (0, 0)


def test_after_a_blocking_limit_is_retuned_below_the_slots_taken_acquire_and_call_refuse() -> None:
    clock = SteppingClock()
    bulkhead = BlockingBulkhead(3, label="shrunk", clock=clock)
    for _ in range(3):
        bulkhead.acquire()
    bulkhead._retune(max_concurrent=1)
    ran: list[int] = []
    with pytest.raises(BulkheadFull):
        bulkhead.acquire()
    with pytest.raises(BulkheadFull):
        bulkhead.call(ran.append, 1)
    bulkhead.release()
    bulkhead.release()
    assert bulkhead.in_use == 1  # two slots retired
    with pytest.raises(BulkheadFull):
        bulkhead.call(ran.append, 1)
    bulkhead.release()
    bulkhead.call(ran.append, 1)
    assert ran == [1] and bulkhead.in_use == 0


def test_after_a_managed_blocking_limit_is_retuned_below_the_slots_taken_a_newcomer_waits() -> None:
    clock = SteppingClock()
    bulkhead = BlockingBulkhead(3, queue_limit=1, label="shrunk-managed", clock=clock, prioritized=True)
    for _ in range(3):
        bulkhead.acquire()
    bulkhead._retune(max_concurrent=1)
    waiter = Waiter(bulkhead, clock)
    waiter.start()
    queued(bulkhead, 1)
    bulkhead.release()
    bulkhead.release()
    assert waiter.entered_at is None and bulkhead.in_use == 1  # two slots retired, none handed on
    bulkhead.release()
    eventually(lambda: waiter.entered_at is not None)
    waiter.done.set()
    waiter.join(5)
    assert waiter.error is None and (bulkhead.in_use, bulkhead.queued) == (0, 0)


@pytest.mark.parametrize("past", [0.0, 0.5], ids=["at-the-deadline", "past-it"])
async def test_a_waiter_handed_a_slot_once_its_deadline_passed_fails_and_passes_the_slot_on(
    past: float, events: RecordingSink,
) -> None:
    # The deadline's own timer has not fired (a stepped clock): the waiter sees it at wake.
    clock = SteppingClock()
    bulkhead = Bulkhead(1, queue_limit=2, label="woken-late", clock=clock)
    held = Held()

    async def scoped() -> None:
        async with stoic.timeout(1.0, clock=clock):
            await bulkhead.execute(held.op, "scoped")

    holder = asyncio.create_task(bulkhead.execute(held.op, "H"))
    await turns()
    late = asyncio.create_task(scoped())
    await turns()
    after = asyncio.create_task(bulkhead.execute(held.op, "after"))
    await turns()
    clock.step(1.0 + past)
    held.release("H")
    await turns()
    assert late.done()
    with pytest.raises(DeadlineExceeded):
        await late
    assert held.order == ["H", "after"] and bulkhead.in_use == 1
    held.release("after")
    await asyncio.gather(holder, after)
    assert (bulkhead.in_use, bulkhead.queued) == (0, 0)
    assert rejections(events) == [{"reason": "deadline_exceeded", "capacity": 1}]


@pytest.mark.parametrize("managed", [False, True], ids=["fifo", "prioritized"])
def test_a_blocking_waiter_one_nanosecond_before_its_timeout_still_waits_and_takes_the_slot(managed: bool) -> None:
    clock = SteppingClock()
    bulkhead = BlockingBulkhead(1, queue_limit=1, label="one-ns", clock=clock, prioritized=managed)
    bulkhead.acquire()
    waiter = Waiter(bulkhead, clock, timeout=0.02)
    waiter.start()
    queued(bulkhead, 1)
    clock.step(0.02 - 1e-9)
    time.sleep(0.06)  # woken by the step, time to leave wrongly: one nanosecond is still left
    assert waiter.error is None and bulkhead.queued_count == 1
    bulkhead.release()
    eventually(lambda: waiter.entered_at is not None)
    waiter.done.set()
    waiter.join(5)
    assert waiter.error is None and (bulkhead.in_use, bulkhead.queued) == (0, 0)


async def test_every_entry_path_refuses_an_expired_deadline_even_with_a_free_slot() -> None:
    clock = SteppingClock()
    asynchronous = Bulkhead(2, label="late-async", clock=clock)
    blocking = BlockingBulkhead(2, label="late-blocking", clock=clock)
    ran: list[str] = []

    async def op() -> None:
        ran.append("execute")

    async with stoic.timeout(0, clock=clock):
        with pytest.raises(DeadlineExceeded):
            await asynchronous.execute(op)
        with pytest.raises(DeadlineExceeded):
            async with asynchronous:
                ran.append("async with")
        with pytest.raises(DeadlineExceeded):
            blocking.call(ran.append, "call")
        with pytest.raises(DeadlineExceeded), blocking:
            ran.append("with")
    assert ran == [] and asynchronous.in_use == 0 and blocking.in_use == 0


async def test_a_critical_arrival_displaces_a_lower_waiter_from_a_queue_retuned_below_its_waiters() -> None:
    clock = SteppingClock()
    bulkhead = Bulkhead(1, queue_limit=3, label="displace", clock=clock, prioritized=True)
    held = Held()

    async def at(criticality: stoic.Criticality, name: str) -> None:
        with stoic.bind_criticality(criticality):
            await bulkhead.execute(held.op, name)

    holder = asyncio.create_task(bulkhead.execute(held.op, "H"))
    low = [asyncio.create_task(at(stoic.Criticality.BEST_EFFORT, name)) for name in ("low1", "low2", "low3")]
    await turns()
    bulkhead._retune(queue_limit=1)
    high = asyncio.create_task(at(stoic.Criticality.CRITICAL, "high"))
    await turns()
    assert low[2].done() and not high.done()  # the newest of the lowest tier made room
    with pytest.raises(stoic.Shed):
        await low[2]
    held.release("H")
    await turns()
    assert held.order == ["H", "high"]
    for name in ("high", "low1", "low2"):
        held.release(name)
    await asyncio.gather(holder, high, *low[:2])
    assert (bulkhead.in_use, bulkhead.queued) == (0, 0)


def test_a_critical_blocking_arrival_displaces_a_lower_waiter_from_a_queue_retuned_below_its_waiters() -> None:
    clock = SteppingClock()
    bulkhead = BlockingBulkhead(1, queue_limit=3, label="displace", clock=clock, prioritized=True)
    bulkhead.acquire()
    low = [CriticalWaiter(bulkhead, clock, stoic.Criticality.BEST_EFFORT) for _ in range(3)]
    for n, waiter in enumerate(low, start=1):
        waiter.start()
        queued(bulkhead, n)
    bulkhead._retune(queue_limit=1)
    high = CriticalWaiter(bulkhead, clock, stoic.Criticality.CRITICAL)
    high.start()
    low[2].join(5)  # the newest of the lowest tier made room
    assert isinstance(low[2].error, stoic.Shed)
    assert high.error is None and bulkhead.queued_count == 3
    bulkhead.release()
    eventually(lambda: high.entered_at is not None)
    high.done.set()
    for waiter in low[:2]:
        eventually(lambda w=waiter: w.entered_at is not None)
        waiter.done.set()
    for waiter in (high, *low):
        waiter.join(5)
    assert (bulkhead.in_use, bulkhead.queued) == (0, 0)


@pytest.mark.parametrize("managed", [False, True], ids=["fifo", "prioritized"])
async def test_a_limit_retuned_higher_hands_every_new_slot_to_a_waiter_at_once(managed: bool) -> None:
    clock = SteppingClock()
    bulkhead = Bulkhead(1, queue_limit=None, label="grown", clock=clock, prioritized=managed)
    held = Held()
    tasks = [asyncio.create_task(bulkhead.execute(held.op, name)) for name in "HABCD"]
    await turns()
    assert (bulkhead.in_use, bulkhead.queued) == (1, 4)
    bulkhead._retune(max_concurrent=4)
    await turns()
    assert held.order == list("HABC") and (bulkhead.in_use, bulkhead.queued) == (4, 1)
    for name in "HABCD":
        held.release(name)
    await asyncio.gather(*tasks)
    assert held.order == list("HABCD") and (bulkhead.in_use, bulkhead.queued) == (0, 0)


def test_a_blocking_limit_retuned_higher_hands_every_new_slot_to_a_waiter_at_once() -> None:
    clock = SteppingClock()
    bulkhead = BlockingBulkhead(1, queue_limit=None, label="grown", clock=clock)
    bulkhead.acquire()
    waiters = [Waiter(bulkhead, clock) for _ in range(4)]
    for n, waiter in enumerate(waiters, start=1):
        waiter.start()
        queued(bulkhead, n)
    bulkhead._retune(max_concurrent=4)
    for waiter in waiters[:3]:
        eventually(lambda w=waiter: w.entered_at is not None)
    assert waiters[3].entered_at is None and (bulkhead.in_use, bulkhead.queued) == (4, 1)
    bulkhead.release()
    for waiter in waiters:
        waiter.done.set()
        waiter.join(5)
        assert waiter.error is None
    assert (bulkhead.in_use, bulkhead.queued) == (0, 0)


@pytest.mark.parametrize("change", [{"queue_target": 0.01}, {"prioritized": True}, {"queue_adaptive_lifo": True}])
async def test_queue_management_cannot_be_turned_on_while_callers_wait(change: dict[str, object]) -> None:
    bulkhead = Bulkhead(1, queue_limit=2, label="switch-on", clock=SteppingClock())
    held = Held()
    tasks = [asyncio.create_task(bulkhead.execute(held.op, name)) for name in "HA"]
    await turns()
    with pytest.raises(ValueError, match="queue_target"):
        bulkhead._retune(**change)
    held.release("H")
    held.release("A")
    await asyncio.gather(*tasks)
    bulkhead._retune(**change)  # with nobody waiting it may
    assert bulkhead._settings()[next(iter(change))] == next(iter(change.values()))


async def test_queue_management_cannot_be_turned_off_while_callers_wait() -> None:
    bulkhead = Bulkhead(1, queue_limit=2, label="switch-off", clock=SteppingClock(), prioritized=True)
    held = Held()
    tasks = [asyncio.create_task(bulkhead.execute(held.op, name)) for name in "HA"]
    await turns()
    with pytest.raises(ValueError, match="queue_target"):
        bulkhead._retune(prioritized=False)
    held.release("H")
    held.release("A")
    await asyncio.gather(*tasks)
    bulkhead._retune(prioritized=False)
    assert bulkhead._settings()["prioritized"] is False


@pytest.mark.parametrize("managed", [False, True], ids=["fifo", "prioritized"])
async def test_a_limit_retuned_lower_while_callers_wait_retires_slots_before_handing_one_over(managed: bool) -> None:
    clock = SteppingClock()
    bulkhead = Bulkhead(3, queue_limit=None, label="shrunk-waiting", clock=clock, prioritized=managed)
    held = Held()
    tasks = [asyncio.create_task(bulkhead.execute(held.op, name)) for name in "ABCW"]
    await turns()
    assert (bulkhead.in_use, bulkhead.queued) == (3, 1)
    bulkhead._retune(max_concurrent=1)
    held.release("A")
    held.release("B")
    await turns()
    assert held.order == list("ABC") and (bulkhead.in_use, bulkhead.queued) == (1, 1)
    held.release("C")
    await turns()
    assert held.order == list("ABCW") and (bulkhead.in_use, bulkhead.queued) == (1, 0)
    held.release("W")
    await asyncio.gather(*tasks)
    assert (bulkhead.in_use, bulkhead.queued) == (0, 0)


def test_a_blocking_limit_retuned_lower_while_callers_wait_retires_slots_before_handing_one_over() -> None:
    clock = SteppingClock()
    bulkhead = BlockingBulkhead(3, queue_limit=None, label="shrunk-waiting", clock=clock)
    for _ in range(3):
        bulkhead.acquire()
    waiter = Waiter(bulkhead, clock)
    waiter.start()
    queued(bulkhead, 1)
    bulkhead._retune(max_concurrent=1)
    bulkhead.release()
    bulkhead.release()
    assert waiter.entered_at is None and (bulkhead.in_use, bulkhead.queued) == (1, 1)
    bulkhead.release()
    eventually(lambda: waiter.entered_at is not None)
    waiter.done.set()
    waiter.join(5)
    assert waiter.error is None and (bulkhead.in_use, bulkhead.queued) == (0, 0)


async def test_a_deadline_already_past_refuses_every_entry_even_with_a_free_slot() -> None:
    # Past, not just reached: the time left is negative.
    clock = SteppingClock()
    asynchronous = Bulkhead(2, label="past-async", clock=clock)
    managed = Bulkhead(2, queue_limit=1, label="past-managed", clock=clock, prioritized=True)
    blocking = BlockingBulkhead(2, label="past-blocking", clock=clock)
    ran: list[str] = []

    async def op() -> None:
        ran.append("execute")

    async with stoic.timeout(1.0, clock=clock):
        clock.step(1.5)
        for bulkhead in (asynchronous, managed):
            with pytest.raises(DeadlineExceeded):
                await bulkhead.execute(op)
        with pytest.raises(DeadlineExceeded):
            blocking.acquire()
        with pytest.raises(DeadlineExceeded):
            blocking.call(ran.append, "call")
    assert ran == [] and asynchronous.in_use == managed.in_use == blocking.in_use == 0


@pytest.mark.parametrize("managed", [False, True], ids=["fifo", "prioritized"])
@pytest.mark.parametrize("past", [0.0, 1.0], ids=["at-the-timeout", "past-it"])
def test_a_blocking_waiter_handed_the_slot_after_its_timeout_fails_and_passes_it_on(managed: bool, past: float) -> None:
    clock = SteppingClock()
    bulkhead = BlockingBulkhead(1, queue_limit=2, label="late-hand-over", clock=clock, prioritized=managed)
    bulkhead.acquire()
    late = Waiter(bulkhead, clock, timeout=30.0)  # waits up to 30 real seconds between rechecks
    late.start()
    queued(bulkhead, 1)
    after = Waiter(bulkhead, clock)
    after.start()
    queued(bulkhead, 2)
    clock.step(30.0 + past)
    bulkhead.release()  # wakes the first waiter granted, past its time: it passes the slot on
    late.join(5)
    assert isinstance(late.error, DeadlineExceeded)
    eventually(lambda: after.entered_at is not None)
    after.done.set()
    after.join(5)
    assert after.error is None and (bulkhead.in_use, bulkhead.queued) == (0, 0)


class NudgingClock(SteppingClock):
    """A :class:`SteppingClock` that moves on by ``nudge_ns`` right after the main thread's next
    reading: what a releaser reads and what the waiter it wakes reads then differ."""

    def __init__(self) -> None:
        super().__init__()
        self.nudge_ns = 0

    def now_ns(self) -> int:
        now = super().now_ns()
        if self.nudge_ns and threading.current_thread() is threading.main_thread():
            self._set_now(now + self.nudge_ns)
            self.nudge_ns = 0
        return now


def test_a_managed_blocking_full_queue_refuses_an_arrival_it_cannot_displace(events: RecordingSink) -> None:
    clock = SteppingClock()
    bulkhead = BlockingBulkhead(1, queue_limit=1, label="managed-full", clock=clock, prioritized=True)
    bulkhead.acquire()
    low = Waiter(bulkhead, clock)  # at the caller's own tier (normal)
    low.start()
    queued(bulkhead, 1)
    with pytest.raises(BulkheadFull):  # the same tier displaces nobody
        bulkhead.acquire()
    with stoic.bind_criticality(stoic.Criticality.CRITICAL), pytest.raises(BulkheadFull):
        bulkhead.acquire(timeout=0)  # one that may not wait displaces nobody either
    assert low.error is None and bulkhead.queued_count == 1
    assert rejections(events) == [{"reason": "bulkhead_full", "capacity": 1, "waiting": 1}] * 2
    bulkhead.release()
    eventually(lambda: low.entered_at is not None)
    low.done.set()
    low.join(5)
    assert (bulkhead.in_use, bulkhead.queued) == (0, 0)


def test_a_shed_blocking_waiter_reports_how_long_it_waited(events: RecordingSink) -> None:
    clock = SteppingClock()
    bulkhead = BlockingBulkhead(1, queue_limit=1, label="sojourn", clock=clock, prioritized=True)
    bulkhead.acquire()
    low = CriticalWaiter(bulkhead, clock, stoic.Criticality.BEST_EFFORT)
    low.start()
    queued(bulkhead, 1)
    clock.step(0.25)
    high = CriticalWaiter(bulkhead, clock, stoic.Criticality.CRITICAL)
    high.start()
    low.join(5)
    assert isinstance(low.error, stoic.Shed)
    assert rejections(events) == [
        {"reason": "priority", "capacity": 1, "sojourn": 0.25, "criticality": "best_effort"}]
    bulkhead.release()
    eventually(lambda: high.entered_at is not None)
    high.done.set()
    high.join(5)
    assert (bulkhead.in_use, bulkhead.queued) == (0, 0)


@pytest.mark.parametrize("past", [0.0, 0.01], ids=["at-the-timeout", "past-it"])
def test_a_managed_blocking_waiter_gives_up_at_its_timeout_without_a_release(
    past: float, events: RecordingSink,
) -> None:
    clock = SteppingClock()
    bulkhead = BlockingBulkhead(1, queue_limit=1, label="managed-timeout", clock=clock, prioritized=True)
    bulkhead.acquire()
    waiter = Waiter(bulkhead, clock, timeout=0.02)
    waiter.start()
    queued(bulkhead, 1)
    clock.step(0.02 + past)
    waiter.join(5)
    assert isinstance(waiter.error, DeadlineExceeded)
    assert (bulkhead.in_use, bulkhead.queued) == (1, 0)
    bulkhead.release()
    assert bulkhead.in_use == 0
    # Reported as a shed waiter is: how long it waited, and its tier.
    assert rejections(events) == [{"reason": "deadline_exceeded", "capacity": 1,
                                   "sojourn": pytest.approx(0.02 + past), "criticality": "normal"}]


def test_an_interrupted_managed_blocking_waiter_leaves_the_queue_without_giving_back_a_slot() -> None:
    clock = SteppingClock()
    bulkhead = BlockingBulkhead(1, queue_limit=2, label="managed-interrupt", clock=clock, prioritized=True)
    bulkhead.acquire()
    first = Waiter(bulkhead, clock, timeout=0.02)
    first.start()
    queued(bulkhead, 1)
    second = Waiter(bulkhead, clock, timeout=0.02)
    second.start()
    queued(bulkhead, 2)
    clock.interrupted.add(first)
    clock.step(0)  # wakes the waiters: "first" reads the clock, and is interrupted
    first.join(5)
    assert isinstance(first.error, KeyboardInterrupt)
    assert (bulkhead.in_use, bulkhead.queued) == (1, 1)
    bulkhead.release()
    eventually(lambda: second.entered_at is not None)
    second.done.set()
    second.join(5)
    assert second.error is None and (bulkhead.in_use, bulkhead.queued) == (0, 0)


def test_a_managed_blocking_waiter_granted_just_before_its_timeout_but_woken_at_it_passes_the_slot_on(
    events: RecordingSink,
) -> None:
    clock = NudgingClock()
    bulkhead = BlockingBulkhead(1, queue_limit=2, label="managed-late", clock=clock, prioritized=True)
    bulkhead.acquire()
    late = Waiter(bulkhead, clock, timeout=30.0)  # waits up to 30 real seconds between rechecks
    late.start()
    queued(bulkhead, 1)
    after = Waiter(bulkhead, clock)
    after.start()
    queued(bulkhead, 2)
    clock.step(30.0 - 1e-9)
    clock.nudge_ns = 1  # the release reads 1 ns before the timeout (and grants), the waiter reads it
    bulkhead.release()
    late.join(5)
    assert isinstance(late.error, DeadlineExceeded)
    eventually(lambda: after.entered_at is not None)
    after.done.set()
    after.join(5)
    assert after.error is None and (bulkhead.in_use, bulkhead.queued) == (0, 0)
    assert rejections(events) == [
        {"reason": "deadline_exceeded", "capacity": 1, "sojourn": 30.0, "criticality": "normal"}]
