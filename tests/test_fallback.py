"""with_fallback: the substitute when every policy failed; outermost only (seed 002)."""

from __future__ import annotations

import asyncio
import gc
import warnings
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from _cancels import swallow_a_cancel

import stoic
from stoic import (
    AdaptiveThrottle,
    Bulkhead,
    CircuitBreaker,
    Defect,
    Pipeline,
    RateLimiter,
    Retrying,
    Schedule,
    is_defect,
    with_fallback,
)
from stoic.testing import RecordingSink, VirtualClock, fail_times, fail_with, hang, settle


class Direct:
    async def execute(self, fn: Callable[..., Awaitable[Any]], /, *args: Any, **kwargs: Any) -> Any:
        return await fn(*args, **kwargs)


async def test_success_returns_the_result_and_never_calls_the_fallback() -> None:
    called: list[Exception] = []

    async def op(x: int) -> int:
        return x

    assert await with_fallback(Direct(), op, 5, fallback=lambda e: called.append(e) or -1, label="fallback") == 5
    assert called == []


async def test_a_failure_returns_the_fallback_sync_or_async() -> None:
    op = fail_with(ConnectionError("down"))
    seen: list[Exception] = []

    def cached(error: Exception) -> str:
        seen.append(error)
        return "cached"

    async def cached_async(error: Exception) -> str:
        return "cached-async"

    assert await with_fallback(Direct(), op, fallback=cached, label="fallback") == "cached"
    assert seen == [op.raised[0]]
    assert await with_fallback(Direct(), op, fallback=cached_async, label="fallback") == "cached-async"


async def test_after_the_retries_are_spent(clock: VirtualClock) -> None:
    op = fail_with(ConnectionError())
    pipeline = Pipeline(Retrying(Schedule.fixed(1).attempts(3), label="op"))
    assert await clock.run(with_fallback(pipeline, op, fallback=lambda e: [], label="fallback")) == []
    assert op.calls == 3  # outermost: the retry saw every failure


async def test_should_handle_decides() -> None:
    op = fail_with(ValueError("bad input"))
    with pytest.raises(ValueError):
        await with_fallback(Direct(), op, fallback=lambda e: 0, should_handle=lambda e: not isinstance(e, ValueError),
                label="fallback")
    assert await with_fallback(Direct(), fail_with(KeyError()), fallback=lambda e: 0,
                               should_handle=lambda e: isinstance(e, KeyError), label="fallback") == 0


async def test_a_defect_is_not_handled_by_default_but_can_be() -> None:
    op = fail_with(Defect("bug"))
    with pytest.raises(Defect):
        await with_fallback(Direct(), op, fallback=lambda e: 0, label="fallback")
    assert await with_fallback(Direct(), op, fallback=lambda e: 0, should_handle=lambda e: True, label="fallback") == 0


async def test_cancellation_is_never_handled(clock: VirtualClock) -> None:
    called: list[Exception] = []
    task = asyncio.ensure_future(with_fallback(Direct(), hang(), fallback=lambda e: called.append(e), label="fallback"))
    await settle()
    task.cancel()
    await settle()
    assert task.cancelled()
    assert called == []


async def test_base_exceptions_pass_through() -> None:
    op = fail_with(asyncio.CancelledError())
    with pytest.raises(asyncio.CancelledError):
        await with_fallback(Direct(), op, fallback=lambda e: 0, label="fallback")


async def test_an_error_in_the_fallback_propagates_chained_to_the_original() -> None:
    op = fail_with(ConnectionError())

    def broken(error: Exception) -> int:
        raise RuntimeError("cache empty")

    with pytest.raises(RuntimeError) as caught:
        await with_fallback(Direct(), op, fallback=broken, label="fallback")
    assert isinstance(caught.value.__context__, ConnectionError)


