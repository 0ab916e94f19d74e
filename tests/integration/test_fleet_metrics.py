"""What a SharedCircuitBreaker reports in metrics, on a real redis-server, against what a local
CircuitBreaker of the same configuration reports for the same calls: the state gauge, calls and
their durations by outcome, rejections by state, transitions by the new state (those this
replica observes, made here or elsewhere in the fleet), and, while the store is down, the
fallback's own series and ``stoic.fleet.fallbacks``. Likewise for the shared rate limiters
(asyncio and blocking) against the local ones: rejections by reason, the waits of queued
requests served, and the waiters gauge (a shared limiter has no ``permits.available``).

The figures are read as an exporter reads them (``stoic._metrics.Collector``). One server per
module (``server`` in conftest.py); a fresh label per breaker keeps their keys apart.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from _breaker_helpers import StepClock
from _threads import eventually
from redis_harness import RedisServer, fresh

import stoic
from stoic import (
    BlockingRateLimiter,
    CircuitBreaker,
    CircuitOpen,
    DeadlineExceeded,
    Defect,
    OpenDuration,
    RateLimited,
    RateLimiter,
    _metrics,
)
from stoic.breaker import BreakerState, CountWindow
from stoic.fleet import BlockingSharedRateLimiter, RedisStore, SharedCircuitBreaker, SharedRateLimiter
from stoic.testing import VirtualClock

pytestmark = pytest.mark.integration

MS = 1_000_000
_DURATION = "stoic.breaker.call.duration"


def figures(label: str) -> dict[str, dict[tuple[str, ...], Any]]:
    """Every series of ``label`` now, by metric: attribute values after the label -> a number, or
    (count, sum in ns) for a histogram. Metrics without a series of ``label`` are left out."""
    out: dict[str, dict[tuple[str, ...], Any]] = {}
    for spec, samples in _metrics.Collector().collect():
        for attrs, value in samples:
            if attrs[0] == label:
                cell = (value.count, value.sum_ns) if isinstance(value, _metrics.Histogram) else value
                out.setdefault(spec.name, {})[attrs[1:]] = cell
    return out


def breaker_figures(label: str) -> dict[str, dict[tuple[str, ...], Any]]:
    """:func:`figures` of the ``stoic.breaker.*`` metrics only, without empty histogram series."""
    return {name: {k: v for k, v in cells.items() if name != _DURATION or v[0]}
            for name, cells in figures(label).items() if name.startswith("stoic.breaker.")}


def shared_of(store: RedisStore, **kwargs: Any) -> SharedCircuitBreaker:
    kwargs.setdefault("refresh_interval", 0.05)
    return SharedCircuitBreaker(label=fresh("metrics"), store=store, **kwargs)


def local_of(**kwargs: Any) -> CircuitBreaker:
    return CircuitBreaker(label=fresh("metrics-local"), **kwargs)


class NotCounted(LookupError):
    """An error ``record_when`` says is not the dependency's failure: a success."""


def counts_unless_lookup(exc: Exception) -> bool:
    return not isinstance(exc, LookupError) and CircuitBreaker.counts_by_default(exc)


# Calls, each advancing the step clock by its duration first: (ms, what it ends with).
SEQUENCE: tuple[tuple[int, type[BaseException] | None], ...] = (
    (3, None), (3, None), (20, ConnectionError), (5, TimeoutError), (7, NotCounted), (1, Defect),
    (60, None),  # slow (slow_call_duration 50 ms): a success, counted once
    (4, ConnectionError), (2, None),
)
EXPECTED_CALLS = {("success",): 5, ("failure",): 3}
EXPECTED_DURATIONS = {
    ("success", ""): (5, (3 + 3 + 7 + 60 + 2) * MS),
    ("failure", "ConnectionError"): (2, (20 + 4) * MS),
    ("failure", "TimeoutError"): (1, 5 * MS),
}
CONFIG: dict[str, Any] = {
    "window": CountWindow(100), "minimum_calls": 100, "slow_call_duration": 0.05, "record_when": counts_unless_lookup,
}


def _steps(clock: StepClock) -> list[Any]:
    def step(ms: int, error: type[BaseException] | None) -> Any:
        def run() -> str:
            clock.t += ms * MS
            if error is not None:
                raise error("scripted")
            return "ok"
        return run
    return [step(ms, error) for ms, error in SEQUENCE]


