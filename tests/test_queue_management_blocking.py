"""Queue management on the blocking bulkhead, with real threads on a virtual clock that only the
test moves (seed 003, "Queue management"): the asyncio bulkheads' options, names and rules
(the decisions are one implementation, ``stoic._waitqueue.QueueRules``), CoDel in folly's
form, adaptive LIFO, criticality bound in the thread's context, deadlines at wake, a slot
granted in the instant its waiter is interrupted, hundreds of contending threads, and a
reference model of priority queueing that both bulkhead kinds must follow."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Iterator

import pytest
from _threads import eventually, process_wide_sink  # noqa: F401  (the process-wide `sink` fixture)
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_bulkhead_properties import Interrupted, InterruptibleCondition, _ThreadingWithInterrupts

import stoic
import stoic.bulkhead as bulkhead_module
from stoic import BlockingBulkhead, Bulkhead, BulkheadFull, Criticality, DeadlineExceeded, Shed
from stoic._waitqueue import QueueRules
from stoic.testing import RecordingSink, VirtualClock, settle

MS = 0.001


def step(clock: VirtualClock, seconds: float) -> None:
    clock._set_now(clock.now_ns() + round(seconds * 1e9))


class Gate:
    """Operations that run until the test opens them, in the order they started."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started: list[str] = []
        self.events: dict[str, threading.Event] = {}

    def _event(self, name: str) -> threading.Event:
        with self.lock:
            return self.events.setdefault(name, threading.Event())

    def op(self, name: str) -> str:
        with self.lock:
            self.started.append(name)
        self._event(name).wait(10)
        return name

    def open(self, name: str) -> None:
        self._event(name).set()


class Caller(threading.Thread):
    """One call through the bulkhead (``acquire(timeout)``, the gated operation, ``release``),
    with ``tier`` bound in the thread's own context; keeps the result or the error."""

    def __init__(self, bulkhead: BlockingBulkhead, gate: Gate, name: str, tier: Criticality = Criticality.NORMAL,
                 timeout: float | None = None) -> None:
        super().__init__(name=name, daemon=True)
        self.bulkhead, self.gate, self.tier, self.timeout = bulkhead, gate, tier, timeout
        self.result: str | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with stoic.bind_criticality(self.tier):
                self.bulkhead.acquire(timeout=self.timeout)
                try:
                    self.result = self.gate.op(self.name)
                finally:
                    self.bulkhead.release()
        except BaseException as exc:
            self.error = exc


def arrive(bulkhead: BlockingBulkhead, gate: Gate, name: str, tier: Criticality = Criticality.NORMAL,
           timeout: float | None = None) -> Caller:
    """Start a caller and wait until it has decided: running, parked, or refused."""
    before = bulkhead.queued_count
    caller = Caller(bulkhead, gate, name, tier, timeout)
    caller.start()
    eventually(lambda: name in gate.started or not caller.is_alive() or bulkhead.queued_count > before)
    return caller


def finish(*callers: Caller) -> None:
    for caller in callers:
        caller.gate.open(caller.name)
    for caller in callers:
        caller.join(10)
        assert not caller.is_alive()


def shed_events(sink: RecordingSink, reason: str) -> list[dict[str, object]]:
    return [dict(e.attributes) for e in sink.of("bulkhead.rejected") if e.attributes["reason"] == reason]


# --- configuration: the asyncio bulkhead's names, defaults and validation ---


@pytest.mark.parametrize(("kwargs", "parameter"), [
    ({"queue_limit": 0, "queue_target": 0.01}, "queue_target"),
    ({"queue_limit": 0, "prioritized": True}, "prioritized"),
    ({"queue_limit": 0, "queue_adaptive_lifo": True}, "queue_adaptive_lifo"),
    ({"queue_limit": 4, "queue_target": 0.1}, "queue_interval"),  # default interval 100 ms
    ({"queue_limit": 4, "queue_target": 0.05, "queue_interval": 0.04}, "queue_interval"),
    ({"queue_limit": 4, "queue_target": -0.01}, "queue_target"),
    ({"queue_limit": 4, "queue_interval": 0}, "queue_interval"),
])
def test_bad_queue_options_name_the_parameter(kwargs: dict[str, object], parameter: str) -> None:
    with pytest.raises(ValueError, match=parameter):
        BlockingBulkhead(1, label="x", **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=parameter):
        Bulkhead(1, label="x", **kwargs)  # type: ignore[arg-type]


