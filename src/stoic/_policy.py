"""The shape every policy shares, so a Pipeline can compose them (seed 000, "API")."""

from __future__ import annotations

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