@pytest.mark.parametrize("form", ["sync", "async"])
async def test_a_fallback_that_raises_substituted_nothing_and_says_so(form: str, clock: VirtualClock) -> None:
    # fallback.substituted says with_fallback returned the fallback's value: it was emitted
    # before the fallback ran, so a fallback that raised was reported as a substitution too.
    op = fail_with(ConnectionError())

    def broken(error: Exception) -> int:
        raise RuntimeError("cache empty")

    async def broken_async(error: Exception) -> int:
        await clock.sleep(0.5)
        raise RuntimeError("cache empty")

    async def slow_cache(error: Exception) -> int:
        await clock.sleep(0.5)
        return 7

    sink = RecordingSink()
    with stoic.use_sinks(sink):
        with pytest.raises(RuntimeError):
            await clock.run(with_fallback(Direct(), op, fallback=broken if form == "sync" else broken_async,
                                          label="fb"))
        assert sink.of("fallback.substituted") == []
        assert await clock.run(with_fallback(Direct(), op, fallback=(lambda e: 7) if form == "sync" else slow_cache,
                                             label="fb")) == 7
    (event,) = sink.of("fallback.substituted")
    assert event.attributes == {"error.type": "ConnectionError"} and event.time_ns == clock.now_ns()


async def test_arguments_are_forwarded() -> None:
    async def op(a: int, *, b: int) -> int:
        return a - b

    assert await with_fallback(Direct(), op, 10, b=3, fallback=lambda e: 0, label="fallback") == 7
    op2 = fail_times(0, then="x")
    assert await with_fallback(Direct(), op2, fallback=lambda e: "y", label="fallback") == "x"


# --- a misused operation is the caller's bug: surfaced, never substituted ----------------------

async def _agen() -> Any:
    yield 1


def _gen() -> Any:
    yield 1


def _returns_gen() -> Any:
    return _gen()


def _returns_agen() -> Any:
    return _agen()


def _returns_value() -> Any:
    return 42


def _policies(clock: VirtualClock) -> dict[str, Any]:
    return {
        "direct": Direct(),
        "breaker": CircuitBreaker(label="b", clock=clock),
        "limiter": RateLimiter(10, label="r", clock=clock),
        "bulkhead": Bulkhead(2, label="k", clock=clock),
        "throttle": AdaptiveThrottle(label="t", clock=clock),
        "retrying": Retrying(Schedule.fixed(1).attempts(3), label="op"),
        "pipeline": Pipeline(Retrying(Schedule.fixed(1).attempts(3), label="op2"),
                             CircuitBreaker(label="b2", clock=clock), Bulkhead(2, label="k2", clock=clock)),
    }


_MISUSED = [_agen, _gen, _returns_gen, _returns_agen, _returns_value]


@pytest.mark.parametrize("policy", ["direct", "breaker", "limiter", "bulkhead", "throttle", "retrying", "pipeline"])
@pytest.mark.parametrize("fn", _MISUSED, ids=lambda fn: fn.__name__)
@pytest.mark.parametrize("handle_all", [False, True], ids=["default", "should_handle-all"])
async def test_a_misused_operation_raises_its_type_error_and_never_falls_back(
    policy: str, fn: Callable[..., Any], handle_all: bool, clock: VirtualClock, sink: RecordingSink,
) -> None:
    # Seen failing before the fix: every case returned "cached" (the fallback hid the bug).
    chosen = _policies(clock)[policy]
    called: list[Exception] = []
    judged: list[Exception] = []

    def everything(error: Exception) -> bool:
        judged.append(error)
        return True

    with pytest.raises(TypeError):
        await clock.run(with_fallback(chosen, fn, fallback=lambda e: called.append(e) or "cached",
                                      should_handle=everything if handle_all else None, label="fallback"))
    assert called == [] and judged == []  # should_handle is not consulted for a misuse
    assert sink.of("fallback.substituted") == []
    if policy == "breaker":
        assert chosen.snapshot.calls == 0  # never counted by the breaker either


