"""Timing helpers shared by the benchmark scripts: best-of-N ns per call, printed as ratios."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass


@dataclass
class Result:
    name: str
    ns_per_call: float


def time_sync(fn: Callable[[], object], *, calls: int = 100_000, repeats: int = 5) -> float:
    """Best-of-``repeats`` nanoseconds per call of ``fn`` over ``calls`` calls."""
    best = float("inf")
    for _ in range(repeats):
        gc.collect()
        start = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter_ns() - start) / calls)
    return best


def time_async(make: Callable[[], Awaitable[object]], *, calls: int = 100_000, repeats: int = 5) -> float:
    """Best-of-``repeats`` nanoseconds per awaited ``make()`` over ``calls`` calls, one loop."""

    async def run() -> float:
        best = float("inf")
        for _ in range(repeats):
            gc.collect()
            start = time.perf_counter_ns()
            for _ in range(calls):
                await make()
            best = min(best, (time.perf_counter_ns() - start) / calls)
        return best

    return asyncio.run(run())


def report(title: str, results: list[Result], *, baseline: str | None = None, reference: str | None = None) -> None:
    """Print a table: ns per call, overhead over ``baseline`` (a bare call), and the ratio of
    each row's overhead to ``reference``'s (stoic's row)."""
    base = next((r.ns_per_call for r in results if r.name == baseline), 0.0) if baseline else 0.0
    ref = next((r for r in results if r.name == reference), None) if reference else None
    print(f"\n## {title}")
    print(f"{'':<34}{'ns/call':>10}{'overhead':>10}{'stoic/this':>12}")
    for r in results:
        overhead = r.ns_per_call - base
        ratio = ""
        if ref is not None and r is not ref and overhead > 0:
            ratio = f"{(ref.ns_per_call - base) / overhead:.2f}x"
        print(f"{r.name:<34}{r.ns_per_call:>10.0f}{overhead:>10.0f}{ratio:>12}")


@dataclass
class Verdict:
    """One target of an issue: what was measured against what limit."""

    target: str
    measured: float
    limit: float
    unit: str = "x"

    @property
    def met(self) -> bool:
        return self.measured <= self.limit


VERDICTS: list[Verdict] = []
"""Every verdict of this run, in order; ``python -m benchmarks`` ends with them as one table."""


def verdict(target: str, measured: float, limit: float, unit: str = "x") -> Verdict:
    """Record (and print) whether ``measured`` is within ``limit`` (lower is better)."""
    made = Verdict(target, measured, limit, unit)
    VERDICTS.append(made)
    print(f"  target: {target}: {measured:.3g}{unit} (at most {limit:g}{unit}) {'met' if made.met else 'NOT MET'}")
    return made


def verdict_table(verdicts: list[Verdict]) -> str:
    """The verdicts as one Markdown table: target, measured, limit, met or not."""
    lines = ["| target | measured | limit | met |", "|---|---|---|---|"]
    for v in verdicts:
        met = "yes" if v.met else "**no**"
        lines.append(f"| {v.target} | {v.measured:.3g}{v.unit} | {v.limit:g}{v.unit} | {met} |")
    return "\n".join(lines)
