"""Issue 9 for the rate limiter, bulkhead, hedge and deadlines: how tasks and errors really
arrive (field reports 17, 18, 20), one consistent API (label, clock), and huge numbers.

Each test names the behaviour; the asyncio and the blocking forms are both exercised where the
behaviour applies to both.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest
from _cancels import swallow_a_cancel
from _threads import eventually

import stoic
from stoic import (
    IDEMPOTENT,
    BlockingBulkhead,
    BlockingRateLimiter,
    Bulkhead,
    BulkheadFull,
    ClockMismatch,
    DeadlineExceeded,
    Hedge,
    RateLimiter,
    RetryBudget,
    _admission,
)
from stoic._deadline import deadline_ns, remaining_ns
from stoic.testing import RecordingSink, VirtualClock, settle

S = 1_000_000_000


# ------------------------------------------------------------------ case 17: stale cancel counts

async def test_a_swallowed_cancel_request_does_not_stop_a_limiter_waiter(
    clock: VirtualClock, sink: RecordingSink
) -> None:
    limiter = RateLimiter(1, burst=1, label="stale")
    assert limiter.try_acquire()

    async def caller() -> float:
        await swallow_a_cancel()
        await limiter.acquire()  # waits 1 s, and is served
        return clock.now()

    assert await clock.run(caller()) == 1.0
    assert sink.of("ratelimiter.rejected") == []
    assert [e.attributes["permits"] for e in sink.of("ratelimiter.waited")] == [1]


async def test_a_swallowed_cancel_request_does_not_stop_a_bulkhead_waiter(
    clock: VirtualClock, sink: RecordingSink
) -> None:
    bulkhead = Bulkhead(1, queue_limit=1, label="stale")
    release = asyncio.Event()

    async def holder() -> None:
        await release.wait()

    async def caller() -> str:
        await swallow_a_cancel()
        return await bulkhead.execute(asyncio.sleep, 0, "ran")

    held = asyncio.create_task(bulkhead.execute(holder))
    waiting = asyncio.create_task(caller())
    await settle()
    assert bulkhead.queued_count == 1
    release.set()
    assert await waiting == "ran"
    await held
    assert sink.of("bulkhead.rejected") == []
    # A real cancellation of a waiter with a stale count is still reported as one, once.
    release.clear()  # before the holder starts (its first step may run inside create_task)
    held = asyncio.create_task(bulkhead.execute(holder))
    waiting = asyncio.create_task(caller())
    await settle()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert [e.attributes["reason"] for e in sink.of("bulkhead.rejected")] == ["cancelled"]
    release.set()
    await held
    assert (bulkhead.active_count, bulkhead.queued_count) == (0, 0)


def test_the_blocking_forms_admit_a_waiter_in_a_task_with_a_stale_cancel_count() -> None:
    bulkhead = BlockingBulkhead(1, queue_limit=1, label="stale")
    limiter = BlockingRateLimiter(1000, burst=1, label="stale")

    async def caller() -> None:
        await swallow_a_cancel()
        bulkhead.acquire()
        threading.Timer(0.02, bulkhead.release).start()
        bulkhead.acquire(timeout=5)  # waits for the timer thread's release, in the loop's thread
        bulkhead.release()
        limiter.acquire()
        limiter.acquire(timeout=5)  # waits ~1 ms on the system clock

    asyncio.run(caller())
    assert bulkhead.active_count == 0 and limiter.waiter_count == 0


async def test_a_swallowed_cancel_request_does_not_turn_a_hedge_into_a_cancelled_call(clock: VirtualClock) -> None:
    started: list[int] = []

    async def op(attempt: stoic.Attempt) -> int:
        started.append(attempt.number)
        if attempt.number == 1:
            await clock.sleep(0.2)
            raise ConnectionError("first fails while the hedge runs")
        await clock.sleep(0.3)
        return attempt.number

    policy = Hedge(0.1, label="stale", budget=RetryBudget.UNLIMITED)

    async def caller() -> int:
        await swallow_a_cancel()
        return await policy.execute(IDEMPOTENT, op)

    assert await clock.run(caller()) == 2  # the hedge's success, not a CancelledError
    assert started == [1, 2] and clock.now() == pytest.approx(0.4)


# ------------------------------------------------------------------ case 18: exception groups

async def test_a_hedged_attempt_failing_with_an_exception_group_is_an_ordinary_failure(clock: VirtualClock) -> None:
    async def op(attempt: stoic.Attempt) -> int:
        if attempt.number == 1:
            await clock.sleep(0.15)
            raise ExceptionGroup("fan-out", [ConnectionError("a")])
        await clock.sleep(0.1)
        return 2

    policy = Hedge(0.1, label="groups", budget=RetryBudget.UNLIMITED)
    assert await clock.run(policy.execute(IDEMPOTENT, op)) == 2


async def test_a_cancellation_group_from_an_attempt_is_that_attempts_failure(clock: VirtualClock) -> None:
    async def op(attempt: stoic.Attempt) -> int:
        if attempt.number == 1:
            await clock.sleep(0.15)
            raise BaseExceptionGroup("inner timeout", [asyncio.CancelledError()])
        await clock.sleep(0.1)
        return 2

    policy = Hedge(0.1, label="groups", budget=RetryBudget.UNLIMITED)
    assert await clock.run(policy.execute(IDEMPOTENT, op)) == 2


async def test_a_keyboard_interrupt_inside_a_group_stops_every_hedge(clock: VirtualClock) -> None:
    cancelled: list[int] = []

    async def op(attempt: stoic.Attempt) -> int:
        try:
            if attempt.number == 1:
                await clock.sleep(0.15)
                raise BaseExceptionGroup("fan-out", [ValueError("x"), KeyboardInterrupt()])
            await clock.sleep(10)
            return 2
        except asyncio.CancelledError:
            cancelled.append(attempt.number)
            raise

    policy = Hedge(0.1, label="groups", budget=RetryBudget.UNLIMITED)
    task = asyncio.ensure_future(policy.execute(IDEMPOTENT, op))
    await clock.advance(0.2)
    with pytest.raises(BaseExceptionGroup) as caught:
        await task
    assert any(isinstance(e, KeyboardInterrupt) for e in caught.value.exceptions)
    assert cancelled == [2]  # the hedge was stopped, not left to win 10 s later


async def test_a_deadline_ending_its_block_as_a_group_of_cancellations_is_deadline_exceeded(
    clock: VirtualClock,
) -> None:
    async def block() -> None:
        async with stoic.timeout(1, label="grouped"):
            try:
                await clock.sleep(5)
            except asyncio.CancelledError as exc:
                raise BaseExceptionGroup("children cancelled", [exc]) from None

    with pytest.raises(DeadlineExceeded) as caught:
        await clock.run(block())
    assert caught.value.label == "grouped" and clock.now() == 1.0


async def test_a_group_with_a_real_error_passes_through_a_fired_deadline(clock: VirtualClock) -> None:
    async def block() -> None:
        async with stoic.timeout(1):
            try:
                await clock.sleep(5)
            except asyncio.CancelledError as exc:
                raise BaseExceptionGroup("mixed", [exc, ConnectionError("child")]) from None

    with pytest.raises(BaseExceptionGroup) as caught:
        await clock.run(block())
    assert not isinstance(caught.value, DeadlineExceeded)
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0  # the deadline's request was taken back


# ------------------------------------------------------------------ case 20: admission after a wait

def _admitted(clock: object) -> tuple[object, int]:
    """The clock and instant of the latest wait this context recorded on ``clock``, or (None, -1)."""
    for at_clock, kept in _admission._waits.get():
        if at_clock is clock:
            return at_clock, kept[-1]
    return None, -1


async def test_the_asyncio_limiter_and_bulkhead_report_admission_only_after_a_wait(clock: VirtualClock) -> None:
    limiter = RateLimiter(1, burst=1, label="adm")
    bulkhead = Bulkhead(1, queue_limit=1, label="adm")
    seen: dict[str, tuple[object, int]] = {}

    async def through_limiter(name: str) -> None:
        await limiter.acquire()
        seen[name] = _admitted(clock)

    async def through_bulkhead(name: str, hold: float) -> None:
        async with bulkhead:
            seen[name] = _admitted(clock)
            await clock.sleep(hold)

    waits = _admission.state.waits
    await clock.run(through_limiter("immediate"))
    assert seen["immediate"] == (None, -1) and _admission.state.waits == waits
    await clock.advance(0.25)
    await clock.run(through_limiter("waited"))  # 0.75 s in the queue
    assert seen["waited"] == (clock, S)
    assert _admission.admitted_since(clock, 0) == 0  # (this test's own context saw nothing)
    first = asyncio.create_task(through_bulkhead("first", 2.0))
    second = asyncio.create_task(through_bulkhead("second", 0.0))
    await clock.run(asyncio.gather(first, second))
    assert seen["first"] == (None, -1)
    assert seen["second"] == (clock, 3 * S)  # admitted when the first left, at 3 s
    assert _admission.state.waits == waits + 2


def test_a_wait_that_encloses_an_inner_stages_wait_is_left_out_once() -> None:
    """A stage whose admission waited on another stage inside it (a shared limiter whose store
    failed, admitting through its local bucket after that bucket queued) records a wait that
    encloses the inner one: the breaker outside leaves the time out once, not twice."""
    import contextvars

    def run() -> tuple[int, int]:
        clock = VirtualClock()
        _admission.admitted_after_wait(clock, 5 * S, 2 * S)  # the local bucket: queued 2 s to 5 s
        _admission.admitted_after_wait(clock, 6 * S, 1 * S)  # the shared limiter: 1 s to 6 s
        enclosing = _admission.admitted_since(clock, 0)
        _admission.admitted_after_wait(clock, 9 * S, 8 * S)  # a later stage, queued 8 s to 9 s
        return enclosing, _admission.admitted_since(clock, 0)

    assert contextvars.copy_context().run(run) == (5 * S, 6 * S)


async def test_execute_reports_the_admission_instant_to_the_breaker_outside(clock: VirtualClock) -> None:
    limiter = RateLimiter(1, burst=1, label="adm")
    assert limiter.try_acquire()

    async def op() -> int:
        return _admission.admitted_since(clock, 0)

    assert await clock.run(limiter.execute(op)) == S  # admitted at 1 s, after waiting from 0


def test_the_blocking_limiter_and_bulkhead_report_admission_only_after_a_wait() -> None:
    clock = VirtualClock()
    limiter = BlockingRateLimiter(1, burst=1, label="adm", clock=clock)
    bulkhead = BlockingBulkhead(1, queue_limit=1, label="adm", clock=clock)
    seen: dict[str, tuple[object, int]] = {}

    limiter.acquire()
    bulkhead.acquire()
    assert _admitted(clock) == (None, -1)  # both immediate: nothing reported

    def limited() -> None:
        limiter.acquire()
        seen["limiter"] = _admitted(clock)

    def bulkheaded() -> None:
        bulkhead.acquire()
        seen["bulkhead"] = _admitted(clock)
        bulkhead.release()

    threads = [threading.Thread(target=limited), threading.Thread(target=bulkheaded)]
    for thread in threads:
        thread.start()
    eventually(lambda: limiter.waiter_count == 1 and bulkhead.queued_count == 1)
    asyncio.run(clock.advance(2.0))
    eventually(lambda: "limiter" in seen)
    bulkhead.release()
    for thread in threads:
        thread.join(5)
    assert seen["limiter"][0] is clock and seen["limiter"][1] >= S
    assert seen["bulkhead"] == (clock, 2 * S)


# ------------------------------------------------------------------ clocks

@pytest.mark.parametrize("make", [
    lambda clock: RateLimiter(1, label="x", clock=clock),
    lambda clock: BlockingRateLimiter(1, label="x", clock=clock),
    lambda clock: Bulkhead(1, label="x", clock=clock),
    lambda clock: BlockingBulkhead(1, label="x", clock=clock),
    lambda clock: Hedge(0.1, label="x", clock=clock),
    lambda clock: stoic.timeout(1, clock=clock),
    lambda clock: stoic.deadline(1.0, clock=clock),
])
@pytest.mark.parametrize("bad", [object(), "monotonic", 0, VirtualClock.now_ns])
def test_a_wrong_clock_is_a_type_error_naming_clock_at_construction(
    make: Callable[[object], object], bad: object
) -> None:
    with pytest.raises(TypeError, match=r"clock must be a stoic\.Clock"):
        make(bad)


async def test_a_full_bulkhead_on_a_good_clock_raises_bulkhead_full_with_a_sink_listening(sink: RecordingSink) -> None:
    bulkhead = Bulkhead(1, label="full", clock=VirtualClock())
    gate = asyncio.Event()
    held = asyncio.create_task(bulkhead.execute(gate.wait))
    await settle()
    with pytest.raises(BulkheadFull):
        await bulkhead.execute(asyncio.sleep, 0)
    assert sink.of("bulkhead.rejected")[0].attributes["reason"] == "bulkhead_full"
    gate.set()
    await held


async def test_a_policy_inside_a_deadline_on_another_clock_refuses_rather_than_mixing_them(sink: RecordingSink) -> None:
    virtual = VirtualClock()
    limiter = RateLimiter(1, burst=1, label="mixed", clock=virtual)
    bulkhead = Bulkhead(1, label="mixed", clock=virtual)
    policy = Hedge(0.1, label="mixed", clock=virtual)
    assert limiter.try_acquire()
    gate = asyncio.Event()
    held = asyncio.create_task(bulkhead.execute(gate.wait))
    await settle()

    async def op() -> int:
        return 1

    async with stoic.timeout(5):  # on the system clock
        with pytest.raises(ClockMismatch, match="cannot be compared"):
            await limiter.acquire()
        with pytest.raises(ClockMismatch):
            await bulkhead.execute(op)
        with pytest.raises(ClockMismatch):
            await policy.execute(IDEMPOTENT, op)
        with pytest.raises(ClockMismatch):
            BlockingRateLimiter(1, label="mixed", clock=virtual).acquire()
    assert limiter.waiter_count == 0 and bulkhead.queued_count == 0  # nothing queued or taken
    assert isinstance(ClockMismatch("x"), stoic.Defect)  # never counted, never retried
    gate.set()
    await held


async def test_the_ambient_deadline_is_read_on_the_asking_policys_clock(clock: VirtualClock) -> None:
    assert remaining_ns(clock) is None and deadline_ns(clock) is None
    async with stoic.timeout(5):
        await clock.advance(2)
        assert remaining_ns(clock) == 3 * S
        assert deadline_ns(clock) == 5 * S
        with pytest.raises(ClockMismatch):
            remaining_ns(VirtualClock())
        assert remaining_ns() == 3 * S  # without a clock: each deadline on its own, for reports
    # Two system clocks are one timeline.
    async with stoic.timeout(5, clock=stoic.SystemClock()):
        assert remaining_ns(stoic.SYSTEM_CLOCK) is not None


async def test_a_timeout_around_a_limiter_on_the_same_virtual_clock_refuses_a_wait_past_it(clock: VirtualClock) -> None:
    limiter = RateLimiter(1, per=2.0, burst=1, label="same")  # the ambient (virtual) clock
    assert limiter.try_acquire()
    async with stoic.timeout(1.5):
        with pytest.raises(stoic.RateLimited) as caught:
            await limiter.acquire()  # would be served at 2 s, after the deadline
    assert caught.value.retry_after == 2.0


# ------------------------------------------------------------------ labels

@pytest.mark.parametrize("cls", [RateLimiter, BlockingRateLimiter, Bulkhead, BlockingBulkhead])
def test_label_is_required_keyword_only_and_a_non_empty_str(cls: Callable[..., object]) -> None:
    with pytest.raises(TypeError, match="label"):
        cls(1)
    with pytest.raises(TypeError):
        cls(1, 1, 1, 1, "positional")
    with pytest.raises(TypeError, match="label must be a str"):
        cls(1, label=b"x")
    with pytest.raises(TypeError, match="label must be a str"):
        cls(1, label=None)
    with pytest.raises(ValueError, match="label must be a non-empty str"):
        cls(1, label="")


def test_a_timeouts_label_is_optional_but_checked() -> None:
    assert stoic.timeout(1)._label is None
    assert stoic.timeout(1, label="fetch")._label == "fetch"
    with pytest.raises(TypeError, match="label must be a str"):
        stoic.timeout(1, label=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="label must be a non-empty str"):
        stoic.deadline(1.0, label="")


# ------------------------------------------------------------------ huge numbers

@pytest.mark.parametrize("seconds", [10**300, 1e300, 10**13])
def test_a_huge_timeout_fails_at_construction_naming_the_parameter(seconds: float) -> None:
    with pytest.raises(ValueError, match="seconds must be at most 1e\\+12 seconds"):
        stoic.timeout(seconds)


@pytest.mark.parametrize("make", [
    lambda: RateLimiter(1, per=10**13, label="x"),
    lambda: Hedge(10**13, label="x"),
    lambda: BlockingBulkhead(1, label="x").acquire(timeout=10**13),
])
def test_every_duration_has_the_one_range(make: Callable[[], object]) -> None:
    with pytest.raises(ValueError, match="at most 1e\\+12 seconds"):
        make()


def test_a_blocking_bulkhead_waiter_with_a_huge_timeout_never_overflows() -> None:
    bulkhead = BlockingBulkhead(1, queue_limit=1, label="huge")
    bulkhead.acquire()
    errors: list[BaseException] = []

    def waiter() -> None:
        try:
            bulkhead.acquire(timeout=1e10)  # above threading.TIMEOUT_MAX
            bulkhead.release()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=waiter)
    thread.start()
    eventually(lambda: bulkhead.queued_count == 1)
    bulkhead.release()
    thread.join(5)
    assert errors == [] and bulkhead.active_count == 0


def test_queued_blocking_limiter_waiters_with_a_huge_timeout_never_overflow() -> None:
    clock = VirtualClock()
    limiter = BlockingRateLimiter(1, burst=1, queue_limit=None, label="huge", clock=clock)
    limiter.acquire()
    errors: list[BaseException] = []
    served: list[float] = []

    def waiter() -> None:
        try:
            limiter.acquire(timeout=1e10)
            served.append(clock.now())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=waiter) for _ in range(2)]
    for i, thread in enumerate(threads):
        thread.start()
        eventually(lambda n=i + 1: limiter.waiter_count == n)  # the second waits behind the head
    asyncio.run(clock.advance(1.0))
    eventually(lambda: len(served) == 1)
    asyncio.run(clock.advance(1.0))
    for thread in threads:
        thread.join(5)
    assert errors == [] and served == [1.0, 2.0]
