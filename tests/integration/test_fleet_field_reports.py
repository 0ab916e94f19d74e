"""Field reports (cases/field-reports.md) re-run against the shared (fleet) policies on a real
redis-server: the shared breaker and the shared rate limiter must not have the faults the local
ones were fixed for. One server for the module; a fresh label per test keeps their keys apart.
Redis answers in real time, so the queueing tests run in real time, scaled down.
"""

from __future__ import annotations

import asyncio
import time
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, NamedTuple

import pytest
from redis_harness import RedisServer, fresh

import stoic
from stoic import Bulkhead, BulkheadFull, CountWindow, OpenDuration, Pipeline, TimeWindow
from stoic.fleet import RedisStore, SharedCircuitBreaker, SharedRateLimiter

pytestmark = pytest.mark.integration

@pytest.fixture
async def store(server: RedisServer) -> AsyncIterator[RedisStore]:
    shared = RedisStore(server.url, budget=0.5)
    yield shared
    await shared.aclose()


def shared_breaker(store: RedisStore, **kwargs: Any) -> SharedCircuitBreaker:
    kwargs.setdefault("window", CountWindow(4))
    kwargs.setdefault("minimum_calls", 4)
    kwargs.setdefault("open_duration", OpenDuration.fixed(30.0, jitter=0.0))
    return SharedCircuitBreaker(label=fresh("fr"), store=store, **kwargs)


def counts(breaker: SharedCircuitBreaker) -> tuple[int, int]:
    snap = breaker.snapshot
    return snap.calls, snap.failures


async def refused() -> None:
    raise ConnectionError("refused")


async def failed_task_group() -> None:
    """Leave this task's ``cancelling()`` raised, as a failed TaskGroup does on Python 3.11 (and
    a library that swallows a cancel without ``uncancel()`` does on any version)."""
    async def child() -> None:
        # Fail once the group is running (an eager task factory would run a child that fails
        # at once inside create_task, shutting the group before its sibling is added).
        await asyncio.sleep(0)
        raise ValueError("child failed")

    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(child())
            group.create_task(asyncio.sleep(1))
    except* ValueError:
        pass
    task = asyncio.current_task()
    assert task is not None
    if task.cancelling() == 0:  # Python >= 3.12 uncancels: swallow one by hand
        task.cancel()
        try:
            await asyncio.sleep(0)
        except asyncio.CancelledError:
            pass
    assert task.cancelling() >= 1


# ---------------------------------------------------------------- 17: a cancel swallowed earlier

@pytest.mark.parametrize("form", ["execute", "decorator"])
async def test_a_stale_cancel_count_does_not_hide_later_failures_from_a_shared_breaker(
    store: RedisStore, form: str,
) -> None:
    await failed_task_group()
    breaker = shared_breaker(store)
    wrapped = breaker(refused)
    for _ in range(4):
        with pytest.raises(ConnectionError):
            await (breaker.execute(refused) if form == "execute" else wrapped())
    assert breaker.state is stoic.BreakerState.OPEN
    with pytest.raises(stoic.CircuitOpen):
        await breaker.execute(refused)


async def test_a_caller_cancelled_during_a_shared_breaker_call_is_still_not_counted(store: RedisStore) -> None:
    breaker = shared_breaker(store)
    started = asyncio.Event()

    async def cleanup_fails() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise ConnectionError("cleanup failed") from None

    async def caller() -> None:
        await failed_task_group()
        await breaker.execute(cleanup_fails)

    task = asyncio.create_task(caller())
    await started.wait()
    task.cancel()
    with pytest.raises(ConnectionError):
        await task
    assert counts(breaker) == (0, 0)


# ---------------------------------------------------------------- 16: generators are not successes

