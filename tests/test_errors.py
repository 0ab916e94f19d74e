"""Rejections carry reason, retry_after and label; defects are recognised through chains and groups."""

from __future__ import annotations

import pytest

from stoic import (
    BudgetExhausted,
    BulkheadFull,
    CircuitOpen,
    DeadlineExceeded,
    Defect,
    RateLimited,
    Rejected,
    RejectionReason,
    is_defect,
)


@pytest.mark.parametrize(
    ("cls", "reason"),
    [
        (CircuitOpen, RejectionReason.CIRCUIT_OPEN),
        (RateLimited, RejectionReason.RATE_LIMITED),
        (BulkheadFull, RejectionReason.BULKHEAD_FULL),
        (BudgetExhausted, RejectionReason.BUDGET_EXHAUSTED),
        (DeadlineExceeded, RejectionReason.DEADLINE_EXCEEDED),
    ],
)
def test_each_rejection_has_its_reason_label_and_retry_after(cls, reason):
    error = cls(label="payments", retry_after=1.5)
    assert isinstance(error, Rejected)
    assert error.reason is reason and str(error.reason) == reason.value
    assert error.label == "payments" and error.retry_after == 1.5
    assert str(error) == f"{reason.value} (payments); retry after 1.500s"
    assert str(cls()) == reason.value
    assert str(cls("custom message")) == "custom message"
    assert cls().retry_after is None and cls().label is None


def test_deadline_exceeded_is_also_a_timeout_error():
    with pytest.raises(TimeoutError):
        raise DeadlineExceeded(label="x")
    assert not isinstance(CircuitOpen(), TimeoutError)


class MyBug(Defect):
    pass


def _raise_from(outer: BaseException, inner: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as caught:
            raise outer from caught
    except BaseException as final:
        return final


def test_defects_are_recognised_directly_and_through_explicit_causes():
    assert is_defect(Defect()) and is_defect(MyBug())
    assert not is_defect(ValueError())
    assert is_defect(_raise_from(RuntimeError("wrapper"), MyBug()))
    deep = _raise_from(KeyError(), _raise_from(ValueError(), Defect()))
    assert is_defect(deep)


def test_an_implicit_context_is_not_a_cause():
    try:
        try:
            raise Defect()
        except Defect:
            raise ValueError("raised while handling, not caused by") from None
    except ValueError as error:
        assert error.__context__ is not None
        assert not is_defect(error)
    try:
        try:
            raise Defect()
        except Defect:
            raise ValueError("implicit context only")  # noqa: B904 - the point of the test
    except ValueError as error:
        assert isinstance(error.__context__, Defect) and error.__cause__ is None
        assert not is_defect(error)


def test_defects_inside_exception_groups_nested_or_caused():
    assert is_defect(ExceptionGroup("g", [ValueError(), MyBug()]))
    assert is_defect(ExceptionGroup("g", [ValueError(), ExceptionGroup("inner", [Defect()])]))
    assert is_defect(ExceptionGroup("g", [_raise_from(OSError(), Defect())]))
    assert not is_defect(ExceptionGroup("g", [ValueError(), KeyError()]))
    assert is_defect(_raise_from(RuntimeError(), ExceptionGroup("g", [Defect()])))


def test_a_cyclic_cause_chain_terminates():
    a, b = ValueError("a"), KeyError("b")
    a.__cause__ = b
    b.__cause__ = a
    assert not is_defect(a)
