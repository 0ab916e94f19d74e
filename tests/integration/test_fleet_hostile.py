"""A hostile production user's review of stoic.fleet on a real redis-server: leases and
permits must not be leaked by a caller's cancellation."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from redis_harness import RedisServer, fresh

from stoic import CircuitOpen, OpenDuration
from stoic.breaker import BreakerState, CountWindow
from stoic.fleet import RedisStore, SharedCircuitBreaker

pytestmark = pytest.mark.integration

def breaker(store: RedisStore, label: str, **kwargs: Any) -> SharedCircuitBreaker:
    return SharedCircuitBreaker(label=label, store=store, window=CountWindow(4), minimum_calls=4,
                                open_duration=OpenDuration.fixed(0.2, jitter=0.0), refresh_interval=0.05,
                                **kwargs)


async def fail() -> None:
    raise ConnectionError("the dependency is down")


async def ok() -> str:
    return "ok"


async def trip(shared: SharedCircuitBreaker) -> None:
    for _ in range(4):
        with pytest.raises(ConnectionError):
            await shared.execute(fail)
    assert shared.state is BreakerState.OPEN


def slow_replies_to(store: RedisStore, script: str, gate: asyncio.Event) -> list[str]:
    """Hold back the replies of ``script`` (already run by the server) until ``gate`` is set:
    a slow network between Redis and this replica. Returns the list of held calls."""
    sha = store._scripts[script].sha
    roundtrip = store._roundtrip
    held: list[str] = []

    async def slow(command: tuple[Any, ...], repeat: bool) -> Any:
        reply = await roundtrip(command, repeat)
        if command[1] == sha:
            held.append(script)
            await gate.wait()
        return reply

    store._roundtrip = slow  # type: ignore[method-assign]
    return held


async def test_a_probe_cancelled_before_its_lease_reply_arrived_gives_the_lease_back(server: RedisServer) -> None:
    label = fresh("probe-cancel")
    store, other_store = RedisStore(server.url, budget=2.0), RedisStore(server.url, budget=2.0)
    shared, other = breaker(store, label), breaker(other_store, label)
    await trip(shared)
    await asyncio.sleep(0.25)  # the open period is over: the next call probes
    held = slow_replies_to(store, "breaker_probe", asyncio.Event())
    probing = asyncio.create_task(shared.execute(ok))
    while not held:
        await asyncio.sleep(0.005)
    probing.cancel()  # the server granted the lease; its reply never reached the caller
    with pytest.raises(asyncio.CancelledError):
        await probing
    # The fleet's one probe lease must be free again: another replica probes (and closes it),
    # instead of being refused until half_open_timeout (60 s) expires the lease as a failure.
    assert await other.execute(ok) == "ok"
    assert other.state is BreakerState.CLOSED
    await store.aclose()
    await other_store.aclose()


async def test_a_probe_cancelled_before_its_report_was_sent_still_reports(server: RedisServer) -> None:
    label = fresh("done-cancel")
    store, other_store = RedisStore(server.url, budget=2.0), RedisStore(server.url, budget=2.0)
    shared, other = breaker(store, label), breaker(other_store, label)
    await trip(shared)
    await asyncio.sleep(0.25)
    sha = store._scripts["breaker_done"].sha
    roundtrip = store._roundtrip
    held = asyncio.Event()

    async def stalled(command: tuple[Any, ...], repeat: bool) -> Any:
        if command[1] == sha and not held.is_set():
            held.set()
            await asyncio.Event().wait()  # the first report never leaves this replica
        return await roundtrip(command, repeat)

    store._roundtrip = stalled  # type: ignore[method-assign]
    probing = asyncio.create_task(shared.execute(ok))
    await held.wait()  # the probe succeeded; its report is stuck
    probing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await probing
    await asyncio.sleep(0.1)  # past the other replica's refresh interval
    # The probe's success reached the store: the breaker is closed for the whole fleet.
    assert await other.execute(ok) == "ok"
    assert other.state is BreakerState.CLOSED
    await store.aclose()
    await other_store.aclose()


def test_the_blocking_shared_limiter_queues_no_more_threads_than_queue_limit(server: RedisServer) -> None:
    import threading

    from stoic import RateLimited
    from stoic.fleet import BlockingSharedRateLimiter, SharedRateLimiter

    label = fresh("queue")
    limiter = BlockingSharedRateLimiter(1, 0.5, queue_limit=1, store=RedisStore(server.url, budget=0.5), label=label)
    assert limiter.try_acquire()  # the bucket is empty now: the next permit in 0.5 s
    first = threading.Thread(target=limiter.acquire)
    first.start()
    while limiter.waiter_count == 0:
        time.sleep(0.005)
    time.sleep(0.05)  # the first thread was refused with a wait: it sleeps in the queue
    with pytest.raises(RateLimited):  # queue_limit=1: a second waiting thread is one too many
        limiter.acquire()
    first.join(5)

    async def the_asyncio_twin() -> None:  # what the asyncio limiter does in the same spot
        twin = SharedRateLimiter(1, 0.5, queue_limit=1, store=RedisStore(server.url, budget=0.5),
                                 label=fresh("queue"))
        assert await twin.try_acquire()
        waiting = asyncio.create_task(twin.acquire())
        while twin.waiter_count == 0:
            await asyncio.sleep(0.005)
        with pytest.raises(RateLimited):
            await twin.acquire()
        await waiting

    asyncio.run(the_asyncio_twin())


async def test_a_trip_whose_caller_is_cancelled_while_reporting_it_still_opens_the_fleets_breaker(
    server: RedisServer,
) -> None:
    label = fresh("trip-cancel")
    store, other_store = RedisStore(server.url, budget=2.0), RedisStore(server.url, budget=2.0)
    shared, other = breaker(store, label), breaker(other_store, label)
    assert await other.execute(ok) == "ok"
    sha = store._scripts["breaker_trip"].sha
    roundtrip = store._roundtrip
    stalled = asyncio.Event()
    release = asyncio.Event()

    async def slow_trip(command: tuple[Any, ...], repeat: bool) -> Any:
        if command[1] == sha:
            stalled.set()
            await release.wait()  # a slow link: the trip is still on its way
        return await roundtrip(command, repeat)

    store._roundtrip = slow_trip  # type: ignore[method-assign]
    for _ in range(3):
        with pytest.raises(ConnectionError):
            await shared.execute(fail)
    fourth = asyncio.create_task(shared.execute(fail))  # trips this replica's window
    await stalled.wait()
    fourth.cancel()  # the request's deadline, say: the trip it was reporting must still land
    with pytest.raises((asyncio.CancelledError, ConnectionError)):
        await fourth
    release.set()
    await asyncio.sleep(0.1)  # the other replica's refresh interval
    with pytest.raises(CircuitOpen):
        await other.execute(ok)
    await store.aclose()
    await other_store.aclose()


async def test_the_fleets_kill_switch_survives_a_redis_restarted_without_its_data(tmp_path) -> None:
    own = RedisServer(tmp_path)
    try:
        label = fresh("switch")
        store, other_store = (RedisStore(own.url, budget=0.2, probe_interval=0.1) for _ in range(2))
        switched, other = breaker(store, label), breaker(other_store, label)
        await switched.force_open()
        own.kill()
        own.start()  # empty: nothing is persisted
        deadline = time.monotonic() + 5.0
        refusals = 0
        while refusals < 3 or switched.degraded:  # through the outage, then on the restarted store
            await asyncio.sleep(0.06)
            with pytest.raises(CircuitOpen):
                await switched.execute(ok)
            refusals += 1
            assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
        with pytest.raises(CircuitOpen) as info:
            await other.execute(ok)  # a replica that never forced anything sees the switch again
        assert info.value.retry_after is None
        await switched.force_closed()
        await asyncio.sleep(0.1)
        assert await other.execute(ok) == "ok"
        await store.aclose()
        await other_store.aclose()
    finally:
        own.stop()


async def test_a_probe_whose_lease_reply_came_after_the_budget_gives_the_lease_back_at_the_next_contact(
    server: RedisServer,
) -> None:
    label = fresh("probe-late")
    store = RedisStore(server.url, budget=0.2, probe_interval=0.2)
    other_store = RedisStore(server.url, budget=0.5)
    shared, other = breaker(store, label), breaker(other_store, label)
    await trip(shared)
    await asyncio.sleep(0.25)  # the open period is over: the next call probes
    sha = store._scripts["breaker_probe"].sha
    roundtrip = store._roundtrip
    late = [True]  # only the first probe's reply is late

    async def slow(command: tuple[Any, ...], repeat: bool) -> Any:
        reply = await roundtrip(command, repeat)
        if command[1] == sha and late:
            late.clear()
            await asyncio.sleep(1.0)  # the lease was granted; its reply misses the 0.2 s budget
        return reply

    store._roundtrip = slow  # type: ignore[method-assign]
    assert await shared.execute(ok) == "ok"  # the store failed: the local fallback decided
    assert shared.degraded
    await asyncio.sleep(0.25)  # the store's rest (probe_interval) is over
    await shared.refresh()  # the next contact: the orphaned lease goes back
    assert not shared.degraded
    # The fleet's probe is free: another replica probes and closes the breaker, instead of being
    # refused until half_open_timeout (60 s) expires the lease as a failed probe.
    assert await other.execute(ok) == "ok"
    assert other.state is BreakerState.CLOSED
    await store.aclose()
    await other_store.aclose()


def end_open_period(server: RedisServer, label: str) -> None:
    """Move the shared open period's end into the past (no real wait for it)."""
    import redis

    raw = redis.Redis.from_url(server.url)
    raw.hset(f"{{stoic:{label}}}:breaker", "un", 1)
    raw.close()


