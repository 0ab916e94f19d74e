"""Generate the Grafana dashboards from code: ``python -m dashboards.generate``.

Writes one dashboard per policy kind (``stoic-breakers.json``, ``stoic-ratelimiters.json``,
``stoic-bulkheads.json`` (fixed and adaptive), ``stoic-throttles.json``, ``stoic-hedges.json``,
``stoic-retries.json``), one for the fleet-wide policies on Redis (``stoic-fleet.json``) and
``stoic-overview.json``,
each with data source, job and instance variables. The JSON is committed;
``tests/test_dashboards.py`` fails when it differs from what this module builds now, and
``tests/integration/test_prometheus.py`` evaluates every panel query against a real Prometheus
scraping the demo (every panel must return data), ``tests/integration/test_fleet_dashboard.py``
the fleet dashboard's (and the overview's fleet panels) against a real Prometheus scraping shared
policies on a real Redis that is killed and restarted. Metric names are the fixed ones of
``stoic._metrics.METRICS`` (docs/metrics.md).

``--check`` compares instead of writing and exits 1 on a difference.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders.dashboard import (
    Dashboard,
    DatasourceVariable,
    QueryVariable,
    Row,
    ThresholdsConfig,
)
from grafana_foundation_sdk.builders.prometheus import Dataquery as PromQuery
from grafana_foundation_sdk.builders.stat import Panel as StatPanel
from grafana_foundation_sdk.builders.statetimeline import Panel as StateTimelinePanel
from grafana_foundation_sdk.builders.timeseries import Panel as TimeseriesPanel
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import BigValueGraphMode, GraphDrawStyle
from grafana_foundation_sdk.models.dashboard import (
    DataSourceRef,
    Threshold,
    ThresholdsMode,
    ValueMap,
    ValueMappingResult,
    VariableOption,
    VariableRefresh,
    VariableSort,
)

HERE = Path(__file__).resolve().parent

PROM = DataSourceRef(type_val="prometheus", uid="${datasource}")
# Grafana substitutes these; tests/integration/test_prometheus.py substitutes the same names.
RATE = "$__rate_interval"

# Breaker state as one number per breaker, for the state timeline's value mapping.
STATE_CODES = {"closed": 0, "half_open": 1, "open": 2}
STATE_COLORS = {"closed": "green", "half_open": "yellow", "open": "red"}


def _sel(label_var: str, suffix: str = "", **matchers: str) -> str:
    """A label selector filtered by the dashboard's job, instance and policy variables, plus exact matchers.

    ``suffix`` (a regex) follows the policy variable: the series of a policy's companion, such as a
    store's health breaker (``<label>.health``)."""
    parts = ['job=~"$job"', 'instance=~"$instance"', f'stoic_label=~"${label_var}{suffix}"']
    parts += [f'{k}="{v}"' for k, v in matchers.items()]
    return "{" + ", ".join(parts) + "}"


def _q(expr: str, legend: str, ref: str = "A") -> PromQuery:
    return PromQuery().expr(expr).legend_format(legend).ref_id(ref)


def _timeseries(title: str, unit: str, description: str, *targets: PromQuery, span: int = 12) -> TimeseriesPanel:
    panel = TimeseriesPanel().title(title).description(description).unit(unit).datasource(PROM).height(8).span(span)
    for target in targets:
        panel = panel.with_target(target)
    return panel


def _stat(title: str, unit: str, description: str, target: PromQuery, *, red_at: float | None = None,
          span: int = 6) -> StatPanel:
    panel = (
        StatPanel().title(title).description(description).unit(unit).datasource(PROM).height(4).span(span)
        .graph_mode(BigValueGraphMode.AREA).with_target(target)
    )
    if red_at is not None:
        panel = panel.thresholds(
            ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps(
                [Threshold(value=None, color="green"), Threshold(value=red_at, color="red")]
            )
        )
    return panel


