"""The circuit breaker: admission, recording, the state machine and manual control.

Seed 000, "CircuitBreaker". Admission is a synchronous decision under a ``threading.Lock``
that is released before the operation runs; nothing runs in the background (the open period
is an instant on the breaker's clock and the move to half-open happens lazily, on the first
call or state read at or after it). Every transition starts a new epoch (a fresh
``itertools.count``); a call carries the epoch it was admitted in, and one that completes in
another epoch is stale. In the closed state the epoch also counts the quick successes taken
without the lock (see ``CircuitBreaker._fold``). The call path itself (``execute``, ``call``,
``@breaker``) is one template in ``_decorate``.

Memory: the window, the half-open episode, the state-stream set and the metrics recorder are
created when first needed, so an unused breaker is one object, its lock and its epoch.
"""

from __future__ import annotations

import inspect
import itertools
import logging
import sys
import threading
import time
import types
import weakref
from bisect import bisect_left as _bisect_left
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, Final, ParamSpec, TypeVar, overload

from .. import _admission, _metrics, _random
from .._callbacks import callback_failed
from .._clock import Clock, SystemClock, current_clock
from .._deadline import caller_cancelled, remaining_ns
from .._durations import Seconds, check_int, check_label, to_seconds
from .._errors import (
    CircuitOpen,
    DeadlineExceeded,
    Defect,
    cut_by_deadline,
    failed_await,
    is_defect,
    is_rejection,
    misused,
)
from .._policy import plain_verdict, refuse_async_callback
from .._retune import validated
from ..events import Level, emit
from ..events._event import error_type
from ..events._sinks import kind_floor
from ..events._sinks import min_level as _min_level_of
from . import _decorate
from ._config import (
    BreakerSnapshot,
    BreakerState,
    CountWindow,
    OpenDuration,
    TimeWindow,
    duration_ns,
    threshold_ppm,
)
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

_NO_COUNTS: Final = (0, 0, 0)
_DEFAULT_WINDOW: Final = TimeWindow(60.0)
_STANDARD: Final = OpenDuration.standard
_metrics_state = _metrics.state
_admission_state = _admission.state
_log = logging.getLogger("stoic")

_BOUNDS_NS: Final = tuple(round(bound * 1e9) for bound in _metrics.DURATION_BUCKETS)
# Recorder keys are (metric name, *attribute values after stoic.label): see stoic._metrics.METRICS.
# stoic.breaker.calls is the count of this histogram, so a call is recorded once.
_DURATION: Final = "stoic.breaker.call.duration"
_SUCCESS_DURATION: Final = (_DURATION, "success", "")

# Only the sinks that want breaker events count here (issue 11): a debug sink that wants none of
# them leaves the fast path on.
_sinks_registry: Final = kind_floor("breaker")
_NEW_RECORDER: Final = threading.Lock()  # (see breaker_recorder)


def breaker_recorder(breaker: Any) -> _metrics.Recorder:
    """``breaker``'s metrics recorder (its ``_recorder``; a CircuitBreaker or a shared breaker),
    made on first use with the success series from the start, kept at hand in the breaker's
    ``_success_histogram`` (set before the recorder is published: a call that finds the recorder
    finds it). One per breaker even when a rejection (counted outside the breaker's lock) and a
    call race to make it; it holds the breaker weakly, for the state gauge."""
    with _NEW_RECORDER:
        recorder: _metrics.Recorder | None = breaker._recorder
        if recorder is None:
            recorder = _metrics.recorder("breaker", breaker._label, breaker)
            recorder.histograms[_SUCCESS_DURATION] = breaker._success_histogram = _metrics.Histogram()
            breaker._recorder = recorder
    return recorder


def min_level() -> int:
    """The lowest level any ambient sink wants for breaker events."""
    return _min_level_of("breaker")

def late(label: str, state: BreakerState, now: int) -> DeadlineExceeded:
    """The refusal of a call that found the ambient deadline passed before it was admitted (seed
    000: a policy does not start work that is already late): ``breaker.rejected`` with reason
    ``deadline_exceeded`` (debug), and the error to raise. Shared by every breaker kind."""
    if min_level() <= _DEBUG:
        emit("breaker.rejected", label, _DEBUG, now, {"state": state.value, "reason": "deadline_exceeded"})
    return DeadlineExceeded(f"deadline exceeded before calling through breaker {label!r}", label=label)


# Events gathered under the lock and emitted after it is released: (name, level, attributes).
_Pending = list[tuple[str, Level, dict[str, Any]]]


def _counted(epoch: itertools.count[int]) -> int:
    """How many times ``next()`` was called on an epoch (``count(n)``'s repr is the only public
    view of its position; read under the lock, off the success path)."""
    return int(repr(epoch)[6:-1])


