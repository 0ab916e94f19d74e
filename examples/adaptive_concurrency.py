"""Adaptive concurrency against a dependency whose capacity halves and comes back.

Run: ``python -m examples.adaptive_concurrency`` (add ``--figure`` to redraw
docs/figures/adaptive.png). Deterministic and offline: everything runs on a
:class:`stoic.testing.VirtualClock`, so the numbers printed are the numbers you get.

The dependency has a capacity knee: up to ``capacity`` calls at once each take 100 ms; beyond
that every call slows in proportion (``0.1 * in_flight / capacity`` seconds: a shared resource,
throughput capped at ``capacity / 0.1`` calls per second). The capacity is 20 for the first
third of the run, 10 for the second third (a deploy gone wrong, a noisy neighbour), and 20
again for the last third. After a 15 s warm-up at half load (Gradient2 learns its long-term
latency from it), clients offer 250 calls per second (25 % above the healthy capacity, 150 %
above the degraded one), each with a 1 s deadline.

Controllers, each in front of the same dependency:

- fixed: ``Bulkhead(40, queue_limit=QUEUE)``, sized generously for the healthy dependency;
- AIMD: ``AdaptiveBulkhead(latency_threshold=THRESHOLD, max_concurrent=40, queue_limit=QUEUE)``;
- AIMD p90: the same with ``latency_quantile=0.9``;
- Gradient2: ``GradientBulkhead(max_concurrent=40, queue_limit=QUEUE)``;
- throttle: ``AdaptiveThrottle()`` alone (no concurrency limit; timeouts are its failures).

Printed per controller: goodput (calls answered within their deadline, per second), p50/p99
latency of those calls as the client saw them (queueing included), the fraction shed by the
policy, the fraction that timed out, and the goodput of the last third (after the recovery).
"""

from __future__ import annotations

import asyncio
import math
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

import stoic
from stoic import AdaptiveBulkhead, AdaptiveThrottle, Bulkhead, DeadlineExceeded, GradientBulkhead, Rejected
from stoic.testing import VirtualClock, seeded

BASE = 0.1
PHASE = 20.0
WARMUP = 15.0
RATE = 250.0
DEADLINE = 1.0
HEALTHY, DEGRADED = 20, 10
QUEUE = 20
THRESHOLD = 0.12


def capacity(t: float) -> int:
    """The dependency's capacity at ``t`` seconds after the warm-up."""
    return DEGRADED if PHASE <= t < 2 * PHASE else HEALTHY


@dataclass
class Run:
    name: str
    latencies: list[tuple[float, float]] = field(default_factory=list)  # (finish time, latency)
    offered: int = 0
    shed: int = 0
    timed_out: int = 0
    limits: list[tuple[float, float]] = field(default_factory=list)


@dataclass(frozen=True)
class Row:
    name: str
    goodput: float
    p50_ms: float
    p99_ms: float
    shed: float
    timed_out: float
    recovered_goodput: float


def percentile(values: list[float], p: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(1, math.ceil(p * len(ordered))) - 1]


class Dependency:
    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self.in_flight = 0
        self.start = 0.0

    async def call(self) -> None:
        self.in_flight += 1
        try:
            t = self.clock.now() - self.start
            seconds = BASE * max(1.0, self.in_flight / capacity(t))
            await self.clock.sleep_until(self.clock.now_ns() + round(seconds * 1e9))
        finally:
            self.in_flight -= 1


def make_policy(name: str, clock: VirtualClock) -> object:
    if name == "fixed":
        return Bulkhead(40, queue_limit=QUEUE, label=name, clock=clock)
    if name == "AIMD":
        return AdaptiveBulkhead(latency_threshold=THRESHOLD, max_concurrent=40, queue_limit=QUEUE, label=name,
                                clock=clock)
    if name == "AIMD p90":
        return AdaptiveBulkhead(latency_threshold=THRESHOLD, max_concurrent=40, queue_limit=QUEUE, latency_quantile=0.9,
                                label=name, clock=clock)
    if name == "Gradient2":
        return GradientBulkhead(max_concurrent=40, queue_limit=QUEUE, label=name, clock=clock)
    return AdaptiveThrottle(label=name, clock=clock)


CONTROLLERS = ("fixed", "AIMD", "AIMD p90", "Gradient2", "throttle")