def _quantiles(metric: str, sel: str, by: str = "stoic_label") -> list[PromQuery]:
    """p50 and p99 of a seconds histogram, one series per ``by`` group."""
    return [
        _q(
            f"histogram_quantile({q}, sum by ({by}, le) (rate({metric}_bucket{sel}[{RATE}])))",
            f"p{int(q * 100)} {{{{{by}}}}}",
            ref,
        )
        for q, ref in ((0.5, "A"), (0.99, "B"))
    ]


def _all(variable: QueryVariable) -> QueryVariable:
    return (variable.datasource(PROM).refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(VariableSort.ALPHABETICAL_ASC).multi(True).include_all(True).all_value(".*")
            .current(VariableOption(selected=True, text="All", value="$__all")))


def _policy_variable(name: str, label: str, metric: str) -> QueryVariable:
    """A multi-select of the ``stoic_label`` values of ``metric`` in the chosen jobs and instances."""
    selector = metric[:-1] + ", " if metric.endswith("}") else metric + "{"
    return _all(QueryVariable(name).label(label).query(
        f'label_values({selector}job=~"$job", instance=~"$instance"}}, stoic_label)'))


def _base(title: str, uid: str, description: str) -> Dashboard:
    """Data source, job and instance variables: every dashboard works on any Prometheus, for any
    number of services scraped into it."""
    return (
        Dashboard(title).uid(uid).description(description).tags(["stoic"]).refresh("10s").time("now-15m", "now")
        .with_variable(DatasourceVariable("datasource").label("Data source").type("prometheus"))
        .with_variable(_all(QueryVariable("job").label("Job").query("label_values(up, job)")))
        .with_variable(_all(QueryVariable("instance").label("Instance")
                            .query('label_values(up{job=~"$job"}, instance)')))
    )


def _state_code(label_var: str, suffix: str = "") -> str:
    """One number per breaker label for the state timeline: the worst state among the series
    carrying it (open over half_open over closed). Each state's 0/1 series is scaled to its code
    and the series are joined with ``or`` (they differ by ``state``), then the highest is kept: a
    label shared by several instances, one half-open and one open, reads 2 (open), never the sum
    3, which no mapping names."""
    scaled = " or ".join(f"{code} * stoic_breaker_state{_sel(label_var, suffix, state=name)}"
                         for name, code in STATE_CODES.items() if code)
    return f"max by (stoic_label) ({scaled})"


def _state_mappings() -> list[Any]:
    return [ValueMap(options={
        str(code): ValueMappingResult(text=name, color=STATE_COLORS[name], index=code)
        for name, code in STATE_CODES.items()
    })]


def _rate_by(metric: str, sel: str, by: str) -> str:
    return f"sum by ({by}) (rate({metric}{sel}[{RATE}]))"


