"""Issue 9 for retry and composition: field reports 16-21 (../shared/cases/field-reports.md),
the consistent API (label, clock=) and what a hostile caller found, in every form: retry,
retry_sync, @retrying, Retrying, Pipeline and with_fallback; async and sync."""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import warnings
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from _cancels import swallow_a_cancel

import stoic
from stoic import (
    Pipeline,
    RetryBudget,
    RetryClassifier,
    RetryDecision,
    Retrying,
    Schedule,
    retry,
    retry_sync,
    retrying,
    with_fallback,
)
from stoic.schedule import MAX_NS
from stoic.testing import RecordingSink, VirtualClock, fail_times, seeded

THREE = Schedule.fixed(1).attempts(3)
NOW = Schedule.fixed(0).attempts(3)


class Jumping(VirtualClock):
    """Blocking sleeps move time at once (single-threaded sync tests)."""

    def sleep_until_blocking(self, when_ns: int) -> None:
        self._set_now(when_ns)


# --- case 16: generators are not successes -------------------------------------------------------

def _gen() -> Iterator[int]:
    yield 1


async def _agen() -> AsyncIterator[int]:
    yield 1


@pytest.mark.parametrize("fn", [_gen, _agen], ids=["generator", "async generator"])
def test_retrying_refuses_a_generator_function_at_decoration(fn: Callable[..., Any]) -> None:
    with pytest.raises(TypeError, match="consumes"):
        retrying(THREE, label="gen")(fn)
    with pytest.raises(TypeError, match="consumes"):
        Retrying(THREE, label="gen")(fn)


def test_pipeline_refuses_an_async_generator_function_at_decoration() -> None:
    with pytest.raises(TypeError):
        Pipeline(Retrying(THREE, label="gen"))(_agen)  # type: ignore[arg-type]


@pytest.mark.parametrize("make", [_gen, _agen], ids=["generator", "async generator"])
def test_a_plain_operation_returning_a_generator_is_refused_and_never_retried(make: Callable[..., Any]) -> None:
    calls: list[int] = []

    def op() -> Any:
        calls.append(1)
        return make()

    policy = Retrying(NOW, label="gen")
    decorated = retrying(NOW, label="gen")(op)
    for run in (lambda: retry_sync(NOW, op, label="gen"), lambda: policy.call(op), decorated):
        calls.clear()
        with pytest.raises(TypeError, match="returned a generator"):
            run()
        assert calls == [1]


# --- case 17: a cancel request swallowed earlier in the task ----------------------------------------

def _coroutine_function(op: Callable[[], Any]) -> Callable[[], Any]:
    async def call() -> Any:
        return await op()

    return call


def _async_forms() -> dict[str, Callable[[Any], Any]]:
    policy = Retrying(THREE, label="forms")
    pipeline = Pipeline(Retrying(THREE, label="forms"))
    return {
        "retry": lambda op: retry(THREE, op, label="forms"),
        "Retrying.execute": lambda op: policy.execute(op),
        "@retrying": lambda op: retrying(THREE, label="forms")(_coroutine_function(op))(),
        "Pipeline": lambda op: pipeline.execute(op),
    }


@pytest.mark.parametrize("form", list(_async_forms()))
async def test_a_cancel_swallowed_earlier_in_the_task_does_not_stop_retrying(clock: VirtualClock, form: str) -> None:
    run = _async_forms()[form]
    op = fail_times(2, then="ok")

    async def scenario() -> str:
        await swallow_a_cancel()
        result: str = await run(op)
        return result

    assert await clock.run(scenario()) == "ok"
    assert op.calls == 3


@pytest.mark.parametrize("form", list(_async_forms()))
async def test_a_cancel_arriving_during_an_attempt_still_stops_retrying(clock: VirtualClock, form: str) -> None:
    run = _async_forms()[form]
    calls: list[int] = []

    async def op() -> None:
        calls.append(1)
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            raise ConnectionError("cancelled mid-call") from None  # turned into an ordinary error

    async def scenario() -> None:
        await swallow_a_cancel()  # a stale count first: only a new request may stop the retry
        await run(op)

    task = asyncio.ensure_future(scenario())
    for _ in range(5):
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(ConnectionError):
        await task
    assert calls == [1]


# --- case 19: Retry-After already in the past; raising callbacks -------------------------------------

