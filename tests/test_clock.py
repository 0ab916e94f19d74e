"""VirtualClock (time moves only when a test says so) and the ambient clock."""

from __future__ import annotations

import asyncio
import functools
import subprocess
import sys
import textwrap
import threading
import time
from datetime import timedelta

import pytest

import stoic
from stoic import SYSTEM_CLOCK, Clock, current_clock, use_clock
from stoic._clock import SystemClock, resolve_clock, same_clock, wait_seconds
from stoic.testing import VirtualClock, fail_times, hang, settle

S = 1_000_000_000


def test_the_virtual_clock_starts_where_told_and_is_a_clock():
    assert VirtualClock().now_ns() == 0
    assert VirtualClock(2.5).now() == 2.5
    assert VirtualClock(timedelta(milliseconds=3)).now_ns() == 3_000_000
    assert isinstance(VirtualClock(), Clock) and isinstance(SYSTEM_CLOCK, Clock)
    with pytest.raises(ValueError, match="start"):
        VirtualClock(-1)


async def test_advance_moves_time_exactly_and_rejects_negative():
    clock = VirtualClock()
    await clock.advance(1.5)
    await clock.advance(timedelta(seconds=2))
    assert clock.now_ns() == 3_500_000_000
    await clock.advance(0)
    assert clock.now_ns() == 3_500_000_000
    with pytest.raises(ValueError, match="seconds"):
        await clock.advance(-0.1)
    await clock.advance_to(10.0)
    assert clock.now() == 10.0
    await clock.advance_to(5.0)  # already past: no-op, time never goes back
    assert clock.now() == 10.0


async def test_advance_to_lands_exactly_on_the_instant_and_fires_its_timer() -> None:
    # It went there through a float number of seconds (target - now) / 1e9, converted back to
    # ns: for instants past about 10**6 s it stopped 1 ns short of round(instant * 1e9) about
    # one time in ten, so a timer (a deadline(instant)) set at that instant did not fire.
    import random

    draw = random.Random(7)
    for _ in range(400):
        clock = VirtualClock()
        await clock.advance(draw.random() * 1000)
        instant = clock.now() + draw.random() * 1e7
        fired: list[int] = []
        clock.call_at(round(instant * 1e9), functools.partial(lambda seen, at: seen.append(at()), fired, clock.now_ns))
        await clock.advance_to(instant)
        assert clock.now_ns() == round(instant * 1e9) and fired == [clock.now_ns()]


async def test_advance_to_refuses_what_is_not_an_instant_as_deadline_does() -> None:
    # It raised whatever its arithmetic did: a ValueError "cannot convert float NaN to integer",
    # an OverflowError for inf, 1e300 or 10**400, a TypeError about multiplying a sequence.
    clock = VirtualClock()
    for bad in (float("nan"), float("inf"), float("-inf"), 1e300, 10**400):
        with pytest.raises(ValueError, match="instant must be a finite number of seconds"):
            await clock.advance_to(bad)
        with pytest.raises(ValueError, match="instant must be a finite number of seconds"):
            stoic.deadline(bad, clock=clock)
    for wrong in ("5", None, True):
        with pytest.raises(TypeError, match="instant must be seconds"):
            await clock.advance_to(wrong)  # type: ignore[arg-type]
    assert clock.now_ns() == 0


async def test_timers_fire_in_instant_order_then_registration_order_at_their_own_instant():
    clock = VirtualClock()
    fired: list[tuple[str, int]] = []
    for name, when in (("c", 3), ("a", 1), ("b1", 2), ("b2", 2), ("late", 10)):
        clock.call_at(when * S, lambda name=name: fired.append((name, clock.now_ns())))
    assert clock.pending_timers == 5
    await clock.advance(5)
    assert fired == [("a", 1 * S), ("b1", 2 * S), ("b2", 2 * S), ("c", 3 * S)]
    assert clock.pending_timers == 1
    assert clock.now_ns() == 5 * S
    assert clock.next_timer_ns() == 10 * S


async def test_a_cancelled_timer_never_fires():
    clock = VirtualClock()
    fired: list[int] = []
    handle = clock.call_at(S, lambda: fired.append(1))
    handle.cancel()
    assert clock.pending_timers == 0
    await clock.advance(2)
    assert fired == []
    assert clock.next_timer_ns() is None


