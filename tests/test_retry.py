"""retry: the order of checks, classification, Retry-After, deadlines, budgets, cancellation,
events, Attempt passing (seed 001, "Semantics"; field reports 6-10). All on virtual time."""

from __future__ import annotations

import asyncio
import functools
import json
from typing import Any

import pytest

import stoic
from stoic import (
    Attempt,
    BudgetExhausted,
    CircuitOpen,
    DeadlineExceeded,
    Defect,
    RateLimited,
    RetryBudget,
    RetryClassifier,
    RetryDecision,
    Schedule,
    retry,
    retry_sync,
    retrying,
)
from stoic.testing import RecordingSink, VirtualClock, fail_times, fail_with, hang, settle

THREE = Schedule.exponential(1).attempts(3)


class Stop(Exception):
    retry_decision = RetryDecision.STOP


class After(Exception):
    def __init__(self, seconds: float) -> None:
        super().__init__(seconds)
        self.retry_decision = RetryDecision.retry_after(seconds)


class TestBasics:
    async def test_first_attempt_success_returns_without_events(self, clock: VirtualClock,
                                                                sink: RecordingSink) -> None:
        op = fail_times(0, then=42)
        assert await retry(THREE, op, label="op") == 42
        assert op.calls == 1
        assert sink.events == []

    async def test_failures_then_success_sleeps_the_schedule(self, clock: VirtualClock, sink: RecordingSink) -> None:
        op = fail_times(2, then="ok")
        assert await clock.run(retry(THREE, op, label="op")) == "ok"
        assert op.started_at == [0.0, 1.0, 3.0]
        assert sink.names == ["retry.attempt_failed", "retry.attempt_failed", "retry.succeeded"]
        first = sink.of("retry.attempt_failed")[0]
        assert dict(first.attributes) == {"attempt": 1, "error.type": "ConnectionError", "decision": "retry",
                                          "next_delay": 1.0}
        assert sink.of("retry.succeeded")[0].attributes == {"attempts": 3}

    async def test_exhausted_raises_the_last_attempts_own_exception(self, clock: VirtualClock,
                                                                    sink: RecordingSink) -> None:
        op = fail_times(5)
        with pytest.raises(ConnectionError) as caught:
            await clock.run(retry(THREE, op, label="op"))
        assert caught.value is op.raised[-1]
        assert op.calls == 3
        assert sink.of("retry.exhausted")[0].attributes == {"attempts": 3, "error.type": "ConnectionError"}
        assert clock.now() == 3.0

    async def test_arguments_are_forwarded(self, clock: VirtualClock) -> None:
        async def add(a: int, b: int, *, scale: int = 1) -> int:
            return (a + b) * scale

        assert await retry(THREE, add, 2, 3, scale=10, label="op") == 50

    async def test_label_names_every_event(self, clock: VirtualClock, sink: RecordingSink) -> None:
        async def fetch_user() -> None:
            raise ConnectionError

        with pytest.raises(ConnectionError):
            await clock.run(retry(Schedule.fixed(0).attempts(2), fetch_user, label="users"))
        assert {e.label for e in sink.events} == {"users"}


class TestValidation:
    async def test_an_unbounded_schedule_is_a_type_error_saying_how_to_bound_it(self) -> None:
        with pytest.raises(TypeError, match=r"\.attempts\(n\).*Schedule\.delays"):
            retry(Schedule.exponential(1), fail_times(0), label="op")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="BoundedSchedule"):
            retry(3, fail_times(0), label="op")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"\.attempts\(n\)"):
            stoic.Retrying(Schedule.fixed(1), label="op")  # type: ignore[arg-type]

    @pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf")])
    async def test_zero_or_invalid_attempt_timeout_is_rejected(self, value: float) -> None:
        # Field report 10: a zero timeout never means "no timeout".
        with pytest.raises(ValueError, match="attempt_timeout"):
            retry(THREE, fail_times(0), attempt_timeout=value, label="op")

    def test_zero_budget_is_rejected_or_means_no_retries(self) -> None:
        with pytest.raises(ValueError, match="ratio"):
            RetryBudget(ratio=0)
        with pytest.raises(ValueError, match="ratio"):
            RetryBudget(ratio=1.5)
        with pytest.raises(ValueError, match="reserve_capacity"):
            RetryBudget(reserve_capacity=-1)
        with pytest.raises(ValueError, match="reserve_per_second"):
            RetryBudget(reserve_per_second=-1)

    async def test_an_empty_reserve_means_exactly_no_retry_without_earnings(self, clock: VirtualClock,
                                                                            sink: RecordingSink) -> None:
        budget = RetryBudget(ratio=0.1, reserve_per_second=0, reserve_capacity=0)
        op = fail_times(5)
        with pytest.raises(ConnectionError):
            await clock.run(retry(THREE, op, budget=budget, label="op"))
        assert op.calls == 1
        assert sink.names == ["retry.budget_exhausted"]

    async def test_attempts_zero_is_rejected(self) -> None:
        with pytest.raises(ValueError, match="count"):
            Schedule.fixed(1).attempts(0)


