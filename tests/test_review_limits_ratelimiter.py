"""Adversarial review of the rate limiter: each test names a behaviour a defect once broke."""

from __future__ import annotations

import asyncio

import pytest

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
        assert type(limiter._credit) is int


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
