"""Test support: virtual time, recorded events, seeded randomness and fault injection."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from .. import _random
from .._budget import reset_budgets
from ._clock import VirtualClock, settle
from ._faults import FaultyOperation, fail_times, fail_with, hang
from ._recording import CatalogViolation, RecordingSink


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Make every call site's jitter stream derive from ``seed`` inside the block.

    Each entry starts fresh streams, so the same seed reproduces the same delays.
    """
    token = _random._ambient.set(_random._seeded_streams(seed))
    try:
        yield
    finally:
        _random._ambient.reset(token)


__all__ = [
    "CatalogViolation",
    "FaultyOperation",
    "RecordingSink",
    "VirtualClock",
    "fail_times",
    "fail_with",
    "hang",
    "reset_budgets",
    "seeded",
    "settle",
]