def fail_once(store: RedisStore, script: str) -> list[str]:
    """The first ``script`` call dies before it reaches the server (a connection reset)."""
    import redis

    sha = store._scripts[script].sha
    roundtrip = store._roundtrip
    failed: list[str] = []

    async def dying(command: tuple[Any, ...], repeat: bool) -> Any:
        if command[1] == sha and not failed:
            failed.append(script)
            raise redis.exceptions.ConnectionError("connection reset by peer")
        return await roundtrip(command, repeat)

    store._roundtrip = dying  # type: ignore[method-assign]
    return failed


@pytest.mark.parametrize(("outcome", "closed"), [("ok", True), ("failed", False)])
async def test_a_probe_whose_report_got_no_answer_is_reported_at_the_next_contact(
    server: RedisServer, outcome: str, closed: bool,
) -> None:
    from stoic.testing import VirtualClock

    label = fresh("done-lost")
    clock = VirtualClock()
    store = RedisStore(server.url, budget=0.5, probe_interval=1.0, clock=clock)
    other_store = RedisStore(server.url, budget=0.5)
    shared, other = breaker(store, label, clock=clock), breaker(other_store, label)
    await trip(shared)
    end_open_period(server, label)
    await clock.advance(0.25)  # this replica's copy of the open period is over too
    failed = fail_once(store, "breaker_done")
    if outcome == "ok":
        assert await shared.execute(ok) == "ok"  # the probe succeeded; its report was lost
    else:
        with pytest.raises(ConnectionError):
            await shared.execute(fail)
    assert failed and shared.degraded
    await clock.advance(1.0)  # the store's rest is over
    await shared.refresh()  # the next contact: the probe's outcome is reported now
    assert not shared.degraded
    # The fleet's one probe lease is not held until half_open_timeout (60 s) expires it as a
    # failed probe: the outcome the probe found decides, for every replica.
    if closed:
        assert await other.execute(ok) == "ok"
        assert other.state is BreakerState.CLOSED and shared.state is BreakerState.CLOSED
    else:
        with pytest.raises(CircuitOpen) as info:
            await other.execute(ok)
        assert info.value.retry_after is not None  # re-opened (probe_failed), not wedged half-open
        assert shared.trips == 2
    await store.aclose()
    await other_store.aclose()


