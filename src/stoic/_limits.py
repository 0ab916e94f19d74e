"""Concurrency-limit algorithms as pure arithmetic on samples (seed 003, "Adaptive (AIMD)" and
"Gradient").

The split follows Netflix's concurrency-limits library: an *algorithm* turns samples into a
limit, a *limiter* (the adaptive bulkheads in :mod:`stoic.adaptive`) gates admission with it,
and a *sample window* (Netflix's ``WindowedLimit``, kept inside :class:`Gradient2Limit`) batches
samples so the Gradient2 update runs per window rather than per call. Nothing here touches an event loop or a
clock: instants and latencies come in as integer nanoseconds, so every rule is testable with
plain numbers.

A sample is one completed call: its latency, the in-flight count when it was admitted, and
whether it was a *drop* (it timed out). Fast failures and cancellations are not samples; the
limiter never passes them in. The limiter times only some calls at high rates
(:mod:`stoic.adaptive`, "which calls are timed"): a timed sample carries a ``weight``, the
inverse of the probability that it was timed (the completions it stands for in expectation),
and a drop of an untimed call comes with a latency of -1 (unknown).
"""

from __future__ import annotations

import math
import sys
from typing import TYPE_CHECKING, NamedTuple

from ._quantile import WindowedQuantile, default_warmup

if TYPE_CHECKING:
    from .fleet import SharedLatency, SharedQuantile

QUANTILE_WINDOW = 200
"""Observations per epoch of AIMD's ``latency_quantile`` estimate, not completions: past the
warm-up one completion in :data:`QUANTILE_STRIDE` is observed (a new epoch also starts on every
backoff, so a quantile measured before the backoff never decides the next one)."""

QUANTILE_CAP = 2
"""AIMD's quantile estimate takes a latency above this many times the threshold as that many
times it: whether the quantile is above the threshold is unchanged, and an outlier's size cannot
pull the P-squared markers past it (fed raw, one 10 s call among 10 ms ones lifted a p95
estimate past a 100 ms threshold; see :class:`stoic._quantile.WindowedQuantile`)."""

QUANTILE_STRIDE = 8
"""Once AIMD's quantile estimate is trusted, one sample in this many updates it (a P-squared
update is the dearest step of a call); the warm-up of a fresh epoch takes every sample, so a
backoff is still followed by a full warm-up's worth of fresh evidence."""

_NEVER = sys.maxsize  # an in-flight count no call reaches
_CLOSED = -sys.maxsize  # an instant before any clock's: the end of no window

WINDOW_MIN_SAMPLES = 10
WINDOW_NS = 1_000_000_000
"""Gradient2 updates once a window holds at least 10 samples and has lasted about a second
(the defaults of Netflix's ``WindowedLimit``)."""

DROP_RATIO = 0.9
"""Gradient2's multiplicative decrease for a window that saw a drop (a timeout)."""

_LONG_WARMUP = 10  # windows averaged plainly before the long RTT becomes an exponential average
_LONG_DECAY = 0.95
_LONG_DECAY_ABOVE = 2.0


class Change(NamedTuple):
    """A change of the integer limit: ``old`` and ``new`` slots and the rule that moved it
    (``backoff``, ``increase`` or ``gradient``)."""

    old: int
    new: int
    cause: str


def _clamp(value: float, low: float, high: float) -> float:
    return low if value < low else high if value > high else value


