"""Breaker configuration values: the window kinds, the open duration, the state and snapshot.

Seed 000, "CircuitBreaker" (API, "The window", "Open duration and growth"). Every value is
validated when it is built: ``ValueError`` naming the parameter and its allowed range.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from .._durations import MAX_NS, MAX_SECONDS, Seconds, check_fraction, check_int, to_ns, to_seconds

_MAX_FACTOR = 10**300  # (an int factor must convert to a float)

MAX_COUNT_WINDOW = 10_000_000
"""The largest :class:`CountWindow` (one byte per call once the window is first used: 10 MB)."""


def _fraction(value: float, name: str, *, low_open: bool) -> float:
    """``check_fraction`` that also names the parameter for an int too large for a float (which
    would otherwise fail inside ``math.isfinite`` with an unnamed ``OverflowError``)."""
    if isinstance(value, int) and not isinstance(value, bool) and not (0 < value <= 1 if low_open else 0 <= value <= 1):
        raise ValueError(f"{name} must be in {'(0' if low_open else '[0'}, 1], got {value!r}")
    return check_fraction(value, name, low_open=low_open)


def duration_ns(value: Seconds, name: str) -> int:
    """Validate a breaker duration and return it in nanoseconds: stoic's one range for every
    duration, ``(0, MAX_SECONDS]`` (see ``stoic._durations``), checked at construction, so an
    instant computed from it is always an exact int. Raises ``TypeError`` when it is not a number
    or timedelta, ``ValueError`` naming ``name`` and the range otherwise.
    """
    return to_ns(value, name)


class BreakerState(enum.StrEnum):
    """The state of a :class:`~stoic.CircuitBreaker`: ``closed``, ``open`` or ``half_open``."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"

    def __str__(self) -> str:
        return self.value


class TimeWindow:
    """Judge the calls of the last ``seconds`` (float seconds or timedelta, > 0).

    Kept in ten buckets of ``seconds / 10``: the window spans between 9/10 of ``seconds`` and
    ``seconds`` (the current bucket plus the nine before it). The default window kind.
    Raises ``ValueError`` when ``seconds`` is not positive or is shorter than 10 ns.
    """

    __slots__ = ("bucket_ns", "ns")

    BUCKETS: ClassVar[int] = 10

    ns: int
    bucket_ns: int

    def __init__(self, seconds: Seconds) -> None:
        ns = duration_ns(seconds, "TimeWindow seconds")
        if ns < self.BUCKETS:
            raise ValueError(f"TimeWindow seconds must be >= 1e-08 (ten 1 ns buckets), got {seconds!r}")
        object.__setattr__(self, "ns", ns)
        object.__setattr__(self, "bucket_ns", ns // self.BUCKETS)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("TimeWindow is immutable")

    @classmethod
    def _of_ns(cls, ns: int) -> TimeWindow:
        window = object.__new__(cls)
        object.__setattr__(window, "ns", ns)
        object.__setattr__(window, "bucket_ns", ns // cls.BUCKETS)
        return window

    def __reduce__(self) -> tuple[Callable[[int], TimeWindow], tuple[int]]:
        return type(self)._of_ns, (self.ns,)  # (exact: no float seconds in between)

    def __copy__(self) -> TimeWindow:
        return self

    def __deepcopy__(self, memo: object) -> TimeWindow:
        return self

    @property
    def seconds(self) -> float:
        """The window's span in seconds."""
        return to_seconds(self.ns)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TimeWindow) and other.ns == self.ns

    def __hash__(self) -> int:
        return hash(("time", self.ns))

    def __repr__(self) -> str:
        return f"TimeWindow({self.seconds:g})"


class CountWindow:
    """Judge exactly the last ``calls`` recorded calls (an integer >= 1).

    Right for a steady, high-volume dependency. Raises ``ValueError`` naming ``calls`` when it
    is not an integer in [1, 10,000,000].
    """

    __slots__ = ("calls",)

    calls: int

    def __init__(self, calls: int) -> None:
        object.__setattr__(self, "calls", check_int(calls, "CountWindow calls", minimum=1, maximum=MAX_COUNT_WINDOW))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("CountWindow is immutable")

    def __reduce__(self) -> tuple[type[CountWindow], tuple[int]]:
        return type(self), (self.calls,)

    def __copy__(self) -> CountWindow:
        return self

    def __deepcopy__(self, memo: object) -> CountWindow:
        return self

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CountWindow) and other.calls == self.calls

    def __hash__(self) -> int:
        return hash(("calls", self.calls))

    def __repr__(self) -> str:
        return f"CountWindow({self.calls})"


