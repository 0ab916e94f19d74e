"""The adaptive bulkheads on virtual time: the moving limit, what is a sample, shrinking without
eviction, configuration, pipeline use (seed 003, "Adaptive (AIMD)", "Gradient")."""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import stoic
from stoic import AdaptiveBulkhead, Bulkhead, BulkheadFull, CircuitBreaker, GradientBulkhead, Pipeline, Rejected
from stoic.testing import RecordingSink, VirtualClock, seeded, settle


def aimd(clock: VirtualClock, **kwargs: object) -> AdaptiveBulkhead:
    options: dict[str, object] = {"latency_threshold": 0.1, "max_concurrent": 10, "min_concurrent": 2,
                                  "queue_limit": 100, "label": "dep", "clock": clock}
    options.update(kwargs)
    return AdaptiveBulkhead(**options)  # type: ignore[arg-type]


async def sleeper(clock: VirtualClock, seconds: float) -> float:
    await clock.sleep_until(clock.now_ns() + round(seconds * 1e9))
    return seconds


# --- configuration ---


@pytest.mark.parametrize(("kwargs", "parameter"), [
    ({"min_concurrent": 11}, "min_concurrent"),
    ({"min_concurrent": 0}, "min_concurrent"),
    ({"max_concurrent": 10**400}, "max_concurrent"),
    ({"max_concurrent": 2**53 + 1}, "max_concurrent"),
    ({"backoff_ratio": 1.0}, "backoff_ratio"),
    ({"backoff_ratio": 0.0}, "backoff_ratio"),
    ({"cooldown": 0}, "cooldown"),
    ({"cooldown": -1.0}, "cooldown"),
    ({"latency_quantile": 1.0}, "latency_quantile"),
    ({"latency_quantile": 0.0}, "latency_quantile"),
    ({"latency_threshold": 0}, "latency_threshold"),
    ({"increase_step": 0}, "increase_step"),
    ({"increase_step": 10**400}, "increase_step"),  # an int beyond any float: not an OverflowError
    ({"increase_step": float("inf")}, "increase_step"),  # (the limit would leap to the ceiling)
    ({"queue_limit": 0, "queue_target": 0.01}, "queue_target"),
    ({"queue_limit": 0, "prioritized": True}, "prioritized"),
    ({"queue_limit": 0, "queue_adaptive_lifo": True}, "queue_adaptive_lifo"),
    ({"queue_target": 0.2, "queue_interval": 0.1}, "queue_interval"),
    ({"queue_target": 0.1, "queue_interval": 0.1}, "queue_interval"),
    ({"queue_interval": 0}, "queue_interval"),
    ({"label": ""}, "label"),
])
def test_aimd_bad_input_names_the_parameter(kwargs: dict[str, object], parameter: str) -> None:
    with pytest.raises(ValueError, match=parameter):
        aimd(VirtualClock(), **kwargs)


@pytest.mark.parametrize(("kwargs", "parameter"), [
    ({"min_concurrent": 11}, "min_concurrent"),
    ({"min_concurrent": 0}, "min_concurrent"),
    ({"max_concurrent": 10**400}, "max_concurrent"),
    ({"rtt_tolerance": 0.99}, "rtt_tolerance"),
    ({"smoothing": 0.0}, "smoothing"),
    ({"smoothing": 1.01}, "smoothing"),
    ({"long_window": 0}, "long_window"),
    ({"long_window": 10**400}, "long_window"),  # accepted, it raised OverflowError from the 11th window on
    ({"headroom": -1.0}, "headroom"),
    ({"headroom": float("inf")}, "headroom"),
    ({"headroom": 10**400}, "headroom"),
    ({"rtt_tolerance": float("inf")}, "rtt_tolerance"),
    ({"rtt_tolerance": 10**400}, "rtt_tolerance"),
    ({"queue_limit": 0, "queue_target": 0.01}, "queue_target"),
])
def test_gradient_bad_input_names_the_parameter(kwargs: dict[str, object], parameter: str) -> None:
    options: dict[str, object] = {"max_concurrent": 10, "queue_limit": 5, "label": "g"}
    options.update(kwargs)
    with pytest.raises(ValueError, match=parameter):
        GradientBulkhead(**options)  # type: ignore[arg-type]


