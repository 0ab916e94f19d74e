"""Helpers for tests of the blocking (threaded) policies."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest

import stoic
from stoic.testing import RecordingSink, VirtualClock

S = TypeVar("S", bound=RecordingSink)


def process_wide(recording: S) -> Iterator[S]:
    """A fixture's body: ``recording`` added process-wide, so the events of worker threads
    (which start with a fresh context) reach it; removed after the test, its contract checked."""
    stoic.add_sink(recording)
    try:
        yield recording
    finally:
        stoic.remove_sink(recording)
    recording.assert_contract()


@pytest.fixture(name="sink")
def process_wide_sink() -> Iterator[RecordingSink]:
    """Process-wide, so the events of worker threads (which start with a fresh context) reach it."""
    yield from process_wide(RecordingSink())


def eventually(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Wait (really: other threads are involved) until ``condition()`` holds, or fail."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.001)


class GateLock:
    """A policy's lock, running ``hook`` once just before the first thread to take it next
    does so: the moment between that thread's reads made outside the lock and its taking it."""

    def __init__(self, real: threading.Lock) -> None:
        self.real = real
        self.hook: Callable[[], None] | None = None

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        hook, self.hook = self.hook, None
        if hook is not None:
            hook()
        return self.real.acquire(blocking, timeout)

    def release(self) -> None:
        self.real.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


class InterruptingClock(VirtualClock):
    """A virtual clock moved by :meth:`step` from the test's thread (no timer fires, so an
    ambient deadline on it is only ever *seen* to pass: no task is cancelled); a thread marked
    in ``interrupted`` gets a ``KeyboardInterrupt`` at its next reading of the clock (as from a
    signal during its wait)."""

    def __init__(self, start: float = 0.0) -> None:
        super().__init__(start)
        self.interrupted: set[threading.Thread] = set()

    def step(self, seconds: float) -> None:
        self._set_now(self.now_ns() + round(seconds * 1e9))

    def now_ns(self) -> int:
        thread = threading.current_thread()
        if thread in self.interrupted:
            self.interrupted.discard(thread)
            raise KeyboardInterrupt
        return super().now_ns()