def test_a_generator_returned_through_the_shared_breakers_call_is_refused_and_never_counted(
    server: RedisServer,
) -> None:
    def numbers() -> Iterator[int]:
        yield 1

    async def later() -> int:
        return 1

    breaker = shared_breaker(RedisStore(server.url, budget=0.5))
    for fn in (numbers, lambda: later()):
        with pytest.raises(TypeError, match=r"generator|coroutine"):
            breaker.call(fn)
    assert counts(breaker) == (0, 0)


async def test_an_async_generator_function_given_to_the_shared_execute_is_refused_and_never_counted(
    store: RedisStore,
) -> None:
    async def stream() -> AsyncIterator[int]:
        yield 1

    breaker = shared_breaker(store, window=CountWindow(1), minimum_calls=1)
    for _ in range(3):
        with pytest.raises(TypeError, match="generator"):
            await breaker.execute(stream)  # type: ignore[arg-type]
    assert breaker.state is stoic.BreakerState.CLOSED
    assert counts(breaker) == (0, 0)


@pytest.mark.parametrize("value", [None, 42], ids=["None", "int"])
async def test_a_plain_function_given_to_the_shared_execute_is_refused_and_never_counted(
    store: RedisStore, value: object,
) -> None:
    # Seen failing before the fix: the TypeError of ``await None`` counted, and with
    # minimum_calls=1 tripped the shared breaker.
    breaker = shared_breaker(store, window=CountWindow(1), minimum_calls=1)
    for _ in range(3):
        with pytest.raises(TypeError, match="cannot be awaited") as caught:
            await breaker.execute(lambda: value)  # type: ignore[arg-type, return-value]
        assert stoic.is_defect(caught.value)
    assert breaker.state is stoic.BreakerState.CLOSED
    assert counts(breaker) == (0, 0)


def _plain_hook() -> None:
    return None


async def test_an_await_on_a_plain_value_deep_in_the_operation_is_counted_by_the_shared_breaker(
    store: RedisStore,
) -> None:
    # Seen failing before the fix ((0, 0): taken for misuse at the call site): the await that
    # failed is the operation's own code's (a library awaiting a plain hook's None), so the
    # TypeError is the dependency call failing, counted like any other.
    async def library_call() -> None:
        await _plain_hook()  # type: ignore[func-returns-value]

    breaker = shared_breaker(store, window=CountWindow(10), minimum_calls=10)
    for _ in range(3):
        with pytest.raises(TypeError, match="can't be used in 'await' expression"):
            await breaker.execute(library_call)
    assert counts(breaker) == (3, 3)


# ---------------------------------------------------------------- 18: errors inside exception groups

async def test_a_group_holding_only_rejections_is_ignored_by_the_shared_breaker_like_a_bare_one(
    store: RedisStore,
) -> None:
    async def full() -> None:
        raise ExceptionGroup("fan-out", [BulkheadFull(label="inner"), BulkheadFull(label="inner")])

    async def bare() -> None:
        raise BulkheadFull(label="inner")

    breaker = shared_breaker(store)
    for fn in (bare, full):
        with pytest.raises((BulkheadFull, ExceptionGroup)):
            await breaker.execute(fn)
    assert counts(breaker) == (0, 0)  # neither a failure nor a success: no evidence at all


# ---------------------------------------------------------------- 19: a record_when that raises

