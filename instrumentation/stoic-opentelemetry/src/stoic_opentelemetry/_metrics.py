"""Metrics: counters and histograms derived from events, gauges read from observed policies.

Every instrument comes from :data:`._table.METRICS`. The sink wants DEBUG events (the call
counter and duration histogram come from ``breaker.recorded``, the wait histogram from
``ratelimiter.waited``), so installing it makes policies build their debug events: that is the
price of per-call metrics, paid only when metrics are on.

Cheapness: ``emit`` is one dict lookup for events no metric uses. Counters are tallied here
(a dict lookup and an uncontended lock per event) and reported through observable counters at
collection time: the SDK's synchronous ``Counter.add`` validates and hashes the attributes on
every call, which costs several microseconds. Histograms have no observable form, so they are
recorded synchronously with attribute dicts built once per (label, value) and reused (never
mutated).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry.metrics import (
    CallbackOptions,
    Histogram,
    Meter,
    MeterProvider,
    Observation,
    get_meter_provider,
)

from stoic.events import AttributeValue, Event, Level

from ._table import BREAKER_STATES, LABEL, METRICS, RETRY_OUTCOMES, SECOND_BUCKETS
from ._version import __version__

_Attrs = dict[str, AttributeValue]
_MAX_CACHED = 10_000  # attribute dicts kept; beyond this (a label explosion) they are built per call

# Event -> the breaker state it proves (a transition). recorded/rejected only introduce a breaker.
_BREAKER_TRANSITIONS = {
    "breaker.opened": "open",
    "breaker.half_open": "half_open",
    "breaker.closed": "closed",
}


class _Tally:
    """One counter's totals by (label, attribute value), read by an observable counter callback.

    Totals are cumulative and only grow, which is what an observable counter reports.
    """

    __slots__ = ("_key", "_cells", "_lock")

    def __init__(self, key: str | None) -> None:
        self._key = key  # the attribute besides stoic.label, or None
        self._cells: dict[tuple[str, AttributeValue], list[Any]] = {}  # -> [attributes, total]
        self._lock = threading.Lock()

    def add(self, label: str, value: AttributeValue = "") -> None:
        with self._lock:
            cell = self._cells.get((label, value))
            if cell is None:
                attrs: _Attrs = {LABEL: label} if self._key is None else {LABEL: label, self._key: value}
                cell = self._cells[(label, value)] = [attrs, 0]
            cell[1] += 1

    def observations(self) -> list[Observation]:
        with self._lock:
            totals = [(attrs, total) for attrs, total in self._cells.values()]
        return [Observation(total, attrs) for attrs, total in totals]


class _Instruments:
    """The instruments of one meter provider, created once and shared by its MetricsSinks.

    OpenTelemetry keeps the first registration of an instrument name and ignores a later one's
    callbacks, so a MetricsSink built after another on the same provider (instrument, uninstrument,
    instrument again) must reuse these. Counters keep their totals across sinks (a counter never
    goes back); callbacks report for the attached sink and nothing while none is attached.
    """

    def __init__(self, meter: Meter) -> None:
        self.sink: MetricsSink | None = None
        self.tallies: dict[str, _Tally] = {}
        self.histograms: dict[str, Histogram] = {}
        for spec in METRICS:
            if spec.kind == "counter":
                tally = self.tallies[spec.name] = _Tally(spec.attributes[1] if len(spec.attributes) > 1 else None)
                meter.create_observable_counter(spec.name, [self._counter(tally)], spec.unit, spec.description)
            elif spec.kind == "histogram":
                self.histograms[spec.name] = meter.create_histogram(
                    spec.name, spec.unit, spec.description, explicit_bucket_boundaries_advisory=list(SECOND_BUCKETS)
                )
            elif spec.name == "stoic.breaker.state":
                meter.create_observable_gauge(spec.name, [self._breaker_state], spec.unit, spec.description)
            else:
                (prop,) = spec.properties
                meter.create_observable_gauge(spec.name, [self._gauge(prop)], spec.unit, spec.description)

    def _counter(self, tally: _Tally) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            return [] if self.sink is None else tally.observations()

        return callback

    def _breaker_state(self, options: CallbackOptions) -> Iterable[Observation]:
        sink = self.sink
        return [] if sink is None else sink._breaker_state_observations()

    def _gauge(self, prop: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            sink = self.sink
            return [] if sink is None else sink._property_observations(prop)

        return callback


_registry_lock = threading.Lock()
_by_provider: weakref.WeakKeyDictionary[MeterProvider, _Instruments] = weakref.WeakKeyDictionary()


def _instruments_for(provider: MeterProvider) -> _Instruments:
    with _registry_lock:
        try:
            instruments = _by_provider.get(provider)
        except TypeError:  # a provider without weakref support: cannot be shared, make its own
            return _Instruments(provider.get_meter("stoic_opentelemetry", __version__))
        if instruments is None:
            instruments = _Instruments(provider.get_meter("stoic_opentelemetry", __version__))
            _by_provider[provider] = instruments
        return instruments


class _Strong:
    """A strong reference with the call shape of ``weakref.ref`` (for objects without weakref support)."""

    __slots__ = ("_target",)

    def __init__(self, target: object) -> None:
        self._target = target

    def __call__(self) -> object:
        return self._target


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class MetricsSink:
    """Turns events into the metrics of :data:`stoic_opentelemetry.METRICS`.

    ``meter_provider`` defaults to the global one. ``level`` is ``Level.DEBUG`` (needed for the
    per-call metrics; a higher level silently loses them). Policies registered with
    :meth:`observe` feed the gauges through their properties (duck typing: ``.state``,
    ``.available_permits``, ``.waiter_count``, ``.active_count``, ``.queued_count``,
    ``.current_delay``; whichever exist), read at collection time; they are held weakly when
    they allow it. Breakers not observed still get a state gauge from their transition events.

    Instruments are created once per meter provider (OpenTelemetry ignores a second registration
    of a name): a later sink on the same provider reports through them, counters continuing from
    their totals, and the newest sink feeds the gauges. After :meth:`close` nothing is counted and,
    until another sink attaches, counters and gauges report nothing.
    """

    def __init__(self, meter_provider: MeterProvider | None = None, *, level: Level = Level.DEBUG) -> None:
        self.level = level
        provider = meter_provider if meter_provider is not None else get_meter_provider()
        self._closed = False
        self._lock = threading.Lock()
        self._attrs: dict[tuple[str, str, AttributeValue], _Attrs] = {}
        self._label_only: dict[str, _Attrs] = {}
        self._breaker_states: dict[str, str] = {}
        self._observed: tuple[Callable[[], object | None], ...] = ()
        self._instruments = _instruments_for(provider)
        self._instruments.sink = self  # the newest sink on a provider feeds its gauges
        self._handlers: dict[str, Callable[[Event], None]] = self._build_handlers()

    # --- cached attribute dicts ---
    def _label(self, label: str) -> _Attrs:
        attrs = self._label_only.get(label)
        if attrs is None:
            attrs = {LABEL: label}
            if len(self._label_only) < _MAX_CACHED:
                self._label_only[label] = attrs
        return attrs

    def _with(self, label: str, key: str, value: AttributeValue) -> _Attrs:
        cache_key = (label, key, value)
        attrs = self._attrs.get(cache_key)
        if attrs is None:
            attrs = {LABEL: label, key: value}
            if len(self._attrs) < _MAX_CACHED:
                self._attrs[cache_key] = attrs
        return attrs

    # --- events ---
    def emit(self, event: Event) -> None:
        handler = self._handlers.get(event.name)
        if handler is not None and not self._closed:
            handler(event)

    def _build_handlers(self) -> dict[str, Callable[[Event], None]]:
        c, h = self._instruments.tallies, self._instruments.histograms
        calls, duration = c["stoic.breaker.calls"], h["stoic.breaker.call.duration"]
        breaker_rejections, transitions = c["stoic.breaker.rejections"], c["stoic.breaker.transitions"]
        wait, limiter_rejections = h["stoic.ratelimiter.wait.duration"], c["stoic.ratelimiter.rejections"]
        bulkhead_rejections = c["stoic.bulkhead.rejections"]
        hedge_attempts, hedge_wins = c["stoic.hedge.attempts"], c["stoic.hedge.wins"]
        retries, outcomes = c["stoic.retry.retries"], c["stoic.retry.outcomes"]
        store_errors, recoveries = c["stoic.fleet.store.errors"], c["stoic.fleet.store.recoveries"]
        fallbacks = c["stoic.fleet.fallbacks"]
        states = self._breaker_states
        attr, label_only = self._with, self._label

        def recorded(e: Event) -> None:
            a = e.attributes
            outcome = a.get("outcome", "unknown")
            calls.add(e.label, outcome)
            seconds = a.get("duration")
            if _is_number(seconds):
                duration.record(seconds, attr(e.label, "outcome", outcome))  # type: ignore[arg-type]  # a number
            if e.label not in states:
                states[e.label] = str(a.get("state", "closed"))

        def rejected(e: Event) -> None:
            state = e.attributes.get("state", "unknown")
            breaker_rejections.add(e.label, state)
            if e.label not in states and state in BREAKER_STATES:
                states[e.label] = str(state)

        def transition(e: Event) -> None:
            state = _BREAKER_TRANSITIONS[e.name]
            states[e.label] = state
            transitions.add(e.label, state)

        def reset(e: Event) -> None:
            states[e.label] = "closed"

        def waited(e: Event) -> None:
            seconds = e.attributes.get("waited")
            if _is_number(seconds):
                wait.record(seconds, label_only(e.label))  # type: ignore[arg-type]  # narrowed by _is_number

        def limiter_rejected(e: Event) -> None:
            limiter_rejections.add(e.label, e.attributes.get("reason", "unknown"))

        def oversized(e: Event) -> None:
            limiter_rejections.add(e.label, "oversized")

        def bulkhead_rejected(e: Event) -> None:
            bulkhead_rejections.add(e.label, e.attributes.get("reason", "unknown"))

        def hedge_started(e: Event) -> None:
            hedge_attempts.add(e.label)

        def hedge_won(e: Event) -> None:
            hedge_wins.add(e.label, e.attributes.get("attempt", 0))

        def attempt_failed(e: Event) -> None:
            retries.add(e.label, e.attributes.get("error.type", "unknown"))

        def store_error(e: Event) -> None:
            store_errors.add(e.label, e.attributes.get("error.type", "unknown"))

        def store_recovered(e: Event) -> None:
            recoveries.add(e.label)

        def fallback(value: str) -> Callable[[Event], None]:
            def count(e: Event) -> None:
                fallbacks.add(e.label, value)

            return count

        def outcome(value: str) -> Callable[[Event], None]:
            def count(e: Event) -> None:
                outcomes.add(e.label, value)

            return count

        handlers: dict[str, Callable[[Event], None]] = {
            "breaker.recorded": recorded,
            "breaker.rejected": rejected,
            "breaker.opened": transition,
            "breaker.half_open": transition,
            "breaker.closed": transition,
            "breaker.reset": reset,
            "ratelimiter.waited": waited,
            "ratelimiter.rejected": limiter_rejected,
            "ratelimiter.oversized": oversized,
            "bulkhead.rejected": bulkhead_rejected,
            "hedge.started": hedge_started,
            "hedge.won": hedge_won,
            "retry.attempt_failed": attempt_failed,
            "fleet.store_error": store_error,
            "fleet.store_recovered": store_recovered,
            "fleet.fail_open": fallback("fail_open"),
            "fleet.fail_closed": fallback("fail_closed"),
        }
        for name, value in RETRY_OUTCOMES.items():
            handlers[name] = outcome(value)
        return handlers

    @property
    def handled_events(self) -> frozenset[str]:
        """The catalog events some metric is derived from."""
        return frozenset(self._handlers)

    # --- observed policies ---
    def observe(self, *policies: object) -> None:
        """Register ``policies`` whose properties feed the gauges (weakly held when possible)."""
        refs: list[Callable[[], object | None]] = []
        for policy in policies:
            try:
                refs.append(weakref.ref(policy))
            except TypeError:  # no __weakref__ slot: keep it alive
                refs.append(_Strong(policy))
        with self._lock:
            known = {id(r()) for r in self._observed}
            self._observed = (*self._observed, *(r for r in refs if id(r()) not in known))

    def _alive(self) -> list[tuple[str, object]]:
        out: list[tuple[str, object]] = []
        dead = False
        for ref in self._observed:
            policy = ref()
            if policy is None:
                dead = True
                continue
            label = getattr(policy, "label", None)
            out.append((label if isinstance(label, str) and label else type(policy).__name__.lower(), policy))
        if dead:
            with self._lock:
                self._observed = tuple(r for r in self._observed if r() is not None)
        return out

    def _breaker_state_observations(self) -> list[Observation]:
        states = dict(self._breaker_states)
        for label, policy in self._alive():
            try:
                state = getattr(policy, "state", None)
            except Exception:  # a property that raises must not break collection
                continue
            value = getattr(state, "value", state)
            if value in BREAKER_STATES:
                states[label] = str(value)
        return [
            Observation(1 if each == current else 0, self._with(label, "state", each))
            for label, current in states.items()
            for each in BREAKER_STATES
        ]

    def _property_observations(self, prop: str) -> list[Observation]:
        observations: list[Observation] = []
        for label, policy in self._alive():
            try:
                value: Any = getattr(policy, prop, None)
            except Exception:  # a property that raises must not break collection
                continue
            if _is_number(value):
                observations.append(Observation(value, self._label(label)))
        return observations

    def close(self) -> None:
        """Stop counting; counters and gauges stop reporting (OTel cannot remove instruments)."""
        self._closed = True
        if self._instruments.sink is self:
            self._instruments.sink = None
        with self._lock:
            self._observed = ()
        self._breaker_states.clear()

    def __repr__(self) -> str:
        return f"MetricsSink(level={self.level.name}, observed={len(self._observed)})"

