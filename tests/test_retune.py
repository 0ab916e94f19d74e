"""Retuning plain policies live through the control plane (issue 14, item 2; seed 003, "Control
plane"): validated by each kind's constructor (ValueError naming the parameter, the live policy
unchanged), applied without losing calls in flight or leaking slots and permits, adaptive state
dropped, and a control.retuned event per action."""

from __future__ import annotations

import asyncio
import copy
import threading
from typing import Any

import pytest
from _threads import GateLock

from stoic import (
    IDEMPOTENT,
    AdaptiveBulkhead,
    AdaptiveThrottle,
    BlockingBulkhead,
    BlockingRateLimiter,
    Bulkhead,
    BulkheadFull,
    CircuitBreaker,
    CircuitOpen,
    ControlPlane,
    CountWindow,
    GradientBulkhead,
    Hedge,
    OpenDuration,
    RateLimited,
    RateLimiter,
    Throttled,
)
from stoic.testing import RecordingSink, VirtualClock


def _state(policy: object) -> dict[str, Any]:
    """Every slot of ``policy`` (copied when it is a container), to compare before and after."""
    seen: dict[str, Any] = {}
    for cls in type(policy).__mro__:
        for name in getattr(cls, "__slots__", ()):
            if name != "__weakref__" and hasattr(policy, name):
                value = getattr(policy, name)
                seen[name] = copy.copy(value) if isinstance(value, (list, dict)) else value
    return seen


def _plane(clock: VirtualClock, policy: Any) -> ControlPlane:
    plane = ControlPlane(clock=clock)
    plane.register(policy)
    return plane


def _builders(clock: VirtualClock) -> dict[str, Any]:
    return {
        "breaker": CircuitBreaker(label="breaker", clock=clock),
        "limiter": RateLimiter(10, label="limiter", clock=clock),
        "blocking_limiter": BlockingRateLimiter(10, label="blocking_limiter", clock=clock),
        "bulkhead": Bulkhead(4, queue_limit=8, label="bulkhead", clock=clock),
        "blocking_bulkhead": BlockingBulkhead(4, label="blocking_bulkhead", clock=clock),
        "aimd": AdaptiveBulkhead(latency_threshold=0.1, max_concurrent=8, label="aimd", clock=clock),
        "gradient": GradientBulkhead(max_concurrent=8, label="gradient", clock=clock),
        "throttle": AdaptiveThrottle(label="throttle", clock=clock),
        "hedge": Hedge(0.05, label="hedge", clock=clock),
    }


# (kind, an invalid change and the parameter the error names, a valid change and how to read it)
CASES = [
    ("breaker", {"minimum_calls": 0}, "minimum_calls", {"failure_rate_threshold": 0.25},
     lambda p: p._fppm == 250_000),
    ("limiter", {"rate": 0}, "rate", {"rate": 20, "queue_limit": None},
     lambda p: p.rate == 20 and p.queue_limit is None),
    ("blocking_limiter", {"per": -1.0}, "per", {"per": 2.0}, lambda p: p.per == 2.0),
    ("bulkhead", {"queue_limit": -1}, "queue_limit", {"max_concurrent": 6}, lambda p: p.max_concurrent == 6),
    ("blocking_bulkhead", {"max_concurrent": 0}, "max_concurrent", {"queue_limit": 3}, lambda p: p.queue_limit == 3),
    ("aimd", {"backoff_ratio": 1.5}, "backoff_ratio", {"latency_threshold": 0.5},
     lambda p: p._algorithm.threshold_ns == 500_000_000),
    ("gradient", {"rtt_tolerance": 0.5}, "rtt_tolerance", {"headroom": 1.0}, lambda p: p._algorithm.headroom == 1.0),
    ("throttle", {"k": 0.5}, "k", {"max_probability": 0.5}, lambda p: p.max_probability == 0.5),
    ("hedge", {"max_attempts": 1}, "max_attempts", {"delay": 0.2}, lambda p: p.current_delay == 0.2),
]


