"""Events: the observability contract (design/python.md, "Events").

Every decision a policy makes is an :class:`Event`; its name, level and attribute keys are in
:data:`CATALOG`. Sinks receive them: install one process-wide with :func:`add_sink`, or for a
context with :func:`use_sinks`.
"""

from ._catalog import CATALOG, Attribute, EventSpec, check_event
from ._event import AttributeValue, Event, Level, error_type
from ._logging import LoggingSink
from ._sinks import Sink, add_sink, emit, enabled, min_level, process_sinks, remove_sink, use_sinks

__all__ = [
    "CATALOG",
    "Attribute",
    "AttributeValue",
    "Event",
    "EventSpec",
    "Level",
    "LoggingSink",
    "Sink",
    "add_sink",
    "check_event",
    "emit",
    "enabled",
    "error_type",
    "min_level",
    "process_sinks",
    "remove_sink",
    "use_sinks",
]
