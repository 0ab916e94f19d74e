"""Bulkhead on virtual time: the limit, the queue, rejections, cancellation and events
(seed 000, "Bulkhead" and "Testing"; field reports 14 and 15)."""

from __future__ import annotations

import asyncio
import random

import pytest

import stoic
import stoic.bulkhead as bulkhead_module
from stoic import BulkheadFull, DeadlineExceeded
from stoic.bulkhead import Bulkhead
from stoic.testing import RecordingSink, VirtualClock, settle


class Gate:
    """An operation that runs until the test opens its gate, recording who is inside."""

    def __init__(self) -> None:
        self.inside: list[str] = []
        self.entered: list[str] = []
        self.most = 0
        self.events: dict[str, asyncio.Event] = {}

    async def op(self, name: str) -> str:
        self.inside.append(name)
        self.entered.append(name)
        self.most = max(self.most, len(self.inside))
        event = self.events.setdefault(name, asyncio.Event())
        try:
            await event.wait()
        finally:
            self.inside.remove(name)
        return name

    def open(self, name: str) -> None:
        self.events.setdefault(name, asyncio.Event()).set()


def start(bulkhead: Bulkhead, gate: Gate, name: str) -> asyncio.Task[str]:
    return asyncio.create_task(bulkhead.execute(gate.op, name), name=name)


# --- configuration ---


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"max_concurrent": 0}, "max_concurrent"),
        ({"max_concurrent": -1}, "max_concurrent"),
        ({"max_concurrent": 2.0}, "max_concurrent"),
        ({"max_concurrent": 1, "queue_limit": -1}, "queue_limit"),
    ],
)
def test_invalid_configuration_names_the_parameter(kwargs: dict[str, object], parameter: str) -> None:
    with pytest.raises(ValueError, match=parameter):
        Bulkhead(label="x", **kwargs)  # type: ignore[arg-type]


def test_configuration_and_gauges_are_readable() -> None:
    bulkhead = Bulkhead(4, queue_limit=2, label="db")
    assert (bulkhead.max_concurrent, bulkhead.queue_limit, bulkhead.label) == (4, 2, "db")
    assert (bulkhead.active_count, bulkhead.queued_count) == (0, 0)
    assert "max_concurrent=4" in repr(bulkhead)


# --- the limit and the queue ---


async def test_at_most_max_concurrent_run_and_the_next_is_shed(clock: VirtualClock, sink: RecordingSink) -> None:
    bulkhead = Bulkhead(2, label="shed")  # queue_limit 0: a load shedder
    gate = Gate()
    a, b = start(bulkhead, gate, "a"), start(bulkhead, gate, "b")
    await settle()
    assert bulkhead.active_count == 2
    with pytest.raises(BulkheadFull) as caught:
        await bulkhead.execute(gate.op, "c")
    assert caught.value.label == "shed" and caught.value.retry_after is None
    assert gate.entered == ["a", "b"]
    [event] = sink.of("bulkhead.rejected")
    assert event.label == "shed"
    assert dict(event.attributes) == {"reason": "bulkhead_full", "capacity": 2, "waiting": 0}
    gate.open("a")
    assert await a == "a"
    assert bulkhead.active_count == 1
    gate.open("b")
    await b
    assert bulkhead.active_count == 0


async def test_the_queue_limit_is_exact_and_waiters_run_in_order(clock: VirtualClock, sink: RecordingSink) -> None:
    bulkhead = Bulkhead(1, queue_limit=3, label="q")
    gate = Gate()
    tasks = [start(bulkhead, gate, f"t{i}") for i in range(6)]
    await settle()
    assert bulkhead.active_count == 1 and bulkhead.queued_count == 3
    rejected = [t for t in tasks if t.done()]
    assert len(rejected) == 2 and all(isinstance(t.exception(), BulkheadFull) for t in rejected)
    assert [e.attributes["waiting"] for e in sink.of("bulkhead.rejected")] == [3, 3]
    for name in ("t0", "t1", "t2", "t3"):
        gate.open(name)
        await settle()
    assert gate.entered == ["t0", "t1", "t2", "t3"]
    assert (bulkhead.active_count, bulkhead.queued_count) == (0, 0)


async def test_a_released_slot_goes_to_the_first_waiter_not_a_newcomer(clock: VirtualClock) -> None:
    bulkhead = Bulkhead(1, queue_limit=5, label="fifo")
    gate = Gate()
    start(bulkhead, gate, "holder")
    await settle()
    waiter = start(bulkhead, gate, "waiter")
    await settle()
    gate.open("holder")
    await asyncio.sleep(0)  # the holder releases; the waiter has not run yet
    newcomer = start(bulkhead, gate, "newcomer")
    await settle()
    assert gate.inside == ["waiter"]
    assert bulkhead.queued_count == 1
    gate.open("waiter")
    gate.open("newcomer")
    await asyncio.gather(waiter, newcomer)
    assert gate.entered == ["holder", "waiter", "newcomer"]