async def _drive(run: Run, clock: VirtualClock) -> None:
    policy = make_policy(run.name, clock)
    dependency = Dependency(clock)
    rng = random.Random(f"arrivals:{run.name}")
    tasks: set[asyncio.Task[None]] = set()

    async def one(measured: bool) -> None:
        started = clock.now()
        try:
            async with stoic.timeout(DEADLINE):
                await policy.execute(dependency.call)  # type: ignore[attr-defined]
        except DeadlineExceeded:
            run.timed_out += measured
            return
        except Rejected:
            run.shed += measured
            return
        if measured:
            run.latencies.append((clock.now() - dependency.start, clock.now() - started))

    async def sample_limit() -> None:
        while True:
            t = clock.now() - dependency.start
            value = float(getattr(policy, "limit", None) or getattr(policy, "probability", 0.0))
            run.limits.append((t, value))
            await clock.sleep_until(clock.now_ns() + 250_000_000)

    sampler = asyncio.ensure_future(sample_limit())
    dependency.start = clock.now() + WARMUP
    end = dependency.start + 3 * PHASE
    while (now := clock.now()) < end:
        measured = now >= dependency.start
        rate = RATE if measured else RATE / 2
        run.offered += measured
        task = asyncio.ensure_future(one(measured))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        gap = rng.expovariate(rate)
        await clock.sleep_until(clock.now_ns() + max(1, round(gap * 1e9)))
    await asyncio.gather(*tasks)
    sampler.cancel()


def simulate(name: str) -> Run:
    """One controller's run, on a fresh virtual clock."""
    clock = VirtualClock()
    run = Run(name)

    async def main() -> None:
        with stoic.use_clock(clock):
            await clock.run(_drive(run, clock), limit=3600.0)

    with seeded(12):
        asyncio.run(main())
    return run


def summarize(run: Run) -> Row:
    total = 3 * PHASE
    latencies = [latency for _, latency in run.latencies]
    last = [1 for finished, _ in run.latencies if finished >= 2 * PHASE + 2.0]
    return Row(run.name, len(latencies) / total, percentile(latencies, 0.5) * 1e3, percentile(latencies, 0.99) * 1e3,
               run.shed / run.offered, run.timed_out / run.offered, len(last) / (PHASE - 2.0))


def table(rows: list[Row]) -> str:
    lines = [f"{'controller':<10} {'goodput/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'shed':>6} {'timeout':>7} "
             f"{'recovered/s':>11}"]
    for r in rows:
        lines.append(f"{r.name:<10} {r.goodput:9.1f} {r.p50_ms:7.0f} {r.p99_ms:7.0f} {r.shed:6.1%} "
                     f"{r.timed_out:7.1%} {r.recovered_goodput:11.1f}")
    return "\n".join(lines)


def figure(runs: list[Run], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, middle, bottom) = plt.subplots(3, 1, figsize=(9, 9), sharex=True)
    colours = dict(zip(CONTROLLERS, ("#888888", "#1f77b4", "#2ca02c", "#d62728", "#9467bd"), strict=True))
    ts = [t / 10 for t in range(0, int(30 * PHASE) + 1)]
    top.step(ts, [capacity(t) for t in ts], where="post", color="black", linestyle=":", label="capacity (knee)")
    for run in runs:
        if run.name == "throttle":
            continue
        points = [(t, v) for t, v in run.limits if t >= -WARMUP]
        top.step([t for t, _ in points], [v for _, v in points], where="post", color=colours[run.name],
                 label=run.name)
    top.set_ylabel("concurrency limit")
    top.legend(loc="upper right", fontsize=8, ncol=3)
    top.set_title("Limit follows the dependency's capacity (halved from 20 s to 40 s)")
    for run in runs:
        buckets: dict[int, list[float]] = {}
        for finished, latency in run.latencies:
            buckets.setdefault(int(finished), []).append(latency)
        xs = sorted(buckets)
        middle.plot(xs, [percentile(buckets[x], 0.99) * 1e3 for x in xs], color=colours[run.name], label=run.name,
                    marker="." if run.name == "throttle" else None, linestyle="none" if run.name == "throttle" else "-")
    middle.set_ylabel("p99 latency of good calls (ms)")
    middle.set_yscale("log")
    middle.legend(loc="upper right", fontsize=8, ncol=3)
    for run in runs:
        counts: dict[int, int] = {}
        for finished, _ in run.latencies:
            counts[int(finished)] = counts.get(int(finished), 0) + 1
        xs = list(range(int(3 * PHASE)))
        bottom.plot(xs, [counts.get(x, 0) for x in range(int(3 * PHASE))], color=colours[run.name], label=run.name)
    bottom.set_ylabel("goodput (calls/s)")
    bottom.set_xlabel("seconds (offered load 250 calls/s, deadline 1 s)")
    for axis in (top, middle, bottom):
        axis.axvspan(PHASE, 2 * PHASE, color="#f4e3c1", alpha=0.5)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str]) -> None:
    runs = [simulate(name) for name in CONTROLLERS]
    print(table([summarize(run) for run in runs]))
    if "--figure" in argv:
        path = Path(__file__).resolve().parent.parent / "docs" / "figures" / "adaptive.png"
        figure(runs, path)
        print(f"wrote {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
