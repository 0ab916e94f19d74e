"""Every retry form (retry, retry_sync, @retrying, Retrying) behaves as the functions and
coroutines it stands for: signatures, binding, tracebacks, budgets, leaks, the coroutine protocol.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import inspect
import sys
import traceback
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import stoic
from stoic import RetryBudget, Retrying, Schedule, retry, retry_sync, retrying, use_clock
from stoic._retry import in_retry_attempt, wants_attempt
from stoic.testing import RecordingSink, VirtualClock, fail_times, fail_with, reset_budgets

# The three-argument throw() is called on purpose (the protocol allows it; CPython 3.12 deprecates
# it): its warning is expected here, and hiding it keeps any other warning visible.
pytestmark = pytest.mark.filterwarnings(
    r"ignore:the \(type, exc, tb\) signature of throw\(\) is deprecated:DeprecationWarning")

DRAIN = Schedule.fixed(0).attempts(100)
THREE = Schedule.fixed(0).attempts(3)

# One call site per form (retry_sync's budget is its call site's).
Form = Callable[..., Any]


def _via_retry_sync(schedule: Any) -> Form:
    def run(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return retry_sync(schedule, fn, *args, **kwargs, label="op")

    return run


def _via_call(schedule: Any, **options: Any) -> Form:
    return Retrying(schedule, **options, label="op").call


def _via_decorator(schedule: Any, **options: Any) -> Form:
    cache: dict[Any, Any] = {}

    def run(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        wrapper = cache.get(fn)
        if wrapper is None:
            wrapper = cache[fn] = retrying(schedule, **options, label="op")(fn)
        return wrapper(*args, **kwargs)

    return run


FORMS: dict[str, Callable[[Any], Form]] = {
    "retry_sync": _via_retry_sync,
    "Retrying.call": _via_call,
    "@retrying": _via_decorator,
}


@pytest.fixture(params=list(FORMS))
def form(request: pytest.FixtureRequest) -> Callable[[Any], Form]:
    return FORMS[request.param]


class Stop(BaseException):
    """A BaseException of our own: never counted, retried or swallowed."""


# --- the forms look like the functions they are ------------------------------------------------

def test_public_functions_keep_their_signatures_and_docstrings() -> None:
    params = list(inspect.signature(retry_sync).parameters)
    assert params == ["schedule", "fn", "args", "label", "budget", "classify", "nesting", "clock", "kwargs"]
    assert retry_sync.__doc__ is not None and "plain (blocking) function" in retry_sync.__doc__
    assert retry_sync.__name__ == "retry_sync" and retry_sync.__module__ == "stoic._retry"
    assert list(inspect.signature(Retrying.call).parameters) == ["self", "fn", "args", "kwargs"]
    assert list(inspect.signature(Retrying(THREE, label="op").call).parameters) == ["fn", "args", "kwargs"]
    assert Retrying.call.__doc__ is not None and "Run plain" in Retrying.call.__doc__
    assert Retrying.call.__qualname__ == "Retrying.call"


def test_a_decorated_function_keeps_its_name_doc_attributes_and_signature() -> None:
    def fetch(url: str, *, timeout: float = 1.0) -> str:
        """Fetch a URL."""
        return f"{url} {timeout}"

    fetch.marker = "kept"  # type: ignore[attr-defined]
    wrapper = retrying(THREE, label="op")(fetch)
    assert wrapper.__name__ == "fetch"
    assert wrapper.__qualname__ == fetch.__qualname__
    assert wrapper.__doc__ == "Fetch a URL."
    assert wrapper.__module__ == __name__
    assert wrapper.__wrapped__ is fetch  # type: ignore[attr-defined]
    assert wrapper.marker == "kept"  # type: ignore[attr-defined]
    assert inspect.signature(wrapper) == inspect.signature(fetch)
    assert not inspect.iscoroutinefunction(wrapper)
    assert weakref.ref(wrapper)() is wrapper
    assert wrapper("u", timeout=2) == "u 2"
    assert wrapper.__dict__["__wrapped__"] is fetch


def test_a_decorated_method_binds_like_a_function() -> None:
    class Client:
        @retrying(THREE, label="op")
        def get(self, x: int) -> tuple[Client, int]:
            return self, x

        @classmethod
        @retrying(THREE, label="op")
        def build(cls, x: int) -> tuple[type, int]:
            return cls, x

        @staticmethod
        @retrying(THREE, label="op")
        def pure(x: int) -> int:
            return x * 2

    client = Client()
    assert client.get(1) == (client, 1)
    assert Client.get(client, 2) == (client, 2)
    bound = client.get
    assert bound.__self__ is client  # type: ignore[attr-defined]
    assert bound(3) == (client, 3)
    assert list(inspect.signature(bound).parameters) == ["x"]
    assert Client.build(4) == (Client, 4)
    assert client.pure(5) == 10


def test_retry_sync_and_call_bind_as_the_python_functions_do() -> None:
    policy = Retrying(THREE, label="op")
    assert Retrying.call(policy, lambda x: x + 1, 1) == 2
    assert functools.partial(retry_sync, THREE, label="op")(lambda x: x * 3, 2) == 6
    assert functools.partial(policy.call, lambda x, y=0: x - y)(5, y=2) == 3


def test_a_decorated_function_is_not_handed_an_attempt_and_stacks_cheaply() -> None:
    calls = 0

    def op() -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError
        return "ok"

    inner = retrying(THREE, label="op")(op)
    assert wants_attempt(inner) is False
    assert getattr(inner, "wants_attempt", False) is False
    outer = retrying(THREE, label="op")(inner)
    assert outer() == "ok"
    assert calls == 2  # the inner layer collapsed to one attempt; the outer one retried


# --- the rules, on every form -------------------------------------------------------------------

def test_arguments_are_forwarded_exactly(form: Callable[[Any], Form]) -> None:
    run = form(THREE)

    def op(a: int, b: int = 0, *rest: int, key: str = "", **extra: int) -> tuple[Any, ...]:
        return a, b, rest, key, extra

    assert run(op, 1) == (1, 0, (), "", {})
    assert run(op, 1, 2, 3, 4, key="k", z=9) == (1, 2, (3, 4), "k", {"z": 9})
    assert run(op, *range(20)) == (0, 1, tuple(range(2, 20)), "", {})


def test_a_failure_is_retried_by_the_python_loop_with_the_same_arguments(form: Callable[[Any], Form],
                                                                          sink: RecordingSink) -> None:
    seen: list[tuple[Any, ...]] = []

    def op(a: int, *, b: int) -> int:
        seen.append((a, b, in_retry_attempt()))
        if len(seen) < 3:
            raise ConnectionError
        return a + b

    assert form(THREE)(op, 1, b=2) == 3
    assert seen == [(1, 2, True)] * 3
    assert sink.names.count("retry.attempt_failed") == 2
    assert sink.of("retry.succeeded")[0].attributes == {"attempts": 3}
    assert not in_retry_attempt()


def test_the_operations_own_exception_propagates_with_its_frames(form: Callable[[Any], Form]) -> None:
    op = fail_with(TypeError("wrong"))  # permanent: raised after the first attempt
    with pytest.raises(TypeError) as caught:
        form(THREE)(op.sync)
    assert caught.value is op.raised[0]
    names = [frame.name for frame in traceback.extract_tb(caught.value.__traceback__)]
    assert names[-2:] == ["sync", "_outcome"]  # where it was raised, innermost last
    assert "test_the_operations_own_exception_propagates_with_its_frames" in names


def test_the_last_attempts_exception_propagates_unchanged(form: Callable[[Any], Form]) -> None:
    op = fail_with(ConnectionError("down"))
    with pytest.raises(ConnectionError) as caught:
        form(THREE)(op.sync)
    assert op.calls == 3
    assert caught.value is op.raised[-1]
    assert [f.name for f in traceback.extract_tb(caught.value.__traceback__)][-1] == "_outcome"


def test_a_base_exception_is_never_retried_and_the_mark_is_reset(form: Callable[[Any], Form]) -> None:
    calls = 0

    def op() -> None:
        nonlocal calls
        calls += 1
        raise Stop

    with pytest.raises(Stop):
        form(THREE)(op)
    assert calls == 1
    assert not in_retry_attempt()


def test_a_coroutine_returned_by_a_plain_operation_is_closed_and_refused(form: Callable[[Any], Form]) -> None:
    async def work() -> int:
        return 1

    made: list[Any] = []

    def op() -> Any:
        made.append(work())
        return made[-1]

    with pytest.raises(TypeError, match="returned a coroutine"):
        form(THREE)(op)
    assert len(made) == 1 and made[0].cr_frame is None  # closed (no "never awaited" warning)
    assert not in_retry_attempt()


def test_an_operation_wanting_an_attempt_takes_the_python_path(form: Callable[[Any], Form]) -> None:
    numbers: list[int] = []

    def op(attempt: Any) -> int:
        numbers.append(attempt.number)
        if attempt.number < 2:
            raise ConnectionError
        return attempt.number

    assert form(THREE)(op) == 2
    assert numbers == [1, 2]


def test_a_retry_inside_an_attempt_makes_a_single_attempt(form: Callable[[Any], Form]) -> None:
    inner = fail_with(ConnectionError())
    marks: list[bool] = []

    def outer() -> None:
        marks.append(in_retry_attempt())
        retry_sync(THREE, inner.sync, label="op")

    with pytest.raises(ConnectionError):
        form(THREE)(outer)
    assert marks == [True] * 3
    assert inner.calls == 3  # one per outer attempt: the inner retry collapsed
    assert not in_retry_attempt()


class _JumpClock:
    """A clock for blocking code: a sleep moves time to its end at once."""

    def __init__(self) -> None:
        self.t = 0

    def now_ns(self) -> int:
        return self.t

    def call_at(self, when_ns: int, callback: Callable[[], object]) -> Any:
        raise NotImplementedError

    async def sleep_until(self, when_ns: int) -> None:
        raise NotImplementedError

    def sleep_until_blocking(self, when_ns: int) -> None:
        self.t = max(self.t, when_ns)


@pytest.mark.parametrize(("up_to", "starts"), [(1.5, [0.0]), (4.5, [0.0, 2.0, 4.0])])
def test_a_timed_schedule_counts_from_the_first_attempts_start(form: Callable[[Any], Form], up_to: float,
                                                              starts: list[float]) -> None:
    # Each attempt takes 1 s, then waits 1 s. Timed from the first failure instead (1 s late),
    # up_to(1.5) would allow a second attempt.
    with use_clock(_JumpClock()):
        op = fail_with(ConnectionError(), takes=1.0)
        with pytest.raises(ConnectionError):
            form(Schedule.fixed(1.0).up_to(up_to).attempts(10))(op.sync)
    assert op.started_at == starts


def test_the_budget_bounds_retries_under_a_full_outage(form: Callable[[Any], Form], clock: VirtualClock) -> None:
    run = form(DRAIN)
    op = fail_with(ConnectionError())
    calls = 200
    for _ in range(calls):
        with pytest.raises(ConnectionError):
            run(op.sync)
    retries = op.calls - calls
    assert 10 <= retries <= 0.2 * calls + 10  # reserve (10, no refill on a still clock) + earned 0.2 each


def test_reset_budgets_between_calls_through_every_form(form: Callable[[Any], Form],
                                                                clock: VirtualClock) -> None:
    run = form(DRAIN)
    for _ in range(3):
        op = fail_with(ConnectionError())
        with pytest.raises(ConnectionError):
            run(op.sync)
        assert op.calls == 11  # a full reserve each time: the reset's new bucket is the one used
        with pytest.raises(ConnectionError):
            run(op.sync)
        assert op.calls == 11 + 1  # drained: no retry
        reset_budgets()


def test_retry_sync_sorts_its_own_keywords_out_and_forwards_the_rest(sink: RecordingSink) -> None:
    def op(**kwargs: Any) -> dict[str, Any]:
        return kwargs

    assert retry_sync(THREE, op, label="mine", budget=RetryBudget.UNLIMITED, other=1) == {"other": 1}
    failing = fail_times(1, ConnectionError, then="ok")
    assert retry_sync(THREE, failing.sync, label="mine") == "ok"
    assert {event.label for event in sink.events} == {"mine"}


def test_argument_errors_are_the_python_functions() -> None:
    with pytest.raises(TypeError, match="bounded schedule"):
        retry_sync(Schedule.fixed(0), len, label="op")
    with pytest.raises(TypeError, match="BoundedSchedule"):
        retry_sync(3, len, label="op")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        retry_sync(THREE, label="op")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        retry_sync(label="op")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="nesting"):
        retry_sync(THREE, len, "x", nesting="no", label="op")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Retrying(THREE, label="op").call()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Retrying.call()  # type: ignore[call-arg]
    with pytest.raises(AttributeError):
        Retrying.call(object(), len, "x")  # type: ignore[arg-type]


def test_a_subclass_of_retrying_keeps_its_call() -> None:
    class Mine(Retrying):
        __slots__ = ()

    op = fail_times(2, ConnectionError, then="ok")
    assert Mine(THREE, label="op").call(op.sync) == "ok" and op.calls == 3


# --- no leaks ------------------------------------------------------------------------------------

def _growth(run: Callable[[int], None], n: int) -> tuple[int, int]:
    run(2_000)  # warm caches (sites, code objects, free lists)
    gc.collect()
    blocks, objects = sys.getallocatedblocks(), len(gc.get_objects())
    run(n)
    gc.collect()
    return sys.getallocatedblocks() - blocks, len(gc.get_objects()) - objects


def _scenarios() -> dict[str, Callable[..., Any]]:
    state = {"calls": 0}

    def ok(x: Any, *, k: Any) -> Any:
        return RESULT

    def flaky(x: Any, *, k: Any) -> Any:  # fails every other call: the Python loop retries it
        state["calls"] += 1
        if state["calls"] % 2:
            raise ConnectionError("down")
        return RESULT

    def permanent(x: Any, *, k: Any) -> Any:
        raise TypeError("wrong")

    def base(x: Any, *, k: Any) -> Any:
        raise Stop

    async def work() -> None:
        return None

    def coroutine(x: Any, *, k: Any) -> Any:
        return work()

    return {"ok": ok, "flaky": flaky, "permanent": permanent, "base": base, "coroutine": coroutine}


class _Result:
    pass


RESULT = _Result()


@pytest.mark.parametrize("scenario", ["ok", "flaky", "permanent", "base", "coroutine"])
def test_no_reference_or_memory_leaks(form: Callable[[Any], Form], scenario: str) -> None:
    fn = _scenarios()[scenario]
    run_form = form(Schedule.fixed(0).attempts(2)) if form is not _via_retry_sync else None
    arg, kwarg = object(), object()
    schedule = Schedule.fixed(0).attempts(2)

    if run_form is None:
        def once() -> Any:
            return retry_sync(schedule, fn, arg, k=kwarg, label="op")
    else:
        def once() -> Any:
            return run_form(fn, arg, k=kwarg)

    def run(n: int) -> None:
        for _ in range(n):
            try:
                once()
            except (ConnectionError, TypeError, Stop):
                pass

    run(1)  # (the decorator form makes its wrapper, which holds fn, on its first call)
    gc.collect()  # (earlier tests' garbage may hold references to RESULT)
    counted = (fn, arg, kwarg, RESULT, schedule)
    before = [sys.getrefcount(x) for x in counted]
    n = 100_000 if scenario == "ok" else 20_000  # (a leak of one block per call shows either way)
    blocks, objects = _growth(run, n)
    assert [sys.getrefcount(x) for x in counted] == before
    assert blocks < 500, f"{blocks} memory blocks more after {n} calls"
    assert objects < 100, f"{objects} objects more after {n} calls"


# --- the async forms: retry() and Retrying.execute() -------------------------------------------

AsyncForm = Callable[..., Any]


def _via_retry(schedule: Any) -> AsyncForm:
    def run(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return retry(schedule, fn, *args, **kwargs, label="op")

    return run


def _via_execute(schedule: Any) -> AsyncForm:
    return Retrying(schedule, label="op").execute


def _via_async_decorator(schedule: Any) -> AsyncForm:
    cache: dict[Any, Any] = {}

    def run(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        wrapper = cache.get(fn)
        if wrapper is None:
            target = fn
            if not inspect.iscoroutinefunction(fn):  # (a FaultyOperation: an object with an async __call__)
                async def target(*a: Any, **k: Any) -> Any:
                    return await fn(*a, **k)
            wrapper = cache[fn] = retrying(schedule, label="op")(target)
        return wrapper(*args, **kwargs)

    return run


ASYNC_FORMS: dict[str, Callable[[Any], AsyncForm]] = {
    "retry": _via_retry, "Retrying.execute": _via_execute, "@retrying": _via_async_decorator,
}


@pytest.fixture(params=list(ASYNC_FORMS))
def aform(request: pytest.FixtureRequest) -> Callable[[Any], AsyncForm]:
    return ASYNC_FORMS[request.param]


def test_nothing_runs_before_the_first_send_and_a_closed_one_never_runs(aform: Callable[[Any], AsyncForm]) -> None:
    calls = 0

    async def op() -> int:
        nonlocal calls
        calls += 1
        return 1

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        made = aform(THREE)(op)
        assert calls == 0
        made.close()
        made.close()
    assert calls == 0
    with pytest.raises(RuntimeError, match="cannot reuse already awaited coroutine"):
        made.send(None)


def test_one_never_awaited_warns_as_a_coroutine_does(aform: Callable[[Any], AsyncForm]) -> None:
    async def op() -> int:
        return 1

    with pytest.warns(RuntimeWarning, match="was never awaited"):
        aform(THREE)(op)
        gc.collect()


async def test_create_task_and_gather_take_them(aform: Callable[[Any], AsyncForm]) -> None:
    run = aform(Schedule.fixed(0).attempts(3))
    flaky = fail_times(1, ConnectionError, then="flaky")

    async def op(x: int, *, y: int = 0) -> int:
        await asyncio.sleep(0)
        return x + y

    task = asyncio.create_task(run(op, 1, y=2))
    results = await asyncio.gather(task, run(op, 3), run(flaky), *(run(op, i) for i in range(100)))
    assert results == [3, 3, "flaky", *range(100)]
    assert flaky.calls == 2
    assert await asyncio.wait_for(run(op, 5), timeout=10) == 5
    assert not in_retry_attempt()


def test_asyncio_run_takes_them(aform: Callable[[Any], AsyncForm]) -> None:
    async def op() -> str:
        return "ran"

    assert asyncio.run(aform(THREE)(op)) == "ran"


async def test_a_cancelled_task_is_never_retried(aform: Callable[[Any], AsyncForm]) -> None:
    started = asyncio.Event()
    calls = 0

    async def hang() -> None:
        nonlocal calls
        calls += 1
        started.set()
        await asyncio.get_running_loop().create_future()

    task = asyncio.create_task(aform(THREE)(hang))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert calls == 1
    assert not in_retry_attempt()


async def test_a_task_cancelled_during_the_backoff_is_not_retried(aform: Callable[[Any], AsyncForm]) -> None:
    op = fail_with(ConnectionError())
    task = asyncio.create_task(aform(Schedule.fixed(60).attempts(3))(op))
    while op.calls == 0:
        await asyncio.sleep(0)
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert op.calls == 1


async def test_async_tracebacks_keep_the_operations_frames(aform: Callable[[Any], AsyncForm]) -> None:
    op = fail_with(TypeError("wrong"))
    with pytest.raises(TypeError) as caught:
        await aform(THREE)(op)
    assert caught.value is op.raised[0]
    names = [frame.name for frame in traceback.extract_tb(caught.value.__traceback__)]
    assert names[-2:] == ["__call__", "_outcome"]


async def test_a_retry_inside_an_async_attempt_makes_a_single_attempt(
        aform: Callable[[Any], AsyncForm]) -> None:
    inner = fail_with(ConnectionError())
    marks: list[bool] = []

    async def outer() -> None:
        marks.append(in_retry_attempt())
        await retry(THREE, inner, label="op")

    with pytest.raises(ConnectionError):
        await aform(THREE)(outer)
    assert marks == [True] * 3
    assert inner.calls == 3
    assert not in_retry_attempt()


async def test_an_async_operation_wanting_an_attempt_takes_the_python_path(
        aform: Callable[[Any], AsyncForm]) -> None:
    async def op(attempt: Any) -> int:
        if attempt.number < 2:
            raise ConnectionError
        return int(attempt.number)

    assert await aform(THREE)(op) == 2


async def test_reset_budgets_between_async_calls(aform: Callable[[Any], AsyncForm], clock: VirtualClock) -> None:
    run = aform(DRAIN)
    for _ in range(2):
        op = fail_with(ConnectionError())
        with pytest.raises(ConnectionError):
            await clock.run(run(op))
        assert op.calls == 11
        reset_budgets()


def test_a_plain_retry_refuses_an_async_retry_as_it_refuses_a_coroutine() -> None:
    async def op() -> int:
        return 1

    for call in (lambda: retry_sync(THREE, lambda: retry(THREE, op, label="op"), label="op"),
                 lambda: retry_sync(THREE, lambda: retry(THREE, op, label="op"), label="own keyword"),
                 lambda: Retrying(THREE, label="op").call(lambda: Retrying(THREE, label="op").execute(op))):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # (closed: no "never awaited" warning either)
            with pytest.raises(TypeError, match="returned a coroutine"):
                call()


# Each step of a script, applied to a retry's awaitable: what it gives and what the operation saw.
_ACTIONS = ["send", "send5", "throw_transient", "throw_base", "throw_exit", "throw3", "close"]


class _Suspend:
    def __await__(self) -> Any:
        return (yield "suspended")


def _drive(make: Callable[[Callable[..., Any]], Any], script: list[str]) -> list[Any]:
    reset_budgets()  # (each call site's budget starts full, as the reference's does)
    log: list[Any] = []

    async def op() -> str:
        log.append("start")
        try:
            got = await _Suspend()
            log.append(("got", got))
            return "result"
        except BaseException as e:
            log.append(("caught", type(e).__name__))
            raise
        finally:
            log.append(("finally", in_retry_attempt()))

    async def main() -> list[Any]:
        made = make(op)
        for action in script:
            try:
                if action == "send":
                    got = made.send(None)
                elif action == "send5":
                    got = made.send(5)
                elif action == "throw_transient":
                    got = made.throw(ConnectionError("thrown"))
                elif action == "throw_base":
                    got = made.throw(Stop())
                elif action == "throw_exit":
                    got = made.throw(GeneratorExit)
                elif action == "throw3":
                    got = made.throw(ConnectionError, ConnectionError("three"), None)
                else:
                    got = made.close()
                log.append((action, "gave", got))
            except StopIteration as stop:
                log.append((action, "returned", stop.value))
            except BaseException as e:  # (recorded and compared)
                log.append((action, "raised", type(e).__name__, str(e).replace("_run_async", "?")))
            log.append(("marked", in_retry_attempt()))
        made.close()
        return log

    return asyncio.run(main())


@settings(max_examples=150, deadline=None)
@given(script=st.lists(st.sampled_from(_ACTIONS), max_size=7))
def test_send_throw_and_close_behave_as_the_python_coroutine(script: list[str]) -> None:
    schedule = Schedule.fixed(0).attempts(3)
    python_retry = getattr(retry, "__wrapped__", retry)
    policy = Retrying(schedule, label="op")
    python_execute = getattr(Retrying.execute, "__wrapped__", Retrying.execute)
    reference = _drive(lambda op: python_retry(schedule, op, label="op"), script)
    assert _drive(lambda op: retry(schedule, op,
            label="op"), script) == reference  # (its own keywords would go to Python)
    unlimited = Retrying(schedule, budget=RetryBudget.UNLIMITED, label="op")
    assert _drive(lambda op: unlimited.execute(op), script) == reference
    assert _drive(lambda op: python_execute(policy, op), script) == _drive(lambda op: policy.execute(op), script)
    assert _drive(lambda op: retrying(schedule, label="op")(op)(), script) == reference


@pytest.mark.parametrize("scenario", ["ok", "flaky", "permanent", "base", "cancelled"])
def test_no_async_reference_or_memory_leaks(aform: Callable[[Any], AsyncForm], scenario: str) -> None:
    state = {"calls": 0}

    async def op(x: Any, *, k: Any) -> Any:
        if scenario == "flaky":
            state["calls"] += 1
            if state["calls"] % 2:
                raise ConnectionError("down")
        elif scenario == "permanent":
            raise TypeError("wrong")
        elif scenario == "base":
            raise Stop
        elif scenario == "cancelled":
            await _Suspend()
        return RESULT

    run_form = aform(Schedule.fixed(0).attempts(2))
    arg, kwarg = object(), object()

    async def calls(n: int) -> None:
        for _ in range(n):
            made = run_form(op, arg, k=kwarg)
            if scenario == "cancelled":
                made.send(None)
                try:
                    made.throw(asyncio.CancelledError())
                except asyncio.CancelledError:
                    pass
                continue
            try:
                await made
            except (ConnectionError, TypeError, Stop):
                pass

    loop = asyncio.new_event_loop()
    try:
        def go(n: int) -> None:
            loop.run_until_complete(calls(n))

        go(1)
        gc.collect()
        counted = (op, arg, kwarg, RESULT)
        before = [sys.getrefcount(x) for x in counted]
        blocks, objects = _growth(go, 100_000 if scenario == "ok" else 20_000)
        assert [sys.getrefcount(x) for x in counted] == before
        assert blocks < 500, f"{blocks} memory blocks more"
        assert objects < 100, f"{objects} objects more"
    finally:
        loop.close()


@retrying(THREE, label="op")
def _module_level(x: int) -> int:
    return x + 1


def test_functions_pickle_and_copy_by_reference_as_functions_do() -> None:
    import copy
    import pickle

    for fn in (_module_level, retry_sync, retry):
        assert pickle.loads(pickle.dumps(fn)) is fn
        assert copy.copy(fn) is fn and copy.deepcopy(fn) is fn
    assert pickle.loads(pickle.dumps(_module_level))(1) == 2


async def test_a_tasks_repr_names_the_retry_coroutine_in_both_modes(aform: Callable[[Any], AsyncForm]) -> None:
    go = asyncio.Event()

    async def op() -> int:
        await go.wait()  # (pending, so the repr shows the coroutine even with an eager task factory)
        return 1

    task = asyncio.create_task(aform(THREE)(op))
    # (a decorated function's coroutine is named after the function, as functools.wraps makes it;
    # Retrying.execute's after the method)
    named = {_via_async_decorator: "op()", _via_execute: "Retrying.execute()"}.get(aform, "_run_async()")
    assert named in repr(task)
    go.set()
    assert await task == 1


# --- @retrying on a coroutine function ---------------------------------------------------------

@retrying(THREE, label="op")
async def _module_level_async(x: int, *, y: int = 1) -> int:
    """Adds."""
    return x + y


def test_a_decorated_coroutine_function_is_a_coroutine_function_with_its_signature_and_attributes() -> None:
    async def fetch(url: str, *, retries: int = 2) -> str:
        """Fetches."""
        return url

    fetch.custom = "kept"  # type: ignore[attr-defined]
    decorated = retrying(THREE, label="op")(fetch)
    assert inspect.iscoroutinefunction(decorated)
    assert asyncio.iscoroutinefunction(decorated)
    assert inspect.signature(decorated) == inspect.signature(fetch)
    assert (decorated.__name__, decorated.__qualname__, decorated.__doc__, decorated.__module__) == (
        fetch.__name__, fetch.__qualname__, "Fetches.", fetch.__module__)
    assert decorated.__wrapped__ is fetch
    assert decorated.__annotations__ == fetch.__annotations__
    assert decorated.custom == "kept"  # type: ignore[attr-defined]
    assert not wants_attempt(decorated)
    assert asyncio.run(decorated("u")) == "u"
    # Stacked: the outer decorator sees a coroutine function too (one single attempt inside).
    twice = retrying(THREE, label="op")(decorated)
    assert inspect.iscoroutinefunction(twice)
    assert asyncio.run(twice("v")) == "v"


def test_a_decorated_coroutine_method_binds_like_a_function() -> None:
    class Client:
        def __init__(self) -> None:
            self.calls = 0

        @retrying(Schedule.fixed(0).attempts(3), label="op")
        async def get(self, key: str) -> tuple[Any, str]:
            self.calls += 1
            if self.calls < 2:
                raise ConnectionError
            return self, key

        @staticmethod
        @retrying(THREE, label="op")
        async def static(x: int) -> int:
            return x

    client = Client()
    assert inspect.iscoroutinefunction(client.get)
    assert asyncio.iscoroutinefunction(client.get)
    assert inspect.ismethod(client.get) and client.get.__self__ is client
    assert list(inspect.signature(client.get).parameters) == ["key"]
    assert asyncio.run(client.get("k")) == (client, "k")
    assert client.calls == 2
    assert asyncio.run(Client.get(client, "j")) == (client, "j")
    assert asyncio.run(client.static(4)) == 4 and inspect.iscoroutinefunction(Client.static)


def test_a_decorated_coroutine_function_pickles_and_copies_by_reference() -> None:
    import copy
    import pickle

    assert pickle.loads(pickle.dumps(_module_level_async)) is _module_level_async
    assert copy.copy(_module_level_async) is _module_level_async
    assert copy.deepcopy(_module_level_async) is _module_level_async
    assert asyncio.run(pickle.loads(pickle.dumps(_module_level_async))(1, y=2)) == 3


def test_the_bucket_and_clock_are_read_at_the_first_send_as_the_python_wrapper_reads_them() -> None:
    op = fail_times(1, ConnectionError, then="ok")

    async def target() -> str:
        return await op()

    made = retrying(Schedule.fixed(5).attempts(2), label="op")(target)()  # made with the system clock ambient
    virtual = VirtualClock()

    async def main() -> str:
        with use_clock(virtual):
            return await virtual.run(made, limit=60)  # a real 5 s sleep would fail the run's limit

    assert asyncio.run(asyncio.wait_for(main(), timeout=2)) == "ok"
    assert op.calls == 2


async def test_a_decorated_coroutine_function_nested_in_an_attempt_makes_a_single_attempt() -> None:
    inner = fail_with(ConnectionError())

    @retrying(THREE, label="op")
    async def inner_retried() -> None:
        await inner()

    @retrying(THREE, label="op")
    async def outer() -> None:
        assert in_retry_attempt()
        await inner_retried()

    with pytest.raises(ConnectionError):
        await outer()
    assert inner.calls == 3  # one per outer attempt: the inner retry never retries
    assert not in_retry_attempt()


# --- a misused operation is never retried, whatever the classifier says ----------------------

def _plain_generator() -> Any:
    yield 1


@pytest.mark.parametrize("value", [None, 42, "gen"], ids=["None", "int", "generator"])
async def test_an_async_retry_of_a_plain_function_is_never_retried(value: object, clock: VirtualClock) -> None:
    # Seen failing before the fix: a classifier retrying everything retried the TypeError of
    # ``await 42`` three times (retry_sync refuses the same misuse at once).
    calls: list[int] = []

    def op() -> object:
        calls.append(1)
        return _plain_generator() if value == "gen" else value

    with pytest.raises(TypeError):
        await clock.run(stoic.retry(Schedule.fixed(1).attempts(3), op, label="misuse", classify=lambda e: True))
    assert calls == [1]


def test_retry_syncs_refusal_is_not_counted_by_an_outer_breaker() -> None:
    # Seen failing before the fix: the refusal was a bare TypeError, counted as a failure.
    breaker = stoic.CircuitBreaker(label="outer")
    for _ in range(3):
        with pytest.raises(TypeError, match="returned a generator") as caught:
            breaker.call(lambda: stoic.retry_sync(Schedule.fixed(0).attempts(2), _plain_generator, label="inner"))
        assert stoic.is_defect(caught.value)
    assert breaker.snapshot.calls == 0


def test_retrying_execute_is_found_where_it_is_defined_as_the_other_methods_are() -> None:
    # Seen failing before the fix: execute, compiled in stoic._retry, said __module__ ==
    # "stoic._retry", where no Retrying exists, so pickle (by reference) raised PicklingError and
    # inspect.getmodule / documentation tools looked for it in the wrong module.
    import copy
    import pickle

    assert Retrying.execute.__module__ == Retrying.call.__module__ == "stoic.pipeline"
    assert inspect.getmodule(Retrying.execute) is inspect.getmodule(Retrying)
    assert pickle.loads(pickle.dumps(Retrying.execute)) is Retrying.execute
    assert copy.deepcopy(Retrying.execute) is Retrying.execute
    assert inspect.iscoroutinefunction(Retrying.execute)
    assert list(inspect.signature(Retrying.execute).parameters) == ["self", "fn", "args", "kwargs"]
