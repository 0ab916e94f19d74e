"""Functions compiled from source: the success paths that a pipeline fuses (stoic.pipeline).

A policy whose admission is a synchronous check writes its part of a call once, as source with
a ``{body}`` slot: its own ``execute`` is compiled from that source, and a ``Pipeline`` of
several such policies is compiled from all of theirs nested in one coroutine, so one rule
stays one text. Every name in that source starts with ``stoic_``; the ones every part may read
are :data:`SHARED`. Retry's first attempt is compiled the same way into its three hosts, in
``stoic._retry``'s own namespace (stoic._retry._FIRST_ATTEMPT).
"""

from __future__ import annotations

import linecache
import textwrap
from collections.abc import Callable
from typing import Any

from . import _deadline
from ._deadline import _current as _deadline_scope

# Names every compiled part may read, bound once in the namespace it is compiled in.
SHARED: dict[str, Any] = {"stoic_deadline": _deadline, "stoic_deadline_get": _deadline_scope.get}


def indent(body: str) -> str:
    """``body`` one block deeper (four spaces), for a part's ``{body}`` slot."""
    return textwrap.indent(body, "    ")


def compile_source(source: str, filename: str, module: str,
                   namespace: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run ``source`` in a fresh namespace holding :data:`SHARED` and return it. Its functions
    belong to ``module`` (their ``__module__``). With ``namespace`` (a module's own globals), run
    it there instead: its functions then read that module's names as the module rebinds them.

    ``filename`` is registered like a file's, so tracebacks through the code show its lines."""
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    if namespace is None:
        namespace = {**SHARED, "__name__": module}
    exec(compile(source, filename, "exec"), namespace)
    return namespace


def compile_method(source: str, qualname: str, doc: str, module: str) -> Callable[..., Any]:
    """The one function ``source`` defines, named by the last part of ``qualname``, compiled
    (:func:`compile_source`, filename ``<stoic qualname>``) to stand as that method: its
    ``__qualname__`` and docstring set."""
    name = qualname.rpartition(".")[2]
    method: Callable[..., Any] = compile_source(source, f"<stoic {qualname}>", module)[name]
    method.__qualname__ = qualname
    method.__doc__ = doc
    return method
