"""The public surface read as a user reads it: every config-like object has a repr that names
its type and settings (as the policies', the instrumentation sinks' and the windows' do), not
``<... object at 0x...>``, which is also what a refused sink's error message printed."""

from __future__ import annotations

import logging

import stoic
from stoic.testing import RecordingSink, VirtualClock


def test_the_sinks_and_a_deadline_have_reprs_naming_their_settings() -> None:
    assert repr(stoic.LoggingSink()) == "LoggingSink(logger='stoic', level=INFO)"
    assert repr(stoic.LoggingSink(logging.getLogger("app.db"), stoic.Level.DEBUG)) == \
        "LoggingSink(logger='app.db', level=DEBUG)"
    sink = RecordingSink(stoic.Level.INFO)
    assert repr(sink) == "RecordingSink(level=INFO, strict=True, events=0)"
    with stoic.use_sinks(sink):
        stoic.CircuitBreaker(label="b").force_open()
    assert repr(sink) == "RecordingSink(level=INFO, strict=True, events=1)"
    clock = VirtualClock(2.0)
    assert repr(stoic.timeout(1.5, clock=clock, label="db")) == \
        "Timeout(deadline=3.5, label='db', clock=VirtualClock(now=2.000000000s, pending=0))"
    assert repr(stoic.deadline(7, clock=clock)) == \
        "Timeout(deadline=7.0, label=None, clock=VirtualClock(now=2.000000000s, pending=0))"


def test_a_refused_sink_is_named_by_its_repr() -> None:
    sink = stoic.LoggingSink(level="debug")  # type: ignore[arg-type]
    try:
        with stoic.use_sinks(sink):
            pass
    except TypeError as error:
        assert "LoggingSink(logger='stoic', level='debug')" in str(error)
    else:
        raise AssertionError("a sink with a str level was installed")
