"""Clocks: where every policy reads time and sleeps.

A policy measures time on one clock for its whole life: the ``clock=`` it was given, else the
ambient clock when it was built (seed 000, "Clock"). Instants are integer nanoseconds on a
monotonic timeline; wall-clock time is never used for state.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import asyncio
else:  # imported on first use (stoic._lazy)
    from ._lazy import lazy_asyncio

    asyncio = lazy_asyncio(globals())


class TimerHandle(Protocol):
    """What :meth:`Clock.call_at` returns: something that can be cancelled."""

    def cancel(self) -> None: ...


@runtime_checkable
class Clock(Protocol):
    """A monotonic clock that can also wake asyncio code up.

    ``now_ns()`` returns integer nanoseconds on a monotonic timeline. ``call_at(when_ns, callback)``
    runs ``callback`` (on the running event loop) once the clock reaches ``when_ns``, in a copy
    of the context current at ``call_at``, as ``loop.call_at`` does (a deadline's or a hedge's
    events then reach the sinks in scope where it was set, whoever moves the clock).
    ``sleep_until(when_ns)`` suspends the calling task until then; cancelling the task cancels
    the sleep. ``sleep_until_blocking(when_ns)`` blocks the calling thread until then.
    """

    def now_ns(self) -> int: ...

    def call_at(self, when_ns: int, callback: Callable[[], object]) -> TimerHandle: ...

    async def sleep_until(self, when_ns: int) -> None: ...

    def sleep_until_blocking(self, when_ns: int) -> None: ...


class SystemClock:
    """The process's monotonic clock (``time.monotonic_ns``) and asyncio's timers."""

    __slots__ = ()

    def now_ns(self) -> int:
        return time.monotonic_ns()

    def now(self) -> float:
        """The current instant in seconds on this clock's monotonic timeline."""
        return time.monotonic_ns() / 1e9

    def call_at(self, when_ns: int, callback: Callable[[], object]) -> TimerHandle:
        loop = asyncio.get_running_loop()
        delay = when_ns - time.monotonic_ns()
        if delay <= 0:
            # Already due: ahead of the tasks already scheduled, as asyncio.timeout does. Through
            # call_later(0) it would run a loop turn late, after the awaiting task had resumed.
            return loop.call_soon(callback)
        return loop.call_later(delay / 1e9, callback)

    async def sleep_until(self, when_ns: int) -> None:
        await asyncio.sleep(max(0, when_ns - time.monotonic_ns()) / 1e9)

    def sleep_until_blocking(self, when_ns: int) -> None:
        # time.sleep raises OverflowError past the platform's limit: sleep in capped steps.
        while (delay := when_ns - time.monotonic_ns()) > 0:
            time.sleep(min(delay / 1e9, _MAX_SLEEP))

    def __repr__(self) -> str:
        return "SystemClock()"


_MAX_SLEEP = threading.TIMEOUT_MAX / 2  # the longest single wait time.sleep/threading accept (halved: margin)


def wait_seconds(ns: int) -> float:
    """``ns`` as the float seconds of one ``threading`` wait, capped at what ``threading`` accepts
    (a longer wait is made of several: callers re-check their condition after every wake-up)."""
    seconds = ns / 1e9
    return seconds if seconds < _MAX_SLEEP else _MAX_SLEEP


def wait_on_clock(clock: Clock, cond: threading.Condition, when_ns: int, left_ns: int) -> bool:
    """Wait on ``cond`` (its lock held by the caller) until it is notified or ``clock`` reaches
    ``when_ns``, if the clock allows; ``left_ns`` (> 0) is ``when_ns`` less the caller's latest
    reading of ``clock``. It may also return early, so the caller re-checks what it waits for
    after every wake-up. True when it waited so.

    On the system clock a timed wait of ``left_ns``. On a clock offering
    ``_wait_blocking(cond, when_ns)`` (``stoic.testing.VirtualClock``) until notified or its time
    moves, so a timeout on virtual time ends when virtual time reaches it, with no real waiting.
    False at once on any other clock (or a VirtualClock that redefines its blocking sleep): the
    caller waits its own way."""
    if type(clock) is SystemClock:
        cond.wait(wait_seconds(left_ns))  # (capped: threading refuses longer waits)
        return True
    clock_wait = getattr(clock, "_wait_blocking", None)
    return clock_wait is not None and bool(clock_wait(cond, when_ns))


def wait_until(clock: Clock, cond: threading.Condition, when_ns: int, left_ns: int) -> None:
    """:func:`wait_on_clock`, and on a clock that cannot wait so, a timed wait of ``left_ns`` in
    real time (a queued waiter's timeout on a clock of the user's own)."""
    if not wait_on_clock(clock, cond, when_ns, left_ns):
        cond.wait(wait_seconds(left_ns))


SYSTEM_CLOCK = SystemClock()

_CLOCK_METHODS = ("now_ns", "call_at", "sleep_until", "sleep_until_blocking")


_CLOCK_TYPES: set[type] = {SystemClock}  # types already checked: a hot call passing a clock pays a set lookup


def check_clock(clock: object) -> Clock:
    """``clock`` itself when it has every :class:`Clock` method, else ``TypeError`` naming ``clock``
    (a wrong object fails where it is given rather than on first use)."""
    kind = type(clock)
    if kind not in _CLOCK_TYPES:
        missing = [name for name in _CLOCK_METHODS if not callable(getattr(clock, name, None))]
        if missing:
            raise TypeError(
                f"clock must be a stoic.Clock (with {', '.join(_CLOCK_METHODS)}); "
                f"{kind.__name__} lacks {', '.join(missing)}"
            )
        _CLOCK_TYPES.add(kind)
    return clock  # type: ignore[return-value]


def resolve_clock(clock: object) -> Clock:
    """The clock a policy keeps for life: ``clock`` itself, validated, or for ``None`` the ambient
    clock now (:func:`current_clock`).

    Raises ``TypeError`` naming ``clock`` when it lacks one of the :class:`Clock` methods, so a
    wrong object fails at construction rather than on first use.
    """
    return current_clock() if clock is None else check_clock(clock)


def same_clock(a: Clock, b: Clock) -> bool:
    """Whether instants on ``a`` and on ``b`` can be compared: the same clock, or two system clocks."""
    return a is b or (type(a) is SystemClock and type(b) is SystemClock)

_ambient_clock: ContextVar[Clock] = ContextVar("stoic.clock", default=SYSTEM_CLOCK)

# Whether use_clock() has ever been entered in this process (never cleared). Until it has, the
# ambient clock is the system clock in every context, so hot paths skip ContextVar.get, which
# costs ~40 ns when some context variable was set since its last read (a retry sets its
# in-attempt mark on every call). Set before the variable, as _deadline.ever_set is.
ever_set = False


def current_clock() -> Clock:
    """The ambient clock: the one installed with :func:`use_clock`, else the system clock."""
    return _ambient_clock.get() if ever_set else SYSTEM_CLOCK


@contextlib.contextmanager
def use_clock(clock: Clock) -> Iterator[Clock]:
    """Make ``clock`` the ambient clock for the enclosed block (and tasks it creates); yields it.

    Policies built inside the block keep this clock for life; deadlines set inside it run on it.
    Raises ``TypeError`` naming ``clock`` (before the block runs) when it lacks one of the
    :class:`Clock` methods, as ``clock=`` does at a policy's construction.
    """
    global ever_set
    check_clock(clock)
    ever_set = True
    token = _ambient_clock.set(clock)
    try:
        yield clock
    finally:
        _ambient_clock.reset(token)
