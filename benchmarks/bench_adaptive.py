"""Adaptive bulkheads and the adaptive throttle: success-path overhead beside the fixed bulkhead.

Run: ``python -m benchmarks adaptive``.

Overhead is ns per call above a bare call, measured in one process on one loop, rows timed
round by round (interleaved, best sample kept). Every policy is sized so it never waits or
sheds, so only the bookkeeping of a successful call is measured: for the adaptive bulkheads
that is two clock reads and one sample fed to the limit algorithm. Target: each adaptive
bulkhead at most 1.5x the fixed ``Bulkhead``'s overhead.
"""

from __future__ import annotations

import asyncio

from benchmarks._harness import Result, report, verdict
from benchmarks.bench_limits import CALLS, _op, _rows
from stoic import AdaptiveBulkhead, AdaptiveThrottle, Bulkhead, GradientBulkhead

TARGET = 1.5


def bench() -> list[Result]:
    fixed = Bulkhead(10, label="bench")
    aimd = AdaptiveBulkhead(latency_threshold=10.0, max_concurrent=10, label="bench")
    aimd_q = AdaptiveBulkhead(latency_threshold=10.0, max_concurrent=10, latency_quantile=0.9, label="bench")
    gradient = GradientBulkhead(max_concurrent=10, label="bench")
    throttle = AdaptiveThrottle(label="bench")
    semaphore = asyncio.Semaphore(10)

    async def bare() -> int:
        return await _op()

    async def with_semaphore() -> int:
        async with semaphore:
            return await _op()

    rows = [
        ("bare await", bare, CALLS),
        ("asyncio.Semaphore async with", with_semaphore, CALLS),
        ("stoic Bulkhead.execute", lambda: fixed.execute(_op), CALLS),
        ("stoic AdaptiveBulkhead.execute", lambda: aimd.execute(_op), CALLS),
        ("stoic AdaptiveBulkhead (p90)", lambda: aimd_q.execute(_op), CALLS),
        ("stoic GradientBulkhead.execute", lambda: gradient.execute(_op), CALLS),
        ("stoic AdaptiveThrottle.execute", lambda: throttle.execute(_op), CALLS),
    ]
    return _rows(rows, is_async=True)


def main() -> None:
    results = bench()
    report("adaptive bulkheads and throttle, asyncio (ns per call)", results, baseline="bare await",
           reference="stoic Bulkhead.execute")
    by = {r.name: r.ns_per_call for r in results}
    base = by["bare await"]
    fixed = by["stoic Bulkhead.execute"] - base
    print("\noverhead relative to the fixed Bulkhead:")
    for name in ("stoic AdaptiveBulkhead (p90)", "stoic AdaptiveThrottle.execute", "asyncio.Semaphore async with"):
        print(f"  {name:<34}{(by[name] - base) / fixed:>6.2f}x")
    for name in ("stoic AdaptiveBulkhead.execute", "stoic GradientBulkhead.execute"):
        verdict(f"{name.removeprefix('stoic ')} overhead / Bulkhead.execute overhead", (by[name] - base) / fixed,
                TARGET)


if __name__ == "__main__":
    main()
