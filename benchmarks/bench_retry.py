"""Success-path overhead of a retried call and of a four-stage pipeline, stoic against its peers.

Every retry retries ``ConnectionError`` up to 3 attempts with exponential backoff; the operation
succeeds at once, so what is measured is what every caller pays on every call. Every peer runs in
its fastest documented form that does the same job (several forms are timed; a target is judged
against the fastest), and every row is timed in turns, one repeat of each row per round, the best
round kept (benchmarks/_harness.py). Targets (issue 10):

- retry at most 0.5x the fastest peer (hyx, pyresilience, backoff, stamina, tenacity's reused
  loop), with the cost unchanged (here: within 1.1x) when 30 context variables are set and when
  two call sites share a bytecode offset;
- ``Pipeline(Retrying, CircuitBreaker, RateLimiter, Bulkhead)`` at most 1.1x the same four stages
  nested by hand (the faster of two hand forms) and at most 0.35x pyresilience's four-in-one
  ``@resilient`` decorator; the peer stack (hyx's retry, circuitbreaker's ``@circuit``,
  aiolimiter, ``asyncio.Semaphore``: each the fastest form of its kind) is shown beside them.

Every ratio is of overheads (ns per call minus the bare call's). Every target is recorded with
``benchmarks._harness.verdict``, so ``python -m benchmarks`` ends with all of them in one table;
a target whose peers are none of them installed is recorded as not measured
(``benchmarks._harness.skipped``), and a peer that is not installed has no rows.
With ``STOIC_BENCH_SMOKE=1`` every row runs a few calls once (a check that the script runs; the
figures then mean nothing).

Runs are short (about 1 ms each: the calls per run are sized per row) and many (21 rounds), the
best kept: on a shared machine a long timed run is always interrupted by other processes (wall
time then measures the contention: at a load average of 8 on 2 CPUs, 20,000-call runs read 4-6x
slower than 2,000-call ones), while a short one often runs clean, and rows of equal duration are
equally exposed.

    python -m benchmarks retry        (peers: pip install -r requirements-bench.txt)
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import stoic
from stoic import Pipeline, Retrying, Schedule, _retry, retry, retry_sync, retrying

from ._harness import SMOKE, Result, have, report, skipped, time_async, time_sync, verdict

CALLS = 20 if SMOKE else int(os.environ.get("STOIC_BENCH_CALLS", "20000"))  # at most, per run
SCHEDULE = Schedule.exponential(0.1).jittered().attempts(3)
ROUNDS = 1 if SMOKE else int(os.environ.get("STOIC_BENCH_REPEATS", "21"))
CONTEXT_VARIABLES = 30


async def _op() -> int:
    return 1


def _op_sync() -> int:
    return 1


@dataclass
class _Later:
    """A row to time: ``make`` called ``calls`` times per round (awaited when ``is_async``), in
    a context with ``variables`` extra context variables set."""

    make: Callable[[], Any]
    calls: int
    is_async: bool
    variables: int = 0
    fresh: bool = False  # ``make`` is a factory called once per round (state bound to one loop)


def _later_async(make: Callable[[], Awaitable[object]], *, calls: int = CALLS, variables: int = 0) -> Any:
    return _Later(make, calls, True, variables)


def _later_fresh(factory: Callable[[], Any], *, calls: int) -> Any:
    return _Later(factory, calls, True, fresh=True)


def _later_sync(make: Callable[[], object], *, calls: int = CALLS * 2, variables: int = 0) -> Any:
    return _Later(make, calls, False, variables)


_VARIABLES: list[contextvars.ContextVar[object]] = [
    contextvars.ContextVar(f"bench.var{i}") for i in range(CONTEXT_VARIABLES)]


def _set_variables(count: int) -> None:
    for variable in _VARIABLES[:count]:
        variable.set(object())


ROUND_NS = 1_000_000  # each timed run lasts about this long, whatever the row's cost


def _run(row: _Later, calls: int) -> float:
    timer = time_async if row.is_async else time_sync
    context = contextvars.copy_context()
    if row.variables:
        context.run(_set_variables, row.variables)  # asyncio.run copies this context
    make = row.make() if row.fresh else row.make
    return context.run(timer, make, calls=calls, repeats=1)


def _timed(results: list[Result]) -> list[Result]:
    """Time every row in turns: one repeat of each row per round, the best round kept. A burst of
    load on a shared machine then hits every row alike instead of one row against its baseline.
    Each row's calls per run are first sized so that a run lasts about ``ROUND_NS`` (at most the
    row's ``calls``): rows then have the same exposure to other processes, where a fixed call
    count would let a cheap row finish inside one time slice and a costly one never."""
    rows = [r.ns_per_call for r in results]
    assert all(isinstance(row, _Later) for row in rows)
    least = 1 if SMOKE else 50
    sized = [max(least, min(row.calls, int(ROUND_NS / max(1.0, _run(row, least))))) for row in rows]  # type: ignore[arg-type]
    best = [float("inf")] * len(results)
    for _ in range(ROUNDS):
        for i, row in enumerate(rows):
            best[i] = min(best[i], _run(row, sized[i]))  # type: ignore[arg-type]
    return [Result(r.name, ns) for r, ns in zip(results, best, strict=True)]


# --- the targets --------------------------------------------------------------------------------

def _overhead(results: list[Result], name: str, baseline: str) -> float:
    rows = {r.name: r.ns_per_call for r in results}
    return rows[name] - rows[baseline]


def _judge(what: str, results: list[Result], ours: str, theirs: list[str], baseline: str, target: float) -> None:
    """Record (``verdict``) ``ours``' overhead over the fastest of ``theirs`` against ``target``."""
    present = [name for name in theirs if any(r.name == name for r in results)]
    if not present:
        if target == float("inf"):
            print(f"  (not shown: {what}: no peer installed)")
        else:
            skipped(f"{what} [{ours} / the fastest peer]", target, reason="no peer installed")
        return
    fastest = min(present, key=lambda name: _overhead(results, name, baseline))
    # (A peer's overhead at or below zero happens only in a smoke run's single tiny round.)
    ratio = _overhead(results, ours, baseline) / max(1e-9, _overhead(results, fastest, baseline))
    if target == float("inf"):  # shown for comparison, not a target
        print(f"  {what} [{ours} / {fastest}]: {ratio:.3g}x")
    else:
        verdict(f"{what} [{ours} / {fastest}]", ratio, target)


