"""stoic.timeout / stoic.deadline on virtual time: expiry, nesting, and telling a deadline's
cancellation from any other."""

from __future__ import annotations

import asyncio

import pytest
from _cancels import HandFiredClock, fail_a_task_group, swallow_a_cancel

import stoic
from stoic import DeadlineExceeded, Rejected, RejectionReason, cancelled_by_deadline, time_remaining
from stoic._deadline import DEADLINE_CANCEL_MESSAGE, remaining_ns
from stoic.testing import VirtualClock, settle

S = 1_000_000_000


async def sleep(clock: VirtualClock, seconds: float) -> None:
    await clock.sleep_until(clock.now_ns() + round(seconds * S))


async def test_timeout_raises_deadline_exceeded_at_the_virtual_instant(clock):
    async def work() -> None:
        async with stoic.timeout(2, label="fetch"):
            await sleep(clock, 10)

    with pytest.raises(DeadlineExceeded) as caught:
        await clock.run(work())
    assert clock.now() == 2.0
    error = caught.value
    assert isinstance(error, TimeoutError) and isinstance(error, Rejected)
    assert error.reason is RejectionReason.DEADLINE_EXCEEDED
    assert error.label == "fetch" and "fetch" in str(error)
    assert isinstance(error.__cause__, asyncio.CancelledError)
    assert clock.pending_timers == 0


async def test_a_block_that_finishes_in_time_is_untouched_and_leaves_no_timer(clock):
    async def work() -> str:
        async with stoic.timeout(5) as scope:
            await sleep(clock, 1)
        assert not scope.expired
        return "done"

    assert await clock.run(work()) == "done"
    assert clock.pending_timers == 0


async def test_after_a_deadline_the_task_is_not_left_cancelling(clock):
    async def work() -> int:
        with pytest.raises(DeadlineExceeded):
            async with stoic.timeout(1):
                await sleep(clock, 5)
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0
        await sleep(clock, 1)  # the spent cancel request is not delivered later
        return 1

    assert await clock.run(work()) == 1
    assert clock.now() == 2.0


async def test_nested_outer_fires_first_outer_raises_and_inner_passes_the_cancellation(clock):
    seen: list[str] = []

    async def work() -> None:
        async with stoic.timeout(1, label="outer"):
            try:
                async with stoic.timeout(10, label="inner") as inner:
                    await sleep(clock, 100)
            except asyncio.CancelledError:
                seen.append(f"inner passed cancellation, expired={inner.expired}")
                raise

    with pytest.raises(DeadlineExceeded) as caught:
        await clock.run(work())
    assert caught.value.label == "outer"
    assert seen == ["inner passed cancellation, expired=False"]
    assert clock.now() == 1.0 and clock.pending_timers == 0


async def test_nested_inner_fires_first_inner_raises_and_outer_goes_on(clock):
    async def work() -> str:
        async with stoic.timeout(10, label="outer") as outer:
            with pytest.raises(DeadlineExceeded) as caught:
                async with stoic.timeout(1, label="inner"):
                    await sleep(clock, 100)
            assert caught.value.label == "inner"
            await sleep(clock, 2)
        assert not outer.expired
        return "outer finished"

    assert await clock.run(work()) == "outer finished"
    assert clock.now() == 3.0


async def test_cancelled_by_deadline_tells_a_deadline_from_another_cancellation(clock):
    reports: list[str] = []

    async def waiter() -> None:
        try:
            await sleep(clock, 100)
        except asyncio.CancelledError:
            reports.append("deadline_exceeded" if cancelled_by_deadline() else "cancelled")
            raise

    async def under_deadline() -> None:
        async with stoic.timeout(1):
            await waiter()

    with pytest.raises(DeadlineExceeded):
        await clock.run(under_deadline())

    async def cancelled_from_outside() -> None:
        async with stoic.timeout(50):
            await waiter()

    task = asyncio.create_task(cancelled_from_outside())
    await settle()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):  # not DeadlineExceeded: it was not the deadline
        await task
    assert reports == ["deadline_exceeded", "cancelled"]
    assert not cancelled_by_deadline()


async def test_an_outside_cancellation_racing_the_deadline_still_passes_through(clock):
    async def work() -> None:
        async with stoic.timeout(1):
            await sleep(clock, 100)

    task = asyncio.create_task(work())
    await settle()
    task.cancel()  # someone else cancels ...
    await clock.advance(1)  # ... and the deadline fires too before the task runs again
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_block_that_swallows_the_cancellation_ends_normally(clock):
    async def work() -> str:
        async with stoic.timeout(1) as scope:
            try:
                await sleep(clock, 100)
            except asyncio.CancelledError:
                pass
        assert scope.expired
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0
        return "swallowed"

    assert await clock.run(work()) == "swallowed"


