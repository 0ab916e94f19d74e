"""Hostile tests of the per-task nesting marks (seed 001, "Nesting"; docs/retry.md "Nesting"):
"inside an attempt" means in the task or thread running it, or in one created *while it runs*.
A task, thread or context made before the attempt is not inside it; one made inside it is,
for as long as it runs, whatever the shape (gather, TaskGroup, to_thread, several loops)."""

from __future__ import annotations

import asyncio
import contextvars
import threading

import pytest

import stoic
from stoic import RetryBudget, RetryNesting, Schedule, retry, retry_sync
from stoic._retry import _marks, in_retry_attempt
from stoic.testing import VirtualClock, fail_with

THREE = Schedule.fixed(0.1).attempts(3)
ZERO3 = Schedule.fixed(0).attempts(3)


async def noop() -> None:
    pass


async def test_a_worker_started_before_an_attempt_is_not_nested_in_it(clock: VirtualClock) -> None:
    # The task's marks exist (an earlier retry made them), then a background worker starts,
    # then the task runs a long attempt: the worker was not created inside it and retries in full.
    await retry(THREE, noop, label="first")
    inner = fail_with(ConnectionError())
    in_attempt = asyncio.Event()
    done = asyncio.Event()
    seen: list[bool] = []

    async def worker() -> None:
        await in_attempt.wait()
        seen.append(in_retry_attempt())
        with pytest.raises(ConnectionError):
            await retry(ZERO3, inner, label="worker", budget=RetryBudget.UNLIMITED)
        done.set()

    task = asyncio.create_task(worker())
    await asyncio.sleep(0)

    async def long_attempt() -> None:
        in_attempt.set()
        await done.wait()

    await retry(THREE, long_attempt, label="main")  # in this task, which made the workers
    await task
    assert seen == [False]
    assert inner.calls == 3


async def test_hundreds_of_workers_started_between_attempts_all_retry_in_full(clock: VirtualClock) -> None:
    inner = fail_with(ConnectionError())
    gate = asyncio.Event()
    finished = 0
    all_done = asyncio.Event()

    async def worker() -> None:
        nonlocal finished
        await gate.wait()
        with pytest.raises(ConnectionError):
            await retry(ZERO3, inner, label="worker", budget=RetryBudget.UNLIMITED)
        finished += 1
        if finished == 300:
            all_done.set()

    workers = []
    for _ in range(300):
        await retry(THREE, noop, label="between")  # an attempt before each worker is made
        workers.append(asyncio.create_task(worker()))

    async def long_attempt() -> None:
        gate.set()
        await all_done.wait()

    await retry(THREE, long_attempt, label="main")  # in this task, which made the workers
    await asyncio.gather(*workers)
    assert inner.calls == 300 * 3


def test_a_thread_running_a_context_copied_before_the_attempt_is_not_nested_in_it(
        jumping_clock: VirtualClock) -> None:
    # A pool that propagates the submitter's context (copy_context at submit time): the context
    # was copied before this thread's attempt began, so the work it runs is not inside it.
    retry_sync(ZERO3, lambda: None, label="first")  # this thread's marks exist
    context = contextvars.copy_context()
    inner = fail_with(ConnectionError())
    in_attempt = threading.Event()
    seen: list[bool] = []
    errors: list[BaseException] = []

    def work() -> None:
        in_attempt.wait(10)
        seen.append(in_retry_attempt())
        try:
            retry_sync(ZERO3, inner.sync, label="pooled", clock=stoic.SYSTEM_CLOCK)
        except BaseException as error:  # (reported below)
            errors.append(error)

    thread = threading.Thread(target=context.run, args=(work,))
    thread.start()

    def long_attempt() -> None:
        in_attempt.set()
        thread.join(10)

    retry_sync(ZERO3, long_attempt, label="main")
    assert seen == [False]
    assert len(errors) == 1 and isinstance(errors[0], ConnectionError)
    assert inner.calls == 3


