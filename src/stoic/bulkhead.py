"""The bulkhead: a concurrency limit with a bounded FIFO queue (seed 000, "Bulkhead").

At most ``max_concurrent`` operations run at once; up to ``queue_limit`` more wait, first in
first out; the next is rejected with :class:`stoic.BulkheadFull`. The default ``queue_limit=0``
makes it a load shedder: when the capacity is spoken for, refuse at once instead of letting
latency grow. The "full" and the "wait" decisions are one critical section, so the limit holds
exactly under contention. A released slot is handed straight to the first waiter (a newcomer
cannot take it first); a waiter that leaves (cancelled, or cut by a deadline) never takes a slot,
and one that is handed a slot but cancelled before it runs passes the slot to the next waiter.

:class:`Bulkhead` serves asyncio tasks (like asyncio's primitives, the tasks of one event loop
at a time: its decisions contain no ``await``, so they are atomic on the loop without a lock; it
binds to no loop, so one bulkhead serves successive ``asyncio.run`` calls). :class:`BlockingBulkhead`
serves threads, with its state under a ``threading.Lock``.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from types import TracebackType
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from . import _deadline, _metrics, _source
from ._admission import admitted_after_wait, refused_after_wait
from ._clock import Clock, resolve_clock, wait_until
from ._deadline import _current as _deadline_scope
from ._deadline import cancelled_by_deadline, remaining_ns
from ._durations import Seconds, check_int, check_label, to_ns, to_seconds
from ._errors import BulkheadFull, DeadlineExceeded, Shed
from ._policy import (
    UNRUN_RESULTS,
    is_async_callable,
    refuse_generator_function,
    refuse_unrun_result,
    through_method_decorators,
)
from ._retune import validated
from ._waitqueue import NO_DEADLINE, ManagedQueue, Parked, QueueRules, check_queue_options, shed_error, shed_event
from ._wakeup import wake
from .events import AttributeValue, Level, emit
from .events._sinks import kind_floor

if TYPE_CHECKING:
    import asyncio
else:  # imported on first use (stoic._lazy)
    from ._lazy import lazy_asyncio

    asyncio = lazy_asyncio(globals())

# The sinks wanting bulkhead events (stoic.events._sinks.KindFloor): a sink that wants none of
# them leaves these events unbuilt.
_SINKS = kind_floor("bulkhead")

P = ParamSpec("P")
T = TypeVar("T")


_UNBOUNDED = sys.maxsize  # queue_limit=None


class _Waiter:
    """A queued caller. ``granted`` turns true when a slot is handed to it (under the state's
    critical section), which is what decides who owns the slot if it is cancelled meanwhile."""

    __slots__ = ("cond", "future", "granted", "queued")

    def __init__(self) -> None:
        self.granted = False
        self.queued = True
        self.future: asyncio.Future[None] | None = None
        self.cond: threading.Condition | None = None


class _Compartment:
    """Configuration, counts and events shared by the asyncio and the blocking bulkhead."""

    __slots__ = ("__weakref__", "_active", "_clock", "_interval_ns", "_label", "_max", "_queue_limit", "_rec",
                 "_waiters")

    _interval_ns: int  # queue_interval, kept even while no queue option uses it (for _settings)

    def __init__(
        self, max_concurrent: int, *, queue_limit: int | None = 0, label: str, clock: Clock | None = None
    ) -> None:
        self._max = check_int(max_concurrent, "max_concurrent", minimum=1)
        # None (unbounded, as for the rate limiter) is kept as a limit no queue can reach, so the
        # full/wait decision stays one integer comparison.
        self._queue_limit = _UNBOUNDED if queue_limit is None else check_int(queue_limit, "queue_limit", minimum=0)
        self._label = check_label(label)
        # Validated here: a wrong clock would otherwise surface as an AttributeError from the
        # first event, in place of the BulkheadFull the caller should see.
        self._clock: Clock = resolve_clock(clock)
        self._active = 0
        self._waiters: deque[_Waiter] = deque()
        self._rec = _metrics.recorder("bulkhead", label, self)

    @property
    def label(self) -> str:
        """The label carried by every event of this bulkhead."""
        return self._label

    @property
    def max_concurrent(self) -> int:
        """How many operations may run at once."""
        return self._max

    @property
    def queue_limit(self) -> int | None:
        """How many callers may wait for a slot (``None``: unbounded)."""
        return None if self._queue_limit == _UNBOUNDED else self._queue_limit

    @property
    def active_count(self) -> int:
        """Slots taken now (operations running, or handed a slot and about to run)."""
        return self._active

    @property
    def queued_count(self) -> int:
        """Callers waiting for a slot now."""
        return len(self._waiters)

    @property
    def limit(self) -> int:
        """The admission limit now (``max_concurrent`` for a fixed bulkhead; it moves for an
        adaptive one)."""
        return self._max

    @property
    def in_use(self) -> int:
        """Slots taken now (the same count as :attr:`active_count`)."""
        return self._active

    @property
    def queued(self) -> int:
        """Callers waiting for a slot now (the same count as :attr:`queued_count`)."""
        return len(self._waiters)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(max_concurrent={self._max}, queue_limit={self.queue_limit}, "
            f"label={self._label!r}, active={self._active}, queued={len(self._waiters)})"
        )

    def _full(self, waiting: int) -> BulkheadFull:
        if _metrics.state.enabled:
            self._rec.count_locked(("stoic.bulkhead.rejections", "bulkhead_full"))
        if _SINKS.wants(Level.INFO):
            emit("bulkhead.rejected", self._label, Level.INFO, self._clock.now_ns(),
                 {"reason": "bulkhead_full", "capacity": self._max, "waiting": waiting})
        return BulkheadFull(label=self._label)

    def _left(self, reason: str) -> None:
        if _metrics.state.enabled:
            self._rec.count_locked(("stoic.bulkhead.rejections", reason))
        if _SINKS.wants(Level.INFO):
            attributes: dict[str, AttributeValue] = {"reason": reason, "capacity": self._max}
            emit("bulkhead.rejected", self._label, Level.INFO, self._clock.now_ns(), attributes)

    def _late(self) -> DeadlineExceeded:
        self._left("deadline_exceeded")
        return self._late_error()

    def _late_error(self) -> DeadlineExceeded:
        return DeadlineExceeded(f"deadline exceeded before a bulkhead slot ({self._label})", label=self._label)

    # --- the control plane (one rule for both kinds) ---
    def _queue_rules(self) -> QueueRules | None:
        """This bulkhead's queue management (None: a plain FIFO queue). Each kind keeps its rules
        in its own attribute (``Bulkhead._managed``, ``BlockingBulkhead._rules``) and reads it here."""
        return None

    def _settings(self) -> dict[str, Any]:
        """The constructor's keyword arguments that rebuild this configuration (for ``_retune``)."""
        rules = self._queue_rules()
        return {
            "max_concurrent": self._max, "queue_limit": self.queue_limit,
            "queue_target": None if rules is None or rules.target_ns is None else to_seconds(rules.target_ns),
            "queue_interval": to_seconds(self._interval_ns if rules is None else rules.interval_ns),
            "queue_adaptive_lifo": rules is not None and rules.lifo,
            "prioritized": rules is not None and rules.prioritized,
        }

    def _check_retune(self, fresh: _Compartment) -> None:
        """Refuse what the bulkhead's state forbids: switching queue management on or off while
        callers wait (their places were decided under the other rule)."""
        if (self._queue_rules() is None) != (fresh._queue_rules() is None) and self._waiters:
            raise ValueError(f"queue_target, queue_adaptive_lifo and prioritized cannot turn queue management "
                             f"on or off while {len(self._waiters)} callers wait")

    def _retune_check(self, **changes: Any) -> None:
        """What :meth:`_retune` would refuse, checked without changing anything (stoic.Keyed checks
        every key before retuning any)."""
        self._check_retune(validated(self, self._settings(), changes))