async def test_time_remaining_is_the_tightest_deadline_and_goes_negative(clock):
    assert time_remaining() is None and remaining_ns() is None

    async def work() -> list[float | None]:
        seen: list[float | None] = []
        async with stoic.timeout(10):
            seen.append(time_remaining())
            await sleep(clock, 4)
            seen.append(time_remaining())
            async with stoic.timeout(100):
                seen.append(time_remaining())  # the outer one is tighter
            async with stoic.timeout(1):
                seen.append(time_remaining())
        return seen

    assert await clock.run(work()) == [10.0, 6.0, 6.0, 1.0]
    assert stoic.time_remaining is time_remaining

    async def late() -> float | None:
        async with stoic.timeout(1):
            try:
                await sleep(clock, 5)
            except asyncio.CancelledError:
                left = time_remaining()
                assert left is not None and left <= 0
                raise
        return None

    with pytest.raises(DeadlineExceeded):
        await clock.run(late())


async def test_deadline_takes_an_instant_and_a_past_instant_expires_at_once(clock):
    await clock.advance(5)

    async def until(instant: float) -> None:
        async with stoic.deadline(instant, label="abs"):
            assert time_remaining() == pytest.approx(instant - clock.now())
            await sleep(clock, 100)

    with pytest.raises(DeadlineExceeded):
        await clock.run(until(8.0))
    assert clock.now() == 8.0
    with pytest.raises(DeadlineExceeded):
        await clock.run(until(1.0))
    assert clock.now() == 8.0


async def test_zero_timeout_expires_at_once_and_negative_is_rejected(clock):
    async def work() -> None:
        async with stoic.timeout(0):
            await sleep(clock, 1)

    with pytest.raises(DeadlineExceeded):
        await clock.run(work())
    assert clock.now() == 0.0
    with pytest.raises(ValueError, match="seconds"):
        stoic.timeout(-1)
    with pytest.raises(TypeError):
        stoic.timeout("1")  # type: ignore[arg-type]


async def test_an_explicit_clock_wins_over_the_ambient_one(clock):
    other = VirtualClock()

    async def work() -> None:
        async with stoic.timeout(1, clock=other):
            await other.sleep_until(10 * S)

    task = asyncio.create_task(work())
    await clock.advance(5)  # the ambient clock moving does not matter
    assert not task.done()
    await other.advance(1)
    with pytest.raises(DeadlineExceeded):
        await task


async def test_the_deadline_is_visible_to_tasks_created_inside_the_block(clock):
    async def child() -> float | None:
        return time_remaining()

    async def work() -> float | None:
        async with stoic.timeout(3):
            return await asyncio.create_task(child())

    assert await clock.run(work()) == 3.0


def test_the_cancel_message_names_stoic():
    assert "deadline" in DEADLINE_CANCEL_MESSAGE


async def test_an_already_expired_deadline_on_the_system_clock_cuts_the_first_await():
    # A timer already due must fire before the block's first await resumes (as asyncio.timeout(0)
    # does), not one loop turn later: "an instant already passed expires at once".
    with pytest.raises(DeadlineExceeded):
        async with stoic.timeout(0, clock=stoic.SYSTEM_CLOCK):
            await asyncio.sleep(0)
    with pytest.raises(DeadlineExceeded):
        async with stoic.deadline(stoic.SYSTEM_CLOCK.now() - 1.0, clock=stoic.SYSTEM_CLOCK):
            await asyncio.sleep(0)
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


def test_a_deadline_instant_that_is_not_a_finite_number_is_a_value_error_naming_it():
    for bad in (float("nan"), float("inf"), float("-inf"), 10**400, -(10**400), 10**300):
        with pytest.raises(ValueError, match="instant"):  # (an int beyond any float: no OverflowError)
            stoic.deadline(bad)
    with pytest.raises(TypeError, match="instant"):
        stoic.deadline("5")  # type: ignore[arg-type]


async def test_a_timeout_object_cannot_be_entered_twice(clock: VirtualClock) -> None:
    block = stoic.timeout(5)
    async with block:
        pass
    with pytest.raises(RuntimeError, match="only once"):
        async with block:
            pass