def breakers() -> Dashboard:
    """Circuit breakers: state, calls by outcome, failure ratio, rejections, latency, transitions."""
    v = "breaker"
    state_code, state_mappings = _state_code(v), _state_mappings()
    all_calls = _rate_by("stoic_breaker_calls_total", _sel(v), "stoic_label")
    failed_calls = _rate_by("stoic_breaker_calls_total", _sel(v, outcome="failure"), "stoic_label")
    return (
        _base("Stoic circuit breakers", "stoic-breakers",
              "State, traffic, failures and latency of every stoic CircuitBreaker (stoic.breaker.* metrics).")
        .with_variable(_policy_variable(v, "Breaker", "stoic_breaker_state"))
        .with_row(Row("State"))
        .with_panel(
            StateTimelinePanel().title("Breaker state")
            .description("closed / half_open / open over time, one lane per breaker: the worst state among the "
                         "instances running it (stoic_breaker_state).")
            .datasource(PROM).height(6).span(18).mappings(state_mappings)
            .with_target(_q(state_code, "{{stoic_label}}"))
        )
        .with_panel(
            _stat("Open breakers", "none", "Breakers open now.",
                  _q(f'sum(stoic_breaker_state{_sel(v, state="open")})', "open"), red_at=1)
            .height(6)
        )
        .with_row(Row("Calls"))
        .with_panel(_timeseries(
            "Calls by outcome", "reqps",
            "Calls the breaker recorded, per second, by outcome (stoic_breaker_calls_total).",
            _q(_rate_by("stoic_breaker_calls_total", _sel(v), "stoic_label, outcome"), "{{stoic_label}} {{outcome}}"),
        ))
        .with_panel(_timeseries(
            "Failure ratio", "percentunit",
            "Failed / recorded calls. The breaker trips when the ratio in its window reaches failure_rate_threshold.",
            _q(f"{failed_calls} / {all_calls}", "{{stoic_label}}"),
        ).min(0).max(1))
        .with_panel(_timeseries(
            "Rejections by state", "reqps",
            "Calls refused without running, per second, by the breaker state that refused them "
            "(stoic_breaker_rejections_total).",
            _q(_rate_by("stoic_breaker_rejections_total", _sel(v), "stoic_label, state"), "{{stoic_label}} {{state}}"),
        ))
        .with_panel(_timeseries(
            "Transitions", "short",
            "State changes by the state entered (stoic_breaker_transitions_total).",
            _q(f"sum by (stoic_label, state) (increase(stoic_breaker_transitions_total{_sel(v)}[{RATE}]))",
               "{{stoic_label}} → {{state}}"),
        ).draw_style(GraphDrawStyle.BARS))
        .with_row(Row("Latency"))
        .with_panel(_timeseries(
            "Call duration p50 / p99", "s",
            "Duration of recorded calls on the breaker's clock (stoic_breaker_call_duration_seconds).",
            *_quantiles("stoic_breaker_call_duration_seconds", _sel(v)),
        ))
        .with_panel(_timeseries(
            "Failures by error type", "reqps",
            "Failed calls per second by the failure's type name (error_type on stoic_breaker_call_duration_seconds).",
            _q(_rate_by("stoic_breaker_call_duration_seconds_count", _sel(v, outcome="failure"),
                        "stoic_label, error_type"), "{{stoic_label}} {{error_type}}"),
        ))
    )


def ratelimiters() -> Dashboard:
    """Rate limiters: permits, waiters, waits, refusals."""
    v = "limiter"
    return (
        _base("Stoic rate limiters", "stoic-ratelimiters",
              "Permits, queues, waits and refusals of every stoic RateLimiter (stoic.ratelimiter.* metrics).")
        # (waiters: every live limiter has it; a shared one has no permits_available, its credit
        # being in the store, and could not be picked from a variable reading that)
        .with_variable(_policy_variable(v, "Rate limiter", "stoic_ratelimiter_waiters"))
        .with_row(Row("Permits"))
        .with_panel(_timeseries(
            "Permits available", "short", "Tokens in each limiter's bucket (stoic_ratelimiter_permits_available).",
            _q(f"sum by (stoic_label) (stoic_ratelimiter_permits_available{_sel(v)})", "{{stoic_label}}"), span=12,
        ))
        .with_panel(_timeseries(
            "Waiters", "short", "Requests queued for a permit (stoic_ratelimiter_waiters).",
            _q(f"sum by (stoic_label) (stoic_ratelimiter_waiters{_sel(v)})", "{{stoic_label}}"), span=12,
        ))
        .with_row(Row("Waits and refusals"))
        .with_panel(_timeseries(
            "Wait for a permit p50 / p99", "s", "Time spent queued before a permit was granted.",
            *_quantiles("stoic_ratelimiter_wait_duration_seconds", _sel(v)),
        ))
        .with_panel(_timeseries(
            "Rejections by reason", "reqps",
            "would_exceed_deadline, queue_full, cancelled, deadline_exceeded, oversized "
            "(stoic_ratelimiter_rejections_total).",
            _q(_rate_by("stoic_ratelimiter_rejections_total", _sel(v), "stoic_label, reason"),
               "{{stoic_label}} {{reason}}"),
        ))
    )


