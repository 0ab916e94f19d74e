"""The traced demo end to end (no Prometheus): the story, the live transitions, the summary,
and the metrics endpoint while it runs."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _post(url: str, body: str) -> tuple[int, str]:
    request = urllib.request.Request(url, data=body.encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.mark.integration
def test_demo_tells_the_whole_story_and_serves_metrics_while_running(tmp_path: Path) -> None:
    port, admin_port = _free_port(), _free_port()
    output = tmp_path / "demo.out"
    # No TTY here: rich prints plain text, at this width; the assertions below expect UTF-8.
    env = {**os.environ, "COLUMNS": "120", "PYTHONIOENCODING": "utf-8"}
    started = time.monotonic()
    with output.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "examples.demo", "--time-scale", "0.25", "--duration", "10.5",
             "--metrics-port", str(port), "--admin-port", str(admin_port)],
            cwd=ROOT, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT, env=env,
        )
        try:
            scraped = ""
            while proc.poll() is None and "stoic_breaker_calls_total{" not in scraped:
                try:
                    status, scraped = _get(f"http://127.0.0.1:{port}/metrics")
                    assert status == 200
                except OSError:
                    pass  # not listening yet
                time.sleep(0.2)
            # The admin endpoint (loopback, no token) serves the breaker's state while it runs.
            admin_status, policies = _get(f"http://127.0.0.1:{admin_port}/policies")
            # docs/demo.md's curl session: force the GET /work breaker open, read it, lift the trip.
            admin = f"http://127.0.0.1:{admin_port}/policies/inventory-api"
            forced = _post(f"{admin}/force-open", '{"key": "GET /work", "actor": "test"}')
            _, one = _get(admin)
            cleared = _post(f"{admin}/clear", '{"key": "GET /work", "actor": "test"}')
            unknown = _post(f"{admin}/force-open", '{"key": "GET /nope"}')
            rc = proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = output.read_text(encoding="utf-8", errors="replace")
    assert rc == 0, text
    assert time.monotonic() - started < 40, "the demo finishes by itself, promptly"
    # The endpoint served the breaker's metrics, with its label, while the demo ran.
    # Keyed by route: the family's label, ":", the key.
    assert re.search(r'stoic_breaker_calls_total\{[^}]*stoic_label="inventory-api:GET /work"', scraped), scraped[-2000:]
    assert "stoic_breaker_state{" in scraped
    assert admin_status == 200 and '"policy":"inventory-api"' in policies and '"forced_open":' in policies, policies
    # The other families are served too: the adaptive bulkhead's limit, the throttle's probability.
    assert '"policy":"inventory-bulkhead","key":"GET /work"' in policies and '"limit":' in policies, policies
    assert '"policy":"inventory-throttle"' in policies and '"probability":' in policies, policies
    assert f"admin       http://127.0.0.1:{admin_port}/policies" in text
    assert forced == (200, '{"policy":"inventory-api","key":"GET /work","forced_open":1}'), forced
    assert '"key":"GET /work","label":"inventory-api:GET /work","kind":"CircuitBreaker","state":"open",' \
           '"forced_open":true' in one, one
    assert cleared == (200, '{"policy":"inventory-api","key":"GET /work","cleared":1}'), cleared
    assert unknown[0] == 404, unknown
    assert "trigger=forced" in text and "control.forced_open" in text and "actor=test" in text, text
    assert "reason=forced" in text and "control.cleared" in text, text
    # The live transitions (from state_changes()), in story order.
    live = re.findall(r"breaker inventory-api:GET /work: (\w+) → (\w+)", text)
    assert live[0] == ("closed", "open"), text
    assert ("open", "half_open") in live and ("half_open", "open") in live, text
    assert live[-1] == ("half_open", "closed"), text
    # The dependency's phases were narrated, and structlog logged the breaker's events.
    for phase in ("healthy", "failing", "slow", "recovered"):
        assert f"dependency is {phase}" in text, text
    assert "breaker.opened" in text and "trigger=failure_rate" in text, text
    assert "breaker.closed" in text and "reason=probes_succeeded" in text, text
    # The summary table.
    assert "Summary: GET /work through the stack (breaker 'inventory-api:GET /work')" in text
    for row in ("calls answered", "successes", "failures", "rejections", "fallbacks", "hedged reads", "retries",
                "time open", "latency p50", "latency p99", "transitions", "closed→open ×", "open→closed ×1",
                "final state",
                "adaptive limit", "throttle"):
        assert row in text, (row, text)
    # The calls went through the transport: a 503 is the last response (HTTP 503), never an exception.
    assert re.search(r"failures\s*│\s*\d+\s+\([^)]*HTTP 503 ×\d", text), text
    assert re.search(r"fallbacks\s*│\s*\d+\s+\([^)]*circuit_open ×\d", text), text
    assert re.search(r"adaptive limit\s*│\s*'inventory-bulkhead:GET /work': 4 at start, lowest [123],", text), text
    # A local refusal is not a permanent failure: the retry honours it or skips it (deadline_skip).
    assert "retry.permanent" not in text, text
    assert re.search(r"final state\s*│\s*closed", text), text
    assert re.search(r"span events\s*│[^│]*breaker\.opened ×\d", text), text
    # Every burst overfills the search bulkhead (no queue): at least the excess is refused each time.
    burst = re.search(r"search bursts\s*│\s*(\d+) bursts of 5 reads at once into 3 slots: refused (\d+)", text)
    assert burst is not None, text
    bursts, refused = int(burst[1]), int(burst[2])
    assert bursts >= 5 and refused >= 2 * bursts, text
    assert re.search(r"search bursts[^┘]*bulkhead_full ×\d", text), text


def test_duration_alone_scales_the_story_to_fit() -> None:
    from examples.demo.app import STORY_SECONDS, Tuning, parse_args
    from examples.demo.dependency import Phase

    args = parse_args(["--duration", str(STORY_SECONDS / 2)])
    assert args.time_scale == 0.5
    phases = Tuning(args.time_scale).phases
    assert [(p.name, p.seconds) for p in phases] == [
        ("healthy", 3.0), ("failing", 4.5), ("slow", 4.5), ("recovered", None)]
    assert parse_args(["--time-scale", "0.5"]).duration == STORY_SECONDS / 2
    looping = Tuning(0.5, repeat=True).phases
    assert looping[-1] == Phase("recovered", 6.0) and sum(p.seconds or 0 for p in looping) == STORY_SECONDS / 2
    serve = parse_args(["--serve"])
    assert (serve.time_scale, serve.metrics_port) == (1.0, None)


@pytest.mark.parametrize("argv", [["--duration", "3"], ["--time-scale", "0.1"], ["--workers", "0"],
                                  ["--serve", "--duration", "12"]])  # --serve runs until Ctrl-C
def test_nonsense_options_are_refused(argv: list[str]) -> None:
    from examples.demo.app import parse_args

    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2


def test_the_summary_says_when_no_retried_call_ended_otherwise() -> None:
    # A run stopped in the healthy phase (Ctrl-C under --serve) has no retry.* end to list: the
    # row says so instead of ending on "ended by: " and nothing.
    import io

    from rich.console import Console

    import stoic
    from examples.demo.app import Demo, SpanTally, parse_args

    def policies() -> tuple[stoic.AdaptiveBulkhead, stoic.AdaptiveThrottle]:
        return (stoic.AdaptiveBulkhead(latency_threshold=0.3, max_concurrent=4, label="a"),
                stoic.AdaptiveThrottle(label="t"))

    console = Console(file=io.StringIO(), width=200)
    demo = Demo(parse_args([]), console)
    tally = SpanTally()
    tally.event_names.update({"retry.attempt_failed": 2, "retry.succeeded": 2})
    console.print(demo.summary("b", "closed", tally, *policies()))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert re.search(r"retries\s*│ 2 attempts retried, 2 calls then succeeded; ended by: nothing else\s*│", text), text
    tally.event_names.update({"retry.exhausted": 3})
    console.file = io.StringIO()
    console.print(demo.summary("b", "closed", tally, *policies()))
    assert "ended by: exhausted ×3" in console.file.getvalue()