def test_a_non_bool_flag_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="prioritized"):
        BlockingBulkhead(1, queue_limit=2, label="x", prioritized=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="queue_adaptive_lifo"):
        BlockingBulkhead(1, queue_limit=2, label="x", queue_adaptive_lifo="yes")  # type: ignore[arg-type]


def test_no_option_keeps_the_plain_fifo_hand_over_and_the_options_share_the_asyncio_rules() -> None:
    assert BlockingBulkhead(2, queue_limit=3, label="x")._rules is None
    rules = BlockingBulkhead(2, queue_limit=None, queue_target=0.01, label="x")._rules
    assert type(rules) is QueueRules and rules.interval_ns == 100_000_000  # the same default interval
    managed = Bulkhead(2, queue_limit=None, queue_target=0.01, label="x")._managed
    assert isinstance(managed, QueueRules)  # one implementation of the decisions, used by both kinds
    prioritized = BlockingBulkhead(1, queue_limit=4, queue_target=0.01, prioritized=True, label="p")._rules
    assert prioritized is not None
    assert [prioritized._allowance_ns(int(t), True) for t in Criticality] == [
        5_000_000, 10_000_000, 20_000_000, 40_000_000]


# --- CoDel ---


def test_codel_sheds_waiters_older_than_twice_the_target_under_sustained_congestion(sink: RecordingSink) -> None:
    clock = VirtualClock()
    target = 0.01
    bulkhead = BlockingBulkhead(1, queue_limit=None, queue_target=target, queue_interval=0.05, label="c", clock=clock)
    gate = Gate()
    first = arrive(bulkhead, gate, "first")
    waiters = []
    for i in range(20):  # a standing queue: 20 waiters over 200 ms, served slower than they arrive
        waiters.append(arrive(bulkhead, gate, f"w{i}"))
        step(clock, 0.01)
    running = "first"
    for _ in range(5):
        count = len(gate.started)
        gate.open(running)
        eventually(lambda n=count: len(gate.started) > n or bulkhead.queued_count == 0)
        running = gate.started[-1]
        step(clock, 0.06)
    finish(first, *waiters)
    sheds = [c.error for c in waiters if isinstance(c.error, Shed)]
    assert sheds and all(e.cause == "sojourn" and e.reason == stoic.RejectionReason.SHED for e in sheds)
    assert all(c.error is None or isinstance(c.error, Shed) for c in waiters)
    events = shed_events(sink, "sojourn")
    assert len(events) == len(sheds)  # each shed thread reported itself, once
    assert all(float(e["sojourn"]) > 2 * target for e in events)  # type: ignore[arg-type]
    assert {e["criticality"] for e in events} == {"normal"}
    assert (bulkhead.in_use, bulkhead.queued) == (0, 0)
    assert bulkhead._rules is not None and not bulkhead._rules.parked  # nothing left behind


def test_codel_does_not_shed_a_queue_that_drains_within_each_interval(sink: RecordingSink) -> None:
    clock = VirtualClock()
    bulkhead = BlockingBulkhead(1, queue_limit=None, queue_target=0.005, queue_interval=0.1, label="c", clock=clock)
    gate = Gate()
    for round_ in range(6):
        callers = [arrive(bulkhead, gate, f"{round_}-{i}") for i in range(5)]
        for caller in callers:  # waiters wait up to 40 ms (8 x target), the queue empties in 50 ms
            step(clock, 0.01)
            count = len(gate.started)
            gate.open(caller.name)
            eventually(lambda n=count: len(gate.started) > n or not bulkhead.queued)
        finish(*callers)
        assert [c.result for c in callers] == [c.name for c in callers]
        step(clock, 0.2)
    assert not shed_events(sink, "sojourn")


