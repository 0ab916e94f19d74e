"""stoic events into structlog.

:class:`StructlogSink` logs each event through a structlog logger, with the event name as the
message and ``label`` plus the event's attributes as key/values, at the event's level. It never
configures structlog: processors, renderers and filtering belong to the application.
"""

from __future__ import annotations

from typing import Any

import structlog

from stoic.events import Event, Level

__all__ = ["StructlogSink", "__version__"]

__version__ = "0.1.0"

_METHODS = {Level.DEBUG: "debug", Level.INFO: "info", Level.WARNING: "warning", Level.ERROR: "error"}


class StructlogSink:
    """Logs every event at ``level`` or above (default ``Level.INFO``) through structlog.

    ``logger`` is any structlog-style logger (a bound logger with ``debug``/``info``/``warning``/
    ``error``); when ``None``, ``structlog.get_logger("stoic")`` is called at each emit, so the
    sink follows the application's configuration even if structlog is configured after the sink
    is created. A call looks like ``logger.warning("breaker.opened", label="payments",
    trigger="failure_rate", ...)``; attribute keys with dots (``error.type``) are passed as they
    are. An attribute named like a reserved argument (``event``) would collide with structlog's
    message and is therefore never used by the catalog.
    """

    __slots__ = ("level", "logger")

    def __init__(self, logger: Any = None, level: Level = Level.INFO) -> None:
        self.logger = logger
        self.level = level

    def emit(self, event: Event) -> None:
        logger = self.logger if self.logger is not None else structlog.get_logger("stoic")
        method = getattr(logger, _METHODS.get(event.level, "info"))
        method(event.name, label=event.label, **event.attributes)

    def __repr__(self) -> str:
        return f"StructlogSink(level={self.level.name})"
