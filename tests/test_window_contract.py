"""The breaker's two windows against a reference model, driven directly (issue 9, item 5).

Seed 000, "The window" and "Judging". ``CountRing`` and ``TimeBuckets`` each promise: ``add``,
``success`` and ``successes`` return True exactly when the window then holds at least
``minimum_calls`` and a rate is at its threshold, and ``counts`` gives (calls, failures, slow
calls) of the window. Like the breaker, the test drops a window as soon as it reports a trip
(a window is never fed after tripping). Driven directly, not through a breaker, so that every
documented path is held to the model, including those the breaker does not take today: a batch
of successes that brings the window to ``minimum_calls``, a batch after old buckets aged out
unjudged, a batch into an empty window. The model is a plain list of calls; sequences come
from fixed seeds.
"""

from __future__ import annotations

import random

import pytest

from stoic.breaker._window import FAILED, FOREVER, NEVER, SLOW, CountRing, TimeBuckets

PPM = 1_000_000
CODES = (0, FAILED, SLOW, FAILED | SLOW, FAILED, SLOW)  # weighted so that every run trips


def over(codes: list[int], minimum: int, failure_ppm: int, slow_ppm: int) -> bool:
    n = len(codes)
    failures = sum(1 for c in codes if c & FAILED)
    slow = sum(1 for c in codes if c & SLOW)
    return n >= minimum and (failures * PPM >= failure_ppm * n or slow * PPM >= slow_ppm * n)


def totals(codes: list[int]) -> tuple[int, int, int]:
    return len(codes), sum(1 for c in codes if c & FAILED), sum(1 for c in codes if c & SLOW)


THRESHOLDS = [(500_000, 1_000_000), (250_000, 500_000), (1_000_000, 250_000), (600_000, 600_000)]


@pytest.mark.parametrize(("size", "minimum"), [(1, 1), (4, 2), (4, 4), (7, 3), (15, 5)])
@pytest.mark.parametrize("seed", range(5))
def test_a_count_ring_matches_the_last_n_calls_model(size: int, minimum: int, seed: int) -> None:
    rng = random.Random(f"ring:{size}:{minimum}:{seed}")
    fppm, sppm = THRESHOLDS[(seed + size) % len(THRESHOLDS)]
    ring = CountRing(size, minimum, fppm, sppm)
    model: list[int] = []
    trips = 0
    for step in range(300):
        op = rng.random()
        if op < 0.6:
            code = rng.choice(CODES)
            model = [*model, code][-size:]
            reported = ring.add(step, code)
        elif op < 0.75:
            model = [*model, 0][-size:]
            reported = ring.success(step)
        else:
            count = rng.choice([1, 2, size - 1, size, size + 1, 3 * size])
            count = max(count, 1)
            model = [*model, *[0] * count][-size:]
            reported = ring.successes(count)
        assert reported == over(model, minimum, fppm, sppm), (step, model)
        assert (ring.calls, ring.failures, ring.slow) == totals(model)
        assert ring.counts(step) == totals(model)
        assert ring.defer_until() == (FOREVER if len(model) >= minimum else NEVER)
        if reported:  # the breaker opens and drops the window
            trips += 1
            ring = CountRing(size, minimum, fppm, sppm)
            model = []
    assert trips > 0


def test_a_batch_of_successes_that_brings_a_count_ring_to_minimum_calls_is_judged_in_full() -> None:
    ring = CountRing(4, 4, 500_000, PPM)
    assert not ring.add(0, FAILED)
    assert not ring.add(1, FAILED)
    assert ring.successes(2)  # 2 failures of 4: exactly the threshold, judged
    quiet = CountRing(4, 4, 500_000, PPM)
    assert not quiet.add(0, FAILED)
    assert not quiet.successes(3)  # 1 of 4: under it
    assert quiet.counts(0) == (4, 1, 0)


def test_successes_into_an_empty_count_ring_fill_it_from_its_first_slot() -> None:
    ring = CountRing(3, 1, PPM, PPM)
    assert not ring.successes(2)
    assert not ring.add(0, SLOW)  # the third slot
    assert ring.counts(0) == (3, 0, 1)
    assert not ring.success(1)  # evicts the oldest batched success, not the slow call
    assert ring.counts(1) == (3, 0, 1)
    assert not ring.success(2)
    assert ring.counts(2) == (3, 0, 1)
    assert not ring.success(3)  # now the slow call goes
    assert ring.counts(3) == (3, 0, 0)


BUCKET = 1_000