class TestClassification:
    @pytest.mark.parametrize("error", [
        UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"),
        json.JSONDecodeError("Expecting value", "x", 0),
        TypeError("bad call"),
        AttributeError("no such"),
        BudgetExhausted(),
        Stop(),
    ])
    async def test_standard_stops_on_errors_retrying_cannot_fix(self, error: Exception, clock: VirtualClock,
                                                                 sink: RecordingSink) -> None:
        op = fail_with(error)
        with pytest.raises(type(error)):
            await clock.run(retry(THREE, op, label="op"))
        assert op.calls == 1
        assert sink.names == ["retry.permanent"]

    @pytest.mark.parametrize("error", [ConnectionError(), OSError(), ValueError("x"), RuntimeError(),
                                       DeadlineExceeded(), RateLimited(), CircuitOpen()])
    async def test_standard_retries_anything_else(self, error: Exception, clock: VirtualClock) -> None:
        op = fail_times(2, error, then="ok")
        assert await clock.run(retry(THREE, op, label="op")) == "ok"
        assert op.calls == 3

    async def test_a_defect_is_never_retried_whatever_the_classifier(self, clock: VirtualClock,
                                                                     sink: RecordingSink) -> None:
        class Bug(Defect):
            pass

        op = fail_with(Bug("oops"))
        with pytest.raises(Bug):
            await clock.run(retry(THREE, op, classify=lambda e: True, label="op"))
        assert op.calls == 1
        assert sink.names == ["retry.defect"]
        assert sink.events[0].level == stoic.Level.ERROR

    async def test_transient_only(self, clock: VirtualClock) -> None:
        op = fail_with(ValueError("x"))
        with pytest.raises(ValueError):
            await clock.run(retry(THREE, op, classify=RetryClassifier.transient_only, label="op"))
        assert op.calls == 1
        for error in (TimeoutError(), ConnectionResetError(), DeadlineExceeded(), After(1)):
            op = fail_times(1, error, then=1)
            assert await clock.run(retry(THREE, op, classify=RetryClassifier.transient_only, label="op")) == 1

    async def test_never(self, clock: VirtualClock) -> None:
        op = fail_times(1, then=1)
        with pytest.raises(ConnectionError):
            await clock.run(retry(THREE, op, classify=RetryClassifier.never, label="op"))
        assert op.calls == 1

    async def test_custom_callables_and_exception_types(self, clock: VirtualClock) -> None:
        op = fail_times(1, KeyError("k"), then=1)
        assert await clock.run(retry(THREE, op, classify=lambda e: isinstance(e, KeyError), label="op")) == 1
        op = fail_times(1, KeyError("k"), then=1)
        with pytest.raises(KeyError):
            await clock.run(retry(THREE, op, classify=(ConnectionError, TimeoutError), label="op"))
        op = fail_times(1, TimeoutError, then=1)
        assert await clock.run(retry(THREE, op, classify=TimeoutError, label="op")) == 1
        op = fail_times(1, TimeoutError, then=1)
        assert await clock.run(retry(THREE, op, classify=RetryClassifier(lambda e: RetryDecision.retry_after(7)),
                label="op")) == 1
        assert op.started_at == [clock.now() - 7, clock.now()]
        with pytest.raises(TypeError):
            retry(THREE, op, classify=42, label="op")  # type: ignore[arg-type]

    def test_decisions_are_values(self) -> None:
        assert RetryDecision.retry_after(1.5) == RetryDecision.retry_after(1.5)
        assert RetryDecision.retry_after(1.5).after == 1.5
        assert RetryDecision.RETRY != RetryDecision.STOP
        assert repr(RetryDecision.retry_after(2)) == "RetryDecision.retry_after(2.0)"
        assert isinstance(Stop(), stoic.Retryable)
        with pytest.raises(ValueError, match="seconds"):
            RetryDecision.retry_after(float("nan"))

    @pytest.mark.parametrize("decision", [RetryDecision.RETRY, RetryDecision.STOP, RetryDecision.retry_after(1.5)])
    def test_decisions_copy_and_pickle_as_values(self, decision: RetryDecision) -> None:
        # An exception carrying one (a Retryable's retry_decision) crosses a process pool by
        # pickle; copy/pickle set the slots through the refused __setattr__ (AttributeError).
        import copy
        import pickle

        assert copy.copy(decision) is decision and copy.deepcopy(decision) is decision
        restored = pickle.loads(pickle.dumps(decision))
        assert restored == decision and restored.after == decision.after and restored.retries == decision.retries
        if decision.after is None:
            assert restored is decision  # RETRY and STOP stay the singletons