@pytest.mark.parametrize(("kind", "bad", "named", "good", "check"), CASES, ids=[c[0] for c in CASES])
def test_every_kind_retunes_validated_by_its_constructor(kind: str, bad: dict[str, Any], named: str,
                                                         good: dict[str, Any], check: Any, clock: VirtualClock,
                                                         sink: RecordingSink) -> None:
    policy = _builders(clock)[kind]
    plane = _plane(clock, policy)
    before = _state(policy)
    with pytest.raises(ValueError, match=named):
        plane.retune(kind, **bad)
    with pytest.raises(TypeError, match="label"):
        plane.retune(kind, label="other")
    with pytest.raises(TypeError, match="clock"):
        plane.retune(kind, clock=VirtualClock())
    with pytest.raises(TypeError, match="nonsense"):
        plane.retune(kind, nonsense=1)
    with pytest.raises(ValueError, match="at least one"):
        plane.retune(kind)
    assert _state(policy) == before  # every refusal left the live policy as it was
    assert plane.retune(kind, actor="ops", **good) == 1
    assert check(policy)
    (event,) = sink.of("control.retuned")
    assert event.label == kind
    assert dict(event.attributes) == {"policies": 1, "parameters": ",".join(sorted(good)), "actor": "ops"}


@pytest.mark.parametrize("kind", [c[0] for c in CASES])
def test_a_retune_that_changes_nothing_keeps_the_configuration(kind: str, clock: VirtualClock) -> None:
    # The settings a kind reads back rebuild exactly its configuration: retuning one parameter
    # to its current value moves nothing else.
    policy = _builders(clock)[kind]
    name, value = {
        "breaker": ("half_open_probes", 1), "limiter": ("rate", 10), "blocking_limiter": ("rate", 10),
        "throttle": ("k", 2.0), "hedge": ("max_attempts", 2), "blocking_bulkhead": ("max_concurrent", 4),
        "bulkhead": ("max_concurrent", 4), "aimd": ("max_concurrent", 8), "gradient": ("max_concurrent", 8),
    }[kind]
    before = _state(policy)
    policy._retune(**{name: value})
    after = _state(policy)
    for volatile in ("_algorithm", "_estimate", "_requests", "_accepts", "_epoch", "_closed_epoch", "_stamp",
                     "_deficit"):
        before.pop(volatile, None)
        after.pop(volatile, None)
    assert after == before


# ---------------------------------------------------------------------------- rate limiter


async def test_a_limiter_serves_at_the_new_rate_from_the_retune_losing_no_waiter(clock: VirtualClock) -> None:
    limiter = RateLimiter(10, label="in", queue_limit=None, clock=clock)
    served: list[int] = []

    async def one(i: int) -> None:
        await limiter.acquire()
        served.append(i)

    tasks = [asyncio.create_task(one(i)) for i in range(300)]
    await clock.advance(1.0)
    assert len(served) == 20  # the burst of 10, then 10 a second
    _plane(clock, limiter).retune("in", rate=100)  # the burst follows the rate (built without one)
    assert limiter.burst == 100
    await clock.advance(1.0)
    assert 119 <= len(served) <= 121  # 100 more in the second after the retune, nothing earned lost
    await clock.advance(2.0)
    await asyncio.gather(*tasks)
    assert sorted(served) == list(range(300)) and served == sorted(served)  # every waiter, in order
    assert limiter.waiter_count == 0 and limiter._queued == 0
    # The last of 300 was served at 3.8 s (20 + 100 a second from 2 s): 0.2 s of credit since.
    assert limiter.available_permits == 20


async def test_a_limiter_retuned_to_a_longer_period_keeps_its_credit_in_permits(clock: VirtualClock) -> None:
    limiter = RateLimiter(10, label="in", burst=10, clock=clock)
    for _ in range(4):
        assert limiter.try_acquire()
    limiter._retune(per=2.0)
    assert limiter.available_permits == 6  # 6 permits left before, 6 after (in the new unit)
    await clock.advance(2.0)
    assert limiter.available_permits == 10  # 10 per 2 s now, capped at the burst