def _counts_by_default(error: BaseException) -> bool:
    """False for a rejection (a :class:`stoic.Rejected`, or an exception group every leaf of which
    is one: inner policies refused, say nothing about the dependency); True for anything else,
    including a group with any other leaf, and a :class:`stoic.DeadlineExceeded` raised by a
    ``stoic.timeout`` block inside the operation that cut the call short (``timed_out``): a hung
    call is a failed call."""
    return not is_rejection(error) or cut_by_deadline(error)




def _report_callback(
    breaker: CircuitBreaker, callback: object, error: Exception, operation_error: BaseException,
) -> None:
    """A ``record_when`` that raised: a configuration error, reported once per callback, loudly,
    by stoic's one rule for user callbacks (``stoic._callbacks.callback_failed``: chained as the
    operation error's context, a ``RuntimeWarning`` and an error on the ``stoic`` logger). The
    operation's own error still propagates; the callback's is also noted on it."""
    try:
        operation_error.add_note(f"stoic: record_when of breaker {breaker.label!r} raised "
                                 f"{type(error).__qualname__}: {error}")
    except Exception:  # an exception type that refuses notes keeps its error as it is
        pass
    callback_failed(callback, f"record_when of breaker {breaker.label!r} (the call counts as a failure)",
                    error, operation_error)


class _Episode:
    """One half-open episode: its probe permits and what the probes found (created per episode)."""

    __slots__ = ("calls", "failures", "free", "inflight", "next_id", "ok", "probes", "slow")

    def __init__(self, probes: int) -> None:
        # The episode's own probe count: a retune of half_open_probes applies from the next one.
        self.probes = self.free = probes
        self.ok = self.calls = self.failures = self.slow = 0
        self.inflight: dict[int, int] = {}
        self.next_id = 0


