"""A cancel request swallowed earlier in a task (field report 17's shape), and a clock whose
timers the test fires by hand (a deadline firing at a moment of the test's choosing)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from stoic._clock import TimerHandle
from stoic.testing import VirtualClock


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


async def fail_a_task_group() -> None:
    """Run a ``TaskGroup`` whose child fails while the body waits in ``__aexit__``, and catch its
    group: Python 3.11 and 3.12.1 then leave the current task's ``cancelling()`` one higher (the
    group's request to its parent is never taken back); later versions leave it as it was."""

    async def child() -> None:
        raise ConnectionError("child")

    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(child())
    except* ConnectionError:
        pass


class HandFiredClock(VirtualClock):
    """Keeps the callback of every timer set on it, for the test to run by hand at a moment of
    its choosing (the timer itself never fires)."""

    def __init__(self) -> None:
        super().__init__()
        self.callbacks: list[Callable[[], object]] = []

    def call_at(self, when_ns: int, callback: Callable[[], object]) -> TimerHandle:
        self.callbacks.append(callback)
        return super().call_at(when_ns + 10**18, lambda: None)