async def test_a_raising_record_when_of_a_shared_breaker_counts_the_failure_and_is_reported_once(
    store: RedisStore, caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(error: Exception) -> bool:
        raise KeyError("no such field")

    breaker = shared_breaker(store, record_when=broken)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(4):
            with pytest.raises(ConnectionError) as info:
                await breaker.execute(refused)
            assert isinstance(info.value.__context__, KeyError)  # the operation's own error, chained
    assert breaker.state is stoic.BreakerState.OPEN  # the conservative decision: each call counted
    assert len([w for w in caught if "record_when" in str(w.message)]) == 1
    assert len([r for r in caplog.records if r.name == "stoic" and "record_when" in r.getMessage()]) == 1


# ---------------------------------------------------------------- 20: local queueing is not a slow dependency

DEPENDENCY = 0.05  # seconds: the dependency answers this fast, every time
SLOW = 0.25  # seconds: slow_call_duration, five times the dependency's answer


async def dependency() -> str:
    await asyncio.sleep(DEPENDENCY)
    return "ok"


def queued_breaker(store: RedisStore) -> SharedCircuitBreaker:
    return shared_breaker(store, window=TimeWindow(60.0), minimum_calls=10, slow_call_duration=SLOW,
                          slow_call_rate_threshold=0.5)


async def run_together(call: Callable[[], Awaitable[str]], callers: int) -> list[object]:
    return await asyncio.gather(*(call() for _ in range(callers)), return_exceptions=True)


@pytest.mark.parametrize("form", ["pipeline", "nested by hand", "stacked decorators"])
async def test_queueing_in_an_inner_bulkhead_is_not_a_slow_call_for_a_shared_breaker(
    store: RedisStore, form: str,
) -> None:
    breaker = queued_breaker(store)
    bulkhead = Bulkhead(2, queue_limit=50, label="api")
    if form == "pipeline":
        pipeline = Pipeline(breaker, bulkhead)

        def call() -> Awaitable[str]:
            return pipeline.execute(dependency)
    elif form == "nested by hand":
        def call() -> Awaitable[str]:
            return breaker.execute(bulkhead.execute, dependency)
    else:
        @breaker
        @bulkhead
        async def decorated() -> str:
            return await dependency()

        call = decorated
    # 24 callers, 2 at a time: the last one queues for 11 answers (0.55 s), over twice SLOW.
    assert await run_together(call, 24) == ["ok"] * 24
    snap = breaker.snapshot
    assert (snap.state, snap.calls, snap.slow_calls) == (stoic.BreakerState.CLOSED, 24, 0)
    assert await run_together(call, 24) == ["ok"] * 24  # the next requests are not refused


async def test_waiting_for_a_shared_rate_limiter_is_not_a_slow_call(store: RedisStore) -> None:
    breaker = queued_breaker(store)
    limiter = SharedRateLimiter(20, per=1.0, burst=1, queue_limit=100, store=store, label=fresh("rl"))
    # 14 callers at 20 per second: the last one waits about 0.65 s for its permit.
    assert await run_together(lambda: Pipeline(breaker, limiter).execute(dependency), 14) == ["ok"] * 14
    snap = breaker.snapshot
    assert (snap.state, snap.calls, snap.slow_calls) == (stoic.BreakerState.CLOSED, 14, 0)


async def test_a_slow_dependency_behind_a_queue_is_still_slow_for_a_shared_breaker(store: RedisStore) -> None:
    async def slow() -> str:
        await asyncio.sleep(SLOW + 0.05)
        return "late"

    breaker = queued_breaker(store)
    bulkhead = Bulkhead(5, queue_limit=50, label="api")
    assert await run_together(lambda: breaker.execute(bulkhead.execute, slow), 10) == ["late"] * 10
    assert breaker.snapshot.state is stoic.BreakerState.OPEN  # every call slow, measured from admission


def call_from_threads(breaker: SharedCircuitBreaker, limiter: Any, threads: int) -> list[str]:
    """``threads`` threads at once, each calling the dependency (sleeping DEPENDENCY) through
    ``breaker.call(limiter.call, ...)``; their results."""
    import threading

    results: list[str] = []

    def answer() -> str:
        time.sleep(DEPENDENCY)
        return "ok"

    def worker() -> None:
        results.append(breaker.call(limiter.call, answer))

    started = [threading.Thread(target=worker) for _ in range(threads)]
    for thread in started:
        thread.start()
    for thread in started:
        thread.join(10)
    return results


def test_threads_waiting_for_a_blocking_shared_rate_limiter_are_not_slow_calls(server: RedisServer) -> None:

    from stoic.fleet import BlockingSharedRateLimiter

    store = RedisStore(server.url, budget=0.5)
    breaker = shared_breaker(store, window=TimeWindow(60.0), minimum_calls=10, slow_call_duration=SLOW,
                             slow_call_rate_threshold=0.5)
    limiter = BlockingSharedRateLimiter(20, per=1.0, burst=1, queue_limit=100, store=store, label=fresh("brl"))
    assert call_from_threads(breaker, limiter, 14) == ["ok"] * 14  # the last waits about 0.65 s
    snap = breaker.snapshot
    assert (snap.state, snap.calls, snap.slow_calls) == (stoic.BreakerState.CLOSED, 14, 0)


STORE_DELAY = 0.3  # seconds: each reply of the limiter's script arrives this late, over SLOW


def limiter_replies_late(store: RedisStore, *, blocking: bool, then_fail: bool) -> list[float]:
    """Hold each reply of the shared limiter's script back STORE_DELAY (a slow network between
    Redis and this process), or fail it after that long (``then_fail``: the store gave up).
    Other scripts answer at once. Returns the list of delays made."""
    import redis

    sha = store._scripts["limiter_take"].sha
    delayed: list[float] = []

    def late() -> None:
        delayed.append(STORE_DELAY)
        if then_fail:
            raise redis.exceptions.TimeoutError("the network dropped the reply")

    if not blocking:
        roundtrip = store._roundtrip

        async def slow(command: tuple[Any, ...], repeat: bool) -> Any:
            reply = await roundtrip(command, repeat)
            if command[1] == sha:
                await asyncio.sleep(STORE_DELAY)
                late()
            return reply

        store._roundtrip = slow  # type: ignore[method-assign]
    else:
        roundtrip_blocking = store._roundtrip_blocking

        def slow_blocking(give_up: float, *command: Any) -> Any:
            reply = roundtrip_blocking(give_up, *command)
            if command[1] == sha:
                time.sleep(STORE_DELAY)
                late()
            return reply

        store._roundtrip_blocking = slow_blocking  # type: ignore[method-assign]
    return delayed


def slow_line_breaker(store: RedisStore) -> SharedCircuitBreaker:
    """A shared breaker on ``store`` judging three calls or more, slow from SLOW."""
    return shared_breaker(store, window=TimeWindow(60.0), minimum_calls=3, slow_call_duration=SLOW,
                          slow_call_rate_threshold=0.5)


class Judged(NamedTuple):
    breaker: SharedCircuitBreaker  # a slow_line_breaker on a store of its own (answering at once)
    limiter_store: RedisStore  # for the limiter under test (whose replies a test may hold back)


@pytest.fixture
async def judged(server: RedisServer) -> AsyncIterator[Judged]:
    """A breaker judging a limiter's calls, and the limiter's own store: two stores (budget 2 s),
    closed after the test."""
    breaker_store = RedisStore(server.url, budget=2.0)
    limiter_store = RedisStore(server.url, budget=2.0)
    try:
        yield Judged(slow_line_breaker(breaker_store), limiter_store)
    finally:
        await breaker_store.aclose()
        await limiter_store.aclose()


LATE_STORE_CASES = {
    # how the limiter admits: (rate, burst, whether the store's reply fails after its delay)
    "granted at once": (1000, 100, False),
    "queued for a permit": (20, 1, False),
    "the store gave up, the local bucket admitted": (1000, 100, True),
}


@pytest.mark.parametrize("case", LATE_STORE_CASES)
async def test_a_shared_rate_limiters_slow_store_is_not_a_slow_call(judged: Judged, case: str) -> None:
    """The time the limiter spends getting its store's decision is the limiter's, not the
    dependency's: a breaker outside judges only the dependency (its own store answers at once)."""
    rate, burst, then_fail = LATE_STORE_CASES[case]
    breaker, limiter_store = judged
    delayed = limiter_replies_late(limiter_store, blocking=False, then_fail=then_fail)
    limiter = SharedRateLimiter(rate, per=1.0, burst=burst, queue_limit=100, store=limiter_store,
                                label=fresh("late-rl"))
    assert await run_together(lambda: breaker.execute(limiter.execute, dependency), 3) == ["ok"] * 3
    # Every call met the slow store (one that failed rests the store: the others skip it).
    assert len(delayed) >= (1 if then_fail else 3)
    snap = breaker.snapshot
    assert (snap.state, snap.calls, snap.slow_calls) == (stoic.BreakerState.CLOSED, 3, 0)


REFUSED_CASES = {
    # why the limiter refuses after its slow round trip: (queue_limit, whether the reply fails)
    "refused: no queue for the wait": (0, False),
    "refused: the store gave up, failing closed": (100, True),
}


@pytest.mark.parametrize("blocking", [False, True], ids=["asyncio", "threads"])
@pytest.mark.parametrize("case", REFUSED_CASES)
async def test_a_shared_rate_limiters_slow_refusal_caught_by_the_operation_is_not_a_slow_call(
    judged: Judged, case: str, blocking: bool,
) -> None:
    """An operation that asks a shared limiter for an optional step after its dependency
    answered, and carries on without the step when refused: the refusal came after a round trip
    to a slow store (0.3 s, over the breaker's 0.25 s slow line), which is the limiter's time
    and never the dependency's, whether the limiter then admits or refuses."""
    from stoic.fleet import BlockingSharedRateLimiter

    queue_limit, then_fail = REFUSED_CASES[case]
    breaker, limiter_store = judged
    kind = BlockingSharedRateLimiter if blocking else SharedRateLimiter
    limiter: Any = kind(1, per=60.0, burst=1, queue_limit=queue_limit, store=limiter_store,
                        label=fresh("refusing-rl"), fail_open_on_store_error=False)
    if blocking:
        assert await asyncio.to_thread(limiter.try_acquire)  # the one permit of the minute, gone
    else:
        assert await limiter.try_acquire()
    delayed = limiter_replies_late(limiter_store, blocking=blocking, then_fail=then_fail)

    def step_blocking() -> str:
        time.sleep(DEPENDENCY)
        try:
            limiter.acquire()
        except stoic.RateLimited:
            return "without the step"
        return "with the step"

    async def step() -> str:
        await asyncio.sleep(DEPENDENCY)
        try:
            await limiter.acquire()
        except stoic.RateLimited:
            return "without the step"
        return "with the step"

    for _ in range(3):  # one after another: each meets the slow store (a failed one, its rest)
        if blocking:
            outcome = await asyncio.to_thread(breaker.call, step_blocking)
        else:
            outcome = await breaker.execute(step)
        assert outcome == "without the step"
    assert len(delayed) >= 1
    snap = breaker.snapshot
    assert (snap.state, snap.calls, snap.slow_calls) == (stoic.BreakerState.CLOSED, 3, 0)


@pytest.mark.parametrize("granted", [True, False], ids=["granted", "refused"])
@pytest.mark.parametrize("blocking", [False, True], ids=["asyncio", "threads"])
async def test_a_shared_rate_limiters_slow_try_acquire_is_not_a_slow_call(
    judged: Judged, blocking: bool, granted: bool,
) -> None:
    """``try_acquire`` never waits for a permit, but it asks the store: that round trip is the
    limiter's time, as an acquire's is. An operation that asks for an optional step after its
    dependency answered, through a store replying 0.3 s late, is not a slow call."""
    from stoic.fleet import BlockingSharedRateLimiter

    breaker, limiter_store = judged
    kind = BlockingSharedRateLimiter if blocking else SharedRateLimiter
    limiter: Any = kind(1000 if granted else 1, per=60.0, burst=100 if granted else 1, store=limiter_store,
                        label=fresh("try-rl"))
    if not granted:  # the one permit of the minute, gone
        assert await (asyncio.to_thread(limiter.try_acquire) if blocking else limiter.try_acquire())
    delayed = limiter_replies_late(limiter_store, blocking=blocking, then_fail=False)

    def step_blocking() -> bool:
        time.sleep(DEPENDENCY)
        return bool(limiter.try_acquire())

    async def step() -> bool:
        await asyncio.sleep(DEPENDENCY)
        return bool(await limiter.try_acquire())

    for _ in range(3):
        took = await (asyncio.to_thread(breaker.call, step_blocking) if blocking else breaker.execute(step))
        assert took is granted
    assert len(delayed) == 3
    snap = breaker.snapshot
    assert (snap.state, snap.calls, snap.slow_calls) == (stoic.BreakerState.CLOSED, 3, 0)


@pytest.mark.parametrize("case", LATE_STORE_CASES)
def test_a_blocking_shared_rate_limiters_slow_store_is_not_a_slow_call(server: RedisServer, case: str) -> None:

    from stoic.fleet import BlockingSharedRateLimiter

    rate, burst, then_fail = LATE_STORE_CASES[case]
    breaker_store = RedisStore(server.url, budget=2.0)
    limiter_store = RedisStore(server.url, budget=2.0)
    delayed = limiter_replies_late(limiter_store, blocking=True, then_fail=then_fail)
    breaker = slow_line_breaker(breaker_store)
    limiter = BlockingSharedRateLimiter(rate, per=1.0, burst=burst, queue_limit=100, store=limiter_store,
                                        label=fresh("late-brl"))
    assert call_from_threads(breaker, limiter, 3) == ["ok"] * 3
    assert len(delayed) >= (1 if then_fail else 3)
    snap = breaker.snapshot
    assert (snap.state, snap.calls, snap.slow_calls) == (stoic.BreakerState.CLOSED, 3, 0)


# ---------------------------------------------------------------- 1 and 3: sinks that raise, a herd of failures

class RaisingSink:
    level = stoic.Level.DEBUG

    def emit(self, event: stoic.Event) -> None:
        raise RuntimeError("the sink is broken")


async def test_a_raising_sink_changes_nothing_the_shared_breaker_decides(store: RedisStore) -> None:
    from stoic.testing import RecordingSink

    async def run(*extra: object) -> tuple[list[str], list[tuple[int, int]], int]:
        recording = RecordingSink()
        breaker = shared_breaker(store, window=CountWindow(6), minimum_calls=4, failure_rate_threshold=0.5)
        outcomes, counts_after = [], []
        with stoic.use_sinks(recording, *extra):  # type: ignore[arg-type]
            for failed in (False, True, False, True, True, False, False):
                try:
                    await breaker.execute(refused if failed else dependency)
                    outcomes.append("ok")
                except Exception as error:
                    outcomes.append(type(error).__name__)
                counts_after.append(counts(breaker))
        return outcomes, counts_after, len(recording.of("breaker.opened"))

    expected = await run()
    assert expected[0][4:] == ["CircuitOpen"] * 3 and expected[2] == 1
    assert await run(RaisingSink()) == expected  # opens at exactly the same call, same counts


async def test_a_hundred_concurrent_failures_open_the_shared_breaker_once(store: RedisStore) -> None:
    from stoic.testing import RecordingSink

    recording = RecordingSink()
    breaker = shared_breaker(store, window=CountWindow(10), minimum_calls=10)
    gate = asyncio.Event()

    async def herd() -> None:
        await gate.wait()
        raise ConnectionError("down")

    with stoic.use_sinks(recording):
        tasks = [asyncio.create_task(breaker.execute(herd)) for _ in range(100)]
        await asyncio.sleep(0.2)  # every caller admitted while closed (the first refresh included)
        gate.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, ConnectionError) for r in results)
    assert breaker.state is stoic.BreakerState.OPEN and breaker.snapshot.trips == 1
    assert len(recording.of("breaker.opened")) == 1