class AimdLimit:
    """Additive increase, multiplicative decrease on latency (seed 003, "Adaptive (AIMD)").

    Starts at ``maximum``. A *breach* (a drop, or a latency above ``threshold_ns``; with
    ``quantile`` set, the windowed P-squared estimate of that latency quantile above the
    threshold; while a fresh epoch warms up only drops breach, and only in-budget samples
    grow the limit) multiplies the limit by ``backoff_ratio``, at most once per ``cooldown_ns``, and
    starts a fresh quantile epoch. An in-budget sample adds ``increase_step / limit`` (about one
    slot per ``limit`` in-budget completions), but only when the sample's in-flight count was at
    least half the limit: a limit that is not being used gives no evidence it could be higher.
    The limit stays in [``minimum``, ``maximum``]. Arguments are validated by the caller.

    The quantile estimate takes every sample until it can be trusted (the warm-up of a fresh
    epoch), then one sample in :data:`QUANTILE_STRIDE`; the samples in between are judged
    against the estimate as it stands. It takes a latency above :data:`QUANTILE_CAP` times the
    threshold as that (a single outlier, however slow, cannot lift the estimate past it).

    For the limiter's success path, :attr:`fast_ns` and :attr:`grow_from` describe where a
    sample that is not a drop changes nothing (a latency at most ``fast_ns`` and an in-flight
    count below ``grow_from``), so the limiter may skip :meth:`sample` there. ``grow_from`` may
    lag below the exact bound while the limit grows (the limiter then calls :meth:`sample`,
    which decides), never above it.
    """

    __slots__ = ("_digest", "_estimate", "_feed_in", "_int", "_last_backoff_ns", "_quantile_ns", "backoff_ratio",
                 "cooldown_ns", "fast_ns", "grow_from", "increase_step", "maximum", "minimum", "quantile",
                 "threshold_ns", "value")

    def __init__(self, *, threshold_ns: int, maximum: int, minimum: int = 1, backoff_ratio: float = 0.9,
                 increase_step: float = 1.0, cooldown_ns: int = 1_000_000_000,
                 quantile: float | None = None, digest: SharedLatency | None = None) -> None:
        self.threshold_ns = threshold_ns
        self.maximum = maximum
        self.minimum = minimum
        self.backoff_ratio = backoff_ratio
        self.increase_step = increase_step
        self.cooldown_ns = cooldown_ns
        self.quantile = quantile
        self._digest = digest  # the fleet's sketch: each epoch's estimator reads its quantile
        self.value = float(maximum)
        self._int = maximum  # int(value): the value never drops below the (integer) floor
        self._last_backoff_ns: int | None = None
        # With a quantile every sample may have to update the estimate: none skips sample().
        self.fast_ns = threshold_ns if quantile is None else -1
        self.grow_from = _NEVER  # at the ceiling: no sample grows the limit
        self._quantile_ns: float | None = None  # the estimate after its last update
        self._feed_in = 0  # samples to judge before the next update of the estimate
        self._estimate = self._fresh_epoch()

    def _fresh_epoch(self) -> WindowedQuantile | SharedQuantile | None:
        self._quantile_ns = None
        self._feed_in = 0
        if self.quantile is None:
            return None
        warmup = default_warmup(self.quantile, QUANTILE_WINDOW)
        cap = float(QUANTILE_CAP * self.threshold_ns)
        if self._digest is not None:
            return self._digest.estimator(self.quantile, QUANTILE_WINDOW, warmup, cap)
        return WindowedQuantile(self.quantile, QUANTILE_WINDOW, warmup, cap)

    @property
    def limit(self) -> int:
        """The admission limit: the integer part of the value (never below the floor)."""
        return self._int

    def _set(self, value: float, cause: str) -> Change | None:
        self.value = value
        # A sample grows the limit when 2 * in_flight >= value, i.e. in_flight >= ceil(value / 2).
        self.grow_from = _NEVER if value >= self.maximum else math.ceil(value / 2.0)
        old = self._int
        new = self._int = int(value)
        return Change(old, new, cause) if new != old else None

    def _grown(self, value: float, weight: int) -> float:
        """``value`` after ``weight`` in-budget completions, each adding ``increase_step / value``.

        One completion is the rule itself. For more, a closed form instead of a loop: each step
        adds ``2 * step + (step / v) ** 2`` to ``v ** 2``, and ``v`` never falls during the run,
        so counting the last term at the starting ``v`` is exact for one step and at most
        ``weight * (step / v) ** 2`` high in ``v ** 2`` for the run (a share of at most ``step /
        (2 * v ** 2)`` of the growth: 1 % for the default step once the limit is 7 or more)."""
        step = self.increase_step
        if weight == 1:
            return value + step / value
        return math.sqrt(value * value + weight * (2.0 * step + step * step / (value * value)))

    def sample(self, now_ns: int, latency_ns: int, in_flight: int, dropped: bool = False,
               weight: int = 1) -> Change | None:
        """Take one completed call; return the change of :attr:`limit` it caused, if any.

        ``weight`` (int >= 1): the completions this sample stands for when the limiter times one
        call in several; an in-budget sample grows the limit as that many would. A breach backs
        off once whatever the weight (the cooldown coalesces a slow burst anyway). A drop of an
        untimed call passes ``latency_ns`` -1: it breaches, and leaves the quantile estimate
        alone."""
        estimate = self._estimate
        if estimate is None:
            if dropped or latency_ns > self.threshold_ns:
                return self._decide(now_ns, in_flight, True)
            # The common case, kept cheap: an in-budget sample without a quantile.
            value = self.value
            if in_flight * 2 < value or value >= self.maximum:
                return None  # not using half the slots (no evidence for more), or at the ceiling
            value = value + self.increase_step / value if weight == 1 else self._grown(value, weight)
            if value > self.maximum:
                value = float(self.maximum)
            if value < self._int + 1:
                self.value = value  # (grow_from may now lag below the exact bound: allowed)
                return None
            return self._set(value, "increase")
        if dropped and latency_ns < 0:
            return self._decide(now_ns, in_flight, True)  # an untimed drop: no latency to estimate
        quantile = self._quantile_ns
        if quantile is not None and self._feed_in > 0:
            self._feed_in -= 1  # judged against the estimate as it stands
            if quantile <= self.threshold_ns and in_flight < self.grow_from and not dropped:
                return None  # no breach, and no evidence for more (the common case, kept cheap)
        else:
            estimate.add(float(latency_ns))
            quantile = self._quantile_ns = estimate.value
            self._feed_in = QUANTILE_STRIDE - 1
        if quantile is None:
            # Warming up a fresh epoch: no quantile to breach yet, and only a sample that is
            # itself in budget may grow the limit.
            if not dropped and latency_ns > self.threshold_ns:
                return None
            return self._decide(now_ns, in_flight, dropped, weight)
        return self._decide(now_ns, in_flight, dropped or quantile > self.threshold_ns, weight)

    def _decide(self, now_ns: int, in_flight: int, breach: bool, weight: int = 1) -> Change | None:
        if breach:
            last = self._last_backoff_ns
            if last is not None and now_ns - last < self.cooldown_ns:
                return None  # one backoff per cooldown: a slow burst counts once
            self._last_backoff_ns = now_ns
            self._estimate = self._fresh_epoch()
            return self._set(max(float(self.minimum), self.value * self.backoff_ratio), "backoff")
        if in_flight * 2 < self.value:
            return None  # not using half the slots: no evidence for more
        return self._set(min(float(self.maximum), self._grown(self.value, weight)), "increase")


