"""A thread interrupted while queued (KeyboardInterrupt, SystemExit, any exception raised into
its wait, e.g. by a signal handler) in a blocking bulkhead or rate limiter is reported as a
cancelled asyncio waiter is: one ``*.rejected`` with ``reason="cancelled"``, emitted by that
thread outside the policy's lock, the interrupt re-raised unchanged, nothing consumed, the
slot or permit handed on. Hundreds of threads wait on a virtual clock that only the test moves
(no real sleeping); marked threads are interrupted at their next reading of the clock.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from _threads import InterruptingClock, eventually, process_wide

from stoic.bulkhead import BlockingBulkhead
from stoic.events import Event, Level
from stoic.ratelimiter import BlockingRateLimiter
from stoic.testing import RecordingSink

START = 1000.0
THREADS = 200


class Interrupt(Exception):
    """Raised into a waiting thread (as by a signal handler): an ordinary exception."""


class InterruptClock(InterruptingClock):
    """Raises ``errors[thread]`` (KeyboardInterrupt by default) in a marked thread at its next
    reading of the clock."""

    def __init__(self) -> None:
        super().__init__(START)
        self.errors: dict[threading.Thread, BaseException] = {}

    def now_ns(self) -> int:
        thread = threading.current_thread()
        if thread in self.interrupted:
            self.interrupted.discard(thread)
            raise self.errors.get(thread, KeyboardInterrupt())
        return super().now_ns()


class LockCheckingSink(RecordingSink):
    """Records each event with the thread that emitted it and whether that thread could take
    ``lock`` (False: it emitted while holding it; a plain Lock is not reentrant)."""

    def __init__(self) -> None:
        super().__init__(level=Level.INFO)
        self.lock: threading.Lock | None = None
        self.emitted: list[tuple[str, str, threading.Thread, bool]] = []

    def emit(self, event: Event) -> None:
        free = True
        if self.lock is not None:
            free = self.lock.acquire(timeout=2)
            if free:
                self.lock.release()
        super().emit(event)
        self.emitted.append((event.name, str(event.attributes.get("reason")), threading.current_thread(), free))


@pytest.fixture
def sink() -> Iterator[LockCheckingSink]:
    yield from process_wide(LockCheckingSink())


class Worker(threading.Thread):
    def __init__(self, take: object, give: object) -> None:
        super().__init__(daemon=True)
        self.take, self.give = take, give
        self.error: BaseException | None = None
        self.admitted = False

    def run(self) -> None:
        try:
            self.take()  # type: ignore[operator]
        except BaseException as exc:  # (recorded for the test)
            self.error = exc
            return
        self.admitted = True
        self.give()  # type: ignore[operator]


def interrupt_some(clock: InterruptClock, workers: list[Worker]) -> tuple[list[Worker], dict[Worker, BaseException]]:
    """Mark every third worker with one of three kinds of interrupt; the marked and the errors."""
    kinds = (KeyboardInterrupt, SystemExit, Interrupt)
    marked = workers[::3]
    errors: dict[Worker, BaseException] = {}
    for n, worker in enumerate(marked):
        errors[worker] = clock.errors[worker] = kinds[n % 3]()
    clock.interrupted.update(marked)
    return marked, errors


@pytest.mark.parametrize("managed", [False, True], ids=["fifo", "managed"])
def test_interrupted_blocking_bulkhead_waiters_are_reported_as_cancelled(
    sink: LockCheckingSink, managed: bool,
) -> None:
    clock = InterruptClock()
    options: dict[str, object] = {"prioritized": True} if managed else {}
    bulkhead = BlockingBulkhead(1, queue_limit=None, label="interrupted", clock=clock, **options)  # type: ignore[arg-type]
    sink.lock = bulkhead._lock
    bulkhead.acquire()
    workers = [Worker(lambda: bulkhead.acquire(timeout=10_000), bulkhead.release) for _ in range(THREADS)]
    for worker in workers:
        worker.start()
    eventually(lambda: bulkhead.queued_count == THREADS)
    marked, errors = interrupt_some(clock, workers)
    clock.step(0)  # wakes every waiter: the marked ones read the clock, and are interrupted
    eventually(lambda: all(not w.is_alive() for w in marked))
    for worker in marked:
        assert worker.error is errors[worker]  # re-raised unchanged
    assert bulkhead.queued_count == THREADS - len(marked) and bulkhead.active_count == 1
    bulkhead.release()  # handed along the survivors, none to a waiter that left
    for worker in workers:
        worker.join(10)
    survivors = [w for w in workers if w not in errors]
    assert all(w.admitted and w.error is None for w in survivors)
    assert (bulkhead.active_count, bulkhead.queued_count) == (0, 0)
    cancelled = [e for e in sink.emitted if e[0] == "bulkhead.rejected"]
    assert len(cancelled) == len(marked) and {e[1] for e in cancelled} == {"cancelled"}
    assert {e[2] for e in cancelled} == set(marked)  # each emitted by the thread concerned
    assert all(e[3] for e in cancelled)  # outside the lock
    attributes = [dict(e.attributes) for e in sink.of("bulkhead.rejected")]
    if managed:
        assert all(set(a) == {"reason", "capacity", "sojourn", "criticality"} for a in attributes)
    else:
        assert all(a == {"reason": "cancelled", "capacity": 1} for a in attributes)


def test_interrupted_blocking_limiter_waiters_are_reported_as_cancelled(sink: LockCheckingSink) -> None:
    clock = InterruptClock()
    limiter = BlockingRateLimiter(1, 1.0, burst=1, queue_limit=None, label="interrupted", clock=clock)
    sink.lock = limiter._lock
    assert limiter.try_acquire()  # drained: one permit a second from now on
    workers = [Worker(lambda: limiter.acquire(1, timeout=10_000), lambda: None) for _ in range(THREADS)]
    for n, worker in enumerate(workers, start=1):
        worker.start()
        eventually(lambda n=n: limiter.waiter_count == n)  # FIFO, in order
    marked, errors = interrupt_some(clock, workers)  # the head among them
    clock.step(0)  # wakes the head (and the waiters on a timeout): the marked ones are interrupted
    eventually(lambda: all(not w.is_alive() for w in marked))
    for worker in marked:
        assert worker.error is errors[worker]
    survivors = [w for w in workers if w not in errors]
    assert limiter.waiter_count == len(survivors)
    for served in range(1, len(survivors) + 1):  # one permit a second, each to the next survivor
        clock.step(1.0)
        eventually(lambda served=served: sum(w.admitted for w in survivors) == served)
    for worker in workers:
        worker.join(10)
    assert limiter.waiter_count == 0 and limiter.available_permits == 0  # nothing consumed
    cancelled = [e for e in sink.emitted if e[0] == "ratelimiter.rejected"]
    assert len(cancelled) == len(marked) and {e[1] for e in cancelled} == {"cancelled"}
    assert {e[2] for e in cancelled} == set(marked)
    assert all(e[3] for e in cancelled)
    assert all(dict(e.attributes) == {"reason": "cancelled", "permits": 1}
               for e in sink.of("ratelimiter.rejected"))