async def test_a_head_waiting_across_a_new_period_pays_the_new_price(clock: VirtualClock) -> None:
    limiter = RateLimiter(10, label="in", burst=10, clock=clock)
    assert limiter.try_acquire(10)
    waiting = asyncio.create_task(limiter.acquire(2))  # asleep until 0.2 s at 10 a second
    await asyncio.sleep(0)
    limiter._retune(per=0.1)  # 10 per 0.1 s: the head's 2 permits now cost a fifth of the time
    await clock.advance(0.2)
    await waiting
    assert limiter.available_permits == 10  # 20 permits earned by 0.2 s, 2 paid, capped at the burst


async def test_a_burst_below_a_waiting_request_is_refused(clock: VirtualClock) -> None:
    limiter = RateLimiter(1, label="in", burst=5, clock=clock)
    assert limiter.try_acquire(5)
    waiting = asyncio.create_task(limiter.acquire(4))
    await asyncio.sleep(0)
    before = _state(limiter)
    with pytest.raises(ValueError, match="burst"):
        limiter._retune(burst=3)
    assert _state(limiter) == before
    await clock.advance(4.0)
    await waiting


def test_a_blocking_limiter_retuned_while_threads_wait() -> None:
    limiter = BlockingRateLimiter(10, label="bin", burst=1, queue_limit=None)  # the system clock
    assert limiter.try_acquire()
    done: list[int] = []
    threads = [threading.Thread(target=lambda: (limiter.acquire(), done.append(1))) for _ in range(50)]
    for t in threads:
        t.start()
    # Until every thread has queued (5 s of waiting at 10 a second); counting the ones served
    # meanwhile, since on a loaded machine starting 50 threads can take longer than a permit.
    while limiter.waiter_count + len(done) < 50:
        threading.Event().wait(0.001)
    limiter._retune(rate=100_000)
    for t in threads:
        t.join(10)
    assert len(done) == 50 and limiter.waiter_count == 0 and limiter._queued == 0


def test_a_retune_wakes_the_blocking_head_asleep_on_the_system_clock() -> None:
    # The head has computed a 100 s sleep at the old rate; the new rate must serve it now, not
    # when that sleep would have ended (the thread would still be asleep at the join below).
    limiter = BlockingRateLimiter(1, per=100.0, burst=1, label="slow-head")
    assert limiter.try_acquire()
    served = threading.Event()
    thread = threading.Thread(target=lambda: (limiter.acquire(), served.set()), daemon=True)
    thread.start()
    while limiter.waiter_count < 1:
        threading.Event().wait(0.001)
    threading.Event().wait(0.01)  # into its sleep
    assert not served.is_set()
    limiter._retune(rate=100_000, per=1.0)
    thread.join(5)
    assert served.is_set() and limiter.waiter_count == 0


def _in_a_wait(cond: threading.Condition) -> bool:
    return bool(cond._waiters)  # type: ignore[attr-defined]  # (CPython's Condition: the threads in wait())


def test_a_retune_wakes_the_blocking_head_asleep_on_a_virtual_clock() -> None:
    # The head sleeps 100 virtual seconds at the old rate; after the retune its permit costs
    # 10 µs, and time moves just that far. Seen failing before the fix: still asleep at the join.
    clock = VirtualClock()
    limiter = BlockingRateLimiter(1, per=100.0, burst=1, label="virtual-head", clock=clock)
    assert limiter.try_acquire()
    served = threading.Event()
    thread = threading.Thread(target=lambda: (limiter.acquire(), served.set()), daemon=True)
    thread.start()
    try:
        while limiter.waiter_count < 1:
            threading.Event().wait(0.001)
        head = limiter._waiters[0]
        assert head.cond is not None
        # Into its sleep: on its own condition (now) or in the clock's blocking sleep (before).
        while not (_in_a_wait(head.cond) or _in_a_wait(clock._cond)):
            threading.Event().wait(0.001)
        assert not served.is_set()
        limiter._retune(rate=100_000, per=1.0)  # a permit in 10 µs now, not in 100 s
        clock._set_now(10_000)
        thread.join(5)
        assert served.is_set() and limiter.waiter_count == 0
    finally:
        clock._set_now(clock.now_ns() + 1_000 * 1_000_000_000)  # (frees the thread, if still asleep)
        thread.join(5)
    assert clock._blocked == {}


