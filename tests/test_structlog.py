"""The structlog adapter: event name as message, label and attributes as key/values, at the
event's level; it never configures structlog."""

from __future__ import annotations

import structlog
from otel_support import SAMPLES, fire
from stoic_structlog import StructlogSink
from structlog.testing import capture_logs

from stoic.events import CATALOG, Level, use_sinks


def test_events_are_logged_with_name_label_attributes_and_level():
    with capture_logs() as logs, use_sinks(StructlogSink()):
        fire("breaker.opened", "payments")
        fire("retry.defect", "payments")
        fire("breaker.closed", "payments")
    assert logs == [
        {"event": "breaker.opened", "log_level": "warning", "label": "payments", **SAMPLES["breaker.opened"]},
        {"event": "retry.defect", "log_level": "error", "label": "payments", **SAMPLES["retry.defect"]},
        {"event": "breaker.closed", "log_level": "info", "label": "payments", **SAMPLES["breaker.closed"]},
    ]
    assert logs[1]["error.type"] == "Defect"


def test_default_level_is_info_and_debug_can_be_asked_for():
    with capture_logs() as logs, use_sinks(StructlogSink()):
        for name in SAMPLES:
            fire(name)
    assert [e["event"] for e in logs] == [n for n in SAMPLES if CATALOG[n].level >= Level.INFO]
    with capture_logs() as debug, use_sinks(StructlogSink(level=Level.DEBUG)):
        fire("breaker.recorded")
    assert debug == [{"event": "breaker.recorded", "log_level": "debug", "label": "svc", **SAMPLES["breaker.recorded"]}]


def test_the_logger_is_looked_up_lazily_so_later_configuration_applies():
    sink = StructlogSink()  # built before structlog is (re)configured by capture_logs
    assert sink.logger is None
    with capture_logs() as logs, use_sinks(sink):
        fire("hedge.won")
    assert [e["event"] for e in logs] == ["hedge.won"]


def test_a_given_logger_is_used_and_structlog_is_never_configured():
    calls: list[tuple[str, str, dict[str, object]]] = []

    class Logger:
        def __getattr__(self, method: str):
            return lambda message, **kw: calls.append((method, message, kw))

    before = structlog.get_config()
    with use_sinks(StructlogSink(Logger(), level=Level.DEBUG)):
        fire("ratelimiter.waited", "rl")
        fire("bulkhead.rejected", "bh")
        fire("hedge.all_failed", "h")
    assert structlog.get_config() == before
    assert calls == [
        ("debug", "ratelimiter.waited", {"label": "rl", **SAMPLES["ratelimiter.waited"]}),
        ("info", "bulkhead.rejected", {"label": "bh", **SAMPLES["bulkhead.rejected"]}),
        ("warning", "hedge.all_failed", {"label": "h"}),
    ]


def test_a_bound_logger_keeps_its_context():
    with capture_logs() as logs:
        logger = structlog.get_logger("stoic").bind(service="checkout")
        with use_sinks(StructlogSink(logger)):
            fire("breaker.half_open", "payments")
    assert logs == [{"event": "breaker.half_open", "log_level": "info", "service": "checkout", "label": "payments",
                     "probes": 1}]
