"""The event contract end to end: one real decision of every policy kind reaches the caller's
current OpenTelemetry span and structlog with exactly the attributes the catalog gives it, and
the events no other test checked attribute by attribute."""

from __future__ import annotations

import asyncio
import gc
import itertools
import random
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from stoic_opentelemetry import SpanEventSink
from stoic_structlog import StructlogSink
from structlog.testing import capture_logs

import stoic
from stoic import (
    IDEMPOTENT,
    AdaptiveThrottle,
    Bulkhead,
    CircuitBreaker,
    ControlPlane,
    CountWindow,
    Hedge,
    Keyed,
    OpenDuration,
    RateLimiter,
    RetryBudget,
    Schedule,
)
from stoic.events import CATALOG, Level
from stoic.testing import RecordingSink, VirtualClock, seeded


class Traced:
    """A tracer whose finished spans are kept, and the three sinks a decision must reach alike."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("review")
        self.recording = RecordingSink()

    def spans(self) -> dict[str, Any]:
        return {s.name: s for s in self.exporter.get_finished_spans()}


@pytest.fixture
def traced() -> Iterator[Traced]:
    made = Traced()
    yield made
    made.provider.shutdown()


def _recorded(events: list[stoic.Event]) -> list[tuple[str, dict[str, Any]]]:
    return [(e.name, {**e.attributes, "stoic.label": e.label}) for e in events]


async def _observe(traced: Traced, decide: Callable[[], Awaitable[None]]) -> tuple[list[Any], list[Any], list[Any]]:
    """Run ``decide`` inside a span "call" with a recording, a span-event and a structlog sink
    (debug and up) in scope: (recorded, span events, log entries), each as (name, attributes
    with stoic.label)."""
    sinks = (traced.recording, SpanEventSink(Level.DEBUG), StructlogSink(level=Level.DEBUG))
    with capture_logs() as logs, stoic.use_sinks(*sinks), traced.tracer.start_as_current_span("call"):
        await decide()
    (span,) = traced.exporter.get_finished_spans()
    on_span = [(e.name, dict(e.attributes)) for e in span.events]
    logged = [(entry.pop("event"), entry) for entry in logs]
    for _, entry in logged:
        assert entry.pop("log_level") == CATALOG[_].level.name.lower()
    traced.recording.assert_contract()
    return _recorded(traced.recording.events), on_span, logged


def _boom() -> Callable[[], Awaitable[None]]:
    async def fail() -> None:
        raise ConnectionError("down")

    return fail


async def _breaker(clock: VirtualClock) -> None:
    breaker = CircuitBreaker(label="db", window=CountWindow(2), minimum_calls=2, failure_rate_threshold=0.5,
                             open_duration=OpenDuration.fixed(30, jitter=0), clock=clock)
    for _ in range(2):
        with pytest.raises(ConnectionError):
            await breaker.execute(_boom())


async def _ratelimiter(clock: VirtualClock) -> None:
    limiter = RateLimiter(1, 1.0, label="rl", clock=clock)
    await limiter.acquire()
    await clock.run(limiter.acquire())  # waits 1 s for its permit: ratelimiter.waited


async def _bulkhead(clock: VirtualClock) -> None:
    bulkhead = Bulkhead(1, queue_limit=0, label="bh", clock=clock)
    gate = asyncio.Event()
    held = asyncio.create_task(bulkhead.execute(gate.wait))
    await asyncio.sleep(0)
    with pytest.raises(stoic.BulkheadFull):
        await bulkhead.execute(asyncio.sleep, 0)
    gate.set()
    await held


_SHED_AT: list[int] = []


async def _throttle(clock: VirtualClock) -> None:
    # Every call fails: the n-th faces (n - 1) / n (requests counted with it, no accepts); calls
    # until the first is shed (the draw depends on the call site's stream).
    throttle = AdaptiveThrottle(label="th", clock=clock, min_throughput=0, max_probability=0.99)
    with seeded(1):
        for n in range(1, 50):
            try:
                await throttle.execute(_boom())
            except ConnectionError:
                continue
            except stoic.Throttled:
                _SHED_AT[:] = [n]
                return
    raise AssertionError("never shed")


async def _adaptive(clock: VirtualClock) -> None:
    bulkhead = stoic.AdaptiveBulkhead(latency_threshold=0.1, max_concurrent=10, label="ad", clock=clock)
    await clock.run(bulkhead.execute(clock.sleep, 0.5))  # a breach: the limit backs off


async def _fleet(clock: VirtualClock) -> None:
    from stoic.fleet import RedisStore, SharedRateLimiter, StoreError

    store = RedisStore("redis://127.0.0.1:1/0", clock=clock)

    async def timed(*args: Any) -> Any:
        raise StoreError("down", operation="limiter_take", unavailable=True)

    store._timed = timed  # type: ignore[method-assign]
    assert await SharedRateLimiter(10, store=store, label="fl", clock=clock).try_acquire()


async def _hedge(clock: VirtualClock) -> None:
    async def attempt(delay: float) -> str:
        await clock.sleep(delay)
        return "ok"

    delays = iter([1.0, 0.05])
    policy = Hedge(0.1, label="hg", clock=clock)
    assert await clock.run(policy.execute(IDEMPOTENT, lambda: attempt(next(delays)))) == "ok"


async def _retry(clock: VirtualClock) -> None:
    calls = 0

    async def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("once")
        return "ok"

    assert await clock.run(stoic.retry(Schedule.fixed(0.5).attempts(3), flaky, label="rt")) == "ok"


async def _timeout(clock: VirtualClock) -> None:
    async def body() -> None:
        async with stoic.timeout(0.25, label="tm"):
            await asyncio.sleep(10)

    with pytest.raises(stoic.DeadlineExceeded):
        await clock.run(body())


async def _fallback(clock: VirtualClock) -> None:
    breaker = CircuitBreaker(label="fb-breaker", clock=clock)
    breaker.force_open()
    result = await stoic.with_fallback(breaker, _boom(), label="fb", fallback=lambda error: "cached")
    assert result == "cached"


async def _keyed(clock: VirtualClock) -> None:
    family = Keyed(Bulkhead, label="kd", max_keys=1, clock=clock, max_concurrent=1)
    await family.execute("a", asyncio.sleep, 0)
    await family.execute("b", asyncio.sleep, 0)  # room for "b": "a" is evicted


async def _control(clock: VirtualClock) -> None:
    plane = ControlPlane(clock=clock)
    plane.register(CircuitBreaker(label="ctl", clock=clock), name="ctl")
    assert plane.force_open("ctl", actor="oncall") == 1


# One decision per policy kind, and the events it must produce, in order (label, name, the
# attributes apart from the label).
_Expected = list[tuple[str, dict[str, Any]]]
KINDS: dict[str, tuple[Callable[[VirtualClock], Awaitable[None]], _Expected | Callable[[], _Expected]]] = {
    "breaker": (_breaker, [
        ("breaker.recorded", {"outcome": "failure", "slow": False, "state": "closed", "duration": 0.0,
                              "stoic.label": "db"}),
        ("breaker.recorded", {"outcome": "failure", "slow": False, "state": "closed", "duration": 0.0,
                              "stoic.label": "db"}),
        ("breaker.opened", {"trigger": "failure_rate", "calls": 2, "failures": 2, "slow_calls": 0, "trips": 1,
                            "open_for": 30.0, "stoic.label": "db"}),
    ]),
    "ratelimiter": (_ratelimiter, [("ratelimiter.waited", {"permits": 1, "waited": 1.0, "stoic.label": "rl"})]),
    "bulkhead": (_bulkhead, [
        ("bulkhead.rejected", {"reason": "bulkhead_full", "capacity": 1, "waiting": 0, "stoic.label": "bh"}),
    ]),
    "throttle": (_throttle, lambda: [
        ("throttle.rejected", {"probability": (_SHED_AT[0] - 1) / _SHED_AT[0], "requests": _SHED_AT[0], "accepts": 0,
                               "stoic.label": "th"}),
    ]),
    "adaptive bulkhead": (_adaptive, [
        ("bulkhead.limit_changed", {"old": 10, "new": 9, "cause": "backoff", "stoic.label": "ad"}),
    ]),
    "fleet": (_fleet, [
        # the store's health breaker counts the failure, the store reports it, the limiter decides
        ("breaker.recorded", {"outcome": "failure", "slow": False, "state": "closed", "duration": 0.0,
                              "stoic.label": "redis.health"}),
        ("breaker.opened", {"trigger": "failure_rate", "calls": 1, "failures": 1, "slow_calls": 0, "trips": 1,
                            "open_for": 1.0, "stoic.label": "redis.health"}),
        ("fleet.store_error", {"operation": "limiter_take", "error.type": "StoreError", "unavailable": True,
                               "stoic.label": "redis"}),
        ("fleet.fail_open", {"policy": "ratelimiter", "unavailable": True, "stoic.label": "fl"}),
    ]),
    "hedge": (_hedge, [
        ("hedge.started", {"attempt": 2, "elapsed": 0.1, "stoic.label": "hg"}),
        ("hedge.won", {"attempt": 2, "started": 2, "latency": 0.15, "stoic.label": "hg"}),
    ]),
    "retry": (_retry, [
        ("retry.attempt_failed", {"attempt": 1, "error.type": "ConnectionError", "decision": "retry",
                                  "next_delay": 0.5, "stoic.label": "rt"}),
        ("retry.succeeded", {"attempts": 2, "stoic.label": "rt"}),
    ]),
    "timeout": (_timeout, [("timeout.expired", {"stoic.label": "tm"})]),
    "fallback": (_fallback, [
        ("breaker.opened", {"trigger": "forced", "calls": 0, "failures": 0, "slow_calls": 0, "trips": 0,
                            "stoic.label": "fb-breaker"}),
        ("breaker.rejected", {"state": "open", "stoic.label": "fb-breaker"}),
        ("fallback.substituted", {"error.type": "CircuitOpen", "stoic.label": "fb"}),
    ]),
    "keyed": (_keyed, [("keyed.evicted", {"key": "a", "reason": "capacity", "stoic.label": "kd"})]),
    "control": (_control, [
        ("breaker.opened", {"trigger": "forced", "calls": 0, "failures": 0, "slow_calls": 0, "trips": 0,
                            "stoic.label": "ctl"}),
        ("control.forced_open", {"policies": 1, "actor": "oncall", "stoic.label": "ctl"}),
    ]),
}


@pytest.mark.parametrize("kind", list(KINDS))
async def test_a_decision_of_every_kind_reaches_the_span_and_structlog_with_the_catalog_attributes(
    kind: str, clock: VirtualClock, traced: Traced
) -> None:
    decide, expect = KINDS[kind]
    recorded, on_span, logged = await _observe(traced, lambda: decide(clock))
    expected = expect() if callable(expect) else expect
    assert recorded == expected
    assert on_span == expected
    assert logged == expected


async def test_under_hundreds_of_concurrent_calls_each_decision_lands_on_its_own_calls_span(
    clock: VirtualClock, traced: Traced
) -> None:
    # Decisions taken in timer callbacks (the hedge's start, a timeout's expiry), by a queued
    # waiter as it is served (ratelimiter.waited) or shed (bulkhead.rejected, priority), each
    # reach the span of the call they are about, never the span of the call that happened to
    # run the timer or the arrival that displaced it.
    n = 200
    policy = Hedge(0.1, label="hg", clock=clock, max_attempts=2, budget=RetryBudget(reserve_capacity=n))
    limiter = RateLimiter(n, 1.0, burst=1, queue_limit=None, label="rl", clock=clock)
    bulkhead = Bulkhead(1, queue_limit=n // 2, prioritized=True, label="bh", clock=clock)
    gate, everyone = asyncio.Event(), asyncio.Event()
    arrived: list[int] = []

    async def attempt(first: list[bool]) -> str:
        slow = first.pop() if first else False
        await clock.sleep(1.0 if slow else 0.05)
        return "ok"

    async def call(i: int) -> None:
        with traced.tracer.start_as_current_span(f"call-{i}"):
            assert await policy.execute(IDEMPOTENT, attempt, [False, True]) == "ok"
            await limiter.acquire()
            with pytest.raises(stoic.DeadlineExceeded):
                async with stoic.timeout(0.5 + i / 1000, label=f"tm-{i}"):
                    await clock.sleep(10)
            tier = stoic.Criticality.CRITICAL if i % 2 else stoic.Criticality.BEST_EFFORT
            arrived.append(i)
            if len(arrived) == n:
                everyone.set()
            with stoic.bind_criticality(tier):
                try:
                    await bulkhead.execute(gate.wait)
                except (stoic.Shed, stoic.BulkheadFull):
                    pass

    async def run() -> None:
        tasks = [asyncio.create_task(call(i)) for i in range(n)]
        await everyone.wait()
        for _ in range(5):
            await asyncio.sleep(0)
        gate.set()
        await asyncio.gather(*tasks)

    with stoic.use_sinks(SpanEventSink(Level.DEBUG)):
        await clock.run(run())
    spans = traced.spans()
    assert len(spans) == n
    shed = 0
    for i in range(n):
        events = [(e.name, dict(e.attributes)) for e in spans[f"call-{i}"].events]
        names = [name for name, _ in events]
        assert names[:2] == ["hedge.started", "hedge.won"], (i, names)
        assert events[0][1] == {"attempt": 2, "elapsed": 0.1, "stoic.label": "hg"}
        # every call asks at 0.15 s; the first takes the burst of 1, the i-th waits i/n s
        waited = [a for name, a in events if name == "ratelimiter.waited"]
        assert waited == ([{"permits": 1, "waited": pytest.approx(i / n), "stoic.label": "rl"}] if i else []), i
        assert ("timeout.expired", {"stoic.label": f"tm-{i}"}) in events, (i, events)
        rejected = [a for name, a in events if name == "bulkhead.rejected"]
        if rejected:
            assert i % 2 == 0 and len(rejected) == 1, (i, rejected)
            if rejected[0]["reason"] == "priority":  # shed from the queue by a critical arrival
                assert rejected[0]["criticality"] == "best_effort"
                shed += 1
            else:
                assert rejected[0]["reason"] == "bulkhead_full"
        assert names.count("timeout.expired") == 1 and names.count("hedge.started") == 1, (i, names)
    assert shed > 0


# --- the breaker's state stream under load ---

_CLOSED, _OPEN, _HALF_OPEN = stoic.BreakerState.CLOSED, stoic.BreakerState.OPEN, stoic.BreakerState.HALF_OPEN


def _transitions(events: list[stoic.Event]) -> list[stoic.BreakerState]:
    """The breaker's transitions as its events tell them: opened (unless it was open already: a
    force_open of a breaker open by itself changes no state), half_open, closed (only sent on a
    change)."""
    out: list[stoic.BreakerState] = []
    for event in events:
        if event.name == "breaker.opened" and (not out or out[-1] is not _OPEN):
            out.append(_OPEN)
        elif event.name == "breaker.half_open":
            out.append(_HALF_OPEN)
        elif event.name == "breaker.closed":
            out.append(_CLOSED)
    return out


async def test_the_state_stream_carries_every_transition_once_in_order_under_load(
    clock: VirtualClock, sink: RecordingSink
) -> None:
    breaker = CircuitBreaker(label="st", window=CountWindow(4), minimum_calls=2, failure_rate_threshold=0.5,
                             open_duration=OpenDuration.fixed(0.05, jitter=0), half_open_probes=2, clock=clock)
    streams = [breaker.state_changes() for _ in range(50)]
    seen: list[list[stoic.BreakerState]] = [[] for _ in streams]
    held = [breaker.state_changes()]  # (the one reference to the slow stream, dropped at the end)
    slow = held[0]
    slow_seen: list[stoic.BreakerState] = []
    stop = asyncio.Event()
    rnd = random.Random(7)

    async def consume(i: int) -> None:
        async for state in streams[i]:
            seen[i].append(state)

    async def consume_slowly() -> None:
        async for state in held[0]:
            slow_seen.append(state)
            await clock.sleep(1.0)  # falls far behind: keeps the newest 16

    async def caller(i: int) -> None:
        for _ in range(40):
            await clock.sleep(rnd.random() * 0.2)
            try:
                if rnd.random() < 0.4:
                    await breaker.execute(_boom())
                else:
                    await breaker.execute(clock.sleep, rnd.random() * 0.01)
            except (ConnectionError, stoic.CircuitOpen):
                pass

    async def operator() -> None:
        while not stop.is_set():
            await clock.sleep(0.037)
            action = rnd.choice(["force_open", "force_closed", "retune", "reset", "state"])
            if action == "force_open":
                breaker.force_open()
            elif action == "force_closed":
                breaker.force_closed()
            elif action == "retune":
                breaker._retune(minimum_calls=rnd.choice([2, 3]))
            elif action == "reset":
                breaker.reset()
            else:
                _ = breaker.state

    async def run() -> None:
        consumers = [asyncio.create_task(consume(i)) for i in range(len(streams))]
        slow_task = asyncio.create_task(consume_slowly())
        op = asyncio.create_task(operator())
        await asyncio.gather(*(caller(i) for i in range(300)))
        stop.set()
        await op
        await clock.sleep(0.001)
        for stream in streams:
            await stream.aclose()
        await asyncio.gather(*consumers)
        slow_task.cancel()
        await asyncio.gather(slow_task, return_exceptions=True)

    await clock.run(run())
    truth = _transitions(sink.events)
    assert len(truth) > 100
    assert all(a is not b for a, b in itertools.pairwise(truth))  # no state "changes" to itself
    for got in seen:
        assert got == truth
    # the slow consumer lost only the oldest of what it had not read, and says how many
    assert len(slow_seen) + slow.dropped + slow.pending == len(truth) and slow.dropped > 0
    assert slow_seen[0] is truth[0]
    # closed ones unsubscribed; the slow one, cancelled while busy (not waiting), goes with its last reference
    assert breaker._streams is not None and list(breaker._streams) == [slow]
    del slow, held[:]
    gc.collect()
    assert len(breaker._streams) == 0


async def test_the_state_stream_from_publishing_threads_is_one_valid_sequence_for_every_consumer() -> None:
    breaker = CircuitBreaker(label="threads", window=CountWindow(2), minimum_calls=1, failure_rate_threshold=0.5,
                             open_duration=OpenDuration.fixed(0.001, jitter=0))
    streams = [breaker.state_changes() for _ in range(20)]
    seen: list[list[stoic.BreakerState]] = [[] for _ in streams]

    async def consume(i: int) -> None:
        async for state in streams[i]:
            seen[i].append(state)

    loop = asyncio.get_running_loop()

    def work(seed: int) -> None:
        rnd = random.Random(seed)
        for _ in range(300):
            time.sleep(0.0002)
            try:
                breaker.call(lambda: 1 / (rnd.random() < 0.6))  # fails (ZeroDivisionError) 40% of calls
            except (ZeroDivisionError, stoic.CircuitOpen):
                pass
            if rnd.random() < 0.02:
                (breaker.force_open if rnd.random() < 0.5 else breaker.force_closed)()
            # A round trip through the loop: the consumers woken by this call's transitions have
            # drained their buffers before this thread makes more (a pace, not a sleep, so a loaded
            # machine cannot make every consumer fall 16 behind: four threads, at most ~3 each).
            asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result()

    consumers = [asyncio.create_task(consume(i)) for i in range(len(streams))]
    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    while any(t.is_alive() for t in threads):
        await asyncio.sleep(0.001)
    await asyncio.sleep(0.01)
    for stream in streams:
        await stream.aclose()
    await asyncio.gather(*consumers)
    allowed = {(_CLOSED, _OPEN), (_OPEN, _HALF_OPEN), (_OPEN, _CLOSED), (_HALF_OPEN, _CLOSED), (_HALF_OPEN, _OPEN)}
    complete = [got for got, stream in zip(seen, streams, strict=True) if stream.dropped == 0]
    assert complete, "every consumer fell 16 behind"
    assert all(got == complete[0] for got in complete)
    sequence = complete[0]
    assert len(sequence) > 20 and sequence[0] is _OPEN
    assert all((a, b) in allowed for a, b in itertools.pairwise(sequence)), sequence
    assert {len(got) + stream.dropped for got, stream in zip(seen, streams, strict=True)} == {len(sequence)}


# --- the events no test checked attribute by attribute ---


async def test_hedge_deadline_skip_counts_the_attempts_started_so_far(clock: VirtualClock, sink: RecordingSink) -> None:
    attempts: list[int] = []

    async def slow(attempt: stoic.Attempt) -> None:
        attempts.append(attempt.number)
        await clock.sleep(10)

    async def call() -> None:
        async with stoic.timeout(0.25):
            await Hedge(0.1, max_attempts=3, label="h", clock=clock).execute(IDEMPOTENT, slow)

    with pytest.raises(stoic.DeadlineExceeded):
        await clock.run(call())
    # at 0.1 s 0.15 s was left, room for the hedge; at 0.2 s only 0.05 s, less than the delay
    assert attempts == [1, 2]
    assert [(e.name, e.attributes, e.time_ns) for e in sink.events if e.name.startswith("hedge.")] == [
        ("hedge.started", {"attempt": 2, "elapsed": 0.1}, 100_000_000),
        ("hedge.deadline_skip", {"attempts": 2}, 200_000_000),
    ]
    assert sink.of("hedge.deadline_skip")[0].level is Level.INFO


async def test_hedge_all_failed_names_the_first_failure_in_completion_order(
    clock: VirtualClock, sink: RecordingSink
) -> None:
    async def attempt(attempt: stoic.Attempt) -> None:
        if attempt.number == 1:
            await clock.sleep(0.3)
            raise TimeoutError("attempt 1")
        await clock.sleep(0.05)
        raise ConnectionError("attempt 2")

    with pytest.raises(ConnectionError):
        await clock.run(Hedge(0.1, label="h", clock=clock).execute(IDEMPOTENT, attempt))
    (event,) = sink.of("hedge.all_failed")
    assert (event.label, event.level, event.attributes, event.time_ns) == (
        "h", Level.WARNING, {"attempts": 2, "error.type": "ConnectionError"}, 300_000_000)


@pytest.mark.parametrize("unavailable", [True, False])
async def test_fleet_fail_closed_says_which_policy_and_why(clock: VirtualClock, sink: RecordingSink,
                                                          unavailable: bool) -> None:
    from stoic.fleet import RedisStore, SharedCircuitBreaker, SharedRateLimiter, StoreError

    store = RedisStore("redis://127.0.0.1:1/0", clock=clock)

    async def timed(*args: Any) -> Any:
        if unavailable:
            raise StoreError("down", operation="limiter_take", unavailable=True)
        return [b"not", b"a", b"reply"]  # a reply of the wrong shape

    store._timed = timed  # type: ignore[method-assign]
    limiter = SharedRateLimiter(10, store=store, label="lim", clock=clock, fail_open_on_store_error=False)
    with pytest.raises(stoic.RateLimited):
        await limiter.acquire()
    breaker = SharedCircuitBreaker(label="brk", store=store, clock=clock, fail_open_on_store_error=False)
    with pytest.raises(stoic.CircuitOpen):
        await breaker.execute(asyncio.sleep, 0)
    closed = [(e.label, e.level, e.attributes) for e in sink.of("fleet.fail_closed")]
    assert closed == [("lim", Level.WARNING, {"policy": "ratelimiter", "unavailable": unavailable}),
                      ("brk", Level.WARNING, {"policy": "breaker", "unavailable": unavailable})]


async def test_a_hedge_refusing_a_call_whose_deadline_has_passed_says_so(clock: VirtualClock,
                                                                         sink: RecordingSink) -> None:
    # Seen failing before the fix: DeadlineExceeded and no event at all, where the breaker, the
    # bulkhead and the limiter each report the same refusal (seed 000: rejections are events).
    ran: list[int] = []

    async def op() -> None:
        ran.append(1)

    async def late() -> None:
        async with stoic.deadline(clock.now() - 1):
            await Hedge(0.1, label="h", clock=clock).execute(IDEMPOTENT, op)

    await clock.advance(2)
    with pytest.raises(stoic.DeadlineExceeded):
        await clock.run(late())
    assert ran == []
    assert [(e.name, e.label, e.level, e.attributes, e.time_ns) for e in sink.events] == [
        ("hedge.deadline_skip", "h", Level.INFO, {"attempts": 0}, 2_000_000_000)]
