"""How errors and tasks really arrive at the breaker (issue 9, field reports 16-18, 20, 21) and
what a hostile caller found: every form (``execute``, ``call``, ``@breaker``), sync and async."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
import types
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
from _breaker_helpers import Boom, StepClock
from _cancels import fail_a_task_group
from _threads import InterruptingClock, eventually

import stoic
from stoic import (
    Bulkhead,
    BulkheadFull,
    CircuitBreaker,
    CountWindow,
    Defect,
    OpenDuration,
    Pipeline,
    RateLimited,
    RateLimiter,
    TimeWindow,
    _random,
)
from stoic.events import Event
from stoic.testing import RecordingSink, VirtualClock

SECOND = 1_000_000_000


def make(**overrides: Any) -> CircuitBreaker:
    config: dict[str, Any] = {
        "window": CountWindow(10), "minimum_calls": 5, "failure_rate_threshold": 1.0,
        "open_duration": OpenDuration.fixed(10.0, jitter=0.0),
    }
    config.update(overrides)
    return CircuitBreaker(label=config.pop("label", "arrivals"), **config)


def counts(breaker: CircuitBreaker) -> tuple[int, int]:
    snap = breaker.snapshot
    return snap.calls, snap.failures


# ---------------------------------------------------------------- 16: generators are not successes

def _gen() -> Iterator[int]:
    yield 1
    raise Boom("during iteration")


async def _agen() -> AsyncIterator[int]:
    yield 1
    raise Boom("during iteration")


@pytest.mark.parametrize("fn", [_gen, _agen])
def test_breaker_refuses_generator_functions_at_decoration(fn: Callable[[], object]) -> None:
    breaker = make()
    with pytest.raises(TypeError, match=r"(?i)protect the code that consumes the generator"):
        breaker(fn)


@pytest.mark.parametrize("fn", [_gen, _agen])
def test_a_generator_returned_through_call_is_refused_and_never_counted(fn: Callable[[], object]) -> None:
    breaker = make()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            with pytest.raises(TypeError, match="consumes the generator"):
                breaker.call(fn)
    assert counts(breaker) == (0, 0)


def test_call_refuses_a_generator_returned_by_a_plain_wrapper_function() -> None:
    breaker = make()
    with pytest.raises(TypeError, match="consumes the generator"):
        breaker.call(lambda: _gen())
    assert counts(breaker) == (0, 0)


@pytest.mark.parametrize("fn", [_gen, _agen])
async def test_a_generator_function_given_to_execute_is_refused_and_never_counted(fn: Callable[[], Any]) -> None:
    breaker = make()
    for _ in range(6):
        with pytest.raises(TypeError, match="consumes the generator") as raised:
            await breaker.execute(fn)
        assert isinstance(raised.value.__cause__, Defect)
    assert counts(breaker) == (0, 0)
    assert breaker.state is stoic.BreakerState.CLOSED


async def test_a_generator_based_coroutine_still_runs_through_execute() -> None:
    @types.coroutine
    def legacy() -> Iterator[None]:
        yield from asyncio.sleep(0).__await__()
        return 5  # type: ignore[misc]

    breaker = make()
    assert await breaker.execute(legacy) == 5  # type: ignore[arg-type]
    assert counts(breaker) == (1, 0)


@pytest.mark.parametrize("result", [None, 42, "text"], ids=["None", "int", "str"])
async def test_a_plain_function_given_to_execute_is_refused_and_never_counted(
    result: object, sink: RecordingSink,
) -> None:
    # Seen failing before the fix: the TypeError of ``await None`` counted as the dependency's
    # failure, and opened the breaker after minimum_calls of them. Reported as breaker.defect,
    # as call(async_fn) and an inner stage's await on the value are (it reported nothing).
    breaker = make()
    for _ in range(6):
        with pytest.raises(TypeError, match="cannot be awaited") as raised:
            await breaker.execute(lambda: result)
        assert isinstance(raised.value.__cause__, Defect)
    assert counts(breaker) == (0, 0)
    assert breaker.state is stoic.BreakerState.CLOSED
    assert [dict(e.attributes) for e in sink.of("breaker.defect")] == [{"error.type": "TypeError"}] * 6


async def test_an_inner_stages_await_on_a_plain_value_is_never_counted() -> None:
    # The inner throttle awaits the plain function's value: the breaker outside it sees that
    # stage's TypeError, the same bug, and does not count it either (seen counted before).
    breaker = make()
    pipeline = Pipeline(breaker, stoic.AdaptiveThrottle(label="inner"))
    for _ in range(6):
        with pytest.raises(TypeError):
            await pipeline.execute(lambda: 42)
    assert counts(breaker) == (0, 0)


async def test_a_type_error_raised_inside_a_generator_based_coroutine_is_its_own_failure() -> None:
    @types.coroutine
    def legacy() -> Iterator[None]:
        yield from asyncio.sleep(0).__await__()
        raise TypeError("bad payload")

    breaker = make()
    with pytest.raises(TypeError, match="bad payload"):
        await breaker.execute(legacy)  # type: ignore[arg-type]
    assert counts(breaker) == (1, 1)


def test_a_refused_generator_returns_a_half_open_probe_permit() -> None:
    clock = StepClock()
    breaker = make(clock=clock, minimum_calls=1)
    with pytest.raises(Boom):
        breaker.call(_raise_boom)
    clock.t += 11 * SECOND
    with pytest.raises(TypeError):
        breaker.call(_gen)
    assert breaker.call(lambda: "ok") == "ok"  # the permit came back: this probe closes it
    assert breaker.state is stoic.BreakerState.CLOSED


def _raise_boom() -> None:
    raise Boom("down")


# ---------------------------------------------------------------- 17: a cancel request swallowed earlier

async def _fan_out() -> None:
    async def child() -> None:
        raise ConnectionError("refused")

    async with asyncio.TaskGroup() as group:
        group.create_task(child())
        group.create_task(asyncio.sleep(0))


async def _refused() -> None:
    raise ConnectionError("refused")


async def test_a_stale_cancel_count_does_not_hide_later_failures() -> None:
    await fail_a_task_group()
    task = asyncio.current_task()
    assert task is not None
    stale = task.cancelling()
    breaker = make()
    wrapped = breaker(_refused)
    for i in range(5):
        with pytest.raises(ConnectionError):
            await (breaker.execute(_refused) if i % 2 else wrapped())
    assert task.cancelling() == stale  # (>= 1 on Python 3.11)
    assert breaker.state is stoic.BreakerState.OPEN


@pytest.mark.parametrize("form", ["execute", "decorator"])
async def test_five_failing_fan_outs_open_the_breaker(form: str) -> None:
    breaker = make()
    wrapped = breaker(_fan_out)
    for _ in range(5):
        with pytest.raises(ExceptionGroup):
            await (breaker.execute(_fan_out) if form == "execute" else wrapped())
    assert breaker.state is stoic.BreakerState.OPEN
    assert breaker.snapshot.failures == 5


async def test_an_inner_timeout_counts_in_a_task_with_a_stale_cancel_count() -> None:
    await fail_a_task_group()

    async def hangs() -> None:
        async with asyncio.timeout(0.001):
            await asyncio.Event().wait()

    breaker = make(minimum_calls=1, window=CountWindow(1))
    with pytest.raises(TimeoutError):
        await breaker.execute(hangs)
    assert breaker.state is stoic.BreakerState.OPEN


async def test_a_caller_cancelled_during_the_call_is_not_counted_even_with_a_stale_count() -> None:
    async def cleanup_fails() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise Boom("cleanup failed") from None

    async def caller(breaker: CircuitBreaker) -> None:
        await fail_a_task_group()
        await breaker.execute(cleanup_fails)

    breaker = make()
    task = asyncio.create_task(caller(breaker))
    for _ in range(5):
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(Boom):
        await task
    assert counts(breaker) == (0, 0)


async def test_a_failure_with_a_cancel_request_still_pending_is_not_counted() -> None:
    async def cancelled_then_fails() -> None:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()  # requested, not yet delivered (no await since)
        raise Boom("failed as the caller went away")

    breaker = make()
    with pytest.raises(Boom):
        await breaker.execute(cancelled_then_fails)
    task = asyncio.current_task()
    assert task is not None
    task.uncancel()
    if sys.version_info < (3, 13):  # (3.13's uncancel() also withdraws a request not yet delivered)
        with pytest.raises(asyncio.CancelledError):
            await asyncio.sleep(0)  # (the request pending on this test's own task is consumed here)
    assert counts(breaker) == (0, 0)


async def test_the_sync_path_counts_failures_in_a_task_with_a_stale_cancel_count() -> None:
    await fail_a_task_group()
    breaker = make()

    def refused() -> None:
        raise ConnectionError("refused")

    wrapped = breaker(refused)
    for i in range(5):
        with pytest.raises(ConnectionError):
            breaker.call(refused) if i % 2 else wrapped()
    assert breaker.state is stoic.BreakerState.OPEN


# ---------------------------------------------------------------- 18: errors inside exception groups

def _group_of(*errors: Exception) -> ExceptionGroup[Exception]:
    return ExceptionGroup("fan-out", list(errors))


@pytest.mark.parametrize("form", ["call", "decorator", "execute"])
async def test_a_group_holding_only_bulkhead_full_is_ignored_like_a_bare_one(form: str) -> None:
    breaker = make(minimum_calls=1)
    for error in (BulkheadFull(label="inner"), _group_of(BulkheadFull(label="a"), BulkheadFull(label="b")),
                  _group_of(_group_of(BulkheadFull(label="nested")))):
        def raise_it(error: Exception = error) -> None:
            raise error

        async def araise_it(error: Exception = error) -> None:
            raise error

        with pytest.raises((BulkheadFull, ExceptionGroup)):
            if form == "call":
                breaker.call(raise_it)
            elif form == "decorator":
                breaker(raise_it)()
            else:
                await breaker.execute(araise_it)
    assert counts(breaker) == (0, 0)


@pytest.mark.parametrize("form", ["call", "execute"])
async def test_a_group_with_a_connection_error_counts(form: str) -> None:
    breaker = make(minimum_calls=1, window=CountWindow(1))
    group = _group_of(BulkheadFull(label="inner"), ConnectionError("refused"))

    def raise_it() -> None:
        raise group

    async def araise_it() -> None:
        raise group

    with pytest.raises(ExceptionGroup):
        if form == "call":
            breaker.call(raise_it)
        else:
            await breaker.execute(araise_it)
    assert breaker.state is stoic.BreakerState.OPEN


def test_counts_by_default_looks_inside_groups() -> None:
    counts_by_default = CircuitBreaker.counts_by_default
    assert not counts_by_default(_group_of(RateLimited(), BulkheadFull()))
    assert counts_by_default(_group_of(RateLimited(), ConnectionError()))
    assert counts_by_default(_group_of(stoic.DeadlineExceeded(timed_out=True)))
    assert not counts_by_default(_group_of(stoic.DeadlineExceeded()))
    assert counts_by_default(_group_of(_group_of(BulkheadFull()), _group_of(OSError())))


def test_a_group_with_a_defect_is_a_defect_never_counted() -> None:
    breaker = make(minimum_calls=1, window=CountWindow(1))

    def raise_it() -> None:
        raise _group_of(ConnectionError("refused"), Defect("our bug"))

    with pytest.raises(ExceptionGroup):
        breaker.call(raise_it)
    assert counts(breaker) == (0, 0)


# ---------------------------------------------------------------- 20: local queueing is not a slow dependency

async def _dependency(clock: VirtualClock) -> str:
    await clock.sleep_until(clock.now_ns() + SECOND // 2)  # answers in 0.5 s, every time
    return "ok"


def _queued_breaker() -> CircuitBreaker:
    return CircuitBreaker(label="api", window=TimeWindow(60.0), minimum_calls=10, slow_call_duration=1.0,
                          slow_call_rate_threshold=0.5)


async def _run_queued(clock: VirtualClock, call: Callable[[], Awaitable[str]], callers: int = 40) -> list[object]:
    tasks = [asyncio.create_task(call()) for _ in range(callers)]
    await clock.run_until_idle()
    return await asyncio.gather(*tasks, return_exceptions=True)


@pytest.mark.parametrize("form", ["pipeline", "nested by hand", "stacked decorators"])
async def test_queueing_in_an_inner_bulkhead_is_not_a_slow_call(clock: VirtualClock, form: str) -> None:
    breaker = _queued_breaker()
    bulkhead = Bulkhead(2, queue_limit=50, label="api")
    if form == "pipeline":
        pipeline = Pipeline(breaker, bulkhead)

        def call() -> Awaitable[str]:
            return pipeline.execute(_dependency, clock)
    elif form == "nested by hand":
        def call() -> Awaitable[str]:
            return breaker.execute(bulkhead.execute, _dependency, clock)
    else:
        @breaker
        @bulkhead
        async def decorated() -> str:
            return await _dependency(clock)

        call = decorated
    results = await _run_queued(clock, call)
    assert results == ["ok"] * 40  # 20 rounds of 0.5 s: the last caller queued for 9.5 s
    snap = breaker.snapshot
    assert (snap.state, snap.calls, snap.slow_calls) == (stoic.BreakerState.CLOSED, 40, 0)
    results = await _run_queued(clock, call)
    assert results == ["ok"] * 40  # the next request is not refused with circuit_open


async def test_queueing_behind_an_inner_rate_limiter_is_not_a_slow_call(clock: VirtualClock) -> None:
    breaker = _queued_breaker()
    limiter = RateLimiter(2, burst=2, queue_limit=100, label="api")  # 2 per second: 40 callers wait up to 19 s
    results = await _run_queued(clock, lambda: Pipeline(breaker, limiter).execute(_dependency, clock))
    assert results == ["ok"] * 40
    assert (breaker.snapshot.calls, breaker.snapshot.slow_calls) == (40, 0)


async def test_a_slow_dependency_behind_a_queue_is_still_slow(clock: VirtualClock) -> None:
    async def slow() -> str:
        await clock.sleep_until(clock.now_ns() + 3 * SECOND // 2)  # 1.5 s: slower than slow_call_duration
        return "late"

    breaker = _queued_breaker()
    bulkhead = Bulkhead(2, queue_limit=50, label="api")
    results = await _run_queued(clock, lambda: breaker.execute(bulkhead.execute, slow), callers=10)
    assert results == ["late"] * 10
    assert breaker.snapshot.state is stoic.BreakerState.OPEN  # every call slow, measured from admission


@pytest.mark.parametrize("stage", ["bulkhead", "limiter"])
async def test_a_queued_sub_step_inside_the_operation_does_not_hide_a_slow_dependency(
    clock: VirtualClock, stage: str,
) -> None:
    """The other side of report 20: only the time spent queued is local. An operation that
    first waits 1.5 s on its dependency and then runs a local sub-step through a queued
    bulkhead or limiter took 1.5 s of the dependency's time, not the sub-step's."""
    breaker = _queued_breaker()
    inner: Any = (Bulkhead(1, queue_limit=50, label="cache") if stage == "bulkhead"
                  else RateLimiter(20, burst=1, queue_limit=50, label="cache"))

    async def write() -> None:
        await clock.sleep_until(clock.now_ns() + SECOND // 20)

    async def handler() -> str:
        await clock.sleep_until(clock.now_ns() + 3 * SECOND // 2)  # the dependency: 1.5 s
        await inner.execute(write)  # then a local step, which queues behind the other callers
        return "ok"

    results = await _run_queued(clock, lambda: breaker.execute(handler), callers=20)
    assert results == ["ok"] * 20  # all admitted while closed
    assert breaker.snapshot.state is stoic.BreakerState.OPEN  # every call slow: 1.5 s and more
    assert breaker.snapshot.trips == 1


@pytest.mark.parametrize("kind", ["codel bulkhead shed", "bulkhead cut by a timeout",
                                  "prioritized bulkhead cut by a timeout", "limiter cancelled"])
async def test_a_sub_step_refused_after_queueing_is_not_a_slow_call(clock: VirtualClock, kind: str) -> None:
    """Report 20 for a wait that ends without admission: an operation whose own dependency
    answers in 0.1 s, then runs an optional local step that queues and is shed (CoDel), cut by
    the step's own timeout, or given up by the operation, and catches that. The time it queued
    is local load-shedding (seed 000: it never reaches the breaker's window), so no call is slow."""
    breaker = _queued_breaker()
    inner: Any
    if kind == "codel bulkhead shed":
        inner = Bulkhead(1, queue_limit=50, queue_target=0.2, queue_interval=0.5, label="cache")
    elif kind == "limiter cancelled":
        inner = RateLimiter(1, burst=1, queue_limit=50, label="cache")  # one a second: callers queue
    else:
        inner = Bulkhead(1, queue_limit=50, prioritized=kind.startswith("prioritized"), label="cache")

    async def write() -> None:
        await clock.sleep_until(clock.now_ns() + SECOND // 2)

    async def optional_step() -> None:
        if kind == "codel bulkhead shed":
            with contextlib.suppress(stoic.Shed):
                await inner.execute(write)
        elif kind == "limiter cancelled":
            # The operation gives the step up after 2 s (its own timer; the limiter never knew).
            task = asyncio.current_task()
            assert task is not None
            timer = clock.call_at(clock.now_ns() + 2 * SECOND, task.cancel)
            try:
                await inner.acquire()
            except asyncio.CancelledError:
                task.uncancel()
            finally:
                timer.cancel()
        else:
            with contextlib.suppress(stoic.DeadlineExceeded):
                async with stoic.timeout(2.0):
                    await inner.execute(write)

    async def handler() -> str:
        await clock.sleep_until(clock.now_ns() + SECOND // 10)  # the dependency: 0.1 s
        await optional_step()
        return "ok"

    results = await _run_queued(clock, lambda: breaker.execute(handler), callers=20)
    assert results == ["ok"] * 20
    snap = breaker.snapshot
    assert (snap.state, snap.calls, snap.slow_calls) == (stoic.BreakerState.CLOSED, 20, 0)


@pytest.mark.parametrize("kind", ["bulkhead", "prioritized bulkhead", "codel bulkhead", "adaptive", "deadline"])
async def test_a_timeout_that_cuts_a_wait_in_an_inner_queue_is_no_failure(clock: VirtualClock, kind: str) -> None:
    """Report 20 for a timeout between the breaker and a queued stage (each call bounded,
    queueing included). Two callers hold both slots for 3 s; 38 more, bounded to 1.75 s, are
    cut while they queue. That is local load-shedding, not the dependency: their
    DeadlineExceeded says ``timed_out`` False and the breaker ignores it, as any rejection, so
    it does not open on the local queue and refuse the next request. The two slow holders are
    the breaker's only evidence."""
    breaker = _queued_breaker()
    stage: Any
    if kind == "adaptive":
        stage = stoic.AdaptiveBulkhead(latency_threshold=5.0, max_concurrent=2, min_concurrent=2, queue_limit=50,
                                       label="api")
    else:
        stage = Bulkhead(2, queue_limit=50, prioritized=kind.startswith("prioritized"),
                         queue_target=10.0 if kind.startswith("codel") else None, queue_interval=20.0, label="api")

    async def dependency(seconds: float) -> str:
        await clock.sleep_until(clock.now_ns() + int(seconds * SECOND))
        return "ok"

    async def bounded(bound: float, seconds: float) -> str:
        scope = stoic.deadline(clock.now_ns() / 1e9 + bound) if kind == "deadline" else stoic.timeout(bound)
        async with scope:
            return await stage.execute(dependency, seconds)

    holders = [asyncio.create_task(breaker.execute(bounded, 5.0, 3.0)) for _ in range(2)]
    await clock.advance(0)
    results = await _run_queued(clock, lambda: breaker.execute(bounded, 1.75, 0.5), callers=38)
    assert [type(r) for r in results] == [stoic.DeadlineExceeded] * 38
    assert not any(r.timed_out for r in results if isinstance(r, stoic.DeadlineExceeded))
    assert await asyncio.gather(*holders) == ["ok", "ok"]
    snap = breaker.snapshot
    assert (snap.state, snap.calls, snap.failures, snap.slow_calls) == (stoic.BreakerState.CLOSED, 2, 0, 2)


async def test_a_wait_on_another_clock_does_not_lose_the_breakers_own_stages_waits(clock: VirtualClock) -> None:
    """The breaker and its bulkhead share a clock; a local step inside the operation queues in
    a bulkhead on a clock of its own (made with another clock in scope). That wait cannot be
    compared with the breaker's clock, but it must not make the breaker forget the outer
    bulkhead's queueing (kept per clock): 40 callers of a 0.5 s dependency behind
    Bulkhead(2, queue_limit=50) are no slow calls."""
    breaker = _queued_breaker()
    bulkhead = Bulkhead(2, queue_limit=50, label="api")
    other = Bulkhead(1, queue_limit=50, label="cache", clock=VirtualClock())  # (its time never moves)

    async def write() -> None:
        await clock.sleep_until(clock.now_ns() + SECOND // 100)

    async def handler() -> str:
        result = await _dependency(clock)
        await other.execute(write)  # the two admitted at once still queue behind each other here
        return result

    results = await _run_queued(clock, lambda: breaker.execute(bulkhead.execute, handler))
    assert results == ["ok"] * 40
    snap = breaker.snapshot
    assert (snap.state, snap.calls, snap.slow_calls) == (stoic.BreakerState.CLOSED, 40, 0)


@pytest.mark.parametrize("prioritized", [False, True], ids=["fifo", "managed"])
async def test_a_thread_timed_out_in_a_blocking_bulkheads_queue_is_not_a_slow_call(
    clock: VirtualClock, prioritized: bool,
) -> None:
    """The blocking form of the test above: a thread whose optional step gives up after
    ``acquire(timeout=2)`` in a full BlockingBulkhead (FIFO, or queue management) and carries on
    queued 2 s locally, which the breaker (slow from 1 s) leaves out."""
    breaker = _queued_breaker()
    inner = stoic.BlockingBulkhead(1, queue_limit=5, prioritized=prioritized, label="cache")
    inner.acquire()  # the only slot, held by someone else throughout

    def handler() -> str:
        try:
            inner.acquire(timeout=2.0)
        except stoic.DeadlineExceeded:
            return "without the step"
        inner.release()
        return "with the step"

    results = [asyncio.create_task(asyncio.to_thread(breaker.call, handler)) for _ in range(10)]
    for _ in range(2000):  # (real time: until every thread waits in the queue)
        if inner.queued_count == 5 and sum(task.done() for task in results) == 5:
            break
        await asyncio.sleep(0.001)
    assert inner.queued_count == 5  # five more were refused at once: BulkheadFull, never counted
    await clock.advance(2.0)
    outcomes = await asyncio.gather(*results, return_exceptions=True)
    assert sorted(map(str, outcomes)) == sorted(["without the step"] * 5 + [str(BulkheadFull(label="cache"))] * 5)
    inner.release()
    snap = breaker.snapshot
    assert (snap.state, snap.calls, snap.slow_calls) == (stoic.BreakerState.CLOSED, 5, 0)


@pytest.mark.parametrize("prioritized", [False, True], ids=["fifo", "managed"])
def test_a_thread_interrupted_in_a_blocking_bulkheads_queue_is_not_a_slow_call(prioritized: bool) -> None:
    """A wait that ends in a ``KeyboardInterrupt`` (any exception out of the wait, not only a
    timeout) is local queueing too: a thread queued 2 s in a full BlockingBulkhead, interrupted
    there and catching it, is no slow call for a breaker slow from 1 s; it leaves the queue
    without a slot and without giving back one it did not hold."""
    clock = InterruptingClock()
    with stoic.use_clock(clock):
        breaker = _queued_breaker()
        inner = stoic.BlockingBulkhead(1, queue_limit=5, prioritized=prioritized, label="cache")
    inner.acquire()  # the only slot, held by someone else throughout
    results: list[str] = []

    def handler() -> str:
        try:
            inner.acquire(timeout=5.0)
        except KeyboardInterrupt:
            return "interrupted"
        inner.release()
        return "admitted"

    worker = threading.Thread(target=lambda: results.append(breaker.call(handler)), daemon=True)
    worker.start()
    eventually(lambda: inner.queued_count == 1)  # (real time: until the thread waits in the queue)
    clock.step(2.0)
    clock.interrupted.add(worker)
    clock.step(0)  # wakes the waiter: it reads the clock and is interrupted, 2 s into its wait
    worker.join(5)
    assert results == ["interrupted"]
    assert (inner.active_count, inner.queued_count) == (1, 0)
    inner.release()
    assert inner.active_count == 0
    snap = breaker.snapshot
    assert (snap.state, snap.calls, snap.slow_calls) == (stoic.BreakerState.CLOSED, 1, 0)


@pytest.mark.parametrize("kind", ["adaptive", "gradient", "prioritized", "keyed bulkhead", "keyed limiter"])
async def test_queueing_in_any_inner_queued_stage_is_not_a_slow_call(clock: VirtualClock, kind: str) -> None:
    """Report 20 for every stage that queues: the adaptive bulkheads, a managed queue and the
    per-key families mark the admission as the fixed bulkhead does."""
    breaker = _queued_breaker()
    stage: Any
    if kind == "adaptive":
        stage = stoic.AdaptiveBulkhead(latency_threshold=5.0, max_concurrent=2, min_concurrent=2, queue_limit=50,
                                       label="api")
    elif kind == "gradient":
        stage = stoic.GradientBulkhead(max_concurrent=2, min_concurrent=2, queue_limit=50, label="api")
    elif kind == "prioritized":
        stage = Bulkhead(2, queue_limit=50, prioritized=True, label="api")
    elif kind == "keyed bulkhead":
        stage = stoic.Keyed(Bulkhead, label="api", max_concurrent=2, queue_limit=50)
    else:
        stage = stoic.Keyed(RateLimiter, label="api", rate=2, burst=2, queue_limit=100)

    def call() -> Awaitable[str]:
        if kind.startswith("keyed"):
            return breaker.execute(stage.execute, "tenant", _dependency, clock)
        return breaker.execute(stage.execute, _dependency, clock)

    results = await _run_queued(clock, call)
    assert results == ["ok"] * 40  # the last caller queued for 9.5 s or more
    snap = breaker.snapshot
    assert (snap.state, snap.calls, snap.slow_calls) == (stoic.BreakerState.CLOSED, 40, 0)


@pytest.mark.parametrize("own_clock", [False, True], ids=["ambient clock", "own SystemClock"])
@pytest.mark.parametrize("kind", ["bulkhead", "limiter"])
def test_threads_queued_in_a_blocking_stage_are_not_slow_calls(kind: str, own_clock: bool) -> None:
    """Report 20 for threads (real time, scaled down: the blocking stages wait on real locks):
    24 threads through 2 slots (or 20 permits a second) of 50 ms calls queue for up to 0.6 s,
    twice the breaker's slow_call_duration. A breaker given its own ``SystemClock()`` shares
    the stages' timeline (two system clocks are one, docs/design.md), so their waits count."""
    import threading
    import time

    breaker = CircuitBreaker(label="api", window=TimeWindow(60.0), minimum_calls=10, slow_call_duration=0.3,
                             slow_call_rate_threshold=0.5, clock=stoic.SystemClock() if own_clock else None)
    stage: Any = (stoic.BlockingBulkhead(2, queue_limit=50, label="api") if kind == "bulkhead"
                  else stoic.BlockingRateLimiter(20, per=1.0, burst=1, queue_limit=100, label="api"))
    results: list[str] = []

    def answer() -> str:
        time.sleep(0.05)
        return "ok"

    def worker() -> None:
        results.append(breaker.call(stage.call, answer))

    threads = [threading.Thread(target=worker) for _ in range(24)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert results == ["ok"] * 24
    snap = breaker.snapshot
    assert (snap.state, snap.calls, snap.slow_calls) == (stoic.BreakerState.CLOSED, 24, 0)


# ---------------------------------------------------------------- 21: forked workers do not open in lockstep

@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_children_draw_different_open_durations() -> None:
    clock = StepClock()
    breaker = make(clock=clock, minimum_calls=1, window=CountWindow(1),
                   open_duration=OpenDuration.fixed(100.0, jitter=1.0))

    def trip() -> float:
        breaker.reset()
        with pytest.raises(Boom):
            breaker.call(_raise_boom)
        retry_after = breaker.snapshot.retry_after
        assert retry_after is not None
        return retry_after

    trip()  # the parent already drew from the breaker's stream before forking
    probe_site = "tests/test_breaker_arrivals.py:fork-probe"
    _random.stream(probe_site).random()
    children: list[tuple[int, int]] = []
    for _ in range(4):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report one open duration and one draw of a plain stream
            try:
                os.close(read)
                os.write(write, f"{trip()!r} {_random.stream(probe_site).random()!r}".encode())
            finally:
                os._exit(0)
        os.close(write)
        children.append((pid, read))
    reports = []
    for pid, read in children:
        with os.fdopen(read) as pipe:
            reports.append(pipe.read().split())
        os.waitpid(pid, 0)
    durations = {report[0] for report in reports}
    plain = {report[1] for report in reports}
    assert len(plain) == 4, "forked children drew identical values from a plain stream: no reseed after fork"
    assert len(durations) == 4, "forked children opened for identical durations: lockstep"


# ---------------------------------------------------------------- hostile callers: permits always come back

class _RaisingSink:
    """Raises ``error`` from the first event named ``name`` it receives."""

    level = stoic.Level.INFO

    def __init__(self, name: str, error: BaseException) -> None:
        self.name = name
        self.error: BaseException | None = error

    def emit(self, event: Event) -> None:
        if event.name == self.name and self.error is not None:
            error, self.error = self.error, None
            raise error


def _tripped(clock: StepClock, **overrides: Any) -> CircuitBreaker:
    breaker = make(clock=clock, minimum_calls=1, window=CountWindow(1), **overrides)
    with pytest.raises(Boom):
        breaker.call(_raise_boom)
    assert breaker.state is stoic.BreakerState.OPEN
    clock.t += 11 * SECOND  # the open period is over: the next call is the probe
    return breaker


_ESCAPING = [KeyboardInterrupt, SystemExit, asyncio.CancelledError, GeneratorExit]


def _run_form(breaker: CircuitBreaker, form: str, ok: bool = True) -> Any:
    def op() -> str:
        if not ok:
            raise Boom("down")
        return "ok"

    async def aop() -> str:
        return op()

    if form == "call":
        return breaker.call(op)
    if form == "decorator":
        return breaker(op)()
    coroutine = breaker.execute(aop) if form == "execute" else breaker(aop)()
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    raise AssertionError("suspended")


_FORMS = ["call", "decorator", "execute", "async decorator"]


@pytest.mark.parametrize("error", _ESCAPING)
@pytest.mark.parametrize("form", _FORMS)
def test_a_sink_raising_on_half_open_gives_the_probe_permit_back(form: str, error: type[BaseException]) -> None:
    clock = StepClock()
    breaker = _tripped(clock)
    sink = _RaisingSink("breaker.half_open", error())
    with stoic.use_sinks(sink):
        with pytest.raises(error):
            _run_form(breaker, form)
        assert breaker.state is stoic.BreakerState.HALF_OPEN
        assert _run_form(breaker, form) == "ok"  # the permit came back: this probe closes it
    assert breaker.state is stoic.BreakerState.CLOSED


@pytest.mark.parametrize("error", _ESCAPING)
@pytest.mark.parametrize("form", _FORMS)
def test_a_record_when_raising_a_base_exception_gives_the_probe_permit_back(
    form: str, error: type[BaseException],
) -> None:
    armed = {"raise": False}

    def record_when(exc: Exception) -> bool:
        if armed["raise"]:
            armed["raise"] = False
            raise error()
        return True

    clock = StepClock()
    breaker = _tripped(clock, record_when=record_when)
    armed["raise"] = True
    with pytest.raises(error):
        _run_form(breaker, form, ok=False)
    assert breaker.state is stoic.BreakerState.HALF_OPEN
    assert _run_form(breaker, form) == "ok"
    assert breaker.state is stoic.BreakerState.CLOSED


@pytest.mark.parametrize("form", _FORMS)
def test_a_record_when_that_raises_is_reported_once_and_counts_every_call(
    form: str, caplog: pytest.LogCaptureFixture,
) -> None:
    def record_when(*errors: Exception) -> bool:
        return errors[0].missing  # type: ignore[attr-defined,no-any-return]  # a bug: AttributeError

    breaker = make(record_when=record_when, window=CountWindow(100), minimum_calls=100)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(99):
            with pytest.raises(Boom):
                _run_form(breaker, form, ok=False)
    # once, not per call (a ResourceWarning here is an earlier test's socket collected meanwhile)
    assert [w.category for w in caught if not issubclass(w.category, ResourceWarning)] == [RuntimeWarning]
    assert "record_when" in str(next(w for w in caught if w.category is RuntimeWarning).message)
    assert [r.name for r in caplog.records if "record_when" in r.getMessage()] == ["stoic"]
    assert counts(breaker) == (99, 99)
    with pytest.raises(Boom):
        _run_form(breaker, form, ok=False)
    assert breaker.state is stoic.BreakerState.OPEN  # never silently disabled


# ---------------------------------------------------------------- read-only state is a property

def test_snapshot_and_state_are_read_only_properties() -> None:
    breaker = make()
    assert isinstance(CircuitBreaker.snapshot, property)
    assert isinstance(CircuitBreaker.state, property)
    assert breaker.snapshot.state is breaker.state
    with pytest.raises(AttributeError):
        breaker.snapshot = None  # type: ignore[misc]


# ---------------------------------------------------------------- huge numbers and wrong types at construction

def test_a_huge_open_duration_is_refused_at_construction_not_on_the_tripping_call() -> None:
    with pytest.raises(ValueError, match="open_duration seconds must be at most"):
        OpenDuration.fixed(10**400)
    with pytest.raises(ValueError, match=r"CountWindow calls must be in \[1, 10000000\]"):
        CountWindow(10**30)
    breaker = make(open_duration=OpenDuration.fixed(10**12), minimum_calls=1, window=CountWindow(1))
    with pytest.raises(Boom):
        breaker.call(_raise_boom)
    assert breaker.state is stoic.BreakerState.OPEN
    retry_after = breaker.snapshot.retry_after
    assert retry_after is not None and retry_after > 3e9 * 0.79


def test_a_clock_without_now_ns_is_a_type_error_naming_clock() -> None:
    class NoNow:
        def sleep_until(self, when_ns: int) -> None: ...

    with pytest.raises(TypeError, match="clock"):
        CircuitBreaker(label="clock", clock=NoNow())  # type: ignore[arg-type]




async def _hedged_call_while_held(
    clock: VirtualClock, breaker: CircuitBreaker, op: Callable[..., Awaitable[str]], held: Bulkhead,
    hold_for: float, *, cancel_holder: bool,
) -> str:
    """One call of ``op`` through ``breaker`` and a hedge (a second attempt after 0.1 s, on an
    unlimited budget) while another task holds ``held``'s slot for ``hold_for`` seconds (taken
    just before the call); after the call that task is cancelled (``cancel_holder``) or awaited.
    The call's result, run on ``clock``."""
    policy = stoic.Hedge(0.1, budget=stoic.RetryBudget.UNLIMITED, label="h")

    async def occupy() -> None:
        await clock.sleep(hold_for)

    async def main() -> str:
        holder = asyncio.create_task(held.execute(occupy))
        await asyncio.sleep(0)
        try:
            return await breaker.execute(policy.execute, stoic.IDEMPOTENT, op)
        finally:
            if cancel_holder:
                holder.cancel()
            else:
                await holder

    return await clock.run(main())


@pytest.mark.parametrize("primary", ["admitted as the hedge wins", "superseded in the queue"])
async def test_a_hedge_on_a_slow_dependency_while_the_first_attempt_queues_is_a_slow_call(
    clock: VirtualClock, primary: str,
) -> None:
    """Report 20 must not hide a slow dependency behind a hedge: a breaker outside a hedge
    whose attempts go to two replicas, each behind its own bulkhead. The first attempt queues
    at a busy replica (admitted at 2 s, or still queued when the hedge wins); the hedge, started
    at 0.1 s, goes to the free replica, whose dependency answers in 2 s. A request was on the
    dependency for 2 s of the call: a slow call. The first attempt's wait, recorded in the
    caller's context, was left out of the call's duration whole (0.1 s, or nothing, remained)."""
    breaker = _queued_breaker()
    busy = Bulkhead(1, queue_limit=50, label="replica-a")
    free = Bulkhead(1, queue_limit=50, label="replica-b")
    hold = 2.0 if primary == "admitted as the hedge wins" else 100.0

    async def answer(seconds: float) -> str:
        await clock.sleep(seconds)
        return "ok"

    async def op(attempt: stoic.Attempt) -> str:
        if attempt.number == 1:
            return await busy.execute(answer, 0.3)
        return await free.execute(answer, 2.0)

    assert await _hedged_call_while_held(clock, breaker, op, busy, hold, cancel_holder=True) == "ok"
    snap = breaker.snapshot
    assert (snap.calls, snap.slow_calls) == (1, 1)


async def test_hedged_attempts_all_queueing_locally_are_no_slow_call(clock: VirtualClock) -> None:
    """The other side: both attempts of a hedged call queue in one bulkhead (3 s, both at
    once), then the first answers in 0.2 s. No request was on the dependency for more than
    0.2 s of the call: no slow call."""
    breaker = _queued_breaker()
    bulkhead = Bulkhead(1, queue_limit=50, label="api")

    async def answer() -> str:
        await clock.sleep(0.2)
        return "ok"

    async def op() -> str:
        return await bulkhead.execute(answer)

    assert await _hedged_call_while_held(clock, breaker, op, bulkhead, 3.0, cancel_holder=False) == "ok"
    snap = breaker.snapshot
    assert (snap.calls, snap.slow_calls) == (1, 0)