def test_codel_sheds_a_thread_older_than_the_interval_while_not_overloaded(sink: RecordingSink) -> None:
    # As for the asyncio bulkhead (one implementation): behind a slot held for 10 s the queue is
    # never seen overloaded, yet a thread that waited 100 intervals is shed at dequeue.
    clock = VirtualClock()
    bulkhead = BlockingBulkhead(1, queue_limit=4, queue_target=0.005, queue_interval=0.1, label="c", clock=clock)
    gate = Gate()
    first = arrive(bulkhead, gate, "first")
    late = arrive(bulkhead, gate, "late")
    step(clock, 10.0)
    finish(first)
    late.join(10)
    assert isinstance(late.error, Shed) and late.error.cause == "sojourn" and gate.started == ["first"]
    assert [e["sojourn"] for e in shed_events(sink, "sojourn")] == [10.0]
    assert (bulkhead.in_use, bulkhead.queued) == (0, 0)


# --- adaptive LIFO ---


def test_adaptive_lifo_is_fifo_until_congested_then_serves_the_newest() -> None:
    clock = VirtualClock()
    bulkhead = BlockingBulkhead(1, queue_limit=10, queue_adaptive_lifo=True, queue_interval=0.1, label="l",
                                clock=clock)
    gate = Gate()
    first = arrive(bulkhead, gate, "first")
    a, b = arrive(bulkhead, gate, "a"), arrive(bulkhead, gate, "b")
    gate.open("first")
    eventually(lambda: gate.started == ["first", "a"])  # the oldest waiter is young: FIFO
    c = arrive(bulkhead, gate, "c")
    step(clock, 0.2)  # b has now waited 200 ms > queue_interval: congested
    gate.open("a")
    eventually(lambda: len(gate.started) == 3)
    finish(first, a, b, c)
    assert gate.started == ["first", "a", "c", "b"]


# --- prioritized, by the criticality bound in each thread ---


def test_prioritized_serves_the_highest_tier_first() -> None:
    bulkhead = BlockingBulkhead(1, queue_limit=10, prioritized=True, label="p", clock=VirtualClock())
    gate = Gate()
    first = arrive(bulkhead, gate, "first")
    callers = [arrive(bulkhead, gate, "low", Criticality.BEST_EFFORT), arrive(bulkhead, gate, "norm"),
               arrive(bulkhead, gate, "crit", Criticality.CRITICAL),
               arrive(bulkhead, gate, "deg", Criticality.DEGRADED)]
    for i, name in enumerate(["first", "crit", "norm", "deg", "low"]):
        gate.open(name)
        eventually(lambda n=i: len(gate.started) == min(n + 2, 5))
    finish(first, *callers)
    assert gate.started == ["first", "crit", "norm", "deg", "low"]


def test_a_full_prioritized_queue_admits_a_higher_tier_by_shedding_the_lowest(sink: RecordingSink) -> None:
    clock = VirtualClock()
    bulkhead = BlockingBulkhead(1, queue_limit=2, prioritized=True, label="p", clock=clock)
    gate = Gate()
    first = arrive(bulkhead, gate, "first")
    low1 = arrive(bulkhead, gate, "low1", Criticality.BEST_EFFORT)
    norm = arrive(bulkhead, gate, "norm")
    with pytest.raises(BulkheadFull), stoic.bind_criticality(Criticality.BEST_EFFORT):
        bulkhead.call(gate.op, "low2")  # the same tier as the lowest waiting: full
    step(clock, 0.03)
    crit = Caller(bulkhead, gate, "crit", Criticality.CRITICAL)
    crit.start()
    low1.join(10)
    assert isinstance(low1.error, Shed) and low1.error.cause == "priority"
    eventually(lambda: bulkhead.queued == 2)
    (event,) = shed_events(sink, "priority")
    assert event["criticality"] == "best_effort" and event["sojourn"] == 0.03
    with pytest.raises(BulkheadFull):
        bulkhead.call(gate.op, "norm2")  # norm is now the lowest: a normal arrival is refused
    finish(first, crit, norm)
    assert gate.started == ["first", "crit", "norm"]
    assert (bulkhead.in_use, bulkhead.queued) == (0, 0)


