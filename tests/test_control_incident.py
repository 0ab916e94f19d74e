"""An operator in an incident against the control plane: retunes under hundreds of calls in
flight and queued, several retunes at once, limits and queue limits lowered below what is in use,
and the events a retune emits. Everything on the virtual clock."""

from __future__ import annotations

import asyncio
import random
import threading
from typing import Any

import pytest

from stoic import (
    AdaptiveBulkhead,
    BlockingBulkhead,
    BlockingRateLimiter,
    Bulkhead,
    BulkheadFull,
    ControlPlane,
    GradientBulkhead,
    Keyed,
    RateLimited,
    RateLimiter,
    Shed,
)
from stoic.testing import RecordingSink, VirtualClock

BULKHEADS = {
    "plain": lambda clock: Bulkhead(10, queue_limit=300, label="db", clock=clock),
    "codel": lambda clock: Bulkhead(10, queue_limit=300, queue_target=5.0, queue_interval=10.0, label="db",
                                    clock=clock),
    "prioritized": lambda clock: Bulkhead(10, queue_limit=300, prioritized=True, label="db", clock=clock),
    "aimd": lambda clock: AdaptiveBulkhead(latency_threshold=100.0, max_concurrent=10, queue_limit=300,
                                           label="db", clock=clock),
    "gradient": lambda clock: GradientBulkhead(max_concurrent=10, queue_limit=300, label="db", clock=clock),
}


@pytest.mark.parametrize("kind", list(BULKHEADS))
async def test_retunes_from_many_tasks_under_hundreds_of_calls_grant_no_slot_twice_and_leak_none(
        kind: str, clock: VirtualClock) -> None:
    bulkhead: Any = BULKHEADS[kind](clock)
    plane = ControlPlane(clock=clock)
    plane.register(bulkhead)
    running = 0
    ran = refused = 0
    limits: list[int] = []

    async def work() -> None:
        nonlocal running, ran
        running += 1
        ran += 1
        try:
            # In flight, every running call holds exactly one slot of the bulkhead's count.
            assert running <= bulkhead.in_use
            await clock.sleep(1.0)
        finally:
            running -= 1

    async def caller() -> None:
        nonlocal refused
        try:
            await bulkhead.execute(work)
        except (BulkheadFull, Shed):
            refused += 1

    async def operator(seed: int) -> None:
        rnd = random.Random(seed)
        for _ in range(20):
            await clock.sleep(rnd.choice((0.0, 0.25, 0.5)))
            limit = rnd.randint(1, 40)
            plane.retune("db", max_concurrent=limit, queue_limit=rnd.choice((1, 3, 50, None)), actor=f"op{seed}")
            limits.append(limit)

    callers = [asyncio.create_task(caller()) for _ in range(300)]
    await asyncio.sleep(0)
    assert bulkhead.in_use == 10 and bulkhead.queued == 290
    operators = [asyncio.create_task(operator(seed)) for seed in range(4)]
    more = []
    for _ in range(30):
        await clock.advance(0.25)
        more += [asyncio.create_task(caller()) for _ in range(10)]
        assert running == bulkhead.in_use  # no slot counted without a call in it, none granted twice
    await asyncio.gather(*operators)
    await clock.run_until_idle()
    await asyncio.gather(*callers, *more)
    assert ran + refused == 600
    assert bulkhead.in_use == 0 and bulkhead.queued == 0 and running == 0
    # The last retune holds, and the bulkhead works at it.
    assert bulkhead.max_concurrent == limits[-1]


