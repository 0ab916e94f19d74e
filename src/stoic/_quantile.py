"""Streaming quantile estimates in constant space: the P-squared algorithm, and a windowed form.

An adaptive hedge waits for an observed quantile of its primaries' latencies (seed 003, "Hedge":
the delay follows the observed ~p95, as "The Tail at Scale" recommends). Storing every latency
would grow without bound, so the estimate is Jain and Chlamtac's P-squared algorithm (CACM 1985):
five markers whose heights track the minimum, the p/2, p and (1+p)/2 quantiles and the maximum,
nudged towards their desired positions with a piecewise-parabolic fit. Five floats and five
positions, no samples kept.

:class:`WindowedQuantile` restarts the estimate every ``window`` observations so that it follows
the current traffic rather than all traffic since start-up, and keeps answering with the previous
epoch's estimate until the new epoch has enough samples to be trusted.
"""

from __future__ import annotations

import math
from array import array

from ._durations import _finite


def _check_quantile(p: float, name: str = "quantile") -> float:
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not (0.0 < p < 1.0):
        raise ValueError(f"{name} must be a number in (0, 1) (exclusive), got {p!r}")
    return float(p)


class P2Quantile:
    """A streaming estimate of the ``p``-quantile of the values passed to :meth:`add`.

    ``p`` must be in (0, 1) exclusive (``ValueError`` otherwise). Until ``exact`` values (at
    least five, the default) have been seen :attr:`value` is the exact nearest-rank quantile of
    those seen (``None`` before the first); from then on it is the P-squared estimate, its five
    markers started at their ranks among those first values. P-squared started from five values
    puts its middle marker at their median and moves it one rank per value, so for a quantile far
    from the median its estimate lags well under the quantile for the first few dozen values (a
    p95 estimate of 20 lognormal values sat near p75): an owner that trusts the estimate after
    ``n`` values passes ``exact=n`` (:class:`WindowedQuantile` does, with its warm-up). Not
    thread-safe: the owner serialises :meth:`add`.
    """

    __slots__ = ("_dn", "_exact", "_first", "_n", "_q", "count", "p")

    def __init__(self, p: float, exact: int = 5) -> None:
        self.p = _check_quantile(p, "p")
        self._exact = max(5, exact)
        self.count = 0
        # Marker heights and their actual positions (1-based ranks among the values seen).
        self._q: list[float] = []
        self._n = [1, 2, 3, 4, 5]
        # Desired-position increments per observation; the desired positions themselves are
        # computed from the count each time (1 + (count - 1) * dn), never accumulated, so no
        # floating-point drift builds up over a long epoch.
        self._dn = (0.0, p / 2.0, p, (1.0 + p) / 2.0, 1.0)
        # The first values, exactly (8 bytes each: an estimator per route stays small).
        self._first = array("d")

    def add(self, x: float) -> None:
        """Take one observation into the estimate (constant time)."""
        self.count += 1
        if self.count <= self._exact:
            self._first.append(x)
            if self.count == self._exact:
                self._start_markers()
            return
        if self._first:
            self._first = array("d")  # (kept for value until now)
        q = self._q
        n = self._n
        # Which cell the value falls in; the extreme markers move to keep min and max exact.
        if x < q[0]:
            q[0] = x
            k = 0
        elif x >= q[4]:
            if x > q[4]:
                q[4] = x
            k = 3
        elif x < q[1]:
            k = 0
        elif x < q[2]:
            k = 1
        elif x < q[3]:
            k = 2
        else:
            k = 3
        for i in range(k + 1, 5):
            n[i] += 1
        span = self.count - 1
        dn = self._dn
        for i in (1, 2, 3):
            d = 1.0 + span * dn[i] - n[i]
            if (d >= 1.0 and n[i + 1] - n[i] > 1) or (d <= -1.0 and n[i - 1] - n[i] < -1):
                step = 1 if d > 0 else -1
                candidate = self._parabolic(i, step)
                if not q[i - 1] < candidate < q[i + 1]:
                    candidate = q[i] + step * (q[i + step] - q[i]) / (n[i + step] - n[i])
                q[i] = candidate
                n[i] += step

    def _start_markers(self) -> None:
        """Place the five markers at the ranks nearest their desired positions among the first
        values (kept exactly until now, and for :attr:`value` until the next one)."""
        ordered = sorted(self._first)
        size = len(ordered)
        ranks = [1]
        for i in (1, 2, 3):
            desired = round(1 + (size - 1) * self._dn[i])
            # Strictly increasing, with room left for the markers above (and the maximum's at size).
            ranks.append(min(max(desired, ranks[-1] + 1), size - 4 + i))
        ranks.append(size)
        self._n = ranks
        self._q = [ordered[rank - 1] for rank in ranks]

    def _parabolic(self, i: int, d: int) -> float:
        q = self._q
        n = self._n
        return q[i] + d / (n[i + 1] - n[i - 1]) * (
            (n[i] - n[i - 1] + d) * (q[i + 1] - q[i]) / (n[i + 1] - n[i])
            + (n[i + 1] - n[i] - d) * (q[i] - q[i - 1]) / (n[i] - n[i - 1])
        )

    @property
    def value(self) -> float | None:
        """The current estimate, or ``None`` before any observation."""
        if self.count > self._exact:
            return self._q[2]
        if not self._first:
            return None
        ordered = sorted(self._first)
        # Exact for a handful of samples: the nearest-rank quantile.
        rank = max(1, math.ceil(self.p * len(ordered)))
        return ordered[rank - 1]

    def __repr__(self) -> str:
        return f"P2Quantile(p={self.p}, count={self.count}, value={self.value!r})"


