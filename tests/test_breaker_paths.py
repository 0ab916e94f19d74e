"""The breaker's success paths (call, execute, @breaker) behave as functions and coroutines do:
binding, metadata, tracebacks, leaks, the coroutine protocol, threads, clocks.
"""

from __future__ import annotations

import asyncio
import collections.abc
import functools
import gc
import inspect
import sys
import threading
import traceback
import tracemalloc
import warnings
from collections.abc import Callable, Coroutine, Generator
from typing import Any

import pytest
from _breaker_helpers import Boom, StepClock

from stoic import CircuitBreaker, CircuitOpen, CountWindow, OpenDuration, TimeWindow, _retry
from stoic.testing import RecordingSink, VirtualClock


def drive(awaitable: Any) -> Any:
    """Run an awaitable that never suspends, by hand (no event loop)."""
    try:
        awaitable.send(None)
    except StopIteration as done:
        return done.value
    raise AssertionError("the awaitable suspended")


class Suspend:
    """Suspends its awaiter once (a bare yield), then returns what it is sent."""

    def __await__(self) -> Generator[None, Any, Any]:
        return (yield)


async def _async_one() -> int:
    return 1


# ------------------------------------------------------------------ references and memory

def _paths() -> dict[str, Callable[[Any, Any], Any]]:
    """Each path once, called with (payload, result object): returns the result or raises."""

    def op(payload: Any, result: Any) -> Any:
        return result

    async def aop(payload: Any, result: Any) -> Any:
        return result

    def failing(payload: Any, result: Any) -> Any:
        raise Boom("down")

    async def afailing(payload: Any, result: Any) -> Any:
        raise Boom("down")

    # A huge window and threshold 1.0: failures never trip it, so every path stays reachable.
    def make() -> CircuitBreaker:
        return CircuitBreaker(label="leak", window=TimeWindow(3600.0), minimum_calls=1, failure_rate_threshold=1.0)

    ok, bad, shut = make(), make(), make()
    shut.force_open()
    wrapped, awrapped = ok(op), ok(aop)
    wrapped_bad, awrapped_bad = bad(failing), bad(afailing)
    return {
        "call ok": lambda p, r: ok.call(op, p, result=r),
        "call failure": lambda p, r: bad.call(failing, p, r),
        "call rejected": lambda p, r: shut.call(op, p, r),
        "execute ok": lambda p, r: drive(ok.execute(aop, p, result=r)),
        "execute failure": lambda p, r: drive(bad.execute(afailing, p, r)),
        "execute rejected": lambda p, r: drive(shut.execute(aop, p, r)),
        "wrapper ok": lambda p, r: wrapped(p, r),
        "wrapper keywords": lambda p, r: wrapped(payload=p, result=r),
        "wrapper failure": lambda p, r: wrapped_bad(p, r),
        "async wrapper ok": lambda p, r: drive(awrapped(p, r)),
        "async wrapper failure": lambda p, r: drive(awrapped_bad(p, r)),
    }


@pytest.mark.parametrize("path", list(_paths()))
def test_no_reference_or_memory_leaks_on_any_path(path: str) -> None:
    run = _paths()[path]
    payload, result = object(), object()
    calls = 100_000 if path.endswith("ok") else 20_000

    def many(n: int) -> None:
        for _ in range(n):
            try:
                assert run(payload, result) is result
            except (Boom, CircuitOpen):
                pass

    many(2_000)  # warm up: caches, interned strings, freelists
    gc.collect()
    refs = sys.getrefcount(payload), sys.getrefcount(result), sys.getrefcount(run)
    objects = len(gc.get_objects())
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        many(calls)
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    growth = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    assert (sys.getrefcount(payload), sys.getrefcount(result), sys.getrefcount(run)) == refs
    assert len(gc.get_objects()) - objects < 100
    assert growth < 64 * 1024, f"{growth} bytes kept after {calls} calls"


# ------------------------------------------------------------------ the @breaker wrapper