class TestRetryAfter:
    async def test_retry_after_replaces_the_schedules_delay(self, clock: VirtualClock, sink: RecordingSink) -> None:
        op = fail_times(1, After(7.5), then="ok")
        assert await clock.run(retry(THREE, op, label="op")) == "ok"
        assert op.started_at == [0.0, 7.5]
        event = sink.of("retry.attempt_failed")[0]
        assert event.attributes["decision"] == "retry_after"
        assert event.attributes["next_delay"] == 7.5

    async def test_a_rejections_retry_after_is_honoured(self, clock: VirtualClock) -> None:
        op = fail_times(1, CircuitOpen(retry_after=12.0), then="ok")
        assert await clock.run(retry(THREE, op, label="op")) == "ok"
        assert op.started_at == [0.0, 12.0]

    async def test_retry_after_is_capped_at_five_minutes(self, clock: VirtualClock, sink: RecordingSink) -> None:
        op = fail_times(1, After(3600), then="ok")
        assert await clock.run(retry(THREE, op, label="op")) == "ok"
        assert op.started_at == [0.0, 300.0]
        assert sink.of("retry.after_capped")[0].attributes == {"requested": 3600.0, "capped": 300.0}

    async def test_an_unbounded_rejection_retry_after_is_capped_not_a_crash(
        self, clock: VirtualClock, sink: RecordingSink
    ) -> None:
        # A rejection may carry any float, an infinite or astronomically long retry_after
        # included: retry caps it like any other long one instead of raising OverflowError
        # in place of the operation's own error.
        for after in (float("inf"), 1e300):
            sink.clear()
            op = fail_times(1, stoic.RateLimited(retry_after=after), then="ok")
            start = clock.now()
            assert await clock.run(retry(THREE, op, label="op")) == "ok"
            assert op.started_at == [start, start + 300.0]
            assert sink.of("retry.after_capped")[0].attributes["capped"] == 300.0

    async def test_retry_after_keeps_the_schedules_bound(self, clock: VirtualClock, sink: RecordingSink) -> None:
        op = fail_with(After(1))
        with pytest.raises(After):
            await clock.run(retry(Schedule.fixed(100).attempts(2), op, label="op"))
        assert op.started_at == [0.0, 1.0]
        assert sink.names[-1] == "retry.exhausted"

    async def test_retry_after_keeps_the_schedules_up_to(self, clock: VirtualClock, sink: RecordingSink) -> None:
        # up_to judged the schedule's 1 s wait; a Retry-After of 100 s in its place would start
        # the next attempt at 100 s, past the 10 s limit no attempt may start after.
        op = fail_with(After(100))
        with pytest.raises(After):
            await clock.run(retry(Schedule.fixed(1).up_to(10).attempts(5), op, label="op"))
        assert op.started_at == [0.0]
        assert sink.names == ["retry.exhausted"]
        assert sink.of("retry.exhausted")[0].attributes == {"attempts": 1, "error.type": "After"}
        # A Retry-After that still fits is waited, as the limit's own delay would be.
        short = fail_times(1, After(8), then="ok")
        start = clock.now()
        assert await clock.run(retry(Schedule.fixed(1).up_to(10).attempts(5), short, label="op")) == "ok"
        assert short.started_at == [start, start + 8.0]

    async def test_a_retry_after_shorter_than_the_schedules_delay_is_what_up_to_judges(
        self, clock: VirtualClock, sink: RecordingSink
    ) -> None:
        # The attempt fails at 32 s asking for 5 s: the next would start at 37 s, within the 40 s
        # limit. The schedule's own 30 s (to 62 s) is no one's wait, so it must not stop the retry.
        op = fail_times(1, After(5), then="ok", takes=32)
        assert await clock.run(retry(Schedule.fixed(30).up_to(40).attempts(5), op, label="op")) == "ok"
        assert op.started_at == [0.0, 37.0]
        assert "retry.exhausted" not in sink.names
        # Under jitter, in a combination and past a cap too; and one that would start past it still stops.
        for schedule in (Schedule.fixed(30).up_to(40).jittered().attempts(5),
                         Schedule.fixed(30).up_to(40).intersection(Schedule.fixed(1).attempts(5)),
                         Schedule.fixed(30).up_to(40).attempts(3).and_then(Schedule.fixed(1).attempts(1)).capped(35)):
            for after, started in ((5, [0.0, 37.0]), (9, [0.0])):
                again = fail_times(1, After(after), then="ok", takes=32)
                start = clock.now()
                try:
                    await clock.run(retry(schedule, again, label="op"))
                except After:
                    pass
                assert [t - start for t in again.started_at] == started, (schedule, after)

    def test_retry_after_keeps_the_up_to_of_each_side_of_a_combination(self, jumping_clock: VirtualClock) -> None:
        # A union goes on while either side does: one without a limit carries it past the other's.
        union = Schedule.fixed(1).up_to(10).union(Schedule.fixed(50).attempts(3))
        op = fail_times(1, After(100), then="ok")
        assert retry_sync(union.attempts(5), op.sync, label="op") == "ok"
        assert op.started_at == [0.0, 100.0]
        # Past the first side of an and_then's limit, the second takes over from its start.
        then = fail_with(After(100))
        start = jumping_clock.now()
        with pytest.raises(After):
            retry_sync(Schedule.fixed(1).up_to(10).attempts(3).and_then(Schedule.fixed(1).up_to(150).attempts(3)),
                       then.sync, label="op")
        assert then.started_at == [start, start + 100, start + 200]  # (the second's 150 s limit, from 100 s)
        # An intersection, and a limit under jitter and a cap, stop there.
        for schedule in (Schedule.fixed(1).up_to(10).intersection(Schedule.fixed(0).attempts(3)),
                         Schedule.fixed(1).up_to(10).jittered().capped(2).attempts(3)):
            failing = fail_with(After(100))
            start = jumping_clock.now()
            with pytest.raises(After):
                retry_sync(schedule, failing.sync, label="op")
            assert failing.started_at == [start], schedule

    async def test_retry_after_keeps_the_budget(self, clock: VirtualClock, sink: RecordingSink) -> None:
        op = fail_with(After(1))
        budget = RetryBudget(ratio=1.0, reserve_per_second=0, reserve_capacity=0)
        with pytest.raises(After):
            await clock.run(retry(THREE, op, budget=budget, label="op"))
        assert op.calls == 2  # one earned token
        assert sink.names[-1] == "retry.budget_exhausted"

    async def test_retry_after_keeps_the_deadline(self, clock: VirtualClock, sink: RecordingSink) -> None:
        op = fail_with(After(20))

        async def call() -> None:
            async with stoic.timeout(10):
                await retry(THREE, op, label="op")

        with pytest.raises(After):
            await clock.run(call())
        assert op.calls == 1
        assert sink.names == ["retry.deadline_skip"]
        assert clock.now() == 0


