"""BlockingBulkhead with real threads and tiny real timeouts."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from _threads import GateLock, eventually, process_wide_sink  # noqa: F401  (the process-wide `sink` fixture)

import stoic
from stoic import BulkheadFull, DeadlineExceeded
from stoic.bulkhead import BlockingBulkhead
from stoic.testing import RecordingSink, VirtualClock


class Holder(threading.Thread):
    """Holds a slot until released by the test."""

    def __init__(self, bulkhead: BlockingBulkhead, name: str, entered: list[str]) -> None:
        super().__init__(name=name, daemon=True)
        self.bulkhead, self.entered = bulkhead, entered
        self.go = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with self.bulkhead:
                self.entered.append(self.name)
                self.go.wait(10)
        except BaseException as exc:
            self.error = exc


def test_configuration_is_validated() -> None:
    with pytest.raises(ValueError, match="max_concurrent"):
        BlockingBulkhead(0, label="x")
    with pytest.raises(ValueError, match="queue_limit"):
        BlockingBulkhead(1, queue_limit=-2, label="x")


def test_full_and_fifo_hand_over(sink: RecordingSink) -> None:
    bulkhead = BlockingBulkhead(1, queue_limit=2, label="fifo")
    entered: list[str] = []
    holders = [Holder(bulkhead, f"h{i}", entered) for i in range(3)]
    holders[0].start()
    eventually(lambda: entered == ["h0"])
    for i, holder in enumerate(holders[1:], start=1):
        holder.start()
        eventually(lambda n=i: bulkhead.queued_count == n)
    with pytest.raises(BulkheadFull):
        bulkhead.call(lambda: None)
    assert dict(sink.of("bulkhead.rejected")[0].attributes) == {"reason": "bulkhead_full", "capacity": 1, "waiting": 2}
    for i, holder in enumerate(holders):
        holder.go.set()
        holder.join(5)
        assert holder.error is None
        if i + 1 < len(holders):
            eventually(lambda n=i: len(entered) == n + 2)
    assert entered == ["h0", "h1", "h2"]
    assert (bulkhead.active_count, bulkhead.queued_count) == (0, 0)


def test_a_timed_out_waiter_leaves_without_a_slot(sink: RecordingSink) -> None:
    bulkhead = BlockingBulkhead(1, queue_limit=1, label="t")
    entered: list[str] = []
    holder = Holder(bulkhead, "holder", entered)
    holder.start()
    eventually(lambda: entered == ["holder"])
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        bulkhead.acquire(timeout=0.01)
    assert time.monotonic() - started >= 0.009
    assert (bulkhead.active_count, bulkhead.queued_count) == (1, 0)
    assert dict(sink.of("bulkhead.rejected")[0].attributes) == {"reason": "deadline_exceeded", "capacity": 1}
    holder.go.set()
    holder.join(5)
    assert bulkhead.active_count == 0
    bulkhead.acquire(timeout=0)  # free: no waiting needed
    bulkhead.release()
    with pytest.raises(RuntimeError, match="release"):
        bulkhead.release()
    with pytest.raises(ValueError, match="timeout"):
        bulkhead.acquire(timeout=-0.1)


def test_no_lock_is_held_across_the_call() -> None:
    bulkhead = BlockingBulkhead(4, label="parallel")
    # All four calls must be inside at once to pass the barrier: with a lock held across the
    # call the first would wait there alone and the barrier break after 10 s. (It was a
    # wall-clock bound, 4 x 50 ms in under 0.19 s, which a machine stalled 140 ms could fail.)
    inside = threading.Barrier(4, timeout=10)

    @bulkhead
    def slow() -> int:
        inside.wait()
        return 1

    results: list[int] = []
    threads = [threading.Thread(target=lambda: results.append(slow())) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(15)
    assert results == [1, 1, 1, 1]
    assert not inside.broken
    with pytest.raises(TypeError, match="Bulkhead"):

        @bulkhead
        async def nope() -> None: ...


def test_contending_threads_never_exceed_the_limit() -> None:
    bulkhead = BlockingBulkhead(3, queue_limit=40, label="many")
    lock = threading.Lock()
    inside = 0
    most = 0

    def op(error: bool) -> None:
        nonlocal inside, most
        with lock:
            inside += 1
            most = max(most, inside)
        time.sleep(0.001)
        with lock:
            inside -= 1
        if error:
            raise KeyError("mine")

    errors: list[BaseException] = []

    def work(i: int) -> None:
        for j in range(5):
            try:
                bulkhead.call(op, (i + j) % 3 == 0)
            except KeyError as exc:
                errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(30)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert 1 <= most <= 3
    assert len(errors) == 50  # the operation's own errors propagate, unchanged
    assert (bulkhead.active_count, bulkhead.queued_count) == (0, 0)


HOUR_NS = 3_600 * 1_000_000_000


@pytest.mark.parametrize("bound", ["timeout", "deadline"])
@pytest.mark.parametrize("managed", [False, True], ids=["fifo", "queue-managed"])
def test_a_waiters_time_limit_on_a_virtual_clock_ends_when_virtual_time_reaches_it(managed: bool, bound: str) -> None:
    # Seen failing before the fix: the waiter slept its hour in real seconds, so moving virtual
    # time past it did not end the wait (the waiter was still queued at the join).
    clock = VirtualClock()
    extra = {"prioritized": True} if managed else {}
    bulkhead = BlockingBulkhead(1, queue_limit=1, label="virtual", clock=clock, **extra)  # type: ignore[arg-type]
    bulkhead.acquire()
    outcome: list[BaseException | None] = []

    async def under_deadline() -> None:
        async with stoic.timeout(3_600.0, clock=clock):
            bulkhead.acquire()

    def wait() -> None:
        try:
            if bound == "timeout":
                bulkhead.acquire(timeout=3_600.0)
            else:
                asyncio.run(under_deadline())  # (no timer fires: the deadline is seen to pass)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    try:
        eventually(lambda: bulkhead.queued_count == 1)
        clock._set_now(HOUR_NS - 1)  # woken, one nanosecond left: it waits on
        clock._set_now(HOUR_NS)
        waiter.join(5)
        assert len(outcome) == 1 and isinstance(outcome[0], DeadlineExceeded)
        assert (bulkhead.active_count, bulkhead.queued_count) == (1, 0) and clock._blocked == {}
    finally:
        bulkhead.release()  # (frees the waiter, if still asleep)
        waiter.join(5)
    assert bulkhead.active_count == 0  # the slot was not handed to the waiter that left


@pytest.mark.parametrize("switch", ["on", "off"])
def test_queue_management_switched_as_a_caller_arrives_is_read_under_the_lock(switch: str) -> None:
    # Seen failing before the fix: the arrival read the queue rules before taking the lock, so
    # one that a retune switched on in between queued as a plain FIFO waiter the rules knew
    # nothing of (the release raised KeyError, the slot and the waiter leaked), and one that a
    # retune switched off parked with the old rules and failed its timeout (AssertionError).
    clock = VirtualClock()
    bulkhead = BlockingBulkhead(1, queue_limit=5, label="switched", clock=clock, prioritized=switch == "off")
    gate = GateLock(bulkhead._lock)
    bulkhead._lock = gate  # type: ignore[assignment]
    bulkhead.acquire()
    outcome: list[BaseException | None] = []

    def arrive() -> None:
        gate.hook = lambda: bulkhead._retune(prioritized=switch == "on")  # (nobody waits: allowed)
        try:
            bulkhead.acquire(timeout=1.0)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    arrival = threading.Thread(target=arrive, daemon=True)
    arrival.start()
    eventually(lambda: bulkhead.queued_count == 1)
    assert (bulkhead._rules is not None) == (switch == "on")
    if switch == "on":
        bulkhead.release()  # handed to the arrival, under the rules it queued with
        arrival.join(5)
        assert outcome == [None] and (bulkhead.active_count, bulkhead.queued_count) == (1, 0)
    else:
        clock._set_now(1_000_000_000)  # its timeout passes: it leaves without a slot
        arrival.join(5)
        assert len(outcome) == 1 and isinstance(outcome[0], DeadlineExceeded)
        assert (bulkhead.active_count, bulkhead.queued_count) == (1, 0)
    bulkhead.release()
    assert (bulkhead.active_count, bulkhead.queued_count) == (0, 0)


@pytest.mark.parametrize("bound", ["timeout", "deadline"])
@pytest.mark.parametrize("managed", [False, True], ids=["fifo", "queue-managed"])
def test_time_spent_waiting_for_the_lock_counts_against_the_waiters_time_limit(managed: bool, bound: str) -> None:
    # Seen failing before the fix: the time left was read before taking the lock and counted
    # from an instant read after it, so time passing in between (the lock held by other
    # threads) was given back: the waiter was still queued after its time limit, and was handed
    # the slot released then.
    clock = VirtualClock()
    extra = {"prioritized": True} if managed else {}
    bulkhead = BlockingBulkhead(1, queue_limit=1, label="lock-wait", clock=clock, **extra)  # type: ignore[arg-type]
    bulkhead.acquire()
    gate = GateLock(bulkhead._lock)
    bulkhead._lock = gate  # type: ignore[assignment]
    outcome: list[BaseException | None] = []

    async def under_deadline() -> None:
        async with stoic.timeout(1.0, clock=clock):
            bulkhead.acquire()

    def wait() -> None:
        gate.hook = lambda: clock._set_now(900_000_000)  # 0.9 s pass before it holds the lock
        try:
            if bound == "timeout":
                bulkhead.acquire(timeout=1.0)
            else:
                asyncio.run(under_deadline())  # (no timer fires: the deadline is seen to pass)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    try:
        eventually(lambda: bulkhead.queued_count == 1)
        clock._set_now(1_000_000_000)  # its time limit, 1 s after it called
        eventually(lambda: bulkhead.queued_count == 0)
        assert len(outcome) == 1 and isinstance(outcome[0], DeadlineExceeded)
    finally:
        bulkhead.release()  # (hands the slot to the waiter, if still queued)
        waiter.join(5)
    assert (bulkhead.active_count, bulkhead.queued_count) == (0, 0)
