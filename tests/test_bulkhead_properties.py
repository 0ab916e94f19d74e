"""The bulkhead against a reference model under random schedules of arrivals, completions and
cancellations (of waiters and of running calls); compared after every step. The blocking
bulkhead is driven through the same model, with interruptions of waiting and running threads
standing in for cancellations."""

from __future__ import annotations

import asyncio
import threading

import pytest
from _threads import eventually
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import stoic.bulkhead as bulkhead_module
from stoic import BulkheadFull
from stoic.bulkhead import BlockingBulkhead, Bulkhead
from stoic.testing import settle

Op = tuple[str, int]


class Model:
    """Who runs and who waits, in order: the textbook FIFO semaphore with a bounded queue."""

    def __init__(self, capacity: int, queue_limit: int) -> None:
        self.capacity, self.queue_limit = capacity, queue_limit
        self.running: list[int] = []
        self.queue: list[int] = []
        self.shed: list[int] = []

    def arrive(self, ident: int) -> None:
        if len(self.running) < self.capacity and not self.queue:
            self.running.append(ident)
        elif len(self.queue) < self.queue_limit:
            self.queue.append(ident)
        else:
            self.shed.append(ident)

    def leave(self, ident: int) -> None:
        if ident in self.queue:
            self.queue.remove(ident)
        elif ident in self.running:
            self.running.remove(ident)
            if self.queue:
                self.running.append(self.queue.pop(0))


async def scenario(capacity: int, queue_limit: int, ops: list[Op]) -> None:
    bulkhead = Bulkhead(capacity, queue_limit=queue_limit, label="model")
    model = Model(capacity, queue_limit)
    inside: list[int] = []
    release: dict[int, asyncio.Event] = {}
    tasks: dict[int, asyncio.Task[None]] = {}

    async def op(ident: int) -> None:
        inside.append(ident)
        try:
            await release[ident].wait()
        finally:
            inside.remove(ident)

    for step, (kind, value) in enumerate(ops):
        if kind == "arrive":
            release[step] = asyncio.Event()
            tasks[step] = asyncio.create_task(bulkhead.execute(op, step))
            model.arrive(step)
        elif kind == "finish" and model.running:
            ident = model.running[value % len(model.running)]
            release[ident].set()
            model.leave(ident)
        elif kind == "cancel" and tasks:
            live = [i for i, t in tasks.items() if not t.done()]
            if live:
                ident = live[value % len(live)]
                tasks[ident].cancel()
                model.leave(ident)
        await settle()
        assert sorted(inside) == sorted(model.running), f"step {step}"
        assert bulkhead.active_count == len(model.running) <= capacity
        assert bulkhead.queued_count == len(model.queue)
        shed = sorted(i for i, t in tasks.items() if t.done() and not t.cancelled()
                      and isinstance(t.exception(), BulkheadFull))
        assert shed == sorted(model.shed)
    for event in release.values():
        event.set()
    await asyncio.gather(*tasks.values(), return_exceptions=True)
    assert (bulkhead.active_count, bulkhead.queued_count) == (0, 0)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    capacity=st.integers(1, 4),
    queue_limit=st.integers(0, 5),
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("arrive"), st.just(0)),
            st.tuples(st.just("finish"), st.integers(0, 20)),
            st.tuples(st.just("cancel"), st.integers(0, 20)),
        ),
        max_size=50,
    ),
)
def test_bulkhead_matches_the_reference_model(capacity: int, queue_limit: int, ops: list[Op]) -> None:
    asyncio.run(scenario(capacity, queue_limit, ops))


# --- the blocking bulkhead against the same model ------------------------------------------------

class Interrupted(BaseException):
    """Stands in for an interruption (KeyboardInterrupt, a thread-level cancel) of a waiter."""


class InterruptibleCondition(threading.Condition):
    """A condition whose waiter raises :class:`Interrupted` once the test sets ``interrupted``
    and wakes it: the blocking twin of cancelling a waiting task."""

    interrupted = False

    def wait(self, timeout: float | None = None) -> bool:
        woken = super().wait(timeout)
        if self.interrupted:
            raise Interrupted
        return woken


class _ThreadingWithInterrupts:
    """The ``threading`` module as the bulkhead sees it, with interruptible conditions."""

    Condition = InterruptibleCondition

    def __getattr__(self, name: str) -> object:
        return getattr(threading, name)


