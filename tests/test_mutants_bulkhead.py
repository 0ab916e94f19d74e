"""Bulkhead behaviour that mutation testing found unchecked (issue 9, item 5; docs/mutation.md).

Seed 000, "Bulkhead": at most ``max_concurrent`` run, ``queue_limit`` more wait FIFO, the next is
refused; a waiter that leaves (cancelled, timed out, cut by a deadline, interrupted) never takes
a slot and never gives back one it did not hold. The blocking bulkhead is driven on a virtual
clock that only the test moves; its waiters recheck that clock at least every ``timeout``
seconds of real time, so the timeouts used here are a few hundredths of a second.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
from _threads import eventually

import stoic
from stoic import BulkheadFull, DeadlineExceeded
from stoic.bulkhead import BlockingBulkhead, Bulkhead
from stoic.events import Level
from stoic.testing import RecordingSink, VirtualClock

START = 1000.0  # a clock far from zero: an instant and a duration are never confused


class SteppingClock(VirtualClock):
    """A virtual clock moved by :meth:`step` from the test's thread; no timer fires, so an
    ambient deadline on it is only ever *seen* to pass (no task is cancelled)."""

    def __init__(self) -> None:
        super().__init__(START)
        self.interrupted: set[threading.Thread] = set()

    def step(self, seconds: float) -> None:
        self._set_now(self.now_ns() + round(seconds * 1e9))

    def now_ns(self) -> int:
        # A thread marked for interruption gets a KeyboardInterrupt at its next clock reading.
        thread = threading.current_thread()
        if thread in self.interrupted:
            self.interrupted.discard(thread)
            raise KeyboardInterrupt
        return super().now_ns()


@pytest.fixture
def events() -> Iterator[RecordingSink]:
    """Process-wide (worker threads start with a fresh context) and listening at INFO exactly,
    the level of every bulkhead event."""
    recording = RecordingSink(level=Level.INFO)
    stoic.add_sink(recording)
    try:
        yield recording
    finally:
        stoic.remove_sink(recording)
    recording.assert_contract()


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
    time.sleep(0.06)  # several rechecks of the clock: one millisecond is still left
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
