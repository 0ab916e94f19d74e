"""The adaptive-concurrency figure (examples/adaptive_concurrency.py) keeps telling the story
docs/adaptive.md tells."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python -m pytest` has it; a bare `pytest` may not
    sys.path.insert(0, str(ROOT))

from examples import adaptive_concurrency as example  # noqa: E402


@pytest.fixture(scope="module")
def runs() -> dict[str, example.Run]:
    return {name: example.simulate(name) for name in example.CONTROLLERS}


@pytest.fixture(scope="module")
def rows(runs: dict[str, example.Run]) -> dict[str, example.Row]:
    return {name: example.summarize(run) for name, run in runs.items()}


@pytest.mark.parametrize("name", ["AIMD", "AIMD p90", "Gradient2"])
def test_adaptive_bulkheads_cut_p99_at_similar_goodput(rows: dict[str, example.Row], name: str) -> None:
    fixed, adaptive = rows["fixed"], rows[name]
    assert adaptive.goodput >= 0.97 * fixed.goodput
    assert adaptive.p99_ms < 0.85 * fixed.p99_ms
    assert adaptive.p50_ms < fixed.p50_ms


@pytest.mark.parametrize("name", ["AIMD", "AIMD p90", "Gradient2"])
def test_adaptive_limits_follow_the_capacity_down_and_back_up(runs: dict[str, example.Run],
                                                             rows: dict[str, example.Row], name: str) -> None:
    limits = runs[name].limits

    def mean(low: float, high: float) -> float:
        values = [v for t, v in limits if low <= t < high]
        return sum(values) / len(values)

    healthy, degraded = mean(10, 20), mean(30, 40)
    assert degraded < healthy * 0.8
    assert mean(50, 60) > degraded * 1.3  # recovered after the capacity returned
    assert rows[name].recovered_goodput >= 0.9 * example.HEALTHY / example.BASE


def test_the_fixed_bulkhead_never_moves_and_the_aimd_ones_beat_gradient2_here(rows: dict[str, example.Row],
                                                                             runs: dict[str, example.Run]) -> None:
    assert {v for _, v in runs["fixed"].limits} == {40.0}
    assert rows["AIMD"].p99_ms < rows["Gradient2"].p99_ms  # a tuned threshold beats tolerance 1.5


def test_the_throttle_alone_is_no_concurrency_limit(rows: dict[str, example.Row]) -> None:
    # It reacts to failures (timeouts), not latency: against a capacity knee it lets work pile up.
    throttle = rows["throttle"]
    assert throttle.timed_out > 0.2 and throttle.goodput < rows["fixed"].goodput
