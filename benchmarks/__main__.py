"""Run every benchmark script (benchmarks/bench_*.py) in one process, one after another."""

from __future__ import annotations

import importlib
import pkgutil
import sys

import benchmarks


def main(argv: list[str]) -> None:
    wanted = set(argv)
    for info in sorted(pkgutil.iter_modules(benchmarks.__path__), key=lambda m: m.name):
        if not info.name.startswith("bench_"):
            continue
        if wanted and info.name.removeprefix("bench_") not in wanted and info.name not in wanted:
            continue
        module = importlib.import_module(f"benchmarks.{info.name}")
        module.main()


if __name__ == "__main__":
    main(sys.argv[1:])
