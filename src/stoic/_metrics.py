"""Per-call figures aggregated in the process, read when metrics are collected.

Metrics are state, events are decisions (docs/observability.md): a policy counts what every call
does (calls by outcome, durations, permits waited for, attempts) into its :class:`Recorder`,
exactly and cheaply, and an exporter reads the recorders at collection time. Nothing is built
per call beyond a few integer additions, and nothing at all while no exporter has called
:func:`enable`.

A recorder belongs to one policy and lives as long as it: :data:`live` holds recorders weakly,
so the series of a policy that has been garbage-collected disappear at the next collection. A
recorder made with ``owner=policy`` also lets the gauges of :data:`METRICS` read the live
policy's properties (``breaker.state``, ``limiter.available_permits``...) at collection time,
all those of its kind but the ones it is made without (``skip``).

:data:`METRICS` is the one table of every metric: the OpenTelemetry and Prometheus adapters
export exactly these, docs/metrics.md is generated from it, and a recorder key is
``(metric name, *attribute values after stoic.label)``, e.g. ``("stoic.breaker.rejections", "open")``.
:class:`Collector` reads everything at once, capping the distinct labels per metric.
"""

from __future__ import annotations

import contextvars
import logging
import re
import threading
import warnings
import weakref
from bisect import bisect_left
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final, Literal

DURATION_BUCKETS: Final[tuple[float, ...]] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""Upper bounds (inclusive, seconds) of every duration histogram; one more bucket holds the rest.
Second-scale on purpose: the OpenTelemetry SDK's defaults are made for milliseconds."""

_BOUNDS_NS: Final[tuple[int, ...]] = tuple(round(b * 1e9) for b in DURATION_BUCKETS)

LABEL: Final = "stoic.label"
"""The attribute key of a policy's label, the same in OpenTelemetry, structlog and stdlib logging
(``stoic.label`` cannot collide with an application's own ``label``)."""

OVERFLOW: Final = "_overflow"
"""The label value that series beyond :data:`DEFAULT_MAX_LABELS` distinct labels are folded into."""

DEFAULT_MAX_LABELS: Final = 1_000
"""Distinct label values per metric an exporter reports by default."""

_log = logging.getLogger("stoic")


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

    def merge(self, other: Histogram) -> None:
        """Add ``other``'s figures into this one (used to fold overflowing labels together)."""
        for i, n in enumerate(other.counts):
            self.counts[i] += n
        self.sum_ns += other.sum_ns
        self.count += other.count

    def copy(self) -> Histogram:
        made = Histogram()
        made.merge(self)
        return made

    @property
    def cumulative(self) -> list[int]:
        """Counts at or below each bound of :data:`DURATION_BUCKETS` (Prometheus ``le``), then the total."""
        out, running = [], 0
        for n in self.counts:
            running += n
            out.append(running)
        return out


class Recorder:
    """One policy's cumulative figures: ``counters[(name, *attribute values)]`` and
    ``histograms[(name, *attribute values)]``. ``kind`` is the policy kind (``breaker``,
    ``ratelimiter``, ...), ``label`` its label, ``owner`` a weak reference to the policy (or None),
    ``skip`` the gauge properties of its kind that the owner has not got (left out of those gauges).

    Not locked: a policy updates its recorder where it already serialises its own state (under
    its lock, or on its event loop), which keeps the figures exact without a second lock.
    """

    __slots__ = ("__weakref__", "counters", "histograms", "kind", "label", "owner", "skip")

    def __init__(self, kind: str, label: str, owner: object = None, skip: frozenset[str] = frozenset()) -> None:
        self.kind = kind
        self.label = label
        self.counters: dict[tuple[str, ...], int] = {}
        self.histograms: dict[tuple[str, ...], Histogram] = {}
        self.owner: Callable[[], object] | None = weakref.ref(owner) if owner is not None else None
        self.skip = skip

    def count(self, key: tuple[str, ...], n: int = 1) -> None:
        counters = self.counters
        counters[key] = counters.get(key, 0) + n

    def observe(self, key: tuple[str, ...], duration_ns: int) -> None:
        histogram = self.histograms.get(key)
        if histogram is None:
            histogram = self.histograms[key] = Histogram()
        histogram.observe(duration_ns)

    def histogram(self, key: tuple[str, ...]) -> Histogram:
        """The histogram of ``key``, created empty if needed: a policy may keep it and observe into
        it directly (one attribute read fewer on its hottest path)."""
        made = self.histograms.get(key)
        if made is None:
            made = self.histograms[key] = Histogram()
        return made

    def count_locked(self, key: tuple[str, ...], n: int = 1) -> None:
        """:meth:`count` under the module's lock, for a rare decision taken outside the policy's own lock."""
        with state.lock:
            self.count(key, n)

    def observe_locked(self, key: tuple[str, ...], duration_ns: int) -> None:
        """:meth:`observe` under the module's lock (see :meth:`count_locked`)."""
        with state.lock:
            self.observe(key, duration_ns)


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

