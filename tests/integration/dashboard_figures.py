"""Draw committed dashboards' panels from a real Prometheus's range queries (matplotlib), for
the integration tests that have a Prometheus scrape real stoic policies (Grafana cannot be
installed here). Used by test_prometheus.py (the demo) and test_fleet_dashboard.py (the fleet).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path

from prometheus_harness import Prometheus

from dashboards.queries import PanelQuery, load, panel_queries

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ROOT / "docs" / "figures"
# What Grafana's $__rate_interval is for the tests' 1 s scrape interval (4 x scrape interval, plus a
# margin): the pictures show rates as Grafana would draw them, so a phase seconds long stays visible
# as such (at 1m, a 20 s story's shedding or outage would smear over the whole picture).
RATE_INTERVAL = "5s"


def figures_dir(tmp_path: Path) -> Path:
    """docs/figures when asked (``STOIC_WRITE_FIGURES=1``, ``make figures``), else a temp dir."""
    return FIGURES if os.environ.get("STOIC_WRITE_FIGURES", "").strip() == "1" else tmp_path / "figures"


def figure_name(dashboard_file: str) -> str:
    """``stoic-breakers.json`` -> ``dashboard-breakers.png``."""
    return f"dashboard-{dashboard_file.removeprefix('stoic-').removesuffix('.json')}.png"


def _legend(template: str, metric: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: metric.get(m.group(1), ""), template).strip() or "value"


def render_figures(prometheus: Prometheus, files: Iterable[str], start: float, end: float, into: Path, *,
                   origin_expr: str, subject: str, origin_text: str, rate_interval: str = RATE_INTERVAL,
                   keep: Callable[[PanelQuery], bool] = lambda query: True) -> list[Path]:
    """One PNG per dashboard file in ``into``: each panel's targets (those ``keep`` accepts) over
    ``start``..``end``, from Prometheus's range queries (``$__rate_interval`` = ``rate_interval``).
    Time 0 is the first sample of ``origin_expr`` (``origin_text`` says what that is on the x
    axis). Returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    into.mkdir(parents=True, exist_ok=True)
    origin = min((float(series["values"][0][0]) for series in prometheus.query_range(origin_expr, start, end)
                  if series["values"]), default=start)
    written = []
    for name in files:
        dashboard = load(name)
        queries = [q for q in panel_queries(name, rate_interval) if keep(q)]
        legends = {(p.get("title", ""), t.get("refId", "")): t.get("legendFormat", "")
                   for p in dashboard["panels"] for t in p.get("targets", [])}
        panels: dict[str, list[PanelQuery]] = {}
        for query in queries:
            panels.setdefault(query.panel, []).append(query)
        columns = 2
        rows = (len(panels) + columns - 1) // columns
        figure, axes = plt.subplots(rows, columns, figsize=(12, 3.0 * rows), squeeze=False)
        for ax, (title, targets) in zip(axes.flat, panels.items(), strict=False):
            drawn = 0
            for query in targets:
                for series in prometheus.query_range(query.promql, start, end):
                    points = [(float(t) - origin, float(v)) for t, v in series["values"]
                              if v not in ("NaN", "+Inf") and float(t) >= origin]
                    if points:
                        xs, ys = zip(*points, strict=True)
                        legend = _legend(legends.get((title, query.ref_id), ""), series["metric"])
                        ax.plot(xs, ys, marker="." if len(xs) < 3 else None, label=legend)
                        drawn += 1
            ax.set_title(title, fontsize=10)
            ax.set_xlabel(origin_text, fontsize=8)
            ax.tick_params(labelsize=8)
            ax.grid(alpha=0.3)
            if drawn:
                ax.legend(fontsize=7, loc="upper left")
        for ax in list(axes.flat)[len(panels):]:
            ax.set_visible(False)
        figure.suptitle(f"{dashboard['title']} ({subject}, scraped by a real Prometheus)", fontsize=12)
        figure.tight_layout()
        path = into / figure_name(name)
        figure.savefig(path, dpi=80)
        plt.close(figure)
        written.append(path)
    return written
