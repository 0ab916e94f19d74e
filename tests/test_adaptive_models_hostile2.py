"""Reference models, written from the documented rules alone (docs/adaptive.md, docs/throttle.md;
seed 003), that the Gradient2 limit and the adaptive throttle must match step for step:
the throttle's shed probability (the window's formula, the two latest buckets' bound, the cap,
min_throughput, shed calls counted as requests) through live retunes, and every
``throttle.rejected`` event's attributes against the catalog."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import stoic
from stoic import AdaptiveThrottle, ControlPlane, Throttled
from stoic._limits import Gradient2Limit
from stoic.testing import RecordingSink, VirtualClock


class _Gradient2:
    """docs/adaptive.md, "Gradient2", steps 1-5, with fixes (a) and (b)."""

    def __init__(self, maximum: int, minimum: int, tolerance: float, smoothing: float, long_window: int,
                 headroom: float) -> None:
        self.maximum, self.minimum = maximum, minimum
        self.tolerance, self.smoothing, self.long_window, self.headroom = tolerance, smoothing, long_window, headroom
        self.value = float(maximum)
        self.long: float | None = None
        self.windows = 0
        self.window: tuple[int, list[tuple[int, int, bool]]] | None = None

    def sample(self, now: int, latency: int, in_flight: int, dropped: bool) -> None:
        if self.window is None:
            self.window = (now + 1_000_000_000, [])
        end, samples = self.window
        samples.append((latency, in_flight, dropped))
        if now < end or len(samples) < 10:
            return
        self.window = None
        if any(drop for _, _, drop in samples):
            self.value = max(self.minimum, self.value * 0.9)
            return
        short = max(1.0, sum(latency for latency, _, _ in samples) / len(samples))
        self.windows += 1
        if self.long is None:
            self.long = short
        elif self.windows <= 10:
            self.long += (short - self.long) / self.windows
        else:
            self.long += (short - self.long) * 2 / (self.long_window + 1)
        if self.long / short > 2:
            self.long *= 0.95
        if max(in_flight for _, in_flight, _ in samples) < self.value / 2:
            return
        gradient = min(1.0, max(0.5, self.tolerance * self.long / short))
        target = self.value * gradient + (self.headroom if gradient >= 1 else 0.0)
        self.value = min(self.maximum, max(self.minimum, self.value * (1 - self.smoothing) + self.smoothing * target))

    @property
    def limit(self) -> int:
        return max(self.minimum, int(self.value))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 200), st.integers(1, 50), st.floats(1, 3), st.floats(0.01, 1), st.integers(1, 50),
       st.floats(0, 10),
       st.lists(st.tuples(st.integers(0, 400_000_000), st.integers(1, 10**9), st.integers(0, 300),
                          st.booleans()), max_size=300))
def test_gradient2_matches_a_reference_model_of_its_documented_rules(
        maximum: int, minimum: int, tolerance: float, smoothing: float, long_window: int, headroom: float,
        steps: list[tuple[int, int, int, bool]]) -> None:
    minimum = min(minimum, maximum)
    limit = Gradient2Limit(maximum=maximum, minimum=minimum, rtt_tolerance=tolerance, smoothing=smoothing,
                           long_window=long_window, headroom=headroom)
    model = _Gradient2(maximum, minimum, tolerance, smoothing, long_window, headroom)
    now = 0
    for gap, latency, in_flight, dropped in steps:
        now += gap
        change = limit.sample(now, latency, in_flight, dropped)
        before = model.limit
        model.sample(now, latency, in_flight, dropped)
        assert limit.limit == model.limit
        assert abs(limit.value - model.value) <= 1e-9 * max(1.0, model.value)
        assert (change is None) == (before == model.limit)


def _shed_probability(counted: list[tuple[int, bool]], bucket: int, k: float, min_throughput: int,
                      cap: float) -> float:
    """docs/throttle.md, "Algorithm": 12 one-second buckets here (window=12)."""
    held = [accepted for at, accepted in counted if at > bucket - 12]
    requests, accepts = len(held), sum(held)
    if requests < min_throughput:
        return 0.0
    p = (requests - k * accepts) / (requests + 1)
    if p <= 0:
        return 0.0
    recent = [accepted for at, accepted in counted if at >= bucket - 1]
    if len(recent) >= min_throughput and recent:
        p = min(p, max(0.0, (len(recent) - k * sum(recent)) / (len(recent) + 1)))
    return min(p, cap)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(
    st.tuples(st.just("call"), st.sampled_from(["up", "down", "domain"]),
              st.sampled_from([0.0, 0.3, 1.0, 2.5, 13.0])),
    st.tuples(st.just("retune"), st.sampled_from([{"k": 1.0}, {"k": 3.5}, {"min_throughput": 0}, {"min_throughput": 4},
                                                  {"max_probability": 0.5}, {"max_probability": 1.0}]),
              st.just(0.0))), min_size=1, max_size=120))
def test_the_throttle_sheds_with_the_probability_a_reference_model_computes_through_retunes(
        steps: list[tuple[str, Any, float]]) -> None:
    clock = VirtualClock()
    sink = RecordingSink()
    throttle = AdaptiveThrottle(label="model", clock=clock, window=12.0, min_throughput=3)
    control = ControlPlane()
    control.register(throttle, name="model")
    settings_now: dict[str, Any] = {"k": 2.0, "min_throughput": 3, "max_probability": 0.9}
    counted: list[tuple[int, bool]] = []  # (bucket, accepted) of every counted request

    async def up() -> None:
        return None

    async def down() -> None:
        raise ConnectionError("down")

    async def domain() -> None:
        raise ValueError("no such account")

    async def main() -> None:
        nonlocal counted
        for kind, what, gap in steps:
            clock._set_now(clock.now_ns() + round(gap * 1e9))
            bucket = clock.now_ns() // 1_000_000_000
            if kind == "retune":
                control.retune("model", **what)  # the window starts afresh
                settings_now.update(what)
                counted = []
                continue
            expected = _shed_probability(counted, bucket, settings_now["k"], settings_now["min_throughput"],
                                         settings_now["max_probability"])
            assert abs(throttle.probability - expected) < 1e-12
            try:
                await throttle.execute({"up": up, "down": down, "domain": domain}[what])
                counted.append((bucket, True))
            except Throttled:
                counted.append((bucket, False))
                event = sink.events[-1]
                assert event.name == "throttle.rejected"
                assert abs(event.attributes["probability"] - expected) < 1e-12
                held = [accepted for at, accepted in counted if at > bucket - 12]
                assert (event.attributes["requests"], event.attributes["accepts"]) == (len(held), sum(held))
            except ConnectionError:
                counted.append((bucket, False))
            except ValueError:
                counted.append((bucket, True))  # a domain failure: the dependency did its job

    with stoic.use_sinks(sink):
        asyncio.run(main())
    sink.assert_contract()