# --- retry --------------------------------------------------------------------------------------

# The least a first attempt does under seed 001's rules, with no schedule, no classifier, no
# events: the cancel count read at entry (check 1, field report 17; through the same one-entry
# read stoic uses), the budget's deposit, a fresh nesting mark set in a context variable (a task
# created inside the attempt must see it: seed 001, "Nesting"), the try around the operation.
# Shown beside the targets, never judged: how much of the 0.5x budget the rules alone take.
_FLOOR_MARK: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("bench.floor", default=None)
_FLOOR_DEPOSITS = itertools.count()


async def _floor_async(fn: Callable[[], Awaitable[int]]) -> int:
    task = None
    running = _retry._RUNNING  # (None from 3.12 on: current_task() is cheap there, and read)
    if running is not None:
        for task in running:  # noqa: B007 (the first entry: one loop runs here)
            break
    else:
        task = asyncio.current_task()
    cancels = 0 if task is None else task.cancelling()
    next(_FLOOR_DEPOSITS)
    mark = [1, cancels]
    _FLOOR_MARK.set(mark)
    try:
        return await fn()
    finally:
        mark[0] = 0


def _floor_sync(fn: Callable[[], int]) -> int:
    next(_FLOOR_DEPOSITS)
    mark = [1, 0]
    _FLOOR_MARK.set(mark)
    try:
        return fn()
    finally:
        mark[0] = 0


FLOOR = "floor: mark, deposit, cancel count"

def _site_a() -> Awaitable[int]:
    return retry(SCHEDULE, _op, label="site-a")


def _site_b() -> Awaitable[int]:  # the same bytecode as _site_a: its retry call is at the same offset
    return retry(SCHEDULE, _op, label="site-b")


