"""Queue management on the fixed and adaptive bulkheads, on virtual time (seed 003, "Queue
management"): CoDel in folly's form, adaptive LIFO, criticality, deadlines at wake, and a slot
granted in the instant its waiter is cancelled."""

from __future__ import annotations

import asyncio
import collections

import pytest
from _gate import Gate, start

import stoic
from stoic import AdaptiveBulkhead, Bulkhead, BulkheadFull, Criticality, DeadlineExceeded, Shed, _waitqueue
from stoic.testing import RecordingSink, VirtualClock, settle

# --- configuration ---


@pytest.mark.parametrize(("kwargs", "parameter"), [
    ({"queue_limit": 0, "queue_target": 0.01}, "queue_target"),
    ({"queue_limit": 0, "prioritized": True}, "prioritized"),
    ({"queue_limit": 0, "queue_adaptive_lifo": True}, "queue_adaptive_lifo"),
    ({"queue_limit": 4, "queue_target": 0.1}, "queue_interval"),  # default interval 100 ms
    ({"queue_limit": 4, "queue_target": 0.05, "queue_interval": 0.04}, "queue_interval"),
    ({"queue_limit": 4, "queue_target": -0.01}, "queue_target"),
])
def test_bad_queue_options_name_the_parameter(kwargs: dict[str, object], parameter: str) -> None:
    with pytest.raises(ValueError, match=parameter):
        Bulkhead(1, label="x", **kwargs)  # type: ignore[arg-type]


def test_an_unknown_criticality_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="Criticality"), stoic.bind_criticality(3):  # type: ignore[arg-type]
        pass
    with pytest.raises(TypeError), stoic.bind_criticality("critical"):  # type: ignore[arg-type]
        pass


def test_no_option_keeps_the_plain_fifo_hand_over() -> None:
    assert Bulkhead(2, queue_limit=3, label="x")._managed is None
    assert Bulkhead(2, queue_limit=None, queue_target=0.01, label="x")._managed is not None


# --- CoDel ---


async def test_codel_does_not_shed_a_queue_that_drains_within_each_interval(clock: VirtualClock,
                                                                          sink: RecordingSink):
    # Bursts whose waiters wait up to 40 ms (four times the target) but whose queue empties well
    # within each 100 ms interval: a good queue, never shed.
    bulkhead = Bulkhead(1, queue_limit=None, queue_target=0.005, queue_interval=0.1, label="c", clock=clock)
    gate = Gate()
    for round_ in range(20):
        tasks = [start(bulkhead, gate, f"{round_}-{i}") for i in range(5)]
        await settle()
        for i in range(5):
            await clock.advance(0.01)
            gate.open(f"{round_}-{i}")
            await settle()
        assert await asyncio.gather(*tasks) == [f"{round_}-{i}" for i in range(5)]
        await clock.advance(0.2)
    assert not [e for e in sink.of("bulkhead.rejected") if e.attributes["reason"] == "sojourn"]


async def test_codel_sheds_waiters_older_than_twice_the_target_under_sustained_congestion(
        clock: VirtualClock, sink: RecordingSink):
    target = 0.01
    bulkhead = Bulkhead(1, queue_limit=None, queue_target=target, queue_interval=0.05, label="c", clock=clock)
    gate = Gate()
    running = start(bulkhead, gate, "first")
    await settle()
    # A standing queue: 20 waiters arriving over 200 ms, and service slower than arrivals.
    waiters = []
    for i in range(20):
        waiters.append(start(bulkhead, gate, f"w{i}"))
        await clock.advance(0.01)
    served = ["first"]
    for _ in range(5):
        gate.open(served[-1])
        await settle()
        served.append(gate.started[-1])
        await clock.advance(0.06)
    gate.open(served[-1])
    for name in [f"w{i}" for i in range(20)]:
        gate.open(name)
    results = await asyncio.gather(running, *waiters, return_exceptions=True)
    sheds = [r for r in results if isinstance(r, Shed)]
    assert sheds and all(r.cause == "sojourn" and r.reason == stoic.RejectionReason.SHED for r in sheds)
    events = [e for e in sink.of("bulkhead.rejected") if e.attributes["reason"] == "sojourn"]
    assert len(events) == len(sheds)
    assert all(float(e.attributes["sojourn"]) > 2 * target for e in events)  # type: ignore[arg-type]
    assert {e.attributes["criticality"] for e in events} == {"normal"}
    assert bulkhead.in_use == 0 and bulkhead.queued == 0


