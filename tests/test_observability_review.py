"""A hostile review of the observability paths: sinks added and removed while events fly,
failing sinks that must not be kept alive, state streams whose consumer's loop is gone or who
fall behind, counters that must never go down, and dashboards checked against the metric table."""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import weakref

import pytest

import stoic
from stoic import BreakerState, CircuitBreaker
from stoic.events import Event, Level

CLOSED, OPEN = BreakerState.CLOSED, BreakerState.OPEN


# ------------------------------------------------------------------ state streams
def test_a_consumer_left_on_a_closed_loop_does_not_break_the_breaker() -> None:
    # Manual loop management: a consumer task is still waiting when its loop is closed. A
    # transition published later from the same thread must not raise "Event loop is closed"
    # out of the breaker (it did: force_open raised RuntimeError, breaker.opened was never emitted).
    breaker = CircuitBreaker(label="closed-loop")
    changes = breaker.state_changes()
    other = breaker.state_changes()
    loop = asyncio.new_event_loop()
    try:
        consumer = loop.create_task(anext(changes))
        loop.run_until_complete(asyncio.sleep(0))
    finally:
        loop.close()
    seen: list[Event] = []

    class Opened:
        def emit(self, event: Event) -> None:
            seen.append(event)

    with stoic.use_sinks(Opened()):
        breaker.force_open()
    assert breaker.state is OPEN
    assert [e.name for e in seen] == ["breaker.opened"]
    assert other.pending == 1  # the other streams still got the transition
    breaker.force_closed()
    assert other.pending == 2
    # The task can never finish (its loop is closed): collect it now, without asyncio's "Task was
    # destroyed but it is pending" error landing in some later test's log capture.
    consumer._log_destroy_pending = False  # type: ignore[attr-defined]
    del consumer
    gc.collect()


# ------------------------------------------------------------------ the sink registry
class _Acting:
    """Records what it receives, then runs ``act`` (to add or remove a sink mid-delivery)."""

    def __init__(self, act: object = None) -> None:
        self.seen: list[str] = []
        self.act = act

    def emit(self, event: Event) -> None:
        self.seen.append(event.name)
        if callable(self.act):
            self.act()


def test_a_scoped_sink_added_process_wide_during_delivery_still_gets_the_event_once() -> None:
    # add_sink from another thread (here: from a sink, deterministically) between the process-wide
    # loop and the scoped one: the scoped sink was skipped as "already process-wide" although the
    # process-wide loop had run without it, so it missed the event.
    scoped = _Acting()
    adder = _Acting(lambda: stoic.add_sink(scoped))
    stoic.add_sink(adder)
    try:
        with stoic.use_sinks(scoped):
            CircuitBreaker(label="adding").force_open()
    finally:
        stoic.remove_sink(adder)
        stoic.remove_sink(scoped)
    assert adder.seen == ["breaker.opened"]
    assert scoped.seen == ["breaker.opened"]


def test_a_sink_removed_process_wide_during_delivery_gets_the_event_once() -> None:
    both = _Acting()
    remover = _Acting(lambda: stoic.remove_sink(both))
    stoic.add_sink(remover)
    stoic.add_sink(both)
    try:
        with stoic.use_sinks(both):
            CircuitBreaker(label="removing").force_open()
    finally:
        stoic.remove_sink(remover)
        stoic.remove_sink(both)
    assert both.seen == ["breaker.opened"]  # was twice: process-wide, then again as "not process-wide"


