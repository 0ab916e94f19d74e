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

from .._callbacks import _first_report
from ._event import AttributeValue, Event, Level

_OFF = 1_000  # above every level: nothing wanted

_log = logging.getLogger("stoic.events")


@runtime_checkable
class Sink(Protocol):
    """Anything with a synchronous ``emit(event)`` (an ``async def`` or generator ``emit`` is
    refused with ``TypeError`` when installed: it would never run). An optional ``level``
    attribute (a :class:`Level` or an int, default ``Level.INFO``) is the lowest level the sink
    wants; lower events are never built for it. An optional ``event_names`` attribute (a
    collection of catalog event names, default ``None``: every event) narrows what it receives:
    a policy whose events none of the sinks want runs as if there were no sink (the floors
    below are kept per policy kind, ``breaker``, ``retry``...)."""

    def emit(self, event: Event) -> None: ...


def _sink_level(sink: Sink) -> int:
    level = getattr(sink, "level", Level.INFO)
    if isinstance(level, bool) or not isinstance(level, (int, float)):
        raise TypeError(f"sink {sink!r}: level must be a stoic.Level or an int (a logging level), got {level!r}")
    if level != level or level in (float("inf"), float("-inf")):
        raise ValueError(f"sink {sink!r}: level must be a finite number (a stoic.Level or a logging level), "
                         f"got {level!r}")
    return int(level)


def _sink_names(sink: Sink) -> frozenset[str] | None:
    names = getattr(sink, "event_names", None)
    if names is None:
        return None
    if isinstance(names, str):
        raise TypeError(f"sink {sink!r}: event_names must be a collection of event names (str), got {names!r}")
    names = tuple(names)  # once: a one-shot iterator would be used up by the check below
    if not all(isinstance(n, str) for n in names):
        raise TypeError(f"sink {sink!r}: event_names must be a collection of event names (str), got {names!r}")
    from ._catalog import CATALOG  # (the catalog is data; imported here to keep this module's imports light)

    unknown = sorted(set(names) - CATALOG.keys())
    if unknown:
        raise ValueError(f"sink {sink!r}: event_names has names that are not events of the catalog: {unknown}")
    return frozenset(names)


def _kind(name: str) -> str:
    return name.partition(".")[0]


# A sink with the level and names it wants, read once when it is installed (levels are compared
# as plain ints on the emit path; names None: every event).
_Entry = tuple[Sink, int, "frozenset[str] | None"]


# CO_GENERATOR, CO_COROUTINE, CO_ITERABLE_COROUTINE, CO_ASYNC_GENERATOR: calling such a function
# runs none of its body, it only makes an object someone would have to drive.
_NOT_RUN_BY_A_CALL = 0x20 | 0x80 | 0x100 | 0x200


def _check(sink: object) -> _Entry:
    if sink is None or not isinstance(sink, Sink):
        raise TypeError(f"a sink needs an emit(event) method, got {sink!r}")
    emit = sink.emit
    code = getattr(getattr(emit, "__func__", emit), "__code__", None)
    if code is not None and getattr(code, "co_flags", 0) & _NOT_RUN_BY_A_CALL:
        # (emit() is called synchronously and its result dropped: an async def emit would
        # receive no event at all, in silence, while looking installed)
        raise TypeError(f"sink {sink!r}: emit must be a synchronous method (an async def or generator emit "
                        "would never run: hand the event to your own task or queue from a plain emit)")
    return (sink, _sink_level(sink), _sink_names(sink))


def _level_for(entries: tuple[_Entry, ...], kind: str) -> int:
    """The lowest level any of ``entries`` wants for events of policy kind ``kind``."""
    return min((lvl for _, lvl, names in entries if names is None or any(_kind(n) == kind for n in names)),
               default=_OFF)


class KindFloor:
    """The floor of one policy kind: no ambient sink in any context wants an event of this kind
    below ``floor``. A policy module holds its kind's object (:func:`kind_floor`) and guards each
    emit with :meth:`wants`; a per-call path reads ``.floor`` inline first (one attribute, no
    context variable, no call) and asks :meth:`wants` only when it is low enough to matter."""

    __slots__ = ("floor", "kind", "process")

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.process = _OFF  # the lowest level of process-wide sinks wanting this kind
        self.floor = _OFF

    def level(self) -> int:
        """The lowest level any ambient sink (process-wide or in scope here) wants for this kind."""
        return _lowest(self.process, _scoped.get(), self.kind)

    def wants(self, level: int) -> bool:
        """Whether an event of this kind at ``level`` would reach any ambient sink: ``False`` from
        the floor alone while no sink anywhere wants it (the context variable is not read)."""
        return self.floor <= level and _lowest(self.process, _scoped.get(), self.kind) <= level