async def test_codel_sheds_a_waiter_older_than_the_interval_while_not_overloaded(clock: VirtualClock,
                                                                                 sink: RecordingSink):
    # Seed 003: queue_interval is "the generous sojourn allowance while the queue has recently
    # been empty". One slot held for 10 s, one waiter: the queue never looked overloaded (no
    # dequeue in between), yet the waiter has waited 100 times the interval; its client has long
    # given up, so it is shed at dequeue, not handed the slot.
    bulkhead = Bulkhead(1, queue_limit=10, queue_target=0.005, queue_interval=0.1, label="c", clock=clock)
    gate = Gate()
    first = start(bulkhead, gate, "first")
    await settle()
    late = start(bulkhead, gate, "late")
    await settle()
    await clock.advance(10.0)
    gate.open("first")
    await settle()
    assert gate.started == ["first"] and late.done()
    with pytest.raises(Shed) as info:
        await late
    assert info.value.cause == "sojourn"
    (event,) = [e for e in sink.of("bulkhead.rejected") if e.attributes["reason"] == "sojourn"]
    assert event.attributes["sojourn"] == 10.0
    assert await first == "first" and bulkhead.in_use == 0 and bulkhead.queued == 0
    # A waiter within the interval is served (not overloaded: the allowance is the interval).
    first = start(bulkhead, gate, "first2")
    await settle()
    young = start(bulkhead, gate, "young")
    await settle()
    await clock.advance(0.09)
    gate.open("first2")
    await settle()
    gate.open("young")
    assert await asyncio.gather(first, young) == ["first2", "young"]


async def test_the_allowance_is_the_interval_until_overloaded_then_twice_the_target(clock: VirtualClock):
    queue = Bulkhead(1, queue_limit=4, queue_target=0.01, queue_interval=0.1, prioritized=True,
                     label="p")._managed
    assert queue is not None
    tiers = [int(t) for t in Criticality]
    assert [queue._allowance_ns(t, overloaded=False) for t in tiers] == [
        25_000_000, 50_000_000, 100_000_000, 200_000_000]
    assert [queue._allowance_ns(t, overloaded=True) for t in tiers] == [
        5_000_000, 10_000_000, 20_000_000, 40_000_000]


async def test_the_allowance_while_not_overloaded_is_never_below_the_overloaded_one(clock: VirtualClock):
    # Seen failing before the fix ([...150 ms...] against 200 ms): with queue_interval between
    # queue_target and twice it (allowed: the interval must only exceed the target), a queue
    # that was not overloaded shed a waiter sooner than an overloaded one would have, the
    # reverse of seed 003's "generous" allowance while the queue has recently been empty.
    queue = Bulkhead(1, queue_limit=4, queue_target=0.1, queue_interval=0.15, label="c", clock=clock)._managed
    assert queue is not None
    assert queue._allowance_ns(int(Criticality.NORMAL), overloaded=False) == 200_000_000
    assert queue._allowance_ns(int(Criticality.NORMAL), overloaded=True) == 200_000_000
    bulkhead = Bulkhead(1, queue_limit=10, queue_target=0.1, queue_interval=0.15, label="c2", clock=clock)
    gate = Gate()
    first = start(bulkhead, gate, "first")
    await settle()
    waiting = start(bulkhead, gate, "waiting")
    await settle()
    await clock.advance(0.18)  # past the interval, within twice the target
    gate.open("first")
    await settle()
    gate.open("waiting")
    assert await asyncio.gather(first, waiting) == ["first", "waiting"]


async def test_codel_state_follows_folly_min_over_interval(clock: VirtualClock):
    queue = Bulkhead(1, queue_limit=4, queue_target=0.01, queue_interval=0.1, label="c")._managed
    assert queue is not None
    queue._observe(0, 0)
    queue._observe(50_000_000, 20_000_000)
    queue._observe(100_000_000, 30_000_000)  # interval ended with minimum 0: not overloaded
    assert not queue.overloaded
    queue._observe(150_000_000, 15_000_000)
    queue._observe(200_000_000, 40_000_000)  # minimum 15 ms > 10 ms: overloaded
    assert queue.overloaded
    queue._observe(250_000_000, 5_000_000)
    queue._observe(300_000_000, 40_000_000)
    assert not queue.overloaded


