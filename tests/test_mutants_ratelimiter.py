"""Rate-limiter behaviour that mutation testing found unchecked (issue 9, item 5; docs/mutation.md).

Seed 000, "RateLimiter": an exact token bucket (``burst`` permits, full at creation, ``rate``
per ``per`` seconds), FIFO waiting decided before waiting (``retry_after`` = the computed wait),
no overtaking, a waiter that leaves consumes nothing. The asyncio and the blocking limiter are
driven through the same cases. Clocks start far from zero so that an instant and a duration
(the refill's ``now - stamp``) can never be confused.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
from _threads import InterruptingClock, eventually, process_wide

import stoic
from stoic import DeadlineExceeded, RateLimited
from stoic.events import Level
from stoic.ratelimiter import BlockingRateLimiter, RateLimiter
from stoic.testing import RecordingSink, VirtualClock

START = 1000.0


class JumpingClock(VirtualClock):
    """A virtual clock whose blocking sleeps move time to their end at once (single-threaded
    tests of the blocking limiter: the head "sleeps" exactly as long as the limiter asked)."""

    def __init__(self) -> None:
        super().__init__(START)
        self.slept_until: list[int] = []
        self.interrupt_sleeps = 0

    def sleep_until_blocking(self, when_ns: int) -> None:
        self.slept_until.append(when_ns)
        if self.interrupt_sleeps:
            self.interrupt_sleeps -= 1
            raise KeyboardInterrupt
        self._set_now(when_ns)

    def step(self, seconds: float) -> None:
        self._set_now(self.now_ns() + round(seconds * 1e9))


@pytest.fixture
def events() -> Iterator[RecordingSink]:
    """Process-wide and listening from DEBUG (``ratelimiter.waited`` is a debug event)."""
    yield from process_wide(RecordingSink(level=Level.DEBUG))


def named(sink: RecordingSink, name: str) -> list[dict[str, object]]:
    return [dict(e.attributes) for e in sink.events if e.name == name]


def drained_blocking(rate: int = 4, per: float = 1.0, burst: int = 2, **kwargs: object) -> tuple[
        BlockingRateLimiter, JumpingClock]:
    clock = JumpingClock()
    limiter = BlockingRateLimiter(rate, per, burst=burst, label="b", clock=clock, **kwargs)  # type: ignore[arg-type]
    assert limiter.try_acquire(burst)
    return limiter, clock


# --------------------------------------------------------------------------- the bucket itself

@pytest.mark.parametrize("kind", [RateLimiter, BlockingRateLimiter])
def test_the_bucket_refills_exactly_and_never_beyond_burst(kind: type[RateLimiter]) -> None:
    clock = JumpingClock()
    limiter = kind(4, per=2.0, burst=6, label="refill", clock=clock)  # 2 permits a second
    assert limiter.available_permits == 6
    assert limiter.try_acquire(6)
    assert limiter.available_permits == 0 and not limiter.try_acquire()
    clock.step(0.499999999)
    assert limiter.available_permits == 0 and not limiter.try_acquire()
    clock.step(0.000000001)  # 0.5 s: exactly one permit earned
    assert limiter.available_permits == 1
    assert not limiter.try_acquire(2)
    assert limiter.try_acquire(1)
    clock.step(1.25)  # 2.5 permits earned: two whole ones, half of one kept for later
    assert limiter.available_permits == 2
    assert limiter.try_acquire(2)
    clock.step(0.25)
    assert limiter.try_acquire()  # the kept half plus a quarter-second's half
    clock.step(3600)
    assert limiter.available_permits == 6  # an idle hour banks no more than burst
    assert limiter.try_acquire(6) and not limiter.try_acquire()
    assert (limiter.rate, limiter.per, limiter.burst) == (4, 2.0, 6)


@pytest.mark.parametrize("kind", [RateLimiter, BlockingRateLimiter])
def test_try_acquire_of_more_than_burst_is_refused_and_reported(kind: type[RateLimiter], events: RecordingSink) -> None:
    limiter = kind(5, burst=3, label="big", clock=JumpingClock())
    assert not limiter.try_acquire(4)
    assert limiter.try_acquire(3)  # the refused request took nothing
    assert [e.name for e in events.events] == ["ratelimiter.oversized"]
    with pytest.raises(ValueError, match="permits"):
        limiter.try_acquire(0)
    with pytest.raises(ValueError, match="permits"):
        limiter.try_acquire(True)


def test_repr_names_the_configuration() -> None:
    limiter = RateLimiter(5, per=2.0, burst=7, queue_limit=None, label="r", clock=JumpingClock())
    assert repr(limiter) == "RateLimiter(rate=5, per=2.0, burst=7, queue_limit=None, label='r')"
    assert limiter.queue_limit is None and limiter.label == "r"


# --------------------------------------------------------------------------- asyncio: execute and acquire

async def test_execute_grants_exactly_burst_plus_rate_times_elapsed_at_once() -> None:
    clock = JumpingClock()
    limiter = RateLimiter(4, per=1.0, burst=3, label="exec", clock=clock)
    ran: list[float] = []

    async def op() -> float:
        ran.append(clock.now())
        return clock.now()

    clock.step(100)  # idle: still only a full bucket
    for _ in range(3):
        await limiter.execute(op)
    assert ran == [START + 100] * 3 and limiter.available_permits == 0
    clock.step(0.249999999)
    pending = limiter.execute(op)  # one nanosecond short: this one has to queue...
    assert limiter.available_permits == 0
    assert await clock.run(pending) == START + 100.25  # ...and is served at the exact instant
    clock.step(0.25)
    granted = limiter.execute(op)  # exactly affordable: taken here, before anything is awaited
    assert limiter.available_permits == 0 and not limiter.try_acquire()
    await granted
    assert ran == [START + 100] * 3 + [START + 100.25, START + 100.5]


async def test_a_permit_taken_by_execute_is_spent_even_if_never_awaited() -> None:
    clock = JumpingClock()
    limiter = RateLimiter(1, burst=1, label="spent", clock=clock)

    async def op() -> None: ...

    coroutine = limiter.execute(op)
    coroutine.close()
    assert not limiter.try_acquire()
    clock.step(1.0)
    assert limiter.try_acquire()


async def test_acquire_waits_exactly_until_the_permits_are_earned(events: RecordingSink) -> None:
    clock = JumpingClock()
    limiter = RateLimiter(4, per=1.0, burst=2, label="wait", clock=clock)
    await limiter.acquire(2)
    clock.step(0.1)  # 0.4 of a permit banked
    await clock.run(limiter.acquire(2))
    assert clock.now() == pytest.approx(START + 0.5, abs=1e-9)  # 1.6 permits more at 4/s: 0.4 s
    assert limiter.available_permits == 0
    assert named(events, "ratelimiter.waited") == [{"permits": 2, "waited": pytest.approx(0.4, abs=1e-9)}]


async def test_retry_after_counts_the_credit_in_a_partly_filled_bucket(events: RecordingSink) -> None:
    clock = JumpingClock()
    limiter = RateLimiter(2, per=1.0, burst=4, queue_limit=0, label="partial", clock=clock)
    await limiter.acquire(4)
    clock.step(0.25)  # half a permit in the bucket
    with pytest.raises(RateLimited) as refused:
        await limiter.acquire(2)
    assert refused.value.retry_after == 0.75  # (2 - 0.5) permits at 2 a second
    assert refused.value.label == "partial"
    assert named(events, "ratelimiter.rejected") == [{"reason": "queue_full", "permits": 2, "retry_after": 0.75}]
    assert limiter.available_permits == 0 and limiter.waiter_count == 0
    clock.step(0.75)
    assert limiter.try_acquire(2)  # the refusal consumed nothing


async def test_retry_after_counts_everyone_queued_ahead() -> None:
    clock = JumpingClock()
    limiter = RateLimiter(2, per=1.0, burst=4, queue_limit=1, label="ahead", clock=clock)
    await limiter.acquire(4)
    clock.step(0.25)
    head = asyncio.create_task(limiter.acquire(3))
    await asyncio.sleep(0)
    assert limiter.waiter_count == 1
    with pytest.raises(RateLimited) as refused:
        await limiter.acquire(1)
    assert refused.value.retry_after == 1.75  # (3 + 1 - 0.5) permits at 2 a second
    await clock.run(head)
    assert clock.now() == START + 1.5


async def test_a_wait_that_would_reach_the_deadline_is_refused_at_once(events: RecordingSink) -> None:
    clock = JumpingClock()
    limiter = RateLimiter(2, per=1.0, burst=4, label="deadline", clock=clock)
    await limiter.acquire(4)
    clock.step(0.25)
    async with stoic.timeout(0.75, clock=clock):
        with pytest.raises(RateLimited) as refused:
            await limiter.acquire(2)  # served at exactly the deadline: too late
    assert refused.value.retry_after == 0.75
    async with stoic.timeout(0.7500001, clock=clock):
        await clock.run(limiter.acquire(2))  # served just before it
    assert clock.now() == START + 1.0
    assert named(events, "ratelimiter.rejected") == [
        {"reason": "would_exceed_deadline", "permits": 2, "retry_after": 0.75}]


async def test_an_expired_deadline_is_refused_even_with_permits_in_the_bucket(events: RecordingSink) -> None:
    clock = JumpingClock()
    limiter = RateLimiter(2, burst=4, label="late", clock=clock)
    async with stoic.timeout(0, clock=clock):
        with pytest.raises(DeadlineExceeded):
            await limiter.acquire()
    async with stoic.timeout(1e-9, clock=clock):  # one nanosecond left: in time
        await limiter.acquire()
        await limiter.execute(asyncio.sleep, 0)
    assert limiter.available_permits == 2
    assert named(events, "ratelimiter.rejected") == [{"reason": "deadline_exceeded", "permits": 1}]


async def test_a_cancelled_waiter_leaves_without_consuming_and_the_next_is_served_earlier() -> None:
    clock = JumpingClock()
    limiter = RateLimiter(1, per=1.0, burst=2, queue_limit=None, label="cancel", clock=clock)
    await limiter.acquire(2)
    served: list[tuple[str, float]] = []

    async def take(name: str, permits: int) -> None:
        await limiter.acquire(permits)
        served.append((name, clock.now()))

    head = asyncio.create_task(take("head", 2))
    await asyncio.sleep(0)
    second = asyncio.create_task(take("second", 1))
    await asyncio.sleep(0)
    assert limiter.waiter_count == 2
    head.cancel()
    await asyncio.sleep(0)
    assert limiter.waiter_count == 1
    await clock.run(second)
    assert served == [("second", START + 1.0)]
    assert limiter.waiter_count == 0 and limiter.available_permits == 0


async def test_the_context_manager_and_decorator_take_one_permit_each() -> None:
    clock = JumpingClock()
    limiter = RateLimiter(2, burst=2, label="forms", clock=clock)

    @limiter
    async def op(x: int) -> int:
        return 2 * x

    async with limiter as entered:
        assert entered is limiter
    assert await op(3) == 6
    assert not limiter.try_acquire()
    with pytest.raises(TypeError, match="BlockingRateLimiter"):
        limiter(lambda: None)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- blocking: the same cases

def test_a_blocking_acquire_sleeps_exactly_until_the_permits_are_earned(events: RecordingSink) -> None:
    limiter, clock = drained_blocking(rate=4, burst=2)
    clock.step(0.1)
    limiter.acquire(2)
    assert clock.slept_until == [round((START + 0.5) * 1e9)]
    assert limiter.available_permits == 0 and limiter.waiter_count == 0
    assert named(events, "ratelimiter.waited") == [{"permits": 2, "waited": pytest.approx(0.4, abs=1e-9)}]
    limiter.acquire(1)  # the next waits for its own permit only
    assert clock.now() == START + 0.75


def test_a_blocking_wait_of_exactly_the_timeout_is_admitted_and_one_beyond_it_refused(
    events: RecordingSink,
) -> None:
    limiter, clock = drained_blocking(rate=2, burst=4)
    clock.step(0.25)
    with pytest.raises(RateLimited) as refused:
        limiter.acquire(2, timeout=0.7499)
    assert refused.value.retry_after == 0.75
    assert limiter.waiter_count == 0 and clock.slept_until == []
    limiter.acquire(2, timeout=0.75)
    assert clock.now() == START + 1.0
    assert named(events, "ratelimiter.rejected") == [
        {"reason": "would_exceed_deadline", "permits": 2, "retry_after": 0.75}]


def test_a_blocking_retry_after_counts_the_credit_and_the_queue_ahead(events: RecordingSink) -> None:
    limiter, clock = drained_blocking(rate=2, burst=4, queue_limit=0)
    clock.step(0.25)
    with pytest.raises(RateLimited) as refused:
        limiter.acquire(2)
    assert refused.value.retry_after == 0.75
    assert named(events, "ratelimiter.rejected") == [{"reason": "queue_full", "permits": 2, "retry_after": 0.75}]
    clock.step(0.75)
    assert limiter.try_acquire(2)


def test_a_blocking_acquire_under_a_live_deadline_waits_and_under_an_expired_one_is_refused(
    events: RecordingSink,
) -> None:
    limiter, clock = drained_blocking(rate=2, burst=4)
    clock.step(0.25)

    async def under(seconds: float, permits: int) -> None:
        async with stoic.timeout(seconds, clock=clock):
            limiter.acquire(permits)

    with pytest.raises(RateLimited):
        asyncio.run(under(0.75, 2))  # served exactly at the deadline: refused before waiting
    assert clock.slept_until == []
    asyncio.run(under(0.7500001, 2))  # served just inside it
    assert clock.now() == START + 1.0
    with pytest.raises(DeadlineExceeded):
        asyncio.run(under(0, 1))
    clock.step(10)
    with pytest.raises(DeadlineExceeded):
        asyncio.run(under(0, 1))  # even with a full bucket
    asyncio.run(under(1e-9, 1))  # one nanosecond left is still in time
    assert limiter.available_permits == 3
    assert [r["reason"] for r in named(events, "ratelimiter.rejected")] == [
        "would_exceed_deadline", "deadline_exceeded", "deadline_exceeded"]


def test_an_interrupted_blocking_head_leaves_the_queue_without_consuming(events: RecordingSink) -> None:
    limiter, clock = drained_blocking(rate=4, burst=2)
    clock.interrupt_sleeps = 1
    with pytest.raises(KeyboardInterrupt):
        limiter.acquire(1)
    assert limiter.waiter_count == 0
    clock.step(0.25)
    assert limiter.available_permits == 1  # what it waited for is still there
    limiter.acquire(2)  # and the queue is not held up by the waiter that left
    assert clock.now() == START + 0.5
    # Reported as a cancelled asyncio waiter is (it left the queue unserved).
    assert named(events, "ratelimiter.rejected") == [{"reason": "cancelled", "permits": 1}]


def test_a_blocking_call_takes_a_permit_or_waits_for_one() -> None:
    limiter, clock = drained_blocking(rate=4, burst=2)
    assert limiter.call(lambda a, b: a + b, 1, b=2) == 3  # type: ignore[misc]
    assert clock.now() == START + 0.25
    clock.step(0.25)
    assert limiter.call(lambda: clock.now()) == START + 0.5  # affordable at once: no sleep
    assert clock.slept_until == [round((START + 0.25) * 1e9)]

    @limiter
    def double(x: int) -> int:
        return 2 * x

    assert double(4) == 8 and clock.now() == START + 0.75
    with limiter as entered:
        assert entered is limiter
    assert clock.now() == START + 1.0


def test_a_blocking_call_under_a_live_deadline_still_takes_its_permit() -> None:
    limiter, clock = drained_blocking(rate=4, burst=2)
    clock.step(0.25)

    async def main() -> int:
        async with stoic.timeout(5, clock=clock):
            return limiter.call(lambda: 7)

    assert asyncio.run(main()) == 7
    assert limiter.available_permits == 0 and clock.slept_until == []


class Taker(threading.Thread):
    def __init__(self, limiter: BlockingRateLimiter, clock: VirtualClock, permits: int,
                 timeout: float | None = None) -> None:
        super().__init__(daemon=True)
        self.limiter, self.clock, self.permits, self.timeout = limiter, clock, permits, timeout
        self.served_at: float | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.limiter.acquire(self.permits, timeout=self.timeout)
            self.served_at = self.clock.now()
        except BaseException as exc:
            self.error = exc




def test_an_interrupted_blocking_waiter_behind_the_head_leaves_the_queue() -> None:
    clock = InterruptingClock(START)
    limiter = BlockingRateLimiter(100, per=1.0, burst=1, queue_limit=None, label="behind", clock=clock)
    assert limiter.try_acquire()
    head = Taker(limiter, clock, 1)  # served at 10 ms
    head.start()
    eventually(lambda: limiter.waiter_count == 1)
    middle = Taker(limiter, clock, 1, timeout=5.0)  # at 20 ms; rechecks the clock every 5 real seconds
    middle.start()
    eventually(lambda: limiter.waiter_count == 2)
    last = Taker(limiter, clock, 1, timeout=0.05)  # at 30 ms, within its timeout; rechecks every 50 ms
    last.start()
    eventually(lambda: limiter.waiter_count == 3)
    clock.interrupted.add(last)
    last.join(5)
    assert isinstance(last.error, KeyboardInterrupt)
    assert limiter.waiter_count == 2
    clock.step(0.01)
    head.join(5)
    assert head.served_at == START + 0.01
    clock.step(0.01)
    middle.join(5)
    assert middle.served_at == START + 0.02
    assert limiter.waiter_count == 0 and limiter.available_permits == 0
    clock.step(0.01)
    assert limiter.try_acquire()  # the permit the interrupted waiter would have had is there


def test_an_interrupted_blocking_head_hands_its_turn_and_credit_to_the_next() -> None:
    clock = InterruptingClock(START)
    limiter = BlockingRateLimiter(10, per=1.0, burst=1, queue_limit=None, label="give-up", clock=clock)
    assert limiter.try_acquire()

    head = Taker(limiter, clock, 1)
    head.start()
    eventually(lambda: limiter.waiter_count == 1)
    behind = Taker(limiter, clock, 1, timeout=0.25)  # admitted: it would be served at 0.2 s
    behind.start()
    eventually(lambda: limiter.waiter_count == 2)
    clock.interrupted.add(head)  # interrupted when it wakes: the next becomes head, with its credit
    clock.step(0.1)
    head.join(5)
    assert isinstance(head.error, KeyboardInterrupt)
    behind.join(5)
    assert behind.error is None and behind.served_at == START + 0.1
    assert limiter.waiter_count == 0 and limiter.available_permits == 0


async def test_execute_adds_what_was_earned_to_a_partly_filled_bucket() -> None:
    clock = JumpingClock()
    limiter = RateLimiter(4, per=1.0, burst=1, label="partial-exec", clock=clock)

    async def op() -> float:
        return clock.now()

    assert await limiter.execute(op) == START
    clock.step(0.125)  # half a permit
    assert limiter.available_permits == 0
    waiting = limiter.execute(op)  # not affordable: queued (its refill banks the half)
    waiting.close()
    clock.step(0.125)  # the other half
    granted = limiter.execute(op)
    assert limiter.available_permits == 0 and not limiter.try_acquire()  # taken at once
    assert await granted == START + 0.25


async def test_an_exactly_affordable_acquire_under_a_deadline_is_granted_without_waiting(
    events: RecordingSink,
) -> None:
    clock = JumpingClock()
    limiter = RateLimiter(4, per=1.0, burst=1, label="exact-slow", clock=clock)
    await limiter.acquire()
    clock.step(0.25)
    async with stoic.timeout(5, clock=clock):
        await limiter.acquire()  # the deadline takes it off the fast path; no queue, no wait
    assert limiter.waiter_count == 0 and limiter.available_permits == 0
    assert named(events, "ratelimiter.waited") == []


def test_a_blocking_acquire_after_its_deadline_passed_is_refused_even_with_a_full_bucket(
    events: RecordingSink,
) -> None:
    clock = JumpingClock()
    limiter = BlockingRateLimiter(4, burst=4, label="passed", clock=clock)

    async def late() -> None:
        async with stoic.timeout(1, clock=clock):
            clock.step(2)  # the deadline passed a second ago (no timer fires on this clock)
            limiter.acquire()

    with pytest.raises(DeadlineExceeded):
        asyncio.run(late())
    assert limiter.available_permits == 4
    assert named(events, "ratelimiter.rejected") == [{"reason": "deadline_exceeded", "permits": 1}]


def test_a_blocking_wait_longer_than_the_deadline_is_refused_with_retry_after(events: RecordingSink) -> None:
    limiter, clock = drained_blocking(rate=2, burst=4)
    clock.step(0.25)

    async def under(seconds: float) -> None:
        async with stoic.timeout(seconds, clock=clock):
            limiter.acquire(2)

    with pytest.raises(RateLimited) as refused:
        asyncio.run(under(0.5))  # the wait (0.75 s) is longer than what is left
    assert refused.value.retry_after == 0.75
    assert limiter.waiter_count == 0 and clock.slept_until == []
    assert named(events, "ratelimiter.rejected") == [
        {"reason": "would_exceed_deadline", "permits": 2, "retry_after": 0.75}]


def test_a_blocking_call_refills_a_partly_filled_bucket_exactly_and_never_beyond_burst() -> None:
    limiter, clock = drained_blocking(rate=4, burst=2)
    clock.step(0.125)
    assert not limiter.try_acquire()  # half a permit, banked by this refill
    clock.step(0.125)
    assert limiter.call(clock.now) == START + 0.25  # the other half: taken at once, no sleep
    assert clock.slept_until == []
    clock.step(3600)
    assert [limiter.call(clock.now) for _ in range(3)] == [START + 3600.25] * 2 + [START + 3600.5]


@pytest.mark.parametrize("kind", [RateLimiter, BlockingRateLimiter])
async def test_a_bucket_one_nanosecond_short_of_full_is_not_full(kind: type[RateLimiter | BlockingRateLimiter]) -> None:
    # The refill takes a shortcut when the time since the last refill has earned the whole
    # deficit back; one unit short (the nanosecond before) must still be counted exactly.
    clock = VirtualClock(START)
    limiter = kind(1, per=1.0, burst=2, label="edge", clock=clock)
    assert limiter.try_acquire()  # the bucket is one permit short: earned back in exactly 1 s
    await clock.advance(0.999_999_999)
    assert not limiter.try_acquire(2)
    assert limiter.available_permits == 1
    await clock.advance(0.000_000_001)
    assert limiter.try_acquire(2)
    assert limiter.available_permits == 0


# --------------------------------------------------------------------------- the current source's draw

@pytest.mark.parametrize("kind", [RateLimiter, BlockingRateLimiter])
def test_retry_after_is_the_ceiling_of_the_missing_units_at_the_rate(kind: type[RateLimiter]) -> None:
    # 3 a second: each nanosecond earns 3 units of the 10**9 one permit costs, so a permit
    # missing entirely takes ceil(10**9 / 3) ns, and one missing a single unit takes 1 ns.
    clock = VirtualClock(START)
    limiter = kind(3, burst=1, queue_limit=0, label="ceil", clock=clock)
    assert limiter.try_acquire()
    with pytest.raises(RateLimited) as refused:
        asyncio.run(limiter.acquire()) if kind is RateLimiter else limiter.acquire()  # type: ignore[func-returns-value]
    assert refused.value.retry_after == 0.333333334
    clock._set_now(clock.now_ns() + 333_333_333)  # 999_999_999 units earned: one missing
    with pytest.raises(RateLimited) as refused:
        asyncio.run(limiter.acquire()) if kind is RateLimiter else limiter.acquire()  # type: ignore[func-returns-value]
    assert refused.value.retry_after == 1e-9


async def test_retry_after_is_zero_when_the_credit_covers_everyone_queued_but_the_queue_is_full() -> None:
    # The head has not run since its permits were earned (the clock jumped without firing its
    # timer): the bucket covers it and the newcomer, but the queue is full.
    clock = VirtualClock(START)
    limiter = RateLimiter(3, burst=3, queue_limit=1, label="covered", clock=clock)
    await limiter.acquire(3)
    head = asyncio.create_task(limiter.acquire())
    await asyncio.sleep(0)
    assert limiter.waiter_count == 1
    clock._set_now(clock.now_ns() + 5_000_000_000)
    with pytest.raises(RateLimited) as refused:
        await limiter.acquire()
    assert refused.value.retry_after == 0.0
    await clock.advance(0)
    await asyncio.wait_for(head, 1)


@pytest.mark.parametrize("taken", [1, 3])
def test_a_retuned_rate_keeps_the_permits_in_the_bucket_in_the_new_units(taken: int) -> None:
    # 2 a second costs 5 * 10**8 units a permit, 3 a second 10**9: the credit is converted.
    clock = VirtualClock(START)
    limiter = RateLimiter(2, burst=4, label="retuned", clock=clock)
    for _ in range(taken):
        assert limiter.try_acquire()
    limiter._retune(rate=3)
    assert (limiter.rate, limiter.burst, limiter.available_permits) == (3, 4, 4 - taken)
    clock._set_now(clock.now_ns() + 333_333_334)  # one permit at the new rate
    assert limiter.available_permits == min(4, 5 - taken)
