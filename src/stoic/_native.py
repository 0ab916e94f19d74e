"""The compiled fast paths, when they are built and wanted.

stoic's breaker and retry success paths have C implementations (``stoic._cbreaker``,
``stoic._cretry``) beside the pure-Python ones; both implement the same rules and the test
suite runs against each. Setting the environment variable ``STOIC_PURE_PYTHON=1`` before
importing stoic selects the pure-Python paths; so does a build without a C compiler.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Coroutine
from types import CoroutineType, ModuleType
from typing import Any

PURE_PYTHON = os.environ.get("STOIC_PURE_PYTHON", "") not in ("", "0")
"""True when ``STOIC_PURE_PYTHON`` asked for the pure-Python paths."""


def load(name: str) -> ModuleType | None:
    """The compiled module ``name``, or None when pure Python was asked for or it was not built."""
    if PURE_PYTHON:
        return None
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


_breaker = load("stoic._cbreaker")
_retry = load("stoic._cretry")

ASYNC_RESULTS: tuple[type[Coroutine[Any, Any, Any]], ...] = (
    CoroutineType,
    *((_breaker.Execution,) if _breaker is not None else ()),
    *((_retry.Run,) if _retry is not None else ()),
)
"""What a plain operation run through a sync path must not return: a coroutine, or the awaitable
a compiled ``execute()``/``retry()`` returns in its place. Every sync path refuses these (never
counted, never retried); the compiled ones are handed this tuple at configuration."""