async def test_a_burst_after_a_calm_is_not_judged_by_the_congestion_before_it(clock: VirtualClock,
                                                                               sink: RecordingSink):
    # Seen failing before the fix: CoDel saw a zero sojourn only when a caller arrived to an
    # empty queue. A congested queue that drained, then 10 s of calls admitted at once (no
    # queue, nothing observed), then one waiter: its arrival closed the congested interval of
    # 10 s before as "overloaded", and the waiter, 30 ms in the queue (within the 50 ms
    # allowance of a queue that has recently been empty), was shed past twice the target.
    bulkhead = Bulkhead(1, queue_limit=None, queue_target=0.01, queue_interval=0.05, label="c", clock=clock)

    async def op(seconds: float) -> float:
        await clock.sleep(seconds)
        return seconds

    overload = []
    for _ in range(100):  # a call every 10 ms, each holding the slot 30 ms
        overload.append(asyncio.create_task(bulkhead.execute(op, 0.03)))
        await clock.advance(0.01)
    await clock.advance(1.0)
    results = await asyncio.gather(*overload, return_exceptions=True)
    assert any(isinstance(r, Shed) for r in results) and bulkhead.queued == 0
    for _ in range(100):  # the calm: admitted at once
        calm = asyncio.create_task(bulkhead.execute(op, 0.001))
        await clock.advance(0.1)
        await calm
    sheds = len(sink.of("bulkhead.rejected"))
    holder = asyncio.create_task(bulkhead.execute(op, 0.03))
    await settle()
    waiter = asyncio.create_task(bulkhead.execute(op, 0.001))
    await settle()
    await clock.advance(0.05)
    assert await asyncio.gather(holder, waiter) == [0.03, 0.001]
    assert len(sink.of("bulkhead.rejected")) == sheds


def test_codel_sees_a_blocking_queue_drain_when_its_last_waiter_times_out(clock: VirtualClock):
    rules = stoic.BlockingBulkhead(1, queue_limit=4, queue_target=0.01, queue_interval=0.05, label="b",
                                   clock=clock)._rules
    assert rules is not None
    rules._observe(0, 40_000_000)  # an interval whose minimum is over the target
    rules.drained(collections.deque(), 10_000_000)  # the queue emptied within it
    rules._observe(60_000_000, 40_000_000)
    assert not rules.overloaded


@pytest.mark.parametrize("how", ["handed_a_slot", "displaced"])
async def test_a_waiter_on_a_closed_loop_leaves_no_entry_behind(clock: VirtualClock, monkeypatch: pytest.MonkeyPatch,
                                                                how: str):
    # Seen failing before the fix: a waiter whose event loop is closed cannot be woken (wake is
    # False) and never runs again to pop what the queue keeps of it, so each one left its entry
    # in the queue's table for the bulkhead's life.
    bulkhead = AdaptiveBulkhead(latency_threshold=1.0, max_concurrent=1, queue_limit=1, prioritized=True,
                                label="w", clock=clock)
    managed = bulkhead._managed
    assert managed is not None
    gate = Gate()
    holder = start(bulkhead, gate, "holder")
    await settle()
    dead = start(bulkhead, gate, "dead", Criticality.BEST_EFFORT)
    await settle()
    dead_future = bulkhead._waiters[0].future
    real_wake = _waitqueue.wake
    monkeypatch.setattr(_waitqueue, "wake", lambda future: future is not dead_future and real_wake(future))
    if how == "displaced":
        critical = start(bulkhead, gate, "critical", Criticality.CRITICAL)
        await settle()
        assert len(managed.parked) == 1  # the critical arrival's
        gate.open("critical")
    gate.open("holder")
    assert await holder == "holder"
    if how == "displaced":
        assert await critical == "critical"
    assert (bulkhead.in_use, bulkhead.queued, managed.parked) == (0, 0, {})
    dead.cancel()  # (here its loop still runs: end the task)
    with pytest.raises(asyncio.CancelledError):
        await dead


# --- adaptive LIFO ---