def _assert_counted_alike(shared: SharedCircuitBreaker, local: CircuitBreaker) -> None:
    seen, expected = breaker_figures(shared.label), breaker_figures(local.label)
    assert expected["stoic.breaker.calls"] == EXPECTED_CALLS
    assert expected[_DURATION] == EXPECTED_DURATIONS
    assert seen.get("stoic.breaker.calls") == EXPECTED_CALLS, seen
    assert seen.get(_DURATION) == EXPECTED_DURATIONS, seen
    assert seen.get("stoic.breaker.state") == {("closed",): 1, ("open",): 0, ("half_open",): 0}, seen
    assert seen == expected


async def test_shared_breaker_counts_its_calls_and_durations_as_the_local_breaker_does(
    server: RedisServer, metrics_on: None,
) -> None:
    clock = StepClock()
    store = RedisStore(server.url, budget=2.0)
    shared = shared_of(store, clock=clock, **CONFIG)  # type: ignore[arg-type]
    local = local_of(clock=clock, **CONFIG)  # type: ignore[arg-type]
    for breaker in (local, shared):
        for run in _steps(clock):
            async def op(run: Any = run) -> str:
                return str(run())
            try:
                await breaker.execute(op)
            except Exception:
                pass
            clock.t += 1 * MS
    _assert_counted_alike(shared, local)
    await store.aclose()


def test_shared_breaker_counts_calls_from_threads_as_the_local_breaker_does(
    server: RedisServer, metrics_on: None,
) -> None:
    clock = StepClock()
    store = RedisStore(server.url, budget=2.0)
    shared = shared_of(store, clock=clock, **CONFIG)  # type: ignore[arg-type]
    local = local_of(clock=clock, **CONFIG)  # type: ignore[arg-type]
    for breaker in (local, shared):
        for run in _steps(clock):
            try:
                breaker.call(run)
            except Exception:
                pass
            clock.t += 1 * MS
    _assert_counted_alike(shared, local)
    asyncio.run(store.aclose())


async def fails() -> None:
    raise ConnectionError("down")


async def ok() -> str:
    return "ok"


async def _probe_sequence(breaker: SharedCircuitBreaker | CircuitBreaker) -> None:
    """Four failures trip it (a 0.1 s open period); a failed probe re-opens it; a probe that
    succeeds closes it."""

    for _ in range(4):
        with pytest.raises(ConnectionError):
            await breaker.execute(fails)
    await asyncio.sleep(0.15)
    with pytest.raises(ConnectionError):
        await breaker.execute(fails)
    await asyncio.sleep(0.15)
    assert await breaker.execute(ok) == "ok"
    assert breaker.state is BreakerState.CLOSED


async def test_shared_breaker_counts_its_probes_as_calls(server: RedisServer, metrics_on: None) -> None:
    store = RedisStore(server.url, budget=2.0)
    config: dict[str, Any] = {"window": CountWindow(4), "minimum_calls": 4,
                              "open_duration": OpenDuration.fixed(0.1, jitter=0.0)}
    shared = shared_of(store, **config)
    local = local_of(**config)
    for breaker in (local, shared):
        await _probe_sequence(breaker)
    calls = {label: breaker_figures(label).get("stoic.breaker.calls") for label in (local.label, shared.label)}
    assert calls == {local.label: {("failure",): 5, ("success",): 1}, shared.label: {("failure",): 5, ("success",): 1}}
    await store.aclose()


async def test_while_the_store_is_down_the_fallback_and_the_fallbacks_counter_report(
    tmp_path: Path, metrics_on: None,
) -> None:
    # Its own server: killed here. Failing open, the calls are the fallback's (label
    # "<label>.fallback"), each a fail_open decision; failing closed, each refusal a fail_closed
    # one. The shared label's state gauge reads the fallback's state meanwhile.
    redis_server = RedisServer(tmp_path)
    try:
        store = RedisStore(redis_server.url, budget=0.2, probe_interval=0.05)
        fail_open = shared_of(store)
        fail_closed = shared_of(store, fail_open_on_store_error=False)

        async def ok() -> str:
            return "ok"

        for breaker in (fail_open, fail_closed):
            assert await breaker.execute(ok) == "ok"
        redis_server.kill()
        await asyncio.sleep(0.06)  # both copies due for a refresh
        for _ in range(3):
            assert await fail_open.execute(ok) == "ok"
            with pytest.raises(CircuitOpen):
                await fail_closed.execute(ok)
        assert fail_open.degraded and fail_closed.degraded
        opened, closed = figures(fail_open.label), figures(fail_closed.label)
        assert opened["stoic.fleet.fallbacks"] == {("fail_open",): 3}
        assert closed["stoic.fleet.fallbacks"] == {("fail_closed",): 3}
        assert opened["stoic.breaker.calls"] == {("success",): 1}  # (the one before the outage)
        assert opened["stoic.breaker.state"] == {("closed",): 1, ("open",): 0, ("half_open",): 0}
        assert figures(f"{fail_open.label}.fallback")["stoic.breaker.calls"] == {("success",): 3}
        assert "stoic.breaker.calls" not in figures(f"{fail_closed.label}.fallback")
        await store.aclose()
    finally:
        redis_server.stop()


