"""User code checked with ``mypy --strict``: every asyncio policy is a ``stoic.Policy`` (so a
Pipeline, ``with_fallback`` and an annotation take it), and every decorator on an async function
gives a coroutine function (so ``asyncio.run``/``create_task`` take its calls), as the runtime
wrappers are."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

api = pytest.importorskip("mypy.api")


def _mypy(tmp_path: Path, snippet: str) -> list[str]:
    source = tmp_path / "typed_usage.py"
    source.write_text(textwrap.dedent(snippet))
    out, _err, _status = api.run([
        "--strict", "--no-error-summary", "--cache-dir", str(tmp_path / ".mypy_cache"), str(source),
    ])
    return [line.split(": ", 1)[1] for line in out.strip().splitlines() if line]


def test_every_asyncio_policy_is_a_policy_to_mypy(tmp_path: Path) -> None:
    lines = _mypy(tmp_path, """
        import stoic

        breaker = stoic.CircuitBreaker(label="b")
        limiter = stoic.RateLimiter(10, label="rl")
        bulkhead = stoic.Bulkhead(4, label="bh")
        policies: list[stoic.Policy] = [
            breaker, limiter, bulkhead,
            stoic.AdaptiveBulkhead(latency_threshold=0.1, max_concurrent=10, label="ab"),
            stoic.GradientBulkhead(max_concurrent=10, label="gb"),
            stoic.AdaptiveThrottle(label="t"),
            stoic.Retrying(stoic.Schedule.fixed(0.1).attempts(2), label="r"),
            stoic.Pipeline(breaker),
        ]
        pipeline = stoic.Pipeline(breaker, limiter, bulkhead)
        nested = stoic.Pipeline([breaker, limiter])

        async def op(path: str) -> bytes:
            return b""

        async def main() -> None:
            reveal_type(await stoic.with_fallback(limiter, op, "p", label="f", fallback=lambda e: b""))
            reveal_type(await limiter.execute(op, "p"))
            await limiter.execute(op, 3)
    """)
    assert lines[:3] == [
        'note: Revealed type is "bytes"',
        'note: Revealed type is "bytes"',
        'error: No overload variant of "execute" of "RateLimiter" matches argument types '
        '"Callable[[str], Coroutine[Any, Any, bytes]]", "int"  [call-overload]',
    ]
    assert all(line.startswith("note: ") for line in lines[3:])


def test_decorated_async_functions_stay_coroutine_functions_to_mypy(tmp_path: Path) -> None:
    lines = _mypy(tmp_path, """
        import asyncio

        import stoic

        limiter = stoic.RateLimiter(10, label="rl")
        bulkhead = stoic.Bulkhead(4, label="bh")
        adaptive = stoic.AdaptiveBulkhead(latency_threshold=0.1, max_concurrent=10, label="ab")
        throttle = stoic.AdaptiveThrottle(label="t")
        pipeline = stoic.Pipeline(stoic.CircuitBreaker(label="b"), bulkhead)

        @limiter
        async def limited(x: int) -> int:
            return x

        @bulkhead
        async def bulkheaded(x: int) -> int:
            return x

        @adaptive
        async def adapted(x: int) -> int:
            return x

        @throttle
        async def throttled(x: int) -> int:
            return x

        @pipeline
        async def piped(x: int) -> int:
            return x

        class Client:
            @limiter
            async def get(self, path: str) -> bytes:
                return b""

        async def main() -> None:
            tasks: list[asyncio.Task[int]] = [
                asyncio.create_task(limited(1)), asyncio.create_task(bulkheaded(1)),
                asyncio.create_task(adapted(1)), asyncio.create_task(throttled(1)),
                asyncio.create_task(piped(1))]
            await asyncio.gather(*tasks)
            reveal_type(Client().get)
            Client().get("p")

        asyncio.run(limited(1))
        asyncio.run(limited("x"))
    """)
    assert lines == [
        'note: Revealed type is "def (path: str) -> typing.Coroutine[Any, Any, bytes]"',
        'error: Value of type "Coroutine[Any, Any, bytes]" must be used  [unused-coroutine]',
        'note: Are you missing an await?',
        'error: Argument 1 to "limited" has incompatible type "str"; expected "int"  [arg-type]',
    ]


def test_control_register_gives_back_the_policy_with_its_type(tmp_path: Path) -> None:
    # ``db = control.register(stoic.Bulkhead(...))`` is the documented idiom (docs/control-plane.md):
    # typed ``-> Any``, ``db`` lost its type and ``return db.in_use`` from a typed function was
    # mypy --strict's "Returning Any" error.
    lines = _mypy(tmp_path, """
        import stoic

        control = stoic.ControlPlane()
        db = control.register(stoic.Bulkhead(2, label="db"))
        tenants = control.register(stoic.Keyed(stoic.RateLimiter, label="tenants", rate=5))
        reveal_type(db)
        reveal_type(tenants)

        def in_use() -> int:
            return db.in_use
    """)
    assert lines == [
        'note: Revealed type is "stoic.bulkhead.Bulkhead"',
        'note: Revealed type is "stoic.keyed.Keyed[stoic.ratelimiter.RateLimiter]"',
    ]


def test_the_retry_pages_first_example_passes_mypy_strict(tmp_path: Path) -> None:
    # The page's own advice (an ``attempt`` without a default makes every caller a mypy error:
    # declare it ``Attempt | None = None``) was broken by its first example, which a user copies.
    import sys

    root = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(root / "tests"))
    try:
        from _docs_runner import blocks
    finally:
        sys.path.pop(0)
    _line, code, reason = blocks((root / "docs" / "retry.md").read_text(encoding="utf-8"))[0]
    assert reason is None and "@retrying" in code and "attempt" in code
    imports = "\n".join(line for line in code.splitlines() if line.startswith(("import ", "from ")))
    body = "\n".join(line for line in code.splitlines() if not line.startswith(("import ", "from ")))
    assert _mypy(tmp_path, imports + "\n\nasync def page() -> None:\n" + textwrap.indent(body, "    ")) == []
