"""Waking an asyncio waiter from wherever the waker runs.

The rate limiter and the bulkhead keep their state under a ``threading.Lock`` and bind to no
event loop; a waiter's future is created lazily on the loop the waiter runs on. The task that
wakes it usually runs on that same loop (then the future is resolved directly, the cheap case),
but may run on another thread's loop, where only ``call_soon_threadsafe`` is safe.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

from . import _lazy

if TYPE_CHECKING:
    import asyncio
else:  # imported on first use (stoic._lazy)
    from ._lazy import lazy_asyncio

    asyncio = lazy_asyncio(globals())


def _get_running_loop() -> asyncio.AbstractEventLoop | None:
    """Replaced by asyncio's own (a C function) as soon as asyncio is in use (stoic._lazy)."""
    loop: asyncio.AbstractEventLoop | None = _lazy.load().events._get_running_loop()
    return loop


def _bind(module: ModuleType) -> None:
    global _get_running_loop
    _get_running_loop = module.events._get_running_loop


_lazy.when_imported(_bind)


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
