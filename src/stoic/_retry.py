"""retry, retry_sync, retrying and recur (seed 001, "Semantics").

One engine, :class:`_Run`, holds what a call needs once it has failed; the first attempt runs
without it, so a call that succeeds at once allocates nothing beyond its coroutine, builds no
event and takes no lock (its budget deposit is one ``next()``).
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
import types
from collections.abc import Awaitable, Callable, Coroutine
from contextvars import ContextVar, Token
from types import AsyncGeneratorType, CodeType, CoroutineType, GeneratorType, ModuleType
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from . import _clock, _deadline, _lazy, _metrics, _random
from ._attempt import Attempt, first_attempt
from ._budget import _NO_OP, RetryBudget, _registry, _Site, site_of_frame
from ._callbacks import callback_failed
from ._classify import ClassifierLike, RetryClassifier, RetryDecision, RetryNesting, as_classifier
from ._clock import SYSTEM_CLOCK, Clock, _ambient_clock, check_clock, current_clock
from ._deadline import Timeout, cancelled_since, remaining_ns
from ._deadline import _current as _deadline_scope
from ._durations import Seconds, check_label, to_ns
from ._errors import DeadlineExceeded, Defect, close_unrun, is_defect, misused
from ._policy import UNRUN_RESULTS, is_async_callable, through_method_decorators
from .events import Level, emit, error_type
from .events._sinks import kind_floor
from .schedule import MAX_NS, BoundedSchedule, Schedule

if TYPE_CHECKING:
    import asyncio
else:  # imported on first use (stoic._lazy)
    from ._lazy import lazy_asyncio

    asyncio = lazy_asyncio(globals())

# The sinks wanting retry events (stoic.events._sinks.KindFloor): a sink that wants none of
# them leaves these events unbuilt.
_SINKS = kind_floor("retry")

P = ParamSpec("P")
R = TypeVar("R")

RETRY_AFTER_CAP_NS = 300 * 1_000_000_000
"""A Retry-After longer than five minutes is capped (retry.after_capped)."""

# One mark per attempt of a retry call, ``[running, parent, budget]``: ``running`` is 1 while
# the first attempt runs, 2 while a later one does (any true value is "running": only a hedge's
# test, _counted_on, tells them apart), else 0; ``parent`` is the mark that was running where
# the retry started (the attempt it is nested in), else None; ``budget`` the retry's RetryBudget
# (a hedge started in the attempt reads it: see below), or None for a retry collapsed in
# another's attempt (SINGLE_ATTEMPT): its one attempt is the outer attempt's request, counted
# where that one is, not on its own budget.
# A retry starts inside an attempt when the mark it finds, or one up that mark's parent chain,
# is running (seed 001, "Nesting").
#
# Each attempt sets its own fresh mark in a context variable and it is never reset; only the
# retry that made a mark changes it. So a task or thread whose context was copied during an
# attempt (created by it, handed work by it) holds that attempt's mark, and is inside it exactly
# while the attempt runs; a context copied before the attempt holds an older mark, not running;
# and a task that outlives the attempt that created it is free once the attempt has ended, the
# retry's later attempts included (_attempt_mark). One set and one small list per attempt, no
# reset and no read of the task or thread (the set's token gives the mark it replaced): a
# success costs what one context-variable write costs.
#
# A hedge on a budget it was given (one a retry may share: stoic.hedge._race_marked) sets a mark
# of its own for the length of a call, ``[0, parent, budget, 1]``: never running
# (a retry in a hedged attempt still retries), ``parent`` the mark it replaced (or _IDLE), so a
# retry in the hedged operation sees any retry attempt the hedge runs in; ``budget`` the budget
# the hedge spends from, None once the call has ended. A retry starting on that very budget
# deposits nothing (see _FIRST_ATTEMPT); a retry mark is three long, so ``len`` tells them apart.
# A retry started in the hedged attempt takes the hedge's mark as its parent (_hedged), so
# every retry the attempt runs, not only the first, finds it. The other way round, a hedge
# started in a running retry attempt, or in another hedge's call, on its own budget deposits
# nothing either (_counted_on): its first attempt is that request.
_Mark = list[Any]
_marks: ContextVar[_Mark | None] = ContextVar("stoic.retry.attempts", default=None)
_get_marks = _marks.get
_set_marks = _marks.set
# What a set's token says it replaced where no retry set a mark before: the variable only ever
# holds marks (never None), so this is the one other value a mark test meets.
_NO_MARK = Token.MISSING
_IDLE: _Mark = [0, None, None]  # a hedge mark's parent where it replaced no mark (never running)
_reset_marks = _marks.reset


def _running(mark: _Mark | None) -> bool:
    """Whether ``mark`` or one up its parent chain is running."""
    while mark is not None:
        if mark[0]:
            return True
        mark = mark[1]
    return False


def _live_hedge(mark: _Mark | None) -> _Mark | None:
    """The first hedge mark (four long) up ``mark``'s chain, itself included, whose call still
    runs, before a running retry mark; None when there is none."""
    while mark is not None and not mark[0]:
        if len(mark) > 3 and mark[2] is not None:
            return mark
        mark = mark[1]
    return None


def _hedged(old: _Mark, mark: _Mark, bucket: RetryBudget) -> bool:
    """Whether a retry whose mark ``mark`` replaced ``old`` (a mark not running, nor any up its
    chain) starts in an attempt of a hedge spending from ``bucket``: a hedge mark up ``old``'s
    chain, itself included, holds that budget, its call still running. The first such hedge's
    mark (on any budget) becomes ``mark``'s parent, so a later retry in the same attempt,
    finding this one's mark, sees it."""
    hedge = _live_hedge(old)
    if hedge is None:  # (no hedge, or its call has ended: not linked)
        return False
    mark[1] = hedge
    return _in_hedge_on(hedge, bucket)


def _in_hedge_on(mark: _Mark | None, bucket: RetryBudget) -> bool:
    """Whether ``mark`` lies in a call of a hedge spending from ``bucket`` that runs inside the
    innermost running retry attempt around it (if any): a hedge mark up the chain before a
    running retry mark holds that budget (an outer hedge's, past a hedge on another budget, too).
    ``mark`` may be the hedge's own, or the finished mark of a retry the hedged attempt ran
    before (its parent is the hedge's: _hedged, or the running branch of _FIRST_ATTEMPT)."""
    while mark is not None and not mark[0]:
        if len(mark) > 3 and mark[2] is bucket:  # (None once the hedge's call has ended)
            return True
        mark = mark[1]
    return False


def _counted_on(mark: _Mark | None, bucket: RetryBudget) -> bool:
    """Whether a hedge spending from ``bucket``, starting where ``mark`` is set, runs in a request
    already counted on that budget: in a call of a hedge on it (_in_hedge_on), or in the running
    attempt of a retry on it. A later attempt of a retry on another budget is a request of its
    own, paid for there: not counted on ``bucket``. A first attempt is the request of the attempt,
    or hedge call, the retry started in (its parent; none at the top): on another budget, or
    collapsed (its budget None), the walk goes on to where that request is counted."""
    while mark is not None:
        running = mark[0]
        if running:
            if mark[2] is bucket:
                return True
            if running != 1:
                return False
        elif len(mark) > 3 and mark[2] is bucket:
            return True
        mark = mark[1]
    return False