_FIRST_DEADLINE_SCRIPT = """
import asyncio, stoic
from stoic import _deadline

breaker = stoic.CircuitBreaker(label="first")
schedule = stoic.Schedule.delays([0.0])
assert breaker.call(lambda: 1) == 1 and not _deadline.ever_set
seen = []

async def main():
    async with stoic.timeout(0):  # the process's first deadline, passed at once
        try:
            await breaker.execute(asyncio.sleep, 0)
        except stoic.DeadlineExceeded:
            seen.append("breaker")
        try:
            await stoic.retry(schedule, lambda: failing(), label="first")
        except stoic.DeadlineExceeded:
            seen.append(calls[0])
        await asyncio.sleep(1)

calls = [0]
async def failing():
    calls[0] += 1
    raise ConnectionError

try:
    asyncio.run(main())
except stoic.DeadlineExceeded:
    pass
print(_deadline.ever_set, seen)
"""


def test_the_first_deadline_of_a_process_is_seen_by_the_policies_inside_it():
    # Policies skip the deadline lookup until some timeout()/deadline() has been entered in the
    # process (_deadline.ever_set); in a fresh interpreter the very first one must still count:
    # the breaker refuses, and so does the retry (the deadline has passed: no attempt runs).
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _FIRST_DEADLINE_SCRIPT], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    assert out.strip() == "True ['breaker', 0]"


async def test_timeout_expired_reaches_the_sinks_in_scope_at_the_block_on_a_virtual_clock(clock):
    # The expiry is reported to the sinks ambient where the block was entered, as on the system
    # clock, not to those of the code that advances the clock.
    from stoic.testing import RecordingSink

    inside, outside = RecordingSink(), RecordingSink()

    async def work() -> None:
        with stoic.use_sinks(inside), pytest.raises(DeadlineExceeded):
            async with stoic.timeout(1, label="scoped"):
                await sleep(clock, 5)

    task = asyncio.ensure_future(work())
    await settle()
    with stoic.use_sinks(outside):
        await clock.advance(2)
    await task
    assert [(e.name, e.label) for e in inside.events] == [("timeout.expired", "scoped")]
    assert outside.events == []


async def test_a_block_whose_coroutine_is_closed_from_another_context_closes_cleanly(clock):
    # A suspended coroutine closed from outside its task (close(), or the garbage collector)
    # leaves the block in another context than it entered it in: the close still succeeds
    # (the context variable's reset raised ValueError in place of the GeneratorExit).
    import contextvars

    async def work() -> None:
        async with stoic.timeout(10):
            await sleep(clock, 5)

    coro = work()
    contextvars.copy_context().run(coro.__await__().send, None)
    coro.close()
    assert clock.pending_timers == 0
    assert time_remaining() is None


@pytest.mark.parametrize("form", ["swallowed", "failed TaskGroup"])
async def test_a_cancel_left_raised_inside_the_block_does_not_hide_its_deadline(clock, form):
    """Field report 17 inside a timeout block: the count rose after the block was entered, and
    the deadline's own cancellation must still end the block with DeadlineExceeded (a bare
    CancelledError would cancel the whole task)."""
    async def work() -> tuple[int, int]:
        task = asyncio.current_task()
        assert task is not None
        with pytest.raises(DeadlineExceeded) as caught:
            async with stoic.timeout(1):
                await (swallow_a_cancel() if form == "swallowed" else fail_a_task_group())
                raised = task.cancelling()  # 1 where the TaskGroup leaves it raised (3.11, 3.12.1)
                await sleep(clock, 100)
        assert caught.value.timed_out
        return raised, task.cancelling()

    raised, after = await clock.run(work())
    assert clock.now() == 1.0
    assert after == raised  # only the deadline's own request was taken back


async def test_a_cancel_pending_when_the_deadline_fires_passes_through_even_with_a_stale_count():
    """The other side: with the count left raised inside the block, an outside cancel request
    still pending when the deadline fires (both reach the task as one CancelledError) is the
    outside caller's, and passes through."""
    clock = HandFiredClock()
    blocked = asyncio.Event()

    async def work() -> None:
        async with stoic.timeout(1, clock=clock):
            await swallow_a_cancel()
            await blocked.wait()

    task = asyncio.create_task(work())
    await settle()
    task.cancel()  # someone else cancels ...
    (fire,) = clock.callbacks
    fire()  # ... and the deadline fires before the task runs again
    with pytest.raises(asyncio.CancelledError):
        await task
