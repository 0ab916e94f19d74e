"""The circuit breaker: admission, recording, the state machine and manual control.

Seed 000, "CircuitBreaker". Admission is a synchronous decision under a ``threading.Lock``
that is released before the operation runs; nothing runs in the background (the open period
is an instant on the breaker's clock and the move to half-open happens lazily, on the first
call or state read at or after it). Every transition starts a new epoch (a fresh list object);
a call carries the epoch it was admitted in, and one that completes in another epoch is stale.
In the closed state the epoch list also counts quick successes taken without the lock (see
``CircuitBreaker._fold``).
"""

from __future__ import annotations

import asyncio
import threading
import time
import types
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Final, ParamSpec, TypeVar, overload

from .. import _deadline, _random
from .._clock import Clock, SystemClock, current_clock
from .._deadline import _current as _deadline_scope
from .._deadline import remaining_ns
from .._durations import Seconds, check_int, to_ns
from .._errors import CircuitOpen, DeadlineExceeded, Defect, Rejected, is_defect
from ..events import Level, emit, min_level
from ..events._sinks import _process as _sinks_registry
from . import _decorate
from ._config import BreakerSnapshot, BreakerState, CountWindow, OpenDuration, TimeWindow, threshold_ppm
from ._stream import StateStream
from ._window import FAILED, FOREVER, NEVER, SLOW, CountRing, TimeBuckets

P = ParamSpec("P")
R = TypeVar("R")

_CLOSED: Final = BreakerState.CLOSED
_OPEN: Final = BreakerState.OPEN
_HALF_OPEN: Final = BreakerState.HALF_OPEN

_DEBUG: Final = Level.DEBUG
_INFO: Final = Level.INFO
_WARNING: Final = Level.WARNING
_ERROR: Final = Level.ERROR

# Quick successes are folded into the window at least this often (bounds the epoch list).
_FOLD_EVERY_NS: Final = 1_000_000

# Level.DEBUG as a plain int: comparing two exact ints is the specialised (fast) comparison.
_DEBUG_INT: Final = int(Level.DEBUG)

_deadline_get = _deadline_scope.get
_CoroutineType: Final = types.CoroutineType
_current_task = asyncio.current_task

# Events gathered under the lock and emitted after it is released: (name, level, attributes).
_Pending = list[tuple[str, Level, dict[str, Any]]]


def _caller_cancelling() -> bool:
    """Whether the current task is being cancelled (False outside a running task: a coroutine
    closed or driven by hand has no caller to ask)."""
    try:
        task = _current_task()
    except RuntimeError:
        return False
    return task is not None and task.cancelling() > 0


def _refuse_coroutine(fn: object, result: object) -> None:
    """An async function given to the sync path would "succeed" without running: close its
    coroutine and raise a TypeError whose cause is a Defect, so the call is never counted."""
    assert isinstance(result, Coroutine)
    result.close()
    raise TypeError(f"{fn!r} returned a coroutine: use await breaker.execute(...) for async functions") from Defect(
        "a coroutine function was passed to CircuitBreaker.call")


def _counts_by_default(error: BaseException) -> bool:
    """False for a :class:`stoic.Rejected` (an inner policy's refusal), True for anything else,
    including a :class:`stoic.DeadlineExceeded` raised by a ``stoic.timeout`` block inside the
    operation that cut the call short (``timed_out``): a hung call is a failed call."""
    return not isinstance(error, Rejected) or (isinstance(error, DeadlineExceeded) and error.timed_out)


