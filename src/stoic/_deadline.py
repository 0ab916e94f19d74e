"""The ambient deadline: ``stoic.timeout()`` and ``stoic.deadline()``.

A deadline is an instant on a clock, kept in a context variable so that every policy running
inside the block can see how much time is left (to refuse work that is already late) and can
tell a cancellation caused by the deadline from any other (design/python.md, "Cancellation and
deadlines"; seed 000, "Cancellation and deadlines, for every policy").

A deadline records the clock it was set on, and time left is always measured on that clock. A
policy measures its own waits on its own clock, so it asks :func:`remaining_ns` with that clock:
a deadline on another clock cannot be compared with the policy's waits (a ``timeout(5)`` on the
system clock around a retry on a virtual clock would never see the retry's virtual sleeps), and
is refused with :class:`ClockMismatch` rather than silently mixed (docs/design.md, "Deadlines
and clocks").
"""

from __future__ import annotations

from contextvars import ContextVar, Token
from types import TracebackType
from typing import TYPE_CHECKING, Any

from . import _admission
from ._clock import Clock, TimerHandle, resolve_clock, same_clock
from ._durations import Seconds, check_label, instant_to_ns, to_ns
from ._errors import DeadlineExceeded, Defect, leaves
from .events import Level, emit
from .events._sinks import kind_floor

if TYPE_CHECKING:
    import asyncio
else:  # imported on first use (stoic._lazy)
    from ._lazy import lazy_asyncio

    asyncio = lazy_asyncio(globals())

# The sinks wanting timeout events (stoic.events._sinks.KindFloor): a sink that wants none of
# them leaves these events unbuilt.
_SINKS = kind_floor("timeout")

DEADLINE_CANCEL_MESSAGE = "stoic: deadline exceeded"


class _Scope:
    """One ``timeout``/``deadline`` block: its instant, its clock, whether it fired and when (on
    its clock)."""

    __slots__ = ("clock", "when_ns", "parent", "fired", "fired_ns", "label")

    def __init__(self, clock: Clock, when_ns: int, parent: _Scope | None, label: str | None) -> None:
        self.clock = clock
        self.when_ns = when_ns
        self.parent = parent
        self.fired = False
        self.fired_ns = 0
        self.label = label

    def cut_a_wait(self) -> bool:
        """Whether this block fired while the work in it waited in a local stage's queue: a wait
        recorded in this context (stoic._admission) ended at or after the firing."""
        return _admission.state.waits > 0 and bool(_admission.waits_after(self.clock, self.fired_ns - 1))


_current: ContextVar[_Scope | None] = ContextVar("stoic.deadline", default=None)

# Whether any timeout()/deadline() block has ever been entered in this process (never cleared).
# Until one has, no context can hold a deadline, so hot paths test this plain module attribute
# first (``if _deadline.ever_set and _current.get() is not None``): a module attribute read
# costs a few ns; ContextVar.get ~10 ns more, ~40 ns more when some context variable was set
# since its last read (its cache is then stale: a retry sets its in-attempt mark on every
# call). Set before the variable, so any context that can see a scope also sees the flag.
ever_set = False


class ClockMismatch(Defect, ValueError):
    """A policy on one clock ran inside a ``stoic.timeout``/``stoic.deadline`` set on another.

    Their instants cannot be compared (virtual time moves without real time, and the reverse),
    so the policy refuses to run rather than judge the deadline wrongly. A :class:`stoic.Defect`:
    a mistake in the program, never counted by a breaker nor retried. Fix it by giving both the
    same clock (``clock=``, or :func:`stoic.use_clock` around both).
    """


def check_deadline_clocks(scope: _Scope | None, clock: Clock) -> None:
    """Raise :class:`ClockMismatch` when ``scope`` (the ambient deadline) or one around it was set
    on another clock than ``clock``, the clock of the policy asking: the one rule every policy
    that compares its waits with a deadline applies."""
    while scope is not None:
        if scope.clock is not clock and not same_clock(scope.clock, clock):
            raise ClockMismatch(
                f"a stoic.timeout/deadline{f' ({scope.label})' if scope.label else ''} set on {scope.clock!r} "
                f"encloses a policy measuring time on {clock!r}: their instants cannot be compared; a deadline "
                "and the policies under it must use one clock (clock=, or stoic.use_clock around both)"
            )
        scope = scope.parent


