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


def _async_decorators() -> list[tuple[str, Callable[[], Any]]]:
    from stoic.fleet import RedisStore, SharedCircuitBreaker, SharedRateLimiter

    store = RedisStore("redis://127.0.0.1:1/0")  # never reached: only the decorators are built
    return [
        ("breaker", lambda: stoic.CircuitBreaker(label="d-breaker")),
        ("retrying", lambda: stoic.retrying(stoic.Schedule.fixed(0.01).attempts(2), label="d-retry")),
        ("ratelimiter", lambda: stoic.RateLimiter(100, label="d-limiter")),
        ("bulkhead", lambda: stoic.Bulkhead(2, label="d-bulkhead")),
        ("throttle", lambda: stoic.AdaptiveThrottle(label="d-throttle")),
        ("pipeline", lambda: stoic.Pipeline(stoic.Bulkhead(2, label="d-stage"))),
        ("shared breaker", lambda: SharedCircuitBreaker(label="d-shared", store=store)),
        ("shared limiter", lambda: SharedRateLimiter(100, store=store, label="d-shared-limiter")),
    ]


@pytest.mark.parametrize(("name", "make"), _async_decorators(), ids=[n for n, _ in _async_decorators()])
def test_every_async_decorator_takes_static_and_class_methods_and_async_callable_objects(
        name: str, make: Callable[[], Any]) -> None:
    # Written above @staticmethod/@classmethod, a decorator decorates the function inside and
    # keeps the descriptor; an object whose __call__ is async is an async operation. (Before:
    # the breaker took both for plain functions and refused every call's coroutine; the others
    # refused them at decoration.)
    class Lookup:
        async def __call__(self, x: int) -> int:
            return x + 1

    class Service:
        @make()
        @staticmethod
        async def fetch(x: int) -> int:
            return x * 2

        @make()
        @classmethod
        async def build(cls, x: int) -> tuple[type, int]:
            return cls, x

    assert isinstance(Service.__dict__["fetch"], staticmethod)
    assert isinstance(Service.__dict__["build"], classmethod)
    lookup = make()(Lookup())
    if name.startswith("shared"):
        return  # (running them needs a Redis: tests/integration; the decorators are what changed)

    async def run() -> None:
        assert await Service.fetch(2) == 4 and await Service().fetch(3) == 6
        assert await Service().build(5) == (Service, 5)
        assert await lookup(1) == 2

    asyncio.run(run())


@pytest.mark.parametrize(("name", "make"), [
    ("breaker", lambda: stoic.CircuitBreaker(label="s-breaker")),
    ("retrying", lambda: stoic.retrying(stoic.Schedule.fixed(0.01).attempts(2), label="s-retry")),
    ("blocking limiter", lambda: stoic.BlockingRateLimiter(100, label="s-limiter")),
    ("blocking bulkhead", lambda: stoic.BlockingBulkhead(2, label="s-bulkhead")),
], ids=["breaker", "retrying", "blocking limiter", "blocking bulkhead"])
def test_every_plain_decorator_takes_static_and_class_methods(name: str, make: Callable[[], Any]) -> None:
    class Service:
        @make()
        @staticmethod
        def read(x: int) -> int:
            return x * 2

        @make()
        @classmethod
        def build(cls, x: int) -> tuple[type, int]:
            return cls, x

    assert Service.read(2) == 4 and Service().read(3) == 6
    assert Service().build(5) == (Service, 5)
    if name.startswith("blocking"):
        class Lookup:
            async def __call__(self) -> int:
                return 1

        with pytest.raises(TypeError, match="plain functions"):
            make()(Lookup())  # an async callable object is refused by a blocking policy, as a coroutine function is
