"""The ambient deadline: ``stoic.timeout()`` and ``stoic.deadline()``.

A deadline is an instant on a clock, kept in a context variable so that every policy running
inside the block can see how much time is left (to refuse work that is already late) and can
tell a cancellation caused by the deadline from any other (design/python.md, "Cancellation and
deadlines"; seed 000, "Cancellation and deadlines, for every policy").
"""

from __future__ import annotations

import asyncio
import math
from contextvars import ContextVar, Token
from types import TracebackType

from ._clock import Clock, TimerHandle, current_clock
from ._durations import Seconds, to_ns
from ._errors import DeadlineExceeded
from .events import Level, emit, min_level

DEADLINE_CANCEL_MESSAGE = "stoic: deadline exceeded"


class _Scope:
    """One ``timeout``/``deadline`` block: its instant, its clock, and whether it fired."""

    __slots__ = ("clock", "when_ns", "parent", "fired", "label")

    def __init__(self, clock: Clock, when_ns: int, parent: _Scope | None, label: str | None) -> None:
        self.clock = clock
        self.when_ns = when_ns
        self.parent = parent
        self.fired = False
        self.label = label


_current: ContextVar[_Scope | None] = ContextVar("stoic.deadline", default=None)

# Whether any timeout()/deadline() block has ever been entered in this process (never cleared).
# Until one has, no context can hold a deadline, so hot paths test this plain module attribute
# first (``if _deadline.ever_set and _current.get() is not None``): a module attribute read
# costs a few ns; ContextVar.get ~10 ns more, ~40 ns more when some context variable was set
# since its last read (its cache is then stale: a retry sets its in-attempt mark on every
# call). Set before the variable, so any context that can see a scope also sees the flag.
ever_set = False


def remaining_ns() -> int | None:
    """Nanoseconds left before the tightest ambient deadline (may be negative), or ``None``."""
    scope = _current.get()
    if scope is None:
        return None
    best: int | None = None
    while scope is not None:
        left = scope.when_ns - scope.clock.now_ns()
        if best is None or left < best:
            best = left
        scope = scope.parent
    return best


def time_remaining() -> float | None:
    """Seconds left before the ambient deadline (negative once passed), or ``None`` without one."""
    left = remaining_ns()
    return None if left is None else left / 1e9


def cancelled_by_deadline() -> bool:
    """True when an enclosing ``timeout``/``deadline`` block has fired.

    A policy that catches ``asyncio.CancelledError`` while waiting uses this to report the wait
    as ``deadline_exceeded`` rather than ``cancelled``.
    """
    scope = _current.get()
    while scope is not None:
        if scope.fired:
            return True
        scope = scope.parent
    return False


class Timeout:
    """Async context manager behind :func:`timeout` and :func:`deadline`.

    On expiry it cancels the enclosing task and, when the block ends with that cancellation,
    raises :class:`DeadlineExceeded` instead. A cancellation from anywhere else passes through.
    """

    __slots__ = ("_clock", "_when_ns", "_label", "_scope", "_token", "_task", "_cancelling", "_handle")

    def __init__(self, when_ns: int, clock: Clock, label: str | None) -> None:
        self._clock = clock
        self._when_ns = when_ns
        self._label = label
        self._scope: _Scope | None = None
        self._token: Token[_Scope | None] | None = None
        self._task: asyncio.Task[object] | None = None
        self._cancelling = 0
        self._handle: TimerHandle | None = None

    @property
    def expired(self) -> bool:
        """Whether this block's deadline fired."""
        return self._scope is not None and self._scope.fired

    async def __aenter__(self) -> Timeout:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("stoic.timeout() must be used inside an asyncio task")
        if self._scope is not None:
            raise RuntimeError("a stoic.timeout()/deadline() object can be entered only once")
        self._task = task
        self._cancelling = task.cancelling()
        global ever_set
        ever_set = True
        self._scope = _Scope(self._clock, self._when_ns, _current.get(), self._label)
        self._token = _current.set(self._scope)
        self._handle = self._clock.call_at(self._when_ns, self._fire)
        return self

    def _fire(self) -> None:
        assert self._scope is not None and self._task is not None
        self._scope.fired = True
        self._task.cancel(DEADLINE_CANCEL_MESSAGE)
        if min_level() <= Level.INFO:
            emit("timeout.expired", self._label or "timeout", Level.INFO, self._clock.now_ns(), {})

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._scope is not None and self._token is not None and self._task is not None
        if self._handle is not None:
            self._handle.cancel()
        _current.reset(self._token)
        if not self._scope.fired:
            return None
        # Our cancel request is spent either way; take it back so it is not delivered later.
        if (
            self._task.uncancel() <= self._cancelling
            and exc_type is not None
            and issubclass(exc_type, asyncio.CancelledError)
        ):
            raise DeadlineExceeded(
                    f"deadline exceeded{f' ({self._label})' if self._label else ''}", label=self._label,
                    timed_out=True,
                ) from exc
        return None


def timeout(seconds: Seconds, *, label: str | None = None, clock: Clock | None = None) -> Timeout:
    """Bound the enclosed ``async with`` block to ``seconds`` (float seconds or timedelta, >= 0).

    Sets the ambient deadline for everything inside it. At expiry the block is cancelled and
    :class:`stoic.DeadlineExceeded` (a ``TimeoutError``) is raised from the ``async with``.
    Runs on ``clock``, else the ambient clock. Raises ``ValueError`` for a negative duration.
    """
    clk = clock if clock is not None else current_clock()
    return Timeout(clk.now_ns() + to_ns(seconds, "seconds", allow_zero=True), clk, label)


def deadline(instant: float, *, label: str | None = None, clock: Clock | None = None) -> Timeout:
    """Like :func:`timeout`, but until ``instant``: seconds on the clock's monotonic timeline
    (as ``clock.now_ns() / 1e9``). An instant already passed expires at once.

    Raises ``ValueError`` naming ``instant`` when it is not a finite number (``TypeError``
    when it is not a number at all)."""
    if isinstance(instant, bool) or not isinstance(instant, (int, float)):
        raise TypeError(f"instant must be seconds on the clock's timeline, got {type(instant).__name__}")
    if not math.isfinite(instant * 1e9):
        raise ValueError(f"instant must be a finite number of seconds, got {instant!r}")
    clk = clock if clock is not None else current_clock()
    return Timeout(round(instant * 1e9), clk, label)
