"""A virtual clock: time moves only when a test says so, and nothing really waits."""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

from .._clock import TimerHandle
from .._durations import Seconds, instant_to_ns, to_ns

T = TypeVar("T")


# The longest real wait of a thread in VirtualClock._wait_blocking between re-checks: bounds
# the delay of a wake-up that _set_now could not deliver at once.
_BLOCKED_RECHECK = 0.05


def _nothing() -> None:
    pass


def _refuse_an_endless_wait(notified: bool = False) -> None:
    """``RuntimeError`` when a blocking sleep on virtual time could never end: this thread runs
    an event loop (the loop that would advance the clock is the one blocked), or it is the only
    thread (no one else can advance it). ``notified``: the wait also ends when another thread
    notifies it (a policy's timed wait: a slot handed over, a retune), so only the second case
    is refused."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        on_loop = False
    else:
        on_loop = not notified
    if on_loop:
        where = "on the event loop's thread"
    elif threading.active_count() > 1:
        return
    else:
        where = "with no other thread to move time"
    raise RuntimeError(
        f"VirtualClock: a blocking sleep {where} would wait for ever (only advance() moves virtual "
        "time); run the blocking code in another thread (asyncio.to_thread) while the loop advances the clock")


class _VirtualTimer:
    __slots__ = ("when_ns", "seq", "callback", "cancelled", "context")

    def __init__(self, when_ns: int, seq: int, callback: Callable[[], object]) -> None:
        self.when_ns = when_ns
        self.seq = seq
        self.callback = callback
        self.cancelled = False
        # As asyncio's timers do: the callback runs in a copy of the context it was scheduled
        # in, not in that of whoever moves time (its events reach the sinks in scope there).
        self.context = contextvars.copy_context()

    def cancel(self) -> None:
        # As asyncio's TimerHandle does: let go of the callback (and all it holds) at once
        # rather than when the clock reaches the instant.
        self.cancelled = True
        self.callback = _nothing

    def __lt__(self, other: _VirtualTimer) -> bool:
        return (self.when_ns, self.seq) < (other.when_ns, other.seq)

    def __repr__(self) -> str:
        state = " cancelled" if self.cancelled else ""
        return f"<VirtualTimer{state} when_ns={self.when_ns} {self.callback!r}>"

    def run(self) -> None:
        """Run the callback in its context as the event loop runs a handle (``Handle._run``):
        an exception it raises (``SystemExit`` and ``KeyboardInterrupt`` aside, which propagate)
        goes to the running loop's ``call_exception_handler`` with the keys asyncio gives it
        (``message``, ``exception``, ``handle``: this timer, what ``call_at`` returned), and the
        caller carries on."""
        callback = self.callback
        try:
            self.context.run(callback)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            asyncio.get_running_loop().call_exception_handler(
                {"message": f"Exception in callback {callback!r}", "exception": exc, "handle": self})


async def settle(limit: int = 10_000) -> None:
    """Let every runnable task and callback run until the event loop has nothing ready.

    Time does not move. Uses the loop's ready queue when it can see it (CPython's loops);
    otherwise yields a fixed number of times.
    """
    loop = asyncio.get_running_loop()
    for i in range(limit):
        await asyncio.sleep(0)
        ready = getattr(loop, "_ready", None)
        if ready is None:
            if i >= 200:
                return
        elif not ready:
            return


class VirtualClock:
    """A :class:`stoic.Clock` whose time only moves on :meth:`advance` or :meth:`run_until_idle`.

    Timers and sleeps registered on it fire in instant order as time is moved, each followed by
    a :func:`settle` so the tasks they wake run before the clock moves on, and each in a copy of
    the context it was set in (as asyncio's timers run), not in that of the code moving time. A
    callback that raises is reported to the running loop's exception handler and the others
    still fire, as on the loop (see :meth:`advance`). ``start`` is the
    initial instant in seconds. Thread-safe for ``now_ns`` and blocking sleeps; advance it from
    the event loop's thread.
    """

    def __init__(self, start: Seconds = 0.0) -> None:
        self._now_ns = to_ns(start, "start", allow_zero=True)
        self._timers: list[_VirtualTimer] = []
        self._seq = 0
        self._cond = threading.Condition()
        # Conditions of threads in _wait_blocking (how many on each), notified as time moves.
        self._blocked: dict[threading.Condition, int] = {}

    # --- the Clock protocol ---

    def now_ns(self) -> int:
        """The current virtual instant in integer nanoseconds."""
        return self._now_ns

    def now(self) -> float:
        """The current virtual instant in seconds."""
        return self._now_ns / 1e9

    def call_at(self, when_ns: int, callback: Callable[[], object]) -> TimerHandle:
        with self._cond:
            self._seq += 1
            timer = _VirtualTimer(when_ns, self._seq, callback)
            heapq.heappush(self._timers, timer)
        if when_ns <= self._now_ns:
            # Already due: run it soon, as a real loop would, without moving time.
            loop = asyncio.get_running_loop()
            loop.call_soon(self._run_due)
        return timer

    async def sleep_until(self, when_ns: int) -> None:
        if when_ns <= self._now_ns:
            await asyncio.sleep(0)
            return
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            # A sleep left pending on a loop since closed (one clock shared by tests that each
            # run their own loop) has no one to wake: set_result would raise "Event loop is
            # closed" into whichever later test moves the clock past it.
            if not future.done() and not loop.is_closed():
                future.set_result(None)

        handle = self.call_at(when_ns, wake)
        try:
            await future
        finally:
            handle.cancel()

    async def sleep(self, seconds: Seconds) -> None:
        """Suspend the calling task for ``seconds`` (>= 0, float or timedelta) of virtual time:
        until :meth:`advance` (or :meth:`run`/:meth:`run_until_idle`) moves the clock that far.
        ``sleep(0)`` yields to the loop once. Raises ``ValueError`` for a negative duration."""
        await self.sleep_until(self._now_ns + to_ns(seconds, "seconds", allow_zero=True))

    def sleep_until_blocking(self, when_ns: int) -> None:
        """Block the calling thread until another thread moves the clock to ``when_ns``.

        Raises ``RuntimeError`` rather than wait for ever when no one can move it: on the thread
        of a running event loop (the one that advances it is blocked) or with no other thread
        alive (a sync test calling ``retry_sync`` on virtual time). Run the blocking code in a
        thread (``asyncio.to_thread``) while the loop advances the clock."""
        with self._cond:
            if self._now_ns < when_ns:
                _refuse_an_endless_wait()
            while self._now_ns < when_ns:
                self._cond.wait()

    def _wait_blocking(self, cond: threading.Condition, when_ns: int) -> bool:
        """For a thread holding ``cond``: wait on it until this clock reaches ``when_ns`` or
        ``cond`` is notified (a blocking rate limiter's retune: "recompute your wait"), or for
        at most a short real while, then return True; the caller re-checks what it waits for
        after every wake-up.

        False at once, without waiting, when a subclass redefines :meth:`sleep_until_blocking`:
        that is its own way for a blocked thread to let time pass (one that moves time on a
        sleep, say), so the caller must sleep through it instead.

        Raises ``RuntimeError``, as :meth:`sleep_until_blocking` does, when the calling thread is
        the only one: nobody could move time or notify it."""
        if type(self).sleep_until_blocking is not VirtualClock.sleep_until_blocking:
            return False
        with self._cond:
            if self._now_ns >= when_ns:
                return True
            _refuse_an_endless_wait(notified=True)
            # Registered before the wait releases cond's lock, and _set_now notifies under that
            # lock, so a move of time after this check is not missed, except when _set_now found
            # the lock taken (see there): the bounded wait re-checks then.
            self._blocked[cond] = self._blocked.get(cond, 0) + 1
        try:
            cond.wait(_BLOCKED_RECHECK)
        finally:
            with self._cond:
                if self._blocked[cond] > 1:
                    self._blocked[cond] -= 1
                else:
                    del self._blocked[cond]
        return True

    # --- driving time ---
    @property
    def pending_timers(self) -> int:
        """How many timers (sleeps included) are waiting for the clock to move."""
        return sum(1 for t in self._timers if not t.cancelled)

    def next_timer_ns(self) -> int | None:
        """The instant of the earliest pending timer, or ``None``."""
        self._drop_cancelled()
        return self._timers[0].when_ns if self._timers else None

    def _drop_cancelled(self) -> None:
        while self._timers and self._timers[0].cancelled:
            heapq.heappop(self._timers)

    def _pop_due(self, limit_ns: int) -> _VirtualTimer | None:
        with self._cond:
            self._drop_cancelled()
            if self._timers and self._timers[0].when_ns <= limit_ns:
                return heapq.heappop(self._timers)
        return None

    def _run_due(self) -> None:
        while (timer := self._pop_due(self._now_ns)) is not None:
            timer.run()  # (one that raises is reported to the loop; the others still run)

    def _set_now(self, ns: int) -> None:
        with self._cond:
            if ns > self._now_ns:
                self._now_ns = ns
            self._cond.notify_all()
            blocked = list(self._blocked) if self._blocked else None
        if blocked is not None:
            # Each under its own lock, outside the clock's (a waiter takes them the other way),
            # and only if free: time may be moved by a thread holding one (a clock subclass
            # moving on a reading, made under a limiter's lock), which must not deadlock; such
            # a waiter re-checks within _BLOCKED_RECHECK.
            for cond in blocked:
                if cond.acquire(blocking=False):
                    try:
                        cond.notify_all()
                    finally:
                        cond.release()

    async def advance(self, seconds: Seconds) -> None:
        """Move time forward by ``seconds`` (>= 0), firing every timer due on the way in order.

        Runnable tasks are settled before the move, and after each timer fires, so a task woken
        at instant t runs (and may register new timers) before time passes t.

        A timer callback that raises does not stop the move, as on a real event loop: its
        exception goes to the running loop's exception handler (``loop.call_exception_handler``
        with ``message``, ``exception`` and ``handle``, the timer ``call_at`` returned; by
        default it is logged), and the later timers still fire. ``SystemExit`` and
        ``KeyboardInterrupt`` propagate, as from the loop, leaving time at that timer's instant.
        Raises ``ValueError`` for a negative ``seconds``, ``TypeError`` for one that is not a
        number or ``timedelta``.
        """
        await self._advance_to_ns(self._now_ns + to_ns(seconds, "seconds", allow_zero=True))

    async def _advance_to_ns(self, target: int) -> None:
        await settle()
        while (timer := self._pop_due(target)) is not None:
            self._set_now(timer.when_ns)
            timer.run()  # (one that raises is reported to the loop; time moves on)
            await settle()
        self._set_now(target)
        await settle()

    async def advance_to(self, instant: float) -> None:
        """Move time forward to ``instant`` seconds (no-op if already past), landing exactly on
        ``round(instant * 1e9)`` ns, the instant a ``deadline(instant)`` or timer set there has.

        Raises ``TypeError`` for an ``instant`` that is not a number, ``ValueError`` naming it
        when it is not finite, as :func:`stoic.deadline` does."""
        target = instant_to_ns(instant)
        if target > self._now_ns:
            await self._advance_to_ns(target)  # (in ns: a float of seconds between could miss by 1 ns)

    async def run_until_idle(self, limit: Seconds = 86_400.0) -> float:
        """Settle, then keep jumping to the next timer until none is left (or ``limit`` seconds
        of virtual time have passed, against a timer that re-arms itself forever).

        Returns the virtual seconds that passed.
        """
        start = self._now_ns
        end = start + to_ns(limit, "limit")
        await settle()
        while (when := self.next_timer_ns()) is not None and when <= end:
            await self.advance((max(when, self._now_ns) - self._now_ns) / 1e9)
        return (self._now_ns - start) / 1e9

    async def run(self, awaitable: Awaitable[T], limit: Seconds = 86_400.0) -> T:
        """Run ``awaitable`` to completion on virtual time, jumping from timer to timer.

        Returns its result or raises its exception. Raises ``RuntimeError`` (after cancelling it)
        when it is blocked with no timer left to fire, or still running after ``limit`` seconds.
        Cancelling ``run()`` cancels it too.
        """
        end = self._now_ns + to_ns(limit, "limit")
        task = asyncio.ensure_future(awaitable)
        try:
            await settle()
            while not task.done():
                when = self.next_timer_ns()
                if when is None or when > end:
                    task.cancel()
                    raise RuntimeError("VirtualClock.run: the task is blocked with no timer left to fire")
                await self.advance((max(when, self._now_ns) - self._now_ns) / 1e9)
        except BaseException:
            # As awaiting it directly would: cancelling run() (a test's own timeout) cancels the
            # task rather than leaving it running on the loop after the test has gone on.
            task.cancel()
            raise
        return task.result()

    def __repr__(self) -> str:
        return f"VirtualClock(now={self.now():.9f}s, pending={self.pending_timers})"
