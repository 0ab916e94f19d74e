"""Sinks: where events go. Process-wide and context-scoped, fanned out, failures isolated.

Cost model: a policy asks :func:`enabled` (or reads :func:`min_level`) before building an
event, so an event no sink wants is never built (the hottest paths first read
``_process.floor``, below which no context's sinks go: no context variable). A sink that
raises never breaks a call and never changes a policy's decision; its failure is logged once
per sink, not per event.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import Protocol, runtime_checkable

from ._event import AttributeValue, Event, Level

_OFF = 1_000  # above every level: nothing wanted

_log = logging.getLogger("stoic.events")


@runtime_checkable
class Sink(Protocol):
    """Anything with ``emit(event)``. An optional ``level`` attribute (a :class:`Level`, default
    ``Level.INFO``) is the lowest level the sink wants; lower events are never built for it."""

    def emit(self, event: Event) -> None: ...


def _sink_level(sink: Sink) -> int:
    return int(getattr(sink, "level", Level.INFO))


# A sink with the level it wants, read once when it is installed (levels are compared as plain
# ints on the emit path).
_Entry = tuple[Sink, int]


class _Registry:
    __slots__ = ("entries", "failed", "floor", "ids", "lock", "min_level", "scoped_floor")

    def __init__(self) -> None:
        self.entries: tuple[_Entry, ...] = ()
        self.ids: frozenset[int] = frozenset()
        self.min_level = _OFF
        # The lowest level of any scoped sink ever installed, in any context. It never rises
        # again: a task that copied a context inside a use_sinks block keeps its sinks after
        # the block has ended, and no one can tell when the last such context is gone.
        self.scoped_floor = _OFF
        # min(min_level, scoped_floor): no ambient sink in any context wants a level below
        # this. A hot path reads it first (one attribute, no context variable) and calls
        # min_level() only when it is low enough to matter.
        self.floor = _OFF
        self.lock = threading.Lock()
        # Failed sinks by id, kept alive so a new sink can never reuse a failed one's id and
        # inherit its silence.
        self.failed: dict[int, Sink] = {}

    def _set(self, entries: tuple[_Entry, ...]) -> None:
        self.entries = entries
        self.ids = frozenset(id(s) for s, _ in entries)
        self.min_level = min((lvl for _, lvl in entries), default=_OFF)
        self.floor = min(self.min_level, self.scoped_floor)

    def lower_scoped_floor(self, level: int) -> None:
        with self.lock:
            if level < self.scoped_floor:
                self.scoped_floor = level
                self.floor = min(self.min_level, level)


_process = _Registry()
# (entries, their lowest level) for the current context, or None.
_scoped: ContextVar[tuple[tuple[_Entry, ...], int] | None] = ContextVar("stoic.sinks", default=None)


def min_level() -> int:
    """The lowest level any ambient sink wants (``1000`` when there is no sink)."""
    scoped = _scoped.get()
    if scoped is None:
        return _process.min_level
    return scoped[1] if scoped[1] < _process.min_level else _process.min_level


def enabled(level: int) -> bool:
    """Whether an event at ``level`` would reach any ambient sink."""
    return min_level() <= level


def add_sink(sink: Sink) -> None:
    """Install ``sink`` process-wide (every thread, task and context). Idempotent.

    The sink's ``level`` is read now; change it by removing and adding the sink again.
    """
    with _process.lock:
        if id(sink) in _process.ids:
            return
        _process._set((*_process.entries, (sink, _sink_level(sink))))


def remove_sink(sink: Sink) -> None:
    """Remove a process-wide sink installed with :func:`add_sink`; no error if absent."""
    with _process.lock:
        _process._set(tuple(e for e in _process.entries if e[0] is not sink))


def process_sinks() -> tuple[Sink, ...]:
    """The process-wide sinks, in installation order."""
    return tuple(s for s, _ in _process.entries)


@contextlib.contextmanager
def use_sinks(*sinks: Sink) -> Iterator[None]:
    """Add ``sinks`` for the enclosed block only (this context and tasks created in it).

    Scoped sinks add to the process-wide ones and to any enclosing scope's sinks. Each sink's
    ``level`` is read on entry.
    """
    outer = _scoped.get()
    base = outer[0] if outer else ()
    # A sink already in scope (or repeated here) is kept once: each sink sees an event once.
    seen = {id(s) for s, _ in base}
    added: list[_Entry] = []
    for sink in sinks:
        if id(sink) not in seen:
            seen.add(id(sink))
            added.append((sink, _sink_level(sink)))
    combined = (*base, *added)
    level = min((lvl for _, lvl in combined), default=_OFF)
    if level < _process.scoped_floor:
        _process.lower_scoped_floor(level)  # before any code can see these sinks in scope
    token = _scoped.set((combined, level))
    try:
        yield
    finally:
        _scoped.reset(token)


def _deliver(sink: Sink, event: Event) -> None:
    try:
        sink.emit(event)
    except Exception:  # a sink must never break a call
        key = id(sink)
        if key not in _process.failed:
            _process.failed[key] = sink
            _log.error("stoic: sink %r raised while handling %s; further failures of this sink are not logged",
                       sink, event.name, exc_info=True)


def emit(name: str, label: str, level: Level, time_ns: int, attributes: Mapping[str, AttributeValue]) -> None:
    """Build an event and hand it to every ambient sink that wants its level.

    Callers on a hot path check :func:`enabled` first so the attribute dict is never built
    when nobody listens.
    """
    event = Event(name, label, level, attributes, time_ns)
    value = int(level)
    for sink, wanted in _process.entries:
        if wanted <= value:
            _deliver(sink, event)
    scoped = _scoped.get()
    if scoped is not None:
        ids = _process.ids
        for sink, wanted in scoped[0]:
            if wanted <= value and id(sink) not in ids:
                _deliver(sink, event)
