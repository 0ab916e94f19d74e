"""stoic.fleet against a real redis-server (issue 13, "Tests on a real Redis").

One server per module (a fresh label per test keeps their keys apart); the kill/restart test
gets its own. Replicas are either real processes (tests.integration._fleet_worker) or, where
only their independent local copies matter, separate store/policy objects with their own
connections in this process: a new object is exactly what a new process builds.
"""

from __future__ import annotations

import asyncio
import gc
import json
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
from _threads import eventually
from redis_harness import RedisServer, fresh

import stoic
from stoic import CircuitBreaker, CircuitOpen, OpenDuration, RateLimited
from stoic.breaker import BreakerState, CountWindow
from stoic.fleet import BlockingSharedRateLimiter, RedisStore, SharedCircuitBreaker, SharedRateLimiter
from stoic.testing import RecordingSink, VirtualClock

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
@pytest.fixture
async def raw(server: RedisServer) -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis.from_url(server.url)
    yield client
    await client.aclose()


def store_for(server: RedisServer, budget: float = 0.25, probe_interval: float = 0.2) -> RedisStore:
    return RedisStore(server.url, budget=budget, probe_interval=probe_interval)


def run_workers(args: list[list[str]], not_before: float = 0.0, timeout: float = 30.0) -> list[dict[str, Any]]:
    """Start one replica process per argument list, wait until every one is set up, start them
    together (0.2 s later, and not before ``not_before``), and return what each saw."""
    procs = [
        subprocess.Popen([sys.executable, "-m", "tests.integration._fleet_worker", *a], cwd=ROOT,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for a in args
    ]
    for proc in procs:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line == "ready", (line, proc.stderr.read() if proc.stderr else "")
    start_at = max(time.time() + 0.2, not_before)
    for proc in procs:  # every replica is told before any is waited for
        assert proc.stdin is not None
        proc.stdin.write(f"{start_at}\n")
        proc.stdin.close()
    results = []
    for proc in procs:
        assert proc.stdout is not None and proc.stderr is not None
        with proc.stdout, proc.stderr:
            out, err = proc.stdout.read(), proc.stderr.read()
        assert proc.wait(timeout=timeout) == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


# ---------------------------------------------------------------------------- rate limiter
def test_four_processes_share_one_bucket(server: RedisServer) -> None:
    label = fresh("share")
    seconds = 5.0
    results = run_workers([["limiter", server.url, label, str(seconds), "4"] for _ in range(4)])
    assert all(r["grants"] for r in results), "every process got permits (none starved)"
    # Each grant is (asked, answered): the server's decision lies between. A window of server
    # time [a, a + w] certainly holds the grants asked at or after a and answered by a + w, and
    # those may never exceed burst + rate x w: checked exactly, with no slack for latency.
    grants = sorted((asked, answered) for r in results for asked, answered in r["grants"])
    burst, rate = 100, 100.0
    for i, (a, _) in enumerate(grants):
        if i % 7:
            continue  # every seventh start is plenty (and keeps this quadratic check fast)
        for width in (0.05, 0.5, 1.0, 2.5):
            inside = sum(1 for asked, answered in grants[i:] if answered <= a + width and asked >= a)
            assert inside <= burst + rate * width, (width, inside)
    span = max(answered for _, answered in grants) - min(asked for asked, _ in grants)
    assert len(grants) <= burst + rate * span
    # With enough demand, within 2 % of burst + rate x t over the run.
    assert len(grants) >= 0.98 * (burst + rate * seconds), len(grants)


async def test_refusal_carries_the_scripts_exact_wait(server: RedisServer) -> None:
    store = store_for(server)
    limiter = SharedRateLimiter(2, 1.0, store=store, label=fresh("exact"), queue_limit=0)
    assert await limiter.try_acquire(2)
    with pytest.raises(RateLimited) as info:
        await limiter.acquire()
    # Empty bucket, 2 permits per second: the next permit is at most 0.5 s away, and a few ms
    # of it have already passed since the bucket was emptied.
    assert info.value.retry_after is not None
    assert 0.3 < info.value.retry_after <= 0.5
    await store.aclose()


async def test_queued_acquire_waits_for_the_computed_instant(server: RedisServer) -> None:
    store = store_for(server)
    limiter = SharedRateLimiter(20, 1.0, store=store, label=fresh("queue"))
    for _ in range(20):
        assert await limiter.try_acquire()
    calls = 0
    real_call = store.call

    async def counting(*args: Any, **kwargs: Any) -> list[Any]:
        nonlocal calls
        calls += 1
        return await real_call(*args, **kwargs)

    store.call = counting  # type: ignore[method-assign]
    start = time.monotonic()
    await asyncio.gather(*(limiter.acquire() for _ in range(5)))
    elapsed = time.monotonic() - start
    # 5 permits at 20/s: 0.25 s; asked again only at each computed instant, never spinning.
    assert 0.2 <= elapsed < 1.0
    assert calls <= 5 + 5 * 3
    await store.aclose()


# ---------------------------------------------------------------------------- breaker
def breaker(store: RedisStore, label: str, **kwargs: Any) -> SharedCircuitBreaker:
    kwargs.setdefault("window", CountWindow(4))
    kwargs.setdefault("minimum_calls", 4)
    kwargs.setdefault("open_duration", OpenDuration.fixed(30.0, jitter=0.0))
    kwargs.setdefault("refresh_interval", 0.1)
    return SharedCircuitBreaker(label=label, store=store, **kwargs)


async def fail() -> None:
    raise ConnectionError("the dependency is down")


async def ok() -> str:
    return "ok"


async def trip(shared: SharedCircuitBreaker) -> None:
    """Fail calls until the breaker refuses one (the window holds 4 calls)."""
    for _ in range(5):
        try:
            await shared.execute(fail)
        except ConnectionError:
            continue
        except CircuitOpen:
            return
    raise AssertionError("never tripped")


async def test_a_trip_in_one_replica_refuses_calls_in_the_others_within_the_refresh_interval(
    server: RedisServer,
) -> None:
    label = fresh("trip")
    stores = [store_for(server) for _ in range(4)]
    replicas = [breaker(s, label, refresh_interval=0.2) for s in stores]
    for replica in replicas:
        assert await replica.execute(ok) == "ok"
    await trip(replicas[0])
    # The collector off while timing (as in the killed-server test below): a full collection of
    # the suite's heap under load (~200 ms once) is the interpreter's pause, not the refresh.
    gc.collect()
    gc.disable()
    try:
        tripped_at = time.monotonic()
        with pytest.raises(CircuitOpen):
            await replicas[0].execute(ok)
        refused_after: list[float] = []
        for replica in replicas[1:]:
            while True:
                try:
                    await replica.execute(ok)
                except CircuitOpen as exc:
                    assert exc.retry_after is not None and 29.0 < exc.retry_after <= 30.0
                    refused_after.append(time.monotonic() - tripped_at)
                    break
                await asyncio.sleep(0.005)
                assert time.monotonic() - tripped_at < 2.0, "never refused"
    finally:
        gc.enable()
    # The refresh interval, plus slack for a loaded machine, in the same proportion as before
    # (it was 0.1 + 0.15 s, and a 150 ms stall of the machine ate that slack).
    assert max(refused_after) <= 0.2 + 0.3
    for s in stores:
        await s.aclose()


def test_exactly_one_probe_fleet_wide(server: RedisServer) -> None:
    label = fresh("probe")

    async def open_it() -> None:
        store = store_for(server)
        shared = breaker(store, label, open_duration=OpenDuration.fixed(1.0, jitter=0.0))
        await trip(shared)
        assert shared.state is BreakerState.OPEN
        await store.aclose()

    asyncio.run(open_it())
    # Every replica set up and the 1 s open period over when the 200 calls arrive.
    results = run_workers([["probe", server.url, label, "50"] for _ in range(4)], not_before=time.time() + 1.1)
    assert sum(r["ran"] for r in results) == 1, results
    assert sum(r["refused"] for r in results) == 199
    assert not any(r["degraded"] for r in results)


async def test_a_new_replica_never_resets_shared_state(server: RedisServer) -> None:
    label = fresh("join")
    first_store = store_for(server)
    first = breaker(first_store, label, open_duration=OpenDuration.exponential(0.3, 2.0, 60.0, jitter=0.0))
    await trip(first)
    # A replica that starts now sees the open breaker and the fleet's trip count.
    joiner_store = store_for(server)
    joiner = breaker(joiner_store, label, open_duration=OpenDuration.exponential(0.3, 2.0, 60.0, jitter=0.0))
    with pytest.raises(CircuitOpen):
        await joiner.execute(ok)
    assert joiner.trips == 1 and joiner.state is BreakerState.OPEN
    await asyncio.sleep(0.35)
    with pytest.raises(ConnectionError):
        await joiner.execute(fail)  # the probe fails: the second trip opens for twice as long
    with pytest.raises(CircuitOpen) as info:
        await joiner.execute(ok)
    assert info.value.retry_after is not None and 0.5 < info.value.retry_after <= 0.6
    late_store = store_for(server)
    late = breaker(late_store, label)
    await late.refresh()
    assert late.trips == 2 and late.state is BreakerState.OPEN
    for s in (first_store, joiner_store, late_store):
        await s.aclose()


async def test_force_open_is_a_fleet_wide_kill_switch(server: RedisServer) -> None:
    label = fresh("force")
    a_store, b_store = store_for(server), store_for(server)
    a, b = breaker(a_store, label), breaker(b_store, label)
    assert await b.execute(ok) == "ok"
    await a.force_open()
    await asyncio.sleep(0.15)
    with pytest.raises(CircuitOpen) as info:
        await b.execute(ok)
    assert info.value.retry_after is None
    await b.force_closed()
    await asyncio.sleep(0.15)
    assert await a.execute(ok) == "ok"
    await a_store.aclose()
    await b_store.aclose()


async def test_a_probe_is_recorded_as_a_half_open_call(server: RedisServer) -> None:
    # breaker.recorded covers probes too (state half_open), as CircuitBreaker reports them:
    # from execute and from call() in a thread.
    store = RedisStore(server.url, budget=2.0)
    sink = RecordingSink()

    async def fails() -> None:
        raise ConnectionError("down")

    def fails_sync() -> None:
        raise ConnectionError("down")

    with stoic.use_sinks(sink):
        shared = breaker(store, fresh("probe-rec"), open_duration=OpenDuration.fixed(0.1, jitter=0.0))
        threaded = breaker(store, fresh("probe-rec-sync"), open_duration=OpenDuration.fixed(0.1, jitter=0.0))
        for _ in range(4):
            with pytest.raises(ConnectionError):
                await shared.execute(fails)
            with pytest.raises(ConnectionError):
                await asyncio.to_thread(threaded.call, fails_sync)
        await asyncio.sleep(0.15)
        with pytest.raises(ConnectionError):
            await shared.execute(fails)  # a failed probe
        with pytest.raises(ConnectionError):
            await asyncio.to_thread(threaded.call, fails_sync)
        await asyncio.sleep(0.15)
        assert await shared.execute(ok) == "ok"  # a successful probe
        assert await asyncio.to_thread(threaded.call, lambda: "ok") == "ok"
    for b in (shared, threaded):
        probes = [e.attributes for e in sink.of("breaker.recorded")
                  if e.label == b.label and e.attributes["state"] == "half_open"]
        assert [p["outcome"] for p in probes] == ["failure", "success"], b.label
        assert b.state is BreakerState.CLOSED
    sink.assert_contract()
    await store.aclose()


async def test_a_first_read_cut_short_by_a_cancelled_caller_is_not_taken_for_closed(server: RedisServer) -> None:
    # A replica that has not read the shared state waits for its first read rather than
    # guessing: when the caller whose call was making that read is cancelled, the calls that
    # waited on it and the next ones read the state themselves, instead of running as closed
    # for a refresh interval while the fleet's breaker is open.
    label = fresh("first-read")
    a_store, b_store = store_for(server), store_for(server)
    a, b = breaker(a_store, label, refresh_interval=5.0), breaker(b_store, label, refresh_interval=5.0)
    await a.force_open()
    real_call = b_store.call
    slow = True

    async def slow_first(*args: Any, **kwargs: Any) -> list[Any]:
        if slow:
            await asyncio.sleep(0.3)
        return await real_call(*args, **kwargs)

    b_store.call = slow_first  # type: ignore[method-assign]
    first = asyncio.create_task(b.execute(ok))
    await asyncio.sleep(0.05)
    waiting = asyncio.create_task(b.execute(ok))  # waits for the first read
    await asyncio.sleep(0.05)
    first.cancel()
    slow = False
    with pytest.raises(asyncio.CancelledError):
        await first
    with pytest.raises(CircuitOpen):
        await waiting
    with pytest.raises(CircuitOpen):
        await b.execute(ok)
    await a.force_closed()
    await a_store.aclose()
    await b_store.aclose()


async def test_reset_emits_breaker_reset_as_the_local_breaker_does(server: RedisServer) -> None:
    # reset() always reports breaker.reset (and breaker.closed when it was not closed), as
    # CircuitBreaker.reset does: forgetting the fleet's trip count is a change worth an event.
    store = RedisStore(server.url, budget=2.0)
    shared = breaker(store, fresh("reset-events"))
    sink = RecordingSink()

    async def ok() -> str:
        return "ok"

    with stoic.use_sinks(sink):
        assert await shared.execute(ok) == "ok"
        await shared.reset()  # closed: only the trip count goes
        await shared.force_open()
        await shared.reset()  # open: closed, then reset
    # (the fallback, "<label>.fallback", reports its own reset besides)
    mine = [e for e in sink.events if e.label == shared.label and e.name in ("breaker.closed", "breaker.reset")]
    assert [e.name for e in mine] == ["breaker.reset", "breaker.closed", "breaker.reset"]
    assert mine[1].attributes["reason"] == "reset"
    sink.assert_contract()
    await store.aclose()


async def test_a_defect_through_the_shared_breaker_is_reported_as_the_local_one_reports_it(server: RedisServer) -> None:
    # A bug (stoic.Defect) is never counted; its event carries error.type, as the catalog says.
    store = RedisStore(server.url, budget=2.0)
    shared = breaker(store, fresh("defect"))
    sink = RecordingSink()

    async def buggy() -> None:
        raise stoic.Defect("a bug, not the dependency")

    with stoic.use_sinks(sink):
        for _ in range(6):
            with pytest.raises(stoic.Defect):
                await shared.execute(buggy)
    assert shared.state is BreakerState.CLOSED
    defects = sink.of("breaker.defect")
    assert len(defects) == 6
    assert all(e.attributes["error.type"] == "Defect" for e in defects)
    sink.assert_contract()
    await store.aclose()


async def test_a_shared_breakers_operation_called_with_arguments_it_does_not_take_is_never_counted(
    server: RedisServer,
) -> None:
    # A wrong call site is a bug, as the local breaker judges it: reported, never a failure that
    # one buggy caller could use to open the circuit for the fleet. A wrong call inside counts.
    store = RedisStore(server.url, budget=2.0)
    shared = breaker(store, fresh("unbound"))
    sink = RecordingSink()

    async def fetch(user_id: int) -> int:
        return user_id

    def lookup(user_id: int) -> int:
        return user_id

    with stoic.use_sinks(sink):
        for _ in range(6):
            with pytest.raises(TypeError, match=r"fetch\(\) takes 1 positional argument"):
                await shared.execute(fetch, 1, 2)
            with pytest.raises(TypeError, match=r"lookup\(\) missing"):
                await asyncio.to_thread(shared.call, lookup)
        assert shared.state is BreakerState.CLOSED
        assert [e.attributes["error.type"] for e in sink.of("breaker.defect")] == ["TypeError"] * 12
        assert await shared.execute(fetch, 3) == 3

        async def wrong_inside() -> int:
            return lookup(1, 2)  # type: ignore[call-arg]

        for _ in range(3):  # (with the success above: the window of 4 calls, 75% failed)
            with pytest.raises(TypeError):
                await shared.execute(wrong_inside)
    assert shared.state is BreakerState.OPEN  # the operation's own TypeError: failures
    sink.assert_contract()
    await store.aclose()


async def test_a_slow_success_is_recorded_once_as_slow(server: RedisServer) -> None:
    # A slow success goes into the window as slow: one breaker.recorded saying so, not a
    # second one claiming the same call was quick (execute, and call() from a thread).
    store = RedisStore(server.url, budget=2.0)
    shared = breaker(store, fresh("slow-once"), slow_call_duration=0.02)
    threaded = breaker(store, fresh("slow-once-sync"), slow_call_duration=0.02)
    sink = RecordingSink()

    async def slow() -> str:
        await asyncio.sleep(0.05)
        return "ok"

    def slow_sync() -> str:
        time.sleep(0.05)
        return "ok"

    with stoic.use_sinks(sink):
        assert await shared.execute(slow) == "ok"  # the first call reads the state first
        assert await shared.execute(slow) == "ok"  # the fast path
        assert await asyncio.to_thread(threaded.call, slow_sync) == "ok"
    for label in (shared.label, threaded.label):
        recorded = [e for e in sink.of("breaker.recorded") if e.label == label]
        assert [e.attributes["slow"] for e in recorded] == ([True, True] if label == shared.label else [True])
    sink.assert_contract()
    await store.aclose()


async def test_a_passed_deadline_does_not_refuse_the_store_call_nor_lose_a_trip(server: RedisServer) -> None:
    # A store call is bounded by its budget. The caller's ambient deadline, passed while the
    # operation ran without yielding, must not make the store's health breaker refuse the
    # call: the shielded trip failed with DeadlineExceeded, and was lost (the window that
    # tripped was already emptied, so it waited for minimum_calls more failures).
    store = RedisStore(server.url, budget=2.0)
    shared = breaker(store, fresh("late-trip"))

    async def fails() -> None:
        raise ConnectionError("down")

    async def fails_late() -> None:
        time.sleep(0.03)  # past the deadline, the loop blocked: no cancellation delivered yet
        raise ConnectionError("down, late")

    for _ in range(3):
        with pytest.raises(ConnectionError):
            await shared.execute(fails)
    # (the deadline fires while the caller waits for the trip to land: it leaves at once)
    with pytest.raises(stoic.DeadlineExceeded) as info:
        async with stoic.timeout(0.01):
            await shared.execute(fails_late)
    assert isinstance(info.value.__cause__.__context__, ConnectionError)  # type: ignore[union-attr]
    await asyncio.sleep(0.05)  # the shielded trip lands
    assert shared.state is BreakerState.OPEN
    joiner = breaker(RedisStore(server.url, budget=2.0), shared.label)
    await joiner.refresh()
    assert joiner.state is BreakerState.OPEN and joiner.trips == 1
    await store.aclose()
    await joiner._store.aclose()


# ---------------------------------------------------------------------------- store failures
async def test_redis_killed_then_restarted(tmp_path: Path) -> None:
    own = RedisServer(tmp_path)
    sink = RecordingSink()
    try:
        with stoic.use_sinks(sink):
            # A 20 ms budget: tight, yet not flaky on a machine the whole suite is loading.
            store = RedisStore(own.url, budget=0.02, probe_interval=0.3)
            limiter = SharedRateLimiter(1000, 1.0, store=store, label=fresh("kill"))
            shared = breaker(store, fresh("killbrk"), refresh_interval=0.05)
            for _ in range(5):
                assert await limiter.try_acquire()
                assert await shared.execute(ok) == "ok"
            own.kill()
            slowest = 0.0
            end = time.monotonic() + 1.0
            calls = 0
            # The collector off while timing: a full collection of the whole suite's heap took
            # ~200 ms once under load, which is the interpreter's pause, not a store budget.
            gc.collect()
            gc.disable()
            try:
                while time.monotonic() < end:
                    start = time.monotonic()
                    await asyncio.wait_for(limiter.acquire(), 1.0)  # fails open to the local bucket
                    assert await asyncio.wait_for(shared.execute(ok), 1.0) == "ok"
                    slowest = max(slowest, time.monotonic() - start)
                    calls += 1
                    await asyncio.sleep(0.002)
            finally:
                gc.enable()
            assert slowest < 0.02 * 2 + 0.15  # two store budgets at most, plus slack for a loaded machine
            assert shared.degraded
            errors = sink.of("fleet.store_error")
            # One budget per probe interval (0.3 s) over 1 s, not one per call.
            assert 1 <= len(errors) <= 8 < calls
            assert all(e.attributes["unavailable"] for e in errors)
            assert sink.of("fleet.fail_open")
            own.start()
            await asyncio.sleep(0.35)
            give_up = time.monotonic() + 5.0
            while shared.degraded or not sink.of("fleet.store_recovered"):
                await limiter.acquire()
                await shared.execute(ok)
                await asyncio.sleep(0.02)
                assert time.monotonic() < give_up, "the policies never went back to the store"
            check = redis.Redis.from_url(own.url)
            assert check.exists(*store.keys(limiter.label, "bucket")) == 1
            check.close()
            await store.aclose()
    finally:
        own.stop()
    sink.assert_contract()


async def test_script_flush_is_recovered(server: RedisServer, raw: redis.asyncio.Redis) -> None:
    sink = RecordingSink()
    with stoic.use_sinks(sink):
        store = store_for(server)
        limiter = SharedRateLimiter(10, 1.0, store=store, label=fresh("flush"))
        assert await limiter.try_acquire()
        await raw.script_flush()
        assert await limiter.try_acquire()
        assert (await raw.script_exists(store._scripts["limiter_take"].sha)) == [True]
        await store.aclose()
    assert not sink.of("fleet.store_error")


async def test_every_key_expires(server: RedisServer, raw: redis.asyncio.Redis) -> None:
    store = store_for(server)
    limiter = SharedRateLimiter(10, 0.1, store=store, label=fresh("ttl"))
    shared = breaker(store, fresh("ttlbrk"), half_open_timeout=1.0,
                     open_duration=OpenDuration.exponential(0.2, 2.0, 1.0, jitter=0.0, reset_after=1.0))
    assert await limiter.try_acquire()
    await trip(shared)
    bucket = store.keys(limiter.label, "bucket")[0]
    state = store.keys(shared.label, "breaker")[0]
    assert 0 < await raw.pttl(bucket) <= 1100  # refill time (0.1 s) + 1 s
    assert 0 < await raw.pttl(state) <= 3000 + 200  # reset_after + probe timeout + 1 s + open period
    await asyncio.sleep(1.25)
    assert await raw.exists(bucket) == 0
    await store.aclose()


async def test_a_key_written_by_another_program_is_a_store_error(
    server: RedisServer, raw: redis.asyncio.Redis,
) -> None:
    sink = RecordingSink()
    with stoic.use_sinks(sink):
        store = store_for(server)
        label = fresh("foreign")
        opened = SharedRateLimiter(3, 60.0, store=store, label=label)
        closed = SharedRateLimiter(3, 60.0, store=store, label=label, fail_open_on_store_error=False)
        key = store.keys(label, "bucket")[0]
        await raw.set(key, "not a hash")  # WRONGTYPE for the script
        assert await opened.try_acquire()  # fails open, to the local bucket of 3
        assert not await closed.try_acquire()  # fails closed
        await raw.delete(key)
        await raw.hset(key, mapping={"c": "lots", "s": "yesterday"})  # a hash of nonsense
        for _ in range(2):
            assert await opened.try_acquire()
        assert not await opened.try_acquire()  # still bounded: the local bucket is empty
        with pytest.raises(RateLimited):
            await closed.acquire()
        await store.aclose()
    errors = sink.of("fleet.store_error")
    assert len(errors) >= 5 and not any(e.attributes["unavailable"] for e in errors)
    assert {e.attributes["error.type"] for e in errors} == {"ResponseError"}
    # Four decisions by the local bucket (three grants, one refusal), two refusals failing closed.
    assert len(sink.of("fleet.fail_open")) == 4 and len(sink.of("fleet.fail_closed")) == 2
    sink.assert_contract()


async def test_a_cancelled_call_never_leaves_a_connection_mid_command(
    server: RedisServer, raw: redis.asyncio.Redis,
) -> None:
    sink = RecordingSink()
    with stoic.use_sinks(sink):
        store = RedisStore(redis.asyncio.Redis.from_url(server.url, max_connections=1), budget=2.0)
        limiter = SharedRateLimiter(5, 1.0, store=store, label=fresh("cancel"))
        shared = breaker(store, fresh("cancelbrk"))
        assert await shared.execute(ok) == "ok"
        await raw.execute_command("CLIENT", "PAUSE", "300", "ALL")
        pending = asyncio.create_task(limiter.try_acquire())
        await asyncio.sleep(0.05)  # the command is sent; its reply is held back by the pause
        pending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await pending
        await asyncio.sleep(0.3)
        # The one pooled connection must not deliver the cancelled call's reply to the next one.
        await shared.refresh()
        assert not shared.degraded
        assert await limiter.try_acquire()
        await store.client.aclose()
    assert not sink.of("fleet.store_error")


async def test_the_budget_bounds_a_paused_server(server: RedisServer, raw: redis.asyncio.Redis) -> None:
    sink = RecordingSink()
    with stoic.use_sinks(sink):
        # A 0.25 s budget, so a loaded machine's stall (the collector is off, too) cannot pass
        # for a second budget spent or a first one not spent: the bounds had 0.1 and 0.05 s of
        # slack. The pause outlasts the budget by 0.75 s, as it outlasted 0.1 s by 0.5 s.
        store = RedisStore(server.url, budget=0.25, probe_interval=0.3)
        limiter = SharedRateLimiter(5, 1.0, store=store, label=fresh("pause"))
        assert await limiter.try_acquire()
        gc.collect()
        gc.disable()
        try:
            await raw.execute_command("CLIENT", "PAUSE", "1000", "ALL")
            start = time.monotonic()
            assert await limiter.try_acquire()  # fails open after one budget, not two
            assert 0.25 <= time.monotonic() - start < 0.25 + 0.25
            start = time.monotonic()
            assert await limiter.try_acquire()  # the store is resting: no budget spent at all
            assert time.monotonic() - start < 0.25
        finally:
            gc.enable()
        await asyncio.sleep(0.9)  # past the pause (1 s) and the probe interval: the store recovers
        assert await limiter.try_acquire()
        await store.aclose()
    assert len(sink.of("fleet.store_error")) == 1
    assert sink.of("fleet.store_recovered")


def test_blocking_calls_use_the_sync_client(server: RedisServer) -> None:
    store = RedisStore(redis.Redis.from_url(server.url), budget=0.25)
    label = fresh("sync")
    key = store.keys(label, "bucket")
    granted = [store.call_blocking("limiter_take", key, (1, 1, 1_000_000, 2_000_000, 3000))[0] for _ in range(3)]
    assert granted == [1, 1, 0]


def test_the_blocking_limiter_shares_the_bucket_across_threads(server: RedisServer) -> None:
    import threading

    store = RedisStore(redis.Redis.from_url(server.url), budget=0.25)
    label = fresh("threads")
    limiter = BlockingSharedRateLimiter(20, 1.0, burst=5, store=store, label=label)
    other = BlockingSharedRateLimiter(20, 1.0, burst=5, store=RedisStore(server.url, budget=0.25), label=label)
    granted: list[float] = []
    lock = threading.Lock()
    start = time.monotonic()

    def worker(shared: BlockingSharedRateLimiter) -> None:
        for _ in range(3):
            with shared, lock:
                granted.append(time.monotonic() - start)

    threads = [threading.Thread(target=worker, args=(limiter if n % 2 else other,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(granted) == 12
    # Five at once from the burst, then 20/s shared by both limiters: the 12th no sooner than 0.35 s.
    assert max(granted) >= 0.35 - 0.01
    assert not limiter.try_acquire(5)
    with pytest.raises(RateLimited) as info:
        limiter.acquire(5, timeout=0.01)
    assert info.value.retry_after is not None and 0.01 <= info.value.retry_after <= 0.25


# ---------------------------------------------------------------------------- latency signal
def _exact_quantile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, int(p * len(ordered)) - 1)]


async def test_two_replicas_with_different_latencies_converge_on_the_merged_quantile(server: RedisServer) -> None:
    import random

    from stoic.fleet import SharedLatency

    label = fresh("latency")
    clock = VirtualClock()
    stores = [store_for(server), store_for(server)]
    digests = [SharedLatency(store=s, label=label, interval=0.5, clock=clock) for s in stores]
    fast, slow = (d.estimator(0.25, window=1000) for d in digests)
    rng = random.Random(7)
    seen: list[float] = []
    for _ in range(4):
        for _ in range(250):
            a, b = rng.uniform(10e6, 20e6), rng.uniform(30e6, 40e6)  # ns: 10-20 ms and 30-40 ms
            fast.add(a)
            slow.add(b)
            seen += (a, b)
        await clock.advance(0.5)
        for digest in digests:
            assert await digest.flush()
    for digest in digests:  # one more read each, so both hold every push
        assert await digest.flush()
    merged = _exact_quantile(seen, 0.25)  # about 15 ms: the fast replica's median
    local_fast, local_slow = fast.local.value, slow.local.value
    assert local_fast is not None and local_slow is not None
    assert local_fast < 14e6 and local_slow > 30e6  # each replica alone is far from the fleet's
    for estimate in (fast, slow):
        value = estimate.value
        assert value is not None
        assert abs(value - merged) / merged < 0.07, (value, merged)  # within half a bucket
    assert abs(digests[0].samples - 2000) < 20  # every sample of both counted once (a little decay)
    for s in stores:
        await s.aclose()


async def test_pushes_are_batched_one_round_trip_per_interval(server: RedisServer) -> None:
    from stoic import AdaptiveBulkhead
    from stoic.fleet import SharedLatency

    clock = VirtualClock()
    store = store_for(server)
    calls = 0
    real_call = store.call

    async def counting(*args: Any, **kwargs: Any) -> list[Any]:
        nonlocal calls
        calls += 1
        return await real_call(*args, **kwargs)

    store.call = counting  # type: ignore[method-assign]
    digest = SharedLatency(store=store, label=fresh("batch"), interval=1.0, clock=clock)
    bulkhead = AdaptiveBulkhead(latency_threshold=0.5, max_concurrent=50, latency_quantile=0.9, label="aimd",
                                clock=clock, latency_digest=digest)

    async def work() -> None:
        await clock.sleep(0.01)

    for _ in range(5):
        await clock.run(asyncio.gather(*(bulkhead.execute(work) for _ in range(40))))
        await clock.advance(1.0)
        await asyncio.sleep(0.05)  # let the push task run against the real server
    assert 4 <= calls <= 6  # 200 samples, one push per interval, none per call
    # The estimator takes every sample of its warm-up (50 for p90), then one in QUANTILE_STRIDE
    # (stoic._limits), and so does the sketch behind it: about 50 + 150 / 8 = 69, less decay.
    from stoic._limits import QUANTILE_STRIDE
    from stoic._quantile import default_warmup

    warmup = default_warmup(0.9, 200)
    expected = warmup + (200 - warmup) / QUANTILE_STRIDE
    assert 0.85 * expected <= digest.samples <= expected + 1
    await store.aclose()


async def test_a_hedge_follows_the_fleets_latency(server: RedisServer) -> None:
    from stoic import Hedge
    from stoic.fleet import SharedLatency

    label = fresh("hedge")
    clock = VirtualClock()
    here_store, there_store = store_for(server), store_for(server)
    there = SharedLatency(store=there_store, label=label, interval=0.1, clock=clock).estimator(0.5)
    for _ in range(300):
        there.add(80e6)  # the other replica sees 80 ms
    assert await there._digest.flush()
    here = SharedLatency(store=here_store, label=label, interval=0.1, clock=clock)
    policy = Hedge(0.05, label="h", quantile=0.5, latency_digest=here, clock=clock)

    async def quick() -> str:
        await clock.sleep(0.01)
        return "ok"

    for _ in range(30):
        assert await clock.run(policy.execute(stoic.IDEMPOTENT, quick)) == "ok"
        await asyncio.sleep(0.02)  # a due push runs on the real server
    # 300 samples at 80 ms elsewhere, 30 at 10 ms here: the fleet's median is the slow one.
    assert policy.current_delay > 0.07
    await here_store.aclose()
    await there_store.aclose()


async def test_a_dead_store_leaves_the_local_estimate_working(tmp_path: Path) -> None:
    from stoic._quantile import WindowedQuantile
    from stoic.fleet import SharedLatency

    own = RedisServer(tmp_path)
    clock = VirtualClock()
    sink = RecordingSink()
    with stoic.use_sinks(sink):
        store = RedisStore(own.url, budget=0.05, probe_interval=0.2)
        digest = SharedLatency(store=store, label=fresh("dead"), interval=0.1, clock=clock)
        estimate = digest.estimator(0.9, window=200)
        reference = WindowedQuantile(0.9, 200, estimate._warmup)
        for n in range(100):
            estimate.add(float(n) * 1e6)
            reference.add(float(n) * 1e6)
        assert await digest.flush()
        own.kill()
        for n in range(300):
            estimate.add(float(n % 50) * 1e6)
            reference.add(float(n % 50) * 1e6)
            if n % 50 == 0:
                await clock.advance(0.1)
                assert not await digest.flush()
        assert digest.degraded
        assert estimate.value == reference.value  # the replica's own estimate, unchanged
        await store.aclose()
    own.stop()
    assert sink.of("fleet.store_error")


# ---------------------------------------------------------------------------- breaker parity
def test_call_runs_plain_functions_from_threads_and_shares_the_trip(server: RedisServer) -> None:
    import threading

    label = fresh("sync-breaker")
    store = RedisStore(server.url, budget=0.25)
    shared = breaker(store, label, window=CountWindow(8), minimum_calls=8, failure_rate_threshold=1.0,
                     open_duration=OpenDuration.fixed(0.3, jitter=0.0))
    results: list[str] = []
    lock = threading.Lock()

    def quick() -> str:
        return "ok"

    def worker() -> None:
        for _ in range(20):
            value = shared.call(quick)
            with lock:
                results.append(value)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert results == ["ok"] * 160
    assert shared.snapshot.state is BreakerState.CLOSED and shared.snapshot.failures == 0

    def broken() -> None:
        raise ConnectionError("down")

    for _ in range(8):
        with pytest.raises(ConnectionError):
            shared.call(broken)
    with pytest.raises(CircuitOpen) as info:
        shared.call(quick)
    assert info.value.retry_after is not None and 0.2 < info.value.retry_after <= 0.3
    snap = shared.snapshot
    assert (snap.state, snap.calls, snap.failures, snap.failure_rate, snap.trips) == (BreakerState.OPEN, 8, 8, 1.0, 1)

    async def seen_by_an_asyncio_replica() -> None:
        other_store = store_for(server)
        other = breaker(other_store, label)
        with pytest.raises(CircuitOpen):
            await other.execute(ok)
        await other_store.aclose()

    asyncio.run(seen_by_an_asyncio_replica())
    time.sleep(0.35)
    assert shared.call(quick) == "ok"  # the one probe, through the lease; it closes the breaker
    assert shared.state is BreakerState.CLOSED
    with pytest.raises(TypeError, match="plain"):
        shared.call(ok)  # type: ignore[arg-type]
    asyncio_only = breaker(RedisStore(redis.asyncio.Redis.from_url(server.url)), label)
    with pytest.raises(TypeError, match=r"redis\.Redis"):
        asyncio_only.call(quick)


async def test_snapshot_has_the_local_breakers_shape(server: RedisServer) -> None:
    from stoic import BreakerSnapshot

    store = store_for(server)
    shared = breaker(store, fresh("snap"), window=CountWindow(10), minimum_calls=4)
    local = CircuitBreaker(label="snap-local", window=CountWindow(10), minimum_calls=4,
                           open_duration=OpenDuration.fixed(30.0, jitter=0.0))
    for policy in (shared, local):
        for _ in range(3):
            await policy.execute(ok)
        with pytest.raises(ConnectionError):
            await policy.execute(fail)
    a, b = shared.snapshot, local.snapshot
    assert isinstance(a, BreakerSnapshot)
    assert (a.state, a.calls, a.failures, a.slow_calls, a.failure_rate, a.trips, a.retry_after) == (
        b.state, b.calls, b.failures, b.slow_calls, b.failure_rate, b.trips, b.retry_after) == (
        BreakerState.CLOSED, 4, 1, 0, 0.25, 0, None)
    await store.aclose()


async def test_state_changes_streams_what_this_replica_observes(server: RedisServer) -> None:
    label = fresh("stream")
    a_store, b_store = store_for(server), store_for(server)
    a = breaker(a_store, label, open_duration=OpenDuration.fixed(0.2, jitter=0.0), refresh_interval=0.05)
    b = breaker(b_store, label, open_duration=OpenDuration.fixed(0.2, jitter=0.0), refresh_interval=0.05)
    assert await b.execute(ok) == "ok"
    seen: list[BreakerState] = []

    async def consume() -> None:
        async with b.state_changes() as changes:
            async for state in changes:
                seen.append(state)
                if state is BreakerState.CLOSED:
                    return

    consumer = asyncio.create_task(consume())
    await asyncio.sleep(0)
    await trip(a)  # the trip is a's; b sees it at its next refresh
    await asyncio.sleep(0.06)
    with pytest.raises(CircuitOpen):
        await b.execute(ok)
    await asyncio.sleep(0.2)
    assert await b.execute(ok) == "ok"  # b's call is the probe: half-open, then closed
    await asyncio.wait_for(consumer, 2.0)
    assert seen == [BreakerState.OPEN, BreakerState.HALF_OPEN, BreakerState.CLOSED]
    await a_store.aclose()
    await b_store.aclose()


async def test_flush_also_pushes_the_samples_recorded_while_a_push_was_under_way(server: RedisServer) -> None:
    from stoic.fleet import SharedLatency

    store = store_for(server)
    digest = SharedLatency(store=store, label=fresh("flush-late"), interval=10.0, clock=VirtualClock())
    estimate = digest.estimator(0.5)
    estimate.add(80e6)  # the first sample starts a push
    await asyncio.sleep(0)  # which has taken its batch (at once under an eager task factory)
    for _ in range(99):
        estimate.add(80e6)  # not due: counted locally, for the next push
    assert await digest.flush()
    assert abs(digest.samples - 100) < 1
    await store.aclose()


async def test_flushes_at_once_share_one_push_and_a_cancelled_flush_still_delivers_its_batch(
    server: RedisServer,
) -> None:
    from stoic.fleet import SharedLatency

    store = store_for(server)
    pushes: list[int] = []
    call = store.call

    async def counted(script: str, keys: Any, args: Any) -> Any:
        if script == "latency_push":
            pushes.append(len(args))
        return await call(script, keys, args)

    store.call = counted  # type: ignore[method-assign]
    digest = SharedLatency(store=store, label=fresh("flushes"), interval=10.0, clock=VirtualClock())
    estimate = digest.estimator(0.5)
    assert await digest.flush()  # the first contact, with nothing to push
    pushes.clear()
    for _ in range(50):
        estimate.add(80e6)  # not due (interval 10 s on a still clock): counted locally
    assert await asyncio.gather(digest.flush(), digest.flush(), digest.flush()) == [True, True, True]
    assert len(pushes) == 1  # the later two waited for the first one's push: nothing was left
    assert abs(digest.samples - 50) < 1
    for _ in range(25):
        estimate.add(80e6)
    flushing = asyncio.create_task(digest.flush())
    await asyncio.sleep(0)  # its push has taken the batch
    flushing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await flushing
    assert await digest.flush()  # waits for the cancelled flush's push if it is still going on
    # That push delivered the 25 samples (one bucket: 2 + 2 arguments); a push after it, if it
    # had ended first, carried none.
    assert pushes[1] == 4 and all(n == 2 for n in pushes[2:]), pushes
    assert abs(digest.samples - 75) < 1
    await store.aclose()


async def test_old_latencies_age_out_and_the_sketch_is_rescaled(
    server: RedisServer, raw: redis.asyncio.Redis,
) -> None:
    from stoic.fleet import SharedLatency

    store = store_for(server)
    digest = SharedLatency(store=store, label=fresh("decay"), interval=0.01, half_life=0.01)
    estimate = digest.estimator(0.5, window=1000)
    for _ in range(200):
        estimate.add(80e6)
    assert await digest.flush()
    key = store.keys(digest.label, "latency")[0]
    assert 0 < await raw.pttl(key) <= 1100  # 10 half-lives (0.1 s) + 1 s
    # 40 half-lives of server time later the slow samples weigh 2**-40: the next push rescales
    # the sketch to a new landmark and drops their bucket.
    await asyncio.sleep(0.4)
    for _ in range(50):
        estimate.add(5e6)
    assert await digest.flush()
    value = digest.quantile(0.99)
    assert value is not None and 4.5e6 < value < 5.5e6
    fields = await raw.hkeys(key)
    assert sorted(fields) == [b"97", b"L", b"T"]  # the landmark, the last push and the fast bucket
    assert 45 < digest.samples <= 50
    await store.aclose()


def test_a_thread_pushes_inline_on_a_sync_store(server: RedisServer) -> None:
    from stoic.fleet import SharedLatency

    store = RedisStore(redis.Redis.from_url(server.url), budget=0.25)
    label = fresh("sync-latency")
    digest = SharedLatency(store=store, label=label, interval=0.05)
    estimate = digest.estimator(0.5, window=100)
    for _ in range(30):
        estimate.add(20e6)  # the first sample pushes at once, from this thread (no loop running)
    time.sleep(0.06)
    estimate.add(20e6)  # due again: pushes the other 30 and reads the sum back
    assert 30 <= digest.samples <= 31
    assert digest.flush_blocking()
    value = estimate.value
    assert value is not None and 18e6 < value < 22e6


def _waiting_in(thread: threading.Thread, function: str) -> bool:
    """Whether ``thread`` is blocked on a ``threading`` primitive inside a call of ``function``."""
    frame = sys._current_frames().get(thread.ident or -1)
    if frame is None or not frame.f_code.co_filename.endswith("threading.py"):
        return False
    while frame is not None:
        if frame.f_code.co_name == function:
            return True
        frame = frame.f_back
    return False


def test_blocking_flushes_at_once_from_many_threads_share_one_push(server: RedisServer) -> None:
    # Seen failing before the fix: flush_blocking did not wait for a push under way, as flush()
    # does, so each of the threads below pushed on its own, while the first push (held here)
    # was still carrying the 50 samples: their reads came back without them (0 samples) and
    # they returned True all the same, the first to end cleared the busy mark of the ones
    # still pushing, and every flush cost a round trip. Now a flush arriving while a push is
    # under way waits for it, then pushes only if counts were recorded after that push took
    # its batch: one push, every flusher sees the 50 samples, none sent twice or lost.
    from stoic.fleet import SharedLatency

    store = RedisStore(redis.Redis.from_url(server.url), budget=0.25)
    digest = SharedLatency(store=store, label=fresh("flush-threads"), interval=3600.0, half_life=3600.0,
                           clock=VirtualClock())
    estimate = digest.estimator(0.5)
    assert digest.flush_blocking()  # the first contact, with nothing to push
    pushes: list[int] = []
    first_push_holds = threading.Event()
    release = threading.Event()
    call_blocking = store.call_blocking

    def counted(script: str, keys: Any, args: Any) -> Any:
        if script == "latency_push":
            pushes.append(len(args))
            if len(pushes) == 1:
                first_push_holds.set()
                assert release.wait(10)
        return call_blocking(script, keys, args)

    store.call_blocking = counted  # type: ignore[method-assign]
    for _ in range(50):
        estimate.add(80e6)  # not due (interval 1 h on a still clock): counted locally
    seen: dict[int, tuple[bool, float]] = {}

    def flush(n: int) -> None:
        seen[n] = (digest.flush_blocking(), digest.samples)

    first = threading.Thread(target=flush, args=(0,), daemon=True)
    first.start()
    assert first_push_holds.wait(10)  # its push has taken the 50 samples and is under way
    others = [threading.Thread(target=flush, args=(n,), daemon=True) for n in range(1, 9)]
    for thread in others:
        thread.start()
    try:
        # Until every other flush has either returned or is waiting for the first one's push.
        eventually(lambda: all(not t.is_alive() or _waiting_in(t, "flush_blocking") for t in others))
    finally:
        release.set()
        for thread in [first, *others]:
            thread.join(10)
    assert all(not t.is_alive() for t in [first, *others])
    assert len(pushes) == 1 and pushes[0] == 4, pushes  # one push: one bucket (2 + 2 arguments)
    assert sorted(seen) == list(range(9))
    assert all(answered and abs(samples - 50) < 1 for answered, samples in seen.values()), seen
    assert abs(digest.samples - 50) < 1


def test_threads_recording_and_flushing_at_once_send_every_count_once(server: RedisServer) -> None:
    # Inline pushes (a sample finding the interval due) and flushes from many threads at once:
    # whichever push carries a count, the fleet's sketch ends up with every count exactly once.
    from stoic.fleet import SharedLatency

    store = RedisStore(redis.Redis.from_url(server.url), budget=0.25)
    digest = SharedLatency(store=store, label=fresh("record-threads"), interval=0.002, half_life=3600.0)
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for i in range(200):
                digest.record(float(1_000_000 * (1 + n)))  # (the sketch's side of estimator.add)
                if i % 50 == n % 50:
                    digest.flush_blocking()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,), daemon=True) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == [] and all(not t.is_alive() for t in threads)
    assert digest.flush_blocking()
    assert not digest.degraded
    assert abs(digest.samples - 1600) < 1, digest.samples  # (half-life 1 h: a few seconds decay ~0.3)