_shared: dict[tuple[str, str], Recorder] = {}


def enable() -> None:
    """Start aggregating (idempotent). Called by exporters when they attach; figures count from here."""
    state.enabled = True


def recorder(kind: str, label: str, owner: object = None, skip: frozenset[str] = frozenset()) -> Recorder:
    """A new recorder for one policy, registered in :data:`live` for as long as it is referenced.

    ``owner`` (the policy itself, held weakly) lets the gauges read its properties at collection;
    ``skip`` names those of its kind's gauge properties it has not got: it has no series in those
    gauges (a shared rate limiter has no ``available_permits``: its credit is in the store).
    """
    made = Recorder(kind, label, owner, skip)
    with state.lock:
        live.add(made)
    _figures[weakref.ref(made, _died)] = ((kind, label), (made.counters, made.histograms))
    return made


_Figures = tuple[dict[tuple[str, ...], int], dict[tuple[str, ...], Histogram]]
# Every live recorder's figures (the dicts themselves: they outlive it), by a weak reference
# whose callback hands them, at its death, to every collector: counts made by a policy that
# lived and died between two collections are not lost with it (see Collector).
_figures: dict[weakref.ref[Recorder], tuple[tuple[str, str], _Figures]] = {}
_collectors: weakref.WeakSet[Collector] = weakref.WeakSet()


def _died(ref: weakref.ref[Recorder], figures: dict[weakref.ref[Recorder], Any] = _figures,
          collectors: weakref.WeakSet[Collector] = _collectors) -> None:
    # (Called by the collector of cycles, in any thread, perhaps while this thread holds a
    # lock of stoic's: no lock is taken; a dict pop and a list append are atomic. The tables are
    # bound as defaults: at interpreter exit the module's globals may be gone first.)
    entry = figures.pop(ref, None)
    if entry is not None and (entry[1][0] or entry[1][1]):
        for collector in list(collectors):
            collector._bury(entry)


def count_shared(kind: str, label: str, key: tuple[str, ...]) -> None:
    """Count ``key`` for a policy that has no object of its own (``stoic.retry(...)`` called as a
    function): one recorder per (kind, label), kept for the process. Locked (such policies run
    in any thread); bounded to :data:`DEFAULT_MAX_LABELS` labels per kind, the rest share
    :data:`OVERFLOW`."""
    with state.lock:
        made = _shared.get((kind, label))
        if made is None:
            if sum(1 for k, _ in _shared if k == kind) >= DEFAULT_MAX_LABELS:
                label = OVERFLOW
                made = _shared.get((kind, label))
            if made is None:
                made = _shared[(kind, label)] = Recorder(kind, label)
                live.add(made)
        made.count(key)


def recorders() -> Iterator[Recorder]:
    """A snapshot of the live recorders (safe while policies are created and collected)."""
    with state.lock:
        current = list(live)
    return iter(current)


# ------------------------------------------------------------------ the metric table

