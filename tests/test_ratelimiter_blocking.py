"""BlockingRateLimiter with real threads: virtual time for the waits, tiny real timeouts only."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest
from _threads import GateLock, eventually, process_wide_sink  # noqa: F401  (the process-wide `sink` fixture)

import stoic
from stoic import DeadlineExceeded, RateLimited
from stoic.ratelimiter import BlockingRateLimiter
from stoic.testing import RecordingSink, VirtualClock


def advance(clock: VirtualClock, seconds: float) -> None:
    asyncio.run(clock.advance(seconds))


class Worker(threading.Thread):
    def __init__(self, limiter: BlockingRateLimiter, clock: VirtualClock, name: str, log: list[tuple[str, float]],
                 permits: int = 1, timeout: float | None = None) -> None:
        super().__init__(name=name, daemon=True)
        self.limiter, self.clock, self.log = limiter, clock, log
        self.permits, self.timeout = permits, timeout
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.limiter.acquire(self.permits, timeout=self.timeout)
            self.log.append((self.name, self.clock.now()))
        except BaseException as exc:
            self.error = exc


def test_fast_paths_take_permits_without_waiting() -> None:
    clock = VirtualClock()
    limiter = BlockingRateLimiter(4, label="b", clock=clock)

    @limiter
    def double(x: int) -> int:
        return 2 * x

    assert double(2) == 4
    assert limiter.call(lambda a, b: a + b, 1, b=2) == 3  # type: ignore[misc]
    with limiter:
        pass
    assert limiter.try_acquire()
    assert not limiter.try_acquire()
    assert limiter.available_permits == 0
    with pytest.raises(TypeError, match="RateLimiter"):

        @limiter
        async def nope() -> None: ...


def test_threads_wait_in_fifo_order_on_the_limiters_clock(sink: RecordingSink) -> None:
    clock = VirtualClock()
    limiter = BlockingRateLimiter(1, per=1.0, burst=2, queue_limit=None, label="fifo", clock=clock)
    limiter.acquire(2)
    log: list[tuple[str, float]] = []
    workers = []
    for i, permits in enumerate([2, 1, 1]):
        worker = Worker(limiter, clock, f"w{i}", log, permits)
        worker.start()
        workers.append(worker)
        eventually(lambda n=i + 1: limiter.waiter_count == n)
    assert not limiter.try_acquire()  # no overtaking
    advance(clock, 2.0)
    eventually(lambda: len(log) == 1)
    advance(clock, 1.0)
    eventually(lambda: len(log) == 2)
    advance(clock, 1.0)
    eventually(lambda: len(log) == 3)
    for worker in workers:
        worker.join(5)
        assert worker.error is None
    assert log == [("w0", 2.0), ("w1", 3.0), ("w2", 4.0)]
    waited = [dict(e.attributes) for e in sink.of("ratelimiter.waited")]
    assert sorted(w["waited"] for w in waited) == [2.0, 3.0, 4.0]


def test_acquire_decides_before_waiting(sink: RecordingSink) -> None:
    clock = VirtualClock()
    limiter = BlockingRateLimiter(2, per=1.0, burst=1, queue_limit=1, label="d", clock=clock)
    limiter.acquire()
    with pytest.raises(RateLimited) as caught:
        limiter.acquire(timeout=0.4)
    assert caught.value.retry_after == 0.5
    assert limiter.waiter_count == 0
    log: list[tuple[str, float]] = []
    worker = Worker(limiter, clock, "w", log, timeout=0.5)  # a wait of exactly the timeout is fine
    worker.start()
    eventually(lambda: limiter.waiter_count == 1)
    with pytest.raises(RateLimited) as full:
        limiter.acquire()
    assert full.value.retry_after == 1.0
    advance(clock, 0.5)
    worker.join(5)
    assert worker.error is None and log == [("w", 0.5)]
    reasons = [e.attributes["reason"] for e in sink.of("ratelimiter.rejected")]
    assert reasons == ["would_exceed_deadline", "queue_full"]
    with pytest.raises(RateLimited):
        limiter.acquire(2)
    assert sink.names[-1] == "ratelimiter.oversized"
    with pytest.raises(ValueError, match="timeout"):
        limiter.acquire(timeout=-1)
    with pytest.raises(ValueError, match="permits"):
        limiter.acquire(0)


class StallingClock(VirtualClock):
    """A virtual clock whose blocking sleeps also wait for the test's go-ahead: a thread that
    is late to run, while time moves on."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()

    def sleep_until_blocking(self, when_ns: int) -> None:
        self.go.wait()
        super().sleep_until_blocking(when_ns)


