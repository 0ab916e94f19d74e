"""Every public constructor and configuration, fuzzed with hostile values (issue 9, "What a hostile
caller found").

For each constructor, each parameter in turn is given a hostile value (negative, zero, NaN, inf,
huge ints, bools, bytes, None, strings, wrong callables, arbitrary numbers) while the others
keep valid ones. The only acceptable outcomes are: a ``ValueError``/``TypeError`` at
construction whose message names the parameter, or a policy that then works (one call through
it, on a virtual clock, returns). Anything else (an ``AttributeError``, ``OverflowError``, a
bare ``int()`` error, a failure on first use) is a defect.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import stoic
from stoic import OpenDuration, Schedule
from stoic.testing import VirtualClock


class _NotAClock:
    """Has neither now_ns nor sleep."""


HOSTILE: list[object] = [
    -1, 0, -0.0, 0.5, float("nan"), float("inf"), float("-inf"), 10**400, 10**30, -(10**30), 1e300, True, False,
    b"1", None, "", "x", "1", object(), _NotAClock(), [], (), {}, lambda: None, lambda a, b, c: None, 3j,
]

numbers = st.one_of(
    st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(allow_nan=True, allow_infinity=True),
)
hostile = st.one_of(st.sampled_from(HOSTILE), numbers)


@dataclass
class Case:
    """A constructor, valid keyword arguments for it, and one call that exercises what it built."""

    name: str
    build: Callable[..., Any]
    valid: dict[str, Any]
    use: Callable[[Any, VirtualClock], None]
    # Parameters whose error message may name another spelling (e.g. a positional name).
    aliases: dict[str, tuple[str, ...]] = field(default_factory=dict)


async def _ok() -> int:
    return 1


def _run(clock: VirtualClock, make: Callable[[], Any]) -> None:
    """Run the coroutine ``make()`` on a fresh loop with ``clock`` ambient, advancing virtual time."""

    async def main() -> None:
        with stoic.use_clock(clock):
            task = asyncio.ensure_future(make())
            while not task.done():
                await asyncio.sleep(0)
                if not task.done():
                    await clock.advance(1.0)
            task.result()

    asyncio.run(main())


def _use_breaker(breaker: Any, clock: VirtualClock) -> None:
    assert breaker.call(lambda: 1) == 1
    _run(clock, lambda: breaker.execute(_ok))


def _use_executor(policy: Any, clock: VirtualClock) -> None:
    _run(clock, lambda: policy.execute(_ok))


def _use_hedge(hedge: Any, clock: VirtualClock) -> None:
    _run(clock, lambda: hedge.execute(stoic.IDEMPOTENT, _ok))


def _use_blocking(policy: Any, clock: VirtualClock) -> None:
    assert policy.call(lambda: 1) == 1


def _use_schedule(schedule: Any, clock: VirtualClock) -> None:
    bounded = schedule.attempts(3) if not isinstance(schedule, stoic.BoundedSchedule) else schedule
    total = bounded.maximum_total_delay
    assert total is None or (isinstance(total, float) and total >= 0 and not math.isnan(total))
    _run(clock, lambda: stoic.retry(bounded, _ok, label="hostile", clock=clock))


def _use_timeout(made: Any, clock: VirtualClock) -> None:
    async def inside() -> None:
        async with made:
            await asyncio.sleep(0)

    try:
        _run(clock, inside)
    except stoic.DeadlineExceeded:
        pass  # a zero or negative timeout expires at once: what it says


def _use_budget(budget: Any, clock: VirtualClock) -> None:
    _run(clock, lambda: stoic.retry(Schedule.fixed(0).attempts(2), _ok, budget=budget, label="hostile", clock=clock))


def _cases(clock: VirtualClock) -> list[Case]:
    return [
        Case("CircuitBreaker", stoic.CircuitBreaker, dict(
            label="b", window=stoic.TimeWindow(60.0), minimum_calls=10, failure_rate_threshold=0.5,
            slow_call_duration=10.0, slow_call_rate_threshold=1.0, open_duration=OpenDuration.standard,
            half_open_probes=1, half_open_timeout=60.0, record_when=stoic.CircuitBreaker.counts_by_default,
            clock=clock), _use_breaker),
        Case("TimeWindow", lambda **kw: stoic.CircuitBreaker(label="w", window=stoic.TimeWindow(**kw), clock=clock),
             dict(seconds=60.0), _use_breaker),
        Case("CountWindow", lambda **kw: stoic.CircuitBreaker(label="w", window=stoic.CountWindow(**kw),
                                                              minimum_calls=1, clock=clock),
             dict(calls=10), _use_breaker),
        Case("OpenDuration.fixed", lambda **kw: stoic.CircuitBreaker(label="o", open_duration=OpenDuration.fixed(**kw),
                                                                     clock=clock),
             dict(seconds=30.0, jitter=0.2), _use_breaker),
        Case("OpenDuration.exponential",
             lambda **kw: stoic.CircuitBreaker(label="o", open_duration=OpenDuration.exponential(**kw), clock=clock),
             dict(initial=30.0, factor=2.0, maximum=300.0, jitter=0.2, reset_after=300.0), _use_breaker),
        Case("RateLimiter", stoic.RateLimiter, dict(rate=10, per=1.0, burst=10, queue_limit=100, label="l",
                                                    clock=clock), _use_executor),
        Case("BlockingRateLimiter", stoic.BlockingRateLimiter, dict(rate=10, per=1.0, burst=10, queue_limit=100,
                                                                    label="l", clock=clock), _use_blocking),
        Case("Bulkhead", stoic.Bulkhead, dict(max_concurrent=2, queue_limit=0, label="k", clock=clock), _use_executor),
        Case("BlockingBulkhead", stoic.BlockingBulkhead, dict(max_concurrent=2, queue_limit=0, label="k",
                                                              clock=clock), _use_blocking),
        Case("Hedge", stoic.Hedge, dict(delay=0.1, max_attempts=2, label="h", clock=clock), _use_hedge),
        Case("Retrying", stoic.Retrying, dict(schedule=Schedule.fixed(0.1).attempts(3), label="r", clock=clock),
             _use_executor),
        Case("RetryBudget", stoic.RetryBudget, dict(ratio=0.2, reserve_per_second=1.0, reserve_capacity=10,
                                                    clock=clock), _use_budget),
        Case("Schedule.fixed", Schedule.fixed, dict(delay=0.1), _use_schedule),
        Case("Schedule.linear", Schedule.linear, dict(step=0.1), _use_schedule),
        Case("Schedule.exponential", Schedule.exponential, dict(base=0.1, factor=2), _use_schedule),
        Case("Schedule.fibonacci", Schedule.fibonacci, dict(base=0.1), _use_schedule),
        Case("Schedule.decorrelated", Schedule.decorrelated, dict(base=0.1, cap=1.0), _use_schedule),
        Case("Schedule.delays", lambda delays: Schedule.delays([delays]), dict(delays=0.1), _use_schedule),
        Case("Schedule.capped", lambda at: Schedule.exponential(0.1).capped(at), dict(at=1.0), _use_schedule),
        Case("Schedule.jittered", lambda kind: Schedule.exponential(0.1).jittered(kind), dict(kind="full"),
             _use_schedule),
        Case("Schedule.up_to", lambda elapsed: Schedule.exponential(0.1).up_to(elapsed), dict(elapsed=1.0),
             _use_schedule),
        Case("Schedule.attempts", lambda count: Schedule.fixed(0.1).attempts(count), dict(count=3), _use_schedule),
        Case("timeout", stoic.timeout, dict(seconds=1.0, label="t", clock=clock), _use_timeout),
    ]


def _names(case: Case, param: str) -> tuple[str, ...]:
    return (param, *case.aliases.get(param, ()))


@settings(max_examples=1500, deadline=None)
@given(data=st.data())
def test_a_hostile_value_is_refused_naming_the_parameter_or_works(data: st.DataObject) -> None:
    clock = VirtualClock()
    case = data.draw(st.sampled_from(_cases(clock)), label="case")
    param = data.draw(st.sampled_from(sorted(case.valid)), label="param")
    value = data.draw(hostile, label="value")
    kwargs = {**case.valid, param: value}
    try:
        built = case.build(**kwargs)
    except (ValueError, TypeError) as refused:
        message = str(refused)
        assert any(name in message for name in _names(case, param)), (
            f"{case.name}({param}={value!r}) raised {type(refused).__name__} without naming {param!r}: {message}")
        return
    # Accepted: it must then work.
    case.use(built, clock)


def test_a_fraction_refused_for_its_type_or_its_range_names_one_range() -> None:
    # The same parameter, the same allowed range, however the value was wrong.
    messages = []
    for value in ("x", float("nan"), 1.5, -0.5):
        try:
            stoic.CircuitBreaker(failure_rate_threshold=value, label="fraction")  # type: ignore[arg-type]
        except ValueError as exc:
            messages.append(str(exc).split(", got")[0])
    assert messages == ["failure_rate_threshold must be a number in (0, 1]"] * 2 + [
        "failure_rate_threshold must be in (0, 1]"] * 2