@pytest.mark.parametrize("minimum", [1, 3, 6])
@pytest.mark.parametrize("seed", range(6))
def test_time_buckets_match_the_last_ten_buckets_model(minimum: int, seed: int) -> None:
    """The current bucket is the latest reading's (a reading from an earlier bucket counts in it);
    the window is the current bucket and the nine before it."""
    rng = random.Random(f"buckets:{minimum}:{seed}")
    fppm, sppm = THRESHOLDS[seed % len(THRESHOLDS)]
    start = 10**12 + rng.randrange(BUCKET)

    def fresh() -> tuple[TimeBuckets, list[tuple[int, int]], int | None]:
        return TimeBuckets(BUCKET, minimum, fppm, sppm), [], None

    window, calls, head = fresh()
    now = start
    trips = 0
    read_since_judged = False  # time was read into a new bucket since the window last judged

    def held(head: int | None) -> list[int]:
        return [code for bucket, code in calls if head is not None and bucket > head - 10]

    def read(at: int) -> int:
        return at // BUCKET if head is None else max(head, at // BUCKET)

    for _ in range(400):
        step = rng.random()
        if step < 0.15:
            now += rng.choice([1, BUCKET // 2, BUCKET, 3 * BUCKET, 9 * BUCKET, 11 * BUCKET])
        elif step < 0.2:
            now -= rng.randrange(2 * BUCKET)  # a completion stamped before the current bucket
        op = rng.random()
        if op < 0.4:
            code = rng.choice(CODES)
            head = read(now)
            calls.append((head, code))
            reported = window.add(now, code)
            read_since_judged = False
        elif op < 0.65:
            head = read(now)
            calls.append((head, 0))
            reported = window.success(now)
            read_since_judged = False
        elif op < 0.85 and head is not None:
            count = rng.choice([1, 2, 5, 30])
            calls.extend([(head, 0)] * count)  # batched successes land in the current bucket
            reported = window.successes(count)
        else:
            read_since_judged = read_since_judged or head is None or now // BUCKET > head
            head = read(now)
            assert window.counts(now) == totals(held(head))
            reported = None  # reading time judges nothing (what aged out is judged next)
        if reported is not None:
            assert reported == over(held(head), minimum, fppm, sppm), (now, held(head))
        # Successes may be deferred until the current bucket ends, once it holds minimum_calls
        # and nothing aged out unjudged.
        deferrable = head is not None and len(held(head)) >= minimum and not read_since_judged
        assert window.defer_until() == ((head + 1) * BUCKET if deferrable else NEVER)
        if reported:
            trips += 1
            window, calls, head = fresh()
            read_since_judged = False
    assert trips > 0


def test_successes_after_old_buckets_aged_out_unjudged_are_judged_in_full() -> None:
    window = TimeBuckets(BUCKET, 2, 500_000, PPM)
    t = 10**12
    for _ in range(3):
        assert not window.success(t)
    assert not window.add(t + 5 * BUCKET, FAILED)  # 1 of 4
    # The three successes age out as time is read: 1 call, under minimum_calls, unjudged.
    assert window.counts(t + 10 * BUCKET) == (1, 1, 0)
    assert window.defer_until() == NEVER  # below minimum_calls nothing is deferred
    assert window.successes(1)  # 1 failure of 2: at the threshold


def test_successes_after_time_was_read_are_judged_in_full() -> None:
    window = TimeBuckets(BUCKET, 1, 500_000, PPM)
    t = 10**12
    assert not window.success(t)
    assert not window.success(t)
    assert not window.add(t + 9 * BUCKET, FAILED)  # 1 of 3
    assert window.defer_until() == (t // BUCKET + 10) * BUCKET  # the end of the current bucket
    # The two successes age out unjudged when time is read: 1 failure of 1 held, over the
    # threshold though nothing said so; the window still holds minimum_calls.
    assert window.counts(t + 10 * BUCKET) == (1, 1, 0)
    assert window.defer_until() == NEVER  # so the breaker defers nothing until it judges again
    assert window.successes(1)  # 1 of 2 still at the threshold: the batch is judged in full


def test_a_success_bringing_time_buckets_to_minimum_calls_is_judged() -> None:
    window = TimeBuckets(BUCKET, 3, 500_000, PPM)
    t = 10**12
    assert not window.add(t, FAILED)
    assert not window.add(t + 1, FAILED)
    assert window.success(t + 2)  # the third call: 2 of 3 failed
    quiet = TimeBuckets(BUCKET, 3, 500_000, PPM)
    assert not quiet.add(t, FAILED)
    assert not quiet.success(t + 1)
    assert not quiet.success(t + 2)  # 1 of 3
    assert not quiet.success(t + 3)
    assert quiet.counts(t + 3) == (4, 1, 0)


def test_a_bucket_past_32_bit_counts_keeps_every_count_as_it_ages() -> None:
    # The buckets' counts start 32-bit (stoic.breaker._window); one bucket of more calls widens
    # them, and the window's totals stay exact through the rolls that follow.
    window = TimeBuckets(BUCKET, 1, 500_000, PPM)
    t = 10**12
    big = 2**32 + 5
    assert not window.success(t)
    window.successes(big - 1)
    assert not window.add(t + 1, FAILED)
    assert window.counts(t + BUCKET) == (big + 1, 1, 0)  # rolled: the big bucket is stored
    assert not window.success(t + BUCKET)
    assert window.counts(t + 3 * BUCKET) == (big + 2, 1, 0)
    assert window.counts(t + 10 * BUCKET) == (1, 0, 0)  # the big bucket aged out
    assert window.counts(t + 30 * BUCKET) == (0, 0, 0)
    assert not window.add(t + 30 * BUCKET, 0)  # after the whole window aged out at once
    assert window.counts(t + 31 * BUCKET) == (1, 0, 0)