def _head_and_late(limiter: BlockingRateLimiter, clock: VirtualClock, log: list[tuple[str, float]],
                   timeout: float) -> tuple[Worker, Worker]:
    """A head waiting for a permit of an emptied bucket, then a late waiter queued behind it."""
    limiter.acquire()
    head = Worker(limiter, clock, "head", log)
    head.start()
    eventually(lambda: limiter.waiter_count == 1)
    late = Worker(limiter, clock, "late", log, timeout=timeout)
    late.start()
    eventually(lambda: limiter.waiter_count == 2)
    return head, late


def test_a_waiter_still_unserved_at_its_timeout_leaves_without_consuming(sink: RecordingSink) -> None:
    clock = StallingClock()
    limiter = BlockingRateLimiter(100, per=1.0, burst=1, label="t", clock=clock)
    log: list[tuple[str, float]] = []
    head, late = _head_and_late(limiter, clock, log, timeout=0.025)  # late admitted: served at 20 ms
    advance(clock, 1.0)  # ...but the head's thread is stalled past the late waiter's timeout
    late.join(5)
    assert isinstance(late.error, DeadlineExceeded)
    assert limiter.waiter_count == 1
    clock.go.set()
    head.join(5)
    assert head.error is None and log == [("head", 1.0)]
    assert limiter.available_permits == 1  # a late head leaves at most a full bucket, never more
    assert sink.of("ratelimiter.rejected")[-1].attributes == {"reason": "deadline_exceeded", "permits": 1}


def test_contending_threads_on_the_system_clock_never_exceed_the_bound() -> None:
    start = time.monotonic_ns()  # no later than the limiter's own start: the bound is tighter
    limiter = BlockingRateLimiter(2000, per=1.0, burst=5, queue_limit=None, label="real")
    grants: list[int] = []
    lock = threading.Lock()

    def work() -> None:
        for _ in range(10):
            limiter.acquire()
            with lock:
                grants.append(time.monotonic_ns())

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(grants) == 80
    for index, at in enumerate(sorted(grants), start=1):
        # Recorded after the grant, so never earlier than it: the bound can only be looser.
        assert index <= 5 + 2000 * (at - start) // 1_000_000_000
    assert (max(grants) - start) >= 75 * 1_000_000_000 // 2000 - 1_000_000
    assert limiter.waiter_count == 0


def test_a_burst_lowered_while_a_caller_enters_is_read_again_under_the_lock() -> None:
    # A retune from another thread lands between acquire()'s first check and its lock (simulated
    # here inside the timeout's conversion): the request is refused as oversized, never served
    # from a bucket smaller than it.
    limiter = BlockingRateLimiter(100, 1.0, burst=10, queue_limit=None, label="race")
    limiter.acquire(10)

    class Retuning(float):
        fired = False

        def __gt__(self, other: object) -> bool:
            if not Retuning.fired:
                Retuning.fired = True
                limiter._retune(burst=5)
            return float.__gt__(self, other)  # type: ignore[operator]

    with pytest.raises(RateLimited, match="can never be granted"):
        limiter.acquire(10, timeout=Retuning(3.0))
    assert Retuning.fired and limiter.burst == 5 and limiter.waiter_count == 0