def _nested(mark: _Mark) -> bool:
    """Whether the retry of ``mark`` started inside another's attempt. Its parent is that
    attempt's mark, or a hedge's (_hedged) when it started in a hedged attempt and no retry
    attempt: a hedge's mark makes it nested only when its chain is running (a hedge running in a
    retry's attempt; marks never run again, so one not running at the start is not now)."""
    parent = mark[1]
    return parent is not None and (len(parent) < 4 or _running(parent))


_SINGLE = RetryNesting.SINGLE_ATTEMPT
_site_at = _registry.frames.get  # the dict is cleared in place by reset_budgets(), never replaced
_PER_SITE = RetryBudget.PER_CALL_SITE
_getframe = sys._getframe
_get_ident = threading.get_ident


def _attempt_mark(mark: _Mark, number: int) -> _Mark:
    """The mark of attempt ``number`` of the retry whose first attempt ran under ``mark``, set
    running: ``mark`` itself for the first, a fresh one with the same parent (set in the context;
    running 2: a request of its own, see _counted_on) for each later attempt, so that a task or
    thread an earlier attempt created, and which outlived it, is not inside this one (it retries
    in full once its attempt has ended)."""
    if number == 1:
        mark[0] = 1
        return mark
    fresh: _Mark = [2, mark[1], mark[2]]  # (never collapsed: its budget is the retry's)
    _set_marks(fresh)
    return fresh


def _misuse_raised(fn: object, mark: _Mark, bucket: RetryBudget, number: int) -> None:
    """A misused operation ``fn`` (stoic._errors.misused) is about to be raised from attempt
    ``number`` of the retry of ``mark``: a first attempt's deposit, if the retry made one, is
    taken back, and a coroutine handed over in place of the operation is closed (it will never
    run: no "never awaited" warning on top of the error).
    It made one unless collapsed (its budget None) or in a hedge's attempt on ``bucket``
    (``_FIRST_ATTEMPT``); the misuse is raised at the call, so the marks are as they were then."""
    if number == 1 and mark[2] is not None and not _in_hedge_on(mark[1], bucket):
        bucket._take_back()
    close_unrun(fn)


def in_retry_attempt() -> bool:
    """True while running inside an attempt of some ``retry``: of this task (or thread), or of
    the task or thread this one was created from, while that attempt runs."""
    return _running(_get_marks())


def _check_schedule(schedule: object) -> BoundedSchedule:
    if isinstance(schedule, BoundedSchedule):
        return schedule
    if isinstance(schedule, Schedule):
        raise TypeError(
            f"retry needs a bounded schedule, got {schedule!r}: call .attempts(n) on it, or build one "
            "with Schedule.delays([...]) (an unbounded retry never ends under an outage)"
        )
    raise TypeError(f"schedule must be a BoundedSchedule (retry's first argument), got {type(schedule).__name__}")


# --- does the operation want an Attempt? -----------------------------------------------------

# id(code) -> (code, wants): hashing a code object hashes its contents (slow), so key by id and
# keep the code object in the entry, which proves the id and keeps it from being reused.
_CODE_WANTS: dict[int, tuple[CodeType, bool]] = {}


def _code_wants(code: CodeType) -> bool:
    names = code.co_varnames[code.co_posonlyargcount: code.co_argcount + code.co_kwonlyargcount]
    wants = "attempt" in names
    _CODE_WANTS[id(code)] = (code, wants)
    return wants


def wants_attempt(fn: Callable[..., object]) -> bool:
    """Whether ``fn`` declares a parameter named ``attempt`` that can be passed by keyword.

    That is the whole rule: such an operation receives ``attempt=Attempt(...)`` on every try
    (unless the caller passed ``attempt`` itself); any other operation is called with exactly the
    arguments given. Cheap for functions and bound methods (cached per code object).
    """
    code = getattr(fn, "__code__", None)  # (a default: no exception built for other callables)
    if code is None:
        return _wants_slow(fn)
    entry = _CODE_WANTS.get(id(code))
    if entry is not None and entry[0] is code:
        return entry[1]
    if isinstance(code, CodeType):
        return _code_wants(code)
    return _wants_slow(fn)


def _wants_slow(fn: Callable[..., object]) -> bool:
    declared = getattr(fn, "wants_attempt", None)
    if isinstance(declared, bool):
        return declared
    if isinstance(fn, functools.partial):
        return "attempt" not in fn.keywords and wants_attempt(fn.func)
    call_code = getattr(getattr(type(fn), "__call__", None), "__code__", None)  # noqa: B004
    if isinstance(call_code, CodeType):  # a callable object: its class's __call__ decides (cached)
        entry = _CODE_WANTS.get(id(call_code))
        return entry[1] if entry is not None and entry[0] is call_code else _code_wants(call_code)
    try:
        parameter = inspect.signature(fn).parameters.get("attempt")
    except (TypeError, ValueError):
        return False
    return parameter is not None and parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)


def _learn_op(holder: Any, fn: Callable[..., object]) -> bool:
    """:func:`wants_attempt` for ``fn``, remembered in ``holder.op`` when ``fn`` has a code
    object (then the answer depends on that code alone); others are asked every time."""
    wants = wants_attempt(fn)
    code = getattr(fn, "__code__", None)
    if type(code) is CodeType:
        holder.op = (code, wants)
    return wants


def _label_of(fn: Callable[..., object]) -> str:
    name = getattr(fn, "__qualname__", None) or getattr(fn, "stoic_label", None) or type(fn).__qualname__
    return str(name)


# --- the engine after a failure --------------------------------------------------------------


def _while_handling(error: BaseException, fn: Callable[..., None], *args: Any) -> None:
    """``fn(*args)`` with ``error`` as the exception being handled (``sys.exc_info()``), as a
    sink sees a breaker's defect: the attempt's error was caught before the retry decides, and
    the logging, structlog and OpenTelemetry sinks attach the traceback of an error-level event
    from it. ``error`` is left as it was (traceback, context)."""
    traceback, context, suppress = error.__traceback__, error.__context__, error.__suppress_context__
    try:
        raise error
    except BaseException:
        error.__traceback__ = traceback  # the handled exception's traceback is the operation's own
        fn(*args)
    finally:
        error.__traceback__, error.__context__, error.__suppress_context__ = traceback, context, suppress

