"""Adaptive bulkheads and the adaptive throttle: success-path overhead beside the fixed bulkhead.

Run: ``python -m benchmarks adaptive`` (``STOIC_BENCH_SMOKE=1``: a few calls per row, to check
that the script runs; its figures mean nothing).

Overhead is ns per call above a bare call, measured in one process on one loop, rows timed
round by round (interleaved, best sample kept). Every policy is sized so it never waits or
sheds, so only the bookkeeping of a successful call is measured: for the adaptive bulkheads
that is the fixed bulkhead's admission and release plus a countdown, and on the calls that are
timed (one in up to 64 at this rate: docs/adaptive.md, "Which calls are timed") two clock
reads, a random draw and the sample (skipped by AIMD where it cannot change the limit;
accumulated into the open window by Gradient2). Target (issue 12, item 10): each adaptive
bulkhead at most 1.5x the fixed ``Bulkhead``'s overhead.

The row "bare await + 2 clock reads" measures what the two readings of the clock cost by
themselves: the fixed bulkhead's overhead plus that is what a bulkhead that timed every call
would start from (printed beside the verdicts), and why the adaptive ones time only a sample
of the calls at high rates.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from benchmarks._harness import SMOKE, Result, report, verdict
from benchmarks.bench_limits import CALLS, _op, _rows
from stoic import AdaptiveBulkhead, AdaptiveThrottle, Bulkhead, GradientBulkhead

TARGET = 1.5


def bench() -> list[Result]:
    calls = 200 if SMOKE else CALLS
    fixed = Bulkhead(10, label="bench")
    aimd = AdaptiveBulkhead(latency_threshold=10.0, max_concurrent=10, label="bench")
    aimd_q = AdaptiveBulkhead(latency_threshold=10.0, max_concurrent=10, latency_quantile=0.9, label="bench")
    gradient = GradientBulkhead(max_concurrent=10, label="bench")
    throttle = AdaptiveThrottle(label="bench")
    semaphore = asyncio.Semaphore(10)
    now_ns = time.monotonic_ns  # what the adaptive bulkheads read on the system clock

    async def bare() -> int:
        return await _op()

    async def clocked() -> int:
        start = now_ns()
        result = await _op()
        _ = now_ns() - start
        return result

    async def with_semaphore() -> int:
        async with semaphore:
            return await _op()

    def wrapped(policy: Bulkhead | AdaptiveBulkhead | GradientBulkhead | AdaptiveThrottle) -> Any:
        # Every row is a coroutine function awaiting the operation, as ``bare`` is: a lambda
        # returning ``execute(_op)`` costs ~45 ns less than that wrapper, which the baseline
        # would then subtract from stoic's overheads (bench_limits' rows are written so too).
        async def row() -> int:
            return await policy.execute(_op)

        return row

    rows = [
        ("bare await", bare, calls),
        ("bare await + 2 clock reads", clocked, calls),
        ("asyncio.Semaphore async with", with_semaphore, calls),
        ("stoic Bulkhead.execute", wrapped(fixed), calls),
        ("stoic AdaptiveBulkhead.execute", wrapped(aimd), calls),
        ("stoic AdaptiveBulkhead (p90)", wrapped(aimd_q), calls),
        ("stoic GradientBulkhead.execute", wrapped(gradient), calls),
        ("stoic AdaptiveThrottle.execute", wrapped(throttle), calls),
    ]
    return _rows(rows, is_async=True)


def main() -> None:
    results = bench()
    title = "adaptive bulkheads and throttle, asyncio (ns per call)"
    report(title + (" [smoke run: figures mean nothing]" if SMOKE else ""), results, baseline="bare await",
           reference="stoic Bulkhead.execute")
    by = {r.name: r.ns_per_call for r in results}
    base = by["bare await"]
    # Guarded: in a smoke run (or a very noisy one) an overhead can come out at or below zero.
    fixed = max(by["stoic Bulkhead.execute"] - base, 1e-9)
    clocks = by["bare await + 2 clock reads"] - base
    print("\noverhead relative to the fixed Bulkhead:")
    for name in ("stoic AdaptiveBulkhead (p90)", "stoic AdaptiveThrottle.execute", "asyncio.Semaphore async with"):
        print(f"  {name:<34}{(by[name] - base) / fixed:>6.2f}x")
    print(f"  {'Bulkhead + 2 clock reads':<34}{(fixed + clocks) / fixed:>6.2f}x")
    for name in ("stoic AdaptiveBulkhead.execute", "stoic GradientBulkhead.execute"):
        verdict(f"{name.removeprefix('stoic ')} overhead / Bulkhead.execute overhead", (by[name] - base) / fixed,
                TARGET)


if __name__ == "__main__":
    main()