# ---------------------------------------------------------------- 11: reused across event loops

def test_shared_policies_built_outside_a_loop_work_under_successive_asyncio_runs(server: RedisServer) -> None:
    from stoic.testing import RecordingSink

    recording = RecordingSink()
    store = RedisStore(server.url, budget=0.5)  # built at "import time": no loop running
    breaker = SharedCircuitBreaker(label=fresh("loops"), store=store, window=CountWindow(20), minimum_calls=4,
                                   refresh_interval=0.01)
    limiter = SharedRateLimiter(20, per=1.0, burst=1, store=store, label=fresh("loops"))

    async def run() -> tuple[list[str], float]:
        results = []
        for _ in range(3):
            results.append(await breaker.execute(dependency))
            await asyncio.sleep(0.02)  # past the refresh interval: the next call asks the store
        began = time.monotonic()
        await asyncio.gather(*(limiter.acquire() for _ in range(3)))  # two of them wait in the queue
        return results, time.monotonic() - began

    with stoic.use_sinks(recording):
        for _ in range(3):
            results, waited = asyncio.run(run())
            assert results == ["ok"] * 3
            assert 0.07 < waited < 1.0  # served by the shared bucket, not refused or failed open at once
    assert [e.name for e in recording.events if e.name.startswith("fleet.")] == []  # the store answered every time
    assert breaker.snapshot.calls == 9