class _Run:
    """The state of one retried call once an attempt has failed."""

    __slots__ = ("bucket", "classify", "clock", "label", "nested", "single", "site", "start_ns", "step", "timed",
                 "wake_ns")

    def __init__(self, schedule: BoundedSchedule, site: str, bucket: RetryBudget, classify: RetryClassifier,
                 single: bool, nested: bool, label: str, clock: Clock, start_ns: int) -> None:
        self.step = schedule._stepper(_random.stream(site))
        self.timed = schedule._timed
        self.site = site
        self.bucket = bucket
        self.classify = classify
        self.single = single
        self.nested = nested
        self.label = label
        self.clock = clock
        self.start_ns = start_ns
        self.wake_ns = 0

    def _event(self, name: str, level: Level, attributes: dict[str, Any]) -> None:
        emit(name, self.label, level, self.clock.now_ns(), attributes)

    def _count(self, metric: str, value: str) -> None:
        # A retry has no object of its own to hold a recorder: one per label (stoic._metrics).
        if _metrics.state.enabled:
            _metrics.count_shared("retry", self.label, (metric, value))

    def after_failure(self, error: Exception, number: int, attempt_start_ns: int) -> bool:
        """Checks (2)-(6) of seed 001's "Order of checks"; ``True`` to retry (``wake_ns`` set).

        Check (1), the retrying task itself cancelled, is the caller's (it needs the task).
        """
        if self.nested and self.single:
            self._count("stoic.retry.outcomes", "nested")
            if _SINKS.wants(Level.INFO):
                self._event("retry.nested", Level.INFO, {"error.type": error_type(error)})
            return False
        if is_defect(error):
            self._count("stoic.retry.outcomes", "defect")
            if _SINKS.wants(Level.ERROR):
                _while_handling(error, self._event, "retry.defect", Level.ERROR,
                                {"attempt": number, "error.type": error_type(error)})
            return False
        try:
            decision = self.classify(error)
        except Exception as failure:  # a user's classifier or retry_decision: stop, keep the error
            callback_failed(self.classify._fn, "classify", failure, error)
            decision = RetryDecision.STOP
        if not decision.retries:
            self._count("stoic.retry.outcomes", "permanent")
            if _SINKS.wants(Level.INFO):
                self._event("retry.permanent", Level.INFO, {"attempt": number, "error.type": error_type(error)})
            return False
        now = self.clock.now_ns()
        after = decision._after_ns
        if after is None or not self.timed:
            delay = self.step.next(now - self.start_ns)
        else:
            # The schedule's up_to limits judge the wait actually made: a Retry-After shorter
            # than the schedule's own delay starts the next attempt sooner, so a limit that
            # delay would overshoot may still allow it (a longer one is judged below).
            wait = after if after <= RETRY_AFTER_CAP_NS else RETRY_AFTER_CAP_NS
            delay = self.step.next(now - self.start_ns, lambda d: d if d <= wait else wait)
        if delay is None:
            self._count("stoic.retry.outcomes", "exhausted")
            if _SINKS.wants(Level.WARNING):
                self._event("retry.exhausted", Level.WARNING, {"attempts": number, "error.type": error_type(error)})
            return False
        if after is not None:
            # Retry-After replaces the schedule's delay, not its bound (stepped above), budget or deadline.
            if after > RETRY_AFTER_CAP_NS:
                if _SINKS.wants(Level.WARNING):
                    self._event("retry.after_capped", Level.WARNING,
                                {"requested": after / 1e9, "capped": RETRY_AFTER_CAP_NS / 1e9})
                after = RETRY_AFTER_CAP_NS
            delay = after
            if self.timed and not self.step.allows(now - self.start_ns + delay):
                # The schedule's up_to judged the shorter of its own delay and this wait: a
                # Retry-After longer than its delay would start the next attempt past the
                # limit, which no attempt may.
                self._count("stoic.retry.outcomes", "exhausted")
                if _SINKS.wants(Level.WARNING):
                    self._event("retry.exhausted", Level.WARNING, {"attempts": number, "error.type": error_type(error)})
                return False
        left = remaining_ns()
        if left is not None and delay + (now - attempt_start_ns) >= left:
            self._count("stoic.retry.outcomes", "deadline_skip")
            if _SINKS.wants(Level.INFO):
                self._event("retry.deadline_skip", Level.INFO, {"attempt": number, "error.type": error_type(error)})
            return False
        if not self.bucket.try_spend():
            self._count("stoic.retry.outcomes", "budget_exhausted")
            if _SINKS.wants(Level.WARNING):
                self._event("retry.budget_exhausted", Level.WARNING,
                            {"attempt": number, "error.type": error_type(error)})
            return False
        self._count("stoic.retry.retries", error_type(error))
        if _SINKS.wants(Level.INFO):
            self._event("retry.attempt_failed", Level.INFO, {
                "attempt": number, "error.type": error_type(error),
                "decision": "retry" if after is None else "retry_after", "next_delay": delay / 1e9,
            })
        self.wake_ns = now + delay
        return True

    def succeeded(self, attempts: int) -> None:
        self._count("stoic.retry.outcomes", "succeeded")
        if _SINKS.wants(Level.INFO):
            self._event("retry.succeeded", Level.INFO, {"attempts": attempts})


def _refuse_if_late(clock: Clock, label: str) -> None:
    """Under an ambient deadline: raise :class:`ClockMismatch` when it (or one around it) runs on
    another clock than the retry's ``clock``, and :class:`stoic.DeadlineExceeded` (``timed_out``
    False: nothing ran) when it has already passed as the retry is about to start (seed 000,
    "Cancellation and deadlines, for every policy": work already late is not started, as the
    breaker, limiter, bulkhead and hedge refuse it), reported as ``retry.deadline_skip`` with
    ``attempt`` 0. No attempt runs and nothing is deposited."""
    left = remaining_ns(clock)
    if left is not None and left <= 0:
        if _metrics.state.enabled:
            _metrics.count_shared("retry", label, ("stoic.retry.outcomes", "deadline_skip"))
        if _SINKS.wants(Level.INFO):
            emit("retry.deadline_skip", label, Level.INFO, clock.now_ns(),
                 {"attempt": 0, "error.type": "DeadlineExceeded"})
        raise DeadlineExceeded("deadline exceeded before the retried call started", label=label)


def _task_reader(module: ModuleType) -> Callable[[], asyncio.Task[Any] | None]:
    """``asyncio.current_task`` as cheaply as this Python allows: on 3.11 it is a Python
    function (a loop lookup and a dict read, ~100 ns); the same two reads, made directly, cost
    about half. Elsewhere (3.12+: in C) it is used as is. ``module``: asyncio."""
    tasks = getattr(module.tasks, "_current_tasks", None)
    if isinstance(module.current_task, types.FunctionType) and isinstance(tasks, dict):
        running_loop, task_of = module.events._get_running_loop, tasks.get

        def current_task() -> asyncio.Task[Any] | None:
            loop = running_loop()
            return None if loop is None else task_of(loop)

        return current_task
    current: Callable[[], asyncio.Task[Any] | None] = module.current_task
    return current


def _first_current_task() -> asyncio.Task[Any] | None:
    """What :data:`_current_task` is until asyncio is first used (then :func:`_bind` replaces it)."""
    _bind(_lazy.load())  # (binding again is harmless: never a call back into this function)
    return _current_task()


