"""Hostile tests of the blocking (threaded) policies under contention."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
from _threads import GateLock, eventually, process_wide_sink  # noqa: F401  (the process-wide `sink` fixture)

import stoic
from stoic import DeadlineExceeded
from stoic.bulkhead import BlockingBulkhead
from stoic.ratelimiter import BlockingRateLimiter
from stoic.testing import RecordingSink, VirtualClock

SECOND_NS = 1_000_000_000


def test_waiters_timing_out_after_a_lower_queue_limit_is_retuned_fail_with_deadline_exceeded(
        sink: RecordingSink) -> None:
    # Seen failing before the fix: a waiter that had queued (there was room then) judged its
    # time-out by the queue limit as it stood at wake: after a retune lowered it below the
    # waiter's place, the waiter that had waited its whole timeout was told BulkheadFull (and
    # bulkhead.rejected said bulkhead_full) instead of DeadlineExceeded.
    clock = VirtualClock()
    bulkhead = BlockingBulkhead(1, queue_limit=100, label="retuned", clock=clock)
    bulkhead.acquire()
    outcomes: list[BaseException | None] = []
    lock = threading.Lock()

    def wait() -> None:
        try:
            bulkhead.acquire(timeout=1.0)
            outcome: BaseException | None = None
        except BaseException as exc:
            outcome = exc
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=wait, daemon=True) for _ in range(50)]
    for thread in threads:
        thread.start()
    try:
        eventually(lambda: bulkhead.queued_count == 50)
        bulkhead._retune(queue_limit=1)  # the waiters keep their places
        clock._set_now(2 * SECOND_NS)
        for thread in threads:
            thread.join(5)
        assert len(outcomes) == 50
        assert [type(o) for o in outcomes] == [DeadlineExceeded] * 50
        reasons = [e.attributes["reason"] for e in sink.of("bulkhead.rejected")]
        assert reasons == ["deadline_exceeded"] * 50
        assert (bulkhead.active_count, bulkhead.queued_count) == (1, 0)
    finally:
        bulkhead.release()
        for thread in threads:
            thread.join(5)
    assert bulkhead.active_count == 0


async def _async_op() -> int:
    return 1


def _generator_op() -> Iterator[int]:
    yield 1


async def _async_generator_op() -> AsyncIterator[int]:
    yield 1


def _plain(fn: Callable[[], object]) -> Callable[[], object]:
    return lambda: fn()  # a plain function handing back what fn returns (an async def is refused at once)


@pytest.mark.parametrize("op", [_async_op, _generator_op, _async_generator_op], ids=lambda f: f.__name__)
def test_blocking_bulkhead_call_refuses_an_operation_that_returns_work_still_to_run(
        op: Callable[[], object]) -> None:
    # Seen failing before the fix: BlockingBulkhead.call(fn) returned the coroutine (or
    # generator) fn made, with the slot already given back: its body ran when the caller awaited
    # (iterated) it, outside the bulkhead, so 300 threads ran it at once through a bulkhead of
    # one, silently. CircuitBreaker.call and retry_sync refuse it with TypeError (cause a Defect).
    bulkhead = BlockingBulkhead(1, queue_limit=None, label="unrun")
    results: list[object] = []
    barrier = threading.Barrier(300)
    lock = threading.Lock()

    def caller(fn: Callable[[], object]) -> None:
        barrier.wait()
        try:
            outcome: object = bulkhead.call(fn)
        except BaseException as exc:
            outcome = exc
        with lock:
            results.append(outcome)

    threads = [threading.Thread(target=caller, args=(op if n % 2 else _plain(op),)) for n in range(300)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    assert len(results) == 300
    for outcome in results:
        assert isinstance(outcome, TypeError), outcome
        assert "BlockingBulkhead" in str(outcome) and isinstance(outcome.__cause__, stoic.Defect)
    assert (bulkhead.active_count, bulkhead.queued_count) == (0, 0)  # every slot given back
    assert bulkhead.call(lambda: 7) == 7


@pytest.mark.parametrize("op", [_async_op, _generator_op, _async_generator_op], ids=lambda f: f.__name__)
def test_blocking_rate_limiter_call_refuses_an_operation_that_returns_work_still_to_run(
        op: Callable[[], object]) -> None:
    # Seen failing before the fix: BlockingRateLimiter.call(fn) spent a permit and returned the
    # coroutine (generator) fn made: its body ran later, whenever the caller awaited it, not
    # when the limiter allowed it.
    limiter = BlockingRateLimiter(1_000, burst=1_000, label="unrun")
    for fn in (op, _plain(op)):
        with pytest.raises(TypeError, match="BlockingRateLimiter") as caught:
            limiter.call(fn)
        assert isinstance(caught.value.__cause__, stoic.Defect)
    assert limiter.call(lambda: 7) == 7


def test_try_acquire_reads_the_burst_under_the_lock(sink: RecordingSink) -> None:
    # Seen failing before the fix: try_acquire checked permits against the burst before taking
    # the lock; a retune from another thread lowering the burst in between let it take 5
    # permits from a bucket of 2 (its deficit then above the bucket's size), as acquire, which
    # reads the burst again under the lock, never does.
    clock = VirtualClock()
    limiter = BlockingRateLimiter(10, per=1.0, burst=10, label="burst-race", clock=clock)
    gate = GateLock(limiter._lock)
    limiter._lock = gate  # type: ignore[assignment]
    gate.hook = lambda: limiter._retune(burst=2)  # just before try_acquire holds the lock
    assert limiter.try_acquire(5) is False
    assert limiter.available_permits == 2  # nothing taken
    assert [dict(e.attributes) for e in sink.of("ratelimiter.oversized")] == [{"permits": 5, "burst": 2}]
    assert limiter.try_acquire(2) is True


class _ReleaseGate(GateLock):
    """A policy's lock running ``after`` once, just after it is next released: the moment
    between a thread's decision under the lock and what it does with it outside."""

    def __init__(self, real: threading.Lock) -> None:
        super().__init__(real)
        self.after: Callable[[], None] | None = None

    def release(self) -> None:
        self.real.release()
        after, self.after = self.after, None
        if after is not None:
            after()


def test_a_managed_caller_out_of_time_is_refused_as_decided_under_the_lock() -> None:
    # Seen failing before the fix: a queue-managed caller that could not wait (its timeout
    # already spent) with room in the queue was refused by a second reading of queue_limit made
    # after the lock was released: a retune lowering the limit in between turned its
    # DeadlineExceeded into BulkheadFull.
    bulkhead = BlockingBulkhead(1, queue_limit=5, label="decided", prioritized=True)
    gate = _ReleaseGate(bulkhead._lock)
    bulkhead._lock = gate  # type: ignore[assignment]
    bulkhead.acquire()
    parked = threading.Thread(target=bulkhead.acquire, daemon=True)  # waits for the slot
    parked.start()
    eventually(lambda: bulkhead.queued_count == 1)
    gate.after = lambda: bulkhead._retune(queue_limit=1)
    with pytest.raises(DeadlineExceeded):
        bulkhead.acquire(timeout=0)
    assert bulkhead.queue_limit == 1
    bulkhead.release()  # handed to the parked thread
    parked.join(5)
    assert not parked.is_alive()
    bulkhead.release()
    assert (bulkhead.active_count, bulkhead.queued_count) == (0, 0)
