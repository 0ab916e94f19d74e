"""Durations: public seconds (float or timedelta) over internal integer nanoseconds."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import TypeAlias

Seconds: TypeAlias = "float | int | timedelta"
"""A public duration: seconds as a number, or a :class:`datetime.timedelta`."""

NS_PER_SECOND = 1_000_000_000


def to_ns(value: Seconds, name: str, *, allow_zero: bool = False) -> int:
    """Convert a public duration to integer nanoseconds, validating it.

    Raises ``ValueError`` naming ``name`` when the value is negative, not finite, or zero
    while ``allow_zero`` is false; ``TypeError`` when it is not a number or timedelta.
    """
    if isinstance(value, timedelta):
        # timedelta is exact in microseconds: convert without going through float.
        ns = ((value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds) * 1_000
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be seconds as a float or a timedelta, got {type(value).__name__}")
    elif isinstance(value, int):
        ns = value * NS_PER_SECOND
    else:
        # value * 1e9 overflows to inf above ~1.8e299 s: refuse it here rather than let round()
        # raise OverflowError without the parameter's name.
        if not math.isfinite(value * NS_PER_SECOND):
            raise ValueError(f"{name} must be a finite number of seconds, got {value!r}")
        ns = round(value * NS_PER_SECOND)
        if value < 0 and ns == 0:  # a tiny negative rounds to 0 ns: still negative, still refused
            ns = -1
    if ns < 0 or (ns == 0 and not allow_zero):
        allowed = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be {allowed} seconds, got {value!r}")
    return ns


def to_seconds(ns: int) -> float:
    """Integer nanoseconds as float seconds (the unit of every public duration and attribute)."""
    return ns / NS_PER_SECOND


def _finite(value: float) -> bool:
    """``math.isfinite`` that says False (not OverflowError) for an int beyond any float."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def check_fraction(value: float, name: str, *, low_open: bool, high: float = 1.0) -> float:
    """Validate a fraction in ``(0, high]`` (``low_open``) or ``[0, high]``; return it as float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not _finite(value):
        raise ValueError(f"{name} must be a number in {'(0' if low_open else '[0'}, {high}], got {value!r}")
    if (value <= 0 if low_open else value < 0) or value > high:
        raise ValueError(f"{name} must be in {'(0' if low_open else '[0'}, {high:g}], got {value!r}")
    return float(value)


def check_int(value: int, name: str, *, minimum: int, maximum: int | None = None) -> int:
    """Validate an integer in ``[minimum, maximum]``; ``ValueError`` naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"in [{minimum}, {maximum}]" if maximum is not None else f">= {minimum}"
        raise ValueError(f"{name} must be {bound}, got {value!r}")
    return value