async def test_an_async_flush_waits_for_a_push_under_way_on_the_sync_client(server: RedisServer) -> None:
    # Seen failing before the fix: on a store built from a URL (both clients), flush() waited
    # only for a push task of its own loop, not for a push on the sync client in another thread
    # (a flush_blocking, a sample's inline push) still carrying counts recorded before the
    # flush was called: it pushed nothing new, read a sketch without them and returned True.
    # Now it waits for that push, as flush_blocking does, and returns what it read.
    from stoic.fleet import SharedLatency

    store = RedisStore(server.url, budget=0.25)
    digest = SharedLatency(store=store, label=fresh("flush-mixed"), interval=3600.0, half_life=3600.0,
                           clock=VirtualClock())
    assert await digest.flush()  # the first contact, with nothing to push
    holds, release = threading.Event(), threading.Event()
    call_blocking = store.call_blocking
    pushes: list[str] = []

    def held(script: str, keys: Any, args: Any) -> Any:
        pushes.append(script)
        holds.set()
        assert release.wait(10)
        return call_blocking(script, keys, args)

    store.call_blocking = held  # type: ignore[method-assign]
    for _ in range(50):
        digest.record(80e6)  # not due (interval 1 h on a still clock): counted locally
    pusher = threading.Thread(target=digest.flush_blocking, daemon=True)
    pusher.start()
    assert await asyncio.to_thread(holds.wait, 10)  # its push has taken the 50 samples

    async def flush() -> tuple[bool, float]:
        return await digest.flush(), digest.samples

    flushing = asyncio.create_task(flush())
    try:
        await asyncio.wait({flushing}, timeout=0.2)  # (it waits for the sync push, or it has read)
    finally:
        release.set()
    answered, samples = await flushing
    await asyncio.to_thread(pusher.join, 10)
    assert not pusher.is_alive() and pushes == ["latency_push"]
    assert answered and abs(samples - 50) < 1, (answered, samples)
    await store.aclose()