class OpenDuration:
    """How long the breaker stays open after a trip, and how that grows with repeated trips.

    The k-th consecutive trip (k = 1, 2, ...) opens for ``initial * factor**(k - 1)`` capped
    at ``maximum``, then shortened by a random fraction of up to ``jitter`` (jitter only ever
    shortens, so the cap holds). The trip count resets once the breaker has stayed closed for
    ``reset_after`` (default: ``maximum``); closing alone does not reset it.

    Build with :meth:`fixed` or :meth:`exponential`. :attr:`initial`, :attr:`maximum` and
    :attr:`reset_after` are seconds (floats), ``initial_ns``, ``maximum_ns`` and
    ``reset_after_ns`` the same in integer nanoseconds; ``factor`` and ``jitter`` are plain
    numbers. Immutable, hashable, compared by value. ``OpenDuration.standard`` is
    ``exponential()``.
    """

    __slots__ = ("factor", "initial_ns", "jitter", "maximum_ns", "reset_after_ns")

    standard: ClassVar[OpenDuration]

    initial_ns: int
    maximum_ns: int
    factor: float
    jitter: float
    reset_after_ns: int

    def __init__(self, initial_ns: int, maximum_ns: int, factor: float, jitter: float, reset_after_ns: int) -> None:
        """The open duration from integer nanoseconds (:meth:`fixed` and :meth:`exponential`
        take seconds, and are the usual way to build one).

        Raises ``ValueError`` naming the parameter when ``initial_ns``, ``maximum_ns`` or
        ``reset_after_ns`` is not an integer in ``[1, MAX_SECONDS * 10**9]``, ``factor`` is not
        a finite number >= 1, ``jitter`` is outside [0, 1], or ``maximum_ns < initial_ns``.
        """
        for value, name in ((initial_ns, "initial_ns"), (maximum_ns, "maximum_ns"), (reset_after_ns, "reset_after_ns")):
            check_int(value, name, minimum=1, maximum=MAX_NS)
        if isinstance(factor, int) and not isinstance(factor, bool) and not 1 <= factor <= _MAX_FACTOR:
            raise ValueError(f"factor must be a finite number >= 1 and <= {_MAX_FACTOR}, got {factor!r}")
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not math.isfinite(factor):
            raise ValueError(f"factor must be a finite number >= 1, got {factor!r}")
        if factor < 1:
            raise ValueError(f"factor must be >= 1, got {factor!r}")
        if maximum_ns < initial_ns:
            raise ValueError(f"maximum must be >= initial ({to_seconds(initial_ns):g} s), "
                             f"got {to_seconds(maximum_ns):g} s")
        jitter = _fraction(jitter, "jitter", low_open=False)
        object.__setattr__(self, "initial_ns", initial_ns)
        object.__setattr__(self, "maximum_ns", maximum_ns)
        object.__setattr__(self, "factor", float(factor))
        object.__setattr__(self, "jitter", jitter)
        object.__setattr__(self, "reset_after_ns", reset_after_ns)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("OpenDuration is immutable")

    def __reduce__(self) -> tuple[type[OpenDuration], tuple[int, int, float, float, int]]:
        return type(self), (self.initial_ns, self.maximum_ns, self.factor, self.jitter, self.reset_after_ns)

    def __copy__(self) -> OpenDuration:
        return self

    def __deepcopy__(self, memo: object) -> OpenDuration:
        return self

    @classmethod
    def fixed(cls, seconds: Seconds, jitter: float = 0.2) -> OpenDuration:
        """Open for ``seconds`` (in (0, MAX_SECONDS], 10**12 s) on every trip, shortened by up to
        ``jitter`` (in [0, 1]).

        Raises ``ValueError`` for a duration out of range or a jitter outside [0, 1].
        """
        ns = duration_ns(seconds, "open_duration seconds")
        return cls(ns, ns, 1.0, jitter, ns)

    @classmethod
    def exponential(
        cls,
        initial: Seconds = 30.0,
        factor: float = 2.0,
        maximum: Seconds = 300.0,
        jitter: float = 0.2,
        reset_after: Seconds | None = None,
    ) -> OpenDuration:
        """Open for ``initial`` seconds, times ``factor`` per consecutive trip, capped at ``maximum``.

        ``initial``, ``maximum`` and ``reset_after`` are seconds (> 0); ``factor`` >= 1 (1 is a
        fixed duration); ``jitter`` in [0, 1]; ``reset_after`` defaults to ``maximum``.
        Raises ``ValueError`` naming the parameter when any is out of range or
        ``maximum < initial``.
        """
        initial_ns = duration_ns(initial, "initial")
        maximum_ns = duration_ns(maximum, "maximum")
        reset_ns = maximum_ns if reset_after is None else duration_ns(reset_after, "reset_after")
        return cls(initial_ns, maximum_ns, factor, jitter, reset_ns)  # (which checks the rest)

    @property
    def initial(self) -> float:
        """Seconds open after the first trip (before jitter)."""
        return to_seconds(self.initial_ns)

    @property
    def maximum(self) -> float:
        """The cap in seconds."""
        return to_seconds(self.maximum_ns)

    @property
    def reset_after(self) -> float:
        """Seconds of staying closed after which the trip count starts again."""
        return to_seconds(self.reset_after_ns)

    def base_ns(self, trips: int) -> int:
        """The un-jittered duration of the ``trips``-th consecutive trip (>= 1), in ns.

        Computed through logarithms so that huge trip counts never overflow.
        """
        exponent = max(0, trips - 1)
        if self.factor == 1.0 or exponent == 0:
            return self.initial_ns
        if exponent * math.log(self.factor) >= math.log(self.maximum_ns / self.initial_ns):
            return self.maximum_ns
        return min(self.maximum_ns, round(self.initial_ns * self.factor**exponent))

    def jittered_ns(self, trips: int, draw: float) -> int:
        """The duration for the ``trips``-th trip shortened by ``draw`` (in [0, 1)) x ``jitter``."""
        base = self.base_ns(trips)
        return max(1, base - round(base * self.jitter * draw))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OpenDuration) and (
            self.initial_ns, self.maximum_ns, self.factor, self.jitter, self.reset_after_ns
        ) == (other.initial_ns, other.maximum_ns, other.factor, other.jitter, other.reset_after_ns)

    def __hash__(self) -> int:
        return hash((self.initial_ns, self.maximum_ns, self.factor, self.jitter, self.reset_after_ns))

    def __repr__(self) -> str:
        return (
            f"OpenDuration(initial={self.initial:g}, factor={self.factor:g}, maximum={self.maximum:g}, "
            f"jitter={self.jitter:g}, reset_after={self.reset_after:g})"
        )


OpenDuration.standard = OpenDuration.exponential()


@dataclass(frozen=True, slots=True)
class BreakerSnapshot:
    """A consistent view of a breaker at one instant (``CircuitBreaker.snapshot``, a property).

    ``calls``/``failures``/``slow_calls`` are the evidence being judged: the window when
    closed, the half-open episode's probes when half-open, and the evidence that tripped it
    when open. Rates are fractions in [0, 1] (0.0 with no calls). ``trips`` is the count of
    consecutive trips; ``retry_after`` the seconds left in the open period (``None`` unless
    open with an end).
    """

    state: BreakerState
    calls: int
    failures: int
    slow_calls: int
    failure_rate: float
    slow_call_rate: float
    trips: int
    retry_after: float | None


def threshold_ppm(value: float, name: str) -> int:
    """Validate a rate threshold in (0, 1] and return it in integer parts per million (>= 1)."""
    fraction = _fraction(value, name, low_open=True)
    return max(1, round(fraction * 1_000_000))


__all__ = [
    "MAX_COUNT_WINDOW",
    "MAX_SECONDS",
    "BreakerSnapshot",
    "BreakerState",
    "CountWindow",
    "OpenDuration",
    "TimeWindow",
    "duration_ns",
    "threshold_ppm",
]
