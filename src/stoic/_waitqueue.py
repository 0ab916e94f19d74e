"""Queue management for every bulkhead kind (seed 003, "Queue management").

A managed queue replaces the bulkhead's plain FIFO hand-over when any of these is configured
(the adaptive bulkheads always use it, because their limit moves):

- CoDel (``queue_target``, ``queue_interval``), in folly's form: the queue is *overloaded*
  when the minimum sojourn seen over an interval exceeded the target; while overloaded, a
  waiter that has waited more than twice the target is shed at dequeue, and otherwise one that
  has waited more than the interval, or twice the target if longer (seed 003's "generous
  sojourn allowance while the queue has recently been empty": a slot held for long, with no
  dequeue to show the congestion, still bounds the wait by time). The sojourn measured is
  that of the oldest waiter at each dequeue (what a FIFO would serve next: a standing queue
  shows there even when adaptive LIFO serves the newest), and a queue that empties counts as a
  zero sojourn when it empties (it drained within the interval), as does an arrival to an empty
  queue. (Observed only at the arrival, a drain followed by a calm of calls admitted at once
  left the verdict of the congested interval before it standing: the first waiter of the next
  burst was judged overloaded, and shed past twice the target, seconds after the congestion.)
- adaptive LIFO (``queue_adaptive_lifo``): while congested (CoDel overloaded, or without CoDel
  the oldest waiter older than ``queue_interval``), serve the newest waiter, whose client is
  likeliest still waiting; FIFO otherwise.
- prioritized (``prioritized``): waiters carry the task's :class:`stoic.Criticality` at arrival;
  the highest tier is served first; a full queue admits an arrival of a higher tier than the
  lowest waiting by shedding the newest waiter of the lowest tier; under CoDel, both sojourn
  allowances are halved per tier below NORMAL and doubled for CRITICAL (lower tiers shed sooner).

Every managed queue also skips a waiter whose deadline passed before it could be served (it is
failed with ``DeadlineExceeded``, never handed a slot) and never hands a slot while the
bulkhead is at or over its limit (an adaptive limit that shrank gates admission without
evicting anything).

The decisions are :class:`QueueRules`, one implementation for both kinds: :class:`ManagedQueue`
adds the asyncio hand-over (futures; the decisions contain no ``await``, so they are atomic on
the event loop), and :class:`stoic.BlockingBulkhead` calls the same rules under its lock and
wakes its waiters' conditions.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from . import _metrics
from ._admission import admitted_after_wait, refused_after_wait
from ._criticality import Criticality, current_criticality
from ._deadline import cancelled_by_deadline, remaining_ns
from ._durations import Seconds, to_ns, to_seconds
from ._errors import DeadlineExceeded, Shed
from ._wakeup import wake
from .events import AttributeValue, Level, emit
from .events._sinks import kind_floor

# The sinks wanting bulkhead events (stoic.events._sinks.KindFloor): a sink that wants none of
# them leaves these events unbuilt.
_SINKS = kind_floor("bulkhead")

if TYPE_CHECKING:
    import asyncio

    from .bulkhead import Bulkhead, _Compartment, _Waiter
else:  # imported on first use (stoic._lazy)
    from ._lazy import lazy_asyncio

    asyncio = lazy_asyncio(globals())

_NORMAL = int(Criticality.NORMAL)
NO_DEADLINE = -1


class Parked:
    """What a managed queue knows of a waiter besides the bulkhead's own bookkeeping: when it
    arrived, its tier, its deadline (``NO_DEADLINE``: none), and once the rules drop it, the
    error it raises and when it was dropped."""

    __slots__ = ("deadline_ns", "dropped_ns", "error", "since_ns", "tier")

    def __init__(self, since_ns: int, tier: int, deadline_ns: int) -> None:
        self.since_ns = since_ns
        self.tier = tier
        self.deadline_ns = deadline_ns
        self.error: BaseException | None = None
        self.dropped_ns = 0


def check_queue_options(queue_limit: int | None, queue_target: Seconds | None, queue_interval: Seconds,
                        queue_adaptive_lifo: bool, prioritized: bool) -> tuple[int | None, int, bool, bool]:
    """Validate the queue-management options; return (target_ns, interval_ns, lifo, prioritized).

    ``ValueError`` naming the parameter: ``queue_interval`` not above ``queue_target``, or any
    option with ``queue_limit=0`` (there is no queue to manage)."""
    interval_ns = to_ns(queue_interval, "queue_interval")
    target_ns = None if queue_target is None else to_ns(queue_target, "queue_target")
    for name, value in (("queue_adaptive_lifo", queue_adaptive_lifo), ("prioritized", prioritized)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    if target_ns is not None and interval_ns <= target_ns:
        raise ValueError(f"queue_interval must be above queue_target ({queue_target!r} s), got {queue_interval!r}")
    if queue_limit == 0:
        for name, on in (("queue_target", target_ns is not None), ("queue_adaptive_lifo", queue_adaptive_lifo),
                         ("prioritized", prioritized)):
            if on:
                raise ValueError(f"{name} needs a queue: queue_limit must be >= 1 (or None), got 0")
    return target_ns, interval_ns, queue_adaptive_lifo, prioritized


class QueueRules:
    """The decisions of a managed queue, shared by the asyncio and the blocking bulkheads (see
    the module docstring): CoDel's state, the tier of an arrival, which waiter a full queue
    displaces, and which waiter a released slot goes to. Pure bookkeeping on the bulkhead's
    deque of waiters and on what is parked beside them; the caller serialises every call (the
    event loop, or the blocking bulkhead's lock) and does the waking."""

    __slots__ = ("_interval_end_ns", "_min_sojourn_ns", "interval_ns", "lifo", "overloaded", "parked",
                 "prioritized", "target_ns")

    def __init__(self, target_ns: int | None, interval_ns: int, lifo: bool, prioritized: bool) -> None:
        self.target_ns = target_ns
        self.interval_ns = interval_ns
        self.lifo = lifo
        self.prioritized = prioritized
        self.overloaded = False
        self._interval_end_ns: int | None = None
        self._min_sojourn_ns: int | None = None
        # The bulkhead's waiters are its own _Waiter objects; what is queue-specific sits beside.
        self.parked: dict[int, Parked] = {}

    def retune(self, other: QueueRules) -> None:
        """Take ``other``'s options (a bulkhead retuned live); what CoDel learnt restarts."""
        self.target_ns, self.interval_ns, self.lifo, self.prioritized = (
            other.target_ns, other.interval_ns, other.lifo, other.prioritized)
        self.overloaded = False
        self._interval_end_ns = self._min_sojourn_ns = None

    # --- CoDel ---
    def _observe(self, now_ns: int, sojourn_ns: int) -> None:
        """folly's rule: at the end of each interval, overloaded := the interval's minimum sojourn
        exceeded the target; the minimum restarts with the first sojourn of the next interval."""
        assert self.target_ns is not None
        end = self._interval_end_ns
        if end is None:
            self._interval_end_ns = now_ns + self.interval_ns
            self._min_sojourn_ns = sojourn_ns
            return
        if now_ns >= end:
            low = self._min_sojourn_ns
            self.overloaded = low is not None and low > self.target_ns
            self._interval_end_ns = now_ns + self.interval_ns
            self._min_sojourn_ns = sojourn_ns
        elif self._min_sojourn_ns is None or sojourn_ns < self._min_sojourn_ns:
            self._min_sojourn_ns = sojourn_ns

    def _allowance_ns(self, tier: int, overloaded: bool) -> int:
        """How long a waiter of ``tier`` may have waited before it is shed at dequeue: twice the
        target while overloaded (folly), the interval otherwise (seed 003: "the generous sojourn
        allowance while the queue has recently been empty"), but never less than twice the target
        (an interval between the target and twice it would shed sooner when not overloaded);
        scaled by tier when prioritized."""
        assert self.target_ns is not None
        allowance = 2 * self.target_ns
        if not overloaded and self.interval_ns > allowance:
            allowance = self.interval_ns
        if self.prioritized and tier != _NORMAL:
            allowance = allowance << (tier - _NORMAL) if tier > _NORMAL else allowance >> (_NORMAL - tier)
        return allowance

    # --- arrival ---
    def tier_now(self) -> int:
        """The tier an arrival parks with: the caller's criticality, prioritized or not. Only a
        prioritized queue orders and sheds by it (every rule asks ``prioritized`` first); any
        queue reports it (``bulkhead.rejected``'s ``criticality`` is the waiter's own tier), and
        a queue retuned to prioritized while callers wait orders them by the tiers they bound."""
        return int(current_criticality())

    def drained(self, waiters: deque[_Waiter], now: int) -> None:
        """A waiter left ``waiters`` (served, dropped, or gone by itself): when that emptied the
        queue, CoDel sees the zero sojourn of a drained queue now."""
        if not waiters and self.target_ns is not None:
            self._observe(now, 0)

    def park(self, waiters: deque[_Waiter], waiter: _Waiter, now: int, tier: int, deadline_ns: int) -> Parked:
        """Queue ``waiter`` (at the back) with what the rules need to know of it."""
        if not waiters and self.target_ns is not None:
            self._observe(now, 0)  # the queue was empty until now
        parked = self.parked[id(waiter)] = Parked(now, tier, deadline_ns)
        waiters.append(waiter)
        return parked

    def displaceable(self, waiters: deque[_Waiter], tier: int) -> _Waiter | None:
        """For a full queue: the newest waiter of the lowest tier, when that tier is below
        ``tier`` and the queue is prioritized; else None (the arrival is refused)."""
        if not self.prioritized:
            return None
        victim = None
        low = tier
        parked = self.parked
        for waiter in reversed(waiters):
            info = parked[id(waiter)]
            if info.tier < low:
                low = info.tier
                victim = waiter
        return victim

    # --- departure ---
    def next_waiter(self, waiters: deque[_Waiter], now: int,
                    drop: Callable[[_Waiter, Parked, str], None]) -> _Waiter | None:
        """Remove and return the waiter a released slot goes to, or None when none is left.

        On the way, a waiter past its CoDel allowance (:meth:`_allowance_ns`) or past its
        deadline is removed and handed to ``drop(waiter, parked, reason)`` (``"sojourn"`` or
        ``"deadline_exceeded"``), which fails and wakes it."""
        parked = self.parked
        while waiters:
            if self.target_ns is not None:
                self._observe(now, now - parked[id(waiters[0])].since_ns)
                for stale in self._stale(waiters, now):
                    waiters.remove(stale)
                    stale.queued = False
                    drop(stale, parked[id(stale)], "sojourn")
                if not waiters:
                    self._observe(now, 0)  # drained (by shedding)
                    return None
            congested = self.lifo and (
                self.overloaded if self.target_ns is not None
                else now - parked[id(waiters[0])].since_ns > self.interval_ns)
            if self.prioritized:
                waiter = self._best(waiters, newest=congested)
                waiters.remove(waiter)
            else:
                waiter = waiters.pop() if congested else waiters.popleft()
            waiter.queued = False
            info = parked[id(waiter)]
            if info.deadline_ns != NO_DEADLINE and now >= info.deadline_ns:
                drop(waiter, info, "deadline_exceeded")
                self.drained(waiters, now)
                continue
            self.drained(waiters, now)
            return waiter
        return None

    def _best(self, waiters: deque[_Waiter], newest: bool) -> _Waiter:
        parked = self.parked
        best: _Waiter | None = None
        best_tier = -1
        for waiter in (reversed(waiters) if newest else waiters):
            tier = parked[id(waiter)].tier
            if tier > best_tier:
                best, best_tier = waiter, tier
        assert best is not None
        return best

    def _stale(self, waiters: deque[_Waiter], now: int) -> list[_Waiter]:
        """Every waiter that has waited past its allowance (see :meth:`_allowance_ns`)."""
        parked = self.parked
        overloaded = self.overloaded
        if self.prioritized:
            return [w for w in waiters
                    if now - parked[id(w)].since_ns > self._allowance_ns(parked[id(w)].tier, overloaded)]
        allowance = self._allowance_ns(_NORMAL, overloaded)
        stale = []
        for w in waiters:  # oldest first: stop at the first that is young enough
            if now - parked[id(w)].since_ns <= allowance:
                break
            stale.append(w)
        return stale


def shed_error(reason: str, label: str) -> Shed | DeadlineExceeded:
    """What a waiter dropped by the rules raises: ``Shed`` for ``sojourn``/``priority``,
    ``DeadlineExceeded`` for ``deadline_exceeded``."""
    if reason == "deadline_exceeded":
        return DeadlineExceeded(f"deadline exceeded before a bulkhead slot ({label})", label=label)
    return Shed(cause=reason, label=label)


def shed_event(bulkhead: _Compartment, reason: str, sojourn_ns: int, tier: int, *, count: bool = True) -> None:
    """Report a waiter the rules dropped: counted by reason (unless ``count`` is False: counted
    already), and ``bulkhead.rejected`` with its sojourn and criticality."""
    if count and _metrics.state.enabled:
        bulkhead._rec.count_locked(("stoic.bulkhead.rejections", reason))
    if _SINKS.wants(Level.INFO):
        attributes: dict[str, AttributeValue] = {
            "reason": reason, "capacity": bulkhead._max, "sojourn": to_seconds(sojourn_ns),
            "criticality": str(Criticality(tier)),
        }
        emit("bulkhead.rejected", bulkhead._label, Level.INFO, bulkhead._clock.now_ns(), attributes)


class ManagedQueue(QueueRules):
    """The managed hand-over of one asyncio bulkhead (see the module docstring)."""

    __slots__ = ()

    async def enter(self, bulkhead: Bulkhead) -> None:
        """The slow path of admission: take a free slot, or park (possibly displacing a lower
        tier), or refuse. Raises what :meth:`Bulkhead.execute` documents, plus ``Shed``."""
        left = remaining_ns(bulkhead._clock)
        if left is not None and left <= 0:
            raise bulkhead._late()
        waiters = bulkhead._waiters
        if bulkhead._active < bulkhead._max and not waiters:
            bulkhead._active += 1
            return
        clock = bulkhead._clock
        now = clock.now_ns()
        tier = self.tier_now()
        if len(waiters) >= bulkhead._queue_limit:
            victim = self.displaceable(waiters, tier)
            if victim is None:
                raise bulkhead._full(len(waiters))
            waiters.remove(victim)
            victim.queued = False
            self._drop(bulkhead, now, victim, self.parked[id(victim)], "priority")
        from .bulkhead import _Waiter  # here: bulkhead imports this module

        waiter = _Waiter()
        waiter.future = asyncio.get_running_loop().create_future()
        parked = self.park(waiters, waiter, now, tier, NO_DEADLINE if left is None else now + left)
        try:
            await waiter.future
        except BaseException as exc:
            if waiter.granted:
                bulkhead._release()  # granted in the same instant it was cancelled: pass it on
            elif waiter.queued:
                waiter.queued = False
                waiters.remove(waiter)
                self.drained(waiters, clock.now_ns())
            self.parked.pop(id(waiter), None)
            # Left the queue unadmitted: the wait was local queueing all the same (an operation
            # catching this, a sub-step's own timeout, is not slow for it).
            refused_after_wait(clock, clock.now_ns(), parked.since_ns)
            if parked.error is not None:  # dropped by the rules, then interrupted before it ran
                self._dropped(bulkhead, parked)
            elif isinstance(exc, asyncio.CancelledError):
                # Reported as a shed waiter is, with how long it waited and its tier.
                shed_event(bulkhead, "deadline_exceeded" if cancelled_by_deadline() else "cancelled",
                           clock.now_ns() - parked.since_ns, parked.tier)
            raise
        self.parked.pop(id(waiter), None)
        if parked.error is not None:
            refused_after_wait(clock, clock.now_ns(), parked.since_ns)  # (shed: local queueing still)
            self._dropped(bulkhead, parked)
            raise parked.error
        if parked.deadline_ns != NO_DEADLINE and clock.now_ns() >= parked.deadline_ns:
            # Woken with a slot after its deadline (the release ran first in that instant).
            bulkhead._release()
            refused_after_wait(clock, clock.now_ns(), parked.since_ns)
            shed_event(bulkhead, "deadline_exceeded", clock.now_ns() - parked.since_ns, parked.tier)
            raise shed_error("deadline_exceeded", bulkhead._label)
        # Admitted after waiting: an outer breaker leaves the wait out of the call's duration.
        admitted_after_wait(clock, clock.now_ns(), parked.since_ns)

    def release(self, bulkhead: Bulkhead) -> None:
        """Give back one slot: hand it to the next waiter the rules pick, unless the bulkhead is
        over its (possibly shrunk) limit, in which case the slot is retired."""
        if bulkhead._active <= bulkhead._max and bulkhead._waiters:
            now = bulkhead._clock.now_ns()
            drop = functools.partial(self._drop, bulkhead, now)
            while (waiter := self.next_waiter(bulkhead._waiters, now, drop)) is not None:
                waiter.granted = True  # the slot changes hands; the active count does not change
                assert waiter.future is not None
                if wake(waiter.future):
                    return
                waiter.granted = False  # its event loop is closed: nobody will run; try the next
                self.parked.pop(id(waiter), None)  # (nor pop its entry: forget it here)
        bulkhead._active -= 1

    def fill(self, bulkhead: Bulkhead) -> None:
        """After the limit grew: hand the new free slots to waiters."""
        while bulkhead._waiters and bulkhead._active < bulkhead._max:
            bulkhead._active += 1
            self.release(bulkhead)

    def _drop(self, bulkhead: Bulkhead, now: int, waiter: _Waiter, info: Parked, reason: str) -> None:
        """Fail a waiter the rules removed from the queue, count it, and wake it. Its event is
        emitted by the waiter itself (:meth:`_dropped`), in its own context, as a thread's is: the
        sinks and the span of the call that was shed, not those of the call that dropped it (an
        arrival that displaced it, a release that found it stale)."""
        info.error = shed_error(reason, bulkhead._label)
        info.dropped_ns = now
        if _metrics.state.enabled:
            bulkhead._rec.count_locked(("stoic.bulkhead.rejections", reason))
        assert waiter.future is not None
        if not wake(waiter.future):
            self.parked.pop(id(waiter), None)  # its event loop is closed: it will never pop its entry
            shed_event(bulkhead, reason, now - info.since_ns, info.tier, count=False)  # (nor report itself)

    @staticmethod
    def _dropped(bulkhead: Bulkhead, parked: Parked) -> None:
        """The event of a waiter the rules dropped (:meth:`_drop` counted it), from its own task."""
        error = parked.error
        reason = error.cause if isinstance(error, Shed) else "deadline_exceeded"
        shed_event(bulkhead, reason, parked.dropped_ns - parked.since_ns, parked.tier, count=False)
