"""The demo's metrics through a real Prometheus: every panel of every dashboard returns data.

Starts ``python -m examples.demo`` with a fixed metrics port, a Prometheus (Debian package
binary) scraping it every second, waits for the story's failing phase to show up in the
stored series, checks the metric families, then evaluates every panel query of every committed
dashboard, as written (Grafana's variables at "All"; no query may hide missing data behind
``or vector(0)``), until each returns data, and checks that the adaptive bulkhead backed off and
the throttle shed. Finally it renders each dashboard's panels from Prometheus's range queries
to PNGs (matplotlib): into the test's temporary directory, or into docs/figures (the pictures
docs/dashboards.md shows) when ``STOIC_WRITE_FIGURES=1`` (``make figures``), so a plain
``make test`` leaves the working tree clean. Without the prometheus binary it skips, except
under CI (CI=true), where it fails.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dashboard_figures import figure_name, figures_dir, render_figures
from prometheus_harness import Prometheus, free_port, require_binary, running_prometheus, stop_process

from dashboards.queries import DEMO_FILES, PanelQuery, load, panel_queries

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
# The demo's policies are keyed by route: the family's label, ":", the key.
LABEL = "inventory-api:GET /work"
SEARCH_LABEL = "inventory-api:GET /search"
# At --duration 20 the story is scaled by 20/36: healthy for 3.3 s, failing until 8.3 s, slow
# until 13.3 s, recovered after. The test's waits add up to under 60 s, so a stuck run fails in
# bounded time (a normal one takes ~25 s).
DEMO_SECONDS = 20


@pytest.fixture
def metrics_port() -> int:
    return free_port()


@pytest.fixture
def prometheus(metrics_port: int, tmp_path: Path) -> Iterator[Prometheus]:
    """Prometheus first, so its scrapes cover the whole story (it takes a few seconds to start)."""
    binary = require_binary("prometheus")
    workdir = tmp_path / "prometheus"
    workdir.mkdir()
    with running_prometheus(binary, workdir, [f"127.0.0.1:{metrics_port}"]) as running:
        running.wait_ready(timeout=15)
        running.wait_scraping(timeout=15)  # the target (not listening yet) is scraped: the demo's first second is kept
        yield running


@pytest.fixture
def demo(prometheus: Prometheus, metrics_port: int, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    output = tmp_path / "demo.out"
    with output.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "examples.demo", "--duration", str(DEMO_SECONDS),
             "--metrics-port", str(metrics_port)],
            cwd=ROOT, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
        )
        try:
            yield proc, output
        finally:
            stop_process(proc)


def _values(result: list[dict[str, Any]]) -> list[float]:
    return [float(series["value"][1]) for series in result]


def _demo_can_feed(query: PanelQuery) -> bool:
    """The demo runs no fleet-wide policy (no Redis): the overview's fleet panels are evaluated by
    test_fleet_dashboard.py instead, and left out of the demo's pictures."""
    return not query.needs_fleet


def _every_panel_query() -> list[PanelQuery]:
    return [q for name in DEMO_FILES for q in panel_queries(name) if _demo_can_feed(q)]