def test_the_wrapper_binds_like_a_function_and_keeps_the_metadata() -> None:
    breaker = CircuitBreaker(label="wrap", window=CountWindow(10), minimum_calls=1)

    class Client:
        base = 10

        @breaker
        def get(self, n: int, *, extra: int = 0) -> int:
            """Get n."""
            return self.base + n + extra

        @staticmethod
        @breaker
        def pure(n: int) -> int:
            return n

    client = Client()
    assert client.get(1) == 11 and client.get(n=2, extra=1) == 13
    assert Client.get(client, 3) == 13  # looked up on the class: the wrapper itself
    assert Client.pure(4) == 4 and client.pure(5) == 5
    bound = client.get
    assert bound.__self__ is client and bound(0) == 10
    assert breaker.snapshot.calls == 6

    get = Client.__dict__["get"]
    assert get.__get__(None, Client) is get
    assert get.__name__ == "get" and get.__qualname__.endswith("Client.get") and get.__doc__ == "Get n."
    assert get.__module__ == __name__ and get.__wrapped__.__name__ == "get"
    assert str(inspect.signature(get)) == "(self, n: 'int', *, extra: 'int' = 0) -> 'int'"
    assert str(inspect.signature(bound)) == "(n: 'int', *, extra: 'int' = 0) -> 'int'"
    assert not inspect.iscoroutinefunction(get)


def test_the_wrapper_copies_the_function_dict_and_answers_retry_about_attempt() -> None:
    breaker = CircuitBreaker(label="wrap-dict")

    def op(attempt: object = None) -> object:
        return attempt

    op.marker = "kept"  # type: ignore[attr-defined]
    wrapped = breaker(op)
    assert wrapped.marker == "kept"  # type: ignore[attr-defined]
    wrapped.other = 1  # type: ignore[attr-defined]
    assert wrapped.__dict__["other"] == 1
    assert _retry.wants_attempt(wrapped) is True
    assert _retry.wants_attempt(breaker(lambda: None)) is False

    class Holder:
        method = wrapped

    assert _retry.wants_attempt(Holder().method) is True


async def test_the_async_wrapper_stays_a_coroutine_function_with_its_signature() -> None:
    breaker = CircuitBreaker(label="awrap")

    async def op(a: int, *, b: int = 2) -> int:
        """Add."""
        return a + b

    wrapped = breaker(op)
    assert inspect.iscoroutinefunction(wrapped) and asyncio.iscoroutinefunction(wrapped)
    assert str(inspect.signature(wrapped)) == "(a: 'int', *, b: 'int' = 2) -> 'int'"
    assert wrapped.__name__ == "op" and wrapped.__doc__ == "Add." and wrapped.__wrapped__ is op
    assert await wrapped(1) == 3 and await wrapped(1, b=5) == 6
    assert await asyncio.gather(wrapped(1), wrapped(a=2)) == [3, 4]
    with pytest.raises(TypeError, match="unexpected keyword argument 'c'"):
        wrapped(1, c=3)  # type: ignore[call-arg]  (raised by the call, as for an async def)
    assert breaker.snapshot.calls == 4


def test_arguments_the_function_cannot_take_are_refused_before_admission() -> None:
    breaker = CircuitBreaker(label="bind")
    breaker.force_open()  # admission would reject: the TypeError must come first

    @breaker
    def f(a: int, b: int = 2, *, c: int) -> int:
        return a + b + c

    for args, kwargs in [((), {"c": 1}), ((1, 2, 3), {"c": 1}), ((1,), {}), ((1,), {"a": 1, "c": 1}),
                         ((1,), {"c": 1, "d": 2})]:
        with pytest.raises(TypeError):
            f(*args, **kwargs)
    with pytest.raises(CircuitOpen):
        f(1, c=3)


def test_a_wrapper_keeps_the_defaults_it_was_decorated_with() -> None:
    breaker = CircuitBreaker(label="defaults")

    @breaker
    def f(a: int = 1) -> int:
        return a

    f.__wrapped__.__defaults__ = (5,)  # type: ignore[attr-defined]
    assert f() == 1  # the decoration-time default, as the generated wrapper has it
    assert f(2) == 2


# ------------------------------------------------------------------ tracebacks

def _raiser(message: str) -> None:
    raise Boom(message)


async def _araiser(message: str) -> None:
    await asyncio.sleep(0)
    raise Boom(message)


def _assert_raised_by_the_operation(error: BaseException) -> None:
    text = "".join(traceback.format_exception(error))
    assert "raise Boom(message)" in text, text
    assert traceback.extract_tb(error.__traceback__)[-1].name in ("_raiser", "_araiser")