def test_clock_must_be_a_clock() -> None:
    with pytest.raises(TypeError, match="clock"):
        AdaptiveBulkhead(latency_threshold=0.1, max_concurrent=4, label="x", clock=object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="clock"):
        stoic.AdaptiveThrottle(label="x", clock=3)  # type: ignore[arg-type]


def test_label_is_required_and_must_be_a_str() -> None:
    with pytest.raises(TypeError):
        AdaptiveBulkhead(latency_threshold=0.1, max_concurrent=4)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="label"):
        GradientBulkhead(max_concurrent=4, label=3)  # type: ignore[arg-type]


def test_defaults_and_read_only_state() -> None:
    bulkhead = AdaptiveBulkhead(latency_threshold=0.1, max_concurrent=8, label="d")
    assert (bulkhead.limit, bulkhead.max_concurrent, bulkhead.min_concurrent) == (8, 8, 1)
    assert (bulkhead.in_use, bulkhead.queued, bulkhead.queue_limit) == (0, 0, 0)
    gradient = GradientBulkhead(max_concurrent=8, label="g")
    assert gradient.limit == 8 and gradient._algorithm.rtt_tolerance == 1.5  # type: ignore[union-attr]
    assert "limit=8" in repr(gradient)


# --- the moving limit ---


async def test_a_slow_completion_backs_off_and_emits_limit_changed(clock: VirtualClock, sink: RecordingSink):
    bulkhead = aimd(clock)
    task = asyncio.ensure_future(bulkhead.execute(sleeper, clock, 0.5))
    await clock.advance(0.5)
    await task
    assert bulkhead.limit == 9
    changed = sink.of("bulkhead.limit_changed")
    assert [dict(e.attributes) for e in changed][-1] == {"old": 10, "new": 9, "cause": "backoff"}


async def test_shrinking_never_evicts_in_flight_work_and_gates_admission(clock: VirtualClock):
    bulkhead = aimd(clock, backoff_ratio=0.5, cooldown=10.0)
    release = asyncio.Event()

    async def held() -> None:
        await release.wait()

    slow = [asyncio.ensure_future(bulkhead.execute(sleeper, clock, 1.0)) for _ in range(2)]
    fast = [asyncio.ensure_future(bulkhead.execute(held)) for _ in range(8)]
    await settle()
    assert bulkhead.in_use == 10
    await clock.advance(1.0)
    await asyncio.gather(*slow)
    assert bulkhead.limit == 5 and bulkhead.in_use == 8  # nothing evicted
    late = [asyncio.ensure_future(bulkhead.execute(held)) for _ in range(3)]
    await settle()
    assert bulkhead.queued == 3  # in_use 8 > limit 5: newcomers wait
    release.set()
    await asyncio.gather(*fast, *late)
    assert bulkhead.in_use == 0 and bulkhead.queued == 0


async def test_growth_hands_the_new_slots_to_waiters(clock: VirtualClock):
    bulkhead = aimd(clock, max_concurrent=4, min_concurrent=1, increase_step=4.0)
    bulkhead._algorithm._set(2.0, "test")  # type: ignore[union-attr]
    bulkhead._max = 2
    release = asyncio.Event()

    async def held() -> None:
        await release.wait()

    running = [asyncio.ensure_future(bulkhead.execute(sleeper, clock, 0.01)) for _ in range(2)]
    queued = [asyncio.ensure_future(bulkhead.execute(held)) for _ in range(3)]
    await settle()
    assert bulkhead.queued == 3
    await clock.advance(0.01)
    await settle()
    # Two in-budget completions: 2 + 4/2 = 4, then 4 + 4/4 -> capped at 4; all three waiters run.
    assert bulkhead.limit == 4 and bulkhead.in_use == 3 and bulkhead.queued == 0
    release.set()
    await asyncio.gather(*running, *queued)


