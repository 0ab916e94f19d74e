"""stoic's pytest plugin: isolation between tests and two fixtures (docs/retry.md, "Testing").

Installed with stoic as the ``pytest11`` entry point ``stoic``, so pytest loads it in any test
suite where stoic is installed (``-p no:stoic`` turns it off). It provides:

- an autouse fixture that calls :func:`stoic.testing.reset_budgets` before and after every
  test: per-call-site and named retry budgets live for the process, so without it one test's
  spent tokens, and the clock a budget was created on (a test's ``VirtualClock``), would carry
  into the next test that reaches the same call site;
- ``virtual_clock``: a :class:`stoic.testing.VirtualClock` installed as the ambient clock for
  the test (``stoic.use_clock``), so policies built in the test run on virtual time;
- ``recording_sink``: a :class:`stoic.testing.RecordingSink` receiving every event of the test
  (debug included), which fails the test on any event-catalog violation.

Imported only by pytest: stoic itself never imports pytest.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .._budget import reset_budgets
from .._clock import use_clock
from ..events import use_sinks
from ._clock import VirtualClock
from ._recording import RecordingSink


@pytest.fixture(autouse=True)
def _stoic_fresh_budgets() -> Iterator[None]:
    """Forget every retry budget before and after each test (see the module docstring)."""
    reset_budgets()
    yield
    reset_budgets()


@pytest.fixture
def virtual_clock() -> Iterator[VirtualClock]:
    """A :class:`VirtualClock` (at 0 s) installed as the ambient clock for the test."""
    clock = VirtualClock()
    with use_clock(clock):
        yield clock


@pytest.fixture
def recording_sink() -> Iterator[RecordingSink]:
    """Records every event (debug included) during the test; fails it on any catalog violation."""
    sink = RecordingSink()
    with use_sinks(sink):
        yield sink
    sink.assert_contract()
