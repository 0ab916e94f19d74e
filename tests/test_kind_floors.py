"""Every policy kind guards its emits with its own kind's floor (issue 11, item 1): a debug sink
that wants no event of a kind makes that kind build no event at all, while a sink that wants the
kind's events still receives every one of them, process-wide or scoped (stoic.use_sinks)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

import stoic
from stoic import (
    IDEMPOTENT,
    AdaptiveBulkhead,
    AdaptiveThrottle,
    Bulkhead,
    BulkheadFull,
    CircuitBreaker,
    CircuitOpen,
    CountWindow,
    Hedge,
    Keyed,
    Level,
    RateLimited,
    RateLimiter,
    Schedule,
    Throttled,
    with_fallback,
)
from stoic.control import ControlPlane
from stoic.events import CATALOG, _sinks
from stoic.fleet import RedisStore, SharedRateLimiter
from stoic.fleet._store import _Script
from stoic.testing import RecordingSink, VirtualClock, reset_budgets, seeded

Scenario = Callable[[VirtualClock], Awaitable[None]]


async def _breaker(clock: VirtualClock) -> None:
    breaker = CircuitBreaker(label="b", window=CountWindow(4), minimum_calls=2, clock=clock)

    async def ok() -> int:
        return 1

    async def boom() -> None:
        raise ConnectionError("down")

    for _ in range(3):
        await breaker.execute(ok)
    for _ in range(3):
        with contextlib.suppress(ConnectionError, CircuitOpen):
            await breaker.execute(boom)


async def _ratelimiter(clock: VirtualClock) -> None:
    limiter = RateLimiter(1, 1.0, burst=1, queue_limit=1, label="r", clock=clock)
    await limiter.acquire()
    waiting = asyncio.create_task(limiter.acquire())  # waits a second: ratelimiter.waited (debug)
    await asyncio.sleep(0)
    with pytest.raises(RateLimited):
        await limiter.acquire()  # the queue is full: ratelimiter.rejected
    with pytest.raises(RateLimited):
        await limiter.acquire(5)  # more than the burst: ratelimiter.oversized
    await clock.run(waiting)


async def _bulkhead(clock: VirtualClock) -> None:
    bulkhead = Bulkhead(1, label="k", clock=clock)
    async with bulkhead:
        with pytest.raises(BulkheadFull):
            await bulkhead.execute(asyncio.sleep, 0)


async def _adaptive(clock: VirtualClock) -> None:
    bulkhead = AdaptiveBulkhead(latency_threshold=0.1, max_concurrent=4, backoff_ratio=0.5, label="a", clock=clock)
    await clock.run(bulkhead.execute(clock.sleep, 1.0))  # slow: the limit backs off (limit_changed)


async def _throttle(clock: VirtualClock) -> None:
    throttle = AdaptiveThrottle(k=1.0, min_throughput=1, max_probability=0.9, label="t", clock=clock)

    async def timing_out() -> None:
        raise TimeoutError

    for _ in range(60):
        with contextlib.suppress(TimeoutError, Throttled):
            await throttle.execute(timing_out)


async def _hedge(clock: VirtualClock) -> None:
    policy = Hedge(0.1, label="h", clock=clock)
    calls = 0

    async def slow_first() -> int:
        nonlocal calls
        calls += 1
        await clock.sleep(1.0 if calls == 1 else 0.01)
        return calls

    async def failing() -> None:
        raise ConnectionError("down")

    await clock.run(policy.execute(IDEMPOTENT, slow_first))  # hedge.started, hedge.won
    with pytest.raises(ConnectionError):
        await policy.execute(IDEMPOTENT, failing)  # hedge.attempt_failed (debug)


async def _retry(clock: VirtualClock) -> None:
    failures = 0

    async def flaky() -> int:
        nonlocal failures
        if failures < 2:
            failures += 1
            raise ConnectionError("flaky")
        return 1

    async def down() -> None:
        raise ConnectionError("down")

    await clock.run(stoic.retry(Schedule.fixed(0.1).attempts(3), flaky, label="r", clock=clock))
    with pytest.raises(ConnectionError):
        await clock.run(stoic.retry(Schedule.fixed(0.1).attempts(2), down, label="r", clock=clock))


async def _timeout(clock: VirtualClock) -> None:
    async def late() -> None:
        async with stoic.timeout(0.1, clock=clock):
            await clock.sleep(1.0)

    with pytest.raises(TimeoutError):
        await clock.run(late())


async def _fallback(clock: VirtualClock) -> None:
    async def down() -> int:
        raise ConnectionError("down")

    assert await with_fallback(Bulkhead(1, label="f", clock=clock), down, label="f", fallback=lambda e: 0) == 0


async def _keyed(clock: VirtualClock) -> None:
    family: Keyed[Bulkhead] = Keyed(Bulkhead, label="fam", max_keys=1, clock=clock, max_concurrent=1)
    await family.execute("a", asyncio.sleep, 0)
    await family.execute("b", asyncio.sleep, 0)  # the capacity evicts "a": keyed.evicted


async def _control(clock: VirtualClock) -> None:
    plane = ControlPlane(clock=clock)
    plane.register(CircuitBreaker(label="dep", clock=clock))
    plane.force_open("dep", actor="ops")
    plane.clear_forced_open("dep")


async def _fleet(clock: VirtualClock) -> None:
    store = RedisStore("redis://127.0.0.1:1/0", clock=clock)

    async def garbled(script: _Script, keys: Any, args: Any, *rest: Any) -> Any:
        return b"OK"  # a reply of the wrong shape: fleet.store_error, then fleet.fail_open

    store._timed = garbled  # type: ignore[method-assign]
    limiter = SharedRateLimiter(2, 60.0, store=store, label="fl", clock=clock)
    assert await limiter.try_acquire()


SCENARIOS: dict[str, Scenario] = {
    "breaker": _breaker, "ratelimiter": _ratelimiter, "bulkhead": _bulkhead, "throttle": _throttle,
    "hedge": _hedge, "retry": _retry, "timeout": _timeout, "fallback": _fallback, "keyed": _keyed,
    "control": _control, "fleet": _fleet,
}
ADAPTIVE = {"bulkhead": _adaptive}  # a second scenario of the bulkhead kind


def _kind(name: str) -> str:
    return name.partition(".")[0]


def _names(kind: str) -> frozenset[str]:
    return frozenset(n for n in CATALOG if _kind(n) == kind)


def _sink(kind: str) -> RecordingSink:
    """A debug-level sink that wants only ``kind``'s events."""
    sink = RecordingSink(Level.DEBUG)
    sink.event_names = _names(kind)  # type: ignore[attr-defined]
    return sink