def test_a_blocking_head_on_a_virtual_clock_still_wakes_when_time_reaches_its_instant() -> None:
    clock = VirtualClock()
    limiter = BlockingRateLimiter(1, per=10.0, burst=1, label="virtual-head", clock=clock)
    assert limiter.try_acquire()
    served: list[float] = []
    thread = threading.Thread(target=lambda: (limiter.acquire(), served.append(clock.now())), daemon=True)
    thread.start()
    while limiter.waiter_count < 1 or not clock._blocked:
        threading.Event().wait(0.001)
    clock._set_now(5 * 1_000_000_000)  # half way: woken, recomputes, sleeps on
    threading.Event().wait(0.01)
    assert served == [] and limiter.waiter_count == 1
    clock._set_now(10 * 1_000_000_000)
    thread.join(5)
    assert served == [10.0] and clock._blocked == {}


class _TickingClock(VirtualClock):
    """Virtual time that moves 1 ms on every reading by the main thread (so it moves inside the
    limiter's lock, while a head waits on the clock)."""

    def now_ns(self) -> int:
        now = super().now_ns()
        if threading.current_thread() is threading.main_thread():
            self._set_now(now + 1_000_000)
        return now


def test_time_moved_under_the_limiters_lock_neither_deadlocks_nor_loses_the_heads_wake_up() -> None:
    # Seen deadlocking while the clock notified a waiting head under its condition's lock
    # unconditionally: the reading thread held that lock already.
    clock = _TickingClock()
    limiter = BlockingRateLimiter(1, per=0.01, burst=1, label="ticking", clock=clock)
    assert limiter.try_acquire()
    served = threading.Event()
    thread = threading.Thread(target=lambda: (limiter.acquire(), served.set()), daemon=True)
    thread.start()
    while not clock._blocked:
        threading.Event().wait(0.001)
    for _ in range(10):  # 10 ms of virtual time, each step taken under the limiter's lock
        with pytest.raises(RateLimited):
            limiter.acquire(timeout=0)  # (refused: the head is ahead of it)
    thread.join(5)
    assert served.is_set() and limiter.waiter_count == 0


# ---------------------------------------------------------------------------- bulkheads


async def test_a_bulkhead_grows_and_shrinks_under_hundreds_of_calls_leaking_no_slot(clock: VirtualClock) -> None:
    bulkhead = Bulkhead(10, queue_limit=None, label="db", clock=clock)
    running = peak_after_shrink = 0
    shrunk = False

    async def call() -> None:
        nonlocal running, peak_after_shrink
        running += 1
        if shrunk:
            peak_after_shrink = max(peak_after_shrink, running)
        try:
            await clock.sleep(1.0)
        finally:
            running -= 1

    tasks = [asyncio.create_task(bulkhead.execute(call)) for _ in range(400)]
    await asyncio.sleep(0)
    assert bulkhead.in_use == 10 and bulkhead.queued == 390
    bulkhead._retune(max_concurrent=50)
    await asyncio.sleep(0)
    assert bulkhead.in_use == 50 and running == 50  # the new slots went to waiters at once
    bulkhead._retune(max_concurrent=5)
    assert bulkhead.in_use == 50  # calls running keep their slots
    shrunk = True
    await clock.advance(1.0)
    assert bulkhead.in_use == 5 and running == 5  # released slots above the new limit retired
    await clock.run_until_idle()
    await asyncio.gather(*tasks)
    assert peak_after_shrink <= 5
    assert bulkhead.in_use == 0 and bulkhead.queued == 0


