"""with_fallback: the substitute when every policy failed; outermost only (seed 002)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from stoic import Defect, Pipeline, Retrying, Schedule, with_fallback
from stoic.testing import VirtualClock, fail_times, fail_with, hang, settle


class Direct:
    async def execute(self, fn: Callable[..., Awaitable[Any]], /, *args: Any, **kwargs: Any) -> Any:
        return await fn(*args, **kwargs)


async def test_success_returns_the_result_and_never_calls_the_fallback() -> None:
    called: list[Exception] = []

    async def op(x: int) -> int:
        return x

    assert await with_fallback(Direct(), op, 5, fallback=lambda e: called.append(e) or -1, label="fallback") == 5
    assert called == []


async def test_a_failure_returns_the_fallback_sync_or_async() -> None:
    op = fail_with(ConnectionError("down"))
    seen: list[Exception] = []

    def cached(error: Exception) -> str:
        seen.append(error)
        return "cached"

    async def cached_async(error: Exception) -> str:
        return "cached-async"

    assert await with_fallback(Direct(), op, fallback=cached, label="fallback") == "cached"
    assert seen == [op.raised[0]]
    assert await with_fallback(Direct(), op, fallback=cached_async, label="fallback") == "cached-async"


async def test_after_the_retries_are_spent(clock: VirtualClock) -> None:
    op = fail_with(ConnectionError())
    pipeline = Pipeline(Retrying(Schedule.fixed(1).attempts(3), label="op"))
    assert await clock.run(with_fallback(pipeline, op, fallback=lambda e: [], label="fallback")) == []
    assert op.calls == 3  # outermost: the retry saw every failure


async def test_should_handle_decides() -> None:
    op = fail_with(ValueError("bad input"))
    with pytest.raises(ValueError):
        await with_fallback(Direct(), op, fallback=lambda e: 0, should_handle=lambda e: not isinstance(e, ValueError),
                label="fallback")
    assert await with_fallback(Direct(), fail_with(KeyError()), fallback=lambda e: 0,
                               should_handle=lambda e: isinstance(e, KeyError), label="fallback") == 0


async def test_a_defect_is_not_handled_by_default_but_can_be() -> None:
    op = fail_with(Defect("bug"))
    with pytest.raises(Defect):
        await with_fallback(Direct(), op, fallback=lambda e: 0, label="fallback")
    assert await with_fallback(Direct(), op, fallback=lambda e: 0, should_handle=lambda e: True, label="fallback") == 0


async def test_cancellation_is_never_handled(clock: VirtualClock) -> None:
    called: list[Exception] = []
    task = asyncio.ensure_future(with_fallback(Direct(), hang(), fallback=lambda e: called.append(e), label="fallback"))
    await settle()
    task.cancel()
    await settle()
    assert task.cancelled()
    assert called == []


async def test_base_exceptions_pass_through() -> None:
    op = fail_with(asyncio.CancelledError())
    with pytest.raises(asyncio.CancelledError):
        await with_fallback(Direct(), op, fallback=lambda e: 0, label="fallback")


async def test_an_error_in_the_fallback_propagates_chained_to_the_original() -> None:
    op = fail_with(ConnectionError())

    def broken(error: Exception) -> int:
        raise RuntimeError("cache empty")

    with pytest.raises(RuntimeError) as caught:
        await with_fallback(Direct(), op, fallback=broken, label="fallback")
    assert isinstance(caught.value.__context__, ConnectionError)


async def test_arguments_are_forwarded() -> None:
    async def op(a: int, *, b: int) -> int:
        return a - b

    assert await with_fallback(Direct(), op, 10, b=3, fallback=lambda e: 0, label="fallback") == 7
    op2 = fail_times(0, then="x")
    assert await with_fallback(Direct(), op2, fallback=lambda e: "y", label="fallback") == "x"