class Gradient2Limit:
    """Netflix's Gradient2 with two faults fixed (seed 003, "Gradient").

    Per window of at least ``window_min_samples`` samples lasting at least ``window_ns`` (from
    the window's first sample):

    - a window that saw a drop multiplies the limit by 0.9 (Netflix's ``Gradient2Limit``
      ignores drops, so a stream of timeouts, which never records a slow success, let the
      limit climb to the maximum);
    - otherwise ``short`` is the window's mean latency, ``long`` an exponential average of the
      windows' ``short`` over ``long_window`` windows (a plain mean for the first 10), decayed
      by 0.95 when ``long / short > 2`` (latency fell back after long overload: the baseline
      catches up faster); when the window's highest in-flight count was below half the limit,
      nothing changes (no evidence); else ``gradient = clamp(rtt_tolerance * long / short,
      0.5, 1)`` and ``new = L*(1-s) + s*(L*gradient + headroom)``, the ``headroom`` added only
      when the gradient is 1 (Netflix always adds it, so a gradient held near 0.8 by modest
      overload converged on ``headroom / (1 - gradient)``, creeping up regardless of capacity).

    A sample only accumulates into the open window (a count, a sum, a maximum: no allocation);
    the update runs when the window closes, so no sample skips :meth:`sample` (:attr:`fast_ns`
    is -1, :attr:`grow_from` 0; see :class:`AimdLimit`). The limit starts at ``maximum`` and stays in
    [``minimum``, ``maximum``]. Arguments are validated by the caller.
    """

    __slots__ = ("_count", "_drops", "_in_flight", "_long_count", "_total_ns", "_window_end_ns", "fast_ns",
                 "grow_from", "headroom", "long_ns", "long_window", "maximum", "minimum", "rtt_tolerance", "smoothing",
                 "value", "window_min_samples", "window_ns")

    def __init__(self, *, maximum: int, minimum: int = 1, rtt_tolerance: float = 1.5, smoothing: float = 0.2,
                 long_window: int = 600, headroom: float = 4.0, window_min_samples: int = WINDOW_MIN_SAMPLES,
                 window_ns: int = WINDOW_NS) -> None:
        self.maximum = maximum
        self.minimum = minimum
        self.rtt_tolerance = rtt_tolerance
        self.smoothing = smoothing
        self.long_window = long_window
        self.headroom = headroom
        self.window_min_samples = window_min_samples
        self.window_ns = window_ns
        self.value = float(maximum)
        self.long_ns: float | None = None
        self._long_count = 0
        # The open window: every sample counted (drops included: a stream of timeouts must fill
        # windows too), successful latencies summed, drops counted, the highest in-flight kept.
        self._count = 0
        self._total_ns = 0
        self._drops = 0
        self._in_flight = 0
        self._window_end_ns = _CLOSED  # no window open: the next sample opens one
        # (As for AimdLimit: no successful sample may skip sample(), each one fills the window.)
        self.fast_ns = -1
        self.grow_from = 0

    @property
    def limit(self) -> int:
        """The admission limit: the integer part of the value, never below the floor."""
        return max(self.minimum, int(self.value))

    def sample(self, now_ns: int, latency_ns: int, in_flight: int, dropped: bool = False,
               weight: int = 1) -> Change | None:
        """Take one completed call; when it closes a window, update and return the change.

        ``weight`` (int >= 1): the completions this sample stands for when the limiter times one
        call in several. They count towards the window's ten, and the window's mean latency is
        weighted by them (an estimate of the mean over every completion); the highest in-flight
        count is that of the timed samples."""
        if dropped:
            self._drops += weight
        else:
            self._total_ns += latency_ns * weight
        self._count += weight
        if in_flight > self._in_flight:
            self._in_flight = in_flight
        if now_ns < self._window_end_ns:
            return None  # the common case: the window's second has not passed
        return self._close(now_ns)

    def _close(self, now_ns: int) -> Change | None:
        """Past the open window's end (or with no window open): open one, or close it."""
        count = self._count
        if self._window_end_ns == _CLOSED:  # this sample is the window's first: it opens the window
            self._window_end_ns = now_ns + self.window_ns
            if now_ns < self._window_end_ns:
                return None
        if count < self.window_min_samples:
            return None
        drops, total, most = self._drops, self._total_ns, self._in_flight
        self._count = self._total_ns = self._drops = self._in_flight = 0
        self._window_end_ns = _CLOSED
        return self.update(count - drops, total, most, drops > 0)

    def _add_long(self, short: float) -> float:
        self._long_count += 1
        long = self.long_ns
        if long is None:
            long = short
        elif self._long_count <= _LONG_WARMUP:
            long += (short - long) / self._long_count
        else:
            long += (short - long) * 2.0 / (self.long_window + 1)
        self.long_ns = long
        return long

    def update(self, successes: int, total_ns: int, max_in_flight: int, dropped: bool) -> Change | None:
        """One window's update (see the class docstring); returns the change of :attr:`limit`."""
        old = self.limit
        if dropped:
            self.value = max(float(self.minimum), self.value * DROP_RATIO)
            cause = "backoff"
        else:
            if successes == 0:
                return None
            short = max(1.0, total_ns / successes)
            long = self._add_long(short)
            if long / short > _LONG_DECAY_ABOVE:
                long = self.long_ns = long * _LONG_DECAY
            if max_in_flight * 2 < self.value:
                return None
            gradient = _clamp(self.rtt_tolerance * long / short, 0.5, 1.0)
            target = self.value * gradient + (self.headroom if gradient >= 1.0 else 0.0)
            s = self.smoothing
            self.value = _clamp(self.value * (1.0 - s) + s * target, float(self.minimum), float(self.maximum))
            cause = "increase" if gradient >= 1.0 else "gradient"
        new = self.limit
        return Change(old, new, cause) if new != old else None


__all__ = ["AimdLimit", "Change", "Gradient2Limit"]