def test_a_blocking_flush_waits_for_a_push_task_under_way_on_another_threads_loop(server: RedisServer) -> None:
    # Seen failing before the fix: flush_blocking() waited only for a push on the sync client,
    # not for a push task under way on an event loop in another thread (a flush(), a sample's
    # background push) still carrying counts recorded before it was called: it pushed nothing
    # new on the sync client, read a sketch without them and returned True all the same.
    from stoic.fleet import SharedLatency

    store = RedisStore(server.url, budget=0.25)
    digest = SharedLatency(store=store, label=fresh("flush-blocking-mixed"), interval=3600.0, half_life=3600.0,
                           clock=VirtualClock())
    holds, release = threading.Event(), threading.Event()
    call = store.call
    pushes: list[str] = []

    async def held(script: str, keys: Any, args: Any, **kwargs: Any) -> Any:
        pushes.append(script)
        holds.set()
        assert await asyncio.to_thread(release.wait, 10)
        return await call(script, keys, args, **kwargs)

    for _ in range(50):
        digest.record(80e6)  # no loop and the interval not due: counted locally (one inline contact first)
    store.call = held  # type: ignore[method-assign]
    flushed: list[bool] = []

    async def flush() -> None:
        flushed.append(await digest.flush())
        await store.aclose()

    looping = threading.Thread(target=asyncio.run, args=(flush(),), daemon=True)
    looping.start()
    assert holds.wait(10)  # the loop's push task has taken the 50 samples
    seen: list[tuple[bool, float]] = []
    blocking = threading.Thread(target=lambda: seen.append((digest.flush_blocking(), digest.samples)), daemon=True)
    blocking.start()
    try:
        blocking.join(0.2)  # (it waits for the push task, or it has read)
    finally:
        release.set()
    blocking.join(10)
    looping.join(10)
    assert not blocking.is_alive() and not looping.is_alive()
    assert flushed == [True] and pushes == ["latency_push"]
    assert seen and seen[0][0] and abs(seen[0][1] - 50) < 1, seen
