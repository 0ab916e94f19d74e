"""The shared rate limiter: one token bucket in Redis for every replica (seed 003, fleet-wide state;
the bucket's contract is seed 000's "RateLimiter").

Each decision is one round trip: ``limiter_take.lua`` refills the bucket from the server's
``TIME`` and takes the permits or answers the exact wait. The credit is the local limiter's exact
integer credit with microseconds (the resolution of ``TIME``) for nanoseconds, and the fraction
``rate / per`` reduced first, so every value the script computes stays below 2**53 and Lua's
doubles hold it exactly. Permits granted fleet-wide by server time ``t`` never exceed
``burst + rate * t / per``.
"""

from __future__ import annotations

import asyncio
import functools
import math
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from types import TracebackType
from typing import Any, ClassVar, Final, ParamSpec, TypeVar

from .. import _metrics
from .._admission import admitted_after_wait, refused_after_wait
from .._clock import Clock, current_clock
from .._deadline import cancelled_by_deadline, remaining_ns
from .._durations import Seconds, to_ns
from .._errors import DeadlineExceeded, RateLimited
from .._policy import is_async_callable, refuse_generator_function, through_method_decorators
from .._wakeup import wake
from ..events import AttributeValue, Level, emit
from ..events._sinks import kind_floor
from ..ratelimiter import BlockingRateLimiter, RateLimiter
from ._store import RedisStore, StoreError, check_key_part

P = ParamSpec("P")
T = TypeVar("T")

_EXACT: Final = 1 << 53
# The sinks wanting fleet / ratelimiter events (stoic.events._sinks.KindFloor).
_FLEET_SINKS: Final = kind_floor("fleet")
_SINKS: Final = kind_floor("ratelimiter")
# The local limiter's metrics (stoic._metrics.METRICS), recorded alike; not its available
# permits: the shared credit is in the store, never read for a collection.
_REJECTIONS: Final = "stoic.ratelimiter.rejections"
_WAITED: Final = ("stoic.ratelimiter.wait.duration",)
_NOT_GAUGED: Final = frozenset({"available_permits"})


def fail_event(label: str, policy: str, admitted: bool, exc: StoreError, now: int) -> None:
    """``fleet.fail_open`` / ``fleet.fail_closed``: a decision taken without the store (and its count,
    ``stoic.fleet.fallbacks``)."""
    if _metrics.state.enabled:
        _metrics.count_shared("fleet", label, ("stoic.fleet.fallbacks", "fail_open" if admitted else "fail_closed"))
    if admitted:
        if _FLEET_SINKS.wants(Level.INFO):
            emit("fleet.fail_open", label, Level.INFO, now, {"policy": policy, "unavailable": exc.unavailable})
    elif _FLEET_SINKS.wants(Level.WARNING):
        emit("fleet.fail_closed", label, Level.WARNING, now, {"policy": policy, "unavailable": exc.unavailable})


def ints(reply: list[Any], count: int, operation: str) -> list[int]:
    """The first ``count`` entries of a script reply as ints; ``StoreError`` when they are not."""
    if len(reply) < count or not all(type(v) is int for v in reply[:count]):
        raise StoreError(f"{operation} answered an unexpected reply {reply[:count]!r}", operation=operation,
                         unavailable=False)
    return reply[:count]