@pytest.mark.parametrize("stages", ["breaker-direct", "retrying-direct", "direct-bulkhead-direct"])
@pytest.mark.parametrize("fn", _MISUSED, ids=lambda fn: fn.__name__)
async def test_a_misused_operation_awaited_by_a_stage_of_the_callers_inside_a_pipeline_never_falls_back(
    stages: str, fn: Callable[..., Any], clock: VirtualClock,
) -> None:
    # A stage of the caller's own (Direct) awaiting the plain function's value raised the
    # TypeError; alone as the policy it was recognised, but behind a stoic stage in a Pipeline
    # its frame was no longer the one after with_fallback's, and the fallback hid the bug.
    made = {"breaker": CircuitBreaker(label="b", clock=clock), "bulkhead": Bulkhead(2, label="k", clock=clock),
            "retrying": Retrying(Schedule.fixed(1).attempts(3), label="op", clock=clock)}
    pipeline = Pipeline(*(made.get(name) or Direct() for name in stages.split("-")))
    called: list[Exception] = []
    with pytest.raises(TypeError):
        await clock.run(with_fallback(pipeline, fn, fallback=lambda e: called.append(e) or "cached", label="fallback"))
    assert called == []

    async def own_type_error() -> None:
        raise TypeError("the operation's own")  # (still the work failing: substituted)

    assert await clock.run(with_fallback(Pipeline(Bulkhead(1, label="k1", clock=clock), Direct()), own_type_error,
                                         fallback=lambda e: "cached", label="fallback")) == "cached"


async def test_a_coroutine_object_instead_of_the_function_is_refused_before_the_policy_runs() -> None:
    ran: list[int] = []

    class Watching:
        async def execute(self, fn: Callable[..., Awaitable[Any]], /, *args: Any, **kwargs: Any) -> Any:
            ran.append(1)
            return await fn(*args, **kwargs)

    async def op() -> int:
        return 1

    pending = op()
    with pytest.raises(TypeError, match="not the result of calling it") as caught:
        await with_fallback(Watching(), pending, fallback=lambda e: 0, label="fallback")  # type: ignore[arg-type]
    assert isinstance(caught.value.__cause__, Defect)
    assert ran == []
    assert pending.cr_frame is None  # closed: no "never awaited" warning


async def test_a_generator_function_is_refused_before_the_policy_runs() -> None:
    with pytest.raises(TypeError, match="async generator function") as caught:
        await with_fallback(Pipeline(), _agen, fallback=lambda e: 0, label="fallback")
    assert is_defect(caught.value)


async def test_the_operations_own_type_error_still_falls_back() -> None:
    async def op() -> int:
        raise TypeError("a bad payload from the dependency")

    assert await with_fallback(Direct(), op, fallback=lambda e: "cached", label="fallback") == "cached"


def _sync_helper() -> int:
    return 5


async def _awaits_a_plain_value() -> int:
    return await _sync_helper()  # type: ignore[misc]  # (the operation's own bug: its work failing)


@pytest.mark.parametrize("policy", ["direct", "breaker", "limiter", "bulkhead", "throttle", "retrying", "pipeline",
                                    "empty-pipeline", "limiter-pipeline"])
async def test_a_type_error_at_the_operations_own_await_falls_back_under_every_policy(
    policy: str, clock: VirtualClock,
) -> None:
    # The TypeError of an await in the operation's own body is the work failing, as one it
    # raises itself. A limiter granting at once hands back the operation's coroutine itself
    # (no frame of its own), and so does an empty pipeline: the operation's frame stood where a
    # policy's execute frame stands, and its failure was taken for a misused policy, not
    # substituted (while the same operation under a bulkhead, or a queued limiter, fell back).
    chosen = {**_policies(clock), "empty-pipeline": Pipeline(),
              "limiter-pipeline": Pipeline(RateLimiter(10, label="r2", clock=clock))}[policy]
    assert await clock.run(with_fallback(chosen, _awaits_a_plain_value, fallback=lambda e: "cached",
                                         label="fallback")) == "cached"


async def test_a_misuse_inside_an_exception_group_is_not_substituted() -> None:
    async def fan_out() -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(Bulkhead(1, label="k").execute(_returns_gen))
            group.create_task(fail_with(ConnectionError())())

    with pytest.raises(ExceptionGroup):
        await with_fallback(Direct(), fan_out, fallback=lambda e: "cached", label="fallback")


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("str() of this exception raises")