def test_a_store_closed_at_the_end_of_each_loop_serves_the_next_and_leaves_no_socket_behind(
    server: RedisServer,
) -> None:
    import gc

    from stoic.testing import VirtualClock

    clock = VirtualClock()
    store = RedisStore(server.url, budget=0.5)
    breaker = SharedCircuitBreaker(label=fresh("closed-loops"), store=store, window=CountWindow(20),
                                   minimum_calls=4, refresh_interval=0.01, clock=clock)
    limiter = SharedRateLimiter(20, per=1.0, burst=3, store=store, label=fresh("closed-loops"))

    async def run() -> list[str]:
        results = []
        for _ in range(3):
            results.append(await breaker.execute(dependency))
            await clock.advance(0.02)  # past the refresh interval: the next call asks the store
        await asyncio.gather(*(limiter.acquire() for _ in range(3)))  # three round trips, at once
        await store.aclose()
        return results

    gc.collect()  # what earlier tests dropped (the test above leaves its loops' sockets to the collector)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            assert asyncio.run(run()) == ["ok"] * 3
        gc.collect()  # a dropped connection would warn when collected
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []
    assert breaker.snapshot.calls == 9


# ---------------------------------------------------------------- 5: the server's clock steps back
# The shared state runs on the server's time (Redis TIME, a wall clock). A state written before
# the server's clock was stepped back an hour holds instants an hour in the future: exactly what
# these tests write, the only way to move a real server's clock from a test.

