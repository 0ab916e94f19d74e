"""Adaptive bulkheads: a concurrency limit that follows the dependency's latency (seed 003,
"Adaptive (AIMD)" and "Gradient").

Both are :class:`stoic.Bulkhead` s whose limit moves: the waiter queue, its cancellation rules
and queue management are the fixed bulkhead's; the arithmetic lives in :mod:`stoic._limits`.
A call's latency is measured around the operation on the bulkhead's clock and fed to the
algorithm when the call completes. Samples: a success (its latency), and a timeout (a *drop*:
``TimeoutError`` or httpx's ``TimeoutException``, a ``DeadlineExceeded`` that cut running work
short, or a cancellation by an enclosing ``stoic.timeout``; an exception group when any leaf is
one). Not samples: any other
failure (fast failures say nothing about queueing; errors are the breaker's business) and plain
cancellations. A call's latency leaves out the time it spent queued in an inner stage (a
bulkhead's queue, a rate limiter's wait: :mod:`stoic._admission`), as the breaker's duration
does (field report 20): local queueing says nothing about the dependency.

Shrinking never evicts in-flight work: the limit gates admission only, and a slot released
while the bulkhead is over its new limit is retired instead of handed on.

Which calls are timed (docs/adaptive.md, "Which calls are timed"): two clock reads cost about
as much as the fixed bulkhead's whole success path, so at high rates only some calls are timed.
A call admitted after waiting, or while an ambient deadline is set, always is. A call admitted
at once is timed with probability ``1 / stride``, independently of the others (at each timed
call a geometric run of untimed ones is drawn, capped at eight strides). The stride is 1 until
the rate of such admissions is known, then recomputed about once a millisecond
(:data:`PERIOD_NS`) from the admissions counted over the last one: a timed call per
:data:`TIMED_GAP_NS` (50 µs), at most :data:`MAX_STRIDE`. So below 20,000 admissions a second,
and in any burst shorter than a millisecond, every call is timed; above, about 20,000 a second
are. A timed success carries its ``weight``, the stride it was drawn with (``1 /
probability``): AIMD grows by that many completions' worth, Gradient2 counts them towards its
window and weights its mean by them, so both are right in expectation however the calls are
ordered. Every drop is a sample, timed or not (an untimed one with an unknown latency). What the
limit does not see is an untimed call's latency, so a lone slow call among them is missed; and
after the rate falls, at most eight strides of calls go untimed before the stride follows.
"""

from __future__ import annotations

import functools
import math
import time
import types
from collections.abc import Awaitable, Callable
from math import log
from types import TracebackType
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, cast

from . import _admission, _deadline, _random
from ._clock import Clock, SystemClock, check_clock
from ._deadline import _current as _deadline_scope
from ._deadline import deadline_cut_running_work
from ._durations import Seconds, check_int, check_label, to_ns, to_seconds
from ._errors import DeadlineExceeded, Rejected, client_timeout, leaves
from ._limits import AimdLimit, Change, Gradient2Limit
from ._quantile import _check_quantile
from ._retune import validated
from ._waitqueue import ManagedQueue
from .bulkhead import Bulkhead
from .events import Level, emit
from .events._sinks import kind_floor

# The sinks wanting bulkhead events (stoic.events._sinks.KindFloor): a sink that wants none of
# them leaves these events unbuilt.
_SINKS = kind_floor("bulkhead")

if TYPE_CHECKING:
    import asyncio

    from .fleet import SharedLatency
else:  # imported on first use (stoic._lazy)
    from ._lazy import lazy_asyncio

    asyncio = lazy_asyncio(globals())

P = ParamSpec("P")
T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


TIMED_GAP_NS = 50_000
"""The calls admitted at once are timed about once per this (50 µs) on average when they come
faster: the stride is the admissions of the last period times this over the period's length."""

