"""Run every benchmark script (benchmarks/bench_*.py), each in its own process, one after
another, and end with one table of every target: what was measured, the limit, met or not.

A script runs in a fresh interpreter so that nothing one leaves behind (metrics switched on, a
sink, an event loop policy, warmed or fragmented memory) changes the figures of the next.

``python -m benchmarks [name ...]`` runs the named scripts (``breaker`` or ``bench_breaker``).
With ``STOIC_BENCH_SMOKE=1`` every script runs with tiny counts (see benchmarks._harness) and
may take at most ``SMOKE_TIMEOUT`` seconds: the test suite runs that to keep the scripts alive.
A script that fails (or times out) is named at the end and the exit status is 1; one that dies
importing a peer library (requirements-bench.txt) that is not installed is named with it.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import pkgutil
import re
import subprocess
import sys
import tempfile
import time

import benchmarks
from benchmarks._harness import SMOKE, VERDICTS, Verdict, verdict_table

SMOKE_TIMEOUT = 60.0  # seconds one script may take in smoke mode


def _peers() -> set[str]:
    """The import names of the peer libraries in requirements-bench.txt."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "requirements-bench.txt")
    try:
        with open(path, encoding="utf-8") as listed:
            lines = [line.split("#")[0].strip() for line in listed]
    except OSError:
        return set()
    return {line.split("==")[0].split(">=")[0].strip().lower().replace("-", "_") for line in lines if line}


def _run_one(name: str, verdicts_path: str) -> None:
    """In the child: run one script and write its verdicts as JSON."""
    importlib.import_module(f"benchmarks.{name}").main()
    with open(verdicts_path, "w", encoding="utf-8") as out:
        json.dump([dataclasses.asdict(v) for v in VERDICTS], out)


def _missing_peer(stderr: str) -> str | None:
    """The peer library a failed script (or a process it started) could not import, if any."""
    peers = _peers()
    for found in re.finditer(r"ModuleNotFoundError: No module named '([^']+)'", stderr):
        if found.group(1).split(".")[0] in peers:
            return found.group(1)
    return None


def main(argv: list[str]) -> int:
    if argv[:1] == ["--one"]:
        _run_one(argv[1], argv[2])
        return 0
    wanted = set(argv)
    verdicts: list[Verdict] = []
    failed: list[str] = []
    for info in sorted(pkgutil.iter_modules(benchmarks.__path__), key=lambda m: m.name):
        if not info.name.startswith("bench_"):
            continue
        if wanted and info.name.removeprefix("bench_") not in wanted and info.name not in wanted:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "verdicts.json")
            command = [sys.executable, "-m", "benchmarks", "--one", info.name, path]
            started = time.monotonic()
            try:  # (stderr read to tell a missing peer library from any other failure)
                done = subprocess.run(command, check=False, timeout=SMOKE_TIMEOUT if SMOKE else None,
                                      stderr=subprocess.PIPE, text=True)
            except subprocess.TimeoutExpired as late:
                sys.stderr.write(late.stderr.decode(errors="replace") if isinstance(late.stderr, bytes) else "")
                failed.append(f"{info.name} (over {SMOKE_TIMEOUT:.0f} s in smoke mode)")
                continue
            sys.stderr.write(done.stderr)
            sys.stdout.flush()
            print(f"({info.name}: {time.monotonic() - started:.1f} s)", flush=True)
            peer = _missing_peer(done.stderr) if done.returncode != 0 else None
            if peer is not None:
                failed.append(f"{info.name} (needs the peer {peer!r}: it must skip that peer's rows when it "
                              "is missing)")
                continue
            if done.returncode != 0:
                failed.append(info.name)
                continue
            with open(path, encoding="utf-8") as got:
                verdicts.extend(dataclasses.replace(Verdict(**v), bench=info.name.removeprefix("bench_"))
                                for v in json.load(got))
    print("\n## Every target of this run\n")
    if SMOKE:
        print("(smoke mode: tiny counts, the figures mean nothing)\n")
    print(verdict_table(verdicts))
    if failed:
        print("", file=sys.stderr)
        for name in failed:
            print(f"FAILED: {name}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