class _SharedBucket:
    """The configuration, the reply check and the refusals shared by the asyncio and the
    blocking shared limiter (see :class:`SharedRateLimiter` for the parameters)."""

    _LOCAL: type[RateLimiter] | type[BlockingRateLimiter] = RateLimiter

    # Never retuned (stoic.ControlPlane.retune, stoic.Keyed.retune refuse it): the configuration is
    # the fleet's, every replica's over one store, not one process's to change.
    _retune: ClassVar[None] = None

    __slots__ = (
        "__weakref__", "_burst", "_cap", "_clock", "_fail_open", "_key", "_label", "_local", "_p", "_per",
        "_queue_limit", "_lock", "_r", "_rate", "_rec", "_store", "_ttl_ms", "_waiters",
    )

    def __init__(
        self,
        rate: int,
        per: Seconds = 1.0,
        *,
        burst: int | None = None,
        queue_limit: int | None = 100,
        store: RedisStore,
        label: str,
        fail_open_on_store_error: bool = True,
        clock: Clock | None = None,
    ) -> None:
        check_key_part(label, "label")
        if not isinstance(store, RedisStore):
            raise TypeError(f"store must be a RedisStore, got {type(store).__name__}")
        blocking = self._LOCAL is BlockingRateLimiter
        if (store.sync_client if blocking else store.client) is None:
            kind = "redis.Redis" if blocking else "redis.asyncio.Redis"
            raise TypeError(f"store must be built from a URL or a {kind} client for {type(self).__name__}")
        # The local bucket validates rate/per/burst/queue_limit/clock and is the fallback.
        # Its events carry "<label>.fallback", so a dashboard tells the two apart.
        self._local: Any = self._LOCAL(rate, per, burst=burst, queue_limit=queue_limit, label=f"{label}.fallback",
                                       clock=clock)
        self._rate = self._local.rate
        self._burst = self._local.burst
        self._queue_limit = self._local.queue_limit
        self._per = self._local.per
        per_ns = to_ns(per, "per")
        if per_ns % 1000:
            raise ValueError(f"per must be a whole number of microseconds (the resolution of Redis TIME), got {per!r}")
        per_us = per_ns // 1000
        g = math.gcd(self._rate, per_us)
        self._r = self._rate // g  # units earned per microsecond
        self._p = per_us // g  # units one permit costs
        self._cap = self._burst * self._p
        if self._cap * self._r >= _EXACT:
            raise ValueError(
                f"burst x rate x per is too large for exact credit in Redis (burst={self._burst}, rate={self._rate}, "
                f"per={self._per!r}): burst * rate * per_us / gcd(rate, per_us)**2 must stay below 2**53"
            )
        # A bucket idle long enough to refill is full, so a missing key means the same: let it go.
        self._ttl_ms = -(-self._cap // self._r) // 1000 + 1000
        self._store = store
        self._label = label
        self._key = store.keys(label, "bucket")
        if not isinstance(fail_open_on_store_error, bool):
            raise TypeError("fail_open_on_store_error must be a bool")
        self._fail_open = fail_open_on_store_error
        self._clock = clock if clock is not None else current_clock()
        self._waiters: deque[Any] = deque()  # this process's queue: futures, or events for threads
        self._lock = threading.Lock()
        # Rejections, waits and the waiters gauge, as the local limiter's (the fallback keeps its own).
        self._rec = _metrics.recorder("ratelimiter", label, self, _NOT_GAUGED)

    # ------------------------------------------------------------------ configuration
    @property
    def label(self) -> str:
        """The bucket's label."""
        return self._label

    @property
    def rate(self) -> int:
        """Permits earned per ``per`` seconds, fleet-wide."""
        return self._rate

    @property
    def per(self) -> float:
        """The refill interval in seconds."""
        return self._per

    @property
    def burst(self) -> int:
        """The shared bucket's size."""
        return self._burst

    @property
    def queue_limit(self) -> int | None:
        """How many requests of this process may wait."""
        return self._queue_limit

    @property
    def waiter_count(self) -> int:
        """Requests of this process waiting now (the ``stoic.ratelimiter.waiters`` gauge)."""
        return len(self._waiters)

    @property
    def fallback(self) -> Any:
        """The local bucket that limits this process while the store cannot be used."""
        return self._local

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(rate={self._rate}, per={self._per!r}, burst={self._burst}, "
                f"label={self._label!r}, store={self._store!r})")

    # ------------------------------------------------------------------ shared by both
    def _parse(self, reply: list[Any]) -> int | StoreError:
        """The script's answer: 0 when granted, else the nanoseconds to wait; a StoreError (reported)
        for a reply of the wrong shape."""
        try:
            granted, wait_us, _left = ints(reply, 3, "limiter_take")
            if granted not in (0, 1) or wait_us < 0 or (granted == 0) != (wait_us > 0):
                raise StoreError(f"limiter_take answered {reply!r}", operation="limiter_take", unavailable=False)
        except StoreError as exc:
            self._store.report(exc)  # a reply of the wrong shape: reported like any store error
            return exc
        self._store.accepted()
        return 0 if granted else wait_us * 1000

    def _check(self, permits: int) -> None:
        if isinstance(permits, bool) or not isinstance(permits, int) or permits < 1:
            raise ValueError(f"permits must be an integer >= 1, got {permits!r}")
        if permits > self._burst:
            if _metrics.state.enabled:
                self._rec.count_locked((_REJECTIONS, "oversized"))
            if _SINKS.wants(Level.WARNING):
                emit("ratelimiter.oversized", self._label, Level.WARNING, self._clock.now_ns(),
                     {"permits": permits, "burst": self._burst})
            raise RateLimited(
                f"rate limited ({self._label}): {permits} permits can never be granted by a bucket of {self._burst}",
                label=self._label,
            )

    def _reject(self, reason: str, permits: int, wait_ns: int | None) -> RateLimited:
        """A refusal: counted by ``reason`` (as the local limiter counts its own), its event, the error."""
        if _metrics.state.enabled:
            self._rec.count_locked((_REJECTIONS, reason))
        if _SINKS.wants(Level.INFO):
            attributes: dict[str, AttributeValue] = {"reason": reason, "permits": permits}
            if wait_ns is not None:
                attributes["retry_after"] = wait_ns / 1e9
            emit("ratelimiter.rejected", self._label, Level.INFO, self._clock.now_ns(), attributes)
        return RateLimited(label=self._label, retry_after=None if wait_ns is None else wait_ns / 1e9)

    def _waited(self, permits: int, start: int, now: int) -> None:
        """A request served after waiting in this process's queue, called at ``start``."""
        if _metrics.state.enabled:
            self._rec.observe_locked(_WAITED, now - start)
        if _SINKS.wants(Level.DEBUG):
            emit("ratelimiter.waited", self._label, Level.DEBUG, now,
                 {"permits": permits, "waited": (now - start) / 1e9})

    def _without_store(self, exc: StoreError) -> None:
        # Failing closed, the refusal is counted in stoic.fleet.fallbacks only: not a rejection.
        fail_event(self._label, "ratelimiter", self._fail_open, exc, self._clock.now_ns())
        if not self._fail_open:
            raise RateLimited(f"rate limited ({self._label}): the store could not decide", label=self._label)

    def _deadline(self, permits: int) -> DeadlineExceeded:
        self._reject("deadline_exceeded", permits, None)
        return DeadlineExceeded(f"deadline exceeded before acquiring ({self._label})", label=self._label)


class SharedRateLimiter(_SharedBucket):
    """A token bucket shared by every process that uses the same store and label.

    ``SharedRateLimiter(rate, per=1.0, *, burst=None, queue_limit=100, store, label,
    fail_open_on_store_error=True, clock=None)``:

    - ``rate`` (int >= 1) permits per ``per`` seconds (float or timedelta, > 0, a whole number
      of microseconds); ``burst`` (int >= 1, default ``rate``) the bucket's size, full at first use;
      ``rate * burst`` and ``per`` must keep the credit below 2**53 units (``ValueError`` says so);
    - ``queue_limit``: requests of this process that may wait (int >= 0, ``None`` unbounded);
    - ``store``: the :class:`RedisStore`; ``label``: names the bucket (``{prefix:label}:bucket``)
      and every event; characters that would break a key are a ``ValueError``;
    - ``fail_open_on_store_error`` (seed 003, default True): when the store errs or is resting,
      admit through a local bucket of the same ``rate``/``burst`` (per process: a fleet of N
      allows up to N times the rate while the store is down); False refuses (``RateLimited``,
      ``retry_after`` None);
    - ``clock``: what this process sleeps on while it waits (the bucket runs on server time).

    ``await limiter.acquire(permits)``, ``await limiter.try_acquire(permits)``,
    ``await limiter.execute(fn, ...)``, ``@limiter`` and ``async with limiter:``.
    """

    __slots__ = ()

    # ------------------------------------------------------------------ decisions
    async def _ask(self, permits: int) -> int | StoreError:
        """One round trip: 0 when granted, else the nanoseconds to wait; a StoreError when the
        store could not decide."""
        try:
            reply = await self._store.call("limiter_take", self._key,
                                           (permits, self._r, self._p, self._cap, self._ttl_ms), repeat=permits == 1)
        except StoreError as exc:
            return exc
        return self._parse(reply)

    async def try_acquire(self, permits: int = 1) -> bool:
        """Take ``permits`` now if the shared bucket holds them and nobody here is queued.

        One round trip, reported as this stage's time (a breaker outside leaves it out of the
        call's duration). Returns False when refused (a request above ``burst`` too, with a
        ``ratelimiter.oversized`` event). When the store cannot decide: the local bucket decides
        (fail open), or False (fail closed). Raises ``ValueError`` for ``permits`` < 1.
        """
        try:
            self._check(permits)
        except RateLimited:
            return False
        if self._waiters:
            return False
        clock = self._clock
        start = clock.now_ns()
        answer = await self._ask(permits)
        # The round trip is this stage's time, granted or not: a breaker outside leaves it out.
        (admitted_after_wait if answer == 0 else refused_after_wait)(clock, clock.now_ns(), start)
        if isinstance(answer, StoreError):
            try:
                self._without_store(answer)
            except RateLimited:
                return False
            return bool(self._local.try_acquire(permits))
        return answer == 0

    async def acquire(self, permits: int = 1) -> None:
        """Take ``permits`` from the shared bucket, waiting in this process's FIFO queue if asked to.

        Asks the store at once when nobody here is queued. Refused with a wait, it decides before
        waiting: ``RateLimited`` (``retry_after`` = the script's exact wait) when that wait reaches
        the ambient deadline or ``queue_limit`` requests already wait here; otherwise it waits
        locally until the computed instant and asks again (only the head of the queue asks; it
        never polls). ``RateLimited`` (``retry_after`` None) for more than ``burst`` permits, or
        when the store cannot decide and ``fail_open_on_store_error`` is False;
        ``DeadlineExceeded`` when the deadline already passed; ``ValueError`` for ``permits`` < 1.
        When the store cannot decide and failing open, the local bucket's ``acquire`` decides.
        A waiter cancelled while it waits locally leaves without consuming anything; one cancelled
        while its request is at the store may find the server granted it (the script ran, the
        reply was lost with the caller): those permits are spent, as any lost reply's are.
        The whole time until admission (round trips and waiting) is reported as this stage's, so
        a breaker outside leaves it out of the call's duration (seed 000, "Pipeline"); so is the
        time until a refusal or a cancellation, for an operation that catches it.
        """
        self._check(permits)
        left = remaining_ns()
        if left is not None and left <= 0:
            raise self._deadline(permits)
        clock = self._clock
        start = clock.now_ns()
        try:
            if not self._waiters:
                answer = await self._ask(permits)
                if isinstance(answer, StoreError):
                    self._without_store(answer)
                    await self._local.acquire(permits)
                    admitted_after_wait(clock, clock.now_ns(), start)  # (the store's failed contact too)
                    return
                if answer == 0:
                    # The round trip for the store's decision is this stage's time, not the
                    # dependency's: a breaker outside leaves it out (a slow store is no slow call).
                    admitted_after_wait(clock, clock.now_ns(), start)
                    return
                wait = answer
            else:
                wait = 0
            left = remaining_ns()
            if left is not None and wait >= left:
                raise self._reject("would_exceed_deadline", permits, wait)
            if self._queue_limit is not None and len(self._waiters) >= self._queue_limit:
                raise self._reject("queue_full", permits, wait if wait else None)
            await self._wait(permits, wait, start)
        except BaseException:
            # Refused (or cancelled) after its round trips and waits: this stage's time all the
            # same, which an operation catching the refusal must not be slow for.
            refused_after_wait(clock, clock.now_ns(), start)
            raise

    async def _wait(self, permits: int, wait: int, start: int) -> None:
        """Queue here, then wait ``wait`` ns (the store's answer to the first ask, 0 when it was not
        asked) and ask again at the head; ``start`` is when :meth:`acquire` was called."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        waiters = self._waiters
        head = not waiters
        waiters.append(future)
        clock = self._clock
        try:
            if not head:
                await future  # woken when it reaches the head
                wait = 0
            while True:
                if wait:
                    await clock.sleep_until(clock.now_ns() + wait)
                answer = await self._ask(permits)
                if isinstance(answer, StoreError):
                    self._without_store(answer)
                    await self._local.acquire(permits)
                    break
                if answer == 0:
                    break
                wait = answer
                left = remaining_ns()
                if left is not None and wait >= left:
                    raise self._reject("would_exceed_deadline", permits, wait)
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError):
                self._reject("deadline_exceeded" if cancelled_by_deadline() else "cancelled", permits, None)
            raise
        finally:
            self._leave(future)
        now = clock.now_ns()
        admitted_after_wait(clock, now, start)  # a breaker outside leaves the wait out
        self._waited(permits, start, now)

    def _leave(self, future: asyncio.Future[None]) -> None:
        waiters = self._waiters
        if waiters and waiters[0] is future:
            waiters.popleft()
            # Wake the next live waiter; one whose loop is gone can never leave by itself.
            while waiters and not wake(waiters[0]):
                waiters.popleft()
        else:
            try:
                waiters.remove(future)
            except ValueError:
                pass

    async def execute(self, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Take one permit (as :meth:`acquire`), then return ``await fn(*args, **kwargs)``.

        ``fn``'s exceptions propagate unchanged; a refusal raises what :meth:`acquire` raises.
        """
        await self.acquire(1)
        return await fn(*args, **kwargs)

    @through_method_decorators
    def __call__(self, fn: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, Coroutine[Any, Any, T]]:
        """Decorate an async function so every call takes one permit first (``TypeError`` otherwise)."""
        if not is_async_callable(fn):
            raise TypeError(f"SharedRateLimiter decorates async functions, not {fn!r}")

        @functools.wraps(fn)
        async def limited(*args: P.args, **kwargs: P.kwargs) -> T:
            await self.acquire(1)
            return await fn(*args, **kwargs)

        return limited

    async def __aenter__(self) -> SharedRateLimiter:
        await self.acquire(1)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None



class BlockingSharedRateLimiter(_SharedBucket):
    """:class:`SharedRateLimiter` for threads: the same shared bucket, script and fallback, on a
    store built from a sync ``redis.Redis`` (or a URL), with a local FIFO queue of threads.

    Same constructor. ``try_acquire(permits)``, ``acquire(permits=1, timeout=None)``,
    ``call(fn, *args, **kwargs)``, ``@limiter`` on a plain function and ``with limiter:``.
    While the store cannot decide and failing open, a local :class:`stoic.BlockingRateLimiter`
    of the same rate and burst decides.
    """

    _LOCAL = BlockingRateLimiter

    __slots__ = ()

    def _ask(self, permits: int) -> int | StoreError:
        try:
            reply = self._store.call_blocking("limiter_take", self._key,
                                              (permits, self._r, self._p, self._cap, self._ttl_ms))
        except StoreError as exc:
            return exc
        return self._parse(reply)

    def try_acquire(self, permits: int = 1) -> bool:
        """Take ``permits`` now if the shared bucket holds them and no thread here is queued
        (one round trip); as :meth:`SharedRateLimiter.try_acquire`."""
        try:
            self._check(permits)
        except RateLimited:
            return False
        if self._waiters:
            return False
        clock = self._clock
        start = clock.now_ns()
        answer = self._ask(permits)
        # The round trip is this stage's time, granted or not: a breaker outside leaves it out.
        (admitted_after_wait if answer == 0 else refused_after_wait)(clock, clock.now_ns(), start)
        if isinstance(answer, StoreError):
            try:
                self._without_store(answer)
            except RateLimited:
                return False
            return bool(self._local.try_acquire(permits))
        return answer == 0

    def acquire(self, permits: int = 1, timeout: Seconds | None = None) -> None:
        """Take ``permits``, waiting in this process's FIFO queue of threads for at most
        ``timeout`` seconds (and the ambient deadline).

        Raises as :meth:`SharedRateLimiter.acquire`: ``RateLimited`` with the script's exact
        ``retry_after`` when the wait would pass the timeout or deadline, or ``queue_limit``
        threads already wait; ``DeadlineExceeded`` when the deadline already passed or the
        timeout runs out while queued behind other threads; ``ValueError`` for bad arguments.
        """
        self._check(permits)
        limit = None if timeout is None else to_ns(timeout, "timeout", allow_zero=True)
        ambient = remaining_ns()
        if ambient is not None and ambient <= 0:
            raise self._deadline(permits)
        if limit is None or (ambient is not None and ambient < limit):
            limit = ambient
        clock = self._clock
        start = clock.now_ns()
        give_up = None if limit is None else start + limit
        ticket = threading.Event()
        with self._lock:
            waiters = self._waiters
            # Behind others it will wait: refused when queue_limit threads wait already (as the
            # asyncio limiter). First in line it asks at once, and is judged if it must wait.
            if waiters and self._queue_limit is not None and len(waiters) >= self._queue_limit:
                raise self._reject("queue_full", permits, None)
            waiters.append(ticket)
            head = waiters[0] is ticket
        try:
            if not head and not ticket.wait(None if give_up is None else max(0, give_up - clock.now_ns()) / 1e9):
                raise self._deadline(permits)
            first = head
            while True:
                answer = self._ask(permits)
                if isinstance(answer, StoreError):
                    self._without_store(answer)
                    left = None if give_up is None else max(0, give_up - clock.now_ns()) / 1e9
                    self._local.acquire(permits, timeout=left)
                    break
                if answer == 0:
                    break
                now = clock.now_ns()
                if give_up is not None and now + answer >= give_up:
                    raise self._reject("would_exceed_deadline", permits, answer)
                if first and self._queue_limit is not None and len(self._waiters) > self._queue_limit:
                    raise self._reject("queue_full", permits, answer)
                first = False
                clock.sleep_until_blocking(now + answer)
        except BaseException:
            # Refused after its round trips and waits: this stage's time all the same, which an
            # operation catching the refusal must not be slow for.
            refused_after_wait(clock, clock.now_ns(), start)
            raise
        finally:
            with self._lock:
                waiters = self._waiters
                if waiters and waiters[0] is ticket:
                    waiters.popleft()
                    if waiters:
                        waiters[0].set()
                else:
                    try:
                        waiters.remove(ticket)
                    except ValueError:
                        pass
        # Queued or not, a breaker outside times the call from here: the store's decision (its
        # round trips, a failed one included) is this stage's time, not the dependency's.
        now = clock.now_ns()
        admitted_after_wait(clock, now, start)
        if not (head and first):  # (a queued acquire was served)
            self._waited(permits, start, now)

    def call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Take one permit (as :meth:`acquire`), then return ``fn(*args, **kwargs)``."""
        self.acquire(1)
        return fn(*args, **kwargs)

    @through_method_decorators
    def __call__(self, fn: Callable[P, T]) -> Callable[P, T]:
        """Decorate a plain function so every call takes one permit first (``TypeError`` for an
        async function: use :class:`SharedRateLimiter`; or a generator function)."""
        refuse_generator_function(fn, type(self).__name__)
        if is_async_callable(fn):
            raise TypeError(f"BlockingSharedRateLimiter decorates plain functions, not {fn!r}")

        @functools.wraps(fn)
        def limited(*args: P.args, **kwargs: P.kwargs) -> T:
            self.acquire(1)
            return fn(*args, **kwargs)

        return limited

    def __enter__(self) -> BlockingSharedRateLimiter:
        self.acquire(1)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None


__all__ = ["BlockingSharedRateLimiter", "SharedRateLimiter"]