def test_a_blocked_thread_waits_for_the_deficit_not_the_request() -> None:
    """Field report 13 for threads: on a bucket of 3 per 3 s, acquire(1) and then acquire(3):
    the second thread is served exactly when the one-permit deficit has refilled (1 s), not at
    3 s and not 1 ns before 1 s."""
    clock = VirtualClock()
    limiter = BlockingRateLimiter(3, per=3.0, label="deficit", clock=clock)
    log: list[tuple[str, float]] = []
    first = Worker(limiter, clock, "one", log, permits=1)
    first.start()
    first.join(5)
    second = Worker(limiter, clock, "three", log, permits=3)
    second.start()
    eventually(lambda: limiter.waiter_count == 1)
    time.sleep(0.05)  # (real time: let it reach its blocking sleep on the virtual clock)
    advance(clock, 0.999_999_999)
    time.sleep(0.05)  # (real time: a thread woken too early would have logged by now)
    assert log == [("one", 0.0)]
    advance(clock, 0.000_000_001)
    second.join(5)
    assert log == [("one", 0.0), ("three", 1.0)]
    assert first.error is None and second.error is None


def test_a_queued_waiters_timeout_on_a_virtual_clock_ends_when_virtual_time_reaches_it() -> None:
    # A waiter behind the head slept its timeout on its condition in real seconds, so moving
    # virtual time past it did not end the wait while the head still waited (here: a retune to a
    # far slower rate after the second waiter was admitted). Seen failing before the fix (the
    # waiter still asleep at the join).
    clock = VirtualClock()
    limiter = BlockingRateLimiter(1, per=1.0, burst=1, label="queued-virtual", clock=clock)
    log: list[tuple[str, float]] = []
    head, late = _head_and_late(limiter, clock, log, timeout=3_600.0)  # late admitted: served at 2 s
    limiter._retune(rate=1, per=100_000.0)  # the head now waits ~100,000 s
    try:
        clock._set_now(3_600 * 1_000_000_000 - 1)  # one nanosecond left: it waits on
        clock._set_now(3_600 * 1_000_000_000)
        late.join(5)
        assert not late.is_alive() and isinstance(late.error, DeadlineExceeded)
        assert limiter.waiter_count == 1 and log == []
    finally:
        limiter._retune(rate=1_000_000, per=1.0)  # (serves the head, if still asleep)
        advance(clock, 1.0)
        head.join(5)
        late.join(5)
    assert head.error is None and [name for name, _ in log] == ["head"]


def under_deadline(clock: VirtualClock, seconds: float, blocking: Callable[[], None]) -> None:
    """``blocking()`` under ``stoic.timeout(seconds)`` on ``clock`` (its timer never fires: nobody
    advances the loop; the blocking policy sees the deadline pass on the clock)."""

    async def run() -> None:
        async with stoic.timeout(seconds, clock=clock):
            blocking()

    asyncio.run(run())


@pytest.mark.parametrize("bound", ["timeout", "deadline"])
def test_time_spent_waiting_for_the_lock_counts_against_the_waiters_time_limit(bound: str) -> None:
    # Seen failing before the fix: the time left was read before taking the lock and applied from
    # an instant read after it, so time passing in between (the lock held by other threads) was
    # given back: a request that could no longer be served before its deadline was queued and
    # served after it (here at 1 s, for a deadline at 0.6 s).
    clock = VirtualClock()
    limiter = BlockingRateLimiter(1, per=1.0, burst=1, label="lock-wait", clock=clock)
    limiter.acquire()  # the next permit comes at 1 s
    gate = GateLock(limiter._lock)
    limiter._lock = gate  # type: ignore[assignment]
    outcome: list[BaseException | None] = []

    def request() -> None:
        gate.hook = lambda: clock._set_now(500_000_000)  # 0.5 s pass before it holds the lock
        try:
            if bound == "timeout":
                limiter.acquire(timeout=0.6)
            else:
                under_deadline(clock, 0.6, limiter.acquire)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    requester = threading.Thread(target=request, daemon=True)
    requester.start()
    try:
        eventually(lambda: len(outcome) == 1 or limiter.waiter_count == 1)
        assert limiter.waiter_count == 0  # refused at once: 0.1 s were left, the wait is 0.5 s
    finally:
        clock._set_now(1_000_000_000)  # (serves it, if queued)
        requester.join(5)
    assert len(outcome) == 1 and isinstance(outcome[0], RateLimited)
    assert outcome[0].retry_after == 0.5


