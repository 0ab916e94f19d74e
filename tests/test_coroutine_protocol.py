"""Scenarios at the edge of the coroutine protocol (handled exceptions, throw, close, a second
awaiter, clocks that read floats), each once found wrong in some form of the breaker or retry.
"""

from __future__ import annotations

import sys
from collections.abc import Generator, Iterator
from typing import Any

import pytest

from stoic import CircuitBreaker, Schedule, retry

# The three-argument throw() is called on purpose (the protocol allows it; CPython 3.12 deprecates
# it): its warning is expected here, and hiding it keeps any other warning visible.
pytestmark = pytest.mark.filterwarnings(
    r"ignore:the \(type, exc, tb\) signature of throw\(\) is deprecated:DeprecationWarning")


class Boom(Exception):
    """The operation failed."""


def _boom() -> None:
    raise Boom("down")


async def _aboom() -> None:
    raise Boom("down")


class _Suspend:
    """Awaiting it suspends once (yields None), then returns None."""

    def __await__(self) -> Generator[None, None, None]:
        yield


class _NoThrowIter:
    """An awaited iterator without throw()/close(): yields "tick" once, then returns 5."""

    def __init__(self) -> None:
        self.steps = 0

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        self.steps += 1
        if self.steps == 1:
            return "tick"
        raise StopIteration(5)


class _NoThrow:
    def __await__(self) -> _NoThrowIter:
        return _NoThrowIter()


def _finish(awaitable: Any) -> Any:
    try:
        awaitable.send(None)
    except StopIteration as done:
        return done.value
    raise AssertionError("the awaitable suspended again")


# ---------------------------------------------------------------- the handled exception


def test_a_failed_call_leaves_no_handled_exception_in_the_calling_generator() -> None:
    # A generator catching the operation's error, first run inside an outer `except`, later
    # resumed outside it, must see no handled exception then (the outer one is not its own).
    breaker = CircuitBreaker(label="review-exc-info")

    def gen() -> Generator[object, None, None]:
        try:
            breaker.call(_boom)
        except Boom:
            pass
        yield None
        yield sys.exc_info()[1]

    g = gen()
    try:
        raise KeyError("outer")
    except KeyError:
        next(g)
    assert next(g) is None


def test_a_failed_execute_leaves_no_handled_exception_in_the_awaiting_coroutine() -> None:
    breaker = CircuitBreaker(label="review-exc-info-async")

    async def caller() -> object:
        try:
            await breaker.execute(_aboom)
        except Boom:
            pass
        await _Suspend()
        return sys.exc_info()[1]

    coro = caller()
    try:
        raise KeyError("outer")
    except KeyError:
        assert coro.send(None) is None  # suspended at _Suspend
    assert _finish(coro) is None


def test_a_failed_call_still_sees_the_callers_handled_exception_in_its_callbacks() -> None:
    # Inside record_when, the handled exception is the operation's, as in the except clause.
    seen: list[object] = []

    def record_when(error: Exception) -> bool:
        seen.append(sys.exc_info()[1])
        return True

    breaker = CircuitBreaker(label="review-exc-info-cb", record_when=record_when)
    with pytest.raises(Boom) as raised:
        breaker.call(_boom)
    assert seen == [raised.value]


# ---------------------------------------------------------------- throw() with arguments it refuses


@pytest.mark.parametrize("args", [(ValueError, None, 42), (42,), (ValueError("x"), ValueError("y"))],
                         ids=["bad-traceback", "not-an-exception", "instance-and-value"])
def test_a_refused_throw_leaves_execute_suspended_at_an_iterator_without_throw(args: tuple[Any, ...]) -> None:
    # `await` on an iterator with no throw() checks throw()'s arguments itself: a TypeError
    # leaves the coroutine suspended where it was (nothing settled, nothing lost).
    breaker = CircuitBreaker(label="review-throw-args")
    ex = breaker.execute(_NoThrow)
    assert ex.send(None) == "tick"
    with pytest.raises(TypeError):
        ex.throw(*args)
    assert _finish(ex) == 5
    assert breaker.snapshot.calls == 1


def test_a_refused_throw_keeps_a_half_open_probe_in_flight_until_it_finishes() -> None:
    from _breaker_helpers import StepClock

    clock = StepClock()
    breaker = CircuitBreaker(label="review-throw-probe", clock=clock, open_duration=_fixed(1.0))  # type: ignore[arg-type]
    breaker.force_open()
    breaker.force_closed()
    for _ in range(10):
        with pytest.raises(Boom):
            breaker.call(_boom)
    assert breaker.state == "open"
    clock.t += 2_000_000_000
    ex = breaker.execute(_NoThrow)  # the one probe
    assert ex.send(None) == "tick"
    with pytest.raises(TypeError):
        ex.throw(42)
    assert _finish(ex) == 5
    assert breaker.state == "closed"  # the probe succeeded


@pytest.mark.parametrize("args", [(ValueError, None, 42), (42,)], ids=["bad-traceback", "not-an-exception"])
def test_a_refused_throw_leaves_retry_suspended_at_an_iterator_without_throw(args: tuple[Any, ...]) -> None:
    run = retry(Schedule.fixed(0.0).attempts(2), _NoThrow, label="op")
    assert run.send(None) == "tick"
    with pytest.raises(TypeError):
        run.throw(*args)
    assert _finish(run) == 5


# ---------------------------------------------------------------- StopIteration thrown in


def _thrown_stop_into_a_fresh_coroutine() -> type[BaseException]:
    """What CPython raises when StopIteration is thrown into a coroutine not yet started: a
    RuntimeError on 3.11 (PEP 479's conversion), the StopIteration itself from 3.12 on (the
    conversion moved into the coroutine's body, which a fresh one has not entered)."""
    plain = _aboom()
    try:
        plain.throw(StopIteration)
    except BaseException as error:
        return type(error)
    raise AssertionError("throw() into a fresh coroutine returned")