@contextlib.contextmanager
def _installed(scoped: bool, *sinks: RecordingSink) -> Iterator[None]:
    if scoped:
        with stoic.use_sinks(*sinks):
            yield
        return
    for sink in sinks:
        stoic.add_sink(sink)
    try:
        yield
    finally:
        for sink in sinks:
            stoic.remove_sink(sink)


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the events built (every event is built by stoic.events._sinks.emit)."""
    names: list[str] = []
    real = _sinks.Event

    def counting(name: str, *args: Any) -> Any:
        names.append(name)
        return real(name, *args)

    monkeypatch.setattr(_sinks, "Event", counting)
    return names


async def _play(scenario: Scenario) -> None:
    reset_budgets()
    with seeded(7):
        await scenario(VirtualClock())


CASES = [*((k, s) for k, s in SCENARIOS.items()), *((k, s) for k, s in ADAPTIVE.items())]
IDS = [*SCENARIOS, *(f"{k}-adaptive" for k in ADAPTIVE)]


@pytest.mark.parametrize("scoped", [False, True], ids=["process", "scoped"])
@pytest.mark.parametrize(("kind", "scenario"), CASES, ids=IDS)
async def test_a_debug_sink_wanting_another_kind_makes_this_kind_build_no_event(
    kind: str, scenario: Scenario, scoped: bool, built: list[str]
) -> None:
    other = _sink("retry" if kind != "retry" else "hedge")
    with _installed(scoped, other):
        await _play(scenario)
    assert [n for n in built if _kind(n) == kind] == []
    assert [e.name for e in other.events if _kind(e.name) == kind] == []


@pytest.mark.parametrize("scoped", [False, True], ids=["process", "scoped"])
@pytest.mark.parametrize(("kind", "scenario"), CASES, ids=IDS)
async def test_a_sink_wanting_the_kind_still_gets_every_event_of_it(
    kind: str, scenario: Scenario, scoped: bool
) -> None:
    everything = RecordingSink(Level.DEBUG)
    with _installed(scoped, everything):
        await _play(scenario)
    expected = [(e.name, e.level, dict(e.attributes)) for e in everything.events if _kind(e.name) == kind]
    assert expected, f"the {kind} scenario emitted no {kind} event"
    wanting, other = _sink(kind), _sink("retry" if kind != "retry" else "hedge")
    with _installed(scoped, wanting, other):
        await _play(scenario)
    assert [(e.name, e.level, dict(e.attributes)) for e in wanting.events] == expected
    everything.assert_contract()


def test_the_scenarios_reach_the_debug_events_of_their_kinds() -> None:
    # The contract test above is only as strong as its scenarios: each kind with debug events in
    # the catalog must exercise at least one of them (it fails here before it can pass vacuously).
    sinks = RecordingSink(Level.DEBUG)

    async def every() -> None:
        for scenario in SCENARIOS.values():
            await _play(scenario)

    with stoic.use_sinks(sinks):
        asyncio.run(every())
    debug_kinds = {_kind(n) for n, spec in CATALOG.items() if spec.level == Level.DEBUG}
    reached = {_kind(e.name) for e in sinks.events if e.level == Level.DEBUG}
    assert debug_kinds <= reached


@pytest.fixture
def fresh_floors(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """As in a process where no scoped sink was ever installed (other tests install them)."""
    assert _sinks._process.entries == ()
    monkeypatch.setattr(_sinks._process, "scoped_floor", _sinks._OFF)
    monkeypatch.setattr(_sinks._process, "scoped_kinds", {})
    saved = {k: (f.process, f.floor) for k, f in _sinks._process.kinds.items()}
    for kind in _sinks._process.kinds.values():
        _sinks._process._refresh(kind)
    yield
    for k, (process, floor) in saved.items():
        _sinks._process.kinds[k].process, _sinks._process.kinds[k].floor = process, floor


@pytest.mark.usefixtures("fresh_floors")
@pytest.mark.parametrize("kind", sorted(SCENARIOS))
def test_the_guard_is_decided_by_the_floor_alone_when_no_sink_wants_the_kind(kind: str) -> None:
    floor = _sinks.kind_floor(kind)
    other = _sink("retry" if kind != "retry" else "hedge")
    stoic.add_sink(other)
    try:
        assert floor.floor == _sinks._OFF  # no context variable is read on this kind's paths
        assert not floor.wants(Level.DEBUG)
        with stoic.use_sinks(_sink(kind)):
            assert floor.floor == Level.DEBUG and floor.wants(Level.DEBUG) and floor.level() == Level.DEBUG
        assert not floor.wants(Level.DEBUG)  # outside the scope: the floor stays low, the answer is no
    finally:
        stoic.remove_sink(other)


def test_event_names_may_be_any_iterable_and_must_name_catalog_events() -> None:
    class Once:
        level = stoic.Level.INFO
        event_names = iter(["ratelimiter.rejected"])  # a one-shot iterator: read once, kept

        def emit(self, event: object) -> None: ...

    once = Once()
    stoic.add_sink(once)
    try:
        assert stoic.events.min_level("ratelimiter") == stoic.Level.INFO
    finally:
        stoic.remove_sink(once)

    class Misspelt:
        level = stoic.Level.INFO
        event_names = ("ratelimiter.rejectd",)

        def emit(self, event: object) -> None: ...

    with pytest.raises(ValueError, match=r"ratelimiter\.rejectd"):
        stoic.add_sink(Misspelt())

    class Endless:
        level = float("inf")

        def emit(self, event: object) -> None: ...

    with pytest.raises(ValueError, match="finite"):
        stoic.add_sink(Endless())
