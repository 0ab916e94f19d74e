"""Adversarial review of the rate limiter: each test names a behaviour a defect once broke."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import stoic
from stoic import RateLimited
from stoic.ratelimiter import BlockingRateLimiter, RateLimiter
from stoic.testing import VirtualClock, settle


@pytest.mark.parametrize("bad", [1.0, True])
async def test_permits_equal_to_one_but_not_an_int_are_a_value_error(bad: object) -> None:
    # 1.0 and True compare equal to 1; accepting them turned the integer credit into a float.
    clock = VirtualClock()
    for limiter in (RateLimiter(5, label="x", clock=clock), BlockingRateLimiter(5, label="x", clock=clock)):
        with pytest.raises(ValueError, match="permits"):
            await limiter.acquire(bad) if isinstance(limiter, RateLimiter) else limiter.acquire(bad)  # type: ignore[arg-type, func-returns-value]
        with pytest.raises(ValueError, match="permits"):
            limiter.try_acquire(bad)  # type: ignore[arg-type]
        assert limiter.available_permits == 5
        assert type(limiter._deficit) is int


def test_try_acquire_is_not_blocked_by_a_head_abandoned_on_a_closed_loop() -> None:
    clock = VirtualClock()
    limiter = RateLimiter(1, per=10.0, burst=2, label="abandoned", clock=clock)
    assert limiter.try_acquire()  # one permit left: a request for two must queue
    old_loop = asyncio.new_event_loop()

    async def abandon() -> asyncio.Task[None]:
        task = asyncio.create_task(limiter.acquire(2))
        await settle()
        return task

    abandoned = old_loop.run_until_complete(abandon())
    old_loop.close()  # closed without cancelling its task: the head will never resume
    assert limiter.waiter_count == 1

    async def later() -> bool:
        return limiter.try_acquire()

    # The one permit in the bucket is nobody's: a live newcomer may take it.
    assert asyncio.run(later()) is True
    assert limiter.waiter_count == 0
    abandoned._log_destroy_pending = False  # type: ignore[attr-defined]
    abandoned.get_coro().close()  # type: ignore[union-attr]


@settings(max_examples=150, deadline=None)
@example(rate=1, per_ms=1000, burst=1, steps=[("try", 1, 0), ("acquire", 1, -1)])
@example(rate=3, per_ms=700, burst=2, steps=[("acquire", 2, 0), ("acquire", 1, -1), ("acquire", 2, -3)])
@given(
    rate=st.integers(1, 7),
    per_ms=st.sampled_from([1, 333, 700, 1000, 3000]),
    burst=st.integers(1, 4),
    steps=st.lists(
        st.one_of(
            # a negative deadline -k stands for the instant k permits are earned: the boundary
            st.tuples(st.just("acquire"), st.integers(1, 4), st.integers(-8, 5_000_000_000)),
            st.tuples(st.just("try"), st.integers(1, 4), st.just(0)),
            st.tuples(st.just("advance"), st.just(0), st.integers(0, 1_500_000_000)),
        ),
        min_size=1,
        max_size=60,
    ),
)
def test_a_waiter_queued_under_a_deadline_is_never_cut_by_it(
    rate: int, per_ms: int, burst: int, steps: list[tuple[str, int, int]]
) -> None:
    """Deciding before waiting is a promise: a request the limiter queues under a deadline is
    served before that deadline (when nobody cancels), and every refusal comes at once."""

    async def scenario() -> None:
        clock = VirtualClock()
        limiter = RateLimiter(rate, per=per_ms / 1000, burst=burst, queue_limit=None, label="d", clock=clock)
        outcomes: list[str] = []

        async def waiter(permits: int, deadline_ns: int) -> None:
            started = clock.now_ns()
            try:
                async with stoic.timeout(deadline_ns / 1e9, clock=clock):
                    await limiter.acquire(min(permits, burst))
                outcomes.append("served")
            except RateLimited:
                assert clock.now_ns() == started  # refused before waiting
                outcomes.append("refused")
            except stoic.DeadlineExceeded:
                # Only a deadline already passed on arrival may end this way.
                assert deadline_ns == 0 and clock.now_ns() == started
                outcomes.append("late")

        tasks: list[asyncio.Task[None]] = []
        for kind, permits, value in steps:
            if kind == "acquire":
                deadline_ns = value if value >= 0 else -(value * per_ms * 1_000_000 // rate)
                tasks.append(asyncio.create_task(waiter(permits, deadline_ns)))
                await settle()
            elif kind == "try":
                limiter.try_acquire(min(permits, burst))
            else:
                await clock.advance(value / 1e9)
        await clock.run_until_idle()
        await asyncio.gather(*tasks)
        assert len(outcomes) == len(tasks)
        assert limiter.waiter_count == 0

    asyncio.run(scenario())


@pytest.mark.parametrize("blocking", [False, True])
async def test_retry_after_is_the_deficit_on_a_bucket_that_is_not_empty(blocking: bool) -> None:
    # 1 permit left of 4 at 2 per second: 3 permits are 2 short, 1 s away (not 1.5 s, the cost of 3).
    clock = VirtualClock()
    cls = BlockingRateLimiter if blocking else RateLimiter
    limiter = cls(2, per=1.0, burst=4, queue_limit=0, label="deficit", clock=clock)
    assert limiter.try_acquire(3)
    await clock.advance(0.25)  # and half a permit earned since: 1.5 left, 0.75 s to go
    with pytest.raises(RateLimited) as caught:
        if isinstance(limiter, RateLimiter):
            await limiter.acquire(3)
        else:
            limiter.acquire(3)
    assert caught.value.retry_after == 0.75
    assert limiter.available_permits == 1  # refused: nothing consumed
    # A deadline shorter than the deficit refuses with the same retry_after.
    limiter2 = cls(2, per=1.0, burst=4, queue_limit=None, label="deficit", clock=clock)
    assert limiter2.try_acquire(3)
    with pytest.raises(RateLimited) as caught:
        if isinstance(limiter2, RateLimiter):
            async with stoic.timeout(0.5, clock=clock):
                await limiter2.acquire(3)
        else:
            limiter2.acquire(3, timeout=0.5)
    assert caught.value.retry_after == 1.0


class _AdvancingClock(VirtualClock):
    """Virtual time for a blocking wait in the loop's own thread: a sleep moves time to its end."""

    def sleep_until_blocking(self, when_ns: int) -> None:
        self._set_now(when_ns)