class Unavailable(Exception):
    def __init__(self, after: float) -> None:
        super().__init__(f"503, retry after {after}")
        self.after = after

    @property
    def retry_decision(self) -> RetryDecision:
        return RetryDecision.retry_after(self.after)


@pytest.mark.parametrize("after", [-2.0, 0.0, -1e300])
async def test_an_elapsed_retry_after_means_retry_now_on_the_schedule(clock: VirtualClock, after: float) -> None:
    assert RetryDecision.retry_after(after) == RetryDecision.RETRY
    op = fail_times(2, lambda: Unavailable(after), then="ok")
    assert await clock.run(retry(THREE, op, label="503")) == "ok"
    assert op.started_at == [0.0, 1.0, 2.0]  # the schedule's delays, not an error


@pytest.mark.parametrize("after", [1e-12, 4e-10, 4.999e-10])
async def test_a_retry_after_below_a_nanosecond_means_retry_now_not_a_value_error(
        clock: VirtualClock, after: float) -> None:
    # A Retry-After computed as a float difference of two instants can be a hair above zero:
    # it rounds to no wait, "now" on the schedule as zero means, never to_ns's ValueError for a
    # zero duration raised inside retry_decision (which stopped the retry after one attempt).
    assert RetryDecision.retry_after(after) == RetryDecision.RETRY
    op = fail_times(2, lambda: Unavailable(after), then="ok")
    assert await clock.run(retry(THREE, op, label="503")) == "ok"
    assert op.started_at == [0.0, 1.0, 2.0]
    # A rejection's retry_after as small: the schedule's delays too, not a zero "retry_after" wait.
    assert RetryClassifier.standard(stoic.RateLimited(retry_after=after)) == RetryDecision.RETRY
    limited = fail_times(2, lambda: stoic.RateLimited(retry_after=after), then="ok")
    assert await clock.run(retry(THREE, limited, label="429")) == "ok"
    assert limited.started_at == [2.0, 3.0, 4.0]


def test_an_elapsed_retry_after_means_retry_now_in_the_sync_form() -> None:
    clock = Jumping()
    with stoic.use_clock(clock):
        op = fail_times(2, lambda: Unavailable(-2), then="ok")
        assert retry_sync(THREE, op.sync, label="503") == "ok"
        assert op.started_at == [0.0, 1.0, 2.0]


class Broken(Exception):
    """What a buggy user callback raises."""


def _raising_classifier(error: BaseException) -> bool:
    raise Broken("classifier bug")


class BadDecision(Exception):
    @property
    def retry_decision(self) -> RetryDecision:
        raise Broken("retry_decision bug")


def _assert_reported_once(caught: list[warnings.WarningMessage], records: list[logging.LogRecord]) -> None:
    ours = [w for w in caught if "Broken" in str(w.message)]
    assert len(ours) == 1 and issubclass(ours[0].category, RuntimeWarning)
    assert len([r for r in records if r.name == "stoic" and "Broken" in r.getMessage()]) == 1


async def test_a_raising_classifier_never_replaces_the_operations_error(
        clock: VirtualClock, sink: RecordingSink, caplog: pytest.LogCaptureFixture) -> None:
    classify = RetryClassifier(_raising_classifier)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):  # reported once however often it fails
            op = fail_times(5)
            with pytest.raises(ConnectionError) as raised:
                await clock.run(retry(THREE, op, classify=classify, label="bad"))
            assert raised.value is op.raised[0]
            assert isinstance(raised.value.__context__, Broken)
            assert op.calls == 1  # the conservative decision: stop retrying
    _assert_reported_once(caught, caplog.records)
    assert sink.names[-1] == "retry.permanent"


def test_a_raising_classifier_never_replaces_the_error_in_the_sync_forms(caplog: pytest.LogCaptureFixture) -> None:
    def classify(error: BaseException) -> bool:
        raise Broken("sync classifier bug")

    policy = Retrying(NOW, classify=classify, label="bad")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for run in (lambda op: retry_sync(NOW, op.sync, classify=classify, label="bad"),
                    lambda op: policy.call(op.sync),
                    lambda op: retrying(NOW, classify=classify, label="bad")(op.sync)()):
            op = fail_times(5)
            with pytest.raises(ConnectionError) as raised:
                run(op)
            assert raised.value is op.raised[0] and isinstance(raised.value.__context__, Broken)
            assert op.calls == 1
    _assert_reported_once(caught, caplog.records)