async def test_a_forced_open_carries_the_evidence_of_this_replicas_window_as_the_local_breakers_does(
    server: RedisServer,
) -> None:
    from stoic import CircuitBreaker, use_sinks
    from stoic.testing import RecordingSink

    sink = RecordingSink()
    store = RedisStore(server.url, budget=0.5)
    shared = breaker(store, fresh("forced"))
    local = CircuitBreaker(label="local", window=CountWindow(4), minimum_calls=4)
    with use_sinks(sink):
        for policy in (shared, local):
            for _ in range(2):
                assert await policy.execute(ok) == "ok"
            with pytest.raises(ConnectionError):
                await policy.execute(fail)
        await shared.force_open()
        local.force_open()
    opened = {e.label: dict(e.attributes) for e in sink.of("breaker.opened")}
    assert opened[shared.label] == opened["local"] == {
        "trigger": "forced", "calls": 3, "failures": 1, "slow_calls": 0, "trips": 0}
    for field in ("state", "calls", "failures", "slow_calls", "failure_rate", "retry_after"):
        assert getattr(shared.snapshot, field) == getattr(local.snapshot, field), field
    sink.assert_contract()
    await shared.force_closed()
    await store.aclose()


async def test_more_concurrent_decisions_than_the_pool_has_connections_wait_for_one_instead_of_failing_open(
    server: RedisServer,
) -> None:
    # redis-py's pool holds at most 100 connections by default: the 101st concurrent store call
    # must wait (within the budget) for one of the store's own, not be taken for an outage that
    # rests the whole store and turns every policy on it local (a half-open breaker's fallback
    # admitting every call to the recovering dependency, a fleet's limit becoming N x rate).
    from stoic import use_sinks
    from stoic.fleet import SharedRateLimiter
    from stoic.testing import RecordingSink

    sink = RecordingSink()
    store = RedisStore(server.url, budget=5.0)
    limiters = [SharedRateLimiter(100_000, 1.0, store=store, label=fresh("many")) for _ in range(3)]
    breakers = [breaker(store, fresh("many")) for _ in range(3)]

    async def one(n: int) -> str:
        assert await limiters[n % 3].try_acquire()
        return await breakers[n % 3].execute(ok)

    with use_sinks(sink):
        for _ in range(2):
            assert await asyncio.gather(*(one(n) for n in range(300))) == ["ok"] * 300
    assert not sink.of("fleet.store_error") and not sink.of("fleet.fail_open")
    assert store.health.state is BreakerState.CLOSED
    pool = store.client.connection_pool
    assert len(store._idle) <= pool.max_connections
    await store.aclose()