async def _refusals(breaker: SharedCircuitBreaker | CircuitBreaker) -> None:
    """Trip it (a 0.2 s open period); two calls refused open and one for its passed deadline; then
    a probe in flight and a call refused half-open (every probe taken); the probe closes it."""

    for _ in range(4):
        with pytest.raises(ConnectionError):
            await breaker.execute(fails)
    for _ in range(2):
        with pytest.raises(CircuitOpen):
            await breaker.execute(ok)
    async with stoic.deadline(stoic.SYSTEM_CLOCK.now() - 1):
        with pytest.raises(stoic.DeadlineExceeded):
            await breaker.execute(ok)
    await asyncio.sleep(0.25)
    gate = asyncio.Event()

    async def held() -> str:
        await gate.wait()
        return "ok"

    probe = asyncio.create_task(breaker.execute(held))
    for _ in range(100):
        await asyncio.sleep(0.005)
        if probe.done() or breaker.state is BreakerState.HALF_OPEN:
            break
    await asyncio.sleep(0.05)  # the probe's lease is taken
    with pytest.raises(CircuitOpen):
        await breaker.execute(ok)
    gate.set()
    assert await probe == "ok"
    assert breaker.state is BreakerState.CLOSED


async def _side_by_side(server: RedisServer, open_seconds: float, sequence: Any, metric: str) -> tuple[Any, Any]:
    """Run ``sequence`` on a local CircuitBreaker and on a SharedCircuitBreaker of one configuration
    (a count window of 4, open for ``open_seconds``): ``metric``'s figures of each, local's first."""
    store = RedisStore(server.url, budget=2.0)
    config: dict[str, Any] = {"window": CountWindow(4), "minimum_calls": 4,
                              "open_duration": OpenDuration.fixed(open_seconds, jitter=0.0)}
    try:
        local, shared = local_of(**config), shared_of(store, **config)
        for breaker in (local, shared):
            await sequence(breaker)
        return breaker_figures(local.label).get(metric), breaker_figures(shared.label).get(metric)
    finally:
        await store.aclose()


async def test_shared_breaker_counts_its_rejections_by_state_as_the_local_breaker_does(
    server: RedisServer, metrics_on: None,
) -> None:
    local, shared = await _side_by_side(server, 0.2, _refusals, "stoic.breaker.rejections")
    assert local == shared == {("open",): 3, ("half_open",): 1}


@pytest.fixture
async def replicas(server: RedisServer) -> AsyncIterator[tuple[str, SharedCircuitBreaker, SharedCircuitBreaker]]:
    """Two replicas of one fresh shared breaker, each on its own store (closed afterwards):
    a count window of 4, refreshed every 50 ms, open for 0.2 s."""
    label = fresh("metrics-replicas")
    stores = RedisStore(server.url, budget=2.0), RedisStore(server.url, budget=2.0)
    a, b = (SharedCircuitBreaker(label=label, store=store, window=CountWindow(4), minimum_calls=4,
                                 refresh_interval=0.05, open_duration=OpenDuration.fixed(0.2, jitter=0.0))
            for store in stores)
    yield label, a, b
    for store in stores:
        await store.aclose()


async def test_a_replica_counts_the_calls_it_refuses_for_a_trip_or_a_switch_made_elsewhere(
    replicas: tuple[str, SharedCircuitBreaker, SharedCircuitBreaker], metrics_on: None,
) -> None:
    label, a, b = replicas
    assert await b.execute(ok) == "ok"
    for _ in range(4):
        with pytest.raises(ConnectionError):
            await a.execute(fails)
    await asyncio.sleep(0.06)
    with pytest.raises(CircuitOpen):
        await b.execute(ok)  # a's trip
    await a.force_open()
    await asyncio.sleep(0.3)  # the trip's open period is over: the switch holds
    with pytest.raises(CircuitOpen):
        await b.execute(ok)  # a's switch
    assert figures(label)["stoic.breaker.rejections"] == {("open",): 2}  # (every refusal was b's)
    await a.reset()