def test_an_arrival_that_may_not_wait_displaces_nobody() -> None:
    bulkhead = BlockingBulkhead(1, queue_limit=1, prioritized=True, label="p", clock=VirtualClock())
    gate = Gate()
    first = arrive(bulkhead, gate, "first")
    low = arrive(bulkhead, gate, "low", Criticality.BEST_EFFORT)
    with stoic.bind_criticality(Criticality.CRITICAL):
        with pytest.raises(BulkheadFull):
            bulkhead.acquire(timeout=0)  # as the plain queue: full, and nobody was shed for it
        low_queue = BlockingBulkhead(1, queue_limit=1, prioritized=True, label="q", clock=VirtualClock())
        low_queue.acquire()
        with pytest.raises(DeadlineExceeded):
            low_queue.acquire(timeout=0)  # room to wait, but no time to
        low_queue.release()
    assert low.is_alive() and bulkhead.queued == 1
    finish(first, low)
    assert low.error is None and gate.started == ["first", "low"]


# --- deadlines at wake, and the grant/interrupt race ---


class HeldCondition(threading.Condition):
    """A condition whose waiter, while the test has it ``held``, does not come back from its
    wait, whatever wakes it (a hand-over, a move of virtual time, a re-check): the test decides
    when it next looks at its slot and its clock. Read and set under the condition's lock."""

    held = False

    def wait(self, timeout: float | None = None) -> bool:
        woken = super().wait(timeout)
        while self.held:
            super().wait()
        return woken


class _ThreadingWithHeldWaits:
    """The ``threading`` module as the bulkhead sees it, with conditions the test can hold."""

    Condition = HeldCondition

    def __getattr__(self, name: str) -> object:
        return getattr(threading, name)


def handed_over_after_its_time_ran_out(bulkhead: BlockingBulkhead, clock: VirtualClock, *, passed_over: bool) -> None:
    """"late" (timeout 5 s) waits behind "first", "after" behind it; "late" is held in its wait
    while its time runs out and "first" releases, then let go. Sequenced on the bulkhead's lock
    and virtual time, not on real time: the release always comes before "late" looks.
    ``passed_over``: the release itself sees the deadline and gives the slot to "after" at once;
    else it hands the slot to "late", which gives it up when it wakes."""
    gate = Gate()
    first = arrive(bulkhead, gate, "first")
    late = arrive(bulkhead, gate, "late", timeout=5.0)
    with bulkhead._lock:
        (waiter,) = bulkhead._waiters
        cond = waiter.cond
        assert isinstance(cond, HeldCondition)
        cond.held = True
    after = arrive(bulkhead, gate, "after")
    step(clock, 5.0)  # its time runs out: woken by the move of time, but held before it looks
    assert late.is_alive() and bulkhead.queued_count == 2
    gate.open("first")  # the release reaches "late", which has not looked yet
    eventually(lambda: not waiter.queued)  # taken off the queue by the release
    assert late.is_alive() and "late" not in gate.started
    if passed_over:
        eventually(lambda: "after" in gate.started)
    else:
        assert bulkhead.queued_count == 1 and "after" not in gate.started  # "late" holds it, asleep
    with cond:
        cond.held = False
        cond.notify_all()
    late.join(10)
    assert isinstance(late.error, DeadlineExceeded) and "late" not in gate.started
    eventually(lambda: "after" in gate.started)  # the slot went to the next waiter, not lost
    finish(first, after)
    assert (bulkhead.in_use, bulkhead.queued) == (0, 0)


@pytest.fixture
def held_waits() -> Iterator[None]:
    bulkhead_module.threading = _ThreadingWithHeldWaits()  # type: ignore[assignment]
    try:
        yield
    finally:
        bulkhead_module.threading = threading


