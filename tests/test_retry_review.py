"""Hostile review of the predicates stoic calls while deciding (retry's classifier, a breaker's
record_when, an HTTP client's is_failure): what a user's function can hand back."""

from __future__ import annotations

import gc
import warnings

import pytest

from stoic import CircuitBreaker, CircuitOpen, RetryBudget, Schedule, retry
from stoic._http import HTTPPolicies
from stoic.testing import RecordingSink, VirtualClock


async def is_transient(error: BaseException) -> bool:
    return False  # an async predicate: "never retry this"


async def test_a_classifier_handing_back_an_async_predicates_coroutine_is_a_failed_classifier(
    clock: VirtualClock, sink: RecordingSink,
) -> None:
    # An async classifier is refused at the call (stoic._policy.refuse_async_callback), but a
    # plain lambda around one hands back its coroutine: always true, it retried every error
    # (five attempts of a permanent one) and left a "never awaited" warning per failure. It is
    # the classifier failing: one attempt, the operation's own error, the failure chained.
    attempts = 0

    async def op() -> None:
        nonlocal attempts
        attempts += 1
        raise ValueError("permanent")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match="permanent") as raised:
            await clock.run(retry(Schedule.fixed(0.1).attempts(5), op, classify=lambda e: is_transient(e),
                                  budget=RetryBudget.UNLIMITED, label="r"))
        gc.collect()
    assert attempts == 1
    assert isinstance(raised.value.__context__, TypeError)
    assert "plain function" in str(raised.value.__context__)
    assert not [w for w in caught if "never awaited" in str(w.message)]
    assert sink.names == ["retry.permanent"]


async def never_a_failure(error: object) -> bool:
    return False


async def test_a_record_when_handing_back_a_coroutine_is_reported_not_silently_true(clock: VirtualClock) -> None:
    # The same kind of fault in the breaker: the coroutine read as "counts" on every call,
    # silently, with a "never awaited" warning per failure. It is now the broken record_when it
    # is (reported once; the call judged conservatively, as for one that raises).
    breaker = CircuitBreaker(label="b", record_when=lambda e: never_a_failure(e), minimum_calls=2, clock=clock)

    async def op() -> None:
        raise ValueError

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            with pytest.raises((ValueError, CircuitOpen)):
                await breaker.execute(op)
        gc.collect()
    assert not [w for w in caught if "never awaited" in str(w.message)]
    assert len([w for w in caught if "record_when" in str(w.message)]) == 1


def test_an_is_failure_handing_back_a_coroutine_falls_back_to_the_default_rule() -> None:
    # An HTTP client's is_failure around an async predicate made every response a failure,
    # a 200 included; now the default rule (5xx) decides, the broken callback reported once.
    policies: HTTPPolicies[object] = HTTPPolicies(is_failure=lambda status: never_a_failure(status))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert policies._failed(200, object()) is False
        assert policies._failed(503, object()) is True
        gc.collect()
    assert not [w for w in caught if "never awaited" in str(w.message)]
