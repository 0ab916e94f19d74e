"""A scripted hedged operation for the hedge tests: per attempt, a duration and an outcome."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import stoic
from stoic.testing import VirtualClock


@dataclass
class Step:
    """What attempt ``number`` does: sleep ``duration`` seconds, then return ``value`` or raise
    ``error``. ``linger`` > 0 makes it ignore cancellation and keep running that long."""

    duration: float
    value: object = None
    error: BaseException | None = None
    linger: float = 0.0


@dataclass
class Script:
    clock: VirtualClock
    steps: dict[int, Step]
    running: set[int] = field(default_factory=set)
    log: list[tuple[str, int, float]] = field(default_factory=list)
    attempts: list[stoic.Attempt] = field(default_factory=list)
    cancel_messages: dict[int, object] = field(default_factory=dict)

    async def __call__(self, attempt: stoic.Attempt) -> object:
        step = self.steps[attempt.number]
        self.attempts.append(attempt)
        self.running.add(attempt.number)
        self.log.append(("start", attempt.number, self.clock.now()))
        try:
            try:
                await self.clock.sleep_until(self.clock.now_ns() + round(step.duration * 1e9))
            except asyncio.CancelledError as exc:
                self.cancel_messages[attempt.number] = exc.args[0] if exc.args else None
                self.log.append(("cancelled", attempt.number, self.clock.now()))
                if step.linger <= 0:
                    raise
                await self.clock.sleep_until(self.clock.now_ns() + round(step.linger * 1e9))
                self.log.append(("lingered", attempt.number, self.clock.now()))
                return step.value
            if step.error is not None:
                self.log.append(("failed", attempt.number, self.clock.now()))
                raise step.error
            self.log.append(("succeeded", attempt.number, self.clock.now()))
            return step.value
        finally:
            self.running.discard(attempt.number)

    def started(self) -> list[int]:
        return [n for kind, n, _ in self.log if kind == "start"]