HOUR_US = 3_600_000_000


def _server_now_us(raw: Any) -> int:
    seconds, micros = raw.time()
    return int(seconds) * 1_000_000 + int(micros)


async def test_a_shared_bucket_stamped_in_the_future_still_refills(server: RedisServer) -> None:
    import redis

    raw = redis.Redis.from_url(server.url)
    store = RedisStore(server.url, budget=0.5)
    label = fresh("stepped")
    limiter = SharedRateLimiter(20, per=1.0, burst=1, queue_limit=10, store=store, label=label)
    assert await limiter.try_acquire()
    raw.hset(f"{{stoic:{label}}}:bucket", mapping={"c": 0, "s": _server_now_us(raw) + HOUR_US})
    began = time.monotonic()
    await asyncio.wait_for(limiter.acquire(), 5.0)  # a permit refills in 50 ms, not in an hour
    assert time.monotonic() - began < 1.0
    await store.aclose()
    raw.close()


async def test_a_shared_open_period_never_outlasts_its_configured_length_when_the_server_clock_steps_back(
    server: RedisServer,
) -> None:
    import redis

    raw = redis.Redis.from_url(server.url)
    store = RedisStore(server.url, budget=0.5)
    breaker = shared_breaker(store, window=CountWindow(1), minimum_calls=1,
                             open_duration=OpenDuration.fixed(30.0, jitter=0.0), refresh_interval=0.01)
    with pytest.raises(ConnectionError):
        await breaker.execute(refused)
    state_key = f"{{stoic:{breaker.label}}}:breaker"
    until = int(raw.hget(state_key, "un"))
    raw.hset(state_key, "un", until + HOUR_US)  # the same open period, seen after a step back
    await asyncio.sleep(0.02)  # past the refresh interval: the next call reads the shared state
    with pytest.raises(stoic.CircuitOpen) as refused_now:
        await breaker.execute(dependency)
    assert refused_now.value.retry_after is not None and refused_now.value.retry_after <= 30.0
    await store.aclose()
    raw.close()