async def test_fast_failures_and_cancellations_are_not_samples_but_timeouts_are(clock: VirtualClock):
    bulkhead = aimd(clock, cooldown=0.001)

    async def fail_slowly() -> None:
        await sleeper(clock, 1.0)
        raise ConnectionError("slow failure")

    task = asyncio.ensure_future(bulkhead.execute(fail_slowly))
    await clock.advance(1.0)
    with pytest.raises(ConnectionError):
        await task
    assert bulkhead.limit == 10  # an error, however slow, is the breaker's business

    task = asyncio.ensure_future(bulkhead.execute(sleeper, clock, 5.0))
    await settle()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert bulkhead.limit == 10 and bulkhead.in_use == 0

    async def timed() -> None:
        async with stoic.timeout(0.05):
            await bulkhead.execute(sleeper, clock, 5.0)

    task = asyncio.ensure_future(timed())
    await clock.advance(0.05)
    with pytest.raises(stoic.DeadlineExceeded):
        await task
    assert bulkhead.limit == 9  # cut short by a deadline: a drop, 50 ms notwithstanding

    async def raise_timeout() -> None:
        raise TimeoutError

    await clock.advance(0.01)
    with pytest.raises(TimeoutError):
        await bulkhead.execute(raise_timeout)
    assert bulkhead.limit == 8


async def test_gradient_bulkhead_shrinks_under_queueing_latency(clock: VirtualClock, sink: RecordingSink):
    bulkhead = GradientBulkhead(max_concurrent=40, min_concurrent=2, queue_limit=1000, label="g", clock=clock)

    async def dependency() -> None:
        # Latency rises with concurrency beyond 10 (a capacity knee).
        load = bulkhead.in_use
        await sleeper(clock, 0.01 * max(1.0, load / 10))

    async def client() -> None:
        for _ in range(60):
            await bulkhead.execute(dependency)

    # Establish the long RTT at low load (more than the ten plainly averaged windows), then overload.
    for _ in range(250):
        await asyncio.gather(*(asyncio.ensure_future(bulkhead.execute(dependency)) for _ in range(5)),
                             clock.advance(0.05))
    tasks = [asyncio.ensure_future(client()) for _ in range(40)]
    await clock.run(asyncio.gather(*tasks))
    assert bulkhead.limit < 40
    assert {e.attributes["cause"] for e in sink.of("bulkhead.limit_changed")} & {"gradient"}


async def test_async_with_is_refused_because_each_call_is_measured(clock: VirtualClock):
    bulkhead = aimd(clock)
    with pytest.raises(TypeError, match="execute"):
        async with bulkhead:
            pass


async def test_decorator_and_pipeline_stage_with_flat_errors_the_breaker_ignores(clock: VirtualClock):
    bulkhead = aimd(clock, max_concurrent=2, min_concurrent=1, queue_limit=0)
    breaker = CircuitBreaker(label="b", clock=clock)
    pipeline = Pipeline(breaker, bulkhead)

    @bulkhead
    async def decorated() -> int:
        return 7

    assert await decorated() == 7
    release = asyncio.Event()

    async def held() -> None:
        await release.wait()

    tasks = [asyncio.ensure_future(pipeline.execute(held)) for _ in range(2)]
    await settle()
    for _ in range(50):
        with pytest.raises(BulkheadFull) as info:
            await pipeline.execute(held)
        assert isinstance(info.value, Rejected) and type(info.value) is BulkheadFull  # flat, not wrapped
    assert breaker.state.value == "closed"
    release.set()
    await asyncio.gather(*tasks)