PERIOD_NS = 1_000_000
"""The stride is recomputed at the first timed call at least this long (1 ms) after the last
recomputation, from the admissions counted since: a rate over a millisecond, not a burst."""

MAX_STRIDE = 64
"""At most this many calls admitted at once stand for each timed one (its weight)."""

_admission_state = _admission.state  # (waits recorded by queued stages: see _timed)

# 1 / ln(1 - 1/stride) for each stride: a geometric count of untimed calls is ln(u) times it.
_RUN_SCALE = [0.0, 0.0] + [1.0 / math.log1p(-1.0 / stride) for stride in range(2, MAX_STRIDE + 1)]


def _is_drop(error: BaseException) -> bool | None:
    """True for a timeout (a drop), None when the failure is not a sample. An exception group
    (a fan-out's verdict) is a drop when any of its leaves is one."""
    if isinstance(error, BaseExceptionGroup):
        return True if any(_is_drop(leaf) for leaf in leaves(error)) else None
    if isinstance(error, asyncio.CancelledError):
        return True if deadline_cut_running_work() else None  # (not a cut of an inner queue's wait)
    if isinstance(error, DeadlineExceeded):
        return True if error.timed_out else None
    if isinstance(error, Rejected):
        return None  # an inner policy refused: nothing ran
    return True if client_timeout(error) else None  # (httpx's timeouts are no TimeoutError)


def _own_copy(method: F) -> F:
    """``method`` with a code object of its own. CPython specialises each attribute access of a
    code object for the one type it meets; the success path shared by both adaptive bulkheads
    would meet two (and two limit algorithms) and run unspecialised, so each class gets a copy."""
    assert isinstance(method, types.FunctionType)
    copy = types.FunctionType(method.__code__.replace(), method.__globals__, method.__name__,
                              method.__defaults__, method.__closure__)
    functools.update_wrapper(copy, method)
    return cast(F, copy)


def _check_number(value: float, name: str, low: float, high: float | None, *, low_open: bool,
                  high_open: bool) -> float:
    # Finite, as a float: an int beyond any float would raise OverflowError below (an admin
    # retune answering 500), and an infinite step or headroom would throw the limit to the ceiling.
    number = math.nan
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:
            pass
    ok = math.isfinite(number) and (number > low if low_open else number >= low) and (
        high is None or (number < high if high_open else number <= high))
    if not ok:
        lo = "(" if low_open else "["
        hi = "" if high is None else f", {high:g}" + (")" if high_open else "]")
        rng = f"in {lo}{low:g}{hi}" if high is not None else f"{'>' if low_open else '>='} {low:g}"
        raise ValueError(f"{name} must be a finite number {rng}, got {value!r}")
    return number


MAX_CONCURRENT = 2**53
"""The largest ``max_concurrent`` of an adaptive bulkhead: its limit is a float, exact to here."""