class TestOrderOfChecks:
    async def test_permanent_is_reported_before_exhaustion(self, clock: VirtualClock, sink: RecordingSink) -> None:
        with pytest.raises(Stop):
            await clock.run(retry(Schedule.fixed(1).attempts(1), fail_with(Stop()), label="op"))
        assert sink.names == ["retry.permanent"]

    async def test_exhaustion_is_reported_before_the_deadline(self, clock: VirtualClock,
                                                              sink: RecordingSink) -> None:
        async def call() -> None:
            async with stoic.timeout(0.5):
                await retry(Schedule.fixed(1).attempts(1), fail_with(ConnectionError()), label="op")

        with pytest.raises(ConnectionError):
            await clock.run(call())
        assert sink.names == ["retry.exhausted"]

    async def test_a_deadline_skip_spends_no_budget_token(self, clock: VirtualClock, sink: RecordingSink) -> None:
        budget = RetryBudget(ratio=0.5, reserve_per_second=0, reserve_capacity=3)
        before = budget.tokens

        async def call() -> None:
            async with stoic.timeout(5):
                await retry(Schedule.fixed(1).attempts(5), fail_with(ConnectionError(), takes=3), budget=budget,
                            label="op")

        with pytest.raises(ConnectionError):
            await clock.run(call())
        assert sink.names == ["retry.deadline_skip"]
        assert budget.tokens == before + 0.5  # the deposit, and nothing spent

    async def test_nested_is_checked_before_the_classifier(self, clock: VirtualClock, sink: RecordingSink) -> None:
        async def outer() -> None:
            await retry(THREE, fail_with(Stop()), label="op")

        with pytest.raises(Stop):
            await clock.run(retry(Schedule.fixed(0).attempts(1), outer, label="op"))
        assert sink.names[0] == "retry.nested"