@pytest.mark.parametrize("classify", [RetryClassifier.standard, RetryClassifier.transient_only, BadDecision])
async def test_a_raising_retry_decision_never_replaces_the_operations_error(
        clock: VirtualClock, classify: Any) -> None:
    op = fail_times(5, BadDecision)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        with pytest.raises(BadDecision) as raised:
            await clock.run(retry(THREE, op, classify=classify, label="bad"))
    assert raised.value is op.raised[0] and isinstance(raised.value.__context__, Broken)
    assert op.calls == 1


async def test_a_raising_fallback_predicate_never_replaces_the_operations_error(
        clock: VirtualClock, caplog: pytest.LogCaptureFixture) -> None:
    def should_handle(error: Exception) -> bool:
        raise Broken("predicate bug")

    fallbacks: list[Exception] = []
    policy = Retrying(Schedule.fixed(0).attempts(1), label="svc")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            op = fail_times(5)
            with pytest.raises(ConnectionError) as raised:
                await with_fallback(policy, op, fallback=fallbacks.append, should_handle=should_handle,
                                    label="rates")
            assert raised.value is op.raised[0] and isinstance(raised.value.__context__, Broken)
    assert fallbacks == []  # the conservative decision: no substitute for an error we could not judge
    _assert_reported_once(caught, caplog.records)


# --- case 21: forked workers share one jitter stream -------------------------------------------------

class _Recorder:
    """A clock that never moves and records every blocking sleep's target (the delay)."""

    def __init__(self) -> None:
        self.delays: list[int] = []

    def now_ns(self) -> int:
        return 0

    def call_at(self, when_ns: int, callback: Callable[[], object]) -> Any:
        raise NotImplementedError

    async def sleep_until(self, when_ns: int) -> None:
        raise NotImplementedError

    def sleep_until_blocking(self, when_ns: int) -> None:
        self.delays.append(when_ns)


JITTERED = Schedule.exponential(1).jittered().attempts(6)


def _draw_delays() -> list[int]:
    """Five jittered delays from one retry call site (the same site in parent and children)."""
    recorder = _Recorder()
    try:
        retry_sync(JITTERED, fail_times(10).sync, budget=RetryBudget.UNLIMITED, clock=recorder, label="forked")
    except ConnectionError:
        pass
    return recorder.delays


def _in_children(count: int, work: Callable[[], object]) -> list[object]:
    results = []
    for _ in range(count):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report and leave at once, running nothing of the parent's
            try:
                os.write(write, pickle.dumps(work()))
            finally:
                os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as pipe:
            results.append(pickle.loads(pipe.read()))
        os.waitpid(pid, 0)
    return results


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_workers_draw_different_retry_delays() -> None:
    parent = _draw_delays()  # the master used the call site before forking
    assert len(parent) == 5
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork() in a process with threads (3.12+)
        children = _in_children(4, _draw_delays)
    assert len({tuple(c) for c in children}) == 4  # type: ignore[arg-type]
    assert all(tuple(c) != tuple(parent) for c in children)  # type: ignore[arg-type]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_seeded_still_reproduces_a_run_after_a_fork() -> None:
    def seeded_draw() -> list[int]:
        with seeded(7):
            return _draw_delays()

    here = seeded_draw()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        children = _in_children(2, seeded_draw)
    assert children == [here, here]


# --- label: keyword-only and required --------------------------------------------------------------

def _label_forms() -> dict[str, Callable[..., Any]]:
    async def op() -> int:
        return 1

    return {
        "retry": lambda **kw: retry(NOW, op, **kw),
        "retry_sync": lambda **kw: retry_sync(NOW, lambda: 1, **kw),
        "@retrying": lambda **kw: retrying(NOW, **kw),
        "Retrying": lambda **kw: Retrying(NOW, **kw),
    }


@pytest.mark.parametrize("form", list(_label_forms()))
def test_label_is_required_keyword_only_and_checked(form: str) -> None:
    make = _label_forms()[form]
    with pytest.raises(TypeError, match="label"):
        make()
    with pytest.raises(TypeError, match="label"):
        make(label=b"x")
    with pytest.raises(TypeError, match="label"):
        make(label=None)
    with pytest.raises(ValueError, match="label"):
        make(label="")
    result = make(label="ok")
    if asyncio.iscoroutine(result):
        result.close()


