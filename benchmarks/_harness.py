"""Timing helpers shared by the benchmark scripts: best-of-N ns per call, printed as ratios, and
the verdicts (one per target) that ``python -m benchmarks`` ends with as one table.

Smoke mode (env ``STOIC_BENCH_SMOKE=1``, what tests/test_benchmarks_smoke.py runs): every row and
every verdict is still produced and every server still started, but with tiny call counts, so a
broken script fails the test suite instead of rotting. Its figures mean nothing. The timing
helpers here shrink their counts by themselves; a script with its own loops sizes them with
:func:`scaled`.
"""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import math
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

SMOKE: Final = os.environ.get("STOIC_BENCH_SMOKE", "") not in ("", "0")
"""True in smoke mode: run everything, measure nothing worth reading."""

SMOKE_CALLS: Final = 20  # calls per timed run in smoke mode, whatever a script asks for


def scaled(full: int, smoke: int = 1) -> int:
    """``full`` normally, ``smoke`` in smoke mode (a count of calls, rounds, samples...)."""
    return smoke if SMOKE else full


def have(peer: str) -> bool:
    """Whether the peer library ``peer`` (an import name from requirements-bench.txt) is installed.

    A script times a peer's rows only when it is, and records the targets judged against it with
    :func:`skipped` when it is not: the test venv has none of them, and every script must run there.
    """
    return importlib.util.find_spec(peer) is not None


def not_installed(*peers: str) -> str:
    """The reason :func:`skipped` records for a target that needs all of ``peers``: which are missing."""
    return f"{', '.join(peer for peer in peers if not have(peer))} not installed"


@dataclass
class Result:
    name: str
    ns_per_call: float


def time_sync(fn: Callable[[], object], *, calls: int = 100_000, repeats: int = 5) -> float:
    """Best-of-``repeats`` nanoseconds per call of ``fn`` over ``calls`` calls."""
    if SMOKE:
        calls, repeats = min(calls, SMOKE_CALLS), 1
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
    if SMOKE:
        calls, repeats = min(calls, SMOKE_CALLS), 1

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


def interleaved(rows: list[tuple[str, Callable[[], object], int]], *, is_async: bool, rounds: int = 8,
                repeats: int = 2) -> list[Result]:
    """Time every ``(name, fn, calls)`` row round by round (each round times every row once, in
    turn), keeping each row's best: a burst of load on a shared machine hits every row alike."""
    best = {name: float("inf") for name, _, _ in rows}
    for _ in range(scaled(rounds)):
        for name, fn, calls in rows:
            if is_async:
                ns = time_async(fn, calls=calls, repeats=repeats)  # type: ignore[arg-type]
            else:
                ns = time_sync(fn, calls=calls, repeats=repeats)
            best[name] = min(best[name], ns)
    return [Result(name, best[name]) for name, _, _ in rows]


def overhead_ratio(results: list[Result], baseline: str, mine: str, theirs: str) -> float:
    """``mine``'s overhead over ``baseline`` divided by ``theirs``' (lower is better)."""
    by = {r.name: r.ns_per_call for r in results}
    return (by[mine] - by[baseline]) / max(1e-9, by[theirs] - by[baseline])


@dataclass
class Verdict:
    """One target of an issue: what was measured (lower is better) against what limit.

    ``unit``: ``"x"`` (a ratio), ``"%"``, or a unit of measure (``"ns"``, ``"µs"``, ``"B"``,
    ``"MB"``...). ``skipped``: why it was not measured (a peer library not installed, a server
    binary missing); a skipped target is never met. ``bench``: the script that judged it (set by
    ``python -m benchmarks``).
    """

    target: str
    measured: float
    limit: float
    unit: str = "x"
    skipped: str = ""
    bench: str = ""

    @property
    def met(self) -> bool:
        return not self.skipped and self.measured <= self.limit

    def shown(self, value: float) -> str:
        number = f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
        unit = self.unit.strip()
        return f"{number}{unit}" if unit in ("x", "%", "") else f"{number} {unit}"

    @property
    def measured_text(self) -> str:
        return f"not measured: {self.skipped}" if self.skipped else self.shown(self.measured)

    @property
    def met_text(self) -> str:
        return "skipped" if self.skipped else "yes" if self.met else "NO"


VERDICTS: list[Verdict] = []
"""Every verdict of this run, in order; ``python -m benchmarks`` ends with them as one table."""


def verdict(target: str, measured: float, limit: float, unit: str = "x") -> Verdict:
    """Record (and print) whether ``measured`` is within ``limit`` (lower is better)."""
    made = Verdict(target, float(measured), float(limit), unit)
    VERDICTS.append(made)
    print(f"  target: {target}: {made.measured_text} (at most {made.shown(made.limit)}) "
          f"{'met' if made.met else 'NOT MET'}")
    return made


def skipped(target: str, limit: float, unit: str = "x", *, reason: str) -> Verdict:
    """Record a target this run could not measure, and why (it shows in the final table)."""
    made = Verdict(target, math.nan, float(limit), unit, skipped=reason)
    VERDICTS.append(made)
    print(f"  target: {target}: not measured ({reason})")
    return made


def verdict_table(verdicts: list[Verdict]) -> str:
    """The verdicts as one Markdown table: target, measured, limit, met or not."""
    lines = ["| benchmark | target | measured | limit | met |", "|---|---|---|---|---|"]
    for v in verdicts:
        met = {"NO": "**no**"}.get(v.met_text, v.met_text)
        lines.append(f"| {v.bench} | {v.target} | {v.measured_text} | at most {v.shown(v.limit)} | {met} |")
    return "\n".join(lines)


def print_verdicts(title: str, verdicts: list[Verdict]) -> None:
    """A script's own closing table (the same verdicts the final table shows)."""
    print(f"\n## {title}")
    width = max((len(v.target) for v in verdicts), default=10) + 2
    print(f"{'target':<{width}}{'measured':>14}{'limit':>14}  met")
    for v in verdicts:
        print(f"{v.target:<{width}}{v.measured_text:>14}{'<= ' + v.shown(v.limit):>14}  {v.met_text}")
