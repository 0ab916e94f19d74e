"""The event catalog: every event's name, level and exact attribute keys, as data.

This is the one place an event is written down. Docs (docs/events.md), the OpenTelemetry and
structlog adapters and the contract tests are driven from it; :class:`stoic.testing.RecordingSink`
rejects any event that is not here or carries other attributes.

Sources: seed 000 "Events" (breaker, ratelimiter, bulkhead, hedge), seed 001 "Events" (retry),
seed 003 (adaptive bulkheads, queue management, adaptive throttle, keyed, control); ``timeout.expired`` and
``fallback.substituted`` are stoic's (issue 11: every decision an event).
Where a seed names an event without attributes, the catalog says which were added and why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from ._event import AttributeValue, Level


@dataclass(frozen=True, slots=True)
class Attribute:
    """One attribute key: its Python type name and meaning (durations are seconds)."""

    type: str
    description: str
    optional: bool = False


@dataclass(frozen=True, slots=True)
class EventSpec:
    """One catalog entry."""

    name: str
    level: Level
    description: str
    attributes: Mapping[str, Attribute] = field(default_factory=dict)

    @property
    def required(self) -> frozenset[str]:
        return frozenset(k for k, a in self.attributes.items() if not a.optional)

    @property
    def allowed(self) -> frozenset[str]:
        return frozenset(self.attributes)

    def check(self, attributes: Mapping[str, AttributeValue]) -> list[str]:
        """Problems with ``attributes`` against this entry (empty when they conform)."""
        problems: list[str] = []
        keys = set(attributes)
        if missing := self.required - keys:
            problems.append(f"{self.name}: missing attributes {sorted(missing)}")
        if extra := keys - self.allowed:
            problems.append(f"{self.name}: attributes not in the catalog {sorted(extra)}")
        for key in keys & self.allowed:
            value = attributes[key]
            expected = self.attributes[key].type
            ok = {
                "str": isinstance(value, str),
                "int": isinstance(value, int) and not isinstance(value, bool),
                "float": isinstance(value, (int, float)) and not isinstance(value, bool),
                "bool": isinstance(value, bool),
            }[expected]
            if not ok:
                problems.append(f"{self.name}: {key}={value!r} is not {expected}")
        return problems


def _a(type_: str, description: str, optional: bool = False) -> Attribute:
    return Attribute(type_, description, optional)


_ERROR_TYPE = _a("str", "the error's type name (OTel `error.type`); messages are never recorded")

_SPECS: tuple[EventSpec, ...] = (
    # --- circuit breaker (seed 000, Events; CircuitBreaker) ---
    EventSpec("breaker.opened", Level.WARNING, "The breaker opened; calls are rejected until the open period ends.", {
        "trigger": _a("str", "failure_rate, slow_calls, probe_failed, probe_slow, probe_timeout or forced"),
        "calls": _a("int", "calls in the window when it opened"),
        "failures": _a("int", "failed calls in the window"),
        "slow_calls": _a("int", "slow calls in the window"),
        "trips": _a("int", "consecutive trips, this one included"),
        "open_for": _a("float", "seconds it stays open (absent when forced: open until released)", optional=True),
    }),
    EventSpec("breaker.half_open", Level.INFO, "The open period ended (observed lazily); probes may run.", {
        "probes": _a("int", "probe permits for this half-open episode"),
    }),
    EventSpec("breaker.closed", Level.INFO, "The breaker closed with an empty window.", {
        "reason": _a("str", "probes_succeeded, forced or reset"),
    }),
    EventSpec("breaker.reset", Level.INFO, "reset() closed the breaker and forgot its trip count."),
    EventSpec("breaker.rejected", Level.DEBUG, "A call was refused without running.", {
        "state": _a("str", "closed, open or half_open"),
        "retry_after": _a("float", "seconds until the breaker may admit a call (open only)", optional=True),
        "reason": _a("str", "deadline_exceeded, when refused because the ambient deadline had passed", optional=True),
    }),
    EventSpec("breaker.recorded", Level.DEBUG, "A completed call was recorded in the window (or as a probe).", {
        "outcome": _a("str", "success or failure"),
        "slow": _a("bool", "whether it took longer than slow_call_duration"),
        "state": _a("str", "the state it was recorded in: closed or half_open"),
        "duration": _a("float", "the call's duration in seconds on the breaker's clock (added to the seed's "
                       "list: the duration the stoic.breaker.call.duration histogram records)"),
    }),
    EventSpec("breaker.ignored", Level.DEBUG, "A completed call was not evidence about the dependency.", {
        "reason": _a("str", "cancelled, rejection or stale"),
    }),
    EventSpec("breaker.defect", Level.ERROR, "The operation raised a Defect (or an error holding one): re-raised, "
              "never counted.", {
        "error.type": _a("str", "the type name of the error the operation raised"),
    }),
    # --- rate limiter (seed 000, Events; RateLimiter) ---
    EventSpec("ratelimiter.rejected", Level.INFO, "acquire refused: nothing queued, nothing consumed.", {
        "reason": _a("str", "would_exceed_deadline, queue_full, cancelled or deadline_exceeded"),
        "permits": _a("int", "permits requested"),
        "retry_after": _a("float", "seconds until the request could be served, when known", optional=True),
    }),
    EventSpec("ratelimiter.oversized", Level.WARNING,
              "A request asked for more permits than the burst; it can never be served.", {
        "permits": _a("int", "permits requested"),
        "burst": _a("int", "the limiter's burst (the most a request can ever get)"),
    }),
    EventSpec("ratelimiter.waited", Level.DEBUG, "A queued acquire was served.", {
        "permits": _a("int", "permits granted"),
        "waited": _a("float", "seconds spent waiting"),
    }),
    # --- bulkhead (seed 000, Events; Bulkhead) ---
    EventSpec("bulkhead.rejected", Level.INFO, "A call was refused, shed, or left the queue without a slot.", {
        "reason": _a("str", "bulkhead_full, cancelled or deadline_exceeded; for a waiter shed by queue management "
                     "(seed 003, Queue management) sojourn (CoDel) or priority (displaced by a higher tier), "
                     "and deadline_exceeded for a waiter whose deadline passed before it could be served"),
        "capacity": _a("int", "the admission limit then (max_concurrent for a fixed bulkhead)"),
        "waiting": _a("int", "callers queued when it was full", optional=True),
        "sojourn": _a("float", "seconds the waiter had waited, shed or leaving the queue by itself (queue "
                      "management only, which every adaptive bulkhead uses)", optional=True),
        "criticality": _a("str", "that waiter's tier: best_effort, degraded, normal or critical (queue "
                          "management only, which every adaptive bulkhead uses)", optional=True),
    }),
    # --- adaptive bulkheads (seed 003, Adaptive (AIMD), Gradient) ---
    EventSpec("bulkhead.limit_changed", Level.INFO, "An adaptive bulkhead's admission limit moved.", {
        "old": _a("int", "the limit before"),
        "new": _a("int", "the limit after"),
        "cause": _a("str", "backoff (a breach or a drop), increase (additive, or Gradient2 headroom), "
                    "gradient (Gradient2 contracting with the latency gradient) or retune (reset to "
                    "max_concurrent by ControlPlane.retune)"),
    }),
    # --- adaptive throttle (seed 003, Adaptive throttle) ---
    EventSpec("throttle.rejected", Level.INFO, "The adaptive throttle shed a call locally.", {
        "probability": _a("float", "the shed probability the call faced"),
        "requests": _a("int", "requests in the window, this one included"),
        "accepts": _a("int", "accepted requests in the window"),
    }),
    # --- hedge (seed 000, Events; hedge) ---
    EventSpec("hedge.started", Level.INFO, "A hedged attempt started beside the running ones.", {
        "attempt": _a("int", "the attempt number started (2 or more)"),
        "elapsed": _a("float", "seconds since the first attempt started"),
    }),
    EventSpec("hedge.attempt_failed", Level.DEBUG, "One attempt failed.", {
        "attempt": _a("int", "the failed attempt's number"),
        "running": _a("int", "attempts still running"),
        "error.type": _ERROR_TYPE,
    }),
    EventSpec("hedge.won", Level.INFO, "An attempt won after at least one hedge had started.", {
        "attempt": _a("int", "the winning attempt's number"),
        "started": _a("int", "attempts started in all"),
        "latency": _a("float", "seconds from the first start to the win"),
    }),
    EventSpec("hedge.budget_exhausted", Level.WARNING, "No retry-budget token: no hedge; running attempts go on.", {
        "attempts": _a("int", "attempts started so far"),
    }),
    EventSpec("hedge.deadline_skip", Level.INFO, "No hedge: the ambient deadline leaves no time for one (or, "
              "with attempts 0, had already passed when the call started: nothing ran).", {
        "attempts": _a("int", "attempts started so far"),
    }),
    EventSpec("hedge.all_failed", Level.WARNING, "Every started attempt failed; the first failure is raised.", {
        "attempts": _a("int", "attempts started in all"),
        "error.type": _ERROR_TYPE,
    }),
    # --- retry (seed 001, Events) ---
    EventSpec("retry.attempt_failed", Level.INFO, "An attempt failed and will be retried.", {
        "attempt": _a("int", "the failed attempt's number (1 is the first)"),
        "error.type": _ERROR_TYPE,
        "decision": _a("str", "retry or retry_after"),
        "next_delay": _a("float", "seconds slept before the next attempt (exactly the delay slept)"),
    }),
    EventSpec("retry.succeeded", Level.INFO, "An operation succeeded after at least one retry.", {
        "attempts": _a("int", "attempts made in all (added: the seed names no attributes)"),
    }),
    EventSpec("retry.exhausted", Level.WARNING, "The schedule allowed no further attempt; the last error is raised.", {
        "attempts": _a("int", "attempts made in all"),
        "error.type": _ERROR_TYPE,
    }),
    EventSpec("retry.budget_exhausted", Level.WARNING, "The retry budget had no token; the last error is raised.", {
        "attempt": _a("int", "the failed attempt's number"),
        "error.type": _ERROR_TYPE,
    }),
    EventSpec("retry.deadline_skip", Level.INFO, "Another attempt could not finish before the ambient deadline (or, "
              "with attempt 0, it had already passed when the call started: nothing ran).", {
        "attempt": _a("int", "the failed attempt's number (0: none ran)"),
        "error.type": _ERROR_TYPE,
    }),
    EventSpec("retry.defect", Level.ERROR, "The operation raised a Defect: never retried.", {
        "attempt": _a("int", "the attempt's number"),
        "error.type": _ERROR_TYPE,
    }),
    EventSpec("retry.permanent", Level.INFO, "The classifier said stop; the error is raised.", {
        "attempt": _a("int", "the failed attempt's number"),
        "error.type": _ERROR_TYPE,
    }),
    EventSpec("retry.nested", Level.INFO, "A retry inside another retry's attempt made a single attempt.", {
        "error.type": _ERROR_TYPE,
    }),
    EventSpec("retry.after_capped", Level.WARNING, "A Retry-After longer than five minutes was capped.", {
        "requested": _a("float", "seconds the error asked for"),
        "capped": _a("float", "seconds actually used"),
    }),
    # --- deadlines (design/python.md, "Cancellation and deadlines") ---
    EventSpec("timeout.expired", Level.INFO, "A stoic.timeout()/deadline() block's deadline fired: the task "
              "inside is cancelled and the block raises DeadlineExceeded. The label is the block's "
              "label, or \"timeout\" without one."),
    # --- fallback (seed 002, "Falling back") ---
    EventSpec("fallback.substituted", Level.INFO, "with_fallback returned the fallback's value instead of "
              "raising (emitted once the fallback has returned it: a fallback that raises emits nothing). "
              "The label is the fallback's own (with_fallback's required label=).", {
        "error.type": _ERROR_TYPE,
    }),
    # --- keyed families (seed 003, Control plane: state per (policy, route)) ---
    EventSpec("keyed.evicted", Level.INFO, "A key's policy was dropped: idle and at rest, or room was needed.", {
        "key": _a("str", "the key dropped (empty for the unkeyed policy)"),
        "reason": _a("str", "idle (unused for idle_after) or capacity (max_keys reached)"),
    }),
    EventSpec("keyed.full", Level.WARNING,
              "Every key is busy at max_keys: new keys share the overflow policy until one is dropped.", {
        "keys": _a("int", "keys held (max_keys)"),
    }),
    # --- the control plane (seed 003, Control plane); the label is the registered name ---
    EventSpec("control.forced_open", Level.WARNING, "An operator forced breakers open (the manual kill switch).", {
        "policies": _a("int", "breakers forced open by this action"),
        "key": _a("str", "the key acted on (absent: every key)", optional=True),
        "actor": _a("str", "who asked, as the caller names it", optional=True),
    }),
    EventSpec("control.cleared", Level.INFO, "An operator lifted a manual trip.", {
        "policies": _a("int", "forced-open breakers closed by this action"),
        "key": _a("str", "the key acted on (absent: every key)", optional=True),
        "actor": _a("str", "who asked, as the caller names it", optional=True),
    }),
    EventSpec("control.retuned", Level.INFO, "An operator swapped a policy's configuration live.", {
        "policies": _a("int", "policies retuned (in place, or rebuilt for a family with its own factory)"),
        "parameters": _a("str", "the parameters changed, comma-separated (never their values)"),
        "actor": _a("str", "who asked, as the caller names it", optional=True),
    }),
    # --- fleet-wide state (seed 003, fleet-wide state; stoic.fleet) ---
    EventSpec("fleet.store_error", Level.WARNING,
              "A store call failed (unreachable in its budget, an error reply, or a reply of an unexpected shape); "
              "the policy decided without the store. Emitted once per failed call: while the store rests after a "
              "failure, calls skip it without an event.", {
        "operation": _a("str", "the script that failed: limiter_take, breaker_refresh, breaker_trip, breaker_probe, "
                        "breaker_done, breaker_force or latency_push"),
        "error.type": _ERROR_TYPE,
        "unavailable": _a("bool", "True for a connection error or a timeout (counts against the store's health)"),
    }),
    EventSpec("fleet.store_recovered", Level.INFO, "A store call succeeded after one or more failed.", {
        "outage": _a("float", "seconds since the first failed call"),
    }),
    EventSpec("fleet.fail_open", Level.INFO,
              "A decision taken without the store, failing open: the local policy (bucket or breaker) decided.", {
        "policy": _a("str", "ratelimiter or breaker"),
        "unavailable": _a("bool", "True when the store was unreachable or resting, False for a wrong answer"),
    }),
    EventSpec("fleet.fail_closed", Level.WARNING,
              "A call refused because the store could not decide (fail_open_on_store_error=False).", {
        "policy": _a("str", "ratelimiter or breaker"),
        "unavailable": _a("bool", "True when the store was unreachable or resting, False for a wrong answer"),
    }),
)

CATALOG: Mapping[str, EventSpec] = MappingProxyType({spec.name: spec for spec in _SPECS})
"""Every event stoic emits, by name."""


def check_event(name: str, attributes: Mapping[str, AttributeValue]) -> list[str]:
    """Problems with an event of ``name`` carrying ``attributes`` (empty when it conforms)."""
    spec = CATALOG.get(name)
    if spec is None:
        return [f"{name}: not in the catalog"]
    return spec.check(attributes)