class TestDeadlines:
    async def test_an_attempt_that_could_not_finish_in_time_is_skipped(self, clock: VirtualClock,
                                                                      sink: RecordingSink) -> None:
        op = fail_with(ConnectionError(), takes=3)

        async def call() -> None:
            async with stoic.timeout(10):
                await retry(Schedule.fixed(1).attempts(10), op, label="op")

        with pytest.raises(ConnectionError):  # the operation's own error, not DeadlineExceeded
            await clock.run(call())
        # Attempts at 0, 4: each takes 3 s, then 1 s of backoff. At 7 s, 1 + 3 >= 3 s left.
        assert op.started_at == [0.0, 4.0]
        assert clock.now() == 7.0
        assert sink.of("retry.deadline_skip")[0].attributes == {"attempt": 2, "error.type": "ConnectionError"}

    async def test_per_attempt_timeout_makes_a_hung_attempt_transient(self, clock: VirtualClock,
                                                                      sink: RecordingSink) -> None:
        op = hang()
        with pytest.raises(DeadlineExceeded):
            await clock.run(retry(Schedule.fixed(1).attempts(3), op, attempt_timeout=2, label="op"))
        assert op.started_at == [0.0, 3.0, 6.0]
        assert clock.now() == 8.0
        assert [e.attributes["error.type"] for e in sink.of("retry.attempt_failed")] == ["DeadlineExceeded"] * 2
        assert clock.pending_timers == 0

    async def test_attempt_timeout_does_not_touch_a_fast_attempt(self, clock: VirtualClock) -> None:
        op = fail_times(1, then="ok", takes=1)
        assert await clock.run(retry(Schedule.fixed(1).attempts(3), op, attempt_timeout=2, label="op")) == "ok"
        assert clock.pending_timers == 0

    async def test_the_ambient_deadline_inside_an_attempt_is_the_attempts(self, clock: VirtualClock) -> None:
        seen: list[float | None] = []

        async def op() -> None:
            seen.append(stoic.time_remaining())
            raise ConnectionError

        with pytest.raises(ConnectionError):
            await clock.run(retry(Schedule.fixed(1).attempts(2), op, attempt_timeout=2.5, label="op"))
        assert seen == [2.5, 2.5]

    async def test_worst_case_sizes_an_outer_timeout_that_never_fires_first(self, clock: VirtualClock) -> None:
        start = Schedule.fixed(0.65).attempts(2)
        op = hang()

        async def call() -> None:
            async with stoic.timeout(start.worst_case(2.5) + 0.001):
                await retry(start, op, attempt_timeout=2.5, label="op")

        with pytest.raises(DeadlineExceeded):
            await clock.run(call())
        assert op.calls == 2
        assert clock.now() == pytest.approx(5.65)  # the second attempt's own timeout, before the outer one

    async def test_an_outer_timeout_of_exactly_worst_case_skips_the_last_attempt_of_timeouts(
        self, clock: VirtualClock, sink: RecordingSink,
    ) -> None:
        # docs/retry.md: no slack, so the last attempt would end exactly at the deadline (check 5).
        start = Schedule.fixed(0.65).attempts(2)
        op = hang()

        async def call() -> None:
            async with stoic.timeout(start.worst_case(2.5)):
                await retry(start, op, attempt_timeout=2.5, label="op")

        with pytest.raises(DeadlineExceeded):
            await clock.run(call())
        assert op.calls == 1
        assert clock.now() == pytest.approx(2.5)  # the outer timeout never fired
        assert [e.attributes["attempt"] for e in sink.of("retry.deadline_skip")] == [1]


