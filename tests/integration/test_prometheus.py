"""The demo's metrics through a real Prometheus, and every dashboard query evaluated against it.

Starts ``python -m examples.demo`` with a fixed metrics port, a Prometheus (Debian package
binary) scraping it every second, waits for the story's failing phase to show up in the
stored series, then checks the metric families the dashboards rely on and evaluates every
panel query of the committed dashboards. Without the prometheus binary it skips, except
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
from prometheus_harness import Prometheus, free_port, require_binary, running_prometheus, stop_process

from dashboards.queries import all_panel_queries, panel_queries

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
LABEL = "inventory-api"
# At --duration 20 the story is scaled by 20/36: healthy for 3.3 s, failing until 8.3 s, slow
# until 13.3 s, recovered after. The test stops it as soon as it has what it needs; its waits
# add up to 70 s at most, so a stuck run fails in bounded time (a normal one takes ~8 s).
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


def test_demo_metrics_reach_prometheus_and_every_dashboard_query_evaluates(
    prometheus: Prometheus, demo: tuple[subprocess.Popen[bytes], Path]
) -> None:
    proc, output = demo
    started = time.monotonic()
    try:
        prometheus.wait_targets_up(timeout=10)
        sel = f'{{stoic_label="{LABEL}"}}'

        # The failing phase happened and was recorded, and the breaker opened at least once.
        failures = prometheus.wait_for(
            f'stoic_breaker_calls_total{{stoic_label="{LABEL}", outcome="failure"}}',
            lambda r: bool(r) and _values(r)[0] > 0, timeout=25, what="failed calls")
        assert _values(failures)[0] > 0
        prometheus.wait_for(
            f'stoic_breaker_transitions_total{{stoic_label="{LABEL}", state="open"}}',
            lambda r: bool(r) and _values(r)[0] >= 1, timeout=10, what="a transition to open")

        # rate() and increase() need two samples of every series, rejections and transitions included.
        prometheus.wait_for(
            f"min(count_over_time(stoic_breaker_rejections_total{sel}[1m]))",
            lambda r: bool(r) and _values(r)[0] >= 3, timeout=10, what="three scrapes since the first rejection")

        successes = prometheus.query(f'stoic_breaker_calls_total{{stoic_label="{LABEL}", outcome="success"}}')
        assert successes and _values(successes)[0] > 0

        # The state gauge: all three states, exactly one of them 1.
        state = prometheus.query(f"stoic_breaker_state{sel}")
        assert sorted(s["metric"]["state"] for s in state) == ["closed", "half_open", "open"]
        assert sorted(_values(state)) == [0.0, 0.0, 1.0]

        rejections = prometheus.query(f"sum(stoic_breaker_rejections_total{sel})")
        assert rejections and _values(rejections)[0] > 0, "an open breaker rejected calls"

        # The histogram has second-scale buckets (the SDK's default ones are made for milliseconds).
        buckets = prometheus.query(f"stoic_breaker_call_duration_seconds_bucket{sel}")
        les = {s["metric"]["le"] for s in buckets}
        assert {"0.005", "0.01", "0.025", "0.25", "0.5", "1.0", "+Inf"} <= les, les
        counts = prometheus.query(f"sum(stoic_breaker_call_duration_seconds_count{sel})")
        assert counts and _values(counts)[0] > 0
        fast = prometheus.query(f'sum(stoic_breaker_call_duration_seconds_bucket{{stoic_label="{LABEL}", le="0.025"}})')
        assert fast and _values(fast)[0] > 0, "healthy calls (a few ms) land at or below 25 ms"

        # Every panel query of every committed dashboard evaluates.
        failed = []
        for query in all_panel_queries():
            assert "$" not in query.promql, query
            try:
                prometheus.query(query.promql)
            except AssertionError as exc:
                failed.append(f"{query}: {exc}")
        assert not failed, "\n".join(failed)

        # The state timeline's single number per breaker is one of its mapped codes.
        (timeline,) = [q for q in panel_queries("stoic-breakers.json") if q.panel == "Breaker state"]
        codes = prometheus.query(timeline.promql)
        assert [s["metric"]["stoic_label"] for s in codes] == [LABEL]
        assert _values(codes)[0] in (0.0, 1.0, 2.0)

        # The breakers dashboard is about this demo: every one of its queries finds data.
        empty = [str(q) for q in panel_queries("stoic-breakers.json") if not prometheus.query(q.promql)]
        assert not empty, f"breaker panels with no data: {empty}"
    except AssertionError:
        print(output.read_text(errors="replace")[-3000:])
        print(prometheus.logs())
        raise
    finally:
        stop_process(proc)
    assert proc.returncode in (0, -15), output.read_text(errors="replace")[-3000:]
    assert time.monotonic() - started < 80
