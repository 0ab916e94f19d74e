"""A demanding user's attacks on the adaptive policies and queue management (seed 003), on
virtual time: what the other suites left untried."""

from __future__ import annotations

import asyncio
import threading

import pytest
from _threads import eventually, process_wide_sink  # noqa: F401  (the process-wide `sink` fixture)

import stoic
from stoic import AdaptiveBulkhead, BlockingBulkhead, Bulkhead, Criticality, Shed
from stoic.testing import RecordingSink, VirtualClock, settle


class Gate:
    """Operations that run until the test opens them."""

    def __init__(self) -> None:
        self.events: dict[str, asyncio.Event] = {}

    async def op(self, name: str) -> str:
        await self.events.setdefault(name, asyncio.Event()).wait()
        return name

    def open(self, name: str) -> None:
        self.events.setdefault(name, asyncio.Event()).set()


def start(bulkhead: Bulkhead, gate: Gate, name: str, tier: Criticality = Criticality.NORMAL) -> asyncio.Task[str]:
    with stoic.bind_criticality(tier):
        return asyncio.create_task(bulkhead.execute(gate.op, name), name=name)


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