def bulkheads() -> Dashboard:
    """Bulkheads, fixed and adaptive: the admission limit, slots in use, queue, refusals and sheds."""
    v = "bulkhead"
    return (
        _base("Stoic bulkheads", "stoic-bulkheads",
              "Limits, concurrency, queues, refusals and sheds of every stoic Bulkhead, AdaptiveBulkhead and "
              "GradientBulkhead (stoic.bulkhead.* metrics).")
        .with_variable(_policy_variable(v, "Bulkhead", "stoic_bulkhead_active"))
        .with_row(Row("Concurrency"))
        .with_panel(_timeseries(
            "Limit and in use", "short",
            "The admission limit (max_concurrent for a fixed bulkhead; it moves for an adaptive one) and the "
            "calls running, both summed over the instances (stoic_bulkhead_limit, stoic_bulkhead_active).",
            _q(f"sum by (stoic_label) (stoic_bulkhead_limit{_sel(v)})", "{{stoic_label}} limit", "A"),
            _q(f"sum by (stoic_label) (stoic_bulkhead_active{_sel(v)})", "{{stoic_label}} in use", "B"),
        ))
        .with_panel(_timeseries(
            "Queued calls", "short", "Calls waiting for a slot (stoic_bulkhead_queued).",
            _q(f"sum by (stoic_label) (stoic_bulkhead_queued{_sel(v)})", "{{stoic_label}} queued"),
        ))
        .with_row(Row("Refusals"))
        .with_panel(_timeseries(
            "Rejections and sheds by reason", "reqps",
            "bulkhead_full, cancelled, deadline_exceeded, and the queue management's sheds: sojourn, priority "
            "(stoic_bulkhead_rejections_total).",
            _q(_rate_by("stoic_bulkhead_rejections_total", _sel(v), "stoic_label, reason"),
               "{{stoic_label}} {{reason}}"),
        ))
        .with_panel(_stat("Lowest limit", "none",
                          "The lowest admission limit now: an adaptive bulkhead below its ceiling is backing off.",
                          _q(f"min(stoic_bulkhead_limit{_sel(v)})", "limit")))
    )


def throttles() -> Dashboard:
    """Adaptive throttles: the shed probability (each shed call is also a throttle.rejected event)."""
    v = "throttle"
    return (
        _base("Stoic adaptive throttles", "stoic-throttles",
              "Client-side shedding of every stoic AdaptiveThrottle (stoic.throttle.* metrics).")
        .with_variable(_policy_variable(v, "Throttle", "stoic_throttle_probability"))
        .with_row(Row("Shedding"))
        .with_panel(_timeseries(
            "Shed probability", "percentunit",
            "The probability the throttle sheds the next call, from its window of requests and accepts "
            "(stoic_throttle_probability). Each shed call is a throttle.rejected event.",
            _q(f"max by (stoic_label) (stoic_throttle_probability{_sel(v)})", "{{stoic_label}}"),
        ).min(0).max(1))
        .with_panel(_timeseries(
            "Shed calls", "reqps", "Calls each throttle shed locally, per second (stoic_throttle_rejections_total).",
            _q(_rate_by("stoic_throttle_rejections_total", _sel(v), "stoic_label"), "{{stoic_label}}"),
        ))
        .with_panel(_stat("Highest shed probability", "percentunit", "The highest shed probability now.",
                          _q(f"max(stoic_throttle_probability{_sel(v)})", "probability"), red_at=0.5, span=12))
    )


def hedges() -> Dashboard:
    """Hedges: hedged attempts, wins by attempt, the (adaptive) delay."""
    v = "hedge"
    return (
        _base("Stoic hedges", "stoic-hedges",
              "Hedged attempts, winners and delays of every stoic Hedge (stoic.hedge.* metrics).")
        .with_variable(_policy_variable(v, "Hedge", "stoic_hedge_delay_seconds"))
        .with_row(Row("Hedging"))
        .with_panel(_timeseries(
            "Hedged attempts and wins", "reqps",
            "Hedges started, and calls won by each attempt number "
            "(stoic_hedge_attempts_total, stoic_hedge_wins_total).",
            _q(_rate_by("stoic_hedge_attempts_total", _sel(v), "stoic_label"), "{{stoic_label}} hedges started", "A"),
            _q(_rate_by("stoic_hedge_wins_total", _sel(v), "stoic_label, attempt"),
               "{{stoic_label}} won by attempt {{attempt}}", "B"),
        ))
        .with_panel(_timeseries(
            "Hedge delay", "s", "The current (adaptive) delay before a hedge starts (stoic_hedge_delay_seconds).",
            _q(f"max by (stoic_label) (stoic_hedge_delay_seconds{_sel(v)})", "{{stoic_label}}"),
        ))
    )


