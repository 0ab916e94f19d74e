"""What counts: the three verdicts (seed 000, "What counts"), stale completions, and calls that
are refused for the caller's sake (seed 000, "Cancellation and deadlines, for every policy")."""

from __future__ import annotations

import asyncio

import pytest
from _breaker_helpers import Boom, Gate, fail, ok

import stoic
from stoic import (
    BreakerState,
    BulkheadFull,
    CircuitBreaker,
    CircuitOpen,
    CountWindow,
    DeadlineExceeded,
    Defect,
    OpenDuration,
    RateLimited,
)
from stoic.testing import RecordingSink, VirtualClock, settle


def make(**overrides: object) -> CircuitBreaker:
    config: dict[str, object] = {
        "window": CountWindow(10),
        "minimum_calls": 1,
        "failure_rate_threshold": 1.0,
        "open_duration": OpenDuration.fixed(10.0, jitter=0.0),
    }
    config.update(overrides)
    return CircuitBreaker(label="v", **config)  # type: ignore[arg-type]


async def half_open(breaker: CircuitBreaker, clock: VirtualClock) -> None:
    with pytest.raises(Boom):
        await breaker.execute(fail)
    await clock.advance(10)
    assert breaker.state is BreakerState.HALF_OPEN


def counts(breaker: CircuitBreaker) -> tuple[int, int]:
    snap = breaker.snapshot
    return snap.calls, snap.failures


async def test_a_cancelled_caller_is_never_counted(clock: VirtualClock, sink: RecordingSink) -> None:
    breaker = make()
    gate = Gate()
    task = asyncio.create_task(breaker.execute(gate.op))
    await settle()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert counts(breaker) == (0, 0)
    assert breaker.state is BreakerState.CLOSED
    assert [dict(e.attributes) for e in sink.of("breaker.ignored")] == [{"reason": "cancelled"}]


async def test_an_error_raised_while_the_caller_is_cancelling_is_not_counted(clock: VirtualClock) -> None:
    breaker = make()

    async def cleanup_fails() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise Boom("cleanup failed") from None

    task = asyncio.create_task(breaker.execute(cleanup_fails))
    await settle()
    task.cancel()
    with pytest.raises(Boom):
        await task
    assert counts(breaker) == (0, 0)


async def test_a_cancelled_probe_returns_its_permit(clock: VirtualClock, sink: RecordingSink) -> None:
    breaker = make()
    await half_open(breaker, clock)
    gate = Gate()
    probe = asyncio.create_task(breaker.execute(gate.op))
    await settle()
    with pytest.raises(CircuitOpen):
        await breaker.execute(ok)
    probe.cancel()
    with pytest.raises(asyncio.CancelledError):
        await probe
    assert await breaker.execute(ok) == "ok"  # the permit came back
    assert breaker.state is BreakerState.CLOSED


async def test_a_defect_is_rethrown_reported_and_never_counted(clock: VirtualClock, sink: RecordingSink) -> None:
    breaker = make()

    class Bug(Defect):
        pass

    async def buggy() -> None:
        raise Bug("our own mistake")

    for _ in range(5):
        with pytest.raises(Bug):
            await breaker.execute(buggy)
    assert counts(breaker) == (0, 0)
    assert breaker.state is BreakerState.CLOSED
    defects = sink.of("breaker.defect")
    assert len(defects) == 5 and defects[0].level is stoic.Level.ERROR


async def test_an_error_wrapping_a_defect_is_a_defect(clock: VirtualClock) -> None:
    breaker = make()

    async def wrapped() -> None:
        try:
            raise Defect("bug")
        except Defect as bug:
            raise RuntimeError("wrapper") from bug

    with pytest.raises(RuntimeError):
        await breaker.execute(wrapped)
    assert counts(breaker) == (0, 0)


async def test_a_defect_in_a_probe_returns_its_permit(clock: VirtualClock) -> None:
    breaker = make()
    await half_open(breaker, clock)

    async def buggy() -> None:
        raise Defect("bug")

    with pytest.raises(Defect):
        await breaker.execute(buggy)
    assert breaker.state is BreakerState.HALF_OPEN
    assert await breaker.execute(ok) == "ok"
    assert breaker.state is BreakerState.CLOSED