async def test_calls_waiting_for_a_connection_are_served_and_leave_none_behind_when_cancelled(
    server: RedisServer,
) -> None:
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(server.url, max_connections=2)
    store = RedisStore(client, budget=5.0)
    limiter_label = fresh("few")
    from stoic.fleet import SharedRateLimiter

    limiter = SharedRateLimiter(100_000, 1.0, store=store, label=limiter_label)
    gate = asyncio.Event()
    pool = client.connection_pool
    get_connection = pool.get_connection

    async def slow_connection() -> Any:  # every reply is held until the gate opens
        conn = await get_connection()
        read = conn.read_response

        async def held(*args: Any, **kwargs: Any) -> Any:
            reply = await read(*args, **kwargs)
            await gate.wait()
            return reply

        conn.read_response = held
        return conn

    pool.get_connection = slow_connection  # type: ignore[method-assign]
    tasks = [asyncio.create_task(limiter.try_acquire()) for _ in range(50)]
    await asyncio.sleep(0.05)
    assert len(store._wanting) == 48  # two calls hold the pool's two connections
    for task in tasks[10:20]:
        task.cancel()  # callers that leave while they wait take nothing with them
    gate.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert results[:10] + results[20:] == [True] * 40
    assert all(isinstance(r, asyncio.CancelledError) for r in results[10:20])
    assert not store._wanting and len(store._idle) == store._held == 2
    assert store.health.state is BreakerState.CLOSED
    await store.aclose()
    await client.aclose()