def blocking_scenario(capacity: int, queue_limit: int, ops: list[Op]) -> None:
    bulkhead = BlockingBulkhead(capacity, queue_limit=queue_limit, label="model")
    model = Model(capacity, queue_limit)
    lock = threading.Lock()
    inside: list[int] = []
    outcome: dict[int, str] = {}
    release: dict[int, threading.Event] = {}
    interrupt: dict[int, bool] = {}

    def op(ident: int) -> None:
        with lock:
            inside.append(ident)
        try:
            release[ident].wait(10)
            if interrupt.get(ident):
                raise Interrupted  # interrupted while running: the slot still comes back
        finally:
            with lock:
                inside.remove(ident)

    def caller(ident: int) -> None:
        try:
            bulkhead.call(op, ident)
            outcome[ident] = "ran"
        except BulkheadFull:
            outcome[ident] = "shed"
        except Interrupted:
            outcome[ident] = "interrupted"

    threads: list[threading.Thread] = []

    def state() -> tuple[list[int], int, int, list[int]]:
        with lock:
            running = sorted(inside)
        shed = sorted(i for i, o in outcome.items() if o == "shed")
        return running, bulkhead.active_count, bulkhead.queued_count, shed

    for step, (kind, value) in enumerate(ops):
        if kind == "arrive":
            release[step] = threading.Event()
            thread = threading.Thread(target=caller, args=(step,), daemon=True)
            threads.append(thread)
            model.arrive(step)
            thread.start()
            # Arrivals are serialised: each has decided (runs, queued or shed) before the next.
            expected_queue = len(model.queue)
            eventually(lambda s=step, q=expected_queue: s in inside or s in outcome or bulkhead.queued_count == q)
        elif kind == "finish" and model.running:
            ident = model.running[value % len(model.running)]
            release[ident].set()
            model.leave(ident)
        elif kind == "handover" and model.running and model.queue:
            # A slot is handed to the head waiter, which is interrupted before it runs: the slot
            # must pass to the next waiter (or come back), never be lost or doubled.
            ident = model.running[value % len(model.running)]
            head = model.queue[0]
            with bulkhead._lock:
                cond = bulkhead._waiters[0].cond
                assert isinstance(cond, InterruptibleCondition)
                cond.interrupted = True  # not woken: it wakes when the slot is handed over
            release[ident].set()
            model.leave(ident)
            model.leave(head)
        elif kind == "cancel":
            if model.queue and value % 2 == 0:
                # Interrupt a queued waiter: the bulkhead's queue is in the model's order.
                index = value // 2 % len(model.queue)
                ident = model.queue[index]
                with bulkhead._lock:
                    cond = bulkhead._waiters[index].cond
                    assert isinstance(cond, InterruptibleCondition)
                    cond.interrupted = True
                    cond.notify()
                model.leave(ident)
            elif model.running:
                ident = model.running[value % len(model.running)]
                interrupt[ident] = True
                release[ident].set()
                model.leave(ident)
        expected = (sorted(model.running), len(model.running), len(model.queue), sorted(model.shed))
        try:
            eventually(lambda e=expected: state() == e, timeout=5.0)
        except AssertionError:
            raise AssertionError(f"step {step}: {state()} != model {expected}") from None
        assert bulkhead.active_count <= capacity
    for event in release.values():
        event.set()
    for thread in threads:
        thread.join(10)
    assert (bulkhead.active_count, bulkhead.queued_count) == (0, 0)


@pytest.mark.parametrize("form", ["asyncio", "blocking"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(capacity=1, queue_limit=2,
         ops=[("arrive", 0), ("arrive", 0), ("arrive", 0), ("cancel", 0), ("finish", 0), ("arrive", 0)])
@example(capacity=2, queue_limit=1,
         ops=[("arrive", 0), ("arrive", 0), ("arrive", 0), ("arrive", 0), ("cancel", 1), ("cancel", 0)])
@example(capacity=1, queue_limit=3,  # the hand-over race, twice in a row
         ops=[("arrive", 0)] * 4 + [("handover", 0), ("handover", 0), ("finish", 0)])
@given(
    capacity=st.integers(1, 3),
    queue_limit=st.integers(0, 3),
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("arrive"), st.just(0)),
            st.tuples(st.just("finish"), st.integers(0, 20)),
            st.tuples(st.just("cancel"), st.integers(0, 20)),
            st.tuples(st.just("handover"), st.integers(0, 20)),  # (blocking form only)
        ),
        max_size=25,
    ),
)
def test_both_bulkheads_match_the_reference_model_under_interruptions(
    form: str, capacity: int, queue_limit: int, ops: list[Op]
) -> None:
    if form == "asyncio":
        asyncio.run(scenario(capacity, queue_limit, ops))
        return
    bulkhead_module.threading = _ThreadingWithInterrupts()  # type: ignore[assignment]
    try:
        blocking_scenario(capacity, queue_limit, ops)
    finally:
        bulkhead_module.threading = threading
