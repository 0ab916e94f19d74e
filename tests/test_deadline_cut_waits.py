"""What a stoic.timeout/stoic.deadline block says when it fires (field reports 17 and 20), checked
by a hostile reader: every stage that can make a call wait, nested deadlines, an operation that
catches a sub-step's refusal, hedged attempts, and cancellations racing the deadline."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from _cancels import HandFiredClock, swallow_a_cancel

import stoic
from stoic import Bulkhead, DeadlineExceeded
from stoic.testing import VirtualClock

SECOND = 1_000_000_000


async def _hold(clock: VirtualClock, seconds: float) -> str:
    await clock.sleep_until(clock.now_ns() + round(seconds * SECOND))
    return "ok"


async def _cut(clock: VirtualClock, work: Callable[[], Awaitable[object]], bound: float) -> DeadlineExceeded:
    """Run ``work`` under ``stoic.timeout(bound)`` and return the DeadlineExceeded it must end with."""
    async def bounded() -> object:
        async with stoic.timeout(bound):
            return await work()

    task = asyncio.create_task(bounded())
    await clock.run_until_idle()
    with pytest.raises(DeadlineExceeded) as caught:
        await task
    return caught.value


def _stage(kind: str) -> Any:
    """A stage of ``kind`` with one slot (or one permit a minute), and room to queue."""
    if kind == "rate limiter":
        return stoic.RateLimiter(1, per=60.0, queue_limit=10, label="api")
    if kind == "gradient bulkhead":
        return stoic.GradientBulkhead(max_concurrent=1, min_concurrent=1, queue_limit=10, label="api")
    if kind == "keyed bulkhead":
        return stoic.Keyed(Bulkhead, label="api", max_concurrent=1, queue_limit=10)
    return Bulkhead(1, queue_limit=10, label="api")


async def _through(stage: Any, kind: str, fn: Callable[..., Awaitable[str]], *args: Any) -> str:
    if kind == "keyed bulkhead":
        result: str = await stage.execute("tenant", fn, *args)
        return result
    return await stage.execute(fn, *args)  # type: ignore[no-any-return]


@pytest.mark.parametrize("kind", ["gradient bulkhead", "keyed bulkhead"])
@pytest.mark.parametrize("place", ["queued behind another", "head of the queue"])
async def test_every_stage_that_makes_a_call_wait_says_the_cut_was_a_wait(
    clock: VirtualClock, kind: str, place: str,
) -> None:
    """Stages field report 20's own test leaves out: a gradient bulkhead and a keyed family of
    bulkheads, at the head of the queue or behind another waiter. A holder takes the slot first;
    the bounded call waits and is cut in the queue: ``timed_out`` False. (A rate limiter never
    starts a wait the deadline would cut: it refuses one that would reach it, RateLimited.)"""
    stage = _stage(kind)
    holder = asyncio.create_task(_through(stage, kind, _hold, clock, 30.0))
    await clock.advance(0)
    if place == "queued behind another":
        ahead = asyncio.create_task(_through(stage, kind, _hold, clock, 0.0))
        await clock.advance(0)
    error = await _cut(clock, lambda: _through(stage, kind, _hold, clock, 0.5), 1.0)
    assert not error.timed_out
    holder.cancel()
    if place == "queued behind another":
        ahead.cancel()
    await asyncio.gather(holder, *([ahead] if place == "queued behind another" else []), return_exceptions=True)


@pytest.mark.parametrize("kind", ["rate limiter", "gradient bulkhead", "keyed bulkhead"])
async def test_every_stage_admitted_then_cut_on_the_dependency_says_timed_out(clock: VirtualClock, kind: str) -> None:
    """The other side, for the same stages: the call waited (admitted at 1 s), then ran on the
    dependency and was cut at 2 s: the dependency was cut, ``timed_out`` True."""
    stage = _stage(kind)
    if kind == "rate limiter":
        stage = stoic.RateLimiter(1, queue_limit=10, label="api")
        assert stage.try_acquire()  # the next permit is due in 1 s
    else:
        holder = asyncio.create_task(_through(stage, kind, _hold, clock, 1.0))
        await clock.advance(0)
    error = await _cut(clock, lambda: _through(stage, kind, _hold, clock, 5.0), 2.0)
    assert error.timed_out
    if kind != "rate limiter":
        assert await holder == "ok"


async def test_an_inner_deadline_cut_in_the_queue_does_not_excuse_an_outer_one_cut_on_the_dependency(
    clock: VirtualClock,
) -> None:
    """Nested deadlines: the inner one (1 s) fires while its block queues, the operation takes
    that refusal and calls the dependency directly, and the outer one (3 s) cuts that call. The
    inner block's DeadlineExceeded says ``timed_out`` False; the outer one cut the dependency:
    True (the wait the inner one cut ended at 1 s, before the outer fired)."""
    bulkhead = Bulkhead(1, queue_limit=10, label="api")
    holder = asyncio.create_task(bulkhead.execute(_hold, clock, 30.0))
    await clock.advance(0)
    inner: list[DeadlineExceeded] = []

    async def work() -> str:
        try:
            async with stoic.timeout(1.0):
                return await bulkhead.execute(_hold, clock, 0.5)
        except DeadlineExceeded as error:
            inner.append(error)
        return await _hold(clock, 10.0)

    outer = await _cut(clock, work, 3.0)
    assert [e.timed_out for e in inner] == [False]
    assert outer.timed_out
    holder.cancel()
    await asyncio.gather(holder, return_exceptions=True)


@pytest.mark.parametrize("refusal", ["shed by CoDel", "queue full"])
async def test_an_operation_that_catches_a_sub_steps_refusal_then_is_cut_on_the_dependency_timed_out(
    clock: VirtualClock, refusal: str,
) -> None:
    """An optional sub-step (a cache behind a queued bulkhead) is refused after queueing (CoDel
    sheds it) or at once (its queue is full); the operation goes on to the dependency, which the
    deadline cuts. The refusal is not what the deadline cut: ``timed_out`` True, and an outer
    breaker counts it (the dependency hung)."""
    if refusal == "shed by CoDel":
        cache = Bulkhead(1, queue_limit=10, queue_target=0.2, queue_interval=0.5, label="cache")
    else:
        cache = Bulkhead(1, queue_limit=0, label="cache")
    holder = asyncio.create_task(cache.execute(_hold, clock, 1.0))  # (CoDel sheds at its release)
    await clock.advance(0)
    caught: list[float] = []

    async def work() -> str:
        try:
            return await cache.execute(_hold, clock, 0.1)
        except (stoic.Shed, stoic.BulkheadFull):
            caught.append(clock.now())
        return await _hold(clock, 10.0)

    breaker = stoic.CircuitBreaker(label="db", window=stoic.CountWindow(10), minimum_calls=1)
    error = await _cut(clock, lambda: breaker.execute(work), 2.0)
    assert caught == [1.0 if refusal == "shed by CoDel" else 0.0]
    assert error.timed_out
    assert breaker.snapshot.failures == 0  # (the breaker is inside the block: it saw a cancel)
    assert await holder == "ok"


@pytest.mark.parametrize("hedge", ["queued too", "on the dependency"])
async def test_a_deadline_around_a_hedge_whose_first_attempt_queues(clock: VirtualClock, hedge: str) -> None:
    """A timeout around a hedged call whose first attempt waits in a busy replica's queue. When
    the hedge queues too (at the same replica), nothing was on the dependency when the deadline
    fired: ``timed_out`` False. When the hedge went to a free replica and was on its dependency,
    a request was cut on the dependency: True."""
    busy = Bulkhead(1, queue_limit=10, label="replica-a")
    free = Bulkhead(1, queue_limit=10, label="replica-b")
    holder = asyncio.create_task(busy.execute(_hold, clock, 30.0))
    await clock.advance(0)
    policy = stoic.Hedge(0.1, budget=stoic.RetryBudget.UNLIMITED, label="h")

    async def op(attempt: stoic.Attempt) -> str:
        replica = busy if attempt.number == 1 or hedge == "queued too" else free
        return await replica.execute(_hold, clock, 10.0)

    error = await _cut(clock, lambda: policy.execute(stoic.IDEMPOTENT, op), 1.0)
    assert error.timed_out is (hedge == "on the dependency")
    holder.cancel()
    await asyncio.gather(holder, return_exceptions=True)


@pytest.mark.parametrize("policy", ["throttle", "adaptive bulkhead"])
@pytest.mark.parametrize("timeout", ["outside the policy", "inside the policy"])
async def test_a_deadline_cutting_waits_in_a_queue_under_an_adaptive_policy_is_no_evidence(
    clock: VirtualClock, policy: str, timeout: str,
) -> None:
    """Field report 20 for the adaptive policies, with the timeout in either place: inside the
    policy (policy -> timeout -> queued bulkhead: the policy sees the DeadlineExceeded) or
    outside it (the recommended overall timeout, timeout -> policy -> queued bulkhead: the
    policy sees the deadline's cancellation). Two calls hold the bulkhead's slots for 3 s;
    38 more, bounded to 1.75 s, are cut while they queue. Local queueing is no sign of an
    overloaded dependency: the throttle must not start shedding, the adaptive bulkhead must not
    cut its limit."""
    throttle = stoic.AdaptiveThrottle(label="t", min_throughput=5)
    adaptive = stoic.AdaptiveBulkhead(latency_threshold=5.0, max_concurrent=64, min_concurrent=1, label="a")
    bulkhead = Bulkhead(2, queue_limit=50, label="api")

    def through(fn: Callable[..., Awaitable[str]], *args: Any) -> Awaitable[str]:
        return throttle.execute(fn, *args) if policy == "throttle" else adaptive.execute(fn, *args)

    async def bounded(bound: float, seconds: float) -> str:
        async with stoic.timeout(bound):
            return await bulkhead.execute(_hold, clock, seconds)

    async def call(bound: float, seconds: float) -> str:
        if timeout == "inside the policy":
            return await through(bounded, bound, seconds)
        async with stoic.timeout(bound):
            return await through(bulkhead.execute, _hold, clock, seconds)

    holders = [asyncio.create_task(call(5.0, 3.0)) for _ in range(2)]
    await clock.advance(0)
    tasks = [asyncio.create_task(call(1.75, 0.5)) for _ in range(38)]
    await clock.run_until_idle()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert [type(r) for r in results] == [DeadlineExceeded] * 38
    assert await asyncio.gather(*holders) == ["ok", "ok"]
    if policy == "throttle":
        assert throttle.probability == 0.0
    else:
        assert adaptive.limit == 64


# ---------------------------------------------------------------- a caller's cancel and the deadline

async def _cleanup_crossing_the_deadline(clock: VirtualClock, form: str) -> None:
    """A block whose work, cancelled by its caller at 0.5 s, cleans up for 5 s: its deadline
    (1 s) fires during the cleanup, while the caller's CancelledError is on its way out."""
    async with stoic.timeout(1.0):
        if form == "finally":
            try:
                await _hold(clock, 100.0)
            finally:
                await _hold(clock, 5.0)
        else:  # the cleanup swallows the deadline's cancel and re-raises the caller's
            try:
                await _hold(clock, 100.0)
            except asyncio.CancelledError:
                try:
                    await _hold(clock, 5.0)
                except asyncio.CancelledError:
                    pass
                raise


@pytest.mark.parametrize("form", ["finally", "except, then re-raise"])
async def test_a_callers_cancel_being_handled_when_the_deadline_fires_stays_the_callers(
    clock: VirtualClock, form: str,
) -> None:
    """Field report 17's fix must not take a caller's cancellation for a stale count: the
    caller's request was delivered (none pending when the deadline fires), and the block ends
    with a CancelledError. The task was asked to stop: it ends cancelled, as before the fix and
    as asyncio.timeout does, not with DeadlineExceeded."""
    task = asyncio.create_task(_cleanup_crossing_the_deadline(clock, form))
    await clock.advance(0.5)
    task.cancel()
    await clock.run_until_idle()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_task_group_shutting_down_a_child_whose_cleanup_crosses_its_deadline(clock: VirtualClock) -> None:
    """The same in its most common form: a TaskGroup's child fails and the group cancels its
    sibling, whose cleanup crosses its own deadline. The group reports the one failure, not a
    DeadlineExceeded of a sibling that was merely told to stop."""
    async def fails() -> None:
        await _hold(clock, 0.5)
        raise ConnectionError("down")

    async def main() -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(fails())
            group.create_task(_cleanup_crossing_the_deadline(clock, "finally"))

    task = asyncio.create_task(main())
    await clock.run_until_idle()
    with pytest.raises(ExceptionGroup) as caught:
        await task
    assert [type(e) for e in caught.value.exceptions] == [ConnectionError]


@pytest.mark.parametrize("task_class", ["C task", "pure-Python task"])
@pytest.mark.parametrize("outside", ["none", "pending when it fires"])
async def test_a_stale_count_on_either_task_implementation(task_class: str, outside: str) -> None:
    """Field report 17's fix reads the task's private state (``_must_cancel``, ``_fut_waiter``):
    both asyncio implementations must answer alike. A count left raised inside the block: the
    expiry is DeadlineExceeded; with a caller's request still pending when the deadline fires,
    the caller's CancelledError."""
    clock = HandFiredClock()
    loop = asyncio.get_running_loop()
    make: Any = asyncio.tasks._PyTask if task_class == "pure-Python task" else asyncio.tasks._CTask  # type: ignore[attr-defined]
    blocked = asyncio.Event()

    async def work() -> None:
        async with stoic.timeout(1, clock=clock):
            await swallow_a_cancel()
            await blocked.wait()

    task = make(work(), loop=loop)
    for _ in range(5):
        await asyncio.sleep(0)
    if outside == "pending when it fires":
        task.cancel()
    (fire,) = clock.callbacks
    fire()
    expected = asyncio.CancelledError if outside == "pending when it fires" else DeadlineExceeded
    with pytest.raises(expected):
        await task