_current_task: Callable[[], asyncio.Task[Any] | None] = _first_current_task

# On 3.11 even the direct read costs a getpid() system call (the running-loop lookup checks the
# pid on every call; 3.12 dropped that). While exactly one loop in the process is running a task,
# that task is the caller's (a coroutine runs inside its task's step, which is what puts the
# entry there), so the entry count is read from the one entry with no system call. Should another
# thread's loop add its entry after the length check, it comes after ours in the dict's
# insertion order (ours was inserted when our step began), so the first value is still ours.
# Read through a view made once (a view follows its dict): one object fewer per call. None
# until asyncio is first used (the callers then take _current_task, which binds it).
_RUNNING: Any = None


def _bind(module: ModuleType) -> None:
    """Bind the readers above to asyncio (``module``), once it is in use (stoic._lazy)."""
    global _current_task, _RUNNING
    _current_task = _task_reader(module)
    tasks = getattr(module.tasks, "_current_tasks", None) if sys.version_info < (3, 12) else None
    _RUNNING = tasks.values() if isinstance(tasks, dict) else None


_lazy.when_imported(_bind)


def _caller_task() -> asyncio.Task[Any] | None:
    """The task running the caller, through the one-entry read above when it applies (else
    :func:`_current_task`; ``None`` outside a task or a loop).

    The one entry is taken only when its loop runs on this thread: a coroutine driven by hand
    outside any task (or from a loop's callback) while another thread's loop runs a task must
    not be handed that task. (A retry only compares that task's cancel count with itself later,
    which is harmless, so ``_run_async`` skips this check; a hedge would schedule on its loop.)"""
    running = _RUNNING
    if running is not None and len(running) == 1:
        try:
            for task in running:
                if getattr(task.get_loop(), "_thread_id", None) == _get_ident():
                    return task  # type: ignore[no-any-return]
                break
        except RuntimeError:  # another thread's loop entered or left a task meanwhile
            pass
    try:
        return _current_task()
    except RuntimeError:
        return None


def _cancelled_since(cancels: int, error: BaseException) -> bool:
    """Whether the current task is being cancelled, ``cancels`` being its cancel count at the
    retry's entry and ``error`` what the attempt raised (``stoic._deadline.cancelled_since``;
    False outside a task or a loop)."""
    try:
        task = _current_task()
    except RuntimeError:
        return False
    return task is not None and cancelled_since(task, cancels, error)


# The first attempt of an async retry, written once and compiled into each of its three hosts:
# ``_run_async`` (what retry() returns), ``Retrying.execute`` and the ``@retrying`` wrapper, so
# that none of them adds a coroutine level or a call of its own on the way in (about 100 and
# 60 ns on 3.11). Each host binds ``fn``, ``args``, ``kwargs``, ``bucket``, ``clock`` and
# ``wants`` (``fn`` is to be handed an Attempt); the other settings are read only on the way to
# ``_loop_async``, through the host's spelling of them ({schedule}, {site}, ...). Compiled in
# this module's namespace: it reads ``_RUNNING`` and ``_current_task`` as ``_bind`` rebinds them.
#
# Check (1) compares with the task's cancel count read here, at entry: a cancel swallowed earlier
# in the task (a TaskGroup on 3.11, a library without uncancel()) must not stop this retry.
#
# A retry nested in another's attempt with SINGLE_ATTEMPT deposits nothing: its one attempt is
# the outer retry's (one request, already deposited or paid for there), and with both on one
# budget a deposit here would count each request twice and let each retry earn a token itself.
# Likewise a retry started in a hedge's attempt on the budget that hedge spends from (the
# hedge's mark, three long, holds that budget): its first attempt is the hedge's request, the
# call's own (the hedge deposited for it) or a hedge (paid for with a token). The tests are
# ordered so that no mark, or a plain retry's left in the task, costs no more than before.
_FIRST_ATTEMPT = """\
running = _RUNNING
task = None
if running is not None and len(running) == 1:
    try:
        for task in running:  # (the first value, without an iterator call)
            break
    except RuntimeError:  # another thread's loop entered or left a task meanwhile
        task = _current_task()
else:
    try:
        task = _current_task()
    except RuntimeError:  # (3.12+) driven by hand (send), outside any loop: no task to cancel
        task = None
cancels = 0 if task is None else task.cancelling()
scope = _deadline_scope.get() if _deadline.ever_set else None  # (ever_set: see _deadline)
if scope is not None:
    _refuse_if_late(clock, {label})  # (its clocks checked too)
if {attempt_ns} is not None:
    mark = [0, None, bucket]  # (this retry's mark, not running yet: its loop counts the attempts)
    old = _set_marks(mark).old_value
    if old is _NO_MARK:
        next(bucket._deposits)
    elif _running(old):
        mark[1] = old
        if {nesting} is _SINGLE:
            mark[2] = None  # (collapsed: its attempt is counted where the outer's is, not on bucket)
        elif not _in_hedge_on(old, bucket):
            next(bucket._deposits)
    elif not _hedged(old, mark, bucket):
        next(bucket._deposits)
    return await _loop_async({schedule}, fn, args, kwargs, {site}, bucket, {classify}, {nesting}, {label},
                             {attempt_ns}, clock, mark, None, -1, cancels, None, {before_backoff})
# Only the deadline check (5) and up_to use the start: without them, success reads no time.
started = clock.now_ns() if {schedule}._timed or scope is not None else -1
mark = [1, None, bucket]  # (this retry's mark, the first attempt counted as running)
old = _set_marks(mark).old_value
if old is _NO_MARK:
    next(bucket._deposits)  # the first attempt's deposit (RetryBudget.deposit, inlined)
elif old[0]:
    mark[1] = old
    if {nesting} is not _SINGLE:  # (a collapsed retry deposits nothing: see above)
        next(bucket._deposits)
    else:
        mark[2] = None  # (nor is its attempt counted on bucket: see the marks)
elif (parent := old[1]) is None:
    next(bucket._deposits)
elif _running(parent):
    mark[1] = old
    if {nesting} is _SINGLE:
        mark[2] = None
    elif not _in_hedge_on(old, bucket):
        next(bucket._deposits)
elif not _hedged(old, mark, bucket):  # (in a hedge's attempt on this budget: see above)
    next(bucket._deposits)
try:
    if wants:  # (``first`` is bound exactly when ``wants``)
        return await fn(*args, **kwargs, attempt=(first := first_attempt()))
    # (Without arguments, a direct call: no tuple and dictionary to unpack.)
    return await (fn(*args, **kwargs) if args or kwargs else fn())
except Exception as caught:
    error = caught
finally:
    mark[0] = 0
return await _loop_async({schedule}, fn, args, kwargs, {site}, bucket, {classify}, {nesting}, {label}, {attempt_ns},
                         clock, mark, error, started, cancels, first if wants else None, {before_backoff})
"""