@pytest.mark.parametrize("blocking", [False, True])
@pytest.mark.parametrize(("deadline_ns", "served"), [
    (1_000_000_000, False),  # served exactly at the deadline: too late, refused up front
    (1_000_000_001, True),   # a nanosecond of margin: admitted, and served before the deadline
    (0, None),               # already passed: DeadlineExceeded before anything
])
async def test_both_limiters_decide_at_the_deadline_boundary(blocking: bool, deadline_ns: int,
                                                             served: bool | None) -> None:
    clock = _AdvancingClock()
    limiter: RateLimiter | BlockingRateLimiter = (BlockingRateLimiter if blocking else RateLimiter)(
        1, per=1.0, burst=1, queue_limit=None, label="edge", clock=clock)
    assert limiter.try_acquire()

    async def take() -> None:
        if isinstance(limiter, RateLimiter):
            await limiter.acquire()
        else:
            limiter.acquire()

    async def scenario() -> str:
        try:
            async with stoic.timeout(deadline_ns / 1e9, clock=clock):
                await take()
        except RateLimited as exc:
            assert exc.retry_after == 1.0 and clock.now_ns() == 0
            return "refused"
        except stoic.DeadlineExceeded:
            assert clock.now_ns() == 0
            return "late"
        assert clock.now_ns() == 1_000_000_000
        return "served"

    outcome = await clock.run(scenario())
    assert outcome == {True: "served", False: "refused", None: "late"}[served]
    assert limiter.waiter_count == 0
    if not served:
        await clock.advance(1.0)
        assert limiter.available_permits == 1  # the refused request consumed nothing
    else:
        assert limiter.available_permits == 0


@pytest.mark.parametrize("deadline_s", [0.0, 5.0])
async def test_the_blocking_bulkhead_refuses_only_an_already_passed_deadline(deadline_s: float) -> None:
    from stoic import BlockingBulkhead

    clock = VirtualClock()
    bulkhead = BlockingBulkhead(1, label="edge", clock=clock)

    async def scenario() -> str:
        try:
            async with stoic.timeout(deadline_s, clock=clock):
                bulkhead.acquire()
                bulkhead.release()
        except stoic.DeadlineExceeded:
            return "late"
        return "ran"

    assert await clock.run(scenario()) == ("late" if deadline_s == 0 else "ran")
    assert bulkhead.active_count == 0
