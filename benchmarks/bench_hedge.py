"""Overhead of a hedged call that finishes before the delay (the common case: no hedge starts).

Compared, in one run with rows interleaved round by round, with the same operation under
``asyncio.timeout`` (the yardstick: a timer armed and cancelled around an inline await, which
is what a hedge that never fires has to do at least), run as a plain task (``await
asyncio.create_task(fn())``), and awaited bare. Target (issue 10): a hedge that never fires
costs at most what ``asyncio.timeout`` costs. Ends with a table: target, measured, met.
"""

from __future__ import annotations

import asyncio

from stoic import IDEMPOTENT, Attempt, Hedge, RetryBudget, hedge

from ._harness import report
from .bench_limits import _ratio, _rows, target_table

CALLS = 50_000


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

    results = _rows([
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

    yielding = _rows([
        ("bare await", _op_yields, CALLS),
        ("asyncio.timeout + await", yields_in_timeout, CALLS),
        ("stoic Hedge.execute", yields_hedged, CALLS),
    ], is_async=True)
    report("hedge: the operation yields to the loop once", yielding, baseline="bare await",
           reference="stoic Hedge.execute")
    timeout = "asyncio.timeout + await"
    target_table([
        ("Hedge.execute (never fires) / asyncio.timeout", 1.0, _ratio(results, "bare await", "stoic Hedge.execute",
                                                                      timeout)),
        ("Hedge.execute, fn takes attempt / asyncio.timeout", 1.0,
         _ratio(results, "bare await", "stoic Hedge.execute (fn takes attempt)", timeout)),
        ("hedge() / asyncio.timeout", 1.0, _ratio(results, "bare await", "stoic hedge()", timeout)),
        ("Hedge.execute, op yields once / asyncio.timeout", 1.0,
         _ratio(yielding, "bare await", "stoic Hedge.execute", timeout)),
    ])


if __name__ == "__main__":
    main()
