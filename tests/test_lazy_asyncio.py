"""``import stoic`` does not import asyncio; the first use puts the real module in place (issue 10)."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_importing_stoic_and_running_blocking_policies_leaves_asyncio_unimported() -> None:
    out = _run("""
        import sys
        import stoic
        from stoic import BlockingBulkhead, BlockingRateLimiter, CircuitBreaker, Schedule, retry_sync
        assert "asyncio" not in sys.modules, "import stoic imported asyncio"
        breaker = CircuitBreaker(label="b")
        assert breaker.call(lambda: 1) == 1
        assert BlockingBulkhead(2, label="bh").call(lambda: 2) == 2
        assert BlockingRateLimiter(rate=100, label="rl").call(lambda: 3) == 3
        assert retry_sync(Schedule.fixed(0).attempts(2), lambda: 4, label="r") == 4
        print("asyncio" in sys.modules)
    """)
    assert out == "False"


def test_the_first_async_use_replaces_every_placeholder_by_asyncio() -> None:
    out = _run("""
        import sys
        import stoic
        from stoic import Bulkhead, CircuitBreaker, Schedule, retry
        from stoic import _lazy
        import asyncio

        async def op():
            return 5

        async def main():
            bulkhead = Bulkhead(2, label="bh")
            breaker = CircuitBreaker(label="b")
            return await retry(Schedule.fixed(0).attempts(2), breaker.execute, bulkhead.execute, op, label="r")

        assert asyncio.run(main()) == 5
        stale = [name for name, module in sys.modules.items()
                 if name.startswith("stoic") and getattr(module, "asyncio", asyncio) is not asyncio]
        assert not stale, stale
        assert not _lazy._namespaces and not _lazy._hooks
        from stoic import _retry
        assert _retry._current_task is not _retry._first_current_task
        print("ok")
    """)
    assert out == "ok"


def test_asyncio_imported_first_means_no_placeholder_at_all() -> None:
    out = _run("""
        import asyncio
        import sys
        import stoic
        stale = [name for name, module in sys.modules.items()
                 if name.startswith("stoic") and getattr(module, "asyncio", asyncio) is not asyncio]
        print(stale)
    """)
    assert out == "[]"


def test_threads_racing_to_the_first_async_use_all_find_asyncio_bound() -> None:
    out = _run("""
        import threading
        import stoic
        from stoic import Bulkhead, Schedule, retry

        barrier = threading.Barrier(16)
        results = []

        def worker():
            import asyncio

            async def op():
                return 1

            async def main():
                return await retry(Schedule.fixed(0).attempts(2), Bulkhead(1, label="bh").execute, op, label="r")

            barrier.wait()
            results.append(asyncio.run(main()))

        threads = [threading.Thread(target=worker) for _ in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        print(sum(results))
    """)
    assert out == "16"