class TestCancellation:
    async def test_cancelled_from_outside_during_an_attempt(self, clock: VirtualClock, sink: RecordingSink) -> None:
        # Field report 6: no second attempt, no backoff sleep, cancellation propagates at 1 s.
        op = fail_with(ConnectionError(), takes=3)
        task = asyncio.ensure_future(retry(Schedule.fixed(0.5).attempts(5), op, label="op"))
        await clock.advance(1)
        task.cancel()
        await settle()
        assert task.cancelled()
        assert op.calls == 1
        assert clock.pending_timers == 0
        assert clock.now() == 1.0
        assert sink.events == []

    async def test_cancelled_by_an_outer_deadline_during_an_attempt(self, clock: VirtualClock,
                                                                    sink: RecordingSink) -> None:
        op = fail_with(ConnectionError(), takes=3)

        async def call() -> None:
            async with stoic.timeout(1):
                await retry(Schedule.fixed(0.5).attempts(5), op, label="op")

        with pytest.raises(DeadlineExceeded):
            await clock.run(call())
        assert op.calls == 1
        assert clock.now() == 1.0
        assert [e.name for e in sink.events] == ["timeout.expired"]  # the deadline's decision, not retry's

    async def test_an_error_raised_while_the_task_is_being_cancelled_is_not_retried(
            self, clock: VirtualClock) -> None:
        calls = 0

        async def op() -> None:
            nonlocal calls
            calls += 1
            try:
                await clock.sleep_until(clock.now_ns() + 3_000_000_000)
            except asyncio.CancelledError:
                raise ConnectionError("converted") from None

        task = asyncio.ensure_future(retry(Schedule.fixed(0).attempts(5), op, label="op"))
        await clock.advance(1)
        task.cancel()
        await settle()
        assert task.done()
        with pytest.raises(ConnectionError):
            task.result()
        assert calls == 1

    async def test_cancelled_during_the_backoff_propagates(self, clock: VirtualClock, sink: RecordingSink) -> None:
        op = fail_with(ConnectionError())
        task = asyncio.ensure_future(retry(Schedule.fixed(10).attempts(5), op, label="op"))
        await clock.advance(5)
        assert op.calls == 1
        task.cancel()
        await settle()
        assert task.cancelled()
        assert clock.pending_timers == 0
        await clock.advance(100)
        assert op.calls == 1

    async def test_a_cancelled_error_from_the_operation_passes_straight_through(
            self, clock: VirtualClock, sink: RecordingSink) -> None:
        op = fail_times(3, asyncio.CancelledError, then=1)
        with pytest.raises(asyncio.CancelledError):
            await retry(THREE, op, label="op")
        assert op.calls == 1
        assert sink.events == []

    @pytest.mark.parametrize("error", [KeyboardInterrupt, SystemExit, GeneratorExit])
    def test_base_exceptions_pass_straight_through(self, error: type[BaseException],
                                                   jumping_clock: VirtualClock, sink: RecordingSink) -> None:
        op = fail_times(3, error, then=1)
        with pytest.raises(error):
            retry_sync(THREE, op.sync, label="op")
        assert op.calls == 1
        assert sink.events == []


class TestReportedDelay:
    async def test_next_delay_is_exactly_the_delay_slept(self, clock: VirtualClock, sink: RecordingSink) -> None:
        # Field report 9, with jitter, Retry-After and a cap in play, to the nanosecond.
        starts: list[int] = []
        errors = [ConnectionError(), After(2.123456789), ConnectionError(), ConnectionError()]

        async def op() -> str:
            starts.append(clock.now_ns())
            await clock.sleep_until(clock.now_ns() + 333_333_333)
            if len(starts) <= len(errors):
                raise errors[len(starts) - 1]
            return "ok"

        schedule = Schedule.exponential(0.7, factor=3).capped(2).jittered().attempts(6)
        assert await clock.run(retry(schedule, op, label="op")) == "ok"
        failed = sink.of("retry.attempt_failed")
        assert len(failed) == 4
        for event, next_start in zip(failed, starts[1:], strict=True):
            slept = next_start - event.time_ns
            assert round(float(event.attributes["next_delay"]) * 1e9) == slept
        assert failed[1].attributes["next_delay"] == 2.123456789


class TestAttempt:
    async def test_an_operation_declaring_attempt_receives_it(self, clock: VirtualClock) -> None:
        seen: list[Attempt] = []

        async def op(x: int, *, attempt: Attempt) -> int:
            seen.append(attempt)
            if attempt.number < 3:
                raise ConnectionError
            return x

        assert await clock.run(retry(THREE, op, 7, label="op")) == 7
        assert [a.number for a in seen] == [1, 2, 3]
        assert len({a.call_id for a in seen}) == 1
        assert seen[0].idempotency_key == seen[0].call_id and seen[0].is_first

    async def test_attempt_rule_for_methods_partials_and_positional_parameters(self, clock: VirtualClock) -> None:
        class Client:
            async def get(self, attempt: Attempt) -> int:
                return attempt.number

        async def plain(**kwargs: Any) -> dict[str, Any]:
            return kwargs

        async def partial_target(a: int, attempt: Attempt) -> int:
            return a * 10 + attempt.number

        assert await retry(THREE, Client().get, label="op") == 1
        assert await retry(THREE, plain, label="op") == {}
        assert await retry(THREE, functools.partial(partial_target, 4), label="op") == 41
        assert await retry(THREE, partial_target, 5, attempt=Attempt(9), label="op") == 59  # the caller's wins

    def test_attempts_are_values(self) -> None:
        a = Attempt(1)
        assert a.next().call_id == a.call_id and a.next().number == 2
        assert a == Attempt(1, a.call_id)
        with pytest.raises(AttributeError):
            a.number = 3  # type: ignore[misc]

    async def test_attempts_copy_and_pickle_as_values_keeping_the_call_id(self, clock: VirtualClock) -> None:
        # An operation handing its Attempt to a process pool (run_in_executor) pickles it; copy
        # and pickle set its slots through the refused __setattr__ (AttributeError), and a copy
        # made before the id was drawn must not draw another one.
        import copy
        import pickle

        seen: list[Attempt] = []

        async def op(*, attempt: Attempt) -> None:
            seen.append(attempt)
            if attempt.number < 2:
                raise ConnectionError

        await clock.run(retry(THREE, op, label="op"))
        later = Attempt(3, hedged=True)
        for attempt in (*seen, later, Attempt(1)):
            assert copy.copy(attempt) is attempt and copy.deepcopy(attempt) is attempt
            restored = pickle.loads(pickle.dumps(attempt))
            assert restored == attempt and type(restored) is Attempt
            assert (restored.number, restored.call_id, restored.hedged) == (attempt.number, attempt.call_id,
                                                                           attempt.hedged)
        assert len({a.call_id for a in seen}) == 1