async def test_a_due_timer_runs_soon_without_moving_time():
    clock = VirtualClock(5)
    fired: list[int] = []
    clock.call_at(S, lambda: fired.append(clock.now_ns()))
    await settle()
    assert fired == [5 * S]


@pytest.mark.parametrize("clock", [VirtualClock(), SYSTEM_CLOCK], ids=["virtual", "system"])
async def test_a_timer_runs_in_the_context_it_was_set_in_not_that_of_whoever_moves_time(clock: Clock) -> None:
    # As loop.call_at does: a copy of the scheduling context, so a deadline's or a hedge's events
    # reach the sinks in scope where it was set. Both clocks keep the rule.
    import contextvars

    where: contextvars.ContextVar[str] = contextvars.ContextVar("where", default="unset")
    seen: list[str] = []
    done = asyncio.Event()

    def fire() -> None:
        seen.append(where.get())
        where.set("changed by the callback")  # (in its copy: the setter's context keeps its value)
        done.set()

    def schedule() -> None:
        where.set("set by the scheduler")
        clock.call_at(clock.now_ns() + 1_000_000, fire)

    contextvars.copy_context().run(schedule)
    where.set("the advancer's")
    if isinstance(clock, VirtualClock):
        await clock.advance(0.001)
    await asyncio.wait_for(done.wait(), 5)
    assert seen == ["set by the scheduler"]
    assert where.get() == "the advancer's"


@pytest.mark.parametrize("clock", [VirtualClock(), SYSTEM_CLOCK], ids=["virtual", "system"])
@pytest.mark.parametrize("due", [False, True], ids=["later", "already-due"])
async def test_a_raising_timer_is_reported_to_the_loop_and_the_others_still_fire(clock: Clock, due: bool) -> None:
    # Seen failing before the fix (virtual): the callback's error escaped advance() (or the
    # loop callback running the due timers), so time stopped at its instant, the timers after
    # it never fired, and the test saw an error from an unrelated callback. The real loop,
    # which the virtual clock stands in for, reports it to its exception handler and goes on:
    # both clocks keep that rule, with the same context keys.
    loop = asyncio.get_running_loop()
    reported: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    fired: list[str] = []
    error = KeyError("boom")

    def boom() -> None:
        fired.append("boom")
        raise error

    try:
        base = clock.now_ns() - (1_000_000 if due else 0)  # (already due: set in the past)
        clock.call_at(base + 1_000_000, lambda: fired.append("first"))
        handle = clock.call_at(base + 2_000_000, boom)
        clock.call_at(base + 3_000_000, lambda: fired.append("last"))
        if isinstance(clock, VirtualClock):
            start = clock.now_ns()
            await clock.advance(0.005)  # (raised here before the fix)
            assert clock.now_ns() == start + 5_000_000  # all the way: not stopped at boom's instant
        else:
            for _ in range(500):
                if len(fired) == 3:
                    break
                await asyncio.sleep(0.002)
        await settle()
    finally:
        loop.set_exception_handler(None)
    assert fired == ["first", "boom", "last"]
    assert len(reported) == 1
    context = reported[0]
    assert context["exception"] is error and context["handle"] is handle
    assert isinstance(context["message"], str) and context["message"].startswith("Exception in callback")


async def test_sleepers_wake_at_their_instant_and_can_sleep_again_within_one_advance():
    clock = VirtualClock()
    woke: list[tuple[str, float]] = []

    async def sleeper(name: str, first: float, second: float) -> None:
        await clock.sleep_until(round(first * S))
        woke.append((name, clock.now()))
        await clock.sleep_until(round(second * S))
        woke.append((name, clock.now()))

    tasks = [asyncio.create_task(sleeper("x", 1, 4)), asyncio.create_task(sleeper("y", 2, 3))]
    await clock.advance(10)
    assert woke == [("x", 1.0), ("y", 2.0), ("y", 3.0), ("x", 4.0)]
    assert all(t.done() for t in tasks)
    assert clock.now() == 10.0


