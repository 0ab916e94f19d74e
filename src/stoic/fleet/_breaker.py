"""The shared circuit breaker: one state machine in Redis, one window per replica (seed 003,
fleet-wide state; the breaker's semantics are seed 000's "CircuitBreaker").

What is shared: the state (closed, open, half-open, forced open), the consecutive trip count, the
open-until instant (server time) and the half-open probe leases. What stays per replica: the
window of recent outcomes. Each replica judges its own traffic; the first whose window trips opens
the breaker for all, and the open duration grows with the fleet's trip count. Sharing the window
would cost a round trip on every call; a per-replica window trips on the same failure rate
(each replica sees a sample of the same dependency), only a little later at low traffic.

Admission in the closed and open states reads a local copy of the shared state, refreshed at
most every ``refresh_interval`` (one round trip, taken by the first call after the interval):
a successful call in the closed state never waits for Redis. Half-open admission takes a
probe lease in one script, so exactly ``half_open_probes`` probes run fleet-wide per episode;
a lease held past ``half_open_timeout`` counts as a failed probe and re-opens the breaker.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Final, ParamSpec, TypeVar

from .. import _random
from .._clock import Clock, SystemClock, current_clock
from .._durations import Seconds, check_int, to_ns
from .._errors import CircuitOpen, Rejected, is_defect
from ..breaker import BreakerState, CircuitBreaker, CountWindow, OpenDuration, TimeWindow
from ..breaker._config import threshold_ppm
from ..breaker._window import FAILED, NEVER, SLOW, CountRing, TimeBuckets
from ..events import Level, emit
from ..events._sinks import kind_floor
from ._limiter import fail_event, ints
from ._store import RedisStore, StoreError, check_key_part

P = ParamSpec("P")
R = TypeVar("R")

# The shared state codes (breaker_common.lua).
_CLOSED: Final = 0
_OPEN: Final = 1
_HALF_OPEN: Final = 2
_FORCED: Final = 3
_DEBUG_INT: Final = int(Level.DEBUG)
# The sinks wanting breaker events (stoic.events._sinks.KindFloor): the success path reads its floor.
_SINKS: Final = kind_floor("breaker")
_STATES: Final = (BreakerState.CLOSED, BreakerState.OPEN, BreakerState.HALF_OPEN, BreakerState.OPEN)


def _caller_cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _text(value: object) -> str | None:
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return None
    return value if isinstance(value, str) else None


class SharedCircuitBreaker:
    """A circuit breaker whose state, trip count and probe leases are shared by every replica.

    ``SharedCircuitBreaker(label=label, *, store, refresh_interval=0.1, fail_open_on_store_error=True,
    ...)`` takes every parameter of :class:`stoic.CircuitBreaker` (``window``, ``minimum_calls``,
    ``failure_rate_threshold``, ``slow_call_duration``, ``slow_call_rate_threshold``,
    ``open_duration``, ``half_open_probes``, ``half_open_timeout``, ``record_when``, ``clock``),
    with the same defaults, ranges and ``ValueError``\\ s, plus:

    - ``store``: the :class:`RedisStore`; ``label`` names the keys (``{prefix:label}:breaker``,
      ``{prefix:label}:probes``) and every event; characters that would break a key are a
      ``ValueError``;
    - ``refresh_interval`` (seconds > 0, default 0.1): the most a replica's copy of the shared
      state may lag: a trip elsewhere refuses calls here within it;
    - ``fail_open_on_store_error`` (seed 003, default True): when the store cannot be used,
      calls go through a local :class:`stoic.CircuitBreaker` with the same configuration
      (:attr:`fallback`); False refuses them (``CircuitOpen``, ``retry_after`` None).

    The window is per replica (see the module text). Asyncio only: ``await breaker.execute(fn,
    ...)`` or ``@breaker`` on an async function. Raises what :meth:`execute` documents.
    """

    def __init__(
        self,
        *,
        label: str,
        store: RedisStore,
        window: TimeWindow | CountWindow = TimeWindow(60.0),  # noqa: B008 (immutable value)
        minimum_calls: int = 10,
        failure_rate_threshold: float = 0.5,
        slow_call_duration: Seconds = 10.0,
        slow_call_rate_threshold: float = 1.0,
        open_duration: OpenDuration = OpenDuration.standard,
        half_open_probes: int = 1,
        half_open_timeout: Seconds = 60.0,
        record_when: Callable[[Exception], bool] = CircuitBreaker.counts_by_default,
        refresh_interval: Seconds = 0.1,
        fail_open_on_store_error: bool = True,
        clock: Clock | None = None,
    ) -> None:
        check_key_part(label, "label")
        if not isinstance(store, RedisStore):
            raise TypeError(f"store must be a RedisStore, got {type(store).__name__}")
        # The local breaker validates the shared configuration and is the fallback.
        # Its events carry "<label>.fallback", so a dashboard tells the two apart.
        self._local = CircuitBreaker(
            label=f"{label}.fallback", window=window, minimum_calls=minimum_calls,
            failure_rate_threshold=failure_rate_threshold,
            slow_call_duration=slow_call_duration, slow_call_rate_threshold=slow_call_rate_threshold,
            open_duration=open_duration, half_open_probes=half_open_probes, half_open_timeout=half_open_timeout,
            record_when=record_when, clock=clock,
        )
        self.label = label
        self._store = store
        self._keys = store.keys(label, "breaker", "probes")
        self._refresh_ns = to_ns(refresh_interval, "refresh_interval")
        if not isinstance(fail_open_on_store_error, bool):
            raise TypeError("fail_open_on_store_error must be a bool")
        self._fail_open = fail_open_on_store_error
        fppm = threshold_ppm(failure_rate_threshold, "failure_rate_threshold")
        sppm = threshold_ppm(slow_call_rate_threshold, "slow_call_rate_threshold")
        self._window = (
            CountRing(window.calls, minimum_calls, fppm, sppm) if isinstance(window, CountWindow)
            else TimeBuckets(window.bucket_ns, minimum_calls, fppm, sppm)
        )
        self._slow_ns = to_ns(slow_call_duration, "slow_call_duration")
        self._record_when = record_when
        self._probes = check_int(half_open_probes, "half_open_probes", minimum=1)
        probe_timeout_ns = to_ns(half_open_timeout, "half_open_timeout")
        self._clock = clock if clock is not None else current_clock()
        self._now: Callable[[], int] = time.monotonic_ns if type(self._clock) is SystemClock else self._clock.now_ns
        self._site = _random.call_site(1)
        # Shared state outlives what it decides: the trip count for reset_after, a probe lease
        # for half_open_timeout (the scripts add the open period and renew it on every use).
        ttl_ms = -(-(open_duration.reset_after_ns + probe_timeout_ns) // 1_000_000) + 1000
        self._config: tuple[int | float, ...] = (
            ttl_ms, self._probes, max(1, open_duration.initial_ns // 1000), max(1, open_duration.maximum_ns // 1000),
            open_duration.factor, open_duration.jitter, max(1, open_duration.reset_after_ns // 1000),
            max(1, probe_timeout_ns // 1000),
        )
        # The local copy of the shared state.
        self._st = _CLOSED
        self._trips = 0
        self._until = 0  # open until, on this process's clock
        self._gen = -1
        self._due = 0  # when the copy must be refreshed
        self._refreshing = False
        self._refreshed: asyncio.Future[None] | None = None
        self._degraded = False  # the store could not be used at the last contact
        self._counts = (0, 0, 0)
        self._quick = 0  # quick successes not yet folded into the window
        self._defer_until = NEVER  # before this instant a quick success may skip the window
        self._why = StoreError("not yet used", operation="breaker_refresh", unavailable=True)

    # ------------------------------------------------------------------ observation
    @property
    def state(self) -> BreakerState:
        """The state of this replica's copy (at most ``refresh_interval`` old; forced open reads
        as open; an open period that has ended reads as half-open). While the store cannot be
        used, the fallback breaker's state."""
        if self._degraded:
            return self._local.state
        st = self._st
        if st == _OPEN and self._now() >= self._until:
            return BreakerState.HALF_OPEN
        return _STATES[st]

    @property
    def trips(self) -> int:
        """The fleet's consecutive trip count as last read from the store."""
        return self._trips

    @property
    def fallback(self) -> CircuitBreaker:
        """The local breaker that decides while the store cannot be used."""
        return self._local

    @property
    def degraded(self) -> bool:
        """True while the last contact with the store failed (the fallback decides)."""
        return self._degraded

    def __repr__(self) -> str:
        return f"SharedCircuitBreaker({self.label!r}, state={self.state.value}, store={self._store!r})"

    # ------------------------------------------------------------------ store calls
    async def _call(self, script: str, *extra: int | str) -> list[Any] | None:
        """Run a breaker script and apply its reply to the local copy; None when the store could
        not be used (the copy is then marked degraded)."""
        draw = _random.stream(self._site).random() if self._config[5] else 0.0
        try:
            reply = await self._store.call(script, self._keys, (*self._config, draw, *extra))
        except StoreError as exc:
            self._degraded = True
            self._why = exc
            return None
        try:
            self._apply(reply, script)
        except StoreError as exc:
            self._store.report(exc)
            self._degraded = True
            self._why = exc
            return None
        return reply

    def _apply(self, reply: list[Any], script: str) -> None:
        st, trips, remaining, gen, granted, open_for = ints(reply, 6, script)
        events = [_text(v) for v in reply[6:]]
        if st not in (0, 1, 2, 3) or granted not in (0, 1) or remaining < -1 or None in events:
            raise StoreError(f"{script} answered an unexpected reply {reply!r}", operation=script, unavailable=False)
        now = self._now()
        if gen != self._gen:
            # Another epoch: calls admitted before are stale, and a fresh closed period starts
            # with an empty window.
            self._window.clear()
            self._quick = 0
            self._defer_until = NEVER
            self._gen = gen
        self._st = st
        self._trips = trips
        self._until = now + remaining * 1000 if remaining >= 0 else 0
        self._degraded = False
        self._due = now + self._refresh_ns
        for event in events:
            assert event is not None
            self._announce(event, trips, open_for, now)

    def _announce(self, event: str, trips: int, open_for_us: int, now: int) -> None:
        name, _, detail = event.partition(":")
        if name == "opened" and _SINKS.wants(Level.WARNING):
            calls, failures, slow = self._counts if detail in ("failure_rate", "slow_calls") else (0, 0, 0)
            attrs: dict[str, Any] = {"trigger": detail, "calls": calls, "failures": failures, "slow_calls": slow,
                                     "trips": trips}
            if detail != "forced":
                attrs["open_for"] = open_for_us / 1e6
            emit("breaker.opened", self.label, Level.WARNING, now, attrs)
        elif name == "half_open" and _SINKS.wants(Level.INFO):
            emit("breaker.half_open", self.label, Level.INFO, now, {"probes": self._probes})
        elif name == "closed" and _SINKS.wants(Level.INFO):
            emit("breaker.closed", self.label, Level.INFO, now, {"reason": detail})
            if detail == "reset":
                emit("breaker.reset", self.label, Level.INFO, now, {})

    async def refresh(self) -> None:
        """Read the shared state into this replica's copy now (one round trip)."""
        self._refreshing = True
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._refreshed = done
        try:
            await self._call("breaker_refresh")
        finally:
            self._refreshing = False
            self._refreshed = None
            self._due = self._now() + self._refresh_ns
            done.set_result(None)

    # ------------------------------------------------------------------ running operations
    async def execute(self, fn: Callable[P, Awaitable[R]], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run ``await fn(*args, **kwargs)`` through the shared breaker and return its result.

        Raises :class:`stoic.CircuitOpen` without running ``fn`` when the shared breaker is open
        (``retry_after`` = seconds left; ``None`` when forced open), or half-open with every
        fleet-wide probe lease taken (``retry_after`` None), or when the store cannot be used and
        ``fail_open_on_store_error`` is False. Otherwise ``fn``'s own result or exception,
        unchanged. While the store cannot be used and failing open, :attr:`fallback` decides
        (and raises what ``CircuitBreaker.execute`` raises). Cancellation, defects and inner
        rejections are never counted.
        """
        now = self._now
        start = now()
        gen = self._gen
        if start >= self._due or self._st or self._degraded or gen < 0:
            return await self._admit_slow(start, fn, args, kwargs)
        # The closed state with a fresh copy: no store round trip, no extra coroutine.
        try:
            result = await (fn(*args, **kwargs) if kwargs else fn(*args))  # type: ignore[call-arg]
        except BaseException as exc:
            verdict = self._judge(exc)
            if verdict is not None:
                await self._record(gen, start, now(), verdict)
            raise
        end = now()
        if end - start > self._slow_ns:
            await self._record(gen, start, end, False)
        elif end < self._defer_until and gen == self._gen:
            # A quick success that cannot change a decision: counted now, folded in later.
            self._quick += 1
        elif gen == self._gen and self._success(end):
            await self._trip(end)
        if _SINKS.floor <= _DEBUG_INT and _SINKS.wants(_DEBUG_INT):
            self._recorded("success", False, start, end)
        return result

    async def _admit_slow(self, now: int, fn: Callable[..., Awaitable[R]], args: Any, kwargs: Any) -> R:
        if now >= self._due and not self._refreshing:
            await self.refresh()
        elif self._gen < 0 and self._refreshed is not None:
            # Nothing read yet: a replica that has not seen the shared state must not guess it.
            await asyncio.shield(self._refreshed)
        if self._degraded:
            return await self._without_store(fn, args, kwargs)
        st = self._st
        if st == _CLOSED:
            return await self._run(fn, args, kwargs)
        if st == _FORCED or self._now() < self._until:
            raise self._reject(self._now())
        return await self._probe(fn, args, kwargs)

    def _recorded(self, outcome: str, slow: bool, start: int, end: int) -> None:
        emit("breaker.recorded", self.label, Level.DEBUG, end,
             {"outcome": outcome, "slow": slow, "state": "closed", "duration": (end - start) / 1e9})

    async def _without_store(self, fn: Callable[..., Awaitable[R]], args: Any, kwargs: Any) -> R:
        fail_event(self.label, "breaker", self._fail_open, self._why, self._now())
        if not self._fail_open:
            raise CircuitOpen(f"circuit open ({self.label}): the store could not decide", label=self.label)
        return await self._local.execute(fn, *args, **kwargs)

    def _reject(self, now: int) -> CircuitOpen:
        retry_after = None
        if self._st == _OPEN and self._until > now:
            retry_after = (self._until - now) / 1e9
        if _SINKS.wants(Level.DEBUG):
            attrs: dict[str, Any] = {"state": self.state.value}
            if retry_after is not None:
                attrs["retry_after"] = retry_after
            emit("breaker.rejected", self.label, Level.DEBUG, now, attrs)
        return CircuitOpen(label=self.label, retry_after=retry_after)

    def _judge(self, exc: BaseException) -> bool | None:
        """True: a failure; False: a success; None: no verdict (cancelled, a defect, a rejection)."""
        if not isinstance(exc, Exception) or _caller_cancelling():
            return None
        if is_defect(exc):
            if _SINKS.wants(Level.ERROR):
                emit("breaker.defect", self.label, Level.ERROR, self._now(), {})
            return None
        try:
            counts = bool(self._record_when(exc))
        except Exception:
            if _SINKS.wants(Level.ERROR):
                emit("breaker.defect", self.label, Level.ERROR, self._now(), {})
            return None
        if not counts and isinstance(exc, Rejected):
            return None
        return counts

    async def _run(self, fn: Callable[..., Awaitable[R]], args: Any, kwargs: Any) -> R:
        """A call in the closed state: judged by this replica's window; a trip goes to the store."""
        gen = self._gen
        now = self._now
        start = now()
        try:
            result = await fn(*args, **kwargs)
        except BaseException as exc:
            verdict = self._judge(exc)
            if verdict is not None:
                await self._record(gen, start, now(), verdict)
            raise
        end = now()
        # The success path: no store round trip unless this success trips the window (slow calls).
        if end - start > self._slow_ns:
            await self._record(gen, start, end, False)
        elif gen == self._gen and self._st == _CLOSED and self._success(end):
            await self._trip(end)
        if _SINKS.wants(_DEBUG_INT):
            self._recorded("success", False, start, end)
        return result

    def _fold(self) -> bool:
        """Fold the quick successes counted without touching the window into it (before any other
        window operation); True when that reaches a threshold."""
        quick = self._quick
        if quick:
            self._quick = 0
            return self._window.successes(quick)
        return False

    def _success(self, end: int) -> bool:
        window = self._window
        tripped = self._fold() | window.success(end)
        # Successes may skip the window until its current bucket ends (once it holds
        # minimum_calls), and at least every millisecond they are folded in.
        self._defer_until = min(window.defer_until(), end + 1_000_000)
        return tripped

    async def _record(self, gen: int, start: int, end: int, failed: bool) -> None:
        if gen != self._gen or self._st != _CLOSED:
            return  # stale: the shared state moved on while it ran
        slow = end - start > self._slow_ns
        if _SINKS.wants(_DEBUG_INT):
            self._recorded("failure" if failed else "success", slow, start, end)
        self._defer_until = NEVER
        if self._fold() | self._window.add(end, (FAILED if failed else 0) | (SLOW if slow else 0)):
            await self._trip(end)

    async def _trip(self, now: int) -> None:
        window = self._window
        self._fold()
        trigger = window.tripped() or "failure_rate"
        self._counts = window.counts(now)
        window.clear()
        self._defer_until = NEVER
        await self._call("breaker_trip", trigger)

    async def _probe(self, fn: Callable[..., Awaitable[R]], args: Any, kwargs: Any) -> R:
        token = os.urandom(9).hex()
        reply = await self._call("breaker_probe", token)
        if reply is None:
            return await self._without_store(fn, args, kwargs)
        if not reply[4]:
            if self._st == _CLOSED:
                return await self._run(fn, args, kwargs)
            raise self._reject(self._now())
        start = self._now()
        try:
            result = await fn(*args, **kwargs)
        except BaseException as exc:
            verdict = self._judge(exc)
            outcome = "none" if verdict is None else ("failed" if verdict else "ok")
            if outcome == "ok" and self._now() - start > self._slow_ns:
                outcome = "slow"
            # Reported even while the caller is being cancelled: the lease goes back at once
            # instead of expiring after half_open_timeout.
            await self._call("breaker_done", token, outcome)
            raise
        await self._call("breaker_done", token, "slow" if self._now() - start > self._slow_ns else "ok")
        return result

    def __call__(self, fn: Callable[P, Coroutine[Any, Any, R]]) -> Callable[P, Coroutine[Any, Any, R]]:
        """Decorate an async function so every call runs as :meth:`execute` would (``TypeError``
        for a plain function)."""
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(f"SharedCircuitBreaker decorates async functions, not {fn!r}")

        @functools.wraps(fn)
        async def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
            return await self.execute(fn, *args, **kwargs)

        return guarded

    # ------------------------------------------------------------------ manual control
    async def _force(self, mode: str) -> None:
        if await self._call("breaker_force", mode) is None:
            raise StoreError(f"force {mode} of {self.label!r} could not reach the store", operation="breaker_force",
                             unavailable=True)

    async def force_open(self) -> None:
        """Open the breaker for the whole fleet with no end (a kill switch) until
        :meth:`force_closed` or :meth:`reset` on any replica. Other replicas refuse within
        ``refresh_interval``. The fallback breaker is forced open too, so the switch holds here
        through a store outage. Raises :class:`StoreError` when the store cannot be reached."""
        self._local.force_open()
        await self._force("open")

    async def force_closed(self) -> None:
        """Close the breaker fleet-wide (the trip count is kept). Raises :class:`StoreError`
        when the store cannot be reached."""
        self._local.force_closed()
        await self._force("closed")

    async def reset(self) -> None:
        """Close the breaker fleet-wide and forget the trip count. Raises :class:`StoreError`
        when the store cannot be reached."""
        self._local.reset()
        await self._force("reset")


__all__ = ["SharedCircuitBreaker"]
