"""Keyed families on virtual time: one policy per key, bounded keys and labels, eviction only
of keys at rest, retune all-or-nothing (seed 003, "Control plane": state per (policy, route))."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

import stoic
from stoic import BreakerState, Bulkhead, BulkheadFull, CircuitBreaker, CircuitOpen, CountWindow, Keyed, RateLimiter
from stoic.keyed import OVERFLOW_KEY
from stoic.testing import RecordingSink, VirtualClock


class Boom(Exception):
    pass


async def boom() -> None:
    raise Boom


async def ok() -> str:
    return "ok"


def breakers(clock: VirtualClock, **kw: object) -> Keyed[CircuitBreaker]:
    config: dict[str, object] = {"window": CountWindow(4), "minimum_calls": 2, "failure_rate_threshold": 0.5}
    config.update(kw)
    return Keyed(CircuitBreaker, label="api", clock=clock, **config)


async def test_one_policy_per_key_built_on_first_use_with_the_key_in_its_label(clock):
    family = breakers(clock)
    assert len(family) == 0
    a, b = family.get("a.example"), family.get("b.example")
    assert a is family.get("a.example") and a is not b
    assert (a.label, b.label) == ("api:a.example", "api:b.example")
    assert family.get() is family.get(None) and family.get().label == "api"
    # One key failing opens only its own breaker.
    for _ in range(2):
        with pytest.raises(Boom):
            await family.execute("a.example", boom)
    assert str(a.state) == "open" and str(b.state) == "closed"
    with pytest.raises(CircuitOpen):
        await family.execute("a.example", ok)
    assert await family.execute("b.example", ok) == "ok"


def test_configuration_is_validated_at_construction_naming_the_parameter(clock):
    with pytest.raises(ValueError, match="failure_rate_threshold"):
        Keyed(CircuitBreaker, label="api", failure_rate_threshold=2.0)
    with pytest.raises(TypeError, match="no parameter 'max_concurent'"):
        Keyed(Bulkhead, label="db", max_concurrent=2, max_concurent=3)
    with pytest.raises(ValueError, match="max_keys"):
        Keyed(CircuitBreaker, label="api", max_keys=0)
    with pytest.raises(ValueError, match="idle_after"):
        Keyed(CircuitBreaker, label="api", idle_after=-1)
    with pytest.raises(ValueError, match="max_labels"):
        Keyed(CircuitBreaker, label="api", max_labels=0)
    with pytest.raises(TypeError, match="label"):
        Keyed(CircuitBreaker, label=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="label"):
        Keyed(CircuitBreaker, label="")
    family = Keyed(CircuitBreaker, label="api")
    with pytest.raises(TypeError, match="key"):
        family.get(42)  # type: ignore[arg-type]


async def test_hundreds_of_keys_stay_within_max_keys_and_labels_within_max_labels(clock, sink):
    family = Keyed(RateLimiter, label="tenant", max_keys=50, max_labels=20, idle_after=60.0, clock=clock,
                   rate=5, per=1.0)
    for i in range(500):
        family.get(f"t{i}")
        assert len(family) <= 50
    labels = {p.label for p in family.policies.values()}
    assert f"tenant:{OVERFLOW_KEY}" in labels
    # Every label ever handed out: the first 20 keys' own, then the one overflow label.
    assert family.label_for("t3") == "tenant:t3"
    assert family.label_for("t499") == f"tenant:{OVERFLOW_KEY}"
    assert len({family.label_for(f"t{i}") for i in range(500)}) == 21
    evicted = sink.of("keyed.evicted")
    assert len(evicted) == 450 and {e.attributes["reason"] for e in evicted} == {"capacity"}
    # The least recently used go first: the newest 50 keys are the ones held.
    assert set(family) == {f"t{i}" for i in range(450, 500)}


async def test_idle_keys_expire_but_an_open_breaker_or_one_in_flight_is_never_dropped(clock, sink):
    family = breakers(clock, max_keys=1000, idle_after=10.0)
    for i in range(300):
        family.get(f"k{i}")
    for _ in range(2):  # k0 open
        with pytest.raises(Boom):
            await family.execute("k0", boom)
    release = asyncio.Event()

    async def hold() -> None:
        await release.wait()

    running = asyncio.create_task(family.execute("k1", hold))  # k1 has a call in flight
    await asyncio.sleep(0)
    forced = family.get("k2")
    forced.force_open()
    await clock.advance(11.0)
    family.get("fresh")  # a miss makes room: the idle keys at rest go
    assert set(family) == {"k0", "k1", "k2", "fresh"}
    release.set()
    await running
    await clock.advance(60.0)
    assert family.sweep() >= 1
    assert "k1" not in family
    assert "k2" in family  # forced open: kept until cleared
    assert all(e.attributes["reason"] == "idle" for e in sink.of("keyed.evicted"))


async def test_a_limiter_with_permits_spent_is_not_dropped_until_its_bucket_is_full_again(clock, sink):
    # A limiter's spent permits are state too: forgetting the key handed its next call a full
    # bucket, so a quota of one call an hour gave another after idle_after (10 minutes here), or
    # at once when other keys needed the room.
    family = Keyed(RateLimiter, label="tenants", max_keys=2, idle_after=600.0, clock=clock, rate=1, per=3600.0,
                   queue_limit=0)
    await family.execute("a", ok)
    await clock.advance(601.0)
    assert family.sweep() == 0 and "a" in family
    with pytest.raises(stoic.RateLimited):
        await family.execute("a", ok)
    await family.execute("b", ok)
    await family.execute("c", ok)  # room needed: every key has spent its permit, "c" gets the overflow
    assert set(family) == {"a", "b"}
    with pytest.raises(stoic.RateLimited):
        await family.execute("a", ok)
    await clock.advance(3600.0)  # refilled: nothing is lost by forgetting them now
    assert family.sweep() == 2 and set(family) == set()


class _Interrupt(BaseException):
    """Not an Exception: what a sink is interrupted by (Ctrl-C landing in its write)."""


async def test_a_sink_interrupted_on_a_keyed_event_leaves_no_call_counted_in_flight(clock):
    # The call is counted in flight with the key made, the events go out after: a sink raising
    # a BaseException there (stoic skips a sink's Exception, never its BaseException) ended the
    # call before it ran, and its count stayed, so the key was never to be dropped again.
    class InterruptedSink:
        level = stoic.Level.INFO

        def emit(self, event: stoic.Event) -> None:
            if event.name.startswith("keyed."):
                raise _Interrupt(event.name)

    family = Keyed(Bulkhead, label="db", max_keys=1, idle_after=10.0, clock=clock, max_concurrent=1)
    await family.execute("a", ok)
    with stoic.use_sinks(InterruptedSink()), pytest.raises(_Interrupt):
        await family.execute("b", ok)  # makes room: "a" is dropped, keyed.evicted
    assert "b" in family and family._slots["b"].calls == []
    await clock.advance(11.0)
    assert family.sweep() == 1 and "b" not in family


async def test_the_overflow_policy_is_acted_on_under_the_key_policies_lists_it_by(clock):
    family = breakers(clock, max_keys=1)
    gate = asyncio.Event()

    async def hold() -> None:
        await gate.wait()

    busy = asyncio.create_task(family.execute("k0", hold))
    await asyncio.sleep(0)
    overflow = family.get("k1")
    assert family.policies[OVERFLOW_KEY] is overflow
    assert family.force_open(OVERFLOW_KEY) == 1 and overflow.state is BreakerState.OPEN
    assert family.get("k0").state is BreakerState.CLOSED
    assert family.clear_forced_open(OVERFLOW_KEY) == 1 and overflow.state is BreakerState.CLOSED
    gate.set()
    await busy
    with pytest.raises(LookupError):
        breakers(clock).force_open(OVERFLOW_KEY)  # no overflow policy yet: no such key


async def test_when_every_key_is_busy_new_keys_share_the_overflow_policy(clock, sink):
    family = Keyed(Bulkhead, label="db", max_keys=3, clock=clock, max_concurrent=1)
    gate = asyncio.Event()

    async def hold() -> None:
        await gate.wait()

    tasks = [asyncio.create_task(family.execute(f"k{i}", hold)) for i in range(3)]
    await asyncio.sleep(0)
    overflow = family.get("k9")
    assert overflow is family.get("k10") and overflow.label == f"db:{OVERFLOW_KEY}"
    assert len(family) == 3 and set(family) == {"k0", "k1", "k2"}
    assert [e.attributes for e in sink.of("keyed.full")] == [{"keys": 3}]  # once per episode
    gate.set()
    await asyncio.gather(*tasks)
    assert family.get("k9") is not overflow and family.get("k9").label == "db:k9"


async def test_hundreds_of_contending_tasks_on_a_keyed_bulkhead_hold_each_keys_limit(clock):
    family = Keyed(Bulkhead, label="db", max_keys=8, clock=clock, max_concurrent=2, queue_limit=None)
    inside: dict[str, int] = {}
    most: dict[str, int] = {}
    rng = random.Random(7)

    async def work(key: str) -> None:
        inside[key] = inside.get(key, 0) + 1
        most[key] = max(most.get(key, 0), inside[key])
        await clock.sleep_until(clock.now_ns() + rng.randrange(1_000_000, 10_000_000))
        inside[key] -= 1

    keys = [f"k{rng.randrange(8)}" for _ in range(400)]
    tasks = [asyncio.create_task(family.execute(k, work, k)) for k in keys]
    while not all(t.done() for t in tasks):
        await clock.advance(0.001)
    await asyncio.gather(*tasks)
    assert set(most) == set(keys) and max(most.values()) == 2
    assert len(family) <= 8
    assert all(p.active_count == 0 for p in family.policies.values())  # no slot leaked


async def test_retune_swaps_every_key_all_or_nothing_and_keeps_a_forced_breaker_forced(clock):
    family = breakers(clock)
    a, b = family.get("a"), family.get("b")
    b.force_open()
    with pytest.raises(ValueError, match="failure_rate_threshold"):
        family.retune(failure_rate_threshold=1.5)
    assert family.get("a") is a and family.config["failure_rate_threshold"] == 0.5  # unchanged
    with pytest.raises(TypeError, match="no parameter"):
        family.retune(failure_rate=0.9)
    with pytest.raises(TypeError, match="label"):
        family.retune(label="x")
    assert family.retune(minimum_calls=4) == 2
    assert family.get("a") is a and a.label == "api:a"  # retuned in place, by its own _retune
    assert family.config["minimum_calls"] == 4
    assert str(family.get("b").state) == "open"  # still forced
    with pytest.raises(Boom):  # a's new breaker needs 4 calls now: 2 failures do not open it
        await family.execute("a", boom)
    with pytest.raises(Boom):
        await family.execute("a", boom)
    assert str(family.get("a").state) == "closed"


async def test_retune_loses_no_call_in_flight(clock):
    family = Keyed(Bulkhead, label="db", clock=clock, max_concurrent=1)
    gate = asyncio.Event()

    async def hold() -> str:
        await gate.wait()
        return "done"

    running = asyncio.create_task(family.execute("k", hold))
    await asyncio.sleep(0)
    old = family.get("k")
    assert old.active_count == 1
    family.retune(max_concurrent=5)
    assert family.get("k") is old and old.max_concurrent == 5  # in place: the call keeps its slot
    gate.set()
    assert await running == "done"
    assert old.active_count == 0


async def test_force_open_all_keys_covers_keys_built_later_until_cleared(clock):
    family = breakers(clock)
    family.get("a")
    assert family.force_open() == 1
    assert str(family.get("late").state) == "open"
    with pytest.raises(CircuitOpen):
        await family.execute("later", ok)
    assert family.clear_forced_open() == 3
    assert await family.execute("newest", ok) == "ok"
    assert str(family.get("a").state) == "closed"
    with pytest.raises(LookupError):
        family.force_open("missing")
    limiters = Keyed(RateLimiter, label="rl", rate=1)
    with pytest.raises(TypeError, match="cannot be forced open"):
        limiters.force_open()


def test_sync_calls_through_a_family(jumping_clock):
    family = Keyed(CircuitBreaker, label="sync", clock=jumping_clock, minimum_calls=1, window=CountWindow(1))
    assert family.call("k", lambda: 3) == 3

    def fail() -> None:
        raise Boom

    with pytest.raises(Boom):
        family.call("k", fail)
    with pytest.raises(CircuitOpen):
        family.call("k", lambda: 3)


async def test_events_conform_to_the_catalog(clock):
    recording = RecordingSink()
    with stoic.use_sinks(recording):
        family = Keyed(Bulkhead, label="db", max_keys=1, clock=clock, max_concurrent=1)
        family.get("a")
        family.get("b")
    recording.assert_contract()
    assert recording.names == ["keyed.evicted"]
    with pytest.raises(BulkheadFull):
        gate = asyncio.Event()
        first = asyncio.create_task(family.execute("b", gate.wait))
        await asyncio.sleep(0)
        try:
            await family.execute("b", gate.wait)
        finally:
            gate.set()
            await first


def test_threads_contending_on_a_keyed_blocking_bulkhead_leak_nothing():
    import threading

    from stoic import BlockingBulkhead

    # Four threads, five places, eight keys: keys are dropped and rebuilt all the time, and there
    # is always one at rest to drop (never the overflow policy), so each key's limit must hold.
    family = Keyed(BlockingBulkhead, label="threads", max_keys=5, max_concurrent=2, queue_limit=None)
    inside: dict[str, int] = {}
    most: dict[str, int] = {}
    lock = threading.Lock()
    errors: list[BaseException] = []

    def work(key: str) -> None:
        with lock:
            inside[key] = inside.get(key, 0) + 1
            most[key] = max(most.get(key, 0), inside[key])
        time.sleep(0.0002)  # (real threads: overlap for real)
        with lock:
            inside[key] -= 1

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(100):
                key = f"k{rng.randrange(8)}"
                family.call(key, work, key)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert len(family) <= 5 and OVERFLOW_KEY not in family.policies
    assert all(p.active_count == 0 and p.queued_count == 0 for p in family.policies.values())
    assert all(inside[k] == 0 for k in inside)
    assert max(most.values()) <= 2  # one bulkhead per key at a time: never two for one key


async def test_a_retune_that_one_key_refuses_changes_no_key_and_not_the_family(clock):
    # Key b has a request for 8 permits queued: a burst of 5 can never serve it, so b refuses the
    # retune. Key a, retuned first, goes back; the family's configuration stays as it was.
    family = Keyed(RateLimiter, label="k", clock=clock, rate=10, per=1.0, burst=10)
    a, b = family.get("a"), family.get("b")
    await b.acquire(10)
    waiting = asyncio.create_task(b.acquire(8))
    await asyncio.sleep(0)
    with pytest.raises(ValueError, match="burst"):
        family.retune(burst=5, rate=5)
    assert (a.rate, a.burst, b.rate, b.burst) == (10, 10, 10, 10)
    assert dict(family.config) == {"rate": 10, "per": 1.0, "burst": 10}
    assert family.get("c").rate == 10 and a.available_permits == 10
    waiting.cancel()
