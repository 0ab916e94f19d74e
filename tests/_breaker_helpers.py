"""Helpers shared by the breaker tests: operations that take virtual time, fail or hang."""

from __future__ import annotations

import asyncio

from stoic.testing import VirtualClock


class Boom(Exception):
    """The dependency failed."""


async def ok() -> str:
    return "ok"


async def fail() -> str:
    raise Boom("down")


def take(clock: VirtualClock, seconds: float, *, error: BaseException | None = None):  # type: ignore[no-untyped-def]
    """An operation that takes ``seconds`` of virtual time, then returns "done" or raises ``error``."""

    async def op() -> str:
        await clock.sleep_until(clock.now_ns() + round(seconds * 1e9))
        if error is not None:
            raise error
        return "done"

    return op


class Gate:
    """An operation that waits until the test opens the gate, then returns or raises."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.started = 0
        self.error: BaseException | None = None

    async def op(self) -> str:
        self.started += 1
        await self.event.wait()
        if self.error is not None:
            raise self.error
        return "done"

    def open(self, error: BaseException | None = None) -> None:
        self.error = error
        self.event.set()


class StepClock:
    """A minimal clock for synchronous tests: time moves only when a test sets ``t`` (ns)."""

    def __init__(self) -> None:
        self.t = 0

    def now_ns(self) -> int:
        return self.t

    def call_at(self, when_ns, callback):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    async def sleep_until(self, when_ns: int) -> None:
        raise NotImplementedError

    def sleep_until_blocking(self, when_ns: int) -> None:
        raise NotImplementedError
