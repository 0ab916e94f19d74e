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
import threading
import time
import types
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any, ClassVar, Final, ParamSpec, TypeVar

from .. import _admission, _deadline, _metrics, _random
from .._callbacks import callback_failed
from .._clock import Clock, SystemClock, current_clock
from .._deadline import caller_cancelled
from .._durations import Seconds, check_int, to_ns
from .._errors import CircuitOpen, Defect, failed_await, is_defect, is_rejection, misused
from .._policy import UNRUN_RESULTS, is_async_callable, plain_verdict, through_method_decorators
from ..breaker import BreakerSnapshot, BreakerState, CircuitBreaker, CountWindow, OpenDuration, TimeWindow
from ..breaker._breaker import _DURATION, breaker_recorder, late
from ..breaker._config import threshold_ppm
from ..breaker._stream import StateStream
from ..breaker._window import FAILED, NEVER, SLOW, CountRing, TimeBuckets
from ..events import Level, emit
from ..events._event import error_type
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


_admission_state: Final = _admission.state
_metrics_state: Final = _metrics.state
_deadline_get: Final = _deadline._current.get


def _refuse_generator(exc: BaseException, awaitable: object) -> None:
    """``execute`` was handed a generator or async generator function, or a plain function
    (``exc``: the TypeError of awaiting what it returned, which cannot be awaited): refused,
    never counted, as the local breaker refuses one. (An awaitable's own TypeError is not.)"""
    if type(exc) is TypeError and failed_await(exc) and not inspect.isawaitable(awaitable):
        generator = type(awaitable) in (types.GeneratorType, types.AsyncGeneratorType)
        if isinstance(awaitable, types.GeneratorType):
            awaitable.close()  # (only a generator: a plain function's value is the caller's)
        hint = ("protect the code that consumes the generator instead" if generator
                else "execute takes an async function; use call() for a plain one")
        raise TypeError(f"SharedCircuitBreaker.execute got a {type(awaitable).__name__}, which cannot be awaited: "
                        f"{hint}") from Defect(f"a {type(awaitable).__name__} was passed to execute")