async def test_with_fallback_label_is_required_and_checked() -> None:
    policy = Retrying(NOW, label="svc")

    async def op() -> int:
        return 1

    with pytest.raises(TypeError, match="label"):
        await with_fallback(policy, op, fallback=lambda e: 0)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="label"):
        await with_fallback(policy, op, fallback=lambda e: 0, label=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="label"):
        await with_fallback(policy, op, fallback=lambda e: 0, label="")
    assert await with_fallback(policy, op, fallback=lambda e: 0, label="rates") == 1


def test_label_is_keyword_only() -> None:
    with pytest.raises(TypeError):
        Retrying(NOW, "svc")  # type: ignore[misc]
    with pytest.raises(TypeError):
        retrying(NOW, "svc")  # type: ignore[misc]


# --- clock= ----------------------------------------------------------------------------------

class NotAClock:
    def now_ns(self) -> int:
        return 0


@pytest.mark.parametrize("bad", [NotAClock(), object(), 5])
def test_clock_is_validated_naming_clock(bad: object) -> None:
    async def op() -> int:
        return 1

    with pytest.raises(TypeError, match="clock"):
        retry(NOW, op, clock=bad, label="c")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="clock"):
        retry_sync(NOW, lambda: 1, clock=bad, label="c")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="clock"):
        retrying(NOW, clock=bad, label="c")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="clock"):
        Retrying(NOW, clock=bad, label="c")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="clock"):
        RetryBudget(clock=bad)  # type: ignore[arg-type]


async def test_retry_sleeps_on_the_clock_it_is_given_not_the_ambient_one() -> None:
    virtual = VirtualClock()
    starts: list[float] = []

    async def op() -> str:
        starts.append(virtual.now())
        if len(starts) < 3:
            raise ConnectionError
        return "ok"

    # No use_clock: the ambient clock is the system clock, the retry's is virtual.
    assert await virtual.run(retry(THREE, op, clock=virtual, label="c")) == "ok"
    assert starts == [0.0, 1.0, 2.0]
    starts.clear()
    assert await virtual.run(retrying(THREE, clock=virtual, label="c")(op)()) == "ok"
    assert starts == [2.0, 3.0, 4.0]


def test_retry_sync_sleeps_on_the_clock_it_is_given() -> None:
    jumping = Jumping()
    starts: list[float] = []

    def op() -> str:
        starts.append(jumping.now())
        if len(starts) < 3:
            raise ConnectionError
        return "ok"

    assert retry_sync(THREE, op, clock=jumping, label="c") == "ok"
    assert starts == [0.0, 1.0, 2.0]


async def test_a_deadline_on_another_clock_than_the_retrys_is_refused() -> None:
    virtual = VirtualClock()
    op = fail_times(10)
    async with stoic.timeout(5):  # the system clock
        with pytest.raises(ValueError, match="one clock"):
            await retry(THREE, op, clock=virtual, label="mixed")
        with pytest.raises(ValueError, match="one clock"):
            await Retrying(THREE, clock=virtual, label="mixed").execute(op)
        with pytest.raises(ValueError, match="one clock"):
            retry_sync(THREE, op.sync, clock=virtual, label="mixed")
    assert op.calls == 0  # refused before the first attempt


async def test_a_deadline_on_the_retrys_clock_bounds_it_on_that_clock(clock: VirtualClock,
                                                                         sink: RecordingSink) -> None:
    op = fail_times(10)

    async def scenario() -> None:
        async with stoic.timeout(5):
            await retry(Schedule.fixed(3).attempts(5), op, label="bounded")

    with pytest.raises(ConnectionError):
        await clock.run(scenario())
    assert op.started_at == [0.0, 3.0]  # never an attempt at 6 s, past the 5 s deadline
    assert sink.names[-1] == "retry.deadline_skip"


# --- what a hostile caller found ---------------------------------------------------------------

@pytest.mark.parametrize("value", [True, "1", None, b"1"])
def test_reserve_per_second_of_the_wrong_type_is_a_type_error_naming_it(value: object) -> None:
    with pytest.raises(TypeError, match="reserve_per_second"):
        RetryBudget(reserve_per_second=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [-1, float("nan"), float("inf"), -1e-300])
def test_reserve_per_second_out_of_range_is_a_value_error_naming_it(value: float) -> None:
    with pytest.raises(ValueError, match="reserve_per_second"):
        RetryBudget(reserve_per_second=value)


