"""The ``@breaker`` wrappers: the breaker's success path inlined around one function.

A wrapper declared ``(*args, **kwargs)`` packs the arguments into a tuple and a fresh dict and
unpacks them again on every call: ~30 ns with no arguments, 50-150 ns with a few, against a
whole breaker overhead of ~250 ns. So when the wrapped function's parameters are simple
(positional-or-keyword and keyword-only; no ``*args``/``**kwargs``, no positional-only), the
wrapper is generated with the same parameter list and defaults and forwards them by name;
anything else gets the same code with ``(*args, **kwargs)``. Both come from one template,
which repeats the fast path of :meth:`CircuitBreaker.execute` / :meth:`CircuitBreaker.call`
(keep the three in step).

What a mirrored wrapper changes, compared with calling through ``(*args, **kwargs)``:
arguments the function cannot take raise ``TypeError`` from the wrapper, as they would from
the function itself, before the breaker admits or counts the call; and the defaults are the
function's at decoration time (the same objects; reassigning ``fn.__defaults__`` later is not
followed).
"""

from __future__ import annotations

import functools
import inspect
import keyword
import linecache
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import _deadline
from .._deadline import _current as _deadline_scope
from ..events import Level, min_level
from ..events._sinks import _process as _sinks_registry

if TYPE_CHECKING:
    from ._breaker import CircuitBreaker

# Every name the template binds starts with this prefix; a function with a parameter that
# does too (or is named like the one builtin it reads) gets the (*args, **kwargs) wrapper, so
# no parameter can shadow the template's names.
_PREFIX = "stoic_"
_BUILTINS_READ = frozenset({"BaseException"})

_TEMPLATE = """\
def stoic_make(stoic_breaker, stoic_fn, stoic_now, stoic_slow_ns, stoic_admit, stoic_refuse_if_late,
               stoic_settle, stoic_settle_error, stoic_deadline, stoic_deadline_get, stoic_sinks,
               stoic_min_level, stoic_coroutine_type, stoic_refuse_coroutine):
    {async_}def stoic_wrapper({params}):
        if stoic_deadline.ever_set and stoic_deadline_get() is not None:
            stoic_refuse_if_late()
        stoic_epoch = stoic_breaker._closed_epoch  # the current epoch when closed, else None
        if stoic_epoch is None:
            stoic_epoch, stoic_probe = stoic_admit()
        else:
            stoic_probe = 0
        stoic_start = stoic_now()
        try:
            stoic_result = {await_}{call}{refuse}
        except BaseException as stoic_exc:
            stoic_settle_error(stoic_exc, stoic_epoch, stoic_probe, stoic_start, {in_task})
            raise
        stoic_end = stoic_now()
        if (
            stoic_end < stoic_breaker._defer_until
            and stoic_end - stoic_start <= stoic_slow_ns
            and (stoic_sinks.floor > {debug} or stoic_min_level() > {debug})
        ):
            stoic_epoch.append(None)
            return stoic_result
        stoic_settle(stoic_epoch, stoic_probe, stoic_start, stoic_end, False)
        return stoic_result
    return stoic_wrapper
"""

# (*args, **kwargs) forwarding: kwargs is nearly always empty, and fn(*args) skips unpacking it.
_PACKED = ("*stoic_args, **stoic_kwargs",
           "(stoic_fn(*stoic_args, **stoic_kwargs) if stoic_kwargs else stoic_fn(*stoic_args))")


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
def _factory(is_async: bool, params: str, call: str) -> Callable[..., Callable[..., Any]]:
    source = _TEMPLATE.format(
        async_="async " if is_async else "",
        await_="await " if is_async else "",
        in_task="True" if is_async else "False",
        # As call(): a plain function that returned a coroutine is refused (never counted).
        refuse="" if is_async else ("\n            if type(stoic_result) is stoic_coroutine_type:"
                                    "\n                stoic_refuse_coroutine(stoic_fn, stoic_result)"),
        params=params,
        call=call,
        debug=int(Level.DEBUG),
    )
    filename = f"<stoic breaker wrapper: {'async ' if is_async else ''}({params})>"
    # Registered like a file so tracebacks through the wrapper show its source lines.
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    namespace: dict[str, Any] = {}
    exec(compile(source, filename, "exec"), namespace)
    make: Callable[..., Callable[..., Any]] = namespace["stoic_make"]
    return make


def decorate(breaker: CircuitBreaker, fn: Callable[..., Any]) -> Callable[..., Any]:
    """The wrapper for ``@breaker`` on ``fn``: each call runs as ``breaker.execute(fn, ...)``
    (coroutine function) or ``breaker.call(fn, ...)`` (plain function) would."""
    from ._breaker import _refuse_coroutine

    is_async = inspect.iscoroutinefunction(fn)
    mirrored = _mirrored(fn)
    params, call = mirrored if mirrored is not None else _PACKED
    wrapper = _factory(is_async, params, call)(
        breaker, fn, breaker._now, breaker._slow_ns, breaker._admit, breaker._refuse_if_late,
        breaker._settle, breaker._settle_error, _deadline, _deadline_scope.get, _sinks_registry, min_level,
        types.CoroutineType, _refuse_coroutine,
    )
    if mirrored is not None:
        # The wrapper's parameters take fn's defaults (the same objects, read now).
        wrapper.__defaults__ = fn.__defaults__
        wrapper.__kwdefaults__ = dict(fn.__kwdefaults__) if fn.__kwdefaults__ else None
    functools.update_wrapper(wrapper, fn)
    return wrapper
