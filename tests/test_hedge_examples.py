"""The hedge and jitter figures (examples/) keep telling the story the docs tell."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python -m pytest` has it; a bare `pytest` may not
    sys.path.insert(0, str(ROOT))

from examples import hedge_tail_latency, jitter_figure  # noqa: E402


@pytest.fixture(scope="module")
def table() -> dict[str, hedge_tail_latency.Row]:
    return {row.name.split(" (")[0]: row for row in hedge_tail_latency.tail_latency_table()}


def test_hedging_cuts_the_tail_for_about_five_percent_more_calls(table: dict[str, hedge_tail_latency.Row]) -> None:
    plain, fixed = table["no policy"], table["fixed hedge"]
    assert plain.backend_calls == 100
    assert plain.p99_ms == pytest.approx(600, abs=1) and plain.max_ms == pytest.approx(600, abs=1)
    assert fixed.p99_ms < plain.p99_ms / 5  # the stalls now cost the delay plus one normal call
    assert 70 <= fixed.p99_ms <= 75 and fixed.max_ms <= 75
    assert fixed.backend_calls == 105  # exactly the five stalled requests were hedged
    assert fixed.p50_ms == pytest.approx(plain.p50_ms)  # a fast call never starts a hedge


def test_the_adaptive_hedge_trades_a_few_more_calls_for_a_shorter_tail(
    table: dict[str, hedge_tail_latency.Row],
) -> None:
    fixed, adaptive = table["fixed hedge"], table["adaptive hedge"]
    assert adaptive.delay_ms is not None and 23 <= adaptive.delay_ms <= 27  # ~p90: the slow end of 20-25 ms
    assert adaptive.p99_ms < fixed.p99_ms - 15
    assert 105 < adaptive.backend_calls <= 112  # the stalls plus ~5% of normal calls
    assert adaptive.p50_ms == pytest.approx(table["no policy"].p50_ms)


def test_the_table_is_deterministic(table: dict[str, hedge_tail_latency.Row]) -> None:
    again = {row.name.split(" (")[0]: row for row in hedge_tail_latency.tail_latency_table()}
    assert again == table
    assert "backend calls" in hedge_tail_latency.format_table(list(table.values()))


def test_jitter_peaks_fall_from_none_to_half_to_full() -> None:
    result = jitter_figure.strategies()
    assert [s.name for s in result] == ["no jitter", "half jitter", "full jitter"]
    peaks = [s.peak for s in result]
    assert peaks[0] == 200  # lockstep: every client at once
    assert peaks[0] > peaks[1] > peaks[2]
    assert jitter_figure.peaks_fall(result)
    assert all(len(s.arrivals_us) == 600 for s in result)
    assert result[0].arrivals_us[0] == 200_000 and result[0].arrivals_us[-1] == 1_400_000
    assert [s.peak for s in jitter_figure.strategies()] == peaks  # seeded: the same every run


def test_busiest_window_is_exact_at_the_edges() -> None:
    assert jitter_figure.busiest_window([0, 24_999, 25_000, 49_999]) == 2
    assert jitter_figure.busiest_window([0, 1, 2]) == 3
    assert jitter_figure.busiest_window([]) == 0


def test_the_figure_is_drawn_only_when_the_peaks_fall(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib")
    target = tmp_path / "jitter.png"
    assert jitter_figure.main([str(target)]) == 0
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    refused = tmp_path / "refused.png"
    monkeypatch.setattr(jitter_figure, "STRATEGIES", (("full jitter", 1.0), ("no jitter", 0.0)))
    assert jitter_figure.main([str(refused)]) == 1
    assert not refused.exists()