# A slot around a call, as source (stoic._source): ``{k}`` is the bulkhead, ``{p}`` prefixes its
# names, ``{body}`` runs the operation. A free slot also says that nobody waits: a caller queues
# only when every slot is taken, and a slot given back while anyone waits is handed over, never
# freed (the max is fixed; the adaptive bulkheads, whose limit moves, have their own fast path).
STAGE = """\
stoic_{p}active = {k}._active
if stoic_{p}active < {k}._max and (not stoic_deadline.ever_set or stoic_deadline_get() is None):
    {k}._active = stoic_{p}active + 1
else:
    await {k}._enter_slow()
try:
{body}
finally:
    if {k}._waiters:
        {k}._release()
    else:
        {k}._active -= 1
"""


def stage(k: str, p: str, body: str) -> str:
    """The bulkhead's part of a call around ``body`` (both at indent 0)."""
    return STAGE.format(k=k, p=p, body=_source.indent(body))


def _execute(doc: str) -> Callable[..., Any]:
    call = "return await (stoic_fn(*stoic_args, **stoic_kwargs) if stoic_kwargs else stoic_fn(*stoic_args))"
    source = ("async def execute(stoic_self, stoic_fn, /, *stoic_args, **stoic_kwargs):\n"
              + _source.indent(stage("stoic_self", "", call)))
    return _source.compile_method(source, "Bulkhead.execute", doc, __name__)


