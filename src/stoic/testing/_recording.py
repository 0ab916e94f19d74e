"""RecordingSink: keeps every event, and checks each against the catalog."""

from __future__ import annotations

import threading

from ..events import Event, Level, check_event


class CatalogViolation(AssertionError):
    """An emitted event is not in the catalog, or carries other attributes than its entry."""


class RecordingSink:
    """A sink that records events in order, for tests.

    Reads follow one rule: a read without an argument is a property (:attr:`events`,
    :attr:`names`, :attr:`violations`), a read with one is a method (:meth:`of`).

    ``level`` is the lowest level recorded (default ``Level.DEBUG``: everything). With
    ``strict=True`` (the default) an event that breaks the catalog contract is recorded in
    :attr:`violations` and :meth:`assert_contract` fails; the sink itself never raises, since a
    sink must not change the policy it observes.
    """

    def __init__(self, level: Level = Level.DEBUG, *, strict: bool = True) -> None:
        self.level = level
        self.strict = strict
        self.events: list[Event] = []
        self.violations: list[str] = []
        self._lock = threading.Lock()

    def emit(self, event: Event) -> None:
        with self._lock:
            self.events.append(event)
            if self.strict:
                self.violations.extend(check_event(event.name, event.attributes))

    @property
    def names(self) -> list[str]:
        """The names of the recorded events, in order (a new list on every read)."""
        return [e.name for e in self.events]

    def of(self, name: str) -> list[Event]:
        """The recorded events called ``name``, in order."""
        return [e for e in self.events if e.name == name]

    def clear(self) -> None:
        with self._lock:
            self.events.clear()
            self.violations.clear()

    def __repr__(self) -> str:
        level = self.level.name if isinstance(self.level, Level) else repr(self.level)
        return f"RecordingSink(level={level}, strict={self.strict}, events={len(self.events)})"

    def assert_contract(self) -> None:
        """Fail if any recorded event broke the catalog contract."""
        if self.violations:
            raise CatalogViolation("\n".join(self.violations))