@pytest.mark.parametrize("kind", list(BULKHEADS))
async def test_a_limit_and_queue_limit_lowered_below_what_is_in_use(kind: str, clock: VirtualClock) -> None:
    bulkhead: Any = BULKHEADS[kind](clock)
    peak = running = 0

    async def work() -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        try:
            await clock.sleep(1.0)
        finally:
            running -= 1

    async def call() -> None:
        try:
            await bulkhead.execute(work)
        except Shed:
            assert kind == "codel"  # CoDel sheds what waited past its interval, as it should

    tasks = [asyncio.create_task(call()) for _ in range(200)]
    await asyncio.sleep(0)
    assert bulkhead.in_use == 10 and bulkhead.queued == 190
    bulkhead._retune(max_concurrent=2, queue_limit=5)
    assert bulkhead.in_use == 10 and bulkhead.queued == 190  # nobody in flight or queued is dropped
    late = asyncio.create_task(bulkhead.execute(work))
    await asyncio.sleep(0)
    assert late.done() and isinstance(late.exception(), BulkheadFull)  # the queue is over its new limit
    peak = 0
    await clock.advance(1.0)
    assert bulkhead.in_use == 2 and running == 2  # eight slots retired as they were released
    await clock.run_until_idle()
    await asyncio.gather(*tasks)
    assert peak <= 2 and bulkhead.in_use == 0 and bulkhead.queued == 0


async def test_a_limiter_retuned_by_many_tasks_serves_every_waiter_once_within_its_rates(
        clock: VirtualClock) -> None:
    limiter = RateLimiter(10, queue_limit=None, label="api", clock=clock)
    plane = ControlPlane(clock=clock)
    plane.register(limiter)
    served: list[int] = []
    refused = 0

    async def one(i: int) -> None:
        nonlocal refused
        try:
            await limiter.acquire()
        except RateLimited:
            refused += 1
            return
        served.append(i)

    tasks = [asyncio.create_task(one(i)) for i in range(300)]
    await asyncio.sleep(0)
    assert limiter.waiter_count == 290

    async def operator(seed: int) -> None:
        rnd = random.Random(seed)
        for _ in range(10):
            await clock.sleep(rnd.choice((0.1, 0.3)))
            plane.retune("api", rate=rnd.randint(1, 50), queue_limit=rnd.choice((0, 5, None)))

    operators = [asyncio.create_task(operator(seed)) for seed in range(3)]
    while not all(task.done() for task in operators):
        await clock.advance(0.1)
    await asyncio.gather(*operators)
    plane.retune("api", rate=100, queue_limit=None)
    await clock.run_until_idle()
    await asyncio.gather(*tasks)
    assert sorted(served) == list(range(300)) and refused == 0  # queued waiters are never dropped
    assert len(set(served)) == 300
    assert limiter.waiter_count == 0 and limiter.available_permits <= 100


async def test_a_queue_limit_lowered_below_the_limiters_queue_keeps_the_queue(clock: VirtualClock) -> None:
    limiter = RateLimiter(1, queue_limit=None, label="api", clock=clock)
    tasks = [asyncio.create_task(limiter.acquire()) for _ in range(101)]
    await asyncio.sleep(0)
    assert limiter.waiter_count == 100
    limiter._retune(queue_limit=2)
    with pytest.raises(RateLimited):
        await limiter.acquire()
    assert limiter.waiter_count == 100
    limiter._retune(rate=1000)
    await clock.advance(1.0)
    await asyncio.gather(*tasks)
    assert limiter.waiter_count == 0


def test_a_retune_emits_exactly_one_control_event_and_a_refused_one_none(clock: VirtualClock,
                                                                          sink: RecordingSink) -> None:
    plane = ControlPlane(clock=clock)
    plane.register(Bulkhead(2, label="db", clock=clock))
    plane.register(AdaptiveBulkhead(latency_threshold=1.0, max_concurrent=8, label="aimd", clock=clock))
    with pytest.raises(ValueError, match="max_concurrent"):
        plane.retune("db", queue_limit=4, max_concurrent=0)
    with pytest.raises(ValueError, match="max_concurrent"):
        plane.retune("aimd", max_concurrent=0, min_concurrent=1)
    assert sink.events == []
    plane.retune("db", max_concurrent=3, queue_limit=4)
    plane.retune("aimd", max_concurrent=4, actor="alice")
    names = [e.name for e in sink.events]
    assert names == ["control.retuned", "bulkhead.limit_changed", "control.retuned"]
    db, limit, aimd = sink.events
    assert dict(db.attributes) == {"policies": 1, "parameters": "max_concurrent,queue_limit"}
    assert dict(limit.attributes) == {"old": 8, "new": 4, "cause": "retune"}
    assert dict(aimd.attributes) == {"policies": 1, "parameters": "max_concurrent", "actor": "alice"}