# retry()'s host: every setting is a parameter.
_RUN_ASYNC = """\
async def _run_async(schedule, fn, args, kwargs, site, bucket, classify, nesting, label, attempt_ns, clock, wants,
                     before_backoff=None):
    \"\"\"The first attempt, inline and lean; the rest (and unusual calls) in :func:`_loop_async`.

    ``wants``: ``fn`` is to be handed an Attempt (the caller decided, from its cache).
    ``before_backoff``: awaited once a failed attempt is to be retried, before the backoff sleep
    (stoic._http releases the failed responses there); it must not raise.\"\"\"
{first}"""

# Retrying.execute: the settings are its retrier's. (Which operation wants an Attempt is cached
# on the retrier: see _learn_op.)
_EXECUTE = """\
async def _retrying_execute(self, fn, /, *args, **kwargs):
    r = self._retrier
    bucket, clock, op = r.bucket, self._clock, r.op
    wants = (op[1] if getattr(fn, "__code__", None) is op[0] else _learn_op(r, fn)) and "attempt" not in kwargs
{first}"""

# The @retrying wrapper of a coroutine function: the settings are constants of its closure.
_WRAPPER = """\
def _make_async_wrapper(schedule, fn, site, retrier, classify, nesting, label, attempt_ns, fixed_clock, general):
    async def async_wrapper(*args, **kwargs):
        clock = fixed_clock if fixed_clock is not None else (  # current_clock(), inlined
            _ambient_clock.get() if _clock.ever_set else SYSTEM_CLOCK)
        bucket = retrier.bucket
        wants = general and "attempt" not in kwargs
{first}
    return async_wrapper
"""


def _compile_hosts() -> None:
    import textwrap

    from ._source import compile_source

    named = {"schedule": "schedule", "site": "site", "classify": "classify", "nesting": "nesting",
             "label": "label", "attempt_ns": "attempt_ns", "before_backoff": "before_backoff"}
    # (A Retrying stage has no attempt timeout; only _run_async is handed a before-backoff hook.)
    retriers = {"schedule": "r.schedule", "site": "r.site", "classify": "r.classify", "nesting": "r.nesting",
                "label": "r.label", "attempt_ns": "None", "before_backoff": "None"}
    wrapped = {**named, "before_backoff": "None"}
    for name, host, names, depth in (("_run_async", _RUN_ASYNC, named, 4),
                                     ("_retrying_execute", _EXECUTE, retriers, 4),
                                     ("_make_async_wrapper", _WRAPPER, wrapped, 8)):
        source = host.format(first=textwrap.indent(_FIRST_ATTEMPT.format(**names), " " * depth))
        compile_source(source, f"<stoic retry: {name}>", __name__, globals())


if TYPE_CHECKING:
    async def _run_async(schedule: BoundedSchedule, fn: Callable[..., Awaitable[R]], args: tuple[Any, ...],
                         kwargs: dict[str, Any], site: str, bucket: RetryBudget, classify: RetryClassifier,
                         nesting: RetryNesting, label: str, attempt_ns: int | None, clock: Clock,
                         wants: bool, before_backoff: Callable[[], Awaitable[object]] | None = None) -> R: ...

    async def _retrying_execute(self: Any, fn: Callable[..., Awaitable[R]], /, *args: Any, **kwargs: Any) -> R: ...

    def _make_async_wrapper(schedule: BoundedSchedule, fn: Callable[..., Awaitable[Any]], site: str,
                            retrier: _Retrier, classify: RetryClassifier, nesting: RetryNesting, label: str,
                            attempt_ns: int | None, fixed_clock: Clock | None,
                            general: bool) -> Callable[..., Coroutine[Any, Any, Any]]: ...
else:
    _compile_hosts()


async def _loop_async(schedule: BoundedSchedule, fn: Callable[..., Awaitable[R]], args: tuple[Any, ...],
                      kwargs: dict[str, Any], site: str, bucket: RetryBudget, classify: RetryClassifier,
                      nesting: RetryNesting, label: str, attempt_ns: int | None, clock: Clock,
                      mark: _Mark, error: Exception | None, started: int, cancels: int,
                      attempt: Attempt | None, before_backoff: Callable[[], Awaitable[object]] | None = None) -> R:
    """Every attempt after a failed first one (``error``, which was handed ``attempt`` if not
    None), or all of them (``error`` None). ``mark``: this retry's (see the marks, above);
    ``before_backoff``: see :func:`_run_async`."""
    nested = _nested(mark)
    if error is None and "attempt" not in kwargs and wants_attempt(fn):
        attempt = first_attempt()
    if attempt is not None:
        kwargs = {**kwargs, "attempt": attempt}
    run: _Run | None = None
    number = 1
    if error is None:
        started = clock.now_ns()
    while True:
        if error is None:
            mark = _attempt_mark(mark, number)  # (every attempt: a nested ALLOW retry's too)
            try:
                if attempt_ns is None:
                    result = await fn(*args, **kwargs)
                else:
                    # A timed-out attempt raises DeadlineExceeded (an Exception: transient), not
                    # CancelledError: the Timeout takes its own cancellation back.
                    async with Timeout(clock.now_ns() + attempt_ns, clock, label):
                        result = await fn(*args, **kwargs)
            except Exception as caught:
                error = caught
            else:
                if run is not None:
                    run.succeeded(number)
                return result
            finally:
                mark[0] = 0
        if _cancelled_since(cancels, error):
            raise error  # (1) the task running the retry is being cancelled: never retried, never swallowed
        if misused(error, fn):
            # An await on what cannot be awaited (a plain function's generator or value), or fn
            # called with arguments it does not take: a bug at the call site, refused like a plain
            # operation's coroutine or generator in retry_sync, whatever the classifier says;
            # raised unchanged, with no event, and the deposit of a call that never reached the
            # dependency taken back.
            _misuse_raised(fn, mark, bucket, number)
            raise error
        if started < 0:
            started = clock.now_ns()  # no deadline and no up_to: the start matters to nothing
        if run is None:
            run = _Run(schedule, site, bucket, classify, nesting is _SINGLE, nested, label, clock, started)
        if not run.after_failure(error, number, started):
            raise error  # the last attempt's own exception, unchanged
        error = None
        number += 1
        if attempt is not None:
            attempt = Attempt(number, attempt.call_id)
            kwargs["attempt"] = attempt
        # Cancellation here propagates as CancelledError: the backoff is not swallowed.
        try:
            if before_backoff is not None:
                await before_backoff()  # (within the backoff: the wake instant is already set)
            await clock.sleep_until(run.wake_ns)
        except BaseException:
            # Cancelled (or closed) while backing off: the retry the token paid for never runs,
            # so a storm of callers leaving mid-backoff does not drain a budget shared with
            # those still there.
            bucket._give_back()
            raise
        started = clock.now_ns()


# What a plain operation must not return (stoic._policy.UNRUN_RESULTS): a coroutine (it wanted
# ``await retry``) or a generator (retrying its creation retries nothing: the work, and its
# failures, come while it is consumed).