async def test_shared_breaker_counts_its_transitions_as_the_local_breaker_does(
    server: RedisServer, metrics_on: None,
) -> None:
    # open, half-open, open (the failed probe), half-open, closed
    local, shared = await _side_by_side(server, 0.1, _probe_sequence, "stoic.breaker.transitions")
    assert local == shared == {("open",): 2, ("half_open",): 1 + 1, ("closed",): 1}


def _transitions_of(breaker: SharedCircuitBreaker) -> dict[str, int]:
    recorder = breaker._recorder
    assert recorder is not None
    return {key[1]: n for key, n in recorder.counters.items() if key[0] == "stoic.breaker.transitions"}


async def test_a_replica_counts_the_transitions_the_fleet_makes_as_it_observes_them(
    replicas: tuple[str, SharedCircuitBreaker, SharedCircuitBreaker], metrics_on: None,
) -> None:
    # Two replicas of one breaker (one label: their series sum in this process, so each is also
    # read from its own recorder). A trip, a probe, a kill switch and its lift, each made by one
    # replica and read by the other from the store.
    label, a, b = replicas
    await a.refresh()
    assert await b.execute(ok) == "ok"
    for _ in range(4):
        with pytest.raises(ConnectionError):
            await a.execute(fails)  # a opens it
    await b.refresh()  # b reads the trip from the store
    await asyncio.sleep(0.25)
    assert await b.execute(ok) == "ok"  # b sees half-open, and its probe closes it
    await a.refresh()  # a reads the close
    await b.force_open()
    await a.refresh()  # a reads b's switch
    await a.force_closed()
    await b.refresh()  # b reads a's lift
    assert (a.state, b.state) == (BreakerState.CLOSED, BreakerState.CLOSED)
    assert _transitions_of(a) == {"open": 2, "closed": 2}
    assert _transitions_of(b) == {"open": 2, "half_open": 1, "closed": 2}
    assert figures(label)["stoic.breaker.transitions"] == {("open",): 4, ("half_open",): 1, ("closed",): 4}


# ---------------------------------------------------------------------------- shared rate limiters
# One permit an hour: the server's bucket earns nothing measurable while a test runs, so a waiter
# is served only when the test refills the bucket (deletes its key: a missing bucket is a full
# one) and moves the limiter's virtual clock to the instant it sleeps until.
HOUR = 3600.0
S = 1_000_000_000
_REJECTIONS = "stoic.ratelimiter.rejections"
_WAITED = "stoic.ratelimiter.wait.duration"
_WAITERS = "stoic.ratelimiter.waiters"
_AVAILABLE = "stoic.ratelimiter.permits.available"


def limiter_figures(label: str) -> dict[str, dict[tuple[str, ...], Any]]:
    """:func:`figures` of the ``stoic.ratelimiter.*`` metrics only, without empty histogram series."""
    return {name: {k: v for k, v in cells.items() if name != _WAITED or v[0]}
            for name, cells in figures(label).items() if name.startswith("stoic.ratelimiter.")}


class SleepWatch(VirtualClock):
    """A VirtualClock that notes the instant of every blocking sleep, so a test knows when a
    thread sleeps (a blocking limiter's head waiting for its permits)."""

    def __init__(self) -> None:
        super().__init__()
        self.sleeps: list[int] = []

    def sleep_until_blocking(self, when_ns: int) -> None:
        self.sleeps.append(when_ns)
        super().sleep_until_blocking(when_ns)


async def until(condition: Callable[[], bool]) -> None:
    """Let the loop run (store round trips are real I/O) until ``condition()`` holds, or fail."""
    for _ in range(2000):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("condition not reached in time")


def bucket_refill(server: RedisServer, limiter: SharedRateLimiter | BlockingSharedRateLimiter) -> Callable[[], None]:
    """Refill ``limiter``'s shared bucket: delete its key (a missing bucket is a full one)."""
    def refill() -> None:
        with redis.Redis.from_url(server.url) as client:
            client.delete(*limiter._key)
    return refill