class _UnhashablePredicate:
    def __hash__(self) -> int:
        raise RuntimeError("hash() of this predicate raises")

    def __call__(self, error: Exception) -> bool:
        raise ValueError("predicate bug")


class _PredicateRaisingUnprintable:
    def __call__(self, error: Exception) -> bool:
        raise _Unprintable()


@pytest.mark.parametrize("predicate", [_UnhashablePredicate(), _PredicateRaisingUnprintable()],
                         ids=["unhashable-callback", "unprintable-failure"])
async def test_a_should_handle_failure_that_cannot_be_reported_still_never_replaces_the_error(
    predicate: Callable[[Exception], bool],
) -> None:
    # Reporting a failing callback (remembering it, formatting its error) is stoic's work: when
    # that fails too, the operation's own error still propagates, the predicate's chained.
    op = fail_with(ConnectionError("down"))
    with warnings.catch_warnings(record=True) as caught_warnings, pytest.raises(ConnectionError) as caught:
        warnings.simplefilter("always")
        await with_fallback(Direct(), op, fallback=lambda e: "fallback", should_handle=predicate, label="fallback")
    assert caught.value is op.raised[0]
    assert isinstance(caught.value.__context__, (ValueError, _Unprintable))
    if isinstance(predicate, _PredicateRaisingUnprintable):  # (still reported, without the message)
        assert [w.category for w in caught_warnings] == [RuntimeWarning]


@pytest.mark.parametrize("form", ["coroutine-function", "lambda-returning-a-coroutine"])
async def test_an_async_should_handle_is_a_failed_callback_never_a_fallback(form: str) -> None:
    # bool() of the coroutine it returns is True: a predicate saying False fell back on every
    # error (and its coroutine was never awaited). Like a should_handle that raises, it is a
    # configuration error: the operation's error stands, the callback's TypeError chained and
    # reported once, and the coroutine closed (no "never awaited" warning).
    async def never(error: Exception) -> bool:
        return False

    predicate: Any = never if form == "coroutine-function" else (lambda e: never(e))
    op = fail_with(ConnectionError("down"))
    called: list[Exception] = []
    with warnings.catch_warnings(record=True) as caught_warnings:
        warnings.simplefilter("always")
        with pytest.raises(ConnectionError) as caught:
            await with_fallback(Direct(), op, fallback=lambda e: called.append(e) or 0, should_handle=predicate,
                                label="fallback")
        gc.collect()
    assert caught.value is op.raised[0] and called == []
    assert isinstance(caught.value.__context__, TypeError) and "should_handle" in str(caught.value.__context__)
    assert [w.category for w in caught_warnings] == [RuntimeWarning]  # reported; no "never awaited"
    assert "coroutine" in str(caught_warnings[0].message)


async def test_a_hedge_in_a_policys_place_is_refused_not_substituted_on_every_call() -> None:
    # A Hedge has an execute, but it takes IDEMPOTENT first: as with_fallback's policy every
    # call raised TypeError and the default should_handle returned the fallback, hiding the bug.
    hedged = stoic.Hedge(0.1, label="h")
    called: list[Exception] = []

    async def op() -> str:
        return "real"

    with pytest.raises(TypeError, match="not a Policy") as caught:
        await with_fallback(hedged, op, fallback=lambda e: called.append(e) or "fallback",  # type: ignore[arg-type]
                            label="fallback")
    assert is_defect(caught.value) and called == []
    # The way it is meant: the hedge runs as the operation of a stageless pipeline.
    assert await with_fallback(Pipeline(), lambda: hedged.execute(stoic.IDEMPOTENT, op), fallback=lambda e: "fallback",
                               label="fallback") == "real"


@pytest.mark.parametrize("policy", [CircuitBreaker, Retrying, Bulkhead, stoic.Keyed(Bulkhead, label="fam",
                                                                                    max_concurrent=1)],
                         ids=["breaker-class", "retrying-class", "bulkhead-class", "keyed-family"])
