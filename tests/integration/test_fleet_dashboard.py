"""The fleet dashboard through a real Prometheus and a real Redis that dies and comes back.

Starts a ``redis-server`` and a Prometheus (Debian package binaries) on free loopback ports, and a
workload process (``_fleet_dashboard_workload.py``) whose SharedRateLimiters (one failing open, one
failing closed) and SharedCircuitBreaker use that Redis and whose metrics Prometheus scrapes every
second. Redis is SIGKILLed and restarted twice, so store errors, decisions without the store and
recoveries all happen (two outages: a counter's first increase is invisible to ``increase()``, the
series being born at its first count). Then every panel query of stoic-fleet.json, and the fleet
panels of the overview (which the demo cannot feed), must return data as written (variables at
"All", no ``or vector(0)``). With ``STOIC_WRITE_FIGURES=1`` it draws docs/figures/dashboard-fleet.png.
Without the binaries it skips, except under CI (CI=true), where it fails.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dashboard_figures import RATE_INTERVAL, figure_name, figures_dir, render_figures
from prometheus_harness import Prometheus, free_port, require_binary, running_prometheus, stop_process
from redis_harness import RedisServer

from dashboards.queries import DEMO_FILES, FLEET_FILES, PanelQuery, load, panel_queries

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
STORE = "fleet-redis"  # the workload's labels (_fleet_dashboard_workload.py)
LIMITER, STRICT, BREAKER = "partner-limit", "partner-strict-limit", "partner-breaker"
OUTAGE_SECONDS = 3.0
HEALTHY_SECONDS = 4.0


def _values(result: list[dict[str, Any]]) -> list[float]:
    return [float(series["value"][1]) for series in result]


def _total(prometheus: Prometheus, expr: str) -> float:
    return sum(_values(prometheus.query(expr)))


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    workdir = tmp_path / "redis"
    workdir.mkdir()
    server = RedisServer(workdir)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def metrics_port() -> int:
    return free_port()


@pytest.fixture
def prometheus(metrics_port: int, tmp_path: Path) -> Iterator[Prometheus]:
    binary = require_binary("prometheus")
    workdir = tmp_path / "prometheus"
    workdir.mkdir()
    with running_prometheus(binary, workdir, [f"127.0.0.1:{metrics_port}"]) as running:
        running.wait_ready(timeout=15)
        yield running


@pytest.fixture
def workload(redis_server: RedisServer, prometheus: Prometheus, metrics_port: int,
             tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    output = tmp_path / "workload.out"
    with output.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.integration._fleet_dashboard_workload", redis_server.url,
             str(metrics_port)],
            cwd=ROOT, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
        )
        try:
            yield proc, output
        finally:
            stop_process(proc)


def _fleet_panel_queries() -> list[PanelQuery]:
    """Every query of the fleet dashboard, and the overview's fleet queries."""
    return ([q for name in FLEET_FILES for q in panel_queries(name, RATE_INTERVAL)]
            + [q for name in DEMO_FILES for q in panel_queries(name, RATE_INTERVAL) if q.needs_fleet])


def _outage(prometheus: Prometheus, redis_server: RedisServer, recoveries: int) -> None:
    """SIGKILL Redis, wait until Prometheus has seen errors and decisions without the store, start it
    again, wait until it has seen recovery number ``recoveries``."""
    errors = f'stoic_fleet_store_errors_total{{stoic_label="{STORE}"}}'
    before = _total(prometheus, errors)
    killed = time.monotonic()
    redis_server.kill()
    prometheus.wait_for(errors, lambda r: sum(_values(r)) > before, timeout=10, what="store errors")
    for label, decision in ((LIMITER, "fail_open"), (STRICT, "fail_closed"), (BREAKER, "fail_open")):
        prometheus.wait_for(f'stoic_fleet_fallbacks_total{{stoic_label="{label}", decision="{decision}"}}',
                            lambda r: bool(r), timeout=10, what=f"{label} {decision}")
    time.sleep(max(0.0, killed + OUTAGE_SECONDS - time.monotonic()))
    redis_server.start()
    prometheus.wait_for(f'stoic_fleet_store_recoveries_total{{stoic_label="{STORE}"}}',
                        lambda r: sum(_values(r)) >= recoveries, timeout=10, what=f"recovery {recoveries}")