# --- property: the limit holds at admission ---


def watched(bulkhead: AdaptiveBulkhead | GradientBulkhead, violations: list[str]) -> None:
    """Check every admission: a slot taken (``_active`` grows) or handed over (a release that
    leaves ``_active`` unchanged) only while in use stays within the limit in force then; and
    the limit within [min, max] after every sample."""
    managed = bulkhead._managed
    assert managed is not None
    base = type(managed)

    class WatchedQueue(base):  # type: ignore[valid-type,misc]
        __slots__ = ()

        def release(self, b: Bulkhead) -> None:
            before = b._active
            super().release(b)
            if b._active == before and b._active > b._max:
                violations.append(f"handed over at {before} in use, limit {b._max}")

        def fill(self, b: Bulkhead) -> None:
            super().fill(b)
            if b._active > b._max:
                violations.append(f"filled to {b._active}, limit {b._max}")

    managed.__class__ = WatchedQueue
    algorithm = bulkhead._algorithm

    class WatchedLimit(type(algorithm)):  # type: ignore[misc]
        __slots__ = ()

        def sample(self, *args: object) -> object:  # type: ignore[override]
            change = super().sample(*args)  # type: ignore[arg-type]
            if not self.minimum <= self.limit <= self.maximum:
                violations.append(f"limit {self.limit} outside [{self.minimum}, {self.maximum}]")
            return change

    algorithm.__class__ = WatchedLimit


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from(["aimd", "aimd_q", "gradient"]), st.booleans())
def test_in_flight_never_exceeds_the_limit_under_random_completions_and_cancellations(seed, kind, managed):
    rng = random.Random(seed)
    clock = VirtualClock()
    queue: dict[str, object] = (
        {"queue_target": 0.02, "queue_adaptive_lifo": True, "prioritized": True} if managed else {})
    bulkhead: AdaptiveBulkhead | GradientBulkhead
    if kind == "gradient":
        bulkhead = GradientBulkhead(max_concurrent=20, min_concurrent=2, queue_limit=50, label="p", clock=clock,
                                    **queue)  # type: ignore[arg-type]
        bulkhead._algorithm.window_ns = 50_000_000  # type: ignore[union-attr]  # many updates per run
    else:
        bulkhead = AdaptiveBulkhead(latency_threshold=0.05, max_concurrent=20, min_concurrent=2, queue_limit=50,
                                    cooldown=0.05, latency_quantile=0.9 if kind == "aimd_q" else None,
                                    label="p", clock=clock, **queue)  # type: ignore[arg-type]
    violations: list[str] = []
    watched(bulkhead, violations)
    in_op = [0]

    async def op(seconds: float) -> None:
        in_op[0] += 1
        try:
            if in_op[0] > bulkhead._active:
                violations.append("more operations running than slots taken")
            await sleeper(clock, seconds)
        finally:
            in_op[0] -= 1

    async def main() -> None:
        tasks: list[asyncio.Future[None]] = []
        for _ in range(300):
            with stoic.bind_criticality(rng.choice(list(stoic.Criticality))):
                tasks.append(asyncio.ensure_future(bulkhead.execute(op, rng.choice([0.001, 0.01, 0.1, 0.3]))))
            if rng.random() < 0.2:
                await clock.advance(rng.random() * 0.05)
            if rng.random() < 0.15:
                rng.choice(tasks).cancel()
        while not all(t.done() for t in tasks):
            await clock.advance(0.05)
            if rng.random() < 0.1:
                rng.choice(tasks).cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(main())
    assert not violations, violations[:5]
    assert bulkhead.in_use == 0 and bulkhead.queued == 0 and in_op[0] == 0  # nothing leaked


# --- which calls are timed (stoic.adaptive: one in a stride while calls come fast) ---


