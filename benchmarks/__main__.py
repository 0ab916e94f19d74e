"""Run every benchmark script (benchmarks/bench_*.py), each in its own process, one after
another, and end with one table of every target: what was measured, the limit, met or not.

A script runs in a fresh interpreter so that nothing one leaves behind (metrics switched on, a
sink, an event loop policy, warmed or fragmented memory) changes the figures of the next.

``python -m benchmarks [name ...]`` runs the named scripts (``breaker`` or ``bench_breaker``).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import pkgutil
import subprocess
import sys
import tempfile

import benchmarks
from benchmarks._harness import VERDICTS, Verdict, verdict_table


def _run_one(name: str, verdicts_path: str) -> None:
    """In the child: run one script and write its verdicts as JSON."""
    importlib.import_module(f"benchmarks.{name}").main()
    with open(verdicts_path, "w", encoding="utf-8") as out:
        json.dump([dataclasses.asdict(v) for v in VERDICTS], out)


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
            done = subprocess.run([sys.executable, "-m", "benchmarks", "--one", info.name, path], check=False)
            if done.returncode != 0:
                failed.append(info.name)
                continue
            with open(path, encoding="utf-8") as got:
                verdicts.extend(Verdict(**v) for v in json.load(got))
    if verdicts:
        print("\n## Every target of this run\n")
        print(verdict_table(verdicts))
    if failed:
        print(f"\nFAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