def test_every_panel_of_the_fleet_dashboard_returns_data_from_shared_policies_on_redis(
    prometheus: Prometheus, redis_server: RedisServer, workload: tuple[subprocess.Popen[bytes], Path],
    tmp_path: Path,
) -> None:
    proc, output = workload
    started = time.monotonic()
    wall_start = time.time()
    try:
        prometheus.wait_targets_up(timeout=15)
        health = f"{STORE}.health"
        prometheus.wait_for(f'stoic_breaker_calls_total{{stoic_label="{health}", outcome="success"}}',
                            lambda r: bool(r) and _values(r)[0] > 0, timeout=10, what="store calls")
        time.sleep(HEALTHY_SECONDS)  # a healthy stretch before, between and after the outages
        _outage(prometheus, redis_server, recoveries=1)
        time.sleep(HEALTHY_SECONDS)
        _outage(prometheus, redis_server, recoveries=2)

        # The store's failures are named by type; the fail-closed limiter refused, the others decided locally.
        kinds = {s["metric"]["error_type"] for s in prometheus.query(
            f'stoic_fleet_store_errors_total{{stoic_label="{STORE}"}}')}
        assert kinds and "" not in kinds, kinds
        decisions = {(s["metric"]["stoic_label"], s["metric"]["decision"])
                     for s in prometheus.query("stoic_fleet_fallbacks_total")}
        assert decisions == {(LIMITER, "fail_open"), (STRICT, "fail_closed"), (BREAKER, "fail_open")}, decisions
        # The health breaker opened on the outages, and the local fallbacks did the work meanwhile.
        assert _total(prometheus, f'stoic_breaker_transitions_total{{stoic_label="{health}", state="open"}}') >= 2
        assert _total(prometheus, f'stoic_breaker_calls_total{{stoic_label="{BREAKER}.fallback"}}') > 0

        # Every panel of the fleet dashboard has a query, and every query returns data, as written.
        for name in FLEET_FILES:
            titled = {p["title"] for p in load(name)["panels"] if p["type"] != "row"}
            assert titled == {q.panel for q in panel_queries(name)}, name
        queries = _fleet_panel_queries()
        assert len(queries) >= 13 and any(q.dashboard == "Stoic resilience overview" for q in queries)
        for query in queries:
            assert "$" not in query.promql and "or vector(" not in query.promql, query
        empty = list(queries)
        deadline = time.monotonic() + 15
        while empty and time.monotonic() < deadline:
            empty = [q for q in empty if not prometheus.query(q.promql)]
            if empty:
                time.sleep(1.0)
        assert not empty, "panels with no data:\n" + "\n".join(f"{q}: {q.promql}" for q in empty)

        time.sleep(max(0.0, HEALTHY_SECONDS - 2.0))  # the panels' wait above took some of it
        end = time.time()
        # The second recovery shows as an increase (the first one created the series).
        (recovered,) = [q for q in panel_queries("stoic-fleet.json", RATE_INTERVAL) if q.panel == "Store recoveries"]
        assert max(float(v) for s in prometheus.query_range(recovered.promql, wall_start, end)
                   for _, v in s["values"]) > 0
        written = render_figures(
            prometheus, FLEET_FILES, wall_start, end, figures_dir(tmp_path), rate_interval=RATE_INTERVAL,
            origin_expr=f'stoic_breaker_state{{stoic_label="{health}"}}', subject="shared policies on a Redis "
            "killed and restarted twice", origin_text="seconds since the workload's policies were first scraped")
        assert [path.name for path in written] == [figure_name(name) for name in FLEET_FILES]
        assert all(path.stat().st_size > 10_000 for path in written)
    except AssertionError:
        print(output.read_text(errors="replace")[-3000:])
        print(prometheus.logs())
        raise
    finally:
        stop_process(proc)
    assert time.monotonic() - started < 60