def _refuse_result(fn: Callable[..., object], result: object) -> None:
    if isinstance(result, CoroutineType):
        result.close()
        raise TypeError(f"{_label_of(fn)} returned a coroutine: await retry(...) for async operations") from Defect(
            "a coroutine was returned to retry_sync")
    if isinstance(result, (GeneratorType, AsyncGeneratorType)):
        if isinstance(result, GeneratorType):
            result.close()
        else:
            result.aclose().close()  # (never awaited: an unstarted async generator has nothing to run)
        raise TypeError(f"{_label_of(fn)} returned a generator: retry the code that consumes it, "
                        "not the call creating it") from Defect("a generator was returned to retry_sync")


def _run_sync(schedule: BoundedSchedule, fn: Callable[..., R], args: tuple[Any, ...], kwargs: dict[str, Any],
              site: str, bucket: RetryBudget, classify: RetryClassifier, nesting: RetryNesting,
              label: str, clock: Clock, wants: bool, before_backoff: Callable[[], object] | None = None) -> R:
    """The first attempt of a plain function, inline; the rest in :func:`_loop_sync`.

    (Every sync form runs this.) ``before_backoff``: as :func:`_run_async`'s, called."""
    scope = _deadline_scope.get() if _deadline.ever_set else None  # (ever_set: see _deadline)
    if scope is not None:
        _refuse_if_late(clock, label)  # (its clocks checked too)
    started = clock.now_ns() if schedule._timed or scope is not None else -1
    mark: _Mark = [1, None, bucket]  # (this retry's mark, the first attempt counted as running)
    old = _set_marks(mark).old_value
    if old is _NO_MARK:
        next(bucket._deposits)
    elif old[0]:
        mark[1] = old
        if nesting is not _SINGLE:  # (see _FIRST_ATTEMPT: a collapsed retry deposits nothing)
            next(bucket._deposits)
        else:
            mark[2] = None
    elif (parent := old[1]) is None:
        next(bucket._deposits)
    elif _running(parent):
        mark[1] = old
        if nesting is _SINGLE:
            mark[2] = None
        elif not _in_hedge_on(old, bucket):
            next(bucket._deposits)
    elif not _hedged(old, mark, bucket):  # (see _FIRST_ATTEMPT: in a hedge's attempt)
        next(bucket._deposits)
    try:
        if wants:  # (``first`` is bound exactly when ``wants``)
            result = fn(*args, **kwargs, attempt=(first := first_attempt()))
        else:
            result = fn(*args, **kwargs) if args or kwargs else fn()
    except Exception as caught:
        error = caught
    else:
        if type(result) in UNRUN_RESULTS:
            _refuse_result(fn, result)
        return result
    finally:
        mark[0] = 0
    return _loop_sync(schedule, fn, args, kwargs, site, bucket, classify, nesting, label, clock,
                      mark, error, started, first if wants else None, before_backoff)


def _loop_sync(schedule: BoundedSchedule, fn: Callable[..., R], args: tuple[Any, ...], kwargs: dict[str, Any],
               site: str, bucket: RetryBudget, classify: RetryClassifier, nesting: RetryNesting,
               label: str, clock: Clock, mark: _Mark, error: Exception | None, started: int,
               attempt: Attempt | None, before_backoff: Callable[[], object] | None = None) -> R:
    """Every attempt after the failed first one (``error``; it was handed ``attempt``, if not
    None). ``mark``: this retry's (see the marks, above)."""
    nested = _nested(mark)
    if attempt is not None:
        kwargs = {**kwargs, "attempt": attempt}
    run: _Run | None = None
    number = 1
    while True:
        if error is None:
            mark = _attempt_mark(mark, number)
            try:
                result = fn(*args, **kwargs)
            except Exception as caught:
                error = caught
            else:
                if type(result) in UNRUN_RESULTS:
                    _refuse_result(fn, result)
                if run is not None:
                    run.succeeded(number)
                return result
            finally:
                mark[0] = 0
        if misused(error, fn):
            _misuse_raised(fn, mark, bucket, number)  # (as in _loop_async)
            raise error
        if started < 0:
            started = clock.now_ns()
        if run is None:
            run = _Run(schedule, site, bucket, classify, nesting is _SINGLE, nested, label, clock, started)
        if not run.after_failure(error, number, started):
            raise error
        error = None
        number += 1
        if attempt is not None:
            attempt = Attempt(number, attempt.call_id)
            kwargs["attempt"] = attempt
        try:
            if before_backoff is not None:
                before_backoff()
            clock.sleep_until_blocking(run.wake_ns)
        except BaseException:
            bucket._give_back()  # (interrupted while backing off: as in _loop_async)
            raise
        started = clock.now_ns()


def _nesting(nesting: RetryNesting) -> RetryNesting:
    if not isinstance(nesting, RetryNesting):
        raise TypeError(f"nesting must be a RetryNesting, got {nesting!r}")
    return nesting


def _budget(budget: RetryBudget) -> RetryBudget:
    if not isinstance(budget, RetryBudget):
        raise TypeError(f"budget must be a RetryBudget, got {type(budget).__name__}")
    return budget


def _site(frame: Any) -> _Site:
    """The call site of ``retry``/``retry_sync`` being made in ``frame`` (see _budget).

    Offsets are shared by sites in different functions: the chain at an offset is walked here,
    inline, so the second site at an offset costs one more identity test, not a slow lookup."""
    site = _site_at(frame.f_lasti)
    code = frame.f_code
    while site is not None:
        if site.code is code:
            return site
        site = site.next
    return site_of_frame(frame)


def _classifier_at(site: _Site, classify: ClassifierLike) -> RetryClassifier:
    """``as_classifier(classify)``, remembered at the call site for the same argument: the same
    object, or a tuple of the very same exception types (a tuple written in the call is built
    anew each time). A wrong argument never matches one that passed, so it still raises."""
    known, classifier = site.classify
    if known is classify:
        return classifier  # type: ignore[no-any-return]
    if type(classify) is tuple and type(known) is tuple and len(known) == len(classify):
        for a, b in zip(known, classify):  # noqa: B905 (the lengths are equal)
            if a is not b:
                break
        else:
            return classifier  # type: ignore[no-any-return]
    classifier = as_classifier(classify)
    site.classify = (classify, classifier)
    return classifier


def _attempt_ns_at(site: _Site, attempt_timeout: Seconds) -> int:
    """``_attempt_ns(attempt_timeout)``, remembered at the call site for the same object."""
    known, ns = site.timeout
    if known is not attempt_timeout:
        ns = _attempt_ns(attempt_timeout)
        site.timeout = (attempt_timeout, ns)
    return ns  # type: ignore[no-any-return]


# --- the public functions --------------------------------------------------------------------

