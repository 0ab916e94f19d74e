"""The rate limiter: an exact token bucket with a bounded FIFO queue (seed 000, "RateLimiter").

``rate`` permits per ``per`` seconds, a bucket of ``burst`` permits (default ``rate``), full at
creation. The bucket is kept in integer units: one permit costs ``per_ns / g`` units and each
elapsed nanosecond earns ``rate / g`` units (``g`` their greatest common divisor, which keeps the
numbers small), so refill is one multiplication with no rounding, and the time to afford a
request is one ceiling division. What is stored is the *deficit*, the units missing from a full
bucket at the last refill: a bucket that was full needs no refill at all. Refill is computed
lazily from the elapsed time on the limiter's (monotonic) clock; nothing ticks.

Invariant (what the tests check): permits granted by time ``t`` after creation never exceed
``burst + rate * t / per``, and equal it (to the permit) while demand never lets the bucket idle.

:class:`RateLimiter` serves asyncio tasks; :class:`BlockingRateLimiter` serves threads with the
same arithmetic, queue and events. Neither binds to an event loop: a waiter's future is made on
the loop the waiter runs on, so one limiter serves successive ``asyncio.run`` calls. The asyncio
limiter is, like asyncio's own primitives, for the tasks of one event loop at a time: its
decisions contain no ``await``, so they are atomic on the loop without a lock (which keeps the
success path cheap). The blocking limiter keeps its state under a ``threading.Lock``.
"""

from __future__ import annotations

import functools
import math
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from types import MappingProxyType, TracebackType
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, overload

from . import _deadline, _metrics, _source
from ._admission import admitted_after_wait, refused_after_wait
from ._clock import Clock, SystemClock, resolve_clock, wait_on_clock, wait_until
from ._deadline import _current as _deadline_scope
from ._deadline import cancelled_by_deadline, remaining_ns
from ._durations import Seconds, check_int, check_label, to_ns, to_seconds
from ._errors import DeadlineExceeded, RateLimited
from ._policy import (
    UNRUN_RESULTS,
    is_async_callable,
    refuse_generator_function,
    refuse_unrun_result,
    through_method_decorators,
)
from ._retune import validated
from ._wakeup import wake
from .events import AttributeValue, Level, emit
from .events._sinks import kind_floor

if TYPE_CHECKING:
    import asyncio
else:  # imported on first use (stoic._lazy)
    from ._lazy import lazy_asyncio

    asyncio = lazy_asyncio(globals())

# The sinks wanting ratelimiter events (stoic.events._sinks.KindFloor): a sink that wants none of
# them leaves these events unbuilt.
_SINKS = kind_floor("ratelimiter")

P = ParamSpec("P")
T = TypeVar("T")

_NO_ATTRIBUTES: MappingProxyType[str, AttributeValue] = MappingProxyType({})
# The common request is one permit: ``permits is _ONE`` (CPython's one small int 1) lets it skip
# the type and range checks in one identity test; anything else equal to 1 takes the checked path.
_ONE = 1


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class _Waiter:
    """One queued request. ``future`` (asyncio) or ``cond`` (threads) is how it is woken when it
    reaches the head of the queue; ``queued`` turns false once it has left (served or not)."""

    __slots__ = ("cond", "future", "head", "nap", "permits", "queued")

    def __init__(self, permits: int) -> None:
        self.permits = permits
        self.queued = True
        self.head = False
        self.future: asyncio.Future[None] | None = None
        self.cond: threading.Condition | None = None
        # The asyncio head's sleep until its permits are affordable: woken early by a retune, so
        # that a faster rate serves the queue at once instead of at the instant the old rate set.
        self.nap: asyncio.Future[None] | None = None


