"""What the sync paths refuse and what the async paths await, whatever form the operation takes."""

from __future__ import annotations

import asyncio
import types
import warnings
from collections.abc import Awaitable, Callable, Generator
from typing import Any

import pytest

import stoic


async def _work() -> int:
    return 1


def _awaitables() -> list[tuple[str, Callable[[], Awaitable[int]]]]:
    breaker = stoic.CircuitBreaker(label="inner")
    schedule = stoic.Schedule.fixed(0.0).attempts(2)
    return [
        ("coroutine", _work),
        ("breaker.execute", lambda: breaker.execute(_work)),
        ("@breaker async", breaker(_work)),
        ("retry", lambda: stoic.retry(schedule, _work, label="op")),
        ("Retrying.execute", lambda: stoic.Retrying(schedule, label="op").execute(_work)),
    ]


def _sync_paths() -> list[tuple[str, Callable[[Callable[[], object]], object]]]:
    breaker = stoic.CircuitBreaker(label="outer")
    schedule = stoic.Schedule.fixed(0.0).attempts(2)
    retrying = stoic.Retrying(schedule, label="op")
    return [
        ("breaker.call", lambda op: breaker.call(op)),
        ("@breaker sync", lambda op: breaker(lambda: op())()),
        ("retry_sync", lambda op: stoic.retry_sync(schedule, op, label="op")),
        ("Retrying.call", lambda op: retrying.call(op)),
        ("@retrying sync", lambda op: stoic.retrying(schedule, label="op")(lambda: op())()),
    ]


@pytest.mark.parametrize("path", _sync_paths(), ids=lambda p: p[0])
@pytest.mark.parametrize("awaitable", _awaitables(), ids=lambda a: a[0])
def test_sync_paths_refuse_any_awaitable_a_plain_operation_returns(
    path: tuple[str, Callable[[Callable[[], object]], object]],
    awaitable: tuple[str, Callable[[], Awaitable[int]]],
) -> None:
    made: list[Awaitable[int]] = []

    def op() -> object:
        made.append(awaitable[1]())
        return made[-1]

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the refused awaitable is closed, never left to warn
        with pytest.raises(TypeError, match="returned a coroutine"):
            path[1](op)
    assert len(made) == 1  # refused at once: never retried
    assert all(type(m) is types.CoroutineType for m in made)


# --- every async path awaits what an operation returns as `await` would -----------------------
# A generator-based coroutine (@types.coroutine) is awaitable without __await__.

@types.coroutine
def _generator_based() -> Generator[Any, None, int]:
    yield from asyncio.sleep(0).__await__()
    return 7


@pytest.mark.parametrize(
    "run",
    [
        lambda: stoic.retry(stoic.Schedule.fixed(0.0).attempts(2), _generator_based, label="op"),
        lambda: stoic.Retrying(stoic.Schedule.fixed(0.0).attempts(2), label="op").execute(_generator_based),
        lambda: stoic.CircuitBreaker(label="generator-based").execute(_generator_based),
    ],
    ids=["retry", "Retrying.execute", "breaker.execute"],
)
async def test_async_paths_await_a_generator_based_coroutine(run: Callable[[], Awaitable[int]]) -> None:
    assert await run() == 7
