"""The compiled retry paths (stoic/_cretry.c) keep the Python paths' rules and behave like the
Python functions they stand for: binding, wraps attributes, signatures, tracebacks, nesting,
budgets and resets. No reference or memory is leaked on any path, success or failure.

Behavioural tests run in both modes (the suite runs again with ``STOIC_PURE_PYTHON=1``); the
few about the compiled objects themselves skip only when pure Python was asked for.
"""

from __future__ import annotations

import functools
import gc
import inspect
import sys
import traceback
import weakref
from collections.abc import Callable
from typing import Any

import pytest

from stoic import RetryBudget, Retrying, Schedule, _native, retry_sync, retrying, use_clock
from stoic._retry import in_retry_attempt, wants_attempt
from stoic.testing import RecordingSink, VirtualClock, fail_times, fail_with, reset_budgets

compiled_only = pytest.mark.skipif(_native.PURE_PYTHON, reason="about the compiled paths (pure Python asked for)")

DRAIN = Schedule.fixed(0).attempts(100)
THREE = Schedule.fixed(0).attempts(3)

# One call site per form (retry_sync's budget is its call site's).
Form = Callable[..., Any]


def _via_retry_sync(schedule: Any) -> Form:
    def run(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return retry_sync(schedule, fn, *args, **kwargs)

    return run


def _via_call(schedule: Any, **options: Any) -> Form:
    return Retrying(schedule, **options).call


def _via_decorator(schedule: Any, **options: Any) -> Form:
    cache: dict[Any, Any] = {}

    def run(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        wrapper = cache.get(fn)
        if wrapper is None:
            wrapper = cache[fn] = retrying(schedule, **options)(fn)
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


# --- the compiled objects look like the Python functions ---------------------------------------

@compiled_only
def test_the_sync_forms_are_compiled() -> None:
    policy = Retrying(THREE)
    assert type(retry_sync).__module__ == "stoic._cretry"
    assert type(Retrying.__dict__["call"]).__module__ == "stoic._cretry"
    assert type(retrying(THREE)(len)).__module__ == "stoic._cretry"
    assert policy.call.__func__ is Retrying.__dict__["call"]  # type: ignore[attr-defined]


def test_public_functions_keep_their_signatures_and_docstrings() -> None:
    params = list(inspect.signature(retry_sync).parameters)
    assert params == ["schedule", "fn", "args", "budget", "classify", "nesting", "label", "kwargs"]
    assert retry_sync.__doc__ is not None and "plain (blocking) function" in retry_sync.__doc__
    assert retry_sync.__name__ == "retry_sync" and retry_sync.__module__ == "stoic._retry"
    assert list(inspect.signature(Retrying.call).parameters) == ["self", "fn", "args", "kwargs"]
    assert list(inspect.signature(Retrying(THREE).call).parameters) == ["fn", "args", "kwargs"]
    assert Retrying.call.__doc__ is not None and "Run plain" in Retrying.call.__doc__
    assert Retrying.call.__qualname__ == "Retrying.call"


def test_a_decorated_function_keeps_its_name_doc_attributes_and_signature() -> None:
    def fetch(url: str, *, timeout: float = 1.0) -> str:
        """Fetch a URL."""
        return f"{url} {timeout}"

    fetch.marker = "kept"  # type: ignore[attr-defined]
    wrapper = retrying(THREE)(fetch)
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
        @retrying(THREE)
        def get(self, x: int) -> tuple[Client, int]:
            return self, x

        @classmethod
        @retrying(THREE)
        def build(cls, x: int) -> tuple[type, int]:
            return cls, x

        @staticmethod
        @retrying(THREE)
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


def test_compiled_retry_sync_and_call_bind_as_the_python_functions_do() -> None:
    policy = Retrying(THREE)
    assert Retrying.call(policy, lambda x: x + 1, 1) == 2
    assert functools.partial(retry_sync, THREE)(lambda x: x * 3, 2) == 6
    assert functools.partial(policy.call, lambda x, y=0: x - y)(5, y=2) == 3


def test_a_decorated_function_is_not_handed_an_attempt_and_stacks_cheaply() -> None:
    calls = 0

    def op() -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError
        return "ok"

    inner = retrying(THREE)(op)
    assert wants_attempt(inner) is False
    assert getattr(inner, "wants_attempt", False) is False  # (the compiled wrapper says so itself)
    outer = retrying(THREE)(inner)
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
    assert sink.names().count("retry.attempt_failed") == 2
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


def test_a_retry_inside_a_compiled_attempt_makes_a_single_attempt(form: Callable[[Any], Form]) -> None:
    inner = fail_with(ConnectionError())
    marks: list[bool] = []

    def outer() -> None:
        marks.append(in_retry_attempt())
        retry_sync(THREE, inner.sync)

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


def test_reset_budgets_between_calls_through_the_compiled_paths(form: Callable[[Any], Form],
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
        retry_sync(Schedule.fixed(0), len)
    with pytest.raises(TypeError, match="BoundedSchedule"):
        retry_sync(3, len)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        retry_sync(THREE)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        retry_sync()  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="nesting"):
        retry_sync(THREE, len, "x", nesting="no")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Retrying(THREE).call()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Retrying.call()  # type: ignore[call-arg]
    with pytest.raises(AttributeError):
        Retrying.call(object(), len, "x")  # type: ignore[arg-type]


def test_a_subclass_of_retrying_keeps_the_compiled_call() -> None:
    class Mine(Retrying):
        __slots__ = ()

    op = fail_times(2, ConnectionError, then="ok")
    assert Mine(THREE).call(op.sync) == "ok" and op.calls == 3


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
            return retry_sync(schedule, fn, arg, k=kwarg)
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
    n = 100_000
    blocks, objects = _growth(run, n)
    assert [sys.getrefcount(x) for x in counted] == before
    assert blocks < 500, f"{blocks} memory blocks more after {n} calls"
    assert objects < 100, f"{objects} objects more after {n} calls"
