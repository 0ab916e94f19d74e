"""with_fallback: what to return when every policy around a call has failed (seed 002,
"Falling back").

A function rather than a policy or a stage, on purpose: a fallback swallows the error, so it
belongs outside everything else. Inside a retry it would make the retry see a success; inside a
breaker it would hide the failures the breaker must count. Taking the policy as an argument
leaves the outermost position as the only one available, and keeps the substitute typed to the
operation's own result.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ._callbacks import callback_failed
from ._clock import current_clock
from ._deadline import caller_cancelled
from ._durations import check_label
from ._errors import Defect, code_of, failed_await, is_defect, leaves, not_bound, stopped_at_await
from ._policy import Policy, not_a_policy
from .events import Level, emit, error_type
from .events._sinks import kind_floor
from .pipeline import Pipeline

# The sinks wanting fallback events (stoic.events._sinks.KindFloor): a sink that wants none of
# them leaves these events unbuilt.
_SINKS = kind_floor("fallback")

__all__ = ["with_fallback"]

R = TypeVar("R")


def _misuse(error: Exception, policy: object, fn: object) -> bool:
    """The operation was handed over wrongly (an async generator or a plain function's generator
    or value where a coroutine was due), or the policy was (its ``execute`` does not take
    ``(fn, *args, **kwargs)``, or returns no awaitable): a bug at the call site, not a failure
    of the work.

    Such a ``TypeError`` is raised by ``await`` itself, or by a policy that refused the result
    (``TypeError`` caused by a :class:`Defect`, as the breaker raises it). In a group, one such
    leaf is enough (the exception-group rule for defects). The ``await`` is stoic's own, or that
    of a policy of the caller's: ``error`` came straight out of that policy's ``execute`` frame,
    or, in a ``Pipeline``, out of the ``execute`` frame of one of its stages (the innermost frame
    of the traceback), which stopped at an ``await``. One deeper in is the operation's own
    failure (stoic._errors.failed_await), and so is the operation's own frame standing there (a
    policy that hands back the operation's coroutine itself, as a limiter granting at once
    does, or an empty pipeline: the ``await`` is the operation's own)."""
    tb = error.__traceback__
    if type(error) is TypeError and not_bound(error, fn):
        return True
    if type(error) is TypeError and tb is not None and tb.tb_next is None:
        # Raised in with_fallback's own frame: calling ``policy.execute(fn, ...)`` did not bind
        # (a policy whose execute takes other arguments), or its result was not awaitable.
        return True
    if type(error) is TypeError and tb is not None and tb.tb_next is not None and tb.tb_next.tb_next is None \
            and stopped_at_await(tb.tb_next) and tb.tb_next.tb_frame.f_code is not code_of(fn):
        return True
    if type(error) is TypeError and tb is not None and isinstance(policy, Pipeline):
        while tb.tb_next is not None:
            tb = tb.tb_next
        code = tb.tb_frame.f_code
        if stopped_at_await(tb) and any(getattr(getattr(type(stage), "execute", None), "__code__", None) is code
                                        for stage in policy.stages):
            return True
    return any(isinstance(leaf, TypeError) and (isinstance(leaf.__cause__, Defect) or failed_await(leaf))
               for leaf in leaves(error))


_GENERATOR_FLAGS = inspect.CO_GENERATOR | inspect.CO_ASYNC_GENERATOR


def _refuse_operation(fn: object) -> None:
    """Refuse, before the policy runs, an operation whose misuse shows at the call."""
    if type(fn) is types.FunctionType and not fn.__code__.co_flags & _GENERATOR_FLAGS:
        return  # (the common case, without inspect's unwrapping: a third of the cost)
    if not callable(fn):
        if inspect.iscoroutine(fn):
            fn.close()  # (never to run: no "never awaited" warning on top of the refusal)
        raise TypeError(f"with_fallback needs the operation itself, got a {type(fn).__name__}: pass the "
                        "function and its arguments, not the result of calling it") from Defect(
            "a non-callable was passed to with_fallback")
    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        kind = "an async generator function" if inspect.isasyncgenfunction(fn) else "a generator function"
        raise TypeError(f"with_fallback cannot run {kind} ({getattr(fn, '__qualname__', fn)!r}) under a policy: "
                        "its body runs while the caller iterates. Protect the code that consumes the "
                        "generator instead.") from Defect(f"{kind} was passed to with_fallback")


def _refuse_policy(policy: object) -> None:
    """Refuse what has an ``execute`` but is no Policy (a :class:`stoic.Hedge`, a
    :class:`stoic.Keyed` family, a policy class: stoic._policy.not_a_policy): every call would
    fail, and the default ``should_handle`` would turn that into the fallback on every call."""
    kind = type(policy)
    if kind in _POLICY_KINDS:
        return
    refused = not_a_policy(policy, "hedge the operation under a stageless pipeline instead, "
                                   "with_fallback(stoic.Pipeline(), lambda: hedge.execute(stoic.IDEMPOTENT, fn), ...)")
    if refused is not None:
        raise TypeError(refused) from Defect("what was passed to with_fallback as its policy is not a Policy")
    if not isinstance(policy, type):  # (an instance's verdict depends on its type alone; a class is judged itself)
        if len(_POLICY_KINDS) >= 256:
            _POLICY_KINDS.clear()
        _POLICY_KINDS.add(kind)