def retries() -> Dashboard:
    """Retries: retried attempts by error type, how retried calls ended."""
    v = "retry"
    return (
        _base("Stoic retries", "stoic-retries",
              "Retried attempts and outcomes of every stoic retry (stoic.retry.* metrics).")
        .with_variable(_policy_variable(v, "Retry", "stoic_retry_outcomes_total"))
        .with_row(Row("Retries"))
        .with_panel(_timeseries(
            "Retries by error type", "reqps", "Attempts retried per second, by the error that caused them.",
            _q(_rate_by("stoic_retry_retries_total", _sel(v), "stoic_label, error_type"),
               "{{stoic_label}} {{error_type}}"),
        ))
        .with_panel(_timeseries(
            "Retry outcomes", "reqps",
            "How retried calls ended: succeeded, exhausted, budget_exhausted, deadline_skip, permanent, "
            "defect, nested (stoic_retry_outcomes_total).",
            _q(_rate_by("stoic_retry_outcomes_total", _sel(v), "stoic_label, outcome"), "{{stoic_label}} {{outcome}}"),
        ))
    )


def fleet() -> Dashboard:
    """Fleet-wide policies on Redis: store errors and recoveries, the store's health breaker, the
    decisions taken without the store and the local fallbacks that took them."""
    v = "fleet"
    # Companions of a store or a shared policy, by the label stoic gives them (docs/fleet.md).
    health = r"\\.health"
    fallback = r"\\.fallback"
    state_code, state_mappings = _state_code(v, health), _state_mappings()
    return (
        _base("Stoic fleet-wide policies", "stoic-fleet",
              "The Redis store behind SharedRateLimiter, SharedCircuitBreaker and SharedLatency: its errors, "
              "outages and latency, and the decisions taken without it (stoic.fleet.* metrics, and the breaker and "
              "limiter metrics of the store's health breaker and of the shared policies' local fallbacks).")
        .with_variable(_policy_variable(v, "Store or shared policy", '{__name__=~"stoic_fleet_.+"}'))
        .with_row(Row("Store"))
        .with_panel(
            StateTimelinePanel().title("Store health")
            .description("The store's health breaker (<store>.health): open while the store is resting after a "
                         "failed call (calls skip it), half_open while one call probes it, closed when it answers.")
            .datasource(PROM).height(6).span(18).mappings(state_mappings)
            .with_target(_q(state_code, "{{stoic_label}}"))
        )
        .with_panel(
            _stat("Store errors", "reqps", "Failed store calls per second now, all stores.",
                  _q(f"sum(rate(stoic_fleet_store_errors_total{_sel(v)}[{RATE}]))", "errors"), red_at=0.001)
            .height(6)
        )
        .with_panel(_timeseries(
            "Store errors by type", "reqps",
            "Store calls that failed, per second, by the error's type name: unreachable within the budget, an "
            "error reply, a reply of the wrong shape (stoic_fleet_store_errors_total).",
            _q(_rate_by("stoic_fleet_store_errors_total", _sel(v), "stoic_label, error_type"),
               "{{stoic_label}} {{error_type}}"),
        ))
        .with_panel(_timeseries(
            "Store recoveries", "short",
            "Outages that ended: a store call that succeeded after failed ones (stoic_fleet_store_recoveries_total; "
            "each is also a fleet.store_recovered event with the outage's length).",
            _q(f"sum by (stoic_label) (increase(stoic_fleet_store_recoveries_total{_sel(v)}[{RATE}]))",
               "{{stoic_label}}"),
        ).draw_style(GraphDrawStyle.BARS))
        .with_panel(_timeseries(
            "Store calls by outcome", "reqps",
            "Every store call, through the store's health breaker, by outcome (stoic_breaker_calls_total of "
            "<store>.health).",
            _q(_rate_by("stoic_breaker_calls_total", _sel(v, health), "stoic_label, outcome"),
               "{{stoic_label}} {{outcome}}"),
        ))
        .with_panel(_timeseries(
            "Store calls skipped while resting", "reqps",
            "Store calls not sent because the health breaker was open or probing: an outage costs one budget per "
            "probe interval, not one per call (stoic_breaker_rejections_total of <store>.health).",
            _q(_rate_by("stoic_breaker_rejections_total", _sel(v, health), "stoic_label, state"),
               "{{stoic_label}} {{state}}"),
        ))
        .with_panel(_timeseries(
            "Store call duration p50 / p99", "s",
            "Round trip of the store calls that were sent, budget included "
            "(stoic_breaker_call_duration_seconds of <store>.health).",
            *_quantiles("stoic_breaker_call_duration_seconds", _sel(v, health)),
        ))
        .with_row(Row("Decisions without the store"))
        .with_panel(_timeseries(
            "Fallbacks by decision", "reqps",
            "Decisions a shared policy took while the store could not be used, per second: fail_open (its local "
            "policy decided) or fail_closed (refused) (stoic_fleet_fallbacks_total).",
            _q(_rate_by("stoic_fleet_fallbacks_total", _sel(v), "stoic_label, decision"),
               "{{stoic_label}} {{decision}}"),
        ))
        .with_panel(_timeseries(
            "Fallback breaker calls by outcome", "reqps",
            "Calls a SharedCircuitBreaker's local fallback breaker (<label>.fallback) ran while failing open, by "
            "outcome (stoic_breaker_calls_total).",
            _q(_rate_by("stoic_breaker_calls_total", _sel(v, fallback), "stoic_label, outcome"),
               "{{stoic_label}} {{outcome}}"),
        ))
        .with_panel(_timeseries(
            "Fallback limiter permits", "short",
            "Tokens in each SharedRateLimiter's local fallback bucket (<label>.fallback, the same rate and burst): "
            "full while the store decides, spent while failing open (stoic_ratelimiter_permits_available).",
            _q(f"sum by (stoic_label) (stoic_ratelimiter_permits_available{_sel(v, fallback)})", "{{stoic_label}}"),
        ))
    )