def test_sinks_toggled_from_another_thread_while_threads_emit_see_each_event_exactly_once() -> None:
    import threading

    class Counting:
        def __init__(self) -> None:
            self.n = 0
            self.lock = threading.Lock()

        def emit(self, event: Event) -> None:
            with self.lock:
                self.n += 1

    both = Counting()
    stop = threading.Event()
    per_thread = 2_000

    def emitter() -> None:
        with stoic.use_sinks(both):
            for i in range(per_thread):
                stoic.events.emit("breaker.reset", "toggled", Level.INFO, i, {})

    def toggler() -> None:
        while not stop.is_set():
            stoic.add_sink(both)
            stoic.remove_sink(both)

    threads = [threading.Thread(target=emitter) for _ in range(4)]
    flipping = threading.Thread(target=toggler)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: the window is a few bytecodes
    try:
        flipping.start()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        stop.set()
        flipping.join()
        sys.setswitchinterval(interval)
    stoic.remove_sink(both)
    assert both.n == 4 * per_thread


def test_a_failing_sink_per_request_is_not_kept_alive_and_each_is_reported() -> None:
    # Failed sinks were kept in a dict for the life of the process (so that a new sink could not
    # reuse a dead one's id): a per-request scoped sink that raises leaked itself and all it held.
    reported: list[str] = []

    class Count(logging.Handler):  # keeps no record (caplog would keep the sinks alive)
        def emit(self, record: logging.LogRecord) -> None:
            reported.append(record.getMessage())

    class PerRequest:
        def __init__(self) -> None:
            self.request = bytearray(10_000)

        def emit(self, event: Event) -> None:
            raise ValueError("broken")

    log = logging.getLogger("stoic.events")
    handler = Count()
    log.addHandler(handler)
    log.propagate = False
    breaker = CircuitBreaker(label="per-request")
    refs = []
    try:
        for _ in range(300):
            sink = PerRequest()
            refs.append(weakref.ref(sink))
            with stoic.use_sinks(sink):
                breaker.force_open()
                breaker.force_closed()  # a second failure of the same sink: not reported again
            del sink
    finally:
        log.removeHandler(handler)
        log.propagate = True
    gc.collect()
    assert sum(ref() is not None for ref in refs) == 0
    assert len(reported) == 300


async def test_a_consumer_that_never_reads_stays_bounded_and_sees_how_many_were_dropped() -> None:
    # Bounded and documented (the newest 16), but the drop was invisible: a consumer coming back
    # could not tell that it had missed transitions. `dropped` counts them.
    breaker = CircuitBreaker(label="never-reads")
    changes = breaker.state_changes()
    for _ in range(50):
        breaker.force_open()
        breaker.force_closed()
    assert changes.pending == 16
    assert changes.dropped == 100 - 16
    received = [await anext(changes) for _ in range(16)]
    assert received == [OPEN, CLOSED] * 8  # the newest 16, in order
    breaker.force_open()
    assert changes.dropped == 84 and await anext(changes) is OPEN  # nothing dropped with room left


# ------------------------------------------------------------------ metrics
def _scrape(registry: object) -> dict[str, float]:
    from prometheus_client import generate_latest

    values = {}
    for line in generate_latest(registry).decode().splitlines():  # type: ignore[arg-type]
        if line.startswith("stoic_") and 'stoic_label="shared:' in line:
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def test_counters_never_go_down_when_one_of_several_policies_sharing_a_label_is_collected() -> None:
    # Policies may share a label (a Keyed family's keys past max_labels all get "<label>:_other",
    # and a family evicts idle keys; or two clients built with the same label). The exporter sums
    # their recorders; when one was garbage-collected its counts left the sum and the counter went
    # DOWN, which Prometheus reads as a reset: rate()/increase() then report a spike of the whole
    # remaining total. A dead member's figures now stay in the sum while the label has a live policy.
    import stoic_prometheus
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    collector = stoic_prometheus.instrument(registry)
    try:
        breakers = [CircuitBreaker(label="shared:_other") for _ in range(3)]
        limiters = [stoic.RateLimiter(100, label="shared:limits") for _ in range(2)]
        for i in range(3):
            for _ in range(i + 1):
                breakers[i].call(lambda: None)
        for i in range(2):
            assert limiters[i].try_acquire(200) is False  # oversized: a rejection counted
        before = _scrape(registry)
        calls = 'stoic_breaker_calls_total{outcome="success",stoic_label="shared:_other"}'
        rejections = 'stoic_ratelimiter_rejections_total{reason="oversized",stoic_label="shared:limits"}'
        count = 'stoic_breaker_call_duration_seconds_count{error_type="",outcome="success",stoic_label="shared:_other"}'
        assert before[calls] == 6 and before[count] == 6 and before[rejections] == 2
        del breakers[2], limiters[1]  # the busiest breaker (3 calls) leaves
        gc.collect()
        after = _scrape(registry)
        assert after[calls] == 6 and after[count] == 6 and after[rejections] == 2
        breakers[0].call(lambda: None)  # the survivors keep counting on top
        assert _scrape(registry)[calls] == 7
        del breakers[:], limiters[:]  # the last members leave: the series go, as documented
        gc.collect()
        assert _scrape(registry) == {}
        CircuitBreaker(label="shared:_other")  # nothing of the old figures is kept for a newcomer
        assert calls not in _scrape(registry)
    finally:
        stoic_prometheus.uninstrument(collector, registry)


