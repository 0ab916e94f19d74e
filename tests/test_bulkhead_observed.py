"""A bulkhead's read-only state as properties, while calls run and wait (issue 9, item 5: the
``limit``, ``in_use`` and ``queued`` properties were read by no test, so dropping ``@property``
survived mutation testing). Seed 000, "Bulkhead"; the API decision: read-only state without an
argument is a property."""

from __future__ import annotations

import asyncio

from stoic import BlockingBulkhead, Bulkhead


async def test_limit_in_use_and_queued_are_properties_that_follow_the_calls() -> None:
    bulkhead = Bulkhead(2, queue_limit=3, label="observed")
    assert (bulkhead.limit, bulkhead.in_use, bulkhead.queued) == (2, 0, 0)
    gate = asyncio.Event()
    tasks = [asyncio.create_task(bulkhead.execute(gate.wait)) for _ in range(4)]
    await asyncio.sleep(0)
    assert (bulkhead.limit, bulkhead.in_use, bulkhead.queued) == (2, 2, 2)
    assert (bulkhead.active_count, bulkhead.queued_count, bulkhead.queue_limit) == (2, 2, 3)
    gate.set()
    await asyncio.gather(*tasks)
    assert (bulkhead.limit, bulkhead.in_use, bulkhead.queued) == (2, 0, 0)


def test_a_blocking_bulkheads_limit_and_in_use_are_properties() -> None:
    bulkhead = BlockingBulkhead(3, label="observed-blocking")
    assert (bulkhead.limit, bulkhead.in_use, bulkhead.queued) == (3, 0, 0)
    with bulkhead:
        assert (bulkhead.limit, bulkhead.in_use, bulkhead.queued) == (3, 1, 0)
    assert bulkhead.in_use == 0