async def tried(limiter: RateLimiter | SharedRateLimiter, permits: int = 1) -> bool:
    """``try_acquire(permits)``: plain on the local limiter, awaited on the shared one (a round trip)."""
    answer: bool | Awaitable[bool] = limiter.try_acquire(permits)
    return await answer if not isinstance(answer, bool) else answer


async def _async_refusals(limiter: RateLimiter | SharedRateLimiter, clock: VirtualClock) -> None:
    """On a bucket of 2 permits an hour with room for one waiter: two oversized requests (one a
    try_acquire), a try_acquire refused for want of permits (not counted), one past its deadline,
    one whose wait would pass its deadline, one refused by the full queue, and the waiter cancelled."""
    assert not await tried(limiter, 3)
    with pytest.raises(RateLimited):
        await limiter.acquire(3)
    assert await tried(limiter, 2)
    assert not await tried(limiter)
    async with stoic.timeout(0, clock=clock):
        with pytest.raises(DeadlineExceeded):
            await limiter.acquire()
    async with stoic.timeout(60, clock=clock):
        with pytest.raises(RateLimited):
            await limiter.acquire()
    waiter = asyncio.create_task(limiter.acquire())
    await until(lambda: limiter.waiter_count == 1 and clock.pending_timers == 1)
    assert limiter_figures(limiter.label)[_WAITERS] == {(): 1}
    with pytest.raises(RateLimited):
        await limiter.acquire()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert limiter.waiter_count == 0


EXPECTED_REFUSALS = {("oversized",): 2, ("deadline_exceeded",): 1, ("would_exceed_deadline",): 1,
                     ("queue_full",): 1, ("cancelled",): 1}


async def test_shared_limiter_counts_its_rejections_by_reason_as_the_local_limiter_does(
    server: RedisServer, metrics_on: None,
) -> None:
    store = RedisStore(server.url, budget=2.0)
    config: dict[str, Any] = {"burst": 2, "queue_limit": 1}
    local_clock, shared_clock = VirtualClock(), VirtualClock()
    local = RateLimiter(1, HOUR, label=fresh("limiter-local"), clock=local_clock, **config)
    shared = SharedRateLimiter(1, HOUR, store=store, label=fresh("limiter"), clock=shared_clock, **config)
    await _async_refusals(local, local_clock)
    await _async_refusals(shared, shared_clock)
    assert limiter_figures(local.label)[_REJECTIONS] == EXPECTED_REFUSALS
    seen = limiter_figures(shared.label)
    assert seen.get(_REJECTIONS) == EXPECTED_REFUSALS, seen
    # No wait was served; the waiters gauge reads the local queue; no permits.available (its
    # credit is in the store), while the fallback, a local limiter, has its own.
    assert seen == {_REJECTIONS: EXPECTED_REFUSALS, _WAITERS: {(): 0}}
    assert limiter_figures(f"{shared.label}.fallback") == {_AVAILABLE: {(): 2}, _WAITERS: {(): 0}}
    await store.aclose()


async def test_with_metrics_off_the_shared_limiter_counts_nothing(server: RedisServer) -> None:
    # (Aggregation is off until an exporter turns it on: only the gauge, read at collection.)
    assert not _metrics.state.enabled
    clock = VirtualClock()
    store = RedisStore(server.url, budget=2.0)
    shared = SharedRateLimiter(1, HOUR, burst=2, queue_limit=1, store=store, label=fresh("limiter-off"), clock=clock)
    await _async_refusals(shared, clock)
    assert (shared._rec.counters, shared._rec.histograms) == ({}, {})
    assert limiter_figures(shared.label) == {_WAITERS: {(): 0}}
    await store.aclose()


async def test_shared_limiter_times_every_queued_request_it_serves(server: RedisServer, metrics_on: None) -> None:
    # Three requests queue (one sleeps at the head until the instant the store gave, two behind
    # it); once the bucket is refilled, the head's next ask is granted and so are the two behind
    # it, each timed from its call (at 0) to that instant. Those granted at once are not waits.
    clock = VirtualClock()
    store = RedisStore(server.url, budget=2.0)
    shared = SharedRateLimiter(1, HOUR, burst=3, queue_limit=None, store=store, label=fresh("limiter-waits"),
                               clock=clock)
    await shared.acquire()
    assert await shared.try_acquire(2)
    head = asyncio.create_task(shared.acquire())
    await until(lambda: clock.pending_timers == 1)
    behind = [asyncio.create_task(shared.acquire()) for _ in range(2)]
    await until(lambda: shared.waiter_count == 3)
    assert limiter_figures(shared.label) == {_WAITERS: {(): 3}}
    instant = clock.next_timer_ns()
    assert instant is not None and instant > 3500 * S
    bucket_refill(server, shared)()
    await clock.advance_to(instant / 1e9)
    await asyncio.wait_for(asyncio.gather(head, *behind), 5.0)
    assert limiter_figures(shared.label) == {_WAITED: {(): (3, 3 * instant)}, _WAITERS: {(): 0}}
    await store.aclose()


