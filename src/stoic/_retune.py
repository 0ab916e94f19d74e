"""Retuning a live policy (seed 003, "Control plane"): the one rule every kind's ``_retune`` follows.

A policy's ``_retune(**changes)`` (called by :meth:`stoic.ControlPlane.retune`) first asks
:func:`validated` for a throwaway policy of its own type, built by its own constructor from its
current settings updated with ``changes``: every value is checked by the code that checks it at
construction, and a refusal leaves the live policy untouched. Only then does it copy the new
configuration into itself, keeping what is in flight (slots, permits, waiters, probes) and
dropping what was learnt under the old configuration (windows, estimates, adaptive limits).
A kind that may be retuned from any thread (the breaker, the blocking bulkhead, the rate
limiters) reads its settings, validates and copies in one critical section of its own lock, so
two retunes at once cannot undo each other; a throwaway policy's construction takes no lock of
the live one's (only the metrics module's leaf lock).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")


def validated(policy: T, settings: Mapping[str, Any], changes: Mapping[str, Any]) -> T:
    """A new policy of ``type(policy)`` built with ``settings`` (its current constructor keyword
    arguments) updated with ``changes``, and the live policy's ``label`` and ``clock``.

    Raises ``ValueError`` when ``changes`` is empty, ``TypeError`` naming a parameter that is
    not in ``settings`` (``label``, ``clock`` or one the kind does not take), and whatever the
    constructor raises for a value (``ValueError`` naming the parameter and its range,
    ``TypeError`` for a wrong type).
    """
    if not changes:
        raise ValueError("retune needs at least one parameter to change")
    kind = type(policy).__name__
    for name in changes:
        if name not in settings:
            what = "is fixed for the policy's life" if name in ("label", "clock") else "is not a parameter"
            raise TypeError(f"{kind}: {name!r} {what}; retunable: {', '.join(sorted(settings))}")
    live: Any = policy
    build: Any = type(policy)
    fresh: T = build(**{**settings, **changes}, label=live.label, clock=live._clock)
    return fresh