class CircuitBreaker:
    """Stops calling a dependency that is failing, and probes it gradually once it may have recovered.

    Seed 000, "CircuitBreaker". ``label`` names the breaker on every event and rejection.

    Parameters (all keyword-only; durations are seconds as float or ``timedelta``):

    - ``window``: :class:`TimeWindow` (default ``TimeWindow(60.0)``, ten buckets) or
      :class:`CountWindow` (the exact last N calls).
    - ``minimum_calls`` (>= 1, default 10; <= N for a count window): calls the window must
      hold before it is judged.
    - ``failure_rate_threshold`` (in (0, 1], default 0.5): opens when the failure rate is at
      least this. ``slow_call_rate_threshold`` (in (0, 1], default 1.0): the same for slow calls.
    - ``slow_call_duration`` (> 0, default 10.0): a call that takes longer is slow; a slow
      half-open probe is a failed probe.
    - ``open_duration``: :class:`OpenDuration` (default ``OpenDuration.exponential()``:
      30 s, x2 per consecutive trip, at most 300 s, 20% jitter).
    - ``half_open_probes`` (>= 1, default 1): probe permits for one half-open episode.
    - ``half_open_timeout`` (> 0, default 60.0): a probe in flight this long counts as failed.
    - ``record_when``: ``(error) -> bool``, True when ``error`` is a failure of the dependency
      (default :meth:`counts_by_default`). False makes it a success, or for a
      :class:`stoic.Rejected` an ignored call.
    - ``clock``: the :class:`stoic.Clock` for the breaker's whole life (default: the ambient
      clock at construction).

    Raises ``ValueError`` naming the parameter and its range for any value out of range.
    Use ``await breaker.execute(fn, ...)`` for coroutine functions, ``breaker.call(fn, ...)``
    for plain functions (thread-safe), or ``@breaker`` on either.
    """

    __slots__ = (
        "__weakref__", "_clock", "_closed_epoch", "_closed_since", "_defer_until", "_epoch", "_fppm", "_inflight",
        "_lock", "_minimum",
        "_next_probe", "_now", "_open_counts", "_open_duration", "_open_until", "_probe_calls",
        "_probe_failures", "_probe_ok", "_probe_slow", "_probe_timeout_ns", "_probes", "_probes_free",
        "_record_when", "_site", "_slow_ns", "_sppm", "_state", "_streams", "_trips", "_window",
        "_window_kind", "label",
    )

    counts_by_default = staticmethod(_counts_by_default)

    def __init__(
        self,
        *,
        label: str,
        window: TimeWindow | CountWindow = TimeWindow(60.0),  # noqa: B008 (immutable value)
        minimum_calls: int = 10,
        failure_rate_threshold: float = 0.5,
        slow_call_duration: Seconds = 10.0,
        slow_call_rate_threshold: float = 1.0,
        open_duration: OpenDuration = OpenDuration.standard,
        half_open_probes: int = 1,
        half_open_timeout: Seconds = 60.0,
        record_when: Callable[[Exception], bool] = _counts_by_default,
        clock: Clock | None = None,
    ) -> None:
        if not isinstance(label, str):
            raise TypeError(f"label must be a str, got {type(label).__name__}")
        self.label = label
        if not isinstance(window, (TimeWindow, CountWindow)):
            raise ValueError(f"window must be TimeWindow(seconds) or CountWindow(calls), got {window!r}")
        if isinstance(window, CountWindow):
            minimum = check_int(minimum_calls, "minimum_calls", minimum=1, maximum=window.calls)
        else:
            minimum = check_int(minimum_calls, "minimum_calls", minimum=1)
        self._minimum = minimum
        self._fppm = threshold_ppm(failure_rate_threshold, "failure_rate_threshold")
        self._sppm = threshold_ppm(slow_call_rate_threshold, "slow_call_rate_threshold")
        # Capped at FOREVER (146 years: never reached).
        self._slow_ns = min(to_ns(slow_call_duration, "slow_call_duration"), FOREVER)
        if not isinstance(open_duration, OpenDuration):
            raise ValueError(f"open_duration must be an OpenDuration, got {open_duration!r}")
        self._open_duration = open_duration
        self._probes = check_int(half_open_probes, "half_open_probes", minimum=1)
        self._probe_timeout_ns = to_ns(half_open_timeout, "half_open_timeout")
        if not callable(record_when):
            raise ValueError("record_when must be a callable (error) -> bool")
        self._record_when = record_when
        self._window_kind = window
        self._window: CountRing | TimeBuckets = (
            CountRing(window.calls, minimum, self._fppm, self._sppm)
            if isinstance(window, CountWindow)
            else TimeBuckets(window.bucket_ns, minimum, self._fppm, self._sppm)
        )
        self._clock = clock if clock is not None else current_clock()
        # The system clock is read straight from time.monotonic_ns: one call fewer per read.
        self._now: Callable[[], int] = (
            time.monotonic_ns if type(self._clock) is SystemClock else self._clock.now_ns
        )
        # The construction call site keys this breaker's jitter stream (seeded under testing.seeded).
        self._site = _random.call_site(1)
        self._lock = threading.Lock()
        self._state: BreakerState = _CLOSED
        self._closed_epoch: list[None] | None = None
        # The epoch: a new list at every transition. A call carries the epoch it was admitted
        # in; one that ends in another epoch is stale. In the closed state the list also holds
        # quick successes not yet folded into the window (see _fold).
        self._epoch: list[None] = []
        self._defer_until = NEVER  # before this instant a quick success may skip the lock
        self._enter(_CLOSED)
        self._open_until: int | None = None
        self._open_counts = (0, 0, 0)
        self._trips = 0
        self._closed_since = self._now()
        self._probes_free = 0
        self._probe_ok = 0
        self._probe_calls = 0
        self._probe_failures = 0
        self._probe_slow = 0
        self._inflight: dict[int, int] = {}
        self._next_probe = 0
        self._streams: weakref.WeakSet[StateStream] = weakref.WeakSet()

    # ------------------------------------------------------------------ running operations
    async def execute(self, fn: Callable[P, Awaitable[R]], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run ``await fn(*args, **kwargs)`` through the breaker and return its result.

        Raises :class:`stoic.CircuitOpen` without running ``fn`` when the breaker is open
        (``retry_after`` = seconds left, ``None`` when forced open) or half-open with every
        probe permit taken (``retry_after`` ``None``); :class:`stoic.DeadlineExceeded` when the
        ambient deadline has already passed. Otherwise ``fn``'s own result or exception,
        unchanged. A cancelled caller, a :class:`stoic.Defect` and an inner rejection are
        never counted; ``KeyboardInterrupt``, ``SystemExit``, ``GeneratorExit`` and
        ``asyncio.CancelledError`` pass through uncounted.
        """
        if _deadline.ever_set and _deadline_get() is not None:  # (ever_set: see _deadline)
            self._refuse_if_late()
        epoch = self._closed_epoch  # the current epoch when closed, else None
        if epoch is None:
            epoch, probe = self._admit()
        else:
            probe = 0
        now = self._now
        start = now()
        try:
            # fn(*args) when there are no keyword arguments (nearly always): no dict to unpack.
            result = await (fn(*args, **kwargs) if kwargs else fn(*args))  # type: ignore[call-arg]
        except BaseException as exc:
            self._settle_error(exc, epoch, probe, start, True)
            raise
        end = now()
        if (
            end < self._defer_until
            and end - start <= self._slow_ns
            and (_sinks_registry.floor > _DEBUG_INT or min_level() > _DEBUG_INT)
        ):
            # (call() and the @breaker template in _decorate.py repeat this path: keep them in step.)
            # The closed-state fast path: a quick success that cannot change a decision is
            # counted without the lock (list.append is atomic) and folded into the window later.
            epoch.append(None)
            return result
        self._settle(epoch, probe, start, end, False)
        return result

    def call(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the plain function ``fn(*args, **kwargs)`` through the breaker (thread-safe).

        The same decisions and exceptions as :meth:`execute`; the lock is never held while
        ``fn`` runs, so calls from many threads run concurrently. Raises ``TypeError`` (never
        counted: it is a bug, not the dependency's health) when ``fn`` returns a coroutine: an
        async function goes through :meth:`execute`.
        """
        if _deadline.ever_set and _deadline_get() is not None:  # (ever_set: see _deadline)
            self._refuse_if_late()
        epoch = self._closed_epoch  # the current epoch when closed, else None
        if epoch is None:
            epoch, probe = self._admit()
        else:
            probe = 0
        now = self._now
        start = now()
        try:
            result = fn(*args, **kwargs) if kwargs else fn(*args)  # type: ignore[call-arg]
            if type(result) is _CoroutineType:
                _refuse_coroutine(fn, result)
        except BaseException as exc:
            self._settle_error(exc, epoch, probe, start, False)
            raise
        end = now()
        if (
            end < self._defer_until
            and end - start <= self._slow_ns
            and (_sinks_registry.floor > _DEBUG_INT or min_level() > _DEBUG_INT)
        ):
            epoch.append(None)
            return result
        self._settle(epoch, probe, start, end, False)
        return result

    @overload
    def __call__(self, fn: Callable[P, Coroutine[Any, Any, R]]) -> Callable[P, Coroutine[Any, Any, R]]: ...

    @overload
    def __call__(self, fn: Callable[P, R]) -> Callable[P, R]: ...

    def __call__(self, fn: Callable[P, Any]) -> Callable[P, Any]:
        """Decorate a coroutine function (each call runs as :meth:`execute` would) or a plain
        function (as :meth:`call` would); the wrapper keeps ``fn``'s name, docstring and
        signature. It repeats the fast path inline rather than calling through, and takes
        ``fn``'s own parameters when they are simple (see ``_decorate``)."""
        return _decorate.decorate(self, fn)

    # ------------------------------------------------------------------ admission
    def _refuse_if_late(self) -> None:
        left = remaining_ns()
        if left is not None and left <= 0:
            if min_level() <= _DEBUG:
                emit("breaker.rejected", self.label, _DEBUG, self._now(),
                     {"state": self._state.value, "reason": "deadline_exceeded"})
            raise DeadlineExceeded(f"deadline exceeded before calling through breaker {self.label!r}",
                                   label=self.label)

    def _admit(self) -> tuple[list[None], int]:
        """Admission outside the closed fast path: (epoch, probe id or 0), or CircuitOpen."""
        now = self._now()
        pending: _Pending = []
        retry_after: int | None = None
        with self._lock:
            self._advance(now, pending)
            state = self._state
            if state is _CLOSED:
                admitted: tuple[list[None], int] | None = (self._epoch, 0)
            elif state is _HALF_OPEN and self._probes_free > 0:
                self._probes_free -= 1
                self._next_probe += 1
                self._inflight[self._next_probe] = now
                admitted = (self._epoch, self._next_probe)
            else:
                admitted = None
                if state is _OPEN and self._open_until is not None:
                    retry_after = self._open_until - now
        if pending:
            self._flush(pending, now)
        if admitted is not None:
            return admitted
        seconds = None if retry_after is None else retry_after / 1e9
        if min_level() <= _DEBUG:
            attrs: dict[str, Any] = {"state": state.value}
            if seconds is not None:
                attrs["retry_after"] = seconds
            emit("breaker.rejected", self.label, _DEBUG, now, attrs)
        raise CircuitOpen(label=self.label, retry_after=seconds)

    # ------------------------------------------------------------------ recording
    def _settle_error(self, exc: BaseException, epoch: list[None], probe: int, start: int, in_task: bool) -> None:
        """Judge an operation that raised ``exc`` (``in_task``: it ran through the async path)."""
        end = self._now()
        if not isinstance(exc, Exception) or (in_task and _caller_cancelling()):
            # The caller was cancelled or interrupted: no evidence about the dependency.
            self._ignore(epoch, probe, "cancelled", end)
            return
        if is_defect(exc):
            self._ignore(epoch, probe, None, end)
            if min_level() <= _ERROR:
                emit("breaker.defect", self.label, _ERROR, end, {})
            return
        try:
            counts = bool(self._record_when(exc))
        except Exception:
            # A record_when that raises is a bug of ours, not the dependency's: never counted.
            self._ignore(epoch, probe, None, end)
            if min_level() <= _ERROR:
                emit("breaker.defect", self.label, _ERROR, end, {})
            return
        if not counts and isinstance(exc, Rejected):
            self._ignore(epoch, probe, "rejection", end)
            return
        self._settle(epoch, probe, start, end, counts)

    def _settle(self, epoch: list[None], probe: int, start: int, end: int, failed: bool) -> None:
        """Record a completed call: a failure, or a success (a return, or an error that
        ``record_when`` did not count) that could not take the fast path."""
        duration = end - start
        slow = duration > self._slow_ns
        pending: _Pending = []
        with self._lock:
            if probe:
                # A probe that outlived half_open_timeout re-opens the breaker, whoever looks first.
                self._advance(end, pending)
            state = self._state
            recorded = epoch is self._epoch
            if recorded and probe == 0:
                self._fold(end, pending)  # earlier quick successes first: they finished before
                recorded = epoch is self._epoch
                if recorded:
                    window = self._window
                    if failed or slow:
                        tripped = window.add(end, (FAILED if failed else 0) | (SLOW if slow else 0))
                    else:
                        tripped = window.success(end)
                    if tripped:
                        self._trip_closed(end, pending)
                    else:
                        self._defer_until = min(window.defer_until(), end + _FOLD_EVERY_NS)
            elif recorded:
                self._inflight.pop(probe, None)
                self._probe_calls += 1
                if failed:
                    self._probe_failures += 1
                if slow:
                    self._probe_slow += 1
                if failed:
                    self._reopen(end, "probe_failed", pending)
                elif slow:
                    self._reopen(end, "probe_slow", pending)
                else:
                    self._probe_ok += 1
                    if self._probe_ok >= self._probes:
                        self._close(end, "probes_succeeded", pending)
        if min_level() <= _DEBUG:
            self._emit_settled(recorded, "failure" if failed else "success", slow, state, end, duration)
        if pending:
            self._flush(pending, end)

    def _fold(self, now: int, pending: _Pending) -> None:
        """Fold the quick successes counted without the lock into the window (under the lock).

        ``del epoch[:n]`` removes exactly the ``n`` entries counted, in one step, so a success
        appended meanwhile by another thread stays for the next fold.
        """
        epoch = self._epoch
        count = len(epoch)
        if count and self._state is _CLOSED:
            del epoch[:count]
            if self._window.successes(count):
                self._trip_closed(now, pending)

    def _emit_settled(
        self, recorded: bool, outcome: str, slow: bool, state: BreakerState, now: int, duration: int
    ) -> None:
        if recorded:
            emit("breaker.recorded", self.label, _DEBUG, now,
                 {"outcome": outcome, "slow": slow, "state": state.value, "duration": duration / 1e9})
        else:
            emit("breaker.ignored", self.label, _DEBUG, now, {"reason": "stale"})

    def _ignore(self, epoch: list[None], probe: int, reason: str | None, now: int) -> None:
        """A completion without a verdict: a probe's permit goes back for another caller."""
        pending: _Pending = []
        if probe:
            with self._lock:
                self._advance(now, pending)
                if epoch is self._epoch and self._inflight.pop(probe, None) is not None:
                    self._probes_free += 1
        if reason is not None and min_level() <= _DEBUG:
            emit("breaker.ignored", self.label, _DEBUG, now, {"reason": reason})
        if pending:
            self._flush(pending, now)

    # ------------------------------------------------------------------ transitions (under the lock)
    def _advance(self, now: int, pending: _Pending) -> None:
        """Apply the lazy transitions due by ``now``, each at the instant it fell due: open ->
        half-open when the open period ends; a probe in flight for ``half_open_timeout`` re-opens."""
        while True:
            state = self._state
            if state is _OPEN:
                until = self._open_until
                if until is None or now < until:
                    return
                self._enter(_HALF_OPEN)
                self._probes_free = self._probes
                self._probe_ok = self._probe_calls = self._probe_failures = self._probe_slow = 0
                self._inflight.clear()
                self._publish(_HALF_OPEN)
                if min_level() <= _INFO:
                    pending.append(("breaker.half_open", _INFO, {"probes": self._probes}))
                return
            if state is not _HALF_OPEN or not self._inflight:
                return
            expired_at = min(self._inflight.values()) + self._probe_timeout_ns
            if now < expired_at:
                return
            # The open period counts from when the probe timed out, not from when it was noticed.
            self._probe_calls += 1
            self._probe_failures += 1
            self._reopen(expired_at, "probe_timeout", pending)

    def _trip_closed(self, now: int, pending: _Pending) -> None:
        """The window reached a threshold: open. Only sustained health resets the trip count."""
        if now - self._closed_since >= self._open_duration.reset_after_ns:
            self._trips = 0
        window = self._window
        trigger = window.tripped() or "failure_rate"
        self._open(now, trigger, window.counts(now), pending)

    def _reopen(self, now: int, trigger: str, pending: _Pending) -> None:
        self._open(now, trigger, (self._probe_calls, self._probe_failures, self._probe_slow), pending)

    def _open(self, now: int, trigger: str, counts: tuple[int, int, int], pending: _Pending) -> None:
        self._trips += 1
        duration = self._open_duration
        draw = _random.stream(self._site).random() if duration.jitter > 0 else 0.0
        open_for = duration.jittered_ns(self._trips, draw)
        self._enter(_OPEN)
        self._open_until = now + open_for
        self._open_counts = counts
        self._window.clear()
        self._inflight.clear()
        self._publish(_OPEN)
        if min_level() <= _WARNING:
            pending.append(("breaker.opened", _WARNING, {
                "trigger": trigger, "calls": counts[0], "failures": counts[1], "slow_calls": counts[2],
                "trips": self._trips, "open_for": open_for / 1e9,
            }))

    def _close(self, now: int, reason: str, pending: _Pending) -> None:
        changed = self._state is not _CLOSED
        self._enter(_CLOSED)
        self._window.clear()
        self._inflight.clear()
        self._closed_since = now
        self._open_until = None
        if changed:
            self._publish(_CLOSED)
            if min_level() <= _INFO:
                pending.append(("breaker.closed", _INFO, {"reason": reason}))

    def _enter(self, state: BreakerState) -> None:
        """Start a new epoch in ``state``: calls admitted before become stale, and quick
        successes not yet folded are dropped with the old list (callers fold first where
        they still count)."""
        epoch: list[None] = []
        self._epoch = epoch
        self._state = state
        self._closed_epoch = epoch if state is _CLOSED else None
        self._defer_until = NEVER

    def _publish(self, state: BreakerState) -> None:
        # Under the lock, so every stream sees transitions in the order they happened.
        if self._streams:
            for stream in list(self._streams):
                stream.publish(state)

    def _flush(self, pending: _Pending, now: int) -> None:
        level = min_level()
        label = self.label
        for name, lvl, attrs in pending:
            if level <= lvl:
                emit(name, label, lvl, now, attrs)

    # ------------------------------------------------------------------ observation
    @property
    def state(self) -> BreakerState:
        """The current state. Reading it applies the lazy transitions due now (open ->
        half-open when the open period has ended; a timed-out probe re-opens)."""
        state = self._state
        if state is _CLOSED:
            return state
        now = self._now()
        pending: _Pending = []
        with self._lock:
            self._advance(now, pending)
            state = self._state
        if pending:
            self._flush(pending, now)
        return state

    def snapshot(self) -> BreakerSnapshot:
        """A consistent :class:`BreakerSnapshot` at this instant (applies due transitions)."""
        now = self._now()
        pending: _Pending = []
        with self._lock:
            self._advance(now, pending)
            if self._state is _CLOSED:
                self._fold(now, pending)
            state = self._state
            retry_after: float | None = None
            if state is _CLOSED:
                if self._trips and now - self._closed_since >= self._open_duration.reset_after_ns:
                    self._trips = 0
                window = self._window
                calls, failures, slow = window.counts(now)
                self._defer_until = min(window.defer_until(), now + _FOLD_EVERY_NS)
            elif state is _HALF_OPEN:
                calls, failures, slow = self._probe_calls, self._probe_failures, self._probe_slow
            else:
                calls, failures, slow = self._open_counts
                if self._open_until is not None:
                    retry_after = (self._open_until - now) / 1e9
            trips = self._trips
        if pending:
            self._flush(pending, now)
        return BreakerSnapshot(
            state=state,
            calls=calls,
            failures=failures,
            slow_calls=slow,
            failure_rate=failures / calls if calls else 0.0,
            slow_call_rate=slow / calls if calls else 0.0,
            trips=trips,
            retry_after=retry_after,
        )

    def state_changes(self) -> StateStream:
        """A new async iterator of every transition from now on, in order.

        Keeps the newest 16 for a consumer that falls behind; never replays the current state
        (read :attr:`state` after subscribing). Half-open is reported when first observed by a
        call or a state read. Publishing never blocks the breaker and works from any thread.
        The stream unsubscribes when its consumer is cancelled, on ``aclose()``, or when it is
        dropped.
        """
        stream = StateStream(self._unsubscribe)
        with self._lock:
            self._streams.add(stream)
        return stream

    def _unsubscribe(self, stream: StateStream) -> None:
        with self._lock:
            self._streams.discard(stream)

    # ------------------------------------------------------------------ manual control
    def force_open(self) -> None:
        """Open with no end: every call is rejected (``retry_after`` ``None``); the breaker is not
        probed and never half-opens until :meth:`force_closed` or :meth:`reset`. Calls in
        flight finish as stale. Does not count as a trip."""
        now = self._now()
        pending: _Pending = []
        with self._lock:
            if self._state is _CLOSED:
                self._fold(now, pending)  # the quick successes count in the reported window
            if self._state is _OPEN and self._open_until is None:
                return
            window = self._window
            if self._state is _CLOSED:
                counts = window.counts(now)
            elif self._state is _HALF_OPEN:
                counts = (self._probe_calls, self._probe_failures, self._probe_slow)
            else:
                counts = self._open_counts
            changed = self._state is not _OPEN
            self._enter(_OPEN)
            self._open_until = None
            self._open_counts = counts
            window.clear()
            self._inflight.clear()
            if changed:
                self._publish(_OPEN)
            trips = self._trips
        if pending:
            self._flush(pending, now)
        if min_level() <= _WARNING:
            emit("breaker.opened", self.label, _WARNING, now, {
                "trigger": "forced", "calls": counts[0], "failures": counts[1], "slow_calls": counts[2],
                "trips": trips,
            })

    def force_closed(self) -> None:
        """Close now with an empty window; judging resumes at once (not a latch). The trip
        count is kept (see :meth:`reset`). Calls in flight finish as stale."""
        now = self._now()
        pending: _Pending = []
        with self._lock:
            self._close(now, "forced", pending)
        if pending:
            self._flush(pending, now)

    def reset(self) -> None:
        """:meth:`force_closed` and forget the trip count: the next trip opens for the initial
        duration. Emits ``breaker.reset`` (and ``breaker.closed`` when it was not closed)."""
        now = self._now()
        pending: _Pending = []
        with self._lock:
            self._close(now, "reset", pending)
            self._trips = 0
        pending.append(("breaker.reset", _INFO, {}))
        self._flush(pending, now)

    def __reduce_ex__(self, protocol: object) -> Any:
        """Refused: ``copy``, ``deepcopy`` and ``pickle`` all raise ``TypeError``. A breaker is the
        live, shared state of one dependency; a copy would judge it from a second, diverging window."""
        raise TypeError(f"a CircuitBreaker cannot be copied or pickled (breaker {self.label!r}): "
                        "share the one instance, or construct another")

    def __repr__(self) -> str:
        return f"CircuitBreaker(label={self.label!r}, state={self._state.value}, window={self._window_kind!r})"

