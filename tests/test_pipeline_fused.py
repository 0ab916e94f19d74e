"""A Pipeline runs adjacent CircuitBreaker, RateLimiter and Bulkhead stages fused in one
coroutine (stoic.pipeline._runs): it must do exactly what the same stages nested by hand do.

Each scenario runs twice on virtual time, once through ``Pipeline(...)`` and once through the
nested chain ``a.execute(b.execute, c.execute, fn)`` on twin stages: the callers' outcomes,
every event (name, label, instant, attributes) and the stages' final state must be equal."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import stoic
from stoic import (
    AdaptiveBulkhead,
    Bulkhead,
    CircuitBreaker,
    CountWindow,
    OpenDuration,
    Pipeline,
    RateLimiter,
    Retrying,
    Schedule,
)
from stoic.testing import RecordingSink, VirtualClock

KINDS = ("breaker", "limiter", "bulkhead")


def _make(kind: str, index: int, clock: VirtualClock) -> Any:
    label = f"{kind}{index}"
    if kind == "breaker":
        return CircuitBreaker(label=label, window=CountWindow(6), minimum_calls=3, failure_rate_threshold=0.5,
                              slow_call_duration=0.5, slow_call_rate_threshold=0.5,
                              open_duration=OpenDuration.fixed(1.5, jitter=0.0), clock=clock)
    if kind == "limiter":
        return RateLimiter(20, 1.0, burst=5, queue_limit=4, label=label, clock=clock)
    return Bulkhead(2, queue_limit=1, label=label, clock=clock)


def _state(stage: Any) -> object:
    if isinstance(stage, CircuitBreaker):
        snap = stage.snapshot
        return (snap.state, snap.calls, snap.failures, snap.slow_calls, snap.trips, snap.retry_after)
    if isinstance(stage, RateLimiter):
        return (stage.available_permits, stage.waiter_count)
    return (stage.in_use, stage.queued)


# One caller: (start delay, operation duration, fails, cancelled by its caller after, or None).
CALLER = st.tuples(st.sampled_from([0.0, 0.05, 0.2, 0.6]), st.sampled_from([0.0, 0.1, 0.7, 2.0]),
                   st.booleans(), st.sampled_from([None, None, 0.05, 0.3]))


def _run(kinds: tuple[str, ...], callers: list[tuple[float, float, bool, float | None]], fused: bool,
         with_sink: bool) -> tuple[list[str], list[tuple[object, ...]], list[object]]:
    clock = VirtualClock()
    stages = [_make(kind, index, clock) for index, kind in enumerate(kinds)]
    if fused:
        pipeline = Pipeline(*stages)
        assert len(pipeline._runs) == 1  # (really fused)
        run: Callable[[Callable[[], Awaitable[Any]]], Awaitable[Any]] = pipeline.execute
    else:
        def run(fn: Callable[[], Awaitable[Any]]) -> Awaitable[Any]:
            return stages[0].execute(*(stage.execute for stage in stages[1:]), fn)  # type: ignore[no-any-return]
    sink = RecordingSink()
    outcomes: list[str] = []

    async def caller(start: float, duration: float, fails: bool, cancel_after: float | None) -> str:
        await clock.sleep(start)

        async def op() -> str:
            await clock.sleep(duration)
            if fails:
                raise ConnectionError("down")
            return "ok"

        task = asyncio.ensure_future(run(op))
        if cancel_after is not None:
            clock.call_at(clock.now_ns() + round(cancel_after * 1e9), task.cancel)
        try:
            return await task
        except asyncio.CancelledError:
            return "cancelled"
        except Exception as error:
            return type(error).__name__

    async def main() -> None:
        outcomes.extend(await asyncio.gather(*(caller(*spec) for spec in callers)))

    if with_sink:
        with stoic.use_sinks(sink):
            asyncio.run(clock.run(main()))
    else:
        asyncio.run(clock.run(main()))
    events = [(e.name, e.label, e.level, e.time_ns, tuple(sorted(e.attributes.items()))) for e in sink.events]
    return outcomes, events, [_state(stage) for stage in stages]


def test_the_scenarios_reach_every_refusal_and_cancellation() -> None:
    # (So the property above compares real refusals, waits and cancellations, not only successes.)
    callers = ([(0.0, 0.0, True, None)] * 2 + [(0.0, 0.7, False, None)] * 2 + [(0.05, 0.1, True, None)] * 3
               + [(0.05, 2.0, False, 0.3)] * 2 + [(0.2, 0.0, False, None)] * 6 + [(0.6, 0.0, False, None)])
    seen = _run(("breaker", "limiter", "bulkhead"), callers, True, True)
    assert {"ok", "ConnectionError", "cancelled", "BulkheadFull", "CircuitOpen"} <= set(seen[0])
    assert {"breaker.opened", "ratelimiter.waited", "bulkhead.rejected"} <= {name for name, *_ in seen[1]}
    assert seen == _run(("breaker", "limiter", "bulkhead"), callers, False, True)
    flood = [(0.0, 0.1, False, None)] * 12
    seen = _run(("limiter", "breaker"), flood, True, True)
    assert {"ok", "RateLimited"} <= set(seen[0])
    assert seen == _run(("limiter", "breaker"), flood, False, True)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kinds=st.lists(st.sampled_from(KINDS), min_size=2, max_size=4).map(tuple),
       callers=st.lists(CALLER, min_size=1, max_size=12), with_sink=st.booleans())
def test_fused_stages_do_exactly_what_the_nested_stages_do(
        kinds: tuple[str, ...], callers: list[tuple[float, float, bool, float | None]], with_sink: bool) -> None:
    assert _run(kinds, callers, True, with_sink) == _run(kinds, callers, False, with_sink)


def test_the_recommended_stack_fuses_everything_after_retrying() -> None:
    retrying = Retrying(Schedule.fixed(0.1).attempts(3), label="r")
    breaker, limiter, bulkhead = CircuitBreaker(label="b"), RateLimiter(10, label="l"), Bulkhead(4, label="k")
    pipeline = Pipeline(retrying, breaker, limiter, bulkhead)
    assert len(pipeline._runs) == 2
    assert pipeline._runs[0] == retrying.execute
    assert pipeline.stages == (retrying, breaker, limiter, bulkhead)


def test_other_stages_and_subclasses_run_their_own_execute() -> None:
    class Mine(CircuitBreaker):
        pass

    adaptive = AdaptiveBulkhead(latency_threshold=0.1, max_concurrent=4, label="a")
    breaker, limiter, bulkhead = CircuitBreaker(label="b"), RateLimiter(10, label="l"), Bulkhead(4, label="k")
    # An adaptive bulkhead between them splits the group; a lone fusable stage is not fused.
    runs = Pipeline(breaker, adaptive, limiter, bulkhead)._runs
    assert len(runs) == 3 and runs[0] == breaker.execute and runs[1] == adaptive.execute
    mine = Mine(label="m")
    assert Pipeline(mine, bulkhead)._runs == (mine.execute, bulkhead.execute)


async def test_a_fused_pipeline_refuses_and_releases_like_its_stages(clock: VirtualClock) -> None:
    breaker = CircuitBreaker(label="b", window=CountWindow(4), minimum_calls=2, clock=clock)
    bulkhead = Bulkhead(1, label="k", clock=clock)
    pipeline = Pipeline(breaker, RateLimiter(100, label="l", clock=clock), bulkhead)

    async def fails() -> None:
        raise ConnectionError("down")

    for _ in range(2):
        with pytest.raises(ConnectionError):
            await pipeline.execute(fails)
    assert bulkhead.in_use == 0  # released however the call ended
    with pytest.raises(stoic.CircuitOpen):
        await pipeline.execute(fails)


def test_fused_equals_nested_with_keywords_a_repeated_stage_a_deadline_and_metrics_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # What the property above leaves out: keyword arguments, two stages of one kind (one object
    # twice is refused: tests/test_pipeline.py), an ambient deadline, and the metrics the stages
    # record (the breaker's locked path on every call).
    from stoic import _metrics

    monkeypatch.setattr(_metrics.state, "enabled", True)

    def run(fused: bool) -> tuple[object, ...]:
        clock = VirtualClock()
        breaker, inner_breaker = _make("breaker", 0, clock), _make("breaker", 3, clock)
        limiter, bulkhead = _make("limiter", 1, clock), _make("bulkhead", 2, clock)
        stages = (breaker, limiter, inner_breaker, bulkhead)
        if fused:
            execute: Callable[..., Awaitable[Any]] = Pipeline(*stages).execute
        else:
            def execute(fn: Callable[..., Awaitable[Any]], /, *args: Any, **kwargs: Any) -> Awaitable[Any]:
                return breaker.execute(limiter.execute, inner_breaker.execute, bulkhead.execute, fn, *args, **kwargs)
        sink = RecordingSink()

        async def op(x: int, *, fn: int, fails: bool) -> tuple[int, int]:
            await clock.sleep(0.2)
            if fails:
                raise ConnectionError("down")
            return x, fn

        async def one(n: int) -> object:
            try:
                async with stoic.timeout(0.3 if n % 3 else 5.0, clock=clock):
                    await clock.sleep(0.1 * (n % 4))
                    return await execute(op, n, fn=-n, fails=n % 5 == 0)
            except Exception as error:
                return type(error).__name__

        async def main() -> list[object]:
            return list(await asyncio.gather(*(one(n) for n in range(16))))

        with stoic.use_sinks(sink):
            outcomes = asyncio.run(clock.run(main()))
        recorded = []
        for stage in stages:
            recorder = getattr(stage, "_recorder", None) or getattr(stage, "_rec", None)
            recorded.append(None if recorder is None else (
                dict(recorder.counters),
                {key: (h.count, h.sum_ns, list(h.counts)) for key, h in recorder.histograms.items()}))
        events = [(e.name, e.label, e.time_ns, tuple(sorted(e.attributes.items()))) for e in sink.events]
        return outcomes, events, recorded, [_state(stage) for stage in stages]

    fused = run(True)
    assert {"DeadlineExceeded", "ConnectionError", "BulkheadFull", "(4, -4)"} <= set(map(str, fused[0]))
    assert fused[2][0] is not None and fused[2][0][1]  # the breaker recorded durations
    assert fused == run(False)
