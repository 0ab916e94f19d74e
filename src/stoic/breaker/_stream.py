"""State-change streams: ``CircuitBreaker.state_changes()``.

Seed 000, "Observation"; design/python.md, "State streams". Each stream keeps the newest 16
transitions (older ones are dropped for a consumer that falls behind), never replays the
current state, and can be published to from any thread without blocking: a publisher on
another thread wakes the consumer through ``loop.call_soon_threadsafe``. The breaker holds
streams weakly, so a consumer that stops iterating and drops the stream leaks nothing; one
whose wait is cancelled, or that calls :meth:`StateStream.aclose`, is unsubscribed at once.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING

from ._config import BreakerState

if TYPE_CHECKING:
    import asyncio
else:  # imported on first use (stoic._lazy)
    from .._lazy import lazy_asyncio

    asyncio = lazy_asyncio(globals())

BUFFER = 16
"""Transitions kept for a consumer that falls behind (the newest ones)."""


class StateStream:
    """An async iterator of :class:`BreakerState` transitions, in order.

    Iteration ends (``StopAsyncIteration``) after :meth:`aclose`. Cancelling a task waiting
    in ``__anext__`` unsubscribes the stream and re-raises the cancellation. Usable as
    ``async with breaker.state_changes() as changes:`` to unsubscribe on exit. One consumer
    at a time, as for an async generator: ``__anext__`` raises ``RuntimeError`` while another
    task is waiting on the same stream. A consumer that fell behind can tell: :attr:`dropped`
    counts the transitions discarded to keep the newest 16.
    """

    __slots__ = ("__weakref__", "_buffer", "_closed", "_dropped", "_lock", "_loop", "_thread", "_unsubscribe",
                 "_waiter")

    def __init__(self, unsubscribe: Callable[[StateStream], None]) -> None:
        self._buffer: deque[BreakerState] = deque(maxlen=BUFFER)
        self._lock = threading.Lock()
        self._waiter: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = 0
        self._closed = False
        self._dropped = 0
        self._unsubscribe = unsubscribe

    # --- publishing (any thread, never blocks on the consumer) ---
    def publish(self, state: BreakerState) -> None:
        with self._lock:
            if self._closed:
                return
            if len(self._buffer) == BUFFER:
                self._dropped += 1  # the oldest goes to make room (deque maxlen)
            self._buffer.append(state)
            waiter = self._waiter
            loop = self._loop
            thread = self._thread
        if waiter is not None and loop is not None:
            self._notify(loop, thread)

    def _notify(self, loop: asyncio.AbstractEventLoop, thread: int) -> None:
        # Either way the consumer's loop may be closed with the consumer still waiting (a loop
        # managed by hand): there is nobody to wake, and the publisher (a breaker transition,
        # under the breaker's lock) must not fail because of it.
        try:
            if thread == threading.get_ident():
                self._wake()
            else:
                loop.call_soon_threadsafe(self._wake)
        except RuntimeError:
            pass

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # --- consuming ---
    def __aiter__(self) -> StateStream:
        return self

    async def __anext__(self) -> BreakerState:
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                if self._buffer:
                    return self._buffer.popleft()
                if self._closed:
                    raise StopAsyncIteration
                current, current_loop = self._waiter, self._loop
                if (current is not None and not current.done() and current_loop is not None
                        and (current_loop is loop or current_loop.is_running())):
                    # Replacing the waiter would leave the first consumer asleep for ever. (One
                    # left on a loop that no longer runs can never be woken: it may be replaced.)
                    raise RuntimeError("another task is already waiting on this stream: give each consumer "
                                       "its own breaker.state_changes()")
                waiter = loop.create_future()
                self._waiter = waiter
                self._loop = loop
                self._thread = threading.get_ident()
            try:
                await waiter
            except BaseException:
                # Cancelled while waiting (or the loop is going away): this consumer is gone.
                self._close()
                raise
            finally:
                if self._waiter is waiter:  # (a consumer on a closed loop may have been replaced)
                    self._waiter = None

    @property
    def pending(self) -> int:
        """How many transitions are buffered, not yet consumed (at most 16)."""
        return len(self._buffer)

    @property
    def dropped(self) -> int:
        """How many transitions this stream discarded, oldest first, because its consumer had
        16 unread (cumulative, never reset): compare two readings to learn that a gap happened
        in between, then read ``breaker.state`` for where the breaker is now."""
        return self._dropped

    def _close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._buffer.clear()
            waiter = self._waiter
            loop = self._loop
            thread = self._thread
        self._unsubscribe(self)
        if waiter is not None and loop is not None:
            self._notify(loop, thread)

    async def aclose(self) -> None:
        """Unsubscribe; a pending or later ``__anext__`` ends the iteration."""
        self._close()

    async def __aenter__(self) -> StateStream:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._close()