# The types whose instances not_a_policy accepted: the next call with one skips the check.
_POLICY_KINDS: set[type] = set()


async def with_fallback(
    policy: Policy,
    fn: Callable[..., Awaitable[R]],
    /,
    *args: Any,
    label: str,
    fallback: Callable[[Exception], R | Awaitable[R]],
    should_handle: Callable[[Exception], bool] | None = None,
    **kwargs: Any,
) -> R:
    """``await policy.execute(fn, *args, **kwargs)``; if that raises an ``Exception`` that
    ``should_handle`` accepts, return ``fallback(error)`` instead (awaited if it returns an
    awaitable: sync or async fallbacks both work).

    ``should_handle`` defaults to "every ``Exception`` except a :class:`stoic.Defect`" (a bug
    should be loud, not papered over). ``asyncio.CancelledError``, ``KeyboardInterrupt``,
    ``SystemExit`` and every other ``BaseException`` are never handled, nor is an error the
    operation made of the caller's cancellation (the task is being cancelled and the error
    carries the ``CancelledError``: the breaker's rule, which never counts it; hedge and retry
    re-raise it too). An exception raised by
    ``fallback`` itself propagates, chained to the original. ``policy`` may be any
    :class:`stoic.Policy`, a ``Pipeline`` included. ``label`` (keyword, required, a non-empty
    ``str``: ``TypeError``/``ValueError`` at the call otherwise) names this fallback in reports.

    A ``should_handle`` that raises, or that returns an awaitable (it must be a plain function:
    it is not awaited), is a configuration error: the operation's own error propagates (not the
    fallback), with the predicate's error chained as its ``__context__`` and reported once
    (``warnings`` and the ``"stoic"`` logger).

    A :class:`stoic.Hedge`, a :class:`stoic.Keyed` family (use ``family.get(key)``) and a policy
    class in place of an instance are not Policies: passed as ``policy`` each raises ``TypeError``
    at the call (it would fail every call, and be substituted).

    A misused operation is a bug at the call site, so it is never substituted, whatever
    ``should_handle`` says (which is not consulted), as the other policies never count or retry
    it: ``fn`` not callable (a coroutine object, say) or a generator or async generator
    function raises ``TypeError`` at the call, before the policy runs; the ``TypeError`` that
    awaiting a plain ``fn``'s generator, async generator or other non-awaitable result raises
    (or a policy's refusal of such a result) propagates unchanged, and the fallback is not
    called. This holds for every policy, a ``Pipeline`` included. So does the ``TypeError`` of
    an ``fn`` that cannot be called with the ``*args``/``**kwargs`` given (``fetch() takes 1
    positional argument but 2 were given``; a wrong call inside ``fn`` is its own failure), and
    that of a misused policy: an ``execute`` that cannot be called as ``execute(fn, *args, **kwargs)``
    or that returns something not awaitable.
    """
    check_label(label)
    _refuse_policy(policy)
    _refuse_operation(fn)
    if not callable(fallback):
        raise TypeError(f"fallback must be callable, got {type(fallback).__name__}")
    if should_handle is not None and not callable(should_handle):
        raise TypeError(f"should_handle must be callable or None, got {type(should_handle).__name__}")
    try:
        result: R = await policy.execute(fn, *args, **kwargs)
        return result
    except Exception as error:
        if _misuse(error, policy, fn):
            raise  # the caller's bug: surfaced, never hidden behind the substitute
        if caller_cancelled(error):
            raise  # the operation made the caller's cancellation an error: no answer for a caller that left
        if should_handle is None:
            handle = not is_defect(error)
        else:
            try:
                verdict = should_handle(error)
                if inspect.isawaitable(verdict):
                    # (An async predicate: its coroutine is always true, so it would fall back on
                    # every error. A configuration error like a raising one; never awaited here.)
                    if inspect.iscoroutine(verdict):
                        verdict.close()
                    raise TypeError(f"should_handle returned a {type(verdict).__name__}, not a bool: it must be a "
                                    "plain function (with_fallback does not await it)")
                handle = bool(verdict)
            except Exception as failure:  # the conservative decision: no fallback, the error stands
                callback_failed(should_handle, f"should_handle of fallback {label!r}", failure, error)
                handle = False
        if not handle:
            raise
        substitute = fallback(error)
        if inspect.isawaitable(substitute):
            substitute = await substitute
        # Once there is a value to return: a fallback that raised substituted nothing.
        if _SINKS.wants(Level.INFO):
            # (On the ambient clock, the one the policies around it measure on: with_fallback has none.)
            emit("fallback.substituted", label, Level.INFO, current_clock().now_ns(), {"error.type": error_type(error)})
        return substitute
