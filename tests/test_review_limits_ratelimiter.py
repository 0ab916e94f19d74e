"""Adversarial review of the rate limiter: each test names a behaviour a defect once broke."""

from __future__ import annotations

import pytest

from stoic.ratelimiter import BlockingRateLimiter, RateLimiter
from stoic.testing import VirtualClock


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
