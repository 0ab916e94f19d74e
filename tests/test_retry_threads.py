"""retry_sync and @retrying on plain functions from many threads; retries on the system clock
under successive event loops (nothing binds to a loop at construction)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from stoic import RetryBudget, Schedule, retry, retry_sync, retrying

ZERO = Schedule.fixed(0).attempts(4)

calls_at_import = 0


@retrying(ZERO, label="op")
async def flaky_at_import() -> int:
    """Decorated at import time, before any event loop exists."""
    global calls_at_import
    calls_at_import += 1
    if calls_at_import % 2:
        raise ConnectionError
    return calls_at_import


def test_a_retry_decorated_at_import_works_under_successive_event_loops() -> None:
    assert asyncio.run(flaky_at_import()) == 2
    assert asyncio.run(flaky_at_import()) == 4
    assert asyncio.run(retry(ZERO, flaky_at_import, label="op")) == 6


def test_many_threads_share_a_budget_without_exceeding_it() -> None:
    budget = RetryBudget(ratio=0.1, reserve_per_second=0, reserve_capacity=20)
    lock = threading.Lock()
    calls = 0
    failures = 0

    def always_fails() -> None:
        nonlocal calls
        with lock:
            calls += 1
        raise ConnectionError

    def worker() -> None:
        nonlocal failures
        for _ in range(20):
            with pytest.raises(ConnectionError):
                retry_sync(ZERO, always_fails, budget=budget, label="op")
            with lock:
                failures += 1

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    first_attempts = 16 * 20
    retries = calls - first_attempts
    assert failures == first_attempts
    assert retries <= 0.1 * first_attempts + 20 + 1e-9
    assert retries >= 20  # the reserve really was spent


def test_the_decorator_is_thread_safe_on_plain_functions() -> None:
    local = threading.local()

    @retrying(ZERO, budget=RetryBudget.UNLIMITED, label="op")
    def flaky() -> str:
        local.n = getattr(local, "n", 0) + 1
        if local.n < 3:
            raise TimeoutError
        return threading.current_thread().name

    results: list[str] = []

    def worker() -> None:
        local.n = 0
        results.append(flaky())

    threads = [threading.Thread(target=worker, name=f"t{i}") for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == sorted(f"t{i}" for i in range(32))
