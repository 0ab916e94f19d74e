"""The compiled fast paths are built and in use, unless STOIC_PURE_PYTHON asked for pure Python.

CI builds them on a machine with a C compiler: a build that silently fell back to pure Python
must fail here rather than pass while testing only one of the two implementations.
"""

from __future__ import annotations

import asyncio
import types
import warnings
from collections.abc import Awaitable, Callable, Generator
from typing import Any

import pytest

import stoic
from stoic import _native

MODULES = ["stoic._cbreaker", "stoic._cretry"]


@pytest.mark.parametrize("name", MODULES)
def test_compiled_module_is_loaded_unless_pure_python_is_asked_for(name: str) -> None:
    module = _native.load(name)
    if _native.PURE_PYTHON:
        assert module is None
    else:
        assert module is not None, f"{name} was not built: is a C compiler installed?"


# --- every sync path refuses every kind of awaitable a plain operation may return -----------
# In the compiled mode breaker.execute() and retry() return awaitables of their own types rather
# than coroutines; a sync path handed one must refuse it exactly as it refuses a coroutine.

async def _work() -> int:
    return 1


def _awaitables() -> list[tuple[str, Callable[[], Awaitable[int]]]]:
    breaker = stoic.CircuitBreaker("inner")
    schedule = stoic.Schedule.fixed(0.0).attempts(2)
    return [
        ("coroutine", _work),
        ("breaker.execute", lambda: breaker.execute(_work)),
        ("@breaker async", breaker(_work)),
        ("retry", lambda: stoic.retry(schedule, _work)),
        ("Retrying.execute", lambda: stoic.Retrying(schedule).execute(_work)),
    ]


def _sync_paths() -> list[tuple[str, Callable[[Callable[[], object]], object]]]:
    breaker = stoic.CircuitBreaker("outer")
    schedule = stoic.Schedule.fixed(0.0).attempts(2)
    retrying = stoic.Retrying(schedule)
    return [
        ("breaker.call", lambda op: breaker.call(op)),
        ("@breaker sync", lambda op: breaker(lambda: op())()),
        ("retry_sync", lambda op: stoic.retry_sync(schedule, op)),
        ("Retrying.call", lambda op: retrying.call(op)),
        ("@retrying sync", lambda op: stoic.retrying(schedule)(lambda: op())()),
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
    assert all(type(m) in _native.ASYNC_RESULTS for m in made)


# --- every async path awaits what an operation returns as `await` would -----------------------
# A generator-based coroutine (@types.coroutine) is awaitable without __await__: the compiled
# retry awaitable once refused it with TypeError where the Python coroutine awaited it.

@types.coroutine
def _generator_based() -> Generator[Any, None, int]:
    yield from asyncio.sleep(0).__await__()
    return 7


@pytest.mark.parametrize(
    "run",
    [
        lambda: stoic.retry(stoic.Schedule.fixed(0.0).attempts(2), _generator_based),
        lambda: stoic.Retrying(stoic.Schedule.fixed(0.0).attempts(2)).execute(_generator_based),
        lambda: stoic.CircuitBreaker("generator-based").execute(_generator_based),
    ],
    ids=["retry", "Retrying.execute", "breaker.execute"],
)
async def test_async_paths_await_a_generator_based_coroutine(run: Callable[[], Awaitable[int]]) -> None:
    assert await run() == 7
