"""stoic.fleet without a server: bad input at construction, replies of an unexpected shape, the
store's health breaker on virtual time, and the core importing no redis (issue 13, "Bad input")."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import stoic
from stoic import CircuitOpen, RateLimited
from stoic.breaker import BreakerState
from stoic.fleet import (
    BlockingSharedRateLimiter,
    RedisStore,
    SharedCircuitBreaker,
    SharedLatency,
    SharedRateLimiter,
    StoreError,
)
from stoic.fleet._latency import BUCKETS, bucket_bounds, bucket_of, quantile_of
from stoic.fleet._store import _Script
from stoic.testing import RecordingSink, VirtualClock

URL = "redis://127.0.0.1:1/0"  # never connected to: these tests replace the round trip


def test_neither_stoic_nor_stoic_fleet_imports_redis() -> None:
    code = "import sys, stoic, stoic.fleet; assert 'redis' not in sys.modules, 'redis imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("url", ["http://localhost:6379", "redis://", "redis://host:notaport/0", "localhost:6379",
                                 "unix://", "redis://host:99999"])
def test_an_unparsable_url_names_the_parameter(url: str) -> None:
    with pytest.raises(ValueError, match="url"):
        RedisStore(url)


@pytest.mark.parametrize(("name", "value"), [("budget", 0), ("budget", -0.001), ("probe_interval", 0),
                                             ("budget", timedelta(0))])
def test_non_positive_durations_name_the_parameter(name: str, value: Any) -> None:
    with pytest.raises(ValueError, match=name):
        RedisStore(URL, **{name: value})


@pytest.mark.parametrize("label", ["a b", "{tag}", "a}b", "", "tab\tlabel", "new\nline", "x" * 201, "é"])
def test_labels_that_would_break_a_key_are_refused(label: str) -> None:
    store = RedisStore(URL)
    with pytest.raises(ValueError, match="label"):
        SharedRateLimiter(10, store=store, label=label)
    with pytest.raises(ValueError, match="label"):
        SharedCircuitBreaker(label=label, store=store)
    with pytest.raises(ValueError, match="prefix"):
        RedisStore(URL, prefix=label)


def test_wrong_types_are_type_errors() -> None:
    with pytest.raises(TypeError, match="client"):
        RedisStore(6379)
    with pytest.raises(TypeError, match="store"):
        SharedRateLimiter(10, store="redis://x", label="a")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="label"):
        SharedCircuitBreaker(label=3, store=RedisStore(URL))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="fail_open_on_store_error"):
        SharedRateLimiter(10, store=RedisStore(URL), label="a", fail_open_on_store_error=1)  # type: ignore[arg-type]


def test_non_positive_refresh_interval_and_bad_limits() -> None:
    store = RedisStore(URL)
    with pytest.raises(ValueError, match="refresh_interval"):
        SharedCircuitBreaker(label="a", store=store, refresh_interval=0)
    with pytest.raises(ValueError, match="half_open_probes"):
        SharedCircuitBreaker(label="a", store=store, half_open_probes=0)
    with pytest.raises(ValueError, match="rate"):
        SharedRateLimiter(0, store=store, label="a")
    with pytest.raises(ValueError, match="per"):
        SharedRateLimiter(10, 1.0000005, store=store, label="a")  # finer than Redis TIME's microsecond
    with pytest.raises(ValueError, match="2\\*\\*53"):
        SharedRateLimiter(10**7, 3600.0 + 1e-6, burst=10**7, store=store, label="a")


def test_keys_share_one_hash_tag() -> None:
    store = RedisStore(URL, prefix="svc")
    assert store.keys("payments", "breaker", "probes") == ["{svc:payments}:breaker", "{svc:payments}:probes"]
    # The documented layout is the plain text (docs/fleet.md, "Key layout"): a ':' in both halves
    # can make two pairs spell one tag, and changing that would orphan every existing user's state.
    assert RedisStore(URL, prefix="a:b").keys("c", "breaker") == RedisStore(URL, prefix="a").keys("b:c", "breaker")


def _answer(store: RedisStore, *replies: Any) -> list[int]:
    """Replace the round trip with canned replies; returns the list counting calls."""
    calls: list[int] = []
    queue = list(replies)

    async def timed(script: _Script, keys: Any, args: Any, *rest: Any) -> Any:
        calls.append(1)
        reply = queue.pop(0) if len(queue) > 1 else queue[0]
        if isinstance(reply, BaseException):
            raise reply
        return reply

    store._timed = timed  # type: ignore[method-assign]
    return calls


@pytest.mark.parametrize("reply", [b"OK", 7, [1], [b"1", b"0", b"5"], [2, 0, 0], [0, 0, 0], [1, 5, 0]])
async def test_a_limiter_reply_of_unexpected_shape_fails_open_bounded(reply: Any) -> None:
    sink = RecordingSink()
    store = RedisStore(URL)
    _answer(store, reply)
    opened = SharedRateLimiter(2, 60.0, store=store, label="shape")
    closed = SharedRateLimiter(2, 60.0, store=store, label="shape", fail_open_on_store_error=False)
    from stoic import use_sinks
    with use_sinks(sink):
        assert await opened.try_acquire()
        assert await opened.acquire() is None
        assert not await opened.try_acquire()  # the local bucket of 2 is spent: never unbounded
        with pytest.raises(RateLimited) as info:
            await closed.acquire()
        assert info.value.retry_after is None
    errors = sink.of("fleet.store_error")
    assert len(errors) == 4
    assert all(e.attributes["operation"] == "limiter_take" and not e.attributes["unavailable"] for e in errors)
    assert len(sink.of("fleet.fail_open")) == 3
    assert len(sink.of("fleet.fail_closed")) == 1
    sink.assert_contract()


@pytest.mark.parametrize("reply", [[0, 0], [0, 0, -1, 1, 0, 0, None], [9, 0, -1, 1, 0, 0], [b"x"] * 6,
                                   # negative counts (a hash field another program wrote): a
                                   # generation of -1 reads as "never read", which first calls
                                   # waited on forever, one round trip after another
                                   [0, 0, -1, -1, 0, 0], [0, -1, -1, 1, 0, 0], [1, 1, 5, 1, 0, -1]])
async def test_a_breaker_reply_of_unexpected_shape_uses_the_fallback(reply: Any) -> None:
    sink = RecordingSink()
    store = RedisStore(URL)
    _answer(store, reply)
    opened = SharedCircuitBreaker(label="shape", store=store)
    closed = SharedCircuitBreaker(label="shape", store=store, fail_open_on_store_error=False)

    async def ok() -> int:
        return 1

    from stoic import use_sinks
    with use_sinks(sink):
        assert await opened.execute(ok) == 1
        assert opened.degraded
        with pytest.raises(CircuitOpen):
            await closed.execute(ok)
    assert sink.of("fleet.store_error")
    assert sink.of("fleet.fail_open")[0].attributes["policy"] == "breaker"
    assert sink.of("fleet.fail_closed")
    sink.assert_contract()


async def test_an_outage_costs_one_budget_per_probe_interval(clock: VirtualClock) -> None:
    sink = RecordingSink()
    store = RedisStore(URL, probe_interval=1.0, clock=clock)
    calls = _answer(store, StoreError("down", operation="limiter_take", unavailable=True))
    limiter = SharedRateLimiter(1000, store=store, label="outage", clock=clock)
    from stoic import use_sinks
    with use_sinks(sink):
        for _ in range(50):
            assert await limiter.try_acquire()
        assert len(calls) == 1  # the store rests for probe_interval after a failure
        await clock.advance(1.0)
        for _ in range(50):
            assert await limiter.try_acquire()
        assert len(calls) == 2  # one probe per interval
        _answer(store, [1, 0, 5])
        await clock.advance(1.0)
        assert await limiter.try_acquire()
    assert len(sink.of("fleet.store_error")) == 2
    recovered = sink.of("fleet.store_recovered")
    assert len(recovered) == 1 and recovered[0].attributes["outage"] == pytest.approx(2.0)
    sink.assert_contract()


def test_each_limiter_needs_its_kind_of_client() -> None:
    import redis
    import redis.asyncio

    with pytest.raises(TypeError, match=r"redis\.Redis"):
        BlockingSharedRateLimiter(10, store=RedisStore(redis.asyncio.Redis()), label="a")
    with pytest.raises(TypeError, match=r"redis\.asyncio\.Redis"):
        SharedRateLimiter(10, store=RedisStore(redis.Redis()), label="a")
    BlockingSharedRateLimiter(10, store=RedisStore(URL), label="a")  # a URL builds both


async def test_a_request_over_the_burst_is_refused_with_the_oversized_event_the_catalog_gives() -> None:
    # The shared limiters report it as the local ones do: permits and burst, and no store call.
    sink = RecordingSink()
    store = RedisStore(URL)
    calls = _answer(store, [1, 0, 0])
    limiter = SharedRateLimiter(10, 1.0, burst=3, store=store, label="big")
    blocking = BlockingSharedRateLimiter(10, 1.0, burst=3, store=RedisStore(URL), label="big-blocking")
    with stoic.use_sinks(sink):
        with pytest.raises(RateLimited):
            await limiter.acquire(4)
        assert not await limiter.try_acquire(4)
        with pytest.raises(RateLimited):
            blocking.acquire(5)
    events = sink.of("ratelimiter.oversized")
    assert [(e.label, e.attributes["permits"], e.attributes["burst"]) for e in events] == [
        ("big", 4, 3), ("big", 4, 3), ("big-blocking", 5, 3)]
    assert calls == []
    sink.assert_contract()


def test_a_blocking_reply_of_unexpected_shape_fails_open_bounded() -> None:
    sink = RecordingSink()
    store = RedisStore(URL)
    store._timed_blocking = lambda *args: [7, 7]  # type: ignore[method-assign]
    limiter = BlockingSharedRateLimiter(2, 60.0, store=store, label="shape")
    from stoic import use_sinks
    with use_sinks(sink):
        assert limiter.try_acquire()
        limiter.acquire()
        assert not limiter.try_acquire()  # the local bucket of 2 is spent
    assert len(sink.of("fleet.store_error")) == 3
    assert len(sink.of("fleet.fail_open")) == 3
    sink.assert_contract()


# ---------------------------------------------------------------------------- latency sketch
@given(st.floats(min_value=1024.0, max_value=2.0**37 - 1))
def test_a_value_falls_inside_its_bucket_and_buckets_are_at_most_an_eighth_wide(ns: float) -> None:
    i = bucket_of(ns)
    low, high = bucket_bounds(i)
    assert low <= ns < high
    assert (high - low) / low <= 0.125 + 1e-12
    assert 0 <= i < BUCKETS


def test_values_out_of_range_land_in_the_end_buckets() -> None:
    assert bucket_of(0.0) == bucket_of(5.0) == 0
    assert bucket_of(1e15) == BUCKETS - 1


@given(st.lists(st.floats(min_value=2e3, max_value=1e10), min_size=20, max_size=300),
       st.floats(min_value=0.01, max_value=0.99))
def test_the_sketch_quantile_is_within_one_bucket_of_the_exact_one(values: list[float], p: float) -> None:
    weights: dict[int, float] = {}
    for v in values:
        weights[bucket_of(v)] = weights.get(bucket_of(v), 0.0) + 1.0
    got = quantile_of(weights, float(len(values)), p)
    ordered = sorted(values)
    exact = ordered[max(0, -(-int(p * len(values) * 1e9) // 10**9) - 1)]
    assert got is not None
    # The reference model: the exact rank's value; the sketch may be off by the buckets around it.
    low = bucket_bounds(bucket_of(ordered[max(0, int(p * len(values)) - 1)]))[0]
    high = bucket_bounds(bucket_of(ordered[min(len(values) - 1, int(p * len(values)))]))[1]
    assert low <= got <= high, (got, exact)


def test_latency_digest_needs_a_quantile_and_the_right_type() -> None:
    from stoic import AdaptiveBulkhead, Hedge

    digest = SharedLatency(store=RedisStore(URL), label="lat")
    with pytest.raises(ValueError, match="quantile"):
        Hedge(0.1, label="h", latency_digest=digest)
    with pytest.raises(ValueError, match="latency_quantile"):
        AdaptiveBulkhead(latency_threshold=0.1, max_concurrent=4, label="a", latency_digest=digest)
    with pytest.raises(TypeError, match="latency_digest"):
        Hedge(0.1, label="h", quantile=0.9, latency_digest=object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="latency_digest"):
        AdaptiveBulkhead(latency_threshold=0.1, max_concurrent=4, latency_quantile=0.9, label="a",
                         latency_digest="redis")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="interval"):
        SharedLatency(store=RedisStore(URL), label="lat", interval=0)
    with pytest.raises(ValueError, match="half_life"):
        SharedLatency(store=RedisStore(URL), label="lat", half_life=-1)
    # Decayed on the server's clock, in microseconds: a shorter half-life cannot be kept (it was
    # taken as 1 us, a decay up to a thousand times slower than asked).
    with pytest.raises(ValueError, match="half_life"):
        SharedLatency(store=RedisStore(URL), label="lat", half_life=1e-7)
    with pytest.raises(ValueError, match="label"):
        SharedLatency(store=RedisStore(URL), label="a b")
    with pytest.raises(TypeError, match="store"):
        SharedLatency(store="redis://x", label="lat")  # type: ignore[arg-type]


@pytest.mark.parametrize("reply", [["x"], [0, b"3"], [0, b"L", b"1", b"999", b"1.0"], [0, b"4", b"-1"],
                                   [0, b"nope", b"1.0"], "text", []])
async def test_a_sketch_reply_of_unexpected_shape_keeps_the_local_estimate(reply: Any) -> None:
    sink = RecordingSink()
    clock = VirtualClock()
    store = RedisStore(URL, clock=clock)

    async def answer(*args: Any, **kwargs: Any) -> Any:
        return reply

    store._timed = answer  # type: ignore[method-assign]
    digest = SharedLatency(store=store, label="lat", clock=clock)
    estimate = digest.estimator(0.5, window=50)
    with stoic.use_sinks(sink):
        for n in range(40):
            estimate.add(1e6 * (n + 1))
        assert not await digest.flush()
    assert digest.degraded and digest.samples == 0.0
    assert estimate.value == estimate.local.value is not None
    assert sink.of("fleet.store_error")


def test_call_without_a_store_goes_through_the_fallback_or_refuses() -> None:
    sink = RecordingSink()
    with stoic.use_sinks(sink):
        opened = SharedCircuitBreaker(label="sync-open", store=RedisStore(URL, budget=0.05))
        closed = SharedCircuitBreaker(label="sync-closed", store=RedisStore(URL, budget=0.05),
                                      fail_open_on_store_error=False)
        assert opened.call(lambda: "ok") == "ok"
        assert opened.degraded and opened.snapshot == opened.fallback.snapshot
        with pytest.raises(CircuitOpen) as info:
            closed.call(lambda: "never")
        assert info.value.retry_after is None
    assert sink.of("fleet.fail_open") and sink.of("fleet.fail_closed")


@pytest.mark.parametrize("reply", [[0, 0, -1, 1, 0, 0], [2, 1, -1, 5, 1, 0]], ids=["closed", "half-open"])
async def test_a_passed_deadline_refuses_the_shared_breaker_before_it_asks_or_runs(reply: Any) -> None:
    # CircuitBreaker's rule (seed 000: a policy that finds the deadline passed does not start work
    # that is already late): no call runs, no probe lease of the fleet's is taken by a doomed call.
    sink = RecordingSink()
    store = RedisStore(URL)
    calls = _answer(store, reply)
    blocking: list[int] = []

    def timed_blocking(*args: Any) -> Any:
        blocking.append(1)
        return reply

    store._timed_blocking = timed_blocking  # type: ignore[method-assign]
    breaker = SharedCircuitBreaker(label="late", store=store)
    ran: list[int] = []

    async def run() -> None:
        ran.append(1)

    wrapped = breaker(run)
    with stoic.use_sinks(sink):
        async with stoic.timeout(0):
            with pytest.raises(stoic.DeadlineExceeded):
                await breaker.execute(run)
            with pytest.raises(stoic.DeadlineExceeded):
                breaker.call(ran.append, 1)
            with pytest.raises(stoic.DeadlineExceeded):
                await wrapped()
    assert ran == [] and calls == [] and blocking == []
    assert [e.attributes["reason"] for e in sink.of("breaker.rejected")] == ["deadline_exceeded"] * 3
    sink.assert_contract()
    # The same breaker decides as usual once the deadline is gone.
    assert await breaker.execute(run) is None and ran == [1]


async def test_a_replica_that_found_every_probe_lease_taken_refuses_locally_until_its_next_refresh(
    clock: VirtualClock, sink: RecordingSink,
) -> None:
    # Half-open with the fleet's lease held by a probe elsewhere: each call asking the store for
    # a lease would put the fleet's whole request rate on Redis for as long as the probe runs
    # (and a round trip on every refusal). The copy of "every lease taken" is trusted for
    # refresh_interval, as the copy of the closed and open states is.
    store = RedisStore(URL, clock=clock)
    full = [2, 1, -1, 5, 0, 0]  # half-open, no lease granted
    calls = _answer(store, full)
    breaker = SharedCircuitBreaker(label="herd", store=store, refresh_interval=0.1, clock=clock)
    ran: list[int] = []

    async def run() -> None:
        ran.append(1)

    for _ in range(3):
        results = await asyncio.gather(*(breaker.execute(run) for _ in range(300)), return_exceptions=True)
        assert all(isinstance(r, CircuitOpen) and r.retry_after is None for r in results)
        await clock.advance(0.1)
    assert ran == []
    assert len(calls) <= 3 * 2  # per refresh interval: one read and one lease request at most
    assert len(sink.of("breaker.rejected")) == 900
    _answer(store, full, [2, 1, -1, 5, 1, 0], full)  # read; the lease was given back elsewhere: granted
    assert await breaker.execute(run) is None and ran == [1]


async def test_a_refresh_cancelled_while_it_gives_an_orphaned_lease_back_keeps_it_for_the_next_contact(
    clock: VirtualClock,
) -> None:
    store = RedisStore(URL, probe_interval=1.0, clock=clock)
    half_open = [2, 1, -1, 5, 0, 0]
    sent: list[tuple[str, tuple[Any, ...]]] = []
    stall = asyncio.Event()
    stalled = asyncio.Event()

    async def timed(script: _Script, keys: Any, args: Any, *rest: Any) -> Any:
        sent.append((script.name, tuple(args[9:])))
        if script.name == "breaker_probe" and len(sent) == 2:
            raise StoreError("timed out", operation=script.name, unavailable=True)  # granted? unknown
        if script.name == "breaker_done" and not stall.is_set():
            stall.set()
            stalled.set()
            await asyncio.Event().wait()  # the give-back is stuck on the wire
        return half_open

    store._timed = timed  # type: ignore[method-assign]
    breaker = SharedCircuitBreaker(label="orphan", store=store, clock=clock)

    async def run() -> None:
        pass

    await breaker.execute(run)  # read half-open; the lease request got no answer: the fallback ran
    token = sent[1][1][0]
    await clock.advance(1.0)  # the store's rest is over
    refreshing = asyncio.create_task(breaker.refresh())
    await stalled.wait()
    refreshing.cancel()  # its caller's deadline, say
    with pytest.raises(asyncio.CancelledError):
        await refreshing
    await breaker.refresh()  # the next contact still gives the lease back
    assert sent[-1] == ("breaker_done", (token, "none"))


@pytest.mark.parametrize("policy", ["limiter", "breaker", "latency"])
async def test_a_store_answering_replies_of_the_wrong_shape_has_not_recovered_until_one_is_used(
    clock: VirtualClock, sink: RecordingSink, policy: str,
) -> None:
    store = RedisStore(URL, clock=clock)
    good = {"limiter": [1, 0, 5], "breaker": [0, 0, -1, 1, 0, 0], "latency": [0]}[policy]
    wrong = {"limiter": [7, 7], "breaker": [0, 0], "latency": ["x"]}[policy]
    _answer(store, wrong)
    limiter = SharedRateLimiter(100, store=store, label="shape", clock=clock)
    breaker = SharedCircuitBreaker(label="shape", store=store, clock=clock, refresh_interval=0.1)
    digest = SharedLatency(store=store, label="shape", clock=clock)

    async def decide() -> None:
        if policy == "limiter":
            await limiter.try_acquire()
        elif policy == "breaker":
            await breaker.refresh()
        else:
            await digest.flush()

    for _ in range(3):
        await decide()
    # Every call failed: an outage under way, not three short ones each ended by the next failure.
    assert [e.name for e in sink.events if e.name.startswith("fleet.store_")] == ["fleet.store_error"] * 3
    _answer(store, good)
    await clock.advance(1.0)
    await decide()
    await decide()
    assert [e.name for e in sink.events if e.name.startswith("fleet.store_")][3:] == ["fleet.store_recovered"]
    assert sink.of("fleet.store_recovered")[0].attributes["outage"] == 1.0


async def test_first_calls_waiting_for_a_read_of_a_corrupted_generation_are_not_held_in_a_loop() -> None:
    store = RedisStore(URL)
    calls: list[int] = []

    async def timed(*args: Any) -> Any:
        calls.append(1)
        await asyncio.sleep(0)  # a round trip: the other first calls wait for this read
        return [0, 0, -1, -1, 0, 0]

    store._timed = timed  # type: ignore[method-assign]
    breaker = SharedCircuitBreaker(label="corrupt", store=store)

    async def ok() -> int:
        return 1

    assert await asyncio.wait_for(asyncio.gather(*(breaker.execute(ok) for _ in range(200))), 5.0) == [1] * 200
    assert breaker.degraded and len(calls) <= 2


@pytest.mark.parametrize("blocking", [False, True], ids=["execute", "call"])
async def test_a_contact_throws_a_lost_switch_again_and_gives_orphaned_leases_back_on_both_paths(
    clock: VirtualClock, blocking: bool,
) -> None:
    # One set of rules for a contact with the store (refresh, the switch thrown again on an
    # emptied store, then the orphaned probe leases, each kept until answered), on execute()'s
    # path and call()'s alike: the same requests, in the same order, with the same outcomes.
    store = RedisStore(URL, probe_interval=1.0, clock=clock)
    half_open, forced, empty = [2, 1, -1, 5, 0, 0], [3, 1, -1, 6, 0, 0], [0, 0, -1, 0, 0, 0]
    lost = StoreError("timed out", operation="breaker", unavailable=True)
    script: list[Any] = [half_open, lost, forced, empty, forced, lost, forced, forced, forced]
    sent: list[tuple[str, tuple[Any, ...]]] = []

    def answer(name: str, args: Any) -> Any:
        sent.append((name, tuple(args[9:])))
        reply = script.pop(0)
        if isinstance(reply, BaseException):
            raise reply
        return reply

    async def timed(s: _Script, keys: Any, args: Any, *rest: Any) -> Any:
        return answer(s.name, args)

    store._timed = timed  # type: ignore[method-assign]
    store._timed_blocking = lambda s, keys, args: answer(s.name, args)  # type: ignore[method-assign]
    breaker = SharedCircuitBreaker(label="contact", store=store, clock=clock)

    async def run() -> str:
        return "ran"

    async def through() -> str:
        if blocking:
            return breaker.call(lambda: "ran")
        return await breaker.execute(run)

    assert await through() == "ran"  # half-open; the lease request got no answer: the fallback ran
    token = sent[1][1][0]
    await clock.advance(1.0)  # the store's rest is over
    await breaker.force_open()  # this replica throws the switch
    await clock.advance(1.0)
    with pytest.raises(CircuitOpen):
        await through()  # an emptied store: the switch again; the give-back got no answer
    assert breaker.degraded and breaker.fallback.state is BreakerState.OPEN
    await clock.advance(1.0)
    with pytest.raises(CircuitOpen):
        await through()  # forced (no second throw); the lease goes back now
    await clock.advance(1.0)
    with pytest.raises(CircuitOpen):
        await through()  # nothing left to give back
    assert sent == [
        ("breaker_refresh", ()), ("breaker_probe", (token,)), ("breaker_force", ("open",)),
        ("breaker_refresh", ()), ("breaker_force", ("open",)), ("breaker_done", (token, "none")),
        ("breaker_refresh", ()), ("breaker_done", (token, "none")),
        ("breaker_refresh", ()),
    ]
    assert not script


async def test_an_async_flush_cancelled_while_it_waits_for_a_sync_push_leaves_nothing_behind() -> None:
    import threading

    store = RedisStore(URL)
    holds, release = threading.Event(), threading.Event()

    def timed_blocking(script: _Script, keys: Any, args: Any) -> Any:
        holds.set()
        assert release.wait(10)
        return [0]

    async def timed(script: _Script, keys: Any, args: Any, *rest: Any) -> Any:
        return [0, "3", "2.0"]

    store._timed_blocking = timed_blocking  # type: ignore[method-assign]
    store._timed = timed  # type: ignore[method-assign]
    digest = SharedLatency(store=store, label="mixed", interval=3600.0, clock=VirtualClock())
    pusher = threading.Thread(target=digest.flush_blocking, daemon=True)
    pusher.start()
    assert await asyncio.to_thread(holds.wait, 10)
    flushing = asyncio.create_task(digest.flush())
    await asyncio.sleep(0)
    assert not flushing.done()  # waiting for the push on the sync client
    flushing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await flushing
    release.set()
    await asyncio.to_thread(pusher.join, 10)
    assert not pusher.is_alive() and not digest._waiting  # the cancelled waiter left the queue
    assert await digest.flush() and digest.samples == 2.0  # (the async client's canned read)
