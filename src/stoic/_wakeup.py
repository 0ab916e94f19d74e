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


_COMPLETED: list[asyncio.Future[None]] = []  # made once, on the first loop that asks


def completed() -> asyncio.Future[None]:
    """An already-completed future (result ``None``) for a step that finished at once: ``await``
    reads it without suspending and without a coroutine of its own. A completed future is never
    scheduled, so the one made on an earlier event loop serves any later loop too, when it is
    only awaited (``async with`` awaits ``__aexit__``'s result). Never return it where a caller
    may hand it to ``gather``/``ensure_future``: those would bind to the future's own loop."""
    if _COMPLETED:
        return _COMPLETED[0]
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    done.set_result(None)
    _COMPLETED.append(done)
    return done