async def test_the_operations_exception_propagates_and_frees_the_slot(clock: VirtualClock) -> None:
    bulkhead = Bulkhead(1, label="x")

    async def boom() -> None:
        raise LookupError("mine")

    with pytest.raises(LookupError, match="mine"):
        await bulkhead.execute(boom)
    assert bulkhead.active_count == 0


async def test_execute_decorator_and_context_manager(clock: VirtualClock) -> None:
    bulkhead = Bulkhead(1, label="x")

    @bulkhead
    async def double(x: int) -> int:
        assert bulkhead.active_count == 1
        return 2 * x

    async def add(a: int, *, b: int) -> int:
        return a + b

    assert await double(4) == 8
    assert double.__name__ == "double"
    assert await bulkhead.execute(add, 1, b=2) == 3
    async with bulkhead:
        assert bulkhead.active_count == 1
        with pytest.raises(BulkheadFull):
            async with bulkhead:
                pass
    assert bulkhead.active_count == 0
    with pytest.raises(TypeError, match="BlockingBulkhead"):
        bulkhead(lambda: None)  # type: ignore[arg-type, return-value]


# --- cancellation and deadlines ---


async def test_a_cancelled_waiter_never_takes_a_slot(clock: VirtualClock, sink: RecordingSink) -> None:
    bulkhead = Bulkhead(1, queue_limit=2, label="c")
    gate = Gate()
    start(bulkhead, gate, "holder")
    leaver = start(bulkhead, gate, "leaver")
    stayer = start(bulkhead, gate, "stayer")
    await settle()
    leaver.cancel()
    await settle()
    assert leaver.cancelled() and bulkhead.queued_count == 1
    assert dict(sink.of("bulkhead.rejected")[0].attributes) == {"reason": "cancelled", "capacity": 1}
    gate.open("holder")
    gate.open("stayer")
    assert await stayer == "stayer"
    assert gate.entered == ["holder", "stayer"]
    assert (bulkhead.active_count, bulkhead.queued_count) == (0, 0)


async def test_a_waiter_cut_by_a_deadline_reports_deadline_exceeded(clock: VirtualClock, sink: RecordingSink) -> None:
    bulkhead = Bulkhead(1, queue_limit=1, label="d")
    gate = Gate()
    holder = start(bulkhead, gate, "holder")

    async def bounded() -> None:
        async with stoic.timeout(2.0):
            await bulkhead.execute(gate.op, "late")

    task = asyncio.create_task(bounded())
    await clock.advance(2.0)
    with pytest.raises(DeadlineExceeded):
        await task
    assert dict(sink.of("bulkhead.rejected")[0].attributes) == {"reason": "deadline_exceeded", "capacity": 1}
    assert (bulkhead.active_count, bulkhead.queued_count) == (1, 0)
    gate.open("holder")
    await holder
    assert bulkhead.active_count == 0 and gate.entered == ["holder"]


async def test_work_already_late_is_refused(clock: VirtualClock, sink: RecordingSink) -> None:
    bulkhead = Bulkhead(3, label="late")
    ran: list[int] = []

    async def op() -> None:
        ran.append(1)

    with pytest.raises(DeadlineExceeded):
        async with stoic.deadline(clock.now() - 0.5):
            await bulkhead.execute(op)
    assert ran == [] and bulkhead.active_count == 0
    assert dict(sink.of("bulkhead.rejected")[0].attributes) == {"reason": "deadline_exceeded", "capacity": 3}

    async def in_time() -> None:
        async with stoic.timeout(1.0):
            await bulkhead.execute(op)

    await in_time()
    assert ran == [1]


async def test_woken_then_cancelled(clock: VirtualClock, sink: RecordingSink) -> None:
    """A slot is released to the first waiter, which is cancelled before it runs: the second
    waiter gets the slot and nothing hangs."""
    bulkhead = Bulkhead(1, queue_limit=2, label="w")
    gate = Gate()
    finish = asyncio.Event()
    waiters: list[asyncio.Task[str]] = []

    async def blocker_op() -> None:
        await finish.wait()
        # Queued now, this cancellation lands after the slot is handed to the first waiter
        # (when this operation returns) but before that waiter resumes.
        asyncio.get_running_loop().call_soon(waiters[0].cancel)

    blocker = asyncio.create_task(bulkhead.execute(blocker_op))
    await settle()
    waiters += [start(bulkhead, gate, "first"), start(bulkhead, gate, "second")]
    await settle()
    assert bulkhead.queued_count == 2
    finish.set()
    await blocker
    await settle()
    first, second = waiters
    assert first.cancelled()
    assert gate.inside == ["second"]
    assert (bulkhead.active_count, bulkhead.queued_count) == (1, 0)
    gate.open("second")
    assert await second == "second"
    assert bulkhead.active_count == 0
    assert [e.attributes["reason"] for e in sink.of("bulkhead.rejected")] == ["cancelled"]


