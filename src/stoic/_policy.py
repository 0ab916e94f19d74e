"""The shape every policy shares, so a Pipeline can compose them (seed 000, "API")."""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Awaitable, Callable
from typing import Any, Final, NoReturn, ParamSpec, Protocol, TypeVar, runtime_checkable

from ._errors import Defect

P = ParamSpec("P")
R = TypeVar("R")


@runtime_checkable
class Policy(Protocol):
    """A policy runs an operation inline: ``await policy.execute(fn, *args, **kwargs)``.

    The operation's own exception propagates unchanged; a refusal is a :class:`stoic.Rejected`.
    ``execute`` returns an awaitable: a coroutine, or (a :class:`stoic.RateLimiter` granting a
    permit at once) the awaitable ``fn`` itself returned, so this protocol promises only
    ``Awaitable`` and an ``async def execute`` fits it as well.
    """

    def execute(self, fn: Callable[..., Awaitable[Any]], /, *args: Any, **kwargs: Any) -> Awaitable[Any]: ...


@functools.cache
def _not_policies() -> tuple[type, type]:
    """(Hedge, Keyed), imported on first use (each imports this module)."""
    from .hedge import Hedge
    from .keyed import Keyed

    return Hedge, Keyed


def not_a_policy(candidate: object, hedge_hint: str) -> str | None:
    """Why ``candidate``, which has an ``execute``, cannot run a call as
    ``candidate.execute(fn, *args, **kwargs)``, or None when nothing says so: a class whose
    ``execute`` is an instance method (unbound: the operation would be taken for ``self``; a
    static or class method is a policy of the class's own), a :class:`stoic.Hedge`
    (it takes ``IDEMPOTENT`` first; ``hedge_hint`` says what to do instead where it was given)
    or a :class:`stoic.Keyed` family (it takes the key first). Accepted, each would fail every
    call; a Pipeline and with_fallback refuse them with ``TypeError`` and this reason."""
    Hedge, Keyed = _not_policies()
    if isinstance(candidate, type) and not isinstance(inspect.getattr_static(candidate, "execute", None),
                                                      (staticmethod, classmethod)):
        return (f"a class is not a Policy (its execute is unbound), got {candidate.__qualname__}: pass an instance, "
                f"{candidate.__name__}(...)")
    if isinstance(candidate, Hedge):
        return f"a Hedge is not a Policy (its execute takes stoic.IDEMPOTENT first), got {candidate!r}: {hedge_hint}"
    if isinstance(candidate, Keyed):
        return (f"a Keyed family is not a Policy (its execute takes the key first), got {candidate!r}: use the "
                "key's policy, family.get(key)")
    return None


def refuse_generator_function(fn: object, stage: str) -> None:
    """A stage decorating a generator or async generator function would run its wrapper (take a
    slot or a permit) while the call only creates the generator, and the body later, while the
    caller iterates, outside the stage: refused with ``TypeError`` (field report 16)."""
    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        kind = "an async generator function" if inspect.isasyncgenfunction(fn) else "a generator function"
        raise TypeError(f"{stage} cannot guard {kind} ({getattr(fn, '__qualname__', fn)!r}): its body runs while "
                        "the caller iterates, outside it. Guard the code that consumes the generator instead.")


# What a plain function run through a blocking stage's ``call`` must not return: work still to
# run (a coroutine when awaited, a generator while iterated), later and outside the stage.
UNRUN_RESULTS: Final = frozenset({types.CoroutineType, types.GeneratorType, types.AsyncGeneratorType})


def refuse_unrun_result(fn: object, result: object, stage: str, async_stage: str) -> NoReturn:
    """``fn``, run by ``stage``'s ``call``, returned ``result``, a type in :data:`UNRUN_RESULTS`:
    close it (never run, so no "never awaited" warning) and raise ``TypeError`` whose cause is a
    :class:`stoic.Defect` (an outer breaker does not count it; never retried), as
    ``CircuitBreaker.call`` and ``retry_sync`` do. ``async_stage``: the class for async functions."""
    kind = type(result).__name__
    if not isinstance(result, types.AsyncGeneratorType):  # (an unstarted one has nothing to close)
        result.close()  # type: ignore[attr-defined]
    hint = (f"use {async_stage} for async functions" if kind == "coroutine"
            else "guard the code that consumes the generator instead")
    raise TypeError(f"{getattr(fn, '__qualname__', fn)!r} returned a {kind} through {stage}.call, whose body "
                    f"would run later, outside it: {hint}") from Defect(f"a {kind} was returned to {stage}.call")


def is_async_callable(fn: object) -> bool:
    """Whether calling ``fn`` gives a coroutine to await: a coroutine function (a
    ``functools.partial`` of one included) or an object whose class's ``__call__`` is one. Every
    decorator and every plain-function path asks this, so an async callable object is taken for
    what it is, not for a plain function whose result is a coroutine."""
    if type(fn) is types.FunctionType and not fn.__code__.co_flags & inspect.CO_COROUTINE \
            and not hasattr(fn, "_is_coroutine_marker"):  # (3.12+ inspect.markcoroutinefunction)
        return False  # a plain def or lambda, without inspect's unwrapping (a callback per call)
    return inspect.iscoroutinefunction(fn) or (
        not inspect.isroutine(fn) and inspect.iscoroutinefunction(getattr(type(fn), "__call__", None)))  # noqa: B004 (the class's own __call__ is what runs)


def refuse_async_callback(callback: object, name: str, returns: str) -> None:
    """``TypeError`` naming ``name`` when ``callback``, a predicate stoic calls while it decides
    about an error (``record_when``, ``classify``, ``is_failure``), is an async callable: it is
    called, never awaited, and its coroutine would read as true on every call."""
    if is_async_callable(callback):
        raise TypeError(f"{name} must be a plain function returning {returns}, got the async callable "
                        f"{callback!r}: it is called while stoic decides about an error, never awaited, "
                        "and its coroutine would read as true every time")


def plain_verdict(verdict: object, name: str) -> object:
    """``verdict``, what the predicate ``name`` returned, unless it is an awaitable: a plain
    function handing back an async predicate's coroutine (a lambda around an ``async def``,
    which :func:`refuse_async_callback` cannot see at construction). Never awaited, it would read
    as true on every call; it is closed and refused with ``TypeError``, which each caller
    handles as that predicate failing (reported once, the conservative decision taken)."""
    if verdict is True or verdict is False or not inspect.isawaitable(verdict):
        return verdict
    if inspect.iscoroutine(verdict):
        verdict.close()  # (never to run: no "never awaited" warning on every call)
    raise TypeError(f"{name} returned a {type(verdict).__name__}: it must be a plain function "
                    "(stoic calls it while deciding and does not await it)")


D = TypeVar("D", bound=Callable[..., Any])


def through_method_decorators(decorate: D) -> D:
    """Let the decorator method ``decorate(self, fn)`` be written above ``@staticmethod`` or
    ``@classmethod``: it decorates the function inside and gives back the same kind of
    descriptor (a plain wrapper would be bound as an instance method, and a staticmethod object
    is no coroutine function, so an async one would be taken for a plain one)."""

    @functools.wraps(decorate)
    def decorator(self: object, fn: Any) -> Any:
        if isinstance(fn, (staticmethod, classmethod)):
            return type(fn)(decorator(self, fn.__func__))
        return decorate(self, fn)

    return decorator  # type: ignore[return-value]
