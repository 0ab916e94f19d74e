"""The core events machinery: process-wide and scoped sinks, fan-out, levels and their cost,
failure isolation, the stdlib-logging sink and the contract-checking RecordingSink."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

import stoic
from stoic.events import (
    CATALOG,
    Event,
    Level,
    LoggingSink,
    Sink,
    add_sink,
    emit,
    enabled,
    min_level,
    process_sinks,
    remove_sink,
    use_sinks,
)
from stoic.testing import CatalogViolation, RecordingSink

OPENED = {"trigger": "forced", "calls": 0, "failures": 0, "slow_calls": 0, "trips": 1}
RECORDED = {"outcome": "success", "slow": False, "state": "closed", "duration": 0.01}


class Raising:
    level = Level.DEBUG

    def __init__(self) -> None:
        self.calls = 0

    def emit(self, event: Event) -> None:
        self.calls += 1
        raise RuntimeError("sink is broken")


class NoLevel:
    """A sink without a ``level`` attribute: INFO by default."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def emit(self, event: Event) -> None:
        self.events.append(event)


def opened(label: str = "svc") -> None:
    emit("breaker.opened", label, Level.WARNING, 42, OPENED)


def recorded(label: str = "svc") -> None:
    emit("breaker.recorded", label, Level.DEBUG, 7, RECORDED)


def test_no_sink_means_nothing_is_enabled():
    assert process_sinks() == ()
    assert min_level() == 1000
    for level in Level:
        assert not enabled(level)