class TestBudget:
    async def test_first_attempts_deposit_and_retries_spend(self, clock: VirtualClock) -> None:
        budget = RetryBudget(ratio=0.5, reserve_per_second=0, reserve_capacity=0)
        for _ in range(4):
            await retry(THREE, fail_times(0), budget=budget, label="op")
        assert budget.tokens == 2.0
        op = fail_times(10)
        with pytest.raises(ConnectionError):
            await clock.run(retry(THREE, op, budget=budget, label="op"))
        assert op.calls == 3
        assert budget.tokens == 0.5

    async def test_each_call_site_has_its_own_budget(self, clock: VirtualClock, sink: RecordingSink) -> None:
        # Drain the first site's reserve (10 tokens, no refill without time passing).
        async def drain() -> None:
            with pytest.raises(ConnectionError):
                await retry(Schedule.fixed(0).attempts(100), fail_with(ConnectionError()), label="op")

        await clock.run(drain())
        assert len(sink.of("retry.attempt_failed")) == 10  # reserve 10 + 0.2 earned
        sink.clear()
        op = fail_times(2, then=1)
        assert await clock.run(retry(Schedule.fixed(0).attempts(3), op, label="op")) == 1  # another site: fresh

    async def test_named_budgets_are_shared_across_call_sites(self, clock: VirtualClock) -> None:
        shared = RetryBudget.named("api.example.com", reserve_per_second=0, reserve_capacity=1)
        op1, op2 = fail_with(ConnectionError()), fail_with(ConnectionError())
        with pytest.raises(ConnectionError):
            await clock.run(retry(THREE, op1, budget=shared, label="op"))
        with pytest.raises(ConnectionError):
            await clock.run(retry(THREE, op2, budget=shared, label="op"))
        assert (op1.calls, op2.calls) == (2, 1)

    async def test_unlimited(self, clock: VirtualClock) -> None:
        op = fail_with(ConnectionError())
        with pytest.raises(ConnectionError):
            await clock.run(retry(Schedule.fixed(0).attempts(50), op, budget=RetryBudget.UNLIMITED, label="op"))
        assert op.calls == 50

    async def test_hundreds_of_concurrent_retries_stay_within_the_budget(self, clock: VirtualClock) -> None:
        budget = RetryBudget(ratio=0.2, reserve_per_second=1, reserve_capacity=10, clock=clock)
        ops = [fail_with(ConnectionError(), takes=0.01 * (i % 7)) for i in range(300)]

        async def one(op: Any) -> None:
            with pytest.raises(ConnectionError):
                await retry(Schedule.fixed(0.1).jittered().attempts(4), op, budget=budget, label="op")

        async def all_of() -> None:
            await asyncio.gather(*(one(op) for op in ops))

        await clock.run(all_of())
        retries = sum(op.calls for op in ops) - len(ops)
        elapsed = clock.now()
        assert retries <= 0.2 * len(ops) + 10 + 1 * elapsed + 1e-9
        assert retries >= 60  # the earned tokens really were spent


