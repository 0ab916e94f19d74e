"""Hedged requests: start another copy of a slow call and take the first to succeed.

Seed 000, "hedge" (with "Cancellation and deadlines, for every policy" and "Events"), and seed
003, "Hedge" (the adaptive delay). Attempt 1 starts at once. If no attempt has succeeded
``delay`` after the latest start, the next starts beside the running ones, up to
``max_attempts``. The first success wins; the others are cancelled with the message
``"superseded"`` and awaited before the call returns, so nothing the call started is still
running when it returns. When every started attempt fails, the first failure (in completion
order) is raised. Hedging answers slowness only: a failure with no other attempt running is
raised at once, never followed by a hedge on a timer (that would be a retry, and would double
the load on a dependency exactly when it is failing).

Each hedge withdraws a token from a :class:`~stoic.RetryBudget` (each call's first attempt
deposits); without a token there is no hedge and the running attempts go on. A hedge the
ambient deadline leaves too little time for is not started (see :class:`Hedge`).

Only idempotent work may be hedged, and the call site has to say so: the first argument is
:data:`IDEMPOTENT`, the single member of :class:`Idempotency`.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from ._attempt import Attempt
from ._budget import RetryBudget
from ._clock import SYSTEM_CLOCK, Clock, TimerHandle, current_clock
from ._deadline import remaining_ns
from ._durations import Seconds, check_int, to_ns
from ._errors import DeadlineExceeded
from ._quantile import WindowedQuantile, _check_quantile, default_warmup
from ._random import call_site
from .events import Level, emit, min_level

R = TypeVar("R")

SUPERSEDED = "superseded"
"""The message of the ``CancelledError`` a losing attempt receives (``exc.args[0]``)."""

_DEFAULT_LABEL = "hedge"


class Idempotency(enum.Enum):
    """The promise a caller makes before hedging: running the operation twice is safe.

    It has one member, :data:`IDEMPOTENT`, so hedging a call that is not idempotent means
    writing a false statement in the source, where a reviewer can see it.
    """

    IDEMPOTENT = "idempotent"


IDEMPOTENT = Idempotency.IDEMPOTENT
"""Pass as the first argument of :func:`hedge` / :meth:`Hedge.execute`."""


# Call ids: a random per-process prefix and a counter, 32 hex digits like ``uuid4().hex`` at a
# tenth of its cost (this is on every call's path). The prefix is drawn again in a forked child
# so two processes never hand out the same id.
_ids = itertools.count()
_id_prefix = os.urandom(8).hex()


def _reseed_ids() -> None:
    global _ids, _id_prefix
    _ids = itertools.count()
    _id_prefix = os.urandom(8).hex()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reseed_ids)


def _new_call_id() -> str:
    return f"{_id_prefix}{next(_ids):016x}"


def _check_idempotency(idempotency: object) -> None:
    if idempotency is not IDEMPOTENT:
        raise TypeError(
            "hedge runs an operation more than once; pass stoic.IDEMPOTENT as the first argument "
            f"to state that this is safe, got {idempotency!r}"
        )


class Hedge:
    """A reusable hedging policy; keeps its adaptive delay across calls.

    ``Hedge(delay, *, max_attempts=2, budget=RetryBudget.PER_CALL_SITE, label=None,
    quantile=None, delay_min=None, delay_max=None, window=1000, clock=None)``

    - ``delay``: seconds (float or timedelta, >= 0) to wait after the latest start before
      starting the next attempt. With ``quantile`` set it is the delay used until the estimate
      has warmed up. ``0`` starts every attempt at once (a race).
    - ``max_attempts``: attempts in all, the first included (>= 2).
    - ``budget``: the :class:`~stoic.RetryBudget` hedges spend from; ``PER_CALL_SITE`` (the
      default) means one budget for the line that constructed this ``Hedge``.
    - ``label``: carried by every event (default ``"hedge"``).
    - ``quantile``: in (0, 1); when set, the delay is the streaming P-squared estimate of that
      quantile of the latencies of calls whose first attempt won (seed 003, "Hedge"), clamped to
      [``delay_min``, ``delay_max``]. The estimate restarts every ``window`` observations and
      keeps the previous epoch's value until the new epoch has enough samples, so it follows
      current traffic. ``delay_min``/``delay_max`` (seconds, >= 0) require ``quantile``.
    - ``clock``: the clock for timers and latencies; default the ambient clock at construction.

    Raises ``ValueError`` for a negative or non-finite delay, ``max_attempts`` < 2, ``quantile``
    outside (0, 1), ``delay_min`` > ``delay_max``, ``delay_min``/``delay_max`` without
    ``quantile``, or ``window`` < 5; ``TypeError`` for a budget that is not a RetryBudget.

    Deadline rule: when a hedge is due and the ambient deadline (:func:`stoic.timeout`) leaves
    less time than the current delay, the hedge is skipped (``hedge.deadline_skip``) and no
    further hedge is started for that call: an attempt that has less time than the delay, which
    is meant to sit near the slow end of normal latency, would most likely be cut off by the
    deadline, costing a budget token and backend load for nothing.

    Not a :class:`~stoic.Policy`: its operation takes the :class:`~stoic.Attempt` and the call
    must state idempotency, so it wraps a pipeline (or a plain call) from the outside.
    """

    __slots__ = (
        "_budget", "_clock", "_delay_ns", "_estimate", "_fixed_ns", "_lock", "_max_ns", "_min_ns",
        "label", "max_attempts", "quantile", "window",
    )

    def __init__(
        self,
        delay: Seconds,
        *,
        max_attempts: int = 2,
        budget: RetryBudget = RetryBudget.PER_CALL_SITE,
        label: str | None = None,
        quantile: float | None = None,
        delay_min: Seconds | None = None,
        delay_max: Seconds | None = None,
        window: int = 1000,
        clock: Clock | None = None,
    ) -> None:
        self._setup(delay, max_attempts, budget, label, quantile, delay_min, delay_max, window, clock,
                    call_site(1) if budget is RetryBudget.PER_CALL_SITE else "")

    def _setup(
        self,
        delay: Seconds,
        max_attempts: int,
        budget: RetryBudget,
        label: str | None,
        quantile: float | None,
        delay_min: Seconds | None,
        delay_max: Seconds | None,
        window: int,
        clock: Clock | None,
        site: str,
    ) -> None:
        self._fixed_ns = to_ns(delay, "delay", allow_zero=True)
        self.max_attempts = check_int(max_attempts, "max_attempts", minimum=2)
        if not isinstance(budget, RetryBudget):
            raise TypeError(f"budget must be a stoic.RetryBudget, got {type(budget).__name__}")
        self._budget = budget.resolve(site) if site else budget
        self.label = _DEFAULT_LABEL if label is None else label
        self._clock = clock if clock is not None else current_clock()
        self._min_ns = None if delay_min is None else to_ns(delay_min, "delay_min", allow_zero=True)
        self._max_ns = None if delay_max is None else to_ns(delay_max, "delay_max", allow_zero=True)
        self.window = window
        self._estimate: WindowedQuantile | None = None
        if quantile is None:
            self.quantile: float | None = None
            if self._min_ns is not None or self._max_ns is not None:
                raise ValueError("delay_min and delay_max require quantile (they bound the adaptive delay)")
        else:
            self.quantile = _check_quantile(quantile)
            if self._min_ns is not None and self._max_ns is not None and self._min_ns > self._max_ns:
                raise ValueError(f"delay_min must be <= delay_max, got {delay_min!r} > {delay_max!r}")
            if isinstance(window, bool) or not isinstance(window, int) or window < 5:
                raise ValueError(f"window must be an integer >= 5, got {window!r}")
            self._estimate = WindowedQuantile(self.quantile, window, default_warmup(self.quantile, window))
        self._delay_ns = self._fixed_ns
        self._lock = threading.Lock()

    @property
    def current_delay(self) -> float:
        """The delay (seconds) the next call would wait before its first hedge."""
        return self._delay_ns / 1e9

    @property
    def budget(self) -> RetryBudget:
        """The (resolved) budget hedges spend from."""
        return self._budget

    def _observe(self, latency_ns: int) -> None:
        # Only called for a call whose first attempt won (seed 003: the primaries' latencies).
        estimate = self._estimate
        assert estimate is not None
        with self._lock:
            estimate.add(float(latency_ns))
            value = estimate.value
            if value is None:
                return
            ns = round(value)
            if self._min_ns is not None and ns < self._min_ns:
                ns = self._min_ns
            if self._max_ns is not None and ns > self._max_ns:
                ns = self._max_ns
            self._delay_ns = ns

    async def execute(
        self, idempotency: Idempotency, fn: Callable[..., Coroutine[Any, Any, R]], /, *args: Any, **kwargs: Any
    ) -> R:
        """Run ``fn(attempt, *args, **kwargs)`` hedged; return the first successful result.

        ``idempotency`` must be :data:`IDEMPOTENT` (``TypeError`` otherwise). ``fn`` is an async
        callable receiving an :class:`~stoic.Attempt` (``number`` from 1, a ``call_id`` shared by
        the call's attempts, ``hedged`` true from attempt 2 on).

        Returns the first successful attempt's result after every other attempt has been
        cancelled (message ``"superseded"``) and has finished. Raises the first failure in
        completion order when every started attempt failed, or at once when an attempt fails
        and no other is running. Raises :class:`~stoic.DeadlineExceeded` without running ``fn``
        when the ambient deadline has already passed. When the caller is cancelled (or its
        deadline fires), every attempt is cancelled and awaited, then ``CancelledError``
        propagates.
        """
        _check_idempotency(idempotency)
        return await _race(self, fn, args, kwargs)

    def __repr__(self) -> str:
        adaptive = f", quantile={self.quantile}" if self.quantile is not None else ""
        return (f"Hedge(delay={self._fixed_ns / 1e9}, max_attempts={self.max_attempts}{adaptive}, "
                f"label={self.label!r}, current_delay={self.current_delay})")


def hedge(
    idempotency: Idempotency,
    fn: Callable[[Attempt], Coroutine[Any, Any, R]],
    *,
    delay: Seconds,
    max_attempts: int = 2,
    budget: RetryBudget = RetryBudget.PER_CALL_SITE,
    label: str | None = None,
    clock: Clock | None = None,
) -> Coroutine[Any, Any, R]:
    """Run ``fn(attempt)`` hedged once: ``result = await hedge(IDEMPOTENT, fn, delay=0.05)``.

    See :class:`Hedge` for the parameters and the rules. ``idempotency`` must be
    :data:`IDEMPOTENT`. ``delay`` is seconds (float or timedelta, >= 0); ``max_attempts`` >= 2
    counts the first attempt. ``budget`` defaults to one budget per line that calls ``hedge()``.
    ``clock`` defaults to the ambient clock at the call. The delay is fixed; keep a
    :class:`Hedge` across calls for an adaptive one.

    Arguments are checked when ``hedge()`` is called (``TypeError`` for a missing
    :data:`IDEMPOTENT` or a wrong budget type, ``ValueError`` for a bad ``delay`` or
    ``max_attempts``), before anything runs; it is a plain function returning the coroutine so
    that the call site keying the default budget is the caller's line even when the coroutine
    is wrapped in a task or ``gather``. Awaiting it returns or raises as :meth:`Hedge.execute`.
    """
    _check_idempotency(idempotency)
    policy = Hedge.__new__(Hedge)
    policy._setup(delay, max_attempts, budget, label, None, None, None, 1000, clock,
                  call_site(1) if budget is RetryBudget.PER_CALL_SITE else "")
    return _race(policy, fn, (), {})


class _Race:
    """The bookkeeping of one hedged call, woken by attempt completions and the hedge timer."""

    __slots__ = ("done", "fired", "loop", "waiter")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.waiter: asyncio.Future[None] = loop.create_future()
        self.done: list[asyncio.Task[Any]] = []  # finished attempts, in completion order
        self.fired = False

    def on_done(self, task: asyncio.Task[Any]) -> None:
        self.done.append(task)
        waiter = self.waiter
        if not waiter.done():
            waiter.set_result(None)

    def on_timer(self) -> None:
        self.fired = True
        waiter = self.waiter
        if not waiter.done():
            waiter.set_result(None)

    async def wait(self) -> None:
        waiter = self.waiter
        if waiter.done():
            waiter = self.waiter = self.loop.create_future()
        await waiter

    async def drain(self, tasks: list[asyncio.Task[Any]]) -> bool:
        """Wait until every task has finished, even through cancellation; True if cancelled."""
        cancelled = False
        while len(self.done) < len(tasks):
            try:
                await self.wait()
            except asyncio.CancelledError:
                # Keep waiting: returning with attempts still running would break the promise
                # that nothing of the call outlives it. The cancellation is re-raised after.
                cancelled = True
        for task in tasks:
            _consume(task)
        return cancelled


def _consume(task: asyncio.Task[Any]) -> None:
    # Mark a finished attempt's exception as retrieved, so asyncio does not log it.
    if not task.cancelled():
        task.exception()


def _error_of(task: asyncio.Task[Any]) -> BaseException | None:
    if task.cancelled():
        # An attempt cancelled by something other than this hedge (which only cancels on the
        # way out): it is that attempt's outcome, like any other failure.
        try:
            task.result()
        except asyncio.CancelledError as exc:
            return exc
    return task.exception()


async def _race(policy: Hedge, fn: Callable[..., Coroutine[Any, Any, R]], args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> R:
    clock = policy._clock
    left = remaining_ns()
    if left is not None and left <= 0:
        raise DeadlineExceeded("deadline exceeded before the hedged call started", label=policy.label)
    loop = asyncio.get_running_loop()
    budget = policy._budget
    budget.deposit()
    call_id = _new_call_id()
    start = clock.now_ns()
    delay_ns = policy._delay_ns
    race = _Race(loop)
    task: asyncio.Task[R] = loop.create_task(fn(Attempt(1, call_id, False), *args, **kwargs))
    task.add_done_callback(race.on_done)
    tasks: list[asyncio.Task[Any]] = [task]
    # A timer handle, not a timer task: a call that finishes before the delay pays for one
    # heap entry and its cancellation.
    handle: TimerHandle | None
    if clock is SYSTEM_CLOCK:
        handle = loop.call_later(delay_ns / 1e9, race.on_timer)
    else:
        handle = clock.call_at(start + delay_ns, race.on_timer)
    try:
        await race.waiter
        if race.done and len(tasks) == 1:
            # The common case: the first attempt finished before the delay.
            handle.cancel()
            handle = None
            if not task.cancelled() and task.exception() is None:
                if policy._estimate is not None:
                    policy._observe(clock.now_ns() - start)
                return task.result()
        return await _decide(policy, race, tasks, fn, args, kwargs, call_id, start, handle)
    except BaseException:
        # The caller was cancelled (or a deadline fired): cancel every attempt and wait for
        # them all before letting the cancellation through.
        if handle is not None:
            handle.cancel()
        for t in tasks:
            if not t.done():
                t.cancel()
        await race.drain(tasks)
        raise


async def _decide(
    policy: Hedge,
    race: _Race,
    tasks: list[asyncio.Task[Any]],
    fn: Callable[..., Coroutine[Any, Any, R]],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    call_id: str,
    start: int,
    handle: TimerHandle | None,
) -> R:
    """The slow path: process completions and timer firings until a winner or a final failure.

    ``tasks`` is shared with the caller so that, on cancellation, it sees every started attempt.
    """
    clock = policy._clock
    label = policy.label
    first_failure: BaseException | None = None
    seen = 0  # how many completions have been processed
    hedging = True  # False once max_attempts, the budget or the deadline ended hedging
    try:
        while True:
            while seen < len(race.done):
                task = race.done[seen]
                seen += 1
                error = _error_of(task)
                number = tasks.index(task) + 1
                if error is None:
                    if handle is not None:
                        handle.cancel()
                        handle = None
                    return await _win(policy, race, tasks, task, number, start)
                running = len(tasks) - seen
                if min_level() <= Level.DEBUG:
                    emit("hedge.attempt_failed", label, Level.DEBUG, clock.now_ns(),
                         {"attempt": number, "running": running, "error.type": type(error).__name__})
                if first_failure is None:
                    first_failure = error
                if running == 0:
                    # Nothing left in flight: a failure is retry's business, not a reason to hedge.
                    if handle is not None:
                        handle.cancel()
                        handle = None
                    if len(tasks) > 1 and min_level() <= Level.WARNING:
                        emit("hedge.all_failed", label, Level.WARNING, clock.now_ns(), {})
                    raise first_failure
            if race.fired:
                race.fired = False
                handle = None
                if hedging:
                    hedging, handle = _start_hedge(policy, race, tasks, fn, args, kwargs, call_id, start)
            await race.wait()
    finally:
        if handle is not None:
            handle.cancel()
        del first_failure  # drop the traceback cycle through this frame


def _start_hedge(
    policy: Hedge,
    race: _Race,
    tasks: list[asyncio.Task[Any]],
    fn: Callable[..., Coroutine[Any, Any, Any]],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    call_id: str,
    start: int,
) -> tuple[bool, TimerHandle | None]:
    """Start the next attempt if the deadline and the budget allow; return (keep hedging, timer)."""
    clock = policy._clock
    label = policy.label
    delay_ns = policy._delay_ns
    left = remaining_ns()
    if left is not None and left < delay_ns:
        if min_level() <= Level.INFO:
            emit("hedge.deadline_skip", label, Level.INFO, clock.now_ns(), {})
        return False, None
    if not policy._budget.try_spend():
        if min_level() <= Level.WARNING:
            emit("hedge.budget_exhausted", label, Level.WARNING, clock.now_ns(), {})
        return False, None
    number = len(tasks) + 1
    now = clock.now_ns()
    task = race.loop.create_task(fn(Attempt(number, call_id, True), *args, **kwargs))
    task.add_done_callback(race.on_done)
    tasks.append(task)
    if min_level() <= Level.INFO:
        emit("hedge.started", label, Level.INFO, now, {"attempt": number, "elapsed": (now - start) / 1e9})
    if number >= policy.max_attempts:
        return False, None
    return True, clock.call_at(now + delay_ns, race.on_timer)


async def _win(policy: Hedge, race: _Race, tasks: list[asyncio.Task[Any]], winner: asyncio.Task[R],
               number: int, start: int) -> R:
    clock = policy._clock
    for task in tasks:
        if not task.done():
            task.cancel(SUPERSEDED)
    end = clock.now_ns()
    if await race.drain(tasks):
        raise asyncio.CancelledError
    if number == 1 and policy._estimate is not None:
        policy._observe(end - start)
    if len(tasks) > 1 and min_level() <= Level.INFO:
        emit("hedge.won", policy.label, Level.INFO, clock.now_ns(),
             {"attempt": number, "started": len(tasks), "latency": (end - start) / 1e9})
    return winner.result()