@pytest.mark.usefixtures("held_waits")
def test_a_waiter_whose_deadline_passed_is_failed_at_wake_not_granted(sink: RecordingSink) -> None:
    clock = VirtualClock()
    bulkhead = BlockingBulkhead(1, queue_limit=5, prioritized=True, label="d", clock=clock)
    handed_over_after_its_time_ran_out(bulkhead, clock, passed_over=True)  # (the rules see its deadline)
    (event,) = shed_events(sink, "deadline_exceeded")
    assert event["sojourn"] == 5.0 and event["criticality"] == "normal"


@pytest.mark.usefixtures("held_waits")
def test_plain_blocking_bulkhead_fails_a_woken_waiter_whose_time_ran_out(sink: RecordingSink) -> None:
    clock = VirtualClock()
    bulkhead = BlockingBulkhead(1, queue_limit=5, label="d", clock=clock)
    handed_over_after_its_time_ran_out(bulkhead, clock, passed_over=False)  # fails at wake, passes it on
    assert [e["reason"] for e in shed_events(sink, "deadline_exceeded")] == ["deadline_exceeded"]


@pytest.mark.parametrize("options", [{"queue_target": 0.01}, {"prioritized": True}, {"queue_adaptive_lifo": True}])
def test_a_slot_granted_in_the_instant_its_waiter_is_interrupted_is_passed_on(options: dict[str, object]) -> None:
    bulkhead_module.threading = _ThreadingWithInterrupts()  # type: ignore[assignment]
    try:
        clock = VirtualClock()
        bulkhead = BlockingBulkhead(1, queue_limit=5, label="r", clock=clock, **options)  # type: ignore[arg-type]
        gate = Gate()
        bulkhead.acquire()
        doomed = arrive(bulkhead, gate, "doomed")
        after = arrive(bulkhead, gate, "next")
        with bulkhead._lock:
            cond = bulkhead._waiters[0].cond
            assert isinstance(cond, InterruptibleCondition)
            cond.interrupted = True  # not woken now: it is interrupted as the slot reaches it
        bulkhead.release()
        doomed.join(10)
        assert isinstance(doomed.error, Interrupted)
        eventually(lambda: gate.started == ["next"])
        finish(after)
        assert after.result == "next" and (bulkhead.in_use, bulkhead.queued) == (0, 0)
    finally:
        bulkhead_module.threading = threading


# --- hundreds of contending threads ---


def test_hundreds_of_contending_threads_never_exceed_the_limit_and_leave_nothing_behind(sink: RecordingSink) -> None:
    bulkhead = BlockingBulkhead(4, queue_limit=40, queue_target=0.0005, queue_interval=0.002,
                                queue_adaptive_lifo=True, prioritized=True, label="many")
    lock = threading.Lock()
    inside = most = 0
    outcomes: list[str] = []
    rng = random.Random(12)
    tiers = [rng.choice(list(Criticality)) for _ in range(300)]
    timeouts = [0.003 if rng.random() < 0.2 else None for _ in range(300)]
    start = threading.Barrier(300)

    def op() -> None:
        nonlocal inside, most
        with lock:
            inside += 1
            most = max(most, inside)
        time.sleep(0.0002)
        with lock:
            inside -= 1

    def work(i: int) -> None:
        start.wait(10)
        try:
            with stoic.bind_criticality(tiers[i]):
                bulkhead.acquire(timeout=timeouts[i])
                try:
                    op()
                finally:
                    bulkhead.release()
            outcome = "ran"
        except (BulkheadFull, Shed, DeadlineExceeded) as exc:
            outcome = exc.cause if isinstance(exc, Shed) else type(exc).__name__
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(300)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(outcomes) == 300 and 1 <= most <= 4
    assert "ran" in outcomes and set(outcomes) <= {"ran", "BulkheadFull", "sojourn", "priority", "DeadlineExceeded"}
    for cause in ("sojourn", "priority"):  # every shed thread reported its own shedding, once
        assert len(shed_events(sink, cause)) == outcomes.count(cause)
    assert (bulkhead.in_use, bulkhead.queued) == (0, 0)
    assert bulkhead._rules is not None and not bulkhead._rules.parked