async def test_a_context_copied_inside_an_attempt_is_nested_only_while_it_runs(clock: VirtualClock) -> None:
    copied: list[contextvars.Context] = []

    earlier: list[bool] = []

    async def op() -> None:
        # a context copied in an earlier attempt is not inside this one
        earlier.extend(context.run(in_retry_attempt) for context in copied)
        copied.append(contextvars.copy_context())
        assert copied[-1].run(in_retry_attempt)

    for _ in range(3):
        await retry(THREE, op, label="op")
        assert not any(context.run(in_retry_attempt) for context in copied)  # those attempts ended
    assert earlier == [False] * 3


async def test_an_allowed_nested_retry_marks_each_of_its_attempts(clock: VirtualClock) -> None:
    # A worker created inside the main attempt starts an ALLOW retry (nested: the creator's
    # attempt runs); the creator's attempt then ends. The worker's later attempts are still
    # attempts: a retry inside them makes a single attempt (seed 001, "Nesting").
    innermost = fail_with(ConnectionError())
    outer_calls = 0
    creator_done = asyncio.Event()
    seen: list[bool] = []

    async def worker_attempt() -> None:
        nonlocal outer_calls
        outer_calls += 1
        if outer_calls == 2:
            await creator_done.wait()
            seen.append(in_retry_attempt())
            with pytest.raises(ConnectionError):
                await retry(THREE, innermost, label="innermost")
        raise ConnectionError

    async def worker() -> None:
        with pytest.raises(ConnectionError):
            await retry(Schedule.fixed(0.1).attempts(2), worker_attempt, nesting=RetryNesting.ALLOW, label="worker")

    holder: list[asyncio.Task[None]] = []

    async def creator_attempt() -> None:
        holder.append(asyncio.create_task(worker()))
        await asyncio.sleep(0)  # the worker's first attempt runs (and fails) inside this one

    await retry(THREE, creator_attempt, label="creator")
    creator_done.set()
    await clock.run(holder[0])
    assert outer_calls == 2
    assert seen == [True]
    assert innermost.calls == 1


async def test_an_allowed_nested_retry_with_attempt_timeouts_marks_each_attempt(clock: VirtualClock) -> None:
    innermost = fail_with(ConnectionError())
    calls = 0
    creator_done = asyncio.Event()

    async def worker_attempt() -> None:
        nonlocal calls
        calls += 1
        if calls == 2:
            await creator_done.wait()
            with pytest.raises(ConnectionError):
                await retry(THREE, innermost, label="innermost")
        raise ConnectionError

    async def worker() -> None:
        with pytest.raises(ConnectionError):
            await retry(Schedule.fixed(0.1).attempts(2), worker_attempt, nesting=RetryNesting.ALLOW,
                        attempt_timeout=60, label="worker")

    holder: list[asyncio.Task[None]] = []

    async def creator_attempt() -> None:
        holder.append(asyncio.create_task(worker()))
        await asyncio.sleep(0)

    await retry(THREE, creator_attempt, label="creator")
    creator_done.set()
    await clock.run(holder[0])
    assert calls == 2 and innermost.calls == 1


def test_an_allowed_nested_blocking_retry_marks_each_of_its_attempts(jumping_clock: VirtualClock) -> None:
    innermost = fail_with(ConnectionError())
    seen: list[bool] = []
    calls = 0

    def middle() -> None:
        nonlocal calls
        calls += 1
        seen.append(in_retry_attempt())
        with pytest.raises(ConnectionError):
            retry_sync(THREE, innermost.sync, label="innermost")
        raise ConnectionError

    def outer() -> None:
        with pytest.raises(ConnectionError):
            retry_sync(Schedule.fixed(0.1).attempts(3), middle, nesting=RetryNesting.ALLOW, label="middle")

    retry_sync(THREE, outer, label="outer")
    assert calls == 3 and seen == [True] * 3 and innermost.calls == 3


# --- pinned: shapes that already behave (gather, TaskGroup, cancellation, interrupts, loops) ----

