"""Task-scoped criticality: how much a request matters when load must be shed (seed 003,
"Queue management", ``prioritized``).

A request's tier is bound for the current context with :func:`bind_criticality` and read by
policies that shed by priority (the prioritized bulkhead queue, the ASGI load-shedding
middleware). Tasks created inside the block inherit the tier, as every context variable.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Iterator
from contextvars import ContextVar


class Criticality(enum.IntEnum):
    """Tiers, lowest first: ``BEST_EFFORT < DEGRADED < NORMAL < CRITICAL``. Unbound work is NORMAL."""

    BEST_EFFORT = 0
    DEGRADED = 1
    NORMAL = 2
    CRITICAL = 3

    def __str__(self) -> str:
        return self.name.lower()


_current: ContextVar[Criticality] = ContextVar("stoic.criticality", default=Criticality.NORMAL)


def current_criticality() -> Criticality:
    """The tier bound for the current context (``Criticality.NORMAL`` when none is bound)."""
    return _current.get()


@contextlib.contextmanager
def bind_criticality(criticality: Criticality) -> Iterator[Criticality]:
    """Bind ``criticality`` for the block (and the tasks it creates); yields it.

    Raises ``TypeError`` when ``criticality`` is not a :class:`Criticality` (an int or a string
    is refused: an unknown tier must never silently become a known one).
    """
    if type(criticality) is not Criticality:
        raise TypeError(f"criticality must be a stoic.Criticality, got {type(criticality).__name__}")
    token = _current.set(criticality)
    try:
        yield criticality
    finally:
        _current.reset(token)