async def test_tracebacks_keep_the_operations_frame_on_every_path() -> None:
    breaker = CircuitBreaker(label="tb")
    for attempt in (
        lambda: breaker.call(_raiser, "x"),
        lambda: breaker(_raiser)("x"),
    ):
        with pytest.raises(Boom) as caught:
            attempt()
        _assert_raised_by_the_operation(caught.value)
    for awaitable in (lambda: breaker.execute(_araiser, "x"), lambda: breaker(_araiser)("x")):
        with pytest.raises(Boom) as caught:
            await awaitable()
        _assert_raised_by_the_operation(caught.value)
    assert breaker.snapshot.failures == 4


def test_the_operations_exception_object_propagates_unchanged() -> None:
    breaker = CircuitBreaker(label="same")
    error = Boom("mine")

    def op() -> None:
        raise error

    with pytest.raises(Boom) as caught:
        breaker.call(op)
    assert caught.value is error and error.__context__ is None and error.__cause__ is None


# ------------------------------------------------------------------ the execute() awaitable

def test_execute_returns_a_coroutine_asyncio_accepts() -> None:
    breaker = CircuitBreaker(label="aio")

    async def double(x: int) -> int:
        await asyncio.sleep(0)
        return 2 * x

    awaitable = breaker.execute(double, 21)
    assert isinstance(awaitable, collections.abc.Coroutine) and asyncio.iscoroutine(awaitable)
    assert asyncio.run(awaitable) == 42

    async def main() -> list[int]:
        task = asyncio.create_task(breaker.execute(double, 1))
        future = asyncio.ensure_future(breaker.execute(double, x=2))
        rest = await asyncio.gather(*(breaker.execute(double, i) for i in range(3, 203)))
        return [await task, await future, *rest]

    assert asyncio.run(main()) == [2 * i for i in range(1, 203)]
    assert breaker.snapshot.calls == 203


def test_nothing_happens_before_the_first_send() -> None:
    breaker = CircuitBreaker(label="lazy", window=CountWindow(2), minimum_calls=1)
    ran: list[int] = []

    async def op() -> int:
        ran.append(1)
        return 1

    breaker.force_open()
    awaitable = breaker.execute(op)  # no CircuitOpen yet
    breaker.force_closed()
    assert drive(awaitable) == 1 and ran == [1]  # admitted at the first send, when closed again

    breaker.force_open()
    pending = breaker.execute(op)
    with pytest.raises(CircuitOpen):
        pending.send(None)
    assert ran == [1]
    with pytest.raises(RuntimeError, match="cannot reuse already awaited coroutine"):
        pending.send(None)


def test_an_awaitable_dropped_before_its_first_send_admitted_nothing_and_warns() -> None:
    breaker = CircuitBreaker(label="dropped", window=CountWindow(2), minimum_calls=1)
    with pytest.warns(RuntimeWarning, match="coroutine '.*execute' was never awaited"):
        breaker.execute(_async_one)
        gc.collect()
    closed = breaker.execute(_async_one)
    closed.close()  # closing one that never started admits nothing and does not warn
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        del closed
        gc.collect()
    assert breaker.snapshot.calls == 0


def test_send_before_the_start_and_reuse_raise_as_for_a_coroutine() -> None:
    breaker = CircuitBreaker(label="reuse")
    awaitable = breaker.execute(_async_one)
    with pytest.raises(TypeError, match="can't send non-None value to a just-started coroutine"):
        awaitable.send(1)
    assert drive(awaitable) == 1
    with pytest.raises(RuntimeError, match="cannot reuse already awaited coroutine"):
        awaitable.send(None)
    with pytest.raises(RuntimeError, match="cannot reuse already awaited coroutine"):
        awaitable.throw(Boom("late"))
    assert awaitable.close() is None


def _suspended(breaker: CircuitBreaker, log: list[str]) -> Coroutine[Any, Any, Any]:
    async def op() -> Any:
        try:
            return await Suspend()
        except Boom:
            log.append("caught")
            return "recovered"
        finally:
            log.append("finally")

    awaitable = breaker.execute(op)
    assert awaitable.send(None) is None  # suspended at Suspend's yield
    return awaitable


def test_close_mid_flight_closes_the_operation_and_ignores_the_call(sink: RecordingSink) -> None:
    breaker = CircuitBreaker(label="close", window=CountWindow(2), minimum_calls=1)
    log: list[str] = []
    awaitable = _suspended(breaker, log)
    assert awaitable.close() is None
    assert log == ["finally"]
    assert [e.attributes["reason"] for e in sink.of("breaker.ignored")] == ["cancelled"]
    assert breaker.snapshot.calls == 0
    with pytest.raises(RuntimeError, match="cannot reuse"):
        awaitable.send(None)


