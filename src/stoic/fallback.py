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
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ._callbacks import callback_failed
from ._durations import check_label
from ._errors import is_defect
from ._policy import Policy
from .events import Level, emit, error_type
from .events._sinks import kind_floor

# The sinks wanting fallback events (stoic.events._sinks.KindFloor): a sink that wants none of
# them leaves these events unbuilt.
_SINKS = kind_floor("fallback")

__all__ = ["with_fallback"]

R = TypeVar("R")


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
    ``SystemExit`` and every other ``BaseException`` are never handled. An exception raised by
    ``fallback`` itself propagates, chained to the original. ``policy`` may be any
    :class:`stoic.Policy`, a ``Pipeline`` included. ``label`` (keyword, required, a non-empty
    ``str``: ``TypeError``/``ValueError`` at the call otherwise) names this fallback in reports.

    A ``should_handle`` that raises is a configuration error: the operation's own error
    propagates (not the fallback), with the predicate's error chained as its ``__context__``
    and reported once (``warnings`` and the ``"stoic"`` logger).
    """
    check_label(label)
    if not callable(fallback):
        raise TypeError(f"fallback must be callable, got {type(fallback).__name__}")
    if should_handle is not None and not callable(should_handle):
        raise TypeError(f"should_handle must be callable or None, got {type(should_handle).__name__}")
    try:
        result: R = await policy.execute(fn, *args, **kwargs)
        return result
    except Exception as error:
        if should_handle is None:
            handle = not is_defect(error)
        else:
            try:
                handle = bool(should_handle(error))
            except Exception as failure:  # the conservative decision: no fallback, the error stands
                callback_failed(should_handle, f"should_handle of fallback {label!r}", failure, error)
                handle = False
        if not handle:
            raise
        if _SINKS.wants(Level.INFO):
            emit("fallback.substituted", label, Level.INFO, time.monotonic_ns(), {"error.type": error_type(error)})
        substitute = fallback(error)
        if inspect.isawaitable(substitute):
            return await substitute
        return substitute