def retry(
    schedule: BoundedSchedule,
    fn: Callable[..., Awaitable[R]],
    /,
    *args: Any,
    label: str,
    budget: RetryBudget = RetryBudget.PER_CALL_SITE,
    classify: ClassifierLike = RetryClassifier.standard,
    nesting: RetryNesting = RetryNesting.SINGLE_ATTEMPT,
    attempt_timeout: Seconds | None = None,
    clock: Clock | None = None,
    **kwargs: Any,
) -> Coroutine[Any, Any, R]:
    """Run ``await fn(*args, **kwargs)``, retrying failures as ``schedule`` allows (seed 001).

    ``schedule`` must be a :class:`BoundedSchedule` (``TypeError`` otherwise, saying to call
    ``.attempts(n)`` or use ``Schedule.delays``). ``label`` (keyword, required: a non-empty
    ``str``, else ``TypeError``/``ValueError``) names the events. ``fn`` receives
    ``attempt=Attempt(...)`` only if it declares a parameter named ``attempt``. ``budget``
    defaults to one per call site of ``retry`` (file:line); ``classify`` is a
    :class:`RetryClassifier`, a callable ``(error) -> RetryDecision | bool`` or exception
    type(s) to retry. With ``attempt_timeout`` (seconds, > 0; saturating at about 292 years)
    each attempt runs under ``stoic.timeout(attempt_timeout)``; a timed-out attempt raises
    :class:`stoic.DeadlineExceeded`, which is transient. Backoff sleeps and ``up_to`` run on
    ``clock`` (a :class:`stoic.Clock`, ``TypeError`` naming ``clock`` otherwise), else the
    ambient clock at the call.

    After a failed attempt, in order: (1) this task is being cancelled (its ``cancelling()``
    count is above its value when the retry started, and not only by the request of a failed
    ``TaskGroup`` in the error's history, which Python 3.11 never takes back): re-raise; (2) inside another retry's
    attempt with ``RetryNesting.SINGLE_ATTEMPT``: re-raise (``retry.nested``); (3) a
    :class:`stoic.Defect` (``retry.defect``) or the classifier says stop (``retry.permanent``;
    also when the classifier itself raises): re-raise; (4) the schedule is exhausted: re-raise
    (``retry.exhausted``); (5) the next attempt could not finish before the ambient deadline if
    it took as long as the last: re-raise (``retry.deadline_skip``); (6) no budget token:
    re-raise (``retry.budget_exhausted``); otherwise ``retry.attempt_failed`` with the exact
    delay, sleep on the clock, retry.

    Returns ``fn``'s result. Raises the last attempt's own exception, unchanged. The
    ``TypeError`` of an ``await`` on what cannot be awaited (``fn`` a plain function returning
    a generator, ``None`` or another value), or of calling ``fn`` with arguments it does not
    take (or an ``fn`` that is not callable, such as its coroutine), is a bug: re-raised at
    once with no event, whatever the classifier says, and the call's deposit taken back
    (stoic._errors.misused), as ``retry_sync`` refuses a returned coroutine or generator.
    ``asyncio.CancelledError`` (and every ``BaseException``) is never retried or swallowed,
    including during the backoff sleep (whose token is then given back). Raises
    ``ValueError`` (before the first attempt) under an ambient deadline set on another clock
    than the retry's, and :class:`stoic.DeadlineExceeded` (before the first attempt,
    ``retry.deadline_skip`` with ``attempt`` 0) when that deadline has already passed. Keyword arguments named like
    retry's own parameters cannot be forwarded to ``fn``: bind them with ``functools.partial``.

    A plain function returning the coroutine (so the call site is known even under
    ``asyncio.create_task(retry(...))``): configuration errors raise at the call, before ``await``.
    """
    if type(schedule) is not BoundedSchedule:
        _check_schedule(schedule)
    if type(label) is not str or not label:
        check_label(label)
    frame = _getframe(1)
    site = _site_at(frame.f_lasti)  # _site(frame), inlined: the chain of sites at this offset
    code = frame.f_code
    while site is not None and site.code is not code:
        site = site.next
    if site is None:
        site = site_of_frame(frame)
    op = site.op
    if clock is not None:
        clock = check_clock(clock)
    return _run_async(
        schedule, fn, args, kwargs, site.name,
        (site.bucket if clock is None else _site_bucket_on(site, clock)) if budget is _PER_SITE else _budget(budget),
        classify if type(classify) is RetryClassifier else _classifier_at(site, classify),
        nesting if nesting is _SINGLE else _nesting(nesting), label,
        None if attempt_timeout is None else _attempt_ns_at(site, attempt_timeout),
        (_ambient_clock.get() if _clock.ever_set else SYSTEM_CLOCK) if clock is None else clock,
        (op[1] if getattr(fn, "__code__", None) is op[0] else _learn_op(site, fn)) and "attempt" not in kwargs,
    )


def _site_bucket_on(site: _Site, clock: Clock) -> RetryBudget:
    """The call site's own budget for a call given ``clock=``: refilling on that clock (as a
    Retrying's or a Hedge's does on the clock it was given), not on the clock that was ambient
    when the site was first met (a reserve spent in a test on virtual time never came back)."""
    bucket = site.bucket
    if bucket._clock is not clock:
        RetryBudget.for_call_site(site.name, clock)  # (moves the site's one bucket to this clock)
    return bucket


def _attempt_ns(attempt_timeout: Seconds) -> int:
    return min(MAX_NS, to_ns(attempt_timeout, "attempt_timeout"))  # (saturating as schedules do)


def retry_sync(
    schedule: BoundedSchedule,
    fn: Callable[..., R],
    /,
    *args: Any,
    label: str,
    budget: RetryBudget = RetryBudget.PER_CALL_SITE,
    classify: ClassifierLike = RetryClassifier.standard,
    nesting: RetryNesting = RetryNesting.SINGLE_ATTEMPT,
    clock: Clock | None = None,
    **kwargs: Any,
) -> R:
    """:func:`retry` for a plain (blocking) function: same checks, events, ``label``,
    ``clock`` and budget; sleeps block the calling thread on the clock. There is no
    ``attempt_timeout`` (a plain function cannot be interrupted) and no cancellation check.
    The ambient deadline, if any, still decides (5). ``fn`` returning a coroutine or a
    generator raises ``TypeError`` (its cause a :class:`stoic.Defect`, so an outer breaker does
    not count it; never retried): await :func:`retry` for async operations, and retry the
    code that consumes a generator."""
    if type(schedule) is not BoundedSchedule:
        _check_schedule(schedule)
    if type(label) is not str or not label:
        check_label(label)
    frame = _getframe(1)
    site = _site_at(frame.f_lasti)  # _site(frame), inlined: the chain of sites at this offset
    code = frame.f_code
    while site is not None and site.code is not code:
        site = site.next
    if site is None:
        site = site_of_frame(frame)
    if clock is not None:
        check_clock(clock)
    bucket = (site.bucket if clock is None else _site_bucket_on(site, clock)) if budget is _PER_SITE \
        else _budget(budget)
    classifier = classify if type(classify) is RetryClassifier else _classifier_at(site, classify)
    if nesting is not _SINGLE:
        _nesting(nesting)
    if clock is None:
        clock = _ambient_clock.get() if _clock.ever_set else SYSTEM_CLOCK  # current_clock(), inlined
    op = site.op
    wants = (op[1] if getattr(fn, "__code__", None) is op[0] else _learn_op(site, fn)) and "attempt" not in kwargs
    return _run_sync(schedule, fn, args, kwargs, site.name, bucket, classifier, nesting, label, clock, wants)