async def test_a_probe_lease_stamped_in_the_future_still_expires_after_half_open_timeout(
    server: RedisServer,
) -> None:
    import redis

    raw = redis.Redis.from_url(server.url)
    store = RedisStore(server.url, budget=0.5)
    breaker = shared_breaker(store, window=CountWindow(1), minimum_calls=1, half_open_probes=1,
                             half_open_timeout=0.2, open_duration=OpenDuration.fixed(0.1, jitter=0.0),
                             refresh_interval=0.01)
    with pytest.raises(ConnectionError):
        await breaker.execute(refused)
    await asyncio.sleep(0.15)
    state_key = f"{{stoic:{breaker.label}}}:breaker"
    # A replica took the one probe lease and died; then the server's clock stepped back an hour.
    raw.hset(state_key, mapping={"st": 2, "pf": 0, "gen": int(raw.hget(state_key, "gen")) + 1})
    raw.hset(f"{{stoic:{breaker.label}}}:probes", "dead-replica",
             _server_now_us(raw) + HOUR_US + 200_000)
    await asyncio.sleep(0.35)  # past half_open_timeout
    # The dead lease counts as a failed probe: the breaker reopens for its 0.1 s and then lets a
    # probe through, instead of refusing every call for an hour.
    deadline = time.monotonic() + 3.0
    while True:
        try:
            assert await breaker.execute(dependency) == "ok"
            break
        except stoic.CircuitOpen:
            assert time.monotonic() < deadline, "the dead lease wedged the half-open state"
            await asyncio.sleep(0.05)
    await store.aclose()
    raw.close()


