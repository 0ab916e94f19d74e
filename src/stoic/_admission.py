"""When an inner stage admitted the call: the breaker times the dependency, not local queueing.

Seed 000, "Pipeline": local load-shedding must never reach the breaker's window. A breaker
outside a queued bulkhead or rate limiter would otherwise count the time a call waited for a
slot or a permit as call duration, and open on slow calls when only the local queue was long
(field report 20). So a stage that made a call *wait* before admitting it (in a queue, for a
permit, or for a store's decision) records when the wait began and the instant it admitted the
call, or let it go unadmitted (on its own clock), in the current context, and a breaker whose
call started earlier leaves out the time spent waiting: only the waiting, so a local sub-step
that queues *after* the operation has already spent 1.5 s on its dependency does not hide those
1.5 s (the breaker's duration is measured from its start shifted by the waits). A wait that
ends unadmitted (shed, out of time, cancelled) is local queueing too: the refusal is never
counted, and an operation that catches it is not slow for the time it queued.
The latest few waits of the context are kept, per clock (a call rarely waits more than once or
twice).

The breaker's success path pays at most one integer comparison: :data:`state.waits` counts
waits recorded, process-wide, and only once it is non-zero does a breaker read the
context variable (one ``get``) to time a call it records in full. Stages nested by hand,
stacked as decorators or held in a ``Pipeline`` all run in the caller's task (and context), so
all three are covered.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Final

from ._clock import Clock, same_clock


class _State:
    __slots__ = ("waits",)

    def __init__(self) -> None:
        self.waits = 0


state: Final = _State()
"""``state.waits``: waits recorded (admitted or not), in the whole process (only ever grows)."""

# The latest waits of this context, per clock, the clock waited on last first:
# ((clock, (since, admitted, since, admitted, ...)), ...). Waits on different clocks cannot be
# compared, and one on another clock must not drop the waits a breaker on this one needs.
_waits: ContextVar[tuple[tuple[Clock, tuple[int, ...]], ...]] = ContextVar("stoic.admission_waits", default=())
_KEPT: Final = 2 * 8  # eight waits a clock
_CLOCKS: Final = 4  # clocks kept (a process rarely mixes more than two)


def _split(entries: tuple[tuple[Clock, tuple[int, ...]], ...], clock: Clock,
           ) -> tuple[tuple[int, ...], tuple[tuple[Clock, tuple[int, ...]], ...]]:
    """The waits kept for ``clock``'s timeline in ``entries`` (empty if none), and the other
    clocks' entries."""
    for index, (at_clock, at_kept) in enumerate(entries):
        if at_clock is clock or same_clock(at_clock, clock):
            return at_kept, entries[:index] + entries[index + 1:]
    return (), entries


def admitted_after_wait(clock: Clock, now_ns: int, since_ns: int) -> None:
    """Called by a stage (bulkhead, rate limiter, ...) that admits a call after making it wait,
    with its clock, the admission instant on it and the instant the call began waiting; or, as
    :data:`refused_after_wait`, by one that made it wait and then did not admit it (shed it,
    refused it at its timeout, or saw it cancelled), with the instant the wait ended. Either way
    the wait is local queueing, and one record of it is all a breaker needs: the refusal itself
    is never counted, but an operation that catches it (an optional sub-step shed after a while
    in a queue) must not be a slow call for the time it queued (field report 20)."""
    entries = _waits.get()
    kept, others = _split(entries, clock)
    since = min(since_ns, now_ns)
    # A wait that began before the latest ones encloses them (a stage admitting through an
    # inner one, as a shared limiter through its local bucket): they are part of it.
    while kept and kept[-2] >= since:
        kept = kept[:-2]
    kept = (*kept[2 - _KEPT:], since, now_ns)
    _waits.set(((clock, kept), *others[:_CLOCKS - 1]))
    state.waits += 1  # (a lost increment under threads only costs one context-variable read)


refused_after_wait: Final = admitted_after_wait
"""The same record, named for the call sites where the wait ended without admission."""


def admitted_since(clock: Clock, start_ns: int) -> int:
    """``start_ns`` (when an outer policy on ``clock`` started the current call) moved later by
    the time the call has since spent waiting in inner stages on that clock: the call's
    duration without local queueing is ``end - admitted_since(clock, start_ns)``. Waits on
    another clock cannot be compared and are ignored (two ``SystemClock`` instances are one
    timeline: ``stoic._clock.same_clock``); they never hide the waits on ``clock``."""
    for at_clock, kept in _waits.get():
        if at_clock is clock or same_clock(at_clock, clock):
            queued = 0
            for i in range(0, len(kept), 2):
                admitted = kept[i + 1]
                if admitted > start_ns:
                    since = kept[i]
                    queued += admitted - (since if since > start_ns else start_ns)
            return start_ns + queued
    return start_ns


def waits_after(clock: Clock, start_ns: int) -> list[tuple[int, int]]:
    """This context's waits on ``clock`` (or one of its timeline) that ended after ``start_ns``,
    as ``(since, admitted)`` pairs, oldest first (empty when none)."""
    for at_clock, kept in _waits.get():
        if at_clock is clock or same_clock(at_clock, clock):
            return [(kept[i], kept[i + 1]) for i in range(0, len(kept), 2) if kept[i + 1] > start_ns]
    return []


def replace_waits_after(clock: Clock, start_ns: int, waits: list[tuple[int, int]]) -> None:
    """Put ``waits`` (``(since, admitted)`` pairs after ``start_ns``, oldest first) in place of this
    context's waits on ``clock`` that ended after ``start_ns``: a policy that ran several
    attempts at once (a hedge) says which of the call's time was local waiting for all of them."""
    entries = _waits.get()
    kept, others = _split(entries, clock)
    kept = tuple(v for i in range(0, len(kept), 2) if kept[i + 1] <= start_ns for v in kept[i:i + 2])
    kept = (*kept, *(v for pair in waits for v in pair))[-_KEPT:]
    if kept or entries is not others:
        _waits.set(((clock, kept), *others[:_CLOCKS - 1]) if kept else others)
    if waits:
        state.waits += 1