async def test_queue_management_can_be_retuned_in_place_but_not_turned_off_while_callers_wait(
    clock: VirtualClock,
) -> None:
    bulkhead = Bulkhead(1, queue_limit=10, queue_target=0.05, queue_interval=0.2, label="db", clock=clock)
    gate = asyncio.Event()
    first = asyncio.create_task(bulkhead.execute(gate.wait))
    queued = [asyncio.create_task(bulkhead.execute(asyncio.sleep, 0)) for _ in range(3)]
    await asyncio.sleep(0)
    managed = bulkhead._managed
    bulkhead._retune(queue_target=0.1, queue_interval=0.5)
    assert bulkhead._managed is managed and managed is not None and managed.target_ns == 100_000_000
    before = _state(bulkhead)
    with pytest.raises(ValueError, match="queue_target"):
        bulkhead._retune(queue_target=None)
    assert _state(bulkhead) == before
    gate.set()
    await asyncio.gather(first, *queued)
    bulkhead._retune(queue_target=None)  # nobody waits now: plain FIFO again
    assert bulkhead._managed is None and bulkhead.in_use == 0


def test_a_blocking_bulkhead_hands_new_slots_to_waiting_threads_and_retires_them() -> None:
    bulkhead = BlockingBulkhead(1, queue_limit=None, label="pool")
    release = threading.Event()
    lock = threading.Lock()
    running = peak = entered = 0
    shrunk = False

    def work() -> None:
        nonlocal running, peak, entered
        with bulkhead:
            with lock:
                running += 1
                entered += 1
                if shrunk:
                    peak = max(peak, running)
            release.wait(10)
            with lock:
                running -= 1

    threads = [threading.Thread(target=work) for _ in range(20)]
    for t in threads:
        t.start()
    while bulkhead.queued_count < 19:
        threading.Event().wait(0.001)
    bulkhead._retune(max_concurrent=10)
    while entered < 10:
        threading.Event().wait(0.001)
    assert bulkhead.active_count == 10 and bulkhead.queued_count == 10
    with lock:
        shrunk = True
    bulkhead._retune(max_concurrent=2)
    release.set()
    for t in threads:
        t.join(10)
    assert entered == 20 and peak <= 2  # the 10 that waited ran at most 2 at a time
    assert bulkhead.active_count == 0 and bulkhead.queued_count == 0
    bulkhead._retune(queue_limit=0)
    with bulkhead, bulkhead, pytest.raises(BulkheadFull):  # the limit is 2 now
        bulkhead.acquire()


async def test_an_adaptive_bulkhead_drops_its_learnt_limit(clock: VirtualClock, sink: RecordingSink) -> None:
    bulkhead = AdaptiveBulkhead(latency_threshold=0.1, max_concurrent=8, backoff_ratio=0.5, cooldown=0.01,
                                queue_limit=None, label="ad", clock=clock)
    await clock.run(bulkhead.execute(clock.sleep, 1.0))  # slow: backs off to 4
    assert bulkhead.limit == 4
    tasks = [asyncio.create_task(bulkhead.execute(clock.sleep, 0.01)) for _ in range(200)]
    await asyncio.sleep(0)
    assert bulkhead.in_use == 4
    old = bulkhead._algorithm
    bulkhead._retune(max_concurrent=16, backoff_ratio=0.9)
    assert bulkhead.limit == 16 and bulkhead.max_concurrent == 16 and bulkhead._algorithm is not old
    assert bulkhead.in_use == 16  # the waiters took the freed slots at once
    changed = sink.of("bulkhead.limit_changed")[-1]
    assert dict(changed.attributes) == {"old": 4, "new": 16, "cause": "retune"}
    await clock.run_until_idle()
    await asyncio.gather(*tasks)
    assert bulkhead.in_use == 0 and bulkhead.queued == 0
    before = _state(bulkhead)
    with pytest.raises(ValueError, match="min_concurrent"):
        bulkhead._retune(min_concurrent=17)
    assert _state(bulkhead) == before


# ---------------------------------------------------------------------------- throttle, hedge, breaker


async def test_a_throttle_forgets_the_window_judged_under_the_old_configuration(clock: VirtualClock) -> None:
    throttle = AdaptiveThrottle(k=1.0, min_throughput=1, label="t", clock=clock)

    async def timing_out() -> None:
        raise TimeoutError

    for _ in range(50):
        with pytest.raises((TimeoutError, Throttled)):
            await throttle.execute(timing_out)
    assert throttle.probability > 0.5
    before = _state(throttle)
    with pytest.raises(ValueError, match="max_probability"):
        throttle._retune(max_probability=0)
    assert _state(throttle) == before
    throttle._retune(k=3.0, window=60.0)
    assert throttle.k == 3.0 and throttle.requests == 0 and throttle.probability == 0.0
    assert throttle._bucket_ns * 12 == 60_000_000_000