def _arrive_after_the_checks(monkeypatch: pytest.MonkeyPatch, kind: type[Any], arrival: threading.Thread,
                             last: Any) -> None:
    """Patch ``kind._check_retune`` so that once both keys of a two-key family have been asked,
    ``arrival`` (a thread that uses ``last``) starts, and the retune goes on once it has queued
    on ``last``, or found ``last`` held through the retune (then it waits for it)."""
    checks = 0
    real_check = kind._check_retune

    def check_then_arrive(self: Any, fresh: Any) -> None:
        nonlocal checks
        real_check(self, fresh)
        checks += 1
        if checks == 2:
            arrival.start()
            while not last._lock.locked() and not last._waiters:
                threading.Event().wait(0.001)

    monkeypatch.setattr(kind, "_check_retune", check_then_arrive)


def test_a_family_retune_refused_by_a_request_queued_after_the_checks_leaves_no_key_retuned(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Keyed.retune asks every key first, then retunes them one by one. A thread may queue a
    # request on a blocking key between the two: it must not leave the family torn, the keys
    # before it retuned and the rest (and the family's configuration) not.
    clock = VirtualClock()
    family = Keyed(BlockingRateLimiter, label="tenants", rate=10, queue_limit=None, clock=clock)
    plane = ControlPlane(clock=clock)
    plane.register(family)
    first, last = family.get("a"), family.get("b")
    assert last.try_acquire(10)  # b's credit spent: a request for 8 permits queues
    outcome: list[str] = []

    def request() -> None:
        try:
            last.acquire(8)
            outcome.append("served")
        except RateLimited:
            outcome.append("refused")  # 8 permits from a bucket of 5: never

    arrival = threading.Thread(target=request, daemon=True)
    _arrive_after_the_checks(monkeypatch, BlockingRateLimiter, arrival, last)  # it asks b for 8 permits
    try:
        plane.retune("tenants", burst=5)
    except ValueError as refused:
        assert "burst" in str(refused)
    finally:
        monkeypatch.undo()
    # All or nothing: either every key took burst 5, or none did (and the family neither).
    bursts = {first.burst, last.burst}
    assert len(bursts) == 1, f"a torn family: a has burst {first.burst}, b has {last.burst}"
    assert family.config.get("burst") == (5 if bursts == {5} else None)
    asyncio.run(clock.advance(10.0))  # a queued request is served (8 permits of 10 a second)
    arrival.join(5)
    assert not arrival.is_alive() and outcome and last.waiter_count == 0


def test_a_family_of_blocking_bulkheads_is_not_torn_by_a_waiter_arriving_after_the_checks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The same interleaving for the blocking bulkhead: queue management switched on, which a
    # waiter refuses; one that starts waiting on the last key after every key was asked.
    clock = VirtualClock()
    family = Keyed(BlockingBulkhead, label="pools", max_concurrent=1, queue_limit=5, clock=clock)
    first, last = family.get("a"), family.get("b")
    last.acquire()  # b's one slot taken: the next caller waits
    outcome: list[str] = []

    def caller() -> None:
        last.acquire()
        outcome.append("ran")
        last.release()

    arrival = threading.Thread(target=caller, daemon=True)
    _arrive_after_the_checks(monkeypatch, BlockingBulkhead, arrival, last)
    try:
        family.retune(queue_target=1.0, queue_interval=2.0)
    except ValueError as refused:
        assert "queue_target" in str(refused)
    finally:
        monkeypatch.undo()
    managed = {first._rules is not None, last._rules is not None}
    assert len(managed) == 1, f"a torn family: a managed {first._rules is not None}, b {last._rules is not None}"
    assert ("queue_target" in family.config) == (managed == {True})
    last.release()
    arrival.join(5)
    assert not arrival.is_alive() and outcome == ["ran"] and last.in_use == 0


def test_duplicate_labels_and_names(clock: VirtualClock, sink: RecordingSink) -> None:
    plane = ControlPlane(clock=clock)
    one = plane.register(Bulkhead(2, label="db", clock=clock))
    with pytest.raises(ValueError, match="'db' is registered already"):
        plane.register(Bulkhead(3, label="db", clock=clock))
    with pytest.raises(ValueError, match="registered already"):
        plane.register(Keyed(Bulkhead, label="db", max_concurrent=1, clock=clock))
    plane.register(one)  # the same policy again: no change
    plane.register(one, name="db-alias")  # and under a second name: both steer it
    assert plane.names == ("db", "db-alias")
    plane.retune("db-alias", max_concurrent=5)
    assert one.max_concurrent == 5 and plane.get("db") is one
    (event,) = sink.of("control.retuned")
    assert event.label == "db-alias"  # the name the operator acted on, not the policy's label


def test_a_policy_dropped_by_its_owner_is_still_steered_and_an_evicted_key_is_rebuilt_retuned(
        clock: VirtualClock, sink: RecordingSink) -> None:
    import gc

    plane = ControlPlane(clock=clock)
    plane.register(RateLimiter(5, label="api", clock=clock))  # nobody else holds it
    gc.collect()
    assert plane.retune("api", rate=7) == 1 and plane.get("api").rate == 7
    family = plane.register(Keyed(RateLimiter, label="tenants", rate=5, idle_after=10.0, clock=clock))
    evicted = family.get("acme")
    clock._set_now(clock.now_ns() + 20 * 10**9)
    family.sweep()
    assert "acme" not in family.policies
    assert plane.retune("tenants", rate=9) == 0  # no key held: none retuned
    assert evicted.rate == 5  # the dropped one is nobody's any more
    assert family.get("acme").rate == 9  # built again with the new configuration
    assert [dict(e.attributes)["policies"] for e in sink.of("control.retuned")] == [1, 0]


def test_threads_retuning_and_using_a_blocking_family_at_once_neither_deadlock_nor_tear() -> None:
    clock = VirtualClock()
    family = Keyed(BlockingRateLimiter, label="tenants", rate=10, queue_limit=0, clock=clock)
    plane = ControlPlane(clock=clock)
    plane.register(family)
    stop = threading.Event()
    errors: list[BaseException] = []

    def retuner(seed: int) -> None:
        rnd = random.Random(seed)
        try:
            for _ in range(200):
                plane.retune("tenants", rate=rnd.randint(1, 50), burst=rnd.choice((None, 20, 60)))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def user(seed: int) -> None:
        rnd = random.Random(seed)
        try:
            while not stop.is_set():
                family.get(f"k{rnd.randint(0, 20)}").try_acquire(rnd.randint(1, 3))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    users = [threading.Thread(target=user, args=(i,), daemon=True) for i in range(4)]
    retuners = [threading.Thread(target=retuner, args=(i,), daemon=True) for i in range(3)]
    for t in users + retuners:
        t.start()
    for t in retuners:
        t.join(60)
    stop.set()
    for t in users:
        t.join(60)
    assert not any(t.is_alive() for t in users + retuners), "deadlocked"
    assert errors == []
    config = dict(family.config)
    for key, policy in family.policies.items():  # every key as the family's last configuration says
        assert policy.rate == config["rate"], key
        assert policy.burst == (config["burst"] if config.get("burst") is not None else config["rate"]), key