async def test_a_cancelled_sleep_leaves_no_timer_behind():
    clock = VirtualClock()
    task = asyncio.create_task(clock.sleep_until(5 * S))
    await settle()
    assert clock.pending_timers == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert clock.pending_timers == 0


async def test_sleeping_until_a_past_instant_returns_at_once():
    clock = VirtualClock(3)
    await clock.sleep_until(1 * S)
    assert clock.now() == 3.0 and clock.pending_timers == 0


async def test_run_until_idle_jumps_from_timer_to_timer_and_reports_elapsed():
    clock = VirtualClock()
    woke: list[float] = []

    async def chain() -> None:
        for delay in (1, 2, 3):
            await clock.sleep_until(clock.now_ns() + delay * S)
            woke.append(clock.now())

    task = asyncio.create_task(chain())
    assert await clock.run_until_idle() == 6.0
    assert woke == [1.0, 3.0, 6.0] and task.done()


async def test_run_until_idle_stops_at_its_limit_against_a_timer_that_rearms_forever():
    clock = VirtualClock()

    def rearm() -> None:
        clock.call_at(clock.now_ns() + S, rearm)

    clock.call_at(S, rearm)
    elapsed = await clock.run_until_idle(limit=30)
    assert elapsed == 30.0
    assert clock.pending_timers == 1


async def test_run_returns_the_result_or_raises_the_error_on_virtual_time():
    clock = VirtualClock()

    async def slow(value: int) -> int:
        await clock.sleep_until(clock.now_ns() + 3600 * S)
        return value

    async def failing() -> None:
        await clock.sleep_until(clock.now_ns() + S)
        raise KeyError("boom")

    started = time.monotonic()
    assert await clock.run(slow(7)) == 7
    assert clock.now() == 3600.0
    with pytest.raises(KeyError):
        await clock.run(failing())
    assert time.monotonic() - started < 5  # an hour of virtual time, no real waiting


async def test_run_fails_loudly_when_the_task_can_never_finish():
    clock = VirtualClock()
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    with pytest.raises(RuntimeError, match="blocked"):
        await clock.run(never)
    assert never.cancelled()

    async def too_slow() -> None:
        await clock.sleep_until(clock.now_ns() + 100 * S)

    with pytest.raises(RuntimeError):
        await clock.run(too_slow(), limit=10)


async def test_cancelling_run_cancels_the_task_it_runs():
    clock = VirtualClock()
    ticks: list[float] = []

    async def forever() -> None:
        while True:
            await clock.sleep(1)
            ticks.append(clock.now())

    outer = asyncio.create_task(clock.run(forever(), limit=10**6))
    await asyncio.sleep(0.01)  # real time: run() is jumping from tick to tick
    outer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await outer
    await settle()
    assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []
    assert clock.pending_timers == 0
    seen = len(ticks)
    await clock.advance(10)
    assert len(ticks) == seen  # nothing of it runs on after the test has gone on

    # Nor does a refused limit start the awaitable it was given.
    started: list[int] = []

    async def record() -> None:
        started.append(1)

    coro = record()
    with pytest.raises(ValueError, match="limit"):
        await clock.run(coro, limit=-1)
    coro.close()
    await settle()
    assert started == []


async def test_a_blocking_sleeper_thread_is_released_when_virtual_time_passes():
    clock = VirtualClock()
    woke = threading.Event()

    def blocked() -> None:
        clock.sleep_until_blocking(2 * S)
        woke.set()

    thread = threading.Thread(target=blocked)
    thread.start()
    await clock.advance(1)
    assert not woke.wait(0.05)
    await clock.advance(1)
    assert await asyncio.to_thread(woke.wait, 5)
    thread.join(5)


async def test_a_blocking_sleep_that_no_one_could_end_fails_instead_of_hanging() -> None:
    clock = VirtualClock(1)
    clock.sleep_until_blocking(S)  # already reached: returns at once, anywhere
    # On the loop's thread: the loop that would advance the clock is the one blocked.
    with pytest.raises(RuntimeError, match="event loop's thread"):
        clock.sleep_until_blocking(2 * S)
    # Sync code on virtual time with no other thread (a sync test calling retry_sync).
    code = textwrap.dedent("""
        import stoic
        from stoic import Schedule
        from stoic.testing import VirtualClock, fail_times
        op = fail_times(1, then="ok")
        try:
            stoic.retry_sync(Schedule.fixed(1).attempts(2), op.sync, label="x", clock=VirtualClock())
        except RuntimeError as error:
            print(error)
    """)
    done = await asyncio.to_thread(subprocess.run, [sys.executable, "-c", code], capture_output=True, text=True,
                                   timeout=60)
    assert "no other thread to move time" in done.stdout, done.stderr


