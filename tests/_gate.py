"""Bulkhead operations that run until the test opens them, and a caller bound to a tier (the
queue-management tests' shared driver)."""

from __future__ import annotations

import asyncio

import stoic
from stoic import Bulkhead, Criticality


class Gate:
    """Operations that run until the test opens them, in the order they started."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.events: dict[str, asyncio.Event] = {}

    async def op(self, name: str) -> str:
        self.started.append(name)
        await self.events.setdefault(name, asyncio.Event()).wait()
        return name

    def open(self, name: str) -> None:
        self.events.setdefault(name, asyncio.Event()).set()


def start(bulkhead: Bulkhead, gate: Gate, name: str, tier: Criticality = Criticality.NORMAL) -> asyncio.Task[str]:
    """``bulkhead.execute(gate.op, name)`` as a task named ``name``, under criticality ``tier``."""
    with stoic.bind_criticality(tier):
        return asyncio.create_task(bulkhead.execute(gate.op, name), name=name)