@pytest.mark.parametrize("trigger", ["probe_failed", "probe_slow"])
async def test_a_failed_probe_opens_with_the_episodes_evidence_as_the_local_breakers_does(
    server: RedisServer, trigger: str,
) -> None:
    from stoic import CircuitBreaker, use_sinks
    from stoic.testing import RecordingSink, VirtualClock

    clock = VirtualClock()
    sink = RecordingSink()
    store = RedisStore(server.url, budget=0.5, clock=clock)
    label = fresh("probe-evidence")
    shared = breaker(store, label, clock=clock, half_open_probes=2)
    local = CircuitBreaker(label="local", window=CountWindow(4), minimum_calls=4, half_open_probes=2,
                           open_duration=OpenDuration.fixed(0.2, jitter=0.0), clock=clock)

    async def bad() -> None:
        if trigger == "probe_slow":
            await clock.advance(11.0)  # past slow_call_duration (10 s) on the breakers' clock
        else:
            raise ConnectionError("still down")

    for policy in (shared, local):
        await trip(policy)  # type: ignore[arg-type]
    end_open_period(server, label)
    await clock.advance(0.25)
    snapshots = []
    with use_sinks(sink):
        for policy in (shared, local):
            assert await policy.execute(ok) == "ok"  # the first probe succeeds
            try:
                await policy.execute(bad)  # the second does not
            except ConnectionError:
                pass
            snapshots.append(policy.snapshot)
    opened = {e.label: dict(e.attributes) for e in sink.of("breaker.opened")}
    assert opened[label].pop("open_for") == opened["local"].pop("open_for") == 0.2
    assert opened[label] == opened["local"] == {
        "trigger": trigger, "calls": 2, "failures": int(trigger == "probe_failed"),
        "slow_calls": int(trigger == "probe_slow"), "trips": 2}
    for field in ("state", "calls", "failures", "slow_calls", "trips"):
        assert getattr(snapshots[0], field) == getattr(snapshots[1], field), field
    sink.assert_contract()
    await store.aclose()


