"""Shared fixtures: a virtual clock made ambient, a recording sink that enforces the catalog,
and fresh retry budgets for every test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import stoic
from stoic.testing import RecordingSink, VirtualClock, reset_budgets


@pytest.fixture(autouse=True)
def _fresh_budgets() -> Iterator[None]:
    reset_budgets()
    yield
    reset_budgets()


@pytest.fixture
def clock() -> Iterator[VirtualClock]:
    """A VirtualClock installed as the ambient clock for the test."""
    virtual = VirtualClock()
    with stoic.use_clock(virtual):
        yield virtual


@pytest.fixture
def sink() -> Iterator[RecordingSink]:
    """Records every event (debug included) during the test; fails it on any catalog violation."""
    recording = RecordingSink()
    with stoic.use_sinks(recording):
        yield recording
    recording.assert_contract()


class JumpingClock(VirtualClock):
    """A VirtualClock whose blocking sleeps move time at once (for single-threaded sync tests)."""

    def sleep_until_blocking(self, when_ns: int) -> None:
        self._set_now(when_ns)


@pytest.fixture
def jumping_clock() -> Iterator[JumpingClock]:
    """A JumpingClock installed as the ambient clock for the test."""
    virtual = JumpingClock()
    with stoic.use_clock(virtual):
        yield virtual
