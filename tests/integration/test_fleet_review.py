"""A hostile review of stoic.fleet on a real redis-server: replicas configured differently on
one key (a rolling deploy), a server clock stepped back under the latency sketch, a sync
client passed in without timeouts, and a trip that met a store error."""

from __future__ import annotations

import socket
import time

import pytest
import redis
from redis_harness import RedisServer, fresh

from stoic.fleet import RedisStore, SharedRateLimiter

pytestmark = pytest.mark.integration


def _server_now_us(raw: redis.Redis) -> int:
    seconds, micros = raw.time()
    return int(seconds) * 1_000_000 + int(micros)


async def test_replicas_of_different_rates_on_one_bucket_never_grant_above_the_larger_rate(
    server: RedisServer,
) -> None:
    """A rolling deploy moves a limit from 10/s to 3/s: for a while replicas of both share the
    bucket. Its credit is a number of permits whatever the rate of the replica that wrote it:
    0.3 permits refilled by a 3/s replica are 0.3 permits for a 10/s one, not 3."""
    raw = redis.Redis.from_url(server.url)
    store = RedisStore(server.url, budget=0.5)
    label = fresh("deploy")
    old = SharedRateLimiter(10, 1.0, store=store, label=label)
    new = SharedRateLimiter(3, 1.0, store=store, label=label)
    key = store.keys(label, "bucket")[0]
    assert await new.try_acquire()  # the bucket exists, written by the 3/s replica
    # Empty, last refilled 100 ms ago: 0.3 permits at 3/s, 1 at 10/s.
    raw.hset(key, mapping={"c": 0, "s": _server_now_us(raw) - 100_000})
    assert not await new.try_acquire()  # refills 0.3 permits (in its units) and refuses
    granted = 0
    while await old.try_acquire():
        granted += 1
    # At most the one permit 100 ms (and the few ms since) are worth at the larger rate.
    assert granted <= 1
    await store.aclose()
    raw.close()


async def test_a_server_clock_stepped_back_leaves_the_fleets_latency_sketch_following_new_samples(
    server: RedisServer,
) -> None:
    """The sketch's landmark and last push were written before the server's clock stepped back an
    hour. The samples pushed since must weigh as the newest, not 2**-360 of the old ones (which
    would hold the fleet's quantile on the old latencies for the hour the clock takes to catch up)."""
    from stoic.fleet import SharedLatency

    raw = redis.Redis.from_url(server.url)
    store = RedisStore(server.url, budget=0.5)
    digest = SharedLatency(store=store, label=fresh("stepped-sketch"), interval=0.01, half_life=10.0)
    estimate = digest.estimator(0.5, window=1000)
    for _ in range(200):
        estimate.add(80e6)
    assert await digest.flush()
    key = store.keys(digest.label, "latency")[0]
    # What a push an hour ahead of the server's clock leaves: the landmark, and every field there.
    ahead = _server_now_us(raw) + 3_600_000_000
    raw.hset(key, "L", ahead)
    if raw.hexists(key, "T"):
        raw.hset(key, "T", ahead)
    for _ in range(2000):
        estimate.add(5e6)
    assert await digest.flush()
    median = digest.quantile(0.5)
    assert median is not None and median < 6e6, median  # ten new samples to one old: the new median
    assert digest.samples < 2300  # (not 2**360 old ones)
    await store.aclose()
    raw.close()


def test_a_sync_client_passed_in_without_timeouts_still_answers_within_the_budget() -> None:
    """A ``redis.Redis`` built with redis-py's defaults (no socket timeouts, its own retries) and a
    server that takes connections but never answers (a hung process, a full accept queue behind
    a load balancer): the store's call must end, as a store error, within the budget. Its read
    was bounded, but not the new connection's handshake, which waited for ever."""
    import threading

    from stoic.fleet import StoreError

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel completes the connections; nobody reads or answers
        port = silent.getsockname()[1]
        store = RedisStore(redis.Redis(host="127.0.0.1", port=port), budget=0.1)
        outcome: list[object] = []

        def decide() -> None:
            started = time.monotonic()
            try:
                store.call_blocking("limiter_take", store.keys("silent", "bucket"), (1, 1, 1, 1, 1000))
            except StoreError as exc:
                outcome.append(exc)
            outcome.append(time.monotonic() - started)

        thread = threading.Thread(target=decide, daemon=True)
        thread.start()
        thread.join(3.0)
        assert not thread.is_alive(), "the store call hung past its budget"
    error, elapsed = outcome
    assert isinstance(error, StoreError) and error.unavailable
    assert isinstance(elapsed, float) and elapsed < 0.1 + 0.4