def _next(contact: Generator[tuple[str, ...], list[Any] | None, None], reply: list[Any] | None,
          ) -> tuple[str, ...] | None:
    """The next request of ``contact`` (SharedCircuitBreaker._contact), sent the reply to the
    last one (None to start); None when the contact is over."""
    try:
        return contact.send(reply)
    except StopIteration:
        return None


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

    The window is per replica (see the module text). ``await breaker.execute(fn, ...)`` or
    ``@breaker`` on an async function; ``breaker.call(fn, ...)`` for a plain function, on the
    store's sync client (a store built from a URL or a ``redis.Redis``), safe from many
    threads. One breaker serves either one event loop or threads through ``call()``, not
    both at once. Raises what :meth:`execute` documents. Observation as
    :class:`stoic.CircuitBreaker`'s: :attr:`state`, :attr:`snapshot`, :meth:`state_changes`.
    """

    # Never retuned (stoic.ControlPlane.retune, stoic.Keyed.retune refuse it): the configuration is
    # the fleet's, every replica's over one store, not one process's to change.
    _retune: ClassVar[None] = None

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
        self._label = label
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
        # Half-open with every probe lease of the fleet taken, as of a lease request in epoch
        # _taken_gen: calls are refused here without asking again until _taken_until.
        self._taken_gen = -1
        self._taken_until = 0
        self._refreshing = False
        self._refreshed: asyncio.Future[None] | None = None
        self._degraded = False  # the store could not be used at the last contact
        self._counts = (0, 0, 0)
        self._counted_gen = -2  # the epoch whose opening self._counts explains
        self._quick = 0  # quick successes not yet folded into the window
        self._defer_until = NEVER  # before this instant a quick success may skip the window
        self._why = StoreError("not yet used", operation="breaker_refresh", unavailable=True)
        self._seen = BreakerState.CLOSED  # the state last published to state_changes() streams
        # Held to record a change of the state seen (rare), and to write the pair it is read from:
        # any thread may read the state (a metrics scrape beside the event loop's calls), and two
        # readers finding one change each published and counted it.
        self._seen_lock = threading.Lock()
        self._streams: weakref.WeakSet[StateStream] | None = None
        self._sync = threading.Lock()  # serialises call() from threads around the shared copy
        # This replica threw the fleet's kill switch (force_open) and nobody has lifted it since:
        # a shared state found empty (a restarted or flushed Redis, an expired key) gets it again.
        self._switched = False
        self._reforce = False
        # Manual controls (force_open, force_closed, reset) run one at a time, in call order:
        # the lock of the loop they run on (a later loop gets a new one).
        self._controls: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None
        # Probe leases whose request or report got no answer (the store timed out or failed),
        # as (token, outcome): the lease may be held, so each is given back ("none": the request
        # was not answered) or reported at the next contact, long before half_open_timeout would
        # expire it as a failed probe.
        self._orphans: list[tuple[str, str]] = []
        # A trip of this replica's window the store did not take (it could not be used): the
        # epoch it was judged in, its trigger and when. Its window was emptied with it, so it is
        # sent again at the next contact that gets an answer while the breaker is still closed in
        # that epoch (or the state was found empty: a restarted, flushed or expired store) and the
        # shortest open period it would have started has not ended; later, the fallback's
        # judgement of the calls since stands.
        self._lost_trip: tuple[int, str, int] | None = None
        self._shortest_open_ns = open_duration.initial_ns
        # This replica's stoic.breaker.* figures, made with its first call or decision once metrics
        # are on (as CircuitBreaker's); the fallback has its own, under "<label>.fallback".
        self._recorder: _metrics.Recorder | None = None
        self._success_histogram: _metrics.Histogram | None = None  # the recorder's success series

    # ------------------------------------------------------------------ observation
    @property
    def label(self) -> str:
        """The label carried by every event, metric and error of this breaker (read-only)."""
        return self._label

    @property
    def state(self) -> BreakerState:
        """The state of this replica's copy (at most ``refresh_interval`` old; forced open reads
        as open; an open period that has ended reads as half-open). While the store cannot be
        used, the fallback breaker's state."""
        if self._degraded:
            return self._local.state
        return self._observe(self._now())

    def _observe(self, now: int) -> BreakerState:
        """The shared state as this replica sees it now, published to the streams on a change and
        counted in ``stoic.breaker.transitions`` (metrics on): every transition this replica
        observes, made here or elsewhere in the fleet, as :meth:`state_changes` streams them."""
        st = self._st
        state = BreakerState.HALF_OPEN if st == _OPEN and now >= self._until else _STATES[st]
        if state is not self._seen:
            return self._changed()
        return state

    def _changed(self) -> BreakerState:
        """A reader found the state changed: under :attr:`_seen_lock`, read it again (the pair
        written under the same lock, a fresh instant) and record and publish it once, whichever
        of the threads that found the change comes first (the others find it recorded)."""
        with self._seen_lock:
            st, until, now = self._st, self._until, self._now()
            state = BreakerState.HALF_OPEN if st == _OPEN and now >= until else _STATES[st]
            if state is not self._seen:
                self._seen = state
                if _metrics_state.enabled:  # (any thread may read the state: under the module's lock)
                    (self._recorder or self._new_recorder()).count_locked(("stoic.breaker.transitions",
                                                                           state.value))
                streams = self._streams
                if streams:
                    for stream in list(streams):
                        stream.publish(state)
            return state

    @property
    def snapshot(self) -> BreakerSnapshot:
        """A :class:`stoic.BreakerSnapshot` of this replica's copy now (the shapes of
        ``CircuitBreaker.snapshot``): closed, the counts of this replica's window; open, the
        evidence of the trip this replica made, of the episode whose failed probe it reported, or
        of its window when it forced the breaker open (zeros for a trip made elsewhere); half-open,
        zeros (the probes are counted in the store). ``trips`` is the fleet's count as last read,
        ``retry_after`` the seconds left of the open period (``None`` when forced open or not
        open). While the store cannot be used, the fallback breaker's snapshot."""
        if self._degraded:
            return self._local.snapshot
        now = self._now()
        state = self._observe(now)
        retry_after: float | None = None
        if state is BreakerState.CLOSED:
            calls, failures, slow = self._window.counts(now)
            calls += self._quick  # quick successes not yet folded in
        elif state is BreakerState.OPEN:
            calls, failures, slow = self._counts if self._gen == self._counted_gen else (0, 0, 0)
            if self._st == _OPEN:
                retry_after = max(0.0, (self._until - now) / 1e9)
        else:
            calls = failures = slow = 0
        return BreakerSnapshot(
            state=state, calls=calls, failures=failures, slow_calls=slow,
            failure_rate=failures / calls if calls else 0.0, slow_call_rate=slow / calls if calls else 0.0,
            trips=self._trips, retry_after=retry_after,
        )

    def state_changes(self) -> StateStream:
        """A new async iterator of every transition this replica observes from now on, in order
        (``CircuitBreaker.state_changes``'s stream: the newest 16 kept, the current state never
        replayed). A transition made elsewhere is seen at this replica's next refresh (within
        ``refresh_interval`` of a call); open -> half-open when a call or a state read finds the
        open period over. While the store cannot be used, the fallback's own stream
        (:attr:`fallback`) reports its transitions. Unsubscribes on ``aclose()``, when its
        consumer is cancelled, or when dropped."""
        stream = StateStream(self._unsubscribe)
        if self._streams is None:
            self._streams = weakref.WeakSet()
        self._streams.add(stream)
        return stream

    def _unsubscribe(self, stream: StateStream) -> None:
        if self._streams is not None:
            self._streams.discard(stream)

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
        return f"SharedCircuitBreaker({self._label!r}, state={self.state.value}, store={self._store!r})"

    # ------------------------------------------------------------------ store calls
    async def _call(self, script: str, *extra: int | str) -> list[Any] | None:
        """Run a breaker script and apply its reply to the local copy; None when the store could
        not be used (the copy is then marked degraded)."""
        try:
            reply = await self._store.call(script, self._keys, self._args(extra))
        except StoreError as exc:
            self._lost(exc)
            return None
        return self._took(script, reply)

    def _call_blocking(self, script: str, *extra: int | str) -> list[Any] | None:
        """:meth:`_call` on the store's sync client (for :meth:`call`)."""
        try:
            reply = self._store.call_blocking(script, self._keys, self._args(extra))
        except StoreError as exc:
            self._lost(exc)
            return None
        return self._took(script, reply)

    def _args(self, extra: tuple[int | str, ...]) -> tuple[int | float | str, ...]:
        draw = _random.stream(self._site).random() if self._config[5] else 0.0
        return (*self._config, draw, *extra)

    def _lost(self, exc: StoreError) -> None:
        self._degraded = True
        self._why = exc
        return None

    def _took(self, script: str, reply: list[Any]) -> list[Any] | None:
        try:
            self._apply(reply, script)
        except StoreError as exc:
            self._store.report(exc)
            self._lost(exc)
            return None
        self._store.accepted()
        return reply

    def _apply(self, reply: list[Any], script: str) -> None:
        st, trips, remaining, gen, granted, open_for = ints(reply, 6, script)
        events = [_text(v) for v in reply[6:]]
        if (st not in (0, 1, 2, 3) or granted not in (0, 1) or remaining < -1 or min(trips, gen, open_for) < 0
                or None in events):
            raise StoreError(f"{script} answered an unexpected reply {reply!r}", operation=script, unavailable=False)
        now = self._now()
        if gen != self._gen:
            # Another epoch: calls admitted before are stale, and a fresh closed period starts
            # with an empty window.
            self._window.clear()
            self._quick = 0
            self._defer_until = NEVER
            self._gen = gen
        if self._switched and st != _FORCED:
            if gen == 0:  # an empty state: the switch was lost with it, not lifted
                self._reforce = True
            else:
                # Lifted by force_closed()/reset() on another replica: the fallback, forced open
                # with the switch, no longer holds it here either (as the lift does locally).
                self._switched = False
                local = self._local.snapshot
                if local.state is BreakerState.OPEN and local.retry_after is None:
                    self._local.force_closed()
        with self._seen_lock:  # (the pair a reader recording a change reads)
            self._st = st
            self._until = now + remaining * 1000 if remaining >= 0 else 0
        self._trips = trips
        self._degraded = False
        self._due = now + self._refresh_ns
        self._observe(now)
        for event in events:
            assert event is not None
            self._announce(event, trips, open_for, now)

    def _announce(self, event: str, trips: int, open_for_us: int, now: int) -> None:
        name, _, detail = event.partition(":")
        if name == "opened":
            detail, _, probed = detail.partition(":")
            if probed:
                # A failed probe (probe_failed/slow/timeout): the episode's evidence, as the local
                # breaker's: its probes (those that succeeded and this one), one failed or slow.
                calls = int(probed) if probed.isdigit() else 0
                self._counts = (calls, int(detail != "probe_slow"), int(detail == "probe_slow"))
                self._counted_gen = self._gen
            if _SINKS.wants(Level.WARNING):
                # (A trip's evidence is this replica's window; a forced open's, when it forced it.)
                counted = detail in ("failure_rate", "slow_calls") or self._counted_gen == self._gen
                calls, failures, slow = self._counts if counted else (0, 0, 0)
                attrs: dict[str, Any] = {"trigger": detail, "calls": calls, "failures": failures, "slow_calls": slow,
                                         "trips": trips}
                if detail != "forced":
                    attrs["open_for"] = open_for_us / 1e6
                emit("breaker.opened", self.label, Level.WARNING, now, attrs)
        elif name == "half_open" and _SINKS.wants(Level.INFO):
            emit("breaker.half_open", self._label, Level.INFO, now, {"probes": self._probes})
        elif name == "closed" and _SINKS.wants(Level.INFO):
            emit("breaker.closed", self._label, Level.INFO, now, {"reason": detail})
            if detail == "reset":
                emit("breaker.reset", self._label, Level.INFO, now, {})
        elif name == "reset" and _SINKS.wants(Level.INFO):  # reset() of a closed breaker
            emit("breaker.reset", self._label, Level.INFO, now, {})

    def _contact(self) -> Generator[tuple[str, ...], list[Any] | None, None]:
        """The requests of a contact with the store, in order, for :meth:`refresh` (awaited) and
        :meth:`call` (on the sync client) alike: each step yields a request (the script and its
        arguments) and is sent the reply it got applied (None: the store could not be used).
        Read the shared state; throw again the switch of this replica that the reply found lost
        with the store's data (see _apply); then, while the store answers, give back or report
        each orphaned probe lease, dropped only once answered (a contact interrupted meanwhile
        leaves it for the next)."""
        answered = (yield ("breaker_refresh",)) is not None
        if self._reforce:
            self._reforce = False
            yield ("breaker_force", "open")
        lost = self._lost_trip
        if answered and lost is not None:
            gen, trigger, at = lost
            if (self._st == _CLOSED and (self._gen == gen or self._gen == 0)
                    and self._now() - at < self._shortest_open_ns):
                self._counted_gen = self._gen + 1  # (the evidence kept with it explains this opening)
                answered = (yield ("breaker_trip", trigger)) is not None
            if answered and self._lost_trip is lost:
                self._lost_trip = None
        while answered and self._orphans:
            orphan = self._orphans[-1]
            answered = (yield ("breaker_done", *orphan)) is not None
            if answered and orphan in self._orphans:
                self._orphans.remove(orphan)

    async def _contact_step(self, step: tuple[str, ...]) -> list[Any] | None:
        """One request of :meth:`_contact`, awaited. The switch thrown again runs in turn with
        this replica's manual controls, and only while it is still thrown: a lift called
        meanwhile is never taken by the store before it and undone by it. (Threads through
        :meth:`call` need no such turn: the manual controls are asyncio only.)"""
        if step[0] != "breaker_force":
            return await self._call(*step)
        async with self._control():
            return await self._call(*step) if self._switched else None

    async def refresh(self) -> None:
        """Read the shared state into this replica's copy now (one round trip)."""
        self._refreshing = True
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._refreshed = done
        cancelled = False
        contact = self._contact()
        try:
            step = _next(contact, None)
            while step is not None:
                step = _next(contact, await self._contact_step(step))
        except asyncio.CancelledError:
            cancelled = True  # no answer, no failure: the next call reads (a reply kept its _due)
            raise
        finally:
            contact.close()
            self._refreshing = False
            self._refreshed = None
            if not cancelled:
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
        rejections are never counted. :class:`stoic.DeadlineExceeded` without running ``fn`` or
        asking the store when the ambient deadline has already passed (``breaker.rejected`` with
        reason ``deadline_exceeded``), as ``CircuitBreaker`` refuses.
        """
        if _deadline.ever_set and _deadline_get() is not None:
            self._refuse_if_late()
        now = self._now
        start = now()
        gen = self._gen
        if start >= self._due or self._st or self._degraded or gen < 0:
            return await self._admit_slow(start, fn, args, kwargs)
        # The closed state with a fresh copy: no store round trip, no extra coroutine.
        awaitable: object = None
        try:
            awaitable = fn(*args, **kwargs) if kwargs else fn(*args)  # type: ignore[call-arg]
            result = await awaitable
        except BaseException as exc:
            _refuse_generator(exc, awaitable)
            verdict = self._judge(exc, True, fn)
            if verdict is not None:
                await self._record(gen, self._since(start), now(), exc if verdict else None)
            raise
        end = now()
        if _admission_state.waits:
            start = self._since(start)
        if end - start > self._slow_ns:
            await self._record(gen, start, end, None)  # (its breaker.recorded says slow)
            return result
        if end < self._defer_until and gen == self._gen:
            # A quick success that cannot change a decision: counted now, folded in later.
            # (Never while metrics are on: see _success.)
            self._quick += 1
        elif gen == self._gen:
            if self._success(start, end):
                await self._trip(end)
        elif _metrics_state.enabled:
            self._measure(start, end, None)  # stale, and counted as CircuitBreaker counts it
        if _SINKS.floor <= _DEBUG_INT and _SINKS.wants(_DEBUG_INT):
            self._recorded("success", False, start, end)
        return result

    async def _admit_slow(self, now: int, fn: Callable[..., Awaitable[R]], args: Any, kwargs: Any) -> R:
        if now >= self._due and not self._refreshing:
            await self.refresh()
        elif self._gen < 0 and self._refreshed is not None:
            # Nothing read yet: a replica that has not seen the shared state must not guess it.
            # (A read whose caller was cancelled before the answer came is made again, once.)
            while self._gen < 0 and not self._degraded:
                if self._refreshed is not None:
                    await asyncio.shield(self._refreshed)
                else:
                    await self.refresh()
        if self._degraded:
            return await self._without_store(fn, args, kwargs)
        st = self._st
        if st == _CLOSED:
            return await self._run(fn, args, kwargs)
        self._observe(self._now())  # an open period that has ended is seen (and published) as half-open
        if st == _FORCED or self._now() < self._until or self._leases_taken():
            raise self._reject(self._now())
        return await self._probe(fn, args, kwargs)

    def _leases_taken(self) -> bool:
        """Whether a lease request of the current half-open epoch found every probe lease taken at
        most ``refresh_interval`` ago: a call is then refused without asking the store (each
        asking would put every call on Redis while the fleet's probes run)."""
        return self._st == _HALF_OPEN and self._taken_gen == self._gen and self._now() < self._taken_until

    def _no_lease(self) -> None:
        """A lease request was refused: note it when the epoch is half-open (see _leases_taken)."""
        if self._st == _HALF_OPEN:
            self._taken_gen = self._gen
            self._taken_until = self._now() + self._refresh_ns

    def _refuse_if_late(self) -> None:
        left = _deadline.remaining_ns()
        if left is not None and left <= 0:
            state = self.state
            self._rejected(state)
            raise late(self.label, state, self._now())

    def _since(self, start: int) -> int:
        """When the call was admitted by the stages inside this breaker: a call that waited in an
        inner queue is timed from its admission, not from ``start`` (field report 20)."""
        return _admission.admitted_since(self._clock, start) if _admission_state.waits else start

    def _recorded(self, outcome: str, slow: bool, start: int, end: int) -> None:
        emit("breaker.recorded", self._label, Level.DEBUG, end,
             {"outcome": outcome, "slow": slow, "state": "closed", "duration": (end - start) / 1e9})

    def _new_recorder(self) -> _metrics.Recorder:
        return breaker_recorder(self)  # (as CircuitBreaker's: made once even when threads race)

    def _measure(self, start: int, end: int, error: BaseException | None) -> None:
        """Count a call with a verdict in ``stoic.breaker.calls`` / ``.call.duration`` (metrics on;
        ``error``: the failure, None for a success), as ``CircuitBreaker`` counts it: window
        evidence, stale or not, and probes. On the event loop, or under ``self._sync``."""
        recorder = self._recorder or self._new_recorder()
        if error is None:
            histogram = self._success_histogram
            assert histogram is not None  # (made with the recorder)
            histogram.observe(end - start)
        else:
            # (The recorder keys of CircuitBreaker's metrics, stoic._metrics.METRICS: recorded alike.)
            recorder.observe((_DURATION, "failure", error_type(error)), end - start)

    async def _without_store(self, fn: Callable[..., Awaitable[R]], args: Any, kwargs: Any) -> R:
        self._store_cannot_decide()
        return await self._local.execute(fn, *args, **kwargs)

    def _store_cannot_decide(self) -> None:
        """The store could not be used: ``fleet.fail_open`` (the caller then runs the call through
        :attr:`fallback`), or ``fleet.fail_closed`` and :class:`stoic.CircuitOpen` (counted in
        ``stoic.fleet.fallbacks``; ``retry_after`` None)."""
        fail_event(self._label, "breaker", self._fail_open, self._why, self._now())
        if not self._fail_open:
            raise CircuitOpen(f"circuit open ({self._label}): the store could not decide", label=self._label)

    def _rejected(self, state: BreakerState) -> None:
        """Count a refusal in ``stoic.breaker.rejections`` by ``state`` (metrics on), as
        ``CircuitBreaker`` counts its own: under the module's lock (from the loop or a thread)."""
        if _metrics_state.enabled:
            (self._recorder or self._new_recorder()).count_locked(("stoic.breaker.rejections", state.value))

    def _reject(self, now: int) -> CircuitOpen:
        retry_after = None
        if self._st == _OPEN and self._until > now:
            retry_after = (self._until - now) / 1e9
        state = self.state
        self._rejected(state)
        if _SINKS.wants(Level.DEBUG):
            attrs: dict[str, Any] = {"state": state.value}
            if retry_after is not None:
                attrs["retry_after"] = retry_after
            emit("breaker.rejected", self._label, Level.DEBUG, now, attrs)
        return CircuitOpen(label=self._label, retry_after=retry_after)

    def _judge(self, exc: BaseException, in_task: bool, fn: object) -> bool | None:
        """How ``fn``'s error ``exc`` counts. True: a failure; False: a success; None: no verdict
        (cancelled, a defect, ``fn`` called with arguments it does not take, a rejection).
        The local breaker's rules (``in_task``: the call ran on the async path, where the caller
        may be being cancelled; judged against the task's state, never ``cancelling() > 0``)."""
        if not isinstance(exc, Exception) or (in_task and caller_cancelled(exc)):
            return None
        if is_defect(exc) or misused(exc, fn):
            # (a bug at the call site, as the local breaker says)
            if _SINKS.wants(Level.ERROR):
                emit("breaker.defect", self._label, Level.ERROR, self._now(), {"error.type": error_type(exc)})
            return None
        try:
            counts = bool(plain_verdict(self._record_when(exc), "record_when"))
        except Exception as bad:
            # A broken record_when: reported once, and the call counts (the conservative decision).
            callback_failed(self._record_when, f"record_when of breaker {self._label!r} (the call counts as a failure)",
                            bad, exc)
            counts = True
        if not counts and is_rejection(exc):
            return None
        return counts

    async def _run(self, fn: Callable[..., Awaitable[R]], args: Any, kwargs: Any) -> R:
        """A call in the closed state: judged by this replica's window; a trip goes to the store."""
        gen = self._gen
        now = self._now
        start = now()
        awaitable: object = None
        try:
            awaitable = fn(*args, **kwargs)
            result = await awaitable
        except BaseException as exc:
            _refuse_generator(exc, awaitable)
            verdict = self._judge(exc, True, fn)
            if verdict is not None:
                await self._record(gen, self._since(start), now(), exc if verdict else None)
            raise
        end = now()
        start = self._since(start)
        # The success path: no store round trip unless this success trips the window (slow calls).
        if end - start > self._slow_ns:
            await self._record(gen, start, end, None)  # (its breaker.recorded says slow)
            return result
        if gen == self._gen and self._st == _CLOSED:
            if self._success(start, end):
                await self._trip(end)
        elif _metrics_state.enabled:
            self._measure(start, end, None)  # stale
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

    def _success(self, start: int, end: int) -> bool:
        """Put a quick success in the window (and in the metrics when on); True when that trips it."""
        window = self._window
        tripped = self._fold() | window.success(end)
        if _metrics_state.enabled:
            # Every success is measured: none skips the window (the quick path stays closed).
            self._measure(start, end, None)
            self._defer_until = NEVER
        else:
            # Successes may skip the window until its current bucket ends (once it holds
            # minimum_calls), and at least every millisecond they are folded in.
            self._defer_until = min(window.defer_until(), end + 1_000_000)
        return tripped

    def _note(self, gen: int, start: int, end: int, error: BaseException | None) -> bool:
        """Put an outcome in the window (``error``: the failure, None for a success); True when
        that trips it."""
        if _metrics_state.enabled:
            self._measure(start, end, error)
        if gen != self._gen or self._st != _CLOSED:
            return False  # stale: the shared state moved on while it ran
        failed = error is not None
        slow = end - start > self._slow_ns
        if _SINKS.wants(_DEBUG_INT):
            self._recorded("failure" if failed else "success", slow, start, end)
        self._defer_until = NEVER
        return self._fold() | self._window.add(end, (FAILED if failed else 0) | (SLOW if slow else 0))

    async def _record(self, gen: int, start: int, end: int, error: BaseException | None) -> None:
        if self._note(gen, start, end, error):
            await self._trip(end)

    def _tripping(self, now: int) -> str:
        """Empty the window that tripped, keeping its evidence; the trigger to send."""
        window = self._window
        self._fold()
        trigger = window.tripped() or "failure_rate"
        self._counts = window.counts(now)
        self._counted_gen = self._gen + 1  # the epoch this trip opens, if it is the one that does
        window.clear()
        self._defer_until = NEVER
        return trigger

    async def _trip(self, now: int) -> None:
        # Shielded: the window that tripped is emptied here, so a trip lost with its cancelled
        # caller (a request's deadline, most likely while the dependency fails) would wait for
        # minimum_calls more failures. The caller still leaves at once; the trip lands.
        gen = self._gen
        await asyncio.shield(self._send_trip(gen, self._tripping(now), now))

    async def _send_trip(self, gen: int, trigger: str, now: int) -> None:
        if await self._call("breaker_trip", trigger) is None:
            self._lost_trip = (gen, trigger, now)  # (sent again at the next contact: see __init__)

    def _trip_blocking(self, now: int) -> None:
        """:meth:`_trip` on the store's sync client (under ``self._sync``)."""
        gen = self._gen
        trigger = self._tripping(now)
        if self._call_blocking("breaker_trip", trigger) is None:
            self._lost_trip = (gen, trigger, now)

    async def _probe(self, fn: Callable[..., Awaitable[R]], args: Any, kwargs: Any) -> R:
        token = os.urandom(9).hex()
        try:
            reply = await self._call("breaker_probe", token)
        except asyncio.CancelledError:
            # The server may have granted the lease before the caller left: given back at once
            # (a lease nobody holds would keep the fleet's probes taken until half_open_timeout,
            # then count as a failed probe). A token never granted changes nothing.
            await self._done(token, "none")
            raise
        if reply is None:
            self._orphan(token, "none")
            return await self._without_store(fn, args, kwargs)
        if not reply[4]:
            if self._st == _CLOSED:
                return await self._run(fn, args, kwargs)
            self._no_lease()
            raise self._reject(self._now())
        start = self._now()
        awaitable: object = None
        try:
            awaitable = fn(*args, **kwargs)
            result = await awaitable
        except BaseException as exc:
            refusal: TypeError | None = None
            try:
                _refuse_generator(exc, awaitable)
            except TypeError as refused:
                refusal = refused  # raised once the lease is back
            verdict = None if refusal is not None else self._judge(exc, True, fn)
            end, start = self._now(), self._since(start)
            # Reported even while the caller is being cancelled: the lease goes back at once
            # instead of expiring after half_open_timeout.
            done = await self._done(token, self._outcome(verdict, start, end))
            if verdict is not None:
                self._probed(done, exc if verdict else None, start, end)
            if refusal is not None:
                raise refusal from refusal.__cause__
            raise
        end, start = self._now(), self._since(start)
        self._probed(await self._done(token, self._outcome(False, start, end)), None, start, end)
        return result

    def _outcome(self, verdict: bool | None, start: int, end: int) -> str:
        """A probe's outcome as the ``breaker_done`` script takes it: ``none`` (no verdict: the
        lease is given back), ``failed``, ``slow`` or ``ok``."""
        if verdict is None:
            return "none"
        if verdict:
            return "failed"
        return "slow" if end - start > self._slow_ns else "ok"

    def _probed(self, reply: list[Any] | None, error: BaseException | None, start: int, end: int) -> None:
        """A probe with a verdict (``error``: its failure, None for a success): measured (metrics
        on), and ``breaker.recorded`` when the store counted it (its lease was held)."""
        if _metrics_state.enabled:
            self._measure(start, end, error)
        if reply is not None and reply[4] and _SINKS.wants(_DEBUG_INT):
            emit("breaker.recorded", self._label, Level.DEBUG, end,
                 {"outcome": "success" if error is None else "failure", "slow": end - start > self._slow_ns,
                  "state": "half_open", "duration": (end - start) / 1e9})

    def _orphan(self, token: str, outcome: str) -> None:
        if len(self._orphans) < 16:  # (bounded: an outage makes one per probe interval at most)
            self._orphans.append((token, outcome))

    async def _done(self, token: str, outcome: str) -> list[Any] | None:
        """Report a probe's outcome (``none``: give the lease back); one that gets no answer is
        sent again at the next contact (harmless when it did run: the lease is gone, and a
        second report is stale)."""
        try:
            reply = await self._call("breaker_done", token, outcome)
        except asyncio.CancelledError:
            # Cancelled before the reply came: the report may never have run, so it is sent again.
            if await self._call("breaker_done", token, outcome) is None:
                self._orphan(token, outcome)
            raise
        if reply is None:
            self._orphan(token, outcome)
        return reply

    # ------------------------------------------------------------------ plain functions
    def call(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the plain function ``fn(*args, **kwargs)`` through the shared breaker (from any
        thread) and return its result: :meth:`execute` for threads, on the store's sync client.

        Raises as :meth:`execute` (``CircuitOpen`` when refused; ``fn``'s own exception
        unchanged); ``TypeError`` for an async function, or a store without a sync client (build
        it from a URL or a ``redis.Redis``). A refresh due, a trip or a probe's report is one
        round trip on the calling thread, bounded by the store's budget.
        """
        if is_async_callable(fn):
            raise TypeError(f"SharedCircuitBreaker.call runs plain functions, not {fn!r}: use execute()")
        if self._store.sync_client is None:
            raise TypeError("SharedCircuitBreaker.call needs a store built from a URL or a redis.Redis client")
        if _deadline.ever_set and _deadline_get() is not None:
            self._refuse_if_late()
        now = self._now
        with self._sync:
            start = now()
            if start >= self._due or self._gen < 0:
                contact = self._contact()
                try:
                    step = _next(contact, None)
                    while step is not None:
                        step = _next(contact, self._call_blocking(*step))
                finally:
                    contact.close()
                self._due = now() + self._refresh_ns
            st, gen, degraded = self._st, self._gen, self._degraded
            if not degraded and st != _CLOSED and (st == _FORCED or now() < self._until or self._leases_taken()):
                raise self._reject(now())
        if degraded:
            self._store_cannot_decide()
            return self._local.call(fn, *args, **kwargs)
        if st != _CLOSED:
            return self._probe_blocking(fn, args, kwargs)
        start = now()
        try:
            result = fn(*args, **kwargs)
            if type(result) in UNRUN_RESULTS:
                CircuitBreaker._refuse_result(fn, result)
        except BaseException as exc:
            verdict = self._judge(exc, False, fn)
            if verdict is not None:
                with self._sync:
                    if self._note(gen, self._since(start), now(), exc if verdict else None):
                        self._trip_blocking(now())
            raise
        end = now()
        start = self._since(start)
        slow = end - start > self._slow_ns
        with self._sync:
            if slow:
                tripped = self._note(gen, start, end, None)  # (its breaker.recorded says slow)
            elif gen == self._gen and self._st == _CLOSED:
                tripped = self._success(start, end)
            else:
                tripped = False
                if _metrics_state.enabled:
                    self._measure(start, end, None)  # stale
            if tripped:
                self._trip_blocking(end)
        if not slow and _SINKS.wants(_DEBUG_INT):
            self._recorded("success", False, start, end)
        return result

    def _probe_blocking(self, fn: Callable[..., R], args: Any, kwargs: Any) -> R:
        token = os.urandom(9).hex()
        with self._sync:
            reply = self._call_blocking("breaker_probe", token)
            closed = self._st == _CLOSED
            if reply is not None and not reply[4]:
                self._no_lease()
        if reply is None:
            self._orphan(token, "none")
            self._store_cannot_decide()
            return self._local.call(fn, *args, **kwargs)
        if not reply[4]:
            if closed:
                return self.call(fn, *args, **kwargs)
            raise self._reject(self._now())
        start = self._now()
        try:
            result = fn(*args, **kwargs)
            if type(result) in UNRUN_RESULTS:
                CircuitBreaker._refuse_result(fn, result)
        except BaseException as exc:
            verdict = self._judge(exc, False, fn)
            end, start = self._now(), self._since(start)
            with self._sync:  # (the figures are updated under it)
                done = self._done_blocking(token, self._outcome(verdict, start, end))
                if verdict is not None:
                    self._probed(done, exc if verdict else None, start, end)
            raise
        end, start = self._now(), self._since(start)
        with self._sync:
            done = self._done_blocking(token, self._outcome(False, start, end))
            self._probed(done, None, start, end)
        return result

    def _done_blocking(self, token: str, outcome: str) -> list[Any] | None:
        """:meth:`_done` on the store's sync client (under ``self._sync``)."""
        reply = self._call_blocking("breaker_done", token, outcome)
        if reply is None:
            self._orphan(token, outcome)
        return reply

    @through_method_decorators
    def __call__(self, fn: Callable[P, Coroutine[Any, Any, R]]) -> Callable[P, Coroutine[Any, Any, R]]:
        """Decorate an async function so every call runs as :meth:`execute` would (``TypeError``
        for a plain function)."""
        if not is_async_callable(fn):
            raise TypeError(f"SharedCircuitBreaker decorates async functions, not {fn!r}")

        @functools.wraps(fn)
        async def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
            return await self.execute(fn, *args, **kwargs)

        return guarded

    # ------------------------------------------------------------------ manual control
    def _control(self) -> asyncio.Lock:
        """The lock the manual controls of this replica take, on the running loop."""
        loop = asyncio.get_running_loop()
        controls = self._controls
        if controls is None or controls[0] is not loop:
            controls = self._controls = (loop, asyncio.Lock())
        return controls[1]

    async def _force(self, mode: str) -> None:
        if await self._call("breaker_force", mode) is None:
            raise StoreError(f"force {mode} of {self._label!r} could not reach the store", operation="breaker_force",
                             unavailable=True)

    def _forcing(self) -> None:
        """Keep the evidence a forced open carries (``CircuitBreaker.force_open``'s): this replica's
        window when closed, its own trip's when open, none from half-open (counted in the store)."""
        if self._st == _CLOSED:
            self._fold()
            self._counts = self._window.counts(self._now())
        elif not (self._st == _OPEN and self._counted_gen == self._gen):
            self._counts = (0, 0, 0)
        self._counted_gen = self._gen + 1  # the epoch the forced open starts, if this call makes it

    async def force_open(self) -> None:
        """Open the breaker for the whole fleet with no end (a kill switch) until
        :meth:`force_closed` or :meth:`reset` on any replica. Other replicas refuse within
        ``refresh_interval``. Once the store has taken it, the fallback breaker is forced open
        too, so the switch holds here through a store outage (until it is lifted: here, or on
        another replica, as this one's next read finds), and this replica throws it again
        when it finds the shared state empty (a Redis restarted without its data, a flushed or
        expired key). Raises :class:`StoreError` when the store cannot be reached; this replica
        is then left as it was (its fallback and the switch it throws again untouched), as it is
        when the call is cancelled. A request whose answer was lost (the budget ran out) may
        still have reached the store: call again. The manual controls of one replica
        (``force_open``, ``force_closed``, ``reset``) run one at a time, in the order called:
        each waits for those called before it to end (one cancelled while it waits leaves the
        queue), so each starts from what the one before left and one that fails puts back only
        its own change: this replica ends as the last control the store took left it."""
        async with self._control():
            before = self._counts, self._counted_gen
            self._forcing()
            forcing = self._counts, self._counted_gen
            try:
                await self._force("open")
            except BaseException:
                if (self._counts, self._counted_gen) == forcing:  # (unless a trip here kept its own since)
                    self._counts, self._counted_gen = before  # no forced open of ours to explain
                raise
            self._local.force_open()
            self._switched = True

    async def force_closed(self) -> None:
        """Close the breaker fleet-wide (the trip count is kept), and the fallback breaker with
        it once the store has taken it. Raises :class:`StoreError` when the store cannot be
        reached; this replica is then left as it was, as :meth:`force_open` says (and runs in
        turn with this replica's other manual controls)."""
        await self._lift("closed", self._local.force_closed)

    async def reset(self) -> None:
        """Close the breaker fleet-wide and forget the trip count, the fallback breaker's too,
        once the store has taken it. Raises :class:`StoreError` when the store cannot be
        reached; this replica is then left as it was, as :meth:`force_open` says (and runs in
        turn with this replica's other manual controls)."""
        await self._lift("reset", self._local.reset)

    async def _lift(self, mode: str, local: Callable[[], None]) -> None:
        """Lift the switch fleet-wide (``mode`` closed or reset), then ``local`` on the fallback."""
        async with self._control():
            switched = self._switched
            # Cleared before the reply is applied: an empty shared state in it is this lifting,
            # not the switch lost with the store's data (see _apply).
            self._switched = False
            try:
                await self._force(mode)
            except BaseException:
                self._switched = switched
                raise
            local()


__all__ = ["SharedCircuitBreaker"]
