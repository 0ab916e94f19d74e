"""When an inner stage admitted the call: the breaker times the dependency, not local queueing.

Seed 000, "Pipeline": local load-shedding must never reach the breaker's window. A breaker
outside a queued bulkhead or rate limiter would otherwise count the time a call waited for a
slot or a permit as call duration, and open on slow calls when only the local queue was long
(field report 20). So a stage that made a call *wait* before admitting it records the instant
it admitted it (on its own clock) in the current context, and a breaker whose call started
earlier measures from that instant instead.

The breaker's success path pays one integer comparison: :data:`state.waits` counts admissions
after a wait, process-wide, and only when it changed during a call does the breaker read the
context variable. Stages nested by hand, stacked as decorators or held in a ``Pipeline`` all run
in the caller's task (and context), so all three are covered.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Final

from ._clock import Clock


class _State:
    __slots__ = ("waits",)

    def __init__(self) -> None:
        self.waits = 0


state: Final = _State()
"""``state.waits``: admissions that followed a wait, in the whole process (only ever grows)."""

_admitted_at: ContextVar[tuple[Clock | None, int]] = ContextVar("stoic.admitted_at", default=(None, -1))


def admitted_after_wait(clock: Clock, now_ns: int) -> None:
    """Called by a stage (bulkhead, rate limiter, ...) that admits a call after making it wait,
    with its clock and the admission instant on it."""
    _admitted_at.set((clock, now_ns))
    state.waits += 1  # (a lost increment under threads only costs one context-variable read)


def admitted_since(clock: Clock, start_ns: int) -> int:
    """The latest instant an inner stage admitted the current call after a wait, if that stage
    runs on ``clock`` (the outer policy's) and admitted it after ``start_ns``; else ``start_ns``.
    Instants on another clock cannot be compared and are ignored."""
    at_clock, at = _admitted_at.get()
    return at if at_clock is clock and at > start_ns else start_ns