def overview() -> Dashboard:
    """Every stoic policy at a glance: one row of numbers per kind; the kind's own dashboard has the detail."""
    v = "policy"
    return (
        _base("Stoic resilience overview", "stoic-overview",
              "Breakers, rate limiters, bulkheads, throttles, hedges, retries and fleet-wide policies of a stoic "
              "service at a glance (stoic.* metrics).")
        .with_variable(_policy_variable(v, "Policy", '{__name__=~"stoic_.+"}'))
        .with_row(Row("At a glance"))
        .with_panel(_stat("Open breakers", "none", "Breakers open now (details: the breakers dashboard).",
                          _q(f'sum(stoic_breaker_state{_sel(v, state="open")})', "open"), red_at=1, span=4))
        .with_panel(_stat("Breaker rejections", "reqps", "Calls refused by open or half-open breakers.",
                          _q(f"sum(rate(stoic_breaker_rejections_total{_sel(v)}[{RATE}]))", "rejected"), span=4))
        .with_panel(_stat("Limiter rejections", "reqps", "Requests refused by rate limiters.",
                          _q(f"sum(rate(stoic_ratelimiter_rejections_total{_sel(v)}[{RATE}]))", "rejected"), span=4))
        .with_panel(_stat("Bulkhead rejections", "reqps", "Calls refused by full bulkheads.",
                          _q(f"sum(rate(stoic_bulkhead_rejections_total{_sel(v)}[{RATE}]))", "rejected"), span=4))
        .with_panel(_stat("Retries", "reqps", "Retried attempts per second, all policies.",
                          _q(f"sum(rate(stoic_retry_retries_total{_sel(v)}[{RATE}]))", "retries"), span=4))
        .with_panel(_stat("Hedged attempts", "reqps", "Hedged attempts started per second.",
                          _q(f"sum(rate(stoic_hedge_attempts_total{_sel(v)}[{RATE}]))", "hedges"), span=4))
        .with_panel(_stat("Lowest bulkhead limit", "none",
                          "The lowest admission limit of any bulkhead now (an adaptive one backing off).",
                          _q(f"min(stoic_bulkhead_limit{_sel(v)})", "limit"), span=12))
        .with_panel(_stat("Highest throttle probability", "percentunit",
                          "The highest shed probability of any adaptive throttle now.",
                          _q(f"max(stoic_throttle_probability{_sel(v)})", "probability"), red_at=0.5, span=12))
        .with_panel(_stat("Fleet store errors", "reqps",
                          "Failed calls to the Redis store of the fleet-wide policies (details: the fleet dashboard).",
                          _q(f"sum(rate(stoic_fleet_store_errors_total{_sel(v)}[{RATE}]))", "errors"), span=12))
        .with_panel(_stat("Fleet decisions without the store", "reqps",
                          "Decisions shared policies took locally (fail_open) or refused (fail_closed) while their "
                          "store could not be used.",
                          _q(f"sum(rate(stoic_fleet_fallbacks_total{_sel(v)}[{RATE}]))", "fallbacks"), span=12))
        .with_row(Row("Traffic"))
        .with_panel(_timeseries(
            "Breaker calls by outcome", "reqps", "Calls every breaker recorded, per second, by outcome.",
            _q(_rate_by("stoic_breaker_calls_total", _sel(v), "stoic_label, outcome"), "{{stoic_label}} {{outcome}}"),
        ))
        .with_panel(_timeseries(
            "Refusals by policy", "reqps", "Everything a policy refused without running it, per second.",
            _q(_rate_by("stoic_breaker_rejections_total", _sel(v), "stoic_label"), "{{stoic_label}} breaker", "A"),
            _q(_rate_by("stoic_ratelimiter_rejections_total", _sel(v), "stoic_label"), "{{stoic_label}} limiter", "B"),
            _q(_rate_by("stoic_bulkhead_rejections_total", _sel(v), "stoic_label"), "{{stoic_label}} bulkhead", "C"),
            _q(_rate_by("stoic_throttle_rejections_total", _sel(v), "stoic_label"), "{{stoic_label}} throttle", "D"),
        ))
    )


DASHBOARDS: dict[str, Callable[[], Dashboard]] = {
    "stoic-overview.json": overview,
    "stoic-breakers.json": breakers,
    "stoic-ratelimiters.json": ratelimiters,
    "stoic-bulkheads.json": bulkheads,
    "stoic-throttles.json": throttles,
    "stoic-hedges.json": hedges,
    "stoic-retries.json": retries,
    "stoic-fleet.json": fleet,
}


def render(build: Callable[[], Dashboard]) -> str:
    """The dashboard as the committed JSON text (sorted keys, two-space indent, final newline)."""
    model = build().build()
    # Unique, stable panel ids (the builders leave them unset or 0), in layout order.
    for number, panel in enumerate(model.panels or [], start=1):
        panel.id_val = number
    return json.dumps(model, cls=JSONEncoder, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dashboards.generate", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed JSON; exit 1 if stale")
    parser.add_argument("--out", type=Path, default=HERE, help="directory to write into (default: dashboards/)")
    args = parser.parse_args(argv)
    stale = []
    for name, build in DASHBOARDS.items():
        path = args.out / name
        text = render(build)
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    if stale:
        print(f"stale: {', '.join(stale)} (run: python -m dashboards.generate)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
