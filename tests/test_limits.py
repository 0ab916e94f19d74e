"""The limit algorithms as pure arithmetic: no event loop, no clock (seed 003, "Adaptive
(AIMD)" and "Gradient"; Netflix concurrency-limits' Gradient2Limit and its two faults)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoic._limits import QUANTILE_STRIDE, AimdLimit, Change, Gradient2Limit

MS = 1_000_000
S = 1_000_000_000


def aimd(**kwargs: object) -> AimdLimit:
    options: dict[str, object] = {"threshold_ns": 100 * MS, "maximum": 20, "minimum": 2, "cooldown_ns": S}
    options.update(kwargs)
    return AimdLimit(**options)  # type: ignore[arg-type]


# --- AIMD ---


def test_aimd_starts_at_the_ceiling_and_backs_off_multiplicatively_on_a_slow_completion():
    limit = aimd()
    assert limit.limit == 20
    assert limit.sample(0, 150 * MS, in_flight=20) == Change(20, 18, "backoff")
    assert limit.value == 18.0


def test_aimd_backs_off_at_most_once_per_cooldown():
    limit = aimd()
    limit.sample(0, 150 * MS, 20)
    assert limit.sample(S - 1, 150 * MS, 20) is None  # inside the cooldown: coalesced
    assert limit.value == 18.0
    assert limit.sample(S, 150 * MS, 20) == Change(18, 16, "backoff")


def test_a_drop_is_a_breach_whatever_its_latency():
    limit = aimd()
    assert limit.sample(0, 1 * MS, 20, dropped=True) == Change(20, 18, "backoff")


def test_aimd_increases_by_step_over_limit_per_in_budget_completion():
    limit = aimd(maximum=100)
    limit._set(10.0, "test")
    limit.sample(0, 10 * MS, in_flight=10)
    assert limit.value == 10.1
    for _ in range(9):
        limit.sample(0, 10 * MS, in_flight=10)
    assert limit.limit == 10  # ten completions: about one slot (10.0 + 10 * ~0.1, just under 11)
    for _ in range(2):
        limit.sample(0, 10 * MS, in_flight=10)
    assert limit.limit == 11


def test_aimd_does_not_grow_while_fewer_than_half_the_slots_are_in_use():
    limit = aimd(maximum=100)
    limit._set(10.0, "test")
    for _ in range(1000):
        assert limit.sample(0, 10 * MS, in_flight=4) is None
    assert limit.value == 10.0
    limit.sample(0, 10 * MS, in_flight=5)
    assert limit.value > 10.0


def test_aimd_never_leaves_its_floor_or_ceiling():
    limit = aimd()
    for i in range(100):
        limit.sample(i * S, 500 * MS, 20)
    assert limit.limit == 2
    for _ in range(10_000):
        limit.sample(200 * S, 1 * MS, 20)
    assert limit.limit == 20 and limit.value == 20.0


def test_with_a_quantile_one_outlier_is_not_a_breach():
    limit = aimd(quantile=0.95)
    for i in range(150):
        latency = 900 * MS if i == 75 else 10 * MS
        assert limit.sample(i * MS, latency, 20) is None or limit.limit == 20
    assert limit.limit == 20


@pytest.mark.parametrize(("quantile", "outlier"), [(0.5, 60 * S), (0.9, 60 * S), (0.95, 10 * S), (0.99, 1 * S)])
def test_with_a_quantile_one_outlier_is_not_a_breach_however_slow_and_wherever_it_falls(quantile, outlier):
    # P-squared's markers move by interpolating towards their neighbours, the largest value seen
    # among them: fed raw, one 10 s call among 10-12 ms ones lifted a p95 estimate past the 100 ms
    # threshold (a 60 s one even the median), wherever it fell in most of the epoch.
    for position in range(200):
        limit = aimd(quantile=quantile)
        for i in range(400):
            latency = outlier if i == position else 10 * MS + (i * 7919 % 2001) * 1000  # 10-12 ms
            assert limit.sample(i * MS, latency, 20) is None, (position, i)
        assert limit.value == 20.0


def test_with_a_quantile_a_shifted_distribution_breaches_and_starts_a_fresh_epoch():
    limit = aimd(quantile=0.9, cooldown_ns=1)
    changes = []
    for i in range(400):
        change = limit.sample(i * 10 * MS, 300 * MS, 20)
        if change:
            changes.append((i, change))
    _first, change = changes[0]
    assert change.cause == "backoff"
    # Each backoff starts a fresh epoch: the next needs a new warm-up's worth of samples, not
    # just the cooldown, so a stale-high estimate cannot back off every second down to the floor.
    assert all(c.cause == "backoff" for _, c in changes)  # a slow sample never grows the limit
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(changes)]
    assert gaps and min(gaps) >= 50  # the warm-up for p=0.9 (5 / 0.1 = 50 samples)
    assert limit.limit > 2  # 400 slow samples: at most 8 backoffs, not one per sample


@pytest.mark.parametrize(("quantile", "span"), [(0.5, 20 + 8 * 180), (0.9, 50 + 8 * 150), (0.99, 200)])
def test_a_quantile_epoch_spans_its_warm_up_plus_eight_completions_per_later_sample(quantile, span):
    # docs/adaptive.md: an epoch is 200 samples of the estimate, not 200 completions.
    limit = aimd(quantile=quantile)
    estimate = limit._estimate
    completions = 0
    while estimate._previous is None:  # (the first epoch rolls over on the sample after its 200th)
        limit.sample(completions * MS, 10 * MS, 20)
        completions += 1
    assert span <= completions - 1 <= span + QUANTILE_STRIDE


def test_after_recovery_the_fresh_epoch_lets_the_limit_grow_again():
    limit = aimd(quantile=0.9)
    t = 0
    for _ in range(200):
        limit.sample(t, 300 * MS, 20)
        t += 10 * MS
    low = limit.value
    assert low < 20
    for _ in range(2000):
        limit.sample(t, 10 * MS, 20)
        t += 10 * MS
    assert limit.value > low + 1


# --- Gradient2 ---


def run_windows(limit: Gradient2Limit, windows: int, latency_ns: int, *, in_flight: int | None = None,
                dropped: bool = False, start_ns: int = 0) -> tuple[int, list[Change]]:
    """Feed ``windows`` sample windows (10 samples over one second each)."""
    t = start_ns
    changes = []
    for _ in range(windows):
        for _j in range(10):
            t += 120 * MS
            change = limit.sample(t, latency_ns, in_flight if in_flight is not None else limit.limit, dropped)
            if change:
                changes.append(change)
    return t, changes


def test_gradient2_updates_once_per_window_of_ten_samples_and_a_second():
    limit = Gradient2Limit(maximum=100, minimum=1)
    limit.value = 20.0
    for i in range(9):
        assert limit.sample((i + 1) * 200 * MS, 10 * MS, 20) is None
    assert limit.long_ns is None  # nine samples: no update yet, even after 1.8 s
    limit.sample(2 * S, 10 * MS, 20)
    assert limit.long_ns == 10 * MS
    # Ten samples in 50 ms: still no update until the second has passed.
    for i in range(10):
        limit.sample(2 * S + (i + 1) * 5 * MS, 10 * MS, 20)
    assert limit._long_count == 1
    limit.sample(3 * S + 5 * MS, 10 * MS, 20)
    assert limit._long_count == 2


def test_gradient2_at_baseline_adds_the_headroom_smoothed():
    limit = Gradient2Limit(maximum=100, minimum=1, smoothing=0.2, headroom=4.0)
    limit.value = 20.0
    limit.update(10, 10 * 10 * MS, 20, False)
    assert limit.value == 20.0 * 0.8 + 0.2 * (20.0 + 4.0)


def test_gradient2_contracts_with_the_gradient_and_clamps_it_at_one_half():
    limit = Gradient2Limit(maximum=100, minimum=1, rtt_tolerance=1.5, smoothing=0.2)
    limit.value = 40.0
    limit.long_ns = 10.0 * MS
    limit._long_count = 100
    limit.update(10, 10 * 40 * MS, 40, False)  # short 40 ms: 1.5 * long / short < 0.5 -> 0.5
    long = limit.long_ns
    assert long is not None
    gradient = max(0.5, min(1.0, 1.5 * long / (40 * MS)))
    assert gradient == 0.5
    assert abs(limit.value - (40 * 0.8 + 0.2 * 40 * 0.5)) < 1e-9


def test_gradient2_does_not_grow_while_in_flight_is_below_half_the_limit():
    limit = Gradient2Limit(maximum=100, minimum=1)
    limit.value = 20.0
    run_windows(limit, 50, 10 * MS, in_flight=9)
    assert limit.value == 20.0


def test_gradient2_long_rtt_decays_when_it_is_more_than_twice_the_short():
    limit = Gradient2Limit(maximum=100, minimum=1)
    limit.long_ns = 100.0 * MS
    limit._long_count = 100
    limit.update(10, 10 * 10 * MS, 0, False)
    expected = (100 * MS + (10 * MS - 100 * MS) * 2 / 601) * 0.95
    assert abs(limit.long_ns - expected) < 1


def test_gradient2_long_rtt_is_a_plain_mean_for_the_first_ten_windows():
    limit = Gradient2Limit(maximum=100, minimum=1)
    for i, latency in enumerate([10, 20, 30, 40]):
        limit.update(1, latency * MS, 0, False)
        assert abs(limit.long_ns - sum([10, 20, 30, 40][: i + 1]) / (i + 1) * MS) < 1  # type: ignore[operator]


def test_fault_a_a_steady_stream_of_timeouts_shrinks_the_limit_to_the_floor():
    limit = Gradient2Limit(maximum=50, minimum=2)
    limit.value = 20.0
    _, changes = run_windows(limit, 60, 5 * S, dropped=True)
    assert limit.limit == 2
    assert changes and all(c.new < c.old and c.cause == "backoff" for c in changes)
    # Each window multiplies by exactly 0.9.
    fresh = Gradient2Limit(maximum=50, minimum=2)
    fresh.value = 20.0
    run_windows(fresh, 1, 5 * S, dropped=True)
    assert fresh.value == 18.0


def test_fault_a_mixed_windows_with_timeouts_never_climb_to_the_maximum():
    limit = Gradient2Limit(maximum=50, minimum=2)
    limit.value = 20.0
    t = 0
    for _ in range(100):
        for j in range(10):
            t += 120 * MS
            limit.sample(t, 10 * MS, limit.limit, dropped=(j == 0))
    assert limit.limit < 20


def test_fault_b_modest_sustained_overload_never_creeps_upward():
    # Keep the gradient at 0.8 window after window (the short RTT follows the long one), the
    # condition under which Netflix's formula converges on headroom / (1 - 0.8) = 20 slots
    # whatever the capacity.
    limit = Gradient2Limit(maximum=100, minimum=1, rtt_tolerance=1.5)
    limit.value = 10.0
    limit.long_ns = 10.0 * MS
    limit._long_count = 100
    values = [limit.value]
    for _ in range(100):
        assert limit.long_ns is not None
        short = round(1.5 * limit.long_ns / 0.8)
        limit.update(10, 10 * short, 100, False)
        values.append(limit.value)
    assert all(b <= a for a, b in itertools.pairwise(values))
    assert values[-1] < 10.0
    # The unfixed update would have risen towards 20.
    netflix = 10.0
    for _ in range(100):
        netflix = netflix * 0.8 + 0.2 * (netflix * 0.8 + 4.0)
    assert netflix > 19


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3 * S), st.integers(0, 400), st.booleans()), max_size=300),
       st.integers(1, 10), st.integers(0, 40), st.booleans())
def test_every_limit_stays_within_its_floor_and_ceiling(samples, floor, extra, quantile):
    ceiling = floor + extra
    algorithms = [
        AimdLimit(threshold_ns=100 * MS, maximum=ceiling, minimum=floor, quantile=0.9 if quantile else None),
        Gradient2Limit(maximum=ceiling, minimum=floor, window_min_samples=3, window_ns=100 * MS),
    ]
    for algorithm in algorithms:
        t = 0
        for gap, latency_ms, dropped in samples:
            t += gap // 10
            change = algorithm.sample(t, latency_ms * MS, ceiling, dropped)
            assert floor <= algorithm.limit <= ceiling
            assert floor <= algorithm.value <= ceiling
            if change is not None:
                assert change.old != change.new and change.new == algorithm.limit


# --- weighted samples (the limiter times one call in a stride: stoic.adaptive) ---


@settings(max_examples=200, deadline=None)
@given(st.floats(1.0, 60.0), st.sampled_from([0.25, 1.0, 4.0]), st.integers(1, 32))
def test_aimd_weighted_sample_grows_as_that_many_in_budget_completions(start, step, weight):
    ceiling = 1000  # far away: the cap does not hide the growth
    weighted = aimd(maximum=ceiling, minimum=1, increase_step=step)
    weighted._set(start, "test")
    weighted.sample(0, 10 * MS, in_flight=ceiling, weight=weight)
    # The reference model: the rule applied once per completion.
    value = start
    for _ in range(weight):
        value += step / value
    if weight == 1:
        assert weighted.value == value  # exactly the per-completion rule
    # Never short of the completions it stands for; over by at most weight * (step / start)**2 in v**2.
    assert value - 1e-9 <= weighted.value <= value + weight * (step / start) ** 2 / (2 * value) + 1e-9
    assert weighted.limit == int(weighted.value)


def test_aimd_weighted_breach_backs_off_once_and_weighted_growth_respects_the_ceiling():
    limit = aimd()
    assert limit.sample(0, 150 * MS, 20, weight=32) == Change(20, 18, "backoff")  # once, not 32 times
    limit.sample(S, 10 * MS, 20, weight=32)
    assert limit.limit == 19  # 18 -> sqrt(18**2 + 32 * (2 + 1/18**2)) ~ 19.7
    limit.sample(S, 10 * MS, 20, weight=32)
    assert limit.value == 20.0  # capped at the ceiling
    quiet = aimd()
    quiet._set(10.0, "test")
    assert quiet.sample(0, 10 * MS, in_flight=4, weight=32) is None and quiet.value == 10.0  # 4 < 10 / 2


def test_aimd_untimed_drop_breaches_and_leaves_the_quantile_estimate_alone():
    limit = aimd(quantile=0.9)
    assert limit.sample(0, 1 * MS, 20, dropped=True) == Change(20, 18, "backoff")  # a timed drop
    for i in range(60):  # inside the cooldown: a fresh epoch, past its warm-up (50 for p90)
        limit.sample((i + 1) * MS, 10 * MS, 20)
    estimate = limit._estimate
    assert estimate is not None
    seen = estimate.epoch_count
    assert limit.sample(100 * MS, -1, 20, dropped=True) is None  # an untimed drop inside the cooldown
    assert estimate.epoch_count == seen  # no latency to add: the estimate untouched
    before, value = limit.limit, limit.value  # (grown back by the 60 in-budget samples)
    assert limit.sample(S, -1, 20, dropped=True) == Change(before, int(value * 0.9), "backoff")  # it breaches


def test_gradient2_weighted_samples_count_towards_the_window_and_weight_its_mean():
    limit = Gradient2Limit(maximum=20, minimum=2)
    limit.sample(0, 10 * MS, 20, weight=1)  # opens the window
    limit.sample(S, 40 * MS, 20, weight=9)  # a second later: ten completions, the window closes
    assert limit.long_ns == (1 * 10 * MS + 9 * 40 * MS) / 10  # the weighted mean: 37 ms, not 25
    dropped = Gradient2Limit(maximum=20, minimum=2)
    dropped.sample(0, 10 * MS, 20)
    assert dropped.sample(S, 10 * MS, 20, dropped=True, weight=9) == Change(20, 18, "backoff")