# ---------------------------------------------------------------- the blocking shared queue limit is exact

@pytest.mark.parametrize("queue_limit", [0, 1, 2])
def test_the_blocking_shared_limiters_queue_limit_is_exact_as_the_asyncio_ones(
    server: RedisServer, queue_limit: int,
) -> None:
    """``queue_limit`` threads wait, the next is refused at once (``queue_full``), as in
    SharedRateLimiter and the local limiters. Four threads arrive 50 ms apart while a permit
    takes 0.5 s to refill."""
    import threading

    from stoic.fleet import BlockingSharedRateLimiter

    limiter = BlockingSharedRateLimiter(2, per=1.0, burst=1, queue_limit=queue_limit,
                                        store=RedisStore(server.url, budget=0.5), label=fresh("bql"))
    assert limiter.try_acquire()
    outcomes: list[str] = []

    def arrive() -> None:
        try:
            limiter.acquire()
            outcomes.append("served")
        except stoic.RateLimited:
            outcomes.append("refused")

    threads = [threading.Thread(target=arrive) for _ in range(4)]
    for thread in threads:
        thread.start()
        time.sleep(0.05)
    for thread in threads:
        thread.join(10)
    assert sorted(outcomes) == ["refused"] * (4 - queue_limit) + ["served"] * queue_limit