def test_more_threads_deciding_at_once_than_the_sync_pool_has_connections_wait_for_one(server: RedisServer) -> None:
    # The thread twin of the asyncio case: a store built from a URL gives its sync client a pool
    # of 100 connections (redis-py's default); the 101st thread deciding at once waits for one,
    # within the budget, instead of being taken for an outage that rests the whole store.
    import contextvars
    import threading

    from stoic import use_sinks
    from stoic.fleet import BlockingSharedRateLimiter
    from stoic.testing import RecordingSink

    sink = RecordingSink()
    store = RedisStore(server.url, budget=5.0)
    limiter = BlockingSharedRateLimiter(100_000, 1.0, store=store, label=fresh("threads"))
    pool = store.sync_client.connection_pool
    get_connection = pool.get_connection
    reading = threading.Barrier(100, timeout=10)  # the replies come once 100 connections are in use
    served = threading.Event()

    def slow_connection(*args: Any, **kwargs: Any) -> Any:
        conn = get_connection(*args, **kwargs)
        read = conn.read_response

        def held(*args: Any, **kwargs: Any) -> Any:
            reply = read(*args, **kwargs)
            if not served.is_set():
                try:
                    reading.wait()
                except threading.BrokenBarrierError:
                    pass
                served.set()
            return reply

        conn.read_response = held
        return conn

    pool.get_connection = slow_connection  # type: ignore[method-assign]
    results: list[bool] = []

    def decide() -> None:
        results.append(limiter.try_acquire())

    with use_sinks(sink):
        threads = [threading.Thread(target=contextvars.copy_context().run, args=(decide,)) for _ in range(150)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(20)
    assert results == [True] * 150
    assert not sink.of("fleet.store_error") and not sink.of("fleet.fail_open")
    assert store.health.state is BreakerState.CLOSED


@pytest.mark.parametrize("operation", ["force_open", "force_closed", "reset"])
async def test_a_manual_control_that_could_not_reach_the_store_changes_nothing_on_this_replica(
    server: RedisServer, operation: str,
) -> None:
    # force_open changed the fallback breaker before asking the store: when the store could not
    # be reached it raised StoreError, yet this replica's fallback stayed forced open (refusing
    # every call through the outage) without the switch being this replica's to throw again.
    # force_closed and reset likewise closed the fallback and dropped the switch this replica
    # throws again on an emptied store. A failed call must leave this replica as it was.
    import redis

    from stoic.fleet import StoreError
    from stoic.testing import VirtualClock

    label = fresh(f"control-lost-{operation}")
    clock = VirtualClock()
    store = RedisStore(server.url, budget=0.5, probe_interval=1.0, clock=clock)
    shared = breaker(store, label, clock=clock)
    assert await shared.execute(ok) == "ok"
    switched = operation != "force_open"  # force_closed and reset are tried on a thrown switch
    if switched:
        await shared.force_open()
    fallback_before = shared.fallback.snapshot
    failed = fail_once(store, "breaker_force")
    with pytest.raises(StoreError):
        await getattr(shared, operation)()
    assert failed and shared.degraded
    assert shared.fallback.snapshot == fallback_before  # the fallback as it was
    if switched:
        with pytest.raises(CircuitOpen) as info:
            await shared.execute(ok)  # through the outage, the switch still holds here
        assert info.value.retry_after is None
    else:
        assert await shared.execute(ok) == "ok"  # the fallback, not forced open, decides
    await clock.advance(1.0)  # the store's rest is over
    raw = redis.Redis.from_url(server.url)
    raw.delete(f"{{stoic:{label}}}:breaker")  # a Redis restarted without its data
    raw.close()
    await shared.refresh()  # the replica that threw the switch throws it again
    assert not shared.degraded
    other_store = RedisStore(server.url, budget=0.5)
    other = breaker(other_store, label)
    if switched:
        with pytest.raises(CircuitOpen):
            await other.execute(ok)
        await shared.force_closed()
    else:
        assert await other.execute(ok) == "ok"
        await trip(breaker(other_store, label))  # (a third replica: a window of its own)
        await shared.refresh()
        # A trip made elsewhere carries no evidence of this replica's window (the forced open
        # that would have kept it never happened).
        assert shared.state is BreakerState.OPEN and shared.snapshot.calls == 0
    await store.aclose()
    await other_store.aclose()


@pytest.mark.parametrize(("left", "lifting"), [("reset", "force_closed"), ("force_closed", "reset")])
async def test_two_manual_controls_at_once_leave_this_replica_as_the_store_was_left(
    server: RedisServer, left: str, lifting: str,
) -> None:
    # Two lifts of this replica's switch at once, the first called left before it reached the
    # store (cancelled), the second taken by the store: each cleared the switch this replica
    # throws again on an emptied store, and the first, ending last, put back the value it had
    # seen (thrown), though the second had lifted the switch fleet-wide. An emptied store then
    # got the lifted switch thrown again. Manual controls run one at a time, in call order.
    import redis

    label = fresh(f"controls-{left}")
    store = RedisStore(server.url, budget=0.5)
    shared = breaker(store, label)
    assert await shared.execute(ok) == "ok"
    await shared.force_open()
    sha = store._scripts["breaker_force"].sha
    roundtrip = store._roundtrip
    held = asyncio.Event()

    async def stalled(command: tuple[Any, ...], repeat: bool) -> Any:
        if command[1] == sha and not held.is_set():
            held.set()
            await asyncio.Event().wait()  # the first control never leaves this replica
        return await roundtrip(command, repeat)

    store._roundtrip = stalled  # type: ignore[method-assign]
    first = asyncio.create_task(getattr(shared, left)())
    await held.wait()
    second = asyncio.create_task(getattr(shared, lifting)())
    await asyncio.wait({second}, timeout=0.2)  # (it waits for the first, or it has run)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    await second  # taken by the store
    assert shared.state is BreakerState.CLOSED
    assert shared.fallback.state is BreakerState.CLOSED
    raw = redis.Redis.from_url(server.url)
    raw.delete(f"{{stoic:{label}}}:breaker")  # a Redis restarted without its data
    raw.close()
    await shared.refresh()  # the switch was lifted: nobody throws it again
    other_store = RedisStore(server.url, budget=0.5)
    assert await breaker(other_store, label).execute(ok) == "ok"
    assert shared.state is BreakerState.CLOSED
    await store.aclose()
    await other_store.aclose()


async def test_a_switch_thrown_again_waits_its_turn_with_a_lift_on_this_replica(server: RedisServer) -> None:
    # The switch this replica threw, found lost with the store's data by a refresh, is thrown
    # again; force_closed() on this replica meanwhile was taken by the store first, then the
    # throw landed on top: force_closed() returned, the fallback closed and the switch was no
    # longer this replica's, yet the whole fleet stayed forced open. The throw now runs in turn
    # with this replica's manual controls, and only while the switch is still thrown.
    import redis

    label = fresh("rethrow-lift")
    store = RedisStore(server.url, budget=0.5)
    shared = breaker(store, label)
    assert await shared.execute(ok) == "ok"
    await shared.force_open()
    raw = redis.Redis.from_url(server.url)
    raw.delete(f"{{stoic:{label}}}:breaker")  # a Redis restarted without its data
    sha = store._scripts["breaker_force"].sha
    roundtrip = store._roundtrip
    held, release = asyncio.Event(), asyncio.Event()

    async def slow(command: tuple[Any, ...], repeat: bool) -> Any:
        if command[1] == sha and not held.is_set():
            held.set()
            await release.wait()  # the throw is slow to leave this replica
        return await roundtrip(command, repeat)

    store._roundtrip = slow  # type: ignore[method-assign]
    refreshing = asyncio.create_task(shared.refresh())  # finds the state empty: throws again
    await held.wait()
    lifting = asyncio.create_task(shared.force_closed())
    await asyncio.wait({lifting}, timeout=0.2)  # (it waits for the throw, or it has run)
    release.set()
    await refreshing
    await lifting
    await shared.refresh()
    assert shared.state is BreakerState.CLOSED and shared.fallback.state is BreakerState.CLOSED
    other_store = RedisStore(server.url, budget=0.5)
    assert await breaker(other_store, label).execute(ok) == "ok"  # the fleet is not forced open
    raw.close()
    await store.aclose()
    await other_store.aclose()


async def test_a_switch_lifted_on_another_replica_no_longer_holds_here_through_an_outage(
    server: RedisServer,
) -> None:
    # The replica that threw the switch forced its fallback open with it (so the switch holds
    # here through an outage); when another replica lifted the switch, this one's next read
    # dropped the switch as no longer its own, but left the fallback forced open: through the
    # next store outage it refused every call, long after the fleet's breaker had closed.
    from stoic.testing import VirtualClock

    label = fresh("lifted-elsewhere")
    clock = VirtualClock()
    store = RedisStore(server.url, budget=0.5, probe_interval=1.0, clock=clock)
    other_store = RedisStore(server.url, budget=0.5)
    shared, other = breaker(store, label, clock=clock), breaker(other_store, label)
    assert await shared.execute(ok) == "ok"
    await shared.force_open()
    await other.force_closed()  # lifted on another replica
    await shared.refresh()
    assert shared.state is BreakerState.CLOSED
    assert shared.fallback.state is BreakerState.CLOSED
    await clock.advance(0.1)  # the copy is due
    failed = fail_once(store, "breaker_refresh")
    assert await shared.execute(ok) == "ok"  # the store cannot be used: the fallback decides
    assert failed and shared.degraded
    await store.aclose()
    await other_store.aclose()