class CircuitBreaker:
    """Stops calling a dependency that is failing, and probes it gradually once it may have recovered.

    Seed 000, "CircuitBreaker". ``label`` (a non-empty ``str``, required) names the breaker on
    every event and rejection.

    Parameters (all keyword-only; durations are seconds as float or ``timedelta``, each in
    (0, MAX_SECONDS], 10**12 s):

    - ``window``: :class:`TimeWindow` (default ``TimeWindow(60.0)``, ten buckets) or
      :class:`CountWindow` (the exact last N calls).
    - ``minimum_calls`` (>= 1, default 10; <= N for a count window): calls the window must
      hold before it is judged.
    - ``failure_rate_threshold`` (in (0, 1], default 0.5): opens when the failure rate is at
      least this. ``slow_call_rate_threshold`` (in (0, 1], default 1.0): the same for slow calls.
    - ``slow_call_duration`` (default 10.0): a call that takes longer is slow; a slow half-open
      probe is a failed probe. Measured from the instant the inner stages admitted the call
      (a bulkhead slot or limiter permit granted after a wait), so local queueing is never
      taken for a slow dependency (field report 20).
    - ``open_duration``: :class:`OpenDuration` (default ``OpenDuration.exponential()``:
      30 s, x2 per consecutive trip, at most 300 s, 20% jitter).
    - ``half_open_probes`` (>= 1, default 1): probe permits for one half-open episode.
    - ``half_open_timeout`` (default 60.0): a probe in flight this long counts as failed.
    - ``record_when``: ``(error) -> bool``, True when ``error`` is a failure of the dependency
      (default :meth:`counts_by_default`). False makes it a success, or for a rejection an
      ignored call. One that raises is reported once (warning and ``stoic`` logger) and the
      call is counted as a failure.
    - ``clock``: the :class:`stoic.Clock` for the breaker's whole life (default: the ambient
      clock at construction).

    Raises ``TypeError`` for a value of the wrong type (``label``, ``clock``, ``record_when``,
    ``window``, ``open_duration``) and ``ValueError`` naming the parameter and its range for a
    value out of range. Use ``await breaker.execute(fn, ...)`` for coroutine functions,
    ``breaker.call(fn, ...)`` for plain functions (thread-safe), or ``@breaker`` on either.
    """

    __slots__ = (
        "__weakref__", "_clock", "_closed_epoch", "_closed_since", "_defer_until", "_episode", "_epoch",
        "_fold_until", "_folded", "_fppm", "_lock", "_minimum", "_now", "_open_counts", "_open_duration", "_open_until",
        "_probe_timeout_ns", "_probes", "_quick_from", "_record_when", "_recorder", "_site", "_slow_ns", "_sppm",
        "_label", "_state", "_streams", "_success_histogram", "_trips", "_window", "_window_kind",
    )

    counts_by_default = staticmethod(_counts_by_default)

    def __init__(
        self,
        *,
        label: str,
        window: TimeWindow | CountWindow = _DEFAULT_WINDOW,
        minimum_calls: int = 10,
        failure_rate_threshold: float = 0.5,
        slow_call_duration: Seconds = 10.0,
        slow_call_rate_threshold: float = 1.0,
        open_duration: OpenDuration = _STANDARD,
        half_open_probes: int = 1,
        half_open_timeout: Seconds = 60.0,
        record_when: Callable[[Exception], bool] = _counts_by_default,
        clock: Clock | None = None,
    ) -> None:
        if type(label) is not str or not label:
            label = str(check_label(label))  # (a str subclass is kept as a plain str)
        self._label = label
        if (
            minimum_calls is _D_MINIMUM and failure_rate_threshold is _D_FAILURE and slow_call_duration is _D_SLOW
            and slow_call_rate_threshold is _D_SLOW_RATE and half_open_probes is _D_PROBES
            and half_open_timeout is _D_PROBE_TIMEOUT
        ):
            # The defaults, validated once at import (and their integers shared by every breaker).
            minimum, self._fppm, self._sppm, self._slow_ns, self._probes, self._probe_timeout_ns = _DEFAULTS
        else:
            minimum = check_int(minimum_calls, "minimum_calls", minimum=1)
            self._fppm = threshold_ppm(failure_rate_threshold, "failure_rate_threshold")
            self._sppm = threshold_ppm(slow_call_rate_threshold, "slow_call_rate_threshold")
            self._slow_ns = duration_ns(slow_call_duration, "slow_call_duration")
            self._probes = check_int(half_open_probes, "half_open_probes", minimum=1)
            self._probe_timeout_ns = duration_ns(half_open_timeout, "half_open_timeout")
        if window is not _DEFAULT_WINDOW:
            if isinstance(window, CountWindow):
                minimum = check_int(minimum_calls, "minimum_calls", minimum=1, maximum=window.calls)
            elif not isinstance(window, TimeWindow):
                raise TypeError(f"window must be TimeWindow(seconds) or CountWindow(calls), got {window!r}")
        self._window_kind = window
        self._minimum = minimum
        if open_duration is not _STANDARD and not isinstance(open_duration, OpenDuration):
            raise TypeError(f"open_duration must be an OpenDuration, got {open_duration!r}")
        self._open_duration = open_duration
        if record_when is not _counts_by_default:
            _check_record_when(record_when)
        self._record_when = record_when
        if clock is None:
            clock = current_clock()
        elif not callable(getattr(clock, "now_ns", None)):
            raise TypeError(f"clock must be a stoic.Clock (with now_ns()), got {type(clock).__name__}")
        self._clock = clock
        # The system clock is read straight from time.monotonic_ns: one call fewer per read.
        self._now: Callable[[], int] = time.monotonic_ns if type(clock) is SystemClock else clock.now_ns
        # The construction call site keys this breaker's jitter stream (seeded under testing.seeded);
        # interned, so breakers made on one line share the string.
        frame = sys._getframe(1)
        self._site = sys.intern(f"{frame.f_code.co_filename}:{frame.f_lineno}")
        self._lock = threading.Lock()
        self._window: CountRing | TimeBuckets | None = None
        self._episode: _Episode | None = None
        self._streams: weakref.WeakSet[StateStream] | None = None
        self._recorder: _metrics.Recorder | None = None
        self._success_histogram: _metrics.Histogram | None = None  # the recorder's success series
        self._open_until: int | None = None
        self._open_counts = _NO_COUNTS
        self._trips = 0
        # Only read once there has been a trip (to reset the trip count): no clock read here.
        self._closed_since = 0
        self._state: BreakerState = _CLOSED
        # The first epoch is made by the first call (through _admit): an unused breaker has none.
        self._epoch: itertools.count[int] | None = None
        self._closed_epoch: itertools.count[int] | None = None
        self._folded = 0
        self._defer_until = NEVER
        self._quick_from = FOREVER
        self._fold_until = NEVER

    # ------------------------------------------------------------------ running operations
    _EXECUTE_DOC: Final = """Run ``await fn(*args, **kwargs)`` through the breaker and return its result.

        Raises :class:`stoic.CircuitOpen` without running ``fn`` when the breaker is open
        (``retry_after`` = seconds left, ``None`` when forced open) or half-open with every
        probe permit taken (``retry_after`` ``None``); :class:`stoic.DeadlineExceeded` when the
        ambient deadline has already passed; ``TypeError`` (never counted) when ``fn`` returns
        an async generator or anything else that cannot be awaited, or cannot be called with
        ``args``/``kwargs`` (Python's own binding error, passed on). Otherwise ``fn``'s own
        result or exception, unchanged. A cancelled caller, a :class:`stoic.Defect` and an
        inner rejection are never counted; ``KeyboardInterrupt``, ``SystemExit``,
        ``GeneratorExit`` and ``asyncio.CancelledError`` pass through uncounted.
        """

    _CALL_DOC: Final = """Run the plain function ``fn(*args, **kwargs)`` through the breaker (thread-safe).

        The same decisions and exceptions as :meth:`execute`; the lock is never held while
        ``fn`` runs, so calls from many threads run concurrently. Raises ``TypeError`` (never
        counted: it is a bug, not the dependency's health) when ``fn`` returns a coroutine, a
        generator or an async generator: an async function goes through :meth:`execute`, and a
        generator's body would run while the caller iterates, outside the breaker.
        """

    if TYPE_CHECKING:
        async def execute(self, fn: Callable[P, Awaitable[R]], /, *args: P.args, **kwargs: P.kwargs) -> R: ...

        def call(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R: ...
    else:
        execute = _decorate.method(True, "execute", _EXECUTE_DOC)
        call = _decorate.method(False, "call", _CALL_DOC)

    @overload
    def __call__(self, fn: Callable[P, Coroutine[Any, Any, R]]) -> Callable[P, Coroutine[Any, Any, R]]: ...

    @overload
    def __call__(self, fn: Callable[P, R]) -> Callable[P, R]: ...

    def __call__(self, fn: Callable[P, Any]) -> Callable[P, Any]:
        """Decorate a coroutine function (each call runs as :meth:`execute` would) or a plain
        function (as :meth:`call` would); the wrapper keeps ``fn``'s name, docstring and
        signature. Raises ``TypeError`` for a generator or async generator function: protect
        the code that consumes the generator instead (see ``_decorate``)."""
        return _decorate.decorate(self, fn)

    # ------------------------------------------------------------------ admission
    def _refuse_if_late(self) -> None:
        left = remaining_ns()
        if left is not None and left <= 0:
            state = self._state
            if _metrics_state.enabled:  # a refusal, counted as _admit counts its own
                (self._recorder or self._new_recorder()).count_locked(("stoic.breaker.rejections", state.value))
            raise late(self.label, state, self._now())

    def _admit(self, now: int) -> tuple[itertools.count[int], int]:
        """Admission outside the closed fast path: (epoch, probe id or 0), or CircuitOpen."""
        pending: _Pending = []
        retry_after: int | None = None
        lock = self._lock
        lock.acquire()  # (as in _settle)
        try:
            self._advance(now, pending)
            state = self._state
            episode = self._episode
            if state is _CLOSED:
                epoch = self._epoch
                if epoch is None:  # the breaker's first call
                    epoch = self._epoch = self._closed_epoch = itertools.count()
                admitted: tuple[itertools.count[int], int] | None = (epoch, 0)
            elif state is _HALF_OPEN and episode is not None and episode.free > 0:
                episode.free -= 1
                episode.next_id += 1
                episode.inflight[episode.next_id] = now
                assert self._epoch is not None
                admitted = (self._epoch, episode.next_id)
            else:
                admitted = None
                if state is _OPEN and self._open_until is not None:
                    retry_after = self._open_until - now
        finally:
            lock.release()
        if pending:
            try:
                self._flush(pending, now)
            except BaseException:
                # A sink on breaker.half_open raised (KeyboardInterrupt, SystemExit, ...): the
                # call never runs, so a probe permit taken goes back.
                if admitted is not None and admitted[1]:
                    self._ignore(admitted[0], admitted[1], None, now)
                raise
        if admitted is not None:
            return admitted
        seconds = None if retry_after is None else retry_after / 1e9
        if _metrics_state.enabled:  # a rare decision, outside the breaker's lock
            (self._recorder or self._new_recorder()).count_locked(("stoic.breaker.rejections", state.value))
        if min_level() <= _DEBUG:
            attrs: dict[str, Any] = {"state": state.value}
            if seconds is not None:
                attrs["retry_after"] = seconds
            emit("breaker.rejected", self._label, _DEBUG, now, attrs)
        raise CircuitOpen(label=self._label, retry_after=seconds)

    @staticmethod
    def _refuse_result(fn: object, result: object) -> None:
        """A plain operation returned a coroutine, generator or async generator: it would
        "succeed" without its body having run inside the breaker. Close it and raise a
        TypeError whose cause is a Defect, so the call is never counted."""
        _close_unawaited(result)
        kind = type(result).__name__
        hint = ("use await breaker.execute(...) for async functions" if kind == "coroutine"
                else "protect the code that consumes the generator instead")
        raise TypeError(f"{fn!r} returned a {kind} through CircuitBreaker.call: {hint}") from Defect(
            f"a {kind} was returned to CircuitBreaker.call")

    # ------------------------------------------------------------------ recording
    def _settle_error(
        self, exc: BaseException, epoch: itertools.count[int], probe: int, start: int, in_task: bool,
        awaitable: object, fn: object,
    ) -> None:
        """Judge operation ``fn`` that raised ``exc`` (``in_task``: it ran through the async path,
        which passes the object it awaited, or None when ``fn`` itself raised)."""
        end = self._now()
        if not isinstance(exc, Exception) or (in_task and caller_cancelled(exc)):
            # The caller was cancelled or interrupted: no evidence about the dependency.
            self._ignore(epoch, probe, "cancelled", end)
            return
        if type(exc) is TypeError and in_task and failed_await(exc) and not inspect.isawaitable(awaitable):
            # execute() was handed a (async) generator function, or a plain function (its value,
            # None included, cannot be awaited): refused like @breaker on a generator function.
            # (An awaitable raising TypeError of its own, a generator-based coroutine included,
            # is the operation's failure.)
            self._ignore(epoch, probe, None, end)
            generator = type(awaitable) in (types.GeneratorType, types.AsyncGeneratorType)
            if generator:  # (never anything else: a plain function's value is the caller's to close)
                _close_unawaited(awaitable)
            kind = type(awaitable).__name__
            hint = ("protect the code that consumes the generator instead" if generator
                    else "execute takes an async function; use call() for a plain one")
            if min_level() <= _ERROR:  # (reported as call()'s misuse and an inner stage's are)
                emit("breaker.defect", self.label, _ERROR, end, {"error.type": "TypeError"})
            raise TypeError(f"CircuitBreaker.execute got a {kind}, which cannot be awaited: {hint}") from Defect(
                f"a {kind} was passed to execute")
        if is_defect(exc) or misused(exc, fn):
            # (An inner stage's await on a plain function's value: the same bug, not the
            # dependency's failure. One in the operation's own code is its failure: failed_await.
            # So is fn called with arguments it does not take: the call site's bug, which one
            # buggy caller must not turn into an open circuit for everyone.)
            self._ignore(epoch, probe, None, end)
            if min_level() <= _ERROR:
                emit("breaker.defect", self._label, _ERROR, end, {"error.type": error_type(exc)})
            return
        try:
            counts = bool(plain_verdict(self._record_when(exc), "record_when"))
        except Exception as bad:
            # A broken record_when is a configuration error: reported once, and the call is
            # judged conservatively (a failure), never silently ignored.
            _report_callback(self, self._record_when, bad, exc)
            counts = True
        except BaseException:
            # KeyboardInterrupt, SystemExit, CancelledError, GeneratorExit from record_when:
            # the probe permit goes back before it propagates.
            self._ignore(epoch, probe, None, end)
            raise
        if not counts and is_rejection(exc):
            self._ignore(epoch, probe, "rejection", end)
            return
        self._settle(epoch, probe, start, end, counts, error_type(exc) if counts else None)

    def _settle(
        self, epoch: itertools.count[int], probe: int, start: int, end: int, failed: bool, kind: str | None,
    ) -> None:
        """Record a completed call: a failure (``kind``: its error.type), or a success (a return,
        or an error that ``record_when`` did not count) that could not take the fast path."""
        if _admission_state.waits:
            # The call waited in an inner queue: time the dependency from its admission.
            start = _admission.admitted_since(self._clock, start)
        duration = end - start
        slow = duration > self._slow_ns
        pending: _Pending = []
        lock = self._lock
        lock.acquire()  # (acquire/release in try/finally: half the cost of ``with lock`` on CPython 3.11)
        try:
            if probe:
                # A probe that outlived half_open_timeout re-opens the breaker, whoever looks first.
                self._advance(end, pending)
            state = self._state
            recorded = epoch is self._epoch
            if recorded and probe == 0:
                if end < self._fold_until:
                    self._fold(end, pending)  # earlier quick successes first: they finished before
                    recorded = epoch is self._epoch
                if recorded:
                    window = self._window or self._new_window()
                    if failed or slow:
                        tripped = window.add(end, (FAILED if failed else 0) | (SLOW if slow else 0))
                    else:
                        tripped = window.success(end)
                    if tripped:
                        self._trip_closed(end, pending)
                    elif _metrics_state.enabled:
                        # Every call takes this path while metrics are on: the lock-free path is
                        # closed, and its count was just folded for the last time (a success
                        # that read "metrics off" counted before any other thread could run: no
                        # switch between its check and its next(), see _decorate). Reading the
                        # epoch on every call would cost more than the metrics themselves.
                        self._defer_until = NEVER
                        self._fold_until = NEVER
                    else:
                        self._defer(window, end)
            elif recorded:
                episode = self._episode
                assert episode is not None
                episode.inflight.pop(probe, None)
                episode.calls += 1
                if failed:
                    episode.failures += 1
                if slow:
                    episode.slow += 1
                if failed:
                    self._reopen(end, "probe_failed", pending)
                elif slow:
                    self._reopen(end, "probe_slow", pending)
                else:
                    episode.ok += 1
                    if episode.ok >= episode.probes:
                        self._close(end, "probes_succeeded", pending)
            if _metrics_state.enabled:
                recorder = self._recorder or self._new_recorder()
                if failed:
                    recorder.observe((_DURATION, "failure", kind or ""), duration)
                else:
                    # The success series exist from the recorder's creation: updated in place,
                    # with no method call and no lookup (every call's cost while metrics are on).
                    histogram = self._success_histogram
                    assert histogram is not None  # (made with the recorder)
                    histogram.counts[_bisect_left(_BOUNDS_NS, duration)] += 1
                    histogram.sum_ns += duration
                    histogram.count += 1
        finally:
            lock.release()
        if _sinks_registry.floor <= _DEBUG and min_level() <= _DEBUG:
            self._emit_settled(recorded, "failure" if failed else "success", slow, state, end, duration)
        if pending:
            self._flush(pending, end)

    def _defer(self, window: CountRing | TimeBuckets, now: int) -> None:
        """Open the lock-free path for quick successes ending before the window allows (under the
        lock; ``now`` is this step's clock reading). A success that started at or after
        ``_quick_from`` and ends before ``_defer_until`` took less than ``slow_call_duration``
        (their difference is exactly that), so the fast path needs two comparisons and no
        subtraction; one that started earlier (in flight across this step) falls back to
        measuring its duration.

        When the window would allow longer than ``slow_call_duration`` from now (a count window
        allows forever; a time window's bucket may outlast it), the pair is placed from now
        instead: a call starting from now on is then proven quick without the subtraction, and
        the first success ending past the pair takes this locked step once more (once per
        ``slow_call_duration`` at most)."""
        slow = self._slow_ns
        until = window.defer_until()
        if until - slow > now:
            until = now + slow
        # Closed while the pair changes: every state a fast path can read is valid (closed, or
        # the two instants exactly slow_call_duration apart).
        self._defer_until = NEVER
        self._quick_from = until - slow
        self._defer_until = until
        self._fold_until = FOREVER

    def _new_window(self) -> CountRing | TimeBuckets:
        kind = self._window_kind
        window: CountRing | TimeBuckets = (
            CountRing(kind.calls, self._minimum, self._fppm, self._sppm)
            if isinstance(kind, CountWindow)
            else TimeBuckets(kind.bucket_ns, self._minimum, self._fppm, self._sppm)
        )
        self._window = window
        return window

    def _new_recorder(self) -> _metrics.Recorder:
        # Made on the first call or decision after metrics were enabled (not at construction: a
        # breaker per route must stay small).
        return breaker_recorder(self)

    def _fold(self, now: int, pending: _Pending) -> None:
        """Fold the quick successes counted without the lock into the window (under the lock).

        The epoch only ever counts up; ``_folded`` is how much of it the window holds already, so
        a success counted while this runs is simply folded next time: exact at any call rate,
        with nothing growing in between.
        """
        if self._state is not _CLOSED or self._epoch is None:
            return
        total = _counted(self._epoch)
        count = total - self._folded
        if count:
            self._folded = total
            window = self._window or self._new_window()
            if window.successes(count):
                self._trip_closed(now, pending)

    def _pending_quick(self) -> int:
        """Quick successes counted but not yet folded (for tests and the benchmark)."""
        with self._lock:
            epoch = self._epoch
            return _counted(epoch) - self._folded if self._state is _CLOSED and epoch is not None else 0

    def _emit_settled(
        self, recorded: bool, outcome: str, slow: bool, state: BreakerState, now: int, duration: int
    ) -> None:
        if recorded:
            emit("breaker.recorded", self._label, _DEBUG, now,
                 {"outcome": outcome, "slow": slow, "state": state.value, "duration": duration / 1e9})
        else:
            emit("breaker.ignored", self._label, _DEBUG, now, {"reason": "stale"})

    def _ignore(self, epoch: itertools.count[int], probe: int, reason: str | None, now: int) -> None:
        """A completion without a verdict: a probe's permit goes back for another caller."""
        pending: _Pending = []
        if probe:
            with self._lock:
                self._advance(now, pending)
                episode = self._episode
                if epoch is self._epoch and episode is not None and episode.inflight.pop(probe, None) is not None:
                    episode.free += 1
        if reason is not None and min_level() <= _DEBUG:
            emit("breaker.ignored", self._label, _DEBUG, now, {"reason": reason})
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
                self._episode = _Episode(self._probes)
                self._publish(_HALF_OPEN)
                if min_level() <= _INFO:
                    pending.append(("breaker.half_open", _INFO, {"probes": self._probes}))
                return
            episode = self._episode
            if state is not _HALF_OPEN or episode is None or not episode.inflight:
                return
            expired_at = min(episode.inflight.values()) + self._probe_timeout_ns
            if now < expired_at:
                return
            # The open period counts from when the probe timed out, not from when it was noticed.
            episode.calls += 1
            episode.failures += 1
            self._reopen(expired_at, "probe_timeout", pending)

    def _trip_closed(self, now: int, pending: _Pending) -> None:
        """The window reached a threshold: open. Only sustained health resets the trip count."""
        if now - self._closed_since >= self._open_duration.reset_after_ns:
            self._trips = 0
        window = self._window
        assert window is not None
        trigger = window.tripped() or "failure_rate"
        self._open(now, trigger, window.counts(now), pending)

    def _reopen(self, now: int, trigger: str, pending: _Pending) -> None:
        episode = self._episode
        counts = (episode.calls, episode.failures, episode.slow) if episode is not None else _NO_COUNTS
        self._open(now, trigger, counts, pending)

    def _open(self, now: int, trigger: str, counts: tuple[int, int, int], pending: _Pending) -> None:
        self._trips += 1
        duration = self._open_duration
        # Drawn from the ambient stream each time, never cached here: _random reseeds its
        # streams in a forked child, so pre-fork workers do not open in lockstep (field report 21).
        draw = _random.stream(self._site).random() if duration.jitter > 0 else 0.0
        open_for = duration.jittered_ns(self._trips, draw)
        self._enter(_OPEN)
        self._open_until = now + open_for
        self._open_counts = counts
        self._window = None
        self._episode = None
        self._publish(_OPEN)
        if min_level() <= _WARNING:
            pending.append(("breaker.opened", _WARNING, {
                "trigger": trigger, "calls": counts[0], "failures": counts[1], "slow_calls": counts[2],
                "trips": self._trips, "open_for": open_for / 1e9,
            }))

    def _close(self, now: int, reason: str, pending: _Pending) -> None:
        changed = self._state is not _CLOSED
        self._enter(_CLOSED)
        self._window = None
        self._episode = None
        self._closed_since = now
        self._open_until = None
        if changed:
            self._publish(_CLOSED)
            if min_level() <= _INFO:
                pending.append(("breaker.closed", _INFO, {"reason": reason}))

    def _enter(self, state: BreakerState) -> None:
        """Start a new epoch in ``state``: calls admitted before become stale, and quick
        successes not yet folded are dropped with the old epoch (callers fold first where
        they still count)."""
        epoch: itertools.count[int] = itertools.count()
        self._epoch = epoch
        self._folded = 0
        self._state = state
        self._closed_epoch = epoch if state is _CLOSED else None
        self._defer_until = NEVER
        self._fold_until = NEVER  # the new epoch has counted nothing yet

    def _publish(self, state: BreakerState) -> None:
        # Under the lock, so every stream sees transitions in the order they happened.
        if _metrics_state.enabled:
            (self._recorder or self._new_recorder()).count(("stoic.breaker.transitions", state.value))
        if self._streams:
            for stream in list(self._streams):
                stream.publish(state)

    def _flush(self, pending: _Pending, now: int) -> None:
        level = min_level()
        label = self._label
        for name, lvl, attrs in pending:
            if level <= lvl:
                emit(name, label, lvl, now, attrs)

    # ------------------------------------------------------------------ observation
    @property
    def label(self) -> str:
        """The label carried by every event, metric and error of this breaker (read-only)."""
        return self._label

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

    @property
    def snapshot(self) -> BreakerSnapshot:
        """A consistent :class:`BreakerSnapshot` at this instant (reading it applies due
        transitions and folds the quick successes counted without the lock)."""
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
                if window is None:
                    calls, failures, slow = _NO_COUNTS
                else:
                    calls, failures, slow = window.counts(now)
                    if not _metrics_state.enabled:
                        self._defer(window, now)
            elif state is _HALF_OPEN:
                episode = self._episode
                calls, failures, slow = (
                    (episode.calls, episode.failures, episode.slow) if episode is not None else _NO_COUNTS)
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
            if self._streams is None:
                self._streams = weakref.WeakSet()
            self._streams.add(stream)
        return stream

    def _unsubscribe(self, stream: StateStream) -> None:
        with self._lock:
            if self._streams is not None:
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
            if self._state is _CLOSED:
                counts = self._window.counts(now) if self._window is not None else _NO_COUNTS
            elif self._state is _HALF_OPEN:
                episode = self._episode
                counts = (episode.calls, episode.failures, episode.slow) if episode is not None else _NO_COUNTS
            else:
                counts = self._open_counts
            changed = self._state is not _OPEN
            self._enter(_OPEN)
            self._open_until = None
            self._open_counts = counts
            self._window = None
            self._episode = None
            if changed:
                self._publish(_OPEN)
            trips = self._trips
        if pending:
            self._flush(pending, now)
        if min_level() <= _WARNING:
            emit("breaker.opened", self._label, _WARNING, now, {
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

    def _retune(self, **changes: Any) -> None:
        """Swap the configuration live (stoic.ControlPlane.retune): any constructor parameter but
        ``label`` and ``clock``, validated by the constructor (``ValueError`` naming the parameter;
        the breaker unchanged). A closed breaker starts an empty window under the new thresholds
        (calls in flight finish as stale, as after :meth:`force_closed`); an open or half-open one
        keeps its state, period and probes, and the new configuration applies from its next
        transition. The trip count is kept."""
        with self._lock:
            # The settings are read under the lock: a retune from another thread landing between
            # that read and this one's writes would be undone by them.
            fresh = validated(self, {
                "window": self._window_kind, "minimum_calls": self._minimum,
                "failure_rate_threshold": self._fppm / 1e6, "slow_call_rate_threshold": self._sppm / 1e6,
                "slow_call_duration": to_seconds(self._slow_ns), "open_duration": self._open_duration,
                "half_open_probes": self._probes, "half_open_timeout": to_seconds(self._probe_timeout_ns),
                "record_when": self._record_when,
            }, changes)
            self._window_kind, self._minimum, self._fppm, self._sppm = (
                fresh._window_kind, fresh._minimum, fresh._fppm, fresh._sppm)
            self._slow_ns, self._open_duration, self._probes = fresh._slow_ns, fresh._open_duration, fresh._probes
            self._probe_timeout_ns, self._record_when = fresh._probe_timeout_ns, fresh._record_when
            if self._state is _CLOSED and self._epoch is not None:
                self._enter(_CLOSED)  # a new epoch: what the old window judged is dropped with it
                self._window = None

    def __reduce_ex__(self, protocol: object) -> Any:
        """Refused: ``copy``, ``deepcopy`` and ``pickle`` all raise ``TypeError``. A breaker is the
        live, shared state of one dependency; a copy would judge it from a second, diverging window."""
        raise TypeError(f"a CircuitBreaker cannot be copied or pickled (breaker {self._label!r}): "
                        "share the one instance, or construct another")

    def __repr__(self) -> str:
        return f"CircuitBreaker(label={self._label!r}, state={self._state.value}, window={self._window_kind!r})"


_KW: Final = CircuitBreaker.__init__.__kwdefaults__ or {}
_D_MINIMUM: Final = _KW["minimum_calls"]
_D_FAILURE: Final = _KW["failure_rate_threshold"]
_D_SLOW: Final = _KW["slow_call_duration"]
_D_SLOW_RATE: Final = _KW["slow_call_rate_threshold"]
_D_PROBES: Final = _KW["half_open_probes"]
_D_PROBE_TIMEOUT: Final = _KW["half_open_timeout"]
_DEFAULTS: Final = (
    check_int(_D_MINIMUM, "minimum_calls", minimum=1),
    threshold_ppm(_D_FAILURE, "failure_rate_threshold"),
    threshold_ppm(_D_SLOW_RATE, "slow_call_rate_threshold"),
    duration_ns(_D_SLOW, "slow_call_duration"),
    check_int(_D_PROBES, "half_open_probes", minimum=1),
    duration_ns(_D_PROBE_TIMEOUT, "half_open_timeout"),
)


def _close_unawaited(value: object) -> None:
    """Close a coroutine or generator that will never run (no "never awaited" warning)."""
    close = getattr(value, "close", None)
    if close is not None and not isinstance(value, types.AsyncGeneratorType):
        close()


def _check_record_when(record_when: object) -> None:
    """A ``record_when`` must be callable with one positional argument (the error)."""
    if not callable(record_when):
        raise TypeError(f"record_when must be a callable (error) -> bool, got {type(record_when).__name__}")
    refuse_async_callback(record_when, "record_when", "bool")
    try:
        signature = inspect.signature(record_when)
    except (TypeError, ValueError):  # a builtin or extension callable without a signature: trusted
        return
    try:
        signature.bind(None)
    except TypeError as error:
        raise TypeError(f"record_when must accept one positional argument (the error): "
                        f"{record_when!r} has the signature {signature} ({error})") from None
