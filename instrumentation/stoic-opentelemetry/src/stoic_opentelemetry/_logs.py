"""Log-based events: each stoic event becomes an OpenTelemetry log record with an event name.

Span events are being deprecated upstream in favour of log records that carry ``event_name``
(OTEP 4430); this sink is the forward-looking option, off by default in ``instrument``.
"""

from __future__ import annotations

import sys
import time
import traceback

from opentelemetry._logs import LoggerProvider, SeverityNumber, get_logger_provider

from stoic._metrics import encodable
from stoic.events import Event, Level

from ._table import SCHEMA_URL, attributes
from ._version import __version__

_SEVERITY: dict[int, tuple[SeverityNumber, str]] = {
    Level.DEBUG: (SeverityNumber.DEBUG, "DEBUG"),
    Level.INFO: (SeverityNumber.INFO, "INFO"),
    Level.WARNING: (SeverityNumber.WARN, "WARN"),
    Level.ERROR: (SeverityNumber.ERROR, "ERROR"),
}


class LogEventSink:
    """Emits every event at ``level`` or above (default ``Level.INFO``) as an OTel log record.

    The record has ``event_name`` set to the stoic event's name, the severity of its level
    (DEBUG, INFO, WARN, ERROR), the event's attributes plus ``stoic.label``, and the event name
    as its body (what log viewers show as the line). An error-level event emitted while an
    exception is being handled (``breaker.defect``, ``retry.defect``) also carries
    ``exception.type``, ``exception.message`` and ``exception.stacktrace``. It is emitted in the current context, so
    an SDK correlates it with the active span. Its timestamp is the wall-clock time of the
    decision (the sink runs when the policy decides), never the event's ``time_ns``, which is
    an instant on the policy's monotonic, possibly virtual, clock. ``logger_provider`` defaults to the global one
    (read once, at construction; the global proxy follows a provider set later).
    """

    __slots__ = ("level", "_logger")

    def __init__(self, logger_provider: LoggerProvider | None = None, level: Level = Level.INFO) -> None:
        self.level = level
        provider = logger_provider if logger_provider is not None else get_logger_provider()
        self._logger = provider.get_logger("stoic_opentelemetry", __version__, schema_url=SCHEMA_URL)

    def emit(self, event: Event) -> None:
        number, text = _SEVERITY.get(event.level, (SeverityNumber.INFO, "INFO"))
        made = attributes(event)
        if event.level >= Level.ERROR:
            # An error-level event emitted while an exception is handled (breaker.defect,
            # retry.defect) carries it, as LoggingSink and StructlogSink do: OTel's exception
            # attributes (semantic conventions), so a backend shows the type and traceback.
            error = sys.exc_info()[1]
            if error is not None:
                made["exception.type"] = type(error).__qualname__
                try:
                    message = str(error)
                except Exception:  # (an exception whose __str__ fails: the record is still sent)
                    message = "<exception str() failed>"  # as the traceback renders it
                # (a message or traceback may name a path with undecodable bytes: a lone
                # surrogate, which OTLP cannot encode, would cost the whole batch)
                made["exception.message"] = encodable(message)
                made["exception.stacktrace"] = encodable("".join(traceback.format_exception(error)))
        self._logger.emit(
            timestamp=time.time_ns(), event_name=event.name, severity_number=number, severity_text=text,
            body=event.name, attributes=made,
        )

    def __repr__(self) -> str:
        return f"LogEventSink(level={getattr(self.level, 'name', self.level)})"