class _Registry:
    __slots__ = ("entries", "floor", "ids", "kinds", "lock", "min_level", "scoped_floor", "scoped_kinds",
                 "view")

    def __init__(self) -> None:
        self.entries: tuple[_Entry, ...] = ()
        self.ids: frozenset[int] = frozenset()
        # (entries, ids) replaced as one: emit reads both from the same installation, so a sink
        # also in scope, added or removed while an event is delivered (by another thread, or by
        # a sink), still gets that event exactly once.
        self.view: tuple[tuple[_Entry, ...], frozenset[int]] = ((), frozenset())
        self.min_level = _OFF
        # The lowest level of any scoped sink ever installed, in any context. It never rises
        # again: a task that copied a context inside a use_sinks block keeps its sinks after
        # the block has ended, and no one can tell when the last such context is gone.
        self.scoped_floor = _OFF
        # The same per policy kind (a scoped sink with names lowers only the kinds it names).
        self.scoped_kinds: dict[str, int] = {}
        # min(min_level, scoped_floor): no ambient sink in any context wants a level below
        # this. A hot path reads it first (one attribute, no context variable) and calls
        # min_level() only when it is low enough to matter.
        self.floor = _OFF
        self.kinds: dict[str, KindFloor] = {}
        self.lock = threading.Lock()

    def _set(self, entries: tuple[_Entry, ...]) -> None:
        self.entries = entries
        self.ids = frozenset(id(e[0]) for e in entries)
        self.view = (entries, self.ids)
        self.min_level = min((e[1] for e in entries), default=_OFF)
        self.floor = min(self.min_level, self.scoped_floor, *self.scoped_kinds.values())
        for kind in self.kinds.values():
            self._refresh(kind)

    def _refresh(self, kind: KindFloor) -> None:
        kind.process = _level_for(self.entries, kind.kind)
        kind.floor = min(kind.process, self.scoped_floor, self.scoped_kinds.get(kind.kind, _OFF))

    def lower_scoped_floor(self, entries: tuple[_Entry, ...]) -> None:
        with self.lock:
            for _, lvl, names in entries:
                if names is None:
                    self.scoped_floor = min(self.scoped_floor, lvl)
                else:
                    for name in {_kind(n) for n in names}:
                        self.scoped_kinds[name] = min(self.scoped_kinds.get(name, _OFF), lvl)
            self.floor = min(self.min_level, self.scoped_floor, *self.scoped_kinds.values())
            for kind in self.kinds.values():
                self._refresh(kind)

    def kind_floor(self, kind: str) -> KindFloor:
        with self.lock:
            made = self.kinds.get(kind)
            if made is None:
                made = self.kinds[kind] = KindFloor(kind)
                self._refresh(made)
            return made


_process = _Registry()
# (entries, their lowest level) for the current context, or None.
_scoped: ContextVar[tuple[tuple[_Entry, ...], int] | None] = ContextVar("stoic.sinks", default=None)


def kind_floor(kind: str) -> KindFloor:
    """The :class:`KindFloor` of policy kind ``kind`` (one object per kind, updated in place)."""
    return _process.kind_floor(kind)


def min_level(kind: str | None = None) -> int:
    """The lowest level any ambient sink wants (``1000`` when there is no sink); with ``kind``,
    counting only the sinks that want events of that policy kind (``"breaker"``...)."""
    scoped = _scoped.get()
    if kind is None:
        if scoped is None:
            return _process.min_level
        return scoped[1] if scoped[1] < _process.min_level else _process.min_level
    floor = _process.kinds.get(kind)
    return _lowest(floor.process if floor is not None else _level_for(_process.entries, kind), scoped, kind)


def _lowest(process: int, scoped: tuple[tuple[_Entry, ...], int] | None, kind: str) -> int:
    """The lowest level wanted for ``kind``: ``process`` (the process-wide sinks') or lower, by
    the sinks in scope (``scoped``) that want that kind."""
    if scoped is None or scoped[1] >= process:
        return process
    return min(process, _level_for(scoped[0], kind))


def enabled(level: int, kind: str | None = None) -> bool:
    """Whether an event at ``level`` (of policy kind ``kind``, when given) would reach any ambient sink."""
    return min_level(kind) <= level


