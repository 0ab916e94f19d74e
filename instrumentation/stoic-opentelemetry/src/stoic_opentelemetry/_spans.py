"""Span events: each stoic event becomes an event on the caller's current span."""

from __future__ import annotations

from opentelemetry import trace

from stoic.events import Event, Level

from ._table import attributes


class SpanEventSink:
    """Adds every event at ``level`` or above (default ``Level.INFO``) to the current span.

    The span event is named after the stoic event (``breaker.opened``) and carries the event's
    attributes plus ``stoic.label`` (an integer beyond 64 bits as a float: OpenTelemetry's
    integers are int64). With no current span, or one that is not recording (unsampled, or the
    no-op default), nothing happens and nothing is allocated. The event's
    ``time_ns`` is a monotonic instant, not wall-clock time, so the span event is stamped by the
    SDK when it is added (which is when the policy decided).
    """

    __slots__ = ("level",)

    def __init__(self, level: Level = Level.INFO) -> None:
        self.level = level

    def emit(self, event: Event) -> None:
        span = trace.get_current_span()
        if not span.is_recording():
            return
        span.add_event(event.name, attributes(event))

    def __repr__(self) -> str:
        return f"SpanEventSink(level={getattr(self.level, 'name', self.level)})"
