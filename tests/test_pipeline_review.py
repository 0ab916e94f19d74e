"""A Pipeline against its stages nested by hand with lambdas, across every stage kind.

``Pipeline(s0, s1, ...).execute(op, *args, **kwargs)`` must behave exactly as
``s0.execute(lambda: s1.execute(lambda: ... op(*args, **kwargs)))`` (seed 000, "Pipeline"): the
fused runs (adjacent CircuitBreaker/RateLimiter/Bulkhead), the Retrying runs between them, the
forwarding of keywords and of the innermost Retrying's Attempt. Where tests/test_pipeline_fused.py
compares the fused kinds in the chain form, this one mixes in Retrying (jittered, seeded),
adaptive bulkheads, the throttle, a Keyed family's policy, a caller's own stage, a breaker in
every state (half-open probes included), two stages of one kind in one pipeline and one object
shared by two pipelines (one object twice in one pipeline is refused when it is built:
tests/test_pipeline.py), with every outcome: success, each error kind, an exception group, an
inner cancellation, a BaseException, deadlines around the call and inside the operation, and the
caller cancelled at any moment. Each scenario runs twice on virtual time (fresh twin stages) and
must give the same outcomes, the same Attempts seen by the operation, the same events (name,
label, level, instant, attributes), the same final counts and the same metrics."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import stoic
from stoic import (
    AdaptiveBulkhead,
    AdaptiveThrottle,
    Attempt,
    Bulkhead,
    CircuitBreaker,
    CountWindow,
    GradientBulkhead,
    Keyed,
    OpenDuration,
    Pipeline,
    RateLimiter,
    Retrying,
    Schedule,
    _metrics,
)
from stoic.events import Level
from stoic.testing import RecordingSink, VirtualClock, reset_budgets, seeded


class Interrupt(BaseException):
    """Not an Exception: no stage may count, retry or swallow it."""


class Own:
    """A stage of the caller's own (a Policy in the protocol's shape), logging what passed it."""

    def __init__(self) -> None:
        self.log: list[str] = []

    async def execute(self, fn: Callable[..., Awaitable[Any]], /, *args: Any, **kwargs: Any) -> Any:
        self.log.append(">")
        try:
            return await fn(*args, **kwargs)
        except BaseException as error:
            self.log.append(type(error).__name__)
            raise


KINDS = ("retry", "breaker", "limiter", "throttle", "keyed", "own", "retry_fixed", "breaker_deadline", "limiter_shed",
         "bulkhead", "bulkhead_shed", "adaptive", "gradient")


def _make(kind: str, index: int, clock: VirtualClock) -> Any:
    label = f"{kind}{index}"
    if kind == "retry":
        return Retrying(Schedule.exponential(0.05).jittered().attempts(3), label=label, clock=clock)
    if kind == "retry_fixed":
        return Retrying(Schedule.fixed(0.1).attempts(4), label=label, clock=clock)
    if kind == "breaker":
        return CircuitBreaker(label=label, window=CountWindow(4), minimum_calls=2, slow_call_duration=0.3,
                              slow_call_rate_threshold=0.5, open_duration=OpenDuration.fixed(0.4, jitter=0.0),
                              half_open_probes=2, half_open_timeout=1.0, clock=clock)
    if kind == "breaker_deadline":
        return CircuitBreaker(label=label, window=CountWindow(3), minimum_calls=1,
                              open_duration=OpenDuration.fixed(0.2, jitter=0.0),
                              record_when=lambda e: CircuitBreaker.counts_by_default(e)
                              or isinstance(e, stoic.DeadlineExceeded), clock=clock)
    if kind == "limiter":
        return RateLimiter(10, 1.0, burst=3, queue_limit=2, label=label, clock=clock)
    if kind == "limiter_shed":
        return RateLimiter(10, 1.0, burst=2, queue_limit=0, label=label, clock=clock)
    if kind == "bulkhead":
        return Bulkhead(2, queue_limit=1, label=label, clock=clock)
    if kind == "bulkhead_shed":
        return Bulkhead(1, label=label, clock=clock)
    if kind == "adaptive":
        return AdaptiveBulkhead(latency_threshold=0.2, max_concurrent=3, min_concurrent=1, queue_limit=1,
                                label=label, clock=clock)
    if kind == "gradient":
        return GradientBulkhead(max_concurrent=3, min_concurrent=1, queue_limit=1, label=label, clock=clock)
    if kind == "throttle":
        return AdaptiveThrottle(k=1.5, min_throughput=2, window=2.0, label=label, clock=clock)
    if kind == "keyed":
        return Keyed(CircuitBreaker, label=label, clock=clock, window=CountWindow(4), minimum_calls=2,
                     open_duration=OpenDuration.fixed(0.4, jitter=0.0)).get("k")
    assert kind == "own"
    return Own()


def _state(stage: Any) -> object:
    if isinstance(stage, Own):
        return tuple(stage.log)
    if isinstance(stage, Retrying):
        return round(stage.budget.tokens, 9)
    if isinstance(stage, CircuitBreaker):
        snap = stage.snapshot
        seen: object = (snap.state, snap.calls, snap.failures, snap.slow_calls, snap.trips, snap.retry_after)
    elif isinstance(stage, RateLimiter):
        seen = (stage.available_permits, stage.waiter_count)
    elif isinstance(stage, AdaptiveThrottle):
        seen = stage.probability
    else:
        seen = (stage.in_use, stage.queued, stage.limit)
    recorder = getattr(stage, "_rec", None) or getattr(stage, "_recorder", None)
    if recorder is None:
        return seen
    return (seen, sorted(recorder.counters.items()),
            sorted((key, (h.count, h.sum_ns, list(h.counts))) for key, h in recorder.histograms.items()))


OUTCOMES = ("ok", "ok", "connection", "value", "flaky", "group", "inner_cancel", "rejected", "inner_deadline",
            "attempt_timeout", "interrupt")

# One caller: (start, operation duration, outcome, cancelled by its caller after, deadline around
# the call, the operation declares attempt, keyword arguments named like stage parameters, the
# second pipeline).
Caller = tuple[float, float, str, "float | None", "float | None", bool, bool, bool]
CALLER = st.tuples(st.sampled_from([0.0, 0.0, 0.05, 0.2, 0.5, 1.0]), st.sampled_from([0.0, 0.1, 0.4, 1.5]),
                   st.sampled_from(OUTCOMES), st.sampled_from([None, None, None, 0.0, 0.05, 0.3]),
                   st.sampled_from([None, None, 0.15, 0.6, 3.0]), st.booleans(), st.booleans(), st.booleans())


def _build(spec: tuple[str, ...], clock: VirtualClock) -> list[Any]:
    """One fresh stage per ``spec`` entry, a kind."""
    return [_make(kind, index, clock) for index, kind in enumerate(spec)]


def _run(spec: tuple[str, ...], callers: list[Caller], fused: bool, level: Level, metrics: bool) -> tuple[object, ...]:
    reset_budgets()  # (both runs' Retrying stages are made on one line: one per-call-site budget)
    _metrics.state.enabled = metrics
    clock = VirtualClock()
    stages = _build(spec, clock)
    # The second pipeline shares the first's objects, innermost first, one stage fewer.
    second = list(reversed(stages))[: max(1, len(stages) - 1)]
    pipelines = (Pipeline(*stages), Pipeline(*second))
    sink = RecordingSink(level)

    def nested(chain: list[Any], op: Callable[..., Awaitable[Any]], args: tuple[Any, ...], kwargs: dict[str, Any],
               wants: bool) -> Awaitable[Any]:
        # s0.execute(lambda: s1.execute(lambda: ... op(*args, **kwargs))), the operation handed
        # the outermost Retrying's Attempt (Attempt(1) without one) when it declares attempt: a
        # Retrying further in is handed it, as a retry given attempt= is.
        def level_from(index: int, attempt: Attempt | None) -> Callable[[], Awaitable[Any]]:
            if index == len(chain):
                given = {**kwargs, "attempt": attempt or Attempt(1)} if wants else kwargs
                return lambda: op(*args, **given)
            stage = chain[index]
            if isinstance(stage, Retrying) and wants and attempt is None:
                def attempted(attempt: Attempt) -> Awaitable[Any]:
                    return level_from(index + 1, attempt)()
                return lambda: stage.execute(attempted)
            inner = level_from(index + 1, attempt)
            return lambda: stage.execute(inner)

        return level_from(0, None)()

    async def caller(n: int, start: float, duration: float, outcome: str, cancel_after: float | None,
                     deadline: float | None, wants: bool, keywords: bool, other: bool) -> object:
        await clock.sleep(start)
        attempts: list[int] = []

        async def work(x: int) -> tuple[str, int]:
            if outcome == "attempt_timeout":
                async with stoic.timeout(0.2, clock=clock):
                    await clock.sleep(duration)
                return "ok", x
            await clock.sleep(duration)
            if outcome == "ok" or (outcome == "flaky" and len(attempts) > 1):
                return "ok", x
            raise {"connection": ConnectionError("down"), "value": ValueError("bad"), "flaky": TimeoutError("slow"),
                   "group": ExceptionGroup("g", [ConnectionError("a"), ValueError("b")]),
                   "inner_cancel": asyncio.CancelledError(), "rejected": stoic.RateLimited("deep", label="deep"),
                   "inner_deadline": stoic.DeadlineExceeded("inner", label="inner"),
                   "interrupt": Interrupt()}[outcome]

        async def plain(x: int, *, fn: object = None, self: object = None, stoic_fn: object = None) -> object:
            attempts.append(0)
            return await work(x)

        async def wanting(x: int, *, fn: object = None, attempt: Attempt | None = None) -> object:
            attempts.append(attempt.number if attempt is not None else -1)
            return await work(x)

        op = wanting if wants else plain
        kwargs: dict[str, Any] = ({"fn": n} if wants else {"fn": n, "self": 1, "stoic_fn": 2}) if keywords else {}
        chain = second if other else stages

        async def call() -> object:
            if fused:
                return await pipelines[other].execute(op, n, **kwargs)
            return await nested(chain, op, (n,), kwargs, wants)

        async def bounded() -> object:
            if deadline is None:
                return await call()
            async with stoic.timeout(deadline, clock=clock):
                return await call()

        task = asyncio.ensure_future(bounded())
        if cancel_after is not None:
            clock.call_at(clock.now_ns() + round(cancel_after * 1e9), task.cancel)
        try:
            result = repr(await task)
        except asyncio.CancelledError:
            result = "cancelled"
        except Interrupt:
            result = "Interrupt"
        except Exception as error:
            details = {name: getattr(error, name) for name in ("label", "retry_after", "reason")
                       if hasattr(error, name)}
            result = f"{type(error).__name__}({error}) {details}"
        return result, tuple(attempts)

    async def main() -> list[object]:
        return list(await asyncio.gather(*(caller(n, *spec) for n, spec in enumerate(callers))))

    try:
        with seeded(7), stoic.use_sinks(sink):
            outcomes = asyncio.run(clock.run(main()))
    finally:
        _metrics.state.enabled = False
    events = [(e.name, e.label, e.level, e.time_ns, tuple(sorted((k, repr(v)) for k, v in e.attributes.items())))
              for e in sink.events]
    return outcomes, events, [_state(stage) for stage in stages], clock.now_ns()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=st.lists(st.sampled_from(KINDS), min_size=1, max_size=5).map(tuple),
       callers=st.lists(CALLER, min_size=1, max_size=12),
       level=st.sampled_from([Level.DEBUG, Level.INFO, Level.WARNING]), metrics=st.booleans())
def test_a_pipeline_does_what_its_stages_nested_by_hand_do(
        spec: tuple[str, ...], callers: list[Caller], level: Level, metrics: bool) -> None:
    assert _run(spec, callers, True, level, metrics) == _run(spec, callers, False, level, metrics)


def test_hundreds_of_callers_through_every_kind_and_a_shared_stage() -> None:
    # The recommended order, a caller's own stage splitting the fused run, a second breaker, and
    # 240 contending callers of every outcome (half of them through the second pipeline),
    # arriving over 12 s so that the breaker opens, probes and closes again.
    spec = ("retry", "breaker", "limiter", "own", "breaker", "throttle", "bulkhead", "adaptive")
    callers: list[Caller] = [
        (0.05 * n, (0.0, 0.1, 0.4, 1.5)[n % 4], OUTCOMES[n % len(OUTCOMES)],
         (None, None, 0.0, 0.3)[n % 4 if n % 5 else 0], (None, 0.6, 3.0)[n % 3], n % 2 == 0, n % 3 == 0, n % 4 < 2)
        for n in range(240)]
    fused = _run(spec, callers, True, Level.DEBUG, True)
    seen = {outcome.partition("(")[0] for outcome, _ in fused[0]}  # type: ignore[misc]
    assert {"", "ConnectionError", "ExceptionGroup", "cancelled", "Interrupt", "BulkheadFull", "RateLimited",
            "CircuitOpen", "Throttled", "DeadlineExceeded"} <= seen
    names = {name for name, *_ in fused[1]}  # type: ignore[misc]
    assert {"breaker.opened", "breaker.half_open", "breaker.closed", "retry.attempt_failed", "retry.exhausted",
            "bulkhead.rejected", "ratelimiter.waited", "ratelimiter.rejected", "throttle.rejected",
            "timeout.expired"} <= names
    assert fused == _run(spec, callers, False, Level.DEBUG, True)