class TestDecoratorAndSync:
    async def test_decorator_on_a_coroutine_function(self, clock: VirtualClock, sink: RecordingSink) -> None:
        calls = 0

        @retrying(Schedule.fixed(1).attempts(3), label="op")
        async def fetch(x: int) -> int:
            nonlocal calls
            calls += 1
            if calls < 3:
                raise ConnectionError
            return x * 2

        assert fetch.__name__ == "fetch"
        assert await clock.run(fetch(21)) == 42
        assert calls == 3
        assert sink.events[0].label == "op"

    def test_decorator_on_a_plain_function(self, jumping_clock: VirtualClock, sink: RecordingSink) -> None:
        calls: list[float] = []

        @retrying(Schedule.exponential(2).attempts(4), label="sync")
        def read(attempt: Attempt) -> int:
            calls.append(jumping_clock.now())
            if attempt.number < 4:
                raise TimeoutError
            return attempt.number

        assert read() == 4
        assert calls == [0.0, 2.0, 6.0, 14.0]
        assert [e.label for e in sink.events] == ["sync"] * 4

    async def test_decorator_above_staticmethod_classmethod_and_on_async_callable_objects(
            self, jumping_clock: VirtualClock) -> None:
        # Written above @staticmethod/@classmethod, the decorator keeps the descriptor: the
        # static method was bound as an instance method (its caller passed as an argument) and
        # an async one's coroutine refused as a plain function's result; a class method was
        # refused. A callable object whose __call__ is a coroutine function was taken for a
        # plain function, and every call refused ("returned a coroutine").
        clock = jumping_clock
        calls: list[str] = []

        class Service:
            @retrying(THREE, label="static")
            @staticmethod
            async def fetch(x: int) -> int:
                calls.append("fetch")
                if len(calls) % 3:
                    raise ConnectionError
                return x

            @retrying(THREE, label="static")
            @staticmethod
            def read(x: int) -> int:
                calls.append("read")
                if len(calls) % 3:
                    raise ConnectionError
                return x

            @retrying(THREE, label="class")
            @classmethod
            async def make(cls, x: int) -> tuple[type, int]:
                calls.append("make")
                if len(calls) % 3:
                    raise ConnectionError
                return cls, x

        assert await clock.run(Service.fetch(1)) == 1
        assert await clock.run(Service().fetch(2)) == 2
        assert Service().read(3) == 3 and Service.read(4) == 4
        assert await clock.run(Service().make(5)) == (Service, 5)
        assert calls == ["fetch"] * 6 + ["read"] * 6 + ["make"] * 3

        class Send:
            def __init__(self) -> None:
                self.calls = 0

            async def __call__(self, x: int) -> int:
                self.calls += 1
                if self.calls < 3:
                    raise ConnectionError
                return x

        send = Send()
        assert await clock.run(retrying(THREE, label="object")(send)(6)) == 6
        assert send.calls == 3

    def test_retry_sync(self, jumping_clock: VirtualClock, sink: RecordingSink) -> None:
        op = fail_times(2, then="ok")
        assert retry_sync(THREE, op.sync, label="op") == "ok"
        assert op.started_at == [0.0, 1.0, 3.0]
        with pytest.raises(TypeError, match="coroutine"):
            retry_sync(THREE, op, label="op")
        with pytest.raises(TypeError, match="attempt_timeout"):
            retrying(THREE, attempt_timeout=1, label="op")(lambda: 1)

    def test_retry_sync_exhausts_and_classifies(self, jumping_clock: VirtualClock, sink: RecordingSink) -> None:
        op = fail_times(5)
        with pytest.raises(ConnectionError) as caught:
            retry_sync(THREE, op.sync, label="op")
        assert caught.value is op.raised[-1]
        stop = fail_with(Stop())
        with pytest.raises(Stop):
            retry_sync(THREE, stop.sync, label="op")
        assert stop.calls == 1
        assert sink.names[-2:] == ["retry.exhausted", "retry.permanent"]

    def test_retry_sync_nests(self, jumping_clock: VirtualClock) -> None:
        inner = fail_with(ConnectionError())

        def outer() -> None:
            retry_sync(THREE, inner.sync, label="op")

        with pytest.raises(ConnectionError):
            retry_sync(THREE, outer, label="op")
        assert inner.calls == 3


class TestEvents:
    async def test_a_raising_sink_never_breaks_a_retry(self, clock: VirtualClock) -> None:
        class Boom:
            level = stoic.Level.DEBUG

            def emit(self, event: stoic.Event) -> None:
                raise RuntimeError("sink down")

        with stoic.use_sinks(Boom()):
            op = fail_times(2, then="ok")
            assert await clock.run(retry(THREE, op, label="op")) == "ok"
            assert op.started_at == [0.0, 1.0, 3.0]

    async def test_no_event_is_built_when_no_sink_listens(self, clock: VirtualClock,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
        import stoic._retry as engine

        built: list[str] = []
        monkeypatch.setattr(engine, "emit", lambda name, *a: built.append(name))
        op = fail_times(2, then="ok")
        assert await clock.run(retry(THREE, op, label="op")) == "ok"
        assert built == []