def default_warmup(p: float, window: int) -> int:
    """Samples an epoch needs before its estimate is trusted: enough to expect five values on the
    thin side of the quantile (at least 20), and never more than the window."""
    side = min(p, 1.0 - p)
    return min(window, max(20, math.ceil(5.0 / side - 1e-9)))


class WindowedQuantile:
    """A :class:`P2Quantile` that forgets: every ``window`` observations a new epoch starts.

    :attr:`value` is the current epoch's estimate once it holds ``warmup`` observations (default
    :func:`default_warmup`), else the previous epoch's final estimate, else ``None`` (not warmed
    up yet). So the estimate follows a shift in traffic within about one window, and a reset
    never leaves a gap. ``ValueError`` for ``p`` outside (0, 1), ``window`` < 5, or ``warmup``
    outside [5, window].

    ``cap`` (a finite number > 0 in the samples' unit, or None; ``ValueError`` otherwise): a
    value above it is taken as ``cap``, for an owner that only asks
    whether the quantile is above some bound below ``cap``. The answer is the same for the true
    quantile, and the estimate no longer depends on how far above the rest an outlier is: the
    P-squared markers move by interpolating towards their neighbours, the largest value seen
    among them, so one value a thousand times the others could lift even the median estimate
    far above every other value of the epoch.
    """

    __slots__ = ("_current", "_previous", "cap", "p", "warmup", "window")

    def __init__(self, p: float, window: int = 1000, warmup: int | None = None, cap: float | None = None) -> None:
        self.p = _check_quantile(p, "p")
        if isinstance(window, bool) or not isinstance(window, int) or window < 5:
            raise ValueError(f"window must be an integer >= 5, got {window!r}")
        self.window = window
        if warmup is None:
            warmup = default_warmup(self.p, window)
        elif isinstance(warmup, bool) or not isinstance(warmup, int) or not 5 <= warmup <= window:
            raise ValueError(f"warmup must be an integer in [5, window={window}], got {warmup!r}")
        self.warmup = warmup
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float))
                                or not _finite(cap) or cap <= 0):
            raise ValueError(f"cap must be None or a finite number > 0 (in the samples' unit), got {cap!r}")
        self.cap = None if cap is None else float(cap)
        self._current = P2Quantile(self.p, warmup)
        self._previous: float | None = None

    def add(self, x: float) -> None:
        """Take one observation; starts a new epoch when the current one is full."""
        current = self._current
        if current.count >= self.window:
            self._previous = current.value
            current = self._current = P2Quantile(self.p, self.warmup)
        cap = self.cap
        current.add(x if cap is None or x <= cap else cap)

    @property
    def value(self) -> float | None:
        """The trusted estimate (see the class docstring), or ``None`` before warm-up."""
        current = self._current
        if current.count >= self.warmup:
            return current.value
        return self._previous

    @property
    def epoch_count(self) -> int:
        """Observations in the current epoch."""
        return self._current.count

    def __repr__(self) -> str:
        return f"WindowedQuantile(p={self.p}, window={self.window}, value={self.value!r})"
