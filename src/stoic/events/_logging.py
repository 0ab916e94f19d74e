"""The stdlib-logging sink (the core's own adapter; structlog's lives in stoic-structlog)."""

from __future__ import annotations

import logging
import sys

from ._event import Event, Level


class LoggingSink:
    """Logs each event to a stdlib ``logging.Logger`` (default ``logging.getLogger("stoic")``).

    The message is ``"<name> <label> key=value ..."``; a label or value that is empty or holds a
    space, ``=``, a quote or a non-printable character (a newline, say) is written quoted with
    Python's escapes, so outside text can neither forge a line nor split a field. The structured
    fields are also passed as ``extra`` (``stoic.event``, ``stoic.label``, ``stoic.attributes``:
    the label under the same key as in OpenTelemetry and structlog; read them with
    ``getattr(record, "stoic.label")``), unescaped.
    ``level`` is the lowest event level forwarded (default ``Level.INFO``). An error-level event
    emitted while an exception is being handled (``breaker.defect``, ``retry.defect``) carries
    it as ``exc_info``, so the traceback is logged (as the structlog sink does). Never configures
    logging: the application decides handlers and levels.
    """

    def __init__(self, logger: logging.Logger | None = None, level: Level = Level.INFO) -> None:
        self.logger = logger if logger is not None else logging.getLogger("stoic")
        self.level = level

    def emit(self, event: Event) -> None:
        if not self.logger.isEnabledFor(event.level):
            return
        attrs = " ".join(f"{k}={_field(v)}" for k, v in event.attributes.items())
        self.logger.log(
            event.level,
            "%s %s%s",
            event.name,
            _field(event.label),
            f" {attrs}" if attrs else "",
            extra={"stoic.event": event.name, "stoic.label": event.label, "stoic.attributes": dict(event.attributes)},
            exc_info=True if event.level >= Level.ERROR and sys.exc_info()[1] is not None else None,
        )

    def __repr__(self) -> str:
        level = self.level.name if isinstance(self.level, Level) else repr(self.level)
        return f"LoggingSink(logger={getattr(self.logger, 'name', self.logger)!r}, level={level})"


def _field(value: object) -> str:
    """``value`` as one field of the line: bare when it is plain text, else quoted and escaped.

    Labels and values often come from outside (a keyed breaker's host, an error's text); a
    newline would forge a second log line and a space or ``=`` would read as another field.
    """
    text = str(value)
    if text and text.isprintable() and not any(c in text for c in " =\"'"):
        return text
    return repr(text)
