"""Overhead of a hedged call that finishes before the delay (the common case: no hedge starts).

Compared, in one run with rows interleaved round by round, with the same operation under
``asyncio.timeout`` (the yardstick: a timer armed and cancelled around an inline await, which
is what a hedge that never fires has to do at least), run as a plain task (``await
asyncio.create_task(fn())``), and awaited bare. Target (issue 10): a hedge that never fires
costs at most what ``asyncio.timeout`` costs. Every target is a ``benchmarks._harness.verdict``;
the script ends with their table (target, measured, limit, met).
"""

from __future__ import annotations

import asyncio

from stoic import IDEMPOTENT, Attempt, Hedge, RetryBudget, hedge

from ._harness import interleaved, overhead_ratio, print_verdicts, report, verdict

CALLS = 25_000  # per timed run; each row is timed twice a round, 8 rounds, the best kept
TARGET = 1.0  # issue 10: a hedge that never fires costs at most what asyncio.timeout costs


async def _op(attempt: Attempt) -> int:
    return 1


async def _plain() -> int:
    return 1


async def _op_yields() -> int:
    await asyncio.sleep(0)  # one trip through the event loop, as any real I/O takes
    return 1


def main() -> None:
    fixed = Hedge(1.0, label="bench")
    unlimited = Hedge(1.0, budget=RetryBudget.UNLIMITED, label="bench")
    adaptive = Hedge(1.0, quantile=0.95, delay_max=1.0, label="bench")

    async def in_task() -> int:
        return await asyncio.create_task(_plain())

    async def under_timeout() -> int:
        async with asyncio.timeout(1.0):
            return await _plain()

    async def fixed_plain() -> int:
        return await fixed.execute(IDEMPOTENT, _plain)

    async def fixed_attempt() -> int:
        return await fixed.execute(IDEMPOTENT, _op)

    async def unlimited_plain() -> int:
        return await unlimited.execute(IDEMPOTENT, _plain)

    async def adaptive_plain() -> int:
        return await adaptive.execute(IDEMPOTENT, _plain)

    async def one_shot() -> int:
        return await hedge(IDEMPOTENT, _plain, delay=1.0, label="bench")

    results = interleaved([
        ("bare await", _plain, CALLS),
        ("asyncio.timeout + await", under_timeout, CALLS),
        ("asyncio.create_task + await", in_task, CALLS),
        ("stoic Hedge.execute", fixed_plain, CALLS),
        ("stoic Hedge.execute (fn takes attempt)", fixed_attempt, CALLS),
        ("stoic Hedge.execute (unlimited)", unlimited_plain, CALLS),
        ("stoic Hedge.execute (adaptive)", adaptive_plain, CALLS),
        ("stoic hedge()", one_shot, CALLS),
    ], is_async=True)
    report("hedge: a call that finishes before the delay", results, baseline="bare await",
           reference="stoic Hedge.execute")

    async def yields_in_timeout() -> int:
        async with asyncio.timeout(1.0):
            return await _op_yields()

    async def yields_hedged() -> int:
        return await fixed.execute(IDEMPOTENT, _op_yields)

    yielding = interleaved([
        ("bare await", _op_yields, CALLS),
        ("asyncio.timeout + await", yields_in_timeout, CALLS),
        ("stoic Hedge.execute", yields_hedged, CALLS),
    ], is_async=True)
    report("hedge: the operation yields to the loop once", yielding, baseline="bare await",
           reference="stoic Hedge.execute")
    timeout = "asyncio.timeout + await"
    judged = [
        verdict("Hedge.execute (never fires) overhead / asyncio.timeout's", overhead_ratio(
            results, "bare await", "stoic Hedge.execute", timeout), TARGET),
        verdict("Hedge.execute, fn takes attempt, overhead / asyncio.timeout's", overhead_ratio(
            results, "bare await", "stoic Hedge.execute (fn takes attempt)", timeout), TARGET),
        verdict("hedge() overhead / asyncio.timeout's", overhead_ratio(
            results, "bare await", "stoic hedge()", timeout), TARGET),
        verdict("Hedge.execute, op yields once, overhead / asyncio.timeout's", overhead_ratio(
            yielding, "bare await", "stoic Hedge.execute", timeout), TARGET),
    ]
    print_verdicts("targets (issue 10: a hedge that never fires)", judged)

if __name__ == "__main__":
    main()