def remaining_ns(clock: Clock | None = None) -> int | None:
    """Nanoseconds left before the tightest ambient deadline (may be negative), or ``None``.

    Each deadline is measured on the clock it was set on. ``clock``: the clock of the policy
    asking, which will compare the answer with its own waits; raises :class:`ClockMismatch`
    when an ambient deadline runs on a different clock. Without ``clock`` nothing is compared
    (for reporting, as :func:`stoic.time_remaining` does).
    """
    scope = _current.get()
    if scope is None:
        return None
    best: int | None = None
    if clock is not None:
        check_deadline_clocks(scope, clock)
    while scope is not None:
        left = scope.when_ns - scope.clock.now_ns()
        if best is None or left < best:
            best = left
        scope = scope.parent
    return best


def deadline_ns(clock: Clock) -> int | None:
    """The tightest ambient deadline as an instant on ``clock`` (the asking policy's), or
    ``None`` without one. Raises :class:`ClockMismatch` as :func:`remaining_ns` does."""
    left = remaining_ns(clock)
    return None if left is None else clock.now_ns() + left


def _is_cancellation(error: BaseException | None) -> bool:
    """A ``CancelledError``, or an exception group holding nothing else (a ``TaskGroup`` cut by
    the deadline while its children were being cancelled)."""
    if isinstance(error, asyncio.CancelledError):
        return True
    if not isinstance(error, BaseExceptionGroup):
        return False
    found = leaves(error)
    return bool(found) and all(isinstance(leaf, asyncio.CancelledError) for leaf in found)


def cancel_explains(task: asyncio.Task[Any], error: BaseException) -> bool:
    """Whether a cancel request that reached ``task`` explains ``error``, the ordinary exception
    the work it ran ended with: the request is still pending (not yet delivered: asyncio's Task
    keeps it in ``_must_cancel``), or it was delivered as a ``CancelledError`` that the work
    turned into ``error`` (in its cause/context chain, not behind a ``TimeoutError``: an inner
    ``asyncio.timeout``/``stoic.timeout`` turns its *own* cancel into one, which is the
    dependency being slow). An exception group, a ``TaskGroup``'s verdict on its children, is
    explained when every leaf is: the children failed on their way out of the cancellation."""
    if getattr(task, "_must_cancel", False):
        return True
    found = leaves(error)
    return bool(found) and all(_turned_from_cancel(leaf) for leaf in found)


def caller_cancelled(error: BaseException) -> bool:
    """Whether the task running the call is being cancelled, asked when the operation ended with
    the ordinary exception ``error`` (a ``CancelledError`` or other ``BaseException`` is never
    counted anyway). One rule for every policy that judges an error: the breakers (not counted)
    and ``with_fallback`` (not substituted).

    The caller is being cancelled when a cancel request reached its task during the call and
    explains ``error`` (``stoic._deadline.cancel_explains``: still pending, or delivered as the
    ``CancelledError`` the operation turned into ``error``; for an exception group, into every
    leaf of it).

    ``task.cancelling()`` above zero alone proves nothing: a cancel swallowed earlier (a failed
    ``TaskGroup`` on Python 3.11 never calls ``uncancel()``, nor do some libraries) leaves it
    raised for the rest of the task, whose later failures must count (field report 17). The
    count is not read on entry (on 3.11 finding the current task costs a ``getpid`` system call,
    ~100 ns, more than half the breaker's success path); it is read only here, on an error.
    """
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running loop: a coroutine closed or driven by hand
        return False
    if task is None or task.cancelling() == 0:
        return False
    return cancel_explains(task, error)


def _turned_from_cancel(error: BaseException) -> bool:
    link: BaseException | None = error
    for _ in range(16):
        if link is None or isinstance(link, TimeoutError):
            return False
        if isinstance(link, asyncio.CancelledError):
            return True
        link = link.__cause__ or link.__context__
    return False


def _cancel_pending(task: asyncio.Task[Any]) -> bool:
    """Whether a cancel request has reached ``task`` and not yet been delivered (the task has
    not run since): it is to be thrown in at its next step, or the future it awaits was
    cancelled for it. (The pure-Python and C tasks both expose these two attributes.)"""
    if getattr(task, "_must_cancel", False):
        return True
    waiter = getattr(task, "_fut_waiter", None)
    return waiter is not None and waiter.cancelled()