async def test_adaptive_lifo_is_fifo_until_congested_then_serves_the_newest(clock: VirtualClock):
    bulkhead = Bulkhead(1, queue_limit=10, queue_adaptive_lifo=True, queue_interval=0.1, label="l", clock=clock)
    gate = Gate()
    first = start(bulkhead, gate, "first")
    await settle()
    a, b = start(bulkhead, gate, "a"), start(bulkhead, gate, "b")
    await settle()
    gate.open("first")
    await settle()
    assert gate.started == ["first", "a"]  # the oldest waiter is young: FIFO
    c = start(bulkhead, gate, "c")
    await settle()
    await clock.advance(0.2)  # b has now waited 200 ms > queue_interval: congested
    gate.open("a")
    await settle()
    assert gate.started[-1] == "c"
    for name in ("b", "c"):
        gate.open(name)
    await asyncio.gather(first, a, b, c)
    assert gate.started == ["first", "a", "c", "b"]


# --- prioritized ---


async def test_prioritized_serves_the_highest_tier_first(clock: VirtualClock):
    bulkhead = Bulkhead(1, queue_limit=10, prioritized=True, label="p", clock=clock)
    gate = Gate()
    first = start(bulkhead, gate, "first")
    await settle()
    tasks = [start(bulkhead, gate, "low", Criticality.BEST_EFFORT), start(bulkhead, gate, "norm"),
             start(bulkhead, gate, "crit", Criticality.CRITICAL), start(bulkhead, gate, "deg", Criticality.DEGRADED)]
    await settle()
    for name in ["first", "crit", "norm", "deg", "low"]:
        gate.open(name)
        await settle()
    await asyncio.gather(first, *tasks)
    assert gate.started == ["first", "crit", "norm", "deg", "low"]


async def test_a_full_prioritized_queue_admits_a_higher_tier_by_shedding_the_lowest(clock: VirtualClock,
                                                                                    sink: RecordingSink):
    bulkhead = Bulkhead(1, queue_limit=2, prioritized=True, label="p", clock=clock)
    gate = Gate()
    first = start(bulkhead, gate, "first")
    await settle()
    low1 = start(bulkhead, gate, "low1", Criticality.BEST_EFFORT)
    norm = start(bulkhead, gate, "norm")
    await settle()
    # Same tier as the lowest waiting (best effort): full.
    with pytest.raises(BulkheadFull), stoic.bind_criticality(Criticality.BEST_EFFORT):
        await bulkhead.execute(gate.op, "low2")
    await clock.advance(0.03)
    crit = start(bulkhead, gate, "crit", Criticality.CRITICAL)
    await settle()
    with pytest.raises(Shed) as info:
        await low1
    assert info.value.cause == "priority"
    (event,) = [e for e in sink.of("bulkhead.rejected") if e.attributes["reason"] == "priority"]
    assert event.attributes["criticality"] == "best_effort" and event.attributes["sojourn"] == 0.03
    # Now norm is the lowest: another normal arrival is refused, a critical one displaces it.
    with pytest.raises(BulkheadFull):
        await bulkhead.execute(gate.op, "norm2")
    for name in ("first", "crit", "norm"):
        gate.open(name)
    assert await asyncio.gather(first, crit, norm) == ["first", "crit", "norm"]


async def test_under_codel_lower_tiers_are_shed_sooner(clock: VirtualClock):
    queue = Bulkhead(1, queue_limit=4, queue_target=0.01, prioritized=True, label="p")._managed
    assert queue is not None
    allowances = [queue._allowance_ns(int(t), overloaded=True) for t in Criticality]
    assert allowances == [5_000_000, 10_000_000, 20_000_000, 40_000_000]


# --- deadlines and the cancel/grant race ---


async def test_a_waiter_whose_deadline_passed_is_failed_at_wake_not_granted(clock: VirtualClock,
                                                                           sink: RecordingSink):
    bulkhead = Bulkhead(1, queue_limit=5, prioritized=True, label="d", clock=clock)
    gate = Gate()
    first = start(bulkhead, gate, "first")
    await settle()
    ran: list[str] = []

    async def late_op() -> None:
        ran.append("late")

    async def waiter() -> None:
        async with stoic.deadline(clock.now() + 0.05):
            await bulkhead.execute(late_op)

    late = asyncio.create_task(waiter())
    after = start(bulkhead, gate, "after")
    await settle()
    # The release runs in the same instant the deadline passes, before the deadline's timer:
    # the managed queue sees the passed deadline and skips the waiter.
    clock._set_now(clock.now_ns() + 50_000_000)
    gate.open("first")
    await settle()
    with pytest.raises(DeadlineExceeded):
        await late
    assert ran == [] and gate.started == ["first", "after"]
    gate.open("after")
    await asyncio.gather(first, after)
    assert bulkhead.in_use == 0 and bulkhead.queued == 0