async def test_shared_limiter_counts_the_refusals_of_its_own_queue(server: RedisServer, metrics_on: None) -> None:
    # The shared queue knows only the store's answer to its head: a request behind the head is
    # queued whatever its deadline (the local limiter, which knows what the queue costs, would
    # refuse it at once), so its deadline may cut it while it waits; and the head, asking again
    # at its instant, is refused when the store's new answer would pass its own deadline.
    clock = VirtualClock()
    store = RedisStore(server.url, budget=2.0)
    shared = SharedRateLimiter(1, HOUR, burst=1, queue_limit=None, store=store, label=fresh("limiter-queue"),
                               clock=clock)
    assert await shared.try_acquire()

    async def within(seconds: float) -> None:
        async with stoic.timeout(seconds, clock=clock):
            await shared.acquire()

    head = asyncio.create_task(within(5000))
    await until(lambda: shared.waiter_count == 1)
    behind = asyncio.create_task(within(1000))
    await until(lambda: shared.waiter_count == 2)
    await clock.advance_to(1000)
    with pytest.raises(DeadlineExceeded):
        await behind
    assert limiter_figures(shared.label)[_REJECTIONS] == {("deadline_exceeded",): 1}
    instant = clock.next_timer_ns()
    assert instant is not None and instant > 3500 * S
    await clock.advance_to(instant / 1e9)  # the store still has nothing: ~an hour more, past 5000 s
    with pytest.raises(RateLimited):
        await asyncio.wait_for(head, 5.0)
    assert limiter_figures(shared.label) == {
        _REJECTIONS: {("deadline_exceeded",): 1, ("would_exceed_deadline",): 1}, _WAITERS: {(): 0}}
    await store.aclose()


async def test_without_the_store_a_limiter_counts_only_what_it_refuses_itself(
    tmp_path: Path, metrics_on: None,
) -> None:
    # Its own server: killed here. Failing closed, each refusal is a fail_closed decision and no
    # rejection; failing open, the fallback decides and counts its own refusals under
    # "<label>.fallback". A request above the burst is refused before the store is asked: counted.
    redis_server = RedisServer(tmp_path)
    try:
        store = RedisStore(redis_server.url, budget=0.2, probe_interval=0.05)
        opened = SharedRateLimiter(1, HOUR, queue_limit=0, store=store, label=fresh("limiter-open"))
        closed = SharedRateLimiter(1, HOUR, queue_limit=0, store=store, label=fresh("limiter-closed"),
                                   fail_open_on_store_error=False)
        redis_server.kill()
        await opened.acquire()  # the fallback grants it
        with pytest.raises(RateLimited):
            await opened.acquire()  # the fallback's queue is full
        assert not await opened.try_acquire()
        for _ in range(2):
            with pytest.raises(RateLimited):
                await closed.acquire()
        assert not await closed.try_acquire()
        for limiter in (opened, closed):
            assert not await limiter.try_acquire(2)
        assert figures(opened.label)["stoic.fleet.fallbacks"] == {("fail_open",): 3}
        assert figures(closed.label)["stoic.fleet.fallbacks"] == {("fail_closed",): 3}
        for limiter in (opened, closed):
            assert limiter_figures(limiter.label) == {_REJECTIONS: {("oversized",): 1}, _WAITERS: {(): 0}}
        assert limiter_figures(f"{opened.label}.fallback") == {
            _REJECTIONS: {("queue_full",): 1}, _AVAILABLE: {(): 0}, _WAITERS: {(): 0}}
        assert limiter_figures(f"{closed.label}.fallback") == {_AVAILABLE: {(): 1}, _WAITERS: {(): 0}}
        await store.aclose()
    finally:
        redis_server.stop()