def test_process_wide_sink_sees_events_from_every_thread_and_task():
    sink = RecordingSink()
    add_sink(sink)
    try:
        add_sink(sink)  # idempotent
        assert process_sinks() == (sink,)
        assert enabled(Level.DEBUG) and min_level() == Level.DEBUG
        threads = [threading.Thread(target=opened, args=(f"t{i}",)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

        async def task() -> None:
            recorded("task")

        asyncio.run(task())
    finally:
        remove_sink(sink)
    remove_sink(sink)  # absent: no error
    assert process_sinks() == ()
    assert not enabled(Level.ERROR)
    assert sorted(e.label for e in sink.of("breaker.opened")) == [f"t{i}" for i in range(8)]
    assert [e.label for e in sink.of("breaker.recorded")] == ["task"]
    sink.assert_contract()


def test_the_event_carries_what_was_emitted():
    sink = RecordingSink()
    with use_sinks(sink):
        opened("payments")
    (event,) = sink.events
    assert (event.name, event.label, event.level, event.time_ns) == ("breaker.opened", "payments", Level.WARNING, 42)
    assert dict(event.attributes) == OPENED
    assert event == Event("breaker.opened", "payments", Level.WARNING, OPENED, 42)
    assert event != Event("breaker.opened", "payments", Level.WARNING, OPENED, 43)
    assert "breaker.opened" in repr(event) and "WARNING" in repr(event)
    with pytest.raises(TypeError):
        hash(event)


def test_scoped_sinks_see_only_their_block_and_nest():
    outer, inner = RecordingSink(), RecordingSink()
    opened("before")
    with use_sinks(outer):
        opened("outer")
        with use_sinks(inner):
            assert enabled(Level.DEBUG)
            opened("inner")
        opened("outer-again")
    opened("after")
    assert not enabled(Level.ERROR)
    assert [e.label for e in outer.events] == ["outer", "inner", "outer-again"]
    assert [e.label for e in inner.events] == ["inner"]


async def test_scoped_sinks_follow_tasks_created_inside_the_block_only():
    sink = RecordingSink()
    started = asyncio.Event()

    async def labelled(label: str) -> None:
        await started.wait()
        opened(label)

    outside = asyncio.create_task(labelled("outside"))
    with use_sinks(sink):
        inside = asyncio.create_task(labelled("inside"))
    started.set()
    await asyncio.gather(outside, inside)
    assert [e.label for e in sink.events] == ["inside"]


def test_fan_out_to_process_and_scoped_sinks_once_each():
    a, b, c = RecordingSink(), RecordingSink(), RecordingSink()
    add_sink(a)
    try:
        with use_sinks(b, c), use_sinks(a):  # a is also process-wide: it still gets each event once
            opened()
    finally:
        remove_sink(a)
    assert len(a.events) == len(b.events) == len(c.events) == 1
    assert a.events[0] is b.events[0] is c.events[0]  # one event object, shared


def test_the_same_sink_scoped_twice_gets_each_event_once():
    sink = RecordingSink()
    with use_sinks(sink), use_sinks(sink):
        opened()
    assert len(sink.events) == 1


def test_levels_filter_per_sink_and_set_the_minimum():
    debug, warning, default = RecordingSink(Level.DEBUG), RecordingSink(Level.WARNING), NoLevel()
    with use_sinks(warning):
        assert min_level() == Level.WARNING
        assert enabled(Level.ERROR) and enabled(Level.WARNING) and not enabled(Level.INFO)
        with use_sinks(default):
            assert min_level() == Level.INFO
            with use_sinks(debug):
                assert min_level() == Level.DEBUG
                recorded()
                emit("breaker.closed", "svc", Level.INFO, 0, {"reason": "reset"})
                opened()
    assert debug.names == ["breaker.recorded", "breaker.closed", "breaker.opened"]
    assert [e.name for e in default.events] == ["breaker.closed", "breaker.opened"]
    assert warning.names == ["breaker.opened"]


def test_process_minimum_level_is_recomputed_on_removal():
    debug, error = RecordingSink(Level.DEBUG), RecordingSink(Level.ERROR)
    add_sink(error)
    add_sink(debug)
    try:
        assert min_level() == Level.DEBUG
        remove_sink(debug)
        assert min_level() == Level.ERROR
        with use_sinks(RecordingSink(Level.INFO)):
            assert min_level() == Level.INFO
        assert min_level() == Level.ERROR
    finally:
        remove_sink(error)
    assert min_level() == 1000


def test_a_raising_sink_is_isolated_and_logged_once(caplog):
    broken, healthy = Raising(), RecordingSink()
    with caplog.at_level(logging.DEBUG, logger="stoic.events"), use_sinks(broken, healthy):
        opened()
        opened()
        recorded()
    assert broken.calls == 3
    assert len(healthy.events) == 3
    errors = [r for r in caplog.records if r.name == "stoic.events"]
    assert len(errors) == 1
    assert errors[0].levelno == logging.ERROR
    assert "breaker.opened" in errors[0].getMessage()
    assert errors[0].exc_info is not None and errors[0].exc_info[0] is RuntimeError


def test_each_raising_sink_is_reported_on_its_own_even_after_others_were_dropped():
    # A failed sink is remembered by identity; a new sink must not inherit an old one's silence
    # when the old one is gone and its id (memory address) is reused. The records are counted by
    # a handler that keeps nothing (caplog would keep each traceback, and with it the sink, alive).
    reported: list[str] = []

    class Count(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            reported.append(record.getMessage())

    log = logging.getLogger("stoic.events")
    handler = Count()
    log.addHandler(handler)
    log.propagate = False
    try:
        for _ in range(50):
            with use_sinks(Raising()):
                opened()
    finally:
        log.removeHandler(handler)
        log.propagate = True
    assert len(reported) == 50


def test_a_raising_process_wide_sink_never_reaches_the_caller(caplog):
    broken = Raising()
    add_sink(broken)
    try:
        with caplog.at_level(logging.ERROR, logger="stoic.events"):
            opened()
    finally:
        remove_sink(broken)
    assert broken.calls == 1
    assert len(caplog.records) == 1


def test_sink_protocol_is_structural():
    assert isinstance(RecordingSink(), Sink)
    assert isinstance(NoLevel(), Sink)
    assert not isinstance(object(), Sink)


# --- LoggingSink ---

def test_logging_sink_writes_name_label_and_attributes_at_the_event_level(caplog):
    with caplog.at_level(logging.DEBUG, logger="stoic"), use_sinks(LoggingSink()):
        opened("payments")
        recorded("payments")  # below the sink's default INFO level
        emit("breaker.reset", "payments", Level.INFO, 0, {})
    records = [r for r in caplog.records if r.name == "stoic"]
    assert [r.levelno for r in records] == [logging.WARNING, logging.INFO]
    first = records[0]
    assert first.getMessage() == (
        "breaker.opened payments trigger=forced calls=0 failures=0 slow_calls=0 trips=1"
    )
    assert getattr(first, "stoic.event") == "breaker.opened"
    assert getattr(first, "stoic.label") == "payments"
    assert getattr(first, "stoic.attributes") == OPENED
    assert records[1].getMessage() == "breaker.reset payments"


def test_logging_sink_honours_its_level_and_the_logger_level(caplog):
    logger = logging.getLogger("stoic.test.custom")
    with caplog.at_level(logging.DEBUG, logger="stoic.test.custom"), use_sinks(LoggingSink(logger, Level.DEBUG)):
        recorded()
    assert [r.getMessage().split()[0] for r in caplog.records] == ["breaker.recorded"]
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="stoic.test.custom"), use_sinks(LoggingSink(logger, Level.DEBUG)):
        recorded()
        opened()  # WARNING < the logger's ERROR: dropped by the logger's own level
    assert caplog.records == []


def test_logging_sink_quotes_labels_and_values_that_could_forge_or_split_a_line(caplog):
    # A label or value often comes from outside (a keyed breaker's host, an error's text): a
    # newline in it must not start a forged log line, and a space or '=' must not read as a
    # second field. Such text is quoted with its control characters escaped; plain text is not.
    with caplog.at_level(logging.DEBUG, logger="stoic"), use_sinks(LoggingSink()):
        emit("breaker.reset", "api\nbreaker.closed forged", Level.INFO, 0, {"reason": "a b=c", "ok": "plain"})
        emit("breaker.reset", "", Level.INFO, 0, {"sep": "x\u2028y", "n": 3})
    first, second = (r.getMessage() for r in caplog.records if r.name == "stoic")
    assert "\n" not in first and "\u2028" not in second
    assert first == "breaker.reset 'api\\nbreaker.closed forged' reason='a b=c' ok=plain"
    assert second == "breaker.reset '' sep='x\\u2028y' n=3"
    record = next(r for r in caplog.records if r.name == "stoic")
    assert getattr(record, "stoic.label") == "api\nbreaker.closed forged"  # the structured field is untouched


def test_logging_sink_never_configures_logging():
    root, stoic_logger = logging.getLogger(), logging.getLogger("stoic")
    before = (list(root.handlers), root.level, list(stoic_logger.handlers), stoic_logger.level)
    sink = LoggingSink()
    with use_sinks(sink):
        opened()
    assert (list(root.handlers), root.level, list(stoic_logger.handlers), stoic_logger.level) == before
    assert sink.logger is stoic_logger and sink.level == Level.INFO


# --- RecordingSink and the contract ---

def test_recording_sink_records_and_queries():
    sink = RecordingSink()
    with use_sinks(sink):
        opened("a")
        recorded("b")
        opened("c")
    assert sink.names == ["breaker.opened", "breaker.recorded", "breaker.opened"]
    assert [e.label for e in sink.of("breaker.opened")] == ["a", "c"]
    assert sink.of("hedge.won") == []
    sink.assert_contract()
    sink.clear()
    assert sink.events == [] and sink.violations == []


@pytest.mark.parametrize(
    ("name", "attributes", "problem"),
    [
        ("breaker.exploded", {}, "not in the catalog"),
        ("breaker.closed", {}, "missing attributes ['reason']"),
        ("breaker.closed", {"reason": "reset", "extra": 1}, "not in the catalog ['extra']"),
        ("breaker.half_open", {"probes": True}, "probes=True is not int"),
        ("breaker.half_open", {"probes": 1.0}, "probes=1.0 is not int"),
        ("breaker.recorded", {**RECORDED, "duration": "1s"}, "duration='1s' is not float"),
        ("breaker.recorded", {**RECORDED, "slow": 0}, "slow=0 is not bool"),
        ("breaker.closed", {"reason": 3}, "reason=3 is not str"),
    ],
)
def test_recording_sink_reports_catalog_violations_without_raising(name, attributes, problem):
    sink = RecordingSink()
    with use_sinks(sink):
        emit(name, "svc", Level.ERROR, 0, attributes)  # the sink must not raise into the policy
    assert len(sink.events) == 1
    assert any(problem in v for v in sink.violations), sink.violations
    with pytest.raises(CatalogViolation, match="breaker"):
        sink.assert_contract()


def test_an_int_is_a_valid_float_and_optional_attributes_may_be_left_out():
    sink = RecordingSink()
    with use_sinks(sink):
        emit("breaker.recorded", "svc", Level.DEBUG, 0, {**RECORDED, "duration": 1})
        emit("breaker.rejected", "svc", Level.DEBUG, 0, {"state": "open"})
        emit("breaker.rejected", "svc", Level.DEBUG, 0, {"state": "open", "retry_after": 3.0})
    sink.assert_contract()


def test_a_lenient_recording_sink_keeps_no_violations():
    sink = RecordingSink(strict=False)
    with use_sinks(sink):
        emit("nope", "svc", Level.INFO, 0, {})
    assert sink.violations == [] and sink.names == ["nope"]
    sink.assert_contract()


def test_the_public_surface_reexports_the_events_api():
    assert stoic.CATALOG is CATALOG
    assert stoic.add_sink is add_sink and stoic.use_sinks is use_sinks and stoic.LoggingSink is LoggingSink


@pytest.mark.parametrize("make", [
    lambda label: stoic.CircuitBreaker(label=label),
    lambda label: stoic.RateLimiter(5, label=label),
    lambda label: stoic.Bulkhead(2, label=label),
    lambda label: stoic.BlockingBulkhead(2, label=label),
    lambda label: stoic.BlockingRateLimiter(5, label=label),
])
@pytest.mark.parametrize("label", [None, 7, b"x", ("a",)])
def test_a_policy_label_that_is_not_a_str_is_refused_at_construction(make, label):
    with pytest.raises(TypeError, match="label"):
        make(label)


async def test_an_expiring_timeout_and_a_substituted_fallback_are_catalog_events(clock, sink):
    async def hang() -> None:
        await clock.sleep_until(clock.now_ns() + 10**10)

    async def expire() -> None:
        async with stoic.timeout(0.5, label="attempt"):
            await hang()

    task = asyncio.ensure_future(expire())
    await asyncio.sleep(0)
    await clock.advance(1.0)
    with pytest.raises(stoic.DeadlineExceeded):
        await task
    (expired,) = sink.of("timeout.expired")
    assert expired.label == "attempt" and expired.level == Level.INFO

    breaker = stoic.CircuitBreaker(label="payments")
    breaker.force_open()
    value = await stoic.with_fallback(breaker, hang, label="payments-fallback", fallback=lambda error: "stale")
    assert value == "stale"
    (substituted,) = sink.of("fallback.substituted")
    assert substituted.label == "payments-fallback" and substituted.attributes == {"error.type": "CircuitOpen"}