class _Retrier:
    """What :func:`retrying` and ``Retrying`` share: settings fixed once, a site, a clock.

    The site is fixed, so its budget is resolved here, once, into ``bucket`` (and again by
    ``reset_budgets()``, which calls :meth:`resolve_budget` on every live retrier): a hot call
    just reads it. ``op`` remembers whether the last operation run through it wants an
    Attempt (see :func:`_learn_op`)."""

    __slots__ = ("__weakref__", "attempt_ns", "budget", "bucket", "classify", "clock", "label", "nesting", "op",
                 "schedule", "site")

    def __init__(self, schedule: BoundedSchedule, budget: RetryBudget, classify: ClassifierLike,
                 nesting: RetryNesting, label: str, attempt_timeout: Seconds | None,
                 clock: Clock | None, site: str) -> None:
        self.schedule = _check_schedule(schedule)
        self.label = check_label(label)
        self.budget = _budget(budget)
        self.classify = as_classifier(classify)
        self.nesting = _nesting(nesting)
        self.attempt_ns = None if attempt_timeout is None else _attempt_ns(attempt_timeout)
        self.clock = None if clock is None else check_clock(clock)
        self.site = site
        self.op = _NO_OP
        self.bucket = budget
        if budget is _PER_SITE:
            _registry.hold(self)  # before resolving: a reset in between then resolves it again
            self.resolve_budget()

    def resolve_budget(self) -> None:
        """Take this site's budget from the registry (at construction and after a reset).

        Retried if a reset ran meanwhile, so the bucket kept is never one a reset dropped."""
        while True:
            generation = _registry.generation
            self.bucket = RetryBudget.for_call_site(self.site, self.clock or current_clock())
            if generation == _registry.generation:
                return

    @through_method_decorators
    def decorate(self, fn: Callable[P, R]) -> Callable[P, R]:
        if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
            raise TypeError(
                f"cannot retry the generator function {_label_of(fn)}: calling it only creates the "
                "generator (its work and failures come while it is consumed); retry the code that consumes it")
        if not callable(fn):
            raise TypeError(f"retrying decorates a function, got {type(fn).__name__}")
        if is_async_callable(fn):
            return self._decorate_async(fn)  # type: ignore[no-any-return, arg-type]
        if self.attempt_ns is not None:
            raise TypeError("attempt_timeout needs a coroutine function: a plain function cannot be interrupted")
        return self._decorate_sync(fn)

    def _decorate_async(self, fn: Callable[..., Awaitable[Any]]) -> Any:
        wrapper = _make_async_wrapper(self.schedule, fn, self.site, self, self.classify, self.nesting, self.label,
                                      self.attempt_ns, self.clock, wants_attempt(fn))
        return functools.wraps(fn)(wrapper)

    def _decorate_sync(self, fn: Callable[P, R]) -> Callable[P, R]:
        schedule, classify, nesting, label = self.schedule, self.classify, self.nesting, self.label
        site, fixed_clock, retrier = self.site, self.clock, self
        general = wants_attempt(fn)

        @functools.wraps(fn)
        def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
            clock = fixed_clock if fixed_clock is not None else (  # current_clock(), inlined
                _ambient_clock.get() if _clock.ever_set else SYSTEM_CLOCK)
            return _run_sync(schedule, fn, args, kwargs, site, retrier.bucket, classify, nesting, label, clock,
                             general and "attempt" not in kwargs)

        return sync_wrapper


def retrying(
    schedule: BoundedSchedule,
    *,
    label: str,
    budget: RetryBudget = RetryBudget.PER_CALL_SITE,
    classify: ClassifierLike = RetryClassifier.standard,
    nesting: RetryNesting = RetryNesting.SINGLE_ATTEMPT,
    attempt_timeout: Seconds | None = None,
    clock: Clock | None = None,
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorator: every call of the decorated function is retried as :func:`retry` would.

    Works on coroutine functions (``attempt_timeout`` allowed) and plain functions (as
    :func:`retry_sync`); refuses generator and async generator functions with ``TypeError``
    (retry the code that consumes the generator). ``label`` is required (a non-empty
    ``str``). The per-call-site budget is that of the decoration (one per decorated
    function); sleeps run on ``clock``, else the ambient clock at each call; sinks are the
    ambient ones at call time. A function declaring ``attempt`` receives the
    :class:`Attempt` (its callers do not pass it). Configuration errors raise here, at
    decoration.
    """
    retrier = _Retrier(schedule, budget, classify, nesting, label, attempt_timeout, clock, _random.call_site(1))
    return retrier.decorate


def recur(schedule: Schedule, fn: Callable[..., Awaitable[R]], /, *args: Any, clock: Clock | None = None,
          **kwargs: Any) -> Coroutine[Any, Any, R]:
    """Run ``fn`` again after each *success*, waiting as ``schedule`` says (polling, refresh).

    Returns the last result when the schedule ends; an error from ``fn`` propagates at once
    (wrap ``fn`` in :func:`retry` to retry failures). The schedule may be unbounded: then
    ``recur`` runs until the task running it is cancelled or its ambient deadline fires, so
    run it where something can stop it (a ``TaskGroup`` task you cancel, a ``stoic.timeout``).
    Jitter draws from the call site's stream; sleeps are on ``clock`` (validated: ``TypeError``
    naming ``clock``), else the ambient clock. An ``fn`` declaring ``attempt`` receives an
    :class:`Attempt` numbering the runs.
    """
    if not isinstance(schedule, Schedule):
        raise TypeError(f"recur needs a Schedule, got {type(schedule).__name__}")
    return _recur(schedule, fn, args, kwargs, _random.call_site(1),
                  current_clock() if clock is None else check_clock(clock))


async def _recur(schedule: Schedule, fn: Callable[..., Awaitable[R]], args: tuple[Any, ...], kwargs: dict[str, Any],
                 site: str, clock: Clock) -> R:
    step = schedule._stepper(_random.stream(site))
    attempt: Attempt | None = None
    if "attempt" not in kwargs and wants_attempt(fn):
        attempt = Attempt(1)
        kwargs = {**kwargs, "attempt": attempt}
    start = clock.now_ns()
    while True:
        result = await fn(*args, **kwargs)
        now = clock.now_ns()
        delay = step.next(now - start)
        if delay is None:
            return result
        if attempt is not None:
            attempt = attempt.next()
            kwargs["attempt"] = attempt
        await clock.sleep_until(now + delay)