def test_a_sleep_left_on_a_closed_loop_does_not_break_the_next_loops_advance() -> None:
    # One clock shared by two tests, each on its own loop; the first closed its loop with a
    # sleeper still pending. Moving time past it in the second must not raise "Event loop is
    # closed" from the first test's leftovers.
    clock = VirtualClock()
    first = asyncio.new_event_loop()

    async def leave_a_sleeper() -> None:
        asyncio.get_running_loop().create_task(clock.sleep(5))
        await asyncio.sleep(0)

    first.run_until_complete(leave_a_sleeper())
    first.close()

    async def second() -> float:
        await clock.advance(10)
        return clock.now()

    assert asyncio.run(second()) == 10.0


def test_use_clock_sets_the_ambient_clock_for_the_block_only():
    virtual = VirtualClock()
    assert current_clock() is SYSTEM_CLOCK
    with use_clock(virtual) as installed:
        assert installed is virtual
        assert current_clock() is virtual
        with use_clock(SYSTEM_CLOCK):
            assert current_clock() is SYSTEM_CLOCK
        assert current_clock() is virtual
    assert current_clock() is SYSTEM_CLOCK
    assert stoic.current_clock is current_clock


def test_the_clock_fixture_is_ambient(clock):
    assert current_clock() is clock


async def test_the_system_clock_is_monotonic_nanoseconds_and_sleeps_on_the_loop():
    a = SYSTEM_CLOCK.now_ns()
    b = SYSTEM_CLOCK.now_ns()
    assert isinstance(a, int) and b >= a
    assert abs(SYSTEM_CLOCK.now() - time.monotonic()) < 1
    await SYSTEM_CLOCK.sleep_until(SYSTEM_CLOCK.now_ns() - S)  # past: no wait
    SYSTEM_CLOCK.sleep_until_blocking(SYSTEM_CLOCK.now_ns() - S)
    fired = asyncio.Event()
    SYSTEM_CLOCK.call_at(SYSTEM_CLOCK.now_ns(), fired.set)
    await asyncio.wait_for(fired.wait(), 5)
    assert repr(SYSTEM_CLOCK) == "SystemClock()"


_FIRST_CLOCK_SCRIPT = """
import asyncio
import stoic
from stoic import _clock
from stoic.testing import VirtualClock

assert stoic.current_clock() is _clock.SYSTEM_CLOCK and not _clock.ever_set
calls = []

async def once():
    calls.append(1)
    if len(calls) == 1:
        raise ConnectionError
    return "ok"

virtual = VirtualClock()
with stoic.use_clock(virtual):  # the process's first ambient clock
    result = asyncio.run(virtual.run(stoic.retry(stoic.Schedule.delays([1.5]), once, label="once")))
    print(_clock.ever_set, stoic.current_clock() is virtual, result, virtual.now())
print(stoic.current_clock() is _clock.SYSTEM_CLOCK)
"""


def test_the_first_ambient_clock_of_a_process_is_the_one_policies_use():
    # current_clock() and the retry functions skip the context variable until use_clock() has
    # been entered once in the process (_clock.ever_set); in a fresh interpreter the very first
    # use_clock must still be seen: the retry's backoff runs on the virtual clock.
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _FIRST_CLOCK_SCRIPT], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    assert out.split() == ["True", "True", "ok", "1.5", "True"]


async def test_virtual_sleep_takes_seconds_beside_sleep_until():
    clock = VirtualClock(start=10.0)
    woke: list[float] = []

    async def sleeper(seconds: float | timedelta) -> None:
        await clock.sleep(seconds)
        woke.append(clock.now())

    tasks = [asyncio.create_task(sleeper(1.5)), asyncio.create_task(sleeper(timedelta(seconds=0.5)))]
    await clock.advance(2)
    await asyncio.gather(*tasks)
    assert woke == [10.5, 11.5]
    await clock.sleep(0)  # yields once, time does not move
    assert clock.now() == 12.0
    with pytest.raises(ValueError, match="seconds must be >= 0"):
        await clock.sleep(-1)


