"""Hostile tests of stoic.Keyed with lock-free hits (a hit within 1 % of idle_after, at most
1 s, of the key's last stamp takes no lock): the precision bound both ways, idle expiry,
eviction under many threads, and a wrong key type refused with TypeError everywhere."""

from __future__ import annotations

import random
import threading

import pytest

from stoic import BlockingBulkhead, CircuitBreaker, Keyed
from stoic.keyed import OVERFLOW_KEY
from stoic.testing import VirtualClock

SECOND = 1_000_000_000


@pytest.mark.parametrize("key", [1, 2.5, b"host", ("a",), object()])
def test_a_key_that_is_not_a_str_is_a_type_error_everywhere(key: object) -> None:
    family = Keyed(CircuitBreaker, label="hosts")
    family.get("a")

    async def op() -> None:
        pass

    for use in (family.get, family.label_for, family.force_open, family.clear_forced_open,
                lambda k: family.call(k, lambda: None)):
        with pytest.raises(TypeError, match="a key must be a str"):
            use(key)  # type: ignore[operator]
    coroutine = family.execute(key, op)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="a key must be a str"):
        coroutine.send(None)
    assert list(family) == ["a"] and str(family.policies["a"].state) == "closed"


def test_a_hit_past_the_precision_restamps_the_key_and_moves_it_last() -> None:
    clock = VirtualClock()
    family = Keyed(CircuitBreaker, label="hosts", max_keys=2, idle_after=100.0, clock=clock)  # precision 1 s
    a = family.get("a")
    family.get("b")
    clock._set_now(2 * SECOND)
    assert family.get("a") is a  # 2 s after its stamp: restamped, now the most recent
    family.get("c")  # at capacity: the least recently used goes, b
    assert list(family) == ["a", "c"]