def fed(bulkhead: AdaptiveBulkhead | GradientBulkhead) -> list[tuple[int, bool, int]]:
    """Record every sample the bulkhead feeds its algorithm: (latency, dropped, weight)."""
    samples: list[tuple[int, bool, int]] = []
    algorithm = bulkhead._algorithm

    class Recording(type(algorithm)):  # type: ignore[misc]
        __slots__ = ()

        def sample(self, now_ns: int, latency_ns: int, in_flight: int, dropped: bool = False,  # type: ignore[override]
                   weight: int = 1) -> object:
            samples.append((latency_ns, dropped, weight))
            return super().sample(now_ns, latency_ns, in_flight, dropped, weight)

    algorithm.__class__ = Recording
    return samples


async def instant() -> int:
    return 1


async def test_every_call_is_timed_below_20_000_admissions_a_second_bursts_included(clock: VirtualClock):
    bulkhead = GradientBulkhead(max_concurrent=10, label="g", clock=clock)  # (Gradient2 takes every timed sample)
    samples = fed(bulkhead)
    for _ in range(100):
        await bulkhead.execute(instant)
        await clock.advance(0.0001)  # 10,000 a second
    for _ in range(1000):  # a burst: a thousand in one instant is no rate over a millisecond
        await bulkhead.execute(instant)
    assert len(samples) == 1100 and {weight for _, _, weight in samples} == {1}


async def test_fast_calls_are_timed_one_in_a_stride_and_the_weights_count_every_admission(clock: VirtualClock):
    bulkhead = GradientBulkhead(max_concurrent=10, label="g", clock=clock)
    samples = fed(bulkhead)
    with seeded(7):
        for _ in range(20_000):  # a million a second: one timed per 50 us is one in 50
            await clock.advance(0.000001)
            await bulkhead.execute(instant)
    weights = [weight for _, _, weight in samples]
    assert weights[:1000] == [1] * 1000  # the first millisecond: the rate is not known yet
    assert set(weights[1001:]) <= {48, 49, 50, 51}
    assert 1000 + 19_000 / 50 * 0.8 < len(samples) < 1000 + 19_000 / 50 * 1.25
    assert abs(sum(weights) - 20_000) < 0.1 * 20_000  # each stands for its stride: the sum estimates the count
    # The rate falls (one call per ms): within eight strides of calls, every call is timed again.
    before = len(samples)
    for _ in range(600):
        await clock.advance(0.001)
        await bulkhead.execute(instant)
    assert [weight for _, _, weight in samples[-100:]] == [1] * 100
    assert len(samples) - before >= 100


async def test_calls_admitted_after_waiting_or_under_a_deadline_are_always_timed(clock: VirtualClock):
    bulkhead = GradientBulkhead(max_concurrent=2, queue_limit=100, label="g", clock=clock)
    samples = fed(bulkhead)
    for _ in range(100):  # ramp the stride up
        await bulkhead.execute(instant)
    before = len(samples)

    async def brief() -> None:
        await clock.sleep(0.001)

    await clock.run(asyncio.gather(*(bulkhead.execute(brief) for _ in range(30))))  # 28 of them wait
    assert len(samples) - before >= 28
    before = len(samples)
    async with stoic.timeout(10.0, clock=clock):
        for _ in range(20):
            await bulkhead.execute(instant)
    assert len(samples) - before == 20 and all(weight == 1 for _, _, weight in samples[before:])


async def test_an_untimed_timeout_is_still_a_drop(clock: VirtualClock):
    bulkhead = aimd(clock, cooldown=0.001)
    samples = fed(bulkhead)
    with seeded(1):
        while bulkhead._skip == 0:  # fast enough for a stride above 1, until a run is drawn
            await clock.advance(0.000001)
            await bulkhead.execute(instant)
    assert bulkhead._stride > 1  # the next call admitted at once is not timed

    async def times_out() -> None:
        raise TimeoutError

    with pytest.raises(TimeoutError):
        await bulkhead.execute(times_out)
    assert samples[-1] == (-1, True, 1)  # a drop, its latency unknown
    assert bulkhead.limit == 9


