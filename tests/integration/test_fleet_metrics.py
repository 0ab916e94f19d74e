"""What a SharedCircuitBreaker reports in metrics, on a real redis-server, against what a local
CircuitBreaker of the same configuration reports for the same calls: the state gauge, calls and
their durations by outcome, rejections by state, transitions by the new state (those this
replica observes, made here or elsewhere in the fleet), and, while the store is down, the
fallback's own series and ``stoic.fleet.fallbacks``.

The figures are read as an exporter reads them (``stoic._metrics.Collector``). One server per
module (``server`` in conftest.py); a fresh label per breaker keeps their keys apart.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from _breaker_helpers import StepClock
from redis_harness import RedisServer, fresh

import stoic
from stoic import CircuitBreaker, CircuitOpen, Defect, OpenDuration, _metrics
from stoic.breaker import BreakerState, CountWindow
from stoic.fleet import RedisStore, SharedCircuitBreaker

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