# --- both kinds against one reference model of priority queueing ---


class PriorityModel:
    """Who runs, who waits and who is refused, for a prioritized queue without CoDel or LIFO:
    the highest tier is served first (FIFO within a tier); a full queue takes an arrival of a
    higher tier than the lowest waiting by shedding the newest waiter of that lowest tier."""

    def __init__(self, capacity: int, queue_limit: int) -> None:
        self.capacity, self.queue_limit = capacity, queue_limit
        self.running: list[int] = []
        self.queue: list[tuple[int, int]] = []  # (ident, tier), in arrival order
        self.shed: list[int] = []
        self.full: list[int] = []

    def arrive(self, ident: int, tier: int) -> None:
        if len(self.running) < self.capacity and not self.queue:
            self.running.append(ident)
            return
        if len(self.queue) >= self.queue_limit:
            lowest = min((t for _, t in self.queue), default=tier)
            if lowest >= tier:
                self.full.append(ident)
                return
            victim = next(entry for entry in reversed(self.queue) if entry[1] == lowest)
            self.queue.remove(victim)
            self.shed.append(victim[0])
        self.queue.append((ident, tier))

    def leave(self, ident: int) -> None:
        queued = [entry for entry in self.queue if entry[0] == ident]
        if queued:
            self.queue.remove(queued[0])
        elif ident in self.running:
            self.running.remove(ident)
            if self.queue:
                best = max(self.queue, key=lambda entry: entry[1])  # max keeps the first (oldest)
                self.queue.remove(best)
                self.running.append(best[0])

    def state(self) -> tuple[list[int], int, list[int], list[int]]:
        return sorted(self.running), len(self.queue), sorted(self.shed), sorted(self.full)


Op = tuple[str, int]
_ops = st.lists(st.one_of(st.tuples(st.just("arrive"), st.integers(0, 3)),
                          st.tuples(st.just("finish"), st.integers(0, 20)),
                          st.tuples(st.just("cancel"), st.integers(0, 20))), max_size=25)


def blocking_model_run(capacity: int, queue_limit: int, ops: list[Op]) -> None:
    bulkhead = BlockingBulkhead(capacity, queue_limit=queue_limit, prioritized=True, label="model",
                                clock=VirtualClock())
    model = PriorityModel(capacity, queue_limit)
    gate = Gate()
    callers: dict[int, Caller] = {}

    def state() -> tuple[list[int], int, list[int], list[int]]:
        running = sorted(int(n) for n in gate.started if not gate.events.get(n, threading.Event()).is_set())
        errors = {i: c.error for i, c in callers.items() if not c.is_alive()}
        return (running, bulkhead.queued, sorted(i for i, e in errors.items() if isinstance(e, Shed)),
                sorted(i for i, e in errors.items() if isinstance(e, BulkheadFull)))

    for index, (kind, value) in enumerate(ops):
        if kind == "arrive":
            callers[index] = Caller(bulkhead, gate, str(index), Criticality(value))
            callers[index].start()
            model.arrive(index, value)
        elif kind == "finish" and model.running:
            ident = model.running[value % len(model.running)]
            gate.open(str(ident))
            model.leave(ident)
        elif kind == "cancel" and model.queue:
            position = value % len(model.queue)  # the bulkhead's queue is in the model's order
            ident = model.queue[position][0]
            with bulkhead._lock:
                cond = bulkhead._waiters[position].cond
                assert isinstance(cond, InterruptibleCondition)
                cond.interrupted = True
                cond.notify()
            model.leave(ident)
        expected = model.state()
        try:
            eventually(lambda e=expected: state() == e and bulkhead.in_use == len(e[0]))
        except AssertionError:
            raise AssertionError(f"step {index}: {state()} != model {expected}") from None
    for ident in callers:
        gate.open(str(ident))
    for caller in callers.values():
        caller.join(10)
    assert (bulkhead.in_use, bulkhead.queued) == (0, 0)