def test_a_member_that_lived_and_died_between_two_scrapes_still_counts() -> None:
    # Seen failing before the fix (6 calls read as 1): the collector kept the figures of the
    # members it had seen at a scrape, so a key of a family that was created, called and evicted
    # between two scrapes (a Keyed family's "_other" label, a client built per request) took its
    # counts with it; the counter never went down, but those calls were never counted at all.
    import stoic_prometheus
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    collector = stoic_prometheus.instrument(registry)
    try:
        resident = CircuitBreaker(label="shared:_other")
        resident.call(lambda: None)
        calls = 'stoic_breaker_calls_total{outcome="success",stoic_label="shared:_other"}'
        assert _scrape(registry)[calls] == 1
        for _ in range(5):
            passing = CircuitBreaker(label="shared:_other")
            passing.call(lambda: None)
            del passing
        gc.collect()
        assert _scrape(registry)[calls] == 6
        assert _scrape(registry)[calls] == 6  # (folded once, not again at the next scrape)
        del resident
        gc.collect()
        assert _scrape(registry) == {}  # the last member gone: the series go, as documented
    finally:
        stoic_prometheus.uninstrument(collector, registry)


def test_a_collector_nobody_scrapes_keeps_one_set_of_figures_per_label_however_many_members_die() -> None:
    # Before, each dead member's figures were queued for every collector until its next
    # collection: a client built per request, with a collector never (or rarely) scraped, grew
    # without bound. Now they are summed per label at death; nothing is lost at the scrape.
    from stoic import _metrics

    _metrics.enable()
    collector = _metrics.Collector()
    resident = CircuitBreaker(label="churn")
    resident.call(lambda: None)
    for _ in range(2_000):
        passing = CircuitBreaker(label="churn")
        passing.call(lambda: None)
        del passing
    for i in range(50):
        gone = CircuitBreaker(label=f"gone-{i}")
        gone.call(lambda: None)
        del gone
    gc.collect()
    assert len(collector._dead) == 0
    assert sorted(label for _, label in collector._buried) == sorted(["churn", *(f"gone-{i}" for i in range(50))])
    calls = dict(next(samples for spec, samples in collector.collect() if spec.name == "stoic.breaker.calls"))
    assert calls[("churn", "success")] == 2_001
    assert not [attrs for attrs in calls if attrs[0].startswith("gone-")]  # (no live member: gone)
    assert collector._buried == {}
    del resident


def test_a_member_dying_while_its_collector_is_busy_is_kept_for_the_next_collection() -> None:
    # The cycle collector may run a recorder's death callback while the collector's lock is
    # held (inside collect(), or in another thread): the figures then wait as they came.
    from stoic import _metrics

    _metrics.enable()
    collector = _metrics.Collector()
    resident = CircuitBreaker(label="busy")
    resident.call(lambda: None)
    passing = CircuitBreaker(label="busy")
    passing.call(lambda: None)
    with collector._lock:
        del passing
        gc.collect()
        assert len(collector._dead) == 1 and collector._buried == {}
    calls = dict(next(samples for spec, samples in collector.collect() if spec.name == "stoic.breaker.calls"))
    assert calls[("busy", "success")] == 2
    del resident


