"""stoic.fleet against a real three-node Redis Cluster (issue 13, items 1 and 8): every script's
keys share one hash tag, so each policy lives on the one node owning its slot."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio.cluster
import redis.cluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis_harness import RedisClusterServer, fresh

import stoic
from stoic import CircuitOpen, OpenDuration
from stoic.breaker import CountWindow
from stoic.fleet import BlockingSharedRateLimiter, RedisStore, SharedCircuitBreaker, SharedLatency, SharedRateLimiter
from stoic.testing import RecordingSink

pytestmark = pytest.mark.integration

@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServer]:
    running = RedisClusterServer(tmp_path_factory.mktemp("cluster"))
    yield running
    running.stop()


def async_client(cluster: RedisClusterServer) -> redis.asyncio.cluster.RedisCluster:
    return redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=cluster.ports[0],
                                              retry=AsyncRetry(NoBackoff(), 0))


def sync_client(cluster: RedisClusterServer) -> redis.cluster.RedisCluster:
    return redis.cluster.RedisCluster(host="127.0.0.1", port=cluster.ports[1], retry=Retry(NoBackoff(), 0),
                                      socket_timeout=0.5)


def labels_on_every_node(store: RedisStore, client: redis.cluster.RedisCluster, suffix: str) -> list[str]:
    """One fresh label per node: their keys' slots are owned by different primaries."""
    found: dict[str, str] = {}
    while len(found) < 3:
        label = fresh("spread")
        node = client.get_node_from_key(store.keys(label, suffix)[0])
        found.setdefault(node.name, label)
    return list(found.values())


async def test_shared_limiter_grants_stay_bounded_on_every_node(cluster: RedisClusterServer) -> None:
    clients = [async_client(cluster), async_client(cluster)]
    stores = [RedisStore(c, budget=0.5) for c in clients]
    probe = sync_client(cluster)
    sink = RecordingSink()
    with stoic.use_sinks(sink):
        for label in labels_on_every_node(stores[0], probe, "bucket"):
            replicas = [SharedRateLimiter(10, 60.0, store=s, label=label) for s in stores]
            granted = 0
            for _ in range(15):
                for replica in replicas:
                    granted += await replica.try_acquire()
            # Two clients, 30 asks of a bucket of 10 refilling 1 per 6 s: the burst and no more.
            assert granted == 10
    assert not sink.of("fleet.store_error") and not sink.of("fleet.fail_open")
    for c in clients:
        await c.aclose()
    probe.close()


async def test_a_trip_seen_by_another_client_on_the_cluster(cluster: RedisClusterServer) -> None:
    label = fresh("trip")
    clients = [async_client(cluster), async_client(cluster)]
    a, b = (SharedCircuitBreaker(label=label, store=RedisStore(c, budget=0.5), window=CountWindow(4),
                                 minimum_calls=4, open_duration=OpenDuration.fixed(30.0, jitter=0.0),
                                 refresh_interval=0.05) for c in clients)

    async def fail() -> None:
        raise ConnectionError("down")

    async def ok() -> str:
        return "ok"

    assert await b.execute(ok) == "ok"
    for _ in range(4):
        with pytest.raises(ConnectionError):
            await a.execute(fail)
    with pytest.raises(CircuitOpen):
        await a.execute(ok)
    await asyncio.sleep(0.1)
    with pytest.raises(CircuitOpen) as info:
        await b.execute(ok)
    assert info.value.retry_after is not None and 29.0 < info.value.retry_after <= 30.0
    assert not a.degraded and not b.degraded and b.trips == 1
    for c in clients:
        await c.aclose()


async def test_noscript_after_a_flush_on_every_node_is_recovered(cluster: RedisClusterServer) -> None:
    client = async_client(cluster)
    store = RedisStore(client, budget=0.5)
    probe = sync_client(cluster)
    sink = RecordingSink()
    with stoic.use_sinks(sink):
        limiters = [SharedRateLimiter(100, 1.0, store=store, label=label)
                    for label in labels_on_every_node(store, probe, "bucket")]
        for limiter in limiters:
            assert await limiter.try_acquire()
        for node in probe.get_primaries():
            probe.execute_command("SCRIPT FLUSH", target_nodes=node)
        for limiter in limiters:
            assert await limiter.try_acquire()
        sha = store._scripts["limiter_take"].sha
        # Loaded again on each node that owns one of the buckets: all three.
        assert all(probe.execute_command("SCRIPT EXISTS", sha, target_nodes=node)[0]
                   for node in probe.get_primaries())
    assert not sink.of("fleet.store_error")
    await client.aclose()
    probe.close()


def test_the_blocking_limiter_on_the_sync_cluster_client(cluster: RedisClusterServer) -> None:
    client = sync_client(cluster)
    store = RedisStore(client, budget=0.5)
    label = fresh("sync")
    limiters = [BlockingSharedRateLimiter(5, 60.0, store=store, label=label) for _ in range(2)]
    sink = RecordingSink()
    with stoic.use_sinks(sink):
        granted = sum(limiter.try_acquire() for _ in range(6) for limiter in limiters)
        assert granted == 5
        assert store.cluster
        for node in client.get_primaries():
            client.execute_command("SCRIPT FLUSH", target_nodes=node)
        assert not limiters[0].try_acquire()  # reloaded after NOSCRIPT, and still empty: the store decided
    assert not sink.of("fleet.store_error") and not sink.of("fleet.fail_open")
    client.close()


async def test_the_latency_sketch_merges_on_the_cluster(cluster: RedisClusterServer) -> None:
    label = fresh("latency")
    clients = [async_client(cluster), async_client(cluster)]
    digests = [SharedLatency(store=RedisStore(c, budget=0.5), label=label, interval=0.1) for c in clients]
    estimates = [d.estimator(0.5) for d in digests]
    for _ in range(100):
        estimates[0].add(5e6)
        estimates[1].add(50e6)
    for d in digests:
        assert await d.flush()
    assert await digests[0].flush()
    assert digests[0].samples == pytest.approx(200, rel=0.02)
    for c in clients:
        await c.aclose()


def test_the_type_error_names_the_cluster_clients() -> None:
    with pytest.raises(TypeError, match="RedisCluster"):
        RedisStore(object())


def test_the_shared_breakers_call_on_the_sync_cluster_client(cluster: RedisClusterServer) -> None:
    label = fresh("sync-trip")
    a, b = (SharedCircuitBreaker(label=label, store=RedisStore(sync_client(cluster), budget=0.5),
                                 window=CountWindow(4), minimum_calls=4,
                                 open_duration=OpenDuration.fixed(30.0, jitter=0.0), refresh_interval=0.05)
            for _ in range(2))

    def broken() -> None:
        raise ConnectionError("down")

    assert b.call(lambda: "ok") == "ok"
    for _ in range(4):
        with pytest.raises(ConnectionError):
            a.call(broken)
    time.sleep(0.06)
    with pytest.raises(CircuitOpen):
        b.call(lambda: "ok")
    assert not a.degraded and not b.degraded and b.snapshot.trips == 1