async def test_aimd_sampled_growth_follows_the_per_completion_rule_in_expectation(clock: VirtualClock, monkeypatch):
    """The same bursty workload (bursts of 16 calls in one instant: the late calls of a burst are
    the ones with enough in flight to grow the limit) through a bulkhead that times every call
    and through ones that time about one in a stride: on average over seeds the limits grow alike."""
    import stoic.adaptive

    # Sixteen calls per 11 ms is about 1,450 a second: timing one per 10 ms makes a stride of 14.
    monkeypatch.setattr(stoic.adaptive, "TIMED_GAP_NS", 10_000_000)

    async def run(stride: int) -> tuple[float, int]:
        monkeypatch.setattr(stoic.adaptive, "MAX_STRIDE", stride)
        bulkhead = aimd(clock, max_concurrent=200, min_concurrent=1)
        bulkhead._algorithm._set(16.0, "test")  # type: ignore[union-attr]
        bulkhead._max = 16
        samples = fed(bulkhead)
        for _ in range(40):
            await clock.run(asyncio.gather(*(bulkhead.execute(sleeper, clock, 0.001) for _ in range(16))))
            await clock.advance(0.01)
        return bulkhead._algorithm.value, len(samples)

    every, timed_every = await run(1)
    assert every > 20  # it grew
    grown = []
    for seed in range(12):
        with seeded(seed):
            value, timed = await run(64)  # (the rate caps it at 14)
        assert timed < timed_every / 2  # fewer calls timed
        grown.append(value - 16.0)
    mean = sum(grown) / len(grown)
    assert abs(mean - (every - 16.0)) < 0.1 * (every - 16.0), (mean, every - 16.0)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from(["aimd", "gradient"]), st.booleans())
def test_nobody_waits_while_a_slot_is_free_so_the_fast_path_never_passes_a_waiter(seed, kind, managed):
    """The untimed fast path admits on ``in_use < limit`` alone (as the fixed bulkhead does): that
    is only fair if a waiter never sits in the queue while a slot is free, however the limit
    moves (shrinks retire slots, growth fills them), waiters are cancelled or shed."""
    rng = random.Random(seed)
    clock = VirtualClock()
    queue: dict[str, object] = (
        {"queue_target": 0.02, "queue_adaptive_lifo": True, "prioritized": True} if managed else {})
    bulkhead: AdaptiveBulkhead | GradientBulkhead
    if kind == "gradient":
        bulkhead = GradientBulkhead(max_concurrent=12, min_concurrent=1, queue_limit=40, label="p", clock=clock,
                                    **queue)  # type: ignore[arg-type]
        bulkhead._algorithm.window_ns = 20_000_000  # type: ignore[union-attr]
    else:
        bulkhead = AdaptiveBulkhead(latency_threshold=0.02, max_concurrent=12, min_concurrent=1, queue_limit=40,
                                    cooldown=0.02, increase_step=4.0, label="p", clock=clock,
                                    **queue)  # type: ignore[arg-type]
    violations: list[str] = []

    def check(where: str) -> None:
        if bulkhead._waiters and bulkhead._active < bulkhead._max:
            violations.append(f"{where}: {len(bulkhead._waiters)} waiting, {bulkhead._active} in use, "
                              f"limit {bulkhead._max}")

    async def op(seconds: float) -> None:
        check("start")
        await sleeper(clock, seconds)
        check("end")

    async def main() -> None:
        tasks: list[asyncio.Future[None]] = []
        for _ in range(300):
            with seeded(rng.randrange(1000)), stoic.bind_criticality(rng.choice(list(stoic.Criticality))):
                tasks.append(asyncio.ensure_future(bulkhead.execute(op, rng.choice([0.0, 0.001, 0.01, 0.05]))))
            if rng.random() < 0.3:
                await clock.advance(rng.random() * 0.02)
                check("step")
            if rng.random() < 0.1:
                rng.choice(tasks).cancel()
        while not all(t.done() for t in tasks):
            await clock.advance(0.01)
            check("drain")
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(main())
    assert not violations, violations[:5]
    assert bulkhead.in_use == 0 and bulkhead.queued == 0


