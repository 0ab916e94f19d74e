"""The decorator and execute/call keep the wrapped function's signature for type checkers
(ParamSpec): mypy sees the same parameters and return type, and flags wrong arguments."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

api = pytest.importorskip("mypy.api")

SNIPPET = textwrap.dedent(
    """
    import stoic

    breaker = stoic.CircuitBreaker(label="typed")

    @breaker
    async def fetch(path: str, *, retries: int = 0) -> bytes:
        return b""

    @breaker
    def add(a: int, b: int) -> int:
        return a + b

    async def main() -> None:
        reveal_type(fetch)
        reveal_type(add)
        reveal_type(await breaker.execute(fetch, "p", retries=1))
        reveal_type(breaker.call(add, 1, 2))
        add("x", 2)
        breaker.call(add, "x", 2)
        await breaker.execute(fetch, 3)
    """
)


def test_mypy_keeps_signatures_through_the_breaker(tmp_path: Path) -> None:
    source = tmp_path / "typed_usage.py"
    source.write_text(SNIPPET)
    out, _err, _status = api.run([
        "--strict", "--no-error-summary", "--cache-dir", str(tmp_path / ".mypy_cache"), str(source),
    ])
    lines = [line.split(": ", 1)[1] for line in out.strip().splitlines()]
    assert lines == [
        'note: Revealed type is "def (path: str, *, retries: int =) '
        '-> typing.Coroutine[Any, Any, bytes]"',
        'note: Revealed type is "def (a: int, b: int) -> int"',
        'note: Revealed type is "bytes"',
        'note: Revealed type is "int"',
        'error: Argument 1 to "add" has incompatible type "str"; expected "int"  [arg-type]',
        'error: Argument 2 to "call" of "CircuitBreaker" has incompatible type "str"; expected "int"  [arg-type]',
        'error: Argument 2 to "execute" of "CircuitBreaker" has incompatible type "int"; expected "str"  [arg-type]',
    ]