async def test_woken_then_cancelled_inside_the_hand_over(
    clock: VirtualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    bulkhead = Bulkhead(1, queue_limit=2, label="w")
    gate = Gate()
    blocker = start(bulkhead, gate, "blocker")
    await settle()
    first = start(bulkhead, gate, "first")
    second = start(bulkhead, gate, "second")
    await settle()
    real_wake = bulkhead_module.wake
    handed: list[bool] = []

    def wake_then_cancel(future: asyncio.Future[None]) -> bool:
        woken = real_wake(future)
        if not handed:
            handed.append(True)
            first.cancel()  # after the hand-over, before `first` resumes
        return woken

    monkeypatch.setattr(bulkhead_module, "wake", wake_then_cancel)
    gate.open("blocker")
    await blocker
    await settle()
    assert first.cancelled()
    assert gate.inside == ["second"] and bulkhead.active_count == 1
    gate.open("second")
    assert await second == "second"
    assert (bulkhead.active_count, bulkhead.queued_count) == (0, 0)


# --- contention ---


async def test_300_contending_tasks_never_exceed_the_limit(clock: VirtualClock) -> None:
    bulkhead = Bulkhead(7, queue_limit=300, label="many")
    inside = 0
    most = 0

    async def op(i: int) -> int:
        nonlocal inside, most
        inside += 1
        most = max(most, inside)
        await clock.sleep_until(clock.now_ns() + (i % 13 + 1) * 1_000_000)
        inside -= 1
        return i

    results = await clock.run(asyncio.gather(*(bulkhead.execute(op, i) for i in range(300))))
    assert sorted(results) == list(range(300))
    assert most == 7
    assert (bulkhead.active_count, bulkhead.queued_count) == (0, 0)


@pytest.mark.parametrize("seed", range(6))
async def test_no_slot_lost_to_cancellation(clock: VirtualClock, seed: int) -> None:
    """Random cancellations of waiters and of running calls never leak or double-grant a slot;
    the invariant is checked after every step."""
    rng = random.Random(seed)
    capacity, queue_limit = rng.randint(1, 6), rng.randint(0, 40)
    bulkhead = Bulkhead(capacity, queue_limit=queue_limit, label="chaos")
    gate = Gate()
    tasks: dict[str, asyncio.Task[str]] = {}

    def check() -> None:
        waiting = [n for n, t in tasks.items() if not t.done() and n not in gate.inside]
        assert bulkhead.active_count == len(gate.inside) <= capacity  # no double grant, no leak
        assert bulkhead.queued_count == len(waiting) <= queue_limit
        if waiting:  # a slot never sits idle while someone waits
            assert bulkhead.active_count == capacity

    for step in range(300):
        roll = rng.random()
        if roll < 0.45:
            name = f"t{step}"
            tasks[name] = start(bulkhead, gate, name)
        elif roll < 0.7 and tasks:
            tasks[rng.choice(sorted(tasks))].cancel()  # waiting, running or already finished
        elif gate.inside:
            gate.open(rng.choice(gate.inside))
        await settle()
        check()
    assert gate.most <= capacity
    for name in list(gate.inside):
        gate.open(name)
    for task in tasks.values():
        task.cancel()
    await asyncio.gather(*tasks.values(), return_exceptions=True)
    assert (bulkhead.active_count, bulkhead.queued_count) == (0, 0)
    for task in tasks.values():
        if task.done() and not task.cancelled() and task.exception() is not None:
            assert isinstance(task.exception(), BulkheadFull)


def test_reused_across_event_loops() -> None:
    bulkhead = Bulkhead(1, queue_limit=5, label="loops")

    async def scenario() -> list[int]:
        order: list[int] = []

        async def op(i: int) -> None:
            await asyncio.sleep(0)
            order.append(i)

        await asyncio.gather(*(bulkhead.execute(op, i) for i in range(4)))
        return order

    assert asyncio.run(scenario()) == [0, 1, 2, 3]
    assert asyncio.run(scenario()) == [0, 1, 2, 3]
    assert (bulkhead.active_count, bulkhead.queued_count) == (0, 0)


def test_the_asyncio_bulkhead_is_a_policy() -> None:
    assert isinstance(Bulkhead(1, label="p"), stoic.Policy)


async def test_an_unbounded_queue_is_none_as_for_the_rate_limiter(clock: VirtualClock) -> None:
    bulkhead = Bulkhead(1, queue_limit=None, label="unbounded")
    assert bulkhead.queue_limit is None
    gate = asyncio.Event()

    async def hold() -> None:
        await gate.wait()

    tasks = [asyncio.create_task(bulkhead.execute(hold)) for _ in range(500)]
    await settle()
    assert (bulkhead.active_count, bulkhead.queued_count) == (1, 499)
    gate.set()
    await asyncio.gather(*tasks)
    assert (bulkhead.active_count, bulkhead.queued_count) == (0, 0)
