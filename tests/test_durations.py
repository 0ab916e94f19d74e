"""Public durations (float seconds or timedelta) to integer nanoseconds, validated."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stoic._durations import MAX_SECONDS, check_fraction, check_int, check_label, to_ns, to_seconds


def test_numbers_and_timedeltas_convert_exactly():
    assert to_ns(1, "d") == 1_000_000_000
    assert to_ns(0.25, "d") == 250_000_000
    assert to_ns(1e-9, "d") == 1
    assert to_ns(timedelta(microseconds=1), "d") == 1_000
    assert to_ns(timedelta(days=1, seconds=1, microseconds=5), "d") == (86_401 * 1_000_000 + 5) * 1_000
    assert to_seconds(1_500_000_000) == 1.5


@given(st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=10_000)))
def test_timedelta_is_converted_without_float_rounding(value):
    assert to_ns(value, "d", allow_zero=True) == value // timedelta(microseconds=1) * 1_000


@given(st.floats(min_value=0, max_value=1e6, allow_nan=False))
def test_float_seconds_round_to_the_nearest_nanosecond(value):
    ns = to_ns(value, "d", allow_zero=True)
    assert abs(ns - value * 1e9) <= 0.5 + value * 1e9 * 1e-15


@pytest.mark.parametrize("value", [-1, -0.001, timedelta(seconds=-1), -1e-12])
def test_negative_durations_are_rejected_naming_the_parameter(value):
    with pytest.raises(ValueError, match=r"open_duration must be >= 0 seconds"):
        to_ns(value, "open_duration", allow_zero=True)


@pytest.mark.parametrize("value", [0, 0.0, timedelta(0), 1e-12])
def test_zero_is_rejected_unless_allowed(value):
    with pytest.raises(ValueError, match=r"window must be > 0 seconds"):
        to_ns(value, "window")
    assert to_ns(value, "window", allow_zero=True) == 0


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_durations_are_rejected(value):
    with pytest.raises(ValueError, match="delay must be a finite number of seconds"):
        to_ns(value, "delay")


@pytest.mark.parametrize("value", [MAX_SECONDS + 1, 1e13, 1e300, 10**300, 10**400, timedelta(days=999_999_999)])
def test_durations_above_the_one_range_are_refused_naming_the_parameter(value):
    with pytest.raises(ValueError, match=r"delay must be at most 1e\+12 seconds") as caught:
        to_ns(value, "delay")
    assert len(str(caught.value)) < 120  # a huge int is not printed in full


def test_the_largest_duration_is_accepted_exactly():
    assert to_ns(MAX_SECONDS, "d") == MAX_SECONDS * 1_000_000_000
    assert to_ns(float(MAX_SECONDS), "d") == MAX_SECONDS * 1_000_000_000


@pytest.mark.parametrize("value", [-1e300, -(10**300)])
def test_huge_negatives_are_negative_not_overflow(value):
    with pytest.raises(ValueError, match="d must be >= 0 seconds"):
        to_ns(value, "d", allow_zero=True)


def test_an_int_too_long_for_repr_is_refused_naming_the_parameter():
    # repr() of an int over 4,300 digits raises its own ValueError ("Exceeds the limit"), which
    # named no parameter: the message shows its size instead.
    with pytest.raises(ValueError, match=r"probes must be in \[1, 5\], got an int of 16610 bits"):
        check_int(10**5000, "probes", minimum=1, maximum=5)
    with pytest.raises(ValueError, match=r"delay must be at most .* got an int of 16610 bits"):
        to_ns(10**5000, "delay")
    with pytest.raises(ValueError, match=r"delay must be >= 0 seconds, got an int of 16610 bits"):
        to_ns(-(10**5000), "delay", allow_zero=True)


def test_labels_are_non_empty_strings():
    assert check_label("x") == "x"
    assert check_label(None, optional=True) is None
    with pytest.raises(TypeError, match="label must be a str"):
        check_label(None)
    with pytest.raises(TypeError, match="label must be a str"):
        check_label(b"x")
    with pytest.raises(ValueError, match="label must be a non-empty str"):
        check_label("")
    with pytest.raises(ValueError, match="label must be a non-empty str"):
        check_label("", optional=True)


@pytest.mark.parametrize("value", [True, False, "1", None, 1j])
def test_bools_and_non_numbers_are_type_errors(value):
    with pytest.raises(TypeError, match="delay must be seconds as a float or a timedelta"):
        to_ns(value, "delay")  # type: ignore[arg-type]


def test_fractions_and_integers_are_validated_naming_the_parameter():
    assert check_fraction(0.5, "rate", low_open=True) == 0.5
    assert check_fraction(0, "rate", low_open=False) == 0.0
    assert check_fraction(1, "rate", low_open=True) == 1.0
    for bad in (0, -0.1, 1.01, math.nan, True, "x"):
        with pytest.raises(ValueError, match="rate"):
            check_fraction(bad, "rate", low_open=True)  # type: ignore[arg-type]
    assert check_fraction(2.0, "q", low_open=False, high=2.0) == 2.0
    assert check_int(3, "probes", minimum=1) == 3
    for bad in (0, True, 1.0, "2"):
        with pytest.raises(ValueError, match="probes"):
            check_int(bad, "probes", minimum=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"in \[1, 5\]"):
        check_int(6, "probes", minimum=1, maximum=5)


@pytest.mark.parametrize(("value", "shown"), [
    (timedelta(microseconds=-1), "-1e-06 seconds"),
    (timedelta(days=-3, seconds=5), "-259195.0 seconds"),
    (timedelta(days=999_999_999), "86399999913600.0 seconds"),
])
def test_a_refused_timedelta_shows_its_value_in_seconds(value, shown):
    # Its repr ("datetime.timedelta(days=-1, seconds=86399, microseconds=999999)") is too long to
    # print whole and said nothing once cut; the seconds it stands for are what the range is in.
    with pytest.raises(ValueError, match=r"delay must be") as caught:
        to_ns(value, "delay", allow_zero=True)
    assert str(caught.value).endswith(f"got a timedelta of {shown}")