def test_throw_generator_exit_mid_flight_settles_like_close(sink: RecordingSink) -> None:
    breaker = CircuitBreaker(label="genexit", window=CountWindow(2), minimum_calls=1)
    log: list[str] = []
    awaitable = _suspended(breaker, log)
    with pytest.raises(GeneratorExit):
        awaitable.throw(GeneratorExit)
    assert log == ["finally"]
    assert [e.attributes["reason"] for e in sink.of("breaker.ignored")] == ["cancelled"]


def test_throw_mid_flight_reaches_the_operation_which_may_recover() -> None:
    breaker = CircuitBreaker(label="throw", window=CountWindow(4), minimum_calls=1)
    log: list[str] = []
    with pytest.raises(StopIteration) as done:
        _suspended(breaker, log).throw(Boom("x"))
    assert done.value.value == "recovered" and log == ["caught", "finally"]
    assert (breaker.snapshot.calls, breaker.snapshot.failures) == (1, 0)

    async def plain() -> Any:
        return await Suspend()

    awaitable = breaker.execute(plain)
    awaitable.send(None)
    error = ValueError("thrown")
    with pytest.raises(ValueError) as caught:
        awaitable.throw(error)
    assert caught.value is error
    assert (breaker.snapshot.calls, breaker.snapshot.failures) == (2, 1)


def test_an_awaitable_dropped_mid_flight_is_closed_like_a_coroutine(sink: RecordingSink) -> None:
    breaker = CircuitBreaker(label="drop-mid", window=CountWindow(2), minimum_calls=1)
    log: list[str] = []
    awaitable = _suspended(breaker, log)
    del awaitable
    gc.collect()
    assert log == ["finally"]
    assert [e.attributes["reason"] for e in sink.of("breaker.ignored")] == ["cancelled"]


def test_a_cancelled_task_is_not_counted() -> None:
    breaker = CircuitBreaker(label="cancel", window=CountWindow(2), minimum_calls=1)

    async def main() -> None:
        started = asyncio.Event()

        async def hang() -> None:
            started.set()
            await asyncio.sleep(3600)

        task = asyncio.create_task(breaker.execute(hang))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert breaker.snapshot.calls == 0


def test_awaiting_what_is_not_awaitable_is_a_type_error_never_counted() -> None:
    # (Pinned "counted" for the retired compiled path; CircuitBreaker.execute's docstring says
    # a result that cannot be awaited is a TypeError never counted, as for generators.)
    breaker = CircuitBreaker(label="not-awaitable", window=CountWindow(4), minimum_calls=1)
    with pytest.raises(TypeError, match="cannot be awaited"):
        drive(breaker.execute(lambda: 1))  # type: ignore[arg-type, return-value]
    assert breaker.snapshot.calls == 0


# ------------------------------------------------------------------ probes and clocks

async def test_a_half_open_probe_through_execute_closes_the_breaker(clock: VirtualClock, sink: RecordingSink) -> None:
    breaker = CircuitBreaker(label="probe", window=CountWindow(2), minimum_calls=2,
                             open_duration=OpenDuration.fixed(1.0, jitter=0.0))

    async def fail() -> None:
        raise Boom("down")

    for _ in range(2):
        with pytest.raises(Boom):
            await breaker.execute(fail)
    with pytest.raises(CircuitOpen):
        await breaker.execute(_async_one)
    await clock.advance(1.0)
    assert await breaker.execute(_async_one) == 1
    assert breaker.state.value == "closed"
    assert sink.names[-3:] == ["breaker.half_open", "breaker.recorded", "breaker.closed"]


def test_a_custom_clock_is_read_for_every_call_and_judges_slow_calls() -> None:
    clock = StepClock()
    breaker = CircuitBreaker(label="custom", window=CountWindow(10), minimum_calls=1, slow_call_duration=1.0,
                             slow_call_rate_threshold=1.0, clock=clock)  # type: ignore[arg-type]

    def take(ns: int) -> str:
        clock.t += ns
        return "done"

    for _ in range(3):
        assert breaker.call(take, 1_000) == "done"
    assert breaker(take)(2_000_000_000) == "done"  # slow: settled under the lock
    assert drive(breaker.execute(_async_one)) == 1
    snap = breaker.snapshot
    assert (snap.calls, snap.slow_calls) == (5, 1)


