"""The bulkhead against a reference model under random schedules of arrivals, completions and
cancellations (of waiters and of running calls); compared after every step."""

from __future__ import annotations

import asyncio

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stoic import BulkheadFull
from stoic.bulkhead import Bulkhead
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