class _Interrupt(BaseException):
    """Not an Exception: a sink raising it is an interruption, not a failing sink."""


class _Interrupting:
    level = Level.INFO

    def __init__(self, names: set[str]) -> None:
        self.names = names

    def emit(self, event: Event) -> None:
        if event.name in self.names:
            raise _Interrupt(event.name)


async def test_a_sink_raising_a_base_exception_interrupts_the_call_and_leaks_nothing() -> None:
    # Deliberate (docs/observability.md): only Exceptions from sinks are isolated. A BaseException
    # propagates from the call that emitted, and what the call held is given back first.
    bulkhead = stoic.Bulkhead(max_concurrent=1, queue_limit=1, label="interrupted")
    release = asyncio.Event()

    async def hold() -> None:
        await release.wait()

    holder = asyncio.create_task(bulkhead.execute(hold))
    await asyncio.sleep(0)
    with stoic.use_sinks(_Interrupting({"bulkhead.rejected"})):
        queued = asyncio.create_task(bulkhead.execute(hold))
        await asyncio.sleep(0)
        assert bulkhead.queued == 1
        with pytest.raises(_Interrupt):  # full: the sink interrupts in place of BulkheadFull
            await bulkhead.execute(hold)
        queued.cancel()  # leaves the queue: bulkhead.rejected(cancelled) interrupts again
        (outcome,) = await asyncio.gather(queued, return_exceptions=True)
        assert isinstance(outcome, _Interrupt)
    assert bulkhead.queued == 0 and bulkhead.in_use == 1
    release.set()
    await holder
    assert bulkhead.in_use == 0
    assert await bulkhead.execute(asyncio.sleep, 0) is None  # the slot is free again

    breaker = CircuitBreaker(label="interrupted-breaker")
    with stoic.use_sinks(_Interrupting({"breaker.opened"})), pytest.raises(_Interrupt):
        breaker.force_open()
    assert breaker.state is OPEN  # the transition happened; only its event's delivery was cut