def test_a_hit_within_the_precision_takes_no_lock_and_keeps_the_stamp() -> None:
    clock = VirtualClock()
    family = Keyed(CircuitBreaker, label="hosts", max_keys=4, idle_after=100.0, clock=clock)
    a = family.get("a")
    lock = family._lock
    assert lock.acquire()  # held by "another thread": a hit within 1 s must not need it
    try:
        clock._set_now(SECOND // 2)
        assert family.get("a") is a
    finally:
        lock.release()


def test_a_key_used_often_is_never_idle_and_an_unused_one_expires_within_the_precision() -> None:
    clock = VirtualClock()
    family = Keyed(CircuitBreaker, label="hosts", max_keys=3, idle_after=100.0, clock=clock)
    hot = family.get("hot")
    family.get("cold")
    for step in range(1, 401):  # 200 s of hits every half second
        clock._set_now(step * SECOND // 2)
        assert family.get("hot") is hot
    assert family.sweep() == 1  # cold, idle 200 s
    assert list(family) == ["hot"]
    clock._set_now(200 * SECOND + 100 * SECOND + SECOND)  # hot unused for idle_after + precision
    assert family.sweep() == 1 and len(family) == 0


def test_threads_hammering_a_small_family_never_drop_a_key_in_flight() -> None:
    clock = VirtualClock()
    family = Keyed(CircuitBreaker, label="hosts", max_keys=8, idle_after=1.0, clock=clock)
    keys = [f"k{n}" for n in range(32)]
    wrong: list[str] = []
    barrier = threading.Barrier(16)

    def worker(seed: int) -> None:
        try:
            hammer(seed)
        except BaseException as error:  # (reported by the assertion below)
            wrong.append(repr(error))

    def hammer(seed: int) -> None:
        rng = random.Random(seed)
        barrier.wait(10)
        for _ in range(400):
            key = rng.choice(keys)
            if rng.random() < 0.1:
                clock._set_now(clock.now_ns() + rng.randrange(SECOND // 20))

            def work(key: str = key) -> None:
                for other in rng.sample(keys, 9):  # room is needed while this call runs
                    family.get(other)
                held = family.policies
                running = [policy for k, policy in held.items() if k in (key, OVERFLOW_KEY)]
                if not running:
                    wrong.append(f"{key} dropped while its call ran")
                if len(family) > 8:
                    wrong.append(f"{len(family)} keys held")

            roll = rng.random()
            if roll < 0.35:
                family.call(key, work)
            elif roll < 0.7:  # the HTTP integrations' lock-free claim, racing the evictions
                slot = family._claim(key)
                try:
                    work()
                    if family._slots.get(key) is not slot and family._overflow is not slot:
                        wrong.append(f"{key} dropped while claimed")
                finally:
                    family._unclaim(key, slot)
            else:
                assert isinstance(family.get(key), CircuitBreaker)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert wrong == []
    assert len(family) <= 8
    for key, slot in family._slots.items():
        assert slot.inflight == 0, key


def test_a_call_ending_stamps_its_key_as_most_recently_used() -> None:
    # A call's end stamps its key as used then; the LRU order must say so too, or expiry
    # (which stops at the first key not idle, in that order) and eviction judge by a stale order.
    clock = VirtualClock()
    family = Keyed(CircuitBreaker, label="hosts", max_keys=3, idle_after=10.0, clock=clock)
    family.get("b")
    ended: list[str] = []

    def long_call() -> None:
        family.get("c")  # c is used at 0 s, while a's call runs
        clock._set_now(5 * SECOND)  # a's call ends at 5 s
        ended.append("a")

    family.call("a", long_call)
    assert ended == ["a"]
    clock._set_now(13 * SECOND)  # b and c idle for 13 s, past idle_after; a for 8 s
    family.get("d")  # room: b and c expire (idle), a stays
    assert sorted(family) == ["a", "d"]
    family.get("e")
    assert sorted(family) == ["a", "d", "e"]


def test_force_open_while_threads_build_and_hit_keys_leaves_no_key_closed() -> None:
    from stoic import CircuitOpen

    clock = VirtualClock()
    family = Keyed(CircuitBreaker, label="hosts", max_keys=512, idle_after=100.0, clock=clock)
    keys = [f"k{n}" for n in range(400)]  # new keys keep being built after the force
    forced, halfway = threading.Event(), threading.Event()
    late_calls_admitted: list[str] = []
    errors: list[str] = []
    barrier = threading.Barrier(9)

    def hammer(seed: int) -> None:
        rng = random.Random(seed)
        barrier.wait(10)
        try:
            for n in range(600):
                if n == 200:
                    halfway.set()
                key = rng.choice(keys)
                was_forced = forced.is_set()
                try:
                    family.call(key, lambda: None) if rng.random() < 0.5 else family.get(key).call(lambda: None)
                except CircuitOpen:
                    continue
                if was_forced:
                    late_calls_admitted.append(key)
        except BaseException as error:  # (reported below)
            errors.append(repr(error))

    threads = [threading.Thread(target=hammer, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    barrier.wait(10)
    halfway.wait(10)
    family.force_open()
    forced.set()
    for thread in threads:
        thread.join(60)
    assert errors == [] and late_calls_admitted == []
    assert all(str(policy.state) == "open" for policy in family.policies.values())


def test_a_bulkhead_family_counts_its_claimed_calls_too() -> None:
    # A bulkhead reports its own calls in flight (in_use) only from its admission on, so the
    # claim counts the call in every family, a bulkhead's too (see the next test).
    bulkheads = Keyed(BlockingBulkhead, label="pools", max_keys=1, max_concurrent=2)
    breakers = Keyed(CircuitBreaker, label="hosts", max_keys=1)
    pool, breaker = bulkheads._claim("a"), breakers._claim("a")
    assert pool.inflight == 1 and breaker.inflight == 1
    with pool.policy:  # a call holds a slot: the key is busy, so a new key goes to the overflow
        assert bulkheads.get("b").label == f"pools:{OVERFLOW_KEY}"
    assert breakers.get("b").label == f"hosts:{OVERFLOW_KEY}"  # the claimed call keeps "a"
    bulkheads._unclaim("a", pool)
    breakers._unclaim("a", breaker)
    assert pool.inflight == 0 and breaker.inflight == 0
    assert bulkheads.get("b").label == "pools:b" and breakers.get("b").label == "hosts:b"


def test_a_key_is_never_evicted_between_call_and_its_bulkheads_admission() -> None:
    # A bulkhead counts a call from its admission on; Keyed.call hands the call over before that,
    # so another thread running in between (simulated here: the first call pauses on its way in)
    # must still find the key busy, not evict it and run the call on a bulkhead no longer held.
    paused, resume = threading.Event(), threading.Event()

    class PausingBulkhead(BlockingBulkhead):
        def call(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def]
            if threading.current_thread().name == "first":
                paused.set()
                resume.wait(10)
            return super().call(fn, *args, **kwargs)

    family = Keyed(PausingBulkhead, label="pools", max_keys=1, max_concurrent=1)
    family.get("a")
    held_during_call: list[object] = []
    thread = threading.Thread(target=lambda: held_during_call.append(
        family.call("a", lambda: family.policies.get("a"))), name="first")
    thread.start()
    assert paused.wait(10)
    try:
        assert family.get("b").label == f"pools:{OVERFLOW_KEY}"  # "a" has a call in flight
        assert "a" in family
    finally:
        resume.set()
        thread.join(10)
    assert held_during_call[0] is not None and family.get("b").label == "pools:b"


@pytest.mark.parametrize("bad", [object(), 5, "clock"])
def test_a_clock_without_now_ns_is_a_type_error_naming_clock(bad: object) -> None:
    # The check came after the family read bad.now_ns for its lock-free hits: an AttributeError.
    with pytest.raises(TypeError, match=r"clock must be a stoic\.Clock"):
        Keyed(CircuitBreaker, label="hosts", clock=bad)  # type: ignore[arg-type]
