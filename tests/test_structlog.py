"""The structlog adapter: event name as message, label and attributes as key/values, at the
event's level; it never configures structlog."""

from __future__ import annotations

import pytest
import structlog
from otel_support import SAMPLES, fire
from stoic_structlog import StructlogSink
from structlog.testing import capture_logs

import stoic
from stoic.events import CATALOG, Level, use_sinks


def test_events_are_logged_with_name_label_attributes_and_level():
    with capture_logs() as logs, use_sinks(StructlogSink()):
        fire("breaker.opened", "payments")
        fire("retry.defect", "payments")
        fire("breaker.closed", "payments")
    assert logs == [
        {"event": "breaker.opened", "log_level": "warning", "stoic.label": "payments", **SAMPLES["breaker.opened"]},
        {"event": "retry.defect", "log_level": "error", "stoic.label": "payments", **SAMPLES["retry.defect"]},
        {"event": "breaker.closed", "log_level": "info", "stoic.label": "payments", **SAMPLES["breaker.closed"]},
    ]
    assert logs[1]["error.type"] == "Defect"


def test_default_level_is_info_and_debug_can_be_asked_for():
    with capture_logs() as logs, use_sinks(StructlogSink()):
        for name in SAMPLES:
            fire(name)
    assert [e["event"] for e in logs] == [n for n in SAMPLES if CATALOG[n].level >= Level.INFO]
    with capture_logs() as debug, use_sinks(StructlogSink(level=Level.DEBUG)):
        fire("breaker.recorded")
    assert debug == [{"event": "breaker.recorded", "log_level": "debug", "stoic.label": "svc",
                      **SAMPLES["breaker.recorded"]}]


def test_the_logger_is_looked_up_lazily_so_later_configuration_applies():
    sink = StructlogSink()  # built before structlog is (re)configured by capture_logs
    assert sink.logger is not None  # made once, a lazy proxy
    with capture_logs() as logs, use_sinks(sink):
        fire("hedge.won")
    assert [e["event"] for e in logs] == ["hedge.won"]


def test_a_given_logger_is_used_and_structlog_is_never_configured():
    calls: list[tuple[str, str, dict[str, object]]] = []

    class Logger:  # no level check: every level is taken as enabled
        def __getattr__(self, method: str):
            if method not in ("debug", "info", "warning", "error"):
                raise AttributeError(method)
            return lambda message, **kw: calls.append((method, message, kw))

    before = structlog.get_config()
    with use_sinks(StructlogSink(Logger(), level=Level.DEBUG)):
        fire("ratelimiter.waited", "rl")
        fire("bulkhead.rejected", "bh")
        fire("hedge.all_failed", "h")
    assert structlog.get_config() == before
    assert calls == [
        ("debug", "ratelimiter.waited", {"stoic.label": "rl", **SAMPLES["ratelimiter.waited"]}),
        ("info", "bulkhead.rejected", {"stoic.label": "bh", **SAMPLES["bulkhead.rejected"]}),
        ("warning", "hedge.all_failed", {"stoic.label": "h", **SAMPLES["hedge.all_failed"]}),
    ]


def test_a_bound_logger_keeps_its_context():
    with capture_logs() as logs:
        logger = structlog.get_logger("stoic").bind(service="checkout")
        with use_sinks(StructlogSink(logger)):
            fire("breaker.half_open", "payments")
    assert logs == [{"event": "breaker.half_open", "log_level": "info", "service": "checkout",
                     "stoic.label": "payments", "probes": 1}]


def test_an_application_label_in_the_context_is_not_overwritten():
    with capture_logs() as logs:
        logger = structlog.get_logger("stoic").bind(label="tenant-7")
        with use_sinks(StructlogSink(logger)):
            fire("breaker.closed", "payments")
    assert logs[0]["label"] == "tenant-7"
    assert logs[0]["stoic.label"] == "payments"


def test_a_disabled_level_builds_nothing():
    calls: list[str] = []

    class Logger:
        def is_enabled_for(self, level: int) -> bool:
            calls.append(f"asked {level}")
            return level >= 30

        def __getattr__(self, method: str):
            return lambda message, **kw: calls.append(f"{method} {message}")

    with use_sinks(StructlogSink(Logger(), level=Level.DEBUG)):
        fire("breaker.closed")
        fire("breaker.opened")
    assert calls == ["asked 20", "asked 30", "warning breaker.opened"]


def test_error_level_events_carry_the_exception_being_handled():
    with capture_logs() as logs, use_sinks(StructlogSink()):
        try:
            raise stoic.Defect("bug")
        except stoic.Defect:
            fire("retry.defect")
        fire("breaker.defect")  # nothing being handled: no exc_info
    assert logs[0]["exc_info"] is True
    assert "exc_info" not in logs[1]


def test_a_breaker_defect_logs_its_traceback_end_to_end():
    breaker = stoic.CircuitBreaker(label="b")

    def buggy() -> None:
        raise stoic.Defect("invariant broken")

    with capture_logs() as logs, use_sinks(StructlogSink()), pytest.raises(stoic.Defect):
        breaker.call(buggy)
    (entry,) = [e for e in logs if e["event"] == "breaker.defect"]
    assert entry["exc_info"] is True and entry["error.type"] == "Defect"


def test_event_names_limit_the_sink_and_leave_other_policies_alone():
    from stoic.events import _sinks

    sink = StructlogSink(level=Level.DEBUG, event_names=("breaker.opened",))
    with capture_logs() as logs, use_sinks(sink):
        fire("breaker.opened")
        fire("hedge.won")
        assert _sinks.min_level("hedge") > Level.ERROR  # a DEBUG sink that names no hedge event
    assert [e["event"] for e in logs] == ["breaker.opened"]


def test_event_names_given_as_one_string_is_a_type_error_not_a_set_of_its_letters():
    with pytest.raises(TypeError, match="event_names"):
        StructlogSink(event_names="breaker.opened")
    assert StructlogSink(event_names=["breaker.opened"]).event_names == frozenset({"breaker.opened"})