class _NoSleep:
    def now_ns(self) -> int:
        return 0


@pytest.mark.parametrize("bad", [object(), 3, "clock", _NoSleep(), time.monotonic_ns])
def test_a_clock_without_the_clock_methods_is_a_type_error_naming_clock(bad: object) -> None:
    with pytest.raises(TypeError, match=r"clock must be a stoic.Clock"):
        resolve_clock(bad)


@pytest.mark.parametrize("bad", [object(), 3, "clock", _NoSleep(), time.monotonic_ns])
def test_use_clock_refuses_what_is_not_a_clock_as_clock_does(bad: object) -> None:
    """The ambient clock is the other way a clock reaches a policy: a wrong object is refused
    where it is given (as ``clock=`` is), not as an ``AttributeError`` from the first policy
    built under it (or from its first call, for a bulkhead), and the ambient clock is unchanged."""
    before = stoic.current_clock()
    with pytest.raises(TypeError, match=r"clock must be a stoic.Clock"), use_clock(bad):  # type: ignore[arg-type]
        pytest.fail("the block ran under a clock that is none")
    assert stoic.current_clock() is before
    virtual = VirtualClock()
    with use_clock(virtual) as given:
        assert given is virtual
        assert stoic.Bulkhead(1, label="b")._clock is virtual


def test_resolve_clock_keeps_a_clock_and_defaults_to_the_ambient_one() -> None:
    virtual = VirtualClock()
    assert resolve_clock(virtual) is virtual
    assert resolve_clock(None) is stoic.current_clock()
    with stoic.use_clock(virtual):
        assert resolve_clock(None) is virtual
    assert same_clock(SystemClock(), SystemClock())
    assert not same_clock(virtual, VirtualClock())


def test_a_threading_wait_is_capped_where_threading_accepts_it() -> None:
    assert wait_seconds(1_500_000_000) == 1.5
    assert wait_seconds(10**21) <= threading.TIMEOUT_MAX
    cond = threading.Condition()
    with cond:
        # The capped value is a legal wait (a second thread ends it at once).
        threading.Timer(0.01, lambda: (cond.acquire(), cond.notify(), cond.release())).start()
        cond.wait(wait_seconds(10**21))