class _TokenBucket:
    """The arithmetic and the queue shared by the asyncio and the blocking limiter."""

    __slots__ = (
        "__weakref__", "_burst", "_capacity", "_clock", "_cost", "_deficit", "_earn", "_label", "_lock", "_now",
        "_per_ns", "_queue_limit", "_queued", "_rate", "_rec", "_stamp", "_waiters",
    )

    def __init__(
        self,
        rate: int,
        per: Seconds = 1.0,
        *,
        burst: int | None = None,
        queue_limit: int | None = 100,
        label: str,
        clock: Clock | None = None,
    ) -> None:
        self._rate = check_int(rate, "rate", minimum=1)
        self._per_ns = to_ns(per, "per")
        self._burst = self._rate if burst is None else check_int(burst, "burst", minimum=1)
        self._queue_limit = None if queue_limit is None else check_int(queue_limit, "queue_limit", minimum=0)
        self._label = check_label(label)
        self._clock: Clock = resolve_clock(clock)
        # The system clock is read directly: one call less on every acquire.
        self._now: Callable[[], int] = time.monotonic_ns if type(self._clock) is SystemClock else self._clock.now_ns
        unit = math.gcd(self._rate, self._per_ns)
        self._earn = self._rate // unit  # units earned per nanosecond
        self._cost = self._per_ns // unit  # units one permit costs
        self._capacity = self._burst * self._cost
        self._deficit = 0  # full at creation
        self._stamp = self._now()
        self._waiters: deque[_Waiter] = deque()
        self._queued = 0  # permits asked for by everyone in the queue
        self._lock = threading.Lock()
        self._rec = _metrics.recorder("ratelimiter", label, self)

    # --- read-only configuration and gauges ---
    @property
    def label(self) -> str:
        """The label carried by every event of this limiter."""
        return self._label

    @property
    def rate(self) -> int:
        """Permits earned per ``per`` seconds."""
        return self._rate

    @property
    def per(self) -> float:
        """The refill interval in seconds."""
        return to_seconds(self._per_ns)

    @property
    def burst(self) -> int:
        """The bucket's size: the most permits that can be granted at one instant."""
        return self._burst

    @property
    def queue_limit(self) -> int | None:
        """How many requests may wait (``None``: unbounded)."""
        return self._queue_limit

    @property
    def available_permits(self) -> int:
        """Whole permits in the bucket now (credit a queued head is saving up included).

        A read only: it computes the refill without writing the bucket, so a metrics exporter
        reading it from its own thread can never race the asyncio limiter's lock-free grants
        (the figure may be a moment old, never wrong for the calls)."""
        deficit, stamp = self._deficit, self._stamp
        missing = deficit - (self._now() - stamp) * self._earn
        credit = self._capacity - missing if missing > 0 else self._capacity
        return max(credit, 0) // self._cost

    @property
    def waiter_count(self) -> int:
        """Requests queued now."""
        return len(self._waiters)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(rate={self._rate}, per={self.per!r}, burst={self._burst}, "
            f"queue_limit={self._queue_limit}, label={self._label!r})"
        )

    # --- arithmetic (the blocking limiter's callers hold its lock) ---
    def _take(self, now: int, cost: int) -> bool:
        """The refill rule, and the one grant made at ``now``: earn ``_earn`` units per elapsed
        nanosecond, capped at the bucket's size, then take ``cost`` units (at most the bucket's
        size) if the bucket holds them. True when taken (``cost`` 0 only refills). Every path
        that grants at once (the asyncio and blocking ``acquire``, ``try_acquire``, ``execute``,
        ``call``) calls this.
        """
        # (The fewest operations: this runs on every granted call. A bucket full at the last
        # refill stays full, whatever the time since; one that earned its deficit back is full,
        # so it then holds ``cost`` less, without the arithmetic of the cap.)
        deficit = self._deficit
        if deficit:
            earned = (now - self._stamp) * self._earn
            if earned < deficit:
                deficit += cost - earned
                if deficit > self._capacity:
                    self._deficit = deficit - cost
                    self._stamp = now
                    return False
            else:
                deficit = cost  # full again: what was earned beyond the cap is not added
        else:
            deficit = cost
        self._deficit = deficit
        self._stamp = now
        return True

    def _wait_ns(self, permits: int) -> int:
        """Nanoseconds until a request joining the queue now would be served: the cost of
        everyone ahead plus its own, less the credit, at ``_earn`` units per nanosecond."""
        missing = (self._queued + permits) * self._cost - self._capacity + self._deficit
        return -(-missing // self._earn) if missing > 0 else 0

    def _serve_head(self, now: int, cost: int) -> int:
        """Serve the head of the queue if its ``cost`` (units) is affordable at ``now``: returns 0
        when served, else the nanoseconds until it will be.

        The head sleeps until the first whole nanosecond at which its cost has been earned, which
        is up to one nanosecond's refill after the exact instant. The cap is applied after the
        cost is taken, not before, so that overshoot stays in the bucket even when cost plus
        overshoot exceeds the cap: in exact time the head was served at the exact instant and
        the overshoot was earned after it. Nothing is earned twice, nothing is lost, and waiters
        are served at ``burst + rate * t / per`` exactly. (Until its cost is earned the credit is
        below the cost, hence below the cap, so the cap cannot have bound in between.)
        """
        raw = self._deficit - (now - self._stamp) * self._earn  # below 0: earned beyond the cap
        self._stamp = now
        missing = raw + cost - self._capacity
        if missing <= 0:
            raw += cost
            self._deficit = raw if raw > 0 else 0
            return 0
        self._deficit = raw  # short of the cost, so the bucket is below the cap
        return -(-missing // self._earn)

    def _leave(self, waiter: _Waiter) -> None:
        """Take ``waiter`` out of the queue; if it was the head, wake the next one."""
        waiters = self._waiters
        waiter.queued = False
        self._queued -= waiter.permits
        if waiters[0] is waiter:
            waiters.popleft()
            self._wake_head()
        else:
            waiters.remove(waiter)

    def _drop_abandoned_head(self) -> bool:
        """Drop a head abandoned on an event loop closed without cancelling it (it will never
        resume or leave, so it must not hold up live callers); True if one was dropped."""
        future = self._waiters[0].future
        if future is not None and future.get_loop().is_closed():
            self._leave(self._waiters[0])
            return True
        return False

    def _wake_head(self) -> None:
        # One wake-up per departure from the head: the next waiter computes its own wait.
        waiters = self._waiters
        while waiters:
            head = waiters[0]
            head.head = True
            if head.cond is not None:
                head.cond.notify()
                return
            if head.future is None or wake(head.future):
                return
            # Its event loop is closed: nobody can resume it, so it must not block the queue.
            waiters.popleft()
            head.queued = False
            self._queued -= head.permits

    # --- the control plane ---
    def _retune(self, **changes: Any) -> None:
        """Swap ``rate``, ``per``, ``burst`` and ``queue_limit`` live (stoic.ControlPlane.retune),
        validated by the constructor (``ValueError`` naming the parameter; the limiter unchanged).

        The credit earned at the old rate up to now is kept as the same number of permits (capped
        at the new burst); waiters keep their places and pay the new price when served (the
        asyncio head asleep is woken to recompute its wait at once, and so is a blocking head on
        the system clock or a ``stoic.testing.VirtualClock``; a blocking head on a clock of
        another kind, whose ``sleep_until_blocking`` cannot be interrupted, wakes at the
        instant it computed). A
        burst that follows the rate (built without ``burst``, or equal to ``rate``) keeps
        following it. ``ValueError``
        naming ``burst`` when a queued request asks more permits than the new burst could hold.
        """
        with self._lock:
            # The settings are read under the lock: a retune from another thread landing between
            # that read and this one's writes would be undone by them.
            fresh = self._validated(changes)
            self._check_retune(fresh)
            self._retune_apply(fresh)

    def _retune_prepare(self, changes: dict[str, Any]) -> _TokenBucket:
        """The validated configuration :meth:`_retune` would take, for a caller holding ``_lock``
        (stoic.Keyed, which holds every key's lock across its checks and its changes; then
        :meth:`_check_retune` and :meth:`_retune_apply`)."""
        return self._validated(changes)

    def _retune_apply(self, fresh: _TokenBucket) -> None:
        """Take ``fresh``'s configuration (checked by :meth:`_check_retune`), holding ``_lock``."""
        self._take(self._now(), 0)  # earned at the old rate up to this instant
        credit = (self._capacity - self._deficit) * fresh._cost // self._cost  # the same permits, new units
        self._rate, self._per_ns, self._burst = fresh._rate, fresh._per_ns, fresh._burst
        self._queue_limit, self._earn, self._cost = fresh._queue_limit, fresh._earn, fresh._cost
        self._capacity = fresh._capacity
        self._deficit = self._capacity - min(credit, self._capacity)
        head = self._waiters[0] if self._waiters else None
        if head is not None and head.nap is not None:
            wake(head.nap)  # the asyncio head recomputes its wait at the new price
        elif head is not None and head.cond is not None:
            head.cond.notify()  # so does a blocking head waiting on its condition

    def _validated(self, changes: dict[str, Any]) -> _TokenBucket:
        burst = None if self._burst == self._rate else self._burst
        return validated(self, {"rate": self._rate, "per": to_seconds(self._per_ns), "burst": burst,
                                "queue_limit": self._queue_limit}, changes)

    @staticmethod
    def _retuned_config(config: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
        """The constructor keywords ``config`` becomes under ``changes`` by :meth:`_retune`'s rule
        (stoic.Keyed builds its later keys with them, as it retunes the keys it holds): a burst
        that follows the rate (none given, or equal to ``rate``) keeps following it."""
        retuned = {**config, **changes}
        if "burst" not in changes and config.get("burst") is not None and config.get("burst") == config.get("rate"):
            retuned["burst"] = None
        return retuned

    def _check_retune(self, fresh: _TokenBucket) -> None:
        """Refuse a burst that a request already queued could never be served from."""
        largest = max((w.permits for w in self._waiters), default=0)
        if largest > fresh._burst:
            raise ValueError(f"burst must be >= {largest} while a request for {largest} permits waits, "
                             f"got {fresh._burst}")

    def _retune_check(self, **changes: Any) -> None:
        """What :meth:`_retune` would refuse, checked without changing anything (stoic.Keyed checks
        every key before retuning any)."""
        fresh = self._validated(changes)
        with self._lock:
            self._check_retune(fresh)

    # --- validation and events ---
    def _check_permits(self, permits: int) -> None:
        if isinstance(permits, bool) or not isinstance(permits, int) or permits < 1:
            raise ValueError(f"permits must be an integer >= 1, got {permits!r}")

    def _oversized(self, permits: int) -> RateLimited:
        if _metrics.state.enabled:
            self._rec.count_locked(("stoic.ratelimiter.rejections", "oversized"))
        if _SINKS.wants(Level.WARNING):
            emit("ratelimiter.oversized", self._label, Level.WARNING, self._now(),
                 {"permits": permits, "burst": self._burst})
        return RateLimited(
            f"rate limited ({self._label}): {permits} permits can never be granted by a bucket of {self._burst}",
            label=self._label,
        )

    def _past_deadline(self, permits: int) -> DeadlineExceeded:
        """Report a caller found past its ambient deadline before it took anything."""
        self._reject("deadline_exceeded", permits, None)
        return DeadlineExceeded(f"deadline exceeded before acquiring ({self._label})", label=self._label)

    def _reject(self, reason: str, permits: int, wait_ns: int | None) -> None:
        if _metrics.state.enabled:
            self._rec.count_locked(("stoic.ratelimiter.rejections", reason))
        if _SINKS.wants(Level.INFO):
            attributes: dict[str, AttributeValue] = {"reason": reason, "permits": permits}
            if wait_ns is not None:
                attributes["retry_after"] = wait_ns / 1e9
            emit("ratelimiter.rejected", self._label, Level.INFO, self._now(), attributes)

    def _waited(self, permits: int, start_ns: int) -> None:
        if _metrics.state.enabled:
            self._rec.observe_locked(("stoic.ratelimiter.wait.duration",), self._now() - start_ns)
        if _SINKS.wants(Level.DEBUG):
            now = self._now()
            emit("ratelimiter.waited", self._label, Level.DEBUG, now,
                 {"permits": permits, "waited": (now - start_ns) / 1e9})


# Whether a call's permit is granted at once, as source (stoic._source): nobody queued, no
# ambient deadline to check, enough credit (taken by the test). ``{l}`` is the limiter.
GRANTED = ("not {l}._waiters and (not stoic_deadline.ever_set or stoic_deadline_get() is None)"
           " and {l}._take({l}._now(), {l}._cost)")


def stage(l: str, p: str, body: str) -> str:  # noqa: E741 (the limiter, as in GRANTED)
    """The limiter's part of a call before ``body`` (both at indent 0): the permit, waited for
    in the queue unless granted at once."""
    return f"if not ({GRANTED.format(l=l)}):\n    await {l}._acquire_slow(1)\n{body}"


def _execute(doc: str) -> Callable[..., Any]:
    source = (f"def execute(stoic_self, stoic_fn, /, *stoic_args, **stoic_kwargs):\n"
              f"    if {GRANTED.format(l='stoic_self')}:\n"
              "        return stoic_fn(*stoic_args, **stoic_kwargs) if stoic_kwargs else stoic_fn(*stoic_args)\n"
              "    return stoic_self._execute_queued(stoic_fn, stoic_args, stoic_kwargs)\n")
    return _source.compile_method(source, "RateLimiter.execute", doc, __name__)


class RateLimiter(_TokenBucket):
    """An exact token-bucket rate limiter for asyncio (seed 000, "RateLimiter").

    ``RateLimiter(rate, per=1.0, *, burst=None, queue_limit=100, label, clock=None)``:

    - ``rate``: permits earned per ``per`` seconds, an int >= 1;
    - ``per``: the interval in seconds (float or timedelta) > 0;
    - ``burst``: the bucket's size, an int >= 1 (default ``rate``); the bucket starts full;
    - ``queue_limit``: how many requests may wait, an int >= 0, or ``None`` for unbounded
      (still bounded by cancellation and deadlines); 0 never waits;
    - ``label``: carried by every event; ``clock``: the clock it measures time on for life
      (default: the ambient clock at construction).

    Raises ``ValueError`` naming the parameter when a value is outside its range.

    Use ``await limiter.acquire(permits)``, ``await limiter.execute(fn, *args, **kwargs)``,
    ``@limiter`` on an async function, or ``async with limiter:`` (one permit). A permit taken is
    spent: a failing operation does not give it back (a limiter limits attempts).
    """

    __slots__ = ()

    def try_acquire(self, permits: int = 1) -> bool:
        """Take ``permits`` (an int >= 1) now if the bucket holds them and nobody is queued.

        Returns True when taken. Never waits and never overtakes a waiter: False whenever anyone
        is queued, even if the bucket could afford it. A request above ``burst`` returns False
        (and emits ``ratelimiter.oversized``). Raises ``ValueError`` for ``permits`` < 1.
        """
        if permits is not _ONE:  # 1.0, True and int subclasses are checked (1.0 and True are refused)
            self._check_permits(permits)
            if permits > self._burst:
                self._oversized(permits)
                return False
        # Nobody may be overtaken, but a head on a closed loop is nobody.
        if self._waiters and not (self._drop_abandoned_head() and not self._waiters):
            return False
        return self._take(self._now(), permits * self._cost)

    async def acquire(self, permits: int = 1) -> None:
        """Take ``permits`` (an int >= 1), waiting in FIFO order if needed.

        Takes them at once when the bucket holds enough and nobody is queued. Otherwise it
        computes when it would be served and decides before waiting at all:

        - ``RateLimited`` (``retry_after`` = that wait in seconds) when it would be served at or
          after the ambient deadline (``stoic.timeout``), or the queue already holds
          ``queue_limit`` waiters; nothing is queued or consumed;
        - ``RateLimited`` (``retry_after`` None) at once when ``permits`` exceeds ``burst``;
        - ``DeadlineExceeded`` when the ambient deadline has already passed;
        - ``ValueError`` when ``permits`` < 1.

        A waiter that is cancelled (or cut by a deadline) leaves without consuming anything and
        re-raises ``asyncio.CancelledError``.
        """
        cost = self._cost
        if permits is not _ONE:  # 1.0, True and int subclasses are checked (1.0 and True are refused)
            self._check_permits(permits)
            if permits > self._burst:
                raise self._oversized(permits)
            cost *= permits
        if (
            not self._waiters
            and (not _deadline.ever_set or _deadline_scope.get() is None)
            and self._take(self._now(), cost)
        ):
            return
        await self._acquire_slow(permits)

    async def _acquire_slow(self, permits: int) -> None:
        left = remaining_ns(self._clock)
        if left is not None and left <= 0:
            raise self._past_deadline(permits)
        cost = permits * self._cost
        loop = asyncio.get_running_loop()
        reason = ""
        now = self._now()
        waiters = self._waiters
        if waiters and self._drop_abandoned_head() and not waiters and self._take(now, cost):
            return
        if self._take(now, 0 if waiters else cost) and not waiters:
            return
        wait = self._wait_ns(permits)
        if left is not None and wait >= left:
            reason = "would_exceed_deadline"
        elif self._queue_limit is not None and len(waiters) >= self._queue_limit:
            reason = "queue_full"
        else:
            waiter = _Waiter(permits)
            # Every waiter gets a future on its own loop: the head is not woken through it, but
            # its loop tells whether the waiter can still run.
            waiter.future = loop_future = loop.create_future()
            waiter.head = not waiters
            waiters.append(waiter)
            self._queued += permits
        if reason:
            self._reject(reason, permits, wait)
            raise RateLimited(label=self._label, retry_after=wait / 1e9)
        start = now
        try:
            if not waiter.head:
                await loop_future
            # At the head: only the head sleeps, and it recomputes after every wake-up, so a
            # late wake-up or a departed waiter never leaves earned credit unspent.
            while True:
                now = self._now()
                wait = self._serve_head(now, permits * self._cost)  # (the price may be retuned meanwhile)
                if not wait:
                    self._leave(waiter)
                    break
                nap = waiter.nap = loop.create_future()
                timer = self._clock.call_at(now + wait, functools.partial(_resolve, nap))
                try:
                    await nap
                finally:
                    timer.cancel()
                    waiter.nap = None
        except BaseException as exc:
            if waiter.queued:
                self._leave(waiter)
            if isinstance(exc, asyncio.CancelledError):
                self._reject("deadline_exceeded" if cancelled_by_deadline() else "cancelled", permits, None)
            # Left the queue unadmitted: the wait was local queueing all the same (an operation
            # catching this, a sub-step's own timeout, is not slow for it).
            refused_after_wait(self._clock, self._now(), start)
            raise
        admitted_after_wait(self._clock, now, start)  # the breaker outside leaves the wait out
        self._waited(permits, start)

    _EXECUTE_DOC = """Take one permit (as :meth:`acquire`), then run ``fn(*args, **kwargs)``; await the result.

        ``await limiter.execute(fn, ...)`` returns what ``fn`` returns; its exceptions propagate
        unchanged. Raises what :meth:`acquire` raises when the permit is refused (``fn`` then
        never runs).

        A plain method that returns a coroutine: when the bucket can grant the permit at once
        (nobody queued, enough credit) it is taken right here and ``fn``'s own coroutine is
        returned, so a granted call costs no coroutine of the limiter's own. Otherwise the
        returned coroutine queues and waits when it is awaited. Either way a permit once taken is
        spent, even if the returned coroutine is never awaited (a limiter limits attempts).
        """

    if TYPE_CHECKING:  # fn's own awaitable is returned when granted at once: a coroutine for a coroutine
        @overload
        def execute(
            self, fn: Callable[P, Coroutine[Any, Any, T]], /, *args: P.args, **kwargs: P.kwargs
        ) -> Coroutine[Any, Any, T]: ...

        @overload
        def execute(self, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs) -> Awaitable[T]: ...

        def execute(self, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs) -> Awaitable[T]: ...
    else:  # compiled from GRANTED, as a pipeline that fuses this limiter is (stoic._source)
        execute = _execute(_EXECUTE_DOC)

    async def _execute_queued(
        self, fn: Callable[..., Coroutine[Any, Any, T]], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> T:
        await self._acquire_slow(1)
        return await fn(*args, **kwargs)

    @through_method_decorators
    def __call__(self, fn: Callable[P, Awaitable[T]]) -> Callable[P, Coroutine[Any, Any, T]]:
        """Decorate an async function so every call takes one permit first.

        Raises ``TypeError`` for a plain function (use :class:`BlockingRateLimiter`).
        """
        if not is_async_callable(fn):
            raise TypeError(f"{type(self).__name__} decorates async functions; use BlockingRateLimiter for {fn!r}")

        @functools.wraps(fn)
        async def limited(*args: P.args, **kwargs: P.kwargs) -> T:
            return await self.execute(fn, *args, **kwargs)

        return limited

    async def __aenter__(self) -> RateLimiter:
        await self.acquire(1)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None


class BlockingRateLimiter(_TokenBucket):
    """The same exact token bucket, queue and events as :class:`RateLimiter`, for threads.

    Same constructor. ``acquire(permits=1, timeout=None)`` blocks the calling thread in FIFO
    order; ``call(fn, *args, **kwargs)``, ``@limiter`` on a plain function and ``with limiter:``
    take one permit. Waiting threads hold no lock: the head sleeps on the limiter's clock
    (``clock.sleep_until_blocking``), the others on a condition until they reach the head.
    """

    __slots__ = ()

    def try_acquire(self, permits: int = 1) -> bool:
        """Take ``permits`` (an int >= 1) now if the bucket holds them and nobody is queued.

        Returns True when taken. Never waits and never overtakes a waiter: False whenever anyone
        is queued, even if the bucket could afford it. A request above ``burst`` returns False
        (and emits ``ratelimiter.oversized``). Raises ``ValueError`` for ``permits`` < 1.
        """
        if permits is not _ONE:  # 1.0, True and int subclasses are checked (1.0 and True are refused)
            self._check_permits(permits)
            if permits > self._burst:
                self._oversized(permits)
                return False
        lock = self._lock
        lock.acquire()  # (acquire/release: half the cost of ``with lock`` on CPython 3.11)
        try:
            # The burst is read again under the lock (as acquire does): a retune from another
            # thread may have lowered it since the check above.
            oversized = permits > self._burst
            if not oversized:
                return not self._waiters and self._take(self._now(), permits * self._cost)
        finally:
            lock.release()
        self._oversized(permits)  # (outside the lock: a sink never runs inside it)
        return False

    def acquire(self, permits: int = 1, timeout: Seconds | None = None) -> None:
        """Take ``permits`` (an int >= 1), blocking in FIFO order for at most ``timeout`` (seconds
        as a float or ``timedelta``, >= 0; ``None``: no limit but the ambient deadline).

        Decides before waiting, like :meth:`RateLimiter.acquire`: ``RateLimited`` (with
        ``retry_after``) when the wait would exceed ``timeout`` (or reach the ambient deadline)
        or the queue is full; ``RateLimited`` (``retry_after`` None) when ``permits`` exceeds
        ``burst``; ``DeadlineExceeded`` when the ambient deadline already passed (at the call,
        or by the time the limiter's lock is taken: nothing is taken then), or when a
        waiter is still unserved at its timeout (possible only if earlier waiters' threads were
        not scheduled in time). ``ValueError`` for ``permits`` < 1 or a ``timeout`` outside
        ``[0, MAX_SECONDS]``; ``TypeError`` for a ``timeout`` that is not a number or ``timedelta``.

        A thread interrupted while queued (``KeyboardInterrupt``, ``SystemExit``, any exception
        raised into its wait) leaves consuming nothing, reports ``ratelimiter.rejected`` with
        reason ``cancelled``, as a cancelled asyncio waiter does, and the exception propagates
        unchanged.
        """
        if permits is not _ONE:  # 1.0, True and int subclasses are checked (1.0 and True are refused)
            self._check_permits(permits)
            if permits > self._burst:
                raise self._oversized(permits)
        limit = None if timeout is None else to_ns(timeout, "timeout", allow_zero=True)
        ambient = remaining_ns(self._clock)
        if ambient is not None and ambient <= 0:
            raise self._past_deadline(permits)
        reason = ""
        served = wait = -1
        called = None if limit is None and ambient is None else self._now()
        queued = False
        try:
            with self._lock:
                now = self._now()
                if called is not None and now > called:
                    # Time spent waiting for the lock counts against the time limits, read before it.
                    late = now - called
                    limit = None if limit is None else limit - late
                    ambient = None if ambient is None else ambient - late
                waiters = self._waiters
                # The burst and the price are read under the lock: a retune from another thread may
                # have changed them since the check above.
                if permits > self._burst:
                    reason = "oversized"
                elif ambient is not None and ambient <= 0:
                    # The deadline ran out while this caller waited for the lock: refused as one found
                    # passed at the call is, taking nothing (not granted after it, nor RateLimited).
                    reason = "deadline_exceeded"
                elif self._take(now, 0 if waiters else permits * self._cost) and not waiters:
                    return
                else:
                    wait = self._wait_ns(permits)
                    if (limit is not None and wait > limit) or (ambient is not None and wait >= ambient):
                        reason = "would_exceed_deadline"
                    elif self._queue_limit is not None and len(waiters) >= self._queue_limit:
                        reason = "queue_full"
                    else:
                        queued = True
                        served = self._wait_locked(permits, now, limit, ambient)
        except BaseException:
            if queued:
                # Interrupted in the queue (a KeyboardInterrupt, any exception out of the wait): it
                # left consuming nothing, and is reported as a cancelled asyncio waiter is, by this
                # thread, outside the lock; the wait was local queueing all the same.
                refused_after_wait(self._clock, self._now(), now)
                self._reject("cancelled", permits, None)
            raise
        if reason == "oversized":
            raise self._oversized(permits)
        if reason == "deadline_exceeded":
            raise self._past_deadline(permits)
        if reason:
            self._reject(reason, permits, wait)
            raise RateLimited(label=self._label, retry_after=wait / 1e9)
        if served < 0:
            # Out of time in the queue: the wait was local queueing all the same.
            refused_after_wait(self._clock, self._now(), now)
            self._reject("deadline_exceeded", permits, None)
            raise DeadlineExceeded(f"timed out waiting for permits ({self._label})", label=self._label)
        # Served after waiting: an outer breaker leaves the wait out of the call's duration.
        admitted_after_wait(self._clock, served, now)
        self._waited(permits, now)

    def _wait_locked(self, permits: int, start: int, limit: int | None, ambient: int | None) -> int:
        """Queue, wait to reach the head, then sleep until affordable. Holds the lock except while
        waiting. Returns the instant it was served, or -1 if the caller's time ran out first (it
        has left the queue)."""
        if limit is None or (ambient is not None and ambient < limit):
            limit = ambient
        give_up = None if limit is None else start + limit
        waiter = _Waiter(permits)
        waiter.cond = threading.Condition(self._lock)
        waiter.head = not self._waiters
        self._waiters.append(waiter)
        self._queued += permits
        try:
            while not waiter.head:
                if give_up is None:
                    waiter.cond.wait()
                else:
                    # Timeouts are computed from the limiter's clock and re-checked against it.
                    left = give_up - self._now()
                    if left <= 0:
                        self._leave(waiter)
                        return -1
                    # On a VirtualClock woken as its time moves (a timeout on virtual time, as
                    # the head's and a blocking bulkhead waiter's).
                    wait_until(self._clock, waiter.cond, give_up, left)
            while True:
                now = self._now()
                wait = self._serve_head(now, permits * self._cost)  # (the price may be retuned meanwhile)
                if not wait:
                    self._leave(waiter)
                    return now
                when = now + wait
                if give_up is not None and when > give_up:
                    self._leave(waiter)
                    return -1
                # On the condition (the system clock, a VirtualClock), so that a retune can wake
                # it to pay the new price now (the loop recomputes the wait however it wakes);
                # another clock is slept through with its own blocking sleep, uninterruptible.
                if not wait_on_clock(self._clock, waiter.cond, when, wait):
                    self._lock.release()
                    try:
                        self._clock.sleep_until_blocking(when)
                    finally:
                        self._lock.acquire()
        except BaseException:
            if waiter.queued:
                self._leave(waiter)
            raise

    def call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Take one permit (as :meth:`acquire` without a timeout), then return ``fn(*args, **kwargs)``.

        ``fn``'s exceptions propagate unchanged; a refusal raises what :meth:`acquire` raises.
        ``fn`` returning a coroutine or a generator (work that would run later, not when the
        permit allowed it) raises ``TypeError``, its cause a :class:`stoic.Defect` (the permit
        is spent).
        """
        taken = False
        if not _deadline.ever_set or _deadline_scope.get() is None:
            lock = self._lock
            lock.acquire()  # (as in try_acquire)
            try:
                taken = not self._waiters and self._take(self._now(), self._cost)
            finally:
                lock.release()
        if not taken:
            self.acquire(1)
        result = fn(*args, **kwargs) if kwargs else fn(*args)  # type: ignore[call-arg]
        if type(result) in UNRUN_RESULTS:  # its body would run later, whenever it is awaited
            refuse_unrun_result(fn, result, "BlockingRateLimiter", "RateLimiter")
        return result

    @through_method_decorators
    def __call__(self, fn: Callable[P, T]) -> Callable[P, T]:
        """Decorate a plain function so every call takes one permit first (blocking). Raises
        ``TypeError`` for an async function (use :class:`RateLimiter`) or a generator function."""
        refuse_generator_function(fn, type(self).__name__)
        if is_async_callable(fn):
            raise TypeError(f"{type(self).__name__} decorates plain functions; use RateLimiter for {fn!r}")

        @functools.wraps(fn)
        def limited(*args: P.args, **kwargs: P.kwargs) -> T:
            return self.call(fn, *args, **kwargs)

        return limited

    def __enter__(self) -> BlockingRateLimiter:
        self.acquire(1)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None


__all__ = ["BlockingRateLimiter", "RateLimiter"]
