"""Randomness for jitter: one stream per call site, reproducible under a seed.

In production every call site draws from its own ``random.Random`` seeded from the OS, so
concurrent callers draw independently. Inside ``stoic.testing.seeded(n)`` each call site's
stream is derived from ``n`` and the site, so a seed reproduces a run's delays exactly
(design/python.md, "Randomness"; seed 001, "Jitter and seeds").

After ``os.fork()`` the child reseeds every unseeded stream from the OS (field report 21): a
pre-fork server's workers would otherwise draw the parent's next delays in lockstep, the very
thing jitter exists to prevent. Seeded streams are left alone, so ``seeded(n)`` still
reproduces a run inside any one process.
"""

from __future__ import annotations

import os
import random
import sys
import threading
from contextvars import ContextVar


class _Streams:
    __slots__ = ("seed", "streams", "lock")

    def __init__(self, seed: int | None) -> None:
        self.seed = seed
        self.streams: dict[str, random.Random] = {}
        self.lock = threading.Lock()

    def get(self, site: str) -> random.Random:
        stream = self.streams.get(site)
        if stream is None:
            with self.lock:
                stream = self.streams.get(site)
                if stream is None:
                    stream = random.Random() if self.seed is None else random.Random(f"{self.seed}:{_portable(site)}")
                    self.streams[site] = stream
        return stream


def _portable(site: str) -> str:
    """A call site's key without its directories (``test_x.py:42``): a seed reproduces the same
    draws wherever the code is checked out. (Two files of one name with a call site on the same
    line then share a seeded stream: a correlation in a seeded test run, never in production.)"""
    return os.path.basename(site)


_PROCESS = _Streams(None)
_ambient: ContextVar[_Streams] = ContextVar("stoic.random", default=_PROCESS)


def call_site(depth: int = 1) -> str:
    """``"file:line"`` of the caller ``depth`` frames above the function calling this."""
    frame = sys._getframe(depth + 1)
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


# The site a stoic.Keyed family is building its policies for (the line that constructed the
# family): a policy it builds is constructed inside stoic, on one line for every family.
building_for: ContextVar[str | None] = ContextVar("stoic.building_for", default=None)


def construction_site(depth: int = 1) -> str:
    """The ``"file:line"`` a policy is constructed at, for a constructor to key what is per call
    site (a hedge's budget): its caller ``depth`` frames up, or the line that constructed the
    :class:`stoic.Keyed` family building it."""
    site = building_for.get()
    return site if site is not None else call_site(depth + 1)


def stream(site: str) -> random.Random:
    """The ambient random stream for ``site`` (a call-site key)."""
    return _ambient.get().get(site)


def _seeded_streams(seed: int) -> _Streams:
    return _Streams(seed)


def _reseed_after_fork() -> None:
    # In the child only. The lock may have been held by another thread of the parent at the
    # fork: replace it rather than wait on it.
    _PROCESS.lock = threading.Lock()
    for stream in list(_PROCESS.streams.values()):
        stream.seed()  # from os.urandom


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reseed_after_fork)
