"""A hostile reader's checks of the shared rate limiters on a real redis-server: a deadline
that cuts a request queued in this process says ``timed_out`` False (a local wait, field
report 20), their rejection counts stay exact from many threads, and a limiter garbage-collected
takes its series with it."""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref

import pytest
from redis_harness import RedisServer, fresh
from test_fleet_metrics import _WAITERS, HOUR, limiter_figures, until

import stoic
from stoic import DeadlineExceeded, RateLimited
from stoic.fleet import BlockingSharedRateLimiter, RedisStore, SharedRateLimiter
from stoic.testing import VirtualClock

pytestmark = pytest.mark.integration


async def test_a_deadline_that_cuts_a_request_queued_behind_the_head_says_it_cut_a_wait(server: RedisServer) -> None:
    """The head of this process's queue waits an hour for its permit (no deadline); a request
    under a 1 s timeout queues behind it (nothing checks its wait against its deadline: it has
    none of its own until it reaches the head) and is cut there. Nothing reached the dependency:
    ``timed_out`` False, which a breaker outside ignores."""
    clock = VirtualClock()
    store = RedisStore(server.url, budget=2.0)
    shared = SharedRateLimiter(1, HOUR, burst=1, queue_limit=None, store=store, label=fresh("limiter-cut"),
                               clock=clock)
    breaker = stoic.CircuitBreaker(label=fresh("cut-breaker"), minimum_calls=1, failure_rate_threshold=0.1,
                                   clock=clock)
    await shared.acquire()
    head = asyncio.create_task(shared.acquire())
    await until(lambda: clock.pending_timers == 1)

    async def bounded() -> str:
        async with stoic.timeout(1.0, clock=clock):
            await shared.acquire()
            return "ok"

    behind = asyncio.create_task(breaker.execute(bounded))
    await until(lambda: shared.waiter_count == 2)
    await clock.advance(1.0)
    with pytest.raises(DeadlineExceeded) as caught:
        await asyncio.wait_for(behind, 5.0)
    assert not caught.value.timed_out
    assert breaker.snapshot.failures == 0
    head.cancel()
    await asyncio.gather(head, return_exceptions=True)
    await store.aclose()


def test_rejections_counted_from_many_threads_are_exact(server: RedisServer, metrics_on: None) -> None:
    """Eight threads each refused 500 times (more permits than the burst, by try_acquire and by
    acquire: counted, no round trip): the counter says 4000, not a figure short of it from an
    unlocked update."""
    store = RedisStore(server.url, budget=2.0)
    shared = BlockingSharedRateLimiter(5, 1.0, burst=2, store=store, label=fresh("limiter-threads"))
    start = threading.Barrier(8)

    def refused() -> None:
        start.wait()
        for _ in range(250):
            assert not shared.try_acquire(3)
            with pytest.raises(RateLimited):
                shared.acquire(3)

    threads = [threading.Thread(target=refused) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert limiter_figures(shared.label)["stoic.ratelimiter.rejections"] == {("oversized",): 4000}
    asyncio.run(store.aclose())


async def test_a_shared_limiter_garbage_collected_leaves_no_series(server: RedisServer, metrics_on: None) -> None:
    """A shared limiter that is dropped is collected (its recorder holds it weakly, nothing
    else of stoic's holds it), and its series, the waiters gauge and the rejections it counted,
    leave the next collection with it (as a local limiter's do); its fallback's too."""
    store = RedisStore(server.url, budget=2.0)
    label = fresh("limiter-gone")
    shared = SharedRateLimiter(5, 1.0, burst=1, store=store, label=label)
    with pytest.raises(RateLimited):
        await shared.acquire(2)
    figures = limiter_figures(label)
    assert figures["stoic.ratelimiter.rejections"] == {("oversized",): 1} and figures[_WAITERS] == {(): 0}
    gone = weakref.ref(shared)
    del shared
    gc.collect()
    assert gone() is None
    assert limiter_figures(label) == {} and limiter_figures(f"{label}.fallback") == {}
    await store.aclose()
