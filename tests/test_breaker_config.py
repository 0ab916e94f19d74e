"""Configuration: defaults, validation (ValueError naming the parameter and its range), the
decorator, and the open-duration arithmetic (seed 000, "API"; design/python.md)."""

from __future__ import annotations

import asyncio
import copy
import inspect
import pickle
from collections.abc import Callable
from datetime import timedelta

import pytest
from _breaker_helpers import Boom

import stoic
from stoic import BreakerState, CircuitBreaker, CountWindow, OpenDuration, TimeWindow
from stoic.testing import VirtualClock


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"failure_rate_threshold": 0.0}, r"failure_rate_threshold must be in \(0, 1\]"),
        ({"failure_rate_threshold": 1.5}, r"failure_rate_threshold must be in \(0, 1\]"),
        ({"failure_rate_threshold": -0.1}, r"failure_rate_threshold must be in \(0, 1\]"),
        ({"failure_rate_threshold": float("nan")}, r"failure_rate_threshold"),
        ({"slow_call_rate_threshold": 0}, r"slow_call_rate_threshold must be in \(0, 1\]"),
        ({"slow_call_rate_threshold": 1.01}, r"slow_call_rate_threshold must be in \(0, 1\]"),
        ({"minimum_calls": 0}, r"minimum_calls must be >= 1"),
        ({"minimum_calls": 11, "window": CountWindow(10)}, r"minimum_calls must be in \[1, 10\]"),
        ({"slow_call_duration": 0}, r"slow_call_duration must be > 0"),
        ({"slow_call_duration": -1.0}, r"slow_call_duration must be > 0"),
        ({"half_open_probes": 0}, r"half_open_probes must be >= 1"),
        ({"half_open_timeout": 0}, r"half_open_timeout must be > 0"),
        ({"half_open_timeout": timedelta(seconds=-1)}, r"half_open_timeout must be > 0"),
        ({"slow_call_duration": 10**400}, "slow_call_duration must be at most"),
        ({"half_open_timeout": 1e300}, "half_open_timeout must be at most"),
        ({"half_open_timeout": timedelta(days=999_999_999)}, "half_open_timeout must be at most"),
    ],
)
def test_bad_breaker_parameters_are_rejected_by_name(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CircuitBreaker(label="bad", **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"window": 60}, r"window must be TimeWindow\(seconds\) or CountWindow\(calls\)"),
        ({"open_duration": 30}, r"open_duration must be an OpenDuration"),
        ({"record_when": "yes"}, r"record_when must be a callable"),
        ({"record_when": lambda: True}, r"record_when must accept one positional argument"),
        ({"record_when": lambda error, extra: True}, r"record_when must accept one positional argument"),
        ({"slow_call_duration": "10"}, r"slow_call_duration must be seconds"),
        ({"clock": object()}, r"clock must be a stoic.Clock"),
        ({"clock": 5}, r"clock must be a stoic.Clock"),
    ],
)
def test_parameters_of_the_wrong_type_are_a_type_error_naming_them(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(TypeError, match=message):
        CircuitBreaker(label="bad", **kwargs)  # type: ignore[arg-type]


def test_the_label_must_be_a_non_empty_str() -> None:
    with pytest.raises(TypeError, match="label must be a str"):
        CircuitBreaker(label=b"api")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="label must be a str"):
        CircuitBreaker(label=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="label must be a non-empty str"):
        CircuitBreaker(label="")


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: TimeWindow(0), r"TimeWindow seconds must be > 0"),
        (lambda: TimeWindow(-5), r"TimeWindow seconds must be > 0"),
        (lambda: TimeWindow(float("inf")), r"TimeWindow seconds must be a finite"),
        (lambda: CountWindow(0), r"CountWindow calls must be in \[1, 10000000\]"),
        (lambda: CountWindow(10**30), r"CountWindow calls must be in \[1, 10000000\]"),
        (lambda: OpenDuration.fixed(10**400), "open_duration seconds must be at most"),
        (lambda: OpenDuration.exponential(maximum=10**13), "maximum must be at most"),
        (lambda: OpenDuration.exponential(reset_after=1e300), "reset_after must be at most"),
        (lambda: TimeWindow(10**400), "TimeWindow seconds must be at most"),
        (lambda: CountWindow(2.5), r"CountWindow calls must be an integer"),  # type: ignore[arg-type]
        (lambda: OpenDuration.fixed(0), r"open_duration seconds must be > 0"),
        (lambda: OpenDuration.fixed(5, jitter=1.5), r"jitter must be in \[0, 1\]"),
        (lambda: OpenDuration.fixed(5, jitter=-0.1), r"jitter must be in \[0, 1\]"),
        (lambda: OpenDuration.exponential(initial=0), r"initial must be > 0"),
        (lambda: OpenDuration.exponential(maximum=-1), r"maximum must be > 0"),
        (lambda: OpenDuration.exponential(factor=0.5), r"factor must be >= 1"),
        (lambda: OpenDuration.exponential(factor=float("inf")), r"factor must be a finite number >= 1"),
        (lambda: OpenDuration.exponential(initial=30, maximum=10), r"maximum must be >= initial"),
        (lambda: OpenDuration.exponential(jitter=2), r"jitter must be in \[0, 1\]"),
        (lambda: OpenDuration.exponential(reset_after=0), r"reset_after must be > 0"),
        # The class's own constructor (nanoseconds) is public too, and held the same ranges
        # unchecked: OpenDuration(0, -5, 0.5, 2.0, 0) built a breaker that reopened for 1 ns.
        (lambda: OpenDuration(0, 10, 2.0, 0.2, 10), r"initial_ns must be in \[1, "),
        (lambda: OpenDuration(10, -5, 2.0, 0.2, 10), r"maximum_ns must be in \[1, "),
        (lambda: OpenDuration(10, 10, 2.0, 0.2, 0), r"reset_after_ns must be in \[1, "),
        (lambda: OpenDuration(10, 10**40, 2.0, 0.2, 10), r"maximum_ns must be in \[1, "),
        (lambda: OpenDuration(1.5, 10, 2.0, 0.2, 10), r"initial_ns must be an integer"),  # type: ignore[arg-type]
        (lambda: OpenDuration(10, 20, 0.5, 0.2, 10), r"factor must be >= 1"),
        (lambda: OpenDuration(10, 20, float("nan"), 0.2, 10), r"factor must be a finite number >= 1"),
        (lambda: OpenDuration(10, 20, 2.0, 2.0, 10), r"jitter must be in \[0, 1\]"),
        (lambda: OpenDuration(20, 10, 2.0, 0.2, 10), r"maximum must be >= initial"),
    ],
)
def test_bad_window_and_open_duration_values_are_rejected_by_name(build: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()  # type: ignore[operator]


def test_defaults_follow_the_seed() -> None:
    breaker = CircuitBreaker(label="d")
    assert breaker._window_kind == TimeWindow(60.0)
    assert breaker._minimum == 10
    assert breaker._fppm == 500_000 and breaker._sppm == 1_000_000
    assert breaker._slow_ns == 10_000_000_000
    assert breaker._probes == 1
    assert breaker._probe_timeout_ns == 60_000_000_000
    assert breaker._open_duration == OpenDuration.exponential(30, 2, 300, 0.2) == OpenDuration.standard
    assert breaker.label == "d"
    assert breaker.state is BreakerState.CLOSED
    assert str(BreakerState.HALF_OPEN) == "half_open"


def test_durations_accept_timedelta() -> None:
    assert TimeWindow(timedelta(minutes=1)) == TimeWindow(60)
    assert OpenDuration.fixed(timedelta(seconds=5), jitter=0) == OpenDuration.fixed(5.0, jitter=0)
    assert CircuitBreaker(label="t", slow_call_duration=timedelta(milliseconds=250))._slow_ns == 250_000_000


def test_open_duration_growth_is_capped_and_never_overflows() -> None:
    duration = OpenDuration.exponential(initial=30, factor=2, maximum=300, jitter=0)
    assert [duration.base_ns(k) / 1e9 for k in range(1, 7)] == [30, 60, 120, 240, 300, 300]
    assert duration.base_ns(10**9) == 300 * 10**9
    slow_growth = OpenDuration.exponential(initial=1, factor=1.0000001, maximum=2, jitter=0)
    assert slow_growth.base_ns(10**12) == 2 * 10**9
    assert OpenDuration.fixed(7, jitter=0).base_ns(50) == 7 * 10**9
    assert OpenDuration.exponential(initial=10, factor=1, maximum=10).base_ns(99) == 10 * 10**9


def test_jitter_only_shortens() -> None:
    duration = OpenDuration.exponential(initial=30, factor=2, maximum=300, jitter=0.2)
    assert duration.jittered_ns(1, 0.0) == 30 * 10**9
    assert duration.jittered_ns(1, 0.999999) == pytest.approx(24 * 10**9, rel=1e-5)
    assert duration.jittered_ns(9, 0.5) == 270 * 10**9  # the cap, shortened by 10%


def test_value_objects_compare_and_print() -> None:
    assert CountWindow(5) == CountWindow(5) and CountWindow(5) != CountWindow(6)
    assert hash(TimeWindow(1)) == hash(TimeWindow(1.0))
    assert repr(TimeWindow(60)) == "TimeWindow(60)"
    assert repr(CountWindow(3)) == "CountWindow(3)"
    assert "factor=2" in repr(OpenDuration.standard)
    assert OpenDuration.standard.initial == 30.0 and OpenDuration.standard.maximum == 300.0
    assert "state=closed" in repr(CircuitBreaker(label="r"))


@pytest.mark.parametrize(("value", "attribute"), [
    (TimeWindow(60), "ns"), (TimeWindow(60), "bucket_ns"), (CountWindow(5), "calls"),
    (OpenDuration.standard, "initial_ns"), (OpenDuration.standard, "jitter"), (OpenDuration.fixed(5), "factor"),
    (OpenDuration.fixed(5), "maximum_ns"), (OpenDuration.fixed(5), "reset_after_ns"),
])
def test_the_window_and_open_duration_values_are_immutable(value: object, attribute: str) -> None:
    # Hashable values (the seed's Hashable structs), shared by every breaker built with the
    # defaults: OpenDuration.standard.initial_ns = 1 made every default breaker rest 1 ns, past
    # every check, and a window's changed hash lost it in a set. Schedules, RetryDecision and
    # Attempt already refused assignment.
    before = hash(value)
    with pytest.raises(AttributeError, match="immutable"):
        setattr(value, attribute, 1)
    assert hash(value) == before
    # Still copied and pickled as values (a settings object holding one is deep-copied).
    assert copy.copy(value) == value and copy.deepcopy(value) == value
    restored = pickle.loads(pickle.dumps(value))
    assert restored == value and type(restored) is type(value) and hash(restored) == before
    assert getattr(restored, attribute) == getattr(value, attribute)


def test_a_time_window_pickles_exactly() -> None:
    window = TimeWindow(timedelta(days=400, microseconds=1))  # (beyond float seconds' exact ns)
    assert pickle.loads(pickle.dumps(window)).ns == window.ns


async def test_decorator_keeps_the_signature_and_runs_coroutines_through_execute(clock: VirtualClock) -> None:
    breaker = CircuitBreaker(label="deco", window=CountWindow(2), minimum_calls=1, failure_rate_threshold=0.5)

    @breaker
    async def fetch(path: str, *, retries: int = 0) -> str:
        """Fetch a path."""
        if path == "bad":
            raise Boom(path)
        return f"{path}:{retries}"

    assert inspect.iscoroutinefunction(fetch)
    assert fetch.__name__ == "fetch" and fetch.__doc__ == "Fetch a path."
    assert str(inspect.signature(fetch)) == "(path: 'str', *, retries: 'int' = 0) -> 'str'"
    assert await fetch("a", retries=2) == "a:2"
    with pytest.raises(Boom):
        await fetch("bad")
    assert breaker.state is BreakerState.OPEN
    with pytest.raises(stoic.CircuitOpen):
        await fetch("a")


def test_decorator_on_a_plain_function_runs_through_call() -> None:
    breaker = CircuitBreaker(label="deco-sync", window=CountWindow(2), minimum_calls=1, failure_rate_threshold=0.5)

    @breaker
    def add(a: int, b: int) -> int:
        if a < 0:
            raise Boom("negative")
        return a + b

    assert not inspect.iscoroutinefunction(add)
    assert add(1, 2) == 3
    with pytest.raises(Boom):
        add(-1, 2)
    with pytest.raises(stoic.CircuitOpen):
        add(1, 2)


def test_a_breaker_built_outside_any_loop_works_under_successive_loops() -> None:
    breaker = CircuitBreaker(label="import-time")

    async def ok() -> int:
        return 1

    assert asyncio.run(breaker.execute(ok)) == 1
    assert asyncio.run(breaker.execute(ok)) == 1
    assert breaker.snapshot.calls == 2


def test_is_a_policy() -> None:
    assert isinstance(CircuitBreaker(label="p"), stoic.Policy)


def test_the_label_must_be_a_string() -> None:
    with pytest.raises(TypeError, match="label must be a str"):
        CircuitBreaker(label=42)  # type: ignore[arg-type]


def test_the_label_is_a_keyword() -> None:
    with pytest.raises(TypeError):
        CircuitBreaker("payments")  # type: ignore[misc]


@pytest.mark.parametrize("how", [copy.copy, copy.deepcopy, pickle.dumps], ids=lambda f: f.__name__)
def test_a_breaker_cannot_be_copied_or_pickled(how: Callable[[object], object]) -> None:
    # A shallow copy would share the lock and the window's lists.
    with pytest.raises(TypeError, match="cannot be copied or pickled"):
        how(CircuitBreaker(label="payments"))