async def test_throttled_calls_in_flight_are_counted_in_the_new_window(clock: VirtualClock) -> None:
    throttle = AdaptiveThrottle(label="t", min_throughput=1000, clock=clock)

    async def timing_out() -> None:
        raise TimeoutError

    for _ in range(20):
        with pytest.raises(TimeoutError):
            await throttle.execute(timing_out)
    tasks = [asyncio.create_task(throttle.execute(clock.sleep, 0.5)) for _ in range(300)]
    await asyncio.sleep(0)
    assert (throttle.requests, throttle.accepts) == (20, 0)
    throttle._retune(min_throughput=5)
    assert (throttle.requests, throttle.accepts) == (0, 0)  # judged under the old configuration: dropped
    await clock.run_until_idle()
    await asyncio.gather(*tasks)
    assert (throttle.requests, throttle.accepts) == (300, 300) and throttle.probability == 0.0


async def test_a_gradient_bulkhead_retuned_under_load_keeps_every_call(clock: VirtualClock) -> None:
    bulkhead = GradientBulkhead(max_concurrent=4, queue_limit=None, label="g", clock=clock)
    tasks = [asyncio.create_task(bulkhead.execute(clock.sleep, 0.01)) for _ in range(300)]
    await asyncio.sleep(0)
    assert bulkhead.in_use == 4
    bulkhead._retune(max_concurrent=32, smoothing=0.5)
    assert bulkhead.limit == 32 and bulkhead.in_use == 32 and bulkhead._algorithm.smoothing == 0.5
    await clock.run_until_idle()
    await asyncio.gather(*tasks)
    assert bulkhead.in_use == 0 and bulkhead.queued == 0


async def test_hedged_calls_in_flight_finish_across_a_retune(clock: VirtualClock) -> None:
    hedge = Hedge(0.1, label="h", clock=clock, quantile=0.9)
    starts = 0

    async def slow() -> int:
        nonlocal starts
        starts += 1
        await clock.sleep(0.3)
        return 1

    tasks = [asyncio.create_task(hedge.execute(IDEMPOTENT, slow)) for _ in range(200)]
    await clock.advance(0.05)
    estimate = hedge._estimate
    hedge._retune(delay=0.5, max_attempts=3)
    assert hedge._estimate is not estimate and hedge.current_delay == 0.5  # the estimate restarts
    await clock.run_until_idle()
    assert await asyncio.gather(*tasks) == [1] * 200
    before = _state(hedge)
    with pytest.raises(ValueError, match="delay_min"):
        hedge._retune(delay_min=1.0, delay_max=0.5)
    assert _state(hedge) == before
    hedge._retune(quantile=None)
    assert hedge._estimate is None and hedge.quantile is None


async def test_a_closed_breaker_starts_a_fresh_window_and_calls_in_flight_finish_stale(
    clock: VirtualClock, sink: RecordingSink,
) -> None:
    breaker = CircuitBreaker(label="dep", window=CountWindow(10), minimum_calls=5, clock=clock)

    async def fail() -> None:
        raise ConnectionError("down")

    for _ in range(4):
        with pytest.raises(ConnectionError):
            await breaker.execute(fail)
    assert breaker.snapshot.failures == 4

    async def slow() -> int:
        await clock.sleep(1.0)
        return 7

    tasks = [asyncio.create_task(breaker.execute(slow)) for _ in range(300)]
    await asyncio.sleep(0)
    breaker._retune(minimum_calls=2, failure_rate_threshold=0.9)
    assert breaker.snapshot.calls == 0  # what the old thresholds judged is gone
    await clock.run_until_idle()
    assert await asyncio.gather(*tasks) == [7] * 300
    assert breaker.snapshot.calls == 0 and len(sink.of("breaker.ignored")) == 300  # stale, not lost
    for _ in range(2):
        with pytest.raises(ConnectionError):
            await breaker.execute(fail)
    assert str(breaker.state) == "open"  # the new minimum_calls and threshold judge
    breaker._retune(half_open_probes=3)  # open: the state and its period are kept
    assert str(breaker.state) == "open"
    with pytest.raises(CircuitOpen):
        await breaker.execute(slow)


