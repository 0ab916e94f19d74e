"""The metric table: every metric the adapter exports, as data.

docs/metrics.md is generated from :data:`METRICS`, the tests check every row against what the
SDK and the Prometheus exporter actually produce, and :mod:`._metrics` creates its instruments
from it. Names, units and attribute keys are fixed (dashboards and alerts query them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Kind = Literal["counter", "histogram", "gauge"]

SECOND_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""Histogram boundaries for durations in seconds (the SDK's defaults are made for milliseconds)."""

LABEL = "stoic.label"
"""The attribute every metric carries: the policy's label."""


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One exported metric.

    ``attributes`` lists every attribute key (``stoic.label`` first); ``source`` says what feeds
    it: an event name from the catalog (``event:breaker.recorded``) or a property read from the
    policies registered with ``Instrumentation.observe`` (``observe:.state``).
    """

    name: str
    kind: Kind
    unit: str
    attributes: tuple[str, ...]
    sources: tuple[str, ...]
    description: str

    @property
    def prometheus_name(self) -> str:
        """The name the OpenTelemetry Prometheus exporter gives this metric (counters gain
        ``_total``; unit ``s`` adds ``_seconds``; annotations like ``{call}`` and ``1`` add nothing)."""
        base = self.name.replace(".", "_")
        unit = re.sub(r"\{[^}]*\}", "", self.unit)
        suffix = {"s": "_seconds", "1": "", "": ""}.get(unit, f"_{unit}")
        total = "_total" if self.kind == "counter" else ""
        return f"{base}{suffix}{total}"

    @property
    def events(self) -> tuple[str, ...]:
        """The catalog events this metric is derived from."""
        return tuple(s.removeprefix("event:") for s in self.sources if s.startswith("event:"))

    @property
    def properties(self) -> tuple[str, ...]:
        """The policy properties this gauge reads (through ``observe``)."""
        return tuple(s.removeprefix("observe:.") for s in self.sources if s.startswith("observe:"))


def _m(name: str, kind: Kind, unit: str, attributes: tuple[str, ...], sources: tuple[str, ...],
       description: str) -> MetricSpec:
    return MetricSpec(name, kind, unit, (LABEL, *attributes), sources, description)


METRICS: tuple[MetricSpec, ...] = (
    # --- circuit breaker ---
    _m("stoic.breaker.state", "gauge", "1", ("state",),
       ("observe:.state", "event:breaker.opened", "event:breaker.half_open", "event:breaker.closed",
        "event:breaker.reset", "event:breaker.recorded", "event:breaker.rejected"),
       "1 for the breaker's current state, 0 for the other two (closed, open, half_open): all three "
       "series exist for every known breaker. Read from .state of observed breakers, else the last "
       "state the breaker's events showed."),
    _m("stoic.breaker.calls", "counter", "{call}", ("outcome",), ("event:breaker.recorded",),
       "Calls recorded by the breaker (as window evidence or as probes), by outcome: success or failure."),
    _m("stoic.breaker.rejections", "counter", "{call}", ("state",), ("event:breaker.rejected",),
       "Calls the breaker refused without running them, by the state it was in."),
    _m("stoic.breaker.transitions", "counter", "{transition}", ("state",),
       ("event:breaker.opened", "event:breaker.half_open", "event:breaker.closed"),
       "State transitions, by the new state."),
    _m("stoic.breaker.call.duration", "histogram", "s", ("outcome",), ("event:breaker.recorded",),
       "Duration of the calls the breaker recorded, in seconds on the breaker's clock, by outcome."),
    # --- rate limiter ---
    _m("stoic.ratelimiter.permits.available", "gauge", "{permit}", (), ("observe:.available_permits",),
       "Permits the limiter could grant right now."),
    _m("stoic.ratelimiter.waiters", "gauge", "{request}", (), ("observe:.waiter_count",),
       "Requests queued waiting for permits."),
    _m("stoic.ratelimiter.wait.duration", "histogram", "s", (), ("event:ratelimiter.waited",),
       "Seconds a queued request waited before it was served."),
    _m("stoic.ratelimiter.rejections", "counter", "{request}", ("reason",),
       ("event:ratelimiter.rejected", "event:ratelimiter.oversized"),
       "Requests refused, by reason: would_exceed_deadline, queue_full, cancelled, deadline_exceeded, "
       "or oversized (more permits than the burst: never servable)."),
    # --- fleet-wide state (stoic.fleet) ---
    _m("stoic.fleet.store.errors", "counter", "{call}", ("error.type",), ("event:fleet.store_error",),
       "Store calls that failed (unreachable within the budget, an error reply, a reply of the wrong shape), "
       "by the error's type name; the label is the store's."),
    _m("stoic.fleet.store.recoveries", "counter", "{recovery}", (), ("event:fleet.store_recovered",),
       "Store calls that succeeded after failed ones (the end of an outage); the label is the store's."),
    _m("stoic.fleet.fallbacks", "counter", "{decision}", ("decision",),
       ("event:fleet.fail_open", "event:fleet.fail_closed"),
       "Decisions a shared policy took without the store, by decision: fail_open (the local policy decided) "
       "or fail_closed (refused)."),
    # --- bulkhead ---
    _m("stoic.bulkhead.active", "gauge", "{call}", (), ("observe:.active_count",),
       "Calls running inside the bulkhead."),
    _m("stoic.bulkhead.queued", "gauge", "{call}", (), ("observe:.queued_count",),
       "Calls queued for a slot."),
    _m("stoic.bulkhead.rejections", "counter", "{call}", ("reason",), ("event:bulkhead.rejected",),
       "Calls refused or that left the queue without a slot, by reason: bulkhead_full, cancelled or "
       "deadline_exceeded."),
    # --- hedge ---
    _m("stoic.hedge.attempts", "counter", "{attempt}", (), ("event:hedge.started",),
       "Hedged attempts started (the first attempt of a call is not counted)."),
    _m("stoic.hedge.wins", "counter", "{call}", ("attempt",), ("event:hedge.won",),
       "Calls won after at least one hedge had started, by the winning attempt's number."),
    _m("stoic.hedge.delay", "gauge", "s", (), ("observe:.current_delay",),
       "The hedge's current delay in seconds (adaptive hedges move it with the observed latency)."),
    # --- retry ---
    _m("stoic.retry.retries", "counter", "{attempt}", ("error.type",), ("event:retry.attempt_failed",),
       "Failed attempts that were retried, by the error's type name."),
    _m("stoic.retry.outcomes", "counter", "{call}", ("outcome",),
       ("event:retry.succeeded", "event:retry.exhausted", "event:retry.budget_exhausted",
        "event:retry.deadline_skip", "event:retry.permanent", "event:retry.defect", "event:retry.nested"),
       "How calls run under retry ended, when the end was an event, by outcome: succeeded (after at "
       "least one retry), exhausted, budget_exhausted, deadline_skip, permanent, defect or nested. A call "
       "that succeeds on its first attempt emits no event and is not counted."),
)
"""Every metric, in documentation order."""

METRICS_BY_NAME = {spec.name: spec for spec in METRICS}

RETRY_OUTCOMES: dict[str, str] = {
    "retry.succeeded": "succeeded",
    "retry.exhausted": "exhausted",
    "retry.budget_exhausted": "budget_exhausted",
    "retry.deadline_skip": "deadline_skip",
    "retry.permanent": "permanent",
    "retry.defect": "defect",
    "retry.nested": "nested",
}
"""Retry terminal events and the ``outcome`` value each one counts as."""

BREAKER_STATES: tuple[str, ...] = ("closed", "open", "half_open")
