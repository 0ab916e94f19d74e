"""A cancel request swallowed earlier in a task (field report 17's shape)."""

from __future__ import annotations

import asyncio


async def swallow_a_cancel() -> None:
    """Leave the current task's ``cancelling()`` count at one more, with nothing cancelling it: a
    request delivered and caught without ``uncancel()``, as a 3.11 ``TaskGroup`` or a careless
    library does."""
    task = asyncio.current_task()
    assert task is not None
    before = task.cancelling()
    task.cancel()
    try:
        await asyncio.sleep(0)
    except asyncio.CancelledError:
        pass
    assert task.cancelling() == before + 1
