"""retry, retry_sync, retrying and recur (seed 001, "Semantics").

One engine, :class:`_Run`, holds what a call needs once it has failed; the first attempt runs
without it, so a call that succeeds at once allocates nothing beyond its coroutine, builds no
event and takes no lock (its budget deposit is one ``next()``).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import sys
from collections.abc import Awaitable, Callable, Coroutine
from contextvars import ContextVar
from types import CodeType, CoroutineType
from typing import Any, ParamSpec, TypeVar

from . import _clock, _deadline, _metrics, _random
from ._attempt import Attempt
from ._budget import _NO_OP, RetryBudget, _registry, _Site, site_of_frame
from ._classify import ClassifierLike, RetryClassifier, RetryNesting, as_classifier
from ._clock import SYSTEM_CLOCK, Clock, _ambient_clock, current_clock
from ._deadline import Timeout, remaining_ns
from ._deadline import _current as _deadline_scope
from ._durations import Seconds, to_ns
from ._errors import is_defect
from .events import Level, emit, error_type, min_level
from .schedule import BoundedSchedule, Schedule

P = ParamSpec("P")
R = TypeVar("R")

RETRY_AFTER_CAP_NS = 300 * 1_000_000_000
"""A Retry-After longer than five minutes is capped (retry.after_capped)."""

# Set while an attempt of some retry runs, in that attempt's context (and tasks it creates).
_in_attempt: ContextVar[bool] = ContextVar("stoic.retry.in_attempt", default=False)

_SINGLE = RetryNesting.SINGLE_ATTEMPT
_site_at = _registry.frames.get  # the dict is cleared in place by reset_budgets(), never replaced
_PER_SITE = RetryBudget.PER_CALL_SITE
_getframe = sys._getframe


def in_retry_attempt() -> bool:
    """True while running inside an attempt of some ``retry`` (this task or its parent's)."""
    return _in_attempt.get()


def _check_schedule(schedule: object) -> BoundedSchedule:
    if isinstance(schedule, BoundedSchedule):
        return schedule
    if isinstance(schedule, Schedule):
        raise TypeError(
            f"retry needs a bounded schedule, got {schedule!r}: call .attempts(n) on it, or build one "
            "with Schedule.delays([...]) (an unbounded retry never ends under an outage)"
        )
    raise TypeError(f"retry needs a BoundedSchedule as its first argument, got {type(schedule).__name__}")


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


def _learn_op(holder: _Site | _Retrier, fn: Callable[..., object]) -> bool:
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

class _Run:
    """The state of one retried call once an attempt has failed."""

    __slots__ = ("bucket", "classify", "clock", "label", "nested", "single", "site", "start_ns", "step", "wake_ns")

    def __init__(self, schedule: BoundedSchedule, site: str, bucket: RetryBudget, classify: RetryClassifier,
                 single: bool, nested: bool, label: str, clock: Clock, start_ns: int) -> None:
        self.step = schedule._stepper(_random.stream(site))
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
            if min_level() <= Level.INFO:
                self._event("retry.nested", Level.INFO, {"error.type": error_type(error)})
            return False
        if is_defect(error):
            self._count("stoic.retry.outcomes", "defect")
            if min_level() <= Level.ERROR:
                self._event("retry.defect", Level.ERROR, {"attempt": number, "error.type": error_type(error)})
            return False
        decision = self.classify(error)
        if not decision.retries:
            self._count("stoic.retry.outcomes", "permanent")
            if min_level() <= Level.INFO:
                self._event("retry.permanent", Level.INFO, {"attempt": number, "error.type": error_type(error)})
            return False
        now = self.clock.now_ns()
        delay = self.step.next(now - self.start_ns)
        if delay is None:
            self._count("stoic.retry.outcomes", "exhausted")
            if min_level() <= Level.WARNING:
                self._event("retry.exhausted", Level.WARNING, {"attempts": number, "error.type": error_type(error)})
            return False
        after = decision._after_ns
        if after is not None:
            # Retry-After replaces the schedule's delay, not its bound (stepped above), budget or deadline.
            if after > RETRY_AFTER_CAP_NS:
                if min_level() <= Level.WARNING:
                    self._event("retry.after_capped", Level.WARNING,
                                {"requested": after / 1e9, "capped": RETRY_AFTER_CAP_NS / 1e9})
                after = RETRY_AFTER_CAP_NS
            delay = after
        left = remaining_ns()
        if left is not None and delay + (now - attempt_start_ns) >= left:
            self._count("stoic.retry.outcomes", "deadline_skip")
            if min_level() <= Level.INFO:
                self._event("retry.deadline_skip", Level.INFO, {"attempt": number, "error.type": error_type(error)})
            return False
        if not self.bucket.try_spend():
            self._count("stoic.retry.outcomes", "budget_exhausted")
            if min_level() <= Level.WARNING:
                self._event("retry.budget_exhausted", Level.WARNING,
                            {"attempt": number, "error.type": error_type(error)})
            return False
        self._count("stoic.retry.retries", error_type(error))
        if min_level() <= Level.INFO:
            self._event("retry.attempt_failed", Level.INFO, {
                "attempt": number, "error.type": error_type(error),
                "decision": "retry" if after is None else "retry_after", "next_delay": delay / 1e9,
            })
        self.wake_ns = now + delay
        return True

    def succeeded(self, attempts: int) -> None:
        self._count("stoic.retry.outcomes", "succeeded")
        if min_level() <= Level.INFO:
            self._event("retry.succeeded", Level.INFO, {"attempts": attempts})


def _task_cancelled() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def _run_async(schedule: BoundedSchedule, fn: Callable[..., Awaitable[R]], args: tuple[Any, ...],
                     kwargs: dict[str, Any], site: str, bucket: RetryBudget, classify: RetryClassifier,
                     nesting: RetryNesting, label: str | None, attempt_ns: int | None, clock: Clock,
                     wants: bool) -> R:
    """The first attempt, inline and lean; the rest (and unusual calls) in :func:`_loop_async`.

    ``wants``: ``fn`` is to be handed an Attempt (the caller decided, from its cache)."""
    next(bucket._deposits)  # the first attempt's deposit (RetryBudget.deposit, inlined)
    if wants or attempt_ns is not None:
        return await _loop_async(schedule, fn, args, kwargs, site, bucket, classify, nesting, label, attempt_ns,
                                 clock, _in_attempt.get(), None, -1)
    # Only the deadline check (5) and up_to use the start: without them, success reads no time.
    under_deadline = _deadline.ever_set and _deadline_scope.get() is not None  # (ever_set: see _deadline)
    started = clock.now_ns() if schedule._timed or under_deadline else -1
    # Set even when already inside an attempt (then it changes nothing and reset restores it):
    # one set beats a get and a branch, and the token's old value says whether we are nested.
    token = _in_attempt.set(True)
    try:
        return await fn(*args, **kwargs)
    except Exception as caught:
        error = caught
    finally:
        _in_attempt.reset(token)
    return await _loop_async(schedule, fn, args, kwargs, site, bucket, classify, nesting, label, attempt_ns,
                             clock, token.old_value is True, error, started)


async def _loop_async(schedule: BoundedSchedule, fn: Callable[..., Awaitable[R]], args: tuple[Any, ...],
                      kwargs: dict[str, Any], site: str, bucket: RetryBudget, classify: RetryClassifier,
                      nesting: RetryNesting, label: str | None, attempt_ns: int | None, clock: Clock,
                      nested: bool, error: Exception | None, started: int) -> R:
    """Every attempt after a failed first one (``error``), or all of them (``error`` None)."""
    attempt: Attempt | None = None
    if "attempt" not in kwargs and wants_attempt(fn):
        attempt = Attempt(1)
        kwargs = {**kwargs, "attempt": attempt}
    run: _Run | None = None
    number = 1
    if error is None:
        started = clock.now_ns()
    while True:
        if error is None:
            token = None if nested else _in_attempt.set(True)
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
                if token is not None:
                    _in_attempt.reset(token)
        if _task_cancelled():
            raise error  # (1) the task running the retry was cancelled: never retried, never swallowed
        if started < 0:
            started = clock.now_ns()  # no deadline and no up_to: the start matters to nothing
        if run is None:
            run = _Run(schedule, site, bucket, classify, nesting is _SINGLE, nested, label or _label_of(fn),
                       clock, started)
        if not run.after_failure(error, number, started):
            raise error  # the last attempt's own exception, unchanged
        error = None
        number += 1
        if attempt is not None:
            attempt = Attempt(number, attempt.call_id)
            kwargs["attempt"] = attempt
        # Cancellation here propagates as CancelledError: the backoff is not swallowed.
        await clock.sleep_until(run.wake_ns)
        started = clock.now_ns()


_COROUTINE = CoroutineType  # what a plain operation must not return


def _not_a_coroutine(fn: Callable[..., object], result: object) -> None:
    if isinstance(result, _COROUTINE):
        result.close()
        raise TypeError(f"{_label_of(fn)} returned a coroutine: await retry(...) for async operations")


def _run_sync(schedule: BoundedSchedule, fn: Callable[..., R], args: tuple[Any, ...], kwargs: dict[str, Any],
              site: str, bucket: RetryBudget, classify: RetryClassifier, nesting: RetryNesting,
              label: str | None, clock: Clock, wants: bool) -> R:
    """The first attempt of a plain function, inline; the rest in :func:`_loop_sync`.

    (Every sync form runs this.)"""
    next(bucket._deposits)
    if wants:
        return _loop_sync(schedule, fn, args, kwargs, site, bucket, classify, nesting, label, clock,
                          _in_attempt.get(), None, -1)
    under_deadline = _deadline.ever_set and _deadline_scope.get() is not None  # (ever_set: see _deadline)
    started = clock.now_ns() if schedule._timed or under_deadline else -1
    token = _in_attempt.set(True)
    try:
        result = fn(*args, **kwargs)
    except Exception as caught:
        error = caught
    else:
        if type(result) is _COROUTINE:
            _not_a_coroutine(fn, result)
        return result
    finally:
        _in_attempt.reset(token)
    return _loop_sync(schedule, fn, args, kwargs, site, bucket, classify, nesting, label, clock,
                      token.old_value is True, error, started)


def _loop_sync(schedule: BoundedSchedule, fn: Callable[..., R], args: tuple[Any, ...], kwargs: dict[str, Any],
               site: str, bucket: RetryBudget, classify: RetryClassifier, nesting: RetryNesting,
               label: str | None, clock: Clock, nested: bool, error: Exception | None, started: int) -> R:
    attempt: Attempt | None = None
    if "attempt" not in kwargs and wants_attempt(fn):
        attempt = Attempt(1)
        kwargs = {**kwargs, "attempt": attempt}
    run: _Run | None = None
    number = 1
    if error is None:
        started = clock.now_ns()
    while True:
        if error is None:
            token = None if nested else _in_attempt.set(True)
            try:
                result = fn(*args, **kwargs)
            except Exception as caught:
                error = caught
            else:
                _not_a_coroutine(fn, result)
                if run is not None:
                    run.succeeded(number)
                return result
            finally:
                if token is not None:
                    _in_attempt.reset(token)
        if started < 0:
            started = clock.now_ns()
        if run is None:
            run = _Run(schedule, site, bucket, classify, nesting is _SINGLE, nested, label or _label_of(fn),
                       clock, started)
        if not run.after_failure(error, number, started):
            raise error
        error = None
        number += 1
        if attempt is not None:
            attempt = Attempt(number, attempt.call_id)
            kwargs["attempt"] = attempt
        clock.sleep_until_blocking(run.wake_ns)
        started = clock.now_ns()


def _nesting(nesting: RetryNesting) -> RetryNesting:
    if not isinstance(nesting, RetryNesting):
        raise TypeError(f"nesting must be a RetryNesting, got {nesting!r}")
    return nesting


def _budget(budget: RetryBudget) -> RetryBudget:
    if not isinstance(budget, RetryBudget):
        raise TypeError(f"budget must be a RetryBudget, got {type(budget).__name__}")
    return budget


# --- the public functions --------------------------------------------------------------------

def retry(
    schedule: BoundedSchedule,
    fn: Callable[..., Awaitable[R]],
    /,
    *args: Any,
    budget: RetryBudget = RetryBudget.PER_CALL_SITE,
    classify: ClassifierLike = RetryClassifier.standard,
    nesting: RetryNesting = RetryNesting.SINGLE_ATTEMPT,
    label: str | None = None,
    attempt_timeout: Seconds | None = None,
    **kwargs: Any,
) -> Coroutine[Any, Any, R]:
    """Run ``await fn(*args, **kwargs)``, retrying failures as ``schedule`` allows (seed 001).

    ``schedule`` must be a :class:`BoundedSchedule` (``TypeError`` otherwise, saying to call
    ``.attempts(n)`` or use ``Schedule.delays``). ``fn`` receives ``attempt=Attempt(...)`` only
    if it declares a parameter named ``attempt``. ``budget`` defaults to one per call site of
    ``retry`` (file:line); ``classify`` is a :class:`RetryClassifier`, a callable
    ``(error) -> RetryDecision | bool`` or exception type(s) to retry; ``label`` names the
    events (default: ``fn``'s qualified name). With ``attempt_timeout`` (seconds, > 0) each
    attempt runs under ``stoic.timeout(attempt_timeout)``; a timed-out attempt raises
    :class:`stoic.DeadlineExceeded`, which is transient.

    After a failed attempt, in order: (1) this task was cancelled: re-raise; (2) inside another
    retry's attempt with ``RetryNesting.SINGLE_ATTEMPT``: re-raise (``retry.nested``); (3) a
    :class:`stoic.Defect` (``retry.defect``) or the classifier says stop (``retry.permanent``):
    re-raise; (4) the schedule is exhausted: re-raise (``retry.exhausted``); (5) the next attempt
    could not finish before the ambient deadline if it took as long as the last: re-raise
    (``retry.deadline_skip``); (6) no budget token: re-raise (``retry.budget_exhausted``);
    otherwise ``retry.attempt_failed`` with the exact delay, sleep on the ambient clock, retry.

    Returns ``fn``'s result. Raises the last attempt's own exception, unchanged.
    ``asyncio.CancelledError`` (and every ``BaseException``) is never retried or swallowed,
    including during the backoff sleep. Keyword arguments named like retry's own parameters
    cannot be forwarded to ``fn``: bind them with ``functools.partial``.

    A plain function returning the coroutine (so the call site is known even under
    ``asyncio.create_task(retry(...))``): configuration errors raise at the call, before ``await``.
    """
    if type(schedule) is not BoundedSchedule:
        _check_schedule(schedule)
    frame = _getframe(1)
    site = _site_at(frame.f_lasti)  # site_of_frame's lookup, inlined for the head of the chain
    if site is None or site.code is not frame.f_code:
        site = site_of_frame(frame)
    op = site.op
    return _run_async(
        schedule, fn, args, kwargs, site.name,
        site.bucket if budget is _PER_SITE else _budget(budget),
        classify if type(classify) is RetryClassifier else as_classifier(classify),
        nesting if nesting is _SINGLE else _nesting(nesting), label,
        None if attempt_timeout is None else to_ns(attempt_timeout, "attempt_timeout"),
        _ambient_clock.get() if _clock.ever_set else SYSTEM_CLOCK,  # current_clock(), inlined
        (op[1] if getattr(fn, "__code__", None) is op[0] else _learn_op(site, fn)) and "attempt" not in kwargs,
    )


def retry_sync(
    schedule: BoundedSchedule,
    fn: Callable[..., R],
    /,
    *args: Any,
    budget: RetryBudget = RetryBudget.PER_CALL_SITE,
    classify: ClassifierLike = RetryClassifier.standard,
    nesting: RetryNesting = RetryNesting.SINGLE_ATTEMPT,
    label: str | None = None,
    **kwargs: Any,
) -> R:
    """:func:`retry` for a plain (blocking) function: same checks, events and budget; sleeps
    block the calling thread on the ambient clock. There is no ``attempt_timeout`` (a plain
    function cannot be interrupted) and no cancellation check. The ambient deadline, if any,
    still decides (5)."""
    if type(schedule) is not BoundedSchedule:
        _check_schedule(schedule)
    # (A coroutine function is caught when it returns its coroutine: cheaper than inspecting it.)
    frame = _getframe(1)
    site = _site_at(frame.f_lasti)  # site_of_frame's lookup, inlined for the head of the chain
    if site is None or site.code is not frame.f_code:
        site = site_of_frame(frame)
    bucket = site.bucket if budget is _PER_SITE else _budget(budget)
    classifier = classify if type(classify) is RetryClassifier else as_classifier(classify)
    if nesting is not _SINGLE:
        _nesting(nesting)
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
                 nesting: RetryNesting, label: str | None, attempt_timeout: Seconds | None,
                 clock: Clock | None, site: str) -> None:
        self.schedule = _check_schedule(schedule)
        self.budget = _budget(budget)
        self.classify = as_classifier(classify)
        self.nesting = _nesting(nesting)
        self.label = label
        self.attempt_ns = None if attempt_timeout is None else to_ns(attempt_timeout, "attempt_timeout")
        self.clock = clock
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
            self.bucket = RetryBudget.for_call_site(self.site)
            if generation == _registry.generation:
                return

    def decorate(self, fn: Callable[P, R]) -> Callable[P, R]:
        if inspect.iscoroutinefunction(fn):
            return self._decorate_async(fn)  # type: ignore[no-any-return]
        if self.attempt_ns is not None:
            raise TypeError("attempt_timeout needs a coroutine function: a plain function cannot be interrupted")
        return self._decorate_sync(fn)

    def _decorate_async(self, fn: Callable[..., Awaitable[Any]]) -> Any:
        schedule, classify, nesting, label, attempt_ns = (
            self.schedule, self.classify, self.nesting, self.label, self.attempt_ns)
        site, fixed_clock, retrier = self.site, self.clock, self
        wants = wants_attempt(fn)

        @functools.wraps(fn)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            bucket = retrier.bucket
            clock = fixed_clock if fixed_clock is not None else current_clock()
            return await _run_async(schedule, fn, args, kwargs, site, bucket, classify, nesting, label,
                                    attempt_ns, clock, wants and "attempt" not in kwargs)

        return async_wrapper

    def _decorate_sync(self, fn: Callable[P, R]) -> Callable[P, R]:
        schedule, classify, nesting, label = self.schedule, self.classify, self.nesting, self.label
        site, fixed_clock, retrier = self.site, self.clock, self
        general = wants_attempt(fn)

        @functools.wraps(fn)
        def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
            bucket = retrier.bucket
            clock = fixed_clock if fixed_clock is not None else current_clock()
            return _run_sync(schedule, fn, args, kwargs, site, bucket, classify, nesting, label, clock,
                             general and "attempt" not in kwargs)

        return sync_wrapper


