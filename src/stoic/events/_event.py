"""The event value and its levels."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import TypeAlias

AttributeValue: TypeAlias = str | int | float | bool


class Level(enum.IntEnum):
    """An event's level; the numbers are the stdlib ``logging`` levels."""

    DEBUG = 10
    INFO = 20
    WARNING = 30
    ERROR = 40


class Event:
    """One decision a policy made (design/python.md, "Events").

    ``name`` is a catalog name such as ``"breaker.opened"``; ``label`` the policy's label;
    ``level`` a :class:`Level`; ``attributes`` maps the catalog's attribute keys to primitives
    (durations in seconds, errors by type name); ``time_ns`` is the instant on the policy's
    clock (monotonic nanoseconds, not wall-clock time). The same object goes to every sink in
    turn: sinks treat it as read-only (copy ``attributes`` before changing them).
    """

    __slots__ = ("name", "label", "level", "attributes", "time_ns")

    def __init__(
        self, name: str, label: str, level: Level, attributes: Mapping[str, AttributeValue], time_ns: int
    ) -> None:
        self.name = name
        self.label = label
        self.level = level
        self.attributes = attributes
        self.time_ns = time_ns

    def __repr__(self) -> str:
        attrs = ", ".join(f"{k}={v!r}" for k, v in self.attributes.items())
        return f"Event({self.name!r}, label={self.label!r}, {self.level.name}, {{{attrs}}})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Event):
            return NotImplemented
        return (self.name, self.label, self.level, dict(self.attributes), self.time_ns) == (
            other.name,
            other.label,
            other.level,
            dict(other.attributes),
            other.time_ns,
        )

    __hash__ = None  # type: ignore[assignment]  # mutable mapping inside: not hashable


def error_type(error: BaseException) -> str:
    """The ``error.type`` attribute for ``error``: its class's qualified name, never its message
    (messages can carry secrets and unbounded cardinality)."""
    return type(error).__qualname__
