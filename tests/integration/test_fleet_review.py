"""A hostile review of stoic.fleet on a real redis-server: replicas configured differently on
one key (a rolling deploy), a server clock stepped back under the latency sketch, a sync
client passed in without timeouts, and a trip that met a store error."""

from __future__ import annotations

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
