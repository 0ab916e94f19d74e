"""Misuse is stoic's own ``await`` failing on what a plain operation returned; an ``await`` on
something not awaitable deeper in (the operation's code, a library's) is the operation failing,
a ``TypeError`` like any other: counted, retried and handed to fallbacks as the classifiers say.

Seen failing before the fix (stoic._errors.failed_await looked only at the instruction, in any
frame): retry made 1 attempt of 3, the breaker and the throttle counted nothing (the breaker
emitted breaker.defect), and with_fallback re-raised instead of substituting.
"""

from __future__ import annotations

from typing import Any

import pytest

from stoic import (
    AdaptiveThrottle,
    CircuitBreaker,
    CountWindow,
    Pipeline,
    Retrying,
    Schedule,
    retry,
    retrying,
    with_fallback,
)
from stoic._errors import failed_await
from stoic.testing import RecordingSink, VirtualClock


def _plain_hook() -> None:
    return None


class Library:
    """A dependency's client with a bug on one path: it awaits a plain hook's None."""

    def __init__(self) -> None:
        self.calls = 0

    async def fetch(self) -> str:
        self.calls += 1
        await _plain_hook()  # type: ignore[func-returns-value]
        return "never"


async def test_the_deep_type_error_is_not_a_failed_await_of_stoics() -> None:
    library = Library()
    with pytest.raises(TypeError, match="can't be used in 'await' expression") as caught:
        await library.fetch()
    assert not failed_await(caught.value)


@pytest.mark.parametrize("form", ["retry", "lambda", "execute", "decorator"])
async def test_a_retry_retries_it_when_its_classifier_says_so(form: str, clock: VirtualClock) -> None:
    library = Library()
    schedule = Schedule.fixed(1).attempts(3)
    options: dict[str, Any] = {"label": "op", "classify": TypeError, "clock": clock}
    if form == "retry":
        call = retry(schedule, library.fetch, **options)
    elif form == "lambda":
        call = retry(schedule, lambda: library.fetch(), **options)
    elif form == "execute":
        call = Retrying(schedule, **options).execute(library.fetch)
    else:
        call = retrying(schedule, **options)(library.fetch)()
    with pytest.raises(TypeError):
        await clock.run(call)
    assert library.calls == 3


async def test_the_breaker_counts_it_as_the_dependencys_failure(sink: RecordingSink) -> None:
    breaker = CircuitBreaker(label="b", window=CountWindow(10), minimum_calls=3)
    library = Library()
    for _ in range(3):
        with pytest.raises(TypeError):
            await breaker.execute(library.fetch)
    snapshot = breaker.snapshot
    assert (snapshot.calls, snapshot.failures) == (3, 3)
    assert sink.of("breaker.defect") == []


async def test_the_throttle_counts_it(clock: VirtualClock) -> None:
    # (The default classifier: not an overload, so each is a request the dependency accepted.)
    throttle = AdaptiveThrottle(label="t", clock=clock, min_throughput=0)
    library = Library()
    for _ in range(5):
        with pytest.raises(TypeError):
            await throttle.execute(library.fetch)
    assert (throttle.requests, throttle.accepts) == (5, 5)


@pytest.mark.parametrize("handle_all", [False, True], ids=["default", "should_handle-all"])
async def test_a_fallback_substitutes_for_it(handle_all: bool, clock: VirtualClock) -> None:
    policy = Pipeline(CircuitBreaker(label="b2", clock=clock), Retrying(Schedule.fixed(0).attempts(2), label="op"))
    library = Library()
    got = await with_fallback(policy, library.fetch, fallback=lambda error: "cached",
                              should_handle=(lambda error: True) if handle_all else None, label="fallback")
    assert got == "cached"


async def test_a_policy_of_the_callers_still_surfaces_a_plain_operations_value() -> None:
    # (The await that fails is the caller's policy's own, straight inside with_fallback.)
    class Direct:
        async def execute(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            return await fn(*args, **kwargs)

    with pytest.raises(TypeError):
        await with_fallback(Direct(), lambda: 42, fallback=lambda error: "cached", label="fallback")
    library = Library()
    assert await with_fallback(Direct(), library.fetch, fallback=lambda error: "cached", label="fallback") == "cached"
