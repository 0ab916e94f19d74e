"""Hostile tests of the lazy asyncio binding (stoic._lazy): asyncio imported after stoic, the
first use made by each kind of entry point (a deadline, a hedge, a limiter's cross-thread
wake-up, typing.get_type_hints), and afterwards no placeholder left anywhere."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

CHECK_BOUND = """
    import sys as _sys
    from stoic import _lazy, _retry, _wakeup
    _stale = [name for name, module in _sys.modules.items()
              if name.startswith("stoic") and getattr(module, "asyncio", asyncio) is not asyncio]
    assert not _stale, _stale
    assert not _lazy._namespaces and not _lazy._hooks
    assert _retry._current_task is not _retry._first_current_task
    assert _wakeup._get_running_loop is asyncio.events._get_running_loop
    if _sys.version_info < (3, 12):
        assert _retry._RUNNING is not None
"""


def _run(*parts: str) -> str:
    script = "\n".join(textwrap.dedent(part) for part in (*parts, CHECK_BOUND)) + "\nprint('ok')\n"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


FIRST_USES = {
    "timeout": """
        async def main():
            async with stoic.timeout(5):
                return 1
    """,
    "hedge": """
        async def main():
            async def op():
                return 1
            return await stoic.Hedge(0.5, label="h").execute(stoic.IDEMPOTENT, op)
    """,
    "retry_with_attempt_timeout": """
        async def main():
            async def op():
                return 1
            return await stoic.retry(stoic.Schedule.fixed(0).attempts(2), op, attempt_timeout=5, label="r")
    """,
    "limiter_woken_from_another_thread": """
        import threading
        async def main():
            limiter = stoic.RateLimiter(rate=1000, burst=1, label="rl")
            await limiter.execute(noop)  # the burst is spent: the next call waits, woken by a timer
            return await limiter.execute(one)
        async def noop():
            return None
        async def one():
            return 1
    """,
    "bulkhead_slot_freed_by_another_loop": """
        import threading
        async def main():
            bulkhead = stoic.Bulkhead(1, label="bh", queue_limit=1)
            entered, leave = threading.Event(), threading.Event()
            async def hold():
                entered.set()
                leave.wait(10)
            def other_loop():
                asyncio.run(bulkhead.execute(hold))
            thread = threading.Thread(target=other_loop)
            thread.start()
            await asyncio.to_thread(entered.wait, 10)
            waiting = asyncio.ensure_future(bulkhead.execute(one))
            while not bulkhead.queued:  # (the waiter is queued: no real wait)
                await asyncio.sleep(0)
            leave.set()  # the slot is freed on the other thread's loop: a cross-loop wake-up
            result = await waiting
            thread.join(10)
            return result
        async def one():
            return 1
    """,
}


@pytest.mark.parametrize("name", sorted(FIRST_USES))
def test_asyncio_imported_after_stoic_then_first_used_by(name: str) -> None:
    out = _run("""
        import sys
        import stoic
        assert "asyncio" not in sys.modules
        import asyncio
    """, FIRST_USES[name], """
        assert asyncio.run(main()) == 1
    """)
    assert out == "ok"


def test_get_type_hints_as_the_first_use_binds_everything() -> None:
    out = _run("""
        import sys
        import typing
        import stoic
        from stoic import _wakeup
        assert "asyncio" not in sys.modules
        hints = typing.get_type_hints(_wakeup.wake)
        import asyncio
        assert hints["future"] == asyncio.Future[None]
    """)
    assert out == "ok"
