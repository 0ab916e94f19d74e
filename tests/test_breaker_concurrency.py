"""The breaker under contention: hundreds of tasks, random cancellations, many threads.
No probe permit is leaked, no count is lost, and the probe limit holds exactly."""

from __future__ import annotations

import asyncio
import random
import sys
import threading

from _breaker_helpers import Boom

from stoic import BreakerState, CircuitBreaker, CircuitOpen, CountWindow, OpenDuration, TimeWindow
from stoic.testing import VirtualClock, settle


def permits_accounted(breaker: CircuitBreaker, succeeded: int) -> bool:
    """Free permits + probes in flight + successful probes == the episode's permits."""
    episode = breaker._episode
    assert episode is not None
    return episode.free + len(episode.inflight) + succeeded == breaker._probes


async def test_random_cancellations_of_probes_never_leak_a_permit(clock: VirtualClock) -> None:
    rng = random.Random(1234)
    breaker = CircuitBreaker(label="probes", window=CountWindow(1), minimum_calls=1, half_open_probes=4,
                             open_duration=OpenDuration.fixed(1, jitter=0), half_open_timeout=3600)
    try:
        await breaker.execute(_fail)
    except Boom:
        pass
    await clock.advance(1)
    assert breaker.state is BreakerState.HALF_OPEN
    running: list[tuple[asyncio.Task[str], asyncio.Event]] = []
    admitted = rejected = 0
    for _round in range(300):
        release = asyncio.Event()

        async def probe(release: asyncio.Event = release) -> str:
            await release.wait()
            return "probe"

        task = asyncio.create_task(breaker.execute(probe))
        await settle()
        if task.done():
            assert isinstance(task.exception(), CircuitOpen)
            rejected += 1
        else:
            admitted += 1
            running.append((task, release))
        assert len(running) <= 4  # never more probes in flight than permits
        if running and rng.random() < 0.6:
            victim, _ = running.pop(rng.randrange(len(running)))
            victim.cancel()
            await asyncio.gather(victim, return_exceptions=True)
        assert permits_accounted(breaker, 0)
    assert admitted > 4 and rejected > 0  # permits were returned and reused
    for _task, release in running:
        release.set()
    await asyncio.gather(*(t for t, _ in running))
    if len(running) == 4:
        assert breaker.state is BreakerState.CLOSED
    else:
        assert permits_accounted(breaker, len(running))


async def test_three_hundred_tasks_with_random_outcomes_keep_exact_counts(clock: VirtualClock) -> None:
    rng = random.Random(99)
    breaker = CircuitBreaker(label="counts", window=TimeWindow(3600), minimum_calls=1, failure_rate_threshold=1.0,
                             slow_call_duration=5.0, slow_call_rate_threshold=1.0)
    outcomes = [(rng.random() < 0.4, rng.uniform(0, 10)) for _ in range(300)]
    outcomes[0] = (False, 0.0)  # at least one quick success: the breaker never reaches 100%

    async def op(failed: bool, seconds: float) -> str:
        await clock.sleep_until(clock.now_ns() + round(seconds * 1e9))
        if failed:
            raise Boom("down")
        return "ok"

    async def one(failed: bool, seconds: float) -> None:
        try:
            await breaker.execute(op, failed, seconds)
        except Boom:
            pass

    await clock.run(asyncio.gather(*(one(f, s) for f, s in outcomes)))
    snap = breaker.snapshot
    assert snap.state is BreakerState.CLOSED
    assert snap.calls == 300
    assert snap.failures == sum(1 for f, _ in outcomes if f)
    assert snap.slow_calls == sum(1 for _, s in outcomes if round(s * 1e9) > 5_000_000_000)


async def test_cancelling_hundreds_of_closed_calls_records_nothing(clock: VirtualClock) -> None:
    breaker = CircuitBreaker(label="cancel", window=CountWindow(500), minimum_calls=1)
    event = asyncio.Event()
    tasks = [asyncio.create_task(breaker.execute(event.wait)) for _ in range(400)]
    await settle()
    for task in tasks[::2]:
        task.cancel()
    await settle()
    event.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert breaker.snapshot.calls == 200
    assert breaker.snapshot.failures == 0


def test_threads_hammering_a_breaker_lose_no_count() -> None:
    breaker = CircuitBreaker(label="hammer", window=CountWindow(100_000), minimum_calls=1, failure_rate_threshold=1.0)
    per_thread = 2_000
    failures_per_thread = per_thread // 4

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        plan = [True] * failures_per_thread + [False] * (per_thread - failures_per_thread)
        rng.shuffle(plan)
        for failed in plan:
            try:
                breaker.call(_raise if failed else _noop)
            except Boom:
                pass

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: races show up
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    snap = breaker.snapshot
    assert snap.state is BreakerState.CLOSED
    assert snap.calls == 8 * per_thread
    assert snap.failures == 8 * failures_per_thread


async def _fail() -> str:
    raise Boom("down")


def _raise() -> None:
    raise Boom("down")


def _noop() -> None:
    return None