Kind = Literal["counter", "histogram", "gauge"]


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One exported metric.

    ``attributes`` lists every attribute key (``stoic.label`` first); ``policy`` is the policy
    kind that records it; ``properties`` the policy properties a gauge reads at collection;
    ``source`` says in words what feeds it.
    """

    name: str
    kind: Kind
    unit: str
    policy: str
    attributes: tuple[str, ...]
    source: str
    description: str
    properties: tuple[str, ...] = ()
    counts_of: str = ""
    """For a counter: the histogram whose counts it reports (summed over the histogram's further
    attributes), so a policy observes one histogram per call instead of counting twice."""

    @property
    def prometheus_name(self) -> str:
        """The Prometheus name (what the OpenTelemetry Prometheus exporter makes of it, and what the
        stoic-prometheus adapter registers): dots become underscores, unit ``s`` adds ``_seconds``,
        counters gain ``_total``; annotations like ``{call}`` and ``1`` add nothing."""
        base = self.name.replace(".", "_")
        unit = re.sub(r"\{[^}]*\}", "", self.unit)
        suffix = {"s": "_seconds", "1": "", "": ""}.get(unit, f"_{unit}")
        total = "_total" if self.kind == "counter" else ""
        return f"{base}{suffix}{total}"

    @property
    def prometheus_labels(self) -> tuple[str, ...]:
        return tuple(a.replace(".", "_") for a in self.attributes)


def _m(name: str, kind: Kind, unit: str, policy: str, attributes: tuple[str, ...], source: str,
       description: str, properties: tuple[str, ...] = (), counts_of: str = "") -> MetricSpec:
    return MetricSpec(name, kind, unit, policy, (LABEL, *attributes), source, description, properties, counts_of)


BREAKER_STATES: Final[tuple[str, ...]] = ("closed", "open", "half_open")

METRICS: Final[tuple[MetricSpec, ...]] = (
    # --- circuit breaker ---
    _m("stoic.breaker.state", "gauge", "1", "breaker", ("state",), "property `.state` of each live breaker",
       "1 for the breaker's current state, 0 for the other two (closed, open, half_open): all three series "
       "exist for every live breaker from its first call or decision (a breaker never used has none yet: its "
       "recorder is made then, to keep per-route breakers small).", ("state",)),
    _m("stoic.breaker.calls", "counter", "{call}", "breaker", ("outcome",), "every call the breaker recorded",
       "Calls recorded by the breaker (as window evidence or as probes), by outcome: success or failure "
       "(the counts of `stoic.breaker.call.duration`).", counts_of="stoic.breaker.call.duration"),
    _m("stoic.breaker.rejections", "counter", "{call}", "breaker", ("state",), "every call the breaker refused",
       "Calls the breaker refused without running them, by the state it was in. A shared breaker (stoic.fleet) "
       "refusing because the store could not decide (fail_open_on_store_error=False) counts that refusal in "
       "`stoic.fleet.fallbacks` only (fail_closed)."),
    _m("stoic.breaker.transitions", "counter", "{transition}", "breaker", ("state",), "every state transition",
       "State transitions, by the new state. A shared breaker (stoic.fleet) counts, on each replica, the "
       "transitions that replica observes, made there or elsewhere in the fleet."),
    _m("stoic.breaker.call.duration", "histogram", "s", "breaker", ("outcome", "error.type"),
       "every call the breaker recorded",
       "Duration of the calls the breaker recorded, in seconds on the breaker's clock, by outcome; `error.type` "
       "is the failure's type name (empty for successes)."),
    # --- rate limiter ---
    _m("stoic.ratelimiter.permits.available", "gauge", "{permit}", "ratelimiter", (),
       "property `.available_permits` of each live local limiter",
       "Permits the limiter could grant right now. A shared limiter (stoic.fleet) has no series here: its "
       "credit is in the store, which a collection does not read, and the figure in its last reply is "
       "outdated at once (docs/fleet.md); its fallback, a local limiter, has its own (label `<label>.fallback`).",
       ("available_permits",)),
    _m("stoic.ratelimiter.waiters", "gauge", "{request}", "ratelimiter", (),
       "property `.waiter_count` of each live limiter",
       "Requests queued waiting for permits (for a shared limiter, in this process's queue).", ("waiter_count",)),
    _m("stoic.ratelimiter.wait.duration", "histogram", "s", "ratelimiter", (), "every queued request served",
       "Seconds a queued request waited before it was served (for a shared limiter, from the call, its "
       "round trips included)."),
    _m("stoic.ratelimiter.rejections", "counter", "{request}", "ratelimiter", ("reason",), "every refusal",
       "Requests refused, by reason: would_exceed_deadline, queue_full, cancelled, deadline_exceeded, "
       "or oversized (more permits than the burst: never servable); a `try_acquire` refused for want of "
       "permits is not counted, one above the burst is. A shared limiter (stoic.fleet) counts its refusals "
       "with the same reasons; one because the store could not decide (fail_open_on_store_error=False) is "
       "counted in `stoic.fleet.fallbacks` only (fail_closed)."),
    # --- bulkhead ---
    _m("stoic.bulkhead.active", "gauge", "{call}", "bulkhead", (), "property `.active_count` of each live bulkhead",
       "Calls running inside the bulkhead.", ("active_count",)),
    _m("stoic.bulkhead.queued", "gauge", "{call}", "bulkhead", (), "property `.queued_count` of each live bulkhead",
       "Calls queued for a slot.", ("queued_count",)),
    _m("stoic.bulkhead.rejections", "counter", "{call}", "bulkhead", ("reason",), "every refusal or shed waiter",
       "Calls refused, shed, or that left the queue without a slot, by reason: bulkhead_full, cancelled, "
       "deadline_exceeded, or (queue management) sojourn or priority: this is the shed-by-reason count."),
    _m("stoic.bulkhead.limit", "gauge", "{call}", "bulkhead", (), "property `.limit` of each live bulkhead",
       "The bulkhead's admission limit now (max_concurrent for a fixed bulkhead; it moves for an adaptive one).",
       ("limit",)),
    # --- adaptive throttle ---
    _m("stoic.throttle.probability", "gauge", "1", "throttle", (), "property `.probability` of each live throttle",
       "The probability the adaptive throttle sheds the next call.", ("probability",)),
    _m("stoic.throttle.rejections", "counter", "{call}", "throttle", (), "every call the throttle shed",
       "Calls the adaptive throttle shed locally (each a `Throttled` refusal)."),
    _m("stoic.hedge.attempts", "counter", "{attempt}", "hedge", (), "every hedged attempt started",
       "Hedged attempts started (the first attempt of a call is not counted)."),
    _m("stoic.hedge.wins", "counter", "{call}", "hedge", ("attempt",), "every call won after a hedge started",
       "Calls won after at least one hedge had started, by the winning attempt's number."),
    _m("stoic.hedge.delay", "gauge", "s", "hedge", (), "property `.current_delay` of each live hedge",
       "The hedge's current delay in seconds (adaptive hedges move it with the observed latency).",
       ("current_delay",)),
    # --- fleet-wide state (stoic.fleet) ---
    _m("stoic.fleet.store.errors", "counter", "{call}", "fleet", ("error.type",), "every failed store call",
       "Store calls that failed (unreachable within the budget, an error reply, a reply of the wrong shape), "
       "by the error's type name; the label is the store's."),
    _m("stoic.fleet.store.recoveries", "counter", "{recovery}", "fleet", (), "every store call after failed ones",
       "Store calls that succeeded after failed ones (the end of an outage); the label is the store's."),
    _m("stoic.fleet.fallbacks", "counter", "{decision}", "fleet", ("decision",), "every decision without the store",
       "Decisions a shared policy took without the store, by decision: fail_open (the local policy decided) "
       "or fail_closed (refused)."),
    # --- retry ---
    _m("stoic.retry.retries", "counter", "{attempt}", "retry", ("error.type",), "every failed attempt retried",
       "Failed attempts that were retried, by the error's type name."),
    _m("stoic.retry.outcomes", "counter", "{call}", "retry", ("outcome",), "every retried call's end",
       "How calls run under retry ended, when the end was a decision, by outcome: succeeded (after at "
       "least one retry), exhausted, budget_exhausted, deadline_skip, permanent, defect or nested. A call "
       "that succeeds on its first attempt is not counted."),
)
"""Every metric, in documentation order."""

METRICS_BY_NAME: Final = {spec.name: spec for spec in METRICS}
_COUNTED: Final = tuple(spec for spec in METRICS if spec.counts_of)


# ------------------------------------------------------------------ collection

Sample = tuple[tuple[str, ...], Any]
"""(attribute values in the spec's order, label first; a number or a :class:`Histogram`)."""


def encodable(text: str) -> str:
    """``text`` as every exposition can encode it: a lone surrogate (a valid Python ``str`` from
    JSON's ``"\\udce9"``, ``os.fsdecode`` or ``surrogateescape``, which neither UTF-8 nor OTLP can
    carry) becomes U+FFFD; a valid pair becomes its character. Anything else is returned as is."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _add(into: Recorder, figures: _Figures) -> None:
    """Add one recorder's ``(counters, histograms)`` into ``into``."""
    counters, histograms = figures
    for name, n in list(counters.items()):
        into.count(name, n)
    for name, histogram in list(histograms.items()):
        into.histogram(name).merge(histogram)


class Collector:
    """Reads every live recorder and policy at once: ``collect()`` -> ``[(spec, samples)]``.

    At most ``max_labels`` distinct labels per metric (default :data:`DEFAULT_MAX_LABELS`); the
    rest are summed under :data:`OVERFLOW`, with one warning per metric naming the label that
    overflowed first. Labels already reported keep their place, but for one: ``max_labels``
    counts the overflow series, so when the cap is first exceeded the last reported label (in
    sorted order) gives its place to it. A gauge property that raises or
    is not a number is skipped (reported once per policy kind and property); it never breaks a
    collection. A transition a gauge's read applies (``breaker.half_open`` when an open period has
    ended) is reported to the process-wide sinks only, outside the collecting caller's context.

    Counters never go down while their label is alive: several policies may share a label (a
    ``Keyed`` family's keys past its ``max_labels``, two clients built alike), and when one of
    them is garbage-collected its figures, up to its last call, stay in the sum for as long as
    a policy of that kind and label lives (otherwise Prometheus would read the drop as a
    counter reset, and ``rate()`` would spike). When the last one goes, the label's series go.
    A member that lived and died between two collections counts too: each recorder's figures
    reach every collector at its death, summed there per (kind, label), so however many members
    die between two collections (a client built per request, a collector nobody scrapes) what
    waits is one set of figures per label, for at most ``10 * max_labels`` labels (the figures
    of further labels dead in the same interval are dropped: beyond the cap they would have
    been summed into the overflow series anyway). So the state kept between collections is the
    labels reported last time, the summed figures of the members dead since the last one, and
    those of dead members of labels still alive: nothing grows with labels no longer seen.
    """

    def __init__(self, max_labels: int = DEFAULT_MAX_LABELS) -> None:
        if isinstance(max_labels, bool) or not isinstance(max_labels, int):
            raise TypeError(f"max_labels must be an int, got {type(max_labels).__name__}")
        if max_labels < 1:
            raise ValueError(f"max_labels must be >= 1, got {max_labels}")
        self.max_labels = max_labels
        self._lock = threading.Lock()
        self._kept: dict[str, set[str]] = {}
        self._warned: set[str] = set()
        self._failed: set[tuple[str, str]] = set()
        # The figures of recorders that died since the last collection (stoic._metrics._died):
        # summed per (kind, label) in _buried, or, when the lock was held as one died (the cycle
        # collector may run anywhere, even inside collect()), kept as they came in _dead.
        self._buried: dict[tuple[str, str], Recorder] = {}
        self._dead: list[tuple[tuple[str, str], _Figures]] = []
        # The figures of dead recorders whose (kind, label) still has a live one.
        self._retired: dict[tuple[str, str], Recorder] = {}
        _collectors.add(self)

    def _bury(self, entry: tuple[tuple[str, str], _Figures]) -> None:
        """Take a dead recorder's figures (from :func:`_died`, which may run inside the cycle
        collector in any thread): summed into :attr:`_buried` when the lock is free, else kept
        as they came until the next collection (never a blocking wait: this thread may hold it)."""
        if not self._lock.acquire(blocking=False):
            self._dead.append(entry)  # (atomic)
            return
        try:
            self._sum_dead(entry)
        finally:
            self._lock.release()

    def _sum_dead(self, entry: tuple[tuple[str, str], _Figures]) -> None:
        """Sum a dead recorder's figures into :attr:`_buried` (under the lock), for at most
        ``10 * max_labels`` labels."""
        key, figures = entry
        buried = self._buried.get(key)
        if buried is None:
            if len(self._buried) >= 10 * self.max_labels:
                return
            buried = self._buried[key] = Recorder(*key)
        _add(buried, figures)

    def _retire(self, current: list[Recorder]) -> list[Recorder]:
        """Fold the figures of recorders that died since the last collection into
        :attr:`_retired` when their (kind, label) still has a live recorder; forget the rest."""
        alive = {(rec.kind, rec.label) for rec in current}
        dead = self._dead
        while dead:
            self._sum_dead(dead.pop())
        buried, self._buried = self._buried, {}
        for key, figures_of in buried.items():
            if key not in alive:
                continue
            retired = self._retired.get(key)
            if retired is None:
                retired = self._retired[key] = Recorder(*key)
            _add(retired, (figures_of.counters, figures_of.histograms))
        for key in [key for key in self._retired if key not in alive]:
            del self._retired[key]
        return [*current, *self._retired.values()]

    def collect(self) -> list[tuple[MetricSpec, list[Sample]]]:
        by_metric: dict[str, dict[tuple[str, ...], Any]] = {spec.name: {} for spec in METRICS}
        with self._lock:
            every = self._retire(list(recorders()))
        # The gauges read in an empty context: a read applies due lazy transitions (a breaker's
        # open period over), whose events belong to no request, not to the scrape's (its span,
        # its scoped sinks): the process-wide sinks get them.
        outside = contextvars.Context()
        for rec in every:
            # (one label no exposition can encode would fail the whole scrape, or export batch,
            # the application's own metrics too)
            label = encodable(rec.label)
            for key, n in list(rec.counters.items()):
                cells = by_metric.get(key[0])
                if cells is not None:
                    attrs = (label, *key[1:])
                    cells[attrs] = cells.get(attrs, 0) + n
            for key, histogram in list(rec.histograms.items()):
                cells = by_metric.get(key[0])
                if cells is not None:
                    attrs = (label, *key[1:])
                    merged = cells.get(attrs)
                    if merged is None:
                        cells[attrs] = histogram.copy()
                    else:
                        merged.merge(histogram)
            for spec in _COUNTED:
                cells = by_metric[spec.name]
                width = len(spec.attributes) - 1
                for key, histogram in list(rec.histograms.items()):
                    if key[0] == spec.counts_of:
                        attrs = (label, *key[1:1 + width])
                        cells[attrs] = cells.get(attrs, 0) + histogram.count
            owner = rec.owner() if rec.owner is not None else None
            if owner is not None:
                outside.run(self._read_gauges, rec.kind, label, owner, by_metric, rec.skip)
        with self._lock:
            return [(spec, self._cap(spec, by_metric[spec.name])) for spec in METRICS]

    def _read_gauges(self, kind: str, label: str, owner: object, by_metric: dict[str, dict[tuple[str, ...], Any]],
                     skip: frozenset[str]) -> None:
        for spec in METRICS:
            if spec.kind != "gauge" or spec.policy != kind:
                continue
            (prop,) = spec.properties
            if prop in skip:
                continue
            try:
                value: Any = getattr(owner, prop)
            except Exception:  # a property that raises must not break collection
                self._report(kind, prop)
                continue
            cells = by_metric[spec.name]
            if spec.name == "stoic.breaker.state":
                current = str(getattr(value, "value", value))
                for each in BREAKER_STATES:
                    cells[(label, each)] = cells.get((label, each), 0) + (1 if each == current else 0)
            elif _is_number(value):
                cells[(label,)] = cells.get((label,), 0) + value
            else:
                self._report(kind, prop)

    def _report(self, kind: str, prop: str) -> None:
        if (kind, prop) not in self._failed:
            self._failed.add((kind, prop))
            _log.error("stoic metrics: reading .%s of a %s failed or gave no number; skipped (reported once)",
                       prop, kind, exc_info=True)

    def _cap(self, spec: MetricSpec, cells: dict[tuple[str, ...], Any]) -> list[Sample]:
        labels = {attrs[0] for attrs in cells}
        if len(labels) <= self.max_labels:
            self._kept[spec.name] = labels
            return list(cells.items())
        previous = self._kept.get(spec.name, set())
        kept = {label for label in labels if label in previous}
        for label in sorted(labels - kept):
            if len(kept) >= self.max_labels - 1:  # one place is the overflow series
                break
            kept.add(label)
        kept = set(sorted(kept)[: self.max_labels - 1]) if len(kept) >= self.max_labels else kept
        self._kept[spec.name] = kept
        out: dict[tuple[str, ...], Any] = {}
        first_dropped: str | None = None
        for attrs, value in cells.items():
            if attrs[0] not in kept:
                first_dropped = first_dropped or attrs[0]
                attrs = (OVERFLOW, *attrs[1:])
            merged = out.get(attrs)
            if merged is None:
                out[attrs] = value.copy() if isinstance(value, Histogram) else value
            elif isinstance(merged, Histogram):
                merged.merge(value)
            else:
                out[attrs] = merged + value
        if spec.name not in self._warned:
            self._warned.add(spec.name)
            try:
                warnings.warn(
                    f"stoic metrics: {spec.name} has more than {self.max_labels} distinct {LABEL} values; label "
                    f"{first_dropped!r} and any further ones are reported as {LABEL}={OVERFLOW!r} "
                    "(warned once per metric)", RuntimeWarning, stacklevel=2)
            except Warning:  # warnings turned into errors must not cost the collection its figures
                _log.warning("stoic metrics: %s has more than %d distinct %s values; the rest are reported as %s",
                             spec.name, self.max_labels, LABEL, OVERFLOW)
        return list(out.items())
