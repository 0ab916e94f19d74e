"""Run every benchmark script (benchmarks/bench_*.py) in one process, one after another, and end
with one table of every target: what was measured, the limit, met or not."""

from __future__ import annotations

import importlib
import pkgutil
import sys

import benchmarks
from benchmarks._harness import VERDICTS, verdict_table


def main(argv: list[str]) -> None:
    wanted = set(argv)
    for info in sorted(pkgutil.iter_modules(benchmarks.__path__), key=lambda m: m.name):
        if not info.name.startswith("bench_"):
            continue
        if wanted and info.name.removeprefix("bench_") not in wanted and info.name not in wanted:
            continue
        module = importlib.import_module(f"benchmarks.{info.name}")
        module.main()
    if VERDICTS:
        print("\n## Every target of this run\n")
        print(verdict_table(VERDICTS))


if __name__ == "__main__":
    main(sys.argv[1:])
