"""Shared fixtures: a virtual clock made ambient, a recording sink that enforces the catalog.

Fresh retry budgets for every test come from stoic's own pytest plugin
(src/stoic/testing/_plugin.py, the ``stoic`` pytest11 entry point), as in any user's suite."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import settings

import stoic
from stoic.testing import RecordingSink, VirtualClock

# Hypothesis is reproducible under CI: the same examples on every run (derandomized, so a
# failure there fails again on the next run), with no example database to carry between runs.
# Rare paths are pinned with @example on the tests themselves. Locally it explores at random.
# No per-example deadline in either profile (the properties are about values, not speed): a
# single example stalled past Hypothesis's default 200 ms by a loaded machine (a GC pause, a
# busy core) would fail its test as "unreliable timings", a red run by chance alone.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True, deadline=None)
settings.register_profile("dev", print_blob=True, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") == "true" else "dev"))


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


@pytest.fixture
def metrics_on() -> Iterator[None]:
    """Metrics aggregation on for the test (as an exporter turns it on), as found afterwards."""
    from stoic import _metrics

    before = _metrics.state.enabled
    _metrics.enable()
    yield
    _metrics.state.enabled = before


@pytest.fixture(autouse=True)
def _metrics_as_found() -> Iterator[None]:
    """Metrics aggregation is process-wide and, in a service, only ever turned on: a test that
    attaches an exporter turns it back off afterwards, so the next test sees the default."""
    from stoic import _metrics

    before = _metrics.state.enabled
    yield
    _metrics.state.enabled = before


@pytest.fixture(autouse=True)
def _no_admission_mark() -> Iterator[None]:
    """A blocking stage's recorded waits live in the main thread's context, which every later
    test's context copies: start each test without any (stoic._admission)."""
    from stoic import _admission

    token = _admission._waits.set(())
    yield
    _admission._waits.reset(token)


if os.environ.get("STOIC_EAGER_TASKS"):  # (3.12+) every test's loop starts tasks eagerly
    import asyncio
    from collections.abc import Callable, Mapping

    def _eager_loop() -> asyncio.AbstractEventLoop:
        loop = asyncio.new_event_loop()
        loop.set_task_factory(asyncio.eager_task_factory)  # type: ignore[attr-defined,unused-ignore]
        return loop

    def pytest_asyncio_loop_factories(
        config: pytest.Config, item: pytest.Item,
    ) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
        """pytest-asyncio's hook: the loops this test runs in (one, eager)."""
        return {"eager": _eager_loop}