async def test_gather_and_taskgroup_children_of_an_attempt_are_nested(clock: VirtualClock) -> None:
    inner = fail_with(ConnectionError())

    async def child() -> bool:
        nested = in_retry_attempt()
        with pytest.raises(ConnectionError):
            await retry(THREE, inner, label="child", budget=RetryBudget.UNLIMITED)
        return nested

    async def attempt() -> None:
        assert await asyncio.gather(*(child() for _ in range(100))) == [True] * 100
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(child()) for _ in range(100)]
        assert all(task.result() for task in tasks)

    await clock.run(retry(THREE, attempt, label="outer"))
    assert inner.calls == 200  # one each: every child ran inside the attempt
    inner.calls = 0
    await clock.run(asyncio.gather(*(child() for _ in range(100))))  # outside: in full
    assert inner.calls == 300


async def test_an_attempt_cancelled_midway_leaves_no_mark(clock: VirtualClock) -> None:
    started = asyncio.Event()

    async def hang() -> None:
        started.set()
        await asyncio.Event().wait()

    after: list[bool] = []
    inner = fail_with(ConnectionError())

    async def caller() -> None:
        await retry(THREE, noop, label="first")
        try:
            await retry(THREE, hang, label="hang")
        except asyncio.CancelledError:
            after.append(in_retry_attempt())
            with pytest.raises(ConnectionError):  # a retry in the cleanup is not nested
                await retry(Schedule.fixed(0).attempts(2), inner, label="cleanup")
            raise

    for _ in range(3):
        started.clear()
        task = asyncio.create_task(caller())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert after == [False] * 3 and inner.calls == 6
    marks = _marks.get()
    assert marks is None or marks[0] == 0  # (depth)


def test_an_interrupt_in_a_blocking_attempt_leaves_no_mark(jumping_clock: VirtualClock) -> None:
    def interrupted() -> None:
        assert in_retry_attempt()
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        retry_sync(THREE, interrupted, label="ki")
    assert not in_retry_attempt()
    inner = fail_with(ConnectionError())
    with pytest.raises(ConnectionError):
        retry_sync(THREE, inner.sync, label="after")
    assert inner.calls == 3  # not mistaken for nested


async def test_an_exception_group_from_an_attempt_leaves_no_mark(clock: VirtualClock) -> None:
    async def failing_group() -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(fail_with(ValueError())())
    with pytest.raises(ExceptionGroup):
        await clock.run(retry(THREE, failing_group, label="group", classify=ValueError))
    assert not in_retry_attempt()


