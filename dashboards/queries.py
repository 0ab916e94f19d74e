"""Read the PromQL out of a committed dashboard, ready to send to Prometheus's API.

Grafana fills in variables before it queries; so does :func:`panel_queries`: each query
variable becomes its "All" value (``.*``) and ``$__rate_interval`` / ``$__interval`` a fixed
range. The tests use it to evaluate every panel query against a real Prometheus.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# The demo runs every policy kind but the fleet-wide ones (they need a Redis): the fleet dashboard
# and the fleet panels of the overview are evaluated against shared policies on a real Redis instead.
DEMO_FILES = ("stoic-overview.json", "stoic-breakers.json", "stoic-ratelimiters.json", "stoic-bulkheads.json",
              "stoic-throttles.json", "stoic-hedges.json", "stoic-retries.json")
FLEET_FILES = ("stoic-fleet.json",)
FILES = DEMO_FILES + FLEET_FILES

_VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)")


@dataclass(frozen=True)
class PanelQuery:
    dashboard: str
    panel: str
    ref_id: str
    expr: str  # as committed, with Grafana variables
    promql: str  # variables substituted: what Prometheus evaluates

    def __str__(self) -> str:
        return f"{self.dashboard} / {self.panel} / {self.ref_id}"

    @property
    def needs_fleet(self) -> bool:
        """True for a query of the fleet-wide policies' own metrics (``stoic_fleet_*``): data only
        where a shared policy uses a store."""
        return "stoic_fleet_" in self.expr


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((HERE / name).read_text(encoding="utf-8"))
    return data


def _panels(panels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    flat: list[dict[str, Any]] = []
    for panel in panels:
        flat.append(panel)
        flat.extend(_panels(panel.get("panels", [])))  # collapsed rows hold their panels
    return flat


def substitute(expr: str, variables: dict[str, str], rate_interval: str = "1m") -> str:
    """Replace ``$name`` / ``${name}`` as Grafana would with "All" selected; KeyError if unknown."""
    values = {"__rate_interval": rate_interval, "__interval": rate_interval, "__range": rate_interval, **variables}

    def replace(match: re.Match[str]) -> str:
        return values[match.group(1) or match.group(2)]

    return _VARIABLE.sub(replace, expr)


def panel_queries(name: str, rate_interval: str = "1m") -> list[PanelQuery]:
    """Every target of every panel of dashboard file ``name``, in layout order."""
    dashboard = load(name)
    variables = {
        v["name"]: v.get("allValue") or ".*"
        for v in dashboard.get("templating", {}).get("list", [])
        if v.get("type") == "query"
    }
    queries = []
    for panel in _panels(dashboard.get("panels", [])):
        for target in panel.get("targets", []):
            expr = target["expr"]
            queries.append(PanelQuery(dashboard["title"], panel.get("title", ""), target.get("refId", ""), expr,
                                      substitute(expr, variables, rate_interval)))
    return queries


def all_panel_queries(rate_interval: str = "1m") -> list[PanelQuery]:
    return [q for name in FILES for q in panel_queries(name, rate_interval)]
