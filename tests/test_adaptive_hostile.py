"""A demanding user's attacks on the adaptive policies and queue management (seed 003), on
virtual time: what the other suites left untried."""

from __future__ import annotations

import asyncio
import threading

import pytest
from _gate import Gate, start
from _threads import eventually, process_wide_sink  # noqa: F401  (the process-wide `sink` fixture)
from hypothesis import given, settings
from hypothesis import strategies as st

import stoic
from stoic import AdaptiveBulkhead, BlockingBulkhead, Bulkhead, Criticality, Shed
from stoic.testing import RecordingSink, VirtualClock, settle

# --- the criticality a waiter is reported and kept with ---


@pytest.mark.parametrize("make", [
    lambda clock: Bulkhead(1, queue_limit=5, queue_target=0.01, label="codel", clock=clock),
    lambda clock: AdaptiveBulkhead(latency_threshold=1.0, max_concurrent=1, queue_limit=5, label="aimd",
                                   clock=clock),
], ids=["codel", "adaptive"])
async def test_a_waiter_is_reported_with_its_own_tier_when_the_queue_is_not_prioritized(
        make: object, clock: VirtualClock, sink: RecordingSink):
    # The catalog's criticality is "that waiter's tier". Without prioritized the tier decides
    # nothing, but it is still the one its task bound: a best-effort waiter shed by CoDel, or
    # cancelled, is not reported as a normal one.
    bulkhead = make(clock)  # type: ignore[operator]
    gate = Gate()
    first = start(bulkhead, gate, "first")
    await settle()
    cancelled = start(bulkhead, gate, "cancelled", Criticality.BEST_EFFORT)
    critical = start(bulkhead, gate, "critical", Criticality.CRITICAL)
    await settle()
    await clock.advance(0.05)
    cancelled.cancel()
    await settle()
    await clock.advance(0.1)  # the critical waiter is past CoDel's interval (100 ms) at the release
    gate.open("first")
    gate.open("critical")
    await first
    await asyncio.gather(critical, cancelled, return_exceptions=True)
    left = [(e.attributes["reason"], e.attributes["criticality"]) for e in sink.of("bulkhead.rejected")]
    shed = [("sojourn", "critical")] if bulkhead.label == "codel" else []
    assert left == [("cancelled", "best_effort"), *shed]


async def test_a_tier_bound_before_prioritized_is_switched_on_live_still_counts(clock: VirtualClock):
    # Turned on during an incident (ControlPlane.retune, allowed while callers wait on an
    # adaptive bulkhead): the waiters already queued keep the tiers their tasks bound, so a
    # normal arrival at the full queue displaces the best-effort waiter queued before.
    bulkhead = AdaptiveBulkhead(latency_threshold=1.0, max_concurrent=1, queue_limit=1, label="a", clock=clock)
    gate = Gate()
    first = start(bulkhead, gate, "first")
    await settle()
    low = start(bulkhead, gate, "low", Criticality.BEST_EFFORT)
    await settle()
    bulkhead._retune(prioritized=True)
    normal = start(bulkhead, gate, "normal")
    await settle()
    assert low.done() and isinstance(low.exception(), Shed), (low, normal)
    gate.open("first")
    gate.open("normal")
    assert await first == "first" and await normal == "normal"
    assert (bulkhead.in_use, bulkhead.queued) == (0, 0)


def test_a_blocking_waiter_is_reported_with_its_own_tier_when_the_queue_is_not_prioritized(
        clock: VirtualClock, sink: RecordingSink):
    bulkhead = BlockingBulkhead(1, queue_limit=1, queue_target=0.01, label="b", clock=clock)
    bulkhead.acquire()
    outcome: list[BaseException] = []

    def waiter() -> None:
        with stoic.bind_criticality(Criticality.DEGRADED):
            try:
                bulkhead.acquire(timeout=0.5)
            except BaseException as exc:  # (recorded for the assertion)
                outcome.append(exc)

    thread = threading.Thread(target=waiter)
    thread.start()
    eventually(lambda: bulkhead.queued == 1)
    clock._set_now(clock.now_ns() + 500_000_000)  # its timeout runs out in the queue
    thread.join(5)
    assert len(outcome) == 1 and isinstance(outcome[0], stoic.DeadlineExceeded)
    bulkhead.release()
    left = [e.attributes["criticality"] for e in sink.of("bulkhead.rejected")]
    assert left == ["degraded"]