def add_sink(sink: Sink) -> None:
    """Install ``sink`` process-wide (every thread, task and context). Idempotent.

    The sink's ``level`` and ``event_names`` are read now; change them by removing and adding the sink
    again. Raises ``TypeError`` for ``None`` or an object without ``emit``, a ``level`` that is
    not a number, or ``event_names`` that are not strings.
    """
    entry = _check(sink)
    with _process.lock:
        if id(sink) in _process.ids:
            return
        _process._set((*_process.entries, entry))


def remove_sink(sink: Sink) -> None:
    """Remove a process-wide sink installed with :func:`add_sink`; no error if absent."""
    with _process.lock:
        _process._set(tuple(e for e in _process.entries if e[0] is not sink))


def process_sinks() -> tuple[Sink, ...]:
    """The process-wide sinks, in installation order."""
    return tuple(e[0] for e in _process.entries)


@contextlib.contextmanager
def use_sinks(*sinks: Sink) -> Iterator[None]:
    """Add ``sinks`` for the enclosed block only (this context and tasks created in it).

    Scoped sinks add to the process-wide ones and to any enclosing scope's sinks. Each sink's
    ``level`` and ``event_names`` are read on entry (``TypeError`` as for :func:`add_sink`).
    """
    outer = _scoped.get()
    base = outer[0] if outer else ()
    # A sink already in scope (or repeated here) is kept once: each sink sees an event once.
    seen = {id(e[0]) for e in base}
    added: list[_Entry] = []
    for sink in sinks:
        entry = _check(sink)
        if id(sink) not in seen:
            seen.add(id(sink))
            added.append(entry)
    combined = (*base, *added)
    level = min((e[1] for e in combined), default=_OFF)
    if added:
        _process.lower_scoped_floor(tuple(added))  # before any code can see these sinks in scope
    token = _scoped.set((combined, level))
    try:
        yield
    finally:
        _scoped.reset(token)


class _Inside(threading.local):
    """The ids of the sinks this thread is inside ``emit()`` of. A sink's emit is synchronous
    (nothing to await), so the thread's stack is exactly its extent."""

    def __init__(self) -> None:
        self.sinks: set[int] = set()


_inside = _Inside()


def _deliver(sink: Sink, event: Event) -> None:
    busy = _inside.sinks
    key = id(sink)
    if key in busy:
        # An event the sink caused while handling another (it called a policy: shipping events
        # through a protected client) is not fed back into it, which would recurse until
        # RecursionError. The other sinks still get it.
        return
    busy.add(key)
    try:
        sink.emit(event)
    except Exception:  # a sink must never break a call
        # Reported once per sink, remembered weakly (stoic._callbacks, the rule for every user
        # callback): a failing sink per request must not be kept alive, nor a new sink that
        # reuses a dead one's address inherit its silence.
        try:
            if _first_report(sink):
                _log.error("stoic: sink %r raised while handling %s; further failures of this sink are not logged",
                           sink, event.name, exc_info=True)
        except Exception:  # nor may reporting it (a sink whose __hash__ raises, a logging filter that does)
            pass
    finally:
        busy.discard(key)


def emit(name: str, label: str, level: Level, time_ns: int, attributes: Mapping[str, AttributeValue]) -> None:
    """Build an event and hand it to every ambient sink that wants its level (and its name).

    ``name`` is a catalog name (:data:`stoic.CATALOG`), ``label`` the emitting policy's label,
    ``level`` a :class:`Level`, ``time_ns`` the instant on the policy's clock in integer
    nanoseconds, ``attributes`` the catalog's keys mapped to primitives (durations in float
    seconds, errors by :func:`error_type`). Note the order: ``time_ns`` comes before
    ``attributes`` here, after them in :class:`Event`. Nothing is checked against the catalog
    (``stoic.testing.RecordingSink`` does that in tests). Never raises for a sink: a sink that
    raises is skipped and reported once (the ``"stoic.events"`` logger), and a sink is not fed
    the events it causes itself.

    Callers on a hot path check :func:`enabled` first so the attribute dict is never built
    when nobody listens.
    """
    event = Event(name, label, level, attributes, time_ns)
    value = int(level)
    entries, ids = _process.view
    for sink, wanted, names in entries:
        if wanted <= value and (names is None or name in names):
            _deliver(sink, event)
    scoped = _scoped.get()
    if scoped is not None:
        for sink, wanted, names in scoped[0]:
            if wanted <= value and id(sink) not in ids and (names is None or name in names):
                _deliver(sink, event)