async def test_a_policy_class_or_a_keyed_family_in_a_policys_place_is_refused_not_substituted(policy: Any) -> None:
    # With an argument for the operation, every call failed inside execute (a class's execute
    # unbound, the operation taken for self: AttributeError; a family's execute taking the
    # operation for its key: TypeError) and the default should_handle returned the fallback.
    called: list[Exception] = []

    async def op(x: int) -> int:
        return x

    with pytest.raises(TypeError, match="not a Policy") as caught:
        await with_fallback(policy, op, 1, fallback=lambda e: called.append(e) or 0, label="fallback")
    assert is_defect(caught.value) and called == []


async def test_a_policy_whose_execute_does_not_take_the_call_is_a_bug_not_a_fallback() -> None:
    # An execute that cannot be called as execute(fn, *args, **kwargs): the TypeError is raised
    # by with_fallback's own call of it, on every call; the fallback would hide it for good.
    class TakesNoArguments:
        async def execute(self, fn: Callable[[], Awaitable[Any]]) -> Any:
            return await fn()

    async def op(x: int) -> int:
        return x

    called: list[Exception] = []
    with pytest.raises(TypeError, match="positional argument"):
        await with_fallback(TakesNoArguments(), op, 1, fallback=lambda e: called.append(e) or 0,  # type: ignore[arg-type]
                            label="fallback")
    assert called == []

    async def op_raising_type_error(x: int) -> int:
        raise TypeError("the operation's own")  # one frame deeper: the work failed, substituted

    assert await with_fallback(TakesNoArguments(), lambda: op_raising_type_error(1),  # type: ignore[arg-type]
                               fallback=lambda e: -1, label="fallback") == -1


async def test_the_substitution_event_is_timed_on_the_ambient_clock(clock: VirtualClock) -> None:
    # Every event's time_ns is on the clock the policies measure on; the fallback's was
    # time.monotonic_ns() under a VirtualClock, out of order with every other event.
    sink = RecordingSink()
    await clock.advance(5)
    with stoic.use_sinks(sink):
        assert await with_fallback(Direct(), fail_with(ConnectionError()), fallback=lambda e: 0, label="fb") == 0
    (event,) = sink.of("fallback.substituted")
    assert event.time_ns == clock.now_ns() == 5_000_000_000


@pytest.mark.parametrize("group", [False, True], ids=["error", "exception-group"])
async def test_an_error_made_of_the_callers_cancellation_is_not_substituted(group: bool) -> None:
    # A client that turns the CancelledError into an error of its own must not get the caller a
    # substitute after it asked to stop (the breaker never counts such an error, hedge re-raises it).
    started = asyncio.Event()

    async def client() -> str:
        try:
            started.set()
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            if not group:
                raise ConnectionError("connection torn down") from None  # (its __context__ is the cancel)
            try:  # (a TaskGroup's children each fail on their way out of the cancellation)
                raise ConnectionError("connection torn down")
            except ConnectionError as leaf:
                raise ExceptionGroup("fan-out", [leaf]) from None
        return "never"

    substituted: list[Exception] = []

    async def call() -> str:
        return await stoic.with_fallback(stoic.Pipeline(), client, label="fb",
                                         fallback=lambda e: substituted.append(e) or "cached")

    task = asyncio.ensure_future(call())
    await started.wait()
    task.cancel()
    with pytest.raises((ConnectionError, ExceptionGroup)):
        await task
    assert substituted == []


async def test_a_failure_after_a_cancel_swallowed_earlier_is_still_substituted() -> None:
    # (Field report 17's shape: the task's cancel count stays raised, but nothing cancels this call.)
    async def fails() -> str:
        raise ConnectionError("down")

    async def main() -> str:
        await swallow_a_cancel()
        return await stoic.with_fallback(stoic.Pipeline(), fails, label="fb", fallback=lambda e: "cached")

    assert await asyncio.ensure_future(main()) == "cached"