def _foreign_cancel_in_flight(error: BaseException | None) -> bool:
    """Whether ``error`` (a block's cancellation) is, or was raised while handling, a
    ``CancelledError`` that is not a deadline's: a caller's cancel already delivered, on its way
    out through cleanup that awaits (a ``finally``, an ``except`` that re-raises it) when the
    deadline fired. A request spent and swallowed (the stale count of field report 17) leaves
    no such trace. (A group is judged by its own history: its leaves are children cancelled by
    their group, whatever cancelled the group.)"""
    link = error
    for _ in range(16):
        if link is None:
            return False
        if isinstance(link, asyncio.CancelledError) and link.args != (DEADLINE_CANCEL_MESSAGE,):
            return True
        link = link.__cause__ or link.__context__
    return False


def cancelled_since(task: asyncio.Task[Any], cancels: int, error: BaseException) -> bool:
    """Whether ``task`` is being cancelled, judged when work a policy began while the task's
    ``cancelling()`` count was ``cancels`` ended with the exception ``error`` (field report
    17): the count rose since, and the rise is not a ``TaskGroup``'s own request.

    On Python 3.11 and early 3.12 a TaskGroup whose child fails while its body waits in
    ``__aexit__`` cancels its parent task and never takes the request back. The work then ends
    with the group's exception group, or with what the work made of it (``except*``, or
    ``raise group.exceptions[0]``): the group is in ``error``'s history (itself or its
    cause/context chain). A rise with such a group in the history and no trace of a
    cancellation (no request pending, no ``CancelledError`` in the chain, no leaf of the group
    raised out of one) is that TaskGroup's; any other rise is the caller's. (Any leaf, not
    every one: ``raise group.exceptions[0]`` replaces that leaf's own context with the group.
    A TaskGroup's own failure whose cancelled siblings turned their cancellation into errors
    is then taken for the caller's, as the count alone always took it.)"""
    if task.cancelling() <= cancels:
        return False
    if getattr(task, "_must_cancel", False):
        return True
    group = False
    link: BaseException | None = error
    for _ in range(16):
        if link is None:
            break
        if isinstance(link, asyncio.CancelledError):
            return True
        if isinstance(link, BaseExceptionGroup):
            if any(_turned_from_cancel(leaf) for leaf in leaves(link)):
                return True
            group = True
        link = link.__cause__ or link.__context__
    return not group


def time_remaining() -> float | None:
    """Seconds left before the ambient deadline (negative once passed), or ``None`` without one."""
    left = remaining_ns()
    return None if left is None else left / 1e9


def cancelled_by_deadline() -> bool:
    """True when an enclosing ``timeout``/``deadline`` block has fired.

    A policy that catches ``asyncio.CancelledError`` while waiting uses this to report the wait
    as ``deadline_exceeded`` rather than ``cancelled``.
    """
    scope = _current.get()
    while scope is not None:
        if scope.fired:
            return True
        scope = scope.parent
    return False


def deadline_cut_running_work() -> bool:
    """True when an enclosing ``timeout``/``deadline`` block has fired while the work under it
    ran, not while it waited in a local stage's queue: asked by a policy that judges the
    dependency (an adaptive limit, a throttle) when the call it ran ends with the deadline's
    ``CancelledError``. A deadline that cut a wait in an inner bulkhead's or limiter's queue is
    local queueing, no more evidence about the dependency than the ``DeadlineExceeded``
    (``timed_out`` False) the block then raises (field report 20, under an overall timeout)."""
    scope = _current.get()
    fired = False
    while scope is not None:
        if scope.fired:
            if scope.cut_a_wait():
                return False
            fired = True
        scope = scope.parent
    return fired