async def test_a_waiter_that_leaves_a_managed_queue_is_reported_with_its_wait_and_tier(clock: VirtualClock,
                                                                                       sink: RecordingSink):
    # Cut by its deadline or cancelled while parked, it is reported as a shed waiter is: with
    # the seconds it waited and the tier it queued with.
    bulkhead = Bulkhead(1, queue_limit=5, prioritized=True, label="left", clock=clock)
    gate = Gate()
    first = start(bulkhead, gate, "first")
    await settle()

    async def waiter() -> None:
        async with stoic.timeout(0.05):
            await bulkhead.execute(gate.op, "never")

    with stoic.bind_criticality(Criticality.CRITICAL):
        late = asyncio.create_task(waiter())
    cancelled = start(bulkhead, gate, "cancelled", Criticality.DEGRADED)
    await clock.advance(0.03)
    cancelled.cancel()
    await clock.advance(0.03)
    with pytest.raises(DeadlineExceeded):
        await late
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    gate.open("first")
    await first
    left = [(e.attributes["reason"], e.attributes["sojourn"], e.attributes["criticality"])
            for e in sink.of("bulkhead.rejected")]
    assert left == [("cancelled", pytest.approx(0.03), "degraded"),
                    ("deadline_exceeded", pytest.approx(0.05), "critical")]
    assert (bulkhead.in_use, bulkhead.queued) == (0, 0)


async def test_plain_bulkhead_fails_a_woken_waiter_whose_deadline_passed(clock: VirtualClock):
    bulkhead = Bulkhead(1, queue_limit=5, label="d", clock=clock)
    gate = Gate()
    first = start(bulkhead, gate, "first")
    await settle()
    ran: list[str] = []

    async def late_op() -> None:
        ran.append("late")

    async def waiter() -> None:
        async with stoic.deadline(clock.now() + 0.05):
            await bulkhead.execute(late_op)

    late = asyncio.create_task(waiter())
    after = start(bulkhead, gate, "after")
    await settle()
    clock._set_now(clock.now_ns() + 50_000_000)
    gate.open("first")  # hands the slot to the late waiter, whose deadline has just passed
    await settle()
    with pytest.raises(DeadlineExceeded):
        await late
    assert ran == []
    gate.open("after")
    await asyncio.gather(first, after)
    assert gate.started == ["first", "after"]  # the slot was passed on
    assert bulkhead.in_use == 0


@pytest.mark.parametrize("options", [{"queue_target": 0.01}, {"prioritized": True}, {"queue_adaptive_lifo": True}])
async def test_a_slot_granted_in_the_instant_its_waiter_is_cancelled_is_passed_on(clock: VirtualClock,
                                                                                  options: dict[str, object]):
    bulkhead = Bulkhead(1, queue_limit=5, label="r", clock=clock, **options)  # type: ignore[arg-type]
    gate = Gate()
    finish = asyncio.Event()
    tasks: list[asyncio.Task[str]] = []

    async def blocker_op() -> str:
        await finish.wait()
        # Lands after the slot is handed to "doomed" (when this returns), before it resumes.
        asyncio.get_running_loop().call_soon(tasks[0].cancel)
        return "blocker"

    blocker = asyncio.create_task(bulkhead.execute(blocker_op))
    await settle()
    tasks += [start(bulkhead, gate, "doomed"), start(bulkhead, gate, "next")]
    await settle()
    finish.set()
    await blocker
    await settle()
    assert tasks[0].cancelled()
    assert gate.started == ["next"]
    gate.open("next")
    assert await tasks[1] == "next"
    assert bulkhead.in_use == 0 and bulkhead.queued == 0


