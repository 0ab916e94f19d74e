"""The shape every policy shares, so a Pipeline can compose them (seed 000, "API")."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, Protocol, TypeVar, runtime_checkable

P = ParamSpec("P")
R = TypeVar("R")


@runtime_checkable
class Policy(Protocol):
    """A policy runs an operation inline: ``await policy.execute(fn, *args, **kwargs)``.

    The operation's own exception propagates unchanged; a refusal is a :class:`stoic.Rejected`.
    """

    async def execute(self, fn: Callable[..., Awaitable[Any]], /, *args: Any, **kwargs: Any) -> Any: ...


def refuse_generator_function(fn: object, stage: str) -> None:
    """A stage decorating a generator or async generator function would run its wrapper (take a
    slot or a permit) while the call only creates the generator, and the body later, while the
    caller iterates, outside the stage: refused with ``TypeError`` (field report 16)."""
    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        kind = "an async generator function" if inspect.isasyncgenfunction(fn) else "a generator function"
        raise TypeError(f"{stage} cannot guard {kind} ({getattr(fn, '__qualname__', fn)!r}): its body runs while "
                        "the caller iterates, outside it. Guard the code that consumes the generator instead.")