@pytest.mark.parametrize("rejection", [BulkheadFull(label="inner"), RateLimited(retry_after=1.0), CircuitOpen()])
async def test_an_inner_rejection_is_ignored_by_default(
    clock: VirtualClock, sink: RecordingSink, rejection: stoic.Rejected
) -> None:
    breaker = make()

    async def refused() -> None:
        raise rejection

    with pytest.raises(type(rejection)) as caught:
        await breaker.execute(refused)
    assert caught.value is rejection  # propagated unchanged
    assert counts(breaker) == (0, 0)
    assert [dict(e.attributes) for e in sink.of("breaker.ignored")] == [{"reason": "rejection"}]


async def test_an_inner_rejection_in_a_probe_returns_its_permit(clock: VirtualClock) -> None:
    breaker = make()
    await half_open(breaker, clock)

    async def refused() -> None:
        raise BulkheadFull()

    with pytest.raises(BulkheadFull):
        await breaker.execute(refused)
    assert breaker.state is BreakerState.HALF_OPEN
    assert await breaker.execute(ok) == "ok"
    assert breaker.state is BreakerState.CLOSED


async def test_record_when_false_makes_an_error_a_success(clock: VirtualClock, sink: RecordingSink) -> None:
    class NotFound(Exception):
        pass

    breaker = make(record_when=lambda error: not isinstance(error, NotFound))
    await half_open(breaker, clock)

    async def missing() -> None:
        raise NotFound("404")

    with pytest.raises(NotFound):
        await breaker.execute(missing)  # the dependency answered: the probe succeeds
    assert breaker.state is BreakerState.CLOSED
    with pytest.raises(NotFound):
        await breaker.execute(missing)
    assert counts(breaker) == (1, 0)
    assert sink.of("breaker.recorded")[-1].attributes["outcome"] == "success"


async def test_record_when_can_count_an_inner_deadline(clock: VirtualClock) -> None:
    def count_deadlines(error: Exception) -> bool:
        return CircuitBreaker.counts_by_default(error) or isinstance(error, DeadlineExceeded)

    breaker = make(record_when=count_deadlines)

    async def attempt() -> None:
        async with stoic.timeout(1.0):
            await asyncio.Event().wait()

    with pytest.raises(DeadlineExceeded):
        await clock.run(breaker.execute(attempt))
    assert counts(breaker) == (1, 1)
    assert breaker.state is BreakerState.OPEN


async def test_a_record_when_that_raises_counts_the_call_as_a_failure(clock: VirtualClock, sink: RecordingSink) -> None:
    def broken(error: Exception) -> bool:
        raise KeyError("bug in the predicate")

    breaker = make(record_when=broken)
    with pytest.warns(RuntimeWarning, match="bug in the predicate"), pytest.raises(Boom):
        await breaker.execute(fail)  # the operation's own error still propagates
    assert counts(breaker) == (1, 1)


def test_counts_by_default() -> None:
    assert CircuitBreaker.counts_by_default(Boom())
    assert CircuitBreaker.counts_by_default(TimeoutError())
    assert not CircuitBreaker.counts_by_default(BulkheadFull())
    assert not CircuitBreaker.counts_by_default(DeadlineExceeded())
    assert CircuitBreaker.counts_by_default(DeadlineExceeded(timed_out=True))


async def test_a_call_finishing_after_a_forced_change_is_stale(clock: VirtualClock, sink: RecordingSink) -> None:
    breaker = make()
    gate = Gate()
    task = asyncio.create_task(breaker.execute(gate.op))
    await settle()
    breaker.force_open()
    breaker.force_closed()
    gate.open(Boom("late"))
    with pytest.raises(Boom):
        await task
    assert counts(breaker) == (0, 0)
    assert breaker.state is BreakerState.CLOSED
    assert [dict(e.attributes) for e in sink.of("breaker.ignored")] == [{"reason": "stale"}]


