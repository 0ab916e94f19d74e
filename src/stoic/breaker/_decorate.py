"""The breaker's one call path: ``execute``, ``call`` and every ``@breaker`` wrapper come from
one template, so the success path exists once (seed 000, "CircuitBreaker": admission is a
synchronous check, no lock is held across the operation).

The template is compiled per shape: async or sync, and the parameter list. ``execute`` and
``call`` take ``(self, fn, /, *args, **kwargs)``. A ``@breaker`` wrapper declared
``(*args, **kwargs)`` would pack the arguments into a tuple and a fresh dict and unpack them
again on every call (~30 ns with no arguments, 50-150 ns with a few, against a whole breaker
overhead of ~200 ns), so when the wrapped function's parameters are simple (positional-or-keyword
and keyword-only; no ``*args``/``**kwargs``, no positional-only) the wrapper is generated with
the same parameter list and defaults and forwards them by name; anything else gets
``(*args, **kwargs)``.

What a mirrored wrapper changes, compared with calling through ``(*args, **kwargs)``:
arguments the function cannot take raise ``TypeError`` from the wrapper, as they would from
the function itself, before the breaker admits or counts the call; and the defaults are the
function's at decoration time (the same objects; reassigning ``fn.__defaults__`` later is not
followed).

The closed-state success path: a success that was quick and cannot change a decision (the
window holds ``minimum_calls`` and, for a time window, the current bucket has not ended) is
counted without the lock, as one ``next()`` on the epoch's ``itertools.count`` (atomic under
the GIL), and folded into the window exactly at the next locked step (see
``CircuitBreaker._fold``). It needs no recent fold, so it holds at any call rate. A debug sink
or enabled metrics take the locked path, which records every call.

"Quick" needs no subtraction in the common case: a success that started at or after
``_quick_from`` and ended before ``_defer_until`` (the locked path sets them exactly
``slow_call_duration`` apart, from that step's instant when the window would allow longer) cannot
have been slow; one that started earlier (a call in flight across a locked step) is timed
against the breaker's current ``_slow_ns``, read live so that a retune applies at once.

Under the GIL the fast path's last check and its ``next()`` run without a thread switch between
them (CPython checks for a switch after a call completes, not on attribute loads, comparisons or
jumps), so a locked step that sees the lock-free path closed knows nothing more is being counted
into the epoch behind it.
"""

from __future__ import annotations

import functools
import inspect
import keyword
import textwrap
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from .. import _metrics
from .._policy import UNRUN_RESULTS, is_async_callable, through_method_decorators
from .._source import compile_source, indent
from ..events import Level

if TYPE_CHECKING:
    import asyncio

    from ._breaker import CircuitBreaker
else:  # imported on first use (stoic._lazy)
    from .._lazy import lazy_asyncio

    asyncio = lazy_asyncio(globals())

# Every name the template binds starts with this prefix; a function with a parameter that
# does too (or is named like the one builtin it reads) gets the (*args, **kwargs) wrapper, so
# no parameter can shadow the template's names.
_PREFIX = "stoic_"
_BUILTINS_READ = frozenset({"BaseException", "type"})

# What a plain operation must not return through the sync path (stoic._policy.UNRUN_RESULTS): it
# would "succeed" without running (a coroutine) or run its body later, outside the breaker (a
# generator).

