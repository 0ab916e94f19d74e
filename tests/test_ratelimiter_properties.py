"""The rate limiter against a reference model, under random schedules (seed 000, "Testing").

The model is the textbook token bucket in exact fractions of a permit: it refills continuously,
caps at ``burst``, and serves its FIFO queue at the exact instant each head's cost is earned; the
limiter, on integer virtual nanoseconds, must serve each request at the first whole nanosecond at
or after that instant. After every step: the same grants at the same instants, the same queue,
and permits granted by ``t`` never above ``burst + rate * t / per``.

The blocking limiter is driven through the same model with threads on a virtual clock that
knows who sleeps until when: time moves to each instant the model serves someone, and the one
sleeping thread (the head: nobody else sleeps) must be sleeping until exactly that instant.
Interrupting a waiting thread stands in for cancelling a waiting task.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections import deque
from dataclasses import dataclass, field
from datetime import timedelta
from fractions import Fraction
from math import ceil
from typing import Any

import pytest
from _threads import eventually
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import stoic
import stoic.ratelimiter as ratelimiter_module
from stoic import RateLimited
from stoic.ratelimiter import BlockingRateLimiter, RateLimiter
from stoic.testing import VirtualClock, settle


@dataclass
class Model:
    rate: int
    per_ns: int
    burst: int
    queue_limit: int | None
    tokens: Fraction = Fraction(0)
    t: int = 0
    queue: deque[tuple[int, int]] = field(default_factory=deque)
    grants: dict[int, int] = field(default_factory=dict)
    granted_permits: int = 0

    def __post_init__(self) -> None:
        self.tokens = Fraction(self.burst)

    def _earned(self, ns: int) -> Fraction:
        return Fraction(self.rate * ns, self.per_ns)

    def run_to(self, target: int) -> None:
        while self.queue:
            ident, permits = self.queue[0]
            if self.tokens < permits:
                need = ceil((permits - self.tokens) * self.per_ns / self.rate)
                if self.t + need > target:
                    break
                # Served at the exact instant its cost was earned; what is earned between that
                # instant and the next whole nanosecond belongs to the bucket afterwards.
                self.tokens = self.tokens + self._earned(need)
                self.t += need
            self.tokens = min(Fraction(self.burst), self.tokens - permits)
            self.queue.popleft()
            self.grants[ident] = self.t
            self.granted_permits += permits
        self.tokens = min(Fraction(self.burst), self.tokens + self._earned(target - self.t))
        self.t = target

    def try_acquire(self, now: int, permits: int) -> bool:
        self.run_to(now)
        if permits > self.burst or self.queue or self.tokens < permits:
            return False
        self.tokens -= permits
        self.granted_permits += permits
        return True

    def acquire(self, now: int, ident: int, permits: int) -> str:
        self.run_to(now)
        if permits > self.burst:
            return "oversized"
        if not self.queue and self.tokens >= permits:
            self.tokens -= permits
            self.grants[ident] = now
            self.granted_permits += permits
            return "granted"
        if self.queue_limit is not None and len(self.queue) >= self.queue_limit:
            return "queue_full"
        self.queue.append((ident, permits))
        return "queued"

    def cancel(self, ident: int) -> None:
        self.queue = deque(entry for entry in self.queue if entry[0] != ident)


Op = tuple[str, int]


async def run_scenario(rate: int, per_ms: int, burst: int, queue_limit: int | None, ops: list[Op]) -> Model:
    clock = VirtualClock()
    limiter = RateLimiter(rate, timedelta(milliseconds=per_ms), burst=burst, queue_limit=queue_limit,
                          label="model", clock=clock)
    model = Model(rate, per_ms * 1_000_000, burst, queue_limit)
    grants: dict[int, int] = {}
    tasks: dict[int, asyncio.Task[None]] = {}
    rejected: dict[int, str] = {}

    async def acquire(ident: int, permits: int) -> None:
        try:
            await limiter.acquire(permits)
        except RateLimited as exc:
            rejected[ident] = "oversized" if exc.retry_after is None else "queue_full"
            return
        grants[ident] = clock.now_ns()

    for step, (kind, value) in enumerate(ops):
        now = clock.now_ns()
        if kind == "advance":
            await clock.advance(value / 1e9)
        elif kind == "try":
            assert limiter.try_acquire(value) == model.try_acquire(now, value), f"step {step}"
        elif kind == "acquire":
            tasks[step] = asyncio.create_task(acquire(step, value))
            await settle()
            outcome = model.acquire(now, step, value)
            if outcome in ("oversized", "queue_full"):
                assert rejected.get(step) == outcome, f"step {step}"
        else:  # cancel the value-th waiter still queued in the model
            if model.queue:
                ident = model.queue[value % len(model.queue)][0]
                tasks[ident].cancel()
                await settle()
                model.cancel(ident)
        model.run_to(clock.now_ns())
        assert grants == model.grants, f"step {step}: {kind} {value}"
        assert limiter.waiter_count == len(model.queue)
        # The invariant, in exact integers: granted * per <= burst * per + rate * t.
        assert model.granted_permits * model.per_ns <= burst * model.per_ns + rate * clock.now_ns()
    for task in tasks.values():
        task.cancel()
    await asyncio.gather(*tasks.values(), return_exceptions=True)
    assert limiter.waiter_count == 0
    return model


op_strategy = st.one_of(
    st.tuples(st.just("advance"), st.integers(0, 3_000_000_000)),
    st.tuples(st.just("advance"), st.integers(0, 5_000)),
    st.tuples(st.just("try"), st.integers(1, 6)),
    st.tuples(st.just("acquire"), st.integers(1, 6)),
    st.tuples(st.just("acquire"), st.integers(1, 2)),
    st.tuples(st.just("cancel"), st.integers(0, 50)),
)
ops_strategy = st.lists(op_strategy, max_size=60)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# A head asking for the whole burst is served up to a nanosecond after its exact instant; the
# refill earned in that nanosecond must stay in the bucket (else every later grant drifts).
@example(rate=3, per_ms=7, burst=1, queue_limit=None,
         ops=[("try", 1), ("acquire", 1), ("acquire", 1), ("acquire", 1), ("advance", 10**9)])
@example(rate=2, per_ms=1000, burst=3, queue_limit=2,
         ops=[("acquire", 3), ("acquire", 2), ("acquire", 3), ("acquire", 1), ("cancel", 0), ("advance", 700_000_000),
              ("cancel", 0), ("try", 1), ("advance", 10**10)])
@given(
    rate=st.integers(1, 50),
    per_ms=st.sampled_from([1, 7, 333, 1000, 3000]),
    burst=st.integers(1, 5),
    queue_limit=st.one_of(st.none(), st.integers(0, 4)),
    ops=ops_strategy,
)
def test_limiter_matches_the_reference_model_and_never_exceeds_the_bound(
    rate: int, per_ms: int, burst: int, queue_limit: int | None, ops: list[Op]
) -> None:
    asyncio.run(run_scenario(rate, per_ms, burst, queue_limit, ops))


@settings(max_examples=100, deadline=None)
@given(
    rate=st.integers(1, 1000),
    per_ms=st.sampled_from([1, 3, 250, 1000, 3000, 7000]),
    burst=st.integers(1, 20),
    steps=st.lists(st.integers(0, 2_000_000_000), min_size=1, max_size=25),
)
def test_under_enough_demand_grants_equal_the_bound_exactly(
    rate: int, per_ms: int, burst: int, steps: list[int]
) -> None:
    async def scenario() -> None:
        clock = VirtualClock()
        limiter = RateLimiter(rate, timedelta(milliseconds=per_ms), burst=burst, queue_limit=None,
                              label="demand", clock=clock)
        per_ns = per_ms * 1_000_000
        demand = burst + 400
        granted = 0

        async def one() -> None:
            nonlocal granted
            await limiter.acquire()
            granted += 1

        tasks = [asyncio.create_task(one()) for _ in range(demand)]
        await settle()
        assert granted == burst
        for step in steps:
            await clock.advance(step / 1e9)
            assert granted == min(demand, burst + rate * clock.now_ns() // per_ns)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(scenario())


def test_300_contending_tasks_with_random_cancellations_match_the_model() -> None:
    """300 acquires of 1-3 permits, interleaved with random advances, tryAcquires and
    cancellations; the invariant and the model are checked after every step."""
    for seed in range(5):
        rng = random.Random(seed)
        ops: list[Op] = []
        for _ in range(300):
            ops.append(("acquire", rng.randint(1, 4)))
            roll = rng.random()
            if roll < 0.3:
                ops.append(("cancel", rng.randrange(1000)))
            elif roll < 0.6:
                ops.append(("advance", rng.randrange(0, 400_000_000)))
            elif roll < 0.7:
                ops.append(("try", rng.randint(1, 2)))
        ops.append(("advance", 10**12))
        model = asyncio.run(run_scenario(rng.randint(3, 20), rng.choice([7, 1000]), rng.randint(1, 4), None, ops))
        assert not model.queue
        assert model.granted_permits > 0


def test_the_ambient_clock_is_kept_from_construction() -> None:
    clock = VirtualClock()
    with stoic.use_clock(clock):
        limiter = RateLimiter(1, label="kept")
    assert limiter.try_acquire()

    async def later() -> bool:
        await clock.advance(1.0)
        return limiter.try_acquire()

    assert asyncio.run(later())


# --- the blocking limiter against the same model --------------------------------------------------

class Interrupted(BaseException):
    """Stands in for an interruption of a waiting thread (the blocking twin of a cancel)."""


class InterruptibleCondition(threading.Condition):
    interrupted = False

    def wait(self, timeout: float | None = None) -> bool:
        woken = super().wait(timeout)
        if self.interrupted:
            raise Interrupted
        return woken


class _ThreadingWithInterrupts:
    """The ``threading`` module as the limiter sees it, with interruptible conditions."""

    Condition = InterruptibleCondition

    def __getattr__(self, name: str) -> object:
        return getattr(threading, name)


class ThreadClock(VirtualClock):
    """Virtual time for threads: knows who sleeps until when, and can interrupt a sleeper."""

    def __init__(self) -> None:
        super().__init__()
        self.sleeping: dict[int, int] = {}
        self.interrupted: set[int] = set()

    def sleep_until_blocking(self, when_ns: int) -> None:
        me = threading.get_ident()
        with self._cond:
            self.sleeping[me] = when_ns
            try:
                while self._now_ns < when_ns:
                    if me in self.interrupted:
                        self.interrupted.discard(me)  # (thread ids are reused by later threads)
                        raise Interrupted
                    self._cond.wait()
            finally:
                del self.sleeping[me]

    def interrupt(self, ident: int) -> None:
        with self._cond:
            self.interrupted.add(ident)
            self._cond.notify_all()


def run_blocking_scenario(rate: int, per_ms: int, burst: int, queue_limit: int | None, ops: list[Op]) -> Model:
    clock = ThreadClock()
    limiter = BlockingRateLimiter(rate, timedelta(milliseconds=per_ms), burst=burst, queue_limit=queue_limit,
                                  label="model", clock=clock)
    model = Model(rate, per_ms * 1_000_000, burst, queue_limit)
    grants: dict[int, int] = {}
    rejected: dict[int, str] = {}
    threads: dict[int, threading.Thread] = {}

    def worker(ident: int, permits: int) -> None:
        try:
            limiter.acquire(permits)
        except RateLimited as exc:
            rejected[ident] = "oversized" if exc.retry_after is None else "queue_full"
            return
        except Interrupted:
            return
        grants[ident] = clock.now_ns()

    def next_due() -> int:
        _, permits = model.queue[0]
        need = ceil((permits - model.tokens) * model.per_ns / model.rate) if model.tokens < permits else 0
        return model.t + need

    def settle(step: int) -> None:
        def quiet() -> bool:
            return (grants == model.grants and limiter.waiter_count == len(model.queue)
                    and len(clock.sleeping) == (1 if model.queue else 0))
        try:
            eventually(quiet)
        except AssertionError:
            raise AssertionError(f"step {step}: grants {grants} != {model.grants}, "
                                 f"queued {limiter.waiter_count} != {len(model.queue)}") from None
        if model.queue:
            # Only the head sleeps, until exactly the instant the model serves it.
            assert list(clock.sleeping.values()) == [next_due()], f"step {step}"

    try:
        _drive(limiter, clock, model, grants, rejected, threads, worker, next_due, settle, burst, rate, ops)
    finally:
        _stop_every_waiter(limiter, clock, list(threads.values()))
    assert limiter.waiter_count == 0
    return model


def _drive(limiter: BlockingRateLimiter, clock: ThreadClock, model: Model, grants: dict[int, int],
           rejected: dict[int, str], threads: dict[int, threading.Thread], worker: Any, next_due: Any,
           settle: Any, burst: int, rate: int, ops: list[Op]) -> None:
    for step, (kind, value) in enumerate(ops):
        now = clock.now_ns()
        if kind == "advance":
            target = now + value
            while model.queue and next_due() <= target:
                due = next_due()
                model.run_to(due)
                clock._set_now(due)
                settle(step)
            model.run_to(target)
            clock._set_now(target)
        elif kind == "try":
            assert limiter.try_acquire(value) == model.try_acquire(now, value), f"step {step}"
        elif kind == "acquire":
            outcome = model.acquire(now, step, value)
            threads[step] = thread = threading.Thread(target=worker, args=(step, value), daemon=True)
            thread.start()
            if outcome in ("oversized", "queue_full"):
                eventually(lambda s=step: s in rejected)
                assert rejected[step] == outcome, f"step {step}"
        elif model.queue:  # interrupt the value-th waiter still queued
            index = value % len(model.queue)
            ident = model.queue[index][0]
            with limiter._lock:
                waiter = limiter._waiters[index]
                if waiter.head:
                    target_thread = threads[ident].ident
                    assert target_thread is not None
                else:
                    cond = waiter.cond
                    assert isinstance(cond, InterruptibleCondition)
                    cond.interrupted = True
                    cond.notify()
            if waiter.head:
                clock.interrupt(target_thread)
            model.cancel(ident)
            model.run_to(clock.now_ns())
        settle(step)
        assert model.granted_permits * model.per_ns <= burst * model.per_ns + rate * clock.now_ns()


def _stop_every_waiter(limiter: BlockingRateLimiter, clock: ThreadClock, threads: list[threading.Thread]) -> None:
    """Interrupt every thread still waiting (the head in its sleep, the others in their
    condition), even after a failed step, so no example leaves threads behind."""
    for _ in range(500):
        alive = [thread for thread in threads if thread.is_alive()]
        if not alive:
            return
        with limiter._lock:
            for waiter in limiter._waiters:
                if isinstance(waiter.cond, InterruptibleCondition):
                    waiter.cond.interrupted = True
                    waiter.cond.notify()
        for thread in alive:
            if thread.ident is not None:
                clock.interrupt(thread.ident)
            thread.join(0.01)


@pytest.mark.parametrize("form", ["asyncio", "blocking"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(form_rate=3, per_ms=7, burst=1, queue_limit=None,
         ops=[("try", 1), ("acquire", 1), ("acquire", 1), ("acquire", 1), ("advance", 10**9)])
@example(form_rate=2, per_ms=1000, burst=3, queue_limit=2,
         ops=[("acquire", 3), ("acquire", 2), ("acquire", 3), ("acquire", 1), ("cancel", 0), ("advance", 700_000_000),
              ("cancel", 0), ("try", 1), ("advance", 10**10)])
@example(form_rate=44, per_ms=1, burst=5, queue_limit=None,  # a new head after an interrupted one
         ops=[("advance", 233), ("acquire", 5), ("advance", 2116), ("acquire", 1), ("cancel", 0), ("acquire", 1),
              ("advance", 10**6)])
@example(form_rate=1, per_ms=1000, burst=2, queue_limit=None,  # the head interrupted, then a later one
         ops=[("acquire", 2), ("acquire", 2), ("acquire", 1), ("acquire", 1), ("cancel", 0), ("advance", 1_500_000_000),
              ("cancel", 1), ("advance", 3_000_000_000)])
@given(
    form_rate=st.integers(1, 50),
    per_ms=st.sampled_from([1, 7, 333, 1000, 3000]),
    burst=st.integers(1, 5),
    queue_limit=st.one_of(st.none(), st.integers(0, 4)),
    ops=st.lists(op_strategy, max_size=30),
)
def test_both_limiters_match_the_reference_model_with_interrupted_waiters(
    form: str, form_rate: int, per_ms: int, burst: int, queue_limit: int | None, ops: list[Op]
) -> None:
    if form == "asyncio":
        asyncio.run(run_scenario(form_rate, per_ms, burst, queue_limit, ops))
        return
    ratelimiter_module.threading = _ThreadingWithInterrupts()  # type: ignore[assignment]
    try:
        run_blocking_scenario(form_rate, per_ms, burst, queue_limit, ops)
    finally:
        ratelimiter_module.threading = threading