async def test_a_call_over_the_budget_is_a_timeout_by_error_type_on_both_paths() -> None:
    """``fleet.store_error`` and ``stoic.fleet.store.errors`` name a failed call by ``error.type``
    (the dashboard's legend): a call that ran out of its budget is a ``TimeoutError`` whether it
    ran on the asyncio client or on the sync one, not the store's own wrapper, ``StoreError``."""
    import asyncio

    import stoic
    from stoic.fleet import StoreError
    from stoic.testing import RecordingSink

    sink = RecordingSink()
    with socket.socket() as silent, stoic.use_sinks(sink):
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel completes the connections; nobody answers
        url = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
        on_loop, on_thread = RedisStore(url, budget=0.05), RedisStore(url, budget=0.05)
        key = on_loop.keys("silent", "bucket")
        with pytest.raises(StoreError):
            await on_loop.call("limiter_take", key, (1, 1, 1, 1, 1000))
        with pytest.raises(StoreError):
            await asyncio.to_thread(on_thread.call_blocking, "limiter_take", key, (1, 1, 1, 1, 1000))
        await on_loop.aclose()
        await on_thread.aclose()
    assert [e.attributes["error.type"] for e in sink.of("fleet.store_error")] == ["TimeoutError", "TimeoutError"]
    sink.assert_contract()


async def test_replicas_of_different_probe_counts_never_wedge_the_fleets_breaker_half_open(
    server: RedisServer,
) -> None:
    """A rolling deploy moves half_open_probes from 1 to 3. The old replica opens the half-open
    episode (one probe permit); a new one takes it and its probe succeeds. Every probe the episode
    allowed succeeded, so the breaker closes: it must not wait for two more successes that no
    permit is left for (half-open for ever, every call of the fleet refused, the key renewed by
    every refresh)."""
    import asyncio

    from stoic import CircuitOpen, OpenDuration
    from stoic.breaker import BreakerState, CountWindow
    from stoic.fleet import SharedCircuitBreaker

    store = RedisStore(server.url, budget=0.5)
    label = fresh("probes-deploy")

    def replica(probes: int) -> SharedCircuitBreaker:
        return SharedCircuitBreaker(label=label, store=store, window=CountWindow(1), minimum_calls=1,
                                    open_duration=OpenDuration.fixed(0.05, jitter=0.0), half_open_probes=probes,
                                    refresh_interval=0.001)

    old, new = replica(1), replica(3)

    async def refused() -> None:
        raise ConnectionError("down")

    async def answered() -> str:
        return "ok"

    with pytest.raises(ConnectionError):
        await old.execute(refused)
    await asyncio.sleep(0.08)  # past the open period
    await old.refresh()  # the old replica's read starts the episode: one probe permit
    assert old.state is BreakerState.HALF_OPEN
    assert await new.execute(answered) == "ok"  # the episode's one probe, by a new replica
    await asyncio.sleep(0.002)
    try:
        outcome = await new.execute(answered)
    except CircuitOpen:
        outcome = "refused"
    assert outcome == "ok" and new.state is BreakerState.CLOSED
    await store.aclose()


async def test_a_trip_the_store_could_not_take_is_sent_again_at_the_next_contact(server: RedisServer) -> None:
    """This replica's window trips while the store cannot be used (here: it answers an error for a
    key another program wrote, then that key is gone). The window that tripped is emptied with
    the trip, so a trip lost there would leave the fleet's breaker closed and this replica blind
    until minimum_calls more failures: it is sent again at the next contact that gets an answer,
    while the open period it would have started has not ended."""
    import asyncio

    from stoic import CircuitOpen, OpenDuration
    from stoic.breaker import CountWindow
    from stoic.fleet import SharedCircuitBreaker

    raw = redis.Redis.from_url(server.url)
    store = RedisStore(server.url, budget=0.5)
    breaker = SharedCircuitBreaker(label=fresh("lost-trip"), store=store, window=CountWindow(2), minimum_calls=2,
                                   open_duration=OpenDuration.fixed(30.0, jitter=0.0), refresh_interval=0.01)
    key = store.keys(breaker.label, "breaker")[0]
    ran = 0

    async def refused() -> None:
        nonlocal ran
        ran += 1
        raise ConnectionError("down")

    with pytest.raises(ConnectionError):
        await breaker.execute(refused)  # read the (closed) state, one failure in the window
    raw.hset(key, "st", "garbage")  # the next script answers an error
    with pytest.raises(ConnectionError):
        await breaker.execute(refused)  # the window trips; the trip gets no usable answer
    assert breaker.degraded
    raw.delete(key)  # the store answers again (empty)
    await asyncio.sleep(0.02)  # past the refresh interval: the next call reads the store
    with pytest.raises(CircuitOpen):
        await breaker.execute(refused)
    assert ran == 2
    assert int(raw.hget(key, "st") or 0) == 1  # open for the whole fleet
    await store.aclose()
    raw.close()
