"""Per-call figures aggregated in the process, read when metrics are collected.

Metrics are state, events are decisions (docs/observability.md): a policy counts what every call
does (calls by outcome, durations, permits waited for, attempts) into its :class:`Recorder`,
exactly and cheaply, and an exporter reads the recorders at collection time. Nothing is built
per call beyond a few integer additions, and nothing at all while no exporter has called
:func:`enable`.

A recorder belongs to one policy and lives as long as it: :data:`live` holds recorders weakly,
so the series of a policy that has been garbage-collected disappear at the next collection.
"""

from __future__ import annotations

import threading
import weakref
from bisect import bisect_left
from collections.abc import Iterator
from typing import Final

DURATION_BUCKETS: Final[tuple[float, ...]] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""Upper bounds (inclusive, seconds) of every duration histogram; one more bucket holds the rest.
Second-scale on purpose: the OpenTelemetry SDK's defaults are made for milliseconds."""

_BOUNDS_NS: Final[tuple[int, ...]] = tuple(round(b * 1e9) for b in DURATION_BUCKETS)


class Histogram:
    """Cumulative counts per bucket of :data:`DURATION_BUCKETS` (``counts[i]`` for the i-th
    bound, ``counts[-1]`` above the last), the sum in nanoseconds and the count."""

    __slots__ = ("count", "counts", "sum_ns")

    def __init__(self) -> None:
        self.counts = [0] * (len(_BOUNDS_NS) + 1)
        self.sum_ns = 0
        self.count = 0

    def observe(self, duration_ns: int) -> None:
        # bisect_left: a duration equal to a bound belongs to that bound's bucket (le semantics).
        self.counts[bisect_left(_BOUNDS_NS, duration_ns)] += 1
        self.sum_ns += duration_ns
        self.count += 1


class Recorder:
    """One policy's cumulative figures: ``counters[(name, *attribute values)]`` and
    ``histograms[(name, *attribute values)]``. ``kind`` is the policy kind (``breaker``,
    ``ratelimiter``, ...), ``label`` its label.

    Not locked: a policy updates its recorder where it already serialises its own state (under
    its lock, or on its event loop), which keeps the figures exact without a second lock.
    """

    __slots__ = ("__weakref__", "counters", "histograms", "kind", "label")

    def __init__(self, kind: str, label: str) -> None:
        self.kind = kind
        self.label = label
        self.counters: dict[tuple[str, ...], int] = {}
        self.histograms: dict[tuple[str, ...], Histogram] = {}

    def count(self, key: tuple[str, ...], n: int = 1) -> None:
        counters = self.counters
        counters[key] = counters.get(key, 0) + n

    def observe(self, key: tuple[str, ...], duration_ns: int) -> None:
        histogram = self.histograms.get(key)
        if histogram is None:
            histogram = self.histograms[key] = Histogram()
        histogram.observe(duration_ns)


class _State:
    __slots__ = ("enabled", "lock")

    def __init__(self) -> None:
        self.enabled = False
        self.lock = threading.Lock()


state: Final = _State()
"""``state.enabled`` is True once an exporter asked for metrics; policies read it (one attribute)
before touching their recorder."""

live: Final[weakref.WeakSet[Recorder]] = weakref.WeakSet()
"""Every recorder whose policy is alive."""


def enable() -> None:
    """Start aggregating (idempotent). Called by exporters when they attach; figures count from here."""
    state.enabled = True


def recorder(kind: str, label: str) -> Recorder:
    """A new recorder for one policy, registered in :data:`live` for as long as it is referenced."""
    made = Recorder(kind, label)
    with state.lock:
        live.add(made)
    return made


def recorders() -> Iterator[Recorder]:
    """A snapshot of the live recorders (safe while policies are created and collected)."""
    with state.lock:
        current = list(live)
    return iter(current)