def test_the_system_clocks_blocking_sleep_never_overflows(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    now = [0]

    def fake_sleep(seconds: float) -> None:
        if seconds > threading.TIMEOUT_MAX:
            raise OverflowError("too large")
        slept.append(seconds)
        now[0] += round(seconds * 1e9)

    monkeypatch.setattr(time, "sleep", fake_sleep)
    monkeypatch.setattr(time, "monotonic_ns", lambda: now[0])
    SystemClock().sleep_until_blocking(10**19 * 3)  # 30 billion seconds
    assert len(slept) >= 4 and max(slept) <= threading.TIMEOUT_MAX
    assert now[0] >= 10**19 * 3


def test_a_cancelled_virtual_timer_lets_go_of_its_callback() -> None:
    """As asyncio's TimerHandle.cancel does: a cancelled timer (a hedge's delay after the first
    attempt won, a sleep cut short) must not keep what its callback holds alive until the clock
    reaches its instant (field report 22: dropped policies must be collectable)."""
    import gc
    import weakref

    class Owner:
        def fire(self) -> None:
            raise AssertionError("a cancelled timer fired")

    clock = VirtualClock()
    owner = Owner()
    handle = clock.call_at(10**15, owner.fire)
    alive = weakref.ref(owner)
    del owner
    handle.cancel()
    gc.collect()
    assert alive() is None
    assert clock.pending_timers == 0


async def test_a_hedge_whose_delay_timer_was_cancelled_is_collectable() -> None:
    import gc
    import weakref

    clock = VirtualClock()

    async def quick() -> int:
        return 1

    hedge = stoic.Hedge(10.0, label="gone", clock=clock)
    assert await hedge.execute(stoic.IDEMPOTENT, quick) == 1  # the first attempt won: no hedge was due
    alive = weakref.ref(hedge)
    del hedge
    gc.collect()
    assert alive() is None


# --- stoic.testing's fault helpers on virtual time ---


async def test_fail_times_fails_the_first_calls_to_start_even_when_they_overlap(clock: VirtualClock) -> None:
    # Each call takes 1 s, so the two overlap; it is the first to start that must fail. Counted
    # at the end instead, both saw two calls begun and neither failed.
    op = fail_times(1, ConnectionError, then="ok", takes=1)

    async def call() -> object:
        try:
            return await op()
        except ConnectionError as error:
            return error

    first, second = await clock.run(asyncio.gather(call(), call()))
    assert op.raised == [first] and second == "ok"


class _HTTPError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Coded(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(f"code {code}")
        self.code = code


class _WithResponse(Exception):
    def __init__(self, message: str, *, response: str) -> None:
        super().__init__(message)
        self.response = response


@pytest.mark.parametrize("error", [_HTTPError(503, "unavailable"), _Coded(5), _WithResponse("bad", response="r"),
                                   ConnectionError(111, "refused")])
def test_an_exception_instance_is_raised_as_a_copy_with_its_args_and_attributes(error: Exception) -> None:
    # copy.copy rebuilds an exception as type(e)(*e.args): a TypeError for the first and third,
    # and "code code 5" for the second.
    op = fail_times(2, error)
    for _ in range(2):
        with pytest.raises(type(error)) as caught:
            op.sync()
        assert caught.value is not error and caught.value.args == error.args
        assert vars(caught.value) == vars(error) and str(caught.value) == str(error)
    assert op.sync() is None


def test_the_plain_form_of_hang_never_returns() -> None:
    # Seen failing before the fix: hang().sync() returned None at once, a success, so a blocking
    # policy under test saw a quick good call where the test meant one that never finishes.
    clock = VirtualClock()
    op = hang()
    returned: list[object] = []

    def call() -> None:
        with use_clock(clock):
            returned.append(op.sync())

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    while clock._blocked == {} and not clock._cond._waiters and caller.is_alive():  # type: ignore[attr-defined]
        time.sleep(0.001)
    clock._set_now(100 * 365 * 86_400 * S)  # a century of virtual time later: still running
    caller.join(0.05)
    assert caller.is_alive() and returned == [] and op.calls == 1
    clock._set_now(2**63 - 1)  # (the end of time lets the thread go)
    caller.join(5)


async def test_a_policys_timed_wait_that_no_one_could_end_fails_instead_of_hanging() -> None:
    # Seen failing before the fix (the child timed out): a blocking limiter's or bulkhead's wait
    # on virtual time, with no other thread to move time or hand over a slot, waited for ever,
    # where a blocking sleep (retry_sync) refuses the same endless wait with RuntimeError.
    code = textwrap.dedent("""
        from stoic import BlockingBulkhead, BlockingRateLimiter
        from stoic.testing import VirtualClock
        limiter = BlockingRateLimiter(1, label="x", clock=VirtualClock())
        bulkhead = BlockingBulkhead(1, queue_limit=1, label="y", clock=VirtualClock())
        limiter.acquire()
        bulkhead.acquire()
        for wait in (lambda: limiter.acquire(timeout=5), lambda: bulkhead.acquire(timeout=5)):
            try:
                wait()
            except RuntimeError as error:
                print(error)
        print("at rest", limiter.waiter_count, bulkhead.queued_count, bulkhead.active_count)
    """)
    done = await asyncio.to_thread(subprocess.run, [sys.executable, "-c", code], capture_output=True, text=True,
                                   timeout=30)
    assert done.stdout.count("no other thread to move time") == 2, done.stderr
    assert "at rest 0 0 1" in done.stdout


@pytest.mark.parametrize("failures", [-1, 1.5, True, "2"])
def test_fail_times_refuses_a_count_that_is_not_a_whole_number_naming_it(failures: object) -> None:
    # Only a negative count was refused: fail_times(1.5) failed once, fail_times(True) once.
    with pytest.raises(ValueError, match="failures must be"):
        fail_times(failures)  # type: ignore[arg-type]
