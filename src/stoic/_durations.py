"""Durations: public seconds (float or timedelta) over internal integer nanoseconds, and the
checks every constructor shares (integers, fractions, labels).

Every public duration has one validated range, ``[0, MAX_SECONDS]`` (``(0, MAX_SECONDS]`` where
zero is refused), checked where it enters (docs/design.md, "Durations"). The bound, 10**12 s
(about 31,700 years), is longer than anything a caller can mean, so no real configuration meets
it, and it keeps every instant and duration a plain integer that converts to a float and back
without overflow: a huge value (``timeout(10**300)``) fails at once with its name, never later
with an ``OverflowError`` from inside a timer or a wait.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Literal, TypeAlias, overload

Seconds: TypeAlias = float | int | timedelta  # (an object, not a string: typing.get_type_hints resolves it)
"""A public duration: seconds as a number, or a :class:`datetime.timedelta`."""

NS_PER_SECOND = 1_000_000_000

MAX_SECONDS = 10**12
"""The longest public duration accepted anywhere, in seconds."""

MAX_NS = MAX_SECONDS * NS_PER_SECOND


def to_ns(value: Seconds, name: str, *, allow_zero: bool = False) -> int:
    """Convert a public duration to integer nanoseconds, validating it.

    Raises ``ValueError`` naming ``name`` and the allowed range when the value is negative, not
    finite, above :data:`MAX_SECONDS`, or zero while ``allow_zero`` is false; ``TypeError`` when
    it is not a number or timedelta.
    """
    if isinstance(value, timedelta):
        # timedelta is exact in microseconds: convert without going through float.
        ns = ((value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds) * 1_000
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be seconds as a float or a timedelta, got {type(value).__name__}")
    elif isinstance(value, int):
        if value > MAX_SECONDS:
            raise _too_long(name, value)
        ns = value * NS_PER_SECOND
    else:
        if not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number of seconds, got {value!r}")
        if value > MAX_SECONDS:
            raise _too_long(name, value)
        # Any negative is refused, a tiny one that would round to 0 ns included.
        ns = -1 if value < 0 else round(value * NS_PER_SECOND)
    if ns < 0 or (ns == 0 and not allow_zero):
        # Kept in whole nanoseconds: a positive value below half of one rounds to 0 and is
        # refused too, so the range says so ("> 0 seconds, got 1e-10" contradicted itself).
        allowed = ">= 0 seconds" if allow_zero else "> 0 seconds (at least 1 ns)"
        raise ValueError(f"{name} must be {allowed}, got {_show(value)}")
    if ns > MAX_NS:
        raise _too_long(name, value)
    return ns


def instant_to_ns(instant: float, name: str = "instant") -> int:
    """An instant in seconds on a clock's timeline (as ``clock.now_ns() / 1e9``) as integer
    nanoseconds, ``round(instant * 1e9)``. Any finite number is an instant (a past one too).

    Raises ``TypeError`` naming ``name`` when it is not a number (a bool included), and
    ``ValueError`` naming it when it is not finite in nanoseconds (an int beyond any float too).
    """
    if isinstance(instant, bool) or not isinstance(instant, (int, float)):
        raise TypeError(f"{name} must be seconds on the clock's timeline, got {type(instant).__name__}")
    try:
        ns = instant * 1e9
    except OverflowError:  # an int beyond any float
        ns = math.inf
    if not math.isfinite(ns):
        raise ValueError(f"{name} must be a finite number of seconds, got {_show(instant)}")
    return round(ns)


def _show(value: object) -> str:
    if isinstance(value, timedelta):  # (its repr is long, and says nothing once cut short)
        return f"a timedelta of {value.total_seconds()!r} seconds"
    if isinstance(value, int) and value.bit_length() > 4096:  # repr() refuses past 4,300 digits
        return f"an int of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)} characters)"


def _too_long(name: str, value: object) -> ValueError:
    return ValueError(f"{name} must be at most {MAX_SECONDS:.0e} seconds (MAX_SECONDS), got {_show(value)}")


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
        raise ValueError(f"{name} must be a number in {'(0' if low_open else '[0'}, {high:g}], got {_show(value)}")
    if (value <= 0 if low_open else value < 0) or value > high:
        raise ValueError(f"{name} must be in {'(0' if low_open else '[0'}, {high:g}], got {_show(value)}")
    return float(value)


def check_int(value: int, name: str, *, minimum: int, maximum: int | None = None) -> int:
    """Validate an integer in ``[minimum, maximum]``; ``ValueError`` naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {_show(value)}")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"in [{minimum}, {maximum}]" if maximum is not None else f">= {minimum}"
        raise ValueError(f"{name} must be {bound}, got {_show(value)}")
    return value


@overload
def check_label(label: object, name: str = ..., *, optional: Literal[False] = ...) -> str: ...
@overload
def check_label(label: object, name: str = ..., *, optional: bool) -> str | None: ...
def check_label(label: object, name: str = "label", *, optional: bool = False) -> str | None:
    """Validate a policy's label: a non-empty ``str`` (``None`` too when ``optional``).

    Raises ``TypeError`` naming ``name`` for another type, ``ValueError`` for ``""``.
    """
    if label is None and optional:
        return None
    if not isinstance(label, str):
        raise TypeError(f"{name} must be a str, got {type(label).__name__}")
    if not label:
        raise ValueError(f"{name} must be a non-empty str")
    return label
