"""Nested retries collapse to one layer by default (seed 001, "Nesting"); recur."""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

import stoic
from stoic import RetryBudget, RetryNesting, Schedule, recur, retry
from stoic._retry import in_retry_attempt
from stoic.testing import RecordingSink, VirtualClock, fail_times, fail_with

THREE = Schedule.fixed(0.1).attempts(3)


async def layers(n: int, nesting: RetryNesting, budget: RetryBudget) -> int:
    calls = 0

    async def dependency() -> None:
        nonlocal calls
        calls += 1
        raise ConnectionError

    def wrap(inner: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
        async def layer() -> None:
            await retry(THREE, inner, nesting=nesting, budget=budget, label="op")

        return layer

    op: Callable[[], Awaitable[None]] = dependency
    for _ in range(n):
        op = wrap(op)
    with pytest.raises(ConnectionError):
        await op()
    return calls


async def test_five_layers_of_three_attempts_make_243_calls_when_nesting_is_allowed(clock: VirtualClock) -> None:
    assert await clock.run(layers(5, RetryNesting.ALLOW, RetryBudget.UNLIMITED)) == 243


async def test_five_layers_of_three_attempts_make_3_calls_by_default(clock: VirtualClock,
                                                                      sink: RecordingSink) -> None:
    assert await clock.run(layers(5, RetryNesting.SINGLE_ATTEMPT, RetryBudget.UNLIMITED)) == 3
    # Each of the outer layer's three attempts passes through four inner layers that each give up.
    assert len(sink.of("retry.nested")) == 3 * 4
    assert len(sink.of("retry.attempt_failed")) == 2
    assert len(sink.of("retry.exhausted")) == 1


def test_the_amplification_example_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    path = Path(__file__).resolve().parent.parent / "examples" / "amplification.py"
    spec = importlib.util.spec_from_file_location("stoic_example_amplification", path)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    example.main()
    printed = capsys.readouterr().out
    rows = {name.strip(): int(calls) for name, calls in (line.rsplit(None, 1) for line in printed.splitlines()[2:])}
    assert rows["every layer retries (ALLOW), no budget"] == 243
    assert rows["stoic default (SINGLE_ATTEMPT)"] == 3
    assert 3 < rows["every layer retries (ALLOW), default budget (one site)"] < 243


async def test_a_nested_retry_still_succeeds_on_its_single_attempt(clock: VirtualClock) -> None:
    inner = fail_times(0, then="ok")

    async def outer() -> str:
        return await retry(THREE, inner, label="op")

    assert await clock.run(retry(THREE, outer, label="op")) == "ok"


async def test_nesting_is_seen_by_tasks_an_attempt_creates(clock: VirtualClock) -> None:
    inner = fail_with(ConnectionError())

    async def outer() -> None:
        await asyncio.create_task(retry(THREE, inner, label="op"))

    with pytest.raises(ConnectionError):
        await clock.run(retry(THREE, outer, label="op"))
    assert inner.calls == 3  # one per outer attempt


async def test_nesting_is_seen_by_grandchild_tasks(clock: VirtualClock) -> None:
    inner = fail_with(ConnectionError())

    async def grandchild() -> None:
        await retry(THREE, inner, label="grandchild")

    async def child() -> None:
        await asyncio.create_task(grandchild())

    async def outer() -> None:
        await asyncio.create_task(child())

    with pytest.raises(ConnectionError):
        await clock.run(retry(Schedule.fixed(0).attempts(2), outer, label="op"))
    assert inner.calls == 2  # the grandchild's single attempt, once per outer attempt


async def test_nesting_is_seen_by_a_thread_an_attempt_hands_work_to() -> None:
    # (The system clock and zero delays: asyncio.to_thread's wake-up is not a virtual timer.)
    inner = fail_with(ConnectionError())
    seen: list[bool] = []
    zero = Schedule.fixed(0).attempts(2)

    def blocking() -> None:
        seen.append(in_retry_attempt())
        stoic.retry_sync(zero, inner.sync, label="thread")

    async def outer() -> None:
        await asyncio.to_thread(blocking)  # the thread runs in a copy of the attempt's context

    with pytest.raises(ConnectionError):
        await retry(zero, outer, label="op")
    assert inner.calls == 2 and seen == [True, True]  # one attempt per outer attempt
    inner.calls = 0
    with pytest.raises(ConnectionError):
        await asyncio.to_thread(blocking)  # outside any attempt: the thread's retry runs in full
    assert inner.calls == 2 and seen == [True, True, False]


async def test_blocking_and_async_retries_alternating_in_one_task_keep_the_mark_exact(clock: VirtualClock) -> None:
    inner = fail_with(ConnectionError())
    seen: list[tuple[str, bool]] = []

    def sync_op() -> str:
        seen.append(("sync", in_retry_attempt()))
        return "s"

    async def async_op() -> str:
        seen.append(("async", in_retry_attempt()))
        assert stoic.retry_sync(THREE, sync_op, label="inner-sync") == "s"  # a blocking retry inside
        seen.append(("after sync", in_retry_attempt()))
        with pytest.raises(ConnectionError):
            stoic.retry_sync(THREE, inner.sync, label="inner-sync")
        return "a"

    for _ in range(3):
        assert stoic.retry_sync(THREE, sync_op, label="top-sync") == "s"
        assert not in_retry_attempt()
        assert await retry(THREE, async_op, label="top-async") == "a"
        assert not in_retry_attempt()
    assert seen == [("sync", True), ("async", True), ("sync", True), ("after sync", True)] * 3
    assert inner.calls == 3  # nested each time: a single attempt


async def test_hundreds_of_tasks_nesting_at_random_depths_each_see_their_own_marks(clock: VirtualClock) -> None:
    import random

    rng = random.Random(7)
    wrong: list[tuple[int, int, bool]] = []

    async def level(task_no: int, depth: int, below: int) -> None:
        if in_retry_attempt() != (depth > 0):
            wrong.append((task_no, depth, in_retry_attempt()))
        await clock.sleep(rng.random() / 100)  # let the other tasks interleave
        if below:
            await retry(THREE, level, task_no, depth + 1, below - 1, label="op")
        if in_retry_attempt() != (depth > 0):
            wrong.append((task_no, depth, in_retry_attempt()))

    async def one(task_no: int) -> None:
        await level(task_no, 0, rng.randint(0, 4))
        await level(task_no, 0, rng.randint(0, 4))

    async def noop() -> None:
        pass

    await retry(THREE, noop, label="first")  # this task's marks now exist: every child inherits them
    await clock.run(asyncio.gather(*(one(n) for n in range(300))))
    assert wrong == []


async def test_the_mark_is_only_set_during_attempts(clock: VirtualClock) -> None:
    seen: list[bool] = []

    async def op() -> None:
        seen.append(in_retry_attempt())

    assert not in_retry_attempt()
    await retry(THREE, op, label="op")
    assert seen == [True]
    assert not in_retry_attempt()


async def test_allow_on_an_inner_layer_retries_inside_an_outer_attempt(clock: VirtualClock) -> None:
    inner = fail_with(ConnectionError())

    async def outer() -> None:
        await retry(THREE, inner, nesting=RetryNesting.ALLOW, label="op")

    with pytest.raises(ConnectionError):
        await clock.run(retry(Schedule.fixed(0).attempts(2), outer, label="op"))
    assert inner.calls == 6


def test_nesting_must_be_a_retry_nesting() -> None:
    with pytest.raises(TypeError):
        retry(THREE, fail_times(0), nesting="allow", label="op")  # type: ignore[arg-type]


class TestRecur:
    async def test_runs_again_after_each_success_until_the_schedule_ends(self, clock: VirtualClock) -> None:
        results = iter(range(10))

        async def poll() -> int:
            return next(results)

        assert await clock.run(recur(Schedule.fixed(10).attempts(4), poll)) == 3
        assert clock.now() == 30

    async def test_an_unbounded_recur_runs_until_its_scope_stops_it(self, clock: VirtualClock) -> None:
        op = fail_times(0, then=None)

        async def supervised() -> None:
            async with stoic.timeout(60):
                await recur(Schedule.fixed(5), op)

        with pytest.raises(stoic.DeadlineExceeded):
            await clock.run(supervised())
        assert op.calls == 12  # at 0, 5, ..., 55; the wake-up at 60 loses to the deadline
        assert clock.pending_timers == 0

    async def test_an_error_propagates_at_once(self, clock: VirtualClock) -> None:
        op = fail_times(1)
        with pytest.raises(ConnectionError):
            await clock.run(recur(Schedule.fixed(1).attempts(5), op))
        assert op.calls == 1

    async def test_recur_can_be_cancelled(self, clock: VirtualClock) -> None:
        op = fail_times(0)
        task = asyncio.ensure_future(recur(Schedule.exponential(1), op))
        await clock.advance(10)
        task.cancel()
        await clock.advance(0)
        assert task.cancelled()
        assert op.calls == 4  # 0, 1, 3, 7
        assert clock.pending_timers == 0

    async def test_recur_hands_out_numbered_attempts(self, clock: VirtualClock) -> None:
        seen: list[int] = []

        async def poll(attempt: stoic.Attempt) -> None:
            seen.append(attempt.number)

        await clock.run(recur(Schedule.fixed(1).attempts(3), poll))
        assert seen == [1, 2, 3]

    def test_recur_needs_a_schedule(self) -> None:
        with pytest.raises(TypeError):
            recur(3, fail_times(0))  # type: ignore[arg-type]


async def test_a_collapsed_nested_retry_deposits_nothing_into_the_budget(clock: VirtualClock) -> None:
    # A nested SINGLE_ATTEMPT retry deposited as a first attempt: its one attempt is the outer
    # retry's (one request to the dependency), so with both on one budget (a named budget per
    # dependency, two Retrying stages, a retry inside a Retrying stage's operation) each request
    # deposited twice and each retry earned a token itself. With ratio 0.5 and no reserve, one
    # failing call earned a retry the documented bound (ratio x first attempts) does not allow.
    def budget() -> RetryBudget:
        return RetryBudget(ratio=0.5, reserve_per_second=0, reserve_capacity=0, clock=clock)

    five = Schedule.fixed(0).attempts(5)

    async def pipeline_form(shared: RetryBudget, op: Callable[[], Awaitable[None]]) -> None:
        pipeline = stoic.Pipeline(stoic.Retrying(five, label="outer", budget=shared),
                                  stoic.CircuitBreaker(label="b"), stoic.Retrying(five, label="inner", budget=shared))
        await pipeline.execute(op)

    async def retry_form(shared: RetryBudget, op: Callable[[], Awaitable[None]]) -> None:
        async def layer() -> None:
            await retry(five, op, label="inner", budget=shared)
        await retry(five, layer, label="outer", budget=shared)

    async def timed_form(shared: RetryBudget, op: Callable[[], Awaitable[None]]) -> None:
        async def layer() -> None:
            await retry(five, op, label="inner", budget=shared, attempt_timeout=1)
        await retry(five, layer, label="outer", budget=shared)

    async def decorated_form(shared: RetryBudget, op: Callable[[], Awaitable[None]]) -> None:
        inner = stoic.retrying(five, label="inner", budget=shared)(op)
        await stoic.Retrying(five, label="outer", budget=shared).execute(inner)

    def sync_form(shared: RetryBudget, op: Callable[[], None]) -> None:
        stoic.retry_sync(five, lambda: stoic.retry_sync(five, op, label="inner", budget=shared), label="outer",
                         budget=shared)

    for form in (pipeline_form, retry_form, timed_form, decorated_form):
        failing = fail_with(ConnectionError())
        with pytest.raises(ConnectionError):
            await clock.run(form(budget(), failing))
        assert failing.calls == 1, form.__name__  # 0.5 earned: no token for a retry

    calls = 0

    def plain() -> None:
        nonlocal calls
        calls += 1
        raise ConnectionError

    with pytest.raises(ConnectionError):
        sync_form(budget(), plain)
    assert calls == 1

    # Alone, or nested with ALLOW (a layer retrying on its own), a first attempt still deposits.
    shared = budget()
    alone = fail_with(ConnectionError())
    with pytest.raises(ConnectionError):
        await clock.run(retry(five, alone, label="alone", budget=shared))
    with pytest.raises(ConnectionError):
        await clock.run(retry(five, alone, label="alone", budget=shared))
    assert alone.calls == 3  # the second call's deposit made a whole token: one retry
    allowing = fail_with(ConnectionError())
    spent = budget()

    async def allowed() -> None:
        await retry(five, allowing, label="inner", budget=spent, nesting=RetryNesting.ALLOW)

    with pytest.raises(ConnectionError):
        await clock.run(retry(five, allowed, label="outer", budget=spent))
    assert allowing.calls == 2  # outer 0.5 + inner 0.5: the inner retries once