def test_every_panel_of_every_dashboard_returns_data_from_the_demo(
    prometheus: Prometheus, demo: tuple[subprocess.Popen[bytes], Path], tmp_path: Path
) -> None:
    proc, output = demo
    started = time.monotonic()
    wall_start = time.time()
    try:
        prometheus.wait_targets_up(timeout=10)
        sel = f'{{stoic_label="{LABEL}"}}'

        # The failing phase happened and was recorded, and the breaker opened at least once.
        prometheus.wait_for(
            f'stoic_breaker_calls_total{{stoic_label="{LABEL}", outcome="failure"}}',
            lambda r: bool(r) and _values(r)[0] > 0, timeout=20, what="failed calls")
        prometheus.wait_for(
            f'stoic_breaker_transitions_total{{stoic_label="{LABEL}", state="open"}}',
            lambda r: bool(r) and _values(r)[0] >= 1, timeout=10, what="a transition to open")

        # The state gauge: all three states, exactly one of them 1.
        state = prometheus.query(f"stoic_breaker_state{sel}")
        assert sorted(s["metric"]["state"] for s in state) == ["closed", "half_open", "open"]
        assert sorted(_values(state)) == [0.0, 0.0, 1.0]

        # The histogram has second-scale buckets and error.type on failures.
        buckets = prometheus.query(f"stoic_breaker_call_duration_seconds_bucket{sel}")
        les = {s["metric"]["le"] for s in buckets}
        assert {"0.005", "0.01", "0.025", "0.25", "0.5", "1.0", "+Inf"} <= les, les
        failing = prometheus.query(f'stoic_breaker_call_duration_seconds_count{{stoic_label="{LABEL}", '
                                   'outcome="failure"}')
        assert {s["metric"]["error_type"] for s in failing} >= {"ServerError"}  # the transport's 503

        # Every panel query of every dashboard returns data, as written: nothing is patched in.
        queries = _every_panel_query()
        assert len(queries) >= 28
        # Every panel of every dashboard has a query (so "every query returns data" covers every panel).
        for name in DEMO_FILES:
            titled = {p["title"] for p in load(name)["panels"] if p["type"] != "row"}
            assert titled == {q.panel for q in panel_queries(name)}, name
        for query in queries:
            assert "$" not in query.promql and "or vector(" not in query.promql, query
        empty = list(queries)
        deadline = time.monotonic() + 25
        while empty and time.monotonic() < deadline:
            empty = [q for q in empty if not prometheus.query(q.promql)]
            if empty:
                time.sleep(1.0)
        assert not empty, "panels with no data:\n" + "\n".join(f"{q}: {q.promql}" for q in empty)

        # The state timeline's single number per breaker is one of its mapped codes.
        (timeline,) = [q for q in panel_queries("stoic-breakers.json") if q.panel == "Breaker state"]
        codes = prometheus.query(timeline.promql)
        assert sorted(s["metric"]["stoic_label"] for s in codes) == [SEARCH_LABEL, LABEL]
        assert set(_values(codes)) <= {0.0, 1.0, 2.0}

        # The adaptive policies did something worth a panel: the AIMD bulkhead backed off below
        # its ceiling of 4 at some point, and the throttle's shed probability rose above 0.
        bulkhead = '{stoic_label="inventory-bulkhead:GET /work"}'
        prometheus.wait_for(f"min_over_time(stoic_bulkhead_limit{bulkhead}[5m])",
                            lambda r: bool(r) and _values(r)[0] < 4, timeout=15, what="the adaptive limit backing off")
        prometheus.wait_for('max_over_time(stoic_throttle_probability{stoic_label="inventory-throttle:GET /work"}[5m])',
                            lambda r: bool(r) and _values(r)[0] > 0, timeout=5, what="the throttle shedding")

        # The pictures cover the whole story: let the demo finish, and the last scrape land.
        proc.wait(timeout=DEMO_SECONDS + 15)
        time.sleep(1.5)
        # Time 0 is the first scrape that saw a breaker's state (its gauge exists from the
        # breaker's first call, as the story starts), not the test's start: the demo's start-up
        # takes a few seconds on a busy machine.
        written = render_figures(
            prometheus, DEMO_FILES, wall_start, time.time(), figures_dir(tmp_path), origin_expr="stoic_breaker_state",
            subject="the demo", origin_text="seconds since the demo's policies were first scraped", keep=_demo_can_feed)
        assert sorted(path.name for path in written) == sorted(figure_name(name) for name in DEMO_FILES)
        assert all(path.stat().st_size > 10_000 for path in written)
    except AssertionError:
        print(output.read_text(errors="replace")[-3000:])
        print(prometheus.logs())
        raise
    finally:
        stop_process(proc)
    assert proc.returncode in (0, -15), output.read_text(errors="replace")[-3000:]
    assert time.monotonic() - started < 60

