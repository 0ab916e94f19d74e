"""The benchmarks cannot rot: every script under benchmarks/ runs in smoke mode (tiny counts, every
row and verdict still produced, servers still started) and the run ends with the table of every
target. A constructor change that breaks a benchmark (as a required ``label`` once broke
bench_http) fails here, not months later in ``make bench``.

The peer libraries of requirements-bench.txt are not installed in the test venv (CI installs only
requirements-dev.txt): every script leaves out a missing peer's rows and records the targets
judged against it as not measured (``benchmarks._harness.skipped``), while its stoic rows still
run. So a script that dies for lack of a peer is a failure like any other, and the run passes with
or without the peers.
"""

from __future__ import annotations

import importlib.util
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.__main__ import _peers

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent


def test_every_benchmark_script_runs_in_smoke_mode_and_the_run_ends_with_its_table():
    scripts = sorted(m.name for m in pkgutil.iter_modules([str(ROOT / "benchmarks")]) if m.name.startswith("bench_"))
    assert scripts, "no benchmark script found"
    env = {**os.environ, "STOIC_BENCH_SMOKE": "1"}
    env.pop("STOIC_BENCH_CALLS", None)
    done = subprocess.run([sys.executable, "-m", "benchmarks"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=110, check=False)
    failed = [line.removeprefix("FAILED: ") for line in done.stderr.splitlines() if line.startswith("FAILED: ")]
    assert not failed, "\n".join(failed) + "\n" + done.stderr[-4000:]
    assert done.returncode == 0, done.stderr[-4000:]
    out = done.stdout
    for script in scripts:  # each ran to its end ("(bench_x: 1.2 s)" is printed after a script exits)
        assert f"({script}: " in out, f"{script} did not run"
    table = out[out.index("## Every target of this run"):]
    assert "| benchmark | target | measured | limit | met |" in table
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| benchmark")]
    assert rows, "the final table has no target"
    measured = [row for row in rows if not row.endswith("| skipped |")]
    for script in scripts:  # stoic's own rows run whatever peers are missing: each script judges some target
        name = script.removeprefix("bench_")
        assert any(row.startswith(f"| {name} |") for row in measured), f"{script} measured no target"
    # A target is skipped exactly when a peer it needs is missing, and says which (or "no peer").
    missing = sorted(peer for peer in _peers() if importlib.util.find_spec(peer) is None)
    skipped = [row for row in rows if row.endswith("| skipped |")]
    if not missing:
        assert not skipped, "every peer is installed, yet targets were skipped:\n" + "\n".join(skipped)
    else:
        assert skipped, f"peers {missing} are missing, yet no target was recorded as not measured"
        for row in skipped:
            reason = row.split(" | ")[2]
            assert reason.startswith("not measured: "), row
            assert "no peer installed" in reason or any(peer in reason for peer in missing), row
