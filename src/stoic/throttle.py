"""The adaptive throttle: client-side shedding in proportion to the dependency's failures
(seed 003, "Adaptive throttle"; the Google SRE book, "Handling Overload", client-side
throttling).

Over a rolling window the throttle counts *requests* (calls it saw, shed ones included) and
*accepts* (calls the dependency handled: successes, and failures that are the dependency doing
its job, i.e. non-retryable ones) and refuses a call locally with probability

    min(max_probability, max(0, (requests - k * accepts) / (requests + 1)))

once the window holds ``min_throughput`` requests. Shed calls count as requests but not
accepts, so the throttle settles where roughly ``k`` times the dependency's capacity is sent.

Recovery after a total outage needs two things beyond the formula. During the outage the
probability approaches 1 (``requests / (requests + 1)``), so almost nothing probes the
dependency: the cap (``max_probability``, default 0.9, as failsafe-go) keeps one call in ten
going through. The cap alone is not enough with a rolling window: the probes' accepts grow
roughly as ``exp(t * k / window)`` against a window full of the outage's requests, so after a
ten-minute outage the probability falls below 5 % only after about 1.7 windows (measured in the
tests). So the probability is also never higher than the same formula on the two latest
buckets alone: while failures persist both agree, and after a recovery the latest buckets'
accepts bring the shedding down within two to four buckets (20 to 40 s at the default
window), well inside one window. While the dependency fails as much in the latest buckets as
over the window, the two rules agree up to the formula's ``+ 1``, which weighs more on the two
buckets' fewer requests (a few percent at low traffic).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from . import _metrics, _random
from ._callbacks import callback_failed
from ._classify import ClassifierLike, RetryClassifier, _own_decision, as_classifier
from ._clock import Clock, SystemClock, resolve_clock
from ._deadline import caller_cancelled, deadline_cut_running_work
from ._durations import Seconds, check_int, check_label, to_ns, to_seconds
from ._errors import Throttled, cut_by_deadline, is_defect, is_rejection, leaves, misused
from ._policy import is_async_callable, through_method_decorators
from ._retune import validated
from .events import Level, emit
from .events._sinks import kind_floor

if TYPE_CHECKING:
    import asyncio
else:  # imported on first use (stoic._lazy)
    from ._lazy import lazy_asyncio

    asyncio = lazy_asyncio(globals())

# The sinks wanting throttle events (stoic.events._sinks.KindFloor): a sink that wants none of
# them leaves these events unbuilt.
_SINKS = kind_floor("throttle")

P = ParamSpec("P")
T = TypeVar("T")

BUCKETS = 12
"""Buckets in the rolling window (10 s each for the default two minutes)."""


def _check_float(value: float, name: str, *, low: float, high: float | None, low_open: bool) -> float:
    number = float("nan")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:  # an int beyond any float
            pass
    ok = math.isfinite(number) and (number > low if low_open else number >= low) and (high is None or number <= high)
    if not ok:
        rng = f"in {'(' if low_open else '['}{low:g}, {high:g}]" if high is not None else f">= {low:g}"
        raise ValueError(f"{name} must be a finite number {rng}, got {value!r}")
    return number


class AdaptiveThrottle:
    """Probabilistic client-side throttling (seed 003, "Adaptive throttle").

    ``AdaptiveThrottle(*, k=2.0, min_throughput=10, window=120.0, max_probability=0.9,
    classify=RetryClassifier.transient_only, label, clock=None)``

    - ``k`` (finite, >= 1): how many requests per accept are tolerated before shedding starts.
    - ``min_throughput`` (int >= 0): below this many requests in the window nothing is shed.
    - ``window`` (seconds > 0): the rolling window, kept in 12 buckets.
    - ``max_probability`` (in (0, 1]): the cap on the shed probability (see the module
      docstring for why it exists).
    - ``classify``: decides which failures were the dependency's fault; a failure it would not
      retry (a domain error) counts as accepted. The default, ``transient_only``, counts only
      ``TimeoutError``, ``ConnectionError`` (httpx's and aiohttp's timeouts and connection
      failures too) and errors that say they are retryable against the dependency: a
      ``ValueError`` from a validation is the dependency doing its job. A classifier (or an
      error's ``retry_decision``) that raises never replaces ``fn``'s error: it is chained to
      it, reported once (``warnings`` and the ``"stoic"`` logger), and the call counts as a
      failure.

    ``await throttle.execute(fn, *args, **kwargs)`` or ``@throttle``. Raises
    :class:`stoic.Throttled` (a retryable :class:`stoic.Rejected`, ``fn`` not run) when the
    call is shed; ``fn``'s own exceptions propagate unchanged. A timeout (``TimeoutError``, a
    ``DeadlineExceeded`` that cut the call, a cancellation by an enclosing ``stoic.timeout``)
    counts as a failure, and so does a server's own refusal (an HTTP 429, ``TooManyRequests``
    from stoic's HTTP integrations: it reached the server); other cancellations (an error ``fn``
    made of its caller's cancellation too, judged as the breaker judges it), defects, inner
    policies' rejections and a misused ``fn`` (called with arguments it does not take, or a plain
    function whose value was awaited: a bug at the call site) are not
    counted at all (an exception group too, judged by its leaves: only rejections, or any leaf a
    defect; a group with a leaf a deadline cut, and no defect leaf, is a timeout; otherwise a
    group counts as a failure if the classifier would retry any of its leaves, as the breaker
    counts one, and the classifier is asked about each leaf). Randomness
    comes from stoic's per-call-site streams (reproducible under ``stoic.testing.seeded``).
    Read-only: ``probability`` (the shed probability the next call would face), ``requests``,
    ``accepts``.

    Raises ``ValueError`` naming the parameter and its range for bad configuration.
    """

    __slots__ = ("__weakref__", "_accepts", "_bucket_ns", "_classify", "_clock", "_end_ns", "_epoch", "_index",
                 "_k", "_label", "_max_probability", "_min_throughput", "_now_ns", "_rec", "_requests", "_site",
                 "_total_accepts", "_total_requests")

    def __init__(
        self, *, k: float = 2.0, min_throughput: int = 10, window: Seconds = 120.0, max_probability: float = 0.9,
        classify: ClassifierLike = RetryClassifier.transient_only, label: str, clock: Clock | None = None,
    ) -> None:
        self._label = check_label(label)
        # Registered for the probability gauge (read at collection; stoic._metrics).
        self._rec = _metrics.recorder("throttle", self._label, self)
        self._k = _check_float(k, "k", low=1.0, high=None, low_open=False)
        self._min_throughput = check_int(min_throughput, "min_throughput", minimum=0)
        window_ns = to_ns(window, "window")
        self._bucket_ns = max(1, window_ns // BUCKETS)
        self._max_probability = _check_float(max_probability, "max_probability", low=0.0, high=1.0, low_open=True)
        self._classify = as_classifier(classify)  # transient_only: only overload evidence counts
        self._clock: Clock = resolve_clock(clock)
        self._now_ns = time.monotonic_ns if type(self._clock) is SystemClock else self._clock.now_ns
        self._site = _random.call_site(1)
        self._requests = [0] * BUCKETS
        self._accepts = [0] * BUCKETS
        self._total_requests = 0
        self._total_accepts = 0
        self._start_epoch(self._clock.now_ns())

    def _start_epoch(self, now: int) -> None:
        """Make the bucket of ``now`` the current one (the window emptied, or rolled to it)."""
        self._epoch = epoch = now // self._bucket_ns  # the bucket number last written
        self._index = epoch % BUCKETS
        self._end_ns = (epoch + 1) * self._bucket_ns  # until then a count needs no division

    # The settings are read-only (change them with ControlPlane.retune, which validates them).
    @property
    def k(self) -> float:
        """The accept multiplier (>= 1): requests are shed once they exceed ``k`` x accepts."""
        return self._k

    @property
    def min_throughput(self) -> int:
        """Requests in the window below which nothing is shed (an int >= 0)."""
        return self._min_throughput

    @property
    def max_probability(self) -> float:
        """The highest rejection probability, in (0, 1]."""
        return self._max_probability

    @property
    def label(self) -> str:
        """The label carried by every event of this throttle."""
        return self._label

    def _retune(self, **changes: Any) -> None:
        """Swap ``k``, ``min_throughput``, ``window``, ``max_probability`` and ``classify`` live
        (stoic.ControlPlane.retune), validated by the constructor (``ValueError`` naming the
        parameter; the throttle unchanged). The window's counts start afresh (they were judged
        under the old configuration); calls running are counted in the new window."""
        fresh = validated(self, {
            "k": self._k, "min_throughput": self._min_throughput, "window": to_seconds(self._bucket_ns * BUCKETS),
            "max_probability": self._max_probability, "classify": self._classify}, changes)
        self._k, self._min_throughput, self._max_probability = fresh._k, fresh._min_throughput, fresh._max_probability
        self._classify, self._bucket_ns = fresh._classify, fresh._bucket_ns
        self._requests, self._accepts = [0] * BUCKETS, [0] * BUCKETS
        self._total_requests = self._total_accepts = 0
        self._start_epoch(self._clock.now_ns())

    def _roll(self) -> int:
        """The current bucket's index, after clearing the buckets that fell out of the window."""
        now = self._now_ns()
        return self._index if now < self._end_ns else self._roll_to(now)

    def _roll_to(self, now: int) -> int:
        """:meth:`_roll` past the end of the current bucket (``now >= _end_ns``, so at least one
        bucket later: _start_epoch keeps ``_end_ns`` the end of bucket ``_epoch``)."""
        gap = now // self._bucket_ns - self._epoch
        requests, accepts = self._requests, self._accepts
        for step in range(1, min(gap, BUCKETS) + 1):
            i = (self._epoch + step) % BUCKETS
            self._total_requests -= requests[i]
            self._total_accepts -= accepts[i]
            requests[i] = accepts[i] = 0
        self._start_epoch(now)
        return self._index

    def _probability(self) -> float:
        i = self._index
        j = (i - 1) % BUCKETS
        return self._shed_probability(self._total_requests, self._total_accepts,
                                      self._requests[i] + self._requests[j], self._accepts[i] + self._accepts[j])

    def _shed_probability(self, requests: int, accepts: int, recent: int, recent_accepts: int) -> float:
        """The rule, from the window's totals and the two latest buckets' counts."""
        if requests < self._min_throughput:
            return 0.0
        k = self._k
        p = (requests - k * accepts) / (requests + 1)
        if p <= 0.0:
            return 0.0
        # Never shed more than the two latest buckets justify: after a recovery their accepts
        # pull the probability down within a bucket or two instead of waiting for the outage's
        # buckets to leave the window (see the module docstring).
        if recent >= self._min_throughput and recent > 0:
            q = (recent - k * recent_accepts) / (recent + 1)
            if q < p:
                p = q if q > 0.0 else 0.0
        return min(p, self._max_probability)

    def _view(self) -> tuple[int, int, int, int]:
        """(requests, accepts, recent requests, recent accepts) of the window as of now, read
        without writing anything: the gauges and properties may be read from another thread
        (a metrics exporter's) while the loop counts calls without a lock, so a read must never
        roll the buckets itself (two rolls at once would subtract a bucket twice)."""
        epoch = self._now_ns() // self._bucket_ns
        last, requests, accepts = self._epoch, self._requests, self._accepts
        total, accepted = self._total_requests, self._total_accepts
        gap = epoch - last
        for step in range(1, min(gap, BUCKETS) + 1):
            i = (last + step) % BUCKETS
            total -= requests[i]
            accepted -= accepts[i]
        i, j = epoch % BUCKETS, (epoch - 1) % BUCKETS
        # A bucket the view rolled past holds nothing yet (the loop will clear it).
        recent = (requests[i] if gap <= 0 else 0) + (requests[j] if gap <= 1 else 0)
        recent_accepts = (accepts[i] if gap <= 0 else 0) + (accepts[j] if gap <= 1 else 0)
        return max(total, 0), max(accepted, 0), recent, recent_accepts

    @property
    def probability(self) -> float:
        """The probability the next call is shed (0 while the window is below ``min_throughput``).
        A read only (safe from any thread)."""
        return self._shed_probability(*self._view())

    @property
    def requests(self) -> int:
        """Requests in the window (shed ones included). A read only."""
        return self._view()[0]

    @property
    def accepts(self) -> int:
        """Accepted requests in the window. A read only."""
        return self._view()[1]

    def _overloaded(self, error: Exception) -> bool:
        """Whether ``error`` counts against the dependency: the classifier retries it. An exception
        group (without a ``retry_decision`` of its own) is judged as the breaker judges one, the
        mirror the seed asks for: it counts if any leaf the classifier would retry does (inner
        refusals aside), where retry itself needs every leaf."""
        if isinstance(error, BaseExceptionGroup) and _own_decision(error) is None:
            return any(self._classify(leaf).retries for leaf in leaves(error) if not is_rejection(leaf))
        return self._classify(error).retries

    def _count(self, accepted: bool) -> None:
        i = self._roll()
        self._requests[i] += 1
        self._total_requests += 1
        if accepted:
            self._accepts[i] += 1
            self._total_accepts += 1

    async def execute(self, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``await fn(*args, **kwargs)`` unless shed; see the class docstring."""
        now = self._now_ns()  # (_roll, inlined: the success path)
        i = self._index if now < self._end_ns else self._roll_to(now)
        total = self._total_requests
        # The window's formula is the upper bound (the latest buckets only lower it), so while
        # requests <= k * accepts nothing is shed and the rest need not be computed.
        p = 0.0 if total < self._min_throughput or total <= self._k * self._total_accepts else self._probability()
        if p > 0.0 and _random.stream(self._site).random() < p:
            self._requests[i] += 1
            self._total_requests += 1
            if _metrics.state.enabled:
                self._rec.count_locked(("stoic.throttle.rejections",))
            if _SINKS.wants(Level.INFO):
                emit("throttle.rejected", self._label, Level.INFO, self._clock.now_ns(),
                     {"probability": p, "requests": self._total_requests, "accepts": self._total_accepts})
            raise Throttled(label=self._label)
        try:
            result = await fn(*args, **kwargs)
        except asyncio.CancelledError:
            if deadline_cut_running_work():
                # An enclosing deadline cut the running call: a timeout (not one that cut a wait
                # in an inner stage's queue: local queueing, field report 20).
                self._count(False)
            raise
        except Exception as exc:
            # A deadline's cut, bare or as a leaf of a group with no defect leaf (whose leaves,
            # all Rejected, would otherwise read as inner refusals): the breaker's rule too.
            if caller_cancelled(exc):
                # The operation made its caller's cancellation an error of its own (some clients
                # do): callers leaving are no evidence of overload, as a bare cancellation is
                # none (the breaker's rule, stoic._deadline.caller_cancelled; field report 4).
                pass
            elif cut_by_deadline(exc) and not is_defect(exc):
                self._count(False)  # the work ran and took too long: the dependency failed it
            elif ((not is_rejection(exc) or getattr(exc, "_by_dependency", False)) and not is_defect(exc)
                  and not misused(exc, fn)):
                # (A group is judged by its leaves. A misused operation, fn called with arguments
                # it does not take or a plain function's value awaited, is a bug: the dependency
                # was not even asked. A server's own refusal, an HTTP 429, did reach it.)
                try:
                    overloaded = self._overloaded(exc)
                except Exception as failure:  # a user's classifier or retry_decision: keep the error
                    callback_failed(self._classify._fn, f"classify of throttle {self._label!r}", failure, exc)
                    overloaded = True  # the conservative decision: the call failed
                self._count(not overloaded)
            raise
        now = self._now_ns()  # (_count(True), inlined: the success path)
        i = self._index if now < self._end_ns else self._roll_to(now)
        self._requests[i] += 1
        self._accepts[i] += 1
        self._total_requests += 1
        self._total_accepts += 1
        return result

    @through_method_decorators
    def __call__(self, fn: Callable[P, Awaitable[T]]) -> Callable[P, Coroutine[Any, Any, T]]:
        """Decorate an async function so every call goes through the throttle."""
        if not is_async_callable(fn):
            raise TypeError(f"AdaptiveThrottle decorates async functions, got {fn!r}")

        @functools.wraps(fn)
        async def throttled(*args: P.args, **kwargs: P.kwargs) -> T:
            return await self.execute(fn, *args, **kwargs)

        return throttled

    def __repr__(self) -> str:
        return (f"AdaptiveThrottle(k={self._k}, min_throughput={self._min_throughput}, "
                f"window={self._bucket_ns * BUCKETS / 1e9}, label={self._label!r})")


__all__ = ["AdaptiveThrottle"]