def under_deadline(clock: VirtualClock, seconds: float, blocking: Callable[[], None]) -> None:
    """``blocking()`` under ``stoic.timeout(seconds)`` on ``clock`` (its timer never fires: the loop
    is not run meanwhile; the blocking limiter reads the deadline on the clock)."""
    async def run() -> None:
        async with stoic.timeout(seconds, clock=clock):
            blocking()

    asyncio.run(run())


def _in_thread(fn: Callable[[], None]) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, errors


def _blocking_refusals(limiter: BlockingRateLimiter | BlockingSharedRateLimiter, clock: SleepWatch,
                       refill: Callable[[], None]) -> None:
    """As :func:`_async_refusals` for threads (a timeout for the wait that would pass it), then
    the waiter is served an hour later (nothing is cancelled in a thread)."""
    assert not limiter.try_acquire(3)
    with pytest.raises(RateLimited):
        limiter.acquire(3)
    assert limiter.try_acquire(2)
    assert not limiter.try_acquire()
    with pytest.raises(DeadlineExceeded):
        under_deadline(clock, 0, limiter.acquire)
    with pytest.raises(RateLimited):
        limiter.acquire(timeout=60)
    thread, errors = _in_thread(limiter.acquire)
    eventually(lambda: limiter.waiter_count == 1 and len(clock.sleeps) == 1)
    assert limiter_figures(limiter.label)[_WAITERS] == {(): 1}
    with pytest.raises(RateLimited):
        limiter.acquire()
    refill()
    asyncio.run(clock.advance(2 * HOUR))
    thread.join(5)
    assert not thread.is_alive() and errors == []


def test_blocking_shared_limiter_counts_its_rejections_and_waits_as_the_local_limiter_does(
    server: RedisServer, metrics_on: None,
) -> None:
    store = RedisStore(server.url, budget=2.0)
    config: dict[str, Any] = {"burst": 2, "queue_limit": 1}
    local_clock, shared_clock = SleepWatch(), SleepWatch()
    local = BlockingRateLimiter(1, HOUR, label=fresh("blocking-local"), clock=local_clock, **config)
    shared = BlockingSharedRateLimiter(1, HOUR, store=store, label=fresh("blocking"), clock=shared_clock, **config)
    _blocking_refusals(local, local_clock, lambda: None)
    _blocking_refusals(shared, shared_clock, bucket_refill(server, shared))
    expected = {("oversized",): 2, ("deadline_exceeded",): 1, ("would_exceed_deadline",): 1, ("queue_full",): 1}
    waited = {(): (1, 2 * 3600 * S)}  # called at 0, served when the clock moved to 2 h
    local_seen = limiter_figures(local.label)
    assert local_seen[_REJECTIONS] == expected and local_seen[_WAITED] == waited
    seen = limiter_figures(shared.label)
    assert seen == {_REJECTIONS: expected, _WAITED: waited, _WAITERS: {(): 0}}
    asyncio.run(store.aclose())


def test_blocking_shared_limiter_times_the_threads_queued_behind_its_head(
    server: RedisServer, metrics_on: None,
) -> None:
    # A head sleeping until the store's instant and two threads behind it, each timed from its
    # call (at 0) to the moment it is served (the clock moved to 2 h); a thread behind the head
    # out of time at once (timeout 0) leaves with deadline_exceeded.
    clock = SleepWatch()
    store = RedisStore(server.url, budget=2.0)
    shared = BlockingSharedRateLimiter(1, HOUR, burst=3, queue_limit=None, store=store,
                                       label=fresh("blocking-waits"), clock=clock)
    shared.acquire()
    assert shared.try_acquire(2)
    head = _in_thread(shared.acquire)
    eventually(lambda: len(clock.sleeps) == 1)
    behind = [_in_thread(shared.acquire) for _ in range(2)]
    eventually(lambda: shared.waiter_count == 3)
    assert limiter_figures(shared.label) == {_WAITERS: {(): 3}}
    with pytest.raises(DeadlineExceeded):
        shared.acquire(timeout=0)
    bucket_refill(server, shared)()
    asyncio.run(clock.advance(2 * HOUR))
    for thread, errors in (head, *behind):
        thread.join(5)
        assert not thread.is_alive() and errors == []
    assert limiter_figures(shared.label) == {
        _REJECTIONS: {("deadline_exceeded",): 1}, _WAITED: {(): (3, 3 * 2 * 3600 * S)}, _WAITERS: {(): 0}}
    asyncio.run(store.aclose())