def test_stop_iteration_thrown_into_a_fresh_execute_fails_as_in_a_plain_coroutine() -> None:
    expected = _thrown_stop_into_a_fresh_coroutine()
    assert expected is (RuntimeError if sys.version_info < (3, 12) else StopIteration)
    breaker = CircuitBreaker(label="review-stop")
    ex = breaker.execute(_aboom)
    with pytest.raises(expected):
        ex.throw(StopIteration)
    with pytest.raises(RuntimeError, match="cannot reuse"):
        ex.send(None)
    assert breaker.snapshot.calls == 0  # never entered: nothing admitted, nothing counted


def test_stop_iteration_thrown_into_a_fresh_retry_fails_as_in_a_plain_coroutine() -> None:
    expected = _thrown_stop_into_a_fresh_coroutine()
    run = retry(Schedule.fixed(0.0).attempts(2), _aboom, label="op")
    with pytest.raises(expected):
        run.throw(StopIteration)
    with pytest.raises(RuntimeError, match="cannot reuse"):
        run.send(None)


def _fixed(seconds: float) -> object:
    from stoic import OpenDuration

    return OpenDuration.fixed(seconds, jitter=0.0)


# ---------------------------------------------------------------- @breaker and fn.__kwdefaults__


def test_a_keyword_default_changed_in_place_after_decoration_is_not_followed() -> None:
    # The wrapper keeps the keyword-only defaults fn had at decoration (a copy of the dict);
    # the compiled wrapper, which lets fn fill them, must not see a change made in fn's dict.
    breaker = CircuitBreaker(label="review-kwdefaults")

    def fn(x: int, *, k: int = 1) -> int:
        return k

    wrapped = breaker(fn)
    assert wrapped(0) == 1
    assert fn.__kwdefaults__ is not None
    fn.__kwdefaults__["k"] = 2
    assert wrapped(0) == 1
    del fn.__kwdefaults__["k"]
    assert wrapped(0) == 1  # (no TypeError from fn, counted as a failure)
    fn.__kwdefaults__["k"] = 1
    assert wrapped(0) == 1
    assert wrapped(0, k=3) == 3
    snapshot = breaker.snapshot
    assert (snapshot.calls, snapshot.failures) == (5, 0)


# ---------------------------------------------------------------- subclasses


class _ListAdmit(CircuitBreaker):
    """A subclass whose _admit answers with a list (unpacked like the tuple it stands for)."""

    def _admit(self, now: int) -> Any:
        return list(super()._admit(now))


def _tripped(breaker_type: type[CircuitBreaker]) -> tuple[CircuitBreaker, Any]:
    """A breaker of ``breaker_type`` opened by failures, and its StepClock (1 s open period)."""
    from _breaker_helpers import StepClock

    clock = StepClock()
    breaker = breaker_type(label="review-tripped", clock=clock, open_duration=_fixed(1.0))  # type: ignore[arg-type]
    for _ in range(10):
        with pytest.raises(Boom):
            breaker.call(_boom)
    assert breaker.state == "open"
    return breaker, clock


def test_a_subclass_admit_may_answer_any_pair() -> None:
    breaker, clock = _tripped(_ListAdmit)
    clock.t += 2_000_000_000
    assert breaker.call(lambda: 7) == 7  # the half-open probe, admitted through the list
    assert breaker.state == "closed"
    breaker, clock = _tripped(_ListAdmit)
    clock.t += 2_000_000_000

    async def eight() -> int:
        return 8

    assert _finish(breaker.execute(eight)) == 8
    assert breaker.state == "closed"


# ---------------------------------------------------------------- clocks reading floats


class _FloatClock:
    """A clock whose now_ns() answers floats (a contract slip the Python path tolerates)."""

    def __init__(self) -> None:
        self.t = 1e12 + 0.5

    def now_ns(self) -> float:
        self.t += 1000.25
        return self.t


def test_a_clock_reading_floats_runs_calls_as_the_python_path_does() -> None:
    from stoic import CountWindow

    breaker = CircuitBreaker(label="review-float", clock=_FloatClock(), window=CountWindow(5),  # type: ignore[arg-type]
                             minimum_calls=2)
    assert [breaker.call(int, n) for n in range(3)] == [0, 1, 2]

    async def four() -> int:
        return 4

    assert _finish(breaker.execute(four)) == 4
    with pytest.raises(Boom):
        breaker.call(_boom)
    snapshot = breaker.snapshot
    assert (snapshot.calls, snapshot.failures) == (5, 1)


# ---------------------------------------------------------------- a second awaiter


def _second_awaiter_is_refused(make: Any) -> None:
    import asyncio

    async def main() -> None:
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        awaitable = make(future)
        first = asyncio.ensure_future(awaitable)
        await asyncio.sleep(0)  # the first task is suspended at the future now

        async def second() -> object:
            return await awaitable

        with pytest.raises(RuntimeError, match="being awaited already"):
            await asyncio.wait_for(second(), 5.0)  # (refused at once; the bound only stops a hang)
        future.set_result(3)
        assert await first == 3

    asyncio.run(main())


def test_a_second_awaiter_of_a_suspended_execute_is_refused() -> None:
    breaker = CircuitBreaker(label="review-second-awaiter")
    _second_awaiter_is_refused(lambda future: breaker.execute(lambda: future))


def test_a_second_awaiter_of_a_suspended_retry_is_refused() -> None:
    _second_awaiter_is_refused(lambda future: retry(Schedule.fixed(0.0).attempts(2), lambda: future, label="op"))
