"""The demo's scripted dependency on its own: phases parsed, followed in time, a clean exit."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from examples.demo.dependency import Phase, Script, format_phases, parse_phases

ROOT = Path(__file__).resolve().parents[1]


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_phases_parse_and_format_round_trip() -> None:
    phases = parse_phases("healthy=6,failing=9,slow=1.5,recovered")
    assert phases == [Phase("healthy", 6.0), Phase("failing", 9.0), Phase("slow", 1.5), Phase("recovered", None)]
    assert format_phases(phases) == "healthy=6,failing=9,slow=1.5,recovered"


def test_script_phase_by_time_since_start_and_repeating() -> None:
    phases = [Phase("healthy", 1.0), Phase("failing", 1.0), Phase("slow", 1.0)]
    once, looping = Script(phases, 0.01, 0.5), Script(phases, 0.01, 0.5, repeat=True)
    for script in (once, looping):
        assert script.phase() == "healthy"
        assert script.respond()[0] == 200
        script.started -= 1.5
        assert script.phase() == "failing"
        assert script.respond() == (503, 0.0)
        script.started -= 1.0
        assert script.phase() == "slow"
        assert script.respond()[1] >= 0.5
        script.started -= 1.0  # 3.5 s in: past the end of the script
    assert once.phase() == "slow"  # stays in the last phase
    assert looping.phase() == "healthy"  # starts over: 3.5 % 3 = 0.5


@pytest.mark.parametrize("bad", ["healthy=1,broken=2", "healthy,failing=1", "healthy=0", "slow=-1"])
def test_phases_refuse_nonsense(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_phases(bad)


@pytest.mark.integration
def test_dependency_follows_its_script_and_exits_when_stdin_closes() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "examples.demo.dependency", "--phases", "healthy=0.6,failing=0.6,slow",
         "--slow-latency", "0.3", "--exit-on-stdin-eof"],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        words = proc.stdout.readline().split()
        assert words[0] == "LISTENING"
        base = f"http://127.0.0.1:{int(words[1])}"
        status, body = _get(f"{base}/work")
        assert (status, json.loads(body)["phase"]) == (200, "healthy")
        time.sleep(0.7)
        status, body = _get(f"{base}/work")
        assert (status, json.loads(body)["phase"]) == (503, "failing")
        time.sleep(0.6)
        started = time.monotonic()
        status, body = _get(f"{base}/work")
        assert (status, json.loads(body)["phase"]) == (200, "slow")
        assert time.monotonic() - started >= 0.3
        assert _get(f"{base}/nope")[0] == 404
        proc.stdin.close()
        assert proc.wait(timeout=5) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
