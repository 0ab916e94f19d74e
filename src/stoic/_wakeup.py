"""Waking an asyncio waiter from wherever the waker runs.

The rate limiter and the bulkhead keep their state under a ``threading.Lock`` and bind to no
event loop; a waiter's future is created lazily on the loop the waiter runs on. The task that
wakes it usually runs on that same loop (then the future is resolved directly, the cheap case),
but may run on another thread's loop, where only ``call_soon_threadsafe`` is safe.
"""

from __future__ import annotations

import asyncio
from asyncio.events import _get_running_loop


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def wake(future: asyncio.Future[None]) -> bool:
    """Resolve ``future`` (a waiter's) soon; False when its loop is closed (the waiter is gone)."""
    loop = future.get_loop()
    if loop is _get_running_loop():
        if not future.done():
            future.set_result(None)
        return True
    try:
        loop.call_soon_threadsafe(_resolve, future)
    except RuntimeError:  # the waiter's loop has been closed: nobody will ever resume it
        return False
    return True