def test_clock_readings_outside_int64_take_the_general_path() -> None:
    class FarClock(StepClock):
        def __init__(self) -> None:
            super().__init__()
            self.t = 2**70

    breaker = CircuitBreaker(label="far", window=CountWindow(10), minimum_calls=1, clock=FarClock())  # type: ignore[arg-type]
    for _ in range(5):
        assert breaker.call(lambda: 7) == 7
        assert drive(breaker.execute(_async_one)) == 1
    assert breaker.snapshot.calls == 10


@pytest.mark.parametrize("window", [TimeWindow(60.0), CountWindow(200)], ids=["time", "count"])
def test_a_clock_far_in_the_future_judges_every_quick_success(window: TimeWindow | CountWindow) -> None:
    # 5e9 s (~158 years, past 2**62 ns) is a valid VirtualClock start: the quick successes the
    # lock-free path counted must still be folded in before a failure is judged.
    breaker = CircuitBreaker(label="far-future", window=window, minimum_calls=10, clock=VirtualClock(start=5e9))
    for _ in range(100):
        breaker.call(lambda: None)

    def fail() -> None:
        raise Boom("down")

    for _ in range(10):
        with pytest.raises(Boom):
            breaker.call(fail)
    snap = breaker.snapshot
    assert snap.state.value == "closed"  # 10 failures in 110 calls
    assert (snap.calls, snap.failures) == (110, 10)


def test_a_huge_slow_call_duration_is_refused_at_construction_by_name() -> None:
    with pytest.raises(ValueError, match="slow_call_duration must be at most"):
        CircuitBreaker(label="huge", slow_call_duration=1e30)
    breaker = CircuitBreaker(label="long", slow_call_duration=1e12)  # MAX_SECONDS: the top of the range
    assert breaker.call(lambda: 1) == 1


# ------------------------------------------------------------------ threads

def test_threads_hammering_call_are_all_counted_exactly() -> None:
    # Every thread starts with successes and one call in 7 fails: the rate stays far below 1.0.
    breaker = CircuitBreaker(label="threads", window=TimeWindow(3600.0), minimum_calls=10, failure_rate_threshold=1.0)
    threads, per_thread = 16, 4_000
    barrier = threading.Barrier(threads)

    def op(i: int) -> int:
        if i % 7 == 3:
            raise Boom(str(i))
        return i

    wrapped = breaker(op)

    def worker() -> None:
        barrier.wait()
        for i in range(per_thread):
            call = functools.partial(breaker.call, op) if i % 2 else wrapped
            try:
                assert call(i) == i
            except Boom:
                pass

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    snap = breaker.snapshot
    assert snap.calls == threads * per_thread
    assert snap.failures == threads * len(range(3, per_thread, 7))


# ------------------------------------------------------------------ what the success path hands back

def test_an_async_function_on_the_sync_paths_is_refused_and_never_counted() -> None:
    breaker = CircuitBreaker(label="refuse", window=CountWindow(4), minimum_calls=1)
    for attempt in (lambda: breaker.call(_async_one), lambda: breaker(lambda: _async_one())()):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the coroutine was closed: no "never awaited"
            with pytest.raises(TypeError, match="returned a coroutine") as caught:
                attempt()
            gc.collect()
        assert type(caught.value.__cause__).__name__ == "Defect"
    assert breaker.snapshot.calls == 0


async def test_a_passed_deadline_refuses_the_sync_and_async_paths_before_admission(sink: RecordingSink) -> None:
    import stoic

    breaker = CircuitBreaker(label="late")
    ran: list[int] = []
    wrapped = breaker(lambda: ran.append(1))
    async with stoic.timeout(0):
        for attempt in (lambda: breaker.call(ran.append, 1), wrapped):
            with pytest.raises(stoic.DeadlineExceeded):
                attempt()
        with pytest.raises(stoic.DeadlineExceeded):
            await breaker.execute(_async_one)
    assert ran == [] and breaker.snapshot.calls == 0
    assert [e.attributes["reason"] for e in sink.of("breaker.rejected")] == ["deadline_exceeded"] * 3


def test_a_record_when_that_raises_leaves_the_operations_exception_in_charge(sink: RecordingSink) -> None:
    def broken(error: Exception) -> bool:
        raise RuntimeError("bug in record_when")

    breaker = CircuitBreaker(label="broken", record_when=broken)
    with pytest.warns(RuntimeWarning, match="record_when"), pytest.raises(Boom) as raised:
        breaker.call(_raiser, "x")
    assert any("bug in record_when" in note for note in raised.value.__notes__)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # reported once per callback, not per call
        with pytest.raises(Boom):
            drive(breaker.execute(_araiser_now, "x"))
    assert breaker.snapshot.failures == 2  # judged conservatively: counted


