"""stoic events into structlog.

:class:`StructlogSink` logs each event through a structlog logger, with the event name as the
message and ``stoic.label`` plus the event's attributes as key/values, at the event's level. It
never configures structlog: processors, renderers and filtering belong to the application.
"""

from __future__ import annotations

import sys
from collections.abc import Collection
from typing import Any

import structlog

from stoic.events import Event, Level

__all__ = ["LABEL", "StructlogSink", "__version__"]

__version__ = "0.1.0"

LABEL = "stoic.label"
"""The key of the policy's label (the same as in OpenTelemetry and stdlib logging; an application's
own ``label`` bound in its context is left alone)."""

_METHODS = {Level.DEBUG: "debug", Level.INFO: "info", Level.WARNING: "warning", Level.ERROR: "error"}


def _level_check(logger: Any) -> Any:
    """The logger's "is this level enabled" method (structlog's filtering loggers and stdlib
    loggers have one), or None when it has neither."""
    check = getattr(logger, "is_enabled_for", None)
    if callable(check):
        return check
    check = getattr(logger, "isEnabledFor", None)
    return check if callable(check) else None


class StructlogSink:
    """Logs every event at ``level`` or above (default ``Level.INFO``) through structlog.

    ``logger`` is any structlog-style logger (a bound logger with ``debug``/``info``/``warning``/
    ``error``); when ``None``, ``structlog.get_logger("stoic")`` is called once, here: it is a lazy
    proxy, so the sink follows the application's configuration even if structlog is configured
    later. Before building anything the sink asks the logger whether the event's level is enabled
    (``is_enabled_for``/``isEnabledFor``, when the logger has one). A call looks like
    ``logger.warning("breaker.opened", **{"stoic.label": "payments", "trigger": "failure_rate", ...})``;
    an error-level event raised while an exception is being handled (``breaker.defect``,
    ``retry.defect``) also gets ``exc_info=True``, so structlog renders the traceback.
    ``event_names`` (default: every event) limits the sink to those catalog events; a policy none
    of whose events it names is not slowed down by it (see :class:`stoic.events.Sink`). A bare
    ``str`` for it is a ``TypeError`` (give a list or a set of names).
    """

    __slots__ = ("event_names", "level", "logger")

    def __init__(self, logger: Any = None, level: Level = Level.INFO,
                 event_names: Collection[str] | None = None) -> None:
        self.logger = logger if logger is not None else structlog.get_logger("stoic")
        self.level = level
        if isinstance(event_names, str):  # (a set of its characters is not what was meant)
            raise TypeError(f"event_names must be a collection of event names (str), got {event_names!r}")
        self.event_names = None if event_names is None else frozenset(event_names)

    def emit(self, event: Event) -> None:
        logger = self.logger
        check = _level_check(logger)
        if check is not None and not check(int(event.level)):
            return
        method = getattr(logger, _METHODS.get(event.level, "info"))
        if event.level >= Level.ERROR and sys.exc_info()[1] is not None:
            method(event.name, exc_info=True, **{LABEL: event.label}, **event.attributes)
        else:
            method(event.name, **{LABEL: event.label}, **event.attributes)

    def __repr__(self) -> str:
        return f"StructlogSink(level={getattr(self.level, 'name', self.level)})"