async def test_a_breaker_retuned_to_more_probes_while_half_open_finishes_its_episode(clock: VirtualClock) -> None:
    # The episode under way keeps the probe count it started with: a retune applies from the next
    # one (with the new count, a probe's success could never close it, nor would any probe run).
    breaker = CircuitBreaker(label="hp", window=CountWindow(4), minimum_calls=4,
                             open_duration=OpenDuration.fixed(1.0), half_open_probes=1, clock=clock)

    async def fail() -> None:
        raise ConnectionError("down")

    for _ in range(4):
        with pytest.raises(ConnectionError):
            await breaker.execute(fail)
    await clock.advance(1.5)
    gate = asyncio.Event()

    async def probe() -> str:
        await gate.wait()
        return "ok"

    probing = asyncio.create_task(breaker.execute(probe))
    await asyncio.sleep(0)
    breaker._retune(half_open_probes=3)
    gate.set()
    assert await probing == "ok"
    assert str(breaker.state) == "closed"


def test_a_retune_keeps_the_fleet_latency_digest_and_a_per_call_site_budget_stays_the_policys() -> None:
    pytest.importorskip("redis")
    from stoic import RetryBudget
    from stoic.fleet import RedisStore, SharedLatency

    store = RedisStore("redis://127.0.0.1:1", budget=0.01)  # never reached: nothing is pushed here
    digest = SharedLatency(store=store, label="h1")
    hedge = Hedge(0.01, quantile=0.9, label="h", latency_digest=digest)
    kind = type(hedge._estimate)
    hedge._retune(max_attempts=3)
    assert hedge._digest is digest and type(hedge._estimate) is kind and hedge.max_attempts == 3
    bulkhead = AdaptiveBulkhead(latency_threshold=0.1, max_concurrent=10, latency_quantile=0.9, label="b",
                                latency_digest=SharedLatency(store=store, label="b1"))
    kept = bulkhead._algorithm._digest
    bulkhead._retune(max_concurrent=20)
    assert kept is not None and bulkhead._algorithm._digest is kept

    def first() -> Hedge:
        return Hedge(0.01, label="a", budget=RetryBudget.PER_CALL_SITE)

    def second() -> Hedge:
        return Hedge(0.01, label="b", budget=RetryBudget.PER_CALL_SITE)

    a, b = first(), second()
    before = (a.budget, b.budget)
    a._retune(budget=RetryBudget.PER_CALL_SITE)
    b._retune(budget=RetryBudget.PER_CALL_SITE)
    assert (a.budget, b.budget) == before and a.budget is not b.budget  # each its own site's bucket


def test_a_blocking_bulkhead_retunes_its_queue_management_as_the_asyncio_one_does() -> None:
    bulkhead = BlockingBulkhead(2, queue_limit=10, queue_target=0.01, label="y")
    bulkhead._retune(queue_target=0.02, queue_interval=0.2)
    assert bulkhead._settings()["queue_target"] == 0.02 and bulkhead._settings()["queue_interval"] == 0.2
    with pytest.raises(ValueError, match="queue"):
        bulkhead._retune(queue_limit=0)  # refused as by the constructor: queue management needs a queue
    assert bulkhead.queue_limit == 10
    bulkhead._retune(queue_target=None)  # off, with nobody waiting
    assert bulkhead._rules is None
    bulkhead._retune(prioritized=True)  # and on again
    assert bulkhead._rules is not None and bulkhead._rules.prioritized