def _site_c() -> Awaitable[int]:  # one more instruction: its retry call is at another offset
    _ = None
    return retry(SCHEDULE, _op, label="site-c")


def _sync_site_a() -> int:
    return retry_sync(SCHEDULE, _op_sync, label="site-a")


def _sync_site_b() -> int:
    return retry_sync(SCHEDULE, _op_sync, label="site-b")


def _sync_site_c() -> int:
    _ = None
    return retry_sync(SCHEDULE, _op_sync, label="site-c")


def _alternating(first: Callable[[], Any], second: Callable[[], Any]) -> Callable[[], Any]:
    pair = itertools.cycle((first, second))
    return lambda: next(pair)()


ASYNC_PEERS = ["hyx @retry", "pyresilience @resilient(retry)", "backoff.on_exception", "stamina.retry",
               "stamina.retry_context", "tenacity AsyncRetrying loop, reused"]
SYNC_PEERS = ["pyresilience @resilient(retry)", "backoff.on_exception", "stamina.retry",
              "tenacity Retrying loop, reused"]


def bench_async() -> list[Result]:
    assert _site_a.__code__.co_code == _site_b.__code__.co_code != _site_c.__code__.co_code
    decorated = retrying(SCHEDULE, label="bench")(_op)
    policy = Retrying(SCHEDULE, label="bench")
    results = [
        Result("bare await", _later_async(_op)),
        Result("stoic @retrying", _later_async(decorated)),
        Result("stoic retry()", _later_async(lambda: retry(SCHEDULE, _op, label="bench"))),
        Result("stoic Retrying.execute", _later_async(lambda: policy.execute(_op))),
        Result(f"stoic retry(), {CONTEXT_VARIABLES} context variables set",
               _later_async(lambda: retry(SCHEDULE, _op, label="bench"), variables=CONTEXT_VARIABLES)),
        Result("stoic retry(), two sites, two offsets", _later_async(_alternating(_site_a, _site_c))),
        Result("stoic retry(), two sites, one offset", _later_async(_alternating(_site_a, _site_b))),
        Result(FLOOR, _later_async(lambda: _floor_async(_op))),
    ]
    if have("hyx"):
        import hyx.retry

        results.append(Result("hyx @retry", _later_async(
            hyx.retry.retry(on=ConnectionError, attempts=3, backoff=0.1)(_op))))
    if have("pyresilience"):
        import pyresilience

        results.append(Result("pyresilience @resilient(retry)", _later_async(pyresilience.resilient(
            retry=pyresilience.RetryConfig(max_attempts=3, delay=0.1, retry_on=(ConnectionError,)))(_op),
            calls=CALLS // 4)))
    if have("backoff"):
        import backoff

        results.append(Result("backoff.on_exception", _later_async(
            backoff.on_exception(backoff.expo, ConnectionError, max_tries=3)(_op), calls=CALLS // 2)))
    if have("stamina"):
        import stamina

        results.append(Result("stamina.retry", _later_async(
            stamina.retry(on=ConnectionError, attempts=3)(_op), calls=CALLS // 5)))

        async def in_context() -> int:
            async for attempt in stamina.retry_context(on=ConnectionError, attempts=3):
                with attempt:
                    return await _op()
            raise AssertionError("unreachable")

        results.append(Result("stamina.retry_context", _later_async(in_context, calls=CALLS // 5)))
    if have("tenacity"):
        import tenacity

        controller = tenacity.AsyncRetrying(
            stop=tenacity.stop_after_attempt(3), wait=tenacity.wait_exponential(multiplier=0.1),
            retry=tenacity.retry_if_exception_type(ConnectionError))

        async def tenacity_inline() -> int:
            async for attempt in controller:
                with attempt:
                    return await _op()
            raise AssertionError("unreachable")

        # One controller reused by every call: tenacity's fastest form (its statistics are shared
        # state, unsafe across concurrent tasks, so this flatters it).
        results.append(Result("tenacity AsyncRetrying loop, reused", _later_async(tenacity_inline, calls=CALLS // 5)))
    return results


def bench_sync() -> list[Result]:
    decorated = retrying(SCHEDULE, label="bench")(_op_sync)
    policy = Retrying(SCHEDULE, label="bench")
    results = [
        Result("bare call", _later_sync(_op_sync)),
        Result("stoic @retrying", _later_sync(decorated)),
        Result("stoic retry_sync()", _later_sync(lambda: retry_sync(SCHEDULE, _op_sync, label="bench"))),
        Result("stoic Retrying.call", _later_sync(lambda: policy.call(_op_sync))),
        Result(f"stoic retry_sync(), {CONTEXT_VARIABLES} context variables set",
               _later_sync(lambda: retry_sync(SCHEDULE, _op_sync, label="bench"), variables=CONTEXT_VARIABLES)),
        Result("stoic retry_sync(), two sites, two offsets", _later_sync(_alternating(_sync_site_a, _sync_site_c))),
        Result("stoic retry_sync(), two sites, one offset", _later_sync(_alternating(_sync_site_a, _sync_site_b))),
        Result("floor: mark, deposit", _later_sync(lambda: _floor_sync(_op_sync))),
    ]
    if have("pyresilience"):
        import pyresilience

        results.append(Result("pyresilience @resilient(retry)", _later_sync(pyresilience.resilient(
            retry=pyresilience.RetryConfig(max_attempts=3, delay=0.1, retry_on=(ConnectionError,)))(_op_sync),
            calls=CALLS // 4)))
    if have("backoff"):
        import backoff

        results.append(Result("backoff.on_exception", _later_sync(
            backoff.on_exception(backoff.expo, ConnectionError, max_tries=3)(_op_sync), calls=CALLS // 2)))
    if have("stamina"):
        import stamina

        results.append(Result("stamina.retry", _later_sync(
            stamina.retry(on=ConnectionError, attempts=3)(_op_sync), calls=CALLS // 5)))
    if have("tenacity"):
        import tenacity

        controller = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(3), wait=tenacity.wait_exponential(multiplier=0.1),
            retry=tenacity.retry_if_exception_type(ConnectionError))

        def tenacity_inline() -> int:
            for attempt in controller:
                with attempt:
                    return _op_sync()
            raise AssertionError("unreachable")

        results.append(Result("tenacity Retrying loop, reused", _later_sync(tenacity_inline, calls=CALLS // 5)))
    return results


# --- the pipeline -------------------------------------------------------------------------------

HAND_FORMS = ["stoic nested by hand, execute chain", "stoic nested by hand, lambdas"]


def _stages() -> tuple[Retrying, stoic.CircuitBreaker, stoic.RateLimiter, stoic.Bulkhead]:
    return (Retrying(SCHEDULE, label="bench"), stoic.CircuitBreaker(label="bench"),
            stoic.RateLimiter(10**9, per=1.0, label="bench"), stoic.Bulkhead(1_000, label="bench"))


def _peer_stack() -> Callable[[], Awaitable[int]] | None:
    """The same four stages from peers, each the fastest form of its kind: hyx's retry,
    circuitbreaker's ``@circuit``, aiolimiter's ``acquire()``, an ``asyncio.Semaphore``.
    Built afresh for every round: the limiter binds to the loop that first uses it."""
    if not all(have(m) for m in ("hyx", "circuitbreaker", "aiolimiter")):
        return None
    import aiolimiter
    import circuitbreaker
    import hyx.retry

    limiter = aiolimiter.AsyncLimiter(10**9, 1)
    semaphore = asyncio.Semaphore(1_000)

    async def limited() -> int:
        await limiter.acquire()
        async with semaphore:
            return await _op()

    breaker = circuitbreaker.circuit(failure_threshold=5, expected_exception=ConnectionError)(limited)
    stack: Callable[[], Awaitable[int]] = hyx.retry.retry(on=ConnectionError, attempts=3, backoff=0.1)(breaker)
    return stack


def bench_pipeline() -> list[Result]:
    retrying_stage, breaker, limiter, bulkhead = _stages()
    pipeline = Pipeline(*_stages())
    # The chain's stages bound once, as a Pipeline holds its stages: binding three methods on
    # every call costs ~75 ns that the Pipeline row never pays.
    chain = (retrying_stage.execute, breaker.execute, limiter.execute, bulkhead.execute)
    retry_execute, breaker_execute, limiter_execute, bulkhead_execute = chain
    results = [
        Result("bare await", _later_async(_op)),
        Result("stoic Pipeline(Retrying, CircuitBreaker, RateLimiter, Bulkhead)",
               _later_async(lambda: pipeline.execute(_op))),
        Result(HAND_FORMS[0], _later_async(
            lambda: retry_execute(breaker_execute, limiter_execute, bulkhead_execute, _op))),
        Result(HAND_FORMS[1], _later_async(lambda: retrying_stage.execute(
            lambda: breaker.execute(lambda: limiter.execute(lambda: bulkhead.execute(_op)))))),
    ]
    if have("pyresilience"):
        import pyresilience

        four_in_one = pyresilience.resilient(
            retry=pyresilience.RetryConfig(max_attempts=3, delay=0.1, retry_on=(ConnectionError,)),
            circuit_breaker=pyresilience.CircuitBreakerConfig(),
            rate_limiter=pyresilience.RateLimiterConfig(max_calls=10**9, period=1.0),
            bulkhead=pyresilience.BulkheadConfig(max_concurrent=1_000))(_op)
        results.append(Result("pyresilience @resilient(retry, breaker, limiter, bulkhead)",
                              _later_async(four_in_one, calls=CALLS // 4)))
    if _peer_stack() is not None:
        results.append(Result("peers: hyx + @circuit + aiolimiter + Semaphore",
                              _later_fresh(_peer_stack, calls=CALLS // 2)))
    return results


def main() -> None:
    results = _timed(bench_async())
    report("retry (async): a call that succeeds at once", results, baseline="bare await",
           reference="stoic @retrying")
    for form in ("stoic @retrying", "stoic retry()", "stoic Retrying.execute"):
        _judge("async retry <= 0.5x the fastest peer", results, form, ASYNC_PEERS, "bare await", 0.5)
    _judge("the rules' floor against the fastest peer (shown, no target)", results, FLOOR, ASYNC_PEERS,
           "bare await", float("inf"))
    _judge(f"async retry unchanged with {CONTEXT_VARIABLES} context variables", results,
           f"stoic retry(), {CONTEXT_VARIABLES} context variables set", ["stoic retry()"], "bare await", 1.1)
    _judge("async retry unchanged when two sites share an offset", results,
           "stoic retry(), two sites, one offset", ["stoic retry(), two sites, two offsets"], "bare await", 1.1)

    results = _timed(bench_sync())
    report("retry (sync): a call that succeeds at once", results, baseline="bare call", reference="stoic @retrying")
    for form in ("stoic @retrying", "stoic retry_sync()", "stoic Retrying.call"):
        _judge("sync retry <= 0.5x the fastest peer", results, form, SYNC_PEERS, "bare call", 0.5)
    _judge("the rules' floor against the fastest peer (shown, no target)", results, "floor: mark, deposit",
           SYNC_PEERS, "bare call", float("inf"))
    _judge(f"sync retry unchanged with {CONTEXT_VARIABLES} context variables", results,
           f"stoic retry_sync(), {CONTEXT_VARIABLES} context variables set", ["stoic retry_sync()"], "bare call", 1.1)
    _judge("sync retry unchanged when two sites share an offset", results,
           "stoic retry_sync(), two sites, one offset", ["stoic retry_sync(), two sites, two offsets"],
           "bare call", 1.1)

    results = _timed(bench_pipeline())
    stack = results[1].name
    report("pipeline: every stage admits, the call succeeds", results, baseline="bare await", reference=stack)
    _judge("Pipeline <= 1.1x the same stages nested by hand", results, stack, HAND_FORMS, "bare await", 1.1)
    _judge("Pipeline <= 0.35x pyresilience's four-in-one decorator", results, stack,
           ["pyresilience @resilient(retry, breaker, limiter, bulkhead)"], "bare await", 0.35)
    _judge("Pipeline vs the peer stack (shown, no target)", results, stack,
           ["peers: hyx + @circuit + aiolimiter + Semaphore"], "bare await", float("inf"))


if __name__ == "__main__":
    main()
