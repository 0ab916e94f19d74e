"""stoic.fleet on a loopback redis-server: shared limiter decisions beside the ``limits`` library's
Redis storage, and the shared breaker's closed-state success overhead beside the local breaker's.

Run: ``python -m benchmarks fleet`` (needs ``redis-server`` on PATH; ``limits`` is in
requirements-bench.txt and runs here on its ``redispy`` implementation over the pinned redis-py).

Limiter rows: every process makes sequential decisions as fast as the server answers, at a
limit so large that every one is granted (what is measured is the decision, not the waiting),
from 1 process and from 4 at once; decisions/s is the aggregate, latency is per decision.
"scripts/dec" is the server's EVAL/EVALSHA calls per decision (each one round trip) and
"cmds/dec" every command it ran per decision, the scripts' inner calls included (INFO
commandstats). Targets: one round trip
per decision, at least the ``limits`` throughput, and the shared breaker's closed-state success
within 2x the local breaker's.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._harness import Result, report, time_async

ROOT = Path(__file__).resolve().parent.parent
DECISIONS = 3000
HUGE = 10**6  # permits per second (and burst): never refused over a run


async def _stoic_decisions(url: str, label: str, count: int) -> list[int]:
    from stoic.fleet import RedisStore, SharedRateLimiter

    store = RedisStore(url, budget=0.5)
    limiter = SharedRateLimiter(HUGE, 1.0, store=store, label=label)
    await limiter.try_acquire()  # connect and load the script outside the timing
    out = []
    clock = time.perf_counter_ns
    for _ in range(count):
        start = clock()
        if not await limiter.try_acquire():
            raise RuntimeError("refused")
        out.append(clock() - start)
    await store.aclose()
    return out


async def _limits_decisions(url: str, label: str, count: int, strategy: str) -> list[int]:
    from limits import RateLimitItemPerSecond
    from limits.aio import strategies
    from limits.aio.storage import RedisStorage

    storage = RedisStorage(url.replace("redis://", "async+redis://"), implementation="redispy")
    limiter = {"moving": strategies.MovingWindowRateLimiter, "fixed": strategies.FixedWindowRateLimiter,
               "sliding": strategies.SlidingWindowCounterRateLimiter}[strategy](storage)
    item = RateLimitItemPerSecond(HUGE)
    await limiter.hit(item, label)
    out = []
    clock = time.perf_counter_ns
    for _ in range(count):
        start = clock()
        if not await limiter.hit(item, label):
            raise RuntimeError("refused")
        out.append(clock() - start)
    return out


def _worker(kind: str, url: str, label: str, count: int, start_at: float) -> None:
    async def run() -> list[int]:
        await asyncio.sleep(max(0.0, start_at - time.time()))
        if kind == "stoic":
            return await _stoic_decisions(url, label, count)
        return await _limits_decisions(url, label, count, kind)

    began = time.time()
    latencies = asyncio.run(run())
    print(json.dumps({"latencies": latencies, "began": began, "ended": time.time()}))


def _commands(url: str) -> tuple[int, int]:
    """(every command the server ran, inner script calls included; top-level script calls)."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        stats = client.info("commandstats")
        total = sum(int(v["calls"]) for v in stats.values())
        scripts = sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("eval", "evalsha"))
        return total, scripts
    finally:
        client.close()


def _limiter_row(kind: str, url: str, processes: int, round_no: int) -> dict[str, Any]:
    label = f"bench-{kind}-{processes}-{round_no}-{time.monotonic_ns()}"
    start_at = time.time() + 1.5
    before = _commands(url)
    procs = [subprocess.Popen([sys.executable, "-m", "benchmarks.bench_fleet", "--worker", kind, url, label,
                               str(DECISIONS), str(start_at)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
             for _ in range(processes)]
    results = [json.loads(p.communicate(timeout=120)[0].strip().splitlines()[-1]) for p in procs]
    after = _commands(url)
    latencies = sorted(v for r in results for v in r["latencies"])
    wall = max(r["ended"] for r in results) - start_at
    total = len(latencies) + processes  # the warm-up decision included in the command count
    return {
        "rate": len(latencies) / wall,
        "p50": latencies[len(latencies) // 2] / 1e3,
        "p99": latencies[int(len(latencies) * 0.99)] / 1e3,
        "commands": (after[0] - before[0] - 1) / total,  # the INFO call itself excluded
        "scripts": (after[1] - before[1]) / total,
    }


def _limiter_table(url: str) -> None:
    kinds = [("stoic SharedRateLimiter", "stoic"), ("limits moving window", "moving"),
             ("limits fixed window", "fixed"), ("limits sliding window counter", "sliding")]
    print("\n## shared rate limiter: decisions against a loopback redis-server")
    print(f"{'':<34}{'procs':>6}{'decisions/s':>13}{'p50 us':>9}{'p99 us':>9}{'scripts/dec':>12}"
          f"{'cmds/dec':>10}")
    best: dict[tuple[str, int], dict[str, Any]] = {}
    for processes in (1, 4):
        for round_no in range(2):  # rows interleaved; the better of two rounds kept
            for name, kind in kinds:
                row = _limiter_row(kind, url, processes, round_no)
                key = (name, processes)
                if key not in best or row["rate"] > best[key]["rate"]:
                    best[key] = row
        for name, _ in kinds:
            row = best[(name, processes)]
            print(f"{name:<34}{processes:>6}{row['rate']:>13.0f}{row['p50']:>9.0f}{row['p99']:>9.0f}"
                  f"{row['scripts']:>12.2f}{row['commands']:>10.2f}")
        ours = best[("stoic SharedRateLimiter", processes)]["rate"]
        for name, _ in kinds[1:]:
            print(f"  stoic / {name}: {ours / best[(name, processes)]['rate']:.2f}x throughput")


def _breaker_table(url: str) -> None:
    from stoic import CircuitBreaker
    from stoic.fleet import RedisStore, SharedCircuitBreaker

    async def op() -> int:
        return 1

    local = CircuitBreaker(label="bench-local")
    store = RedisStore(url, budget=0.5)
    shared = SharedCircuitBreaker(label=f"bench-shared-{time.monotonic_ns()}", store=store)
    samples: dict[str, list[float]] = {"bare call": [], "CircuitBreaker": [], "SharedCircuitBreaker": []}
    makers = {"bare call": op, "CircuitBreaker": lambda: local.execute(op),
              "SharedCircuitBreaker": lambda: shared.execute(op)}
    for _ in range(4):
        for name, make in makers.items():
            samples[name].append(time_async(make, calls=20_000, repeats=1))
    results = [Result(name, min(values)) for name, values in samples.items()]
    report("breaker closed-state success (refresh_interval 0.1 s: one refresh round trip per 0.1 s)", results,
           baseline="bare call", reference="SharedCircuitBreaker")
    base = results[0].ns_per_call
    ratio = (results[2].ns_per_call - base) / (results[1].ns_per_call - base)
    print(f"  shared overhead / local overhead: {ratio:.2f}x (target <= 2x)")


def main() -> None:
    sys.path.insert(0, str(ROOT / "tests" / "integration"))
    from redis_harness import RedisServer

    with tempfile.TemporaryDirectory() as workdir:
        server = RedisServer(Path(workdir))
        try:
            _limiter_table(server.url)
            _breaker_table(server.url)
        finally:
            server.stop()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        _worker(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), float(sys.argv[6]))
    else:
        main()