async def test_calls_in_flight_when_the_breaker_trips_are_stale(clock: VirtualClock) -> None:
    breaker = make(minimum_calls=1, failure_rate_threshold=1.0)
    gate = Gate()
    slow_success = asyncio.create_task(breaker.execute(gate.op))
    await settle()
    with pytest.raises(Boom):
        await breaker.execute(fail)
    assert breaker.state is BreakerState.OPEN
    await clock.advance(10)
    assert breaker.state is BreakerState.HALF_OPEN
    gate.open()
    assert await slow_success == "done"
    assert breaker.state is BreakerState.HALF_OPEN  # the old success did not close it


async def test_work_already_late_is_refused_without_using_a_probe(clock: VirtualClock, sink: RecordingSink) -> None:
    breaker = make()
    await half_open(breaker, clock)
    ran = 0

    async def op() -> str:
        nonlocal ran
        ran += 1
        return "ran"

    with pytest.raises(DeadlineExceeded) as caught:
        async with stoic.timeout(0):
            await breaker.execute(op)
    assert caught.value.label == "v"
    assert ran == 0
    assert dict(sink.of("breaker.rejected")[-1].attributes) == {"state": "half_open", "reason": "deadline_exceeded"}
    assert await breaker.execute(op) == "ran"  # the probe permit was never taken
    assert breaker.state is BreakerState.CLOSED


def test_sync_work_already_late_is_refused() -> None:
    # A deadline set in an async context is visible to a plain call made inside it.
    clock = VirtualClock()
    breaker = CircuitBreaker(label="late", clock=clock)

    async def main() -> None:
        async with stoic.timeout(0, clock=clock):
            with pytest.raises(DeadlineExceeded):
                breaker.call(lambda: None)

    asyncio.run(main())


async def test_work_with_time_left_runs(clock: VirtualClock) -> None:
    breaker = make()
    async with stoic.timeout(5):
        assert await breaker.execute(ok) == "ok"


def test_a_coroutine_closed_mid_call_passes_generator_exit_through() -> None:
    # No event loop at all: the coroutine is driven and closed by hand.
    breaker = CircuitBreaker(label="closed-by-hand", window=CountWindow(1), minimum_calls=1)

    class Suspend:
        def __await__(self):  # type: ignore[no-untyped-def]
            yield

    async def op() -> None:
        await Suspend()

    coroutine = breaker.execute(op)
    coroutine.send(None)
    coroutine.close()  # GeneratorExit at the await: must leave without any other error
    assert breaker.snapshot.calls == 0
    assert breaker.state is BreakerState.CLOSED


async def test_an_innermost_attempt_timeout_that_cut_the_call_short_counts_as_a_failure(
    clock: VirtualClock, sink: RecordingSink
) -> None:
    """The recommended order puts the attempt timeout inside the breaker, so that a hung call is
    seen as a failed one (seed 000, "Recommended order")."""
    breaker = make(window=CountWindow(2), minimum_calls=2)

    async def hangs_past_its_attempt_timeout() -> None:
        async with stoic.timeout(2.0):
            await clock.sleep_until(clock.now_ns() + 10**12)

    for _ in range(2):
        task = asyncio.create_task(breaker.execute(hangs_past_its_attempt_timeout))
        await clock.advance(2.0)
        with pytest.raises(DeadlineExceeded) as caught:
            await task
        assert caught.value.timed_out
    assert counts(breaker) == (2, 2)  # the evidence that tripped it
    assert breaker.state is BreakerState.OPEN
    assert [e.attributes["outcome"] for e in sink.of("breaker.recorded")] == ["failure", "failure"]
    assert sink.of("breaker.opened")[0].attributes["trigger"] == "failure_rate"