async def test_a_keyed_family_refused_by_one_key_leaves_every_key_as_it_was(clock: VirtualClock) -> None:
    from stoic import Keyed

    family = Keyed(Bulkhead, label="kb", clock=clock, max_concurrent=1, queue_limit=5)
    a, b = family.get("a"), family.get("b")
    gate = asyncio.Event()
    running = [asyncio.create_task(b.execute(gate.wait)) for _ in range(2)]  # one runs, one waits
    await asyncio.sleep(0)
    assert b.queued == 1
    with pytest.raises(ValueError, match="queue management"):
        family.retune(max_concurrent=4, queue_target=0.01)
    assert (a.max_concurrent, b.max_concurrent, a._managed, b._managed) == (1, 1, None, None)
    assert family.config["max_concurrent"] == 1 and "queue_target" not in family.config
    gate.set()
    await asyncio.gather(*running)


async def test_a_faster_rate_serves_the_queue_at_once_not_when_the_old_rate_would_have(clock: VirtualClock) -> None:
    limiter = RateLimiter(1, 100.0, queue_limit=None, label="fast", clock=clock)
    await limiter.acquire()
    served: list[float] = []

    async def wait_turn() -> None:
        await limiter.acquire()
        served.append(clock.now())

    waiting = [asyncio.create_task(wait_turn()) for _ in range(3)]
    await asyncio.sleep(0)
    await clock.advance(1.0)
    limiter._retune(rate=1000, per=1.0)  # the head was asleep until t=100 s at the old rate
    await clock.advance(0.01)
    assert len(served) == 3 and max(served) <= 1.01
    await asyncio.gather(*waiting)


@pytest.mark.parametrize("kind", ["bulkhead", "blocking_bulkhead", "aimd", "gradient"])
def test_a_queue_interval_given_alone_survives_a_retune_that_turns_an_option_on(kind: str) -> None:
    # queue_interval is validated and kept by the constructor even before an option uses it: a
    # retune of another parameter must not replace it with the default.
    make: dict[str, Any] = {
        "bulkhead": lambda: Bulkhead(2, queue_limit=4, queue_interval=0.5, label="q"),
        "blocking_bulkhead": lambda: BlockingBulkhead(2, queue_limit=4, queue_interval=0.5, label="q"),
        "aimd": lambda: AdaptiveBulkhead(latency_threshold=0.1, max_concurrent=2, queue_limit=4,
                                         queue_interval=0.5, label="q"),
        "gradient": lambda: GradientBulkhead(max_concurrent=2, queue_limit=4, queue_interval=0.5, label="q"),
    }
    policy = make[kind]()
    assert policy._settings()["queue_interval"] == 0.5
    policy._retune(queue_adaptive_lifo=True)
    rules = policy._queue_rules()
    assert rules is not None and rules.interval_ns == 500_000_000 and rules.lifo


# (kind, a change made by another thread, the change made here, how to read that both hold)
CONCURRENT = [
    ("breaker", {"failure_rate_threshold": 0.25}, {"minimum_calls": 3},
     lambda p: (p._fppm, p._minimum) == (250_000, 3)),
    ("blocking_limiter", {"rate": 50}, {"queue_limit": 7}, lambda p: (p.rate, p.burst, p.queue_limit) == (50, 50, 7)),
    ("blocking_bulkhead", {"max_concurrent": 6}, {"queue_limit": 7},
     lambda p: (p.max_concurrent, p.queue_limit) == (6, 7)),
]


@pytest.mark.parametrize(("kind", "theirs", "mine", "check"), CONCURRENT, ids=[c[0] for c in CONCURRENT])
def test_two_threads_retuning_one_policy_at_once_lose_neither_change(kind: str, theirs: dict[str, Any],
                                                                     mine: dict[str, Any], check: Any) -> None:
    # Seen failing before the fix: each retune read the policy's settings before taking its
    # lock, so one that another thread's retune overtook in between wrote that thread's
    # parameters back to their old values (the kinds "may be acted on from any thread").
    clock = VirtualClock()
    policy = _builders(clock)[kind]
    plane = _plane(clock, policy)
    gate = GateLock(policy._lock)
    policy._lock = gate
    gate.hook = lambda: plane.retune(kind, **theirs)  # lands just before this retune takes the lock
    plane.retune(kind, **mine)
    assert gate.hook is None  # (the other retune ran in between)
    assert check(policy)
