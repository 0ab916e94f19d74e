"""Hostile review of retry's classifiers: what a user's classifier can hand back."""

from __future__ import annotations

import gc
import warnings

import pytest

from stoic import RetryBudget, Schedule, retry
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
