"""RateLimiter on virtual time: the bucket, the queue, rejections, cancellation and events
(seed 000, "RateLimiter" and "Testing"; field reports 11-13)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

import stoic
import stoic.ratelimiter as ratelimiter_module
from stoic import DeadlineExceeded, RateLimited
from stoic.ratelimiter import RateLimiter
from stoic.testing import RecordingSink, VirtualClock, settle


def served_at(clock: VirtualClock, limiter: RateLimiter, permits: int, log: list[tuple[str, float]], name: str):
    async def run() -> None:
        await limiter.acquire(permits)
        log.append((name, clock.now()))

    return asyncio.create_task(run(), name=name)


# --- configuration ---


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"rate": 0}, "rate"),
        ({"rate": -3}, "rate"),
        ({"rate": 1.5}, "rate"),
        ({"rate": 1, "per": 0}, "per"),
        ({"rate": 1, "per": -1.0}, "per"),
        ({"rate": 1, "per": timedelta(0)}, "per"),
        ({"rate": 1, "burst": 0}, "burst"),
        ({"rate": 1, "queue_limit": -1}, "queue_limit"),
    ],
)
def test_invalid_configuration_names_the_parameter(kwargs: dict[str, object], parameter: str) -> None:
    with pytest.raises(ValueError, match=parameter):
        RateLimiter(label="x", **kwargs)  # type: ignore[arg-type]


async def test_invalid_permits_are_a_value_error(clock: VirtualClock) -> None:
    limiter = RateLimiter(5, label="x")
    for bad in (0, -1, 2.5, "2"):
        with pytest.raises(ValueError, match="permits"):
            await limiter.acquire(bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="permits"):
            limiter.try_acquire(bad)  # type: ignore[arg-type]
    assert limiter.available_permits == 5


def test_defaults_and_configuration_are_readable() -> None:
    limiter = RateLimiter(10, timedelta(milliseconds=500), label="api", clock=VirtualClock())
    assert (limiter.rate, limiter.per, limiter.burst, limiter.queue_limit) == (10, 0.5, 10, 100)
    assert limiter.label == "api"
    assert limiter.available_permits == 10  # full at creation
    assert limiter.waiter_count == 0
    assert "rate=10" in repr(limiter)


# --- the bucket ---


async def test_burst_then_steady_rate(clock: VirtualClock) -> None:
    limiter = RateLimiter(5, per=1.0, burst=10, label="x")
    assert [limiter.try_acquire() for _ in range(11)] == [True] * 10 + [False]
    await clock.advance(0.199_999_999)
    assert not limiter.try_acquire()
    await clock.advance(0.000_000_001)
    assert limiter.try_acquire()
    # A steady stream of waiting acquires is served one every 200 ms, exactly.
    log: list[tuple[str, float]] = []
    tasks = [served_at(clock, limiter, 1, log, f"w{i}") for i in range(5)]
    await clock.run_until_idle()
    assert [t for _, t in log] == pytest.approx([0.4, 0.6, 0.8, 1.0, 1.2], abs=1e-9)
    assert all(t.done() and t.exception() is None for t in tasks)


async def test_refill_never_exceeds_burst(clock: VirtualClock) -> None:
    limiter = RateLimiter(2, per=1.0, burst=3, label="x")
    assert limiter.try_acquire(3)
    await clock.advance(3600)
    assert limiter.available_permits == 3
    assert limiter.try_acquire(3)
    assert not limiter.try_acquire()


async def test_rate_per_interval_is_exact_in_integers(clock: VirtualClock) -> None:
    # 3 permits per 7 s: the k-th permit after an empty bucket comes at ceil(7k/3 s) in ns.
    limiter = RateLimiter(3, per=7.0, burst=1, label="x")
    assert limiter.try_acquire()
    log: list[tuple[str, float]] = []
    for i in range(6):
        served_at(clock, limiter, 1, log, f"w{i}")
    await clock.run_until_idle()
    expected = [-(-(7_000_000_000 * k) // 3) / 1e9 for k in range(1, 7)]
    assert [t for _, t in log] == expected


async def test_a_permit_taken_is_spent_even_when_the_operation_fails(clock: VirtualClock) -> None:
    limiter = RateLimiter(1, per=10.0, label="x")

    async def boom() -> None:
        raise KeyError("mine")

    with pytest.raises(KeyError, match="mine"):
        await limiter.execute(boom)
    assert limiter.available_permits == 0
    assert not limiter.try_acquire()


# --- the queue ---


async def test_waiters_are_served_first_in_first_out(clock: VirtualClock) -> None:
    limiter = RateLimiter(1, per=1.0, burst=3, queue_limit=None, label="x")
    assert limiter.try_acquire(3)
    log: list[tuple[str, float]] = []
    served_at(clock, limiter, 2, log, "a")
    await settle()
    served_at(clock, limiter, 1, log, "b")
    await settle()
    served_at(clock, limiter, 3, log, "c")
    await settle()
    served_at(clock, limiter, 1, log, "d")
    await settle()
    assert limiter.waiter_count == 4
    await clock.run_until_idle()
    # Each is served when everything ahead of it and its own cost has refilled: 2, 3, 6, 7.
    assert log == [("a", 2.0), ("b", 3.0), ("c", 6.0), ("d", 7.0)]


async def test_no_overtaking_try_acquire_is_false_while_anyone_waits(clock: VirtualClock) -> None:
    limiter = RateLimiter(1, per=1.0, burst=3, label="x")
    assert limiter.try_acquire(2)
    log: list[tuple[str, float]] = []
    served_at(clock, limiter, 3, log, "big")
    await clock.advance(1.0)
    assert limiter.available_permits == 2  # the bucket could afford one
    assert not limiter.try_acquire()  # ...but a newcomer never passes a waiter
    small = served_at(clock, limiter, 1, log, "small")  # nor does a waiting acquire
    await clock.advance(0.5)
    assert not small.done()
    await clock.run_until_idle()
    assert log == [("big", 2.0), ("small", 3.0)]


async def test_acquire_decides_before_waiting_queue_full(clock: VirtualClock, sink: RecordingSink) -> None:
    limiter = RateLimiter(1, per=1.0, burst=1, queue_limit=2, label="q")
    assert limiter.try_acquire()
    log: list[tuple[str, float]] = []
    served_at(clock, limiter, 1, log, "a")
    served_at(clock, limiter, 1, log, "b")
    await settle()
    with pytest.raises(RateLimited) as caught:
        await limiter.acquire()
    assert caught.value.retry_after == 3.0  # two ahead plus its own, from an empty bucket
    assert caught.value.label == "q"
    assert limiter.waiter_count == 2
    [event] = sink.of("ratelimiter.rejected")
    assert event.label == "q"
    assert dict(event.attributes) == {"reason": "queue_full", "permits": 1, "retry_after": 3.0}
    await clock.run_until_idle()
    assert log == [("a", 1.0), ("b", 2.0)]  # the rejection consumed nothing


async def test_queue_limit_zero_never_waits(clock: VirtualClock) -> None:
    limiter = RateLimiter(2, per=1.0, queue_limit=0, label="x")
    await limiter.acquire(2)
    with pytest.raises(RateLimited) as caught:
        await limiter.acquire()
    assert caught.value.retry_after == 0.5
    assert limiter.waiter_count == 0


async def test_unbounded_queue(clock: VirtualClock) -> None:
    limiter = RateLimiter(1000, per=1.0, burst=1, queue_limit=None, label="x")
    assert limiter.try_acquire()
    tasks = [asyncio.create_task(limiter.acquire()) for _ in range(500)]
    await settle()
    assert limiter.waiter_count == 500
    await clock.advance(0.5)
    assert limiter.waiter_count == 0 and all(t.done() for t in tasks)


async def test_immediate_rejection_when_the_wait_exceeds_the_deadline(
    clock: VirtualClock, sink: RecordingSink
) -> None:
    limiter = RateLimiter(1, per=1.0, burst=1, label="x")
    assert limiter.try_acquire()
    async with stoic.timeout(1.0):
        # Served exactly at the deadline is too late: the deadline fires first.
        with pytest.raises(RateLimited) as caught:
            await limiter.acquire()
    assert caught.value.retry_after == 1.0
    assert clock.now() == 0.0  # decided before waiting at all
    assert limiter.waiter_count == 0
    assert sink.of("ratelimiter.rejected")[0].attributes == {
        "reason": "would_exceed_deadline", "permits": 1, "retry_after": 1.0,
    }

    async def with_a_nanosecond_to_spare() -> None:
        async with stoic.timeout(1.000_000_001):
            await limiter.acquire()

    await clock.run(with_a_nanosecond_to_spare())
    assert clock.now() == 1.0


async def test_work_already_late_is_refused_with_deadline_exceeded(clock: VirtualClock, sink: RecordingSink) -> None:
    limiter = RateLimiter(5, label="late")
    with pytest.raises(DeadlineExceeded):
        async with stoic.deadline(clock.now() - 1.0):
            await limiter.acquire()
    assert limiter.available_permits == 5  # nothing consumed
    assert sink.of("ratelimiter.rejected")[0].attributes == {"reason": "deadline_exceeded", "permits": 1}


async def test_a_request_above_burst_is_rejected_at_once(clock: VirtualClock, sink: RecordingSink) -> None:
    limiter = RateLimiter(10, burst=4, label="big")
    with pytest.raises(RateLimited) as caught:
        await limiter.acquire(5)
    assert caught.value.retry_after is None
    assert not limiter.try_acquire(5)
    assert sink.names == ["ratelimiter.oversized", "ratelimiter.oversized"]
    assert limiter.available_permits == 4 and limiter.waiter_count == 0
    await limiter.acquire(4)  # the burst itself is fine


# --- cancellation and deadlines while waiting ---


async def test_a_cancelled_waiter_never_consumes(clock: VirtualClock, sink: RecordingSink) -> None:
    limiter = RateLimiter(1, per=1.0, burst=3, label="x")
    assert limiter.try_acquire(3)
    log: list[tuple[str, float]] = []
    head = served_at(clock, limiter, 3, log, "head")
    middle = served_at(clock, limiter, 2, log, "middle")
    tail = served_at(clock, limiter, 1, log, "tail")
    assert not tail.done()
    await clock.advance(2.5)
    head.cancel()
    middle.cancel()
    await settle()
    assert head.cancelled() and middle.cancelled()
    assert limiter.waiter_count == 0
    # The tail is served at once: the 2.5 permits earned while the others waited are still there.
    assert log == [("tail", 2.5)]
    assert limiter.available_permits == 1
    reasons = [e.attributes["reason"] for e in sink.of("ratelimiter.rejected")]
    assert reasons == ["cancelled", "cancelled"]
    assert [e.attributes["permits"] for e in sink.of("ratelimiter.rejected")] == [3, 2]


class LateClock(VirtualClock):
    """A virtual clock whose wake-ups of the limiter come 10 s late (an overloaded loop), while a
    deadline's own timer fires on time: a deadline the limiter judged reachable can then pass
    while it waits."""

    async def sleep_until(self, when_ns: int) -> None:
        await super().sleep_until(when_ns + 10 * 1_000_000_000)

    def call_at(self, when_ns: int, callback: Any) -> Any:
        if getattr(callback, "__name__", "") != "_fire":  # (stoic.timeout's timer stays on time)
            when_ns += 10 * 1_000_000_000
        return super().call_at(when_ns, callback)


async def test_a_waiter_cut_by_a_deadline_reports_deadline_exceeded(sink: RecordingSink) -> None:
    late = LateClock()
    limiter = RateLimiter(1, per=1.0, burst=1, label="x", clock=late)
    assert limiter.try_acquire()

    async def waiting() -> None:
        async with stoic.timeout(5.0, clock=late):
            await limiter.acquire()

    task = asyncio.create_task(waiting())
    await settle()
    assert limiter.waiter_count == 1
    await late.advance(5.0)
    with pytest.raises(DeadlineExceeded):
        await task
    assert limiter.waiter_count == 0
    assert limiter.available_permits == 1  # the departed waiter consumed nothing
    assert sink.of("ratelimiter.rejected")[0].attributes == {"reason": "deadline_exceeded", "permits": 1}


async def test_woken_then_cancelled_before_resuming_passes_the_turn_on(
    clock: VirtualClock, sink: RecordingSink, monkeypatch: pytest.MonkeyPatch
) -> None:
    limiter = RateLimiter(1, per=1.0, burst=1, label="x")
    assert limiter.try_acquire()
    log: list[tuple[str, float]] = []
    first = served_at(clock, limiter, 1, log, "first")
    second = served_at(clock, limiter, 1, log, "second")
    third = served_at(clock, limiter, 1, log, "third")
    await settle()
    real_wake = ratelimiter_module.wake

    def wake_then_cancel(future: asyncio.Future[None]) -> bool:
        woken = real_wake(future)
        if not second.done():
            second.cancel()  # lands after the wake-up, before `second` resumes
        return woken

    monkeypatch.setattr(ratelimiter_module, "wake", wake_then_cancel)
    await clock.run_until_idle()
    assert second.cancelled() and first.done() and third.done()
    assert log == [("first", 1.0), ("third", 2.0)]
    assert limiter.waiter_count == 0
    assert [e.attributes["reason"] for e in sink.of("ratelimiter.rejected")] == ["cancelled"]


async def test_head_cancelled_while_sleeping_wakes_the_next(clock: VirtualClock) -> None:
    limiter = RateLimiter(1, per=1.0, burst=2, label="x")
    assert limiter.try_acquire(2)
    log: list[tuple[str, float]] = []
    head = served_at(clock, limiter, 2, log, "head")
    nxt = served_at(clock, limiter, 1, log, "next")
    await clock.advance(1.0)
    head.cancel()
    await settle()
    assert log == [("next", 1.0)]
    assert nxt.done()


# --- events, execute, decorator, context manager ---


async def test_waited_event_reports_permits_and_the_wait(clock: VirtualClock, sink: RecordingSink) -> None:
    limiter = RateLimiter(4, per=1.0, label="w")
    await limiter.acquire(4)
    task = asyncio.create_task(limiter.acquire(2))
    await clock.run_until_idle()
    await task
    [event] = sink.of("ratelimiter.waited")
    assert event.label == "w"
    assert dict(event.attributes) == {"permits": 2, "waited": 0.5}
    assert event.time_ns == 500_000_000


async def test_no_event_is_built_without_a_sink(clock: VirtualClock, monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[str] = []
    monkeypatch.setattr(ratelimiter_module, "emit", lambda name, *a: built.append(name))
    limiter = RateLimiter(1, burst=1, queue_limit=0, label="x")
    await limiter.acquire()
    task = asyncio.create_task(limiter.acquire())
    with pytest.raises(RateLimited):
        await task
    with pytest.raises(RateLimited):
        await limiter.acquire(2)
    assert built == []


async def test_execute_decorator_and_context_manager_take_one_permit_each(clock: VirtualClock) -> None:
    limiter = RateLimiter(3, per=1.0, label="x")

    async def add(a: int, *, b: int) -> int:
        return a + b

    @limiter
    async def decorated(a: int) -> int:
        return a * 2

    assert await limiter.execute(add, 1, b=2) == 3
    assert await decorated(21) == 42
    assert decorated.__name__ == "decorated"
    async with limiter:
        pass
    assert limiter.available_permits == 0
    with pytest.raises(TypeError, match="BlockingRateLimiter"):
        limiter(lambda: None)  # type: ignore[arg-type, return-value]
    task = asyncio.create_task(limiter.execute(add, 1, b=1))
    await clock.advance(0.333_333_333)
    assert not task.done()
    await clock.advance(0.000_000_001)  # the ceiling of a third of a second, in ns
    assert task.done() and task.result() == 2


async def test_execute_waits_and_respects_the_deadline(clock: VirtualClock) -> None:
    limiter = RateLimiter(1, per=1.0, label="x")
    calls: list[float] = []

    async def op() -> None:
        calls.append(clock.now())

    await limiter.execute(op)
    async with stoic.timeout(0.5):
        with pytest.raises(RateLimited):
            await limiter.execute(op)

    async def in_time() -> None:
        async with stoic.timeout(2.0):
            await limiter.execute(op)

    await clock.run(in_time())
    assert calls == [0.0, 1.0]


# --- field reports ---


def test_reused_across_event_loops() -> None:
    """A limiter built outside any loop (as at import time) works under successive asyncio.run calls."""
    clock = VirtualClock()
    limiter = RateLimiter(1, per=1.0, burst=1, label="import-time", clock=clock)

    async def scenario() -> list[float]:
        times: list[float] = []

        async def one() -> None:
            await limiter.acquire()
            times.append(clock.now())

        tasks = [asyncio.create_task(one()) for _ in range(3)]
        await clock.run_until_idle()
        await asyncio.gather(*tasks)
        return times

    assert asyncio.run(scenario()) == [0.0, 1.0, 2.0]
    assert asyncio.run(scenario()) == [3.0, 4.0, 5.0]


def test_reused_across_event_loops_on_the_system_clock() -> None:
    limiter = RateLimiter(1000, per=1.0, burst=1, label="real")

    async def scenario() -> None:
        await asyncio.gather(*(limiter.acquire() for _ in range(3)))  # two 1 ms waits

    asyncio.run(scenario())
    asyncio.run(scenario())
    assert limiter.waiter_count == 0


async def test_thundering_wake_ups_each_refill_wakes_one_waiter(
    clock: VirtualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """10,000 waiters at 100 permits/s: each refill wakes O(1) waiters and a ticker keeps ticking."""
    limiter = RateLimiter(100, per=1.0, burst=1, queue_limit=None, label="herd")
    assert limiter.try_acquire()
    wakes = 0
    real_wake = ratelimiter_module.wake

    def counting_wake(future: asyncio.Future[None]) -> bool:
        nonlocal wakes
        wakes += 1
        return real_wake(future)

    monkeypatch.setattr(ratelimiter_module, "wake", counting_wake)
    resumed = 0

    async def waiter() -> None:
        nonlocal resumed
        await limiter.acquire()
        resumed += 1

    tasks = [asyncio.create_task(waiter()) for _ in range(10_000)]
    await settle()
    assert limiter.waiter_count == 10_000
    ticks: list[float] = []

    async def ticker() -> None:
        while True:
            ticks.append(clock.now())
            await asyncio.sleep(0)  # be a well-behaved task...
            await clock.sleep_until(clock.now_ns() + 10_000_000)  # ...ticking every 10 ms

    tick_task = asyncio.create_task(ticker())
    pending_before = clock.pending_timers
    await clock.advance(1.0)
    assert resumed == 100
    assert wakes == 100  # one wake-up per permit served: the next waiter, nobody else
    assert clock.pending_timers <= pending_before + 1  # only the head sleeps on a timer
    assert len(ticks) >= 100  # the loop stayed responsive: the 10 ms ticker kept ticking
    await clock.advance(1.0)
    assert resumed == 200 and wakes == 200
    tick_task.cancel()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, tick_task, return_exceptions=True)
    assert limiter.waiter_count == 0
    assert limiter.available_permits == 0  # the 200th was served just now...
    await clock.advance(0.01)
    assert limiter.available_permits == 1  # ...and the 9,800 who left consumed nothing


async def test_wait_for_the_deficit_not_the_request(clock: VirtualClock) -> None:
    """Bucket of 3 per 3 s: acquire(1) then acquire(3) at once; the second is served exactly when
    the one-permit deficit has refilled (1 s), no later and no earlier."""
    limiter = RateLimiter(3, per=3.0, label="deficit")
    log: list[tuple[str, float]] = []
    served_at(clock, limiter, 1, log, "one")
    served_at(clock, limiter, 3, log, "three")
    await clock.advance(0.999_999_999)
    assert log == [("one", 0.0)]
    await clock.advance(0.000_000_001)
    assert log == [("one", 0.0), ("three", 1.0)]


def test_a_waiter_abandoned_on_a_closed_loop_does_not_block_the_next_loop() -> None:
    limiter = RateLimiter(20, per=1.0, burst=1, label="abandoned")  # waits of 50 ms, real time
    assert limiter.try_acquire()
    old_loop = asyncio.new_event_loop()

    async def abandon() -> list[asyncio.Task[None]]:
        tasks = [asyncio.create_task(limiter.acquire()) for _ in range(2)]
        await settle()
        return tasks

    abandoned = old_loop.run_until_complete(abandon())
    old_loop.close()  # closed without cancelling its tasks: they will never resume
    assert limiter.waiter_count == 2

    async def later() -> None:
        await asyncio.wait_for(limiter.acquire(), 1.0)

    asyncio.run(later())
    assert limiter.waiter_count == 0
    assert not any(task.done() for task in abandoned)
    for task in abandoned:  # they can never finish; keep their destruction quiet
        task._log_destroy_pending = False  # type: ignore[attr-defined]
        task.get_coro().close()  # type: ignore[union-attr]


def test_the_asyncio_limiter_is_a_policy() -> None:
    assert isinstance(RateLimiter(1, label="p", clock=VirtualClock()), stoic.Policy)


async def test_execute_takes_a_grantable_permit_when_called_and_queues_only_when_awaited(
    clock: VirtualClock,
) -> None:
    """execute() is a plain method returning a coroutine: a permit the bucket can grant at once
    is taken at the call (no coroutine of the limiter's own); a request that must wait queues
    only when the returned coroutine is awaited."""
    limiter = RateLimiter(1, per=1.0, label="eager")

    async def op(value: int) -> int:
        return value

    first = limiter.execute(op, 1)
    assert limiter.available_permits == 0
    assert await first == 1
    second = limiter.execute(op, 2)
    assert limiter.waiter_count == 0
    task = asyncio.create_task(second)
    await settle()
    assert limiter.waiter_count == 1
    await clock.advance(1.0)
    assert await task == 2
    assert limiter.waiter_count == 0


async def test_reading_available_permits_never_writes_the_bucket(clock: VirtualClock) -> None:
    # A metrics exporter reads the gauge from its own thread while the loop grants lock-free: the
    # read must leave the bucket exactly as it found it, and still count the refill since.
    limiter = RateLimiter(10, label="gauge", burst=5)
    for _ in range(5):
        await limiter.acquire()
    state = (limiter._deficit, limiter._stamp)
    assert limiter.available_permits == 0
    await clock.advance(0.35)  # 3.5 permits earned
    for _ in range(3):
        assert limiter.available_permits == 3
    assert (limiter._deficit, limiter._stamp) == state  # untouched by every read
    await clock.advance(10.0)
    assert limiter.available_permits == 5  # capped at the burst
    for _ in range(5):
        assert limiter.try_acquire()
    assert not limiter.try_acquire()