# --- field report 18: a fan-out's errors arrive as an exception group ---

@pytest.mark.parametrize("kind", ["aimd", "gradient"])
async def test_a_timeout_inside_an_exception_group_is_a_drop_like_a_bare_one(clock: VirtualClock, kind: str):
    bulkhead = aimd(clock, cooldown=0.001) if kind == "aimd" else GradientBulkhead(
        max_concurrent=10, label="g", clock=clock)
    samples = fed(bulkhead)

    async def fan_out_timed_out() -> None:
        raise ExceptionGroup("fan-out", [ValueError("bad row"), ExceptionGroup("inner", [TimeoutError()])])

    async def fan_out_refused() -> None:
        raise ExceptionGroup("fan-out", [stoic.BulkheadFull(label="inner")])

    with pytest.raises(ExceptionGroup):
        await bulkhead.execute(fan_out_timed_out)
    assert samples[-1][1] is True  # a drop, as a bare TimeoutError is
    count = len(samples)
    with pytest.raises(ExceptionGroup):
        await bulkhead.execute(fan_out_refused)
    assert len(samples) == count  # inner rejections only: nothing ran, no sample


async def test_a_waiter_leaving_an_adaptive_bulkhead_reports_its_sojourn_and_tier_without_queue_options(
        clock: VirtualClock, sink: RecordingSink):
    # docs/adaptive.md, "Events and metrics": its queue is always managed (the limit moves), so a
    # waiter that leaves is reported as a managed queue reports one, not as the plain FIFO does.
    bulkhead = aimd(clock, max_concurrent=2, min_concurrent=1, queue_limit=None)
    running = [asyncio.create_task(bulkhead.execute(sleeper, clock, 1.0)) for _ in range(2)]
    waiters = [asyncio.create_task(bulkhead.execute(sleeper, clock, 1.0)) for _ in range(300)]
    await settle()
    await clock.advance(0.25)
    for waiter in waiters:
        waiter.cancel()
    await settle()
    left = sink.of("bulkhead.rejected")
    assert len(left) == 300
    assert all(dict(e.attributes) == {"reason": "cancelled", "capacity": 2, "sojourn": 0.25,
                                      "criticality": "normal"} for e in left)
    assert bulkhead.queued == 0 and bulkhead.in_use == 2
    await clock.run_until_idle()
    await asyncio.gather(*running)
    assert bulkhead.in_use == 0


async def test_a_sink_raising_a_base_exception_on_a_limit_change_keeps_no_slot(clock: VirtualClock):
    # The success path's sample runs after the call: a sink that raises a BaseException there
    # (emit() contains only Exception; pytest's Failed is one) must still give the slot back.
    class Abort(BaseException):
        pass

    class Interrupting:
        level = stoic.Level.DEBUG
        event_names = None

        def emit(self, event: stoic.Event) -> None:
            if event.name == "bulkhead.limit_changed":
                raise Abort

    bulkhead = aimd(clock, max_concurrent=3, min_concurrent=1)
    interrupting = Interrupting()
    stoic.add_sink(interrupting)
    try:
        task = asyncio.ensure_future(bulkhead.execute(sleeper, clock, 0.5))  # slow: backs off
        await clock.advance(0.5)
        with pytest.raises(Abort):
            await task
    finally:
        stoic.remove_sink(interrupting)
    assert bulkhead.limit == 2
    assert bulkhead.active_count == 0
    assert [await bulkhead.execute(sleeper, clock, 0) for _ in range(3)] == [0, 0, 0]
