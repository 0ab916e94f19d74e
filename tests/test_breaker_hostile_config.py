"""Every breaker constructor fuzzed with hostile values (issue 9, "What a hostile caller found"):
each is refused at construction with a ValueError/TypeError naming the parameter, or accepted
and then works."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from stoic import CircuitBreaker, CountWindow, OpenDuration, TimeWindow

HOSTILE = st.one_of(
    st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 1, True, False, None, b"1", "1", 10**30, 1e300, -0.0, math.nan, math.inf,
                     timedelta(days=10**8), timedelta(seconds=-1), object(), lambda: None]),
)

_PARAMETERS = ["minimum_calls", "failure_rate_threshold", "slow_call_duration", "slow_call_rate_threshold",
               "half_open_probes", "half_open_timeout", "window", "open_duration", "record_when", "clock", "label"]


def _accepted_or_named(build: Any, name: str) -> object | None:
    try:
        return build()
    except (ValueError, TypeError) as error:
        assert name.split()[0] in str(error), f"{error!r} does not name {name!r}"
        return None


@settings(max_examples=300, deadline=None, derandomize=True)
@given(parameter=st.sampled_from(_PARAMETERS), value=HOSTILE)
@example(parameter="slow_call_duration", value=10**400)
@example(parameter="half_open_timeout", value=timedelta(days=10**8))
@example(parameter="label", value="")
@example(parameter="clock", value=object())
def test_a_hostile_breaker_parameter_is_named_or_works(parameter: str, value: object) -> None:
    breaker = _accepted_or_named(lambda: CircuitBreaker(**{"label": "fuzz", parameter: value}), parameter)
    if breaker is not None:
        assert isinstance(breaker, CircuitBreaker)
        try:
            breaker.call(lambda: 1)
        except TypeError:
            # An accepted clock-like object whose now_ns is not really a clock: only a clock is
            # taken on trust (it is checked for now_ns, not run at construction).
            assert parameter == "clock"
        else:
            assert breaker.snapshot.calls >= 0


@settings(max_examples=300, deadline=None, derandomize=True)
@given(which=st.sampled_from(["TimeWindow", "CountWindow", "fixed", "fixed jitter", "initial", "maximum",
                              "factor", "jitter", "reset_after"]), value=HOSTILE)
@example(which="fixed", value=10**400)
@example(which="CountWindow", value=10**30)
def test_a_hostile_window_or_open_duration_is_named_or_works(which: str, value: Any) -> None:
    builds = {
        "TimeWindow": (lambda: TimeWindow(value), "TimeWindow seconds"),
        "CountWindow": (lambda: CountWindow(value), "CountWindow calls"),
        "fixed": (lambda: OpenDuration.fixed(value), "open_duration seconds"),
        "fixed jitter": (lambda: OpenDuration.fixed(1.0, jitter=value), "jitter"),
        "initial": (lambda: OpenDuration.exponential(initial=value, maximum=10**9), "initial"),
        "maximum": (lambda: OpenDuration.exponential(initial=1e-9, maximum=value), "maximum"),
        "factor": (lambda: OpenDuration.exponential(factor=value), "factor"),
        "jitter": (lambda: OpenDuration.exponential(jitter=value), "jitter"),
        "reset_after": (lambda: OpenDuration.exponential(reset_after=value), "reset_after"),
    }
    build, name = builds[which]
    built = _accepted_or_named(build, name)
    if built is None:
        return
    kwargs: dict[str, Any] = {"label": "fuzz"}
    if isinstance(built, OpenDuration):
        kwargs.update(open_duration=built, window=CountWindow(1), minimum_calls=1)
    else:
        kwargs["window"] = built
        kwargs["minimum_calls"] = 1
    breaker = CircuitBreaker(**kwargs)

    def boom() -> None:
        raise ConnectionError("down")

    with pytest.raises(ConnectionError):
        breaker.call(boom)  # the tripping call: never an OverflowError from a huge duration
    snapshot = breaker.snapshot
    if isinstance(built, OpenDuration) or (isinstance(built, CountWindow) and built.calls == 1):
        assert snapshot.state in ("open", "half_open")  # (a 1 ns open period may be over already)
        assert snapshot.retry_after is None or snapshot.retry_after >= 0
