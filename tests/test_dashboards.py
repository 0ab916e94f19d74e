"""The committed Grafana dashboards: generated from code, and querying only metrics that exist.

The PromQL itself is evaluated against a real Prometheus in tests/integration/test_prometheus.py;
here it is parsed by promtool (same Debian package), and every metric name it mentions must be
one the OpenTelemetry adapter emits (the fixed names of the brief, as Prometheus spells them).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from dashboards import generate
from dashboards.queries import FILES, all_panel_queries, load, panel_queries, substitute

DASHBOARDS = Path(generate.__file__).resolve().parent

# OTel name -> Prometheus family: dots to underscores, "_seconds" for unit s, "_total" on counters.
METRIC_FAMILIES = {
    "stoic_breaker_state", "stoic_breaker_calls_total", "stoic_breaker_rejections_total",
    "stoic_breaker_transitions_total", "stoic_breaker_call_duration_seconds",
    "stoic_ratelimiter_permits_available", "stoic_ratelimiter_waiters", "stoic_ratelimiter_wait_duration_seconds",
    "stoic_ratelimiter_rejections_total",
    "stoic_bulkhead_active", "stoic_bulkhead_queued", "stoic_bulkhead_rejections_total", "stoic_bulkhead_limit",
    "stoic_throttle_probability", "stoic_throttle_rejections_total",
    "stoic_hedge_attempts_total", "stoic_hedge_wins_total", "stoic_hedge_delay_seconds",
    "stoic_retry_retries_total", "stoic_retry_outcomes_total",
    "stoic_fleet_store_errors_total", "stoic_fleet_store_recoveries_total", "stoic_fleet_fallbacks_total",
}
HISTOGRAMS = {"stoic_breaker_call_duration_seconds", "stoic_ratelimiter_wait_duration_seconds"}


def _known(name: str) -> bool:
    if name in METRIC_FAMILIES:
        return True
    base, _, suffix = name.rpartition("_")
    return base in HISTOGRAMS and suffix in ("bucket", "count", "sum")


@pytest.mark.parametrize("name", FILES)
def test_committed_json_equals_what_the_generator_writes_now(name: str) -> None:
    build = generate.DASHBOARDS[name]
    committed = (DASHBOARDS / name).read_text(encoding="utf-8")
    assert committed == generate.render(build), f"{name} is stale: run `python -m dashboards.generate`"


def test_generator_check_mode_detects_a_stale_file(tmp_path: Path) -> None:
    assert generate.main(["--out", str(tmp_path)]) == 0
    assert generate.main(["--check", "--out", str(tmp_path)]) == 0
    (tmp_path / FILES[0]).write_text("{}\n", encoding="utf-8")
    assert generate.main(["--check", "--out", str(tmp_path)]) == 1


@pytest.mark.parametrize("name", FILES)
def test_panels_have_unique_ids_titles_and_the_datasource_variable(name: str) -> None:
    dashboard = load(name)
    panels = dashboard["panels"]
    ids = [p["id"] for p in panels]
    assert len(set(ids)) == len(ids) and 0 not in ids
    titles = [p["title"] for p in panels if p["type"] != "row"]
    assert len(set(titles)) == len(titles), titles
    for panel in panels:
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
            assert panel["targets"], panel["title"]
            assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"]), panel["title"]
    names = [v["name"] for v in dashboard["templating"]["list"]]
    assert names[:3] == ["datasource", "job", "instance"] and len(names) == 4
    assert dashboard["uid"] == name.removesuffix(".json")


def test_breakers_dashboard_covers_state_outcomes_failures_rejections_latency_transitions() -> None:
    exprs = " ".join(q.expr for q in panel_queries("stoic-breakers.json"))
    for needed in ("stoic_breaker_state", "stoic_breaker_calls_total", 'outcome="failure"',
                   "stoic_breaker_rejections_total", "histogram_quantile(0.5,", "histogram_quantile(0.99,",
                   "stoic_breaker_call_duration_seconds_bucket", "stoic_breaker_transitions_total"):
        assert needed in exprs, needed


@pytest.mark.parametrize("kind", ["ratelimiter", "bulkhead", "throttle", "hedge", "retry", "fleet"])
def test_each_policy_kind_has_a_dashboard_covering_all_its_metrics(kind: str) -> None:
    name = "stoic-fleet.json" if kind == "fleet" else f"stoic-{kind.replace('retry', 'retrie')}s.json"
    exprs = " ".join(q.expr for q in panel_queries(name))
    for family in METRIC_FAMILIES:
        if family.startswith(f"stoic_{kind}_"):
            assert family in exprs, family


def test_no_query_hides_missing_data_behind_a_fallback() -> None:
    for query in all_panel_queries():
        assert "or vector(" not in query.expr, query


def test_the_overview_touches_every_policy_kind() -> None:
    exprs = " ".join(q.expr for q in panel_queries("stoic-overview.json"))
    for kind in ("breaker", "ratelimiter", "bulkhead", "throttle", "hedge", "retry", "fleet"):
        assert f"stoic_{kind}_" in exprs, kind


def test_the_fleet_dashboard_reads_the_store_health_breaker_and_the_local_fallbacks() -> None:
    # Shared policies report no breaker/limiter series of their own: the store's health breaker
    # (<store>.health) and the local fallbacks (<label>.fallback) do, under the breaker and
    # ratelimiter metrics; the panels find them by those suffixes.
    exprs = " ".join(q.expr for q in panel_queries("stoic-fleet.json"))
    assert 'stoic_label=~"$fleet\\\\.health"' in exprs and 'stoic_label=~"$fleet\\\\.fallback"' in exprs
    for needed in ("stoic_breaker_state", "stoic_breaker_calls_total", "stoic_breaker_rejections_total",
                   "stoic_breaker_call_duration_seconds_bucket", "stoic_ratelimiter_permits_available",
                   'decision', 'error_type'):
        assert needed in exprs, needed


def test_only_the_fleet_queries_need_a_store() -> None:
    # The demo (no Redis) feeds every other query; test_fleet_dashboard.py feeds these.
    for query in all_panel_queries():
        if query.dashboard != "Stoic fleet-wide policies" and query.needs_fleet:
            assert query.panel.startswith("Fleet "), query


def test_every_query_names_only_metrics_the_adapter_emits_and_filters_by_label() -> None:
    for query in all_panel_queries():
        names = set(re.findall(r"\b(stoic_[a-z_]+)\s*\{", query.expr))
        assert names, query
        unknown = {n for n in names if not _known(n)}
        assert not unknown, f"{query}: {unknown}"
        # Every selector is filtered by the dashboard's job, instance and policy variables.
        selectors = len(re.findall(r"\bstoic_[a-z_]+\s*\{", query.expr))
        assert query.expr.count('{job=~"$job", instance=~"$instance", stoic_label=~"$') == selectors, query


def test_substitute_fills_grafana_variables_and_refuses_unknown_ones() -> None:
    assert substitute('rate(x{a=~"$v"}[$__rate_interval])', {"v": ".*"}) == 'rate(x{a=~".*"}[1m])'
    assert substitute('x{a=~"${v}"}', {"v": ".*"}) == 'x{a=~".*"}'
    with pytest.raises(KeyError):
        substitute('x{a=~"$nope"}', {})


def _promtool() -> str:
    promtool = shutil.which("promtool")
    if promtool is None:
        import os

        reason = "promtool not found (Debian package prometheus: apt-get install prometheus); .ci/run installs it"
        if os.environ.get("CI", "").strip().lower() in ("true", "1", "yes"):
            pytest.fail(f"CI=true but {reason}")
        pytest.skip(reason)
    return promtool


def test_every_query_parses_as_promql(tmp_path: Path) -> None:
    promtool = _promtool()
    queries = all_panel_queries()
    rules = {"groups": [{"name": "dashboards", "rules": [
        {"record": f"stoic:dashboard_query:{i}", "expr": q.promql} for i, q in enumerate(queries)
    ]}]}
    path = tmp_path / "rules.yml"
    path.write_text(json.dumps(rules), encoding="utf-8")  # JSON is YAML
    done = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(queries)} rules found" in done.stdout, done.stdout


# What the tests above do not check by themselves: that their list of families is the exporter's
# own (a metric added to or renamed in stoic._metrics.METRICS must show up here, or the coverage
# test above would not ask for it), that every label a query matches on or groups by is one the
# metric carries (a typo there gives an empty panel, not an error), and that the template
# variables' queries name real metrics too.
def _labels_of() -> dict[str, set[str]]:
    from stoic._metrics import METRICS

    labels: dict[str, set[str]] = {}
    for spec in METRICS:
        carried = {*spec.prometheus_labels, "job", "instance"}
        if spec.kind == "histogram":
            labels[f"{spec.prometheus_name}_bucket"] = carried | {"le"}
            labels[f"{spec.prometheus_name}_sum"] = labels[f"{spec.prometheus_name}_count"] = carried
        else:
            labels[spec.prometheus_name] = carried
    return labels


def test_the_families_the_dashboards_are_checked_against_are_the_metric_tables() -> None:
    from stoic._metrics import METRICS

    assert {spec.prometheus_name for spec in METRICS} == METRIC_FAMILIES
    assert {spec.prometheus_name for spec in METRICS if spec.kind == "histogram"} == HISTOGRAMS


def test_every_label_a_query_matches_or_groups_by_is_carried_by_its_metrics() -> None:
    labels = _labels_of()
    for query in all_panel_queries():
        selectors = re.findall(r"\b(stoic_[a-z_]+)\s*\{([^}]*)\}", query.expr)
        for name, body in selectors:
            for label in re.findall(r"(\w+)\s*(?:=~|!~|!=|=)\s*\"", body):
                assert label in labels[name], f"{query}: {name} has no label {label!r}"
        names = {name for name, _ in selectors}
        for grouping in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", query.expr):
            for label in filter(None, (part.strip() for part in grouping.split(","))):
                assert any(label in labels[name] for name in names), f"{query}: no metric has {label!r}"


def test_every_template_variable_reads_a_metric_that_exists() -> None:
    labels = _labels_of()
    for name in FILES:
        for variable in load(name).get("templating", {}).get("list", []):
            if variable.get("type") != "query":
                continue
            query = variable["query"]
            query = query.get("query", "") if isinstance(query, dict) else query
            metric = re.match(r"label_values\((\w+)", query)
            if metric is not None and metric.group(1) != "up":
                assert metric.group(1) in labels, f"{name} ${variable['name']}: {query}"
                assert "stoic_label" in labels[metric.group(1)], query
            else:  # label_values(up...) or a name pattern: it must match at least one family
                pattern = re.search(r'__name__=~"([^"]+)"', query)
                if pattern is not None:
                    assert any(re.fullmatch(pattern.group(1), family) for family in labels), query


def _panels_with_units() -> list[tuple[str, dict[str, Any]]]:
    return [(name, panel) for name in FILES for panel in load(name)["panels"] if panel["type"] != "row"]


def test_every_panels_unit_is_the_unit_of_what_its_queries_compute() -> None:
    # A quantile of a seconds histogram is seconds, a ratio of rates a fraction, a rate per second,
    # an increase a count; a gauge keeps its metric's unit (seconds; "1" a fraction, or a state
    # code; an annotation like {call} a plain number).
    from stoic._metrics import METRICS

    units = {spec.prometheus_name: spec.unit for spec in METRICS}
    for name, panel in _panels_with_units():
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
        for target in panel["targets"]:
            expr = target["expr"]
            families = {re.sub(r"_(bucket|count|sum)$", "", f) if re.sub(r"_(bucket|count|sum)$", "", f) in HISTOGRAMS
                        else f for f in re.findall(r"\b(stoic_[a-z_]+)\s*\{", expr)}
            if "histogram_quantile(" in expr:
                wanted = {"s"}
            elif re.search(r"\)\s*/\s*sum", expr):
                wanted = {"percentunit"}
            elif "rate(" in expr:
                wanted = {"reqps"}
            elif "increase(" in expr:
                wanted = {"short"}
            else:
                (metric_unit,) = {units[f] for f in families}
                wanted = {"s"} if metric_unit == "s" else {"percentunit", "none", None} if metric_unit == "1" \
                    else {"short", "none"}
            assert unit in wanted, f"{name} / {panel['title']}: unit {unit!r}, its query computes {wanted}: {expr}"


def test_every_legend_names_only_labels_its_query_keeps() -> None:
    for name, panel in _panels_with_units():
        for target in panel["targets"]:
            expr, legend = target["expr"], target.get("legendFormat", "")
            kept = set()
            for grouping in re.findall(r"\bby\s*\(([^)]*)\)", expr):
                kept |= {part.strip() for part in grouping.split(",")}
            kept.discard("le")
            for label in re.findall(r"\{\{\s*(\w+)\s*\}\}", legend):
                assert label in kept, f"{name} / {panel['title']}: legend {legend!r} names {label!r}, kept {kept}"


@pytest.mark.parametrize(("name", "panel", "label"), [("stoic-breakers.json", "Breaker state", "b"),
                                                      ("stoic-fleet.json", "Store health", "store.health")])
def test_the_state_timeline_reads_the_worst_state_of_a_label_shared_by_instances(
        name: str, panel: str, label: str, tmp_path: Path) -> None:
    # The lane's number must be a mapped code (0 closed, 1 half_open, 2 open) however many
    # instances run a breaker of that label: replicas of one service share it. Evaluated by
    # promtool's rule unit tests on input series, one instance or two per label.
    promtool = _promtool()
    (query,) = [q for q in panel_queries(name) if q.panel == panel]
    cases = {"closed": (["closed"], 0), "half": (["half_open"], 1), "open": (["open"], 2),
             "mixed": (["half_open", "open"], 2), "recovering": (["closed", "half_open"], 1),
             "partial": (["closed", "open"], 2)}
    series = []
    for case, (states, _) in cases.items():
        for i, current in enumerate(states):
            for state in ("closed", "half_open", "open"):
                labels = f'job="svc", instance="i{i}", stoic_label="{case}-{label}", state="{state}"'
                value = "1" if state == current else "0"
                series.append({"series": f"stoic_breaker_state{{{labels}}}", "values": value})
    expected = [{"labels": f'{{stoic_label="{case}-{label}"}}', "value": code} for case, (_, code) in cases.items()]
    spec = {"rule_files": [], "evaluation_interval": "1m", "tests": [{"interval": "1m", "input_series": series,
            "promql_expr_test": [{"expr": query.promql, "eval_time": "0m", "exp_samples": expected}]}]}
    path = tmp_path / "timeline_test.yml"
    path.write_text(json.dumps(spec), encoding="utf-8")  # JSON is YAML
    done = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stdout + done.stderr


def test_limit_and_in_use_add_up_the_same_instances(tmp_path: Path) -> None:
    # Two replicas of a service, each with a bulkhead of 4 slots, 3 of them in use: the panel
    # pairs the limit with the calls in use, so both are totals over the instances (8 and 6); a
    # per-instance limit beside a summed in-use read 6 calls in use under a limit of 4.
    promtool = _promtool()
    limit, in_use = (q.promql for q in panel_queries("stoic-bulkheads.json") if q.panel == "Limit and in use")
    series = [{"series": f'stoic_bulkhead_{name}{{job="svc", instance="i{i}", stoic_label="db"}}', "values": value}
              for i in range(2) for name, value in (("limit", "4"), ("active", "3"))]
    spec = {"rule_files": [], "evaluation_interval": "1m", "tests": [{"interval": "1m", "input_series": series,
            "promql_expr_test": [
                {"expr": limit, "eval_time": "0m", "exp_samples": [{"labels": '{stoic_label="db"}', "value": 8}]},
                {"expr": in_use, "eval_time": "0m", "exp_samples": [{"labels": '{stoic_label="db"}', "value": 6}]},
            ]}]}
    path = tmp_path / "limit_test.yml"
    path.write_text(json.dumps(spec), encoding="utf-8")
    done = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stdout + done.stderr
