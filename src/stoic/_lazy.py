"""asyncio, imported on first use, so ``import stoic`` stays light for threaded programs
(importing asyncio costs about 30 ms; issue 10) while no call path pays for the laziness.

A module that needs asyncio binds ``asyncio = lazy_asyncio(globals())`` (under ``TYPE_CHECKING``
it imports the real module, for the type checker). Until asyncio is imported, that name holds a
placeholder; its first attribute read imports asyncio, puts the real module in place of the
placeholder in every namespace that bound it, and runs the hooks registered with
:func:`when_imported` (module-level bindings such as a pre-read private function). From then on
every use is the plain global read of the real module it always was. A coroutine cannot run
before asyncio is imported, so by the first async call the placeholder is one attribute read
from being gone; when asyncio is already imported, no placeholder is made at all.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

__all__ = ["lazy_asyncio", "when_imported"]

_namespaces: list[dict[str, Any]] = []
_hooks: list[Callable[[ModuleType], None]] = []
# Held while placeholders are replaced and hooks run: a second thread's first use waits until
# every binding is made (re-entrant: a hook may itself read asyncio through a placeholder).
_lock = threading.RLock()


class _Placeholder:
    """What ``asyncio`` names in a stoic module until asyncio is first used."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        return getattr(load(), name)

    def __repr__(self) -> str:
        return "<asyncio, imported on first use by stoic>"


_PLACEHOLDER = _Placeholder()


def load() -> ModuleType:
    """Import asyncio, put it in place of every placeholder, run the hooks; returns asyncio."""
    import asyncio

    with _lock:
        while _namespaces:
            namespace = _namespaces.pop()
            if namespace.get("asyncio") is _PLACEHOLDER:
                namespace["asyncio"] = asyncio
        while _hooks:
            _hooks.pop(0)(asyncio)
    return asyncio


def lazy_asyncio(namespace: dict[str, Any]) -> Any:
    """The value a module binds as ``asyncio``: the module itself when already imported, else
    the placeholder (``namespace``, the module's ``globals()``, is remembered to rebind)."""
    if "asyncio" in sys.modules and not _namespaces:
        return sys.modules["asyncio"]
    _namespaces.append(namespace)
    return _PLACEHOLDER


def when_imported(hook: Callable[[ModuleType], None]) -> None:
    """Run ``hook(asyncio)`` now when asyncio is in use, else when it first is."""
    if "asyncio" in sys.modules and not _namespaces:
        hook(sys.modules["asyncio"])
    else:
        _hooks.append(hook)