class _AdaptiveBulkhead(Bulkhead):
    """What both adaptive bulkheads share: the sample path and the moving limit."""

    __slots__ = ("_admitted", "_algorithm", "_ceiling", "_floor", "_now_ns", "_period_at", "_run", "_site", "_skip",
                 "_stride")

    _algorithm: AimdLimit | Gradient2Limit

    def _setup(self, max_concurrent: int, min_concurrent: int, clock: Clock | None) -> None:
        check_label(self._label)
        if clock is not None:
            check_clock(clock)
        # Two clock reads per call: the system clock's own function saves a Python frame each.
        self._now_ns = time.monotonic_ns if type(self._clock) is SystemClock else self._clock.now_ns
        # Which calls are timed (module docstring): untimed admissions left before the next
        # timed one (drawn as a run of ``_run``), the stride (1 / the probability of being
        # timed), the admissions at once counted since ``_period_at``, and the random stream the
        # runs are drawn from (the constructor's caller's).
        self._skip = self._run = self._admitted = 0
        self._stride = 1
        self._period_at: int | None = None
        self._site = _random.call_site(2)
        # The limit moves as a float: a ceiling is exact as one (and never overflows it).
        self._ceiling = check_int(max_concurrent, "max_concurrent", minimum=1, maximum=MAX_CONCURRENT)
        self._floor = check_int(min_concurrent, "min_concurrent", minimum=1)
        if self._floor > max_concurrent:
            raise ValueError(f"min_concurrent must be in [1, max_concurrent={max_concurrent}], got {min_concurrent!r}")
        if self._managed is None:
            # A moving limit needs the limit-aware hand-over even with no queue option set.
            self._managed = ManagedQueue(None, self._interval_ns, False, False)

    @property
    def max_concurrent(self) -> int:
        """The ceiling (and initial value) of the limit."""
        return self._ceiling

    @property
    def min_concurrent(self) -> int:
        """The floor of the limit."""
        return self._floor

    def _settings(self) -> dict[str, Any]:
        return {**super()._settings(), "max_concurrent": self._ceiling, "min_concurrent": self._floor}

    def _retune(self, **changes: Any) -> None:
        """Swap the configuration live (stoic.ControlPlane.retune), validated by the constructor
        (``ValueError`` naming the parameter; the bulkhead unchanged). The limit starts afresh
        at ``max_concurrent`` with a new algorithm (what the old one learnt is dropped), emitting
        ``bulkhead.limit_changed`` (cause ``retune``) when that moves it; calls running keep
        their slots, and waiters get the slots a higher limit frees at once."""
        fresh = validated(self, self._settings(), changes)
        managed = self._managed
        assert managed is not None and fresh._managed is not None
        self._queue_limit, self._interval_ns = fresh._queue_limit, fresh._interval_ns
        managed.retune(fresh._managed)
        self._ceiling, self._floor, self._algorithm = fresh._ceiling, fresh._floor, fresh._algorithm
        if fresh._max != self._max:
            self._apply(Change(self._max, fresh._max, "retune"))

    def _apply(self, change: Change) -> None:
        self._max = change.new
        if _SINKS.wants(Level.INFO):
            emit("bulkhead.limit_changed", self._label, Level.INFO, self._clock.now_ns(),
                 {"old": change.old, "new": change.new, "cause": change.cause})
        if change.new > change.old:
            managed = self._managed
            assert managed is not None
            managed.fill(self)

    async def execute(self, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``await fn(*args, **kwargs)`` in a slot, waiting if the queue allows, and feed its
        latency to the limit (when the call is timed: see the module docstring).

        Returns what ``fn`` returns; its exceptions propagate unchanged and the slot is released
        however it ends. Raises ``BulkheadFull``, ``Shed`` or ``DeadlineExceeded`` (``fn`` never
        ran) when refused.
        """
        # A free slot says that nobody waits, as in the fixed bulkhead, although the limit moves:
        # a caller parks only while every slot is taken; a shrunk limit retires released slots
        # down to the limit, never below it while anyone waits; a grown one hands its new slots
        # to waiters at once (ManagedQueue.fill). So a newcomer never passes a waiter here.
        skip = self._skip
        if skip and self._active < self._max and (not _deadline.ever_set or _deadline_scope.get() is None):
            # Untimed: the fixed bulkhead's path plus this countdown; a drop is still a sample.
            self._skip = skip - 1
            self._active += 1
            try:
                return await (fn(*args, **kwargs) if kwargs else fn(*args))  # type: ignore[call-arg]
            except BaseException as exc:
                self._dropped(exc, None, self._active)
                raise
            finally:
                if self._waiters:
                    self._release()
                else:
                    self._active -= 1
        return await self._timed(fn, args, kwargs)

    async def _timed(self, fn: Callable[..., Awaitable[T]], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
        """:meth:`execute` for a call that is timed (module docstring, "which calls are timed")."""
        if self._active < self._max and (not _deadline.ever_set or _deadline_scope.get() is None):  # (as in execute)
            self._active += 1
            now_ns = self._now_ns  # (read as an attribute, then called: a slot's method call is slower)
            start = now_ns()
            # Pace the timed calls. Inline: the attributes of a helper shared by both classes
            # would run unspecialised (see _own_copy).
            weight = stride = self._stride  # this call was timed with probability 1 / stride
            admitted = self._admitted + self._run + 1  # the untimed run before it, and itself
            began = self._period_at
            if began is None:
                self._period_at, admitted = start, 0
            elif start - began >= PERIOD_NS:
                # The rate over the period sets the stride: a timed call per TIMED_GAP_NS.
                stride = admitted * TIMED_GAP_NS // (start - began)
                stride = self._stride = 1 if stride < 1 else MAX_STRIDE if stride > MAX_STRIDE else stride
                self._period_at, admitted = start, 0
            self._admitted = admitted
            if stride > 1:
                # How many of the next calls admitted at once go untimed: a geometric count, so
                # each is timed with probability 1 / stride whatever its place (first or last of
                # a burst, say), which the weight undoes in expectation. Capped at eight strides
                # (a tail of probability e**-8, so the weights over-count by 0.03 %): a fallen
                # rate goes unseen for no longer.
                run = int(log(1.0 - _random.stream(self._site).random()) * _RUN_SCALE[stride])
                self._skip = self._run = run if run < 8 * stride else 8 * stride
            else:
                self._run = 0
        else:
            await self._enter_slow()
            now_ns = self._now_ns
            start = now_ns()
            weight = 1  # admitted after waiting (or under a deadline): always timed, for itself
        in_flight = self._active
        try:
            result = await (fn(*args, **kwargs) if kwargs else fn(*args))
        except BaseException as exc:
            try:
                self._dropped(exc, start, in_flight, weight)
            finally:
                self._exit()
            raise
        try:
            now = now_ns()
            if _admission_state.waits:
                # Field report 20: time the call spent queued in an inner stage (a bulkhead, a
                # rate limiter) is local queueing, not the dependency's latency.
                start = _admission.admitted_since(self._clock, start)
            algorithm = self._algorithm
            # Where a success changes nothing (AIMD: in budget, no evidence for growth) the sample
            # is skipped; Gradient2 takes every one (it accumulates into its window).
            if now - start > algorithm.fast_ns or in_flight >= algorithm.grow_from:
                change = algorithm.sample(now, now - start, in_flight, False, weight)
                if change is not None:
                    self._apply(change)  # (a sink raising a BaseException here keeps no slot)
        finally:
            if self._waiters:
                self._release()
            else:
                self._active -= 1
        return result

    def _dropped(self, error: BaseException, start: int | None, in_flight: int, weight: int = 1) -> None:
        """The operation raised: feed a drop to the limit if it was one (``start`` None: the call
        was not timed, its latency is unknown). The caller gives the slot back."""
        if _is_drop(error):
            now = self._now_ns()
            if start is not None and _admission_state.waits:
                start = _admission.admitted_since(self._clock, start)  # (as in _timed)
            change = self._algorithm.sample(now, -1 if start is None else now - start, in_flight, True, weight)
            if change is not None:
                self._apply(change)

    def _exit(self) -> None:
        if self._waiters:
            self._release()
        else:
            self._active -= 1

    async def __aenter__(self) -> Bulkhead:
        raise TypeError(f"{type(self).__name__} measures each call: use execute() or decorate the function")

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        raise TypeError(f"{type(self).__name__} measures each call: use execute() or decorate the function")

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(limit={self._max}, max_concurrent={self._ceiling}, "
                f"min_concurrent={self._floor}, label={self._label!r}, in_use={self._active}, "
                f"queued={len(self._waiters)})")


class AdaptiveBulkhead(_AdaptiveBulkhead):
    """A bulkhead whose limit is set by latency with AIMD (seed 003, "Adaptive (AIMD)").

    ``AdaptiveBulkhead(*, latency_threshold, max_concurrent, min_concurrent=1, queue_limit=0,
    backoff_ratio=0.9, increase_step=1.0, cooldown=1.0, latency_quantile=None, label,
    clock=None, queue_target=None, queue_interval=0.1, queue_adaptive_lifo=False,
    prioritized=False, latency_digest=None)``

    - ``latency_threshold`` (seconds > 0): a completion slower than this is congestion.
    - ``max_concurrent`` (int in [1, 2**53]): the ceiling and the initial limit.
    - ``min_concurrent`` (int in [1, max_concurrent]): the floor.
    - ``backoff_ratio`` (in (0, 1)): the limit is multiplied by it on a breach, at most once per
      ``cooldown`` (seconds > 0).
    - ``increase_step`` (finite, > 0): an in-budget completion adds ``increase_step / limit``, only while
      at least half the limit is in use.
    - ``latency_quantile`` (in (0, 1), or None): when set, a breach is the windowed P-squared
      estimate of that quantile exceeding the threshold (200 samples of the estimate per epoch:
      every completion while it warms up, one in 8 after, so about 1,250 completions for 0.9; a
      backoff starts a fresh epoch), so a single outlier cannot halve the limit.
    - ``latency_digest``: a :class:`stoic.fleet.SharedLatency` (requires ``latency_quantile``):
      the quantile is the fleet's, merged from every replica's samples in the store, and this
      replica's own estimate only while the fleet's is unknown (docs/fleet.md, "Latency signal").
    - ``queue_limit`` and the queue options: as for :class:`stoic.Bulkhead`.

    Read-only: ``limit`` (int, admission limit now), ``in_use``, ``queued``. Use ``await
    execute(fn, ...)`` or ``@bulkhead`` (not ``async with``: each call is measured). Raises
    ``ValueError`` naming the parameter and its range for bad configuration; at call time,
    ``BulkheadFull``, ``Shed`` or ``DeadlineExceeded`` when refused.
    """

    __slots__ = ()

    def _settings(self) -> dict[str, Any]:
        aimd = self._algorithm
        assert isinstance(aimd, AimdLimit)
        return {**super()._settings(), "latency_threshold": to_seconds(aimd.threshold_ns),
                "backoff_ratio": aimd.backoff_ratio, "increase_step": aimd.increase_step,
                "cooldown": to_seconds(aimd.cooldown_ns), "latency_quantile": aimd.quantile,
                "latency_digest": aimd._digest}

    def __init__(
        self, *, latency_threshold: Seconds, max_concurrent: int, min_concurrent: int = 1,
        queue_limit: int | None = 0, backoff_ratio: float = 0.9, increase_step: float = 1.0,
        cooldown: Seconds = 1.0, latency_quantile: float | None = None, label: str, clock: Clock | None = None,
        queue_target: Seconds | None = None, queue_interval: Seconds = 0.1, queue_adaptive_lifo: bool = False,
        prioritized: bool = False, latency_digest: SharedLatency | None = None,
    ) -> None:
        super().__init__(max_concurrent, queue_limit=queue_limit, label=label, clock=clock,
                         queue_target=queue_target, queue_interval=queue_interval,
                         queue_adaptive_lifo=queue_adaptive_lifo, prioritized=prioritized)
        self._setup(max_concurrent, min_concurrent, clock)
        if latency_digest is not None:
            from .fleet._latency import check_digest

            if latency_quantile is None:
                raise ValueError("latency_digest requires latency_quantile (it shares the quantile's samples)")
            check_digest(latency_digest, "latency_digest")
        self._algorithm = AimdLimit(
            threshold_ns=to_ns(latency_threshold, "latency_threshold"), maximum=max_concurrent,
            minimum=self._floor,
            backoff_ratio=_check_number(backoff_ratio, "backoff_ratio", 0.0, 1.0, low_open=True, high_open=True),
            increase_step=_check_number(increase_step, "increase_step", 0.0, None, low_open=True, high_open=False),
            cooldown_ns=to_ns(cooldown, "cooldown"),
            quantile=None if latency_quantile is None else _check_quantile(latency_quantile, "latency_quantile"),
            digest=latency_digest,
        )

    execute = _own_copy(_AdaptiveBulkhead.execute)
    _timed = _own_copy(_AdaptiveBulkhead._timed)


class GradientBulkhead(_AdaptiveBulkhead):
    """A bulkhead whose limit follows the latency gradient: Gradient2 (seed 003, "Gradient";
    Netflix concurrency-limits' ``Gradient2Limit``, with two faults fixed, see
    :class:`stoic._limits.Gradient2Limit`).

    ``GradientBulkhead(*, max_concurrent, min_concurrent=1, queue_limit=0, rtt_tolerance=1.5,
    smoothing=0.2, long_window=600, headroom=4.0, label, clock=None, queue_target=None,
    queue_interval=0.1, queue_adaptive_lifo=False, prioritized=False)``

    - ``max_concurrent`` (int in [1, 2**53]): the ceiling and the initial limit; ``min_concurrent``
      (int in [1, max_concurrent]) the floor.
    - ``rtt_tolerance`` (finite, >= 1): how much the short-term latency may exceed the long-term one
      before the limit contracts (1.5: a 50 % rise).
    - ``smoothing`` (in (0, 1]): how far each update moves towards its target.
    - ``long_window`` (int in [1, 2**53]): the long-term latency is an exponential average over
      this many sample windows.
    - ``headroom`` (finite, >= 0): slots added to the target while the gradient is 1 (no queueing seen).

    The limit updates once per sample window of at least 10 samples and about a second.
    Read-only: ``limit``, ``in_use``, ``queued``. Same calls and errors as
    :class:`AdaptiveBulkhead`.
    """

    __slots__ = ()

    def _settings(self) -> dict[str, Any]:
        gradient = self._algorithm
        assert isinstance(gradient, Gradient2Limit)
        return {**super()._settings(), "rtt_tolerance": gradient.rtt_tolerance, "smoothing": gradient.smoothing,
                "long_window": gradient.long_window, "headroom": gradient.headroom}

    def __init__(
        self, *, max_concurrent: int, min_concurrent: int = 1, queue_limit: int | None = 0,
        rtt_tolerance: float = 1.5, smoothing: float = 0.2, long_window: int = 600, headroom: float = 4.0,
        label: str, clock: Clock | None = None, queue_target: Seconds | None = None,
        queue_interval: Seconds = 0.1, queue_adaptive_lifo: bool = False, prioritized: bool = False,
    ) -> None:
        super().__init__(max_concurrent, queue_limit=queue_limit, label=label, clock=clock,
                         queue_target=queue_target, queue_interval=queue_interval,
                         queue_adaptive_lifo=queue_adaptive_lifo, prioritized=prioritized)
        self._setup(max_concurrent, min_concurrent, clock)
        self._algorithm = Gradient2Limit(
            maximum=max_concurrent, minimum=self._floor,
            rtt_tolerance=_check_number(rtt_tolerance, "rtt_tolerance", 1.0, None, low_open=False, high_open=False),
            smoothing=_check_number(smoothing, "smoothing", 0.0, 1.0, low_open=True, high_open=False),
            # (At most 2**53: its factor 2 / (long_window + 1) is a float, from the 11th window on.)
            long_window=check_int(long_window, "long_window", minimum=1, maximum=MAX_CONCURRENT),
            headroom=_check_number(headroom, "headroom", 0.0, None, low_open=False, high_open=False),
        )

    execute = _own_copy(_AdaptiveBulkhead.execute)
    _timed = _own_copy(_AdaptiveBulkhead._timed)


__all__ = ["AdaptiveBulkhead", "GradientBulkhead"]