# The breaker's part of a call, at indent 0: ``{b}`` is the breaker, ``{p}`` prefixes its own
# names (so several breakers fused in one pipeline cannot collide: stoic.pipeline), ``{body}``
# (indented by 4 here) runs the operation into ``stoic_result``. Its clock is ``stoic_{p}now``.
_STAGE = """\
if stoic_deadline.ever_set and stoic_deadline_get() is not None:
    {b}._refuse_if_late()
stoic_{p}start = stoic_{p}now()
stoic_{p}epoch = {b}._closed_epoch  # the current epoch when closed, else None
if stoic_{p}epoch is None:
    stoic_{p}epoch, stoic_{p}probe = {b}._admit(stoic_{p}start)
else:
    stoic_{p}probe = 0
try:
{body}
except BaseException as stoic_{p}exc:
    {b}._settle_error(stoic_{p}exc, stoic_{p}epoch, stoic_{p}probe, stoic_{p}start, {verdict})
    raise
stoic_{p}end = stoic_{p}now()
if (
    stoic_{p}end < {b}._defer_until
    and (stoic_{p}start >= {b}._quick_from or stoic_{p}end - stoic_{p}start <= {b}._slow_ns)
    and (stoic_sinks.floor > {debug} or stoic_min_level() > {debug})
    and not stoic_metrics.enabled
):
    stoic_next(stoic_{p}epoch)
else:
    {b}._settle(stoic_{p}epoch, stoic_{p}probe, stoic_{p}start, stoic_{p}end, False, None)
"""

# What every generated function takes from stoic_make, besides its own: see shared(). (The
# deadline's names are stoic._source.SHARED, in every compiled namespace.)
SHARED_PARAMS: Final = "stoic_sinks, stoic_min_level, stoic_metrics, stoic_next, stoic_refused, stoic_coroutine_type"

_TEMPLATE = """\
def stoic_make(stoic_breaker, stoic_fn, stoic_now, {shared}):
    {async_}def stoic_wrapper({params}):
{bind_now}{stage}
        return stoic_result
    return stoic_wrapper
"""

_ASYNC_BODY = """\
stoic_awaitable = None
stoic_awaitable = {call}
stoic_result = await stoic_awaitable"""

_SYNC_BODY = """\
stoic_result = {call}
if {refused_test}:
    {b}._refuse_result(stoic_fn, stoic_result)"""


def stage(b: str, p: str, body: str, is_async: bool) -> str:
    """The breaker's part of a call (``_STAGE``) around ``body`` (at indent 0), at indent 0."""
    return _STAGE.format(
        b=b, p=p, body=indent(body), debug=int(Level.DEBUG),
        # The sync path never asks about task cancellation; the async one passes the awaitable
        # so that an async generator handed to execute() is refused, never counted.
        verdict="True, stoic_awaitable, stoic_fn" if is_async else "False, None, stoic_fn")


# call() refuses every returned coroutine, generator or async generator. A @breaker wrapper has
# already refused generator functions at decoration, so it only checks for a coroutine (one
# identity test: a plain function that returns a generator it made is its caller's to iterate).
_REFUSED_BY_CALL = "type(stoic_result) in stoic_refused"
_REFUSED_BY_WRAPPER = "type(stoic_result) is stoic_coroutine_type"

# (*args, **kwargs) forwarding: kwargs is nearly always empty, and fn(*args) skips unpacking it;
# with no arguments either (a lambda, a partial), a plain fn() call skips CALL_FUNCTION_EX.
_PACKED = ("*stoic_args, **stoic_kwargs",
           "(stoic_fn(*stoic_args, **stoic_kwargs) if stoic_kwargs"
           " else (stoic_fn(*stoic_args) if stoic_args else stoic_fn()))")
_METHOD_PARAMS = "stoic_self, stoic_fn, /, *stoic_args, **stoic_kwargs"


def _mirrored(fn: Callable[..., Any]) -> tuple[str, str] | None:
    """(parameter list, the call forwarding them) mirroring ``fn``'s, or None when ``fn`` is not a
    plain Python function with only positional-or-keyword and keyword-only parameters."""
    if type(fn) is not types.FunctionType:
        return None
    code = fn.__code__
    if code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS) or code.co_posonlyargcount:
        return None
    positional = code.co_varnames[: code.co_argcount]
    keyword_only = code.co_varnames[code.co_argcount: code.co_argcount + code.co_kwonlyargcount]
    for name in (*positional, *keyword_only):
        if (not name.isidentifier() or keyword.iskeyword(name) or name.startswith(_PREFIX)
                or name in _BUILTINS_READ):
            return None
    params = list(positional)
    forward = list(positional)
    if keyword_only:
        params.append("*")
        params.extend(keyword_only)
        forward.extend(f"{name}={name}" for name in keyword_only)
    return ", ".join(params), f"stoic_fn({', '.join(forward)})"


