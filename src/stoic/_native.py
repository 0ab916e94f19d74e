"""The compiled fast paths, when they are built and wanted.

stoic's breaker and retry success paths have C implementations (``stoic.breaker._cbreaker``,
``stoic._cretry``) beside the pure-Python ones; both implement the same rules and the test
suite runs against each. Setting the environment variable ``STOIC_PURE_PYTHON=1`` before
importing stoic selects the pure-Python paths; so does a build without a C compiler.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

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