class Bulkhead(_Compartment):
    """A concurrency limit for asyncio operations (seed 000, "Bulkhead").

    ``Bulkhead(max_concurrent, *, queue_limit=0, label, clock=None, queue_target=None,
    queue_interval=0.1, queue_adaptive_lifo=False, prioritized=False)``: ``max_concurrent`` (an
    int >= 1) operations run at once, ``queue_limit`` (an int >= 0, or ``None`` for unbounded, still
    bounded by cancellation and deadlines) more wait in FIFO order;
    ``label`` is carried by every event; ``clock`` (default: the ambient clock at construction)
    times the events. Raises ``ValueError`` naming the parameter when a value is out of range.

    Queue management (seed 003, "Queue management"; see ``stoic._waitqueue``): ``queue_target``
    (seconds) turns on CoDel, which sheds waiters with :class:`stoic.Shed` past twice the target
    under sustained congestion, past ``queue_interval`` (seconds, above the target; also CoDel's
    interval) otherwise;
    ``queue_adaptive_lifo`` serves the newest waiter while congested; ``prioritized`` orders and
    sheds waiters by :func:`stoic.current_criticality`. Each needs ``queue_limit`` != 0.

    Use ``await bulkhead.execute(fn, *args, **kwargs)``, ``@bulkhead`` on an async function, or
    ``async with bulkhead:``. Refusals: :class:`stoic.BulkheadFull` (every slot and queue place
    taken) and :class:`stoic.DeadlineExceeded` (the ambient deadline already passed). A waiter
    that is cancelled leaves without a slot and re-raises ``asyncio.CancelledError``.
    """

    __slots__ = ("_entered", "_exited", "_managed")

    def __init__(
        self, max_concurrent: int, *, queue_limit: int | None = 0, label: str, clock: Clock | None = None,
        queue_target: Seconds | None = None, queue_interval: Seconds = 0.1, queue_adaptive_lifo: bool = False,
        prioritized: bool = False,
    ) -> None:
        super().__init__(max_concurrent, queue_limit=queue_limit, label=label, clock=clock)
        target_ns, interval_ns, lifo, prio = check_queue_options(
            queue_limit, queue_target, queue_interval, queue_adaptive_lifo, prioritized)
        self._interval_ns = interval_ns
        # None keeps the plain FIFO hand-over below (the common case, and the cheapest).
        self._managed: ManagedQueue | None = (
            ManagedQueue(target_ns, interval_ns, lifo, prio) if target_ns is not None or lifo or prio else None)
        # What ``async with`` awaits when it takes a slot at once, and when it gives one back: made
        # together by the first ``__aenter__`` (they need a running loop), in _completed.
        self._entered: asyncio.Future[Bulkhead] | None = None
        self._exited: asyncio.Future[None]

    async def _enter_slow(self) -> None:
        if self._managed is not None:
            return await self._managed.enter(self)
        left = remaining_ns(self._clock)
        if left is not None and left <= 0:
            raise self._late()
        waiters = self._waiters
        if self._active < self._max and not waiters:
            self._active += 1
            return
        if len(waiters) >= self._queue_limit:
            raise self._full(len(waiters))
        waiter = _Waiter()
        waiter.future = asyncio.get_running_loop().create_future()
        waiters.append(waiter)
        since = self._clock.now_ns()
        try:
            await waiter.future
        except BaseException as exc:
            if waiter.granted:
                # Handed a slot but cancelled before running: the slot goes to the next waiter.
                self._release()
            elif waiter.queued:
                waiter.queued = False
                waiters.remove(waiter)
            if isinstance(exc, asyncio.CancelledError):
                self._left("deadline_exceeded" if cancelled_by_deadline() else "cancelled")
            # Left the queue unadmitted: the wait was local queueing all the same (an operation
            # catching this, a sub-step's own timeout, is not slow for it).
            refused_after_wait(self._clock, self._clock.now_ns(), since)
            raise
        if left is not None and (now_left := remaining_ns(self._clock)) is not None and now_left <= 0:
            # Handed a slot in the instant its deadline passed: fail at wake, pass the slot on.
            self._release()
            refused_after_wait(self._clock, self._clock.now_ns(), since)
            raise self._late()
        # Admitted after waiting: an outer breaker leaves the wait out of the call's duration.
        admitted_after_wait(self._clock, self._clock.now_ns(), since)

    def _release(self) -> None:
        if self._managed is not None:
            return self._managed.release(self)
        waiters = self._waiters
        while waiters and self._active <= self._max:  # above a limit retuned lower, the slot retires
            waiter = waiters.popleft()
            waiter.queued = False
            waiter.granted = True  # the slot changes hands; the active count does not change
            assert waiter.future is not None
            if wake(waiter.future):
                return
            waiter.granted = False  # its event loop is closed: nobody will run; try the next
        self._active -= 1

    def _queue_rules(self) -> QueueRules | None:
        return self._managed

    def _retune(self, **changes: Any) -> None:
        """Swap the configuration live (stoic.ControlPlane.retune), validated by the constructor
        (``ValueError`` naming the parameter; the bulkhead unchanged). Calls running keep their
        slots: a lower limit retires slots as they are released, a higher one hands the new free
        slots to waiters at once. Queue management's learnt state restarts; turning it on or off
        needs an empty queue (``ValueError`` naming ``queue_target`` otherwise)."""
        fresh = validated(self, self._settings(), changes)
        self._check_retune(fresh)
        managed, new = self._managed, fresh._managed
        self._max, self._queue_limit, self._interval_ns = fresh._max, fresh._queue_limit, fresh._interval_ns
        if managed is not None and new is not None:
            managed.retune(new)
        else:
            self._managed = new
        if self._managed is not None:
            self._managed.fill(self)
        else:
            while self._waiters and self._active < self._max:
                self._active += 1
                self._release()  # hands the new slot over (or gives it back if nobody can run)

    _EXECUTE_DOC = """Run ``await fn(*args, **kwargs)`` in a slot, waiting for one if the queue allows.

        Returns what ``fn`` returns; its exceptions propagate unchanged and the slot is released
        however it ends. Raises ``BulkheadFull``, ``Shed`` (queue management dropped the waiter)
        or ``DeadlineExceeded`` (``fn`` never ran) when refused.
        """

    if TYPE_CHECKING:
        async def execute(self, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs) -> T: ...
    else:  # compiled from STAGE, as a pipeline that fuses this bulkhead is (stoic._source)
        execute = _execute(_EXECUTE_DOC)

    @through_method_decorators
    def __call__(self, fn: Callable[P, Awaitable[T]]) -> Callable[P, Coroutine[Any, Any, T]]:
        """Decorate an async function so every call runs in a slot.

        Raises ``TypeError`` for a plain function (use :class:`BlockingBulkhead`).
        """
        if not is_async_callable(fn):
            raise TypeError(f"{type(self).__name__} decorates async functions; use BlockingBulkhead for {fn!r}")

        @functools.wraps(fn)
        async def bulkheaded(*args: P.args, **kwargs: P.kwargs) -> T:
            return await self.execute(fn, *args, **kwargs)

        return bulkheaded

    # ``async with`` awaits what __aenter__/__aexit__ return. A slot taken (or given back) at once
    # needs no coroutine: they return an already-completed future, which ``await`` reads without
    # suspending. A completed future is never scheduled, so one made on an earlier event loop
    # serves any later loop too (only ``async with`` awaits them: never handed to gather & co).
    def __aenter__(self) -> Awaitable[Bulkhead]:
        active = self._active
        if active < self._max and (not _deadline.ever_set or _deadline_scope.get() is None):  # (as in execute)
            entered = self._entered
            if entered is None:
                entered = self._completed()  # (outside an asyncio loop this raises before a slot is taken)
            self._active = active + 1
            return entered
        return self._aenter_slow()

    async def _aenter_slow(self) -> Bulkhead:
        await self._enter_slow()
        if self._entered is None:
            self._completed()
        return self

    def _completed(self) -> asyncio.Future[Bulkhead]:
        loop = asyncio.get_running_loop()
        self._exited = loop.create_future()
        self._exited.set_result(None)  # None: __aexit__ never suppresses the block's exception
        entered = self._entered = loop.create_future()
        entered.set_result(self)
        return entered

    def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Awaitable[None]:
        if self._waiters:
            self._release()
        else:
            self._active -= 1
        return self._exited  # (an attribute read: a third of a call to _wakeup.completed)