@pytest.mark.parametrize("value", [b"1", "1", bytearray(b"12"), 5])
def test_schedule_delays_refuses_bytes_strings_and_non_iterables(value: object) -> None:
    with pytest.raises(TypeError, match="delays"):
        Schedule.delays(value)  # type: ignore[arg-type]


@pytest.mark.parametrize(("build", "name"), [
    (lambda: Schedule.fixed(10**300), "delay"),
    (lambda: Schedule.delays([10**300]), r"delays\[0\]"),
    (lambda: Schedule.linear(10**300), "step"),
    (lambda: Schedule.fixed(1).up_to(10**300), "elapsed"),
])
def test_a_configured_duration_beyond_the_one_range_is_refused_by_name(build: Any, name: str) -> None:
    with pytest.raises(ValueError, match=f"{name} must be at most"):
        build()


def test_computed_delays_saturate_at_max_ns() -> None:
    # Inputs have one range (stoic._durations.MAX_SECONDS); what a schedule computes from them
    # (growth, sums) saturates instead of overflowing, and a server's Retry-After too.
    assert Schedule.fixed(10**12).attempts(10**9).maximum_total_delay == MAX_NS / 1e9
    assert RetryDecision.retry_after(1e300).after == MAX_NS / 1e9


def test_a_retry_after_timedelta_past_the_range_saturates_as_a_number_does() -> None:
    # A server's Retry-After as a timedelta (a far HTTP-date less now) is the same wait as its
    # seconds: it saturates, never refused with a ValueError in the classifier.
    from datetime import timedelta

    assert RetryDecision.retry_after(timedelta(days=10**8)) == RetryDecision.retry_after(10**13)
    assert RetryDecision.retry_after(timedelta(days=10**8)).after == MAX_NS / 1e9
    assert RetryDecision.retry_after(timedelta(seconds=1, microseconds=5)).after == 1.000005


async def test_a_huge_attempt_timeout_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="attempt_timeout must be at most"):
        await retry(THREE, fail_times(1, then="ok"), attempt_timeout=10**300, label="huge")


def test_schedule_delays_of_an_iterator_still_works() -> None:
    assert Schedule.delays(iter([1, 2])).maximal_delays() == [1.0, 2.0]


def test_a_swallowed_cancel_is_judged_per_task_with_loops_running_in_several_threads() -> None:
    # Loops in several threads running tasks at once: the entry count must still be the
    # caller's own task's (the shortcut that reads the one running task applies only when there
    # is exactly one; otherwise asyncio is asked).
    import threading

    results: list[int] = []
    barrier = threading.Barrier(4)

    async def scenario() -> None:
        await swallow_a_cancel()
        for _ in range(20):
            calls: list[int] = []

            async def op(calls: list[int] = calls) -> str:
                calls.append(1)
                await asyncio.sleep(0)  # let the other loops' tasks run in between
                if len(calls) < 3:
                    raise ConnectionError
                return "ok"

            assert await retry(NOW, op, budget=RetryBudget.UNLIMITED, label="threads") == "ok"
            results.append(len(calls))

    def worker() -> None:
        barrier.wait()
        asyncio.run(scenario())

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert results == [3] * 80


def test_a_reported_callback_is_not_kept_alive_by_the_report() -> None:
    import gc
    import weakref

    from stoic._callbacks import callback_failed

    def classify(error: BaseException) -> bool:
        raise Broken("per-request classifier")

    alive = weakref.ref(classify)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        callback_failed(classify, "classify", Broken("no traceback"), ConnectionError())
        callback_failed(classify, "classify", Broken("again"), ConnectionError())
    assert len(caught) == 1
    del classify
    gc.collect()
    assert alive() is None


async def test_recur_runs_on_the_clock_it_is_given_and_validates_it() -> None:
    virtual = VirtualClock()
    seen: list[float] = []

    async def poll() -> int:
        seen.append(virtual.now())
        return len(seen)

    assert await virtual.run(stoic.recur(Schedule.fixed(2).attempts(3), poll, clock=virtual)) == 3
    assert seen == [0.0, 2.0, 4.0]
    with pytest.raises(TypeError, match="clock"):
        stoic.recur(Schedule.fixed(2).attempts(3), poll, clock=NotAClock())  # type: ignore[arg-type]