@functools.lru_cache(maxsize=256)
def _factory(is_async: bool, params: str, call: str, method: bool) -> Callable[..., Callable[..., Any]]:
    # A method reads the breaker's own attributes; a wrapper has them as closure constants.
    b = "stoic_self" if method else "stoic_breaker"
    refused_test = _REFUSED_BY_CALL if method else _REFUSED_BY_WRAPPER
    body = (_ASYNC_BODY if is_async else _SYNC_BODY).format(call=call, b=b, refused_test=refused_test)
    source = _TEMPLATE.format(
        shared=SHARED_PARAMS,
        async_="async " if is_async else "",
        params=params,
        # A method reads its clock once into a local: a call through ``stoic_self._now()`` would
        # be a LOAD_METHOD on a slot holding a builtin, which CPython 3.11 cannot specialise
        # (~200 ns more per call, measured).
        bind_now="        stoic_now = stoic_self._now\n" if method else "",
        stage=textwrap.indent(stage(b, "", body, is_async).rstrip("\n"), "        "),
    )
    kind = "method" if method else "wrapper"
    filename = f"<stoic breaker {kind}: {'async ' if is_async else ''}({params})>"
    make: Callable[..., Callable[..., Any]] = compile_source(source, filename, "stoic.breaker")["stoic_make"]
    return make


def shared() -> tuple[object, ...]:
    """The values of :data:`SHARED_PARAMS`, in order."""
    from ._breaker import _sinks_registry, min_level  # the breaker kind's sink floor

    return (_sinks_registry, min_level, _metrics.state, next, UNRUN_RESULTS, types.CoroutineType)


def method(is_async: bool, name: str, doc: str | None) -> Callable[..., Any]:
    """``CircuitBreaker.execute`` (``is_async``) or ``CircuitBreaker.call``, from the template."""
    made = _factory(is_async, _METHOD_PARAMS, _PACKED[1], True)(None, None, None, *shared())
    made.__name__ = name
    made.__qualname__ = f"CircuitBreaker.{name}"
    made.__doc__ = doc
    return made


def refuse_generator_function(fn: Callable[..., Any]) -> None:
    """``@breaker`` on a generator function or async generator function: the call would return
    the generator at once and its body would run later, outside the breaker. Refused."""
    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        kind = "an async generator function" if inspect.isasyncgenfunction(fn) else "a generator function"
        raise TypeError(
            f"@breaker cannot protect {kind} ({getattr(fn, '__qualname__', fn)!r}): its body runs while the "
            "caller iterates, outside the breaker. Protect the code that consumes the generator instead.")


@through_method_decorators
def decorate(breaker: CircuitBreaker, fn: Callable[..., Any]) -> Callable[..., Any]:
    """The wrapper for ``@breaker`` on ``fn``: each call runs as ``breaker.execute(fn, ...)``
    (coroutine function) or ``breaker.call(fn, ...)`` (plain function) would. Raises
    ``TypeError`` for a generator or async generator function."""
    if not callable(fn):
        raise TypeError(f"@breaker needs a function, got {type(fn).__name__}")
    refuse_generator_function(fn)
    is_async = is_async_callable(fn)
    mirrored = _mirrored(fn)
    params, call = mirrored if mirrored is not None else _PACKED
    wrapper = _factory(is_async, params, call, False)(breaker, fn, breaker._now, *shared())
    if mirrored is not None:
        # The wrapper's parameters take fn's defaults (the same objects, read now).
        wrapper.__defaults__ = fn.__defaults__
        wrapper.__kwdefaults__ = dict(fn.__kwdefaults__) if fn.__kwdefaults__ else None
    functools.update_wrapper(wrapper, fn)
    return wrapper
