"""The compiled fast paths are built and in use, unless STOIC_PURE_PYTHON asked for pure Python.

CI builds them on a machine with a C compiler: a build that silently fell back to pure Python
must fail here rather than pass while testing only one of the two implementations.
"""

from __future__ import annotations

import pytest

from stoic import _native

MODULES = ["stoic.breaker._cbreaker", "stoic._cretry"]


@pytest.mark.parametrize("name", MODULES)
def test_compiled_module_is_loaded_unless_pure_python_is_asked_for(name: str) -> None:
    module = _native.load(name)
    if _native.PURE_PYTHON:
        assert module is None
    else:
        assert module is not None, f"{name} was not built: is a C compiler installed?"