async def _araiser_now(message: str) -> None:
    raise Boom(message)


def test_the_awaitable_of_execute_or_an_async_wrapper_is_refused_by_the_sync_paths() -> None:
    breaker, other = CircuitBreaker(label="outer"), CircuitBreaker(label="inner")
    awrapped = other(_async_one)
    for attempt in (lambda: breaker.call(other.execute, _async_one), lambda: breaker.call(awrapped),
                    lambda: breaker(lambda: awrapped())()):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # closed, not left "never awaited"
            with pytest.raises(TypeError, match="returned a coroutine"):
                attempt()
            gc.collect()
    assert breaker.snapshot.calls == 0 and other.snapshot.calls == 0


def test_a_stop_iteration_leaving_the_awaitable_fails_as_it_would_leave_a_plain_coroutine() -> None:
    breaker = CircuitBreaker(label="stop", window=CountWindow(4), minimum_calls=1)

    async def plain() -> Any:
        return await Suspend()

    class NoThrow:
        def __await__(self) -> Any:
            return iter([None])  # an iterator without throw(): thrown errors land at the await

    async def reference() -> Any:
        return await NoThrow()

    # What a plain coroutine suspended there does. 3.11: the StopIteration propagates from the
    # await and leaves as PEP 479's RuntimeError. 3.12 and later: the await takes it for the
    # iterator's end and completes with its value. The breaker must do as the coroutine does,
    # counting a failure in the first case and a success in the second.
    plain_run = reference()
    plain_run.send(None)
    with pytest.raises(BaseException) as plain_caught:
        plain_run.throw(StopIteration(5))
    expected = type(plain_caught.value)
    assert expected is (RuntimeError if sys.version_info < (3, 12) else StopIteration)

    awaitable = breaker.execute(NoThrow)  # type: ignore[arg-type]
    awaitable.send(None)
    with pytest.raises(expected) as caught:
        awaitable.throw(StopIteration(5))
    if expected is RuntimeError:
        assert "coroutine raised StopIteration" in str(caught.value)
        assert isinstance(caught.value.__cause__, StopIteration)
        assert breaker.snapshot.failures == 1  # (a StopIteration is an Exception: counted)
    else:
        assert caught.value.value == 5 == plain_caught.value.value  # type: ignore[attr-defined]
        assert (breaker.snapshot.calls, breaker.snapshot.failures) == (1, 0)
    resumed = CircuitBreaker(label="stop-2").execute(plain)  # (the failure above opened the first one)
    resumed.send(None)
    with pytest.raises(StopIteration) as done:
        resumed.send((1, 2))  # a tuple result is returned whole, not unpacked
    assert done.value.value == (1, 2)


_MODULE_BREAKER = CircuitBreaker(label="module-level")


@_MODULE_BREAKER
def _module_level(x: int) -> int:
    return x


@_MODULE_BREAKER
async def _module_level_async(x: int) -> int:
    return x


def test_wrappers_are_pickled_and_copied_by_reference_like_functions() -> None:
    import copy
    import pickle

    for wrapped in (_module_level, _module_level_async):
        assert pickle.loads(pickle.dumps(wrapped)) is wrapped
        assert copy.copy(wrapped) is wrapped and copy.deepcopy(wrapped) is wrapped


# ------------------------------------------------------------------ memory of an unused breaker

def test_an_unused_breaker_allocates_only_itself_and_its_lock() -> None:
    CircuitBreaker(label="warm")  # (interns the call-site string of this line's neighbour)
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        breakers = [CircuitBreaker(label="lazy") for _ in range(1000)]
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    per_breaker = sum(stat.size_diff for stat in after.compare_to(before, "filename")) / 1000
    assert per_breaker <= 600  # issue 10: a default breaker in at most 600 bytes
    breaker = breakers[0]
    assert (breaker._window, breaker._episode, breaker._streams, breaker._epoch, breaker._recorder) == (
        None, None, None, None, None)
    breaker.call(lambda: 1)  # the first call makes the epoch and the window
    assert breaker._epoch is not None and breaker._window is not None
    assert breaker.snapshot.calls == 1