class BlockingBulkhead(_Compartment):
    """The same bulkhead for threads: ``call(fn, *args, **kwargs)``, ``@bulkhead`` on a plain
    function, ``with bulkhead:``, or ``acquire(timeout=None)`` / ``release()``.

    ``BlockingBulkhead(max_concurrent, *, queue_limit=0, label, clock=None, queue_target=None,
    queue_interval=0.1, queue_adaptive_lifo=False, prioritized=False)``: the same constructor,
    rules and queue management as :class:`Bulkhead` (the decisions are the same code,
    ``stoic._waitqueue.QueueRules``; ``prioritized`` reads the criticality bound in the calling
    thread's context). A waiting thread holds no lock (it waits on its own condition); a slot
    is handed over under the lock, and every event is emitted outside it by the thread it
    concerns (a shed waiter reports its own shedding when it wakes).
    """

    __slots__ = ("_lock", "_rules")

    def __init__(
        self, max_concurrent: int, *, queue_limit: int | None = 0, label: str, clock: Clock | None = None,
        queue_target: Seconds | None = None, queue_interval: Seconds = 0.1, queue_adaptive_lifo: bool = False,
        prioritized: bool = False,
    ) -> None:
        super().__init__(max_concurrent, queue_limit=queue_limit, label=label, clock=clock)
        target_ns, interval_ns, lifo, prio = check_queue_options(
            queue_limit, queue_target, queue_interval, queue_adaptive_lifo, prioritized)
        self._interval_ns = interval_ns
        # None keeps the plain FIFO hand-over (the common case, and the cheapest).
        self._rules: QueueRules | None = (
            QueueRules(target_ns, interval_ns, lifo, prio) if target_ns is not None or lifo or prio else None)
        self._lock = threading.Lock()

    def acquire(self, timeout: Seconds | None = None) -> None:
        """Take a slot, waiting (FIFO, if the queue allows) at most ``timeout`` (seconds as a
        float or ``timedelta``, >= 0; ``None``: no limit but the ambient deadline).

        Raises ``BulkheadFull`` when every slot and queue place is taken; ``DeadlineExceeded``
        when the ambient deadline already passed, or ``timeout`` (measured on the bulkhead's
        clock) or the ambient deadline ran out while waiting (the waiter left without a slot,
        also when one was handed to it as its time ran out); ``Shed`` when queue management
        dropped the waiter; ``ValueError`` for a ``timeout`` outside ``[0, MAX_SECONDS]``,
        ``TypeError`` for one that is not a number or ``timedelta``. Pair every successful
        ``acquire`` with one :meth:`release`.

        A thread interrupted while queued (``KeyboardInterrupt``, ``SystemExit``, any exception
        raised into its wait) leaves without a slot (one handed to it in that instant goes to
        the next waiter), reports ``bulkhead.rejected`` with reason ``cancelled``, as a
        cancelled asyncio waiter does, and the exception propagates unchanged.
        """
        limit = None if timeout is None else to_ns(timeout, "timeout", allow_zero=True)
        left = remaining_ns(self._clock)
        if left is not None:
            if left <= 0:
                raise self._late()
            if limit is None or left < limit:
                limit = left  # an ambient deadline bounds the wait like a timeout
        # The instant the wait ends by, read before the lock: time spent waiting for it counts.
        give_up = None if limit is None else self._clock.now_ns() + limit
        lock = self._lock
        lock.acquire()
        # Which queue this caller joins is read under the lock: a retune may switch queue
        # management on or off (while nobody waits) between a read outside it and the queueing.
        rules = self._rules
        if rules is not None:
            return self._acquire_managed(rules, give_up)  # (releases the lock)
        queued = False
        try:
            try:
                waiters = self._waiters
                if self._active < self._max and not waiters:
                    self._active += 1
                    return
                waiting = len(waiters)
                since = self._clock.now_ns()
                queued = waiting < self._queue_limit
                admitted = queued and self._wait_locked(give_up)
            finally:
                lock.release()
        except BaseException:
            if queued:
                # Interrupted in the queue (a KeyboardInterrupt, any exception out of the wait):
                # it left unadmitted, and the wait was local queueing all the same. Reported as
                # a cancelled asyncio waiter is, by this thread, now outside the lock.
                refused_after_wait(self._clock, self._clock.now_ns(), since)
                self._left("cancelled")
            raise
        if admitted:
            # Admitted after waiting: an outer breaker leaves the wait out of the call's duration.
            admitted_after_wait(self._clock, self._clock.now_ns(), since)
            return
        # Events are emitted outside the lock: a sink never runs inside the critical section.
        # (Judged by whether it queued, not by the queue limit now: a retune may have lowered
        # it below this waiter's place while it waited its whole time.)
        if not queued:
            raise self._full(waiting)
        # Out of time in the queue: the wait was local queueing all the same.
        refused_after_wait(self._clock, self._clock.now_ns(), since)
        raise self._late()

    def _wait_locked(self, give_up: int | None) -> bool:
        """Queue and wait for a slot to be handed over; False when the clock reached ``give_up``
        (an instant on it; None: no limit) first."""
        waiter = _Waiter()
        waiter.cond = threading.Condition(self._lock)
        self._waiters.append(waiter)
        try:
            while not waiter.granted:
                if give_up is None:
                    waiter.cond.wait()
                    continue
                left = give_up - self._clock.now_ns()
                if left <= 0:
                    waiter.queued = False
                    self._waiters.remove(waiter)
                    return False
                # On a VirtualClock woken as its time moves (a timeout on virtual time).
                wait_until(self._clock, waiter.cond, give_up, left)
        except BaseException:
            if waiter.granted:
                self._release_locked()
            elif waiter.queued:
                waiter.queued = False
                self._waiters.remove(waiter)
            raise
        if give_up is not None and self._clock.now_ns() >= give_up:
            self._release_locked()  # handed a slot as its time ran out: fail at wake, pass it on
            return False
        return True

    def _queue_rules(self) -> QueueRules | None:
        return self._rules

    def _retune(self, **changes: Any) -> None:
        """Swap the configuration live, as :meth:`Bulkhead._retune` does (queue management
        included: its options can change, and it can be switched on or off while nobody waits).
        The settings are read under the lock, so a retune from another thread is never undone."""
        with self._lock:
            fresh = self._retune_prepare(changes)
            self._check_retune(fresh)
            self._retune_apply(fresh)

    def _retune_prepare(self, changes: dict[str, Any]) -> BlockingBulkhead:
        """The validated configuration :meth:`_retune` would take, for a caller holding ``_lock``
        (stoic.Keyed, which holds every key's lock across its checks and its changes; then
        :meth:`_check_retune` and :meth:`_retune_apply`)."""
        return validated(self, self._settings(), changes)

    def _retune_apply(self, fresh: BlockingBulkhead) -> None:
        """Take ``fresh``'s configuration (checked by :meth:`_check_retune`), holding ``_lock``."""
        self._max, self._queue_limit, self._interval_ns = fresh._max, fresh._queue_limit, fresh._interval_ns
        rules, new = self._rules, fresh._rules
        if rules is not None and new is not None:
            rules.retune(new)
        else:
            self._rules = new
        while self._waiters and self._active < self._max:
            self._active += 1
            self._release_locked()

    def _acquire_managed(self, rules: QueueRules, give_up: int | None) -> None:
        """:meth:`acquire` past the checks of the ambient deadline, under queue management:
        called holding the lock (``rules`` read under it), which it releases. ``give_up``: the
        instant on the clock the wait ends by (None: no limit)."""
        clock = self._clock
        parked: Parked | None = None
        victim: _Waiter | None = None
        admitted = False
        try:
            try:
                tier = rules.tier_now()  # the calling thread's criticality
                waiters = self._waiters
                if self._active < self._max and not waiters:
                    self._active += 1
                    return
                now = clock.now_ns()
                waiting = len(waiters)
                full = waiting >= self._queue_limit  # (decided here: a retune may change the limit after)
                may_wait = give_up is None or give_up > now  # (one that may not wait displaces nobody)
                if may_wait and full:
                    victim = rules.displaceable(waiters, tier)
                    if victim is not None:
                        waiters.remove(victim)
                        victim.queued = False
                        self._drop_locked(now, victim, rules.parked[id(victim)], "priority")
                if may_wait and (not full or victim is not None):
                    parked = rules.park(waiters, (waiter := _Waiter()), now, tier,
                                        NO_DEADLINE if give_up is None else give_up)
                    try:
                        admitted = self._wait_managed_locked(waiter, parked)
                    finally:
                        rules.parked.pop(id(waiter), None)
            finally:
                self._lock.release()
        except BaseException:
            if parked is not None:
                # Left the queue on an exception out of the wait (a KeyboardInterrupt, ...):
                # unadmitted, and the wait was local queueing all the same.
                refused_after_wait(clock, clock.now_ns(), parked.since_ns)
            if parked is not None and parked.error is not None:  # dropped, then interrupted
                shed_event(self, self._reason(parked.error), parked.dropped_ns - parked.since_ns, parked.tier)
            elif parked is not None:
                # Interrupted in the queue: reported as a cancelled asyncio waiter is.
                shed_event(self, "cancelled", clock.now_ns() - parked.since_ns, parked.tier)
            raise
        # Events are emitted outside the lock: a sink never runs inside the critical section.
        if admitted:
            assert parked is not None
            # Admitted after waiting: an outer breaker leaves the wait out of the call's duration.
            admitted_after_wait(clock, clock.now_ns(), parked.since_ns)
            return
        if parked is None:
            raise self._full(waiting) if full else self._late()
        # Dropped or out of time in the queue: the wait was local queueing all the same.
        refused_after_wait(clock, clock.now_ns(), parked.since_ns)
        if parked.error is not None:
            shed_event(self, self._reason(parked.error), parked.dropped_ns - parked.since_ns, parked.tier)
            raise parked.error
        # Out of time in the queue: reported as a shed waiter is, with its wait and its tier.
        shed_event(self, "deadline_exceeded", clock.now_ns() - parked.since_ns, parked.tier)
        raise self._late_error()

    def _wait_managed_locked(self, waiter: _Waiter, parked: Parked) -> bool:
        """Wait for a slot until granted (True), dropped by the rules (False, ``parked.error``
        set) or out of time (False)."""
        cond = waiter.cond = threading.Condition(self._lock)
        clock = self._clock
        deadline = parked.deadline_ns
        try:
            while not waiter.granted and parked.error is None:
                if deadline == NO_DEADLINE:
                    cond.wait()
                    continue
                left = deadline - clock.now_ns()
                if left <= 0:
                    waiter.queued = False
                    self._waiters.remove(waiter)
                    self._drained()
                    return False
                wait_until(clock, cond, deadline, left)
        except BaseException:
            if waiter.granted:
                self._release_locked()  # granted in the same instant it was interrupted: pass it on
            elif waiter.queued:
                waiter.queued = False
                self._waiters.remove(waiter)
                self._drained()
            raise
        if parked.error is not None:
            return False
        if deadline != NO_DEADLINE and (now := clock.now_ns()) >= deadline:
            # Woken with a slot after its deadline (handed over as its time ran out): pass it on.
            self._release_locked()
            self._drop_locked(now, None, parked, "deadline_exceeded")
            return False
        return True

    def _drained(self) -> None:
        """A managed waiter left the queue by itself (under the lock): CoDel sees it drain."""
        assert self._rules is not None
        self._rules.drained(self._waiters, self._clock.now_ns())

    def _drop_locked(self, now: int, waiter: _Waiter | None, parked: Parked, reason: str) -> None:
        """Fail a waiter the rules removed from the queue and wake it (it reports itself)."""
        parked.error = shed_error(reason, self._label)
        parked.dropped_ns = now
        if waiter is not None:
            assert waiter.cond is not None
            waiter.cond.notify()

    @staticmethod
    def _reason(error: BaseException) -> str:
        return error.cause if isinstance(error, Shed) else "deadline_exceeded"

    def _release_locked(self) -> None:
        waiters = self._waiters
        if waiters and self._active <= self._max:  # above a limit retuned lower, the slot retires
            rules = self._rules
            if rules is None:
                waiter: _Waiter | None = waiters.popleft()
            else:
                now = self._clock.now_ns()
                waiter = rules.next_waiter(waiters, now, functools.partial(self._drop_locked, now))
                if waiter is None:  # every waiter was dropped: the slot is free
                    self._active -= 1
                    return
            assert waiter is not None and waiter.cond is not None
            waiter.queued = False
            waiter.granted = True
            waiter.cond.notify()
        else:
            self._active -= 1

    def release(self) -> None:
        """Give back a slot taken with :meth:`acquire` (to the first waiter, if any).

        Raises ``RuntimeError`` when no slot is taken.
        """
        with self._lock:
            if self._active <= 0:
                raise RuntimeError(f"release() without a matching acquire() ({self._label})")
            self._release_locked()

    def call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn(*args, **kwargs)`` in a slot (as :meth:`acquire` without a timeout).

        Returns what ``fn`` returns; its exceptions propagate unchanged; the slot is released
        however it ends. ``fn`` returning a coroutine or a generator (work that would run
        later, outside the slot) raises ``TypeError``, its cause a :class:`stoic.Defect`.
        """
        lock = self._lock
        taken = False
        if _deadline_scope.get() is None:
            lock.acquire()  # (acquire/release in try/finally: half the cost of ``with lock`` on CPython 3.11)
            try:
                if self._active < self._max and not self._waiters:
                    self._active += 1
                    taken = True
            finally:
                lock.release()
        if not taken:
            self.acquire()
        try:
            result = fn(*args, **kwargs)
            if type(result) in UNRUN_RESULTS:  # its body would run later, outside the slot
                refuse_unrun_result(fn, result, "BlockingBulkhead", "Bulkhead")
            return result
        finally:
            lock.acquire()
            try:
                self._release_locked()
            finally:
                lock.release()

    @through_method_decorators
    def __call__(self, fn: Callable[P, T]) -> Callable[P, T]:
        """Decorate a plain function so every call runs in a slot (blocking). Raises ``TypeError``
        for an async function (use :class:`Bulkhead`) or a generator function."""
        refuse_generator_function(fn, type(self).__name__)
        if is_async_callable(fn):
            raise TypeError(f"{type(self).__name__} decorates plain functions; use Bulkhead for {fn!r}")

        @functools.wraps(fn)
        def bulkheaded(*args: P.args, **kwargs: P.kwargs) -> T:
            return self.call(fn, *args, **kwargs)

        return bulkheaded

    def __enter__(self) -> BlockingBulkhead:
        self.acquire()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


__all__ = ["BlockingBulkhead", "Bulkhead"]