async def asyncio_model_run(capacity: int, queue_limit: int, ops: list[Op]) -> None:
    bulkhead = Bulkhead(capacity, queue_limit=queue_limit, prioritized=True, label="model")
    model = PriorityModel(capacity, queue_limit)
    inside: list[int] = []
    release: dict[int, asyncio.Event] = {}
    tasks: dict[int, asyncio.Task[None]] = {}

    async def op(ident: int) -> None:
        inside.append(ident)
        try:
            await release[ident].wait()
        finally:
            inside.remove(ident)

    for index, (kind, value) in enumerate(ops):
        if kind == "arrive":
            release[index] = asyncio.Event()
            with stoic.bind_criticality(Criticality(value)):
                tasks[index] = asyncio.create_task(bulkhead.execute(op, index))
            model.arrive(index, value)
        elif kind == "finish" and model.running:
            ident = model.running[value % len(model.running)]
            release[ident].set()
            model.leave(ident)
        elif kind == "cancel" and model.queue:
            ident = model.queue[value % len(model.queue)][0]
            tasks[ident].cancel()
            model.leave(ident)
        await settle()

        def refused(kind: type[BaseException]) -> list[int]:
            return sorted(i for i, t in tasks.items() if t.done() and not t.cancelled()
                          and isinstance(t.exception(), kind))

        assert (sorted(inside), bulkhead.queued, refused(Shed), refused(BulkheadFull)) == model.state(), index
        assert bulkhead.in_use == len(model.running)
    for event in release.values():
        event.set()
    await asyncio.gather(*tasks.values(), return_exceptions=True)
    assert (bulkhead.in_use, bulkhead.queued) == (0, 0)


@pytest.mark.parametrize("form", ["asyncio", "blocking"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(capacity=1, queue_limit=2,  # displacement, then service by tier
         ops=[("arrive", 2), ("arrive", 0), ("arrive", 1), ("arrive", 3), ("finish", 0), ("finish", 0)])
@example(capacity=1, queue_limit=1, ops=[("arrive", 0), ("arrive", 1), ("arrive", 1), ("cancel", 0), ("arrive", 0)])
@given(capacity=st.integers(1, 3), queue_limit=st.integers(1, 3), ops=_ops)
def test_both_kinds_follow_the_reference_model_of_priority_queueing(form: str, capacity: int, queue_limit: int,
                                                                    ops: list[Op]) -> None:
    if form == "asyncio":
        asyncio.run(asyncio_model_run(capacity, queue_limit, ops))
        return
    bulkhead_module.threading = _ThreadingWithInterrupts()  # type: ignore[assignment]
    try:
        blocking_model_run(capacity, queue_limit, ops)
    finally:
        bulkhead_module.threading = threading


def test_shed_waiters_are_counted_by_reason_in_both_kinds(monkeypatch: pytest.MonkeyPatch) -> None:
    from stoic import _metrics

    monkeypatch.setattr(_metrics.state, "enabled", True)
    key = ("stoic.bulkhead.rejections", "priority")
    blocking = BlockingBulkhead(1, queue_limit=1, prioritized=True, label="m", clock=VirtualClock())
    gate = Gate()
    first = arrive(blocking, gate, "first")
    low = arrive(blocking, gate, "low", Criticality.BEST_EFFORT)
    crit = Caller(blocking, gate, "crit", Criticality.CRITICAL)
    crit.start()
    low.join(10)
    assert isinstance(low.error, Shed)
    finish(first, crit)
    assert blocking._rec.counters.get(key) == 1

    async def displace() -> int:
        bulkhead = Bulkhead(1, queue_limit=1, prioritized=True, label="m")
        release = asyncio.Event()
        tasks = []
        for tier in (Criticality.NORMAL, Criticality.BEST_EFFORT, Criticality.CRITICAL):
            with stoic.bind_criticality(tier):
                tasks.append(asyncio.create_task(bulkhead.execute(release.wait)))
            await settle()
        release.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(results[1], Shed)
        return bulkhead._rec.counters.get(key, 0)

    assert asyncio.run(displace()) == 1