async def test_adaptive_bulkheads_take_the_queue_options(clock: VirtualClock):
    bulkhead = AdaptiveBulkhead(latency_threshold=1.0, max_concurrent=1, queue_limit=2, prioritized=True,
                                label="a", clock=clock)
    gate = Gate()
    first = start(bulkhead, gate, "first")
    await settle()
    low = start(bulkhead, gate, "low", Criticality.BEST_EFFORT)
    mid = start(bulkhead, gate, "mid", Criticality.DEGRADED)
    await settle()
    crit = start(bulkhead, gate, "crit", Criticality.CRITICAL)
    await settle()
    with pytest.raises(Shed):
        await low
    for name in ("first", "crit", "mid"):
        gate.open(name)
        await settle()
    await asyncio.gather(first, crit, mid)
    assert gate.started == ["first", "crit", "mid"]


async def test_a_shed_waiter_is_reported_in_its_own_context_not_in_the_one_that_dropped_it(
        clock: VirtualClock):
    # Its own sinks and span (use_sinks, OpenTelemetry's current span) are those of the call that
    # was shed: a displacing arrival's or a releasing call's get nothing, as with threads.
    def scoped(sink: RecordingSink, name: str, tier: Criticality = Criticality.NORMAL) -> asyncio.Task[str]:
        with stoic.use_sinks(sink):
            return start(bulkhead, gate, name, tier)

    bulkhead = Bulkhead(1, queue_limit=1, prioritized=True, label="own", clock=clock)
    gate = Gate()
    holder_sink, low_sink, crit_sink = RecordingSink(), RecordingSink(), RecordingSink()
    holder = scoped(holder_sink, "holder")
    await settle()
    low = scoped(low_sink, "low", Criticality.BEST_EFFORT)
    await settle()
    crit = scoped(crit_sink, "crit", Criticality.CRITICAL)  # displaces low
    with pytest.raises(Shed):
        await low
    assert [e.attributes["reason"] for e in low_sink.of("bulkhead.rejected")] == ["priority"]
    assert not crit_sink.of("bulkhead.rejected")
    # Stale at the release (CoDel): shed by the holder's release, reported by the waiter itself.
    codel = Bulkhead(1, queue_limit=10, queue_target=0.005, queue_interval=0.1, label="own-c", clock=clock)
    bulkhead = codel
    first = scoped(holder_sink, "first")
    await settle()
    stale_sink = RecordingSink()
    stale = scoped(stale_sink, "stale")
    await settle()
    await clock.advance(10)
    gate.open("first")
    with pytest.raises(Shed):
        await stale
    assert [e.attributes["reason"] for e in stale_sink.of("bulkhead.rejected")] == ["sojourn"]
    assert not holder_sink.of("bulkhead.rejected")
    gate.open("holder")
    gate.open("crit")
    assert await asyncio.gather(holder, crit, first) == ["holder", "crit", "first"]
    for each in (holder_sink, low_sink, crit_sink, stale_sink):
        each.assert_contract()


async def test_a_waiter_shed_and_cancelled_in_the_same_instant_is_reported_once(clock: VirtualClock,
                                                                                 sink: RecordingSink):
    # Displaced by a more critical arrival (reported: priority), then cancelled before it could
    # resume: it leaves with the CancelledError, and it is not reported a second time as cancelled.
    bulkhead = Bulkhead(1, queue_limit=1, prioritized=True, label="p", clock=clock)
    gate = Gate()
    first = start(bulkhead, gate, "first")
    await settle()
    low = start(bulkhead, gate, "low", Criticality.BEST_EFFORT)
    await settle()
    low_waiter = bulkhead._waiters[0]  # (taken before crit can displace it)
    with stoic.bind_criticality(Criticality.CRITICAL):
        crit = asyncio.create_task(bulkhead.execute(gate.op, "crit"))
    # Cancel low in the step where crit has parked and displaced it (its future done), before
    # low resumes: crit's first step runs inside create_task under an eager task factory, at
    # the next loop step otherwise. (low reports itself, in its own task, when it resumes.)
    while low_waiter in bulkhead._waiters:
        await asyncio.sleep(0)
    assert low_waiter.future.done() and not low.done()
    low.cancel()
    await settle()
    assert low.cancelled()
    assert [e.attributes["reason"] for e in sink.of("bulkhead.rejected")] == ["priority"]
    gate.open("first")
    gate.open("crit")
    assert await asyncio.gather(first, crit) == ["first", "crit"]
    assert bulkhead.in_use == 0 and bulkhead.queued == 0