def retrying(
    schedule: BoundedSchedule,
    *,
    budget: RetryBudget = RetryBudget.PER_CALL_SITE,
    classify: ClassifierLike = RetryClassifier.standard,
    nesting: RetryNesting = RetryNesting.SINGLE_ATTEMPT,
    label: str | None = None,
    attempt_timeout: Seconds | None = None,
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorator: every call of the decorated function is retried as :func:`retry` would.

    Works on coroutine functions (``attempt_timeout`` allowed) and plain functions (as
    :func:`retry_sync`). The per-call-site budget is that of the decoration (one per decorated
    function); events use the ambient clock and sinks at call time; ``label`` defaults to the
    function's qualified name. A function declaring ``attempt`` receives the :class:`Attempt`
    (its callers do not pass it).
    """
    retrier = _Retrier(schedule, budget, classify, nesting, label, attempt_timeout, None, _random.call_site(1))
    return retrier.decorate



def recur(schedule: Schedule, fn: Callable[..., Awaitable[R]], /, *args: Any, **kwargs: Any) -> Coroutine[Any, Any, R]:
    """Run ``fn`` again after each *success*, waiting as ``schedule`` says (polling, refresh).

    Returns the last result when the schedule ends; an error from ``fn`` propagates at once
    (wrap ``fn`` in :func:`retry` to retry failures). The schedule may be unbounded: then
    ``recur`` runs until the task running it is cancelled or its ambient deadline fires, so
    run it where something can stop it (a ``TaskGroup`` task you cancel, a ``stoic.timeout``).
    Jitter draws from the call site's stream; sleeps are on the ambient clock. An ``fn``
    declaring ``attempt`` receives an :class:`Attempt` numbering the runs.
    """
    if not isinstance(schedule, Schedule):
        raise TypeError(f"recur needs a Schedule, got {type(schedule).__name__}")
    return _recur(schedule, fn, args, kwargs, _random.call_site(1), current_clock())


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