@pytest.mark.parametrize("bucket", ["full", "empty"])
@pytest.mark.parametrize("instant", [600_000_000, 700_000_000], ids=["at-the-deadline", "past-it"])
def test_a_deadline_that_runs_out_while_waiting_for_the_lock_raises_deadline_exceeded(
        bucket: str, instant: int, sink: RecordingSink) -> None:
    # Seen failing before the fix: a deadline that ran out while the caller waited for the
    # limiter's lock was not seen as passed. An empty bucket refused with RateLimited (as if the
    # deadline were merely too close, retry_after 0.3 s), a full one granted the permit after
    # the deadline (spent on a call that cannot finish in time), where a deadline found passed
    # a moment earlier, at the call, raises DeadlineExceeded and takes nothing.
    clock = VirtualClock()
    limiter = BlockingRateLimiter(1, per=1.0, burst=1, label="lock-deadline", clock=clock)
    if bucket == "empty":
        limiter.acquire()  # the next permit comes at 1 s
    gate = GateLock(limiter._lock)
    limiter._lock = gate  # type: ignore[assignment]
    outcome: list[BaseException | None] = []

    def request() -> None:
        gate.hook = lambda: clock._set_now(instant)  # the deadline (0.6 s) runs out before it holds the lock
        try:
            under_deadline(clock, 0.6, limiter.acquire)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    requester = threading.Thread(target=request, daemon=True)
    requester.start()
    requester.join(5)
    assert not requester.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], DeadlineExceeded)
    assert limiter.waiter_count == 0
    assert limiter.available_permits == (1 if bucket == "full" else 0)  # nothing taken
    assert [dict(e.attributes) for e in sink.of("ratelimiter.rejected")] == [
        {"reason": "deadline_exceeded", "permits": 1}]


def test_a_waiter_out_of_time_in_the_queue_is_not_a_slow_call_for_a_breaker_outside() -> None:
    """Field report 20 for a blocking waiter that leaves unserved (here: a retune to a far slower
    rate after it was admitted, so its 2 s timeout runs out behind the head): an operation that
    catches the DeadlineExceeded and carries on queued 2 s locally, which a breaker outside
    (slow from 1 s) leaves out of the call's duration."""
    clock = VirtualClock()
    breaker = stoic.CircuitBreaker(label="api", window=stoic.CountWindow(1), minimum_calls=1,
                                   slow_call_duration=1.0, slow_call_rate_threshold=0.5, clock=clock)
    limiter = BlockingRateLimiter(1, per=1.0, burst=1, label="queued-step", clock=clock)
    log: list[tuple[str, float]] = []
    limiter.acquire()
    head = Worker(limiter, clock, "head", log)
    head.start()
    eventually(lambda: limiter.waiter_count == 1)
    outcome: list[str] = []

    def step() -> str:
        try:
            limiter.acquire(timeout=2.0)  # admitted: served at 2 s
        except DeadlineExceeded:
            return "without the step"
        return "with the step"

    late = threading.Thread(target=lambda: outcome.append(breaker.call(step)), daemon=True)
    late.start()
    eventually(lambda: limiter.waiter_count == 2)
    limiter._retune(rate=1, per=100_000.0)  # the head now waits ~100,000 s
    try:
        clock._set_now(2_000_000_000)
        late.join(5)
        assert outcome == ["without the step"]
    finally:
        limiter._retune(rate=1_000_000, per=1.0)  # (serves the head)
        advance(clock, 1.0)
        head.join(5)
    snap = breaker.snapshot
    assert (snap.state, snap.calls, snap.slow_calls) == (stoic.BreakerState.CLOSED, 1, 0)