async def test_a_deadline_refusal_from_an_inner_policy_is_not_counted(clock: VirtualClock, sink: RecordingSink) -> None:
    """A DeadlineExceeded raised because a policy refused late work (nothing ran) is a rejection."""
    breaker = make()

    async def inner_refuses() -> None:
        raise DeadlineExceeded("refused before starting", label="inner")

    with pytest.raises(DeadlineExceeded) as caught:
        await breaker.execute(inner_refuses)
    assert not caught.value.timed_out
    assert counts(breaker) == (0, 0)
    assert [dict(e.attributes) for e in sink.of("breaker.ignored")] == [{"reason": "rejection"}]


def test_an_async_function_given_to_call_is_refused_and_never_counted(sink: RecordingSink) -> None:
    """breaker.call(async_fn) would otherwise record a success for a coroutine that never ran."""
    breaker = make()

    async def not_for_call() -> int:
        return 1

    with pytest.raises(TypeError, match="execute"):
        breaker.call(not_for_call)
    assert counts(breaker) == (0, 0)
    assert len(sink.of("breaker.defect")) == 1
    assert not sink.of("breaker.recorded")


async def test_an_operation_called_with_arguments_it_does_not_take_is_never_counted(
    clock: VirtualClock, sink: RecordingSink,
) -> None:
    """A wrong call site (``execute(fetch, 1, 2)`` against ``fetch(user_id)``) is a bug in the
    caller, not the dependency failing: counting it would let one buggy caller open the breaker
    for everyone. It propagates unchanged and is reported as a defect; a probe's permit goes back."""
    breaker = make()

    async def fetch(user_id: int) -> int:
        return user_id

    def lookup(user_id: int) -> int:
        return user_id

    class Client:
        def get(self, key: str) -> str:
            return key

    import functools

    wrong: list[tuple[str, object]] = [
        ("fetch() takes 1 positional argument but 2 were given", lambda: breaker.execute(fetch, 1, 2)),
        ("fetch() missing 1 required positional argument", lambda: breaker.execute(fetch)),
        ("unexpected keyword argument 'user'", lambda: breaker.execute(fetch, user=1)),
        ("lookup() takes 1 positional argument", lambda: breaker.call(lookup, 1, 2)),
        ("Client.get() missing", lambda: breaker.call(Client().get)),
        ("fetch() takes 1 positional argument", lambda: breaker.execute(functools.partial(fetch, 1), 2)),
        ("fetch() takes 1 positional argument", lambda: stoic.Pipeline(breaker).execute(fetch, 1, 2)),
    ]
    for message, attempt in wrong:
        with pytest.raises(TypeError, match=message.replace("(", r"\(").replace(")", r"\)")):
            result = attempt()
            if asyncio.iscoroutine(result):
                await result
    assert counts(breaker) == (0, 0) and breaker.state is BreakerState.CLOSED
    assert [dict(e.attributes) for e in sink.of("breaker.defect")] == [{"error.type": "TypeError"}] * len(wrong)

    # A probe's permit goes back: the next call probes and closes the breaker.
    await half_open(breaker, clock)
    with pytest.raises(TypeError):
        await breaker.execute(fetch, 1, 2)
    assert breaker.state is BreakerState.HALF_OPEN
    assert await breaker.execute(fetch, 7) == 7
    assert breaker.state is BreakerState.CLOSED


async def test_a_wrong_call_inside_the_operation_is_its_own_failure(clock: VirtualClock) -> None:
    """Only the call site's own binding error is a defect: the same TypeError raised by a call
    the operation makes (a library called wrongly, deep inside) is the operation failing."""
    breaker = make()

    def fetch(user_id: int) -> int:
        return user_id

    async def handler() -> int:
        return fetch(1, 2)  # type: ignore[call-arg]

    def sync_handler() -> int:
        return fetch()  # type: ignore[call-arg]

    with pytest.raises(TypeError, match="fetch"):
        await breaker.execute(handler)
    assert counts(breaker) == (1, 1)
    breaker.reset()
    with pytest.raises(TypeError, match="fetch"):
        breaker.call(sync_handler)
    assert counts(breaker) == (1, 1)
    breaker.reset()
    with pytest.raises(TypeError, match="has no len"):
        breaker.call(len, 5)  # a builtin's own TypeError: no Python code of fn's to name
    assert counts(breaker) == (1, 1)