class Timeout:
    """Async context manager behind :func:`timeout` and :func:`deadline`.

    On expiry it cancels the enclosing task and, when the block ends with that cancellation,
    raises :class:`DeadlineExceeded` instead. A cancellation from anywhere else passes through.
    """

    __slots__ = ("_clock", "_when_ns", "_label", "_scope", "_token", "_task", "_cancelling", "_stale", "_handle")

    def __init__(self, when_ns: int, clock: Clock, label: str | None) -> None:
        self._clock = clock
        self._when_ns = when_ns
        self._label = label
        self._scope: _Scope | None = None
        self._token: Token[_Scope | None] | None = None
        self._task: asyncio.Task[object] | None = None
        self._cancelling = 0
        self._stale = -1  # the count at firing, when it had risen inside the block (see _fire)
        self._handle: TimerHandle | None = None

    @property
    def expired(self) -> bool:
        """Whether this block's deadline fired."""
        return self._scope is not None and self._scope.fired

    def __repr__(self) -> str:
        return f"Timeout(deadline={self._when_ns / 1e9!r}, label={self._label!r}, clock={self._clock!r})"

    async def __aenter__(self) -> Timeout:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("stoic.timeout() must be used inside an asyncio task")
        if self._scope is not None:
            raise RuntimeError("a stoic.timeout()/deadline() object can be entered only once")
        self._task = task
        self._cancelling = task.cancelling()
        global ever_set
        ever_set = True
        self._scope = _Scope(self._clock, self._when_ns, _current.get(), self._label)
        self._token = _current.set(self._scope)
        self._handle = self._clock.call_at(self._when_ns, self._fire)
        return self

    def _fire(self) -> None:
        assert self._scope is not None and self._task is not None
        self._scope.fired = True
        self._scope.fired_ns = now = self._clock.now_ns()
        task = self._task
        if task.cancelling() > self._cancelling and not _cancel_pending(task):
            # A request made inside the block and spent without uncancel() (a TaskGroup whose
            # child failed, on 3.11; a library swallowing a cancel) left the count raised: our
            # request may be judged against the count as it stands, or it would pass for a
            # caller's (field report 17). A request still pending is a caller's, and keeps the
            # old count; so is one delivered and still on its way out (see __aexit__).
            self._stale = task.cancelling()
        task.cancel(DEADLINE_CANCEL_MESSAGE)
        if _SINKS.wants(Level.INFO):
            emit("timeout.expired", self._label or "timeout", Level.INFO, now, {})

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._scope is not None and self._token is not None and self._task is not None
        if self._handle is not None:
            self._handle.cancel()
        try:
            _current.reset(self._token)
        except ValueError:
            # Left in another context than it was entered in: a suspended coroutine closed from
            # outside its task (GeneratorExit, by close() or the garbage collector). That context
            # never saw this deadline, so there is nothing to restore in it, and the close must
            # not fail with this error in place of its GeneratorExit.
            if not isinstance(exc, GeneratorExit):
                raise
        if not self._scope.fired:
            return None
        # Our cancel request is spent either way; take it back so it is not delivered later.
        # Ended by our cancellation (bare, or as the only content of exception groups): the
        # deadline's. A group with any other error in it is the block's own outcome and passes.
        left = self._task.uncancel()
        if _is_cancellation(exc) and (
                left <= self._cancelling
                or (left <= self._stale and not _foreign_cancel_in_flight(exc))):
            raise DeadlineExceeded(
                    f"deadline exceeded{f' ({self._label})' if self._label else ''}", label=self._label,
                    # Fired while the block waited in a local stage's queue (a wait, admitted
                    # or not, that ended after the firing): nothing of the dependency was cut
                    # short, only local queueing (field report 20), and the policies that count
                    # a hung call ignore it as the rejection it is.
                    timed_out=not self._scope.cut_a_wait(),
                ) from exc
        return None


def timeout(seconds: Seconds, *, label: str | None = None, clock: Clock | None = None) -> Timeout:
    """Bound the enclosed ``async with`` block to ``seconds`` (float seconds or timedelta, >= 0).

    The deadline is ``seconds`` from this call (as with ``asyncio.timeout``), not from entering
    the block. Sets the ambient deadline for everything inside it. At expiry the block is
    cancelled and :class:`stoic.DeadlineExceeded` (a ``TimeoutError``) is raised from the
    ``async with``.
    Runs on ``clock``, else the ambient clock (the deadline keeps that clock: policies inside
    compare it on their own clock, see :func:`remaining_ns`). ``label`` (optional, a non-empty
    str) names the deadline in its error and events.

    Raises ``ValueError`` for a negative duration or one above ``MAX_SECONDS`` (10**12 s: the
    one range of every duration, docs/design.md "Durations"), ``TypeError`` for a non-number,
    a non-str ``label`` or a ``clock`` that is not a :class:`stoic.Clock`; all at the call,
    before the block is entered.
    """
    ns = to_ns(seconds, "seconds", allow_zero=True)
    label = check_label(label, optional=True)
    clk = resolve_clock(clock)
    return Timeout(clk.now_ns() + ns, clk, label)


def deadline(instant: float, *, label: str | None = None, clock: Clock | None = None) -> Timeout:
    """Like :func:`timeout`, but until ``instant``: seconds on the clock's monotonic timeline
    (as ``clock.now_ns() / 1e9``). An instant already passed expires at once.

    Raises ``ValueError`` naming ``instant`` when it is not a finite number (``TypeError``
    when it is not a number at all), and the errors of :func:`timeout` for ``label``/``clock``."""
    when_ns = instant_to_ns(instant)
    label = check_label(label, optional=True)
    clk = resolve_clock(clock)
    return Timeout(when_ns, clk, label)