def test_loops_in_several_threads_each_keep_their_own_marks() -> None:
    # 4 threads, each its own loop and virtual clock, 100 tasks each nesting at random: every
    # task sees exactly its own depth (the 3.11 one-running-task shortcut must never pick
    # another thread's task).
    import random

    wrong: list[tuple[int, int]] = []
    barrier = threading.Barrier(4)

    def run_loop(seed: int) -> None:
        rng = random.Random(seed)
        clock = VirtualClock()

        async def level(depth: int, below: int) -> None:
            if in_retry_attempt() != (depth > 0):
                wrong.append((seed, depth))
            await clock.sleep(rng.random() / 100)
            if below:
                await retry(THREE, level, depth + 1, below - 1, label="op", clock=clock)
            if in_retry_attempt() != (depth > 0):
                wrong.append((seed, depth))

        async def main() -> None:
            barrier.wait(10)
            await clock.run(asyncio.gather(*(level(0, rng.randint(0, 3)) for _ in range(100))))

        asyncio.run(main())

    threads = [threading.Thread(target=run_loop, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert wrong == []


async def test_a_hedge_over_a_retry_lets_each_hedged_attempt_retry_in_full(clock: VirtualClock) -> None:
    # Hedge -> retry: the first hedged attempt's retry runs in the caller's task; the hedge's
    # second attempt is a task made when the hedge began, outside any attempt. Its retry is not
    # nested in the first one's (they race; neither retries the other's work).
    calls: list[str] = []

    async def op(hedged: int) -> str:
        calls.append(f"hedged {hedged}")
        if hedged == 1:
            await clock.sleep(10)  # the first attempt hangs: the hedge fires at 0.05 s
            return "slow"
        if calls.count("hedged 2") < 3:
            raise ConnectionError
        return "fast"

    async def retried(attempt: stoic.Attempt) -> str:
        return await retry(THREE, op, attempt.number, label="inner", budget=RetryBudget.UNLIMITED)

    hedge = stoic.Hedge(0.05, label="h", budget=RetryBudget.UNLIMITED)
    async def caller() -> str:
        await retry(THREE, noop, label="first")  # the caller's task has its marks
        return await hedge.execute(stoic.IDEMPOTENT, retried)

    assert await clock.run(caller()) == "fast"
    assert calls.count("hedged 2") == 3


async def test_attempts_cut_by_their_timeout_leave_the_count_exact(clock: VirtualClock) -> None:
    inner = fail_with(ConnectionError())
    seen: list[bool] = []

    async def hangs_after_a_nested_retry() -> None:
        with pytest.raises(ConnectionError):
            await retry(THREE, inner, label="inner")  # nested: one attempt
        seen.append(in_retry_attempt())
        await clock.sleep(60)  # cut by the attempt timeout

    with pytest.raises(stoic.DeadlineExceeded):
        await clock.run(retry(THREE, hangs_after_a_nested_retry, attempt_timeout=1, label="timed"))
    assert inner.calls == 3 and seen == [True] * 3
    assert not in_retry_attempt()
    inner.calls = 0
    with pytest.raises(ConnectionError):
        await clock.run(retry(THREE, inner, label="after"))
    assert inner.calls == 3


async def test_a_task_an_attempt_created_retries_in_full_during_the_next_attempt(clock: VirtualClock) -> None:
    # Seen failing before the fix: one mark served every attempt of a retry call, so a worker
    # created by attempt 1 that outlived it was "inside" attempt 2 too, and its own retry made a
    # single attempt (docs/retry.md: it retries in full once the attempt that created it ended).
    inner = fail_with(ConnectionError())
    copied: list[contextvars.Context] = []
    workers: list[asyncio.Task[None]] = []
    seen: list[bool] = []

    async def worker() -> None:
        # (Under an eager task factory its first step runs inside attempt 1, which is right: it
        # looks once attempt 1 has ended.)
        await asyncio.sleep(0)
        seen.append(in_retry_attempt())
        with pytest.raises(ConnectionError):
            await retry(ZERO3, inner, label="worker", budget=RetryBudget.UNLIMITED)

    async def op() -> None:
        if not workers:
            copied.append(contextvars.copy_context())
            workers.append(asyncio.create_task(worker()))
            raise ConnectionError("attempt 1 fails")
        assert copied[0].run(in_retry_attempt) is False  # copied in attempt 1: not inside attempt 2
        await workers[0]  # attempt 2 runs while the worker retries

    await retry(ZERO3, op, label="main", budget=RetryBudget.UNLIMITED)
    assert seen == [False] and inner.calls == 3


def test_a_thread_an_attempt_started_retries_in_full_during_the_next_attempt(jumping_clock: VirtualClock) -> None:
    inner = fail_with(ConnectionError())
    go = threading.Event()
    errors: list[BaseException] = []
    threads: list[threading.Thread] = []

    def work() -> None:
        go.wait(10)
        try:
            retry_sync(ZERO3, inner.sync, label="worker", budget=RetryBudget.UNLIMITED, clock=stoic.SYSTEM_CLOCK)
        except BaseException as error:  # (reported below)
            errors.append(error)

    def op() -> None:
        if not threads:
            threads.append(threading.Thread(target=contextvars.copy_context().run, args=(work,)))
            threads[0].start()
            raise ConnectionError("attempt 1 fails")
        go.set()  # attempt 2 runs while the thread retries
        threads[0].join(10)

    retry_sync(ZERO3, op, label="main", budget=RetryBudget.UNLIMITED)
    assert len(errors) == 1 and isinstance(errors[0], ConnectionError)
    assert inner.calls == 3
