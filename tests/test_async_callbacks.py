"""A predicate stoic calls while deciding about an error (``record_when``, ``classify``,
``is_failure``) is called, never awaited: an async one's coroutine read as true on every call
(every error a failure, every error retried) and warned "never awaited". Each is refused at
construction with a TypeError naming the parameter (seen accepted before)."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import Any

import pytest

import stoic
from stoic import AdaptiveThrottle, CircuitBreaker, Retrying, Schedule, retrying
from stoic._policy import is_async_callable


async def async_predicate(error: object) -> bool:
    return False


class AsyncCallable:
    async def __call__(self, error: object) -> bool:
        return False


CALLBACKS = [async_predicate, AsyncCallable()]


@pytest.mark.parametrize("callback", CALLBACKS, ids=["coroutine-function", "async-callable-object"])
@pytest.mark.parametrize(("name", "build"), [
    ("record_when", lambda cb: CircuitBreaker(label="b", record_when=cb)),
    ("classify", lambda cb: Retrying(Schedule.fixed(0).attempts(2), label="r", classify=cb)),
    ("classify", lambda cb: retrying(Schedule.fixed(0).attempts(2), label="r", classify=cb)),
    ("classify", lambda cb: AdaptiveThrottle(label="t", classify=cb)),
    ("classify", lambda cb: stoic.RetryClassifier(cb)),
])
def test_an_async_predicate_is_refused_at_construction(
    callback: object, name: str, build: Callable[[object], Any],
) -> None:
    with pytest.raises(TypeError, match=rf"^{name} must be a plain function"):
        build(callback)


@pytest.mark.parametrize("callback", CALLBACKS, ids=["coroutine-function", "async-callable-object"])
async def test_retry_refuses_an_async_classify_before_the_first_attempt(callback: object) -> None:
    calls = 0

    async def op() -> str:
        nonlocal calls
        calls += 1
        return "ok"

    with pytest.raises(TypeError, match=r"^classify must be a plain function"):
        await stoic.retry(Schedule.fixed(0).attempts(2), op, label="r", classify=callback)  # type: ignore[arg-type]
    assert calls == 0


@pytest.mark.parametrize("callback", CALLBACKS, ids=["coroutine-function", "async-callable-object"])
def test_the_http_policies_refuse_an_async_is_failure(callback: object) -> None:
    from stoic.httpx import AsyncResilientTransport

    with pytest.raises(TypeError, match=r"^is_failure must be a plain function"):
        AsyncResilientTransport(is_failure=callback)  # type: ignore[arg-type]


def test_the_shared_breaker_refuses_an_async_record_when() -> None:
    from stoic.fleet import RedisStore, SharedCircuitBreaker

    store = RedisStore("redis://127.0.0.1:1")  # (never contacted: construction only)
    with pytest.raises(TypeError, match=r"^record_when must be a plain function"):
        SharedCircuitBreaker(label="b", store=store, record_when=AsyncCallable())  # type: ignore[arg-type]


def test_plain_predicates_are_still_accepted() -> None:
    lam = lambda error: True  # noqa: E731
    assert not is_async_callable(lam)
    assert not is_async_callable(len)
    CircuitBreaker(label="b", record_when=lam)
    Retrying(Schedule.fixed(0).attempts(2), label="r", classify=lam)


@pytest.mark.skipif(sys.version_info < (3, 12), reason="inspect.markcoroutinefunction is 3.12+")
def test_a_function_marked_as_a_coroutine_function_is_async() -> None:
    def marked(error: object) -> object:
        return async_predicate(error)

    inspect.markcoroutinefunction(marked)  # type: ignore[attr-defined]
    assert is_async_callable(marked)
