"""The public surface read as a user reads it: every config-like object has a repr that names
its type and settings (as the policies', the instrumentation sinks' and the windows' do), not
``<... object at 0x...>``, which is also what a refused sink's error message printed."""

from __future__ import annotations

import logging

import pytest

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


def _policies() -> list[object]:
    import stoic.fleet

    store = stoic.fleet.RedisStore("redis://127.0.0.1:1/0")  # (never reached: nothing is called)
    return [
        stoic.CircuitBreaker(label="p"), stoic.RateLimiter(5, label="p"), stoic.BlockingRateLimiter(5, label="p"),
        stoic.Bulkhead(2, label="p"), stoic.BlockingBulkhead(2, label="p"),
        stoic.AdaptiveBulkhead(latency_threshold=0.1, max_concurrent=4, label="p"),
        stoic.GradientBulkhead(max_concurrent=4, label="p"), stoic.Hedge(0.1, label="p"),
        stoic.AdaptiveThrottle(label="p"), stoic.Retrying(stoic.Schedule.fixed(1).attempts(2), label="p"),
        stoic.Keyed(stoic.CircuitBreaker, label="p"),
        stoic.fleet.SharedCircuitBreaker(label="p", store=store),
        stoic.fleet.SharedRateLimiter(5, label="p", store=store),
    ]


def test_every_policys_label_is_read_only() -> None:
    # The breakers' and the hedge's label was a plain attribute: writing it moved the events to
    # the new label while the metrics (and a ControlPlane registration) kept the old one. Every
    # other policy's label is a read-only property.
    for policy in _policies():
        with pytest.raises(AttributeError):
            policy.label = "renamed"  # type: ignore[attr-defined]
        assert policy.label == "p", policy  # type: ignore[attr-defined]


def test_the_hedges_and_the_throttles_settings_are_read_only() -> None:
    # They were plain attributes: Hedge.quantile/window, from which the estimate is built at
    # construction, changed nothing but the repr; max_attempts, k, min_throughput and
    # max_probability took effect unchecked (max_probability = 5 shed every call). Their one
    # way to change is ControlPlane.retune, which validates.
    hedge = stoic.Hedge(0.05, quantile=0.95, window=200, max_attempts=3, label="h")
    throttle = stoic.AdaptiveThrottle(k=2.5, min_throughput=7, max_probability=0.8, label="t")
    for policy, settings in ((hedge, {"max_attempts": 3, "quantile": 0.95, "window": 200}),
                             (throttle, {"k": 2.5, "min_throughput": 7, "max_probability": 0.8})):
        shown = repr(policy)
        for name, value in settings.items():
            with pytest.raises(AttributeError):
                setattr(policy, name, 5)
            assert getattr(policy, name) == value
        assert repr(policy) == shown
    control = stoic.ControlPlane()
    control.register(hedge)
    control.register(throttle)
    control.retune("h", max_attempts=4)
    control.retune("t", max_probability=0.5)
    assert hedge.max_attempts == 4 and throttle.max_probability == 0.5