def test_the_core_runs_its_events_metrics_and_streams_with_no_optional_dependency_installed() -> None:
    # test_missing_extras checks that importing stoic imports none of them; this runs the
    # observability paths (sinks, the stdlib logging sink, recorders and their collection, a state
    # stream, retries, timeouts) with every integration made unimportable, as on a bare install.
    import subprocess
    import textwrap

    code = textwrap.dedent("""
        import sys
        for m in ("opentelemetry", "structlog", "prometheus_client", "stoic_opentelemetry",
                  "stoic_structlog", "stoic_prometheus"):
            sys.modules[m] = None
        import asyncio, logging
        import stoic
        from stoic import _metrics
        from stoic.testing import RecordingSink, VirtualClock
        logging.basicConfig(level=logging.DEBUG, stream=sys.stdout, format="%(message)s")
        _metrics.enable()

        async def main():
            clock, recording = VirtualClock(), RecordingSink()
            with stoic.use_clock(clock), stoic.use_sinks(recording, stoic.LoggingSink(level=stoic.Level.DEBUG)):
                breaker = stoic.CircuitBreaker(label="b", minimum_calls=1, window=stoic.CountWindow(1))
                limiter, bulkhead = stoic.RateLimiter(1, label="r"), stoic.Bulkhead(max_concurrent=1, label="h")
                changes = breaker.state_changes()

                async def ok():
                    return 1

                async def down():
                    raise ConnectionError

                await limiter.execute(ok)
                await bulkhead.execute(ok)
                try:
                    await breaker.execute(down)
                except ConnectionError:
                    pass
                assert await anext(changes) is stoic.BreakerState.OPEN
                flaky = stoic.retrying(stoic.Schedule.delays([0.01, 0.01]), label="t")(down)
                try:
                    await clock.run(flaky())
                except ConnectionError:
                    pass
            recording.assert_contract()
            collected = {spec.name for spec, samples in _metrics.Collector().collect() if samples}
            print("events", sorted(set(recording.names)))
            print("metrics", sorted(collected))

        asyncio.run(main())
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "breaker.opened b trigger=failure_rate" in done.stdout  # the LoggingSink's line
    assert "'retry.exhausted'" in done.stdout
    for metric in ("stoic.breaker.calls", "stoic.ratelimiter.permits.available", "stoic.bulkhead.active",
                   "stoic.retry.retries"):
        assert f"'{metric}'" in done.stdout, done.stdout


async def test_a_second_task_awaiting_one_stream_is_refused_instead_of_hanging_the_first() -> None:
    # Two tasks awaiting one stream: the second replaced the first's waiter, so the first was never
    # woken again, whatever arrived (it hung for ever with a transition pending). Like an async
    # generator, a stream now has one consumer at a time; a second gets RuntimeError at once.
    breaker = CircuitBreaker(label="two-consumers")
    changes = breaker.state_changes()
    first = asyncio.create_task(anext(changes))
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="state_changes"):
        await anext(changes)
    breaker.force_open()
    assert await asyncio.wait_for(first, 1) is OPEN
    breaker.force_closed()
    assert await anext(changes) is CLOSED  # one at a time is fine, from any task
    assert len(breaker._streams or ()) == 1  # the refused call did not unsubscribe the stream


async def test_scoped_sinks_follow_the_context_into_tasks_and_to_thread_but_not_into_plain_threads() -> None:
    # Documented in docs/observability.md ("Scoped sinks follow the context"): what use_sinks
    # covers is the contextvars context, with its usual reach.
    import threading

    seen: list[str] = []

    class Labels:
        def emit(self, event: Event) -> None:
            seen.append(event.label)

    def opened(label: str) -> None:
        CircuitBreaker(label=label).force_open()

    release = asyncio.Event()

    async def later() -> None:
        await release.wait()
        opened("task-after-the-block")

    with stoic.use_sinks(Labels()):
        task = asyncio.create_task(later())
        await asyncio.to_thread(opened, "to_thread")
        thread = threading.Thread(target=opened, args=("plain-thread",))
        thread.start()
        thread.join()
        await asyncio.get_running_loop().run_in_executor(None, opened, "run_in_executor")
    release.set()
    await task
    assert seen == ["to_thread", "task-after-the-block"]


def test_a_sink_that_fails_even_to_be_reported_never_breaks_the_call() -> None:
    # Reporting a failed sink looks it up (weakly, by hash) and formats it: a sink whose __hash__
    # raises something other than TypeError made that lookup raise out of the except clause,
    # into the call the sink was only observing.
    class Hostile:
        def __hash__(self) -> int:
            raise RuntimeError("no hash")

        def __eq__(self, other: object) -> bool:
            raise RuntimeError("no eq")

        def __repr__(self) -> str:
            raise RuntimeError("no repr")

        def emit(self, event: Event) -> None:
            raise ValueError("broken")

    breaker = CircuitBreaker(label="hostile-sink")
    logging.getLogger("stoic.events").disabled = True  # the report of a sink without a repr is noise here
    try:
        with stoic.use_sinks(Hostile()):
            breaker.force_open()
            breaker.force_closed()
            assert breaker.call(lambda: 42) == 42
    finally:
        logging.getLogger("stoic.events").disabled = False
    assert breaker.state is CLOSED


def test_a_stream_keeps_its_breaker_alive_and_dropping_it_frees_both() -> None:
    # Documented in docs/breaker.md: the breaker holds streams weakly, a stream holds its breaker.
    breaker = CircuitBreaker(label="watched")
    ref = weakref.ref(breaker)
    changes = breaker.state_changes()
    del breaker
    gc.collect()
    assert ref() is not None
    del changes
    gc.collect()
    assert ref() is None


def test_the_overflow_warning_turned_into_an_error_does_not_lose_the_collection() -> None:
    # Test suites often run with warnings as errors (filterwarnings = error). The one-time overflow
    # RuntimeWarning was raised out of collect(), so that collection (a whole scrape) returned no
    # stoic metric at all; the adapters' guards then only logged it.
    import warnings

    from stoic import _metrics

    _metrics.enable()
    first, second = CircuitBreaker(label="w-one"), CircuitBreaker(label="w-two")
    first.call(lambda: None)
    second.call(lambda: None)
    collector = _metrics.Collector(max_labels=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        collected = dict(collector.collect())
    calls = {attrs: n for attrs, n in next(s for spec, s in collected.items() if spec.name == "stoic.breaker.calls")}
    assert calls[(_metrics.OVERFLOW, "success")] >= 2  # both folded into the one series the cap allows
    del first, second


def test_the_adapters_sinks_have_a_repr_for_an_int_level_too() -> None:
    # A sink's level may be "a Level or an int (a logging level)"; the adapters' reprs read
    # .name, so repr() raised AttributeError (it is what the failed-sink report prints).
    from stoic_opentelemetry import LogEventSink, SpanEventSink
    from stoic_structlog import StructlogSink

    for sink in (SpanEventSink(15), LogEventSink(level=15), StructlogSink(level=15)):  # type: ignore[arg-type]
        assert "15" in repr(sink)
    assert "INFO" in repr(SpanEventSink(Level.INFO))


def test_an_event_a_sink_causes_is_not_fed_back_into_that_sink() -> None:
    # A sink that ships events through a stoic-protected client calls a policy from emit(), which
    # emits again into the same sink: it recursed until RecursionError (about 166 nested calls
    # for ONE event here), and after the first time silently (a failing sink is reported once).
    # An event a sink causes while handling another is now not delivered back to it; the other
    # sinks still get it.
    shipper = CircuitBreaker(label="shipper")
    others: list[str] = []

    class Shipping:
        level = Level.DEBUG

        def __init__(self) -> None:
            self.seen: list[str] = []

        def emit(self, event: Event) -> None:
            self.seen.append(event.label)
            shipper.call(lambda: None)  # "send" the event through a protected client

    class Watching:
        level = Level.DEBUG

        def emit(self, event: Event) -> None:
            others.append(event.label)

    shipping = Shipping()
    with stoic.use_sinks(shipping, Watching()):
        assert CircuitBreaker(label="app").call(lambda: 1) == 1
    assert shipping.seen == ["app"]  # one event, one shipment
    assert sorted(others) == ["app", "shipper"]  # the shipment's own event still reaches the other sink


def test_a_sink_busy_in_one_thread_still_gets_the_events_of_another() -> None:
    # The feedback guard above is per thread: a sink handling an event in one thread is not
    # "busy" for a concurrent event decided in another.
    import threading

    entered, release = threading.Event(), threading.Event()
    seen: list[str] = []

    class Slow:
        def emit(self, event: Event) -> None:
            seen.append(event.label)
            if event.label == "first":
                entered.set()
                release.wait(5)

    slow = Slow()
    stoic.add_sink(slow)
    try:
        first = threading.Thread(target=lambda: CircuitBreaker(label="first").force_open())
        first.start()
        assert entered.wait(5)
        CircuitBreaker(label="second").force_open()  # while "first" is still inside emit()
        release.set()
        first.join()
    finally:
        stoic.remove_sink(slow)
    assert seen == ["first", "second"]


def test_a_stream_whose_consumer_was_left_on_a_stopped_loop_can_be_consumed_from_a_new_one() -> None:
    # The one-consumer rule must not lock a stream for ever because a consumer was abandoned on a
    # loop that no longer runs (stopped or closed): nobody can wake that one.
    breaker = CircuitBreaker(label="abandoned")
    changes = breaker.state_changes()
    stopped = asyncio.new_event_loop()
    abandoned = stopped.create_task(anext(changes))
    stopped.run_until_complete(asyncio.sleep(0))  # left pending on a loop that stops (not closed)

    async def consume() -> BreakerState:
        waiter = asyncio.create_task(anext(changes))
        await asyncio.sleep(0)
        breaker.force_open()
        return await asyncio.wait_for(waiter, 1)

    try:
        assert asyncio.run(consume()) is OPEN
    finally:
        abandoned.cancel()
        stopped.run_until_complete(asyncio.gather(abandoned, return_exceptions=True))
        stopped.close()


def test_the_logging_sink_logs_a_defect_with_its_traceback_as_the_structlog_sink_does(caplog) -> None:
    # StructlogSink attaches the exception being handled to error-level events (breaker.defect,
    # retry.defect); LoggingSink dropped it, so a defect reached stdlib logs without its traceback.
    breaker = CircuitBreaker(label="defect-log")

    def buggy() -> None:
        raise stoic.Defect("invariant broken")

    with caplog.at_level(logging.INFO, logger="stoic"), stoic.use_sinks(stoic.LoggingSink()):
        with pytest.raises(stoic.Defect):
            breaker.call(buggy)
        breaker.force_open()  # a WARNING event, nothing being handled: no traceback
    (defect,) = [r for r in caplog.records if getattr(r, "stoic.event", "") == "breaker.defect"]
    assert defect.exc_info is not None and defect.exc_info[0] is stoic.Defect
    (opened,) = [r for r in caplog.records if getattr(r, "stoic.event", "") == "breaker.opened"]
    assert opened.exc_info is None


def test_a_retry_defect_is_logged_with_its_traceback_sync_and_async(caplog) -> None:
    # docs/observability.md: retry.defect, like breaker.defect, reaches the logging, structlog and
    # OpenTelemetry log sinks with the exception's traceback; the retry decides after the attempt's
    # except clause, so nothing was being handled when it emitted, and every sink dropped it.
    import traceback

    from stoic_structlog import StructlogSink

    class Logger:
        def __init__(self) -> None:
            self.calls: list[tuple[str, dict[str, object]]] = []

        def error(self, event: str, **kw: object) -> None:
            self.calls.append((event, kw))

    outer = KeyError("handled by the caller")

    def buggy() -> None:
        raise stoic.Defect("invariant broken")

    async def abuggy() -> None:
        raise stoic.Defect("invariant broken, async")

    structured = Logger()
    schedule = stoic.Schedule.fixed(0.01).attempts(3)
    with caplog.at_level(logging.INFO, logger="stoic"), \
            stoic.use_sinks(stoic.LoggingSink(), StructlogSink(structured)):
        try:
            raise outer
        except KeyError:
            with pytest.raises(stoic.Defect) as sync_error:
                stoic.retry_sync(schedule, buggy, label="defect-retry")
        with pytest.raises(stoic.Defect) as async_error:
            asyncio.run(stoic.retry(schedule, abuggy, label="defect-retry-async"))
    records = [r for r in caplog.records if getattr(r, "stoic.event", "") == "retry.defect"]
    assert [r.exc_info[1] if r.exc_info else None for r in records] == [sync_error.value, async_error.value]
    assert [kw.get("exc_info") for name, kw in structured.calls if name == "retry.defect"] == [True, True]
    # the error itself is left as the operation raised it: its traceback ends in the operation, its
    # context is the caller's
    assert traceback.extract_tb(sync_error.value.__traceback__)[-1].name == "buggy"
    assert sync_error.value.__context__ is outer and async_error.value.__context__ is None
