"""Overhead of a hedged call that finishes before the delay (the common case: no hedge starts).

Compared with the same operation run as a plain task (``await asyncio.create_task(fn())``, the
least any policy that can run a second copy beside the first must pay) and with a bare
``await fn()``. Target: hedge at most 2x the plain task.
"""

from __future__ import annotations

import asyncio

from stoic import IDEMPOTENT, Attempt, Hedge, RetryBudget, hedge

from ._harness import Result, report, time_async

CALLS = 50_000


async def _op(attempt: Attempt) -> int:
    return 1


async def _plain() -> int:
    return 1


async def _op_yields(attempt: Attempt) -> int:
    await asyncio.sleep(0)  # one trip through the event loop, as any real I/O takes
    return 1


async def _plain_yields() -> int:
    await asyncio.sleep(0)
    return 1


def main() -> None:
    fixed = Hedge(1.0, label="h")
    unlimited = Hedge(1.0, budget=RetryBudget.UNLIMITED, label="h")
    adaptive = Hedge(1.0, quantile=0.95, delay_max=1.0, label="h")

    async def in_task() -> int:
        return await asyncio.create_task(_plain())

    async def one_shot() -> int:
        return await hedge(IDEMPOTENT, _op, delay=1.0, label="h")

    results = [
        Result("bare await", time_async(_plain, calls=CALLS)),
        Result("asyncio.create_task + await", time_async(in_task, calls=CALLS)),
        Result("stoic Hedge.execute", time_async(lambda: fixed.execute(IDEMPOTENT, _op), calls=CALLS)),
        Result("stoic Hedge.execute (unlimited)", time_async(lambda: unlimited.execute(IDEMPOTENT, _op), calls=CALLS)),
        Result("stoic Hedge.execute (adaptive)", time_async(lambda: adaptive.execute(IDEMPOTENT, _op), calls=CALLS)),
        Result("stoic hedge()", time_async(one_shot, calls=CALLS)),
    ]
    report("hedge: a call that finishes before the delay", results, baseline="bare await",
           reference="stoic Hedge.execute")
    task = next(r.ns_per_call for r in results if r.name == "asyncio.create_task + await")
    for r in results[2:]:
        print(f"{r.name:<34}{r.ns_per_call / task:>9.2f}x the plain task (target <= 2x)")

    async def in_task_yields() -> int:
        return await asyncio.create_task(_plain_yields())

    yielding = [
        Result("bare await", time_async(_plain_yields, calls=CALLS)),
        Result("asyncio.create_task + await", time_async(in_task_yields, calls=CALLS)),
        Result("stoic Hedge.execute", time_async(lambda: fixed.execute(IDEMPOTENT, _op_yields), calls=CALLS)),
    ]
    report("hedge: the operation yields to the loop once", yielding, baseline="bare await",
           reference="stoic Hedge.execute")
    task = yielding[1].ns_per_call
    print(f"{'stoic Hedge.execute':<34}{yielding[2].ns_per_call / task:>9.2f}x the plain task (target <= 2x)")


if __name__ == "__main__":
    main()