# --- local queueing inside an adaptive bulkhead is not the dependency's latency ---


def _inner(kind: str, clock: VirtualClock) -> stoic.Policy:
    if kind == "bulkhead":
        return Bulkhead(1, queue_limit=50, label="inner", clock=clock)
    return stoic.RateLimiter(100, 1.0, burst=1, queue_limit=50, label="inner", clock=clock)  # one call per 10 ms


@pytest.mark.parametrize("kind", ["bulkhead", "ratelimiter"])
@pytest.mark.parametrize("adaptive", ["aimd", "gradient"])
async def test_time_queued_in_an_inner_stage_is_not_latency_for_the_limit(
        kind: str, adaptive: str, clock: VirtualClock, sink: RecordingSink):
    # Field report 20, for the policies that judge latency: a dependency answering in 10 ms
    # every time, behind a local queue (a one-slot bulkhead, or a limiter of 100 a second) that
    # an adaptive bulkhead hands 20 calls at once. The last of them waits ~190 ms in that queue,
    # nearly four times the 50 ms threshold; the dependency was never slow, so the limit must
    # not move (the breaker and the hedge already leave such waits out).
    outer: AdaptiveBulkhead | stoic.GradientBulkhead
    if adaptive == "aimd":
        outer = AdaptiveBulkhead(latency_threshold=0.05, max_concurrent=20, label="outer", clock=clock)
    else:
        outer = stoic.GradientBulkhead(max_concurrent=20, label="outer", clock=clock)
        outer._algorithm.window_ns = 0  # type: ignore[union-attr]  # update at every 10 samples
    inner = _inner(kind, clock)

    async def dependency() -> None:
        await clock.sleep(0.010)

    async def call() -> None:
        await outer.execute(inner.execute, dependency)  # type: ignore[attr-defined]

    for _ in range(30):  # one at a time first: Gradient2 learns the 10 ms as its baseline
        await clock.run(call())
    refused = []
    for _ in range(3):
        outcomes = await clock.run(asyncio.gather(*(call() for _ in range(20)), return_exceptions=True))
        refused += [o for o in outcomes if o is not None]
        await clock.advance(0.5)
    assert [dict(e.attributes) for e in sink.of("bulkhead.limit_changed")] == []
    assert refused == []
    assert outer.limit == 20


# --- AIMD's arithmetic against the seed's rule, with the limiter's skipped samples ---


@settings(max_examples=300, deadline=None)
@given(maximum=st.integers(1, 40), floor_share=st.floats(0.0, 1.0),
       ratio=st.sampled_from([0.5, 0.9, 0.99, 0.013]), step=st.sampled_from([1.0, 0.5, 3.0, 0.01, 1e6]),
       cooldown=st.integers(1, 1000),
       samples=st.lists(st.tuples(st.integers(0, 50), st.sampled_from([0, 99, 100, 101, 10**6]),
                                  st.integers(0, 45), st.booleans()), max_size=200))
def test_aimd_follows_the_per_completion_rule_exactly_even_where_the_limiter_skips_samples(
        maximum: int, floor_share: float, ratio: float, step: float, cooldown: int,
        samples: list[tuple[int, int, int, bool]]) -> None:
    # Seed 003: a completion over the threshold (or a drop) multiplies the limit by the ratio,
    # at most once per cooldown, never below the floor; an in-budget one adds step / limit, here
    # only when at least half the limit was in flight, never above the ceiling. The limiter skips
    # sample() where fast_ns and grow_from say it changes nothing: that must be exactly true.
    from stoic._limits import AimdLimit

    floor = max(1, round(floor_share * maximum))
    threshold = 100
    algorithm = AimdLimit(threshold_ns=threshold, maximum=maximum, minimum=floor, backoff_ratio=ratio,
                          increase_step=step, cooldown_ns=cooldown)
    value, last, now = float(maximum), None, 0
    for gap, latency, in_flight, dropped in samples:
        now += gap
        if dropped or latency > algorithm.fast_ns or in_flight >= algorithm.grow_from:
            algorithm.sample(now, latency, in_flight, dropped)
        if dropped or latency > threshold:
            if last is None or now - last >= cooldown:
                last, value = now, max(float(floor), value * ratio)
        elif 2 * in_flight >= value:
            value = min(float(maximum), value + step / value)
        assert algorithm.value == pytest.approx(value, rel=1e-12) and algorithm.limit == int(algorithm.value)
        assert floor <= algorithm.limit <= maximum
